"""The backend contract as the core uses it (``litegpu.backend``).

A malformed backend is refused when its plugin registers, naming the plugin and the
fault; a backend implementing only ``supports`` and ``compile`` runs a model; the base
classes' optional members do what their docstrings say, and the core honours them.
"""
from __future__ import annotations

import types
from typing import Sequence

import numpy as np
import pytest

import litegpu
from litegpu import plugins
from litegpu.backend import (COMPLETE, Backend, Bound, CompileOptions, Event, NodeContext, Partition, Program, Runtime,
                             Step, Support, contract_problems)
from litegpu.errors import BackendUnavailableError, PluginError, ResourceLimitError
from litegpu.hookspecs import hookimpl
from litegpu.ops import TensorSpec, get_op
from litegpu.plugins import PluginManager, manager
from litegpu.testing.builder import ModelBuilder


# -- a third party's minimal host backend ---------------------------------------------------
_KERNELS = {"ADD": np.add, "MUL": np.multiply}


class MinimalProgram(Program):
    """Runs a partition's ADD / MUL / RESHAPE nodes in numpy; implements ``run`` only."""

    def __init__(self, partition: Partition) -> None:
        self.nodes = [(ctx.node.op, list(ctx.node.inputs), list(ctx.node.outputs)) for ctx in partition.nodes]
        self.inputs, self.outputs = list(partition.inputs), list(partition.outputs)
        self.constants = {t: s.value for t, s in partition.specs.items() if s.value is not None}
        self.given: list[list[bool]] = []   # per run: which outputs arrived as arrays (not None)
        self.runs = 0

    def run(self, inputs: Sequence[np.ndarray], outputs: list, wait_for: Sequence[Event] = ()) -> Event:
        self.runs += 1
        self.given.append([o is not None for o in outputs])
        env = {**self.constants, **dict(zip(self.inputs, inputs))}
        for op, ins, outs in self.nodes:
            a, b = (env[i] for i in ins)
            env[outs[0]] = np.reshape(a, b.astype(np.int64)) if op == "RESHAPE" else _KERNELS[op](a, b)
        for k, t in enumerate(self.outputs):
            if outputs[k] is None:   # shaped at run time: the program supplies the array
                outputs[k] = np.array(env[t])
            else:
                outputs[k][...] = env[t]
        return COMPLETE


class MinimalBackend(Backend):
    """ADD and MUL of float32 (and RESHAPE by a run-time shape): only the two required methods."""

    name = "minimal"

    def __init__(self) -> None:
        self.programs: list[MinimalProgram] = []

    def supports(self, node: NodeContext, model) -> Support:
        if node.node.op in _KERNELS and node.attrs.get("activation", "NONE") == "NONE":
            return Support(True)
        if node.node.op == "RESHAPE":
            return Support(True)
        return Support(False, f"minimal has no kernel for {node.node.op}")

    def compile(self, partition: Partition, options: CompileOptions) -> Program:
        program = MinimalProgram(partition)
        self.programs.append(program)
        return program


def _plugin(*backends) -> object:
    """A plugin object whose hook returns ``backends`` (as a third party's module would)."""

    class Plugin:
        @hookimpl
        def litegpu_backends(self):
            return list(backends)
    return Plugin()


@pytest.fixture
def registered():
    """Registers plugins for one test and removes them afterwards."""
    names: list[str] = []

    def register(name: str, *backends) -> None:
        manager().register(_plugin(*backends), name)
        names.append(name)
    yield register
    for name in names:
        manager().unregister(name)


def _add_mul_model() -> bytes:
    b = ModelBuilder()
    x = b.input("x", (2, 3))
    c = b.const("c", np.arange(6, dtype=np.float32).reshape(2, 3))
    y = b.tensor("y", (2, 3))
    b.op("ADD", [x, c], [y])
    z = b.tensor("z", (2, 3))
    b.op("MUL", [y, y], [z])
    b.output(z)
    return b.build()


def _run(model: bytes, backend: str, x: np.ndarray, runs: int = 1) -> tuple[litegpu.Interpreter, np.ndarray]:
    interp = litegpu.Interpreter(model_content=model, experimental_delegates=[litegpu.load_delegate(backend)])
    interp.allocate_tensors()
    for _ in range(runs):
        interp.set_tensor(interp.get_input_details()[0]["index"], x)
        interp.invoke()
    return interp, interp.get_tensor(interp.get_output_details()[0]["index"])


