"""Profiling: the per-op summary, the Chrome trace, ``bench --profile --trace``, and no cost when off."""
from __future__ import annotations

import collections
import json
from pathlib import Path

import numpy as np
import pytest

import litegpu
from litegpu import executor
from litegpu.cli import main
from litegpu.profile import STATE, node_flops
from litegpu.testing.builder import ModelBuilder

# A trained network (90 nodes: convolutions, depthwise, pads, pools, concatenations) fetched
# by litegpu.testing.realmodels, so the whole-model profile runs without the shared models.
REAL_MODEL = "blazeface_short_range"


def _small_model() -> bytes:
    """CONV_2D then an elementwise chain (ADD with RELU, MUL): the chain fuses on cpu and
    folds into the conv's kernel on opencl, so both attribute one slice to several nodes."""
    b = ModelBuilder()
    x = b.input("x", (1, 8, 8, 3))
    w = b.const("w", np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32))
    bias = b.const("b", np.zeros(4, np.float32))
    y = b.tensor("y", (1, 8, 8, 4))
    b.op("CONV_2D", [x, w, bias], [y], padding="SAME", stride_w=1, stride_h=1)
    c = b.const("c", np.full((1, 8, 8, 4), 0.5, np.float32))
    z = b.tensor("z", (1, 8, 8, 4))
    b.op("ADD", [y, c], [z], fused_activation_function="RELU")
    out = b.tensor("out", (1, 8, 8, 4))
    b.op("MUL", [z, z], [out])
    b.output(out)
    return b.build()


def _interpreter(backend: str, **source) -> litegpu.Interpreter:
    delegates = [] if backend == "cpu" else [litegpu.load_delegate(backend)]
    interp = litegpu.Interpreter(**source, experimental_delegates=delegates)
    interp.allocate_tensors()
    for d in interp.get_input_details():
        interp.set_tensor(d["index"], np.random.default_rng(1).standard_normal(d["shape"]).astype(d["dtype"]))
    return interp


def _check(interp: litegpu.Interpreter, runs: int, tmp_path: Path) -> dict:
    """Profile ``runs`` runs; check the summary and the trace against the delegation report."""
    interp.invoke()   # compile and warm outside the profile
    with litegpu.profile() as p:
        for _ in range(runs):
            interp.invoke()
    report = interp.get_delegation_report()
    executed = {a.node: a.op for a in report.assignments}
    assert p.runs == runs
    # Every op type of the executed nodes, with its count of nodes.
    table = {op: count for op, count, *_ in p.op_table()}
    assert table == dict(collections.Counter(executed.values()))
    text = p.summary()
    for op in table:
        assert op in text
    # The trace: one slice per executed cpu step or opencl kernel per run, named by node and op.
    path = tmp_path / "trace.json"
    p.save_chrome_trace(path)
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    timed = [e for e in events if e["ph"] == "X" and e["cat"] in ("node", "kernel")]
    expected = sum(_slices_per_run(program) for program, _, _ in interp._compiled.programs)
    assert len(timed) == expected * runs
    covered = {n for e in timed for n in e["args"]["nodes"]}
    assert covered == set(executed)
    for e in timed:
        assert all(f"{n}" in e["name"] for n in (e["args"]["nodes"][0], e["args"]["ops"][0]))
        assert e["dur"] >= 0 and e["args"]["backend"] in ("cpu", "opencl", "webgpu")
    assert sum(e.get("cat") == "run" for e in events) == runs
    assert sum(e.get("cat") == "partition" for e in events) == runs * len(report.partitions)
    names = {e["args"]["name"] for e in events if e["ph"] == "M"}
    assert "host" in names
    return trace


def _slices_per_run(program) -> int:
    """What one run of a program records: a slice per cpu step, per opencl or webgpu launch."""
    if hasattr(program, "step_nodes"):
        return len(program.step_nodes)
    return len(program.launches)


def test_small_model_on_cpu(tmp_path):
    interp = _interpreter("cpu", model_content=_small_model())
    trace = _check(interp, 3, tmp_path)
    fused = [e for e in trace["traceEvents"] if e.get("cat") == "node" and len(e["args"]["nodes"]) > 1]
    assert fused and fused[0]["name"].startswith("nodes 1-2 (ADD+MUL)")


def test_real_model_on_cpu(real_model, tmp_path):
    _check(_interpreter("cpu", model_path=str(real_model(REAL_MODEL))), 2, tmp_path)


