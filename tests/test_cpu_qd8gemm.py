"""The cpu backend's dynamically quantized product (litegpu_cpu.kernels.qd8gemm), the kernel
of hybrid FULLY_CONNECTED: equal to the op's hybrid reference (XNNPACK's qd8-f32-qc8w
arithmetic) on the VNNI path and the plain one, and to LiteRT on whole models."""
from __future__ import annotations

import numpy as np
import pytest

from litegpu.ops.hybrid import xnn_dequantize_sums, xnn_quantize_rows
from litegpu.testing.builder import ModelBuilder
from litegpu_cpu.kernels import qd8gemm
from litegpu_cpu.kernels import threads as kthreads

from test_ops_hybrid import close
from test_ops_quantized import run_both

RNG = np.random.default_rng(5)

PATHS = [pytest.param(False, id="plain"),
         pytest.param(True, id="vnni", marks=pytest.mark.skipif(
             not qd8gemm.VNNI, reason="this CPU has no AVX-512 VNNI (vpdpbusd); the plain path is tested"))]


def rows(m: int, k: int) -> np.ndarray:
    """Rows of every kind the row quantization meets: mixed signs at several scales, a row
    of zeros, one all positive, one all negative, one constant."""
    x = (RNG.normal(size=(m, k)) * RNG.uniform(0.01, 8, (m, 1))).astype(np.float32)
    special = [np.zeros(k), np.abs(x[0]) + 1, -np.abs(x[0]) - 0.5, np.full(k, 3.25)]
    for i, row in enumerate(special[:m - 1]):
        x[i + 1] = row
    return x


@pytest.mark.parametrize("vnni", PATHS)
@pytest.mark.parametrize("m,k,n,threads,bias,clamp", [
    (6, 8, 16, 1, True, (-np.inf, np.inf)),     # one tile
    (7, 13, 24, 1, False, (0.0, np.inf)),       # K not a multiple of 4, rows past a tile, a partial panel
    (1, 300, 70, 2, True, (-1.0, 1.0)),         # one row
    (64, 128, 512, 2, True, (0.0, 6.0)),        # tiny_bert's shapes: panels split over tasks
    (200, 64, 20, 2, True, (-np.inf, np.inf)),  # rows split over tasks
    (20, 40, 109, 1, False, (-np.inf, np.inf)),  # wide tiles of four panels, then two, then a partial one
    (64, 96, 1129, 2, True, (-2.0, 2.0)),       # panels split in wide chunks, each with a rest
])
def test_product_equals_the_hybrid_reference(vnni, m, k, n, threads, bias, clamp):
    w = RNG.integers(-127, 128, (k, n)).astype(np.int8)
    scale = RNG.uniform(0.001, 0.02, n).astype(np.float32)
    b = RNG.normal(size=n).astype(np.float32) if bias else None
    x = rows(m, k)
    before = kthreads.current()
    kthreads.configure_threads(min(threads, kthreads.default_count()))
    try:
        product = qd8gemm.DynamicQuantizedMatmul(w, scale, b, *clamp, threads, vnni=vnni)
        memory = np.full(m * n + 32, 7.5, np.float32)
        out = memory[:m * n].reshape(m, n)
        call = product.bind(x, out)
        call()
        call()                          # a bound call runs again on the same scratch
    finally:
        kthreads.configure_threads(before)
    quantized, row_scale, _ = xnn_quantize_rows(x)
    want = np.clip(xnn_dequantize_sums(quantized @ w.astype(np.float64), row_scale, scale, b), *clamp)
    # The reference's fused multiply-add is emulated in float64 and may round twice (about
    # once in 2^29 values); the kernel's is a real FMA. One ulp covers that, nothing more.
    np.testing.assert_array_max_ulp(out, want.astype(np.float32), maxulp=1)
    assert np.count_nonzero(out != want) <= 1
    assert np.all(memory[m * n:] == 7.5), "the product wrote past its output"


def test_rejects_mismatched_arrays():
    product = qd8gemm.DynamicQuantizedMatmul(np.ones((8, 4), np.int8), np.ones(4, np.float32), None,
                                             -np.inf, np.inf, 1)
    with pytest.raises(ValueError, match="given"):
        product.bind(np.zeros((2, 9), np.float32), np.zeros((2, 4), np.float32))


@pytest.mark.parametrize("shape,per_channel,act", [((2, 7, 48), True, "NONE"), ((1, 130), False, "RELU"),
                                                   ((64, 128), True, "RELU6")])
def test_hybrid_fully_connected_uses_the_kernel(monkeypatch, shape, per_channel, act):
    bound = []
    bind = qd8gemm.DynamicQuantizedMatmul.bind
    monkeypatch.setattr(qd8gemm.DynamicQuantizedMatmul, "bind",
                        lambda self, *a: (bound.append(1), bind(self, *a))[1])
    k, units = shape[-1], 36
    b = ModelBuilder()
    x = b.input("x", shape, np.float32)
    scales = RNG.uniform(0.004, 0.02, units if per_channel else 1).astype(np.float32)
    w = b.const("w", RNG.integers(-127, 128, (units, k)).astype(np.int8), scale=scales,
                zero_point=[0] * len(scales), quantized_dimension=0)
    bias = b.const("b", RNG.normal(size=units).astype(np.float32))
    y = b.tensor("y", (int(np.prod(shape[:-1])), units), np.float32)
    b.op("FULLY_CONNECTED", [x, w, bias], [y], fused_activation_function=act, asymmetric_quantize_inputs=True,
         version=12)
    b.output(y)
    (ours,), (theirs,) = run_both(b.build(), [rows(int(np.prod(shape[:-1])), k).reshape(shape)])
    assert bound, "the hybrid FULLY_CONNECTED did not run the dynamically quantized kernel"
    close(ours, theirs)


def test_products_reading_one_tensor_quantize_it_once(monkeypatch):
    """Three hybrid FCs on one input (attention's query, key, value) and one on another
    tensor: the first quantizes, the next two read its rows, the fourth quantizes its own;
    every output equals LiteRT's."""
    sources = []
    read = qd8gemm.DynamicQuantizedMatmul.read_rows_of
    monkeypatch.setattr(qd8gemm.DynamicQuantizedMatmul, "read_rows_of",
                        lambda self, source: (sources.append(source), read(self, source))[1])
    m, k = 64, 48
    b = ModelBuilder()
    x = b.input("x", (m, k), np.float32)
    outs = []
    for i, reads_x in enumerate([True, True, False, True]):
        w = b.const(f"w{i}", RNG.integers(-127, 128, (k, k)).astype(np.int8), scale=[0.01], zero_point=[0])
        y = b.tensor(f"y{i}", (m, k), np.float32)
        b.op("FULLY_CONNECTED", [x if reads_x else outs[-1], w, -1], [y], asymmetric_quantize_inputs=True,
             version=12)
        outs.append(y)
    b.output(*outs)
    ours, theirs = run_both(b.build(), [rows(m, k)])
    assert len(sources) == 2 and sources[0] is sources[1], "the second and fourth products read the first's rows"
    for o, t in zip(ours, theirs):
        close(o, t)
