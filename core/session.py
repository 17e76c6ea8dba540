"""A loaded model with its backends, options and state: what both public APIs share.

The Interpreter and CompiledModel are thin façades over a :class:`Session`. It
resolves the backend preference list, compiles subgraphs for given input shapes
(caching them, so control flow re-uses compiled bodies), keeps resource variables
across invokes, and offers control-flow kernels its subgraph calls
(:mod:`litegpu.control_flow`).
"""
from __future__ import annotations

import dataclasses
import logging
import os
from functools import partial
from dataclasses import dataclass, field

import numpy as np

from . import __version__
from .backend import HALF_ARITHMETIC, Backend, CompileOptions, Runtime, device_is_cpu
from .control_flow import ControlFlow
from .errors import LiteGpuError
from .executor import CompiledSubgraph, Limits, infer_subgraph, make_runtime
from .float_view import MODE as FLOAT_VIEW, float_view, is_quantized_model
from .guard import UseGuard
from .quant import quantization_mode, variable_initial_value
from .graph import Model
from .ops import TensorSpec, get_op
from .partition import CONTROL_FLOW, CPU, Assignment, DelegationReport, assign
from .placement import FIRST, MEASURE, cache_dir, check_placement, place
from .plugins import manager

log = logging.getLogger("litegpu")
CPU_PRECISION = "F32 (cpu has no fp16 mode; precision_loss_allowed ignored)"
_warned_precision = False


@dataclass
class Delegate:
    """A request to run on a named backend, as returned by :func:`litegpu.load_delegate`."""

    backend: str
    options: dict = field(default_factory=dict)


def load_delegate(library: str, options: dict | None = None) -> Delegate:
    """Name a backend to delegate to, the way ``tflite.load_delegate`` names a delegate library.

    ``library`` is a backend name (``"cpu"``, ``"opencl"``, a plugin's name) or ``"GPU"``.
    Raises :class:`BackendUnavailableError` naming why, when the backend cannot be used.
    """
    options = dict(options or {})
    if library.upper() == "GPU":
        return Delegate("GPU", options)
    manager().available_backend(library)
    return Delegate(library, options)


def resolve_backends(names: list[str]) -> list[Backend]:
    """Backends for a preference list; "GPU" means every available GPU backend whose device
    is not a CPU, best first (``Backend.gpu_priority``), with a warning if none."""
    pm = manager()
    out: list[Backend] = []
    for name in names:
        if name.upper() == "GPU":
            out.extend(b for b in _gpu_backends(pm.backends.values()) if b not in out)
            continue
        backend = pm.available_backend(name)
        if backend not in out:
            out.append(backend)
    return out


def _gpu_backends(backends) -> list[Backend]:
    """What "GPU" means here: the available GPU backends, best first (cuda on NVIDIA, metal
    on macOS, else opencl; the rest after it take what the first cannot run), without those
    whose device is a CPU. PoCL's OpenCL on a CPU runs models slower than the cpu backend,
    and a user who asked for a GPU would otherwise read "fully accelerated" about a CPU;
    asking for the backend by name still uses it."""
    usable = sorted((b for b in backends if b.name != CPU and b.is_gpu and b.available()[0]),
                    key=lambda b: -b.gpu_priority)
    gpus = [b for b in usable if not device_is_cpu(b)]
    if not gpus:
        on_cpu = "".join(f" ({b.name} runs on {b.device_info().get('device', 'a CPU device')}, a CPU, where the "
                         f"cpu backend is faster: ask for {b.name!r} by name to use it)" for b in usable[:1])
        log.warning("GPU acceleration was requested but no GPU backend is available; running on cpu%s", on_cpu)
    return gpus


