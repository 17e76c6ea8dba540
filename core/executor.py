"""Plan, compile and run one subgraph: shape inference and folding, partitions, transfers.

Everything that can be decided is decided when a subgraph is compiled: tensor specs
(with constant folding of shape arithmetic), the backend of each node, the arena of
each partition and the compiled programs. A run replays the partitions in order.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Callable, Sequence

import numpy as np

from .backend import (COMPLETE, Backend, Bound, CompileOptions, Event, NodeContext, Partition, Program, Runtime,
                      Step, run_steps)
from .errors import (ExecutionError, InvalidArgumentError, LiteGpuError, ModelFormatError, PluginError,
                     ResourceLimitError, UnsupportedError)
from .graph import Model, Subgraph
from .quant import variable_initial_value
from .memory import ArenaPlan, Usage, plan_arena
from .ops import VIEW_OPS, DynamicShape, TensorSpec, get_op
from . import progress
from .partition import CPU, DelegationReport, assign
from .profile import run_profiled
from .steps import STATE as _PROFILING
from .transfers import DeviceRunner

log = logging.getLogger("litegpu")

#: Sets of a caller's arrays a subgraph keeps its steps bound to (see ``CompiledSubgraph.run_on``).
BOUND_SETS = 4


def default_memory_limit() -> int:
    """Bytes one model may allocate by default: half of physical memory."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError, AttributeError):
        return 8 << 30


@dataclass
class Limits:
    """Run-time limits, each with a clear error when exceeded."""

    max_bytes: int = 0                   # 0: default_memory_limit()
    max_while_iterations: int = 10_000_000


def infer_subgraph(model: Model, sg: Subgraph, input_specs: dict[int, TensorSpec], depth: int = 0
                   ) -> tuple[list[NodeContext], dict[int, TensorSpec], list[int]]:
    """Specs of every tensor, node contexts of the nodes left after folding, folded node indices.

    A node whose inputs are all known values is folded: its reference runs now and its
    outputs become constants (SHAPE → STRIDED_SLICE → PACK chains vanish this way). An
    IF's outputs are static when both branches give the same static shapes and types
    (:func:`_if_specs`); other stateful ops' are known only at run time.
    """
    specs: dict[int, TensorSpec | None] = {}
    for t in sg.tensors:
        if t.is_constant and t.type_name != "STRING":
            specs[t.index] = TensorSpec(t.shape, t.dtype, t.stored, t.full_precision)
        elif t.is_variable:
            specs[t.index] = TensorSpec(t.shape, t.dtype, full_precision=t.full_precision)
    specs.update({t: replace(s, full_precision=sg.tensors[t].full_precision) if 0 <= t < len(sg.tensors) else s
                  for t, s in input_specs.items()})
    # Inputs the caller resized: an operand mismatch is then the caller's error
    # (InvalidArgumentError), not the model's (ModelFormatError).
    resized = {t: s.shape for t, s in input_specs.items()
               if 0 <= t < len(sg.tensors) and tuple(s.shape) != tuple(sg.tensors[t].shape)}
    contexts: list[NodeContext] = []
    folded: list[int] = []
    for node in sg.nodes:
        opdef = get_op(node.op)
        if opdef is None:
            raise UnsupportedError(f"node {node.index} ({node.op}): op is not supported by litegpu "
                                   "(no op definition registered)")
        attrs = opdef.node_attrs(node, sg.tensors)
        ins = [specs.get(i) if i >= 0 else None for i in node.inputs]
        for pos, i in enumerate(node.inputs):
            if i >= 0 and i not in specs:
                raise ModelFormatError(f"node {node.index} ({node.op}): input {pos} (tensor {i}) has no value")
        unknown = any(i >= 0 and specs[i] is None for i in node.inputs)
        outs: list[TensorSpec] | None = None
        # Stateful ops have value-dependent shapes, except those whose only state is
        # variable tensors written back in place (LSTM): their shapes are static.
        static = not opdef.stateful or "state_writeback" in attrs
        if node.op == "IF" and not unknown:
            outs = _if_specs(model, node, attrs, ins[1:], depth)
        elif static and not unknown:
            try:
                if opdef.plan_check is not None:
                    opdef.plan_check(_planned_shapes(node, sg, input_specs), ins, attrs)
                outs = opdef.infer(ins, attrs)
            except DynamicShape:
                outs = None
            except LiteGpuError as exc:
                raise _operand_error(node, sg, exc, str(exc), resized) from None
            except (ValueError, IndexError, TypeError, KeyError, ZeroDivisionError, OverflowError,
                    AttributeError) as exc:  # AttributeError: a required input omitted (-1) in the file
                raise _operand_error(node, sg, ModelFormatError(), f"shape inference failed: {exc}",
                                     resized) from None
            if outs is not None and len(outs) != len(node.outputs):
                raise ModelFormatError(f"node {node.index} ({node.op}): has {len(node.outputs)} outputs, "
                                       f"the op produces {len(outs)}")
            if outs is not None and not opdef.stateful and node.inputs \
                    and all(s is None or s.value is not None for s in ins) \
                    and any(s is not None for s in ins):
                values = _run_reference(opdef, node, [None if s is None else s.value for s in ins], attrs)
                for o, v in zip(node.outputs, values):
                    # (a folded value keeps its tensor's full_precision: the float view's
                    # wide values must not be stored in half precision)
                    specs[o] = replace(TensorSpec.of(np.asarray(v)), full_precision=sg.tensors[o].full_precision)
                folded.append(node.index)
                continue
            if outs is not None and not opdef.stateful and outs and all(o.value is not None for o in outs):
                # The value follows from shapes alone (SHAPE of a static tensor): fold it too.
                for o, spec in zip(node.outputs, outs):
                    specs[o] = replace(TensorSpec.of(np.asarray(spec.value)),
                                       full_precision=sg.tensors[o].full_precision)
                folded.append(node.index)
                continue
        if outs is None:
            for o in node.outputs:
                specs[o] = None
        else:
            for o, s in zip(node.outputs, outs):
                specs[o] = TensorSpec(tuple(int(d) for d in s.shape), np.dtype(s.dtype), s.value,
                                      sg.tensors[o].full_precision)
        contexts.append(NodeContext(
            node=node, opdef=opdef, attrs=attrs, inputs=ins,
            outputs=[specs[o] or TensorSpec((), sg.tensors[o].dtype) for o in node.outputs],
            tensors=sg.tensors, dynamic=outs is None))
    return contexts, specs, folded


