"""The cpu backend: compiles a partition into a flat list of kernel calls over one arena."""
from __future__ import annotations

import dataclasses
import logging
import os
import platform
import time
from functools import lru_cache, partial
from itertools import groupby
from typing import Sequence

import numpy as np

from litegpu.backend import (COMPLETE, REFERENCE, Backend, Branch, CompileOptions, Event, Loop, NodeContext,
                             Partition, Program, Support, run_steps)
from litegpu.errors import ExecutionError, LiteGpuError, Unbound
from litegpu.graph import Model
from litegpu.ops import TensorSpec

# .fusion and .kernels import numba (~0.2 s), so they are imported where first used: a
# process whose model runs entirely on another backend never loads numba.

log = logging.getLogger("litegpu.cpu")
_RUNTIME_ERRORS = (ValueError, IndexError, TypeError, KeyError, ZeroDivisionError, OverflowError,
                   FloatingPointError, MemoryError, AttributeError)


class CpuBackend(Backend):
    """numba/numpy kernels on the host; always available."""

    name = "cpu"

    def device_info(self) -> dict:
        import llvmlite
        import numba
        return {"device": _cpu_model(), "cores": os.cpu_count(), "simd": _simd_features(),
                "numpy": np.__version__, "numba": numba.__version__, "llvmlite": llvmlite.__version__,
                "threads": numba.config.NUMBA_NUM_THREADS, "threading layer": numba.config.THREADING_LAYER}

    def supports(self, node: NodeContext, model: Model) -> Support:
        for t in (*node.node.inputs, *node.node.outputs):
            if t < 0 or not node.tensors:
                continue
            tensor = node.tensors[t]
            # Quantized tensors are fine: their nodes run the ops' integer references
            # (kernels.registry.make_kernel), and nodes without one fail when compiled.
            if tensor.type_name in ("STRING", "INT4", "BFLOAT16", "VARIANT"):
                return Support(False, f"tensor {tensor.name!r} has type {tensor.type_name}, which has no kernels")
        return Support(True)

    def schedule(self, nodes: list[NodeContext], outputs: list[int]) -> list[list[int]]:
        """Runs of fusable elementwise nodes become one step, and so does a node with a
        follower its kernel computes too (a conv or FC with the RELU after it, int8
        swish); every other node its own."""
        from .fusion import fusion_runs
        return fusion_runs(nodes, outputs)

    def compile(self, partition: Partition, options: CompileOptions) -> Program:
        from .compile_progress import report_numba_compiles
        from .kernels.threads import configure_threads
        configure_threads(options.num_threads)
        report_numba_compiles()   # most kernels compile in the first run: say which
        return CpuProgram(partition, options)

    def bind_control(self, control: Branch | Loop):
        """An IF or WHILE whose steps are task functions as one plan, jumps and all (see
        :mod:`.control`); it chains with the plans around it."""
        from .control import bind_control
        return bind_control(control)


def _cpuinfo() -> dict[str, str]:
    info: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return info


def _cpu_model() -> str:
    return _cpuinfo().get("model name") or platform.processor() or platform.machine()


def _simd_features() -> str:
    flags = set(_cpuinfo().get("flags", "").split())
    wanted = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_vnni", "neon", "asimd")
    return " ".join(f for f in wanted if f in flags) or "unknown"


