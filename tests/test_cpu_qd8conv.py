"""The cpu backend's kernels for hybrid (dynamic-range) CONV_2D and DEPTHWISE_CONV_2D
(litegpu_cpu.kernels.qd8conv): chosen for hybrid nodes, bit for bit equal to the ops'
hybrid references (XNNPACK's qd8-f32-qc8w convolution, TFLite's builtin hybrid depthwise
conv) over a spread of geometries, and equal to LiteRT itself.

Inputs are shifted (``offset``) so that each image's zero point lies far from 0: padding
that counted as 0 rather than as the zero point would show. Every batch of two has an
image of zeros (quantized with scale 1 and its own zero point).
"""
from __future__ import annotations

import numpy as np
import pytest

import litegpu
from litegpu.ops.hybrid import _conv_hybrid, _depthwise_hybrid, xnn_quantize_rows
from litegpu.testing.builder import ModelBuilder
from litegpu_cpu.kernels import qd8conv, qd8gemm
from litegpu_cpu.kernels.common import window_geometry
from litegpu_cpu.kernels.qd8conv import HybridDepthwise

from test_ops_hybrid import close
from test_ops_quantized import run_both

RNG = np.random.default_rng(17)


def hybrid_model(op: str, x_shape: tuple, w_shape: tuple, out_shape: tuple, per_channel: bool = True,
                 **options) -> bytes:
    """One hybrid ``op`` node: float32 input and output, symmetric int8 filter (per output
    channel or per tensor), float32 bias."""
    b = ModelBuilder()
    x = b.input("x", x_shape, np.float32)
    axis = 3 if op == "DEPTHWISE_CONV_2D" else 0
    channels = w_shape[axis]
    scales = RNG.uniform(0.004, 0.02, channels if per_channel else 1).astype(np.float32)
    w = b.const("w", RNG.integers(-127, 128, w_shape).astype(np.int8), scale=scales, zero_point=[0] * scales.size,
                quantized_dimension=axis)
    bias = b.const("b", RNG.normal(size=channels).astype(np.float32))
    y = b.tensor("y", out_shape, np.float32)
    b.op(op, [x, w, bias], [y], version=2, **options)
    b.output(y)
    return b.build()


def float_input(shape: tuple, offset: float = 1.0) -> np.ndarray:
    """Normal values around ``offset``; in a batch of two, the second image all zeros."""
    x = (RNG.normal(size=shape) * 2 + offset).astype(np.float32)
    if shape[0] > 1:
        x[1] = 0
    return x


def run_kernel(content: bytes, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, str]:
    """litegpu's output for ``x``, the node's hybrid reference on the same input, and the
    name of the kernel that ran the node."""
    interp = litegpu.Interpreter(model_content=content)
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    got = interp.get_tensor(interp.get_output_details()[0]["index"])
    program = interp._compiled.programs[0][0]
    (_, name), = program.kernels()
    ctx = program.steps[0][4]
    (want,) = ctx.opdef.reference_for(ctx.attrs)([x, *[s.value for s in ctx.inputs[1:]]], ctx.attrs)
    return got, want, name