# How deep IF branches are inferred within IF branches (a malformed model may name the
# subgraph that holds the IF as its branch).
_MAX_BRANCH_DEPTH = 8


def _if_specs(model: Model, node, attrs: dict, ins: list, depth: int) -> list[TensorSpec] | None:
    """The output specs of an IF whose branch inputs have specs ``ins``: those of both
    branches' outputs when they are static and alike in shape and type, inferred from the
    branch subgraphs; None (known only at run time) otherwise."""
    if depth >= _MAX_BRANCH_DEPTH:
        return None
    found = []
    for index in (attrs["then"], attrs["else"]):
        if not 0 <= index < len(model.subgraphs):
            return None
        branch = model.subgraphs[index]
        if len(branch.inputs) != len(ins):
            return None
        try:
            _, specs, _ = infer_subgraph(model, branch, {t: TensorSpec(s.shape, s.dtype)
                                                         for t, s in zip(branch.inputs, ins)}, depth + 1)
        except LiteGpuError:
            return None          # the branch fails when it runs, and says why then
        outs = [specs.get(o) for o in branch.outputs]
        if any(s is None for s in outs):
            return None
        found.append([(tuple(int(d) for d in s.shape), np.dtype(s.dtype)) for s in outs])
    if found[0] != found[1] or len(found[0]) != len(node.outputs):
        return None
    return [TensorSpec(shape, dtype) for shape, dtype in found[0]]


def _planned_shapes(node, sg: Subgraph, input_specs: dict[int, TensorSpec]) -> list[tuple[int, ...] | None]:
    """The shapes LiteRT plans ``node`` with (see ``OpDef.plan_check``): a subgraph input's
    as given, any other tensor's as the model declares it; None for an omitted input."""
    return [None if i < 0 else tuple(input_specs[i].shape) if i in input_specs else tuple(sg.tensors[i].shape)
            for i in node.inputs]


