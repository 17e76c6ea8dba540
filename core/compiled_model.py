"""``litegpu.CompiledModel``: a mirror of ``ai_edge_litert.compiled_model.CompiledModel``.

With ``Environment``, ``TensorBuffer``, ``HardwareAccelerator`` and ``Options`` /
``CpuOptions`` / ``GpuOptions`` spelled as LiteRT spells them. A specific backend is
named with ``backend="opencl"`` (or any plugin's backend name).
"""
from __future__ import annotations

import enum
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from .backend import COMPLETE, Event
from .errors import InvalidArgumentError
from .executor import BOUND_SETS, CompiledSubgraph, FutureEvent
from .graph import Signature
from .interpreter import tensor_details
from .model import load_model
from .ops import TensorSpec
from .session import Session
from .tensor_buffer import TensorBuffer


class HardwareAccelerator(enum.IntFlag):
    """LiteRT's accelerator flags; combine with ``|`` (GPU | CPU falls back to cpu)."""

    NONE = 0
    CPU = 1
    GPU = 2
    NPU = 4


@dataclass
class CpuOptions:
    """CPU options (LiteRT's names)."""

    num_threads: int = 0


@dataclass
class GpuOptions:
    """GPU options with LiteRT's names.

    ``enforce_f32=False`` allows fp16 storage (precision loss). ``serialization_dir`` is
    where compiled kernels are cached (default: litegpu's cache directory) and
    ``model_token`` an optional extra cache key; the cache is keyed by content without it.
    """

    enforce_f32: bool = True
    serialization_dir: str | None = None
    model_token: str | None = None

    def extra(self) -> dict:
        """The settings backends read from ``CompileOptions.extra``."""
        return {k: v for k, v in (("serialization_dir", self.serialization_dir),
                                  ("model_token", self.model_token)) if v is not None}


@dataclass
class Options:
    """Per-model options: accelerators and their option groups, plus litegpu's own: a
    backend name, and ``placement`` ("first": each node on the first accelerator that
    supports it; "measure": the fastest measured assignment, never slower than all-cpu,
    cached on disk; see :class:`litegpu.Interpreter`)."""

    hardware_accelerators: HardwareAccelerator = HardwareAccelerator.CPU
    cpu_options: CpuOptions = field(default_factory=CpuOptions)
    gpu_options: GpuOptions = field(default_factory=GpuOptions)
    backend: str | None = None
    placement: str = "first"

    @classmethod
    def create(cls) -> "Options":
        """Default options, like the C++ factory."""
        return cls()


@dataclass
class Environment:
    """Shared runtime state; backends may read device handles from ``options``
    (e.g. a user's OpenCL context and queue)."""

    options: dict = field(default_factory=dict)

    @classmethod
    def create(cls, **options: Any) -> "Environment":
        """A new environment with backend-specific options."""
        return cls(dict(options))

    def close(self) -> None:
        """Release the environment (nothing held on the host)."""

    def __enter__(self) -> "Environment":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _backend_names(options: Options) -> list[str]:
    """The backend preference list: a named backend, else GPU when its flag is set (cpu is the fallback)."""
    if options.backend:
        return [options.backend]
    return ["GPU"] if HardwareAccelerator(options.hardware_accelerators) & HardwareAccelerator.GPU else []


def _check_input(compiled: CompiledSubgraph, t: int, array: np.ndarray) -> None:
    """Raise now, in the caller, what ``compiled.set_input`` would raise on the worker."""
    dst = compiled.host[t]
    if array.shape != dst.shape or array.dtype != dst.dtype:
        compiled.set_input(t, array)   # raises, naming the tensor; equal shapes and dtypes never get here


def _output_copier(compiled: CompiledSubgraph, t: int, buf: TensorBuffer):
    """Copies output ``t`` of a finished run into a host buffer (into a device buffer's host copy first)."""
    def finish() -> None:
        value = compiled.output(t)
        target = buf._array
        np.copyto(target.reshape(value.shape), value)
        if buf.is_device:
            backend, buffer = buf.device
            backend.copy_in(buffer, target)
    return finish


