"""The delegation report: true reasons, and every node of every subgraph (control flow's too)."""
from __future__ import annotations

import logging

import pytest

import litegpu
import litegpu.session as session_module


@pytest.fixture
def report_of(shared_model):
    """``f(name, delegates)``: the delegation report of shared model ``name``, allocated."""
    def make(name: str, delegates: list) -> litegpu.partition.DelegationReport:
        interp = litegpu.Interpreter(str(shared_model(name)), experimental_delegates=delegates)
        interp.allocate_tensors()
        return interp.get_delegation_report()
    return make


@pytest.fixture
def on_opencl(opencl) -> list:
    """The delegates that put a model on opencl (skips, or fails where required, as ``opencl`` does)."""
    return [litegpu.load_delegate("opencl")]


def _reasons(report) -> dict[str, str]:
    return {a.op: a.reason for a in report.assignments if a.backend == "cpu"}


def test_control_flow_and_variables_get_their_own_reasons(report_of, on_opencl) -> None:
    report = report_of("stateful_counter", on_opencl)
    reasons = _reasons(report)
    for op in ("CALL_ONCE", "WHILE", "IF"):
        assert "control flow runs on cpu" in reasons[op], reasons[op]
    for op in ("VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE"):
        assert "resource variables live on the host" in reasons[op], reasons[op]
    assert "comes from node 6 (READ_VARIABLE)" in reasons["ADD"], reasons["ADD"]
    assert "depends on tensor values" not in str(report)


def test_every_subgraph_is_reported_with_its_caller(report_of, on_opencl) -> None:
    report = report_of("stateful_counter", on_opencl)
    roles = {r.subgraph: r.role for r in report.called}
    assert roles == {2: "init of CALL_ONCE node 0 in subgraph 0",
                     3: "else branch of IF node 5 in subgraph 0",
                     4: "then branch of IF node 5 in subgraph 0",
                     5: "condition of WHILE node 4 in subgraph 0",
                     6: "body of WHILE node 4 in subgraph 0"}
    for called in report.called:
        assert called.assignments and all(a.backend == "cpu" and "as LiteRT's GPU delegate does" in a.reason
                                          for a in called.assignments)
    # The main subgraph's own view is unchanged; the called ones are extra.
    assert {s for s, _ in report.all_assignments()} == {0, 2, 3, 4, 5, 6}
    assert "subgraph 1 'reset': never called from subgraph 0" in str(report)
    assert "subgraph 6 (body of WHILE node 4 in subgraph 0)" in str(report)


def test_a_subgraph_that_has_run_reports_its_compiled_placement(shared_model) -> None:
    interp = litegpu.Interpreter(str(shared_model("lstm_classifier")))
    interp.allocate_tensors()
    before = interp.get_delegation_report()
    interp.invoke()
    after = interp.get_delegation_report()
    assert [r.subgraph for r in after.called] == [1, 2] == [r.subgraph for r in before.called]
    body = after.called[1]
    assert body.role == "body of WHILE node 5 in subgraph 0"
    assert body.nodes_on("cpu") == len(body.assignments) and body.nodes_in_file == 19
    # Nothing but cpu was asked for: no reasons to give.
    assert not any(a.reason for _, a in after.all_assignments())


def test_nodes_after_a_loop_name_the_loop(report_of, on_opencl) -> None:
    report = report_of("lstm_classifier", on_opencl)
    reasons = _reasons(report)
    assert "comes from node 5 (WHILE)" in reasons["STRIDED_SLICE"]
    assert "follow from node 5 (WHILE)" in reasons["FULLY_CONNECTED"]


def test_signature_reports_cover_their_own_callees(shared_model) -> None:
    with litegpu.CompiledModel.from_file(str(shared_model("stateful_counter"))) as model:
        reports = model.delegation_reports()
    assert [r.subgraph for r in reports] == [0, 1]
    assert [r.subgraph for r in reports[1].called] == [2]
    assert reports[1].called[0].role == "init of CALL_ONCE node 0 in subgraph 1"


def test_fp16_on_cpu_is_reported_as_f32(report_of, monkeypatch, caplog) -> None:
    monkeypatch.setattr(session_module, "_warned_precision", False)
    with caplog.at_level(logging.WARNING, logger="litegpu"):
        report = report_of("lstm_classifier", [litegpu.load_delegate("cpu", {"precision_loss_allowed": True})])
    assert "partition 0 on cpu: F32 (cpu has no fp16 mode; precision_loss_allowed ignored)" in str(report)
    assert all(r.programs for r in report.subgraph_reports())
    warnings = [r.getMessage() for r in caplog.records if "cpu backend computes in fp32" in r.getMessage()]
    assert len(warnings) == 1
    plain = report_of("lstm_classifier", [])
    assert "fp16" not in str(plain)


def test_the_top_line_names_the_host_arena_when_a_device_plans_its_own(opencl) -> None:
    """A fully delegated model's top line said "arena 0.00 MB" while its partition line
    said 1.1 MB: the top line counts host memory only, and says so beside a device."""
    from litegpu.testing.builder import ModelBuilder
    b = ModelBuilder()
    x = b.input("x", (1, 64, 64, 8))
    y, z = b.tensor("y", (1, 64, 64, 8)), b.tensor("z", (1, 64, 64, 8))
    b.op("LOGISTIC", [x], [y])
    b.op("MUL", [y, x], [z])
    b.output(z)
    lines = {}
    for name, delegates in (("cpu", []), ("opencl", [litegpu.load_delegate("opencl")])):
        interp = litegpu.Interpreter(model_content=b.build(), experimental_delegates=delegates)
        lines[name] = str(interp.get_delegation_report()).splitlines()
    assert "; arena " in lines["cpu"][0] and "host arena" not in lines["cpu"][0]
    assert "; host arena 0.00 MB" in lines["opencl"][0]
    assert any(line.startswith("  partition 0 on opencl") and "arena" in line for line in lines["opencl"])