def _operand_error(node, sg: Subgraph, exc: LiteGpuError, message: str,
                   resized: dict[int, tuple[int, ...]]) -> LiteGpuError:
    """The error for a node whose shape inference failed, naming node and op.

    A model error under resized inputs is an :class:`InvalidArgumentError` naming the
    resize: the model's own shapes agree (or they would have failed when it was loaded).
    """
    text = f"node {node.index} ({node.op}): {message}"
    if not resized or not isinstance(exc, ModelFormatError):
        return type(exc)(text)
    what = ", ".join(f"tensor {t} ({sg.tensors[t].name!r}) to {list(shape)} from {list(sg.tensors[t].shape)}"
                     for t, shape in resized.items())
    return InvalidArgumentError(f"{text} (inputs resized: {what})")


def _run_reference(opdef, node, values, attrs) -> list[np.ndarray]:
    """The node's reference (the integer one for a quantized node) on known values."""
    try:
        return opdef.reference_for(attrs)(values, attrs)
    except LiteGpuError as exc:
        raise type(exc)(f"node {node.index} ({node.op}): {exc}") from None
    except (ValueError, IndexError, TypeError, KeyError, ZeroDivisionError, OverflowError, MemoryError,
            AttributeError) as exc:
        raise ExecutionError(f"node {node.index} ({node.op}): {type(exc).__name__}: {exc}") from None