def _check_device_aliases(sig: Signature, compiled: CompiledSubgraph, bound: dict[int, tuple]) -> None:
    """One device buffer given for an input and an output, or for two outputs, must be an
    update in place (:meth:`CompiledSubgraph.updates_in_place`: a KV cache): a device run
    reads and writes the buffers where they lie, so any other sharing would read what the
    run has already overwritten. InvalidArgumentError naming the tensors otherwise."""
    by_buffer: dict[int, list[int]] = {}
    for t, (_, buffer) in bound.items():
        by_buffer.setdefault(id(buffer), []).append(t)
    outputs = set(sig.outputs.values())
    shared = [ts for ts in by_buffer.values() if len(ts) > 1 and outputs.intersection(ts)]
    if shared and not (all(len(ts) == 2 for ts in shared) and compiled.updates_in_place([tuple(ts) for ts in shared])):
        names = {t: n for n, t in (*sig.inputs.items(), *sig.outputs.items())}
        ts = shared[0]
        raise InvalidArgumentError(
            f"signature {sig.key!r}: one device buffer is given for {', '.join(repr(names[t]) for t in ts)}; "
            "an input and an output share a buffer only where a DYNAMIC_UPDATE_SLICE updates that input in "
            "place (a KV cache) and nothing else reads it")


def _host_run(sig: Signature, compiled: CompiledSubgraph, buffers: Sequence[TensorBuffer]) -> tuple:
    """``(arrays by tensor, their binding key, the buffers)`` of a run of ``sig`` on host
    ``buffers`` (its inputs, then its outputs). A host buffer's array is fixed for its life;
    the buffers are kept with it, so that no other buffer takes their ids."""
    tensors = (*sig.inputs.values(), *sig.outputs.values())
    arrays = {t: buf.array for t, buf in zip(tensors, buffers)}
    return arrays, compiled.binding_key(arrays), tuple(buffers)


