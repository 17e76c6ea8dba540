"""The cpu backend: compiles a partition into a flat list of kernel calls over one arena."""
from __future__ import annotations

import dataclasses
import logging
import os
import platform
from functools import lru_cache, partial
from itertools import groupby
from pathlib import Path
from typing import Sequence

import numpy as np

from litegpu.backend import (COMPLETE, REFERENCE, Backend, Bound, Branch, CompileOptions, Event, Loop, NodeContext,
                             Partition, Program, Step, Support, run_steps)
from litegpu.errors import ExecutionError, LiteGpuError, Unbound
from litegpu.graph import Int4Constant, Model
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

        from .kernels.threads import default_count
        return {"device": _cpu_model(), "cores": os.cpu_count(), "simd": _simd_features(),
                "numpy": np.__version__, "numba": numba.__version__, "llvmlite": llvmlite.__version__,
                "threads": default_count()}

    def supports(self, node: NodeContext, model: Model) -> Support:
        for t in (*node.node.inputs, *node.node.outputs):
            if t < 0 or not node.tensors:
                continue
            tensor = node.tensors[t]
            # Quantized tensors are fine: their nodes run the ops' integer references
            # (kernels.registry.make_kernel), and nodes without one fail when compiled.
            # INT4 weights are read as int8 (their ops take them); an INT4 activation is not.
            if tensor.type_name in ("STRING", "BFLOAT16", "VARIANT") or (tensor.type_name == "INT4"
                                                                          and not tensor.is_constant):
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

    def prebuild(self, directory: str | None = None) -> str:
        """Every task function of the package compiled for this CPU into the prebuilt
        entries (see :mod:`.prebuild`)."""
        from .prebuild import prebuild
        return prebuild(Path(directory) if directory else None).summary()

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
    """A partition as a list of steps ``(kernel, input slots, output slots, dynamic, node)``
    over one arena, run as bound :class:`~litegpu.backend.Step` s.

    :meth:`bind` binds every step to given arrays at once (a program without run-time
    shapes). :meth:`run` binds as it goes: its first run on a set of arrays runs the steps
    one by one, binding each to the arrays its slots hold then, and later runs on the same
    arrays replay those bindings, chained. A step whose output shapes are decided at run
    time (a reference, a WHILE) checks that its results fit the arrays later steps were
    bound to; when they do not, the run binds again from there. That is the one rule: a
    changed shape means binding again.
    """

    def __init__(self, partition: Partition, options: CompileOptions) -> None:
        from litegpu.chains import AttentionChain

        from .fusion import FusedGroup, make_fused_kernel
        from .kernels import make_kernel
        from .kernels.attention import attention_kernel
        from .kernels.workspace import Workspace, making
        self.partition = partition
        # Called first in every run: the run's thread may not be the one that compiled.
        self._threads_here = _threads_setter(options.num_threads)
        self._runtime = options.runtime
        arena = partition.arena
        self.arena = np.empty(arena.size if arena else 0, np.uint8)
        self.workspace = Workspace()   # (the steps' shared scratch: they run one after another)
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
        self.step_nodes: list[tuple[NodeContext, ...]] = []   # the nodes each step computes
        with making(self.workspace):   # (the kernels made here share its scratch)
            for group, nodes in _groups(partition):
                if isinstance(group, (FusedGroup, AttentionChain)):
                    kernel = make_fused_kernel(group) if isinstance(group, FusedGroup) else attention_kernel(group)
                    self.steps.append((kernel, [slot(t) for t in group.inputs], [slot(t) for t in group.outputs],
                                       False, group.nodes[0]))
                    self.step_nodes.append(tuple(nodes))
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
                self.step_nodes.append(tuple(nodes))
        if log.isEnabledFor(logging.DEBUG):
            log.debug("cpu program: %s", "; ".join(
                f"{getattr(kernel, '__name__', type(kernel).__name__)} for "
                f"{'+'.join(f'{c.node.index} {c.node.op}' for c in nodes)}"
                for (kernel, *_), nodes in zip(self.steps, self.step_nodes)))
        _share_quantized_rows(self.steps)
        _drop_packed_constants(partition, slot_of, slots, self.steps)
        slots.append(None)  # slot -1: an omitted optional input
        self.slots = slots
        # A stateful node whose outputs are planned static (an IF whose branches agree) may
        # bind itself (OpDef.bind) with the rest: see bind().
        self.static = not any(dynamic and ctx.dynamic for _, _, _, dynamic, ctx in self.steps)
        # What run() binds: per step, (ids of the arrays it was bound to, its Step, the
        # arrays: kept so that no new array takes one's id); the steps chained, with the
        # caller's arrays they are valid for.
        self._bound_at: list[tuple | None] = [None] * len(self.steps)
        self._replay: list[Step] | None = None
        self._replay_for: tuple = ()
        self._settled: dict[tuple, object] = {}   # see _settled_kernel

    def bind(self, inputs: Sequence[np.ndarray], outputs: list) -> Bound | None:
        """This program on exactly these arrays (see :meth:`Program.bind`), or None when it
        has run-time-shaped steps. Binding does not touch the arrays :meth:`run` works on."""
        if not self.static or any(o is None for o in outputs):
            return None
        slots = self._point_slots(inputs, outputs, list(self.slots))
        steps = []
        for n, (_, _, _, stateful, _) in enumerate(self.steps):
            step = self._self_bound_step(n, slots) if stateful else self._static_step(n, slots)
            if step is None:
                return None
            steps.append(step)
        return Bound(_chain_plans(steps) + self._copies(slots, outputs), (self._threads_here,))

    def run(self, inputs: Sequence[np.ndarray], outputs: list, wait_for: Sequence[Event] = ()) -> Event:
        for e in wait_for:
            e.wait()
        self._threads_here()
        key = (*map(id, inputs), *map(id, outputs))
        if self._replay is not None and key == self._replay_for[0]:
            try:
                run_steps(self._replay)
                self._fill(outputs)
                return COMPLETE
            except _Reshaped as changed:
                rebind, resume = changed.rebind, changed.resume
        else:
            self._point_slots(inputs, outputs)
            rebind = resume = 0
        self._replay = None
        self._bind_from(rebind, resume)
        # The caller's arrays are kept so that their ids stay theirs.
        self._replay_for = (key, list(inputs), list(outputs))
        copies = self._copies(self.slots, outputs)
        run_steps(copies)
        self._replay = _chain_plans([entry[1] for entry in self._bound_at]) + copies
        self._fill(outputs)
        return COMPLETE

    def _bind_from(self, rebind: int, resume: int) -> None:
        """Bind steps ``rebind`` on to the arrays their slots hold, running those from
        ``resume`` on as they are bound (a run-time-shaped step runs first: its results
        decide its arrays). A step keeps its binding while its arrays stay the same."""
        slots = self.slots
        for n in range(rebind, len(self.steps)):
            kernel, ins, outs, dynamic, ctx = self.steps[n]
            if dynamic:
                if n >= resume:
                    args = [slots[i] for i in ins]
                    run_steps((Step(partial(self._run_unbound, n, args, outs), self.step_nodes[n],
                                    partial(_failure, ctx), self._step_kernel(n)),))
                self._bound_at[n] = (None, self._dynamic_step(n))
                continue
            args, results = [slots[i] for i in ins], [slots[o] for o in outs]
            key = (*map(id, args), *map(id, results))
            entry = self._bound_at[n]
            if entry is None or entry[0] != key:
                entry = self._bound_at[n] = (key, self._static_step(n, slots), args, results)
            if n >= resume:
                run_steps((entry[1],))

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

    def _copies(self, slots: list, outputs: list) -> list[Step]:
        """Steps copying each output the program keeps in a slot of its own (an input
        passed through, a constant) into the caller's array."""
        from .kernels.layout import copy_call
        return [Step(copy_call(slots[s], outputs[i])) for i, s in enumerate(self.out_slots)
                if outputs[i] is not None and outputs[i] is not slots[s]]

    def _fill(self, outputs: list) -> None:
        """Hand over each output the caller left to the program (None) as its slot's array."""
        for i, s in enumerate(self.out_slots):
            if outputs[i] is None:
                outputs[i] = self.slots[s]

    def _static_step(self, n: int, slots: list) -> Step:
        """Static step ``n`` bound to the arrays in ``slots``; a task function's checks
        name the step's node."""
        kernel, ins, outs, _, ctx = self.steps[n]
        call = _bind_step(kernel, [slots[i] for i in ins], [slots[o] for o in outs])
        return _named_step(call, self.step_nodes[n], ctx, self._step_kernel(n))

    def _self_bound_step(self, n: int, slots: list) -> Step | None:
        """Stateful step ``n`` with static outputs bound by its op to the arrays in
        ``slots`` (:meth:`_op_bound_step`), when that gives a plan (an IF over plans); None
        otherwise (the program then runs through :meth:`run`)."""
        from .kernels.tasks import is_plan
        _, ins, outs, _, _ = self.steps[n]
        step = self._op_bound_step(n, [slots[i] for i in ins], [slots[o] for o in outs])
        return step if step is not None and is_plan(step.call) else None

    def _op_bound_step(self, n: int, args: list, results: list) -> Step | None:
        """Stateful step ``n`` bound by its op (``OpDef.bind``) to these arrays: a plan (an
        IF or WHILE over plans) as it is, another call binding again from this step when it
        raises :class:`Unbound`; None when the op does not bind here. Its part is the run
        through the op, which the profiler takes so that it records the nodes of the
        subgraphs a WHILE or an IF runs."""
        from .kernels.tasks import is_plan
        kernel, _, outs, _, ctx = self.steps[n]
        if ctx.opdef.bind is None or any(a is None for a in (*args, *results)):
            return None
        call = ctx.opdef.bind(args, results, ctx.attrs, self._runtime)
        if call is None:
            return None
        nodes, fail = self.step_nodes[n], partial(_failure, ctx)
        in_place = Step(partial(_run_in_place, self, n, kernel, args, outs, results), nodes, fail,
                        self._step_kernel(n))
        if is_plan(call):
            return Step(call, nodes, fail, "bound control flow", (in_place,))
        return Step(partial(_unless_unbound, n, call), nodes, fail, in_place.kernel, (in_place,))

    def _dynamic_step(self, n: int) -> Step:
        """Run-time-shaped step ``n`` bound to the arrays its slots hold after it ran.

        A node whose output shapes follow from its operands' shapes alone (it sits after
        a WHILE or a READ_VARIABLE) gets the kernel a static node of these shapes gets: its
        operands are fixed arrays here, whose shapes only a step before it that raised
        :class:`_Reshaped` could change, and that ends this binding. A stateful node may
        bind itself (``OpDef.bind``: an IF or WHILE over plans is a plan). Any other runs
        as at run time and copies its results into these arrays, raising
        :class:`_Reshaped` when they no longer fit."""
        kernel, ins, outs, _, ctx = self.steps[n]
        slots = self.slots
        args, results = [slots[i] for i in ins], [slots[o] for o in outs]
        nodes = self.step_nodes[n]
        if not ctx.opdef.stateful:
            settled = self._settled_kernel(n, args, results)
            if settled is not None:
                from .kernels.registry import kernel_name
                return _named_step(_bind_step(settled, args, results), nodes, ctx, kernel_name(settled))
        else:
            bound = self._op_bound_step(n, args, results)
            if bound is not None:
                return bound
        return Step(partial(_run_in_place, self, n, kernel, args, outs, results), nodes, partial(_failure, ctx),
                    self._step_kernel(n))

    def _run_unbound(self, n: int, args: list, outs: list[int]) -> None:
        """Run run-time-shaped step ``n`` and store its results in its slots: with the
        kernel later runs are bound to when its output shapes follow from its operands'
        shapes (so the first run gives the bits every later run gives; the reference sums
        in another order), else with its reference or the op's ``execute``."""
        kernel, _, _, _, ctx = self.steps[n]
        if not ctx.opdef.stateful:
            specs = _inferred_outputs(ctx, args)
            if specs is not None:
                slots = self.slots
                results = [slots[o] if slots[o] is not None and slots[o].shape == tuple(s.shape)
                           and slots[o].dtype == s.dtype else np.empty(s.shape, s.dtype) for o, s in zip(outs, specs)]
                settled = self._settled_kernel(n, args, results)
                if settled is not None:
                    _bind_step(settled, args, results)()
                    self._store(outs, results)
                    return
        self._store(outs, kernel(args))

    def _store(self, outs: list[int], results: Sequence) -> None:
        """Put a run-time-shaped step's results in its output slots: copied into the arrays
        there when shape and dtype match, so the slots keep their arrays from run to run
        (and later steps their bindings); else a copy of their own (a reference may
        return a view of its input)."""
        slots = self.slots
        for o, r in zip(outs, results):
            r = np.asarray(r)
            dst = slots[o]
            if dst is r:
                continue
            if dst is not None and dst.shape == r.shape and dst.dtype == r.dtype:
                dst[...] = r
            else:
                slots[o] = np.array(r)

    def _settled_kernel(self, n: int, args: list, results: list):
        """:func:`_settled_kernel` for step ``n``, made once per set of operand shapes (a
        factory may re-lay out weights)."""
        key = (n, *(None if a is None else (a.shape, a.dtype) for a in (*args, *results)))
        if key not in self._settled:
            if len(self._settled) >= _MAX_SETTLED:   # shapes that keep changing: start over
                self._settled.clear()
            self._settled[key] = _settled_kernel(self.steps[n][4], args, results)
        return self._settled[key]

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


