"""The webgpu backend: WGSL rendered by :mod:`litegpu.codegen`, run through wgpu-py.

``available()`` opens the device lazily (never at import or plugin load), so a machine
without wgpu or without a WebGPU adapter lists the backend as unavailable with the
reason, and models run on cpu.

Its ``gpu_priority`` (5) puts it after cuda (30), metal (20) and opencl (10): "GPU" takes
WebGPU where no native runtime is there (a GPU without an OpenCL driver, D3D12 on
Windows). The same kernels render for all of them, but WGSL caps vectors at 4 lanes
(the native tiles use 8 and 16), WebGPU bounds-checks every storage access and validates
every submission, and it has no 64-bit integers. Measured on the only devices at hand, CPU
ones that "GPU" passes over anyway: lavapipe ran the shared models 5-40x slower than
PoCL on the same cores. On a GPU the acceptance script (benchmarks/gpu_acceptance.py)
times every backend side by side; the order is to be revisited with its numbers.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from litegpu.backend import COMPLETE, CompileOptions, Event, NodeContext, Partition, Program, Support
from litegpu.codegen import Precision
from litegpu.codegen.backend import CodegenBackend
from litegpu.codegen.render import kernel_lanes
from litegpu.codegen.wgsl import WgslDialect, modules
from litegpu.errors import BackendUnavailableError, InvalidArgumentError
from litegpu.graph import Model
from litegpu.ops import TensorSpec

from .device import Device, current_device, import_wgpu, user_device
from .fence import WebGpuEvent
from .program import WebGpuProgram, precision_for
from .tensor import WgpuTensor, new_tensor, read, round4, storage_dtype, write

#: ``CompileOptions.extra`` (Environment) key: a user's ``wgpu.GPUDevice`` to run on
#: (buffers the user wraps must belong to it).
DEVICE_OPTION = "webgpu_device"


class WebGpuBackend(CodegenBackend):
    """See the module docstring."""

    name = "webgpu"
    gpu_priority = 5   # below opencl (10) until the kernels are ported to the IR
    dialect = "wgsl"

    def open_device(self) -> Device:
        """The default device; a device variable naming nothing raises InvalidArgumentError."""
        return current_device()

    def device_for(self, options: CompileOptions) -> Device:
        """The user's device from the environment (``webgpu_device``), else the default."""
        given = options.extra.get(DEVICE_OPTION)
        return user_device(given) if given is not None else self.open_device()

    def offline_build(self, source: str) -> dict[str, bytes]:
        """Validates each module of ``source`` by building its pipeline on the default device
        (naga checks the WGSL), so a kernel that does not build is reported; the source is
        the artifact. BackendUnavailableError where there is no WebGPU adapter."""
        ok, why = self.available()
        if not ok:
            raise BackendUnavailableError(f"WGSL is checked on a WebGPU device ({why})")
        pipelines = self.open_device().pipelines
        for module in modules(source):
            pipelines.get(module)   # BuildFailed carries naga's log
        return {}

    def dialect_object(self) -> WgslDialect:
        """WGSL with the default device's storage-buffer limit."""
        return self.open_device().dialect

    def supports(self, node: NodeContext, model: Model) -> Support:
        """As every codegen backend, and no tensor over the device's binding size (even in F32)."""
        device = self.open_device()
        for spec in (*node.inputs, *node.outputs):
            if spec is None or spec.shape is None or any(d is None or d < 0 for d in spec.shape):
                continue
            nbytes = round4(int(np.prod(spec.shape, dtype=np.int64)) * storage_dtype(Precision(), spec.dtype).itemsize)
            if nbytes > device.max_binding:
                return Support(False, f"a tensor of shape {list(spec.shape)} takes {nbytes} bytes; {device.name} "
                                      f"binds at most {device.max_binding} (maxStorageBufferBindingSize)")
        return super().supports(node, model)

    def kernel_lanes(self) -> int:
        """One work-item a row on a CPU device (lavapipe), a GPU's lanes on a GPU."""
        return kernel_lanes(self.open_device().is_cpu)

    def compile(self, partition: Partition, options: CompileOptions) -> Program:
        return WebGpuProgram(self.device_for(options), partition, options)

    # -- device memory -------------------------------------------------------------------------
    def allocate(self, spec: TensorSpec, options: CompileOptions) -> WgpuTensor:
        device = self.device_for(options)
        return new_tensor(device, precision_for(device, options)[0], spec.shape, spec.dtype, spec.full_precision)

    def wrap(self, native: Any, spec: TensorSpec, options: CompileOptions) -> WgpuTensor:
        """A tensor around a user's ``wgpu.GPUBuffer`` (usage STORAGE, COPY_SRC and COPY_DST)
        holding ``spec``'s elements in their WGSL storage type, F32 (8- and 16-bit integers
        and bool as 32 bits each). The buffer must belong to the device the model runs on
        (the Environment's ``webgpu_device``, else the default device)."""
        device = self.device_for(options)
        wgpu = import_wgpu()
        if not isinstance(native, wgpu.GPUBuffer):
            raise InvalidArgumentError(f"a {type(native).__name__} is not a wgpu.GPUBuffer")
        usage = wgpu.BufferUsage
        needed = usage.STORAGE | usage.COPY_SRC | usage.COPY_DST
        if native.usage & needed != needed:
            raise InvalidArgumentError(f"the GPUBuffer's usage {native.usage} lacks STORAGE, COPY_SRC or COPY_DST")
        # wgpu-py keeps a buffer's device only privately; a foreign buffer would otherwise
        # surface as a validation error at the first run.
        owner = getattr(native, "_device", None)
        if owner is not None and owner is not device.device:
            raise InvalidArgumentError("the GPUBuffer belongs to another WebGPU device than the model's "
                                       f"(pass that device as the Environment's {DEVICE_OPTION})")
        storage = storage_dtype(Precision(), spec.dtype)
        tensor = WgpuTensor(native, tuple(int(d) for d in spec.shape), np.dtype(spec.dtype), storage, device)
        if native.size < tensor.binding_size:
            raise InvalidArgumentError(f"the GPUBuffer has {native.size} bytes; a {spec.dtype} tensor of shape "
                                       f"{list(spec.shape)} stored as {storage} needs {tensor.binding_size}")
        return tensor

    def nbytes(self, buffer: WgpuTensor) -> int:
        return buffer.nbytes

    def copy_in(self, buffer: WgpuTensor, array: np.ndarray, wait_for: Sequence[Event] = ()) -> Event:
        _wait_foreign(buffer.device, wait_for)
        write(buffer, array)
        return COMPLETE

    def copy_out(self, buffer: WgpuTensor, array: np.ndarray, wait_for: Sequence[Event] = ()) -> Event:
        _wait_foreign(buffer.device, wait_for)
        read(buffer, array)
        return COMPLETE


def _wait_foreign(device: Device, events: Sequence[Event]) -> None:
    """Wait for the events that the device's queue does not order by itself (the host's,
    other backends', other devices'); this device's own runs come first anyway."""
    for e in events:
        if not (isinstance(e, WebGpuEvent) and e.device is device):
            e.wait()
