"""Float DEPTHWISE_CONV_2D, AVERAGE_POOL_2D, MEAN / SUM, SOFTMAX, SIN, COS, RSQRT, SQRT, TANH and
few-row FULLY_CONNECTED on cpu with LiteRT's bits: the order of XNNPACK's sums
(litegpu_cpu.kernels.xnn_order), against LiteRT itself on single-op models, every cpu
kernel of each op (the 3x3 stride-1 and stride-2 paths, the framed 5x5 one, the general
one; the pool's passes; channel and row sums, over one run of axes or several).

The tap orders, the pool's tree and the channel sums are XNNPACK's on any x86 host; a
depthwise tap is one fused multiply-add only where XNNPACK runs its FMA3 or AVX-512F
kernels (``MATCHES_LITERT``), a row sum is XNNPACK's where it runs the AVX-512F one
(``RSUM_MATCHES_LITERT``): elsewhere those checks skip.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from numba import njit

import litegpu
from litegpu.testing.builder import ModelBuilder
from litegpu_cpu.kernels import xnn_order

from ai_edge_litert.interpreter import Interpreter as LiteRT  # a test dependency: never skipped

F32 = np.float32
x86 = pytest.mark.skipif(not xnn_order.X86, reason="XNNPACK's orders are checked against LiteRT on x86")
fma_host = pytest.mark.skipif(not xnn_order.MATCHES_LITERT,
                              reason="LiteRT's depthwise kernels multiply and add apart on a host without FMA")
avx512_host = pytest.mark.skipif(not xnn_order.RSUM_MATCHES_LITERT,
                                 reason="XNNPACK's row sum has other lanes on a host without AVX-512F")


def out_size(size: int, k: int, s: int, d: int, padding: str) -> int:
    span = (k - 1) * d + 1
    return -(-size // s) if padding == "SAME" else (size - span) // s + 1


def run_both(data: bytes, xs: list[np.ndarray], threads: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Output 0 of litegpu (cpu) and of LiteRT on ``xs``."""
    got = []
    for interp in (litegpu.Interpreter(model_content=data, num_threads=threads),
                   LiteRT(model_content=data, num_threads=threads)):
        interp.allocate_tensors()
        for d, x in zip(interp.get_input_details(), xs):
            interp.set_tensor(d["index"], x)
        interp.invoke()
        got.append(interp.get_tensor(interp.get_output_details()[0]["index"]).copy())
    return got[0], got[1]


def assert_same_bits(ours: np.ndarray, litert: np.ndarray) -> None:
    """Bit for bit (the sign of a zero, NaN too)."""
    assert ours.shape == litert.shape and ours.dtype == litert.dtype == F32
    differ = ours.view(np.uint32) != litert.view(np.uint32)
    assert not differ.any(), (f"{differ.sum()} of {differ.size} differ, e.g. ours {ours[differ][:4]} "
                              f"LiteRT {litert[differ][:4]}")


# -- DEPTHWISE_CONV_2D -------------------------------------------------------------------------

def depthwise_model(shape, k, stride, dilation, padding, mult, activation, w, bias, relu_after=None) -> bytes:
    """One DEPTHWISE_CONV_2D (``relu_after``: its activation NONE, then that op)."""
    n, h, wd, c = shape
    kh, kw = k
    oh, ow = out_size(h, kh, stride, dilation, padding), out_size(wd, kw, stride, dilation, padding)
    b = ModelBuilder()
    x = b.input("x", shape, F32)
    y = b.tensor("y", (n, oh, ow, c * mult), F32)
    b.op("DEPTHWISE_CONV_2D", [x, b.const("w", w), b.const("b", bias)], [y], padding=padding, stride_h=stride,
         stride_w=stride, dilation_h_factor=dilation, dilation_w_factor=dilation, depth_multiplier=mult,
         fused_activation_function=activation)
    if relu_after:
        z = b.tensor("z", (n, oh, ow, c * mult), F32)
        b.op(relu_after, [y], [z])
        y = z
    b.output(y)
    return b.build()