# Kernels kept for run-time shapes (per step and shapes); made again, identical, if dropped.
_MAX_SETTLED = 64


class _Reshaped(Exception):
    """A run-time-shaped step's result changed shape or dtype: bind again from step
    ``rebind``, running the steps from ``resume`` on."""

    def __init__(self, rebind: int, resume: int) -> None:
        super().__init__(rebind, resume)
        self.rebind, self.resume = rebind, resume


def _unless_unbound(n: int, call) -> None:
    """Bound stateful step ``n``: when it raises :class:`Unbound` (nothing written), the run
    binds again from it."""
    try:
        call()
    except Unbound:
        raise _Reshaped(n, n) from None


def _run_in_place(program: CpuProgram, n: int, kernel, args: list, outs: list[int], dsts: list) -> None:
    """Run step ``n``, a run-time-shaped one, and copy its results into ``dsts``, its
    arrays of the last run; when they no longer fit, store them as a first run does and
    raise :class:`_Reshaped` (bind again from this step, run on from the next)."""
    results = kernel(args)
    for dst, r in zip(dsts, results):
        if dst is r:
            continue
        if not (isinstance(r, (np.ndarray, np.generic)) and dst is not None
                and dst.shape == r.shape and dst.dtype == r.dtype):
            # (Results copied before this one are copied again: harmless.)
            program._store(outs, results)
            raise _Reshaped(n, n + 1)
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


