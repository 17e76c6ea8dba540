"""litegpu's CPU backend: numba JIT kernels, BLAS through numpy for GEMM-shaped work.

Registered under the ``litegpu.backends`` entry-point group exactly as a third-party
backend would be.
"""
from __future__ import annotations

from litegpu.hookspecs import hookimpl


@hookimpl
def litegpu_backends():
    """The cpu backend."""
    from .backend import CpuBackend
    return [CpuBackend()]
