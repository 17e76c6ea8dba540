"""The Metal runtime, on Apple's documented API through PyObjC: device and queue,
shared-storage buffers, libraries compiled from source, pipelines, command buffers.

On Apple silicon a buffer in shared storage is the host's memory too: a tensor's bytes
are read and written through a numpy view of ``contents()``, with no copy to a device.
A committed command buffer is the :class:`MetalEvent`; ``waitUntilCompleted`` waits.
"""
from __future__ import annotations

import threading
from typing import Any

import numpy as np

from litegpu.backend import Event
from litegpu.codegen.backend import once
from litegpu.env import install_hint
from litegpu.errors import BackendUnavailableError, ExecutionError


def import_metal():
    """PyObjC's ``Metal`` module, or BackendUnavailableError saying why not."""
    try:
        import Metal
    except ImportError as exc:
        raise BackendUnavailableError(f"PyObjC's Metal bindings are not installed ({exc}); Metal runs on macOS: "
                                      f"{install_hint('metal')}") from None
    return Metal


class CompileError(Exception):
    """Metal refused a source; the message is its compiler error."""


class MetalDevice:
    """The system's default Metal device with one command queue."""

    def __init__(self) -> None:
        mtl = self.mtl = import_metal()
        self.device = mtl.MTLCreateSystemDefaultDevice()
        if self.device is None:
            raise BackendUnavailableError("macOS reports no Metal device")
        self.queue = self.device.newCommandQueue()

    @property
    def name(self) -> str:
        """The GPU's name."""
        return str(self.device.name())

    def info(self) -> dict:
        """What ``litegpu backends`` shows."""
        d = self.device
        return {"device": self.name,
                "unified memory": "yes" if d.hasUnifiedMemory() else "no",
                "max threads per threadgroup": d.maxThreadsPerThreadgroup().width,
                "recommended working set": f"{d.recommendedMaxWorkingSetSize() / 2**30:.1f} GiB",
                "fp16 arithmetic": "yes"}

    @property
    def identity(self) -> str:
        """Part of every cache key: the device's name and registry id."""
        return f"{self.name}|{self.device.registryID()}"

    # -- memory -----------------------------------------------------------------------------
    def buffer(self, nbytes: int) -> Any:
        """A shared-storage buffer of at least one byte."""
        buf = self.device.newBufferWithLength_options_(max(int(nbytes), 1), self.mtl.MTLResourceStorageModeShared)
        if buf is None:
            raise ExecutionError(f"Metal could not allocate {nbytes} bytes")
        return buf

    @staticmethod
    def view(buf: Any, offset: int, count: int, dtype: np.dtype) -> np.ndarray:
        """``count`` elements of ``dtype`` at byte ``offset`` of a shared buffer, as a numpy view."""
        raw = buf.contents().as_buffer(buf.length())
        return np.frombuffer(raw, dtype=dtype, count=count, offset=offset)

    # -- programs ---------------------------------------------------------------------------
    def library(self, source: str) -> Any:
        """``source`` compiled; CompileError with Metal's message when it does not."""
        options = self.mtl.MTLCompileOptions.new()
        options.setFastMathEnabled_(False)   # fp32 as LiteRT computes it (no flush to zero)
        library, error = self.device.newLibraryWithSource_options_error_(source, options, None)
        if library is None:
            raise CompileError(str(error.localizedDescription()) if error is not None else "unknown error")
        return library

    def pipeline(self, library: Any, name: str) -> Any:
        """The compute pipeline of kernel function ``name``."""
        function = library.newFunctionWithName_(name)
        if function is None:
            raise ExecutionError(f"the Metal library has no function {name}")
        pipeline, error = self.device.newComputePipelineStateWithFunction_error_(function, None)
        if pipeline is None:
            raise ExecutionError(f"Metal could not make a pipeline of {name}: {error}")
        return pipeline

    def size(self, dims: tuple[int, ...]) -> Any:
        """An ``MTLSize`` of up to three dimensions."""
        x, y, z = (tuple(dims) + (1, 1, 1))[:3]
        return self.mtl.MTLSizeMake(x, y, z)


class MetalEvent(Event):
    """Completion of a committed command buffer."""

    def __init__(self, command_buffer: Any) -> None:
        self.command_buffer = command_buffer
        self._lock = threading.Lock()

    def wait(self, wait_type: str = "passive") -> None:
        """Block until the GPU has run the command buffer; raises its error, if any."""
        with self._lock:
            if wait_type == "active":
                while not self.is_complete():
                    pass
            self.command_buffer.waitUntilCompleted()
            error = self.command_buffer.error()
            if error is not None:
                raise ExecutionError(f"Metal command buffer failed: {error.localizedDescription()}")

    def is_complete(self) -> bool:
        """True when the command buffer has completed (or failed)."""
        import Metal
        return self.command_buffer.status() >= Metal.MTLCommandBufferStatusCompleted


@once
def default_device() -> MetalDevice:
    """The process's Metal device (opened once)."""
    return MetalDevice()
