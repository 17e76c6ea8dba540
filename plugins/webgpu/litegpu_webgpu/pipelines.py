"""Compute pipelines from WGSL sources, cached per source in memory.

Every kernel :mod:`litegpu.codegen.wgsl` renders is a whole shader module (entry point
``main``, its tensors as ``@group(0) @binding(j)`` storage arrays in argument order), so
a pipeline is made per distinct source, and the device's pipelines are kept by source:
identical kernels of one model, and of every model on the device, share one.

There is no disk cache: it would not pay. Parsing and validating a kernel's WGSL (naga)
takes 0.2-0.4 ms, and the WGSL is rendered afresh from the kernel tree anyway; what costs
is the driver turning it into machine code (lavapipe: 0.5-3 ms per kernel of the IR
tests), which WebGPU gives no way to store (wgpu-native's pipeline cache is not exposed
by wgpu-py).

Each pipeline gets an explicit layout whose bindings say what the shader declares
(``read`` or ``read_write``): WebGPU requires they match, and the runtime needs to know
which bindings a dispatch writes to keep one buffer from being bound read-only and
writable in the same dispatch (see :mod:`.arenas`).
"""
from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .device import is_loss

if TYPE_CHECKING:
    from .device import Device

log = logging.getLogger("litegpu.webgpu")

ENTRY_POINT = "main"
# How the WGSL renderer declares a tensor: ``@group(0) @binding(3) var<storage, read_write> t3: array<f32>;``
_BINDING = re.compile(r"@group\(0\)\s*@binding\((\d+)\)\s*var<storage,\s*(read_write|read)>")


class BuildFailed(Exception):
    """naga or the driver refused a WGSL source; the message is their log."""


def binding_writes(source: str) -> tuple[bool, ...]:
    """For each binding of ``source`` in order, whether the shader may write it."""
    found = sorted((int(j), access == "read_write") for j, access in _BINDING.findall(source))
    if [j for j, _ in found] != list(range(len(found))):
        raise BuildFailed(f"the WGSL module's storage bindings are not numbered 0..n-1: {[j for j, _ in found]}")
    return tuple(writes for _, writes in found)


@dataclass(frozen=True)
class Pipeline:
    """A compute pipeline with its bind group layout and each binding's access."""

    pipeline: Any
    layout: Any          # the wgpu.GPUBindGroupLayout of group 0
    writes: tuple[bool, ...]


class Pipelines:
    """One device's pipelines by source, with hit and miss counts and the time spent building."""

    def __init__(self, device: "Device") -> None:
        self.device = device
        self._by_source: dict[str, Pipeline] = {}
        self._layouts: dict[tuple[bool, ...], Any] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.build_seconds = 0.0

    def get(self, source: str) -> Pipeline:
        """The pipeline of ``source``; BuildFailed with naga's or the driver's message."""
        with self._lock:
            found = self._by_source.get(source)
            if found is not None:
                self.hits += 1
                return found
        start = time.perf_counter()
        built = self._build(source)
        with self._lock:
            self.misses += 1
            self.build_seconds += time.perf_counter() - start
            return self._by_source.setdefault(source, built)

    def _layout(self, writes: tuple[bool, ...]) -> Any:
        with self._lock:
            layout = self._layouts.get(writes)
        if layout is None:
            wgpu = self.device.wgpu
            entries = [{"binding": j, "visibility": wgpu.ShaderStage.COMPUTE,
                        "buffer": {"type": "storage" if w else "read-only-storage"}} for j, w in enumerate(writes)]
            layout = self.device.device.create_bind_group_layout(entries=entries)
            with self._lock:
                layout = self._layouts.setdefault(writes, layout)
        return layout

    def _build(self, source: str) -> Pipeline:
        device, wgpu = self.device, self.device.wgpu
        writes = binding_writes(source)
        if device.lost:
            raise device.lost_error("building a kernel")
        try:
            module = device.device.create_shader_module(code=source)
            layout = self._layout(writes)
            pipeline = device.device.create_compute_pipeline(
                layout=device.device.create_pipeline_layout(bind_group_layouts=[layout]),
                compute={"module": module, "entry_point": ENTRY_POINT})
        except wgpu.GPUError as exc:
            if is_loss(exc):
                device.mark_lost(str(exc))
                raise device.lost_error("building a kernel") from None
            raise BuildFailed(str(exc)) from None
        return Pipeline(pipeline, layout, writes)
