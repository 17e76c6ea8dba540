"""int8 TRANSPOSE_CONV on the cpu backend (litegpu_cpu.kernels.qtransposeconv) and its
integer reference, against LiteRT.

LiteRT runs an int8 TRANSPOSE_CONV two ways: XNNPACK when the output shape, weights and
bias are constants of the file (float32 requantization), else its builtin kernel (a
Keras Conv2DTranspose converted with a dynamic batch computes the output shape with
SHAPE and PACK; here SHAPE, MUL and ADD), whose per-channel requantization rounds ties
up in groups of eight channels and away from zero in the rest. Each case runs both
ways, on the kernel and on the reference alone, and must equal LiteRT on every element.
"""
from __future__ import annotations

import numpy as np
import pytest

from litegpu.testing.builder import ModelBuilder

from test_cpu_qmatmul import check, full_range

I8 = np.int8
KERNEL = "int8 transpose conv"


def transpose_conv_model(x_shape: tuple, o: int, k: int, stride: int, padding: str, computed_shape: bool,
                         activation: str = "NONE", bias: bool = True, per_channel: bool = True, seed: int = 0,
                         out_q: tuple = (0.02, 3)) -> bytes:
    """TRANSPOSE_CONV of an int8 input ``x_shape`` into ``o`` channels with a ``k`` x ``k``
    kernel, its output shape a constant or ``computed_shape`` from the input's SHAPE."""
    rng = np.random.default_rng(seed)
    n, h, w, c = x_shape
    oh, ow = (h * stride, w * stride) if padding == "SAME" else ((h - 1) * stride + k, (w - 1) * stride + k)
    scales = (rng.uniform(0.5, 1.5, o) * 0.01).astype(np.float32) if per_channel else np.array([0.01], np.float32)
    b = ModelBuilder()
    x = b.input("x", x_shape, I8, scale=[0.05], zero_point=[-5])
    weights = b.const("w", rng.integers(-127, 128, (o, k, k, c)).astype(I8), scale=list(scales),
                      zero_point=[0] * scales.size, quantized_dimension=0)
    if computed_shape:
        shape, scaled, out_shape = (b.tensor(name, (4,), np.int32) for name in ("shape", "scaled", "out_shape"))
        b.op("SHAPE", [x], [shape], out_type=np.int32)
        b.op("MUL", [shape, b.const("times", np.array([1, 0, 0, 0], np.int32))], [scaled])
        b.op("ADD", [scaled, b.const("plus", np.array([0, oh, ow, o], np.int32))], [out_shape])
    else:
        out_shape = b.const("out_shape", np.array([n, oh, ow, o], np.int32))
    inputs = [out_shape, weights, x]
    if bias:
        inputs.append(b.const("bias", rng.integers(-3000, 3000, o).astype(np.int32), scale=list(0.05 * scales),
                              zero_point=[0] * scales.size))
    y = b.tensor("y", (n, oh, ow, o), I8, scale=[out_q[0]], zero_point=[out_q[1]])
    b.op("TRANSPOSE_CONV", inputs, [y], padding=padding, stride_h=stride, stride_w=stride,
         fused_activation_function=activation, version=4)
    b.output(y)
    return b.build()


@pytest.fixture(params=["kernel", "reference"])
def runs(request, monkeypatch) -> str:
    """What runs the node: the cpu kernel, or (quantized kernels set aside) the reference."""
    if request.param == "kernel":
        return KERNEL
    from litegpu_cpu.kernels import registry
    monkeypatch.setattr(registry, "QUANTIZED_KERNELS", {})
    return "reference"


def check_transpose_conv(model: bytes, x_shape: tuple, runs: str, seed: int = 1) -> None:
    import litegpu
    interp = litegpu.Interpreter(model_content=model)
    interp.allocate_tensors()
    (name,) = {k[3] for k in interp.get_delegation_report().kernels if k[1] == "TRANSPOSE_CONV"}
    assert name.startswith(runs), name
    check(model, [full_range(np.random.default_rng(seed), x_shape)], "TRANSPOSE_CONV", name)


@pytest.mark.parametrize("computed_shape", [False, True], ids=["xnnpack", "builtin"])
@pytest.mark.parametrize("x_shape,o,k,stride,padding", [
    ((1, 12, 12, 32), 16, 2, 2, "SAME"),        # unet's decoder
    ((1, 5, 6, 7), 12, 3, 2, "SAME"),           # C not a multiple of 4; 8 + 4 channels
    ((2, 4, 5, 8), 20, 3, 2, "VALID"),          # a batch; 16 + 4 channels
    ((1, 6, 6, 16), 8, 3, 1, "SAME"),           # stride 1
    ((1, 3, 4, 4), 3, 4, 3, "VALID"),           # fewer than 8 channels: all one at a time
    ((1, 24, 20, 12), 24, 3, 2, "SAME"),        # col2im cut into tasks
], ids=["unet", "odd-c", "batch-valid", "stride1", "narrow", "tasks"])
def test_transpose_conv(runs: str, computed_shape: bool, x_shape: tuple, o: int, k: int, stride: int,
                        padding: str) -> None:
    model = transpose_conv_model(x_shape, o, k, stride, padding, computed_shape)
    check_transpose_conv(model, x_shape, runs)


@pytest.mark.parametrize("computed_shape", [False, True], ids=["xnnpack", "builtin"])
@pytest.mark.parametrize("activation,bias,per_channel,out_q", [
    ("RELU", True, True, (0.02, 3)), ("RELU6", False, True, (6 / 255 * 1.003, -128)),
    ("NONE", True, False, (0.02, 3)), ("RELU_N1_TO_1", False, False, (2 / 255 * 0.97, 0)),
    ("NONE", False, True, (0.0004, -20)),     # a small output scale: most results saturate
])
def test_transpose_conv_options(runs: str, computed_shape: bool, activation: str, bias: bool, per_channel: bool,
                                out_q: tuple) -> None:
    x_shape = (1, 5, 6, 8)
    model = transpose_conv_model(x_shape, 12, 3, 2, "SAME", computed_shape, activation, bias, per_channel,
                                 out_q=out_q)
    check_transpose_conv(model, x_shape, runs)


@pytest.mark.parametrize("seed", range(4))
def test_transpose_conv_ties(runs: str, seed: int) -> None:
    """An output scale that makes every multiplier a power of two (one weight scale, output
    scale input * weight * 2^6): many sums are ties, which the builtin kernel's two
    roundings take apart by channel."""
    x_shape = (1, 6, 6, 8)
    out_q = (float(np.float32(0.05) * np.float32(0.01) * 64), -7)
    model = transpose_conv_model(x_shape, 12, 3, 2, "SAME", True, per_channel=False, seed=seed, out_q=out_q)
    check_transpose_conv(model, x_shape, runs, seed=seed)


def test_transpose_conv_without_vnni(monkeypatch) -> None:
    """The products' plain LLVM arithmetic, what a host without AVX-512 VNNI runs."""
    from litegpu_cpu.kernels import qmatmul
    monkeypatch.setattr(qmatmul, "VNNI", False)
    x_shape = (1, 5, 6, 7)
    check_transpose_conv(transpose_conv_model(x_shape, 12, 3, 2, "SAME", True, seed=9), x_shape, KERNEL)