class CpuProgram(Program):
    """A partition as a flat list of ``(kernel, input slots, output slots)``."""

    def __init__(self, partition: Partition, options: CompileOptions) -> None:
        from .fusion import FusedGroup, make_fused_kernel
        from .kernels import make_kernel
        self.partition = partition
        # Called first in every run: the run's thread may not be the one that compiled.
        self._threads_here = _threads_setter(options.num_threads)
        self._runtime = options.runtime
        arena = partition.arena
        self.arena = np.empty(arena.size if arena else 0, np.uint8)
        slot_of: dict[int, int] = {}
        slots: list = []

        def slot(t: int) -> int:
            if t not in slot_of:
                slot_of[t] = len(slots)
                spec = partition.specs.get(t)
                if spec is not None and spec.value is not None:
                    slots.append(spec.value)
                elif arena is not None and t in arena.offsets and spec is not None:
                    nbytes = int(np.prod(spec.shape, dtype=np.int64)) * spec.dtype.itemsize
                    off = arena.offsets[t]
                    slots.append(self.arena[off:off + nbytes].view(spec.dtype).reshape(spec.shape))
                else:
                    slots.append(None)
            return slot_of[t]

        self.in_slots = [slot(t) for t in partition.inputs]
        self.out_slots = [slot(t) for t in partition.outputs]
        self.steps = []
        self.step_nodes: list[list[NodeContext]] = []   # the nodes of each step, for profiling
        for group, nodes in _groups(partition):
            if isinstance(group, FusedGroup):
                kernel = make_fused_kernel(group)
                self.steps.append((kernel, [slot(t) for t in group.inputs], [slot(t) for t in group.outputs],
                                   False, group.nodes[0]))
                self.step_nodes.append(nodes)
                continue
            ctx = group
            dynamic = ctx.opdef.stateful or ctx.dynamic
            if not dynamic and all(spec.value is not None for spec in ctx.outputs):
                # Outputs known at compile time (SHAPE of a static tensor): their slots
                # already hold the values, so the node has nothing left to do.
                continue
            ins = [slot(i) if i >= 0 else -1 for i in ctx.node.inputs]
            outs = [slot(o) for o in ctx.node.outputs]
            kernel = _returning_kernel(ctx, options) if dynamic else make_kernel(ctx)
            self.steps.append((kernel, ins, outs, dynamic, ctx))
            self.step_nodes.append(nodes)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("cpu program: %s", "; ".join(
                f"{getattr(kernel, '__name__', type(kernel).__name__)} for "
                f"{'+'.join(f'{c.node.index} {c.node.op}' for c in nodes)}"
                for (kernel, *_), nodes in zip(self.steps, self.step_nodes)))
        _share_quantized_rows(self.steps)
        slots.append(None)  # slot -1: an omitted optional input
        self.slots = slots
        # With no run-time shapes every slot is fixed once inputs and outputs are: the
        # steps are bound to their arrays once and a run is a flat list of calls.
        self.static = not any(dynamic for _, _, _, dynamic, _ in self.steps)
        self._bound: list = []
        self._bound_to: tuple = ()
        self._fill: list[tuple[int, int]] = []
        self._calls: list = [None] * len(self.steps)   # per step: (ids of its arrays, bound call, arrays)
        # With run-time-shaped steps: every step bound to the arrays of the last run, valid
        # while the caller's arrays and the run-time shapes stay the same.
        self._fixed: list | None = None
        self._fixed_to: tuple = ()
        self._binds = 0
        self._settled: dict[tuple, object] = {}   # see _settled_kernel

    def _bind(self, inputs: Sequence[np.ndarray], outputs: list, key: tuple) -> None:
        """Point the slots at this run's arrays and bind every step to its arrays."""
        self._bound, self._fill, self._copy = self._bound_steps(inputs, outputs, self.slots)
        self._bound_to = key

    def _point_slots(self, inputs: Sequence[np.ndarray], outputs: list, slots: list | None = None) -> list:
        """Point the input slots at ``inputs`` and the output slots at the given ``outputs``
        (None: left to the program); returns the slots (the program's unless given)."""
        slots = self.slots if slots is None else slots
        for s, arr in zip(self.in_slots, inputs):
            slots[s] = arr
        for s, arr in zip(self.out_slots, outputs):
            if arr is not None:
                slots[s] = arr
        return slots

    def _bound_steps(self, inputs: Sequence[np.ndarray], outputs: list, slots: list) -> tuple[list, list, list]:
        """Each step as a call of no arguments on these arrays, plus the outputs left to us
        (None: filled from our slots) and the outputs to copy into (slot not the caller's).

        A kernel with a ``bind(inputs, outputs)`` attribute returns a call with its views
        (reshapes, slices) made here, once, rather than on every run.
        """
        slots = self._point_slots(inputs, outputs, slots)
        bound = _chain_plans([(_bind_step(kernel, [slots[i] for i in ins], [slots[o] for o in outs]), ctx)
                              for kernel, ins, outs, _, ctx in self.steps])
        fill = [(i, s) for i, s in enumerate(self.out_slots) if outputs[i] is None]
        copy = [(i, s) for i, s in enumerate(self.out_slots)
                if outputs[i] is not None and outputs[i] is not slots[s]]
        return bound, fill, copy

    def bind_steps(self, inputs: Sequence[np.ndarray], outputs: list):
        """This program on exactly these arrays as ``(enter, steps)``, or None when run-time
        shapes prevent it: ``enter()`` readies the calling thread (call it once before a
        series of runs on that thread), each step is ``(call, fail)``, ``call()`` runs it and
        ``fail(exc)`` is the error naming its node to raise when it raised ``exc`` (None:
        not a kernel failure, let it propagate). A caller running several programs (a
        WHILE loop's condition and body) can then make them one flat list of calls.

        Binding does not touch the arrays :meth:`run` works on, so a program may be bound
        to several sets of arrays at once (a loop alternating between two)."""
        if not self.static or any(o is None for o in outputs):
            return None
        slots = list(self.slots)
        bound, _, copy = self._bound_steps(inputs, outputs, slots)
        from .kernels.layout import copy_call
        steps = [(call, partial(_failure, ctx)) for call, ctx in bound]
        # An output the program keeps in a slot of its own (not the caller's array).
        steps += [(copy_call(slots[s], outputs[i]), _not_ours) for i, s in copy]
        return self._threads_here, steps

    def bind(self, inputs: Sequence[np.ndarray], outputs: list):
        """A call of no arguments that runs this program on exactly these arrays (the caller
        passes the same ones every run), or None when run-time shapes prevent it. It skips
        :meth:`run`'s check of which arrays it was handed."""
        bound = self.bind_steps(inputs, outputs)
        if bound is None:
            return None
        threads_here, steps = bound

        def run_bound() -> None:
            threads_here()
            run_steps(steps)
        return run_bound

    def _run_steps(self, start: int = 0, stop: int | None = None) -> None:
        """Run the steps from ``start`` on the current slots. A static step whose arrays are
        the ones it ran on last time reuses the call bound then, which matters when shapes
        change from run to run and :meth:`_bind_fixed` no longer applies."""
        slots = self.slots
        calls = self._calls
        for n in range(start, len(self.steps) if stop is None else stop):
            kernel, ins, outs, dynamic, ctx = self.steps[n]
            args = [slots[i] for i in ins]
            try:
                if dynamic:
                    if not ctx.opdef.stateful and self._run_settled(n, args, outs):
                        continue
                    self._store(outs, kernel(args))
                    continue
                results = [slots[o] for o in outs]
                key = (*map(id, args), *map(id, results))
                cached = calls[n]
                if cached is None or cached[0] != key:
                    # The entry keeps the arrays alive, so no new array can take one's id.
                    cached = calls[n] = (key, _bind_step(kernel, args, results), args, results)
                cached[1]()
            except (LiteGpuError, *_RUNTIME_ERRORS) as exc:
                raise _fail(ctx, exc) from None

    def _run_settled(self, n: int, args: list, outs: list[int]) -> bool:
        """Run run-time-shaped step ``n`` with the kernel later runs are bound to
        (:meth:`_bind_fixed`) when its output shapes follow from its operands' shapes, so
        the first run gives the bits every later run gives (the reference it would run
        otherwise sums in another order). False when they do not: run the reference."""
        specs = _inferred_outputs(self.steps[n][4], args)
        if specs is None:
            return False
        # Written in place into the slots' arrays only while the program still binds (as
        # _store copies into them then); else new arrays, as _store keeps results.
        slots, settling = self.slots, self._binds < _MAX_BINDS or self._fixed is not None
        results = [slots[o] if settling and slots[o] is not None and slots[o].shape == tuple(s.shape)
                   and slots[o].dtype == s.dtype else np.empty(s.shape, s.dtype) for o, s in zip(outs, specs)]
        kernel = self._settled_kernel(n, args, results)
        if kernel is None:
            return False
        _bind_step(kernel, args, results)()
        self._store(outs, results)
        return True

    def _store(self, outs: list[int], results: Sequence) -> None:
        """Put a run-time-shaped step's results in its output slots: copied into the arrays
        there when shape and dtype match, so the slots keep their arrays from run to run
        (and :meth:`_bind_fixed`'s bindings stay valid); else a copy of its own. Once the
        program has stopped binding, results are stored as they are: no array is written in
        place again, so none needs to be our own."""
        slots = self.slots
        settling = self._binds < _MAX_BINDS or self._fixed is not None
        for o, r in zip(outs, results):
            if not settling:
                slots[o] = r
                continue
            r = np.asarray(r)
            dst = slots[o]
            if dst is r:
                continue
            if dst is not None and dst.shape == r.shape and dst.dtype == r.dtype:
                dst[...] = r
            else:
                slots[o] = np.array(r)

    def _bind_fixed(self) -> list:
        """Every step bound to the arrays its slots hold now (after a run): static steps as
        in a static program, run-time-shaped ones as a call that copies its results into
        those arrays and raises :class:`_Reshaped` when a shape or dtype changed.

        A run-time-shaped node whose output shapes follow from its operands' shapes alone
        (it sits after a WHILE or a READ_VARIABLE, whose results are shaped at run time)
        gets the kernel a static node of these shapes gets: its operands are fixed arrays
        here, whose shapes only a :class:`_Reshaped` step before it could change, and that
        ends this binding."""
        slots = self.slots
        fixed = []
        for n, (kernel, ins, outs, dynamic, ctx) in enumerate(self.steps):
            args = [slots[i] for i in ins]
            results = [slots[o] for o in outs]
            settled = self._settled_kernel(n, args, results) if dynamic and not ctx.opdef.stateful else None
            bound = self._bound_stateful(n, ctx, args, results) if dynamic and ctx.opdef.stateful else None
            if settled is not None:
                call = _bind_step(settled, args, results)
            elif bound is not None:
                call = bound
            elif dynamic:
                call = partial(_run_in_place, self, n, kernel, args, outs, results)
            else:
                call = _bind_step(kernel, args, results)
            fixed.append((call, ctx))
        return _chain_plans(fixed)

    def _bound_stateful(self, n: int, ctx: NodeContext, args: list, results: list):
        """Stateful step ``n`` bound to these arrays by its op (``OpDef.bind``: an IF or
        WHILE over plans is a plan, and chains), or None. A bound call that raises
        :class:`Unbound` hands the step back to the step-by-step run."""
        bind = ctx.opdef.bind
        if bind is None or any(a is None for a in (*args, *results)):
            return None
        from .kernels.tasks import is_plan
        call = bind(args, results, ctx.attrs, self._runtime)
        if call is None or is_plan(call):
            return call
        return partial(_unless_unbound, n, call)

    def _settled_kernel(self, n: int, args: list, results: list):
        """:func:`_settled_kernel` for step ``n``, made once per set of operand shapes (a
        factory may re-lay out weights)."""
        key = (n, *(None if a is None else (a.shape, a.dtype) for a in (*args, *results)))
        if key not in self._settled:
            if len(self._settled) >= _MAX_SETTLED:   # shapes that keep changing: start over
                self._settled.clear()
            self._settled[key] = _settled_kernel(self.steps[n][4], args, results)
        return self._settled[key]

    def _run_dynamic(self, inputs: Sequence[np.ndarray], outputs: list) -> None:
        """A run of a program with run-time-shaped steps. The first run, and a run after
        shapes changed, go step by step; they leave every slot holding an array, so the
        program is then bound like a static one and later runs are a flat list of calls,
        until the caller's arrays or a run-time shape change (at most ``_MAX_BINDS``
        times: a program whose shapes keep changing stays on the step-by-step path)."""
        key = (*map(id, inputs), *map(id, outputs))
        if self._fixed is not None and key == self._fixed_to[0]:
            try:
                for call, ctx in self._fixed:
                    call()
                return
            except _Reshaped as changed:
                resume = changed.resume
            except (LiteGpuError, *_RUNTIME_ERRORS) as exc:
                raise _fail(ctx, exc) from None
            self._fixed = None
            self._run_steps(resume)
            return
        self._point_slots(inputs, outputs)
        self._fixed = None
        self._run_steps()
        if self._binds < _MAX_BINDS:
            self._binds += 1
            self._fixed = self._bind_fixed()
            # The caller's arrays are kept so that their ids stay theirs.
            self._fixed_to = (key, list(inputs), list(outputs))

    def run(self, inputs: Sequence[np.ndarray], outputs: list, wait_for: Sequence[Event] = ()) -> Event:
        self._threads_here()
        if self.static:
            key = (*map(id, inputs), *map(id, outputs))
            if key != self._bound_to:
                self._bind(inputs, outputs, key)
            try:
                for call, ctx in self._bound:
                    call()
            except (LiteGpuError, *_RUNTIME_ERRORS) as exc:
                raise _fail(ctx, exc) from None
            slots = self.slots
            for i, s in self._fill:
                outputs[i] = slots[s]
            for i, s in self._copy:
                np.copyto(outputs[i], slots[s])
            return COMPLETE
        self._run_dynamic(inputs, outputs)
        self._fill_outputs(outputs)
        return COMPLETE

    def kernels(self) -> list[tuple[tuple[int, ...], str]]:
        """Each step's nodes and what runs them (see :func:`.kernels.registry.kernel_name`)."""
        return [(tuple(c.node.index for c in nodes), self._step_kernel(n))
                for n, nodes in enumerate(self.step_nodes)]

    def _step_kernel(self, n: int) -> str:
        kernel, _, _, dynamic, ctx = self.steps[n]
        if not dynamic:
            from .kernels.registry import kernel_name
            return kernel_name(kernel)
        if ctx.opdef.stateful:
            return "the op's run-time execute (control flow, state)"
        return f"{REFERENCE} (output shapes known at run time)"

    def run_profiled(self, inputs: Sequence[np.ndarray], outputs: list, wait_for: Sequence[Event],
                     profiler) -> Event:
        """:meth:`run` step by step, each step timed into ``profiler`` (a
        ``litegpu.profile.Profiler``) as one slice naming its nodes (several for a fused step)."""
        from litegpu.profile import HOST, CPU_STEPS, Slice, node_info, nodes_label
        for e in wait_for:
            e.wait()
        self._threads_here()
        self._point_slots(inputs, outputs)
        clock = time.perf_counter
        for n, nodes in enumerate(self.step_nodes):
            start = clock()
            self._run_steps(n, n + 1)
            dur = clock() - start
            infos = tuple(node_info(c) for c in nodes)
            profiler.add(Slice(nodes_label(infos), "node", HOST, CPU_STEPS, start, dur, infos, "cpu",
                               {"fused": len(infos) > 1, "kernel": self._step_kernel(n)}))
        self._fixed = None   # slots may hold new arrays: a run-time-shaped program binds again
        self._fill_outputs(outputs)
        return COMPLETE

    def _fill_outputs(self, outputs: list) -> None:
        """Hand over each output slot: into the caller's array, or as the array when it has none."""
        slots = self.slots
        for i, s in enumerate(self.out_slots):
            if outputs[i] is None:
                outputs[i] = slots[s]
            elif outputs[i] is not slots[s]:
                np.copyto(outputs[i], slots[s])


