"""The cpu backend's specialized kernels against direct numpy formulations written here
(loops over taps and pixels, float64) and against the op registry's reference.

Each case builds a NodeContext the way the backend does at compile time (constants carry
their value), runs the factory's kernel on preallocated outputs and compares.
"""
from __future__ import annotations

import numpy as np
import pytest

from litegpu.backend import NodeContext
from litegpu.graph import Node
from litegpu.ops import get_op
from litegpu.ops.registry import TensorSpec
from litegpu_cpu.kernels import KERNELS

RNG = np.random.default_rng(20240611)
CLAMPS = {"NONE": (-np.inf, np.inf), "RELU": (0, np.inf), "RELU6": (0, 6), "RELU_N1_TO_1": (-1, 1)}


def act(y: np.ndarray, name: str) -> np.ndarray:
    """A fused activation as LiteRT's float kernels apply it: an output clamp. TANH and
    SIGN_BIT have no clamp range there, so they leave the values alone."""
    if name in ("TANH", "SIGN_BIT"):
        return y
    lo, hi = CLAMPS[name]
    return np.clip(y, lo, hi)


def rand(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def build(op: str, attrs: dict, inputs: list, out_shapes: list, consts=(), out_dtype=np.float32):
    """The compiled kernel for ``op`` (asserting the factory did not decline) and fresh outputs."""
    specs = []
    for i, a in enumerate(inputs):
        if a is None:
            specs.append(None)
        else:
            a = np.asarray(a)
            specs.append(TensorSpec(tuple(a.shape), a.dtype, a if i in consts else None))
    outs = [TensorSpec(tuple(s), np.dtype(out_dtype)) for s in out_shapes]
    node = Node(index=0, op=op, opcode=0, version=1, inputs=tuple(range(len(inputs))),
                outputs=tuple(range(len(inputs), len(inputs) + len(outs))))
    ctx = NodeContext(node=node, opdef=get_op(op), attrs=attrs, inputs=specs, outputs=outs)
    run = KERNELS[op](ctx)
    assert run is not None, f"{op} kernel declined {attrs}"
    # NaN-filled outputs so an element the kernel forgets to write fails the comparison.
    return run, [np.full(s.shape, np.nan if s.dtype.kind == "f" else -1, s.dtype) for s in outs]


def run_kernel(op, attrs, inputs, out_shapes, consts=(), out_dtype=np.float32):
    run, outs = build(op, attrs, inputs, out_shapes, consts, out_dtype)
    run(list(inputs), outs)
    return outs


def close(got: np.ndarray, want: np.ndarray, rel: float = 1e-5) -> None:
    """max |got - want| <= rel * max |want| (the conformance suite's measure)."""
    want = np.asarray(want, np.float64)
    assert got.shape == want.shape, (got.shape, want.shape)
    scale = max(float(np.max(np.abs(want))), 1e-6) if want.size else 1.0
    err = float(np.max(np.abs(got.astype(np.float64) - want))) if want.size else 0.0
    assert err <= rel * scale, f"max error {err:.3g} vs scale {scale:.3g}"


def vs_reference(op: str, inputs: list, attrs: dict, got: list) -> None:
    """Compare with the op registry's numpy reference, when the op is defined there."""
    opdef = get_op(op)
    if opdef is None:
        return
    for g, w in zip(got, opdef.reference(list(inputs), attrs)):
        close(g, w)


def same_pad(size: int, k: int, s: int, d: int = 1) -> tuple[int, int]:
    """SAME output size and padding before, from TF's definition."""
    out = -(-size // s)
    total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
    return out, total // 2


def out_and_pad(padding: str, size: int, k: int, s: int, d: int = 1) -> tuple[int, int]:
    if padding == "SAME":
        return same_pad(size, k, s, d)
    return (size - (k - 1) * d - 1) // s + 1, 0


# -- CONV_2D ----------------------------------------------------------------------------------

def direct_conv(x, f, b, stride, dilation, padding, activation):
    """Per output pixel: sum over taps inside the image of x[pixel] . f[:, tap] (float64)."""
    n, h, w, c = x.shape
    o, kh, kw, _ = f.shape
    oh, pt = out_and_pad(padding, h, kh, stride[0], dilation[0])
    ow, pl = out_and_pad(padding, w, kw, stride[1], dilation[1])
    y = np.zeros((n, oh, ow, o))
    for i in range(oh):
        for j in range(ow):
            for a in range(kh):
                for e in range(kw):
                    ih, iw = i * stride[0] - pt + a * dilation[0], j * stride[1] - pl + e * dilation[1]
                    if 0 <= ih < h and 0 <= iw < w:
                        y[:, i, j, :] += np.einsum("nc,oc->no", x[:, ih, iw, :].astype(np.float64), f[:, a, e, :])
    if b is not None:
        y += b
    return act(y, activation)


CONV_CASES = [
    # (N, H, W, C, O, KH, KW, stride, dilation, padding, activation, bias)
    (1, 8, 8, 16, 24, 1, 1, (1, 1), (1, 1), "VALID", "RELU6", True),     # pointwise GEMM
    (2, 5, 7, 3, 8, 1, 1, (1, 1), (1, 1), "SAME", "NONE", False),        # pointwise, batch 2, no bias
    (2, 9, 11, 5, 7, 3, 3, (2, 2), (1, 1), "SAME", "NONE", True),
    (1, 10, 9, 4, 6, 3, 3, (1, 1), (2, 2), "SAME", "RELU", True),        # dilated
    (1, 11, 8, 3, 5, 5, 3, (2, 1), (1, 1), "VALID", "TANH", True),
    (1, 9, 9, 8, 4, 1, 1, (2, 2), (1, 1), "SAME", "NONE", True),         # strided 1x1 shortcut
    (1, 16, 15, 3, 8, 7, 7, (2, 2), (1, 1), "SAME", "RELU_N1_TO_1", True),
    (2, 6, 6, 4, 3, 2, 2, (2, 2), (1, 1), "VALID", "SIGN_BIT", True),
    # more than 32 output channels: the untransposed GEMM paths
    (2, 6, 5, 8, 40, 1, 1, (1, 1), (1, 1), "SAME", "RELU6", True),
    (1, 7, 6, 4, 36, 3, 3, (1, 1), (1, 1), "SAME", "RELU", True),
    (1, 7, 7, 4, 33, 3, 3, (2, 2), (1, 1), "VALID", "NONE", False),
    # 1x1 convs on one or two pixels: the few-row FC kernels
    (1, 1, 1, 24, 8, 1, 1, (1, 1), (1, 1), "SAME", "RELU", True),        # squeeze-excite (small_fc)
    (2, 1, 1, 576, 100, 1, 1, (1, 1), (1, 1), "VALID", "RELU6", True),   # conv head (gemv)
    (1, 1, 1, 1024, 300, 1, 1, (1, 1), (1, 1), "SAME", "NONE", False),   # gemv on two threads
    # few input channels (an image's first conv), interior and border pixels
    (1, 23, 21, 3, 16, 3, 3, (2, 2), (1, 1), "SAME", "RELU6", True),     # an image's first conv
    (2, 13, 12, 3, 32, 3, 3, (2, 2), (1, 1), "SAME", "RELU", True),      # two channel blocks, batch 2
    (1, 17, 19, 3, 24, 3, 3, (2, 1), (1, 1), "VALID", "NONE", True),     # blocks of 8, strides differ
    (1, 12, 11, 1, 10, 5, 5, (1, 1), (1, 1), "SAME", "RELU_N1_TO_1", True),   # one channel, 5x5
    (1, 14, 13, 2, 8, 3, 3, (1, 1), (2, 3), "SAME", "NONE", False),      # dilated, no bias
    (1, 2, 3, 3, 16, 3, 3, (2, 2), (1, 1), "SAME", "NONE", True),        # no interior pixel at all
    (3, 9, 9, 4, 7, 2, 2, (1, 1), (1, 1), "SAME", "RELU", True),         # padding on one side only
    # the implicit GEMM over the padded input (kernels/packed.py through conv._implicit_conv)
    (1, 12, 14, 5, 16, 3, 3, (2, 2), (1, 1), "VALID", "RELU", True),     # input rows/cols past the frame
    (2, 10, 13, 6, 20, 3, 5, (1, 2), (2, 1), "SAME", "RELU6", True),     # channels cropped, batch 2
]


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: f"k{c[5]}x{c[6]}-s{c[7][0]}{c[7][1]}-d{c[8][0]}-{c[9]}-{c[10]}")
def test_conv2d(case):
    n, h, w, c, o, kh, kw, stride, dilation, padding, activation, has_bias = case
    x, f = rand(n, h, w, c), rand(o, kh, kw, c, scale=0.3)
    b = rand(o) if has_bias else None
    want = direct_conv(x, f, b, stride, dilation, padding, activation)
    attrs = {"padding": padding, "stride": stride, "dilation": dilation, "activation": activation}
    inputs = [x, f, b]
    (got,) = run_kernel("CONV_2D", attrs, inputs, [want.shape], consts=(1, 2))
    close(got, want)
    vs_reference("CONV_2D", inputs, attrs, [got])


@pytest.mark.parametrize("o", [4, 40])
def test_conv2d_im2col_blocks(monkeypatch, o):
    """Force several im2col blocks (and a shorter last one) so block boundaries are exercised
    (stride 2 and five channels: neither the shifted-taps nor the direct kernel takes it)."""
    from litegpu_cpu.kernels import conv
    monkeypatch.setattr(conv, "_IM2COL_BLOCK_BYTES", 4 * 45 * 7)   # 7 rows of K=45 per block
    x, f, b = rand(1, 9, 10, 5), rand(o, 3, 3, 5), rand(o)
    attrs = {"padding": "SAME", "stride": (2, 2), "dilation": (1, 1), "activation": "RELU"}
    real, calls = conv.im2col, []

    def counting(*args):
        calls.append(args)
        return real(*args)
    monkeypatch.setattr(conv, "im2col", counting)
    (got,) = run_kernel("CONV_2D", attrs, [x, f, b], [(1, 5, 5, o)], consts=(1, 2))
    assert len(calls) == 4     # 25 rows in blocks of 7
    close(got, direct_conv(x, f, b, (2, 2), (1, 1), "SAME", "RELU"))


def test_conv2d_small_images_take_im2col_where_it_fills_the_tiles(monkeypatch):
    """A 7x7 output row is a tile of 6 rows and a second tile recomputing 5 of them in the
    implicit GEMM; im2col's 49 rows fill 9 tiles nearly whole: a wide 3x3 conv on a small
    image (ResNet's last stage) takes im2col, a large image keeps the implicit GEMM. Both
    give the same bits (one product, one order of sums)."""
    from litegpu_cpu.kernels import conv
    assert conv._im2col_fills_tiles_better(49, 7, 512) and conv._im2col_fills_tiles_better(196, 14, 256)
    assert not conv._im2col_fills_tiles_better(784, 28, 128) and not conv._im2col_fills_tiles_better(49, 7, 32)
    assert not conv._im2col_fills_tiles_better(1024, 32, 64)
    assert not conv._im2col_fills_tiles_better(0, 0, 512)
    x, f, b = rand(1, 7, 7, 16), rand(64, 3, 3, 16, scale=0.3), rand(64)
    attrs = {"padding": "SAME", "stride": (1, 1), "dilation": (1, 1), "activation": "RELU"}
    calls = []
    real = conv.im2col
    monkeypatch.setattr(conv, "im2col", lambda *args: calls.append(args) or real(*args))
    (im2col,) = run_kernel("CONV_2D", attrs, [x, f, b], [(1, 7, 7, 64)], consts=(1, 2))
    assert calls
    monkeypatch.setattr(conv, "_im2col_fills_tiles_better", lambda *args: False)
    calls.clear()
    (implicit,) = run_kernel("CONV_2D", attrs, [x, f, b], [(1, 7, 7, 64)], consts=(1, 2))
    assert not calls
    np.testing.assert_array_equal(im2col, implicit)
    close(im2col, direct_conv(x, f, b, (1, 1), (1, 1), "SAME", "RELU"))


def test_conv2d_declines_non_constant_filter():
    x, f = rand(1, 4, 4, 2), rand(3, 1, 1, 2)
    attrs = {"padding": "VALID", "stride": (1, 1), "dilation": (1, 1), "activation": "NONE"}
    specs = [TensorSpec(x.shape, x.dtype), TensorSpec(f.shape, f.dtype)]
    node = Node(index=0, op="CONV_2D", opcode=3, version=1, inputs=(0, 1), outputs=(2,))
    ctx = NodeContext(node=node, opdef=get_op("CONV_2D"), attrs=attrs, inputs=specs,
                      outputs=[TensorSpec((1, 4, 4, 3), np.dtype(np.float32))])
    assert KERNELS["CONV_2D"](ctx) is None


# -- DEPTHWISE_CONV_2D -------------------------------------------------------------------------

def direct_depthwise(x, f, b, stride, dilation, padding, activation, mult):
    n, h, w, c = x.shape
    _, kh, kw, oc = f.shape
    oh, pt = out_and_pad(padding, h, kh, stride[0], dilation[0])
    ow, pl = out_and_pad(padding, w, kw, stride[1], dilation[1])
    y = np.zeros((n, oh, ow, oc))
    for i in range(oh):
        for j in range(ow):
            for a in range(kh):
                for e in range(kw):
                    ih, iw = i * stride[0] - pt + a * dilation[0], j * stride[1] - pl + e * dilation[1]
                    if 0 <= ih < h and 0 <= iw < w:
                        for ch in range(oc):
                            y[:, i, j, ch] += x[:, ih, iw, ch // mult] * np.float64(f[0, a, e, ch])
    if b is not None:
        y += b
    return act(y, activation)


DW_CASES = [
    # (N, H, W, C, M, K, stride, dilation, padding, activation, bias)
    (1, 12, 12, 16, 1, 3, (1, 1), (1, 1), "SAME", "RELU6", True),
    (2, 11, 9, 8, 1, 3, (2, 2), (1, 1), "SAME", "NONE", True),
    (1, 10, 10, 3, 2, 3, (1, 1), (1, 1), "VALID", "RELU", True),       # depth multiplier 2
    (1, 13, 12, 5, 1, 5, (2, 2), (1, 1), "SAME", "NONE", False),
    (1, 12, 12, 4, 3, 3, (1, 2), (2, 2), "SAME", "TANH", True),        # dilation, multiplier 3
    # 3x3, multiplier 1 (the register path): images with no interior, odd strides and sizes
    (1, 2, 2, 16, 1, 3, (1, 1), (1, 1), "SAME", "NONE", True),
    (1, 1, 5, 7, 1, 3, (1, 1), (1, 1), "SAME", "RELU", True),
    (2, 7, 9, 33, 1, 3, (2, 1), (1, 1), "SAME", "RELU6", True),
    (1, 8, 6, 5, 1, 3, (1, 2), (1, 1), "VALID", "NONE", False),
    (1, 3, 3, 4, 1, 3, (1, 1), (1, 1), "VALID", "NONE", True),
    # 3x3, multiplier 1, stride 1 (flattened rows, four at a time): channel counts, partial last
    # row groups, dilation, several passes over a row (C=40: 480 floats a pass), no interior
    (1, 9, 10, 1, 1, 3, (1, 1), (1, 1), "SAME", "RELU6", True),
    (1, 7, 9, 3, 1, 3, (1, 1), (1, 1), "VALID", "NONE", True),
    (2, 10, 8, 16, 1, 3, (1, 1), (1, 1), "SAME", "RELU", True),
    (1, 6, 7, 17, 1, 3, (1, 1), (1, 1), "SAME", "RELU_N1_TO_1", False),
    (1, 5, 6, 32, 1, 3, (1, 1), (1, 1), "VALID", "RELU6", True),
    (1, 9, 9, 144, 1, 3, (1, 1), (1, 1), "SAME", "RELU6", True),
    (1, 5, 30, 40, 1, 3, (1, 1), (1, 1), "SAME", "NONE", True),
    (1, 11, 9, 32, 1, 3, (1, 1), (2, 2), "SAME", "NONE", True),
    (2, 13, 12, 5, 1, 3, (1, 1), (3, 2), "VALID", "RELU", True),
    (1, 3, 4, 8, 1, 3, (1, 1), (2, 2), "SAME", "NONE", True),
    (1, 9, 10, 16, 1, 3, (1, 1), (2, 2), "SAME", "RELU6", True),     # a dilation phase with no row
    (1, 1, 1, 16, 1, 3, (1, 1), (1, 1), "SAME", "RELU6", True),
    (1, 2, 3, 17, 1, 3, (1, 1), (1, 1), "SAME", "NONE", True),
    (2, 1, 1, 3, 1, 3, (1, 1), (1, 1), "SAME", "RELU", False),
    # 3x3, multiplier 1, stride 2 (2x2 output blocks): even and odd sizes (padding before 0
    # or 1), a last row pair with one row, an odd interior column, no interior
    (1, 12, 12, 16, 1, 3, (2, 2), (1, 1), "SAME", "RELU6", True),
    (2, 11, 13, 17, 1, 3, (2, 2), (1, 1), "SAME", "NONE", True),
    (1, 9, 9, 3, 1, 3, (2, 2), (1, 1), "VALID", "RELU", False),
    (1, 15, 15, 32, 1, 3, (2, 2), (1, 1), "VALID", "RELU_N1_TO_1", True),
    (1, 8, 10, 144, 1, 3, (2, 2), (1, 1), "SAME", "RELU6", True),
    (1, 10, 7, 1, 1, 3, (2, 2), (1, 1), "SAME", "NONE", True),
    (1, 1, 1, 16, 1, 3, (2, 2), (1, 1), "SAME", "RELU6", True),
    (2, 2, 3, 1, 1, 3, (2, 2), (1, 1), "SAME", "NONE", True),
    (1, 3, 3, 5, 1, 3, (2, 2), (1, 1), "VALID", "RELU", True),
]


@pytest.mark.parametrize("case", DW_CASES, ids=lambda c: f"m{c[4]}-k{c[5]}-s{c[6][0]}{c[6][1]}-d{c[7][0]}-{c[8]}-{c[9]}")
def test_depthwise(case):
    n, h, w, c, m, k, stride, dilation, padding, activation, has_bias = case
    x, f = rand(n, h, w, c), rand(1, k, k, c * m)
    b = rand(c * m) if has_bias else None
    want = direct_depthwise(x, f, b, stride, dilation, padding, activation, m)
    attrs = {"padding": padding, "stride": stride, "dilation": dilation, "activation": activation,
             "depth_multiplier": m}
    inputs = [x, f, b]
    (got,) = run_kernel("DEPTHWISE_CONV_2D", attrs, inputs, [want.shape], consts=(1, 2))
    close(got, want)
    vs_reference("DEPTHWISE_CONV_2D", inputs, attrs, [got])


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("k, size, channels, specials", [
    (3, 6, 16, [((2, 3, 5), np.nan), ((0, 0, 7), np.inf), ((4, 4, 9), -np.inf)]),
    (5, 10, 24, [((2, 3, 5), np.nan), ((0, 0, 7), np.inf), ((9, 9, 20), -np.inf), ((5, 5, 17), np.inf)]),
])
def test_depthwise_propagates_nan_and_inf_like_the_reference(stride, k, size, channels, specials):
    """The 3x3 and the 5x5 kernels (each with its own speed paths): NaN and inf where the
    reference has them, the other values close."""
    x, f, b = rand(1, size, size, channels), rand(1, k, k, channels), rand(channels)
    for (h, w, c), value in specials:
        x[0, h, w, c] = value
    attrs = {"padding": "SAME", "stride": (stride, stride), "dilation": (1, 1), "activation": "NONE",
             "depth_multiplier": 1}
    out = size // stride
    (got,) = run_kernel("DEPTHWISE_CONV_2D", attrs, [x, f, b], [(1, out, out, channels)], consts=(1, 2))
    with np.errstate(invalid="ignore"):
        want = get_op("DEPTHWISE_CONV_2D").reference([x, f, b], attrs)[0]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("stride, dilation", [(1, 1), (1, 2), (1, 3), (2, 1)])
def test_depthwise3x3_writes_nothing_past_its_output(stride, dilation):
    """The output is the front of a larger buffer: the rows behind it keep their NaNs (the
    stride-1 kernel takes rows in groups that can run past the last one)."""
    x, f, b = rand(1, 9, 10, 16), rand(1, 3, 3, 16), rand(16)
    attrs = {"padding": "SAME", "stride": (stride, stride), "dilation": (dilation, dilation), "activation": "NONE",
             "depth_multiplier": 1}
    want = direct_depthwise(x, f, b, (stride, stride), (dilation, dilation), "SAME", "NONE", 1)
    run, _ = build("DEPTHWISE_CONV_2D", attrs, [x, f, b], [want.shape], consts=(1, 2))
    buffer = np.full((1, want.shape[1] + 8, *want.shape[2:]), np.nan, np.float32)
    run([x, f, b], [buffer[:, :want.shape[1]]])
    close(buffer[:, :want.shape[1]], want)
    assert np.isnan(buffer[:, want.shape[1]:]).all()


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("k, c", [(3, 24), (5, 40)])
def test_depthwise3x3_and_5x5_on_any_thread_count(threads, stride, k, c):
    """The parallel 3x3 and 5x5 kernels split their work over numba's threads; each count
    gives the same result."""
    import numba
    x, f, b = rand(2, 13, 11, c), rand(1, k, k, c), rand(c)
    attrs = {"padding": "SAME", "stride": (stride, stride), "dilation": (1, 1), "activation": "RELU6",
             "depth_multiplier": 1}
    want = direct_depthwise(x, f, b, (stride, stride), (1, 1), "SAME", "RELU6", 1)
    before = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        (got,) = run_kernel("DEPTHWISE_CONV_2D", attrs, [x, f, b], [want.shape], consts=(1, 2))
    finally:
        numba.set_num_threads(before)
    close(got, want)


@pytest.mark.parametrize("stride", [1, 2])
def test_depthwise3x3_takes_strided_arrays(stride):
    """The 3x3 kernels read raw pointers: a non-contiguous input is copied first and a
    non-contiguous output written through scratch, leaving the bytes between its elements."""
    x_big, f, b = rand(1, 8, 8, 32), rand(1, 3, 3, 16), rand(16)
    x = x_big[..., ::2]
    attrs = {"padding": "SAME", "stride": (stride, stride), "dilation": (1, 1), "activation": "NONE",
             "depth_multiplier": 1}
    want = direct_depthwise(x, f, b, (stride, stride), (1, 1), "SAME", "NONE", 1)
    run, _ = build("DEPTHWISE_CONV_2D", attrs, [x, f, b], [want.shape], consts=(1, 2))
    out_big = np.full((*want.shape[:3], 32), np.nan, np.float32)
    run([x, f, b], [out_big[..., 1::2]])
    close(out_big[..., 1::2], want)
    assert np.isnan(out_big[..., ::2]).all()


def test_depthwise3x3_refuses_arrays_of_other_shapes():
    """Its shapes are fixed when it is built; other arrays are an error, not a stray write."""
    x, f, b = rand(1, 8, 8, 16), rand(1, 3, 3, 16), rand(16)
    attrs = {"padding": "SAME", "stride": (1, 1), "dilation": (1, 1), "activation": "NONE",
             "depth_multiplier": 1}
    run, (out,) = build("DEPTHWISE_CONV_2D", attrs, [x, f, b], [(1, 8, 8, 16)], consts=(1, 2))
    with pytest.raises(ValueError, match=r"built for input \(1, 8, 8, 16\).*given \(1, 9, 8, 16\)"):
        run([rand(1, 9, 8, 16), f, b], [np.empty((1, 9, 8, 16), np.float32)])


def test_run_plan_calls_the_task_function_once_per_task():
    """The shared launcher of :mod:`litegpu_cpu.kernels.tasks`, with a task function
    written here: every task index runs once, on any thread, with its parameters (two
    arrays given, the other four slots left to the launcher)."""
    import numba
    from numba import carray

    from litegpu_cpu.kernels.tasks import bound_tasks, task_function

    @task_function()
    def scaled_index(t, a0, a1, a2, a3, a4, a5, a6, a7, ip, fp):
        out = carray(a1, ip[0])
        out[t] += np.float32(t) * fp[0] + a0[0]

    out = np.zeros(37, np.float32)
    first = np.full(1, 0.5, np.float32)
    before = numba.get_num_threads()
    numba.set_num_threads(min(2, numba.config.NUMBA_NUM_THREADS))
    try:
        call = bound_tasks(scaled_index, out.size, (first, out),
                           np.array([out.size], np.int64), np.array([3.0], np.float32))
        del first, out
        call()
        out = call.held[1]
    finally:
        numba.set_num_threads(before)
    np.testing.assert_array_equal(out, np.arange(37, dtype=np.float32) * 3 + 0.5)



def test_chained_task_calls_run_in_order_as_one_call():
    """:func:`chained` runs several bound task calls as one plan, in order: the second
    reads what the first wrote, a one-task row runs on the calling thread and a
    many-task row over the threads, and a chain chains again."""
    from numba import carray

    from litegpu_cpu.kernels.tasks import bound_tasks, chained, is_plan, task_function

    @task_function()
    def affine(t, a0, a1, a2, a3, a4, a5, a6, a7, ip, fp):
        x, y = carray(a0, ip[0]), carray(a1, ip[0])
        part = (ip[0] + ip[1] - 1) // ip[1]
        for i in range(t * part, min(ip[0], (t + 1) * part)):
            y[i] = x[i] * fp[0] + fp[1]

    x = np.arange(50, dtype=np.float32)
    y, z, w = (np.zeros(50, np.float32) for _ in range(3))

    def step(src, dst, tasks, scale, shift):
        return bound_tasks(affine, tasks, (src, dst), np.array([50, tasks], np.int64),
                           np.array([scale, shift], np.float32))

    first = chained([step(x, y, 1, 2.0, 1.0), step(y, z, 7, -1.0, 0.5)])
    call = chained([first, step(z, w, 2, 3.0, 0.0)])
    assert is_plan(call) and call.rows.shape[0] == 3
    call()
    np.testing.assert_array_equal(w, ((x * 2 + 1) * -1 + 0.5) * 3)

# -- TRANSPOSE_CONV ---------------------------------------------------------------------------

def direct_transpose_conv(x, f, b, out_hw, stride, padding, activation):
    """Scatter: input pixel (i, j) adds x . f[:, a, e] at output (i*s - pad + a, j*s - pad + e)."""
    n, h, w, c = x.shape
    o, kh, kw, _ = f.shape
    pads = []
    for size, k, s in zip(out_hw, (kh, kw), stride):
        pads.append(same_pad(size, k, s)[1] if padding == "SAME" else 0)
    y = np.zeros((n, *out_hw, o))
    for i in range(h):
        for j in range(w):
            for a in range(kh):
                for e in range(kw):
                    oi, oj = i * stride[0] - pads[0] + a, j * stride[1] - pads[1] + e
                    if 0 <= oi < out_hw[0] and 0 <= oj < out_hw[1]:
                        y[:, oi, oj, :] += np.einsum("nc,oc->no", x[:, i, j, :].astype(np.float64), f[:, a, e, :])
    if b is not None:
        y += b
    return act(y, activation)


TCONV_CASES = [
    # (N, H, W, C, O, K, stride, out_hw, padding, activation, bias)
    (1, 6, 6, 8, 4, 3, (2, 2), (12, 12), "SAME", "NONE", True),
    (2, 5, 4, 3, 5, 3, (2, 2), (11, 9), "VALID", "RELU", True),
    (1, 5, 5, 4, 3, 2, (2, 2), (10, 10), "SAME", "NONE", False),
    (1, 7, 6, 3, 2, 3, (1, 1), (7, 6), "SAME", "RELU6", True),
    (1, 5, 5, 2, 3, 4, (3, 2), (15, 9), "SAME", "NONE", True),      # odd output, uneven stride
]


@pytest.mark.parametrize("case", TCONV_CASES, ids=lambda c: f"k{c[5]}-s{c[6][0]}{c[6][1]}-{c[8]}-{c[9]}")
def test_transpose_conv(case):
    n, h, w, c, o, k, stride, out_hw, padding, activation, has_bias = case
    x, f = rand(n, h, w, c), rand(o, k, k, c)
    b = rand(o) if has_bias else None
    want = direct_transpose_conv(x, f, b, out_hw, stride, padding, activation)
    shape = np.array([n, *out_hw, o], np.int32)
    attrs = {"padding": padding, "stride": stride, "activation": activation}
    inputs = [shape, f, x, b]
    (got,) = run_kernel("TRANSPOSE_CONV", attrs, inputs, [want.shape], consts=(0, 1, 3))
    close(got, want)
    vs_reference("TRANSPOSE_CONV", inputs, attrs, [got])


def test_convolution2d_transpose_bias():
    x, f, b = rand(1, 4, 5, 3), rand(6, 3, 3, 3), rand(6)
    want = direct_transpose_conv(x, f, b, (8, 10), (2, 2), "SAME", "NONE")
    attrs = {"padding": "SAME", "stride": (2, 2), "activation": "NONE"}
    (got,) = run_kernel("Convolution2DTransposeBias", attrs, [x, f, b], [want.shape], consts=(1, 2))
    close(got, want)
    vs_reference("Convolution2DTransposeBias", [x, f, b], attrs, [got])


# -- pooling -----------------------------------------------------------------------------------

def direct_pool(x, kind, filt, stride, padding, activation):
    n, h, w, c = x.shape
    oh, pt = out_and_pad(padding, h, filt[0], stride[0])
    ow, pl = out_and_pad(padding, w, filt[1], stride[1])
    y = np.zeros((n, oh, ow, c))
    for i in range(oh):
        for j in range(ow):
            rows = [r for r in range(i * stride[0] - pt, i * stride[0] - pt + filt[0]) if 0 <= r < h]
            cols = [q for q in range(j * stride[1] - pl, j * stride[1] - pl + filt[1]) if 0 <= q < w]
            window = x[:, rows][:, :, cols].astype(np.float64)
            y[:, i, j] = window.max(axis=(1, 2)) if kind == "MAX" else window.mean(axis=(1, 2))
    return act(y, activation)


POOL_CASES = [
    ("MAX", (2, 2), (2, 2), "VALID", "NONE", (1, 8, 8, 16)),
    ("MAX", (3, 3), (2, 2), "SAME", "RELU", (2, 9, 11, 5)),
    ("AVG", (3, 3), (1, 1), "SAME", "RELU6", (1, 7, 7, 6)),
    ("AVG", (2, 3), (2, 2), "VALID", "NONE", (2, 9, 10, 3)),
    ("AVG", (7, 7), (1, 1), "VALID", "NONE", (1, 7, 7, 32)),    # global average
]


@pytest.mark.parametrize("case", POOL_CASES, ids=lambda c: f"{c[0]}-{c[1][0]}x{c[1][1]}-s{c[2][0]}-{c[3]}-{c[4]}")
def test_pool(case):
    kind, filt, stride, padding, activation, shape = case
    x = rand(*shape)
    want = direct_pool(x, kind, filt, stride, padding, activation)
    op = "MAX_POOL_2D" if kind == "MAX" else "AVERAGE_POOL_2D"
    attrs = {"padding": padding, "stride": stride, "filter": filt, "activation": activation}
    (got,) = run_kernel(op, attrs, [x], [want.shape])
    close(got, want)
    vs_reference(op, [x], attrs, [got])


# -- FULLY_CONNECTED / BATCH_MATMUL -----------------------------------------------------------

@pytest.mark.parametrize("x_shape,keep,has_bias,const_w,activation,o", [
    ((1, 64), False, True, True, "NONE", 12),
    ((3, 20), False, True, True, "RELU", 12),
    ((2, 5, 16), True, False, True, "NONE", 12),
    ((2, 5, 16), False, True, False, "RELU6", 12),
    ((1, 1536), False, True, True, "NONE", 32),          # GEMV: dot products
    ((1, 128), False, False, True, "RELU_N1_TO_1", 7),
    ((4, 512), False, True, True, "RELU6", 515),         # GEMV on two threads, odd width
    ((2, 3, 256), True, True, True, "RELU", 40),          # six rows: not a GEMV
])
def test_fully_connected(x_shape, keep, has_bias, const_w, activation, o):
    k = x_shape[-1]
    x, w = rand(*x_shape), rand(o, k)
    b = rand(o) if has_bias else None
    rows = x.reshape(-1, k).astype(np.float64)
    want = np.einsum("mk,ok->mo", rows, w.astype(np.float64)) + (0 if b is None else b)
    want = act(want, activation).reshape((*x_shape[:-1], o) if keep else (-1, o))
    attrs = {"activation": activation, "keep_num_dims": keep}
    inputs = [x, w, b]
    (got,) = run_kernel("FULLY_CONNECTED", attrs, inputs, [want.shape], consts=(1, 2) if const_w else (2,))
    close(got, want)
    vs_reference("FULLY_CONNECTED", inputs, attrs, [got])


@pytest.mark.parametrize("rows,depth,width,kernel", [
    (1, 1536, 32, "gemv"), (4, 128, 9, "gemv"), (3, 512, 512, "gemv_parallel"),
    (5, 1536, 32, None), (1, 127, 32, "gemv"), (2, 9, 20, "gemv"),
])
def test_fully_connected_gemv_path_and_nan(rows, depth, width, kernel):
    """Few rows of a constant weight take the GEMV, and a NaN or inf
    in a row reaches exactly that row's outputs, as in the reference."""
    from litegpu_cpu.kernels import gemv
    from litegpu_cpu.kernels.tasks import is_plan
    x, w, b = rand(rows, depth), rand(width, depth), rand(width)
    x[0, 3] = np.nan
    if rows > 1:
        x[1, 5] = np.inf
    attrs = {"activation": "NONE", "keep_num_dims": False}
    run, outs = build("FULLY_CONNECTED", attrs, [x, w, b], [(rows, width)], consts=(1, 2))
    call = run.bind([x, w, b], outs)
    chosen = None
    if is_plan(call):           # a task function's bound call: which one, on how many threads?
        (address, tasks, *_), = call.rows
        if address == gemv._gemv_task.address:
            chosen = "gemv_parallel" if tasks == 2 else "gemv"
    assert chosen == kernel if kernel else chosen not in ("gemv", "gemv_parallel")
    call()
    (want,) = get_op("FULLY_CONNECTED").reference([x, w, b], attrs)
    np.testing.assert_array_equal(np.isnan(outs[0]), np.isnan(want))
    assert np.isnan(outs[0][0]).all()
    finite = np.isfinite(want)
    np.testing.assert_allclose(outs[0][finite], want[finite], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("a_shape,b_shape,adj_x,adj_y", [
    ((2, 4, 6), (2, 6, 5), False, False),
    ((1, 4, 8, 16), (1, 4, 8, 16), False, True),
    ((3, 6, 4), (6, 5), True, False),               # broadcast batch
    ((2, 1, 5, 3), (4, 4, 5), True, True),
])
def test_batch_matmul(a_shape, b_shape, adj_x, adj_y):
    a, b = rand(*a_shape), rand(*b_shape)
    sa = "...km" if adj_x else "...mk"
    sb = "...nk" if adj_y else "...kn"
    want = np.einsum(f"{sa},{sb}->...mn", a.astype(np.float64), b.astype(np.float64))
    attrs = {"adj_x": adj_x, "adj_y": adj_y}
    (got,) = run_kernel("BATCH_MATMUL", attrs, [a, b], [want.shape])
    close(got, want)
    vs_reference("BATCH_MATMUL", [a, b], attrs, [got])


# -- elementwise -------------------------------------------------------------------------------

BINARY = {"ADD": np.add, "SUB": np.subtract, "MUL": np.multiply, "DIV": np.divide,
          "MAXIMUM": np.maximum, "MINIMUM": np.minimum}


@pytest.mark.parametrize("op", sorted(BINARY))
@pytest.mark.parametrize("shapes,activation", [
    (((1, 6, 6, 8), (1, 6, 6, 8)), "NONE"),
    (((2, 5, 5, 8), (1, 1, 1, 8)), "RELU6"),
    (((4, 1), (3,)), "RELU"),
    (((2, 3), ()), "RELU_N1_TO_1"),
])
def test_binary(op, shapes, activation):
    a, b = rand(*shapes[0]), rand(*shapes[1])
    if op == "DIV":
        b = np.where(np.abs(b) < 0.1, np.float32(0.5), b).astype(np.float32)
    fused = op in ("ADD", "SUB", "MUL", "DIV")
    activation = activation if fused else "NONE"
    want = BINARY[op](a.astype(np.float64), b.astype(np.float64))
    if fused:
        want = act(want, activation)
    attrs = {"activation": activation} if fused else {}
    (got,) = run_kernel(op, attrs, [a, b], [want.shape])
    close(got, want)
    vs_reference(op, [a, b], attrs, [got])


def test_add_int32():
    a = RNG.integers(-1000, 1000, (3, 4)).astype(np.int32)
    b = RNG.integers(-1000, 1000, (4,)).astype(np.int32)
    (got,) = run_kernel("ADD", {"activation": "NONE"}, [a, b], [(3, 4)], out_dtype=np.int32)
    assert got.dtype == np.int32 and np.array_equal(got, a + b)


def test_squared_difference():
    a, b = rand(2, 8), rand(8)
    (got,) = run_kernel("SQUARED_DIFFERENCE", {}, [a, b], [(2, 8)])
    close(got, (a.astype(np.float64) - b) ** 2)


def _gelu(x):
    from math import erf, sqrt
    return np.vectorize(lambda v: 0.5 * v * (1 + erf(v / sqrt(2))))(x)


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


UNARY = {
    "RELU": lambda x: np.maximum(x, 0),
    "RELU6": lambda x: np.clip(x, 0, 6),
    "RELU_N1_TO_1": lambda x: np.clip(x, -1, 1),
    "TANH": np.tanh,
    "LOGISTIC": lambda x: 1 / (1 + np.exp(-x)),
    "HARD_SWISH": lambda x: x * np.clip(x + 3, 0, 6) / 6,
    "GELU": _gelu,
    "EXP": np.exp,
    "NEG": np.negative,
    "ABS": np.abs,
    "SQUARE": np.square,
    "SQRT": lambda x: np.sqrt(np.abs(x)),
    "RSQRT": lambda x: 1 / np.sqrt(np.abs(x)),
}


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary(op):
    x = rand(2, 7, 5, 9, scale=4.0)
    x[0, 0, 0, :3] = [-100.0, 100.0, 0.0]     # logistic saturation, hard-swish clamps
    if op in ("SQRT", "RSQRT"):
        x = np.abs(x) + np.float32(0.01)
    if op in ("EXP", "SQUARE"):
        x = np.clip(x, -20, 20)
    want = UNARY[op](x.astype(np.float64))
    attrs = {"approximate": False} if op == "GELU" else {}
    (got,) = run_kernel(op, attrs, [x], [x.shape])
    close(got, want)
    vs_reference(op, [x], attrs, [got])


def test_gelu_approximate():
    x = rand(3, 33, scale=3.0)
    (got,) = run_kernel("GELU", {"approximate": True}, [x], [x.shape])
    close(got, _gelu_tanh(x.astype(np.float64)))


# -- reductions, softmax ------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN"])
@pytest.mark.parametrize("shape,axes,keep", [
    ((2, 7, 5, 16), (1, 2), True),       # spatial, keep dims (squeeze-excite)
    ((1, 7, 7, 32), (1, 2), False),      # classifier head
    ((1, 64, 128), (-1,), True),         # layer norm
    ((3, 4, 5), (0, 2), False),
])
def test_reduce(op, shape, axes, keep):
    x = rand(*shape)
    fn = {"MEAN": np.mean, "SUM": np.sum, "REDUCE_MAX": np.max, "REDUCE_MIN": np.min}[op]
    want = fn(x.astype(np.float64), axis=axes, keepdims=keep)
    axes_arr = np.array(axes, np.int32)
    attrs = {"keep_dims": keep}
    (got,) = run_kernel(op, attrs, [x, axes_arr], [want.shape], consts=(1,))
    close(got, want)
    vs_reference(op, [x, axes_arr], attrs, [got])


@pytest.mark.parametrize("shape,beta", [((2, 10), 1.0), ((1, 4, 64, 64), 1.0), ((3, 7), 0.5)])
def test_softmax(shape, beta):
    x = rand(*shape, scale=3.0)
    z = x.astype(np.float64) * beta
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    want = e / e.sum(axis=-1, keepdims=True)
    (got,) = run_kernel("SOFTMAX", {"beta": beta}, [x], [shape])
    close(got, want)
    vs_reference("SOFTMAX", [x], {"beta": beta}, [got])


# -- resize, pad, concatenation -----------------------------------------------------------------

def direct_resize(x, out_hw, align, half):
    n, h, w, c = x.shape
    y = np.zeros((n, *out_hw, c))

    def source(i, size_in, size_out):
        scale = (size_in - 1) / (size_out - 1) if align and size_out > 1 else size_in / size_out
        s = (i + 0.5) * scale - 0.5 if half else i * scale
        lo = max(int(np.floor(s)), 0)
        hi = min(int(np.ceil(s)), size_in - 1)
        return lo, hi, s - lo

    for i in range(out_hw[0]):
        y0, y1, fy = source(i, h, out_hw[0])
        for j in range(out_hw[1]):
            x0, x1, fx = source(j, w, out_hw[1])
            top = x[:, y0, x0] * (1 - fx) + x[:, y0, x1] * fx
            bottom = x[:, y1, x0] * (1 - fx) + x[:, y1, x1] * fx
            y[:, i, j] = top * (1 - fy) + bottom * fy
    return y


@pytest.mark.parametrize("in_hw,out_hw,align,half", [
    ((4, 4), (8, 8), False, False),
    ((5, 7), (10, 13), True, False),
    ((6, 5), (12, 11), False, True),
    ((8, 8), (3, 5), False, True),     # downscale
])
def test_resize_bilinear(in_hw, out_hw, align, half):
    x = rand(2, *in_hw, 3)
    want = direct_resize(x.astype(np.float64), out_hw, align, half)
    size = np.array(out_hw, np.int32)
    attrs = {"align_corners": align, "half_pixel_centers": half}
    (got,) = run_kernel("RESIZE_BILINEAR", attrs, [x, size], [want.shape], consts=(1,))
    close(got, want)
    vs_reference("RESIZE_BILINEAR", [x, size], attrs, [got])


@pytest.mark.parametrize("op,value", [("PAD", None), ("PADV2", -2.5)])
def test_pad(op, value):
    x = rand(2, 3, 4, 5)
    pads = np.array([[0, 0], [1, 2], [3, 0], [0, 1]], np.int32)
    want = np.full((2, 6, 7, 6), 0.0 if value is None else value)
    want[:, 1:4, 3:7, 0:5] = x
    inputs = [x, pads] + ([] if value is None else [np.array([value], np.float32)])
    (got,) = run_kernel(op, {}, inputs, [want.shape], consts=(1, 2))
    close(got, want)
    vs_reference(op, inputs, {}, [got])


@pytest.mark.parametrize("dtype,value", [(np.float32, -0.0), (np.float32, np.nan), (np.int8, -3), (np.int16, 0),
                                         (np.float16, 1.5), (np.int32, 7), (np.int64, -(1 << 40)), (np.bool_, True)])
@pytest.mark.parametrize("rank", [1, 2, 3, 4, 5])
def test_pad_rows_match_numpy(dtype, value, rank):
    """The row-copy PAD task over ranks, dtypes (1 to 8 bytes), values whose bits are not
    zero (-0.0, NaN), axes padded or not, and outputs big enough to split into tasks."""
    rng = np.random.default_rng(rank)
    shape = tuple(int(d) for d in rng.integers(1, 5, rank))
    if rank >= 3:
        shape = (*shape[:-1], 300)   # past _PAD_PARALLEL_BYTES: several tasks
    pads = rng.integers(0, 3, (rank, 2)) * rng.integers(0, 2, (rank, 1))   # some axes unpadded
    pads[rank // 2] = [1, 2]
    x = (rng.standard_normal(shape) * 50).astype(dtype)
    want = np.pad(x, pads, constant_values=np.array(value).astype(dtype))
    inputs = [x, pads.astype(np.int32), np.array([value]).astype(dtype)]
    run, (got,) = build("PADV2", {}, inputs, [want.shape], consts=(1, 2), out_dtype=dtype)
    assert hasattr(run, "bind")   # the task function, not the numpy fill-and-copy
    got[...] = 1
    run.bind(inputs, [got])()
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))   # bit for bit


@pytest.mark.parametrize("axis,activation", [(3, "NONE"), (-1, "RELU"), (1, "NONE"), (0, "RELU6")])
def test_concatenation(axis, activation):
    parts = [rand(2, 3, 4, 5), rand(2, 3, 4, 5), rand(2, 3, 4, 5)]
    parts[1] = parts[1][:, :, :, :2].copy() if axis in (3, -1) else parts[1]
    want = act(np.concatenate(parts, axis=axis).astype(np.float64), activation)
    attrs = {"axis": axis, "activation": activation}
    (got,) = run_kernel("CONCATENATION", attrs, parts, [want.shape])
    close(got, want)
    vs_reference("CONCATENATION", parts, attrs, [got])


@pytest.mark.parametrize("shape,perm", [
    ((1, 64, 4, 32), (0, 2, 1, 3)),          # attention heads out: rows of 32 stay contiguous
    ((1, 64, 4, 32), (0, 2, 3, 1)),          # keys transposed: a strided read per element
    ((2, 3, 4, 5, 6, 7, 2), (6, 0, 5, 1, 4, 2, 3)),   # rank 7, two dimensions merge: six loops
    ((2, 3, 2, 3, 2, 3, 2), (6, 5, 4, 3, 2, 1, 0)),   # rank 7 reversed, nothing merges: numpy's copy
    ((3, 1, 5), (1, 2, 0)),
    ((7,), (0,)),
    ((64, 64, 33), (1, 0, 2)),               # big enough for tasks over the threads
    ((5, 3, 1200), (1, 0, 2)),               # three loops: tasks split the outermost, not a padding 1
    ((9, 2000), (1, 0)),                     # two loops, eight tasks over 2000 rows
])
@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.int16, np.int64, np.bool_])
def test_transpose_any_rank_and_element_size(shape, perm, dtype):
    x = (RNG.standard_normal(shape) * 50).astype(dtype)
    node = Node(index=0, op="TRANSPOSE", opcode=0, version=1, inputs=(0, 1), outputs=(2,))
    p = np.array(perm, np.int32)
    want = x.transpose(perm)
    ctx = NodeContext(node=node, opdef=get_op("TRANSPOSE"), attrs={},
                      inputs=[TensorSpec(shape, np.dtype(dtype)), TensorSpec(p.shape, np.dtype(np.int32), p)],
                      outputs=[TensorSpec(want.shape, np.dtype(dtype))])
    out = np.zeros(want.shape, dtype)
    KERNELS["TRANSPOSE"](ctx)([x, p], [out])
    np.testing.assert_array_equal(out, want)


def test_cast_between_int32_and_float32_converts_as_litert_does():
    """The CAST task (a decoder's positions to float and back) on the values where
    conversions differ: NaN and the infinities, truncation toward zero, the saturation
    limits, and int32 values float32 cannot hold exactly."""
    from litegpu.ops.elementwise import cast_like_litert
    floats = np.array([np.nan, np.inf, -np.inf, 2.5, -2.5, -0.7, 0.7, 2147483520.0, 2147483648.0, -2147483648.0,
                       -2147483904.0, 1e20, -1e20, 0.0, -0.0], np.float32)
    ints = np.array([0, 1, -1, 16777217, -16777217, 2147483647, -2147483648, 123456789], np.int32)
    for x, dtype in ((floats, np.int32), (ints, np.float32)):
        got, = run_kernel("CAST", {"out_dtype": np.dtype(dtype)}, [x], [x.shape], out_dtype=dtype)
        want = cast_like_litert(x, np.dtype(dtype))
        assert got.dtype == want.dtype and np.array_equal(got, want)