# -- registration: malformed backends are refused, naming the plugin --------------------------
def _named(name, **members) -> Backend:
    """An instance of a fresh Backend subclass with ``name`` and the given class members."""
    kind = type("Bad", (MinimalBackend,), {"name": name, **members})
    return kind()


_MALFORMED = {
    "not-a-backend": ([types.SimpleNamespace(name="ns", supports=print, compile=print)],
                      "a types.SimpleNamespace is not a litegpu.backend.Backend"),
    "empty-name": ([_named("")], "name must be a non-empty str, got ''"),
    "name-not-str": ([_named(7)], "name must be a non-empty str, got 7"),
    "name-two-words": ([_named("my gpu")], "name 'my gpu' must be one word"),
    "name-in-a-list": ([_named("a,b")], "name 'a,b' must be one word"),
    "name-gpu": ([_named("Gpu")], "name 'Gpu' is reserved"),
    "name-taken": ([_named("cpu")], "name 'cpu' is already taken by plugin 'cpu'"),
    "name-twice": ([_named("twin"), _named("twin")],
                   "backend 1 ('twin', a test_backend_contract.Bad): name 'twin' is already taken by backend 0"),
    "compile-not-callable": ([_named("nocompile", compile=None)], "compile must be a method, got None"),
    "supports-not-callable": ([_named("nosupports", supports="yes")], "supports must be a method, got 'yes'"),
    "copy_out-not-callable": ([_named("nocopy", copy_out=3)], "copy_out must be a method, got 3"),
    "is_gpu-not-bool": ([_named("flag", is_gpu="yes")], "is_gpu must be a bool, got 'yes'"),
    "host_memory-not-bool": ([_named("mem", host_memory=None)], "host_memory must be a bool, got None"),
    "gpu_priority-not-int": ([_named("prio", gpu_priority="high")], "gpu_priority must be an int, got 'high'"),
}


@pytest.mark.parametrize("case", sorted(_MALFORMED))
def test_a_malformed_backend_is_refused_at_registration_naming_plugin_and_fault(case):
    backends, fault = _MALFORMED[case]
    before = dict(manager().backends)
    with pytest.raises(PluginError) as caught:
        manager().register(_plugin(*backends), f"third-party-{case}")
    message = str(caught.value)
    assert message.startswith(f"plugin 'third-party-{case}': backend "), message
    assert fault in message, message
    # Refused whole: nothing registered, no record left, the plugin's hooks gone from pluggy.
    assert manager().backends == before
    assert not [r for r in manager().records if r.name == f"third-party-{case}"]
    assert manager().pm.get_plugin(f"third-party-{case}") is None


def test_a_plugin_with_one_malformed_backend_registers_none_of_its_backends():
    with pytest.raises(PluginError, match="backend 1 .*name must be a non-empty str"):
        manager().register(_plugin(MinimalBackend(), _named("")), "half-good")
    assert "minimal" not in manager().backends
    with pytest.raises(BackendUnavailableError, match="no backend named 'minimal'"):
        litegpu.load_delegate("minimal")


def test_every_fault_of_a_plugin_is_named_in_one_error():
    with pytest.raises(PluginError) as caught:
        manager().register(_plugin(_named(""), _named("ok", is_gpu=1)), "two-faults")
    message = str(caught.value)
    assert "backend 0 (a test_backend_contract.Bad): name must be a non-empty str" in message, message
    assert "backend 1 ('ok', a test_backend_contract.Bad): is_gpu must be a bool, got 1" in message, message


def test_a_hook_returning_no_list_is_refused():
    with pytest.raises(PluginError, match=r"plugin 'lonely': litegpu_backends\(\) must return a list of "
                                          r"backends, got a test_backend_contract.MinimalBackend"):
        manager().register(_plugin_returning(MinimalBackend()), "lonely")
    assert "minimal" not in manager().backends


def _plugin_returning(result) -> object:
    class Plugin:
        @hookimpl
        def litegpu_backends(self):
            return result
    return Plugin()


def test_a_hook_that_raises_is_a_plugin_error_naming_the_plugin():
    class Raising:
        @hookimpl
        def litegpu_backends(self):
            raise RuntimeError("driver exploded")
    with pytest.raises(PluginError, match="plugin 'raiser': a hook raised RuntimeError: driver exploded"):
        manager().register(Raising(), "raiser")
    assert manager().pm.get_plugin("raiser") is None