# Bindings a program with run-time-shaped steps makes before it stops re-binding.
_MAX_BINDS = 8
# Kernels kept for run-time shapes (per step and shapes); made again, identical, if dropped.
_MAX_SETTLED = 64


class _Reshaped(Exception):
    """A run-time-shaped step's result changed shape or dtype; the run goes on step by
    step from step ``resume``."""

    def __init__(self, resume: int) -> None:
        super().__init__(resume)
        self.resume = resume


def _unless_unbound(n: int, call) -> None:
    """Bound stateful step ``n``: when it raises :class:`Unbound` (nothing written), the run
    goes on step by step from it."""
    try:
        call()
    except Unbound:
        raise _Reshaped(n) from None


def _run_in_place(program: CpuProgram, n: int, kernel, args: list, outs: list[int], dsts: list) -> None:
    """Run step ``n``, a run-time-shaped one, and copy its results into ``dsts``, its
    arrays of the last run; when they no longer fit, store them as a step-by-step run
    does and raise :class:`_Reshaped`."""
    results = kernel(args)
    for dst, r in zip(dsts, results):
        if dst is r:
            continue
        if not (isinstance(r, (np.ndarray, np.generic)) and dst is not None
                and dst.shape == r.shape and dst.dtype == r.dtype):
            # (Results copied before this one are copied again: harmless.)
            program._store(outs, results)
            raise _Reshaped(n + 1)
        dst[...] = r


