"""Plugin manager, partitioner, arena planner, control flow and limits."""
from __future__ import annotations

import logging

import numpy as np
import pytest

import litegpu
from litegpu.backend import Backend, CompileOptions, NodeContext, Partition, Program, Support
from litegpu.memory import Usage, plan_arena
from litegpu.plugins import PluginManager, manager
from litegpu.testing.builder import ModelBuilder


class AddOnlyBackend(Backend):
    """A backend that runs ADD only (its own numpy kernel), to exercise partitioning."""

    name = "addonly"

    def __init__(self) -> None:
        self.compiled: list[list[int]] = []

    def supports(self, node: NodeContext, model) -> Support:
        if node.node.op == "ADD" and node.attrs["activation"] == "NONE":
            return Support(True)
        return Support(False, f"{node.node.op} is not implemented")

    def compile(self, partition: Partition, options: CompileOptions) -> Program:
        self.compiled.append([ctx.node.index for ctx in partition.nodes])
        return _AddProgram(partition)


class _AddProgram(Program):
    def __init__(self, partition: Partition) -> None:
        self.partition = partition

    def run(self, inputs, outputs, wait_for=()):
        env = {t: a for t, a in zip(self.partition.inputs, inputs)}
        env.update({t: s.value for t, s in self.partition.specs.items() if s.value is not None})
        for ctx in self.partition.nodes:
            a, b = (env[i] for i in ctx.node.inputs)
            env[ctx.node.outputs[0]] = a + b
        for i, t in enumerate(self.partition.outputs):
            outputs[i][...] = env[t]
        return litegpu.backend.COMPLETE


@pytest.fixture(scope="module")
def addonly():
    backend = AddOnlyBackend()

    class Plugin:
        @litegpu.hookspecs.hookimpl
        def litegpu_backends(self):
            return [backend]

    pm = manager()
    pm.register(Plugin(), "addonly-test-plugin")
    yield pm.backends["addonly"]
    pm.unregister("addonly-test-plugin")
    assert "addonly" not in pm.backends


def chain_model(ops: list[str]) -> bytes:
    """x -> op0 -> op1 ... with a constant second operand for binary ops."""
    b = ModelBuilder()
    t = b.input("x", (2, 3))
    for i, op in enumerate(ops):
        y = b.tensor(f"t{i}", (2, 3))
        if op in ("ADD", "MUL", "SUB"):
            c = b.const(f"c{i}", np.full((2, 3), i + 1, np.float32))
            b.op(op, [t, c], [y])
        else:
            b.op(op, [t], [y])
        t = y
    b.output(t)
    return b.build()


def run(interp: litegpu.Interpreter, x: np.ndarray) -> np.ndarray:
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    return interp.get_tensor(interp.get_output_details()[0]["index"])


def test_partitions_fall_back_to_cpu_and_warn_once(addonly, caplog) -> None:
    model = chain_model(["ADD", "ADD", "RELU", "ADD", "MUL", "ADD", "ADD"])
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    with caplog.at_level(logging.WARNING, logger="litegpu"):
        interp = litegpu.Interpreter(model_content=model, experimental_delegates=[litegpu.load_delegate("addonly")])
    report = interp.get_delegation_report()
    assert [b for b, _ in report.partitions] == ["addonly", "cpu", "addonly", "cpu", "addonly"]
    assert report.nodes_on("addonly") == 5 and report.nodes_on("cpu") == 2
    assert not report.fully_delegated
    relu = [a for a in report.assignments if a.op == "RELU"][0]
    assert relu.backend == "cpu" and "RELU is not implemented" in relu.reason
    warnings = [r.getMessage() for r in caplog.records if "cannot be handled by this delegate" in r.getMessage()]
    assert any("op code #19 (RELU)" in w for w in warnings)
    expected = (np.maximum(x + 1 + 2, 0) + 4) * 5 + 6 + 7
    np.testing.assert_allclose(run(interp, x), expected, rtol=1e-6)
    assert "partition" in str(report)


def test_max_delegated_partitions_keeps_the_largest(addonly) -> None:
    model = chain_model(["ADD", "RELU", "ADD", "ADD", "ADD", "RELU", "ADD", "ADD"])
    interp = litegpu.Interpreter(model_content=model, experimental_delegates=[litegpu.load_delegate("addonly")],
                                 max_delegated_partitions=1)
    report = interp.get_delegation_report()
    delegated = [p for p in report.partitions if p[0] == "addonly"]
    assert len(delegated) == 1 and len(delegated[0][1]) == 3
    x = np.ones((2, 3), np.float32)
    np.testing.assert_allclose(run(interp, x), np.full((2, 3), 1 + 1 + 3 + 4 + 5 + 7 + 8, np.float32))