def _drop_packed_constants(partition: Partition, slot_of: dict[int, int], slots: list, steps: list) -> None:
    """Empty the slot of each INT4 constant that every step reading it packed for itself
    (its kernel's ``packed_inputs``): the slot held the constant's unpacked int8 values,
    twice the bytes the model stores, for the program's life."""
    read = {s for kernel, ins, _, _, _ in steps for position, s in enumerate(ins)
            if position not in getattr(kernel, "packed_inputs", ())}
    read |= {slot_of[t] for t in (*partition.inputs, *partition.outputs) if t in slot_of}
    for t, s in slot_of.items():
        if s not in read and isinstance(getattr(partition.specs.get(t), "stored", None), Int4Constant):
            slots[s] = None


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


def _named_step(call, nodes: tuple, ctx: NodeContext, kernel: str) -> Step:
    """``call`` as the step computing ``nodes``, its failures named by node ``ctx``: a
    task function's checks too, which raise after the table they run in."""
    from .kernels.tasks import Check, is_plan
    fail = partial(_failure, ctx)
    if is_plan(call) and call.checks:
        call.checks = tuple(Check((params, at, partial(_named_error, ctx, error))) for params, at, error in call.checks)
    return Step(call, nodes, fail, kernel)


def _chain_plans(steps: list[Step]) -> list[Step]:
    """``steps`` with each run of consecutive task-function calls (see :mod:`.kernels.tasks`)
    made one step: a single compiled loop over their table, no Python between them (a
    kernel of a few microseconds costs about half a microsecond to call from Python). A
    chained step keeps its parts (the profiler times them one by one); its failure names
    the first node of its run: task functions cannot raise, so only the launcher itself
    could fail there, and each check names its own node (:func:`_named_step`)."""
    from .kernels.tasks import chained, is_plan
    out: list[Step] = []
    for tasks, run in groupby(steps, key=lambda step: is_plan(step.call)):
        run = list(run)
        if tasks and len(run) > 1:
            out.append(Step(chained([step.call for step in run]), tuple(c for step in run for c in step.nodes),
                            run[0].fail, "", tuple(run)))
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
    """The call that puts the calling thread on ``num_threads`` threads: one object
    per count, so that a caller running several programs' bound steps (a WHILE loop's
    condition and body) can tell it needs calling once."""
    from .kernels.threads import threads_here
    return partial(threads_here, num_threads)


