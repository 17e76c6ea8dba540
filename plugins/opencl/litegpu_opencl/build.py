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

import ctypes
import logging
import os
from functools import lru_cache
from typing import Any

from litegpu import progress
from litegpu.backend import CompileOptions
from litegpu.errors import ExecutionError
from litegpu.kernel_cache import KernelCache, cache_dir, compile_forbidden, options_key

from .device import Device
from .driver_caches import POCL_PLATFORM

log = logging.getLogger("litegpu.opencl")

API = "opencl"   # its kernel cache (litegpu.kernel_cache)
# No fast-math, and divisions and square roots correctly rounded (OpenCL allows 2.5 ulp
# otherwise): results must match LiteRT's fp32.
BUILD_OPTIONS = "-cl-fp32-correctly-rounded-divide-sqrt"


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


def build_program(device: Device, source: str, options: CompileOptions, kernels: int = 0) -> tuple[Any, bool]:
    """The built program and whether it came from the cache; BuildFailed when it does not build.

    ``kernels``, the number of kernel functions in ``source``, is for the progress reports.
    """
    cl = device.cl
    cache = KernelCache.for_options(API, options.extra)
    count = f"{kernels} " if kernels else ""
    if cache is None:
        progress.report(f"opencl: building a program of {count}kernels (kernel cache off: in every process)")
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
    progress.report(f"opencl: building a program of {count}kernels (once, then cached)")
    program = _from_source(device, source, options, cache, key)
    if device.platform.name == POCL_PLATFORM:   # the slow part of a cold start on PoCL (see program_binary)
        progress.report(f"opencl: PoCL compiling {count}kernels into a binary for the cache (once)")
    try:
        binary = program_binary(device, program)
    except cl.Error as exc:
        log.warning("OpenCL kernel cache: the driver gives no program binary (%s); not cached", exc)
        return program, False
    if binary:
        cache.store(key, binary)
    return program, False


def program_binary(device: Device, program: Any) -> bytes:
    """The built ``program``'s binary for ``device`` (empty when the driver has none).

    PoCL makes the binary when it is asked for (mobilenet_v2: ~8 s, compiling every kernel's
    work-group function), and pyopencl's ``get_info`` holds the GIL through that, freezing
    every other Python thread, the command's spinner included. So the binary is read
    through ctypes, which releases the GIL around the call, from the OpenCL library
    pyopencl itself calls; where that library cannot be found, through pyopencl.
    Raises ``pyopencl.Error`` as pyopencl's ``get_info`` does.
    """
    binary = _binary_releasing_gil(device, program)
    if binary is None:
        binaries = program.get_info(device.cl.program_info.BINARIES)
        binary = bytes(binaries[0]) if binaries and binaries[0] else b""
    return binary


# cl_program_info values (cl.h)
_NUM_DEVICES, _DEVICES, _BINARY_SIZES, _BINARIES = 0x1162, 0x1163, 0x1165, 0x1166


@lru_cache(maxsize=1)
def _get_program_info():
    """``clGetProgramInfo`` of the OpenCL library pyopencl's extension is linked to (its own
    copy in a wheel), or None. Symbols are looked up through the extension module, whose
    dependencies are searched too, so it is the same library pyopencl calls."""
    try:
        import pyopencl._cl as native
        function = ctypes.CDLL(native.__file__).clGetProgramInfo
    except (ImportError, OSError, AttributeError) as exc:
        log.debug("clGetProgramInfo not reachable through ctypes (%s): reading binaries through pyopencl", exc)
        return None
    function.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_size_t, ctypes.c_void_p,
                         ctypes.POINTER(ctypes.c_size_t)]
    function.restype = ctypes.c_int32
    return function


def _binary_releasing_gil(device: Device, program: Any) -> bytes | None:
    """The binary for ``device`` read with the GIL released; None when that cannot be
    done here or the driver reported an error (the caller asks pyopencl, which raises it)."""
    get = _get_program_info()
    pointer = getattr(program, "int_ptr", None)
    if get is None or pointer is None:
        return None
    handle = ctypes.c_void_p(pointer)
    count = ctypes.c_uint32()
    if get(handle, _NUM_DEVICES, ctypes.sizeof(count), ctypes.byref(count), None) != 0 or count.value == 0:
        return None
    devices = (ctypes.c_void_p * count.value)()
    sizes = (ctypes.c_size_t * count.value)()
    if (get(handle, _DEVICES, ctypes.sizeof(devices), devices, None) != 0
            or get(handle, _BINARY_SIZES, ctypes.sizeof(sizes), sizes, None) != 0):   # the slow call
        return None
    ours = getattr(device.device, "int_ptr", None)
    index = next((i for i, d in enumerate(devices) if d == ours), 0)
    buffers = [ctypes.create_string_buffer(max(size, 1)) for size in sizes]
    pointers = (ctypes.c_void_p * count.value)(*(ctypes.addressof(b) for b in buffers))
    if get(handle, _BINARIES, ctypes.sizeof(pointers), pointers, None) != 0:
        return None
    return buffers[index].raw[:sizes[index]]


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
        binary = program_binary(device, program)
    except cl.Error as exc:
        log.warning("OpenCL kernel cache: could not refresh a PoCL binary (%s)", exc)
        return False
    return bool(binary) and cache.store(options_key(API, source, BUILD_OPTIONS, device.identity, options), binary)