def test_unsupported_op_fails_at_compile_naming_op_and_node() -> None:
    b = ModelBuilder()
    x = b.input("x", (4,))
    y = b.tensor("y", (4,))
    b.custom_op("NoSuchCustomOp", [x], [y])
    b.output(y)
    with pytest.raises(litegpu.UnsupportedError, match=r"node 0 \(NoSuchCustomOp\)"):
        litegpu.Interpreter(model_content=b.build())


def test_broken_plugin_is_recorded_not_fatal(monkeypatch) -> None:
    from importlib import metadata

    class BrokenEP:
        name, value, group, dist = "broken", "no_such_module_xyz", "litegpu.backends", None

        def load(self):
            raise ImportError("No module named 'no_such_module_xyz'")

    real = metadata.entry_points
    monkeypatch.setattr(metadata, "entry_points",
                        lambda group=None: [*real(group=group), BrokenEP()] if group else real())
    pm = PluginManager()
    pm.load()
    rec = {r.name: r for r in pm.records}
    assert "No module named" in rec["broken"].error
    assert "cpu" in pm.backends
    with pytest.raises(litegpu.BackendUnavailableError, match="broken"):
        pm.backend("broken")


def test_arena_shares_memory_between_disjoint_lifetimes() -> None:
    usages = [Usage(0, 1000, 0, 1), Usage(1, 1000, 1, 2), Usage(2, 1000, 2, 3), Usage(3, 500, 3, 4)]
    plan = plan_arena(usages)
    # 0 and 2 never live together, nor 1 and 3: two slots suffice.
    assert plan.size < plan.naive_size
    for a in usages:
        for b in usages:
            if a is not b and not (a.last < b.first or b.last < a.first):
                ra = range(plan.offsets[a.tensor], plan.offsets[a.tensor] + a.nbytes)
                rb = range(plan.offsets[b.tensor], plan.offsets[b.tensor] + b.nbytes)
                assert not set(ra) & set(rb), (a, b)


def test_long_chain_runs_in_small_arena(monkeypatch) -> None:
    monkeypatch.setenv("LITEGPU_CPU_FUSION", "0")  # one node per step: memory is shared across steps
    model = chain_model(["ADD", "MUL", "SUB"] * 10)
    interp = litegpu.Interpreter(model_content=model)
    report = interp.get_delegation_report()
    assert report.arena_bytes <= 3 * 64 and report.arena_naive_bytes > report.arena_bytes
    x = np.ones((2, 3), np.float32)
    expect = x.copy()
    for i, op in enumerate(["ADD", "MUL", "SUB"] * 10):
        expect = {"ADD": np.add, "MUL": np.multiply, "SUB": np.subtract}[op](expect, np.float32(i + 1))
    np.testing.assert_allclose(run(interp, x), expect, rtol=1e-6)


def while_model(limit: float) -> bytes:
    """i = 0; while i < limit: i += 1."""
    b = ModelBuilder()
    cond = b.subgraph("cond")
    ci = cond.input("i", ())
    c_lim = cond.const("limit", np.array(limit, np.float32))
    c_out = cond.tensor("less", (), np.bool_)
    cond.op("LESS", [ci, c_lim], [c_out])
    cond.output(c_out)
    body = b.subgraph("body")
    bi = body.input("i", ())
    one = body.const("one", np.array(1, np.float32))
    b_out = body.tensor("next", ())
    body.op("ADD", [bi, one], [b_out])
    body.output(b_out)
    x = b.input("x", ())
    y = b.tensor("y", ())
    b.op("WHILE", [x], [y], cond_subgraph_index=cond.index, body_subgraph_index=body.index)
    b.output(y)
    return b.build()


def test_fused_chain_never_overwrites_what_it_reads() -> None:
    """A fused run reading a broadcast operand that an earlier node of the run produced."""
    b = ModelBuilder()
    x = b.input("x", (4, 8))
    m = b.tensor("m", (4, 8))
    b.op("MUL", [x, b.const("two", np.full((4, 8), 2, np.float32))], [m])
    s = b.tensor("s", (4, 1))
    b.op("MEAN", [m, b.const("axis", np.array([1], np.int32))], [s], keep_dims=True)
    d = b.tensor("d", (4, 8))
    b.op("SUB", [m, s], [d])
    e = b.tensor("e", (4, 8))
    b.op("MUL", [d, d], [e])
    f = b.tensor("f", (4, 8))
    b.op("ADD", [e, m], [f])
    b.output(f)
    x_val = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
    m_val = x_val * 2
    d_val = m_val - m_val.mean(axis=1, keepdims=True)
    np.testing.assert_allclose(run(litegpu.Interpreter(model_content=b.build()), x_val), d_val * d_val + m_val,
                               rtol=1e-5, atol=1e-6)


