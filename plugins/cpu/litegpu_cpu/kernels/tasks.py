"""Parallel kernels as serial task functions run by one shared parallel launcher.

A numba ``parallel=True`` kernel is costly to compile cold: numba types and lowers its
``prange`` body twice (once as the kernel, once as the outlined gufunc) and LLVM
re-optimizes every function it calls in each of the modules they are linked into. The
3x3 depthwise kernels took 4-6 s each to compile that way (mobilenet_v2's cold first
result doubled, 9 -> 19 s). Here a kernel is instead:

- a *task function*: plain serial numba code that computes one task (say, two output
  rows) from raw float32 pointers, compiled once, on first use, as a C callback
  (:func:`numba.cfunc`) with its pointers marked ``noalias``, so that LLVM vectorizes
  its loops without run-time alias checks (the property numba gives a ``prange`` body
  only when the body creates no array views); its machine code is kept in litegpu's
  cache and linked by later processes without numba (:mod:`..objects`);
- run by :func:`run_plan`, one small launcher compiled once for every task function,
  which calls the callback's address for each task index on the calling thread and the
  launcher's workers. A plan is a table of such calls, so a run of task-function steps
  is one call from Python (:func:`plan_call`, through :data:`..native.call_block`);
  with control rows (jumps, copies; run by :func:`run_program`) a WHILE loop or an IF
  whose subgraphs are plans is part of the same table (see :mod:`..control`).

The pointers are typed float32; a task function over other dtypes reinterprets them
(:func:`int32_pointer`, :func:`uint8_pointer` for bool and bytes, ...). A task
cannot raise: one that finds bad input (an index out of range) sets a word of its own
int64 parameters, and the call checks it after the plan (a *check*, see
:func:`bound_tasks`).

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

import atexit
import ctypes
import logging
import os
import platform
import threading
from functools import partial
from pathlib import Path
from time import perf_counter_ns

import numpy as np
from llvmlite import ir

from .. import jit, objects
from ..compile_progress import report_compile
from ..jit import carray, cfunc, cgutils, intrinsic, njit, types
from ..native import call_block
from .registry import in_order
from .threads import current as current_threads

log = logging.getLogger(__name__)

_F32P = types.CPointer(types.float32)
# task index, eight float32 arrays (those a kernel does not use come last, as one scratch
# float), its int64 and float32 parameters.
ARRAYS = 8
TASK_SIGNATURE = types.void(types.int64, *[_F32P] * ARRAYS, types.CPointer(types.int64), _F32P)


def _register_noalias() -> bool:
    """Let ``cfunc``/``njit`` take ``noalias=True`` (numba's internal ``Flags.noalias``);
    False where this numba has no such flag. Idempotent."""
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


_COMPILE_LOCK = threading.RLock()    # numba compiles one function at a time anyway


class TaskFunction:
    """A serial task function ``fn(task, a0, .., a7, ints, floats)`` (float32 pointers,
    int64 and float32 parameter pointers), compiled as a C callback on first use; with
    another ``signature``, any C callback of litegpu's (the launcher's entries).
    ``requires``: the host CPU features (llvmlite's names) its instructions need; it is
    only compiled where the host has them (LLVM aborts on an instruction it cannot select)."""

    def __init__(self, fn, fastmath=False, signature=TASK_SIGNATURE, requires: tuple[str, ...] = ()) -> None:
        self.fn = fn
        self.fastmath = fastmath
        self.signature = signature
        self.requires = requires
        self._address = 0
        self._compiled = None                  # keeps the code alive

    @property
    def name(self) -> str:
        """``module.function``, as logs and progress name it."""
        return f"{self.fn.__module__}.{self.fn.__qualname__}"

    def _options(self) -> dict:
        # error_model="numpy": a callback cannot raise, so x / 0 is inf as in numpy.
        return {"fastmath": self.fastmath, "error_model": "numpy", "noalias": True}

    def _compile(self, options: dict):
        """numba's C callback of this function (numba's own cache too, for a function whose
        code needs numba's runtime: :mod:`..objects` keeps only what links without it)."""
        jit.materialize()
        if not _register_noalias():
            options = {k: v for k, v in options.items() if k != "noalias"}
        report_compile(self.fn.__name__)   # a cfunc raises no numba compile event
        return cfunc(jit.real(self.signature), cache=True, **options)(self.fn)

    @property
    def address(self) -> int:
        """The callback's address: linked from litegpu's cache of machine code or its
        prebuilt entries (no numba needed, :mod:`..objects`), else compiled by numba and
        kept in the cache; once."""
        if not self._address and not self.linked():
            # One compile per function even when threads build models at once: a second
            # compile would replace ``_compiled`` and free the code at an address already
            # handed out.
            with _COMPILE_LOCK:
                if not self._address:
                    self._compiled = self._compile(self._options())
                    entry = self.entry()
                    if entry:
                        objects.store(entry, self._compiled)
                    self._address = self._compiled.address
        return self._address

    def linked(self) -> bool:
        """True when the function runs without a compile now: compiled or linked in this
        process already, or linked now from the cache or the prebuilt entries (never
        waiting for a compile another thread is making)."""
        if not self._address:
            entry = self.entry()
            address = objects.load(entry) if entry else 0     # (links an entry once a process)
            if address:
                self._address = address
        return bool(self._address)

    def prebuild(self, directory: Path) -> str:
        """Compile this function into ``directory`` as a prebuilt entry of :mod:`..objects`:
        ``"built"``, ``"present"`` (there already) or ``"runtime"`` (its code needs numba's
        runtime, so it cannot be kept there). The caller checks :attr:`requires`."""
        entry = self.entry()
        if entry is not None and (directory / f"{entry}.o").is_file():
            return "present"
        with _COMPILE_LOCK:
            kept = entry is not None and objects.store(entry, self._compile(self._options()), directory)
        return "built" if kept else "runtime"

    def entry(self) -> str | None:
        """Its entry name in :mod:`..objects` (None: it has none)."""
        return objects.key(self.fn, self.signature, self._options())


def task_function(fastmath=False, signature=TASK_SIGNATURE, requires: tuple[str, ...] = ()):
    """Decorator: the function as a :class:`TaskFunction` (``requires``: see there)."""
    return lambda fn: TaskFunction(fn, fastmath, signature, requires)


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


def _pointer_cast(to: str):
    """An intrinsic reinterpreting a float32 pointer as a pointer to numba type ``to`` (its
    name: the type itself exists once numba is imported, see :mod:`..jit`)."""
    @intrinsic
    def cast(typingctx, pointer):
        target = types.CPointer(getattr(types, to))

        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], context.get_value_type(target))
        return target(pointer), codegen
    return cast


