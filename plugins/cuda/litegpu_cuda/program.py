"""A compiled cuda partition: its CUDA modules, an arena, a flat list of launches.

Compile time does everything, as on opencl: the partition is rendered as CUDA C++
programs of a few kernels each (:mod:`litegpu.codegen.render`), compiled side by side by
NVRTC to cubins for the device's arch (or loaded from the kernel cache), one module
each; intermediates get offsets in one device
allocation planned by lifetime, constants are uploaded, and each launch gets an
argument block: one device pointer per kernel parameter, already at its tensor's
offset. A run writes the bound input and output pointers into those blocks,
enqueues every launch on the stream and returns an event recorded after the last.

A partition run again on the same input and output pointers (a decoder's steps) is
captured as a CUDA graph at its second run on them and replayed from then on: one
``cuGraphLaunch`` in place of hundreds of ``cuLaunchKernel`` calls from Python. A few
graphs are kept per program, by pointers; a stream that cannot be captured (the legacy
default stream a user handed over) runs launch by launch, as does every program under
``LITEGPU_CUDA_GRAPHS=0``.
"""
from __future__ import annotations

import logging
import math
import os
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from litegpu import env
from litegpu.backend import CompileOptions, Event, Partition, Program
from litegpu.codegen import Precision, requested_precision
from litegpu.codegen.nodegen import StoredTensor
from litegpu.codegen.cuda import CUDA
from litegpu.codegen.render import (IoBindings, assemble_parts, blocks, build_failure, launched, lifetimes,
                                    partition_kernels)
from litegpu.errors import ExecutionError, InvalidArgumentError
from litegpu.kernel_cache import KernelCache, compile_forbidden, options_key
from litegpu.memory import Usage, plan_arena

from . import nvrtc
from .device import Device, Memory, check

log = logging.getLogger("litegpu.cuda")
API = "cuda"
GRAPHS_ENV = "LITEGPU_CUDA_GRAPHS"
MAX_GRAPHS = 4    # per program: a decoder alternates two KV caches
ALIGNMENT = 256   # cuMemAlloc's own alignment: every tensor's pointer is as aligned as an allocation


@dataclass
class CudaTensor(StoredTensor):
    """A tensor in device memory: its address, shape, dtype and storage dtype.

    ``owner`` keeps the memory alive (our :class:`Memory`, or the user's array we wrap).
    ``__cuda_array_interface__`` lets CuPy, PyTorch and numba use it without a copy.
    """

    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype
    storage: np.dtype
    device: Device
    owner: Any = None


    @property
    def __cuda_array_interface__(self) -> dict:
        """Version 3 of the CUDA array interface (C-contiguous, in its storage dtype)."""
        return {"shape": self.shape, "typestr": self.storage.str, "data": (self.ptr, False), "version": 3,
                "strides": None, "stream": int(self.device.stream) or None}


class CudaEvent(Event):
    """Completion of work enqueued on a stream (a ``CUevent`` recorded after it)."""

    def __init__(self, device: Device, event: Any) -> None:
        self.device, self.event = device, event

    def wait(self, wait_type: str = "passive") -> None:
        """Block until the work is done: in the driver ("passive") or by polling ("active")."""
        self.device.activate()
        if wait_type == "active":
            while not self.is_complete():
                pass
        check(self.device.cu.cuEventSynchronize(self.event), "cuEventSynchronize")

    def is_complete(self) -> bool:
        """True when the work is done."""
        self.device.activate()
        err, = self.device.cu.cuEventQuery(self.event)
        return err == self.device.cu.CUresult.CUDA_SUCCESS

    def __del__(self) -> None:
        try:
            self.device.cu.cuEventDestroy(self.event)
        except Exception:   # noqa: BLE001 - at interpreter exit the driver may be gone
            pass


def order_after(device: Device, events: Sequence[Event]) -> None:
    """Make the stream wait for ``events``: on the device for CUDA events, here for others."""
    for e in events:
        if isinstance(e, CudaEvent):
            check(device.cu.cuStreamWaitEvent(device.stream, e.event, 0), "cuStreamWaitEvent")
        else:
            e.wait()