def _operand_specs(ctx: NodeContext, args: list) -> list:
    """``ctx``'s input specs for operands of these arrays' shapes: constants keep their
    values (kernels precompute from them); the rest are shapes only."""
    return [s if a is None or (s is not None and s.value is not None) else TensorSpec(a.shape, a.dtype)
            for a, s in zip(args, ctx.inputs)]


def _inferred_outputs(ctx: NodeContext, args: list) -> list | None:
    """The output specs of run-time-shaped node ``ctx`` on operands of these arrays'
    shapes, or None when they depend on operand values (``infer`` raises) or an operand
    is missing."""
    if any(a is None and s is not None for a, s in zip(args, ctx.inputs)):
        return None
    try:
        outputs = ctx.opdef.infer(_operand_specs(ctx, args), ctx.attrs)
    except Exception:  # noqa: BLE001  (DynamicShape, or an error the step-by-step run reports)
        return None
    return outputs if len(outputs) == len(ctx.outputs) else None


def _settled_kernel(ctx: NodeContext, args: list, results: list):
    """The kernel of run-time-shaped node ``ctx`` for operands of these arrays' shapes, or
    None when its output shapes depend on operand values (``infer`` says so by raising)
    or differ from ``results``'."""
    if any(r is None for r in results) or any(a is None and s is not None for a, s in zip(args, ctx.inputs)):
        return None
    inputs = _operand_specs(ctx, args)
    try:
        outputs = ctx.opdef.infer(inputs, ctx.attrs)
    except Exception:  # noqa: BLE001  (DynamicShape, or an error the step-by-step run reports)
        return None
    if len(outputs) != len(results) or any(tuple(o.shape) != r.shape or np.dtype(o.dtype) != r.dtype
                                           for o, r in zip(outputs, results)):
        return None
    from .fusion import generate_alone, make_fused_kernel, plan_group
    from .kernels import make_kernel
    from .kernels.registry import bindable
    settled = dataclasses.replace(ctx, inputs=inputs, outputs=[TensorSpec(r.shape, r.dtype) for r in results],
                                  dynamic=False)
    group = plan_group([settled], set(ctx.node.outputs)) if generate_alone(settled) else None
    if group is None:
        return make_kernel(settled)
    # The generated kernel a static node gets (a task function: it chains), which takes
    # the group's inputs (constants are in its pool).
    fused = make_fused_kernel(group)
    where = [ctx.node.inputs.index(t) for t in group.inputs]
    return bindable(lambda inputs, outputs: _bind_step(fused, [inputs[i] for i in where], outputs))


