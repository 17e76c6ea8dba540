"""Threads of the cpu kernels: the plan launcher's workers (:mod:`.tasks`) and OpenBLAS's.

The two must not both be wide. OpenBLAS's workers busy-wait after each GEMM; in a network
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


# numba's thread count belongs to the calling thread: what each thread was set to.
_APPLIED: dict[int, int] = {}


def configure_threads(num_threads: int) -> None:
    """Apply the cpu backend's thread policy on the calling thread: numba kernels on
    ``num_threads`` threads (0: numba's default), GEMMs on the calling thread (see the
    module docstring)."""
    import numba

    from .tasks import ensure_workers
    if num_threads > 0:
        numba.set_num_threads(min(num_threads, numba.config.NUMBA_NUM_THREADS))
    ensure_workers(numba.get_num_threads())
    ensure_gemm_policy()
    _APPLIED[threading.get_ident()] = num_threads


def threads_here(num_threads: int) -> None:
    """Make sure the calling thread runs numba kernels on ``num_threads`` threads. A run
    may come from another thread than the compile (``run_async``'s worker, a user's
    thread pool), and numba would give that thread its default count; ~0.1 µs when set."""
    if _APPLIED.get(threading.get_ident()) != num_threads:
        configure_threads(num_threads)