@intrinsic
def advanced(typingctx, pointer, offset):
    """Float32 pointer ``pointer`` moved ``offset`` elements on: ``carray(advanced(p, i), n)``
    is a C-contiguous view of elements ``i .. i + n`` (a slice of a view is not, and a
    reshape calls into numba's runtime, which linked machine code cannot, :mod:`..objects`)."""
    def codegen(context, builder, signature, args):
        return builder.gep(args[0], [args[1]])
    return types.CPointer(types.float32)(types.CPointer(types.float32), types.intp), codegen


@intrinsic
def address_of(typingctx, pointer):
    """The integer address of float32 pointer ``pointer`` (for :func:`_call_task`)."""
    def codegen(context, builder, signature, args):
        return builder.ptrtoint(args[0], ir.IntType(64))
    return types.intp(types.CPointer(types.float32)), codegen


int8_pointer = _pointer_cast("int8")
int16_pointer = _pointer_cast("int16")
int32_pointer = _pointer_cast("int32")
int64_pointer = _pointer_cast("int64")
float64_pointer = _pointer_cast("float64")
# numpy stores a bool as one byte, 0 or 1: read ``p[i] != 0``, write ``np.uint8(v)``.
uint8_pointer = _pointer_cast("uint8")


@intrinsic
def _load_int64(typingctx, address):
    """The int64 at integer ``address``."""
    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        return builder.load(builder.inttoptr(args[0], i64.as_pointer()))
    return types.int64(types.intp), codegen


@intrinsic
def _store_int64(typingctx, address, value):
    """Store int64 ``value`` at integer ``address``."""
    def codegen(context, builder, signature, args):
        builder.store(args[1], builder.inttoptr(args[0], ir.IntType(64).as_pointer()))
        return context.get_dummy_value()
    return types.void(types.intp, types.int64), codegen


@intrinsic
def _load_byte(typingctx, address):
    """The byte at integer ``address`` (a bool), as an int64."""
    def codegen(context, builder, signature, args):
        byte = builder.load(builder.inttoptr(args[0], ir.IntType(8).as_pointer()))
        return builder.zext(byte, ir.IntType(64))
    return types.int64(types.intp), codegen


@intrinsic
def _copy_bytes(typingctx, src, dst, count):
    """Copy ``count`` bytes from address ``src`` to address ``dst`` (not overlapping)."""
    def codegen(context, builder, signature, args):
        byte = ir.IntType(8).as_pointer()
        cgutils.raw_memcpy(builder, builder.inttoptr(args[1], byte), builder.inttoptr(args[0], byte),
                           args[2], 1)
        return context.get_dummy_value()
    return types.void(types.intp, types.intp, types.int64), codegen


# Control rows: a row whose task count is one of these negative codes is not a task call
# but a step of the plan's own control flow, its operands in the array columns. Jumps
# are relative (rows from this one), so tables stay valid when concatenated.
JUMP_IF_FALSE = -1   # a0: address of a bool; a1: the jump, taken when the bool is false
JUMP = -2            # a1: the jump
COPY = -3            # a0 -> a1, a2 bytes
STOP_IF_SET = -4     # a0: address of an int64 check word; the plan stops when it is nonzero
SET = -5             # the int64 at a0 = the int64 at a1
COUNT_DOWN = -6      # the int64 at a0 minus one; below zero: sets the int64 at a1 and stops


