"""What litegpu changes in numba's own start-up, and why.

numba loads its typing and lowering registries when it first compiles, or first loads a
function from its disk cache. One of them, ``numba.np.arraymath``, asks at import whether
a BLAS is there for ``np.vdot`` / ``np.inner`` by importing ``scipy.linalg.cython_blas``;
importing ``scipy.linalg`` (and the array-API layers under it) took 0.15-0.25 s on the
2-core test machine: a third of a warm process's time to its first result, for a question
litegpu's kernels never ask (they call no BLAS routine from numba).

:func:`defer_blas_probe` imports ``numba.np.arraymath`` with that probe answered by whether
scipy can be found, without importing it: numba still enables its BLAS paths when scipy is
installed, and the first numba function that really calls BLAS (a user's ``np.dot``) runs
numba's own check, which imports scipy then and raises as it always did if that fails.

Another: when numba loads its typing registries, its cffi support makes a ``cffi.FFI()``
whether or not anything uses cffi, and the FFI's C parser (pycparser) builds its lexer:
~18 ms of a warm process's ~0.55 s. :func:`defer_cffi_parser` imports that support with its
FFI made on first use (:class:`_LazyFFI`): a user's cffi function passed to numba gets the
real FFI then, as before.
"""
from __future__ import annotations

import importlib.util
import logging
import sys

log = logging.getLogger("litegpu.cpu.numba")


def _scipy_findable() -> None:
    """numba's ``ensure_blas`` contract (ImportError when no BLAS), answered without an import."""
    if importlib.util.find_spec("scipy") is None:
        raise ImportError("scipy is not installed")


def defer_blas_probe() -> None:
    """Import ``numba.np.arraymath`` with its BLAS probe deferred (see the module docstring);
    nothing when it is already imported or numba is laid out differently."""
    if "numba.np.arraymath" in sys.modules:
        return
    try:
        import numba.np.linalg as linalg
        real = linalg.ensure_blas
    except (ImportError, AttributeError) as exc:
        log.debug("numba without numba.np.linalg.ensure_blas (%s): its BLAS probe stays as it is", exc)
        return
    linalg.ensure_blas = _scipy_findable
    try:
        import numba.np.arraymath as arraymath
    finally:
        linalg.ensure_blas = real
    if getattr(arraymath, "ensure_blas", None) is _scipy_findable:
        arraymath.ensure_blas = real


class _LazyFFI:
    """A ``cffi.FFI()`` made when first used (see the module docstring)."""

    def __init__(self, make) -> None:
        self._make = make
        self._ffi = None

    def __getattr__(self, name: str):
        if self._ffi is None:
            self._ffi = self._make()
        return getattr(self._ffi, name)


def defer_cffi_parser() -> None:
    """Import numba's cffi support with its module-level FFI made lazily (see the module
    docstring); nothing when it is imported already or cffi is not installed."""
    if "numba.core.typing.cffi_utils" in sys.modules:
        return
    try:
        import cffi
    except ImportError:
        return
    real = cffi.FFI
    cffi.FFI = lambda *args, **kwargs: _LazyFFI(lambda: real(*args, **kwargs))
    try:
        import numba.core.typing.cffi_utils as cffi_utils
        log.debug("numba's cffi support loaded with a lazy FFI: %s", type(cffi_utils.ffi).__name__)
    except ImportError as exc:
        log.debug("numba without numba.core.typing.cffi_utils (%s): its FFI stays as it is", exc)
    finally:
        cffi.FFI = real
