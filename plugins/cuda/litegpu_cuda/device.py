"""The CUDA device: driver, primary context, stream, device memory, events.

The default device is ordinal ``$LITEGPU_CUDA_DEVICE`` (default 0), opened once per
process on its primary context (the one the CUDA runtime, CuPy and PyTorch share, so
their pointers are valid here) with a stream of its own. A user who already has a
stream hands it over through the ``Environment`` (``cuda_stream=``: an int handle, or an
object with ``__cuda_stream__``, ``cuda_stream`` or ``ptr`` as CuPy's and PyTorch's
streams have), and the work is ordered on it; ``cuda_context=`` (a ``CUcontext`` handle)
puts it in the user's own context instead of the primary one.
"""
from __future__ import annotations

import os
import weakref
from functools import cached_property
from typing import Any

from litegpu.backend import Event
from litegpu.codegen.backend import once
from litegpu.env import install_hint
from litegpu.errors import BackendUnavailableError, ExecutionError, InvalidArgumentError

DEVICE_ENV = "LITEGPU_CUDA_DEVICE"


def import_driver():
    """``cuda.bindings.driver``, or BackendUnavailableError saying how to get it."""
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        raise BackendUnavailableError(f"NVIDIA's cuda-bindings is not installed ({exc}); "
                                      f"{install_hint('cuda')}") from None
    return driver


def check(result: Any, what: str = "CUDA call", error: type = ExecutionError) -> Any:
    """The values of a cuda-bindings result tuple ``(CUresult, *values)``; raises on an error code."""
    cu = import_driver()
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != cu.CUresult.CUDA_SUCCESS:
        _, name = cu.cuGetErrorName(err)
        raise error(f"{what} failed: {name.decode() if isinstance(name, bytes) else err}")
    return values[0] if len(values) == 1 else tuple(values) or None


def stream_handle(stream: Any) -> int:
    """The raw ``CUstream`` of a user's stream object (see the module docstring)."""
    if hasattr(stream, "__cuda_stream__"):
        return int(stream.__cuda_stream__()[1])
    for attr in ("cuda_stream", "ptr", "handle"):
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    if isinstance(stream, int):
        return stream
    raise InvalidArgumentError(f"cuda_stream must be a CUDA stream (an int handle, or an object with "
                               f"__cuda_stream__, cuda_stream or ptr), not {type(stream).__name__}")


