"""The GPU kernels that give LiteRT's bits (XNNPACK's arithmetic), on opencl (PoCL in CI) and
webgpu (lavapipe in CI), against LiteRT itself on single-op models: float FULLY_CONNECTED and
BATCH_MATMUL (one fused multiply-add per step in the order of k, from the bias), the hybrid
FULLY_CONNECTED of the float view (ROW_QUANTIZE and HYBRID_FULLY_CONNECTED: int8 per-channel
and blockwise int4 weights, one row and many), SIN and COS (XNNPACK's reduction and rational
fit), sums, RSQRT, SQRT, SOFTMAX, LOGISTIC, GELU and TANH.

A decoder's hybrid products quantize their input rows on the fly, where an ulp upstream can
move a value across a rounding boundary and become a whole quantum: these are the ops that
keep a GPU decoder on LiteRT's tokens. (lavapipe computes WGSL's ``fma`` as a product then a
sum, and reassociates float sums: the webgpu backend finds the first and emulates a fused
multiply-add there, and ``opaque`` keeps the sums the formulas order; see
:mod:`litegpu.codegen.wgsl`.)
"""
from __future__ import annotations

import numpy as np
import pytest

import litegpu
from litegpu.testing.builder import ModelBuilder
from test_cpu_xnnpack_order import reduce_model, square_reduce_model, unary_model
from test_int4_weights import hybrid_fc

from ai_edge_litert.interpreter import Interpreter as LiteRT  # a test dependency: never skipped

F32 = np.float32


def _run(interp, xs: list[np.ndarray]) -> np.ndarray:
    interp.allocate_tensors()
    for d, x in zip(interp.get_input_details(), xs):
        interp.set_tensor(d["index"], x)
    interp.invoke()
    return interp.get_tensor(interp.get_output_details()[0]["index"]).copy()


def assert_litert_bits(gpu: str, data: bytes, xs: list[np.ndarray]) -> None:
    """Every node on ``gpu``, and its output LiteRT's to the bit."""
    ours = litegpu.Interpreter(model_content=data, experimental_delegates=[litegpu.load_delegate(gpu)])
    assert ours.get_delegation_report().nodes_on("cpu") == 0
    got, want = _run(ours, xs), _run(LiteRT(model_content=data, num_threads=2), xs)
    differ = got.view(np.uint32) != want.view(np.uint32)
    assert not differ.any(), f"{differ.sum()} of {differ.size} differ, e.g. ours {got[differ][:4]} LiteRT {want[differ][:4]}"


def float_fc(rows: int, k: int, n: int, rng) -> bytes:
    b = ModelBuilder()
    x = b.input("x", (rows, k), F32)
    w = b.const("w", rng.standard_normal((n, k)).astype(F32))
    bias = b.const("bias", rng.standard_normal(n).astype(F32))
    y = b.tensor("y", (rows, n), F32)
    b.op("FULLY_CONNECTED", [x, w, bias], [y])
    b.output(y)
    return b.build()


def int8_fc(rows: int, k: int, n: int, rng, activation: str = "NONE") -> bytes:
    b = ModelBuilder()
    x = b.input("x", (rows, k), F32)
    w = b.const("w", rng.integers(-127, 128, (n, k)).astype(np.int8), scale=list(rng.uniform(1e-3, 2e-2, n)),
                zero_point=[0] * n, quantized_dimension=0)
    bias = b.const("bias", rng.standard_normal(n).astype(F32))
    y = b.tensor("y", (rows, n), F32)
    b.op("FULLY_CONNECTED", [x, w, bias], [y], fused_activation_function=activation)
    b.output(y)
    return b.build()


def batch_matmul(a_shape: tuple, b_shape: tuple, adj_y: bool) -> bytes:
    b = ModelBuilder()
    x, z = b.input("x", a_shape, F32), b.input("z", b_shape, F32)
    y = b.tensor("y", (*a_shape[:-1], b_shape[-2] if adj_y else b_shape[-1]), F32)
    b.op("BATCH_MATMUL", [x, z], [y], adj_x=False, adj_y=adj_y)
    b.output(y)
    return b.build()