def _depthwise_cases():
    """Every kernel size, stride, padding and dilation together; channel counts, depth
    multipliers, activations and batches in turn along them."""
    channels = itertools.cycle([1, 7, 16, 40, 144, 17])
    mults = itertools.cycle([1, 1, 2])
    activations = itertools.cycle(["NONE", "RELU6", "RELU"])
    batches = itertools.cycle([1, 2])
    cases = []
    for k, s, padding, d in itertools.product((3, 5, 7), (1, 2), ("SAME", "VALID"), (1, 2)):
        cases.append(((next(batches), 15, 14, next(channels)), (k, k), s, d, padding, next(mults),
                      next(activations)))
    cases += [
        ((1, 12, 12, 144), (3, 3), 1, 1, "SAME", 1, "RELU6"),   # the stride-1 rows, several passes
        ((2, 11, 13, 40), (3, 3), 2, 1, "SAME", 1, "NONE"),      # 2x2 blocks, an odd column
        ((1, 14, 14, 240), (5, 5), 1, 1, "SAME", 1, "NONE"),     # the framed 5x5: 15 blocks of 16
        ((1, 9, 10, 40), (5, 5), 2, 1, "SAME", 1, "RELU"),       # a partial last block of 16
        ((1, 1, 3, 32), (5, 5), 1, 1, "SAME", 1, "RELU6"),       # a band of three pixels
        ((1, 5, 4, 16), (5, 5), 2, 1, "SAME", 1, "NONE"),        # rows of two: the general kernel
        ((1, 7, 7, 1152), (5, 5), 1, 1, "SAME", 1, "NONE"),
        ((1, 14, 14, 8), (5, 5), 1, 1, "SAME", 1, "NONE"),       # under 16 channels: the general kernel
        ((1, 12, 12, 16), (2, 2), 1, 1, "SAME", 1, "NONE"),      # XNNPACK's 4-tap kernel
        ((1, 12, 12, 16), (1, 3), 1, 1, "SAME", 1, "RELU6"),     # its 3-tap one
        ((1, 12, 12, 16), (3, 5), 2, 1, "SAME", 1, "NONE"),      # 15 taps: its 25-tap one
        ((1, 12, 12, 16), (5, 6), 1, 1, "SAME", 1, "NONE"),      # 30 taps: an IGEMM, row by row
        ((1, 12, 12, 16), (1, 1), 1, 1, "VALID", 1, "NONE"),     # a 1x1: XNNPACK's vmulcaddc
        ((1, 9, 9, 8), (3, 3), 1, 1, "SAME", 3, "RELU6"),        # multiplier 3: an IGEMM
    ]
    return cases


DEPTHWISE_CASES = _depthwise_cases()


@fma_host
@pytest.mark.parametrize("case", DEPTHWISE_CASES, ids=lambda c: "n{}-{}x{}x{}-k{}x{}-s{}-d{}-{}-m{}-{}".format(
    *c[0], *c[1], *c[2:]))
def test_depthwise_gives_litert_bits(case):
    shape, k, s, d, padding, mult, activation = case
    rng = np.random.default_rng(sum(shape) + 7 * k[0] + s + d)
    w = rng.standard_normal((1, *k, shape[3] * mult)).astype(F32)
    bias = rng.standard_normal(shape[3] * mult).astype(F32)
    x = rng.standard_normal(shape).astype(F32)
    assert_same_bits(*run_both(depthwise_model(shape, k, s, d, padding, mult, activation, w, bias), [x]))


@fma_host
@pytest.mark.parametrize("k, c", [((3, 3), 16), ((5, 5), 16), ((7, 7), 16), ((5, 5), 8)])
def test_depthwise_padding_taps_are_multiplied_zeros(k, c):
    """A tap in the padding adds ``0 * w`` as XNNPACK's zero buffer does. From a bias of -0
    over a zero input a sum stays -0 through negative weights (the same model with every
    weight negative shows it) and turns +0 at a positive one, in the padding too: so with
    only tap (0, 0) positive every output is +0, where skipping the padding would leave -0
    along the top row and the left column. And an infinite weight there makes NaN. The
    general kernel, which skips the padding where that changes nothing, does not here."""
    shape = (1, 6, 6, c)
    w = np.full((1, *k, c), -1, F32)
    bias = np.full(c, -0.0, F32)
    x = np.zeros(shape, F32)
    ours, theirs = run_both(depthwise_model(shape, k, 1, 1, "SAME", 1, "NONE", w, bias), [x])
    assert np.signbit(theirs).all()
    assert_same_bits(ours, theirs)
    w[0, 0, 0, :] = 1
    ours, theirs = run_both(depthwise_model(shape, k, 1, 1, "SAME", 1, "NONE", w, bias), [x])
    assert not np.signbit(theirs).any()
    assert_same_bits(ours, theirs)

    w[0, 0, 0, :] = np.inf                          # tap (0, 0): in the padding of the top row
    x = np.random.default_rng(3).standard_normal(shape).astype(F32)
    ours, theirs = run_both(depthwise_model(shape, k, 1, 1, "SAME", 1, "NONE", w, np.ones(c, F32)), [x])
    assert np.isnan(theirs[0, 0]).all()
    assert_same_bits(ours, theirs)


