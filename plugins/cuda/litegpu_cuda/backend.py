"""The cuda backend: CUDA C++ rendered by :mod:`litegpu.codegen`, compiled by NVRTC,
launched through the driver API.

``available()`` opens the device lazily (never at import or plugin load), so a machine
without ``cuda-bindings`` or without an NVIDIA driver lists the backend as unavailable
with the reason, and models run elsewhere.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

import numpy as np

from litegpu.backend import COMPLETE, CompileOptions, Event, Partition, Program
from litegpu.codegen import Precision
from litegpu.codegen.backend import CodegenBackend
from litegpu.errors import InvalidArgumentError
from litegpu.ops import TensorSpec

from . import nvrtc
from .device import Device, default_device, stream_handle
from .program import CudaProgram, CudaTensor, new_tensor, precision_for, read, write


ARCHS_ENV = "LITEGPU_CUDA_ARCHS"


class CudaBackend(CodegenBackend):
    """See the module docstring."""

    name = "cuda"
    gpu_priority = 30   # "GPU" picks cuda first where it is available
    dialect = "cuda"

    def __init__(self) -> None:
        self._user_devices: dict[tuple, Device] = {}

    def open_device(self) -> Device:
        return default_device()

    def device_for(self, options: CompileOptions) -> Device:
        """The default device, on the user's stream and in the user's context when the
        environment gives them (``cuda_stream``, ``cuda_context``)."""
        stream, context = options.extra.get("cuda_stream"), options.extra.get("cuda_context")
        if stream is None and context is None:
            return default_device()
        # One Device per (stream, context): programs and buffers of one environment share it.
        key = (None if stream is None else stream_handle(stream), None if context is None else int(context))
        if key not in self._user_devices:
            self._user_devices[key] = default_device().with_user(stream, context)
        return self._user_devices[key]

    def compile(self, partition: Partition, options: CompileOptions) -> Program:
        return CudaProgram(self.device_for(options), partition, options)

    def offline_build(self, source: str) -> dict[str, bytes]:
        """PTX of ``source`` for each arch of ``$LITEGPU_CUDA_ARCHS`` (default "80,90":
        Ampere and Hopper; a driver JIT-compiles PTX for newer GPUs). Needs no GPU."""
        archs = [a.strip() for a in os.environ.get(ARCHS_ENV, "80,90").split(",") if a.strip()]
        # NVRTC runs in several threads at once (it releases the GIL): one per arch.
        with ThreadPoolExecutor(max(1, len(archs)), thread_name_prefix="litegpu-nvrtc") as pool:
            ptx = list(pool.map(lambda arch: nvrtc.compile_source(source, arch), archs))
        return {f"compute_{arch}.ptx": code for arch, code in zip(archs, ptx)}

    # -- device memory ---------------------------------------------------------------------
    def allocate(self, spec: TensorSpec, options: CompileOptions) -> CudaTensor:
        device = self.device_for(options)
        return new_tensor(device, precision_for(device, options), spec.shape, spec.dtype, spec.full_precision)

    def wrap(self, native: Any, spec: TensorSpec, options: CompileOptions) -> CudaTensor:
        """A tensor around a user's CUDA array (CuPy, PyTorch, numba: anything with
        ``__cuda_array_interface__``), without a copy; it must be C-contiguous and hold
        ``spec``'s dtype (float32 tensors as float32)."""
        iface = getattr(native, "__cuda_array_interface__", None)
        if iface is None:
            raise InvalidArgumentError(f"a {type(native).__name__} is not a CUDA array "
                                       "(it has no __cuda_array_interface__)")
        shape, dtype = tuple(int(d) for d in iface["shape"]), np.dtype(iface["typestr"])
        storage = Precision().storage_dtype(spec.dtype)
        strides = iface.get("strides")
        if strides is not None and tuple(strides) != tuple(np.empty(shape, dtype).strides):
            raise InvalidArgumentError("the CUDA array is not C-contiguous; make a contiguous copy first")
        if dtype != storage or int(np.prod(shape, dtype=np.int64)) != int(np.prod(spec.shape, dtype=np.int64)):
            raise InvalidArgumentError(f"the CUDA array holds {list(shape)} x {dtype}; the tensor needs "
                                       f"{list(spec.shape)} x {storage}")
        return CudaTensor(int(iface["data"][0]), tuple(spec.shape), np.dtype(spec.dtype), storage,
                          self.device_for(options), native)

    def nbytes(self, buffer: CudaTensor) -> int:
        return buffer.nbytes

    def copy_in(self, buffer: CudaTensor, array: np.ndarray, wait_for: Sequence[Event] = ()) -> Event:
        write(buffer, array, wait_for)
        return COMPLETE

    def copy_out(self, buffer: CudaTensor, array: np.ndarray, wait_for: Sequence[Event] = ()) -> Event:
        read(buffer, array, wait_for)
        return COMPLETE
