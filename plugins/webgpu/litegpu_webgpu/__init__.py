"""litegpu's WebGPU backend: kernels rendered as WGSL by litegpu.codegen, run through wgpu-py.

Runs on any WebGPU adapter wgpu-native finds: Vulkan, Metal, D3D12 (and GL), or Mesa's
lavapipe on a CPU (what CI uses). Registered under the ``litegpu.backends`` entry-point
group like any third-party backend; nothing here imports wgpu until the backend is asked
whether it is available.
"""
from __future__ import annotations

from litegpu.hookspecs import hookimpl


@hookimpl
def litegpu_backends():
    """The webgpu backend (it probes its device lazily, in ``available()``)."""
    from .backend import WebGpuBackend
    return [WebGpuBackend()]


@hookimpl
def litegpu_dialects():
    """The WGSL dialect its kernels render in."""
    from litegpu.codegen.wgsl import WGSL
    return [WGSL]