@fma_host
@pytest.mark.parametrize("relu", ["RELU6", "RELU"])
def test_depthwise_then_relu_folded_gives_litert_bits(relu):
    """A RELU node after a depthwise conv with no activation is folded into it (the cpu
    fusion's ``folded_activation``), as XNNPACK fuses it: the same bits."""
    rng = np.random.default_rng(11)
    shape = (1, 12, 12, 32)
    w, bias = rng.standard_normal((1, 3, 3, 32)).astype(F32), rng.standard_normal(32).astype(F32)
    x = rng.standard_normal(shape).astype(F32)
    assert_same_bits(*run_both(depthwise_model(shape, (3, 3), 1, 1, "SAME", 1, "NONE", w, bias, relu), [x]))


def test_depthwise_tap_orders():
    assert xnn_order.depthwise_taps(3, 3, 1)[:4].tolist() == [[0, 0], [1, 0], [2, 0], [0, 1]]   # column by column
    assert xnn_order.depthwise_taps(5, 5, 1).shape == (25, 2)
    assert xnn_order.depthwise_taps(7, 7, 1)[:2].tolist() == [[0, 0], [0, 1]]                   # row by row
    assert xnn_order.depthwise_taps(3, 3, 2)[:2].tolist() == [[0, 0], [0, 1]]


# -- AVERAGE_POOL_2D ---------------------------------------------------------------------------

def pool_model(shape, f, s, padding, activation) -> bytes:
    n, h, w, c = shape
    oh, ow = out_size(h, f[0], s, 1, padding), out_size(w, f[1], s, 1, padding)
    b = ModelBuilder()
    x = b.input("x", shape, F32)
    y = b.tensor("y", (n, max(oh, 1), max(ow, 1), c), F32)
    b.op("AVERAGE_POOL_2D", [x], [y], padding=padding, stride_h=s, stride_w=s, filter_height=f[0],
         filter_width=f[1], fused_activation_function=activation)
    b.output(y)
    return b.build()


def _pool_cases():
    channels = itertools.cycle([1, 7, 16, 40, 144])
    activations = itertools.cycle(["NONE", "RELU6", "RELU"])
    batches = itertools.cycle([1, 2])
    cases = [((next(batches), 13, 12, next(channels)), (k, k), s, padding, next(activations))
             for k, s, padding in itertools.product((1, 2, 3, 5, 7), (1, 2), ("SAME", "VALID"))]
    cases += [
        ((1, 42, 42, 168), (3, 3), 1, "SAME", "NONE"),    # nasnet's
        ((1, 7, 7, 1280), (7, 7), 1, "VALID", "NONE"),    # a global pool: 49 taps, six passes
        ((1, 6, 7, 16), (7, 7), 1, "VALID", "NONE"),      # a VALID window past the input: 1/49
        ((1, 12, 12, 16), (3, 2), 1, "SAME", "RELU6"),
        ((1, 12, 12, 16), (3, 3), 4, "SAME", "NONE"),     # stride > window: TFLite's own kernel
    ]
    return cases


@x86
@pytest.mark.parametrize("case", _pool_cases(), ids=lambda c: "n{}-{}x{}x{}-f{}x{}-s{}-{}-{}".format(
    *c[0], *c[1], *c[2:]))
