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
- run by :func:`run_tasks`, one small parallel launcher compiled once for every task
  function, which calls the callback's address for each task index over numba's threads.

The 3x3 depthwise kernels compile in about half the time this way and run as fast;
mobilenet_v2's cold first result is back to ~9 s.

Marking pointers ``noalias`` makes the callers promise that the arrays behind
``a0 .. a5`` do not overlap; the arena planner never places an operand and a result of
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

log = logging.getLogger(__name__)

_F32P = types.CPointer(types.float32)
# task index, six float32 arrays (those a kernel does not use come last, as one scratch
# float), its int64 and float32 parameters.
TASK_SIGNATURE = types.void(types.int64, _F32P, _F32P, _F32P, _F32P, _F32P, _F32P,
                            types.CPointer(types.int64), _F32P)
ARRAYS = 6


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
    """A serial task function ``fn(task, a0, .., a5, ints, floats)`` (float32 pointers,
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
            compiled = cfunc(TASK_SIGNATURE, cache=True, fastmath=self.fastmath, **options)(self.fn)
            self._compiled = compiled
            self._address = compiled.address
        return self._address


def task_function(fastmath=False):
    """Decorator: the function as a :class:`TaskFunction`."""
    return lambda fn: TaskFunction(fn, fastmath)


@intrinsic
def _call_task(typingctx, fn, task, a0, a1, a2, a3, a4, a5, ints, floats):
    """Call the task function at address ``fn`` (every argument an integer address)."""
    sig = types.void(*([types.intp] * 10))

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        f32p = ir.FloatType().as_pointer()
        fnty = ir.FunctionType(ir.VoidType(), [i64] + [f32p] * ARRAYS + [i64.as_pointer(), f32p])
        callee = builder.inttoptr(args[0], fnty.as_pointer())
        pointers = [builder.inttoptr(a, f32p) for a in args[2:8]]
        builder.call(callee, [args[1], *pointers, builder.inttoptr(args[8], i64.as_pointer()),
                              builder.inttoptr(args[9], f32p)])
        return context.get_dummy_value()

    return sig, codegen


@njit(cache=True, parallel=True)
def run_tasks(fn, tasks, addresses):
    """Tasks ``0 .. tasks-1`` of the task function at address ``fn`` over numba's threads;
    ``addresses``: a0 .. a5, the int64 and the float32 parameters."""
    q = addresses
    for t in prange(tasks):
        _call_task(fn, np.int64(t), q[0], q[1], q[2], q[3], q[4], q[5], q[6], q[7])


_UNUSED = np.zeros(1, np.float32)      # the array slots and floats a task does not use


def bound_tasks(task: TaskFunction, tasks: int, arrays: tuple, params: np.ndarray,
                floats: np.ndarray = _UNUSED):
    """A call of no arguments running ``task`` over ``tasks`` tasks on ``arrays`` (up to six
    C-contiguous float32 arrays, a0 .. a5 in order; the slots after them are unused),
    ``params`` (int64) and ``floats`` (float32). :func:`run_tasks` gets their addresses, so
    that it has one signature (one compile) for every task function whatever the arrays'
    shapes or flags; the call holds the arrays."""
    if len(arrays) > ARRAYS or not all(a.flags.c_contiguous and a.dtype == np.float32 for a in arrays):
        raise ValueError("a task function takes up to six C-contiguous float32 arrays")
    if params.dtype != np.int64 or floats.dtype != np.float32:
        raise ValueError("task parameters are an int64 and a float32 array")
    held = (*arrays, *[_UNUSED] * (ARRAYS - len(arrays)), params, floats)
    call = partial(run_tasks, task.address, tasks, np.array([a.ctypes.data for a in held], np.int64))
    call.held = held
    return call
