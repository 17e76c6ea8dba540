"""A compiled metal partition: one Metal library, one shared arena, a list of dispatches.

As on cuda and opencl, compile time does everything: the partition is rendered as one
MSL program (:mod:`litegpu.codegen.render`), compiled with ``newLibraryWithSource``, a
pipeline made per kernel, intermediates placed at offsets of one shared-storage buffer
and constants uploaded. A run encodes every dispatch into one command buffer (each
buffer bound at its tensor's byte offset), commits it and returns it as the event.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from litegpu.backend import CompileOptions, Event, Partition, Program
from litegpu.codegen import Precision, requested_precision
from litegpu.codegen.nodegen import StoredTensor
from litegpu.codegen.metal import METAL
from litegpu.codegen.render import assemble, build_failure, lifetimes, partition_kernels, running
from litegpu.errors import InvalidArgumentError
from litegpu.memory import Usage, plan_arena

from .runtime import CompileError, MetalDevice, MetalEvent

ALIGNMENT = 256   # every tensor's offset is as aligned as a buffer's start


@dataclass
class MetalTensor(StoredTensor):
    """A tensor in a shared-storage buffer: host and GPU see the same bytes."""

    buffer: Any
    shape: tuple[int, ...]
    dtype: np.dtype
    storage: np.dtype
    device: MetalDevice
    offset: int = 0


    def numpy(self) -> np.ndarray:
        """The tensor's bytes as a numpy view in its storage dtype (no copy)."""
        return self.device.view(self.buffer, self.offset, self.size, self.storage).reshape(self.shape)


def precision_for(options: CompileOptions) -> Precision:
    """F32 unless precision loss is allowed; then F16 (every Apple GPU computes in half), or
    F32_F16 when the ``half_arithmetic`` delegate option is False."""
    return requested_precision(options, True)


def new_tensor(device: MetalDevice, precision: Precision, shape, dtype, full_precision: bool = False) -> MetalTensor:
    """A tensor of ``shape``/``dtype`` stored as ``precision`` stores it."""
    storage = precision.storage_dtype(dtype, full_precision)
    shape = tuple(int(d) for d in shape)
    return MetalTensor(device.buffer(math.prod(shape) * storage.itemsize), shape, np.dtype(dtype), storage, device)


def _wait(events: Sequence[Event]) -> None:
    for e in events:
        e.wait()


def write(tensor: MetalTensor, array: np.ndarray, wait_for: Sequence[Event] = ()) -> None:
    """Copy a host array into the tensor (the host writes the shared bytes, after the GPU is done)."""
    host = np.asarray(array)
    if host.size != tensor.size:
        raise InvalidArgumentError(f"cannot write {host.size} elements into a Metal tensor of {tensor.size}")
    _wait(wait_for)
    tensor.numpy()[...] = host.reshape(tensor.shape).astype(tensor.storage, copy=False)


def read(tensor: MetalTensor, out: np.ndarray, wait_for: Sequence[Event] = ()) -> None:
    """Copy the tensor into a host array, once the GPU work it waits for is done."""
    if out.size != tensor.size:
        raise InvalidArgumentError(f"cannot read a Metal tensor of {tensor.size} elements into {out.size}")
    _wait(wait_for)
    out[...] = tensor.numpy().reshape(out.shape).astype(out.dtype, copy=False)


class _Dispatch:
    __slots__ = ("pipeline", "grid", "group", "args", "io", "name", "copy_of")

    def __init__(self, pipeline, grid, group, args, io, name, copy_of=None) -> None:
        self.pipeline, self.grid, self.group = pipeline, grid, group
        self.args = args   # [(buffer, byte offset)] per parameter; io ones are set per run
        self.io = io       # [(parameter position, tensor index)]
        self.name = name
        self.copy_of = copy_of   # see KernelSpec.copy_of


