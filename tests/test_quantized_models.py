"""Full-integer int8 shared models on the cpu backend's integer references, against LiteRT.

mobilenet_v2_int8 (int8 input and output) and mobilenet_v3_small_int8 (float input and
output, QUANTIZE / DEQUANTIZE at the edges, HARD_SWISH on LiteRT's builtin kernel, the
rest on its XNNPACK delegate). The spec: every output element within one quantum of
LiteRT's, the same top-1. Today they agree exactly; the counts are logged (``--log-cli-level=INFO``).
"""
from __future__ import annotations

import logging

import numpy as np
import pytest

import litegpu
from test_shared_models import MODELS, SHARED

from ai_edge_litert.interpreter import Interpreter as LiteRT  # a test dependency: never skipped

log = logging.getLogger(__name__)
INT8_MODELS = ["mobilenet_v2_int8.tflite", "mobilenet_v3_small_int8.tflite"]


def _need(name: str) -> str:
    if name not in MODELS:
        pytest.skip(f"shared model {name} is not at {SHARED}")
    return str(SHARED / name)


def _inputs(details: dict, seed: int) -> np.ndarray:
    """Seeded random input: int8 over the whole range, or floats in [-1, 1)."""
    rng = np.random.default_rng(seed)
    shape = tuple(int(s) for s in details["shape"])
    if np.dtype(details["dtype"]) == np.int8:
        return rng.integers(-128, 128, shape).astype(np.int8)
    return (rng.random(shape, np.float32) * 2 - 1).astype(np.float32)


def _output_quantum(path: str) -> float:
    """The quantum of the model's output: its scale, or for a float output the scale of the
    int8 tensor its DEQUANTIZE reads."""
    sg = litegpu.load_model(path).subgraphs[0]
    out = sg.tensors[sg.outputs[0]]
    if out.quantization is not None and out.quantization.is_set:
        return float(out.quantization.scales[0])
    (producer,) = [n for n in sg.nodes if sg.outputs[0] in n.outputs]
    assert producer.op == "DEQUANTIZE"
    return float(sg.tensors[producer.inputs[0]].quantization.scales[0])


@pytest.mark.parametrize("path_kind", ["references", "kernels"])
@pytest.mark.parametrize("name", INT8_MODELS)
def test_int8_model_matches_litert_to_the_quantum(name: str, path_kind: str, monkeypatch) -> None:
    """On the integer references alone, and with the cpu backend's integer kernels."""
    path = _need(name)
    if path_kind == "references":
        from litegpu_cpu.kernels import registry
        monkeypatch.setattr(registry, "QUANTIZED_KERNELS", {})
    ours, theirs = litegpu.Interpreter(model_path=path, num_threads=2), LiteRT(model_path=path, num_threads=2)
    for interp in (ours, theirs):
        interp.allocate_tensors()
    report = ours.get_delegation_report()
    assert report.nodes_on("cpu") == len(report.assignments)
    quantum = _output_quantum(path)
    for seed in (1, 2):
        x = _inputs(theirs.get_input_details()[0], seed)
        outs = []
        for interp in (ours, theirs):
            interp.set_tensor(interp.get_input_details()[0]["index"], x)
            interp.invoke()
            outs.append(interp.get_tensor(interp.get_output_details()[0]["index"]).copy())
        got, want = outs
        assert got.dtype == want.dtype and got.shape == want.shape
        diff = np.abs(got.astype(np.float64) - want.astype(np.float64)) / quantum
        differ = int(np.count_nonzero(diff > 1e-6))
        log.info("%s seed %d: max |ours - LiteRT| = %.3g quanta, %d of %d elements differ", name, seed, diff.max(),
                 differ, got.size)
        assert diff.max() <= 1.0 + 1e-6
        assert int(got.argmax()) == int(want.argmax())
        assert differ == 0   # exact today: any drift in rounding shows up here


@pytest.mark.parametrize("name", INT8_MODELS)
def test_quantization_details_match_litert(name: str) -> None:
    path = _need(name)
    ours, theirs = litegpu.Interpreter(model_path=path), LiteRT(model_path=path)
    for get in ("get_input_details", "get_output_details"):
        for a, b in zip(getattr(ours, get)(), getattr(theirs, get)()):
            assert a["dtype"] == b["dtype"]
            assert a["quantization"] == pytest.approx(b["quantization"])
            pa, pb = a["quantization_parameters"], b["quantization_parameters"]
            np.testing.assert_array_equal(pa["scales"], pb["scales"])
            np.testing.assert_array_equal(pa["zero_points"], pb["zero_points"])
            assert pa["quantized_dimension"] == pb["quantized_dimension"]


def test_int8_model_under_the_opencl_delegate_runs_on_cpu(opencl) -> None:
    path = _need("mobilenet_v2_int8.tflite")
    ours = litegpu.Interpreter(model_path=path, experimental_delegates=[litegpu.load_delegate("opencl")])
    theirs = LiteRT(model_path=path)
    x = _inputs(theirs.get_input_details()[0], 3)
    outs = []
    for interp in (ours, theirs):
        interp.allocate_tensors()
        interp.set_tensor(interp.get_input_details()[0]["index"], x)
        interp.invoke()
        outs.append(interp.get_tensor(interp.get_output_details()[0]["index"]))
    report = ours.get_delegation_report()
    assert report.nodes_on("cpu") == len(report.assignments) > 0
    np.testing.assert_array_equal(outs[0], outs[1])
