"""End to end on opencl: every shared float model and two fetched real ones (so that a
machine without the shared models runs whole models too), fp32 and fp16 storage, against LiteRT.

fp32 must match LiteRT as closely as cpu does (TOLERANCE, relative to max|LiteRT|).
With precision loss allowed (F32_F16: tensors and weights stored in half), the outputs
stay within FP16_MODEL_TOL of LiteRT's fp32 outputs, with no NaN or Inf where LiteRT
has none: each stored activation rounds to 11 significant bits (relative step 4.9e-4),
and that error grows through a deep network's layers, so a whole model gets more room
than one op (mobilenet_v2 measures ~2.4e-2 on random inputs). Tensor memory on the
device is about halved.
"""
from __future__ import annotations

import numpy as np
import pytest

import litegpu
from litegpu.cli import random_inputs

from test_shared_models import FLOAT_MODELS, TOLERANCE, LiteRT, rel_error

FP16_MODEL_TOL = 5e-2
_RUN_TIME_LOOKUPS = ("GATHER", "GATHER_ND", "EMBEDDING_LOOKUP")
# (fixture, name): the shared float models (NONE where there are none: it skips saying so)
# and real models of litegpu.testing.realmodels: a face detector (convolutions, depthwise,
# pads, pools, concatenations; fp16 weights) and a wake-word classifier (dense layers).
MODELS = [*(("shared_model", name) for name in FLOAT_MODELS),
          ("real_model", "blazeface_short_range"), ("real_model", "oww_alexa")]


def _run(path, precision_loss: bool):
    ours = litegpu.Interpreter(model_path=str(path), experimental_delegates=[
        litegpu.load_delegate("opencl", {"precision_loss_allowed": precision_loss})])
    theirs = LiteRT(model_path=str(path), num_threads=2)
    for interp in (ours, theirs):
        interp.allocate_tensors()
    inputs = random_inputs(theirs.get_input_details(), seed=7)
    for interp in (ours, theirs):
        for d, x in zip(interp.get_input_details(), inputs):
            interp.set_tensor(d["index"], x)
        interp.invoke()
    got = [ours.get_tensor(d["index"]) for d in ours.get_output_details()]
    want = [theirs.get_tensor(d["index"]) for d in theirs.get_output_details()]
    return ours, got, want


def _device_bytes(interp) -> int:
    """Arena plus constants of every opencl program of the model."""
    return sum(p.arena_bytes + p.const_bytes for p, _, _ in interp._compiled.steps if hasattr(p, "arena_bytes"))


@pytest.mark.parametrize("source, name", MODELS, ids=[name for _, name in MODELS])
def test_model_on_opencl_matches_litert_in_fp32_and_fp16(opencl, request, source, name):
    path = request.getfixturevalue(source)(name)
    full, got, want = _run(path, precision_loss=False)
    errors = [rel_error(g, w) for g, w in zip(got, want)]
    assert max(errors) <= TOLERANCE, errors
    report = full.get_delegation_report()
    if name != "lstm_classifier.tflite":   # its WHILE loop runs on cpu, as in LiteRT
        # Lookups by run-time indices stay on cpu too, which raises LiteRT's error on an
        # index out of range (a kernel cannot report one).
        elsewhere = [a for a in report.assignments if a.backend != "opencl"]
        assert all(a.op in _RUN_TIME_LOOKUPS and "run time" in a.reason for a in elsewhere), str(report)
    half, got16, _ = _run(path, precision_loss=True)
    for g, w in zip(got16, want):
        if w.dtype.kind == "f":
            assert np.isfinite(g).sum() >= np.isfinite(w).sum(), "fp16 made a NaN or Inf that fp32 has not"
    errors16 = [rel_error(g, w) for g, w in zip(got16, want)]
    assert max(errors16) <= FP16_MODEL_TOL, errors16
    assert "F32_F16" in str(half.get_delegation_report())
    if _device_bytes(full) >= 4096:   # fp16 halves what there is to halve
        assert _device_bytes(half) <= 0.55 * _device_bytes(full)
