"""litegpu's OpenCL backend: kernels generated per node as OpenCL C, built with pyopencl.

Runs on any OpenCL 1.2+ device: a GPU, or PoCL on a CPU (what CI uses). Registered
under the ``litegpu.backends`` entry-point group like any third-party backend.
"""
from __future__ import annotations

from litegpu.hookspecs import hookimpl


@hookimpl
def litegpu_backends():
    """The opencl backend (it probes its device lazily, in ``available()``)."""
    from .backend import OpenClBackend
    return [OpenClBackend()]


@hookimpl
def litegpu_dialects():
    """The OpenCL C dialect its kernels render in."""
    from litegpu.codegen.opencl import OPENCL
    return [OPENCL]
