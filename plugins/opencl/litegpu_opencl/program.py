"""A compiled opencl partition: one OpenCL program, an arena, a flat list of launches.

Compile time does everything: each step's kernels are generated, identical sources are
deduplicated, the program is built (or loaded from the kernel cache), intermediates get
offsets in one arena planned by lifetime, constants are uploaded, and every kernel
object gets its fixed arguments. A run binds the partition's input and output device
tensors (:class:`ClTensor`; the executor does the host copies) and enqueues the launches
on the in-order queue; it returns the event of the last launch.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from litegpu import progress
from litegpu.backend import CompileOptions, Event, Partition, Program
from litegpu.errors import ExecutionError, InvalidArgumentError
from litegpu.memory import Usage, plan_arena

from .build import BuildFailed, build_program, build_source, store_warmed_binary
from litegpu.codegen import Precision, requested_precision
from litegpu.codegen.nodegen import StoredTensor
from litegpu.codegen.opencl import OPENCL
from litegpu.codegen.render import (IoBindings, assemble, build_failure, kernel_lanes, launched, lifetimes,
                                    partition_kernels)
from .device import Device
from .driver_caches import POCL_PLATFORM, new_kernel

log = logging.getLogger("litegpu.opencl")
_ZERO = np.int32(0)
_COMPLETE = 0   # CL_COMPLETE


@dataclass
class ClTensor(StoredTensor):
    """A tensor in device memory: a pyopencl buffer with its shape, dtype and storage dtype.

    ``dtype`` is the tensor's type as the model sees it; ``storage`` is what the device
    holds (float16 for float32 tensors in F32_F16/F16 mode).
    """

    buffer: Any
    shape: tuple[int, ...]
    dtype: np.dtype
    storage: np.dtype
    device: Device | None = None


class ClEvent(Event):
    """Completion of enqueued OpenCL work (wraps a ``pyopencl.Event``)."""

    def __init__(self, event: Any) -> None:
        self.event = event

    def wait(self, wait_type: str = "passive") -> None:
        """Block until the work is done: in the driver ("passive") or by polling ("active")."""
        if wait_type == "active":
            while not self.is_complete():
                pass
        self.event.wait()

    def is_complete(self) -> bool:
        """True when the work is done."""
        return self.event.command_execution_status == _COMPLETE


def new_tensor(device: Device, precision: Precision, shape, dtype, full_precision: bool = False) -> ClTensor:
    """A device tensor of ``shape``/``dtype`` stored as ``precision`` stores it."""
    cl = device.cl
    storage = precision.storage_dtype(dtype, full_precision)
    nbytes = int(np.prod(shape, dtype=np.int64)) * storage.itemsize
    buf = cl.Buffer(device.context, cl.mem_flags.READ_WRITE, max(nbytes, 1))
    return ClTensor(buf, tuple(int(d) for d in shape), np.dtype(dtype), storage, device)


def write(tensor: ClTensor, array: np.ndarray, wait_for=None) -> None:
    """Copy a host array into a device tensor, converting to its storage dtype.

    The copy is enqueued without waiting (a blocking write costs a queue round trip,
    ~70 us on PoCL) from a private snapshot that pyopencl keeps alive until it is done,
    so the caller may reuse ``array`` at once; later work on the in-order queue sees it.
    """
    host = np.array(array, dtype=tensor.storage, order="C", copy=True)
    if host.size != tensor.size:
        raise InvalidArgumentError(f"cannot write {host.size} elements into a device tensor of {tensor.size}")
    if host.nbytes:
        cl = tensor.device.cl
        cl.enqueue_copy(tensor.device.queue, tensor.buffer, host, wait_for=wait_for, is_blocking=False)


def read(tensor: ClTensor, out: np.ndarray, wait_for=None) -> None:
    """Copy a device tensor into a host array (blocking), converting from its storage dtype."""
    if out.size != tensor.size:
        raise InvalidArgumentError(f"cannot read a device tensor of {tensor.size} elements into {out.size}")
    if tensor.size == 0:
        return
    cl, queue = tensor.device.cl, tensor.device.queue
    if out.dtype == tensor.storage and out.flags.c_contiguous:
        cl.enqueue_copy(queue, out, tensor.buffer, wait_for=wait_for, is_blocking=True)
        return
    tmp = np.empty(tensor.shape, tensor.storage)
    cl.enqueue_copy(queue, tmp, tensor.buffer, wait_for=wait_for, is_blocking=True)
    out[...] = tmp.reshape(out.shape).astype(out.dtype)


def precision_for(device: Device, options: CompileOptions) -> Precision:
    """F32 unless precision loss is allowed; then half storage, and half arithmetic on fp16
    devices (F32_F16 on the others, or when the ``half_arithmetic`` delegate option is False)."""
    return requested_precision(options, device.fp16)


class _Launch:
    __slots__ = ("kernel", "global_size", "local_size", "io", "nodes", "name", "copy_of")

    def __init__(self, kernel, global_size, local_size, io, nodes=(), name="", copy_of=None) -> None:
        self.kernel = kernel
        self.global_size = global_size
        self.local_size = local_size
        self.io = io    # [(arg position, tensor index)] of partition inputs/outputs
        self.nodes = nodes   # the NodeContexts of the step it belongs to (for profiling)
        self.name = name     # its kernel function
        self.copy_of = copy_of   # see KernelSpec.copy_of


class ClProgram(Program):
    """See the module docstring."""

    def __init__(self, device: Device, partition: Partition, options: CompileOptions) -> None:
        self.device = device
        cl = self.cl = device.cl
        self.precision = precision_for(device, options)
        self.inputs = list(partition.inputs)
        self.outputs = list(partition.outputs)
        specs = partition.specs
        progress.report(f"opencl: generating kernels for {len(partition.nodes)} nodes")
        step_kernels = partition_kernels(partition, self.precision, lanes=kernel_lanes(not device.is_gpu))
        self.kernel_count = sum(len(k) for k in step_kernels)
        source, self.function_count = assemble(step_kernels, self.precision)
        try:
            self.program, self.cache_hit = build_program(device, source, options, self.function_count)
        except BuildFailed as exc:
            raise build_failure(partition, step_kernels, self.precision, OPENCL,
                                lambda one: build_source(device, one), str(exc)) from None
        # PoCL compiles each kernel's work-group code at its first launch, after the binary
        # was cached: once the first run is done, the cache entry is refreshed to hold it.
        self._refresh = None if self.cache_hit else (source, options)
        # Memory: intermediates at offsets of one arena; I/O buffers bound per run; constants uploaded.
        io = set(self.inputs) | set(self.outputs)
        used = lifetimes(step_kernels, io, specs)
        plan = plan_arena([Usage(t, self.precision.nbytes_of(specs[t]), f, l) for t, (f, l) in used.items()],
                          alignment=device.base_alignment)
        self.arena_bytes = plan.size
        mf = cl.mem_flags
        self.arena = cl.Buffer(device.context, mf.READ_WRITE, max(plan.size, device.base_alignment))
        # (buffer, element offset) of each intermediate
        arena_at = {t: np.int32(off // self.precision.storage_of(specs[t]).itemsize)
                    for t, off in plan.offsets.items()}
        # What each input/output buffer must hold: (elements, storage dtype).
        self.io_layout = {t: self.precision.layout_of(specs[t]) for t in io}
        # Float tensors a half-storage program keeps in float32 (see TensorSpec.full_precision).
        self.full_precision = sum(1 for t in set(used) | io if self.precision.half_storage
                                  and specs[t].dtype == np.float32 and specs[t].full_precision)
        self.const_bytes = 0
        # pyopencl's set_arg holds no reference: every buffer a kernel uses is kept here.
        self._constants: list[Any] = []
        consts: dict[int, Any] = {}
        self.launches: list[_Launch] = []
        for k, nodes in launched(partition, step_kernels):
            kernel = new_kernel(cl, self.program, f"k_{k.digest}")
            io_args = []
            for n, a in enumerate(k.args):
                pos, offset = 2 * n, _ZERO
                if a.tensor is not None and a.tensor in io:   # set when a run binds it
                    io_args.append((pos, a.tensor))
                    kernel.set_arg(pos + 1, offset)
                    continue
                if a.tensor is not None and specs[a.tensor].value is not None:
                    if a.tensor not in consts:
                        spec = specs[a.tensor]
                        consts[a.tensor] = self._upload(
                            np.asarray(spec.value).astype(self.precision.storage_of(spec)), convert=False)
                    buffer = consts[a.tensor]
                elif a.tensor is not None:
                    buffer, offset = self.arena, arena_at[a.tensor]
                else:
                    buffer = self._upload(a.const, convert=False)
                kernel.set_arg(pos, buffer)
                kernel.set_arg(pos + 1, offset)
            self.launches.append(_Launch(kernel, k.global_size, k.local_size, io_args, nodes, f"k_{k.digest}",
                                         k.copy_of))
        self._io = IoBindings(self.launches)
        if log.isEnabledFor(logging.DEBUG):
            log.debug("OpenCL program (%s): %s", "from cache" if self.cache_hit else "built", "; ".join(
                f"{launch.name} for node{'s' if len(launch.nodes) > 1 else ''} "
                f"{'+'.join(f'{c.node.index} {c.node.op}' for c in launch.nodes)}" for launch in self.launches))

    # -- memory ---------------------------------------------------------------------------
    def _upload(self, array: np.ndarray, convert: bool = True) -> Any:
        if convert:
            array = array.astype(self.precision.storage_dtype(array.dtype))
        array = np.ascontiguousarray(array)
        self.const_bytes += array.nbytes
        mf = self.cl.mem_flags
        if array.nbytes == 0:
            buf = self.cl.Buffer(self.device.context, mf.READ_ONLY, 1)
        else:
            buf = self.cl.Buffer(self.device.context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=array)
        self._constants.append(buf)
        return buf

    @property
    def summary(self) -> str:
        """Precision, kernels and memory, for the delegation report."""
        p = self.precision
        kept = f" ({self.full_precision} tensors kept fp32)" if self.full_precision else ""
        return (f"{p.name} ({p.storage} storage{kept}, {p.arithmetic} arithmetic), {len(self.launches)} launches of "
                f"{self.function_count} kernels, arena {self.arena_bytes / 1e6:.2f} MB, "
                f"constants {self.const_bytes / 1e6:.2f} MB, program {'from cache' if self.cache_hit else 'built'}")

    # -- running ------------------------------------------------------------------------------
    def run(self, inputs: Sequence[ClTensor], outputs: Sequence[ClTensor], wait_for: Sequence[Event] = ()) -> Event:
        """Enqueue the partition on device tensors (inputs and outputs in partition order).

        Returns at once with the event of the last launch; the in-order queue orders
        later work after it. Events of other devices or the host are waited for here.
        """
        cl_wait = [e.event for e in wait_for if isinstance(e, ClEvent)] or None
        for e in wait_for:
            if not isinstance(e, ClEvent):
                e.wait()
        self._bind_all(inputs, outputs)
        if self._refresh is not None:
            return self._first_run(cl_wait)
        queue, enqueue = self.device.queue, self.cl.enqueue_nd_range_kernel
        event = None
        try:
            for launch in self._io.running:
                event = enqueue(queue, launch.kernel, launch.global_size, launch.local_size, wait_for=cl_wait)
                cl_wait = None
        except self.cl.Error as exc:
            raise ExecutionError(f"OpenCL launch failed: {exc}") from None
        return ClEvent(event if event is not None else self.cl.enqueue_marker(queue, wait_for=cl_wait))

    def _first_run(self, cl_wait) -> ClEvent:
        """:meth:`run` the first time after a build from source: every launch is waited for in
        turn, saying which, since PoCL compiles each kernel for its launch sizes when it
        first runs (mobilenet_v2: ~8 s on 2 cores) and a silent wait looks like a hang.
        Then :meth:`_finished` stores the warmed binary."""
        queue, enqueue = self.device.queue, self.cl.enqueue_nd_range_kernel
        events = []
        try:
            for launch in self._io.running:
                events.append(enqueue(queue, launch.kernel, launch.global_size, launch.local_size,
                                      wait_for=cl_wait))
                cl_wait = None
        except self.cl.Error as exc:
            raise ExecutionError(f"OpenCL launch failed: {exc}") from None
        what = "PoCL compiles each kernel (once, then cached)" \
            if self.device.platform.name == POCL_PLATFORM else "the driver prepares each kernel"
        for n, event in enumerate(events):
            # The in-order queue runs launches one after another, so their events complete
            # in order: the count moves as the driver gets through them.
            progress.report(f"opencl: first launch {n + 1}/{len(events)}, {what}")
            event.wait()
        return self._finished(ClEvent(events[-1] if events else self.cl.enqueue_marker(queue, wait_for=cl_wait)))

    def kernels(self) -> list[tuple[tuple[int, ...], str]]:
        """Each launch's nodes (a producer and its folded followers) and its kernel function."""
        return [(tuple(c.node.index for c in launch.nodes), launch.name) for launch in self.launches]

    def run_profiled(self, inputs: Sequence[ClTensor], outputs: Sequence[ClTensor], wait_for: Sequence[Event],
                     profiler) -> Event:
        """:meth:`run` on a profiling queue, each launch recorded into ``profiler`` (a
        ``litegpu.profile.Profiler``) with the device's own start and end times."""
        from litegpu.profile import Slice, node_info, nodes_label
        queue = _profiling_queue(self.device, profiler)
        enqueue, clock = self.cl.enqueue_nd_range_kernel, time.perf_counter
        backend = "opencl"
        track = f"queue ({self.device.device.name.strip()})"
        for e in wait_for:
            e.wait()
        self._bind_all(inputs, outputs)
        event = None
        try:
            for n, launch in enumerate(self._io.running):
                enqueued = clock()
                event = enqueue(queue, launch.kernel, launch.global_size, launch.local_size)
                infos = tuple(node_info(c) for c in launch.nodes)
                profiler.add_device(event, enqueued, Slice(
                    nodes_label(infos), "kernel", backend, track, 0.0, 0.0, infos, backend,
                    {"kernel": launch.name, "global": list(launch.global_size), "precision": self.precision.name,
                     "first": n == 0}))
        except self.cl.Error as exc:
            raise ExecutionError(f"OpenCL launch failed: {exc}") from None
        return self._finished(ClEvent(event if event is not None else self.cl.enqueue_marker(queue)))

    def _finished(self, event: ClEvent) -> ClEvent:
        """``event`` of a run's last launch; after the first run only, wait for it and store
        the warmed binary (PoCL finalizes kernels on first use)."""
        if self._refresh is not None:
            event.wait()
            progress.report("opencl: storing the compiled kernels in the kernel cache")
            store_warmed_binary(self.device, *self._refresh)
            self._refresh = None
        return event

    def _bind_all(self, inputs: Sequence[ClTensor], outputs: Sequence[ClTensor]) -> None:
        """Point the launches at these input and output tensors (partition order)."""
        self._io.bind((*self.inputs, *self.outputs), (*inputs, *outputs), self._attach)

    def _attach(self, t: int, tensor: ClTensor, uses) -> None:
        ClTensor.check_binding(t, tensor, self.io_layout[t])
        for launch, pos in uses:
            launch.kernel.set_arg(pos, tensor.buffer)


def _profiling_queue(device: Device, profiler) -> Any:
    """An in-order queue with profiling enabled, put in place of ``device.queue`` (copies
    use it too, so order is kept) until ``profiler`` ends; the usual queue, which has no
    profiling cost, is put back then."""
    queue = device.queue
    if queue.properties & device.cl.command_queue_properties.PROFILING_ENABLE:
        return queue
    queue.finish()
    profiling = device.cl.CommandQueue(device.context, device.device,
                                       properties=device.cl.command_queue_properties.PROFILING_ENABLE)
    device.queue = profiling

    def restore() -> None:
        profiling.finish()
        device.queue = queue
    profiler.on_exit(restore)
    return profiling
