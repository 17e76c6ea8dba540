"""The WebGPU device: adapter choice, the device and its queue, what it can do, loss.

The default adapter is WebGPU's high-performance one. ``LITEGPU_WEBGPU_ADAPTER`` (a
substring of the adapter's name, case-insensitive) and ``LITEGPU_WEBGPU_BACKEND``
(Vulkan, Metal, D3D12 or GL) pick another among ``wgpu.gpu.enumerate_adapters_sync()``;
a value that matches nothing raises InvalidArgumentError listing the adapters (never a
quiet fallback to another adapter or to the cpu).

The device is requested with ``shader-f16`` and ``timestamp-query`` where the adapter
offers them, and with the adapter's own maxima for the limits kernels run into (storage
buffers per stage, the size of one binding and of one buffer): WebGPU's defaults (8
buffers, 128 MiB) are far below what most adapters allow.

A lost device (a driver reset, ``destroy()``) is seen as wgpu's errors saying so: the
call that meets one raises ExecutionError saying the device was lost, the device is
marked lost, and the next model created gets a new device (:func:`current_device`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import weakref
from functools import cached_property
from typing import Any, Iterator

from litegpu.codegen.wgsl import WGSL, WgslDialect
from litegpu.env import install_hint
from litegpu.errors import BackendUnavailableError, ExecutionError, InvalidArgumentError

log = logging.getLogger("litegpu.webgpu")

ADAPTER_ENV = "LITEGPU_WEBGPU_ADAPTER"
BACKEND_ENV = "LITEGPU_WEBGPU_BACKEND"

#: What users may write in ``LITEGPU_WEBGPU_BACKEND`` -> wgpu's ``backend_type``.
BACKEND_TYPES = {"vulkan": "Vulkan", "metal": "Metal", "d3d12": "D3D12", "gl": "OpenGL", "opengl": "OpenGL"}
#: Features requested when the adapter offers them (F16 storage and arithmetic; device timestamps).
WANTED_FEATURES = ("shader-f16", "timestamp-query")
#: Limits requested at the adapter's maximum: the ones a model's kernels run into.
WANTED_LIMITS = ("max-storage-buffers-per-shader-stage", "max-storage-buffer-binding-size", "max-buffer-size")
# High-performance first, as request_adapter(power_preference="high-performance") orders them.
_PREFERENCE = {"DiscreteGPU": 0, "IntegratedGPU": 1, "VirtualGPU": 2, "Unknown": 3, "CPU": 4}


def import_wgpu():
    """wgpu, or BackendUnavailableError saying how to get it."""
    try:
        import wgpu
    except ImportError as exc:
        raise BackendUnavailableError(f"wgpu is not installed ({exc}); {install_hint('webgpu')}") from None
    return wgpu


def _describe(adapter: Any) -> str:
    info = adapter.info
    return f"{info.get('device', '?')} ({info.get('adapter_type', '?')}, {info.get('backend_type', '?')})"


def choose_adapter(wgpu: Any, name: str | None, backend: str | None) -> Any:
    """The adapter the variables name (see the module docstring), else the high-performance one.

    BackendUnavailableError when there is none; InvalidArgumentError when a variable names
    nothing here (the user's mistake, which ``available()`` lets through)."""
    name, backend = (name or "").strip(), (backend or "").strip()
    if not name and not backend:
        try:
            adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
        except Exception as exc:   # noqa: BLE001 - wgpu raises RuntimeError or returns None, by version
            raise BackendUnavailableError(f"no WebGPU adapter ({exc}); {_DRIVER_HINT}") from None
        if adapter is None:
            raise BackendUnavailableError(f"no WebGPU adapter; {_DRIVER_HINT}")
        return adapter
    if backend and backend.lower() not in BACKEND_TYPES:
        raise InvalidArgumentError(f"{BACKEND_ENV}={backend!r} is not a WebGPU backend; "
                                   f"use one of Vulkan, Metal, D3D12, GL")
    try:
        adapters = list(wgpu.gpu.enumerate_adapters_sync())
    except Exception as exc:   # noqa: BLE001
        raise BackendUnavailableError(f"could not list the WebGPU adapters ({exc}); {_DRIVER_HINT}") from None
    found = [a for a in adapters
             if (not backend or a.info.get("backend_type") == BACKEND_TYPES[backend.lower()])
             and (not name or name.lower() in str(a.info.get("device", "")).lower())]
    if not found:
        asked = " and ".join(f"{var}={value!r}" for var, value in ((ADAPTER_ENV, name), (BACKEND_ENV, backend))
                             if value)
        listed = "; ".join(_describe(a) for a in adapters) or "none"
        raise InvalidArgumentError(f"{asked} matches no WebGPU adapter; the adapters here: {listed}")
    return min(found, key=lambda a: _PREFERENCE.get(a.info.get("adapter_type", "Unknown"), 3))


_DRIVER_HINT = ("install a Vulkan, Metal or D3D12 driver (on Linux without a GPU: Debian's mesa-vulkan-drivers; "
                "on an NVIDIA machine without a display, set VK_DRIVER_FILES to an ICD file whose library_path is "
                "the driver's libEGL_nvidia.so.0: the default one names libGLX_nvidia.so.0, which needs X)")


class Device:
    """One WebGPU device with its queue, limits, pipeline cache and fences."""

    def __init__(self, wgpu: Any, adapter: Any, device: Any) -> None:
        self.wgpu = wgpu
        self.adapter = adapter
        self.device = device
        self.queue = device.queue
        self.features = set(device.features)
        self.limits = dict(device.limits)
        #: Why the device is gone ("" while it works).
        self.lost = ""
        from .fence import FencePool
        from .pipelines import Pipelines
        self.pipelines = Pipelines(self)
        self.fences = FencePool(self)

    @classmethod
    def open(cls, name: str | None = None, backend: str | None = None) -> "Device":
        """A new device on the adapter ``name``/``backend`` choose (see :func:`choose_adapter`)."""
        wgpu = import_wgpu()
        adapter = choose_adapter(wgpu, name, backend)
        features = [f for f in WANTED_FEATURES if f in adapter.features]
        limits = {k: adapter.limits[k] for k in WANTED_LIMITS if k in adapter.limits}
        try:
            device = adapter.request_device_sync(required_features=features, required_limits=limits)
        except Exception as exc:   # noqa: BLE001 - whatever the driver says is the reason
            raise BackendUnavailableError(f"could not open WebGPU device {_describe(adapter)}: {exc}") from None
        opened = cls(wgpu, adapter, device)
        log.debug("WebGPU device opened: %s, features %s", _describe(adapter), sorted(features))
        return opened

    # -- what the device can do -----------------------------------------------------------------
    @property
    def f16(self) -> bool:
        """True when the device has ``shader-f16``: half storage and half arithmetic."""
        return "shader-f16" in self.features

    @property
    def max_buffers(self) -> int:
        """Storage buffers one kernel may bind (``maxStorageBuffersPerShaderStage``)."""
        return int(self.limits["max-storage-buffers-per-shader-stage"])

    @property
    def max_binding(self) -> int:
        """Bytes one storage binding may cover (``maxStorageBufferBindingSize``)."""
        return int(self.limits["max-storage-buffer-binding-size"])

    @property
    def max_buffer(self) -> int:
        """Bytes one buffer may have (``maxBufferSize``)."""
        return int(self.limits["max-buffer-size"])

    @property
    def offset_alignment(self) -> int:
        """What a storage binding's offset must be a multiple of (``minStorageBufferOffsetAlignment``)."""
        return max(int(self.limits["min-storage-buffer-offset-alignment"]), 4)

    @cached_property
    def dialect(self) -> WgslDialect:
        """WGSL with this device's storage-buffer limit (kernels may bind that many) and
        whether its ``fma`` rounds once (:meth:`fma_is_fused`)."""
        return dataclasses.replace(WGSL, max_buffers=self.max_buffers, fused_fma=self.fma_is_fused)

    @cached_property
    def fma_is_fused(self) -> bool:
        """Whether WGSL's ``fma`` rounds once on this device: one tiny kernel computes
        ``fma(x, x, -(1 + 2^-11))`` for ``x = 1 + 2^-12``, which is 2^-24 rounded once and 0
        as a product then a sum (lavapipe's). False too when the probe cannot run: the
        emulation is exact everywhere, only slower."""
        import numpy as np
        from litegpu.codegen import ir
        from litegpu.codegen.nodegen import KernelSpec, Precision
        from litegpu.codegen.wgsl import WgslRenderer

        from .dispatch import run_kernels
        from .tensor import new_tensor, read, write
        b = ir.KernelBuilder()
        operands, result = b.buffer(np.float32), b.buffer(np.float32, writes=True)
        b.store(result, 0, ir.call("fma", operands.load(0), operands.load(1), operands.load(2)))
        source = WgslRenderer(Precision(), fused_fma=True).kernel(b.kernel((1,))).source
        x = 1 + 2.0 ** -12
        try:
            with self.calls("probing fma"):
                tensors = [new_tensor(self, Precision(), (n,), np.float32) for n in (3, 1)]
                write(tensors[0], np.array([x, x, -(1 + 2.0 ** -11)], np.float32))
                run_kernels(self, [(KernelSpec(source, (1,), None, []), tensors)]).wait()
                got = np.empty(1, np.float32)
                read(tensors[1], got)
        except Exception as exc:   # noqa: BLE001 - the exact emulation is the safe answer
            log.warning("could not probe fma on %s (%s): emulating it", self.name, exc)
            return False
        fused = float(got[0]) == 2.0 ** -24
        log.debug("WebGPU device %s: fma %s", self.name, "fused" if fused else f"not fused ({got!r}): emulated")
        return fused

    @cached_property
    def name(self) -> str:
        """The device's name as its adapter gives it."""
        return str(self.adapter.info.get("device", "")).strip() or "WebGPU device"

    @cached_property
    def is_cpu(self) -> bool:
        """True for an adapter that is a CPU (lavapipe)."""
        return str(self.adapter.info.get("adapter_type", "")) == "CPU"

    def info(self) -> dict:
        """What ``litegpu backends`` shows."""
        info, limits = self.adapter.info, self.limits
        adapter_type = str(info.get("adapter_type", "Unknown"))
        offered = set(self.adapter.features)
        yes = lambda f: "yes" if f in self.features else "no"   # noqa: E731
        return {
            "device": self.name,
            "type": "CPU" if self.is_cpu else "GPU",
            "adapter type": adapter_type,
            "backend": info.get("backend_type", ""),
            "vendor": info.get("vendor", "") or f"0x{int(info.get('vendor_id', 0)):04x}",
            "driver": info.get("description", ""),
            "f16 (shader-f16)": "yes" if self.f16 else "no (F32 only)",
            "fma": "fused" if self.fma_is_fused else "a product then a sum (emulated, rounded once)",
            "timestamps (timestamp-query)": yes("timestamp-query"),
            "subgroups": "offered, not used" if offered & {"subgroups", "subgroup"} else "no",
            "max storage buffer binding": f"{limits['max-storage-buffer-binding-size'] / 2**20:.0f} MiB",
            "storage buffers per stage": limits["max-storage-buffers-per-shader-stage"],
            "max workgroup size": f"{limits['max-compute-workgroup-size-x']} x {limits['max-compute-workgroup-size-y']}"
                                  f" x {limits['max-compute-workgroup-size-z']}, "
                                  f"{limits['max-compute-invocations-per-workgroup']} invocations",
            "max workgroups per dimension": limits["max-compute-workgroups-per-dimension"],
            "storage offset alignment": f"{self.offset_alignment} bytes",
            "wgpu": getattr(self.wgpu, "__version__", "?"),
        }

    # -- failures -----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def calls(self, what: str) -> Iterator[None]:
        """wgpu's errors inside as ExecutionError saying ``what`` failed (see :meth:`failure`)."""
        if self.lost:
            raise self.lost_error(what)
        try:
            yield
        except self.wgpu.GPUError as exc:
            raise self.failure(what, exc) from None

    def failure(self, what: str, exc: BaseException) -> ExecutionError:
        """The error to raise for ``exc``, met while doing ``what``: a lost device is marked
        lost and said so (the next model gets a new device)."""
        if is_loss(exc) or self.lost:
            self.mark_lost(self.lost or str(exc))
            return self.lost_error(what)
        return ExecutionError(f"WebGPU: {what} failed on {self.name}: {exc}")

    def mark_lost(self, why: str) -> None:
        """Remember that the device is gone; :func:`current_device` then opens a new one."""
        if not self.lost:
            log.warning("the WebGPU device %s was lost: %s", self.name, why.strip().splitlines()[-1:])
        self.lost = why.strip() or "lost"

    def lost_error(self, what: str) -> ExecutionError:
        """The error of ``what`` on a lost device."""
        last = self.lost.splitlines()[-1].strip() if self.lost else "lost"
        return ExecutionError(f"WebGPU: {what} failed: the device {self.name} was lost ({last}); "
                              "create the model again: a new model gets a new device")


def is_loss(exc: BaseException) -> bool:
    """True when a wgpu error says the device is gone."""
    # wgpu-core says "Parent device is lost" / "Device is lost"; a destroyed buffer is not a lost device.
    text = str(exc).lower()
    return "device is lost" in text or "device is invalid" in text or "device lost" in text


_lock = threading.Lock()
_current: list[Device] = []
_users: "weakref.WeakKeyDictionary[Any, Device]" = weakref.WeakKeyDictionary()


def current_device() -> Device:
    """The process's default device: opened on first use (see the module docstring), and
    opened again once it is lost. Two threads never open two devices."""
    with _lock:
        if not _current or _current[0].lost:
            device = Device.open(os.environ.get(ADAPTER_ENV), os.environ.get(BACKEND_ENV))
            _current[:] = [device]
        return _current[0]


def user_device(gpu_device: Any) -> Device:
    """A :class:`Device` around a user's ``wgpu.GPUDevice`` (the Environment's
    ``webgpu_device``), one per device, so its pipelines are cached once."""
    wgpu = import_wgpu()
    if not isinstance(gpu_device, wgpu.GPUDevice):
        raise InvalidArgumentError(f"webgpu_device must be a wgpu.GPUDevice, got a {type(gpu_device).__name__}")
    with _lock:
        device = _users.get(gpu_device)
        if device is None:
            device = _users[gpu_device] = Device(wgpu, gpu_device.adapter, gpu_device)
        return device