@intrinsic
def fetch_add(typingctx, address, value):
    """Atomically add ``value`` to the int64 at integer ``address``; the old value."""
    def codegen(context, builder, signature, args):
        pointer = builder.inttoptr(args[0], ir.IntType(64).as_pointer())
        return builder.atomic_rmw("add", pointer, args[1], "seq_cst")
    return types.int64(types.intp, types.int64), codegen


@intrinsic
def _load_acquire(typingctx, address):
    """The int64 at integer ``address``, read atomically (acquire: what its writer wrote
    before its releasing store is visible after this load)."""
    def codegen(context, builder, signature, args):
        pointer = builder.inttoptr(args[0], ir.IntType(64).as_pointer())
        return builder.load_atomic(pointer, "acquire", 8)
    return types.int64(types.intp), codegen


_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686", "x86")


@intrinsic
def wait_a_little(typingctx, spins):
    """One step of a busy wait: ``pause`` (x86) for the first ``SPINS`` steps, then give the
    core away (``sched_yield``) on every step, so that a waiting thread does not keep a
    loaded machine's core from the thread it waits for."""
    def codegen(context, builder, signature, args):
        void = ir.FunctionType(ir.VoidType(), [])
        spinning = builder.icmp_signed("<", args[0], ir.Constant(ir.IntType(64), SPINS))
        with builder.if_else(spinning) as (spin, give_away):
            with spin:
                if _X86:
                    builder.call(cgutils.get_or_insert_function(builder.module, void, "llvm.x86.sse2.pause"), [])
            with give_away:
                if os.name == "posix":
                    yield_ = ir.FunctionType(ir.IntType(32), [])
                    builder.call(cgutils.get_or_insert_function(builder.module, yield_, "sched_yield"), [])
        return context.get_dummy_value()
    return types.void(types.int64), codegen


# Busy-wait steps before a waiting thread starts yielding: ~20 us of ``pause`` on Zen 4,
# longer than a row's imbalance when the machine is idle. Yielding after 256 steps was 2-3x
# slower with another process busy on one of 2 cores (each yield gave it the core for a
# time slice); never yielding leaves two of our threads squeezed onto one core waiting on
# each other until the scheduler moves one.
SPINS = 4096
# Counters are int64s a cache line apart, so that claims and completions, and the counters
# of successive barriers, do not share a line.
_LINE = 64
_WORDS = _LINE // 8


# -- the launcher's workers ----------------------------------------------------------------

# Words of :data:`POOL`, a cache line apart: the job's generation (odd while a job is
# open; its low 32 bits are the futex idle workers sleep on), the job (the plan's address
# and rows, its counters' address, its width), the workers inside the job, whether a caller
# owns the workers, whether they should stop, how many sleep, how many were started.
_GEN, _PLAN, _ROWS, _COUNTERS, _WIDTH, _ACTIVE, _OWNER, _STOP, _SLEEPERS, _WORKERS = range(10)


def _immortal_int64s(count: int) -> np.ndarray:
    """``count`` zeroed int64s that are never freed, not even while the interpreter shuts
    down: the workers are daemon threads reading them without the GIL, and one the OS has
    descheduled may still be running when module globals are torn down."""
    memory = (ctypes.c_int64 * count)()
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(memory))   # a reference nobody drops
    return np.frombuffer(memory, np.int64)


POOL = _immortal_int64s(10 * _LINE // 8)
"""The launcher's state, shared by the caller of a plan and the workers (see :class:`_Workers`).
Compiled code takes it as an argument: numba would freeze a global array into a copy."""

_LINUX = platform.system() == "Linux"
_SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine().lower())
_FUTEX_WAIT_PRIVATE, _FUTEX_WAKE_PRIVATE = 128, 129


@intrinsic
def claim_word(typingctx, address):
    """Set the int64 at integer ``address`` from 0 to 1, atomically; False when it was not 0
    (someone else holds what it guards; giving it back is ``fetch_add(address, -1)``)."""
    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        pair = builder.cmpxchg(builder.inttoptr(args[0], i64.as_pointer()), ir.Constant(i64, 0),
                               ir.Constant(i64, 1), "seq_cst", "seq_cst")
        return builder.extract_value(pair, 1)
    return types.boolean(types.intp), codegen


@njit(cache=True, inline="always")
def _release(state):
    """Give the workers back (``_OWNER`` to 0)."""
    fetch_add(state + _OWNER * _LINE, np.int64(-1))


