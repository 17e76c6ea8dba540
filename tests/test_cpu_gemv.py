"""The cpu backend's few-row product with a constant weight (litegpu_cpu.kernels.gemv)."""
from __future__ import annotations

import numba
import numpy as np
import pytest

from litegpu_cpu.kernels import gemv, misc
from litegpu_cpu.kernels.tasks import is_plan

from test_cpu_kernels import rand


@pytest.mark.parametrize("m,k,o,threads", [
    (1, 1024, 1000, 2),     # wide tiles, the last panel padded with 8 zero columns, split
    (1, 576, 1024, 1),      # wide tiles, none padded
    (3, 512, 512, 2),       # an odd row count: pairs of rows, the last row alone
    (4, 128, 64, 1),        # one wide tile
    (1, 64, 3, 1),          # small: one panel, mostly padding, stored through the tail
    (2, 20, 100, 1),        # a wide tile and three single panels, the last partial
    (4, 7, 64, 1),
    (2, 1024, 96, 1),       # deep: a wide tile and two single panels
    (1, 1536, 32, 1),
    (3, 1536, 21, 2),       # a partial panel through the tail, split
    (2, 768, 16 * 9, 2),    # split in whole wide tiles: 8 panels and 1
])
def test_gemv_matches_float64(m, k, o, threads):
    x, w, b = rand(m, k), rand(o, k, scale=0.2), rand(o)
    before = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        product = misc.constant_product(m, k, w, b, "RELU6")
        out = np.full((m, o), np.nan, np.float32)
        call = product(x, out)
        assert is_plan(call)
        (address, _tasks, *_), = call.rows
        assert address == gemv._gemv_task.address
        call()
        call()
    finally:
        numba.set_num_threads(before)
    want = np.clip(x.astype(np.float64) @ w.astype(np.float64).T + b, 0, 6)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.sqrt(k))


def test_a_weight_read_by_the_gemv_and_the_gemm_is_packed_once():
    """A decoder's prefill (the GEMM) and decode (the GEMV) read one weight: one packing,
    the GEMM's panels, serves both while either lives."""
    from litegpu_cpu.kernels import packed
    w, b = rand(300, 64, scale=0.2), rand(300)
    few, many = misc.constant_product(1, 64, w, b, "NONE"), misc.constant_product(64, 64, w, b, "NONE")
    x1, x64 = rand(1, 64), rand(64, 64)
    out1, out64 = np.empty((1, 300), np.float32), np.empty((64, 300), np.float32)
    calls = few(x1, out1), many(x64, out64)
    weights = [next(a for a in call.held if a.ndim == 3) for call in calls]
    assert weights[0] is weights[1]
    np.testing.assert_array_equal(weights[0], packed.pack(w.T))
    for call in calls:
        call()
    np.testing.assert_allclose(out1, x1 @ w.T + b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out64, x64 @ w.T + b, rtol=1e-5, atol=1e-5)
