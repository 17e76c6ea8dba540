"""int16 (16x8) TRANSPOSE_CONV on the cpu backend (litegpu_cpu.kernels.q16transposeconv),
against LiteRT's builtin reference kernel: the kernel (not the integer reference) runs the
node, bound as one plan, and every output element equals LiteRT's. Cases cover strides 1
to 3, SAME and VALID, 2x2 to 4x4 kernels, odd channel counts, batches, col2im cut into
tasks, int64 / no bias (an int32 one: the same sums), per-tensor weights, fused activations, and sums past
int32 (one tap of 640 channels at the extremes, up to nine taps added)."""
from __future__ import annotations

import numpy as np
import pytest

import litegpu
from litegpu.testing.builder import ModelBuilder

from test_cpu_q16 import check, random16

I16 = np.int16
KERNEL = "int16 transpose conv"


def transpose_conv16(x_shape: tuple, o: int, k: int, stride: int, padding: str, activation: str = "NONE",
                     bias=np.int64, per_channel: bool = True, big: bool = False, out_scale: float = 0.004,
                     seed: int = 0) -> bytes:
    """TRANSPOSE_CONV of an int16 input ``x_shape`` (scale 0.0005) into ``o`` channels with a
    ``k`` x ``k`` kernel of symmetric int8 weights, a constant output shape, and a bias of
    dtype ``bias`` (None: none). ``big``: weights of magnitude near 127, all positive in
    the first half of the output channels (with inputs of one sign per pixel, each tap's
    sum there is near ``C * 127 * 32768``)."""
    rng = np.random.default_rng(seed)
    n, h, w, c = x_shape
    oh, ow = (h * stride, w * stride) if padding == "SAME" else ((h - 1) * stride + k, (w - 1) * stride + k)
    values = rng.integers(-127, 128, (o, k, k, c))
    if big:
        values = np.where(values < 0, -127, 127) - rng.integers(0, 3, values.shape) * np.sign(values)
        values[:o // 2] = np.abs(values[:o // 2])
    scales = rng.uniform(0.002, 0.02, o if per_channel else 1).astype(np.float32)
    b = ModelBuilder()
    x = b.input("x", x_shape, I16, scale=[0.0005], zero_point=[0])
    weights = b.const("w", values.astype(np.int8), scale=list(scales), zero_point=[0] * scales.size,
                      quantized_dimension=0)
    inputs = [b.const("out_shape", np.array([n, oh, ow, o], np.int32)), weights, x]
    if bias is not None:
        bias_scales = np.broadcast_to(np.float32(0.0005) * scales, (o,))
        inputs.append(b.const("bias", rng.integers(-3_000_000, 3_000_000, o).astype(bias), scale=list(bias_scales),
                              zero_point=[0] * o))
    y = b.tensor("y", (n, oh, ow, o), I16, scale=[out_scale], zero_point=[0])
    b.op("TRANSPOSE_CONV", inputs, [y], padding=padding, stride_h=stride, stride_w=stride,
         fused_activation_function=activation, version=4)
    b.output(y)
    return b.build()


SHAPES = [  # x shape, O, K, stride, padding
    ((1, 12, 12, 128), 64, 2, 2, "SAME"),      # unet 16x8's first decoder step
    ((1, 5, 6, 7), 12, 3, 2, "SAME"),          # odd C: x's rows widened to pairs
    ((2, 4, 5, 8), 20, 3, 2, "VALID"),         # a batch; 16 + 4 columns
    ((1, 6, 6, 16), 8, 3, 1, "SAME"),          # stride 1: nine taps per output pixel
    ((1, 6, 5, 6), 10, 2, 1, "VALID"),
    ((1, 5, 5, 12), 9, 4, 2, "SAME"),          # 4x4
    ((1, 4, 3, 5), 3, 4, 1, "VALID"),          # 4x4 stride 1, three channels
    ((1, 3, 4, 4), 3, 4, 3, "VALID"),          # stride 3
    ((1, 24, 20, 12), 24, 3, 2, "SAME"),       # col2im cut into tasks
]


@pytest.mark.parametrize("x_shape,o,k,stride,padding", SHAPES,
                         ids=["unet", "odd-c", "batch-valid", "stride1", "stride1-valid", "k4", "k4-stride1",
                              "stride3", "tasks"])
def test_int16_transpose_conv_chosen_and_exact(x_shape, o, k, stride, padding) -> None:
    rng = np.random.default_rng(1)
    check(transpose_conv16(x_shape, o, k, stride, padding), [random16(rng, x_shape)], "TRANSPOSE_CONV", KERNEL)


@pytest.mark.parametrize("activation,bias,per_channel,out_scale", [
    ("RELU", np.int64, True, 0.004),
    ("RELU6", None, True, 0.0002),
    ("NONE", None, False, 0.004),
    ("RELU_N1_TO_1", np.int64, False, 0.0001),
    ("NONE", np.int64, True, 0.00005),          # a small output scale: most results saturate
])
def test_int16_transpose_conv_options(activation, bias, per_channel, out_scale) -> None:
    x_shape = (1, 5, 6, 8)
    model = transpose_conv16(x_shape, 12, 3, 2, "SAME", activation, bias, per_channel, out_scale=out_scale, seed=2)
    check(model, [random16(np.random.default_rng(3), x_shape)], "TRANSPOSE_CONV", KERNEL)


@pytest.mark.parametrize("x_shape,o,k,stride", [
    ((1, 4, 4, 640), 20, 3, 1),                # each tap's sum past int32, up to nine taps added
    ((1, 5, 4, 704), 34, 2, 2),                # one tap per output pixel, past int32; a partial panel
    ((1, 3, 3, 257), 6, 4, 1),                 # odd C; taps within int32, up to nine added past it
])
def test_int16_transpose_conv_sums_past_int32(x_shape, o, k, stride) -> None:
    """Inputs at the int16 extremes, one sign per pixel, and weights near 127: in the first
    half of the channels every tap's sum is near ``C * 126 * 32767`` (past 2^31 from about
    520 channels), so the products run in several int32 blocks, added in int64, and col2im
    adds the taps in int64."""
    rng = np.random.default_rng(4)
    n, h, w, c = x_shape
    sign = rng.integers(0, 2, (n, h, w, 1)) == 0
    x = np.where(sign, np.int16(32767), np.int16(-32768)) - rng.integers(0, 4, x_shape) * np.where(sign, 1, -1)
    model = transpose_conv16(x_shape, o, k, stride, "SAME", big=True, out_scale=2.0, seed=5)
    check(model, [x.astype(I16)], "TRANSPOSE_CONV", KERNEL)


def run_ours(model: bytes, x: np.ndarray) -> np.ndarray:
    interp = litegpu.Interpreter(model_content=model)
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    return interp.get_tensor(interp.get_output_details()[0]["index"])


def test_int16_transpose_conv_int32_bias_sums_the_same() -> None:
    """An int32 bias is the same int64 sums as the int64 bias of the same values (LiteRT's
    int32-bias 16x8 kernel saturates every output, as its conv does: the int64-bias model
    is the expectation, checked against LiteRT above)."""
    x_shape = (1, 5, 6, 8)
    x = random16(np.random.default_rng(3), x_shape)
    wide, narrow = (transpose_conv16(x_shape, 12, 3, 2, "SAME", bias=dtype, seed=2) for dtype in (np.int64, np.int32))
    check(wide, [x], "TRANSPOSE_CONV", KERNEL)
    np.testing.assert_array_equal(run_ours(narrow, x), run_ours(wide, x))


def test_int16_transpose_conv_is_one_plan() -> None:
    """The node runs the kernel, bound as one plan (products, then col2im), and no node of
    the model runs the reference."""
    from litegpu_cpu.kernels.tasks import is_plan
    x_shape = (1, 5, 6, 7)
    ours = litegpu.Interpreter(model_content=transpose_conv16(x_shape, 12, 3, 2, "SAME", bias=np.int32))
    ours.allocate_tensors()
    report = ours.get_delegation_report()
    assert not report.reference_nodes()
    assert [name for _, op, _, name in report.kernels if op == "TRANSPOSE_CONV"] == \
        ["int16 transpose conv (3x3/2): packed GEMM + col2im"]
    program = ours._compiled.programs[0][0]
    x = random16(np.random.default_rng(6), x_shape)
    (call, *_), = program.bind([x], [np.empty((1, 10, 12, 12), I16)]).steps
    assert is_plan(call) and len(call.rows) == 3         # rows widened, products, col2im


def test_int16_product_raw_sums() -> None:
    """:class:`QuantizedMatmul16` without a requantization stores the exact int64 sums
    (with the bias): K of 600 at the extremes, past int32, partial panels."""
    from litegpu_cpu.kernels.q16 import QuantizedMatmul16
    rng = np.random.default_rng(7)
    m, k, n = 37, 600, 50
    x = np.where(rng.integers(0, 2, (m, k)) == 0, -32768, 32767).astype(I16)
    w = np.where(rng.integers(0, 4, (k, n)) == 0, -128, 127).astype(np.int8)
    bias = rng.integers(-10**12, 10**12, n)
    out = np.empty((m, n), np.int64)
    QuantizedMatmul16(w, bias, None, 2).bind(x, out)()
    want = x.astype(np.int64) @ w.astype(np.int64) + bias
    assert np.abs(want).max() > 2 ** 31
    np.testing.assert_array_equal(out, want)