class Device:
    """One CUDA device: its primary context and the stream the backend works on."""

    def __init__(self, ordinal: int = 0, stream: Any = None, context: Any = None) -> None:
        cu = self.cu = import_driver()
        try:
            check(cu.cuInit(0), "cuInit", BackendUnavailableError)
        except BackendUnavailableError:
            raise
        except Exception as exc:   # no libcuda.so: the bindings raise their own loader error
            raise BackendUnavailableError(f"no NVIDIA driver here ({exc})") from None
        count = check(cu.cuDeviceGetCount(), "cuDeviceGetCount", BackendUnavailableError)
        if count == 0:
            raise BackendUnavailableError("the NVIDIA driver sees no CUDA device")
        if not 0 <= ordinal < count:
            raise InvalidArgumentError(f"{DEVICE_ENV}={ordinal}: there are {count} CUDA devices (0..{count - 1})")
        self.ordinal = ordinal
        self.device = check(cu.cuDeviceGet(ordinal), "cuDeviceGet", BackendUnavailableError)
        self.context = cu.CUcontext(int(context)) if context is not None else check(
            cu.cuDevicePrimaryCtxRetain(self.device), "cuDevicePrimaryCtxRetain", BackendUnavailableError)
        self.activate()
        self.own_stream = stream is None
        self.stream = check(cu.cuStreamCreate(0), "cuStreamCreate") if stream is None else \
            cu.CUstream(stream_handle(stream))

    def activate(self) -> None:
        """Make the context current on the calling thread (driver calls act on the current one)."""
        check(self.cu.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")

    def with_user(self, stream: Any = None, context: Any = None) -> "Device":
        """The same device working on a user's stream and/or in a user's context."""
        return Device(self.ordinal, stream, context)

    # -- what the device is -----------------------------------------------------------------
    def attribute(self, name: str) -> int:
        """A ``CU_DEVICE_ATTRIBUTE_<name>`` of the device."""
        attr = getattr(self.cu.CUdevice_attribute, f"CU_DEVICE_ATTRIBUTE_{name}")
        return int(check(self.cu.cuDeviceGetAttribute(attr, self.device), "cuDeviceGetAttribute"))

    @cached_property
    def arch(self) -> str:
        """The compute capability as NVRTC names it ("80", "90")."""
        return f"{self.attribute('COMPUTE_CAPABILITY_MAJOR')}{self.attribute('COMPUTE_CAPABILITY_MINOR')}"

    @cached_property
    def name(self) -> str:
        """The device's name."""
        raw = check(self.cu.cuDeviceGetName(256, self.device), "cuDeviceGetName")
        return raw.split(b"\0", 1)[0].decode(errors="replace").strip()

    @cached_property
    def driver_version(self) -> str:
        """The driver's CUDA version, e.g. "12.8"."""
        v = int(check(self.cu.cuDriverGetVersion(), "cuDriverGetVersion"))
        return f"{v // 1000}.{v % 1000 // 10}"

    @property
    def fp16(self) -> bool:
        """Half arithmetic: every NVIDIA GPU since compute capability 5.3 (Pascal's sm_60 and on)."""
        return int(self.arch) >= 53

    @cached_property
    def identity(self) -> str:
        """Device, arch and driver: part of every kernel cache key."""
        return f"{self.name}|sm_{self.arch}|driver {self.driver_version}"

    def info(self) -> dict:
        """What ``litegpu backends`` shows."""
        from . import nvrtc
        total = int(check(self.cu.cuDeviceTotalMem(self.device), "cuDeviceTotalMem"))
        return {
            "device": f"{self.name} (ordinal {self.ordinal})",
            "compute capability": f"{self.arch[:-1]}.{self.arch[-1]}",
            "driver (CUDA)": self.driver_version,
            "nvrtc": nvrtc.version(),
            "multiprocessors": self.attribute("MULTIPROCESSOR_COUNT"),
            "global memory": f"{total / 2**30:.1f} GiB",
            "fp16 arithmetic": "yes" if self.fp16 else "no",
            "stream": "the user's" if not self.own_stream else "its own",
        }

    # -- memory and events ------------------------------------------------------------------
    def alloc(self, nbytes: int) -> "Memory":
        """``nbytes`` of device memory (at least one byte), freed when the returned object goes."""
        self.activate()
        ptr = check(self.cu.cuMemAlloc(max(int(nbytes), 1)), f"cuMemAlloc({nbytes} bytes)")
        return Memory(self, ptr, nbytes)

    def record(self) -> Event:
        """An event recorded now on the stream: complete when all work enqueued so far is."""
        from .program import CudaEvent
        self.activate()
        event = check(self.cu.cuEventCreate(self.cu.CUevent_flags.CU_EVENT_DISABLE_TIMING), "cuEventCreate")
        check(self.cu.cuEventRecord(event, self.stream), "cuEventRecord")
        return CudaEvent(self, event)

    def synchronize(self) -> None:
        """Wait for everything enqueued on the stream."""
        self.activate()
        check(self.cu.cuStreamSynchronize(self.stream), "cuStreamSynchronize")


class Memory:
    """An allocation; ``ptr`` is its device address (an int). Freed with the object."""

    def __init__(self, device: Device, ptr: Any, nbytes: int) -> None:
        self.device, self.nbytes = device, int(nbytes)
        self.ptr = int(ptr)
        self._free = weakref.finalize(self, _free, device.cu, ptr)


def _free(cu, ptr) -> None:
    try:
        cu.cuMemFree(ptr)
    except Exception:   # noqa: BLE001 - at interpreter exit the driver may be gone
        pass


@once
def default_device() -> Device:
    """The process's default device (opened once; see the module docstring)."""
    raw = os.environ.get(DEVICE_ENV, "0").strip() or "0"
    if not raw.isdigit():
        raise InvalidArgumentError(f"{DEVICE_ENV}={raw!r} is not a device ordinal")
    return Device(int(raw))
