"""litegpu's CUDA backend: kernels rendered as CUDA C++ by :mod:`litegpu.codegen`,
compiled at run time with NVRTC and launched through the CUDA driver API
(NVIDIA's ``cuda-bindings``; litegpu's ``[cuda]`` extra).

Registered under the ``litegpu.backends`` entry-point group like any third-party
backend. Without an NVIDIA driver it is listed as unavailable, saying why; NVRTC
itself needs no GPU, so ``litegpu compile --backend cuda`` works anywhere.
"""
from __future__ import annotations

from litegpu.hookspecs import hookimpl


@hookimpl
def litegpu_backends():
    """The cuda backend (it opens its device lazily, in ``available()``)."""
    from .backend import CudaBackend
    return [CudaBackend()]


@hookimpl
def litegpu_dialects():
    """The CUDA C++ dialect its kernels render in."""
    from litegpu.codegen.cuda import CUDA
    return [CUDA]