class CompiledSubgraph:
    """One subgraph compiled for fixed input shapes: partitions, programs, buffers."""

    def __init__(self, model: Model, sg_index: int, input_specs: dict[int, TensorSpec],
                 backends: list[Backend], cpu: Backend, options: CompileOptions,
                 max_delegated_partitions: int = 0, limits: Limits | None = None,
                 moved: dict[int, str] | None = None) -> None:
        start = time.perf_counter()
        self.model = model
        self.sg = sg = model.subgraphs[sg_index]
        self.limits = limits or Limits()
        contexts, specs, folded = infer_subgraph(model, sg, input_specs)
        self.specs = specs
        self.report: DelegationReport = assign(contexts, model, backends, cpu, sg_index, max_delegated_partitions,
                                                 moved)
        self.report.folded = folded
        by_name = {b.name: b for b in backends}
        by_name.setdefault(CPU, cpu)
        self.host: dict[int, np.ndarray] = {}
        consumers = _last_reader_partition(self.report, contexts, sg)
        # Plan every partition and the host tensors first, and check the memory limit
        # before anything is allocated.
        planned = []
        for p, (backend_name, positions) in enumerate(self.report.partitions):
            nodes = [contexts[pos] for pos in positions]
            produced = {o for ctx in nodes for o in ctx.node.outputs}
            read = [i for ctx in nodes for i in ctx.node.inputs if i >= 0]
            p_inputs = list(dict.fromkeys(i for i in read if i not in produced and not _is_const(specs, i)))
            p_outputs = [o for o in dict.fromkeys(produced) if consumers.get(o, -1) > p or o in sg.outputs]
            backend = by_name[backend_name]
            if not backend.host_memory:   # state written back in place must come back from the device
                p_outputs += [t for t in _written_state(nodes) if t not in p_outputs]
            steps = backend.schedule(nodes, p_outputs)
            # Host memory is planned here; a device backend plans its own (its storage
            # format decides the sizes) and reports it in its program summary.
            arena = self._plan_arena(nodes, steps, produced - set(p_outputs) if backend.host_memory else set(),
                                     specs)
            self.report.arena_bytes += arena.size
            self.report.arena_naive_bytes += arena.naive_size
            touched = {t: specs[t] for ctx in nodes for t in (*ctx.node.inputs, *ctx.node.outputs)
                       if t >= 0 and specs.get(t) is not None}
            planned.append((backend, Partition(backend_name, sg, nodes, p_inputs, p_outputs, touched, arena, steps)))
        # Host storage: subgraph inputs, variables and tensors crossing partitions.
        host_specs = {t: specs[t] for t in {*sg.inputs, *(o for _, part in planned for o in part.outputs),
                                            *(t.index for t in sg.tensors if t.is_variable)}
                      if specs.get(t) is not None}
        total = self.report.arena_bytes + sum(_nbytes(s) for s in host_specs.values() if s.value is None)
        limit = self.limits.max_bytes or default_memory_limit()
        if total > limit:
            raise ResourceLimitError(f"the model needs {total} bytes of tensor memory, over the limit of "
                                     f"{limit} bytes (raise it with Limits.max_bytes)")
        for t, spec in host_specs.items():
            # A variable starts where TFLite's ResetVariableTensor puts it (int8: its zero point).
            initial = variable_initial_value(sg.tensors[t]) if sg.tensors[t].is_variable else 0
            # (zeros: memory the OS maps on first write, so a signature run on its caller's
            # arrays, a decoder's KV cache, never commits its own copies)
            self.host[t] = spec.value if spec.value is not None else \
                np.full(spec.shape, initial, spec.dtype) if initial else np.zeros(spec.shape, spec.dtype)
        log.info("subgraph %d: %d nodes planned into %d partitions (%d folded) in %.1f ms", sg_index,
                 len(contexts), len(planned), len(folded), (time.perf_counter() - start) * 1e3)
        self.programs: list[tuple[Program, list[int], list[int]]] = [
            (_compile_logged(backend, part, options, i), part.inputs, part.outputs)
            for i, (backend, part) in enumerate(planned)]
        self._bound: Bound | bool | None = None   # by the first run: the bound steps, or False
        self._bound_on: dict[tuple, tuple] = {}    # run_on's bindings to callers' arrays
        self._seen_arrays: dict[tuple, None] = {}   # the arrays of run_on's recent calls, in order
        self._in_place: dict[frozenset, bool] = {}   # updates_in_place's answers
        self.report.programs = [f"partition {i} on {backend.name}: {program.summary}"
                                for i, ((backend, _), (program, _, _)) in enumerate(zip(planned, self.programs))
                                if program.summary]
        ops = {a.node: a.op for a in self.report.assignments}
        self.report.kernels = [(n, ops.get(n, "?"), backend.name, name)
                               for (backend, _), (program, _, _) in zip(planned, self.programs)
                               for nodes, name in program.kernels() for n in nodes]
        # With device partitions, runs go through a transfer plan (see litegpu.transfers).
        self.runner: DeviceRunner | None = None
        if any(not backend.host_memory for backend, _ in planned):
            state = [t for _, part in planned for t in _written_state(part.nodes)]
            self.runner = DeviceRunner([(program, backend, ins, outs) for (backend, _), (program, ins, outs)
                                        in zip(planned, self.programs)], self.host, specs,
                                       [*sg.outputs, *state], options)
            self.report.bytes_moved = self.runner.plan().bytes_moved
        # Subgraph outputs that were folded to constants, and pass-through inputs.
        self.compile_seconds = time.perf_counter() - start

    def _plan_arena(self, nodes: list[NodeContext], steps: list[list[int]], internal: set[int],
                    specs) -> ArenaPlan:
        """Offsets for the partition's ``internal`` tensors. The output of a reshape
        (:data:`VIEW_OPS`) of an internal tensor is the same bytes: it shares its input's
        place, alive as long as either, and its kernel has nothing to copy."""
        alias: dict[int, int] = {}
        for ctx in nodes:
            node = ctx.node
            if node.op in VIEW_OPS and node.inputs and node.inputs[0] in internal and node.outputs[0] in internal \
                    and specs.get(node.inputs[0]) is not None and specs.get(node.outputs[0]) is not None \
                    and _nbytes(specs[node.inputs[0]]) == _nbytes(specs[node.outputs[0]]):
                alias[node.outputs[0]] = alias.get(node.inputs[0], node.inputs[0])
        first: dict[int, int] = {}
        last: dict[int, int] = {}
        for step, positions in enumerate(steps):
            for pos in positions:
                ctx = nodes[pos]
                for t in (*ctx.node.inputs, *ctx.node.outputs):
                    if t in internal:
                        t = alias.get(t, t)
                        first.setdefault(t, step)
                        last[t] = step
        usages = [Usage(t, _nbytes(specs[t]), first[t], last[t]) for t in first
                  if specs.get(t) is not None and specs[t].value is None]
        limit = self.limits.max_bytes or default_memory_limit()
        need = sum(u.nbytes for u in usages)
        if need > limit:
            raise ResourceLimitError(f"the model's intermediate tensors need {need} bytes, over the limit of "
                                     f"{limit} bytes")
        plan = plan_arena(usages)
        plan.offsets.update((t, plan.offsets[root]) for t, root in alias.items() if root in plan.offsets)
        return plan

    def set_input(self, tensor: int, value: np.ndarray) -> None:
        """Copy ``value`` into input ``tensor`` (shape and dtype must match the compiled spec)."""
        dst = self.host[tensor]
        if value.shape != dst.shape:
            raise InvalidArgumentError(f"tensor {tensor} ({self.sg.tensors[tensor].name!r}): got shape "
                                       f"{list(value.shape)}, expected {list(dst.shape)}")
        if value.dtype != dst.dtype:
            self._bad_dtype(tensor, value)
        dst[...] = value    # same shape and dtype: a plain copy (np.copyto's checks cost 0.3 us more)

    def _bad_dtype(self, tensor: int, value: np.ndarray) -> None:
        raise InvalidArgumentError(f"tensor {tensor} ({self.sg.tensors[tensor].name!r}): got dtype {value.dtype}, "
                                   f"expected {self.host[tensor].dtype}")

    def run(self) -> None:
        """Run every partition in order on the host-side tensors.

        Three routes, each decided once: a subgraph with device partitions runs through
        its transfer plan (:class:`DeviceRunner`); a host-only one whose tensors all have
        fixed arrays is bound on its first run (:meth:`bind`) and later runs only make the
        steps' calls; one with run-time shapes between partitions (or at its outputs)
        calls each program's ``run`` with this run's arrays. A profiled run goes partition
        by partition (:func:`litegpu.profile.run_profiled`)."""
        if _PROFILING.active is not None:   # the one check profiling costs when off
            run_profiled(self)
            return
        if self.runner is not None:
            self.submit().wait()
            return
        bound = self._bound
        if bound is None:
            bound = self._bound = self.bind() or False
        if bound:
            for enter in bound.enter:
                enter()
            run_steps(bound.steps)
            return
        host, specs = self.host, self.specs
        for program, ins, outs in self.programs:
            # An output shaped at run time is the program's to supply (None; see
            # Program.run): last run's array may not have this run's shape.
            out_arrays = [host.get(o) if specs.get(o) is not None else None for o in outs]
            program.run([host[i] for i in ins], out_arrays)
            for o, arr in zip(outs, out_arrays):
                host[o] = arr

    def submit(self, bound: dict[int, tuple[Backend, Any]] | None = None, wait_for: Sequence[Event] = ()) -> Event:
        """Run; ``bound`` supplies device buffers for subgraph inputs/outputs as
        (backend, buffer). Returns the run's event: when this returns, the run is done
        up to the device work whose results stay on the device (host outputs are final)."""
        if _PROFILING.active is not None:   # profiled runs are synchronous, step by step
            return run_profiled(self, bound, wait_for)
        if self.runner is None:
            for e in wait_for:
                e.wait()
            self.run()
            return COMPLETE
        return self.runner.run(self.runner.plan(bound), bound, wait_for)

    @staticmethod
    def binding_key(arrays: dict[int, np.ndarray]) -> tuple:
        """The name of :meth:`run_on`'s binding to ``arrays``: the tensors and the arrays'
        identities (a binding keeps its arrays alive, so no other array takes their ids,
        and an array that is referenced cannot move its memory: numpy refuses such a resize)."""
        return tuple((t, id(a)) for t, a in sorted(arrays.items()))

    def run_on(self, arrays: dict[int, np.ndarray], key: tuple | None = None) -> bool:
        """Run with tensor ``t`` read or written in ``arrays[t]`` (subgraph inputs and
        outputs: a caller's buffers, used in place, nothing copied in or out); False, with
        nothing run, where that cannot be done (a device partition, run-time shapes, arrays
        not of the tensors' shapes and dtypes, an unsafe alias) or is not worth it yet (arrays
        not used in a recent call: binding steps to arrays costs a slow first run). The
        steps bound to a set of arrays are kept for later runs on them (:data:`BOUND_SETS`
        sets: a decoder's prefill and decode).

        An input and an output may be one array when the output is written in place:
        the input is read by one node only, a DYNAMIC_UPDATE_SLICE (its operand), whose
        result is that output (a KV cache updated where it lies, as LiteRT-LM runs it).
        Any other sharing is refused (False), as is sharing between inputs and outputs
        otherwise. ``key``: :meth:`binding_key` of ``arrays``, when the caller keeps it."""
        if _PROFILING.active is not None:   # profiled runs go step by step on the subgraph's own arrays
            return False
        if key is None:
            key = self.binding_key(arrays)
        bound = self._bound_on.get(key)
        if bound is None:
            # Binding costs a slow first run: only arrays seen in an earlier call are worth it.
            if key not in self._seen_arrays:
                self.expect_reuse(key)      # (the next call on them binds)
                return False
            if self.runner is not None or not self._safe_aliases(arrays):
                return False
            bound = self.bind(arrays)
            if bound is None:
                return False
            if len(self._bound_on) >= BOUND_SETS:
                self._bound_on.pop(next(iter(self._bound_on)))
            self._bound_on[key] = (bound, tuple(arrays.values()))   # (the arrays kept alive with their binding)
        else:
            bound = bound[0]
        for enter in bound.enter:
            enter()
        run_steps(bound.steps)
        return True

    def expect_reuse(self, key: tuple) -> None:
        """The caller will run on the arrays of binding ``key`` (:meth:`binding_key`) again:
        their first :meth:`run_on` binds the steps to them at once, where a first call on
        new arrays otherwise takes the copying path (binding costs a slow first run, wasted
        on arrays used once)."""
        self._seen_arrays[key] = None
        if len(self._seen_arrays) > 2 * BOUND_SETS:
            self._seen_arrays.pop(next(iter(self._seen_arrays)))

    def _safe_aliases(self, arrays: dict[int, np.ndarray]) -> bool:
        """True when the arrays that share memory are the in-place updates :meth:`run_on` allows."""
        items = list(arrays.items())
        shared = []
        for i, (t, a) in enumerate(items):
            for u, b in items[i + 1:]:
                if np.may_share_memory(a, b):
                    if a.ctypes.data != b.ctypes.data or a.nbytes != b.nbytes:
                        return False    # overlapping, not one array: never safe
                    shared.append((t, u))
        return self.updates_in_place(shared)

    def updates_in_place(self, pairs: Sequence[tuple[int, int]]) -> bool:
        """True when each pair of tensors (an input and an output, in either order) may be
        one buffer: the input is read by one node only, a DYNAMIC_UPDATE_SLICE (its
        operand), whose result is the output, so the update writes where the input lies and
        nothing reads the input afterwards (a KV cache, as LiteRT-LM runs it). A tensor in
        two pairs is refused."""
        if not pairs:
            return True
        key = frozenset(map(frozenset, pairs))
        if key not in self._in_place:
            self._in_place[key] = self._updated_in_place(pairs)
        return self._in_place[key]

    def _updated_in_place(self, pairs: Sequence[tuple[int, int]]) -> bool:
        readers: dict[int, list] = {}
        producer: dict[int, object] = {}
        for node in self.sg.nodes:
            for i in node.inputs:
                readers.setdefault(i, []).append(node)
            for o in node.outputs:
                producer[o] = node
        inputs, outputs = set(self.sg.inputs), set(self.sg.outputs)
        if len({t for pair in pairs for t in pair}) != 2 * len(pairs):
            return False    # one buffer given for three tensors or more
        for ts in pairs:
            x, y = sorted(ts, key=lambda t: t not in inputs)
            node = producer.get(y)
            if x not in inputs or y not in outputs or x in outputs or y in inputs or node is None \
                    or node.op != "DYNAMIC_UPDATE_SLICE" or node.inputs[0] != x or readers.get(x) != [node]:
                return False
        return True

    def device_of(self, t: int) -> Backend | None:
        """The device backend (not host memory) that produces tensor ``t``, else the one
        that first reads it; None when ``t`` lives on the host."""
        if self.runner is None:
            return None
        for _, backend, ins, outs in self.runner.programs:
            if t in outs:
                return None if backend.host_memory else backend
        for _, backend, ins, _ in self.runner.programs:
            if t in ins:
                return None if backend.host_memory else backend
        return None

    def output_size(self, t: int) -> int | None:
        """Elements of tensor ``t`` when known before the run."""
        spec = self.specs.get(t)
        return None if spec is None else int(np.prod(spec.shape, dtype=np.int64))

    @property
    def fixed(self) -> bool:
        """True once a run found every host array fixed for good (no run-time shapes), so
        arrays read from :meth:`output` stay the ones later runs write."""
        if self.runner is not None:   # fixed unless a host partition has run-time shapes
            return all(o in self.host for _, _, _, outs in self.runner.programs for o in outs)
        return bool(self._bound)

    def bind(self, arrays: dict[int, np.ndarray] | None = None) -> Bound | None:
        """The subgraph on fixed host arrays as one :class:`Bound`: its partitions' steps
        (:meth:`Program.bind`), concatenated. Tensor ``t`` in ``arrays`` (a subgraph input
        or output, or a tensor crossing partitions) is read or written there instead of in
        :attr:`host`, which is left as it is; so a caller can bind one subgraph to several
        sets of arrays and run several subgraphs as one list (a WHILE loop). A program
        that does not bind runs as one step calling its ``run`` on the subgraph's own
        arrays (not on arrays of the caller's choosing: then None). None when a partition
        is on a device or a tensor has no fixed array (run-time shapes)."""
        if self.runner is not None:
            return None
        arrays = arrays or {}
        host = self.host
        for t, array in arrays.items():
            mine = host.get(t)
            if mine is None or mine.shape != array.shape or mine.dtype != array.dtype:
                return None
        enters: dict[int, object] = {}
        steps: list[Step] = []
        for program, ins, outs in self.programs:
            in_arrays = [arrays.get(t, host.get(t)) for t in ins]
            out_arrays = [arrays.get(t, host.get(t)) for t in outs]
            if any(a is None for a in (*in_arrays, *out_arrays)):
                return None
            bound = program.bind(in_arrays, out_arrays)
            if bound is None:
                if arrays:
                    return None
                nodes = tuple(program.partition.nodes) if program.partition is not None else ()
                bound = Bound([Step(partial(program.run, in_arrays, out_arrays), nodes)])
            enters.update((id(e), e) for e in bound.enter)   # (one thread count: called once)
            steps += bound.steps
        return Bound(steps, tuple(enters.values()))

    def output(self, tensor: int) -> np.ndarray:
        """The current value of an output (or any host-side) tensor."""
        if tensor in self.host:
            return self.host[tensor]
        spec = self.specs.get(tensor)
        if spec is not None and spec.value is not None:
            return spec.value
        raise InvalidArgumentError(f"tensor {tensor} is an intermediate whose memory is reused; "
                                   "only inputs, outputs and constants can be read")


