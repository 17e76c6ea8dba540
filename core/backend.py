"""The protocols a backend plugin implements: Backend, Program, Buffer, Event.

A backend is one object returned by the ``litegpu_backends`` hook. The core asks it
whether it supports each node, hands it partitions to compile, and runs the returned
programs. Everything here is device-neutral; the base classes say what is missing.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from .graph import Model, Node, Subgraph, Tensor
from .ops.registry import OpDef, TensorSpec


@dataclass(frozen=True)
class Support:
    """A backend's answer to "can you run this node?", with the reason when not."""

    ok: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


@dataclass
class NodeContext:
    """What a kernel factory knows about one node at compile time.

    ``inputs`` are the input specs (``None`` for an omitted optional input); a spec's
    ``value`` is set for constants. ``dynamic`` is True when output shapes are only
    known at run time: then the kernel must accept any shape. ``dynamic_reason`` says why
    when the core knows (the node whose shapes are known only at run time feeds it), for
    a backend to give as its reason.
    """

    node: Node
    opdef: OpDef
    attrs: dict
    inputs: list[TensorSpec | None]
    outputs: list[TensorSpec]
    tensors: Sequence[Tensor] = ()   # the subgraph's tensors (names, quantization)
    dynamic: bool = False
    dynamic_reason: str = ""


@dataclass
class Partition:
    """A contiguous run of nodes of one subgraph assigned to one backend."""

    backend: str
    subgraph: Subgraph
    nodes: list[NodeContext]
    inputs: list[int]     # tensor indices read from outside the partition
    outputs: list[int]    # tensor indices read after the partition
    specs: dict[int, TensorSpec] = field(default_factory=dict)   # every tensor the partition touches
    arena: Any = None     # litegpu.memory.ArenaPlan for tensors internal to the partition
    # Positions into ``nodes`` run as one step each (from Backend.schedule); the arena is
    # planned at this granularity, so a fused step never overwrites what it still reads.
    steps: list[list[int]] = field(default_factory=list)


@dataclass
class Runtime:
    """Services the core offers to kernels of stateful ops (control flow, variables)."""

    call_subgraph: Callable[[int, list[np.ndarray]], list[np.ndarray]]
    resources: dict[Any, np.ndarray]
    max_while_iterations: int = 10_000_000


@dataclass
class CompileOptions:
    """Options for :meth:`Backend.compile`."""

    num_threads: int = 0                 # 0: the backend's default
    precision_loss_allowed: bool = False
    runtime: Runtime | None = None
    model: Model | None = None           # the whole model (e.g. ``model.digest()`` keys a kernel cache)
    # Backend-specific settings from delegate options and the Environment (e.g.
    # ``serialization_dir``, ``model_token``, ``opencl_context``); backends ignore keys they do not know.
    extra: dict = field(default_factory=dict)


class Event:
    """Completion of submitted work. The base event is already complete.

    ``wait_type`` is LiteRT's: "passive" blocks in the driver (the thread sleeps),
    "active" polls :meth:`is_complete` (lower latency, burns a core).
    """

    def wait(self, wait_type: str = "passive") -> None:
        """Block until the work is done."""

    def is_complete(self) -> bool:
        """True when the work is done."""
        return True


COMPLETE = Event()


class Program:
    """A compiled partition."""

    def run(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray],
            wait_for: Sequence[Event] = ()) -> Event:
        """Run on ``inputs``, writing ``outputs`` (both in partition order)."""
        raise NotImplementedError("need run")


def run_steps(steps: list) -> None:
    """Run ``(call, fail)`` steps (see ``CompiledSubgraph.bind_steps``) in order; a step
    that raises ``exc`` raises ``fail(exc)`` instead (the error naming its node) unless
    ``fail`` is None or returns None."""
    for call, fail in steps:
        try:
            call()
        except Exception as exc:
            error = None if fail is None else fail(exc)
            if error is None:
                raise
            raise error from None


class Copy:
    """A step copying one array into another of the same shape and dtype (``dst[...] =
    src``): a branch's output that is one of its inputs, a loop's values going in and out."""

    def __init__(self, src: np.ndarray, dst: np.ndarray) -> None:
        self.src, self.dst = src, dst

    def __call__(self) -> None:
        self.dst[...] = self.src