def test_average_pool_gives_litert_bits(case):
    shape, f, s, padding, activation = case
    x = np.random.default_rng(sum(shape) + f[0] + s).standard_normal(shape).astype(F32)
    assert_same_bits(*run_both(pool_model(shape, f, s, padding, activation), [x]))


def test_pool_passes():
    passes = xnn_order.pool_passes(3, 3)
    assert passes.shape == (1, 9, 2) and passes[0, :4].tolist() == [[0, 0], [1, 0], [2, 0], [0, 1]]
    passes = xnn_order.pool_passes(2, 2)
    assert passes[0, 4:].tolist() == [[-1, -1]] * 5
    assert xnn_order.pool_passes(5, 5).shape == (3, 9, 2)


# -- MEAN / SUM --------------------------------------------------------------------------------

def reduce_model(op, shape, axes, keep) -> bytes:
    b = ModelBuilder()
    x = b.input("x", shape, F32)
    axes_n = [a % len(shape) for a in axes]
    out = [1 if i in axes_n else d for i, d in enumerate(shape) if keep or i not in axes_n]
    y = b.tensor("y", out, F32)
    b.op(op, [x, b.const("axes", np.array(axes, np.int32))], [y], keep_dims=keep)
    b.output(y)
    return b.build()


CHANNEL_SUMS = [  # a kept last axis: XNNPACK's channel sums
    ("MEAN", (1, 7, 7, 1280), [1, 2], True), ("MEAN", (1, 7, 7, 1280), [1, 2], False),
    ("MEAN", (2, 11, 11, 40), [1, 2], True), ("MEAN", (1, 9, 9, 7), [2, 1], False),
    ("MEAN", (1, 112, 112, 32), [1, 2], True), ("MEAN", (1, 4, 4, 1056), [1, 2], True),
    ("MEAN", (1, 10, 10, 16), [1], True), ("MEAN", (3, 50, 20), [1], False),
    ("MEAN", (1, 10, 10, 1), [2], True), ("MEAN", (2, 10, 10, 1), [1, 2], False),   # a kept last axis of 1
    ("SUM", (1, 7, 7, 144), [1, 2], True), ("SUM", (2, 3, 40, 7), [1, 2], False),
]
ROW_SUMS = [      # the last axis reduced: XNNPACK's row sums
    ("MEAN", (1, 64, 128), [-1], True), ("MEAN", (4, 64), [1], False), ("MEAN", (2, 5, 100), [-1], True),
    ("MEAN", (2, 5, 77), [2], True), ("MEAN", (1, 10, 10, 16), [1, 2, 3], True), ("MEAN", (3, 7), [1], True),
    ("MEAN", (2, 15), [1], True), ("MEAN", (2, 16), [1], True), ("MEAN", (2, 33), [1], True),
    ("MEAN", (1, 2, 768), [2], False), ("SUM", (2, 5, 100), [-1], True), ("SUM", (4, 64), [1], False),
]


def _reduce_id(case):
    op, shape, axes, keep = case
    return f"{op}-{'x'.join(map(str, shape))}-axes{''.join(map(str, axes))}-{'keep' if keep else 'drop'}"


@x86
@pytest.mark.parametrize("case", CHANNEL_SUMS, ids=_reduce_id)
def test_channel_sums_give_litert_bits(case):
    op, shape, axes, keep = case
    x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(F32)
    assert_same_bits(*run_both(reduce_model(op, shape, axes, keep), [x]))


@avx512_host
@pytest.mark.parametrize("case", ROW_SUMS, ids=_reduce_id)
def test_row_sums_give_litert_bits(case):
    op, shape, axes, keep = case
    x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(F32)
    assert_same_bits(*run_both(reduce_model(op, shape, axes, keep), [x]))


SEVERAL_RUNS = [  # axes in several runs (kept axes between), or with reduced axes of size 1
    ("MEAN", (1, 8, 2560), [0, 2], False),       # a LayerNorm's decomposition (phi-2)
    ("MEAN", (1, 4, 768), [0, 2], True), ("MEAN", (2, 3, 100), [0, 2], False), ("SUM", (4, 5, 37), [0, 2], True),
    ("MEAN", (2, 3, 4, 50), [1, 3], False), ("MEAN", (2, 3, 4, 50), [0, 1, 3], True),
    ("MEAN", (2, 3, 4, 50), [0, 2], False), ("SUM", (3, 2, 5, 7), [0, 2], True),    # channel sums
    ("MEAN", (2, 3, 4, 5, 6), [0, 2, 3], False), ("MEAN", (4, 1, 5, 6), [1, 3], True),
    ("MEAN", (1, 3, 4, 5), [0, 2], True), ("MEAN", (2, 1, 50), [0, 2], False), ("MEAN", (1, 7, 1, 9), [0, 2], True),
]