class MetalProgram(Program):
    """See the module docstring."""

    def __init__(self, device: MetalDevice, partition: Partition, options: CompileOptions) -> None:
        self.device = device
        self.precision = precision_for(options)
        self.inputs, self.outputs = list(partition.inputs), list(partition.outputs)
        specs = partition.specs
        step_kernels = partition_kernels(partition, self.precision, METAL)
        source, self.function_count = assemble(step_kernels, self.precision, METAL)
        try:
            library = device.library(source)
        except CompileError as exc:
            raise build_failure(partition, step_kernels, self.precision, METAL, device.library, str(exc)) from None
        io = set(self.inputs) | set(self.outputs)
        plan = plan_arena([Usage(t, self.precision.nbytes_of(specs[t]), f, l)
                           for t, (f, l) in lifetimes(step_kernels, io, specs).items()], alignment=ALIGNMENT)
        self.arena_bytes = plan.size
        self.arena = device.buffer(plan.size)
        self.io_layout = {t: self.precision.layout_of(specs[t]) for t in io}
        self.const_bytes = 0
        self._constants: list[Any] = []
        consts: dict[int, Any] = {}
        pipelines: dict[str, Any] = {}
        self.dispatches: list[_Dispatch] = []
        for kernels in step_kernels:
            for k in kernels:
                if any(g == 0 for g in k.global_size):
                    continue
                name = f"k_{k.digest}"
                if name not in pipelines:
                    pipelines[name] = device.pipeline(library, name)
                pipeline = pipelines[name]
                args, io_args = [], []
                for n, a in enumerate(k.args):
                    if a.tensor is not None and a.tensor in io:
                        io_args.append((n, a.tensor))
                        args.append((None, 0))
                    elif a.tensor is not None and specs[a.tensor].value is not None:
                        if a.tensor not in consts:
                            spec = specs[a.tensor]
                            consts[a.tensor] = self._upload(np.asarray(spec.value).astype(self.precision.storage_of(spec)))
                        args.append((consts[a.tensor], 0))
                    elif a.tensor is not None:
                        args.append((self.arena, plan.offsets[a.tensor]))
                    else:
                        args.append((self._upload(a.const), 0))
                group = k.local_size or (min(int(pipeline.threadExecutionWidth()), k.global_size[0]),)
                self.dispatches.append(_Dispatch(pipeline, device.size(k.global_size), device.size(group),
                                                 args, io_args, name, k.copy_of))
        self._copies = [d for d in self.dispatches if d.copy_of]

    def _upload(self, array: np.ndarray) -> Any:
        array = np.ascontiguousarray(array)
        buf = self.device.buffer(array.nbytes)
        if array.nbytes:
            self.device.view(buf, 0, array.size, array.dtype)[...] = array.reshape(-1)
        self._constants.append(buf)
        self.const_bytes += array.nbytes
        return buf

    @property
    def summary(self) -> str:
        """Precision, kernels and memory, for the delegation report."""
        p = self.precision
        return (f"{p.name} ({p.storage} storage, {p.arithmetic} arithmetic), {len(self.dispatches)} dispatches of "
                f"{self.function_count} kernels, arena {self.arena_bytes / 1e6:.2f} MB, "
                f"constants {self.const_bytes / 1e6:.2f} MB")

    def run(self, inputs: Sequence[MetalTensor], outputs: Sequence[MetalTensor], wait_for: Sequence[Event] = ()
            ) -> Event:
        """Encode and commit the dispatches a run makes (:func:`running`) in one command
        buffer; it is the event.

        Command buffers of the one queue run in order, so earlier metal work needs no
        wait; anything else in ``wait_for`` is waited for here.
        """
        _wait([e for e in wait_for if not isinstance(e, MetalEvent)])
        bound = dict(zip(self.inputs, inputs)) | dict(zip(self.outputs, outputs))
        for t, x in bound.items():
            MetalTensor.check_binding(t, x, self.io_layout[t])
        command_buffer = self.device.queue.commandBuffer()
        encoder = command_buffer.computeCommandEncoder()
        for d in running(self.dispatches, self._copies, bound):
            encoder.setComputePipelineState_(d.pipeline)
            for pos, (buf, offset) in enumerate(d.args):
                encoder.setBuffer_offset_atIndex_(buf, offset, pos)
            for pos, t in d.io:
                encoder.setBuffer_offset_atIndex_(bound[t].buffer, bound[t].offset, pos)
            encoder.dispatchThreads_threadsPerThreadgroup_(d.grid, d.group)
        encoder.endEncoding()
        command_buffer.commit()
        return MetalEvent(command_buffer)