def new_tensor(device: Device, precision: Precision, shape, dtype, full_precision: bool = False) -> CudaTensor:
    """A device tensor of ``shape``/``dtype`` stored as ``precision`` stores it."""
    storage = precision.storage_dtype(dtype, full_precision)
    shape = tuple(int(d) for d in shape)
    memory = device.alloc(math.prod(shape) * storage.itemsize)
    return CudaTensor(memory.ptr, shape, np.dtype(dtype), storage, device, memory)


def write(tensor: CudaTensor, array: np.ndarray, wait_for: Sequence[Event] = ()) -> None:
    """Copy a host array into a device tensor, converting to its storage dtype.

    Ordered on the stream after ``wait_for``. From pageable host memory the driver stages
    the bytes before the call returns, so the caller may reuse ``array`` at once.
    """
    host = np.ascontiguousarray(array, dtype=tensor.storage)
    if host.size != tensor.size:
        raise InvalidArgumentError(f"cannot write {host.size} elements into a device tensor of {tensor.size}")
    device = tensor.device
    device.activate()
    order_after(device, wait_for)
    if host.nbytes:
        check(device.cu.cuMemcpyHtoDAsync(tensor.ptr, host.ctypes.data, host.nbytes, device.stream), "cuMemcpyHtoD")


def read(tensor: CudaTensor, out: np.ndarray, wait_for: Sequence[Event] = ()) -> None:
    """Copy a device tensor into a host array (blocking), converting from its storage dtype."""
    if out.size != tensor.size:
        raise InvalidArgumentError(f"cannot read a device tensor of {tensor.size} elements into {out.size}")
    device = tensor.device
    device.activate()
    order_after(device, wait_for)
    if tensor.size == 0:
        return
    direct = out.dtype == tensor.storage and out.flags.c_contiguous
    host = out if direct else np.empty(tensor.shape, tensor.storage)
    check(device.cu.cuMemcpyDtoHAsync(host.ctypes.data, tensor.ptr, tensor.nbytes, device.stream), "cuMemcpyDtoH")
    device.synchronize()
    if not direct:
        out[...] = host.reshape(out.shape).astype(out.dtype)


def precision_for(device: Device, options: CompileOptions) -> Precision:
    """F32 unless precision loss is allowed; then half storage, and half arithmetic where the
    device has it (as on opencl)."""
    return requested_precision(options, device.fp16)


#: Functions per NVRTC program. NVRTC compiles several programs at once in threads (it
#: releases the GIL), and a partition's kernels take ~0.1 s each to optimize: mobilenet_v2's
#: 32 took 5.3 s as one program, 3.0 s as two on 2 cores, and ~8 parts run side by side on a
#: GPU machine's 16. Each part also parses the prelude (cuda_fp16.h: ~0.08 s), so parts are
#: not single kernels. A fixed count, not one per core, keeps the cache keys machine-independent.
FUNCTIONS_PER_PART = 4


def build_cubins(device: Device, sources: Sequence[str], options: CompileOptions) -> tuple[list[bytes], bool]:
    """The cubins of ``sources``, built side by side in threads where the kernel cache lacks
    them, and whether every one came from the cache."""
    workers = min(len(sources), len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                  else os.cpu_count() or 1)
    if workers <= 1:
        built = [build_cubin(device, s, options) for s in sources]
    else:
        with ThreadPoolExecutor(workers, thread_name_prefix="litegpu-nvrtc") as pool:
            built = list(pool.map(lambda s: build_cubin(device, s, options), sources))
    return [cubin for cubin, _ in built], all(hit for _, hit in built)


def build_cubin(device: Device, source: str, options: CompileOptions) -> tuple[bytes, bool]:
    """The cubin of ``source`` for the device, and whether it came from the kernel cache."""
    cache = KernelCache.for_options(API, options.extra)
    build_options = " ".join(nvrtc.OPTIONS) + f" sm_{device.arch} nvrtc {nvrtc.version()}"
    key = options_key(API, source, build_options, device.identity, options)
    if cache is not None:
        cubin = cache.load(key)
        if cubin is not None:
            return cubin, True
    if compile_forbidden(API, options.extra):
        raise ExecutionError("the cuda kernel cache had no entry for this program and compiling is forbidden "
                             "(forbid_compile / LITEGPU_CUDA_FORBID_COMPILE)")
    cubin = nvrtc.compile_source(source, device.arch, cubin=True)
    if cache is not None:
        cache.store(key, cubin)
    return cubin, False