def _bind_step(kernel, args: list, results: list):
    """A call of no arguments running ``kernel`` on these arrays: the kernel's own
    ``bind`` (its reshaped views made once) when it has one and reshaping cannot copy."""
    bind = getattr(kernel, "bind", None)
    if bind is not None and all(a is None or a.flags.c_contiguous for a in (*args, *results)):
        return bind(args, results)
    return partial(kernel, args, results)


def _share_quantized_rows(steps: list[tuple]) -> None:
    """Dynamically quantized products (hybrid FULLY_CONNECTED) that read one tensor with
    one K quantize it once: each later one reads the first one's quantized rows (the
    first runs before them in every run, and nothing writes a tensor between its readers)."""
    first: dict[tuple, object] = {}
    for kernel, ins, _, _, _ in steps:
        product = getattr(kernel, "quantized_rows", None)
        if product is not None:
            source = first.setdefault((ins[0], product.k), product)
            if source is not product:
                product.read_rows_of(source)


def _chain_plans(steps: list[tuple]) -> list[tuple]:
    """``(call, node)`` pairs with each run of consecutive task-function calls (see
    :mod:`.kernels.tasks`) made one call: a single compiled loop over their table, no
    Python between them (a kernel of a few microseconds costs about half a microsecond
    to call from Python). A chained call's failure names the first node of its run: task
    functions cannot raise, so only the launcher itself could fail there."""
    from .kernels.tasks import Check, chained, is_plan
    out: list[tuple] = []
    for tasks, run in groupby(steps, key=lambda step: is_plan(step[0])):
        run = list(run)
        if tasks and len(run) > 1:
            for call, ctx in run:
                # A check's error names its own node, not the first of the run.
                call.checks = tuple(Check((params, at, partial(_named_error, ctx, error)))
                                    for params, at, error in call.checks)
            out.append((chained([call for call, _ in run]), run[0][1]))
        else:
            out.extend(run)
    return out