def test_small_model_on_opencl(opencl, tmp_path):
    interp = _interpreter("opencl", model_content=_small_model())
    trace = _check(interp, 3, tmp_path)
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
    assert kernels and all(e["args"]["precision"] and e["args"]["kernel"].startswith("k_") for e in kernels)
    assert any(e.get("cat") == "copy" for e in trace["traceEvents"])
    # Device times sit inside their run on the host clock.
    run = next(e for e in trace["traceEvents"] if e.get("cat") == "run")
    first = kernels[0]
    assert run["ts"] - 1e3 <= first["ts"] <= run["ts"] + run["dur"] + 1e3


def test_small_model_on_webgpu_from_timestamp_queries(webgpu, tmp_path):
    interp = _interpreter("webgpu", model_content=_small_model())
    if "timestamp-query" not in webgpu.open_device().features:
        pytest.skip("the WebGPU adapter has no timestamp-query: the profiler times partitions whole")
    trace = _check(interp, 3, tmp_path)
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel" and e["args"]["backend"] == "webgpu"]
    assert kernels and all(e["args"]["kernel"].startswith("k_") and e["dur"] > 0 for e in kernels)
    # The device's times: within their run, and no longer than it.
    runs = [e for e in trace["traceEvents"] if e.get("cat") == "run"]
    assert max(e["dur"] for e in kernels) <= max(r["dur"] for r in runs)


def test_real_model_on_opencl(opencl, real_model, tmp_path):
    _check(_interpreter("opencl", model_path=str(real_model(REAL_MODEL))), 2, tmp_path)


def test_profiling_off_leaves_nothing_behind(monkeypatch, opencl_or_none):
    backend = "opencl" if opencl_or_none else "cpu"
    interp = _interpreter(backend, model_content=_small_model())
    interp.invoke()
    expected = interp.get_tensor(interp.get_output_details()[0]["index"]).copy()
    with litegpu.profile() as p:
        assert STATE.active is p
        interp.invoke()
        with pytest.raises(RuntimeError):
            litegpu.profile().__enter__()
    assert STATE.active is None
    if backend == "opencl":
        from litegpu_opencl.device import default_device
        queue = default_device().queue
        assert not queue.properties & default_device().cl.command_queue_properties.PROFILING_ENABLE

    def profiled(*args, **kwargs):
        raise AssertionError("a run took the profiled path with profiling off")
    monkeypatch.setattr(executor, "run_profiled", profiled)
    interp.invoke()
    np.testing.assert_array_equal(interp.get_tensor(interp.get_output_details()[0]["index"]), expected)
    # A run under the profiler gives the same outputs as one without.
    monkeypatch.undo()
    with litegpu.profile():
        interp.invoke()
    np.testing.assert_array_equal(interp.get_tensor(interp.get_output_details()[0]["index"]), expected)


@pytest.fixture
def opencl_or_none():
    """The opencl backend when it is usable here, else None (the test then runs on cpu)."""
    from litegpu.plugins import manager
    backend = manager().backends.get("opencl")
    return backend if backend is not None and backend.available()[0] else None


def test_flops_of_the_gemm_shaped_ops():
    assert node_flops("CONV_2D", [(1, 8, 8, 3), (4, 3, 3, 3), (4,)], [(1, 8, 8, 4)]) == 2 * 256 * 27
    assert node_flops("DEPTHWISE_CONV_2D", [(1, 8, 8, 4), (1, 3, 3, 4), (4,)], [(1, 8, 8, 4)]) == 2 * 256 * 9
    assert node_flops("FULLY_CONNECTED", [(1, 16), (10, 16), None], [(1, 10)]) == 2 * 10 * 16
    assert node_flops("BATCH_MATMUL", [(2, 3, 5), (2, 5, 7)], [(2, 3, 7)]) == 2 * 42 * 5
    assert node_flops("ADD", [(1, 4), (1, 4)], [(1, 4)]) == 0


@pytest.mark.parametrize("where", ["cpu", "opencl"])
def test_bench_profile_and_trace(where, tmp_path, capsys, request):
    if where == "opencl":
        request.getfixturevalue("opencl")
    model = tmp_path / "small.tflite"
    model.write_bytes(_small_model())
    trace = tmp_path / "out.json"
    argv = ["bench", str(model), "--profile", "--trace", str(trace), "--num-runs", "2", "--warmup-runs", "0"]
    assert main([*argv, *(["--backend", where] if where != "cpu" else [])]) == 0
    out = capsys.readouterr().out
    assert "steady state" in out and "Per op type" in out and "Slowest nodes" in out
    for op in ("CONV_2D", "ADD", "MUL"):
        assert op in out
    events = json.loads(trace.read_text())["traceEvents"]
    assert sum(e.get("cat") == "run" for e in events) == 2
