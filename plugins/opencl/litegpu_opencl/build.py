"""Building OpenCL programs, through the on-disk kernel cache (see :mod:`litegpu.kernel_cache`).

A hit loads the stored binary (``clCreateProgramWithBinary`` + build, milliseconds); a
miss builds from source and stores the binary. pyopencl's own binary cache is never
used (``cache_dir=False``), with ours on or off: entries are not kept twice, our hits
never depend on it, and its files (a pickle among them) cannot break a run. PoCL's cache
is scratch for one process (see :mod:`.driver_caches`): ours is the one that lasts.

PoCL compiles each kernel's work-group function lazily, at its first enqueue (seconds
for a whole model), and the binary it hands out is a snapshot of its cache directory
at build time. :func:`store_warmed_binary`, for the program to call after its first run,
re-stores the entry with those functions inside, so a warm start needs neither a
build nor PoCL's own cache.

Every store keeps the cache directory under its size cap (``kernel_cache_max_bytes``,
``$LITEGPU_OPENCL_CACHE_MAX_BYTES``, 512 MiB by default), evicting the least recently
used entries; see :mod:`litegpu.kernel_cache`.
"""
from __future__ import annotations

import logging
import os
from typing import Any

from litegpu.backend import CompileOptions
from litegpu.errors import ExecutionError
from litegpu.kernel_cache import KernelCache, cache_dir, compile_forbidden, options_key

from .device import Device
from .driver_caches import POCL_PLATFORM

log = logging.getLogger("litegpu.opencl")

API = "opencl"   # its kernel cache (litegpu.kernel_cache)
BUILD_OPTIONS = ""   # no fast-math: results must match LiteRT's fp32


def _from_binary(device: Device, binary: bytes) -> Any:
    cl = device.cl
    return cl.Program(device.context, [device.device], [binary]).build(BUILD_OPTIONS)


def _from_source(device: Device, source: str, options: CompileOptions, cache: KernelCache | None,
                 key: str | None) -> Any:
    if compile_forbidden(API, options.extra):
        where = f"{cache.path(key)}" if cache is not None else f"{cache_dir(API, options.extra)} (cache off or unusable)"
        raise ExecutionError(f"the OpenCL kernel cache had no entry for this program ({where}) and compiling "
                             "is forbidden (forbid_compile / LITEGPU_OPENCL_FORBID_COMPILE)")
    # Built for our device only, so the program has exactly one binary to store.
    return build_source(device, source)


class BuildFailed(Exception):
    """The OpenCL compiler refused a source; the message is its build log."""


def build_source(device: Device, source: str) -> Any:
    """``source`` built for the device, bypassing pyopencl's cache; BuildFailed with the log."""
    cl = device.cl
    try:
        return cl.Program(device.context, source).build(BUILD_OPTIONS, devices=[device.device], cache_dir=False)
    except cl.Error as exc:
        raise BuildFailed(str(exc)) from None


def build_program(device: Device, source: str, options: CompileOptions) -> tuple[Any, bool]:
    """The built program and whether it came from the cache; BuildFailed when it does not build."""
    cl = device.cl
    cache = KernelCache.for_options(API, options.extra)
    if cache is None:
        return _from_source(device, source, options, None, None), False
    key = options_key(API, source, BUILD_OPTIONS, device.identity, options)
    binary = cache.load(key)
    if binary is not None:
        try:
            program = _from_binary(device, binary)
            log.debug("OpenCL kernel cache hit: %s", cache.path(key))
            return program, True
        except cl.Error as exc:   # verified bytes the driver no longer takes (e.g. it was upgraded in place)
            cache.discard(key, f"refused by the driver ({exc})")
    program = _from_source(device, source, options, cache, key)
    try:
        binaries = program.get_info(cl.program_info.BINARIES)
    except cl.Error as exc:
        log.warning("OpenCL kernel cache: the driver gives no program binary (%s); not cached", exc)
        return program, False
    if binaries and binaries[0]:
        cache.store(key, bytes(binaries[0]))
    return program, False


def store_warmed_binary(device: Device, source: str, options: CompileOptions) -> bool:
    """After a first run on PoCL, replace the program's entry with one holding the compiled kernels.

    Meant for a program built from source in this process (``cache_hit`` False), once its
    first run has completed. Rebuilding the same source is then a PoCL cache hit (~0.1 s)
    whose binary carries the work-group functions the run compiled. True when an entry
    was stored; a no-op elsewhere: other drivers' binaries are already final code.
    """
    cl = device.cl
    if device.platform.name != POCL_PLATFORM or os.environ.get("POCL_KERNEL_CACHE") == "0":
        return False   # without PoCL's cache the rebuild would be a full compile
    if compile_forbidden(API, options.extra):
        return False
    cache = KernelCache.for_options(API, options.extra)
    if cache is None:
        return False
    try:
        program = cl.Program(device.context, source).build(BUILD_OPTIONS, devices=[device.device], cache_dir=False)
        binary = bytes(program.get_info(cl.program_info.BINARIES)[0])
    except cl.Error as exc:
        log.warning("OpenCL kernel cache: could not refresh a PoCL binary (%s)", exc)
        return False
    return bool(binary) and cache.store(options_key(API, source, BUILD_OPTIONS, device.identity, options), binary)