class _EntryPoint:
    """What ``importlib.metadata.entry_points`` yields, for a plugin of our making."""

    def __init__(self, name: str, plugin: object) -> None:
        self.name, self.value, self._plugin = name, "third_party_gpu:plugin", plugin
        self.dist = types.SimpleNamespace(name="third-party-gpu", version="1.2")

    def load(self) -> object:
        return self._plugin


def test_an_installed_plugin_with_a_malformed_backend_is_listed_as_failed_and_named_when_asked_for(
        monkeypatch, caplog):
    good, bad = MinimalBackend(), _named("")
    eps = [_EntryPoint("tp-good", _plugin(good)), _EntryPoint("tp-bad", _plugin(bad))]
    monkeypatch.setattr(plugins.metadata, "entry_points", lambda group: eps if group == plugins.ENTRY_POINT_GROUP
                        else [])
    pm = PluginManager()
    pm.load()   # no raise: a broken installed plugin must not break litegpu
    assert pm.backends == {"minimal": good}
    (rec,) = [r for r in pm.records if r.name == "tp-bad"]
    assert rec.error.startswith("PluginError: plugin 'tp-bad' (entry point third_party_gpu:plugin, "
                                "distribution third-party-gpu 1.2): backend 0 (a test_backend_contract.Bad): "
                                "name must be a non-empty str"), rec.error
    assert "tp-bad" in caplog.text and "name must be a non-empty str" in caplog.text
    assert pm.pm.get_plugin("tp-bad") is None
    with pytest.raises(BackendUnavailableError, match=r"plugins that failed to load: \[.tp-bad \(PluginError: "
                                                      r"plugin 'tp-bad'"):
        pm.backend("whatever")


def test_compile_returning_no_program_is_refused_naming_the_backend(registered):
    class Sloppy(MinimalBackend):
        name = "sloppy"

        def compile(self, partition, options):
            return lambda inputs, outputs, wait_for=(): COMPLETE   # runs, but is no Program

    registered("sloppy-plugin", Sloppy())
    with pytest.raises(PluginError, match=r"backend 'sloppy': compile\(\) returned a builtins.function, not a "
                                          r"litegpu.backend.Program"):
        _run(_add_mul_model(), "sloppy", np.ones((2, 3), np.float32))


def test_the_shipped_backends_meet_the_contract():
    for name, backend in manager().backends.items():
        assert contract_problems(backend) == [], name
    assert contract_problems(MinimalBackend()) == []


# -- a minimal valid backend runs a model -----------------------------------------------------
def test_a_backend_with_only_supports_and_compile_runs_a_model(registered):
    backend = MinimalBackend()
    registered("minimal-plugin", backend)
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    interp, out = _run(_add_mul_model(), "minimal", x, runs=2)
    expected = (x + np.arange(6, dtype=np.float32).reshape(2, 3)) ** 2
    np.testing.assert_allclose(out, expected, rtol=1e-6)
    report = interp.get_delegation_report()
    assert {a.backend for a in report.assignments} == {"minimal"}
    (program,) = backend.programs
    assert program.runs == 2 and program.given == [[True], [True]]   # fixed shapes: arrays given


def _reshape_model() -> bytes:
    """x * x, reshaped to a shape given as an input: the output's shape is known only at run time."""
    b = ModelBuilder()
    x = b.input("x", (2, 3))
    shape = b.input("shape", (2,), np.int32)
    y = b.tensor("y", (2, 3))
    b.op("MUL", [x, x], [y])
    z = b.tensor("z", (3, 2))
    b.op("RESHAPE", [y, shape], [z])
    b.output(z)
    return b.build()


@pytest.mark.parametrize("shape", [(3, 2), (1, 6)])
def test_an_output_shaped_at_run_time_arrives_as_none_and_the_array_the_program_supplies_is_used(
        registered, shape):
    backend = MinimalBackend()
    registered("minimal-plugin", backend)
    interp = litegpu.Interpreter(model_content=_reshape_model(),
                                 experimental_delegates=[litegpu.load_delegate("minimal")])
    interp.allocate_tensors()
    x_index, shape_index = (d["index"] for d in interp.get_input_details())
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    interp.set_tensor(x_index, x)
    interp.set_tensor(shape_index, np.array(shape, np.int32))
    interp.invoke()
    out = interp.get_tensor(interp.get_output_details()[0]["index"])
    assert {a.backend for a in interp.get_delegation_report().assignments} == {"minimal"}
    (program,) = backend.programs
    assert program.given == [[False]]   # the executor had no array for it
    np.testing.assert_array_equal(out, (x * x).reshape(shape))


