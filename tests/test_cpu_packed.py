"""The cpu backend's packed-weight GEMM (litegpu_cpu.kernels.packed) and the kernels using it."""
from __future__ import annotations

import numpy as np
import pytest

from litegpu_cpu.kernels import packed
from litegpu_cpu.kernels import threads as kthreads
from litegpu_cpu.kernels.tasks import is_plan

from test_cpu_kernels import build, direct_conv, rand

RNG = np.random.default_rng(7)


def want(x, w, b, lo, hi):
    return np.clip(x.astype(np.float64) @ w.astype(np.float64) + b, lo, hi)


@pytest.mark.parametrize("m,k,n,threads", [
    (6, 5, 16, 1),          # one tile
    (7, 33, 32, 1),         # a tile and one row: the last tile moves back
    (64, 128, 128, 2),      # split by panels (N >= M)
    (3136, 24, 144, 2),     # split by rows, the last task taking the rest
    (250, 96, 16, 2),       # one panel, rows split
    (100, 1, 48, 1),        # K = 1
    (3136, 144, 24, 2),     # N not a multiple of 16: the last panel stores its first 8 lanes
    (13, 7, 3, 1),          # one partial panel
    (64, 40, 200, 2),       # split by panels, the last one partial
])
def test_packed_matmul_matches_float64(m, k, n, threads):
    x, w, b = rand(m, k), rand(k, n, scale=0.2), rand(n)
    before = kthreads.current()
    kthreads.configure_threads(min(threads, kthreads.default_count()))
    try:
        pm = packed.PackedMatmul(w, b, -1.5, 2.0, threads)
        # Sentinels after the output: a partial panel must not store past N.
        memory = np.full(m * n + 32, 7.0, np.float32)
        out = memory[:m * n].reshape(m, n)
        out[...] = np.nan
        call = pm.bind(x, out)
        assert is_plan(call)
        call()
        call()
    finally:
        kthreads.configure_threads(before)
    np.testing.assert_allclose(out, want(x, w, b, -1.5, 2.0), rtol=2e-5, atol=2e-5 * np.sqrt(k))
    assert (memory[m * n:] == 7.0).all()


def test_split_covers_every_row_and_panel_once():
    for m, n, k in [(3136, 144, 24), (64, 512, 128), (6, 16, 4), (13, 16, 1 << 16), (600, 16, 512),
                    (64, 200, 512), (3136, 24, 144)]:
        row_chunk, row_tasks, panel_chunk, panel_tasks = packed.split(m, n, k, 2, m)
        rows = [min(m, r * row_chunk + row_chunk) if r < row_tasks - 1 else m for r in range(row_tasks)]
        assert rows[-1] == m and all(b - a >= packed.MR for a, b in zip([0, *rows], rows))
        panels = -(-n // packed.NR)
        assert min(panels, panel_chunk * panel_tasks) == panels
        assert (panel_tasks - 1) * panel_chunk < panels


def test_packed_matmul_refuses_what_it_cannot_run():
    assert packed.packed_matmul(rand(8, 32), None, -np.inf, np.inf, 5) is None     # fewer rows than a tile
    pm = packed.PackedMatmul(rand(8, 32), rand(32), -np.inf, np.inf, 1)
    with pytest.raises(ValueError, match="packed matmul"):
        pm.bind(rand(10, 9), np.empty((10, 32), np.float32))
    with pytest.raises(ValueError, match="packed matmul"):
        pm.bind(rand(4, 8), np.empty((4, 32), np.float32))


def _runs_packed(call) -> bool:
    """True when ``call`` (or a step of an in_order call) is the packed GEMM's task."""
    address = packed._packed_gemm.address
    return any(is_plan(c) and address in c.rows[:, 0] for c in getattr(call, "calls", [call]))


def test_fully_connected_takes_the_packed_gemm():
    x, w, b = rand(2, 10, 48), rand(32, 48), rand(32)
    attrs = {"activation": "RELU6", "keep_num_dims": True}
    run, (out,) = build("FULLY_CONNECTED", attrs, [x, w, b], [(2, 10, 32)], consts=(1, 2))
    call = run.bind([x, w, b], [out])
    assert _runs_packed(call)
    call()
    np.testing.assert_allclose(out, want(x.reshape(20, 48), w.T, b, 0, 6).reshape(2, 10, 32), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kh,stride,o", [(1, 1, 32), (3, 2, 16)])
def test_convs_take_the_packed_gemm(kh, stride, o):
    """A pointwise conv multiplies its input directly, a strided 3x3 over 8 channels its
    im2col rows; both through the packed GEMM when O is a multiple of 16."""
    x, f, b = rand(1, 11, 9, 8), rand(o, kh, kh, 8, scale=0.3), rand(o)
    attrs = {"padding": "SAME", "stride": (stride, stride), "dilation": (1, 1), "activation": "RELU"}
    expect = direct_conv(x, f, b, (stride, stride), (1, 1), "SAME", "RELU")
    run, (out,) = build("CONV_2D", attrs, [x, f, b], [expect.shape], consts=(1, 2))
    call = run.bind([x, f, b], [out])
    assert _runs_packed(call)
    call()
    np.testing.assert_allclose(out, expect, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("batches,m,k,n,adj_y", [(4, 192, 64, 512, True), (2, 7, 70, 37, True), (3, 6, 33, 16, True),
                                                 (4, 192, 512, 64, False), (2, 9, 17, 45, False)])
def test_batched_product_packs_every_batch_and_block(batches, m, k, n, adj_y):
    """Both layouts of b, whole 16 x 16 blocks transposed in registers and the rest (a
    partial last panel, K not a multiple of 16), every batch in one call: the exact
    float32 products of a float64 check where the entries are small integers."""
    rng = np.random.default_rng(k + n)
    a = rng.integers(-3, 4, (batches, m, k)).astype(np.float32)
    b = rng.integers(-3, 4, (batches, n, k) if adj_y else (batches, k, n)).astype(np.float32)
    out = np.full((batches, m, n), np.nan, np.float32)
    bind = packed.batched_product(a.shape, b.shape, adj_y, threads=2)
    bind(a, b, out)()
    want = a.astype(np.float64) @ (np.swapaxes(b, 1, 2) if adj_y else b).astype(np.float64)
    np.testing.assert_array_equal(out, want.astype(np.float32))
