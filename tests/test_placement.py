"""placement="measure": the fastest measured assignment, never slower than all-cpu, cached.

On PoCL a tiny model is far faster on cpu than through kernel launches and copies, so a
measured placement moves it off opencl: that choice is robust, and the only one asserted.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

import litegpu
from litegpu import placement
from litegpu.testing.builder import ModelBuilder
from litegpu.testing.conformance import litert_outputs

from test_opencl_runtime import _split_model   # opencl (ADD) -> cpu (CUMSUM) -> opencl (MUL)


def _tiny_model(shape=(1, 8)) -> bytes:
    """x -> ADD -> MUL -> RELU: three small elementwise ops, all supported by opencl."""
    b = ModelBuilder()
    x = b.input("x", shape, np.float32)
    a = b.tensor("a", shape, np.float32)
    b.op("ADD", [x, x], [a])
    m = b.tensor("m", shape, np.float32)
    b.op("MUL", [a, x], [m])
    r = b.tensor("r", shape, np.float32)
    b.op("RELU", [m], [r])
    b.output(r)
    return b.build()


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cache directory, and fresh placement counters."""
    monkeypatch.setenv("LITEGPU_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(placement, "stats", {"measured": 0, "from_cache": 0})
    return tmp_path / "placement"


def _interp(content: bytes, **kwargs) -> litegpu.Interpreter:
    interp = litegpu.Interpreter(model_content=content,
                                 experimental_delegates=[litegpu.load_delegate("opencl")], **kwargs)
    interp.allocate_tensors()
    return interp


def _run(interp: litegpu.Interpreter, x: np.ndarray) -> np.ndarray:
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    return interp.get_tensor(interp.get_output_details()[0]["index"])


def test_measure_moves_a_tiny_model_off_opencl_with_the_measured_reason(opencl, cache):
    content = _tiny_model()
    interp = _interp(content, placement="measure")
    report = interp.get_delegation_report()
    assert report.nodes_on("cpu") == 3, str(report)
    assert report.placement.startswith("placement measured"), report.placement
    assert "first-that-supports" in report.placement and "all-cpu" in report.placement
    reason = report.assignments[0].reason
    assert reason.startswith("measured: cpu ") and " vs opencl " in reason and reason.endswith("for nodes 0..2")
    assert "placement measured" in str(report) and reason in str(report)
    assert placement.stats == {"measured": 1, "from_cache": 0}
    x = np.linspace(-2, 2, 8, dtype=np.float32).reshape(1, 8)
    np.testing.assert_allclose(_run(interp, x), litert_outputs(content, [x])[0], rtol=1e-6)
    # The default placement is unchanged: first-that-supports, everything on opencl.
    default = _interp(content).get_delegation_report()
    assert default.nodes_on("opencl") == 3 and default.placement == ""


def test_a_warm_start_reads_the_decision_and_does_not_measure(opencl, cache, monkeypatch):
    content = _tiny_model()
    cold = _interp(content, placement="measure").get_delegation_report()
    assert len(list(cache.glob("*.json"))) == 1

    def no_timing(*_args, **_kwargs):
        raise AssertionError("a warm start measured again")
    monkeypatch.setattr(placement, "time_candidate", no_timing)
    # Through the delegate option this time, and through CompiledModel.
    warm_interp = litegpu.Interpreter(model_content=content, experimental_delegates=[
        litegpu.load_delegate("opencl", {"placement": "measure"})])
    warm = warm_interp.get_delegation_report()
    assert warm.placement.startswith("placement from cache (measured "), warm.placement
    assert [a.backend for a in warm.assignments] == [a.backend for a in cold.assignments]
    assert warm.assignments[0].reason == cold.assignments[0].reason
    model = litegpu.CompiledModel.from_buffer(content, backend="opencl", placement="measure")
    assert model.delegation_reports()[0].nodes_on("cpu") == 3
    assert placement.stats == {"measured": 1, "from_cache": 2}
    x = np.full((1, 8), 0.5, np.float32)
    warm_interp.allocate_tensors()
    np.testing.assert_allclose(_run(warm_interp, x), np.maximum((x + x) * x, 0), rtol=1e-6)


@pytest.mark.parametrize("garbage", ["{not json", json.dumps({"format": 1, "moved": [1]}), ""])
def test_a_corrupt_cache_file_is_ignored_and_rewritten(opencl, cache, garbage, caplog):
    content = _tiny_model()
    _interp(content, placement="measure")
    (path,) = cache.glob("*.json")
    path.write_text(garbage)
    report = _interp(content, placement="measure").get_delegation_report()
    assert report.placement.startswith("placement measured"), report.placement
    assert placement.stats["measured"] == 2
    assert "corrupt" in caplog.text
    assert json.loads(path.read_text())["format"] == 1


def test_each_device_partition_is_a_candidate(opencl, cache):
    content = _split_model((2, 4))
    report = _interp(content, placement="measure").get_delegation_report()
    assert "partition 0 (opencl) to cpu" in report.placement and "partition 2 (opencl) to cpu" in report.placement
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    interp = _interp(content, placement="measure")
    np.testing.assert_allclose(_run(interp, x), litert_outputs(content, [x])[0], rtol=1e-6)


def test_measure_with_only_cpu_measures_nothing(cache):
    interp = litegpu.Interpreter(model_content=_tiny_model(), placement="measure")
    assert interp.get_delegation_report().placement == ""
    assert placement.stats["measured"] == 0 and not cache.exists()


@pytest.mark.parametrize("make", [
    lambda c: litegpu.Interpreter(model_content=c, placement="fastest"),
    lambda c: litegpu.Interpreter(model_content=c, experimental_delegates=[
        litegpu.load_delegate("cpu", {"placement": "auto"})]),
    lambda c: litegpu.CompiledModel.from_buffer(c, placement="Measure"),
])
def test_an_invalid_placement_names_the_valid_ones(make):
    with pytest.raises(litegpu.InvalidArgumentError, match="'first', 'measure'"):
        make(_tiny_model())


def test_the_fastest_candidate_is_kept_even_when_it_is_the_device(opencl, cache, monkeypatch):
    # Timings made up: the device wins, so nothing moves and no node gets a measured reason.
    monkeypatch.setattr(placement, "time_candidate",
                        lambda compiled: 1e-3 if compiled.report.nodes_on("opencl") else 2e-3)
    report = _interp(_tiny_model(), placement="measure").get_delegation_report()
    assert report.nodes_on("opencl") == 3
    assert report.placement.endswith("first-that-supports 1 ms, all-cpu 2 ms; kept first-that-supports")
    assert not any(a.reason for a in report.assignments)


def test_the_command_line_measures_cold_and_reads_the_cache_warm(opencl, cache, capsys, tmp_path):
    from litegpu.cli import main
    path = tmp_path / "tiny.tflite"
    path.write_bytes(_tiny_model())
    argv = ["run", str(path), "--backend", "opencl", "--placement", "measure"]
    assert main(argv) == 0
    cold = capsys.readouterr().out
    assert "placement measured" in cold and "partition 0: cpu" in cold
    assert main(argv) == 0
    assert "placement from cache (measured " in capsys.readouterr().out
    assert placement.stats == {"measured": 1, "from_cache": 1}