@dataclass
class Branch:
    """IF over fixed arrays, for :meth:`Backend.bind_control`: ``then`` when the
    one-element bool ``flag`` is true, else ``orelse``; each a list of ``(call, fail)``
    steps (see ``CompiledSubgraph.bind_steps``; ``fail`` may be None)."""

    flag: np.ndarray
    then: list
    orelse: list


@dataclass
class Loop:
    """WHILE over fixed arrays, for :meth:`Backend.bind_control`: the ``enter`` steps,
    then iterations alternating between the two ``phases``. Phase ``(cond, flag, body,
    exit)`` runs the ``cond`` steps and, when its one-element bool ``flag`` is true, the
    ``body`` steps (iteration ``n`` is phase ``n % 2``), else its ``exit`` steps, which end
    the loop. Before the body runs more than ``limit[0]`` times (an int64 array, which
    the caller may change between runs) the loop stops with ``limit_error()``."""

    enter: list
    phases: list
    limit: np.ndarray
    limit_error: Callable[[], Exception]


class Backend:
    """Base class of backends. Subclasses set ``name`` and implement the methods."""

    name: str = ""
    is_gpu: bool = False   # True: chosen when a user asks for "GPU" / HardwareAccelerator.GPU
    # True: programs read and write host numpy arrays. False: they take the backend's own
    # device buffers (from ``allocate``); the executor keeps tensors in device memory
    # between partitions of the backend and inserts copy_in/copy_out at device boundaries.
    host_memory: bool = True

    def available(self) -> tuple[bool, str]:
        """Whether this backend can be used here, and why not."""
        return True, ""

    def device_info(self) -> dict:
        """Device, driver, library versions and features, for ``litegpu backends``."""
        return {}

    def supports(self, node: NodeContext, model: Model) -> Support:
        """Whether this backend can run ``node``."""
        raise NotImplementedError("need supports")

    def schedule(self, nodes: list[NodeContext], outputs: list[int]) -> list[list[int]]:
        """Group the partition's nodes into steps that run as one kernel (default: one node each).

        ``outputs`` are the tensors read after the partition. Memory is planned per step.
        """
        return [[i] for i in range(len(nodes))]

    def compile(self, partition: Partition, options: CompileOptions) -> Program:
        """Compile a partition into a runnable program."""
        raise NotImplementedError("need compile")

    def bind_control(self, control: Branch | Loop) -> Callable[[], None] | None:
        """``control`` (its steps from this backend's programs) as one call of no
        arguments, e.g. a compiled table with jumps; None (the default) leaves it to the
        core, which runs the steps from Python."""
        return None

    def allocate(self, spec: TensorSpec, options: CompileOptions) -> Any:
        """Device memory for a tensor of ``spec``, in the storage format programs compiled
        with ``options`` use (e.g. half for float32 when precision loss is allowed).
        Host backends return a numpy array."""
        return np.empty(spec.shape, spec.dtype)

    def wrap(self, native: Any, spec: TensorSpec, options: CompileOptions) -> Any:
        """A buffer of this backend around a user's native device buffer (e.g. a
        ``pyopencl.Buffer``) holding a tensor of ``spec``, without copying it."""
        raise NotImplementedError(f"backend {self.name!r} cannot wrap native buffers")

    def nbytes(self, buffer: Any) -> int:
        """Bytes a copy of ``buffer`` moves."""
        return int(buffer.nbytes)

    def copy_in(self, buffer: Any, array: np.ndarray, wait_for: Sequence[Event] = ()) -> Event:
        """Copy a host array into device memory (the host array may be reused on return)."""
        for e in wait_for:
            e.wait()
        np.copyto(buffer, array)
        return COMPLETE

    def copy_out(self, buffer: Any, array: np.ndarray, wait_for: Sequence[Event] = ()) -> Event:
        """Copy device memory into a host array; done when this returns."""
        for e in wait_for:
            e.wait()
        np.copyto(array, buffer)
        return COMPLETE