# -- the base classes' declared defaults ------------------------------------------------------
class _RunOnly(Program):
    def __init__(self) -> None:
        self.runs = 0

    def run(self, inputs, outputs, wait_for=()):
        self.runs += 1
        return COMPLETE


def test_program_optional_members_default_to_not_offered():
    program = _RunOnly()
    a = [np.zeros(2)]
    assert program.summary == ""
    assert program.partition is None
    assert program.bind(a, a) is None
    assert program.run_profiled(a, a, (), object()) is None
    assert program.runs == 0   # the default run_profiled runs nothing: the profiler runs ``run``
    with pytest.raises(NotImplementedError, match="need run"):
        Program().run(a, a)


class _Waited(Event):
    def __init__(self) -> None:
        self.waited = 0

    def wait(self, wait_type: str = "passive") -> None:
        self.waited += 1


def test_backend_optional_members_default_to_host_memory():
    backend = Backend()
    spec = TensorSpec((2, 2), np.dtype(np.float32))
    assert (backend.name, backend.is_gpu, backend.host_memory) == ("", False, True)
    assert backend.available() == (True, "")
    assert backend.device_info() == {}
    assert backend.schedule([None, None, None], []) == [[0], [1], [2]]
    assert backend.bind_control(None) is None
    buf = backend.allocate(spec, CompileOptions())
    assert isinstance(buf, np.ndarray) and buf.shape == (2, 2) and buf.dtype == np.float32
    assert backend.nbytes(buf) == 16
    src, first = np.arange(4, dtype=np.float32).reshape(2, 2), _Waited()
    assert backend.copy_in(buf, src, [first]) is COMPLETE
    np.testing.assert_array_equal(buf, src)
    back, second = np.zeros((2, 2), np.float32), _Waited()
    assert backend.copy_out(buf, back, [second]) is COMPLETE
    np.testing.assert_array_equal(back, src)
    assert (first.waited, second.waited) == (1, 1)   # copies follow the events they are given


def test_the_base_backends_required_and_refused_members_raise_naming_the_backend():
    backend = _named("lazy", supports=Backend.supports, compile=Backend.compile)
    with pytest.raises(NotImplementedError, match=r"backend 'lazy' does not implement supports\(\)"):
        backend.supports(None, None)
    with pytest.raises(NotImplementedError, match=r"backend 'lazy' does not implement compile\(\)"):
        backend.compile(None, CompileOptions())
    with pytest.raises(NotImplementedError, match="backend 'lazy' cannot wrap native buffers"):
        backend.wrap(object(), TensorSpec((1,), np.dtype(np.float32)), CompileOptions())


def test_runtime_optional_services_default_to_the_plain_paths():
    def call(index, inputs):
        return inputs
    runtime = Runtime(call_subgraph=call, resources={})
    assert runtime.branch is call
    assert (runtime.while_loop, runtime.bind_while, runtime.bind_if) == (None, None, None)
    other = Runtime(call_subgraph=call, resources={}, branch=len)
    assert other.branch is len


def _counting_subgraphs(calls: list):
    """Subgraph 1: ``v < 3`` (a WHILE condition); 2: ``v + 1`` (its body); 3 and 4: IF branches."""
    def call_subgraph(index: int, inputs: list) -> list:
        calls.append(index)
        v = inputs[0]
        return {1: lambda: [np.array(v < 3)], 2: lambda: [v + 1], 3: lambda: [v * 10], 4: lambda: [-v]}[index]()
    return call_subgraph


def test_while_without_a_session_loop_iterates_call_subgraph():
    calls: list = []
    runtime = Runtime(call_subgraph=_counting_subgraphs(calls), resources={}, max_while_iterations=10)
    (result,) = get_op("WHILE").execute([np.array(0)], {"cond": 1, "body": 2}, runtime)
    assert int(result) == 3
    assert calls == [1, 2, 1, 2, 1, 2, 1]
    assert get_op("WHILE").bind([np.array(0)], [np.array(0)], {"cond": 1, "body": 2}, runtime) is None


