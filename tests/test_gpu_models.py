"""End to end on the GPU backends CI executes (opencl on PoCL, webgpu on lavapipe): every
shared float model and two fetched real ones (so that a machine without the shared
models runs whole models too), in each precision mode the device gives, against LiteRT.

F32 must match LiteRT as closely as cpu does (TOLERANCE, relative to max|LiteRT|).
With half storage (F32_F16) or half arithmetic too (F16, where the device has it:
lavapipe's shader-f16; PoCL has no cl_khr_fp16) the outputs stay within FP16_MODEL_TOL of
LiteRT's fp32 outputs, with no NaN or Inf where LiteRT has none: each stored activation
rounds to 11 significant bits (relative step 4.9e-4), and that error grows through a deep
network's layers, so a whole model gets more room than one op (efficientnet_b0 measures
~3e-2 in F16 on random inputs). Tensor memory on the device is about halved.
"""
from __future__ import annotations

import numpy as np
import pytest

import litegpu
from litegpu.cli import random_inputs
from litegpu.testing.conformance import PRECISION_OPTIONS, precision_ran

from test_shared_models import FLOAT_MODELS, TOLERANCE, LiteRT, rel_error

FP16_MODEL_TOL = 5e-2
_RUN_TIME_LOOKUPS = ("GATHER", "GATHER_ND", "EMBEDDING_LOOKUP")
# (fixture, name): the shared float models (NONE where there are none: it skips saying so)
# and real models of litegpu.testing.realmodels: a face detector (convolutions, depthwise,
# pads, pools, concatenations; fp16 weights) and a wake-word classifier (dense layers).
MODELS = [*(("shared_model", name) for name in FLOAT_MODELS),
          ("real_model", "blazeface_short_range"), ("real_model", "oww_alexa")]
GPUS = ["opencl", "webgpu"]


def run_on(gpu: str, path, mode: str, inputs=None):
    """(interpreter on ``gpu`` in ``mode``, its outputs, LiteRT's outputs) on seeded inputs."""
    ours = litegpu.Interpreter(model_path=str(path), experimental_delegates=[
        litegpu.load_delegate(gpu, PRECISION_OPTIONS[mode])])
    theirs = LiteRT(model_path=str(path), num_threads=2)
    for interp in (ours, theirs):
        interp.allocate_tensors()
    inputs = random_inputs(theirs.get_input_details(), seed=7) if inputs is None else inputs
    for interp in (ours, theirs):
        for d, x in zip(interp.get_input_details(), inputs):
            interp.set_tensor(d["index"], x)
        interp.invoke()
    got = [ours.get_tensor(d["index"]) for d in ours.get_output_details()]
    want = [theirs.get_tensor(d["index"]) for d in theirs.get_output_details()]
    return ours, got, want


def mode_ran(interp) -> str:
    """The precision mode the GPU programs of ``interp`` ran in."""
    return precision_ran(interp.get_delegation_report())


def _device_bytes(interp) -> int:
    """Arena plus constants of every GPU program of the model."""
    total = 0
    for program, _, _ in interp._compiled.programs:
        if hasattr(program, "const_bytes"):   # opencl's arena is a size, webgpu's a plan
            total += program.arena_bytes if hasattr(program, "arena_bytes") else program.arena.total
            total += program.const_bytes
    return total


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("source, name", MODELS, ids=[name for _, name in MODELS])
def test_model_matches_litert_in_every_precision_mode(request, gpu, source, name):
    request.getfixturevalue(gpu)
    path = request.getfixturevalue(source)(name)
    full, got, want = run_on(gpu, path, "F32")
    errors = [rel_error(g, w) for g, w in zip(got, want)]
    assert max(errors) <= TOLERANCE, errors
    report = full.get_delegation_report()
    if name != "lstm_classifier.tflite":   # its WHILE loop runs on cpu, as in LiteRT
        # Lookups by run-time indices stay on cpu too, which raises LiteRT's error on an
        # index out of range (a kernel cannot report one).
        elsewhere = [a for a in report.assignments if a.backend != gpu]
        assert all(a.op in _RUN_TIME_LOOKUPS and "run time" in a.reason for a in elsewhere), str(report)
    for mode in ("F32_F16", "F16"):
        half, got16, _ = run_on(gpu, path, mode)
        if mode == "F16" and mode_ran(half) != "F16":
            continue   # a device without half arithmetic: F32_F16 again (the report says so)
        assert mode_ran(half) == mode
        for g, w in zip(got16, want):
            if w.dtype.kind == "f":
                assert np.isfinite(g).sum() >= np.isfinite(w).sum(), f"{mode} made a NaN or Inf that fp32 has not"
        errors16 = [rel_error(g, w) for g, w in zip(got16, want)]
        assert max(errors16) <= FP16_MODEL_TOL, (mode, errors16)
        if _device_bytes(full) >= 4096:   # fp16 halves what there is to halve
            assert _device_bytes(half) <= 0.55 * _device_bytes(full)
