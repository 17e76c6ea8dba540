"""The opencl backend: OpenCL C generated per node, built with pyopencl.

``available()`` opens the default device lazily (never at import or plugin load), so a
machine without pyopencl or without an OpenCL platform lists the backend as unavailable
with the reason, and models run on cpu.
"""
from __future__ import annotations

import numpy as np

from typing import Any, Sequence

from litegpu.backend import COMPLETE, Backend, CompileOptions, Event, NodeContext, Partition, Program, Support
from litegpu.errors import BackendUnavailableError, InvalidArgumentError, LiteGpuError
from litegpu.graph import Model
from litegpu.ops import TensorSpec

from .codegen import Precision
from .device import Device, default_device
from .fusion import chain_steps
from .kernels import Decline, load_all
from .program import ClEvent, ClProgram, ClTensor, generate, new_tensor, precision_for, read, write

_OK_DTYPES = {np.dtype(t) for t in (np.float32, np.int32, np.int64, np.bool_, np.uint8, np.int8, np.int16)}


class OpenClBackend(Backend):
    """See the module docstring."""

    name = "opencl"
    is_gpu = True
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
        if node.dynamic:
            # The core names the node an unknown shape comes from; without it the shape
            # depends on this node's own input values.
            return Support(False, node.dynamic_reason or "output shape depends on tensor values (dynamic)")
        for spec in (*node.inputs, *node.outputs):
            if spec is not None and spec.dtype not in _OK_DTYPES:
                return Support(False, f"tensor type {spec.dtype} is not supported")
        # Quantized models run here in their float view (litegpu.float_view), where only
        # the edges' QUANTIZE/DEQUANTIZE touch integers; integer arithmetic stays on cpu.
        if "quant" in node.attrs and node.node.op not in ("QUANTIZE", "DEQUANTIZE"):
            return Support(False, "quantized integer arithmetic runs on cpu (GPUs run the model's float view)")
        generators = load_all()
        if node.node.op not in generators:
            return Support(False, "operation is not supported")
        specs = {t: s for t, s in zip(node.node.inputs, node.inputs) if t >= 0 and s is not None}
        specs.update(zip(node.node.outputs, node.outputs))
        try:
            generate(node, Precision(), specs)
        except Decline as exc:
            return Support(False, str(exc))
        except (KeyError, LiteGpuError) as exc:
            return Support(False, f"no kernel for this variant: {exc}")
        return Support(True)

    def schedule(self, nodes: list[NodeContext], outputs: list[int]) -> list[list[int]]:
        """Each producer with the elementwise nodes folded into its kernel (see fusion)."""
        load_all()
        return chain_steps(nodes, outputs)

    def compile(self, partition: Partition, options: CompileOptions) -> Program:
        return ClProgram(self.device_for(options), partition, options)

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
