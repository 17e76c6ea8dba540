"""Every conformance case the opencl backend takes, in F32_F16 mode (half storage).

Inputs given to LiteRT are rounded to fp16 first (what the device stores). Tolerance:
fp16 keeps 11 significant bits (relative step 2**-11 ≈ 4.9e-4); each stored
intermediate rounds once, so a case whose chain stores a few values stays well within
FP16_TOL relative to max|LiteRT|. Integer and bool outputs must still match exactly,
except those of quantized cases, whose float inputs the float view holds in half as
the device does (stored inputs are rounded for LiteRT too, so the rounding onto a grid
sees what the device sees): 8-bit grid values survive half storage within a couple of
quanta, and int16 values are full precision (kept float32), so 16-bit grids get the same
bound.
"""
from __future__ import annotations

import numpy as np
import pytest

from litegpu.testing.cases import all_cases
from litegpu.testing.conformance import compare, litegpu_outputs, litert_outputs, unsupported

FP16_TOL = 1e-2
FP16_QUANTA = 2


@pytest.mark.parametrize("case", all_cases(), ids=lambda c: c.id)
def test_op_fp16(opencl, case):
    model_bytes, inputs = case.build()
    refused = unsupported(model_bytes, opencl)
    if refused:
        pytest.skip(f"opencl does not support node {refused[0][1]} ({refused[0][2]}): {refused[0][3].reason}")
    # The device stores float inputs in half: LiteRT sees the same rounded values, so an
    # op that is exact on its inputs (CAST to int, comparisons) must still be exact.
    stored = [x.astype(np.float16).astype(np.float32) if x.dtype == np.float32 else x for x in inputs]
    want = litert_outputs(model_bytes, stored)
    big = max((float(np.abs(w).max()) for w in want if w.dtype.kind == "f" and w.size and np.isfinite(w).all()),
              default=0.0)
    if big > float(np.finfo(np.float16).max):
        pytest.skip(f"outputs reach {big:g}, beyond the fp16 range (65504): half storage cannot hold them")
    got = litegpu_outputs(model_bytes, inputs, "opencl", precision_loss_allowed=True)
    for g in got:
        if g.dtype.kind == "f":
            assert np.isfinite(g).all() or not all(np.isfinite(w).all() for w in want), "fp16 made a NaN/Inf"
    quanta = None
    if case.quanta is not None:
        quanta = case.quanta + FP16_QUANTA
    compare(got, want, max(FP16_TOL, case.tol), f"{case.id} on opencl in F32_F16", quanta)
