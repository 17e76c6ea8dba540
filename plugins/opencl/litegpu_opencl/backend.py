"""The opencl backend: OpenCL C rendered by :mod:`litegpu.codegen`, built with pyopencl.

``available()`` opens the default device lazily (never at import or plugin load), so a
machine without pyopencl or without an OpenCL platform lists the backend as unavailable
with the reason, and models run on cpu.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from litegpu.backend import COMPLETE, Backend, CompileOptions, Event, NodeContext, Partition, Program, Support
from litegpu.codegen import Precision, planning
from litegpu.codegen.opencl import OPENCL
from litegpu.errors import BackendUnavailableError, InvalidArgumentError
from litegpu.graph import Model
from litegpu.ops import TensorSpec

from .build import build_source
from .device import Device, default_device
from .program import ClEvent, ClProgram, ClTensor, new_tensor, precision_for, read, write


class OpenClBackend(Backend):
    """See the module docstring."""

    name = "opencl"
    is_gpu = True
    gpu_priority = 10   # after cuda and metal, where those are available
    dialect = "opencl"
    host_memory = False

    def _default(self) -> Device:
        return default_device()

    def available(self) -> tuple[bool, str]:
        """Whether the default device opens; a device variable naming nothing raises instead."""
        try:
            self._default()
        except BackendUnavailableError as exc:
            return False, str(exc)
        return True, ""

    def device_info(self) -> dict:
        try:
            return self._default().info()
        except BackendUnavailableError as exc:
            return {"error": str(exc)}

    def device_for(self, options: CompileOptions) -> Device:
        """The user's device from the environment (``opencl_context``/``opencl_queue``), else the default."""
        context = options.extra.get("opencl_context")
        if context is not None:
            return Device.from_user(context, options.extra.get("opencl_queue"))
        return self._default()

    def supports(self, node: NodeContext, model: Model) -> Support:
        return planning.supports(node, model)

    def schedule(self, nodes: list[NodeContext], outputs: list[int]) -> list[list[int]]:
        """Each producer with the elementwise nodes folded into its kernel (see litegpu.codegen.fusion)."""
        return planning.schedule(nodes, outputs, OPENCL)

    def compile(self, partition: Partition, options: CompileOptions) -> Program:
        return ClProgram(self.device_for(options), partition, options)

    def offline_build(self, source: str) -> dict[str, bytes]:
        """Builds ``source`` on the default device when there is one that can (an F16 program
        needs ``cl_khr_fp16``), so a kernel that does not build is reported; the source is
        the artifact, so nothing is returned."""
        if self.available()[0] and (self._default().fp16 or "cl_khr_fp16" not in source):
            build_source(self._default(), source)
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