@pytest.mark.parametrize("rows, k, n", [(1, 128, 256), (16, 128, 96), (3, 77, 40)])
def test_float_fully_connected(gpu_name, rows, k, n):
    rng = np.random.default_rng(k)
    assert_litert_bits(gpu_name, float_fc(rows, k, n, rng), [rng.standard_normal((rows, k)).astype(F32)])


@pytest.mark.parametrize("a_shape, b_shape, adj_y", [((1, 4, 16, 32), (1, 4, 32, 128), False),
                                                     ((1, 4, 16, 32), (1, 4, 128, 32), True),
                                                     ((1, 4, 1, 128), (1, 4, 128, 32), False)])
def test_batch_matmul(gpu_name, a_shape, b_shape, adj_y):
    rng = np.random.default_rng(len(a_shape) + a_shape[-2])
    xs = [rng.standard_normal(a_shape).astype(F32), rng.standard_normal(b_shape).astype(F32)]
    assert_litert_bits(gpu_name, batch_matmul(a_shape, b_shape, adj_y), xs)


@pytest.mark.parametrize("rows, k, n, activation", [(1, 128, 256, "NONE"), (16, 768, 64, "RELU"),
                                                    (3, 77, 40, "NONE")])
def test_hybrid_int8_fully_connected(gpu_name, rows, k, n, activation):
    rng = np.random.default_rng(rows)
    x = (rng.standard_normal((rows, k)) * 3).astype(F32)
    x[0, :5] = 0.0
    assert_litert_bits(gpu_name, int8_fc(rows, k, n, rng, activation), [x])


@pytest.mark.parametrize("rows", [1, 16])
@pytest.mark.parametrize("block", [32, 128])
def test_hybrid_blockwise_int4_fully_connected(gpu_name, rows, block):
    x = np.random.default_rng(block).standard_normal((rows, 128)).astype(F32)
    assert_litert_bits(gpu_name, hybrid_fc(rows, block), [x])


@pytest.mark.parametrize("op", ["SIN", "COS"])
def test_sin_and_cos(gpu_name, op):
    """RoPE tables (positions times inverse frequencies up to 4096 rad), small and large
    arguments, inf and NaN."""
    rng = np.random.default_rng(3)
    positions = np.arange(4096, dtype=F32)[:, None] * (10000 ** (-np.arange(0, 64, 2) / 64)).astype(F32)[None, :]
    x = np.concatenate([positions.reshape(-1), rng.standard_normal(4096).astype(F32) * 1e-3,
                        rng.standard_normal(4096).astype(F32) * 1e5,
                        np.array([0, -0.0, np.pi, -np.pi / 2, np.inf, -np.inf, np.nan], F32)]).astype(F32)
    assert_litert_bits(gpu_name, unary_model(op, x.shape), [x])


@pytest.mark.parametrize("op, shape, axes", [("MEAN", (1, 16, 768), (2,)), ("MEAN", (3, 819), (1,)),
                                             ("SUM", (2, 5, 47), (2,)), ("MEAN", (1, 16, 4, 32), (3,)),
                                             ("MEAN", (3, 50, 20), (1,)), ("MEAN", (1, 10, 10, 1), (2,)),
                                             ("MEAN", (1, 7, 40), (1, 2))])
def test_mean_and_sum_and_of_squares(gpu_name, op, shape, axes):
    """XNNPACK's row sum (rsum) where the run of axes ends at the last one, its channel sum
    (rdsum) elsewhere (a kept last axis of size 1 too); a square ``MUL(x, x)`` read by the
    sum alone folds into it (rsum2 / rdsum2), after a residual ADD too."""
    x = (np.random.default_rng(len(shape)).standard_normal(shape) * 3).astype(F32)
    assert_litert_bits(gpu_name, reduce_model(op, shape, list(axes), True), [x])
    assert_litert_bits(gpu_name, square_reduce_model(op, shape, axes), [x])
    assert_litert_bits(gpu_name, square_reduce_model(op, shape, axes, residual=True), [x])


