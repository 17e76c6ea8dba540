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