class CompiledModel:
    """A model compiled for a set of accelerators; run it through TensorBuffers."""

    def __init__(self, session: Session, environment: Environment) -> None:
        self._session = session
        self._environment = environment
        model = session.model
        self._signatures: list[Signature] = list(model.signatures) or [
            Signature("serving_default", 0,
                      {model.subgraphs[0].tensors[t].name: t for t in model.subgraphs[0].inputs},
                      {model.subgraphs[0].tensors[t].name: t for t in model.subgraphs[0].outputs})]
        self._shapes: dict[int, dict[int, tuple[int, ...]]] = {}
        self._compiled = [session.compile(s.subgraph_index) for s in self._signatures]
        # Asynchronous runs that would block the caller: one worker thread, created by the first.
        self._worker: ThreadPoolExecutor | None = None
        self._pending: Future | None = None   # the last run submitted to the worker, until done
        self._queue_lock = threading.Lock()   # the choice between worker and caller, per run
        # Host runs made on the caller's buffers, for the next run on them (a decoder's steps):
        # (signature, buffer ids) -> (arrays by tensor, their binding key, the buffers).
        self._host_runs: dict[tuple[int, ...], tuple] = {}

    @classmethod
    def from_file(cls, model_path: str | os.PathLike, hardware_accel: HardwareAccelerator | None = None,
                  environment: Environment | None = None, options: Options | None = None,
                  backend: str | None = None, placement: str | None = None) -> "CompiledModel":
        """Load and compile a model file (``placement``: see :class:`Options`)."""
        return cls._create(load_model(model_path), hardware_accel, environment, options, backend, placement)

    @classmethod
    def from_buffer(cls, model_data: bytes, hardware_accel: HardwareAccelerator | None = None,
                    environment: Environment | None = None, options: Options | None = None,
                    backend: str | None = None, placement: str | None = None) -> "CompiledModel":
        """Load and compile a model from bytes (``placement``: see :class:`Options`)."""
        return cls._create(load_model(model_data), hardware_accel, environment, options, backend, placement)

    @classmethod
    def _create(cls, model, hardware_accel, environment, options, backend, placement=None) -> "CompiledModel":
        if options is not None and hardware_accel is not None:
            raise InvalidArgumentError("pass either options or hardware_accel, not both")
        options = options or Options(hardware_accelerators=hardware_accel or HardwareAccelerator.CPU)
        if backend:
            options.backend = backend
        if placement is not None:
            options.placement = placement
        environment = environment or Environment()
        session = Session(model, _backend_names(options), num_threads=options.cpu_options.num_threads,
                          precision_loss_allowed=not options.gpu_options.enforce_f32,
                          extra={**environment.options, **options.gpu_options.extra()},
                          placement=options.placement)
        compiled = cls(session, environment)
        session.release_pages()
        return compiled

    @property
    def environment(self) -> Environment:
        """The environment this model was created in."""
        return self._environment

    def __enter__(self) -> "CompiledModel":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Release the compiled model, after the runs still pending."""
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None

    # -- signatures --------------------------------------------------------------------
    def get_signature_list(self) -> dict[str, dict[str, list[str]]]:
        """``{key: {"inputs": [...], "outputs": [...]}}``."""
        return {s.key: {"inputs": list(s.inputs), "outputs": list(s.outputs)} for s in self._signatures}

    def get_num_signatures(self) -> int:
        """How many signatures the model has."""
        return len(self._signatures)

    def get_signature_index(self, key: str) -> int:
        """The index of signature ``key``, or -1."""
        return next((i for i, s in enumerate(self._signatures) if s.key == key), -1)

    def get_signature_by_index(self, index: int) -> dict:
        """``{"key", "inputs", "outputs"}`` for one signature."""
        s = self._signature(index)
        return {"key": s.key, "inputs": list(s.inputs), "outputs": list(s.outputs)}

    def _signature(self, index: int) -> Signature:
        if not 0 <= index < len(self._signatures):
            raise InvalidArgumentError(f"signature index {index} out of range ({len(self._signatures)})")
        return self._signatures[index]

    def _index(self, key: str) -> int:
        i = self.get_signature_index(key)
        if i < 0:
            raise InvalidArgumentError(f"unknown signature {key!r}; the model has "
                                       f"{[s.key for s in self._signatures]}")
        return i

    def _details(self, index: int, names: dict[str, int]) -> dict[str, dict]:
        compiled, sg = self._compiled[index], self._session.model.subgraphs[self._signatures[index].subgraph_index]
        out = {}
        for name, t in names.items():
            spec = compiled.specs.get(t)
            out[name] = tensor_details(sg.tensors[t], spec.shape if spec is not None else sg.tensors[t].shape, name)
        return out

    def get_input_tensor_details(self, signature_key: str) -> dict[str, dict]:
        """Input details by name, with the current shapes."""
        i = self._index(signature_key)
        return self._details(i, self._signatures[i].inputs)

    def get_output_tensor_details(self, signature_key: str) -> dict[str, dict]:
        """Output details by name."""
        i = self._index(signature_key)
        return self._details(i, self._signatures[i].outputs)

    def is_fully_accelerated(self) -> bool:
        """True when every node of every signature runs on the requested accelerator
        (False when an accelerator was requested but none is available)."""
        if self._session.requested and not self._session.backends:
            return False
        return all(c.report.fully_delegated for c in self._compiled)

    def delegation_reports(self) -> list:
        """The delegation report of each signature's subgraph, each with the reports of the
        subgraphs its control flow calls (``called``)."""
        return [self._session.delegation_report(c) for c in self._compiled]

    # -- buffers -------------------------------------------------------------------------
    def _new_buffer(self, index: int, t: int) -> TensorBuffer:
        """A buffer of the kind the accelerator prefers: device memory when a device
        partition is the tensor's first reader (inputs) or its producer (outputs)."""
        compiled = self._compiled[index]
        spec = compiled.specs.get(t)
        tensor = self._session.model.subgraphs[self._signatures[index].subgraph_index].tensors[t]
        shape = spec.shape if spec is not None else tensor.shape
        host = np.zeros(shape, tensor.dtype)
        backend = compiled.device_of(t)
        if backend is None:
            return TensorBuffer(host)
        buffer = backend.allocate(TensorSpec(tuple(shape), np.dtype(tensor.dtype), full_precision=tensor.full_precision),
                                  self._session.options)
        out = TensorBuffer(host, (backend, buffer))
        out.write(host)   # zeros on the device too, as a host buffer starts
        return out

    def create_input_buffers(self, signature_index: int = 0) -> list[TensorBuffer]:
        """New buffers for every input of a signature."""
        return [self._new_buffer(signature_index, t) for t in self._signature(signature_index).inputs.values()]

    def create_output_buffers(self, signature_index: int = 0) -> list[TensorBuffer]:
        """New buffers for every output of a signature."""
        return [self._new_buffer(signature_index, t) for t in self._signature(signature_index).outputs.values()]

    def create_input_buffer_by_name(self, signature_key: str, input_name: str) -> TensorBuffer:
        """A new buffer for one named input."""
        i = self._index(signature_key)
        return self._new_buffer(i, self._lookup(self._signatures[i].inputs, input_name))

    def create_output_buffer_by_name(self, signature_key: str, output_name: str) -> TensorBuffer:
        """A new buffer for one named output."""
        i = self._index(signature_key)
        return self._new_buffer(i, self._lookup(self._signatures[i].outputs, output_name))

    @staticmethod
    def _lookup(names: dict[str, int], name: str) -> int:
        if name not in names:
            raise InvalidArgumentError(f"no tensor named {name!r}; names are {list(names)}")
        return names[name]

    def resize_input_tensor(self, input_index: int, dims: Sequence[int], signature_index: int = 0,
                            strict: bool = True) -> None:
        """Change one input's shape and recompile (cached per shape)."""
        sig = self._signature(signature_index)
        tensors = list(sig.inputs.values())
        if not 0 <= input_index < len(tensors):
            raise InvalidArgumentError(f"input index {input_index} out of range ({len(tensors)} inputs)")
        t = tensors[input_index]
        tensor = self._session.model.subgraphs[sig.subgraph_index].tensors[t]
        dims = tuple(int(d) for d in dims)
        if strict and (len(dims) != len(tensor.shape_signature) or any(
                s != -1 and s != d for s, d in zip(tensor.shape_signature, dims))):
            raise InvalidArgumentError(f"input {input_index} has signature {list(tensor.shape_signature)}; "
                                       f"{list(dims)} changes a static dimension (pass strict=False)")
        with self._session.guard.serialized("resize_input_tensor"):
            self._shapes.setdefault(signature_index, {})[t] = dims
            self._compiled[signature_index] = self._session.compile(sig.subgraph_index,
                                                                    self._shapes[signature_index])

    def resize_input_tensor_by_name(self, signature_key: str, input_name: str, dims: Sequence[int],
                                    strict: bool = True) -> None:
        """Resize a named input."""
        i = self._index(signature_key)
        names = list(self._signatures[i].inputs)
        if input_name not in names:
            raise InvalidArgumentError(f"unknown input {input_name!r} for signature {signature_key!r}")
        self.resize_input_tensor(names.index(input_name), dims, i, strict)

    # -- running -------------------------------------------------------------------------
    def run_by_index(self, signature_index: int, input_buffers: Sequence[TensorBuffer],
                     output_buffers: Sequence[TensorBuffer]) -> None:
        """Run a signature, reading ``input_buffers`` and writing ``output_buffers`` (signature order).

        Device buffers are used in place: a fully delegated model run on device buffers
        copies nothing between host and device.
        """
        self._start(signature_index, input_buffers, output_buffers, asynchronous=False).wait()
        for buf in output_buffers:
            buf.wait()

    def run_async(self, signature_index: int, input_buffers: Sequence[TensorBuffer],
                  output_buffers: Sequence[TensorBuffer]) -> Event:
        """Start a run and return at once with its event; every output buffer carries it.

        Reading an output waits for it. Input buffers that carry an event are waited for
        by the run (on the device when both are on one device). The host blocks only
        when it reads. A run that needs the host (a model that runs on the host alone,
        or host work after device work) runs on this model's worker thread: its inputs
        are copied before this returns (write them again at once if you like), runs are
        served in call order, and a run's error is raised by ``wait()`` on its event or
        by reading one of its outputs.

        Runs from several threads are serialized: each caller gets the outputs of its
        own inputs.
        """
        return self._start(signature_index, input_buffers, output_buffers, asynchronous=True)

    def _start(self, signature_index: int, input_buffers: Sequence[TensorBuffer],
               output_buffers: Sequence[TensorBuffer], asynchronous: bool) -> Event:
        """Start a run (see :meth:`run_async`). Every run holds the model's guard from
        writing its inputs to copying its outputs into the caller's buffers, so runs from
        several threads are serialized and each caller gets its own outputs. Nothing
        waits on another event while holding the guard: a run queued behind this model's
        worker would need it."""
        sig = self._signature(signature_index)
        if len(input_buffers) != len(sig.inputs) or len(output_buffers) != len(sig.outputs):
            raise InvalidArgumentError(f"signature {sig.key!r} takes {len(sig.inputs)} input and "
                                       f"{len(sig.outputs)} output buffers, got {len(input_buffers)} and "
                                       f"{len(output_buffers)}")
        compiled: CompiledSubgraph = self._compiled[signature_index]
        if not asynchronous and self._in_place(sig, compiled, input_buffers, output_buffers):
            return COMPLETE
        bound: dict[int, tuple] = {}
        wait_for: list[Event] = []
        host_inputs: list[tuple[int, np.ndarray]] = []
        for t, buf in zip(sig.inputs.values(), input_buffers):
            if self._on_device(compiled, t, buf):
                bound[t] = buf.device
                if buf.event is not None:
                    wait_for.append(buf.event)
            else:
                array = buf.array   # waits for the run that writes it, if any
                _check_input(compiled, t, array)
                host_inputs.append((t, array))
        host_outputs = []
        for t, buf in zip(sig.outputs.values(), output_buffers):
            self._check_output(sig, compiled, t, buf)
            if self._on_device(compiled, t, buf):
                bound[t] = buf.device
            else:
                host_outputs.append(_output_copier(compiled, t, buf))
        _check_device_aliases(sig, compiled, bound)
        call = f"run of signature {sig.key!r}"

        def run(inputs: list[tuple[int, np.ndarray]]) -> Event:
            with self._session.guard.serialized(call):
                for t, array in inputs:
                    compiled.set_input(t, array)
                event = compiled.submit(bound, wait_for)
                for copy in host_outputs:   # host outputs are final once submit returns
                    copy()
            return event

        # A run that would block the caller (host work, or host work after device work) goes
        # to this model's worker when asynchronous, and so does any run queued behind one.
        blocking = compiled.runner is None or compiled.runner.plan(bound).host_after_device
        with self._queue_lock:
            if self._pending is not None or (asynchronous and blocking):
                # The caller may write its input buffers once this returns: take a snapshot.
                snapshot = [(t, array.copy()) for t, array in host_inputs]
                if self._worker is None:
                    self._worker = ThreadPoolExecutor(1, thread_name_prefix="litegpu-run")
                future = self._pending = self._worker.submit(lambda: run(snapshot).wait())
            else:
                future = None
        if future is None:
            event = run(host_inputs)
        else:   # outside the lock: a finished future calls _forget at once, which takes it
            future.add_done_callback(self._forget)
            event = FutureEvent(future)
        for t, buf in zip(sig.outputs.values(), output_buffers):
            if t in bound:
                buf.device_written(event)
            else:
                buf.set_event(event)
        return event

    def _expect_reuse(self, signature_key: str, input_map: dict[str, TensorBuffer],
                      output_map: dict[str, TensorBuffer]) -> None:
        """These host buffers will be run again, as they are (a decoder's cache and feeds,
        :mod:`litegpu.lm`): the signature's first run on them binds its steps to their
        arrays (:meth:`CompiledSubgraph.expect_reuse`) instead of first taking the copying
        path. Nothing happens for device buffers or a run with device partitions."""
        i = self._index(signature_key)
        sig, compiled = self._signatures[i], self._compiled[i]
        buffers = [input_map.get(n) for n in sig.inputs] + [output_map.get(n) for n in sig.outputs]
        if compiled.runner is not None or any(b is None or b.is_device for b in buffers):
            return
        compiled.expect_reuse(_host_run(sig, compiled, buffers)[1])

    def _updates_in_place(self, signature_key: str, names: Sequence[str]) -> bool:
        """True when each of the ``names`` inputs of the signature may be given the buffer of
        the output of the same name (:meth:`CompiledSubgraph.updates_in_place`: a KV cache
        updated where it lies, on the host or on a device)."""
        i = self._index(signature_key)
        sig = self._signatures[i]
        if any(n not in sig.inputs or n not in sig.outputs for n in names):
            return False
        return self._compiled[i].updates_in_place([(sig.inputs[n], sig.outputs[n]) for n in names])

    def _in_place(self, sig: Signature, compiled: CompiledSubgraph, input_buffers: Sequence[TensorBuffer],
                  output_buffers: Sequence[TensorBuffer]) -> bool:
        """A synchronous run of a subgraph on the host, on host buffers, made on the buffers'
        own arrays (:meth:`CompiledSubgraph.run_on`: nothing copied in or out; an input and
        output given one buffer, a KV cache, updated where it lies). False, with nothing
        run, where the run takes the copying path instead."""
        if compiled.runner is not None:
            return False
        buffers = (*input_buffers, *output_buffers)
        ids = (sig.key, *map(id, buffers))
        known = self._host_runs.get(ids)
        if known is None:
            if any(b.is_device for b in buffers):
                return False
            known = _host_run(sig, compiled, buffers)
        for buf in buffers:
            if buf.event is not None:
                buf.wait()
        with self._queue_lock:
            if self._pending is not None:
                return False
            with self._session.guard.serialized(f"run of signature {sig.key!r}"):
                if not compiled.run_on(known[0], known[1]):
                    return False
        if ids not in self._host_runs:      # (bound now: the subgraph keeps these arrays anyway)
            if len(self._host_runs) >= 2 * BOUND_SETS:
                self._host_runs.pop(next(iter(self._host_runs)))
            self._host_runs[ids] = known
        for buf in output_buffers:
            if buf.event is not None:
                buf.set_event(None)
        return True

    @staticmethod
    def _on_device(compiled: CompiledSubgraph, t: int, buf: TensorBuffer) -> bool:
        """True when the run reads or writes ``buf``'s device memory in place."""
        return buf.is_device and compiled.runner is not None and compiled.device_of(t) is buf.device[0]

    @staticmethod
    def _check_output(sig: Signature, compiled: CompiledSubgraph, t: int, buf: TensorBuffer) -> None:
        """An output buffer must hold the output's elements when their count is known before the run."""
        value_size = compiled.output_size(t)
        if value_size is not None and buf.size != value_size:
            raise InvalidArgumentError(f"output buffer for {sig.key!r} holds {buf.size} elements, "
                                       f"the output has {value_size}")

    def _forget(self, future: Future) -> None:
        """Drop the pending run once it is the last one and done: synchronous runs go direct again."""
        with self._queue_lock:
            if self._pending is future:
                self._pending = None

    def run_by_name(self, signature_key: str, input_map: dict[str, TensorBuffer],
                    output_map: dict[str, TensorBuffer]) -> None:
        """Run a signature with buffers keyed by name."""
        i = self._index(signature_key)
        sig = self._signatures[i]
        try:
            inputs = [input_map[n] for n in sig.inputs]
        except KeyError:
            raise InvalidArgumentError(f"missing inputs {sorted(set(sig.inputs) - set(input_map))} for signature "
                                       f"{signature_key!r}") from None
        outs = [output_map.get(n) or self._new_buffer(i, t) for n, t in sig.outputs.items()]
        self.run_by_index(i, inputs, outs)