def test_while_loop_runs_and_matches_litert() -> None:
    import ai_edge_litert.interpreter as litert
    model = while_model(5.5)
    outs = []
    for cls in (litegpu.Interpreter, litert.Interpreter):
        interp = cls(model_content=model)
        outs.append(run(interp, np.array(0.5, np.float32)))
    assert outs[0] == outs[1] == np.float32(5.5)


def test_endless_while_hits_iteration_limit() -> None:
    model = while_model(1e30)
    interp = litegpu.Interpreter(model_content=model, limits=litegpu.Limits(max_while_iterations=1000))
    with pytest.raises(litegpu.ResourceLimitError, match="1000 iterations"):
        run(interp, np.array(0, np.float32))


def test_memory_limit_is_a_clear_error() -> None:
    b = ModelBuilder()
    x = b.input("x", (1024, 1024))
    y = b.tensor("y", (1024, 1024))
    b.op("RELU", [x], [y])
    b.output(y)
    with pytest.raises(litegpu.ResourceLimitError, match="limit"):
        litegpu.Interpreter(model_content=b.build(), limits=litegpu.Limits(max_bytes=1 << 20))


def _if_with_weights() -> bytes:
    """IF over two branches that each take the caller's constant weight [4, 8] as an input
    (as TF's converter passes a branch its weights) and run FULLY_CONNECTED with it."""
    from litegpu.testing.builder import ModelBuilder
    b = ModelBuilder()
    branches = []
    for sign in (1.0, -1.0):
        sg = b.subgraph()
        x, w = sg.input("x", (2, 8)), sg.input("w", (4, 8))
        y, z = sg.tensor("y", (2, 4)), sg.tensor("z", (2, 4))
        sg.op("FULLY_CONNECTED", [x, w, -1], [y], fused_activation_function="NONE")
        sg.op("MUL", [y, sg.const("s", np.full((1,), sign, np.float32))], [z], fused_activation_function="NONE")
        sg.output(z)
        branches.append(sg.index)
    c, x = b.input("c", (), np.bool_), b.input("x", (2, 8))
    w = b.const("w", np.arange(32, dtype=np.float32).reshape(4, 8) / 10)
    out = b.tensor("out", (2, 4))
    b.op("IF", [c, x, w], [out], then_subgraph_index=branches[0], else_subgraph_index=branches[1])
    b.output(out)
    return b.build()


def test_if_compiles_the_constant_inputs_of_its_branch_in() -> None:
    """A branch's constant input (its weights) is compiled in as a constant: nothing is
    copied in for it, and both branches still compute with it."""
    interp = litegpu.Interpreter(model_content=_if_with_weights())
    interp.allocate_tensors()
    c, x = (d["index"] for d in interp.get_input_details())
    w = next(t.index for t in interp._session.model.subgraphs[0].tensors if t.name == "w")
    xs = np.linspace(-1, 1, 16, dtype=np.float32).reshape(2, 8)
    weights = np.arange(32, dtype=np.float32).reshape(4, 8) / 10
    for flag, sign in ((True, 1.0), (False, -1.0), (True, 1.0)):
        interp.set_tensor(c, np.array(flag))
        interp.set_tensor(x, xs)
        interp.invoke()
        got = interp.get_tensor(interp.get_output_details()[0]["index"])
        np.testing.assert_allclose(got, sign * xs @ weights.T, rtol=1e-6)
    # Each branch was compiled with its weight input as the model's own constant array: the
    # host array is that array, which the call does not copy into.
    branches = list(interp._session.control._calls.values())
    assert len(branches) == 2
    for call in branches:
        w_input = call.compiled.sg.inputs[1]
        assert call.compiled.host[w_input] is call.compiled.sg.tensors[w_input].data or \
            call.compiled.host[w_input] is interp._session.model.subgraphs[0].tensors[w].data


def test_compile_time_is_measured_from_the_start_of_compiling():
    """A subgraph's compile time is the time it took, not the process's clock (a variable's
    initial value once overwrote the start time)."""
    b = ModelBuilder()
    x = b.input("x", (2, 3), np.float32)
    y = b.tensor("y", (2, 3), np.float32)
    b.op("RELU", [x], [y])
    b.output(y)
    interp = litegpu.Interpreter(model_content=b.build())
    interp.allocate_tensors()
    (compiled,) = interp._session._cache.values()
    assert 0 <= compiled.compile_seconds < 60