def _named_error(ctx: NodeContext, error, params: np.ndarray) -> LiteGpuError:
    """A check's ``error(params)`` naming node ``ctx`` (and marked so :func:`_fail` keeps it)."""
    exc = _fail(ctx, error(params))
    exc.node_named = True
    return exc


def _fail(ctx: NodeContext, exc: Exception) -> LiteGpuError:
    """The litegpu error for a kernel failure, naming the node (unless it names one already)."""
    if getattr(exc, "node_named", False):
        return exc
    if isinstance(exc, LiteGpuError):
        return type(exc)(f"node {ctx.node.index} ({ctx.node.op}): {exc}")
    return ExecutionError(f"node {ctx.node.index} ({ctx.node.op}): {type(exc).__name__}: {exc}")


@lru_cache(maxsize=None)
def _threads_setter(num_threads: int):
    """The call that puts the calling thread on ``num_threads`` numba threads: one object
    per count, so that a caller running several programs' bound steps (a WHILE loop's
    condition and body) can tell it needs calling once."""
    from .kernels.threads import threads_here
    return partial(threads_here, num_threads)


def _failure(ctx: NodeContext, exc: Exception) -> LiteGpuError | None:
    """:func:`_fail` for the errors a kernel raises when it fails (see ``bind_steps``), else None."""
    return _fail(ctx, exc) if isinstance(exc, (LiteGpuError, *_RUNTIME_ERRORS)) else None


