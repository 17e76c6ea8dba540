"""Launches and their submission: one command encoder, one compute pass, one submit per run.

A :class:`Launch` is one kernel with its pipeline, the groups it dispatches and what each
of its bindings covers (a buffer, an offset, a size). Its bind group is made when first
needed and again only when its bindings change to ones it has not had just before (a
run binding other input or output tensors; the last two groups are kept).
:func:`submit` records every launch of a run into one compute pass (WebGPU orders the
dispatches of a pass: each sees what the one before wrote), ends the command buffer with
the fence copy (see :mod:`.fence`) and submits it once.

:func:`run_kernels` runs rendered kernels on given device tensors without a partition:
what a program does per run, for tests and tools.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from litegpu.codegen.nodegen import KernelSpec
from litegpu.codegen.wgsl import launch as launch_size
from litegpu.errors import InvalidArgumentError, UnsupportedError

from .fence import FENCE_BYTES, WebGpuEvent
from .pipelines import Pipeline
from .tensor import WgpuTensor

if TYPE_CHECKING:
    from .device import Device
    from .timing import Timestamps


@dataclass(frozen=True)
class Binding:
    """What one binding covers: ``size`` bytes of ``buffer`` from byte ``offset``."""

    buffer: Any
    offset: int
    size: int


class Launch:
    """One dispatch of a kernel (see the module docstring)."""

    __slots__ = ("pipeline", "groups", "bindings", "io", "name", "nodes", "copy_of", "_group", "_made")

    def __init__(self, pipeline: Pipeline, groups: tuple[int, int, int], bindings: list[Binding | None],
                 io: list[tuple[int, int]] = (), name: str = "", nodes: Sequence = (),
                 copy_of: tuple[int, int] | None = None) -> None:
        self.pipeline = pipeline
        self.groups = groups
        self.bindings = bindings     # per binding; None for an I/O tensor not bound yet
        self.io = list(io)           # [(binding, tensor index)] bound per run
        self.name = name
        self.nodes = nodes           # the NodeContexts of the step it belongs to
        self.copy_of = copy_of       # see KernelSpec.copy_of
        self._group: Any = None
        # The last two bind groups made, by their bindings: a decoder's steps alternate two
        # KV caches, and would otherwise make their groups again every step.
        self._made: dict[tuple, Any] = {}

    def bind(self, position: int, binding: Binding) -> None:
        """Point binding ``position`` at ``binding`` (the bind group is made again when used)."""
        if self.bindings[position] != binding:
            self.bindings[position] = binding
            self._group = None

    def bind_group(self, device: "Device") -> Any:
        """The bind group of the current bindings."""
        if self._group is None:
            key = tuple(self.bindings)
            self._group = self._made.get(key)
            if self._group is None:
                entries = [{"binding": j, "resource": {"buffer": b.buffer, "offset": b.offset, "size": b.size}}
                           for j, b in enumerate(self.bindings)]
                self._group = self._made[key] = device.device.create_bind_group(layout=self.pipeline.layout,
                                                                                entries=entries)
                if len(self._made) > 2:
                    del self._made[next(iter(self._made))]
        return self._group


def groups_of(spec: KernelSpec, device: "Device") -> tuple[int, int, int]:
    """The groups ``spec`` dispatches along each axis; UnsupportedError past the device's limit."""
    _, groups, _ = launch_size(spec.global_size, spec.local_size)
    limit = int(device.limits["max-compute-workgroups-per-dimension"])
    if max(groups) > limit:
        raise UnsupportedError(f"the kernel dispatches {groups} groups; {device.name} allows {limit} per dimension")
    return groups


def submit(device: "Device", launches: Sequence[Launch], timestamps: "Timestamps | None" = None) -> WebGpuEvent:
    """Record ``launches`` into one command buffer and submit it; the event of its completion.

    With ``timestamps`` (profiling, see :mod:`.timing`) each launch gets a compute pass of
    its own whose beginning and end the device stamps: WebGPU stamps passes, not dispatches."""
    with device.calls("running a partition"):
        fence = device.fences.acquire()
        encoder = device.device.create_command_encoder()
        passes = [[launch] for launch in launches] if timestamps else [list(launches)] if launches else []
        for j, group in enumerate(passes):
            compute = encoder.begin_compute_pass(timestamp_writes=timestamps.writes(j) if timestamps else None)
            for launch in group:
                compute.set_pipeline(launch.pipeline.pipeline)
                compute.set_bind_group(0, launch.bind_group(device))
                compute.dispatch_workgroups(*launch.groups)
            compute.end()
        if timestamps:
            timestamps.resolve(encoder)
        encoder.copy_buffer_to_buffer(device.fences.source(), 0, fence, 0, FENCE_BYTES)
        device.queue.submit([encoder.finish()])
        return device.fences.track(fence)


def run_kernels(device: "Device", kernels: Sequence[tuple[KernelSpec, Sequence[WgpuTensor]]]) -> WebGpuEvent:
    """Run each WGSL kernel on its tensors (one per binding, in order) as one submission.

    No partition and no arena: the caller owns the tensors (from
    :func:`litegpu_webgpu.tensor.new_tensor` or ``Backend.wrap``). A tensor may be a view at
    an offset of a larger buffer (a multiple of the device's offset alignment). Raises
    ``BuildFailed`` for a kernel that does not build."""
    launches = []
    for spec, tensors in kernels:
        pipeline = device.pipelines.get(spec.source)
        if len(tensors) != len(pipeline.writes):
            raise InvalidArgumentError(f"the kernel binds {len(pipeline.writes)} tensors, {len(tensors)} given")
        for t in tensors:
            if t.offset % device.offset_alignment:
                raise InvalidArgumentError(f"a binding offset of {t.offset} bytes is not a multiple of "
                                           f"{device.offset_alignment} (minStorageBufferOffsetAlignment)")
        bindings = [Binding(t.buffer, t.offset, t.binding_size) for t in tensors]
        if all(g > 0 for g in spec.global_size):
            launches.append(Launch(pipeline, groups_of(spec, device), bindings))
    return submit(device, launches)
