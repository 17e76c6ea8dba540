"""Threads of the cpu kernels: the plan launcher's workers (:mod:`.tasks`) and OpenBLAS's.

The launcher's thread count is litegpu's own, per calling thread (:func:`current`):
numba's threading layer is never started (it spawned a pool of its own, ~25 ms of a
process's start, for kernels that no longer use it).

The two pools must not both be wide. OpenBLAS's workers busy-wait after each GEMM; in a network
that alternates a task-function kernel (a depthwise conv) and a BLAS product, each pool's
spinners would take the cores the other needs (measured on 2 loaded cores, mobilenet_v2 /
resnet18 per invoke, with numba's OpenMP pool as the other: OpenBLAS 2 threads: 100-280 /
240-870 ms; OpenBLAS 1 thread: 17-22 / 72-100 ms). So OpenBLAS runs on the calling thread
only (set once, when the first GEMM kernel is built: :func:`ensure_gemm_policy`), and
large GEMMs are split into tasks by :mod:`.gemm` instead. The launcher's workers spin
~20 us after a plan and then sleep, and a plan never waits for one the OS descheduled.

Setting OpenBLAS's thread count goes through the ``*_set_num_threads`` symbol of the
OpenBLAS that numpy bundles, found with ctypes; when it is not found (another BLAS, a
different build) nothing changes and :func:`blas_threads_settable` says so.
"""
from __future__ import annotations

import ctypes
import glob
import os
import threading
from typing import Callable

_SETTER: Callable[[int], None] | None = None
_GEMM_POLICY_SET = False
_SEARCHED = False
_SYMBOLS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
            "openblas_set_num_threads64_", "openblas_set_num_threads")


def numpy_openblas_symbol(names: tuple[str, ...]):
    """The first of ``names`` exported by the OpenBLAS that numpy bundles (a ctypes function), or None."""
    import numpy as np
    base = os.path.dirname(os.path.dirname(np.__file__))
    candidates = glob.glob(os.path.join(base, "numpy.libs", "*openblas*")) + \
        glob.glob(os.path.join(base, "numpy", ".dylibs", "*openblas*"))
    for path in candidates:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in names:
            fn = getattr(lib, name, None)
            if fn is not None:
                return fn
    return None


def _find_setter() -> Callable[[int], None] | None:
    """The OpenBLAS thread-count setter of numpy's bundled BLAS, or None."""
    global _SETTER, _SEARCHED
    if _SEARCHED:
        return _SETTER
    _SEARCHED = True
    fn = numpy_openblas_symbol(_SYMBOLS)
    if fn is not None:
        fn.argtypes = [ctypes.c_int]
        fn.restype = None
        _SETTER = fn
    return _SETTER


def blas_threads_settable() -> bool:
    """True when this process's numpy BLAS thread count can be set."""
    return _find_setter() is not None


def set_blas_threads(n: int) -> bool:
    """Set OpenBLAS's thread count (process-wide); False when it cannot be set."""
    setter = _find_setter()
    if setter is None:
        return False
    setter(max(1, int(n)))
    return True


def ensure_gemm_policy() -> None:
    """Put OpenBLAS on one thread, once per process (see the module docstring). Called by
    the factories of GEMM kernels, so a process that never builds one is left alone."""
    global _GEMM_POLICY_SET
    if not _GEMM_POLICY_SET:
        _GEMM_POLICY_SET = True
        set_blas_threads(1)


def default_count() -> int:
    """The thread count of a program that asks for none (``num_threads`` 0): the
    ``NUMBA_NUM_THREADS`` environment variable where set (the knob numba users know),
    else the cores this process may run on."""
    try:
        return max(1, int(os.environ["NUMBA_NUM_THREADS"]))
    except (KeyError, ValueError):
        pass
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


# The thread count belongs to the calling thread (a run may come from another thread
# than the compile: ``run_async``'s worker, a user's thread pool): what each was set to.
_HERE = threading.local()


def current() -> int:
    """The calling thread's thread count for the cpu kernels: what :func:`configure_threads`
    set on it, else :func:`default_count`. Kernels split their work by it when they are
    built, and a plan bound on this thread runs on up to that many threads."""
    return getattr(_HERE, "count", 0) or default_count()


def configure_threads(num_threads: int) -> None:
    """Apply the cpu backend's thread policy on the calling thread: kernels on
    ``num_threads`` threads (0: :func:`default_count`; never more than that, since the
    launcher's workers spin a little after each plan), the launcher's workers started,
    GEMMs on the calling thread (see the module docstring)."""
    from .tasks import ensure_workers
    most = default_count()
    _HERE.count = min(num_threads, most) if num_threads > 0 else most
    _HERE.asked = num_threads
    ensure_workers(_HERE.count)
    ensure_gemm_policy()


def threads_here(num_threads: int) -> None:
    """Make sure the calling thread runs the cpu kernels on ``num_threads`` threads; ~0.1 µs
    when it does already."""
    if getattr(_HERE, "asked", None) != num_threads:
        configure_threads(num_threads)