def _syscall_futex(builder, address, op, value):
    """``syscall(SYS_futex, address, op, value, 0, 0, 0)`` (Linux)."""
    i64 = ir.IntType(64)
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i64, [i64], var_arg=True), "syscall")
    zero = ir.Constant(i64, 0)
    builder.call(fn, [ir.Constant(i64, _SYS_FUTEX), address, ir.Constant(i64, op), value, zero, zero, zero])


@intrinsic
def _futex_wait(typingctx, address, value):
    """Sleep while the 32-bit word at ``address`` holds the low 32 bits of ``value`` (a
    futex where Linux has one; elsewhere a 50 us nap, and the caller checks again)."""
    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        if _LINUX and _SYS_FUTEX is not None:
            low = builder.and_(args[1], ir.Constant(i64, 0xFFFFFFFF))
            _syscall_futex(builder, args[0], _FUTEX_WAIT_PRIVATE, low)
        else:
            i32 = ir.IntType(32)
            nap = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i32, [i32]), "usleep")
            builder.call(nap, [ir.Constant(i32, 50)])
        return context.get_dummy_value()
    return types.void(types.intp, types.int64), codegen


@intrinsic
def _futex_wake(typingctx, address, count):
    """Wake up to ``count`` threads sleeping on the futex at ``address`` (Linux; elsewhere
    nothing: they nap and look again)."""
    def codegen(context, builder, signature, args):
        if _LINUX and _SYS_FUTEX is not None:
            _syscall_futex(builder, args[0], _FUTEX_WAKE_PRIVATE, args[1])
        return context.get_dummy_value()
    return types.void(types.intp, types.int64), codegen


@intrinsic
def _plan_at(typingctx, address):
    """The int64 pointer at integer ``address``."""
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], ir.IntType(64).as_pointer())
    return types.CPointer(types.int64)(types.intp), codegen


@njit(cache=True, nogil=True)
def _work(state, part):
    """A worker's life: wait for a job (spin ``SPINS`` steps, then sleep on the
    generation's futex), take part ``part`` of it (:func:`_take_part`) unless it closed
    meanwhile or is narrower, and again, until ``_STOP``."""
    gen_at, active = state + _GEN * _LINE, state + _ACTIVE * _LINE
    seen = _load_acquire(gen_at)
    while True:
        spins = 0
        gen = _load_acquire(gen_at)
        while gen == seen:
            if _load_acquire(state + _STOP * _LINE) != 0:
                return
            if spins < SPINS:
                wait_a_little(np.int64(0))
                spins += 1
            else:
                fetch_add(state + _SLEEPERS * _LINE, np.int64(1))
                if fetch_add(gen_at, np.int64(0)) == seen and _load_acquire(state + _STOP * _LINE) == 0:
                    _futex_wait(gen_at, seen)
                fetch_add(state + _SLEEPERS * _LINE, np.int64(-1))
            gen = _load_acquire(gen_at)
        seen = gen
        if gen % 2 == 0:
            continue                    # a job that closed before this worker saw it
        fetch_add(active, np.int64(1))
        width = _load_int64(state + _WIDTH * _LINE)
        if fetch_add(gen_at, np.int64(0)) == gen and part < width:
            plan = carray(_plan_at(_load_int64(state + _PLAN * _LINE)), (_load_int64(state + _ROWS * _LINE), 4 + ARRAYS))
            _take_part(plan, _load_int64(state + _COUNTERS * _LINE), width, part)
        fetch_add(active, np.int64(-1))


ENTRY_SIGNATURE = types.void(types.CPointer(types.int64))
"""A launcher entry's C signature: ``void entry(int64_t *arguments)``, called by
:data:`..native.call_block` with the words of a block after its first."""


@task_function(signature=ENTRY_SIGNATURE)
def _work_entry(arguments):
    """:func:`_work` (``arguments``: the pool's address, the part)."""
    _work(arguments[0], arguments[1])


@task_function(signature=ENTRY_SIGNATURE)
def _wake_entry(arguments):
    """Wake every worker sleeping on the generation's futex of the pool at ``arguments[0]``."""
    _futex_wake(arguments[0] + _GEN * _LINE, np.int64(1 << 30))


