"""A compiled webgpu partition: a pipeline per distinct kernel, a few arenas, a flat list of launches.

Compile time does everything, as on the other GPU backends: each step's kernels are
rendered as WGSL modules (:func:`litegpu.codegen.render.partition_kernels` in the
device's dialect), a pipeline is made per distinct source (cached on the device, see
:mod:`.pipelines`), intermediates get offsets in arenas planned by lifetime (see
:mod:`.arenas`), constants are uploaded into packed read-only buffers, and every launch
gets its fixed bindings. A run binds the partition's input and output tensors
(:class:`~litegpu_webgpu.tensor.WgpuTensor`; the executor does the host copies), records
the launches into one command buffer, submits it and returns its event at once.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Sequence

import numpy as np

from litegpu import progress
from litegpu.backend import CompileOptions, Event, Partition, Program
from litegpu.codegen import Precision, requested_precision
from litegpu.codegen.nodegen import KernelSpec
from litegpu.codegen.render import (IoBindings, assemble, build_failure, kernel_lanes, launched, lifetimes,
                                    partition_kernels)
from litegpu.codegen.wgsl import WgslDialect
from litegpu.errors import InvalidArgumentError, UnsupportedError
from litegpu.memory import Usage

from . import arenas
from .device import Device
from .dispatch import Binding, Launch, groups_of, submit
from .fence import WebGpuEvent
from .pipelines import BuildFailed
from .tensor import WgpuTensor, host_bytes, round4, storage_dtype
from .timing import MAX_TIMED_DISPATCHES, Timestamps

log = logging.getLogger("litegpu.webgpu")

#: Makes a partition's kernels: (precision, dialect) -> kernels per step.
KernelSource = Callable[[Precision, WgslDialect], list[list[KernelSpec]]]


def precision_for(device: Device, options: CompileOptions) -> tuple[Precision, str]:
    """The precision mode a program runs in, and a note when it is not what was asked for.

    F32 unless precision loss is allowed; then F16 (or F32_F16, see
    :data:`litegpu.codegen.HALF_ARITHMETIC`) where the device has ``shader-f16``, without
    which WGSL has no half type at all."""
    if not options.precision_loss_allowed:
        return Precision(), ""
    if not device.f16:
        return Precision(), "; precision loss allowed, but the device has no shader-f16"
    return requested_precision(options, True), ""


class WebGpuProgram(Program):
    """See the module docstring. ``kernels`` replaces the rendering of the partition's
    kernels (tests run hand-built kernels through a real partition with it)."""

    def __init__(self, device: Device, partition: Partition, options: CompileOptions,
                 kernels: KernelSource | None = None) -> None:
        self.device = device
        self.partition = partition
        self.precision, self._note = precision_for(device, options)
        self.inputs, self.outputs = list(partition.inputs), list(partition.outputs)
        specs = partition.specs
        progress.report(f"webgpu: generating kernels for {len(partition.nodes)} nodes")
        make = kernels or (lambda precision, dialect: partition_kernels(
            partition, precision, dialect, kernel_lanes(device.is_cpu)))
        step_kernels = make(self.precision, device.dialect)
        built_before = device.pipelines.misses
        pipelines = self._pipelines(partition, step_kernels)
        self.pipelines_built = device.pipelines.misses - built_before
        io = set(self.inputs) | set(self.outputs)
        self._storage = {t: storage_dtype(self.precision, specs[t].dtype, specs[t].full_precision)
                         for t in io | set(lifetimes(step_kernels, io, specs))}
        # What each input/output buffer must hold: (elements, storage dtype).
        self.io_layout = {t: (int(np.prod(specs[t].shape, dtype=np.int64)), self._storage[t]) for t in io}
        self.arena = self._plan(step_kernels, pipelines, io, specs)
        self._arenas = [self._buffer(size) for size in self.arena.sizes]
        self._constants, self._const_buffers = self._upload_constants(step_kernels, io, specs)
        self.const_bytes = sum(b.size for b in self._constants.values())
        self.launches: list[Launch] = []
        self.launches = [self._launch(k, pipelines[k.source], io, specs, nodes)
                         for k, nodes in launched(partition, step_kernels)]
        self._io = IoBindings(self.launches)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("WebGPU program: %s", "; ".join(
                f"{launch.name} for {'+'.join(f'{c.node.index} {c.node.op}' for c in launch.nodes)}"
                for launch in self.launches))

    # -- compile ------------------------------------------------------------------------------------
    def _pipelines(self, partition: Partition, step_kernels: list[list[KernelSpec]]) -> dict[str, Any]:
        """Each distinct source's pipeline; KernelBuildError naming the node whose kernel fails."""
        pipelines: dict[str, Any] = {}
        try:
            for kernels in step_kernels:
                for k in kernels:
                    if k.source not in pipelines:
                        pipelines[k.source] = self.device.pipelines.get(k.source)
        except BuildFailed as exc:
            modules = self.device.dialect
            by_step = {assemble([kernels], self.precision, modules)[0]: kernels for kernels in step_kernels}

            def build_step(source: str) -> None:
                for k in by_step.get(source, ()):
                    self.device.pipelines.get(k.source)
            raise build_failure(partition, step_kernels, self.precision, modules, build_step, str(exc)) from None
        return pipelines

    def _plan(self, step_kernels, pipelines, io: set[int], specs) -> arenas.ArenaPlan:
        """The arenas of the intermediates (see :mod:`.arenas`)."""
        used = lifetimes(step_kernels, io, specs)
        dispatches = []
        for kernels in step_kernels:
            for k in kernels:
                writes = pipelines[k.source].writes
                tensors = [(a.tensor, w) for a, w in zip(k.args, writes) if a.tensor in used]
                dispatches.append(({t for t, w in tensors if not w}, {t for t, w in tensors if w}))
        usages = [Usage(t, round4(self._nbytes(t, specs)), first, last) for t, (first, last) in used.items()]
        return arenas.plan(usages, dispatches, self.device.offset_alignment, self.device.max_buffer)

    def _nbytes(self, t: int, specs) -> int:
        return int(np.prod(specs[t].shape, dtype=np.int64)) * self._storage[t].itemsize

    def _buffer(self, nbytes: int) -> Any:
        usage = self.device.wgpu.BufferUsage
        with self.device.calls("allocating the arena"):
            return self.device.device.create_buffer(size=round4(nbytes), usage=usage.STORAGE)

    def _constant_data(self, a, io: set[int], specs) -> tuple[Any, np.ndarray] | None:
        """(key, bytes) of argument ``a`` when it is a constant: a constant tensor of the model
        (converted to its storage dtype) or an array the generator made (already in its
        WGSL storage dtype)."""
        if a.tensor is None:
            return ("array", id(a.const)), host_bytes(a.const, a.const.dtype)
        if a.tensor not in io and specs[a.tensor].value is not None:
            return ("tensor", a.tensor), host_bytes(np.asarray(specs[a.tensor].value), self._storage_of(a.tensor, specs))
        return None

    def _upload_constants(self, step_kernels, io: set[int], specs) -> tuple[dict[Any, Binding], list[Any]]:
        """Every constant's binding, packed into as few read-only buffers as the device's
        buffer size allows, each at an aligned offset (only read, so sharing costs nothing)."""
        found: dict[Any, np.ndarray] = {}
        for kernels in step_kernels:
            for k in kernels:
                for a in k.args:
                    constant = self._constant_data(a, io, specs)
                    if constant is not None:
                        found.setdefault(*constant)
        align, limit = self.device.offset_alignment, self.device.max_buffer
        chunks: list[list[tuple[Any, int, np.ndarray]]] = [[]]
        end = 0
        for key, data in found.items():
            offset = -(-end // align) * align
            if offset + data.nbytes > limit and chunks[-1]:
                chunks.append([])
                offset = 0
            chunks[-1].append((key, offset, data))
            end = offset + data.nbytes
        bindings, buffers = {}, []
        usage = self.device.wgpu.BufferUsage
        for chunk in filter(None, chunks):
            packed = np.zeros(round4(chunk[-1][1] + chunk[-1][2].nbytes), np.uint8)
            for _, offset, data in chunk:
                packed[offset:offset + data.nbytes] = data
            with self.device.calls("uploading constants"):
                buffer = self.device.device.create_buffer_with_data(data=packed, usage=usage.STORAGE)
            buffers.append(buffer)
            bindings.update((key, Binding(buffer, offset, data.nbytes)) for key, offset, data in chunk)
        return bindings, buffers

    def _launch(self, k: KernelSpec, pipeline, io: set[int], specs, nodes) -> Launch:
        """The launch of ``k`` with every binding fixed but the partition's inputs and outputs."""
        if len(k.args) != len(pipeline.writes):
            ctx = nodes[0]
            raise UnsupportedError(f"node {ctx.node.index} ({ctx.node.op}): its webgpu kernel declares "
                                   f"{len(pipeline.writes)} bindings for {len(k.args)} arguments")
        bindings: list[Binding | None] = []
        io_args = []
        for j, a in enumerate(k.args):
            constant = self._constant_data(a, io, specs)
            if constant is not None:
                bindings.append(self._constants[constant[0]])
            elif a.tensor in io:    # bound per run
                io_args.append((j, a.tensor))
                bindings.append(None)
            else:
                buffer, offset = self.arena.placement[a.tensor]
                bindings.append(Binding(self._arenas[buffer], offset, round4(self._nbytes(a.tensor, specs))))
        for b in bindings:
            if b is not None and b.size > self.device.max_binding:
                ctx = nodes[0]
                raise UnsupportedError(f"node {ctx.node.index} ({ctx.node.op}): its webgpu kernel binds "
                                       f"{b.size} bytes; {self.device.name} binds at most "
                                       f"{self.device.max_binding} (maxStorageBufferBindingSize)")
        return Launch(pipeline, groups_of(k, self.device), bindings, io_args, f"k_{k.digest}", nodes, k.copy_of)

    def _storage_of(self, t: int, specs) -> np.dtype:
        return storage_dtype(self.precision, specs[t].dtype, specs[t].full_precision)

    @property
    def summary(self) -> str:
        """Precision, kernels and memory, for the delegation report."""
        p = self.precision
        cached = len({id(launch.pipeline) for launch in self.launches}) - self.pipelines_built
        return (f"{p.name} ({p.storage} storage, {p.arithmetic} arithmetic{self._note}), {len(self.launches)} "
                f"dispatches, {self.pipelines_built} pipelines built + {max(cached, 0)} cached, "
                f"{len(self._arenas)} arenas {self.arena.total / 1e6:.2f} MB, "
                f"constants {self.const_bytes / 1e6:.2f} MB")

    # -- running ------------------------------------------------------------------------------------
    def run(self, inputs: Sequence[WgpuTensor], outputs: Sequence[WgpuTensor],
            wait_for: Sequence[Event] = ()) -> WebGpuEvent:
        """Submit the partition on device tensors (inputs and outputs in partition order).

        Returns at once with the submission's event. Work submitted earlier to this device's
        queue comes first anyway; events of the host, other backends or other devices are
        waited for here."""
        self._prepare(inputs, outputs, wait_for)
        return submit(self.device, self._io.running)

    def kernels(self) -> list[tuple[tuple[int, ...], str]]:
        """Each launch's nodes (a producer and its folded followers) and its kernel function."""
        return [(tuple(c.node.index for c in launch.nodes), launch.name) for launch in self.launches]

    def run_profiled(self, inputs: Sequence[WgpuTensor], outputs: Sequence[WgpuTensor], wait_for: Sequence[Event],
                     profiler) -> WebGpuEvent | None:
        """:meth:`run` with each dispatch's device time recorded into ``profiler`` (a
        ``litegpu.profile.Profiler``) from timestamp queries (see :mod:`.timing`); None,
        having run nothing, on a device without ``timestamp-query`` (the profiler then
        times the partition as a whole)."""
        from litegpu.profile import Slice, node_info, nodes_label
        if "timestamp-query" not in self.device.features or not 0 < len(self.launches) <= MAX_TIMED_DISPATCHES:
            return None
        self._prepare(inputs, outputs, wait_for)
        launches = self._io.running
        with self.device.calls("preparing timestamp queries"):
            stamps = Timestamps(self.device, len(launches))
        submitted = time.perf_counter()
        stamps.event = submit(self.device, launches, stamps)
        track = f"queue ({self.device.name})"
        for j, launch in enumerate(launches):
            infos = tuple(node_info(c) for c in launch.nodes)
            profiler.add_device(stamps.dispatch(j), submitted, Slice(
                nodes_label(infos), "kernel", "webgpu", track, 0.0, 0.0, infos, "webgpu",
                {"kernel": launch.name, "groups": list(launch.groups), "precision": self.precision.name,
                 "first": j == 0}))
        return stamps.event

    def _prepare(self, inputs: Sequence[WgpuTensor], outputs: Sequence[WgpuTensor], wait_for: Sequence[Event]) -> None:
        """Wait for what the queue does not order (see :meth:`run`) and bind the run's tensors."""
        for e in wait_for:
            if not (isinstance(e, WebGpuEvent) and e.device is self.device):
                e.wait()
        self._io.bind((*self.inputs, *self.outputs), (*inputs, *outputs), self._attach)

    def _attach(self, t: int, tensor: WgpuTensor, uses) -> None:
        WgpuTensor.check_binding(t, tensor, self.io_layout[t])
        if tensor.device is not self.device:
            raise InvalidArgumentError(f"tensor {t}: its buffer belongs to another WebGPU device than the program's")
        binding = Binding(tensor.buffer, tensor.offset, tensor.binding_size)
        for launch, position in uses:
            launch.bind(position, binding)
