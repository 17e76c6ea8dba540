"""The OpenCL device: platform and device choice, context and queue, what it can do.

The default device is chosen once per process: the platform and device named by
``LITEGPU_OPENCL_PLATFORM`` / ``LITEGPU_OPENCL_DEVICE`` (an index or a substring of
the name, case-insensitive), else the first GPU, else the first device of any kind.
A variable that names nothing here raises InvalidArgumentError listing what there is
(never a fallback to another device or to the cpu).
A user who already has a pyopencl context and queue hands them over through the
``Environment`` (``opencl_context=``, ``opencl_queue=``) and gets a :class:`Device`
around them. PoCL's and pyopencl's own caches are made safe as the device is opened
(see :mod:`.driver_caches`).
"""
from __future__ import annotations

import logging
import os
from functools import cached_property
from typing import Any

from litegpu.codegen.backend import once
from litegpu.env import install_hint
from litegpu.errors import BackendUnavailableError, InvalidArgumentError

from . import driver_caches

log = logging.getLogger("litegpu.opencl")
PLATFORM_ENV = "LITEGPU_OPENCL_PLATFORM"
DEVICE_ENV = "LITEGPU_OPENCL_DEVICE"


def import_pyopencl():
    """pyopencl, or BackendUnavailableError saying how to get it."""
    try:
        import pyopencl
    except ImportError as exc:
        raise BackendUnavailableError(f"pyopencl is not installed ({exc}); {install_hint('opencl')}") from None
    return pyopencl


def _pick(items: list, wanted: str | None, what: str, env: str):
    """The item ``wanted`` names (index or name substring); None when nothing is wanted.

    A name or index that matches nothing is the user's mistake, not a missing driver:
    it raises InvalidArgumentError, which ``available()`` lets through, so a misspelled
    variable stops the program instead of quietly moving the work to the cpu.
    """
    if not wanted or not wanted.strip():
        return None
    wanted = wanted.strip()
    names = [f"{i}: {item.name.strip()}" for i, item in enumerate(items)]
    if wanted.isdigit():
        i = int(wanted)
        if i >= len(items):
            raise InvalidArgumentError(f"{env}={wanted}: there are only {len(items)} OpenCL {what}s: {names}")
        return items[i]
    for item in items:
        if wanted.lower() in item.name.lower():
            return item
    raise InvalidArgumentError(f"{env}={wanted!r} matches no OpenCL {what}; the {what}s here: {names}")


class Device:
    """One OpenCL device with its context and in-order queue."""

    def __init__(self, context: Any, queue: Any) -> None:
        self.cl = import_pyopencl()
        self.context = context
        self.queue = queue
        self.device = queue.device
        self.platform = self.device.platform
        # Before the first kernel object, which opens pyopencl's own cache.
        driver_caches.check_pyopencl_cache(self.cl)

    @classmethod
    def choose(cls, platform: str | None = None, device: str | None = None) -> "Device":
        """The named device, else the first GPU, else the first device; BackendUnavailableError if none."""
        cl = import_pyopencl()
        try:
            platforms = cl.get_platforms()
        except cl.Error as exc:
            raise BackendUnavailableError(f"no OpenCL platform found ({exc}); install an OpenCL driver "
                                          "(e.g. Debian's pocl-opencl-icd)") from None
        if not platforms:
            raise BackendUnavailableError("no OpenCL platform found; install an OpenCL driver "
                                          "(e.g. Debian's pocl-opencl-icd)")
        chosen_platform = _pick(platforms, platform, "platform", PLATFORM_ENV)
        listed = [chosen_platform] if chosen_platform else platforms
        candidates = []
        # PoCL reads its cache directory when its devices are first listed (see driver_caches).
        with driver_caches.pocl_cache(listed) as cache_problem:
            for p in listed:
                try:
                    candidates.extend(p.get_devices())
                except cl.Error:
                    continue
        if not candidates:
            raise BackendUnavailableError("the OpenCL platforms have no devices"
                                          + (f" ({cache_problem})" if cache_problem else ""))
        chosen = _pick(candidates, device, "device", DEVICE_ENV)
        if chosen is None:
            gpus = [d for d in candidates if d.type & cl.device_type.GPU]
            chosen = (gpus or candidates)[0]
        try:
            context = cl.Context([chosen])
            queue = cl.CommandQueue(context, chosen)
        except cl.Error as exc:
            raise BackendUnavailableError(f"could not open OpenCL device {chosen.name.strip()!r}: {exc}") from None
        return cls(context, queue)

    @classmethod
    def from_user(cls, context: Any, queue: Any = None) -> "Device":
        """A device around a user's pyopencl context (and queue; a new one when None)."""
        cl = import_pyopencl()
        if queue is None:
            queue = cl.CommandQueue(context)
        if queue.context != context:
            raise BackendUnavailableError("the OpenCL queue given does not belong to the context given")
        given = os.environ.get(driver_caches.POCL_CACHE_ENV)
        if given and any(driver_caches.is_pocl(d.platform) for d in context.devices):
            # PoCL took its cache directory when the user's context was made; its damaged
            # programs can still be moved aside before our builds read them.
            problem = driver_caches.user_cache_problem(given)
            if problem is not None:
                log.warning("PoCL cache %s %s", given, problem)
        return cls(context, queue)

    # -- what the device can do -----------------------------------------------------------
    @cached_property
    def extensions(self) -> set[str]:
        """The device's extension names."""
        return set(self.device.extensions.split())

    @property
    def fp16(self) -> bool:
        """True when the device does arithmetic in half precision (``cl_khr_fp16``)."""
        return "cl_khr_fp16" in self.extensions

    @cached_property
    def base_alignment(self) -> int:
        """Byte alignment of sub-buffer origins (``CL_DEVICE_MEM_BASE_ADDR_ALIGN``)."""
        return max(int(self.device.mem_base_addr_align) // 8, 4)

    @cached_property
    def max_work_group_size(self) -> int:
        """The largest work-group the device runs."""
        return int(self.device.max_work_group_size)

    @cached_property
    def is_gpu(self) -> bool:
        """True for a GPU device (PoCL's CPU device is not)."""
        return bool(self.device.type & self.cl.device_type.GPU)

    @cached_property
    def identity(self) -> str:
        """Platform, device and driver versions: part of every kernel cache key."""
        d = self.device
        return "|".join([self.platform.name, self.platform.version, d.name, d.version, d.driver_version,
                         d.vendor, str(d.type)])

    def info(self) -> dict:
        """What ``litegpu backends`` shows."""
        d = self.device
        return {
            "platform": f"{self.platform.name.strip()} ({self.platform.version.strip()})",
            "device": d.name.strip(),
            "type": "GPU" if self.is_gpu else "CPU" if d.type & self.cl.device_type.CPU else "accelerator",
            "driver": d.driver_version.strip(),
            "opencl": d.version.strip(),
            "compute units": d.max_compute_units,
            "global memory": f"{d.global_mem_size / 2**30:.1f} GiB",
            "max work-group": d.max_work_group_size,
            "fp16 arithmetic (cl_khr_fp16)": "yes" if self.fp16 else "no (half storage through vload_half)",
            "fp64": "yes" if "cl_khr_fp64" in self.extensions else "no",
            "pyopencl": ".".join(str(v) for v in self.cl.VERSION),
        }


@once
def default_device() -> Device:
    """The process's default device (chosen once; see the module docstring)."""
    return Device.choose(os.environ.get(PLATFORM_ENV), os.environ.get(DEVICE_ENV))