def out_size(size: int, k: int, stride: int, dilation: int, padding: str) -> int:
    span = (k - 1) * dilation + 1
    return -(-size // stride) if padding == "SAME" else (size - span) // stride + 1


def conv_case(n, h, w, c, o, kh, kw, stride, dilation, padding, act):
    x_shape = (n, h, w, c)
    out = (n, out_size(h, kh, stride, dilation, padding), out_size(w, kw, stride, dilation, padding), o)
    options = dict(padding=padding, stride_h=stride, stride_w=stride, dilation_h_factor=dilation,
                   dilation_w_factor=dilation, fused_activation_function=act)
    return x_shape, (o, kh, kw, c), out, options


CONV_CASES = {
    "pointwise": conv_case(1, 9, 7, 24, 40, 1, 1, 1, 1, "SAME", "NONE"),
    "pointwise-odd-channels": conv_case(2, 5, 6, 13, 7, 1, 1, 1, 1, "VALID", "RELU6"),
    "3x3-same": conv_case(1, 12, 20, 16, 24, 3, 3, 1, 1, "SAME", "NONE"),
    "3x3-valid-batch2": conv_case(2, 9, 9, 8, 6, 3, 3, 1, 1, "VALID", "RELU"),
    "3x3-stride2": conv_case(2, 11, 10, 5, 17, 3, 3, 2, 1, "SAME", "RELU6"),
    "3x3-dilated": conv_case(1, 13, 11, 6, 9, 3, 3, 1, 2, "SAME", "NONE"),
    "7x7-stride2": conv_case(1, 23, 23, 3, 32, 7, 7, 2, 1, "SAME", "RELU"),
    "10x4-stride2": conv_case(1, 49, 10, 1, 64, 10, 4, 2, 1, "SAME", "RELU"),     # DS-CNN's first conv
    "1x1-stride2": conv_case(2, 8, 8, 12, 20, 1, 1, 2, 1, "VALID", "RELU_N1_TO_1"),
    "deep": conv_case(1, 8, 8, 128, 96, 3, 3, 1, 1, "SAME", "RELU"),              # panels and K split
}


@pytest.mark.parametrize("per_channel", [True, False], ids=["per-channel", "per-tensor"])
@pytest.mark.parametrize("case", CONV_CASES)
def test_conv_kernel_equals_the_reference(case: str, per_channel: bool) -> None:
    x_shape, w_shape, out_shape, options = CONV_CASES[case]
    content = hybrid_model("CONV_2D", x_shape, w_shape, out_shape, per_channel, **options)
    got, want, name = run_kernel(content, float_input(x_shape))
    kind = "pixels" if case.startswith("pointwise") else "indirect" if x_shape[3] % 4 == 0 else "im2col"
    assert name.startswith("qd8 ") and kind in name, name
    np.testing.assert_array_equal(got, want)


PATHS = [pytest.param(False, id="plain"),
         pytest.param(True, id="vnni", marks=pytest.mark.skipif(
             not qd8gemm.VNNI, reason="this CPU has no AVX-512 VNNI (vpdpbusd); the plain path is tested"))]


@pytest.mark.parametrize("vnni", PATHS)
@pytest.mark.parametrize("convolve", [qd8conv._indirect_conv, qd8conv._im2col_conv], ids=["indirect", "im2col"])
@pytest.mark.parametrize("x_shape,k,stride,dilation,padding", [
    ((2, 9, 11, 8), 3, 1, 1, "SAME"),       # padding on every side, a zero image
    ((1, 13, 10, 12), 3, 2, 2, "SAME"),     # stride 2, dilation 2, padding unequal before and after
    ((1, 4, 4, 64), 3, 1, 1, "SAME"),       # 16 rows: whole tiles, the rest in one more
    ((1, 7, 7, 16), 1, 2, 1, "VALID"),      # a 1x1 stride-2 conv: one tap
])
def test_conv_paths_equal_the_reference(convolve, vnni: bool, x_shape: tuple, k: int, stride: int, dilation: int,
                                        padding: str) -> None:
    """Both ways of running a conv that is not pointwise, on both instruction sets."""
    n, h, w, c = x_shape
    o = 20
    weights = RNG.integers(-127, 128, (o, k, k, c)).astype(np.int8)
    weight_scale = RNG.uniform(0.004, 0.02, o).astype(np.float32)
    bias = RNG.normal(size=o).astype(np.float32)
    attrs = {"stride": (stride, stride), "dilation": (dilation, dilation), "padding": padding,
             "activation": "RELU", "weight_scale": weight_scale, "pointwise": False}
    product = qd8gemm.DynamicQuantizedMatmul(np.ascontiguousarray(weights.reshape(o, -1).T), weight_scale, bias,
                                             0.0, np.inf, 2, vnni=vnni)
    out_hw = (out_size(h, k, stride, dilation, padding), out_size(w, k, stride, dilation, padding))
    run = convolve(product, x_shape, (k, k), window_geometry(attrs, h, w, k, k), *out_hw)
    x = float_input(x_shape)
    out = np.full((n, *out_hw, o), 7.5, np.float32)
    run.bind([x], [out])()
    (want,) = _conv_hybrid([x, weights, bias], attrs)
    np.testing.assert_array_equal(out, want)


def test_conv_of_a_zero_image_is_the_bias() -> None:
    """A batch of one image of zeros: zero point 127 (XNNPACK's choice for an empty range),
    padding included, every sum 0."""
    x_shape, w_shape, out_shape, options = CONV_CASES["3x3-same"]
    got, want, _ = run_kernel(hybrid_model("CONV_2D", x_shape, w_shape, out_shape, **options),
                              np.zeros(x_shape, np.float32))
    np.testing.assert_array_equal(got, want)
    assert np.all(got == got[0, 0, 0])


def test_grouped_conv_runs_the_reference() -> None:
    content = hybrid_model("CONV_2D", (1, 6, 6, 8), (6, 3, 3, 4), (1, 6, 6, 6), padding="SAME", stride_h=1,
                           stride_w=1)
    got, want, name = run_kernel(content, float_input((1, 6, 6, 8)))
    assert name == "reference"
    np.testing.assert_array_equal(got, want)


def depthwise_case(n, h, w, c, multiplier, k, stride, dilation, padding, act):
    o = c * multiplier
    out = (n, out_size(h, k, stride, dilation, padding), out_size(w, k, stride, dilation, padding), o)
    options = dict(padding=padding, stride_h=stride, stride_w=stride, dilation_h_factor=dilation,
                   dilation_w_factor=dilation, depth_multiplier=multiplier, fused_activation_function=act)
    return (n, h, w, c), (1, k, k, o), out, options


DEPTHWISE_CASES = {
    "3x3-same": depthwise_case(1, 12, 14, 32, 1, 3, 1, 1, "SAME", "NONE"),
    "3x3-valid-batch2": depthwise_case(2, 9, 9, 48, 1, 3, 1, 1, "VALID", "RELU6"),
    "3x3-stride2-odd-channels": depthwise_case(2, 11, 10, 37, 1, 3, 2, 1, "SAME", "RELU"),   # scalar-order channels
    "3x3-dilated": depthwise_case(1, 13, 11, 21, 1, 3, 1, 2, "SAME", "NONE"),
    "5x5-stride2": depthwise_case(1, 20, 20, 40, 1, 5, 2, 1, "SAME", "RELU6"),
    "multiplier2": depthwise_case(2, 8, 8, 5, 2, 3, 2, 1, "SAME", "RELU6"),
    "multiplier3": depthwise_case(1, 8, 9, 6, 3, 3, 1, 1, "VALID", "RELU_N1_TO_1"),
    "few-channels": depthwise_case(1, 6, 7, 3, 1, 3, 1, 1, "SAME", "NONE"),                   # the plain loop only
    "wide": depthwise_case(1, 7, 7, 960, 1, 3, 1, 1, "SAME", "RELU6"),
}


@pytest.mark.parametrize("case", DEPTHWISE_CASES)
def test_depthwise_kernel_equals_the_reference(case: str) -> None:
    x_shape, w_shape, out_shape, options = DEPTHWISE_CASES[case]
    content = hybrid_model("DEPTHWISE_CONV_2D", x_shape, w_shape, out_shape, **options)
    got, want, name = run_kernel(content, float_input(x_shape))
    assert name.startswith("hybrid depthwise"), name
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("offset", [1.0, 40.0, -3.0], ids=["shifted", "positive", "negative"])
def test_depthwise_zero_points_across_the_range(offset: float) -> None:
    """Images mostly positive or negative put TFLite's zero point near an end of int8."""
    x_shape, w_shape, out_shape, options = DEPTHWISE_CASES["3x3-valid-batch2"]
    content = hybrid_model("DEPTHWISE_CONV_2D", x_shape, w_shape, out_shape, **options)
    got, want, _ = run_kernel(content, float_input(x_shape, offset))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("case", ["pointwise-odd-channels", "3x3-stride2", "10x4-stride2"])
def test_conv_kernel_equals_litert(case: str) -> None:
    x_shape, w_shape, out_shape, options = CONV_CASES[case]
    (ours,), (theirs,) = run_both(hybrid_model("CONV_2D", x_shape, w_shape, out_shape, **options),
                                  [float_input(x_shape)])
    close(ours, theirs)


@pytest.mark.parametrize("case", ["3x3-stride2-odd-channels", "5x5-stride2", "multiplier2"])
def test_depthwise_kernel_equals_litert(case: str) -> None:
    x_shape, w_shape, out_shape, options = DEPTHWISE_CASES[case]
    (ours,), (theirs,) = run_both(hybrid_model("DEPTHWISE_CONV_2D", x_shape, w_shape, out_shape, **options),
                                  [float_input(x_shape)])
    close(ours, theirs)


def test_pointwise_convs_reading_one_tensor_quantize_it_once(monkeypatch) -> None:
    """Two 1x1 convs on one input (a ResNet block's shortcut and its first conv): the
    second reads the first's quantized pixels; both equal LiteRT."""
    sources = []
    read = qd8gemm.DynamicQuantizedMatmul.read_rows_of
    monkeypatch.setattr(qd8gemm.DynamicQuantizedMatmul, "read_rows_of",
                        lambda self, source: (sources.append(source), read(self, source))[1])
    b = ModelBuilder()
    x = b.input("x", (1, 6, 6, 16), np.float32)
    outs = []
    for i, o in enumerate((24, 8)):
        scales = RNG.uniform(0.004, 0.02, o).astype(np.float32)
        w = b.const(f"w{i}", RNG.integers(-127, 128, (o, 1, 1, 16)).astype(np.int8), scale=scales,
                    zero_point=[0] * o, quantized_dimension=0)
        bias = b.const(f"b{i}", RNG.normal(size=o).astype(np.float32))
        outs.append(b.tensor(f"y{i}", (1, 6, 6, o), np.float32))
        b.op("CONV_2D", [x, w, bias], [outs[-1]], padding="SAME", stride_h=1, stride_w=1, version=2)
    b.output(*outs)
    ours, theirs = run_both(b.build(), [float_input((1, 6, 6, 16))])
    assert len(sources) == 1
    for got, want in zip(ours, theirs):
        close(got, want)


# -- images quantized in pieces (fewer images than threads) ----------------------------------


@pytest.mark.parametrize("m,k,threads", [(1, 20000, 2), (2, 40001, 3), (1, 16384, 5)])
def test_rows_quantized_in_pieces(m: int, k: int, threads: int) -> None:
    """Long rows cut in one piece a thread (a range pass, then each piece quantized with the
    folded range) give XNNPACK's quantization of the whole row, whatever threads run them."""
    x = float_input((m, k))
    x[0, 7] = -9.5                           # the range's ends in different pieces
    x[-1, -3] = 12.25
    k4 = k + 3
    q, scale, correction = np.full((m, k4), 99, np.int8), np.empty(m * 2, np.float32), np.empty(m * 2, np.int32)
    call = qd8gemm.bind_quantize_rows(x, q, scale, correction, threads, repeat=2)
    assert len(call.rows) == 2, "a range pass, then the quantization"
    call()
    want, want_scale, want_zp = xnn_quantize_rows(x)
    np.testing.assert_array_equal(q[:, :k].astype(np.float64) - want_zp[:, None], want)
    assert np.all(q[:, k:] == 0)
    np.testing.assert_array_equal(scale, np.repeat(want_scale, 2))
    np.testing.assert_array_equal(correction, np.repeat(128 + want_zp, 2))


@pytest.mark.parametrize("multiplier,threads", [(1, 2), (2, 3)])
def test_depthwise_of_images_quantized_in_pieces(multiplier: int, threads: int) -> None:
    n, h, w, c = 1, 40, 36, 12
    o = c * multiplier
    weights = RNG.integers(-127, 128, (3, 3, o)).astype(np.int8)
    weight_scale = RNG.uniform(0.004, 0.02, o).astype(np.float32)
    bias = RNG.normal(size=o).astype(np.float32)
    conv = HybridDepthwise(weights, weight_scale, bias, multiplier, 0.0, 6.0, (1, 1, 1, 1, 1, 1), threads)
    x = float_input((n, h, w, c))
    out = np.empty((n, h, w, o), np.float32)
    conv.bind(x, out)()
    attrs = {"stride": (1, 1), "dilation": (1, 1), "padding": "SAME", "activation": "RELU6",
             "depth_multiplier": multiplier, "weight_scale": weight_scale}
    (want,) = _depthwise_hybrid([x, weights[None], bias], attrs)
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("references", [False, True])
def test_hybrid_depthwise_input_rounding_ties(monkeypatch, references: bool) -> None:
    """LiteRT's hybrid depthwise quantizes ``x / scale`` rounded before the zero point is
    added, its vector loop (the first K // 8 * 8 values of an image) rounding 0.49999997
    up, its tail exactly: a 1x1 depthwise of one channel shows each quantized value.
    The kernel and the reference alone (``references``) both equal LiteRT."""
    from test_ops_hybrid_transpose_conv import rounding_ties
    from test_ops_quantized import run_both
    if references:
        from litegpu_cpu.kernels import registry
        monkeypatch.setattr(registry, "QUANTIZED_KERNELS", {})
    x = rounding_ties()
    width = x.size
    b = ModelBuilder()
    xt = b.input("x", (1, 1, width, 1), np.float32)
    w = b.const("w", np.ones((1, 1, 1, 1), np.int8), scale=[0.5], zero_point=[0], quantized_dimension=3)
    y = b.tensor("y", (1, 1, width, 1), np.float32)
    b.op("DEPTHWISE_CONV_2D", [xt, w, b.const("bias", np.zeros(1, np.float32))], [y], padding="VALID",
         stride_h=1, stride_w=1, depth_multiplier=1)
    b.output(y)
    (ours,), (theirs,) = run_both(b.build(), [x.reshape(1, 1, width, 1)])
    np.testing.assert_array_equal(ours, theirs)