def _compile_logged(backend: Backend, part: Partition, options: CompileOptions, index: int) -> Program:
    """``backend.compile``, saying at INFO what was compiled, how (its summary: kernels,
    cache) and how long it took. A result that is not a :class:`Program` is refused here,
    naming the backend: the core reads the program's optional members from the base class."""
    start = time.perf_counter()
    progress.report(f"partition {index} ({backend.name}, {len(part.nodes)} nodes): compiling")
    program = backend.compile(part, options)
    if not isinstance(program, Program):
        raise PluginError(f"backend {backend.name!r}: compile() returned a {type(program).__module__}."
                          f"{type(program).__qualname__}, not a litegpu.backend.Program (subclass it)")
    log.info("partition %d on %s (%d nodes): compiled in %.1f ms%s", index, backend.name, len(part.nodes),
             (time.perf_counter() - start) * 1e3, f": {program.summary}" if program.summary else "")
    return program


class FutureEvent(Event):
    """Completion of a run on the worker thread; ``wait`` re-raises its error."""

    def __init__(self, future) -> None:
        self.future = future

    def wait(self, wait_type: str = "passive") -> None:
        """Block until the run is done."""
        if wait_type == "active":
            while not self.future.done():
                pass
        self.future.result()

    def is_complete(self) -> bool:
        """True when the run is done."""
        return self.future.done()


