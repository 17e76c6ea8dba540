"""Parallel kernels as serial task functions run by one shared parallel launcher.

A numba ``parallel=True`` kernel is costly to compile cold: numba types and lowers its
``prange`` body twice (once as the kernel, once as the outlined gufunc) and LLVM
re-optimizes every function it calls in each of the modules they are linked into. The
3x3 depthwise kernels took 4-6 s each to compile that way (mobilenet_v2's cold first
result doubled, 9 -> 19 s). Here a kernel is instead:

- a *task function*: plain serial numba code that computes one task (say, two output
  rows) from raw float32 pointers, compiled once, on first use, as a C callback
  (:func:`numba.cfunc`, in numba's disk cache) with its pointers marked ``noalias``, so
  that LLVM vectorizes its loops without run-time alias checks (the property numba gives
  a ``prange`` body only when the body creates no array views);
- run by :func:`run_plan`, one small launcher compiled once for every task function,
  which calls the callback's address for each task index over numba's threads. A plan
  is a table of such calls, so a run of task-function steps is one call from Python.

The 3x3 depthwise kernels compile in about half the time this way and run as fast;
mobilenet_v2's cold first result is back to ~9 s.

Marking pointers ``noalias`` makes the callers promise that the arrays behind
``a0 .. a7`` do not overlap; the arena planner never places an operand and a result of
one node in the same bytes (their lifetimes overlap at that node), and constants are
separate arrays. numba has no public option for it: :func:`_register_noalias` adds the
flag its parallel lowering already uses, and when a numba version lacks it the task
functions compile without it (correct, slower).
"""
from __future__ import annotations

import logging
from functools import partial

import numpy as np
from llvmlite import ir
from numba import cfunc, njit, prange, types
from numba.extending import intrinsic

from .registry import in_order

log = logging.getLogger(__name__)

_F32P = types.CPointer(types.float32)
# task index, eight float32 arrays (those a kernel does not use come last, as one scratch
# float), its int64 and float32 parameters.
ARRAYS = 8
TASK_SIGNATURE = types.void(types.int64, *[_F32P] * ARRAYS, types.CPointer(types.int64), _F32P)


def _register_noalias() -> bool:
    """Let ``cfunc``/``njit`` take ``noalias=True`` (numba's internal ``Flags.noalias``)."""
    try:
        from numba.core.compiler import Flags
        from numba.core.cpu import CPUTargetOptions
        from numba.core.options import TargetOptions
        if not hasattr(CPUTargetOptions, "noalias"):
            if "noalias" not in Flags.options:
                return False
            CPUTargetOptions.noalias = TargetOptions.Mapping("noalias")
        return True
    except (ImportError, AttributeError) as exc:     # another numba: compile without it
        log.debug("numba has no noalias flag (%s): task functions compile without it", exc)
        return False


NOALIAS = _register_noalias()


class TaskFunction:
    """A serial task function ``fn(task, a0, .., a7, ints, floats)`` (float32 pointers,
    int64 and float32 parameter pointers), compiled as a C callback on first use."""

    def __init__(self, fn, fastmath=False) -> None:
        self.fn = fn
        self.fastmath = fastmath
        self._address = 0
        self._compiled = None                  # keeps the code alive

    @property
    def address(self) -> int:
        """The callback's address (compiles it, or loads it from numba's cache, once)."""
        if not self._address:
            options = {"noalias": True} if NOALIAS else {}
            # error_model="numpy": a callback cannot raise, so x / 0 is inf as in numpy.
            compiled = cfunc(TASK_SIGNATURE, cache=True, fastmath=self.fastmath, error_model="numpy",
                             **options)(self.fn)
            self._compiled = compiled
            self._address = compiled.address
        return self._address


def task_function(fastmath=False):
    """Decorator: the function as a :class:`TaskFunction`."""
    return lambda fn: TaskFunction(fn, fastmath)