def _failure(ctx: NodeContext, exc: Exception) -> LiteGpuError | None:
    """:func:`_fail` for the errors a kernel raises when it fails (a step's ``fail``), else
    None: the error propagates as it is (:class:`_Reshaped`, an interrupt)."""
    return _fail(ctx, exc) if isinstance(exc, (LiteGpuError, *_RUNTIME_ERRORS)) else None


def _groups(partition: Partition) -> list[tuple]:
    """The partition's steps as ``(what to compile, its nodes)``: an AttentionChain for an
    attention's chain of nodes, a FusedGroup for each fused run, a node with the follower it
    computes too (a conv and its RELU) as one node context, else single node contexts."""
    from litegpu.chains import attention_chain, reader_counts

    from .fusion import folded_pair, generate_alone, plan_group
    nodes = partition.nodes
    steps = partition.steps or [[i] for i in range(len(nodes))]
    last_reader: dict[int, int] = {}
    for pos, ctx in enumerate(nodes):
        for t in ctx.node.inputs:
            last_reader[t] = pos
    readers = reader_counts(nodes, partition.outputs)
    out: list = []
    for positions in steps:
        run = [nodes[p] for p in positions]
        if len(run) > 3 and (chain := attention_chain(run, 0, readers)) is not None and len(chain.nodes) == len(run):
            out.append((chain, run))
            continue
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