def _true_root(op: str, x: np.ndarray) -> np.ndarray:
    """``1 / sqrt(x)`` (RSQRT) or ``sqrt(x)`` (SQRT), correctly rounded."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return (1 / np.sqrt(x.astype(np.float64))).astype(F32) if op == "RSQRT" else np.sqrt(x)


@pytest.mark.parametrize("op, seed, edges", [
    ("RSQRT", 9, [0, 1e-40, 2.0 ** -127, 2.0 ** 126, 3e38, np.inf]),
    ("SQRT", 10, [0, -0.0, 1e-40, 2.0 ** -127, 2.0 ** 126, 3e38, np.inf, -1.0, np.nan]),
])
def test_rsqrt_and_sqrt(gpu_name, op, seed, edges):
    """The instruction's 14-bit estimate (litegpu.codegen.rsqrt14) and XNNPACK's Newton step
    (for SQRT, times x) over [2**-126, 2**125], powers of 4 (exact roots) too; outside it
    the correctly rounded ``1 / sqrt`` or root."""
    rng = np.random.default_rng(seed)
    x = np.concatenate([np.exp(rng.uniform(np.log(2.0 ** -126), np.log(2.0 ** 125), 20000)),
                        4.0 ** np.arange(-63, 62), [2.0, 0.5, 3.9999998]]).astype(F32)
    assert_litert_bits(gpu_name, unary_model(op, x.shape), [x])
    edges = np.array(edges, F32)
    ours = litegpu.Interpreter(model_content=unary_model(op, edges.shape),
                               experimental_delegates=[litegpu.load_delegate(gpu_name)])
    np.testing.assert_array_equal(_run(ours, [edges]), _true_root(op, edges))


@pytest.mark.parametrize("width", [1, 5, 16, 63, 64, 77, 130, 512, 1000])
def test_softmax(gpu_name, width):
    """XNNPACK's exponentials (formulas.xnn_exp_nonpositive), its sum (blocks of 64 over two
    accumulators, of 16, the tail) and ``1 / sum``; masked rows (-inf and float32's lowest)
    and an entry below the exponential's cutoff too."""
    x = (np.random.default_rng(width).standard_normal((6, width)) * 4).astype(F32)
    x[1, width // 2:] = -np.inf
    x[2, :width // 3] = np.finfo(F32).min
    x[3, 0] = -100.0
    assert_litert_bits(gpu_name, unary_model("SOFTMAX", x.shape, beta=1.0), [x])


@pytest.mark.parametrize("op, options", [("LOGISTIC", {}), ("GELU", {"approximate": False}),
                                         ("GELU", {"approximate": True}), ("TANH", {})])
def test_logistic_gelu_and_tanh(gpu_name, op, options):
    """XNNPACK's AVX-512F sigmoid (its table of 2**(k/32), vscalefps, flushed results), its
    rational GELU and tanh fits, over a swish's range, the tails, and the edges."""
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.standard_normal(20000) * 4, np.linspace(-110, 110, 4001),
                        [0, -0.0, 1e-30, -1e-30, 88, -88, 3e38, -3e38, np.inf, -np.inf, np.nan]]).astype(F32)
    assert_litert_bits(gpu_name, unary_model(op, x.shape, **options), [x])


@pytest.mark.parametrize("shape, axes", [((1, 8, 2560), [0, 2]), ((1, 4, 768), [0, 2]), ((4, 1, 5, 6), [1, 3])])
def test_means_over_reduced_unit_axes(gpu_name, shape, axes):
    """A MEAN whose runs are one once its reduced size-1 axes go (a LayerNorm decomposition's
    [0, 2] of [1, rows, width]) is XNNPACK's one-run sum, as LiteRT's."""
    xs = (np.random.default_rng(sum(shape)).standard_normal(shape) * 2 + 0.3).astype(F32)
    assert_litert_bits(gpu_name, reduce_model("MEAN", shape, axes, True), [xs])