@intrinsic
def _call_task(typingctx, fn, task, a0, a1, a2, a3, a4, a5, a6, a7, ints, floats):
    """Call the task function at address ``fn`` (every argument an integer address)."""
    sig = types.void(*([types.intp] * (4 + ARRAYS)))

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        f32p = ir.FloatType().as_pointer()
        fnty = ir.FunctionType(ir.VoidType(), [i64] + [f32p] * ARRAYS + [i64.as_pointer(), f32p])
        callee = builder.inttoptr(args[0], fnty.as_pointer())
        pointers = [builder.inttoptr(a, f32p) for a in args[2:2 + ARRAYS]]
        builder.call(callee, [args[1], *pointers, builder.inttoptr(args[2 + ARRAYS], i64.as_pointer()),
                              builder.inttoptr(args[3 + ARRAYS], f32p)])
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True, parallel=True)
def run_plan(plan):
    """Each row of ``plan`` in order (the task function's address, its task count, then
    the addresses of a0 .. a7, the int64 and the float32 parameters): its tasks over numba's threads,
    or on the calling thread when there is one task (no parallel region to wake). One
    compile serves every task function and every sequence of them."""
    for s in range(plan.shape[0]):
        q = plan[s]
        if q[1] == 1:
            _call_task(q[0], np.int64(0), q[2], q[3], q[4], q[5], q[6], q[7], q[8], q[9], q[10], q[11])
        else:
            for t in prange(q[1]):
                _call_task(q[0], np.int64(t), q[2], q[3], q[4], q[5], q[6], q[7], q[8], q[9], q[10], q[11])


_UNUSED = np.zeros(1, np.float32)      # the array slots and floats a task does not use


def bound_tasks(task: TaskFunction, tasks: int, arrays: tuple, params: np.ndarray,
                floats: np.ndarray = _UNUSED):
    """A call of no arguments running ``task`` over ``tasks`` tasks on ``arrays`` (up to eight
    C-contiguous float32 arrays, a0 .. a7 in order; the slots after them are unused),
    ``params`` (int64) and ``floats`` (float32). :func:`run_plan` gets their addresses, so
    that it has one signature (one compile) for every task function whatever the arrays'
    shapes or flags. The call holds the arrays (``held``), and :func:`chained` can run
    several such calls as one."""
    if len(arrays) > ARRAYS or not all(a.flags.c_contiguous and a.dtype == np.float32 for a in arrays):
        raise ValueError("a task function takes up to eight C-contiguous float32 arrays")
    if params.dtype != np.int64 or floats.dtype != np.float32:
        raise ValueError("task parameters are an int64 and a float32 array")
    held = (*arrays, *[_UNUSED] * (ARRAYS - len(arrays)), params, floats)
    plan = np.array([[task.address, tasks, *(a.ctypes.data for a in held)]], np.int64)
    call = partial(run_plan, plan)
    call.held = held
    return call


def is_plan(call) -> bool:
    """True for a call made by :func:`bound_tasks` or :func:`chained`."""
    return isinstance(call, partial) and call.func is run_plan


def chained(calls: list):
    """One call of no arguments making ``calls`` (at least one, each from
    :func:`bound_tasks` or this function) in order, in a single :func:`run_plan`: no
    Python between them."""
    if len(calls) == 1:
        return calls[0]
    call = partial(run_plan, np.concatenate([c.args[0] for c in calls]))
    call.held = tuple(a for c in calls for a in c.held)
    return call


def in_sequence(calls: list):
    """One call of no arguments making ``calls`` in order: a single plan (:func:`chained`)
    when every one is a task-function call, else :func:`.registry.in_order`."""
    return chained(calls) if calls and all(is_plan(c) for c in calls) else in_order(calls)


def bind_task(task: TaskFunction, tasks: int, inputs: tuple, outputs: tuple, params: np.ndarray,
              floats: np.ndarray = _UNUSED):
    """:func:`bound_tasks` on ``inputs`` then ``outputs`` (a0 .. in that order) as a kernel's
    ``bind`` gets them: an input that is not C-contiguous float32 is copied (the backend
    binds once only arrays that are all C-contiguous, and binds again on every run
    otherwise), an output that is not is written through scratch and copied back."""
    ins = tuple(np.ascontiguousarray(a, dtype=np.float32) for a in inputs)
    outs, copies = [], []
    for out in outputs:
        if out.dtype == np.float32 and out.flags.c_contiguous:
            outs.append(out)
        else:
            outs.append(np.empty(out.shape, np.float32))
            copies.append(partial(np.copyto, out, outs[-1]))
    call = bound_tasks(task, tasks, (*ins, *outs), params, floats)
    if not copies:
        return call
    return in_order([call, *copies])
