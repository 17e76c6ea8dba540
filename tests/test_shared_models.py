"""End to end: every shared model runs on litegpu's cpu backend and matches LiteRT.

The models are found through the ``shared_model`` fixture (tests/conftest.py); where they
are not here each test skips saying where it looked, or fails where the run requires them.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import litegpu
from litegpu.cli import random_inputs
from litegpu.testing.shared_models import NONE, shared_model_names, shared_model_path

from ai_edge_litert.interpreter import Interpreter as LiteRT  # a test dependency: never skipped

MODELS = shared_model_names()


def _is_quantized(name: str) -> bool:
    """Whether the model has quantized integer tensors (refused until int8 kernels exist)."""
    model = litegpu.load_model(shared_model_path(name))
    return any(t.type_name in ("INT8", "UINT8", "INT16") and t.quantization is not None
               and t.quantization.is_set for sg in model.subgraphs for t in sg.tensors)


QUANTIZED = {m for m in MODELS if _is_quantized(m)}
STATEFUL = {"stateful_counter.tflite"}
# Every float model here; where there are none, NONE, which the fixture skips (or fails) on.
FLOAT_MODELS = [m for m in MODELS if m not in QUANTIZED | STATEFUL] or [NONE]
TOLERANCE = 1e-4


def rel_error(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / max |want| (exact compare for non-float outputs)."""
    assert got.shape == want.shape and got.dtype == want.dtype
    if want.dtype.kind not in "fc":
        return 0.0 if np.array_equal(got, want) else float("inf")
    scale = max(float(np.abs(want).max()), 1e-30) if want.size else 1.0
    return float(np.abs(got.astype(np.float64) - want.astype(np.float64)).max()) / scale if want.size else 0.0


def run_both(path: Path, batch: int | None = None) -> list[float]:
    ours = litegpu.Interpreter(model_path=str(path), num_threads=2)
    theirs = LiteRT(model_path=str(path), num_threads=2)
    for interp in (ours, theirs):
        if batch is not None:
            for d in interp.get_input_details():
                interp.resize_tensor_input(d["index"], [batch, *d["shape"][1:]])
        interp.allocate_tensors()
    inputs = random_inputs(theirs.get_input_details(), seed=7)
    for interp in (ours, theirs):
        for d, x in zip(interp.get_input_details(), inputs):
            interp.set_tensor(d["index"], x)
        interp.invoke()
    report = ours.get_delegation_report()
    assert report.nodes_on("cpu") == len(report.assignments)
    return [rel_error(ours.get_tensor(a["index"]), theirs.get_tensor(b["index"]))
            for a, b in zip(ours.get_output_details(), theirs.get_output_details())]


def test_the_shared_models_are_here(shared_model) -> None:
    """Without them every model test here skips: say so, or fail where the run requires them."""
    shared_model(NONE)


@pytest.mark.parametrize("name", FLOAT_MODELS)
def test_model_matches_litert(shared_model, name: str) -> None:
    errors = run_both(shared_model(name))
    assert max(errors) <= TOLERANCE, errors


def test_dynamic_batch_resize_matches_litert(shared_model) -> None:
    errors = run_both(shared_model("dynamic_batch_mlp"), batch=3)
    assert max(errors) <= TOLERANCE


# Quantized models (full-integer, 16x8, dynamic-range) are compared with LiteRT in
# tests/test_quantized_models.py and tests/test_hybrid_models.py.


def test_int8_model_is_read_whole(shared_model) -> None:
    assert len(litegpu.load_model(shared_model("mobilenet_v2_int8")).subgraphs[0].nodes) == 64


def test_stateful_counter_keeps_state_like_litert(shared_model) -> None:
    path = str(shared_model("stateful_counter"))
    ours, theirs = litegpu.Interpreter(model_path=path), LiteRT(model_path=path)
    assert ours.get_signature_list() == theirs.get_signature_list()
    runners = [(i.get_signature_runner("increment"), i.get_signature_runner("reset")) for i in (ours, theirs)]
    rng = np.random.default_rng(3)
    for step in range(7):
        x = rng.standard_normal(4).astype(np.float32)
        results = []
        for inc, reset in runners:
            results.append(reset() if step == 4 else _call_increment(inc, x))
        assert results[0].keys() == results[1].keys()
        for key in results[0]:
            np.testing.assert_allclose(results[0][key], results[1][key], rtol=1e-6, atol=1e-6)


def _call_increment(runner, x: np.ndarray) -> dict:
    (name,) = runner.get_input_details().keys()
    return runner(**{name: x})