def _not_ours(exc: Exception) -> None:
    """A copy step's ``fail``: its errors are not a node's."""
    return None


def _groups(partition: Partition) -> list[tuple]:
    """The partition's steps as ``(what to compile, its nodes)``: a FusedGroup for each
    fused run, a node with the follower it computes too (a conv and its RELU) as one node
    context, else single node contexts."""
    from .fusion import folded_pair, generate_alone, plan_group
    nodes = partition.nodes
    steps = partition.steps or [[i] for i in range(len(nodes))]
    last_reader: dict[int, int] = {}
    for pos, ctx in enumerate(nodes):
        for t in ctx.node.inputs:
            last_reader[t] = pos
    out: list = []
    for positions in steps:
        run = [nodes[p] for p in positions]
        if len(run) == 2 and (folded := folded_pair(*run)) is not None:
            out.append((folded, run))
            continue
        if len(run) >= 2 or generate_alone(run[0]):
            after = positions[-1]
            produced = [ctx.node.outputs[0] for ctx in run]
            escaping = {t for t in produced if last_reader.get(t, -1) > after or t in partition.outputs}
            group = plan_group(run, escaping)
            if group is not None:
                out.append((group, run))
                continue
        out.extend((ctx, [ctx]) for ctx in run)
    return out


def _returning_kernel(ctx: NodeContext, options: CompileOptions):
    """A kernel that returns new arrays: for stateful ops and outputs shaped at run time."""
    attrs = ctx.attrs
    if ctx.opdef.stateful:
        execute, runtime = ctx.opdef.execute, options.runtime
        return lambda inputs: execute(inputs, attrs, runtime)
    reference = ctx.opdef.reference_for(attrs)
    return lambda inputs: reference(inputs, attrs)