class Session:
    """A model plus everything needed to run it repeatedly."""

    def __init__(self, model: Model, backend_names: list[str], num_threads: int = 0,
                 precision_loss_allowed: bool = False, max_delegated_partitions: int = 0,
                 limits: Limits | None = None, extra: dict | None = None, placement: str = FIRST) -> None:
        self.backends = resolve_backends(backend_names)
        # As LiteRT's GPU delegate, a GPU runs a quantized model in its float view.
        self.quant_mode = None
        self.source_model = model
        if is_quantized_model(model) and any(b.is_gpu for b in self.backends):
            model, self.quant_mode = float_view(model), FLOAT_VIEW
        self.model = model
        # "first": each node on the first backend that supports it; "measure": the fastest
        # of a few assignments, timed at compile time (see litegpu.placement).
        self.placement = check_placement(placement)
        self.requested = list(backend_names)
        self.cpu = manager().backend(CPU)
        self.limits = limits or Limits()
        self.max_delegated_partitions = max_delegated_partitions
        self.resources: dict = {}
        self.control = ControlFlow(self)
        self.options = CompileOptions(num_threads=num_threads or min(os.cpu_count() or 1, 4),
                                      precision_loss_allowed=precision_loss_allowed,
                                      runtime=self._runtime(),
                                      model=model, extra=dict(extra or {}))
        self.guard = UseGuard()   # one thread at a time in this model's state (see litegpu.guard)
        self._cache: dict[tuple, CompiledSubgraph] = {}

    def _runtime(self) -> Runtime:
        """The services control-flow kernels use: :meth:`call_subgraph`, and the optional
        ones a session offers (see :class:`~litegpu.backend.Runtime`): its WHILE loop,
        IF's branch call (constant inputs compiled in) and the binds for ``OpDef.bind``."""
        control = self.control
        return make_runtime(control.call_subgraph, self.resources, self.limits, while_loop=control.while_loop,
                            branch=partial(control.call_subgraph, constants=True),
                            bind_while=control.bind_while, bind_if=control.bind_if)

    def release_pages(self) -> None:
        """Let the model, and the float view run in its place, drop what the compiled
        programs no longer need (:meth:`litegpu.graph.Model.release_pages`)."""
        self.source_model.release_pages()
        if self.model is not self.source_model:
            self.model.release_pages()

    def compile(self, sg_index: int, input_shapes: dict[int, tuple[int, ...]] | None = None,
                delegate: bool = True, values: dict[int, np.ndarray] | None = None) -> CompiledSubgraph:
        """The subgraph compiled for ``input_shapes`` (default: the model's shapes), the
        inputs in ``values`` as those constants; cached.

        ``delegate`` False keeps every node on cpu: the bodies of control flow run there,
        as LiteRT's GPU delegate leaves them to the CPU (a loop body of a few small ops
        would pay device launches and copies on every iteration).
        """
        sg = self.model.subgraphs[sg_index]
        shapes = {t: tuple(sg.tensors[t].shape) for t in sg.inputs}
        shapes.update(input_shapes or {})
        values = values or {}
        key = (sg_index, tuple(sorted(shapes.items())), delegate, tuple(sorted((t, id(v)) for t, v in values.items())))
        compiled = self._cache.get(key)
        if compiled is None:
            specs = {t: TensorSpec(shape, sg.tensors[t].dtype, values.get(t)) for t, shape in shapes.items()}
            backends = self.backends if delegate else []

            def build(moved: dict[int, str]) -> CompiledSubgraph:
                return CompiledSubgraph(self.model, sg_index, specs, backends, self.cpu, self.options,
                                        self.max_delegated_partitions, self.limits, moved)
            if self.placement == MEASURE and any(b.name != CPU for b in backends):
                compiled = self._measured(build, sg_index, shapes)
            else:
                compiled = build({})
            if self.options.precision_loss_allowed:
                _note_cpu_precision(compiled.report)
            self._cache[key] = compiled
        return compiled

    def _measured(self, build, sg_index: int, shapes: dict[int, tuple[int, ...]]) -> CompiledSubgraph:
        """The subgraph compiled with the measured (or cached) placement; the runs that
        measured it leave no trace in the model's state."""
        sg = self.model.subgraphs[sg_index]
        material = {
            "model": self.model.digest(), "subgraph": sg_index,
            "inputs": sorted((t, list(shape), str(sg.tensors[t].dtype)) for t, shape in shapes.items()),
            "backends": [(b.name, b.device_info()) for b in (*self.backends, self.cpu)],
            "litegpu": __version__, "num_threads": self.options.num_threads,
            "precision_loss_allowed": self.options.precision_loss_allowed,
            HALF_ARITHMETIC: bool(self.options.extra.get(HALF_ARITHMETIC, True)),
            "max_delegated_partitions": self.max_delegated_partitions}
        saved = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in self.resources.items()}
        try:
            compiled = place(build, material, cache_dir(self.options.extra))
        finally:
            self.resources.clear()
            self.resources.update(saved)
        _reset_variables(compiled)
        return compiled

    # -- the delegation report -------------------------------------------------------------
    def delegation_report(self, compiled: CompiledSubgraph) -> DelegationReport:
        """``compiled``'s report extended to the whole model: the reports of every subgraph
        its control flow calls (transitively), and a line for each subgraph it never reaches."""
        entry = compiled.report.subgraph
        callers = self._callers(entry)
        called = [self._called_report(sg, roles) for sg, roles in sorted(callers.items()) if sg != entry]
        reached = {entry, *callers}
        names = {s.subgraph_index: s.key for s in self.model.signatures}
        unreached = [f"subgraph {i} {sg.name!r}: never called from subgraph {entry}"
                     + (f" (signature {names[i]!r} has its own report)" if i in names else "")
                     for i, sg in enumerate(self.model.subgraphs) if i not in reached]
        source = self.source_model.subgraphs[entry]
        return dataclasses.replace(compiled.report, called=called, unreached=unreached,
                                   quantization=self.quant_mode or quantization_mode(source.tensors),
                                   added_nodes=len(self.model.subgraphs[entry].nodes) - len(source.nodes))

    def _callers(self, entry: int) -> dict[int, list[str]]:
        """Each subgraph reachable from ``entry`` through control flow, with the calls that reach it."""
        found: dict[int, list[str]] = {}
        todo, seen = [entry], {entry}
        while todo:
            current = todo.pop()
            sg = self.model.subgraphs[current]
            for node in sg.nodes:
                if node.op not in CONTROL_FLOW:
                    continue
                try:
                    attrs = get_op(node.op).node_attrs(node, sg.tensors)
                except LiteGpuError:
                    continue   # compiling or running the node reports it
                for key, label in CONTROL_FLOW[node.op]:
                    callee = attrs[key]
                    if not isinstance(callee, int) or not 0 <= callee < len(self.model.subgraphs):
                        continue   # the op's kernel names a bad index when it runs
                    found.setdefault(callee, []).append(f"{label} of {node.op} node {node.index} in subgraph {current}")
                    if callee not in seen:
                        seen.add(callee)
                        todo.append(callee)
        return found

    def _called_report(self, sg_index: int, roles: list[str]) -> DelegationReport:
        """The report of a subgraph control flow calls: the one it was compiled with when it
        has run, else its planned placement at the model's shapes; every node on cpu."""
        compiled = next((c for (i, _, delegate, _), c in self._cache.items() if i == sg_index and not delegate), None)
        base = compiled.report if compiled is not None else self._planned_report(sg_index)
        role = "; ".join(roles)
        # A reason on each node only when something other than cpu was asked for, as in
        # the main subgraph's report.
        asked = [b.name for b in self.backends]
        why = f"{role}: runs on cpu, as LiteRT's GPU delegate does" if asked and asked[0] != CPU else ""
        return dataclasses.replace(base, requested=asked, role=role,
                                   assignments=[Assignment(a.node, a.op, a.backend, why) for a in base.assignments])

    def _planned_report(self, sg_index: int) -> DelegationReport:
        """Where the nodes of a not yet compiled subgraph will run (all on cpu), without compiling."""
        sg = self.model.subgraphs[sg_index]
        try:
            contexts, _, folded = infer_subgraph(self.model, sg, {t: TensorSpec(tuple(sg.tensors[t].shape),
                                                                               sg.tensors[t].dtype)
                                                                for t in sg.inputs})
            report = assign(contexts, self.model, [], self.cpu, sg_index)
            report.folded = folded
        except LiteGpuError:
            # Its shapes follow from the caller's values: list the nodes as the file has them.
            report = DelegationReport(sg_index, [], [Assignment(n.index, n.op, CPU) for n in sg.nodes],
                                      folded_at_load=[(n.index, n.op) for n in sg.folded_at_load],
                                      inlined_composites=list(sg.inlined_composites))
            report.partitions = [(CPU, list(range(len(sg.nodes))))] if sg.nodes else []
        if self.options.precision_loss_allowed:
            _note_cpu_precision(report)
        return report

    def reset_variables(self) -> None:
        """Forget resource variables and CALL_ONCE state, and put variable tensors (e.g. LSTM
        state) back to their initial values: a fresh interpreter's state, as LiteRT's
        ``reset_all_variables`` does."""
        self.resources.clear()
        for compiled in self._cache.values():
            _reset_variables(compiled)


def _reset_variables(compiled: CompiledSubgraph) -> None:
    """Put ``compiled``'s variable tensors back to their initial values."""
    for tensor in compiled.sg.tensors:
        array = compiled.host.get(tensor.index)
        if tensor.is_variable and array is not None:
            array[...] = variable_initial_value(tensor) if tensor.data is None else \
                np.asarray(tensor.data).reshape(array.shape)


def _note_cpu_precision(report: DelegationReport) -> None:
    """State in ``report`` that its cpu partitions compute in fp32 although precision loss
    was allowed (warned once per process): the cpu backend has no fp16 mode."""
    global _warned_precision
    described = {line.split(":", 1)[0] for line in report.programs}
    notes = [f"partition {i} on cpu: {CPU_PRECISION}" for i, (backend, _) in enumerate(report.partitions)
             if backend == CPU and f"partition {i} on cpu" not in described]
    if not notes:
        return
    report.programs = sorted([*report.programs, *notes], key=lambda line: int(line.split()[1]))
    if not _warned_precision:
        _warned_precision = True
        log.warning("precision loss (fp16) was allowed, but the cpu backend computes in fp32: "
                    "nodes on cpu run F32")