def test_while_uses_the_runtime_loop_when_offered_and_none_from_it_is_the_limit():
    seen = []

    def while_loop(cond, body, values, limit, truth):
        seen.append((cond, body, limit))
        return None   # the limit was reached
    runtime = Runtime(call_subgraph=_counting_subgraphs([]), resources={}, max_while_iterations=5,
                      while_loop=while_loop)
    with pytest.raises(ResourceLimitError, match="WHILE ran 5 iterations"):
        get_op("WHILE").execute([np.array(0)], {"cond": 1, "body": 2}, runtime)
    assert seen == [(1, 2, 5)]


def test_if_calls_the_runtime_branch():
    calls: list = []
    plain = Runtime(call_subgraph=_counting_subgraphs(calls), resources={})
    (out,) = get_op("IF").execute([np.array(True), np.array(2)], {"then": 3, "else": 4}, plain)
    assert int(out) == 20 and calls == [3]
    branched = []
    session_like = Runtime(call_subgraph=_counting_subgraphs(calls), resources={},
                           branch=lambda index, inputs: branched.append(index) or [np.array(7)])
    (out,) = get_op("IF").execute([np.array(False), np.array(2)], {"then": 3, "else": 4}, session_like)
    assert int(out) == 7 and branched == [4] and calls == [3]


class _BindingBackend(MinimalBackend):
    """Its programs offer ``bind``: the executor must replay the bound call, never ``run``."""

    name = "binding"

    def compile(self, partition, options):
        program = _BindingProgram(partition)
        self.programs.append(program)
        return program


class _BindingProgram(MinimalProgram):
    summary = "binding: 2 nodes, one bound call"

    def __init__(self, partition: Partition) -> None:
        super().__init__(partition)
        self.partition = partition
        self.bound_calls = 0

    def bind(self, inputs, outputs):
        def call() -> None:
            self.bound_calls += 1
            MinimalProgram.run(self, inputs, outputs)
            self.runs -= 1   # counted as a bound call, not a run
        return Bound([Step(call, tuple(self.partition.nodes))])


def test_the_executor_replays_a_programs_bind_and_reports_its_summary(registered):
    backend = _BindingBackend()
    registered("binding-plugin", backend)
    x = np.ones((2, 3), np.float32)
    interp, out = _run(_add_mul_model(), "binding", x, runs=3)
    np.testing.assert_allclose(out, (x + np.arange(6, dtype=np.float32).reshape(2, 3)) ** 2)
    (program,) = backend.programs
    assert (program.bound_calls, program.runs) == (3, 0)
    assert "partition 0 on binding: binding: 2 nodes, one bound call" in interp.get_delegation_report().programs


def test_the_profiler_times_a_program_without_run_profiled_as_a_whole(registered):
    backend = _BindingBackend()
    registered("binding-plugin", backend)
    interp, _ = _run(_add_mul_model(), "binding", np.ones((2, 3), np.float32))
    with litegpu.profile() as profiler:
        interp.invoke()
    (program,) = backend.programs
    assert program.runs == 1   # profiled runs go through ``run``, not the bound call
    (whole,) = [s for s in profiler.slices if s.cat == "node"]
    assert whole.thread == "binding (whole partitions)"
    assert [n.op for n in whole.nodes] == ["ADD", "MUL"]   # named from Program.partition


def test_gpu_asks_for_the_available_gpu_backends_best_first(registered):
    """"GPU" orders the available GPU backends by gpu_priority (cuda before metal before
    opencl); an unavailable one is left out, and non-GPU backends never join."""
    from litegpu.session import resolve_backends
    registered("gpus", _named("slow-gpu", is_gpu=True, gpu_priority=-5),
               _named("best-gpu", is_gpu=True, gpu_priority=1000),
               _named("absent-gpu", is_gpu=True, gpu_priority=2000, available=lambda self: (False, "no driver")),
               _named("not-a-gpu", gpu_priority=3000))
    names = [b.name for b in resolve_backends(["GPU"])]
    assert names[0] == "best-gpu" and names[-1] == "slow-gpu", names
    assert "absent-gpu" not in names and "not-a-gpu" not in names and "cpu" not in names
    priorities = [manager().backends[n].gpu_priority for n in names]
    assert priorities == sorted(priorities, reverse=True), names