def _written_state(nodes: list[NodeContext]) -> list[int]:
    """Variable tensors that nodes update in place (``attrs["state_writeback"]``, e.g. LSTM state)."""
    return [ctx.node.inputs[i] for ctx in nodes for _, i in ctx.attrs.get("state_writeback", ())
            if ctx.node.inputs[i] >= 0]


def _is_const(specs, t: int) -> bool:
    s = specs.get(t)
    return s is not None and s.value is not None


def _nbytes(spec: TensorSpec) -> int:
    return int(np.prod(spec.shape, dtype=np.int64)) * np.dtype(spec.dtype).itemsize


def _last_reader_partition(report: DelegationReport, contexts, sg) -> dict[int, int]:
    last: dict[int, int] = {}
    for p, (_, positions) in enumerate(report.partitions):
        for pos in positions:
            for i in contexts[pos].node.inputs:
                if i >= 0:
                    last[i] = p
    return last


def make_runtime(call_subgraph, resources, limits: Limits, **services: Callable | None) -> Runtime:
    """The services stateful kernels use; ``services`` are :class:`Runtime`'s optional ones
    (``while_loop``, ``branch``, ``bind_while``, ``bind_if``)."""
    return Runtime(call_subgraph=call_subgraph, resources=resources,
                   max_while_iterations=limits.max_while_iterations, **services)