@avx512_host
@pytest.mark.parametrize("case", SEVERAL_RUNS, ids=_reduce_id)
def test_sums_over_several_runs_give_litert_bits(case):
    """XNNPACK sums the innermost run of axes and accumulates over the others' positions:
    ``out += sum * scale``, fused for row sums, rounded twice for channel sums."""
    op, shape, axes, keep = case
    x = (np.random.default_rng(sum(shape)).standard_normal(shape) * 2 + 0.3).astype(F32)
    assert_same_bits(*run_both(reduce_model(op, shape, axes, keep), [x]))
    squares = (("MEAN", (1, 8, 2560), (0, 2)), ("MEAN", (2, 3, 4, 5, 6), (1, 3)), ("MEAN", (2, 3, 4, 50), (0, 2)))
    if (op, shape, tuple(axes)) in squares:
        assert_same_bits(*run_both(square_reduce_model(op, shape, tuple(axes)), [x]))


@njit
def _row_sums(x, out):
    for r in range(x.shape[0]):
        out[r] = xnn_order.rsum_avx512f(x[r], 0, x.shape[1])


def _rsum_reference(row: np.ndarray) -> np.float32:
    """``xnn_f32_rsum_ukernel__avx512f_u32_acc2`` in numpy (float32 lane by lane)."""
    n, i = row.size, 0
    acc0, acc1 = np.zeros(16, F32), np.zeros(16, F32)
    while n - i >= 32:
        acc0, acc1, i = acc0 + row[i:i + 16], acc1 + row[i + 16:i + 32], i + 32
    if n - i >= 16:
        acc0, i = acc0 + row[i:i + 16], i + 16
    acc0 = acc0 + acc1
    if n > i:
        acc0 = acc0 + np.concatenate([row[i:], np.zeros(16 - (n - i), F32)])
    for half in (8, 4, 2, 1):
        acc0 = acc0[:half] + acc0[half:2 * half]
    return acc0[0]


def test_row_sum_lanes_on_any_host():
    """The row sum's vector code (16-lane intrinsics, a masked last load) adds what the
    AVX-512F kernel adds, whatever the host's vectors."""
    rng = np.random.default_rng(5)
    for n in (1, 5, 15, 16, 17, 31, 32, 33, 47, 48, 49, 64, 100, 129, 768):
        x = rng.standard_normal((6, n)).astype(F32)
        x[1] = -0.0                               # a row of -0: XNNPACK's zero lanes make it +0
        out = np.empty(6, F32)
        _row_sums(x, out)
        want = np.array([_rsum_reference(row) for row in x], F32)
        assert (out.view(np.uint32) == want.view(np.uint32)).all(), n


# -- SOFTMAX, SIN, COS, RSQRT: XNNPACK's elementwise arithmetic ----------------------------------

def unary_model(op: str, shape: tuple[int, ...], **options) -> bytes:
    b = ModelBuilder()
    x = b.input("x", shape, F32)
    y = b.tensor("y", shape, F32)
    b.op(op, [x], [y], **options)
    b.output(y)
    return b.build()