class _Launch:
    __slots__ = ("function", "grid", "block", "values", "pointers", "io", "nodes", "name", "copy_of")

    def __init__(self, function, grid, block, values: np.ndarray, io, nodes, name, copy_of=None) -> None:
        self.function, self.grid, self.block = function, grid, block
        self.values = values   # one uint64 per parameter: the device pointer passed
        # cuLaunchKernel takes an array of pointers to the parameter values.
        self.pointers = np.array([values.ctypes.data + 8 * i for i in range(len(values))], np.uint64)
        self.io = io           # [(parameter position, tensor index)] bound per run
        self.nodes, self.name = nodes, name
        self.copy_of = copy_of   # see KernelSpec.copy_of


class CudaProgram(Program):
    """See the module docstring."""

    def __init__(self, device: Device, partition: Partition, options: CompileOptions) -> None:
        self.device = device
        cu = device.cu
        device.activate()
        self.precision = precision_for(device, options)
        self.inputs, self.outputs = list(partition.inputs), list(partition.outputs)
        specs = partition.specs
        step_kernels = partition_kernels(partition, self.precision, CUDA)
        parts = assemble_parts(step_kernels, self.precision, CUDA, FUNCTIONS_PER_PART)
        self.function_count = sum(len(names) for _, names in parts)
        try:
            cubins, self.cache_hit = build_cubins(device, [source for source, _ in parts], options)
        except nvrtc.CompileError as exc:
            raise build_failure(partition, step_kernels, self.precision, CUDA,
                                lambda one: nvrtc.compile_source(one, device.arch), exc.log) from None
        self.modules = [check(cu.cuModuleLoadData(cubin), "cuModuleLoadData") for cubin in cubins]
        module_of = {name: module for module, (_, names) in zip(self.modules, parts) for name in names}
        # Memory: intermediates at offsets of one allocation; I/O bound per run; constants uploaded.
        io = set(self.inputs) | set(self.outputs)
        plan = plan_arena([Usage(t, self.precision.nbytes_of(specs[t]), f, l)
                           for t, (f, l) in lifetimes(step_kernels, io, specs).items()], alignment=ALIGNMENT)
        self.arena_bytes = plan.size
        self.arena = device.alloc(plan.size)
        self.io_layout = {t: self.precision.layout_of(specs[t]) for t in io}
        self.const_bytes = 0
        self._memory: list[Memory] = [self.arena]
        consts: dict[int, int] = {}
        self.launches: list[_Launch] = []
        functions: dict[str, Any] = {}
        for k, nodes in launched(partition, step_kernels):
            name = f"k_{k.digest}"
            if name not in functions:
                functions[name] = check(cu.cuModuleGetFunction(module_of[name], name.encode()),
                                        "cuModuleGetFunction")
            values = np.zeros(len(k.args), np.uint64)
            io_args = []
            for n, a in enumerate(k.args):
                if a.tensor is not None and a.tensor in io:
                    io_args.append((n, a.tensor))
                elif a.tensor is not None and specs[a.tensor].value is not None:
                    if a.tensor not in consts:
                        spec = specs[a.tensor]
                        consts[a.tensor] = self._upload(np.asarray(spec.value).astype(self.precision.storage_of(spec)))
                    values[n] = consts[a.tensor]
                elif a.tensor is not None:
                    values[n] = self.arena.ptr + plan.offsets[a.tensor]
                else:
                    values[n] = self._upload(a.const)
            grid, block = blocks(k)
            self.launches.append(_Launch(functions[name], grid, block, values, io_args, nodes, name, k.copy_of))
        self._io = IoBindings(self.launches)
        self._graphs = GraphCache(lambda graph: check(cu.cuGraphExecDestroy(graph)), env.flag(GRAPHS_ENV, True))
        weakref.finalize(self, self._graphs.close)   # (the cache holds no reference to the program)

    def _upload(self, array: np.ndarray) -> int:
        array = np.ascontiguousarray(array)
        memory = self.device.alloc(array.nbytes)
        if array.nbytes:
            check(self.device.cu.cuMemcpyHtoD(memory.ptr, array.ctypes.data, array.nbytes), "cuMemcpyHtoD")
        self._memory.append(memory)
        self.const_bytes += array.nbytes
        return memory.ptr

    @property
    def summary(self) -> str:
        """Precision, kernels and memory, for the delegation report."""
        p = self.precision
        return (f"{p.name} ({p.storage} storage, {p.arithmetic} arithmetic), {len(self.launches)} launches of "
                f"{self.function_count} kernels, arena {self.arena_bytes / 1e6:.2f} MB, constants "
                f"{self.const_bytes / 1e6:.2f} MB, sm_{self.device.arch} cubin "
                f"{'from cache' if self.cache_hit else 'built'}")

    def run(self, inputs: Sequence[CudaTensor], outputs: Sequence[CudaTensor], wait_for: Sequence[Event] = ()
            ) -> Event:
        """Enqueue the partition on device tensors (inputs and outputs in partition order);
        returns at once with an event recorded after the last launch."""
        device = self.device
        device.activate()
        order_after(device, wait_for)
        self._io.bind((*self.inputs, *self.outputs), (*inputs, *outputs), self._attach)
        graph = self._graphs.graph_for(tuple(self._io.bound[t].ptr for t in (*self.inputs, *self.outputs)),
                                       self._capture)
        if graph is not None:
            check(device.cu.cuGraphLaunch(graph, device.stream), "cuGraphLaunch")
        else:
            self._launch_all()
        return device.record()

    def _launch_all(self) -> None:
        """Enqueue the launches a run makes (:func:`running`) on the stream, on the pointers bound now."""
        cu, stream = self.device.cu, self.device.stream
        launch_kernel, success = cu.cuLaunchKernel, cu.CUresult.CUDA_SUCCESS
        for launch in self._io.running:
            result = launch_kernel(launch.function, *launch.grid, *launch.block, 0, stream,
                                   launch.pointers.ctypes.data, 0)
            if result[0] != success:
                check(result, f"cuLaunchKernel ({launch.name})")

    def _capture(self) -> Any:
        """The launches, on the pointers bound now, captured as an instantiated graph;
        ExecutionError where the stream cannot capture."""
        cu, stream = self.device.cu, self.device.stream
        check(cu.cuStreamBeginCapture(stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
              "cuStreamBeginCapture")
        graph = None
        try:
            try:
                self._launch_all()
            finally:   # (a capture left open would turn every later call on the stream into an error)
                graph = check(cu.cuStreamEndCapture(stream), "cuStreamEndCapture")
            return check(cu.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        finally:
            if graph is not None:
                cu.cuGraphDestroy(graph)

    def _attach(self, t: int, tensor: CudaTensor, uses) -> None:
        CudaTensor.check_binding(t, tensor, self.io_layout[t])
        for launch, pos in uses:
            launch.values[pos] = tensor.ptr



class GraphCache:
    """Which runs of a program replay a captured graph (see the module docstring): a run on
    pointers seen in one of the last few runs captures, and later runs on them replay it;
    the ``keep`` newest graphs are kept (``destroy(graph)`` for the others). A failed
    capture turns graphs off for good."""

    def __init__(self, destroy: Callable[[Any], None], enabled: bool = True, keep: int = MAX_GRAPHS) -> None:
        self._destroy, self.enabled, self._keep = destroy, enabled, keep
        self._graphs: dict[tuple, Any] = {}
        self._seen: dict[tuple, None] = {}    # pointers of recent runs launched one by one

    def graph_for(self, pointers: tuple, capture: Callable[[], Any]) -> Any:
        """The graph to launch for a run on ``pointers`` (``capture()`` makes one, or raises
        ExecutionError); None: launch one by one."""
        if not self.enabled:
            return None
        graph = self._graphs.get(pointers)
        if graph is not None:
            return graph
        if pointers not in self._seen:
            self._seen[pointers] = None
            if len(self._seen) > self._keep:
                del self._seen[next(iter(self._seen))]
            return None
        try:
            graph = capture()
        except ExecutionError as exc:
            log.info("cuda: launching kernels one by one: the stream could not be captured as a CUDA graph (%s)",
                     exc)
            self.enabled = False
            self.close()
            return None
        if len(self._graphs) >= self._keep:
            self._destroy(self._graphs.pop(next(iter(self._graphs))))
        self._graphs[pointers] = graph
        return graph

    def __len__(self) -> int:
        """How many graphs are kept."""
        return len(self._graphs)

    def close(self) -> None:
        """Destroy every graph kept."""
        graphs, self._graphs = list(self._graphs.values()), {}
        for graph in graphs:
            try:
                self._destroy(graph)
            except Exception:   # noqa: BLE001 - at interpreter exit the driver may be gone
                pass
