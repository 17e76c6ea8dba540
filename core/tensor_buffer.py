"""``TensorBuffer``: a tensor's memory, on the host or on a device, with an event.

Mirrors LiteRT's TensorBuffer. A host buffer wraps a numpy array. A device buffer
wraps a backend's device memory — one the CompiledModel allocated, or the user's own
(e.g. a ``pyopencl.Buffer``, like LiteRT's ``CreateFromClBuffer``) — and is copied to
the host only when read. A buffer may carry an :class:`~litegpu.backend.Event`: reading
waits for it, and a run that takes the buffer as input waits for it first.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .backend import Backend, CompileOptions, Event
from .errors import InvalidArgumentError
from .ops import TensorSpec


class TensorBuffer:
    """A tensor's memory: host memory, or device memory of a backend (see module docstring)."""

    def __init__(self, array: np.ndarray, device: tuple[Backend, Any] | None = None) -> None:
        self._array = array
        self._device = device
        self._event: Event | None = None
        self._host_stale = device is not None     # the device holds newer data than ``_array``

    @classmethod
    def create_from_host_memory(cls, data_array: np.ndarray) -> "TensorBuffer":
        """Wrap an existing C-contiguous array without copying."""
        if not isinstance(data_array, np.ndarray) or not data_array.flags.c_contiguous:
            raise InvalidArgumentError("create_from_host_memory needs a C-contiguous numpy array")
        return cls(data_array)

    @classmethod
    def create_from_device_buffer(cls, native: Any, shape, dtype, backend: str = "opencl",
                                  environment: Any = None) -> "TensorBuffer":
        """Wrap a user's device buffer (for ``"opencl"``, a ``pyopencl.Buffer`` in the context of
        the environment's ``opencl_context``, or the default context) holding a tensor of
        ``shape`` and ``dtype``; no copy is made."""
        from .plugins import manager
        impl = manager().available_backend(backend)
        options = CompileOptions(extra=dict(getattr(environment, "options", {}) or {}))
        spec = TensorSpec(tuple(int(d) for d in shape), np.dtype(dtype))
        return cls(np.zeros(spec.shape, spec.dtype), (impl, impl.wrap(native, spec, options)))

    @classmethod
    def create_from_opencl_buffer(cls, buffer: Any, shape, dtype, environment: Any = None) -> "TensorBuffer":
        """Wrap a ``pyopencl.Buffer`` (see :meth:`create_from_device_buffer`)."""
        return cls.create_from_device_buffer(buffer, shape, dtype, "opencl", environment)

    # -- events ---------------------------------------------------------------------------
    @property
    def event(self) -> Event | None:
        """The event of the work that last wrote this buffer (None: nothing pending)."""
        return self._event

    def set_event(self, event: Event | None) -> None:
        """Attach an event: reads of this buffer and runs taking it as input wait for it."""
        self._event = event

    def has_event(self) -> bool:
        """True when an event is attached."""
        return self._event is not None

    def wait(self, wait_type: str = "passive") -> None:
        """Wait for the attached event."""
        if self._event is not None:
            self._event.wait(wait_type)

    # -- data -------------------------------------------------------------------------------
    @property
    def size(self) -> int:
        """Number of elements."""
        return int(self._array.size)

    @property
    def is_device(self) -> bool:
        """True for device memory."""
        return self._device is not None

    @property
    def __cuda_array_interface__(self) -> dict:
        """The CUDA array interface of a cuda device buffer (CuPy, PyTorch and numba then use
        the memory without a copy), once its pending work is done; other buffers have none."""
        native = self._device[1] if self._device is not None else None
        if not hasattr(native, "__cuda_array_interface__"):
            raise AttributeError("only a cuda device buffer has __cuda_array_interface__")
        self.wait()
        return native.__cuda_array_interface__

    @property
    def device(self) -> tuple[Backend, Any] | None:
        """(backend, backend buffer) for device memory, else None."""
        return self._device

    def write(self, data_array: np.ndarray) -> None:
        """Copy ``data_array`` (same element count, convertible dtype) into the buffer."""
        data = np.asarray(data_array)
        if data.size != self._array.size:
            raise InvalidArgumentError(f"write of {data.size} elements into a buffer of {self._array.size}")
        self.wait()
        self._array.reshape(-1)[...] = data.reshape(-1).astype(self._array.dtype, copy=False)
        if self._device is not None:
            backend, buffer = self._device
            backend.copy_in(buffer, self._array)
            self._host_stale = False

    def read(self, num_elements: int, output_dtype: Any) -> np.ndarray:
        """A copy of the first ``num_elements`` elements as ``output_dtype`` (waits for the event)."""
        if not 0 <= num_elements <= self._array.size:
            raise InvalidArgumentError(f"read of {num_elements} elements from a buffer of {self._array.size}")
        return self.array.reshape(-1)[:num_elements].astype(output_dtype, copy=True)

    def get_tensor_details(self) -> dict:
        """``{"dtype": name, "shape": [...]}``."""
        return {"dtype": self._array.dtype.name, "shape": list(self._array.shape)}

    @property
    def array(self) -> np.ndarray:
        """The host array behind the buffer; for device memory, synchronized from the device first."""
        self.wait()
        if self._device is not None and self._host_stale:
            backend, buffer = self._device
            backend.copy_out(buffer, self._array)
            self._host_stale = False
        return self._array

    def device_written(self, event: Event | None) -> None:
        """Note that a run wrote the device memory (the host copy is now stale)."""
        self._event = event
        self._host_stale = True

    def destroy(self) -> None:
        """Release the buffer."""
        self._device = None
