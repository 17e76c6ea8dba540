"""The cpu backend's few-row product with a constant weight (litegpu_cpu.kernels.gemv)."""
from __future__ import annotations

import numba
import numpy as np
import pytest

from litegpu_cpu.kernels import gemv, misc
from litegpu_cpu.kernels.tasks import is_plan

from test_cpu_kernels import rand


@pytest.mark.parametrize("m,k,o,threads,narrow", [
    (1, 1024, 1000, 2, False),      # panels, the last padded with 24 zero columns, split
    (1, 576, 1024, 1, False),       # panels, none padded
    (3, 512, 512, 2, False),        # an odd row count: pairs of rows, the last row alone
    (4, 128, 64, 1, False),         # one panel
    (1, 64, 3, 1, False),           # small: one panel, mostly padding, stored through the tail
    (2, 20, 100, 1, False),         # a whole panel and a partial one
    (4, 7, 64, 1, False),
    (2, 1024, 96, 1, True),         # deep, half a 64-column panel of padding: panels of 16
    (1, 1536, 32, 1, True),
    (3, 1536, 21, 2, True),         # a partial narrow panel through the tail, split
])
def test_gemv_matches_float64(m, k, o, threads, narrow):
    x, w, b = rand(m, k), rand(o, k, scale=0.2), rand(o)
    before = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        product = misc.constant_product(m, k, w, b, "RELU6")
        out = np.full((m, o), np.nan, np.float32)
        call = product(x, out)
        assert is_plan(call)
        (address, _tasks, *_), = call.rows
        assert address == gemv._gemv_task.address and call.held[-2][4] == narrow
        call()
        call()
    finally:
        numba.set_num_threads(before)
    want = np.clip(x.astype(np.float64) @ w.astype(np.float64).T + b, 0, 6)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.sqrt(k))


def test_panels_layout():
    w = rand(70, 5)
    p = gemv.panels(w)
    assert p.shape == (2, 5, 64) and p.flags.c_contiguous
    np.testing.assert_array_equal(p[1, :, 3], w[67])
    assert not p[1, :, 6:].any()
    p = gemv.panels(w, 16)
    assert p.shape == (5, 5, 16)
    np.testing.assert_array_equal(p[4, :, 5], w[69])
    assert not p[4, :, 6:].any()
