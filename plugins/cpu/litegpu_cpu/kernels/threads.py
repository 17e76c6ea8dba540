"""Thread pools of the cpu kernels: numba's (numba.prange kernels) and OpenBLAS's (GEMMs
through numpy).

The two pools must not both be wide. OpenBLAS's workers busy-wait after each GEMM, and
numba's OpenMP workers after each parallel region; in a network that alternates the
two (a depthwise conv, then a pointwise GEMM) each pool's spinners take the cores the
other needs. Measured on 2 loaded cores (mobilenet_v2 / resnet18 per invoke):
OpenBLAS 2 threads: 100-280 / 240-870 ms; OpenBLAS 1 thread but numba's OpenMP
workers spinning (libgomp's default, 300000 spins, milliseconds): 165-280 / 340-880 ms;
OpenBLAS 1 thread and OpenMP workers that sleep when idle: 17-22 / 72-100 ms.

Sleeping at once is not free either: on an idle VM waking a sleeping worker costs every
parallel kernel ~50-70 us (an empty prange call: 72 us passive, 1.9 us when the worker
is still spinning), which is most of mobilenet_v3_small's time (9.1 ms passive against
3.4 ms with a short spin). But when other processes keep the cores busy, a worker that
spins takes time the caller needs, and the same short spin makes things far worse
(measured with load average ~2.7 on the 2 cores, ratio to LiteRT passive / 10000
spins: efficientnet_b0 2.4 / 8.5, mobilenet_v2 2.3 / 7.6, unet_small 2.5 / 6.6). So the
wait policy is picked once, when this module is imported, from the load average:

- numba gets ``num_threads``; with the 1-minute load average under half the cores its
  OpenMP workers spin briefly, then sleep (``GOMP_SPINCOUNT=10000``, ~0.1-0.3 ms there);
  otherwise they sleep at once (``OMP_WAIT_POLICY=PASSIVE``). A user's own
  ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` is left alone. libgomp reads them when numba
  first starts its pool, at the first parallel kernel call;
- OpenBLAS runs on the calling thread only (set once, when the first GEMM kernel is
  built: :func:`ensure_gemm_policy`); large GEMMs are split over numba's threads by
  :mod:`.gemm` instead.

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


def machine_busy() -> bool:
    """True when the 1-minute load average is at least half the cores (other work running)."""
    try:
        return os.getloadavg()[0] >= 0.5 * (os.cpu_count() or 1)
    except (OSError, AttributeError):   # no load average on this platform: assume busy
        return True


# Before numba's OpenMP pool starts (nothing in this package launches a parallel kernel at import).
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    if machine_busy():
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    else:
        os.environ["GOMP_SPINCOUNT"] = "10000"

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
    if num_threads > 0:
        numba.set_num_threads(min(num_threads, numba.config.NUMBA_NUM_THREADS))
    ensure_gemm_policy()
    _APPLIED[threading.get_ident()] = num_threads


def threads_here(num_threads: int) -> None:
    """Make sure the calling thread runs numba kernels on ``num_threads`` threads. A run
    may come from another thread than the compile (``run_async``'s worker, a user's
    thread pool), and numba would give that thread its default count; ~0.1 µs when set."""
    if _APPLIED.get(threading.get_ident()) != num_threads:
        configure_threads(num_threads)
