"""The opencl backend: OpenCL C rendered by :mod:`litegpu.codegen`, built with pyopencl.

``available()`` opens the default device lazily (never at import or plugin load), so a
machine without pyopencl or without an OpenCL platform lists the backend as unavailable
with the reason, and models run on cpu.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from litegpu.backend import COMPLETE, CompileOptions, Event, Partition, Program
from litegpu.codegen import Precision
from litegpu.codegen.backend import CodegenBackend
from litegpu.codegen.render import kernel_lanes
from litegpu.errors import InvalidArgumentError
from litegpu.ops import TensorSpec

from .build import build_source
from .device import Device, default_device
from .program import ClEvent, ClProgram, ClTensor, new_tensor, precision_for, read, write


class OpenClBackend(CodegenBackend):
    """See the module docstring."""

    name = "opencl"
    gpu_priority = 10   # after cuda and metal, where those are available
    dialect = "opencl"

    def open_device(self) -> Device:
        """The default device; a device variable naming nothing raises InvalidArgumentError."""
        return default_device()

    def device_for(self, options: CompileOptions) -> Device:
        """The user's device from the environment (``opencl_context``/``opencl_queue``), else the default."""
        context = options.extra.get("opencl_context")
        if context is not None:
            return Device.from_user(context, options.extra.get("opencl_queue"))
        return self.open_device()

    def kernel_lanes(self) -> int:
        """One work-item a row on a CPU device (PoCL), a GPU's lanes on a GPU."""
        return kernel_lanes(not self.open_device().is_gpu)

    def compile(self, partition: Partition, options: CompileOptions) -> Program:
        return ClProgram(self.device_for(options), partition, options)

    def offline_build(self, source: str) -> dict[str, bytes]:
        """Builds ``source`` on the default device when there is one that can (an F16 program
        needs ``cl_khr_fp16``), so a kernel that does not build is reported; the source is
        the artifact, so nothing is returned."""
        if self.available()[0] and (self.open_device().fp16 or "cl_khr_fp16" not in source):
            build_source(self.open_device(), source)
        return {}

    # -- device memory ---------------------------------------------------------------------
    def allocate(self, spec: TensorSpec, options: CompileOptions) -> ClTensor:
        device = self.device_for(options)
        return new_tensor(device, precision_for(device, options), spec.shape, spec.dtype, spec.full_precision)

    def wrap(self, native: Any, spec: TensorSpec, options: CompileOptions) -> ClTensor:
        """A tensor around a user's ``pyopencl.Buffer`` holding ``spec.dtype`` elements."""
        device = self.device_for(options)
        storage = Precision().storage_dtype(spec.dtype)
        tensor = ClTensor(native, tuple(spec.shape), np.dtype(spec.dtype), storage, device)
        if native.size < tensor.nbytes:
            raise InvalidArgumentError(f"the OpenCL buffer has {native.size} bytes; a {spec.dtype} tensor of "
                                       f"shape {list(spec.shape)} needs {tensor.nbytes}")
        return tensor

    def nbytes(self, buffer: ClTensor) -> int:
        return buffer.nbytes

    def copy_in(self, buffer: ClTensor, array: np.ndarray, wait_for: Sequence[Event] = ()) -> Event:
        write(buffer, array, _device_events(wait_for))
        return COMPLETE

    def copy_out(self, buffer: ClTensor, array: np.ndarray, wait_for: Sequence[Event] = ()) -> Event:
        read(buffer, array, _device_events(wait_for))
        return COMPLETE


def _device_events(events: Sequence[Event]) -> list | None:
    """OpenCL events to order a command after (the device waits); other events are waited for here."""
    out = []
    for e in events:
        if isinstance(e, ClEvent):
            out.append(e.event)
        else:
            e.wait()
    return out or None