@avx512_host
@pytest.mark.parametrize("width", [1, 5, 16, 63, 64, 77, 130, 512, 1000])
def test_softmax_gives_litert_bits(width):
    """XNNPACK's exponentials, its sum (blocks of 64 over two accumulators, of 16, the
    tail) and ``1 / sum``; a masked attention row (-inf and float32's lowest) too."""
    x = (np.random.default_rng(width).standard_normal((6, width)) * 4).astype(F32)
    x[1, width // 2:] = -np.inf
    x[2, :width // 3] = np.finfo(F32).min
    x[3, 0] = -100.0                        # below XNNPACK's cutoff: exactly 0
    assert_same_bits(*run_both(unary_model("SOFTMAX", x.shape, beta=1.0), [x]))


@fma_host
@pytest.mark.parametrize("op", ["SIN", "COS"])
def test_sin_and_cos_give_litert_bits(op):
    """XNNPACK's rational 5/4 fits after its reduction by 2 pi: RoPE tables (positions
    times inverse frequencies up to 4096 rad), small and large arguments, inf and NaN."""
    rng = np.random.default_rng(3)
    positions = np.arange(4096, dtype=F32)[:, None] * (10000 ** (-np.arange(0, 64, 2) / 64)).astype(F32)[None, :]
    x = np.concatenate([positions.reshape(-1), rng.standard_normal(4096).astype(F32) * 1e-3,
                        rng.standard_normal(4096).astype(F32) * 1e5,
                        np.array([0, -0.0, np.pi, -np.pi / 2, np.inf, -np.inf, np.nan], F32)]).astype(F32)
    assert_same_bits(*run_both(unary_model(op, x.shape), [x]))


@avx512_host
def test_rsqrt_gives_litert_bits_where_it_is_right():
    """The 14-bit estimate and XNNPACK's Newton step over [2**-126, 2**125]; outside it
    (0, subnormals, above 2**125), where XNNPACK gives NaN or 1.5 times the root, the
    true ``1 / sqrt``."""
    rng = np.random.default_rng(9)
    x = np.exp(rng.uniform(np.log(2.0 ** -126), np.log(2.0 ** 125), 20000)).astype(F32)
    ours, litert = run_both(unary_model("RSQRT", x.shape), [x])
    assert_same_bits(ours, litert)
    edges = np.array([0, 1e-40, 2.0 ** -127, 2.0 ** 126, 3e38, np.inf], F32)
    ours, _ = run_both(unary_model("RSQRT", edges.shape), [edges])
    with np.errstate(divide="ignore"):
        np.testing.assert_array_equal(ours, (1 / np.sqrt(edges.astype(np.float64))).astype(F32))


@avx512_host
def test_sqrt_gives_litert_bits_where_it_is_right():
    """RSQRT's estimate and Newton step times x over [2**-126, 2**125] (not always the
    nearest float: the correctly rounded root differs from LiteRT's on about a third of
    these); outside it, where XNNPACK flushes subnormals and is wrong above 2**125, the
    correctly rounded root (0, inf and NaN as LiteRT gives them)."""
    rng = np.random.default_rng(10)
    x = np.concatenate([np.exp(rng.uniform(np.log(2.0 ** -126), np.log(2.0 ** 125), 20000)),
                        4.0 ** np.arange(-63, 62), [2.0, 0.5, 3.9999998]]).astype(F32)
    ours, litert = run_both(unary_model("SQRT", x.shape), [x])
    assert_same_bits(ours, litert)
    assert np.count_nonzero(np.sqrt(x) != litert) > 1000
    edges = np.array([0, -0.0, 1e-40, 2.0 ** -127, 2.0 ** 126, 3e38, np.inf, -1.0, np.nan], F32)
    ours, _ = run_both(unary_model("SQRT", edges.shape), [edges])
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(ours, np.sqrt(edges))


def square_reduce_model(op: str, shape: tuple[int, ...], axes: tuple[int, ...], second_reader: bool = False,
                        residual: bool = False) -> bytes:
    """``op(MUL(x, x), axes)``, kept dims (an rms norm's decomposition); with
    ``second_reader`` the square is an output too, so it cannot fold; with ``residual`` x
    is ``x0 + x0``, an ADD the square would otherwise fuse with."""
    b = ModelBuilder()
    x = b.input("x", shape, F32)
    if residual:
        x0, x = x, b.tensor("x1", shape, F32)
        b.op("ADD", [x0, x0], [x])
    sq = b.tensor("sq", shape, F32)
    b.op("MUL", [x, x], [sq])
    out_shape = tuple(1 if i in axes else d for i, d in enumerate(shape))
    y = b.tensor("y", out_shape, F32)
    b.op(op, [sq, b.const("axes", np.array(axes, np.int32))], [y], keep_dims=True)
    b.output(y, *([sq] if second_reader else []))
    return b.build()


@avx512_host
@pytest.mark.parametrize("op,shape,axes", [("MEAN", (1, 64, 768), (2,)), ("MEAN", (3, 819), (1,)),
                                           ("SUM", (2, 5, 47), (2,)), ("MEAN", (2, 9, 16), (1,)),
                                           ("MEAN", (1, 7, 40), (1, 2))])
def test_a_mean_of_squares_gives_litert_bits(op, shape, axes):
    """XNNPACK folds ``reduce(MUL(x, x))`` into one sum of squares (fused multiply-adds in
    its rsum2 / rdsum2 order); the cpu folds the pair too (fusion.folded_square_sum)."""
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(F32) * F32(3)
    assert_same_bits(*run_both(square_reduce_model(op, shape, axes), [x]))
    assert_same_bits(*run_both(square_reduce_model(op, shape, axes, residual=True), [x]))
    ours, litert = run_both(square_reduce_model(op, shape, axes, second_reader=True), [x])
    np.testing.assert_allclose(ours, litert, rtol=1e-6)


@fma_host
def test_tanh_gives_litert_bits():
    """XNNPACK's rational 9/8 fit, clamped where it reaches +-1; inf, NaN and signed zeros."""
    rng = np.random.default_rng(11)
    x = np.concatenate([rng.standard_normal(4000).astype(F32) * scale for scale in (0.01, 0.5, 3, 100)] +
                       [np.array([0, -0.0, 7.9807181358, -8, np.inf, -np.inf, np.nan], F32)]).astype(F32)
    assert_same_bits(*run_both(unary_model("TANH", x.shape), [x]))


def fully_connected_model(m: int, k: int, o: int, bias: bool) -> bytes:
    rng = np.random.default_rng(k + o)
    b = ModelBuilder()
    x = b.input("x", (m, k), F32)
    w = b.const("w", (rng.standard_normal((o, k)) / np.sqrt(k)).astype(F32))
    y = b.tensor("y", (m, o), F32)
    b.op("FULLY_CONNECTED", [x, w, b.const("b", rng.standard_normal(o).astype(F32)) if bias else -1], [y])
    b.output(y)
    return b.build()


@fma_host
@pytest.mark.parametrize("m,k,o,bias", [(1, 1536, 16, False), (2, 4096, 16, True), (1, 768, 2, True),
                                        (3, 1024, 96, False), (1, 64, 3, True), (4, 1024, 1000, True),
                                        (1, 2048, 450, False)])
def test_few_row_products_give_litert_bits(m, k, o, bias):
    """Every output one chain of fused multiply-adds from the bias, K in order, as XNNPACK's
    f32 GEMM microkernels add: wide weights in panels of 64 columns, narrow deep ones
    (16x1536, a small decoder's attention output) in panels of 16."""
    x = np.random.default_rng(m * k).standard_normal((m, k)).astype(F32)
    assert_same_bits(*run_both(fully_connected_model(m, k, o, bias), [x]))


@fma_host
@pytest.mark.parametrize("a_shape, b_shape, adj_y", [((2, 16, 128), (128, 32), False),
                                                     ((1, 2, 16, 128), (1, 1, 128, 32), False),
                                                     ((2, 16, 32), (1, 128, 32), True), ((2, 16, 128), (2, 128, 32), False)])
def test_batched_products_give_litert_bits(a_shape, b_shape, adj_y):
    """BATCH_MATMUL of run-time operands, one B for every batch of A too (a KV group read by
    several query heads): each output XNNPACK's one chain of fused multiply-adds over K."""
    b = ModelBuilder()
    x, y = b.input("a", a_shape, F32), b.input("b", b_shape, F32)
    out = [*np.broadcast_shapes(a_shape[:-2], b_shape[:-2]), a_shape[-2], b_shape[-2] if adj_y else b_shape[-1]]
    z = b.tensor("z", out, F32)
    b.op("BATCH_MATMUL", [x, y], [z], adj_y=adj_y)
    b.output(z)
    rng = np.random.default_rng(len(a_shape))
    assert_same_bits(*run_both(b.build(), [rng.standard_normal(a_shape).astype(F32),
                                           rng.standard_normal(b_shape).astype(F32)]))
