"""The metal backend: MSL rendered by :mod:`litegpu.codegen`, compiled and run through
PyObjC's Metal bindings (see :mod:`.runtime`).

``available()`` opens the device lazily, so anywhere without macOS, PyObjC's Metal
bindings or a Metal device the backend is listed as unavailable with the reason.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from litegpu.backend import COMPLETE, CompileOptions, Event, Partition, Program
from litegpu.codegen import Precision
from litegpu.codegen.backend import CodegenBackend
from litegpu.errors import BackendUnavailableError, InvalidArgumentError
from litegpu.ops import TensorSpec

from .program import MetalProgram, MetalTensor, new_tensor, precision_for, read, write
from .runtime import MetalDevice, default_device


class MetalBackend(CodegenBackend):
    """See the module docstring."""

    name = "metal"
    gpu_priority = 20   # "GPU" on a Mac: metal before opencl
    dialect = "metal"

    def open_device(self) -> MetalDevice:
        return default_device()

    def compile(self, partition: Partition, options: CompileOptions) -> Program:
        return MetalProgram(default_device(), partition, options)

    def offline_build(self, source: str) -> dict[str, bytes]:
        """Compiles ``source`` with Metal (so a kernel that does not build is reported); the
        source is the artifact. BackendUnavailableError where there is no Metal device."""
        ok, why = self.available()
        if not ok:
            raise BackendUnavailableError(f"Metal compiles on a Mac with a Metal device ({why})")
        default_device().library(source)
        return {}

    # -- memory: shared storage, so host copies are plain numpy copies --------------------------
    def allocate(self, spec: TensorSpec, options: CompileOptions) -> MetalTensor:
        return new_tensor(default_device(), precision_for(options), spec.shape, spec.dtype, spec.full_precision)

    def wrap(self, native: Any, spec: TensorSpec, options: CompileOptions) -> MetalTensor:
        """A tensor around a user's ``MTLBuffer`` (in shared storage) holding ``spec``'s elements."""
        if not (hasattr(native, "contents") and hasattr(native, "length")):
            raise InvalidArgumentError(f"a {type(native).__name__} is not an MTLBuffer")
        storage = Precision().storage_dtype(spec.dtype)
        tensor = MetalTensor(native, tuple(spec.shape), np.dtype(spec.dtype), storage, default_device())
        if native.length() < tensor.nbytes:
            raise InvalidArgumentError(f"the MTLBuffer has {native.length()} bytes; the tensor needs {tensor.nbytes}")
        return tensor

    def nbytes(self, buffer: MetalTensor) -> int:
        return buffer.nbytes

    def copy_in(self, buffer: MetalTensor, array: np.ndarray, wait_for: Sequence[Event] = ()) -> Event:
        write(buffer, array, wait_for)
        return COMPLETE

    def copy_out(self, buffer: MetalTensor, array: np.ndarray, wait_for: Sequence[Event] = ()) -> Event:
        read(buffer, array, wait_for)
        return COMPLETE