class _Workers:
    """The launcher's worker threads: Python threads, each running :func:`_work` without
    the GIL for the life of the process, started on demand (:func:`ensure_workers`), told
    to stop at exit, and forgotten in a forked child (whose copy of :data:`POOL` has no
    threads behind it)."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._forget)
        atexit.register(self.stop)

    def ensure(self, count: int) -> None:
        """At least ``count`` workers running."""
        if len(self.threads) >= count:
            return
        with self.lock:
            while len(self.threads) < count:
                part = len(self.threads) + 1
                block = np.array([_work_entry.address, POOL.ctypes.data, part], np.int64)
                thread = threading.Thread(target=call_block, args=(block,), daemon=True,
                                          name=f"litegpu-cpu-worker-{part}")
                thread.start()
                self.threads.append(thread)
                POOL[_WORKERS * _LINE // 8] = len(self.threads)

    def stop(self) -> None:
        """Let every worker return (at exit)."""
        if not self.threads:
            return
        POOL[_STOP * _LINE // 8] = 1
        POOL[_GEN * _LINE // 8] += 2        # (no job: a changed generation wakes the sleepers)
        call_block(np.array([_wake_entry.address, POOL.ctypes.data], np.int64))
        for thread in self.threads:
            thread.join(timeout=1.0)

    def _forget(self) -> None:
        POOL[:] = 0
        self.threads = []
        self.lock = threading.Lock()


_WORKER_THREADS = _Workers()


def ensure_workers(threads: int) -> None:
    """Enough workers for plans on ``threads`` threads (the caller is one of them)."""
    _WORKER_THREADS.ensure(max(0, threads - 1))


@njit(cache=True)
def _run_rows_serially(plan):
    """Every task of every row of ``plan`` in order on the calling thread."""
    for s in range(plan.shape[0]):
        q = plan[s]
        for t in range(q[1]):
            _call_task(q[0], t, q[2], q[3], q[4], q[5], q[6], q[7], q[8], q[9], q[10], q[11])


@njit(cache=True, inline="always")
def _stretch_end(plan, s):
    """The row after the run of one-task rows starting at row ``s`` (``s + 1`` when row
    ``s`` has another count): such a run is a *serial stretch*."""
    end = s + 1
    if plan[s, 1] == 1:
        while end < plan.shape[0] and plan[end, 1] == 1:
            end += 1
    return end


@njit(cache=True, inline="always")
def _claim_and_run(q, base, width, part):
    """Run tasks of row ``q`` until none is left; the count run. The tasks are cut in
    ``width`` contiguous ranges, one per part, each with a claim counter (``base + p``
    lines): a part claims its own range's tasks first, then the others', so that when
    every thread takes part each runs the same tasks from run to run and finds their
    weights in its own cache (a 1536x128 float product split in two ran as slowly as on
    one thread while the halves changed cores)."""
    tasks = q[1]
    ran = 0
    for k in range(width):
        p = (part + k) % width
        start, stop = p * tasks // width, (p + 1) * tasks // width
        while True:
            t = start + fetch_add(base + p * _LINE, np.int64(1))
            if t >= stop:
                break
            _call_task(q[0], t, q[2], q[3], q[4], q[5], q[6], q[7], q[8], q[9], q[10], q[11])
            ran += 1
    return ran


@njit(cache=True, nogil=True)
def _take_part(plan, base, width, part):
    """One thread's part of a plan run in one parallel region: for each row in order,
    claim its tasks (:func:`_claim_and_run`) and run them until none is left, then wait
    until every task of the row has finished (a second counter) before the next row,
    which may read the row's results. A serial stretch (:func:`_stretch_end`) is run in
    order by the thread that claims it while the others wait once at its end, not at
    each row (a GRU step is ~17 rows of 48 values each, whose waits had cost more than
    their work). Any thread may run any task, so the run finishes whatever number of
    threads actually take part (one thread running two parts in turn finds the second
    one's rows all done). ``base``: the address of zeroed counters, ``width + 1`` lines
    per barrier (the claims of each part's range, then the finished count). ``part``:
    0 for the caller, 1 .. for the workers."""
    rows = plan.shape[0]
    s = 0
    while s < rows:
        tasks = plan[s, 1]
        end = _stretch_end(plan, s)
        finished = base + width * _LINE
        if tasks == 1:
            if fetch_add(base, np.int64(1)) == 0:
                for r in range(s, end):
                    q = plan[r]
                    _call_task(q[0], 0, q[2], q[3], q[4], q[5], q[6], q[7], q[8], q[9], q[10], q[11])
                fetch_add(finished, np.int64(1))
        else:
            ran = _claim_and_run(plan[s], base, width, part)
            if ran:
                fetch_add(finished, ran)
        spins = 0
        while _load_acquire(finished) < tasks:
            wait_a_little(spins)
            spins += 1
        base += (width + 1) * _LINE
        s = end


@njit(cache=True, nogil=True)
def _lead(plan, counters, state, width):
    """The caller's side of a job (see :func:`run_plan`): publish ``plan`` and its
    ``counters`` (an address: zeroed words the plan's call holds), take part 0, close the
    job and return once no worker is inside it, so that the counters outlive every worker
    that may still touch them (one the OS descheduled inside the job)."""
    _store_int64(state + _PLAN * _LINE, plan.ctypes.data)
    _store_int64(state + _ROWS * _LINE, plan.shape[0])
    _store_int64(state + _COUNTERS * _LINE, counters)
    _store_int64(state + _WIDTH * _LINE, width)
    fetch_add(state + _GEN * _LINE, np.int64(1))                 # odd: the job is open
    if fetch_add(state + _SLEEPERS * _LINE, np.int64(0)) > 0:
        _futex_wake(state + _GEN * _LINE, np.int64(width - 1))
    _take_part(plan, counters, width, np.int64(0))
    fetch_add(state + _GEN * _LINE, np.int64(1))                 # even: closed
    spins = 0
    while fetch_add(state + _ACTIVE * _LINE, np.int64(0)) != 0:   # a worker still inside
        wait_a_little(spins)
        spins += 1


@njit(cache=True, nogil=True)
def run_plan(plan, state, width, counters):
    """Each row of ``plan`` in order (the task function's address, its task count, then
    the addresses of a0 .. a7, the int64 and the float32 parameters) on up to ``width``
    threads. One compile serves every task function and every sequence of them.

    With several threads and a row of several tasks, the whole plan runs as one job of
    the launcher's workers (``state``: the address of :data:`POOL`, see :class:`_Workers`):
    the caller takes part 0 (:func:`_take_part`), each worker awake takes another, the
    barriers (a row of several tasks, a serial stretch) are counters in memory
    (``counters``: the address of at least :func:`counter_words` int64s). The caller never
    waits for a worker to *arrive*: a part's tasks that its worker has not claimed are the
    caller's to run, so a worker the OS has descheduled (another process busy on the
    cores) costs its share of the work, not a wait for its time slice; the caller waits
    only for tasks a worker has started, and at the end for workers still inside the job.
    (numba's ``prange`` waits for every thread at the end of each parallel region: a
    10 us model took 80 us beside one CPU-bound process.) Otherwise, or when the workers
    serve another caller (another model's run on another thread), the rows run on the
    calling thread."""
    parallel = False
    barriers = 0
    s = 0
    while s < plan.shape[0]:
        parallel |= plan[s, 1] > 1
        barriers += 1
        s = _stretch_end(plan, s)
    if width == 1 or not parallel or not claim_word(state + _OWNER * _LINE):   # take the workers
        _run_rows_serially(plan)
        return
    width = min(width, _load_acquire(state + _WORKERS * _LINE) + 1)
    if width == 1:
        _release(state)
        _run_rows_serially(plan)
        return
    for line in range(barriers * (width + 1)):
        _store_int64(counters + line * _LINE, np.int64(0))
    _lead(plan, counters, state, width)
    _release(state)


@njit(cache=True, nogil=True)
def run_program(plan, state, width, counters):
    """A table with control rows (a negative count: ``JUMP``, ``COPY``, ...): a small
    program with branches and loops (IF and WHILE, see :mod:`..control`), each run of task
    rows between them handed to :func:`run_plan`. Serial itself, so that the launcher's
    parallel lowering never sees the control rows (with them inside, its cold compile
    doubled) and models without control flow never compile this."""
    s = 0
    while s < plan.shape[0]:
        end = s
        while end < plan.shape[0] and plan[end, 1] >= 0:
            end += 1
        if end > s:
            run_plan(plan[s:end], state, width, counters)
            s = end
            continue
        q = plan[s]
        op = q[1]
        if op == JUMP_IF_FALSE:
            if _load_byte(q[2]) == 0:
                s += q[3]
                continue
        elif op == JUMP:
            s += q[3]
            continue
        elif op == COPY:
            _copy_bytes(q[2], q[3], q[4])
        elif op == STOP_IF_SET:
            if _load_int64(q[2]) != 0:
                return
        elif op == SET:
            _store_int64(q[2], _load_int64(q[3]))
        elif op == COUNT_DOWN:
            left = _load_int64(q[2]) - 1
            _store_int64(q[2], left)
            if left < 0:
                _store_int64(q[3], np.int64(1))
                return
        s += 1


@task_function(signature=ENTRY_SIGNATURE)
def _plan_entry(arguments):
    """:func:`run_plan` (``arguments``: the table's address and rows, the pool's address,
    the width, the counters' address)."""
    run_plan(carray(_plan_at(arguments[0]), (arguments[1], 4 + ARRAYS)), arguments[2], arguments[3], arguments[4])


@task_function(signature=ENTRY_SIGNATURE)
def _program_entry(arguments):
    """:func:`run_program`, with :func:`_plan_entry`'s arguments."""
    run_program(carray(_plan_at(arguments[0]), (arguments[1], 4 + ARRAYS)), arguments[2], arguments[3],
                arguments[4])


def counter_words(rows: np.ndarray, width: int) -> int:
    """How many int64s the barriers of table ``rows`` take on ``width`` threads: ``width + 1``
    cache lines for each serial stretch or row of several tasks (:func:`run_plan`), over
    the task rows between the control rows."""
    counts = rows[:, 1]
    single = counts == 1
    starts = (~single | ~np.concatenate(([False], single))[:-1]) & (counts >= 0)
    return max(int(starts.sum()), 1) * (width + 1) * _WORDS


def control_row(op: int, *operands: int) -> np.ndarray:
    """One control row (see ``JUMP`` ...): ``operands`` in the columns of a0, a1, ..."""
    row = np.zeros((1, 4 + ARRAYS), np.int64)
    row[0, 1] = op
    row[0, 2:2 + len(operands)] = operands
    return row


_UNUSED = np.zeros(1, np.float32)      # the array slots and floats a task does not use


def row_tasks(rows: int, work: int, parallel_from: int, most: int = 8) -> tuple[int, int]:
    """``(tasks, chunk)``: ``rows`` rows cut into up to ``most`` tasks of ``chunk`` rows
    each when the work (``work``, in any unit) reaches ``parallel_from``, else one task;
    never zero tasks or an empty chunk."""
    tasks = min(rows, most) if work >= parallel_from else 1
    chunk = max(-(-rows // max(tasks, 1)), 1)
    return max(-(-rows // chunk), 1), chunk


def bound_tasks(task: TaskFunction, tasks: int, arrays: tuple, params: np.ndarray,
                floats: np.ndarray = _UNUSED, checks: tuple = ()):
    """A call of no arguments running ``task`` over ``tasks`` tasks on ``arrays`` (up to eight
    C-contiguous arrays, a0 .. a7 in order; the slots after them are unused), ``params``
    (int64) and ``floats`` (float32). :func:`run_plan` gets their addresses, so that it has
    one signature (one compile) for every task function whatever the arrays' shapes or
    flags. The call holds the arrays (``held``) and its table (``rows``), and
    :func:`chained` can run several such calls as one.

    ``checks`` are ``(at, error)`` pairs for a task that reports bad input: it sets
    ``params[at]`` (nonzero), and the call then resets it and raises ``error(params)``."""
    if len(arrays) > ARRAYS or not all(a.flags.c_contiguous for a in arrays):
        raise ValueError("a task function takes up to eight C-contiguous arrays")
    if params.dtype != np.int64 or floats.dtype != np.float32:
        raise ValueError("task parameters are an int64 and a float32 array")
    held = (*arrays, *[_UNUSED] * (ARRAYS - len(arrays)), params, floats)
    rows = np.array([[task.address, tasks, *(a.ctypes.data for a in held)]], np.int64)
    return plan_call(rows, held, tuple((params, at, error) for at, error in checks))


class Check(tuple):
    """``(params, at, error)``: after a plan, ``params[at]`` nonzero means a task found bad
    input; :meth:`raise_if_set` resets it and raises ``error(params)``."""

    def raise_if_set(self) -> None:
        params, at, error = self
        if params[at]:
            exc = error(params)
            params[at] = 0
            raise exc


def plan_call(rows: np.ndarray, held: tuple, checks: tuple):
    """The call running table ``rows`` (through :func:`run_plan`, or :func:`run_program`
    when it has control rows) on the calling thread's thread count (:func:`.threads.current`):
    a ``partial`` of :data:`..native.call_block` on the block of its arguments, with no
    Python around it when nothing is checked; with ``rows``, ``held``, ``checks`` and the
    block (which holds the counters) attached."""
    checks = tuple(Check(c) for c in checks)
    entry = _program_entry if len(rows) and rows[:, 1].min() < 0 else _plan_entry
    width = current_threads()
    counters = np.zeros(counter_words(rows, width), np.int64)
    block = np.array([entry.address, rows.ctypes.data, len(rows), POOL.ctypes.data, width, counters.ctypes.data],
                     np.int64)
    run = partial(call_block, block)
    # Timing costs ~1 us a run from Python: only for plans with several parallel rows, whose
    # barriers a descheduled worker can hold (a wake-word head's one split row: not worth it).
    if width > 1 and len(rows) and int((rows[:, 1] > 1).sum()) >= LoadAdaptiveWidth.PARALLEL_ROWS:
        run = partial(LoadAdaptiveWidth(block, width), run)
    if checks:
        def call() -> None:
            run()
            for check in call.checks:   # (the attribute: a caller may rename the errors)
                check.raise_if_set()
    else:
        call = run
    call.rows, call.held, call.checks, call.block, call.counters = rows, held, checks, block, counters
    return call


class LoadAdaptiveWidth:
    """A parallel plan's thread count while other processes load the cores: the bound width,
    unless the plan's recent runs say one thread is faster now.

    With another CPU-bound process on the cores, a worker the OS deschedules in the middle
    of a task holds its row's barrier for up to a time slice, and a plan of many short rows
    can run slower on two threads than on one. Called with each run
    (``LoadAdaptiveWidth(block, width)(run)``), this times it and sets the width word
    ``block[4]`` that :func:`run_plan` reads for the next run:

    - on the full width, after :attr:`RUNS` runs in a row slower than :attr:`SLOW` times
      the best recent one, it tries one thread: a first run slower than the full width's
      recent mean ends the trial at once (a quiet machine: it costs that one run), else
      :attr:`TRIAL` runs decide, by their mean;
    - on one thread, every :attr:`PROBE_EVERY` th run starts a trial of :attr:`TRIAL` runs
      on the full width, kept when their mean beats one thread's (one run says little: the
      other process leaves the cores now and then, and a full-width run is then twice as fast).

    Tasks compute the same outputs whichever thread runs them, so the width never changes a
    bit of the answers, only where the time goes."""

    SLOW, RUNS, TRIAL, PROBE_EVERY, BACK_OFF = 1.3, 3, 8, 32, 64
    PARALLEL_ROWS = 4       # rows of several tasks a plan needs to be timed at all
    DECAY = 1.002           # the best time ages, so a lasting change of speed is learnt
    FULL, TRY_ONE, ONE, TRY_FULL = range(4)

    def __init__(self, block: np.ndarray, width: int) -> None:
        self.block, self.width, self.mode = block, width, self.FULL
        self.best = float("inf")
        self.mean = {self.FULL: 0.0, self.ONE: 0.0}     # recent means (1/8 weight per run)
        self.slow = self.wait = self.runs = self.trial = self.total = 0

    def __call__(self, run) -> None:
        start = perf_counter_ns()
        run()
        took = perf_counter_ns() - start
        mode = self.mode
        if mode in (self.FULL, self.ONE):
            mean = self.mean[mode]
            self.mean[mode] = took if not mean else mean + (took - mean) / 8
        if mode == self.FULL:
            self.best = min(self.best * self.DECAY, took)
            if took <= self.SLOW * self.best:
                self.slow = 0
            elif self.wait:
                self.wait -= 1
            else:
                self.slow += 1
                if self.slow == self.RUNS:
                    self._start(self.TRY_ONE, 1)
        elif mode == self.ONE:
            self.runs += 1
            if self.runs % self.PROBE_EVERY == 0:
                self._start(self.TRY_FULL, self.width)
        else:
            self.trial += 1
            self.total += took
            if mode == self.TRY_FULL:
                self.best = min(self.best, took)
            current, tried = (self.FULL, self.ONE) if mode == self.TRY_ONE else (self.ONE, self.FULL)
            if mode == self.TRY_ONE and self.trial == 1 and took > self.mean[current]:
                self._end(current)
            elif self.trial == self.TRIAL:
                mean = self.total / self.trial
                if mean < self.mean[current]:
                    self.mean[tried] = mean
                    self._end(tried)
                else:
                    self._end(current)

    def _start(self, mode: int, width: int) -> None:
        self.mode, self.trial, self.total, self.slow = mode, 0, 0, 0
        self.block[4] = width

    def _end(self, mode: int) -> None:
        # Back on the full width after one thread lost: wait before trying it again.
        self.wait = self.BACK_OFF if mode == self.FULL and self.mode == self.TRY_ONE else 0
        self.mode, self.runs = mode, 0
        self.block[4] = 1 if mode == self.ONE else self.width


def is_plan(call) -> bool:
    """True for a call made by :func:`bound_tasks` or :func:`chained`."""
    return getattr(call, "rows", None) is not None


def chained(calls: list):
    """One call of no arguments making ``calls`` (at least one, each from
    :func:`bound_tasks` or this function) in order, in a single :func:`run_plan`: no
    Python between them."""
    if len(calls) == 1:
        return calls[0]
    return plan_call(np.concatenate([c.rows for c in calls]), tuple(a for c in calls for a in c.held),
                      tuple(check for c in calls for check in c.checks))


def in_sequence(calls: list):
    """One call of no arguments making ``calls`` in order: a single plan (:func:`chained`)
    when every one is a task-function call, else :func:`.registry.in_order`."""
    return chained(calls) if calls and all(is_plan(c) for c in calls) else in_order(calls)


def bind_task(task: TaskFunction, tasks: int, inputs: tuple, outputs: tuple, params: np.ndarray,
              floats: np.ndarray = _UNUSED, dtypes: tuple | None = None, checks: tuple = ()):
    """:func:`bound_tasks` on ``inputs`` then ``outputs`` (a0 .. in that order) as a kernel's
    ``bind`` gets them: an input that is not C-contiguous of its dtype (``dtypes``, inputs
    then outputs; float32 when not given) is copied (the backend binds once only arrays
    that are all C-contiguous, and binds again on every run otherwise), an output that is
    not is written through scratch and copied back."""
    if dtypes is None:
        dtypes = (np.dtype(np.float32),) * (len(inputs) + len(outputs))
    ins = tuple(np.ascontiguousarray(a, dtype=d) for a, d in zip(inputs, dtypes))
    outs, copies = [], []
    for out, dtype in zip(outputs, dtypes[len(inputs):]):
        if out.dtype == dtype and out.flags.c_contiguous:
            outs.append(out)
        else:
            outs.append(np.empty(out.shape, dtype))
            copies.append(partial(np.copyto, out, outs[-1]))
    call = bound_tasks(task, tasks, (*ins, *outs), params, floats, checks)
    if not copies:
        return call
    return in_order([call, *copies])
