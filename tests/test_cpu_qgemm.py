"""The cpu backend's quantized int8 product (litegpu_cpu.kernels.qgemm): exact against
integer numpy arithmetic with the same requantization, on the VNNI path and the plain one."""
from __future__ import annotations

import numpy as np
import pytest

from litegpu_cpu.kernels import qgemm
from litegpu_cpu.kernels import threads as kthreads
from litegpu_cpu.kernels.tasks import is_plan

RNG = np.random.default_rng(11)


def expected(x, w, bias, zx, scales, zo, lo, hi):
    """int32 sums in int64 numpy, then the float32 requantization the kernel documents."""
    acc = (x.astype(np.int64) - zx) @ w.astype(np.int64) + (0 if bias is None else bias.astype(np.int64))
    value = np.clip(acc.astype(np.float32) * np.asarray(scales, np.float32), np.float32(lo - zo), np.float32(hi - zo))
    return (np.rint(value).astype(np.int32) + zo).astype(np.int8)


PATHS = [pytest.param(False, id="plain"),
         pytest.param(True, id="vnni", marks=pytest.mark.skipif(
             not qgemm.VNNI, reason="this CPU has no AVX-512 VNNI (vpdpbusd); the plain path is tested"))]


@pytest.mark.parametrize("vnni", PATHS)
@pytest.mark.parametrize("m,k,n,threads,per_channel", [
    (6, 8, 16, 1, True),          # one tile
    (7, 12, 24, 1, True),         # rows past a tile, a partial panel
    (1, 1280, 1000, 2, True),     # one row (clamped rows), panels split over tasks
    (100, 37, 3, 1, False),       # K not a multiple of 4, one partial panel, per-tensor scale
    (3136, 24, 144, 2, True),     # rows split over tasks
    (49, 960, 320, 2, True),
    (13, 20, 109, 1, True),       # wide tiles of four panels, then two, then a partial one clamped
    (30, 64, 1129, 2, True),      # panels split in wide chunks, the last with two- and one-panel rest
])
def test_quantized_matmul_is_exact(vnni, m, k, n, threads, per_channel):
    k4 = -(-k // 4) * 4
    x = np.zeros((m, k4), np.int8)
    x[:, :k] = RNG.integers(-128, 128, (m, k))
    x[:, k:] = RNG.integers(-128, 128, (m, k4 - k))     # padding bytes meet zero weights
    w = RNG.integers(-127, 128, (k, n)).astype(np.int8)
    bias = RNG.integers(-5000, 5000, n).astype(np.int32)
    scales = (RNG.random(n if per_channel else 1) * 0.002 + 0.0002).astype(np.float32)
    zx, zo, lo, hi = -3, 5, -100, 90           # a fused activation's narrower range
    before = kthreads.current()
    kthreads.configure_threads(min(threads, kthreads.default_count()))
    try:
        product = qgemm.QuantizedMatmul(w, bias, zx, scales, zo, lo, hi, threads, vnni=vnni)
        memory = np.full(m * n + 64, 77, np.int8)
        out = memory[:m * n].reshape(m, n)
        call = product.bind(x, out)
        assert is_plan(call)
        call()
    finally:
        kthreads.configure_threads(before)
    want = expected(x[:, :k], w, bias, zx, scales, zo, lo, hi)
    np.testing.assert_array_equal(out, want)
    assert (memory[m * n:] == 77).all()          # a partial panel stores nothing past N
    assert lo <= out.min() and out.max() <= hi


def test_extreme_values_do_not_overflow():
    """All -128 activations against all -128 weights (the largest products) and a zero
    point at the other end: the sums stay exact in int32 and saturate at the bounds."""
    k, n = 1024, 32
    x = np.full((6, k), -128, np.int8)
    w = np.full((k, n), -128, np.int8)
    product = qgemm.QuantizedMatmul(w, None, 127, np.full(n, 1e-6, np.float32), 0, -128, 127, 1)
    out = np.zeros((6, n), np.int8)
    product.bind(x, out)()
    np.testing.assert_array_equal(out, expected(x, w, None, 127, np.full(n, 1e-6, np.float32), 0, -128, 127))


def test_split_covers_every_row_and_panel_once():
    for m, n, k in [(3136, 144, 24), (1, 1000, 1280), (49, 320, 960), (6, 16, 8), (64, 2048, 768), (64, 1129, 96)]:
        row_chunk, row_tasks, panel_chunk, panel_tasks = qgemm.split(m, n, k, 2)
        assert row_chunk % qgemm.MR == 0 or row_tasks == 1
        assert (row_tasks - 1) * row_chunk < m <= row_tasks * row_chunk
        panels = -(-n // qgemm.NR)
        wide = panels >= 4 * qgemm._WIDE_PANELS     # whole wide tiles per task
        assert panel_tasks == 1 or panel_chunk % (qgemm._WIDE_PANELS if wide else qgemm._TILE_PANELS) == 0
        assert (panel_tasks - 1) * panel_chunk < panels <= panel_tasks * panel_chunk


def test_pack_layout_and_initial_sums():
    w = RNG.integers(-127, 128, (6, 20)).astype(np.int8)
    packed = qgemm.pack(w)
    assert packed.shape == (2, 2, 16, 4)
    assert packed[1, 1, 2, 1] == w[5, 18] and packed[1, 1, 2, 2] == 0      # past K: zero
    assert not packed[1, :, 4:].any()                                      # past N: zero
    sums = qgemm.initial_sums(w, np.arange(20), 3)
    assert sums.shape == (32,) and sums[7] == 7 - 131 * int(w[:, 7].astype(int).sum())
    with pytest.raises(ValueError, match="overflow"):
        qgemm.initial_sums(np.full((1 << 17, 1), 127, np.int8), None, 127)


def test_bind_refuses_what_it_cannot_run():
    product = qgemm.QuantizedMatmul(np.ones((6, 16), np.int8), None, 0, np.ones(1, np.float32), 0, -128, 127, 1)
    with pytest.raises(ValueError, match="quantized product"):
        product.bind(np.zeros((4, 6), np.int8), np.zeros((4, 16), np.int8))      # K not padded to 8
    with pytest.raises(ValueError, match="quantized product"):
        product.bind(np.zeros((4, 8), np.uint8), np.zeros((4, 16), np.int8))
    with pytest.raises(ValueError, match="int8 weight"):
        qgemm.QuantizedMatmul(np.ones((6, 16), np.float32), None, 0, np.ones(1), 0, -128, 127, 1)
