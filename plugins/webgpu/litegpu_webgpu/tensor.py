"""Device tensors: GPU buffers holding a tensor in its WGSL storage type, and host copies.

A tensor's storage dtype is what the precision mode stores (:meth:`Precision.storage_dtype`:
half for float32 in F32_F16/F16, bytes for bool) widened as WGSL storage needs
(:meth:`WgslDialect.storage_dtype`: 8- and 16-bit integers and bool are 32 bits per
element). Copies convert on the host: ``write`` widens (or narrows float32 to half),
``read`` converts back to the tensor's dtype.

WebGPU sizes and copies buffers in multiples of 4 bytes, so a buffer is its tensor's
bytes rounded up to 4 (an odd number of halves gets one more), and a binding covers the
same rounded size.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from litegpu.codegen import Precision
from litegpu.codegen.nodegen import StoredTensor
from litegpu.codegen.wgsl import WGSL
from litegpu.errors import InvalidArgumentError, ResourceLimitError

if TYPE_CHECKING:
    from .device import Device

COPY_ALIGNMENT = 4   # WebGPU's copy and binding sizes are multiples of 4 bytes


def round4(nbytes: int) -> int:
    """``nbytes`` rounded up to a multiple of 4, and at least 4 (a binding is never empty)."""
    return max(-(-int(nbytes) // COPY_ALIGNMENT) * COPY_ALIGNMENT, COPY_ALIGNMENT)


def storage_dtype(precision: Precision, dtype: Any, full_precision: bool = False) -> np.dtype:
    """The dtype a tensor of ``dtype`` has in device memory (see the module docstring)."""
    return WGSL.storage_dtype(precision.storage_dtype(dtype, full_precision))


@dataclass
class WgpuTensor(StoredTensor):
    """A tensor in device memory: ``buffer`` (a ``wgpu.GPUBuffer``) from byte ``offset``,
    with the tensor's ``shape`` and ``dtype`` and the ``storage`` dtype it has there."""

    buffer: Any
    shape: tuple[int, ...]
    dtype: np.dtype
    storage: np.dtype
    device: "Device"
    offset: int = 0

    @property
    def binding_size(self) -> int:
        """Bytes a binding of this tensor covers (see the module docstring)."""
        return round4(self.nbytes)


def new_tensor(device: "Device", precision: Precision, shape, dtype, full_precision: bool = False) -> WgpuTensor:
    """A new device tensor of ``shape``/``dtype`` stored as ``precision`` stores it."""
    shape = tuple(int(d) for d in shape)
    storage = storage_dtype(precision, dtype, full_precision)
    nbytes = round4(math.prod(shape) * storage.itemsize)
    if nbytes > device.max_buffer:
        raise ResourceLimitError(f"a {np.dtype(dtype)} tensor of shape {list(shape)} needs {nbytes} bytes; "
                                 f"{device.name} allows {device.max_buffer} per buffer (maxBufferSize)")
    usage = device.wgpu.BufferUsage
    with device.calls("allocating a tensor"):
        buffer = device.device.create_buffer(size=nbytes, usage=usage.STORAGE | usage.COPY_SRC | usage.COPY_DST)
    return WgpuTensor(buffer, shape, np.dtype(dtype), storage, device)


def host_bytes(array: np.ndarray, storage: np.dtype) -> np.ndarray:
    """``array`` converted to ``storage``, as bytes padded to a multiple of 4."""
    host = np.ascontiguousarray(array, dtype=storage).reshape(-1).view(np.uint8)
    pad = -host.size % COPY_ALIGNMENT
    return np.concatenate([host, np.zeros(pad, np.uint8)]) if pad else host


def write(tensor: WgpuTensor, array: np.ndarray) -> None:
    """Copy a host array into ``tensor`` (converted to its storage dtype).

    ``queue.write_buffer`` takes its own copy at once, so ``array`` may be reused on return,
    and every command submitted later sees the data."""
    array = np.asarray(array)
    if array.size != tensor.size:
        raise InvalidArgumentError(f"cannot write {array.size} elements into a WebGPU tensor of {tensor.size}")
    if tensor.size == 0:
        return
    data = host_bytes(array, tensor.storage)
    with tensor.device.calls("copying a tensor to the device"):
        tensor.device.queue.write_buffer(tensor.buffer, tensor.offset, data)


def read(tensor: WgpuTensor, out: np.ndarray) -> None:
    """Copy ``tensor`` into a host array (blocking until the device is done with the work
    submitted before), converting from its storage dtype."""
    if out.size != tensor.size:
        raise InvalidArgumentError(f"cannot read a WebGPU tensor of {tensor.size} elements into {out.size}")
    if tensor.size == 0:
        return
    with tensor.device.calls("copying a tensor from the device"):
        raw = tensor.device.queue.read_buffer(tensor.buffer, tensor.offset, tensor.binding_size)
    values = np.frombuffer(raw, tensor.storage, count=tensor.size)
    out[...] = values.reshape(out.shape).astype(out.dtype, copy=False)
