"""The backend contract: what a plugin implements and what the core calls, in one module.

A backend author needs this module and the conformance suite (``pytest --pyargs
litegpu.testing.conformance_suite --litegpu-backend NAME``); ``examples/`` has a complete
out-of-tree backend.

Registering. A plugin (an object or module registered under the ``litegpu.backends``
entry-point group) implements the ``litegpu_backends()`` hook of ``litegpu.hookspecs`` and
returns :class:`Backend` instances. Each is checked when the plugin loads
(:func:`contract_problems`): an instance of :class:`Backend`; ``name`` a non-empty word
(letters, digits, ``_ . + -``; not "GPU", which names any GPU) no other backend has;
every method still callable; ``is_gpu`` and ``host_memory`` bools, ``gpu_priority`` an int. (``supports`` and
``compile`` are not checked there: a backend unavailable here is never asked; the base
class's versions raise, naming the backend.) A backend that fails is rejected with a
:class:`~litegpu.errors.PluginError` naming the plugin, its distribution and the fault: an
entry point's is recorded and logged (``litegpu backends`` lists it, asking for it by name
says why it is missing), a direct ``PluginManager.register`` raises it.

Lifecycle, in the order the core calls things:

1. ``available()`` when a backend is asked for (by name or as "GPU") and by ``litegpu
   backends``; probe the device lazily here, never at import or in the hook.
2. ``supports(node, model)`` for each node, in the user's order of preference: the first
   backend that says yes gets the node (else cpu); each run of consecutive nodes on one
   backend is a :class:`Partition`.
3. ``schedule(nodes, outputs)`` per partition: which nodes run as one step (fusion).
4. ``compile(partition, options)`` once per partition and input shapes: a :class:`Program`.
5. Device backends (``host_memory`` False) only: ``allocate`` buffers for the tensors the
   core keeps on the device, ``copy_in`` / ``copy_out`` where a tensor crosses between the
   host and the device, ``nbytes`` to count the bytes moved, ``wrap`` for a user's native
   buffer (``TensorBuffer``).
6. ``Program.run(inputs, outputs, wait_for)`` on every run, returning an :class:`Event`;
   the next command waits for it, and the host waits only when it reads a result.

Required and optional members (an optional member's default is what the base class does):

==========  =============================  ==========================================
class       required                       optional, and its default
==========  =============================  ==========================================
Backend     ``name``, ``supports``,        ``is_gpu`` (False), ``gpu_priority`` (0),
            ``compile``                    ``host_memory`` (True),
                                           ``available`` (yes), ``device_info`` ({}),
                                           ``schedule`` (one node per step),
                                           ``allocate``/``copy_in``/``copy_out``/
                                           ``nbytes`` (numpy host memory), ``wrap``
                                           (refuses), ``bind_control`` (None)
Program     ``run``                        ``summary`` (""), ``partition`` (None),
                                           ``bind``/``run_profiled`` (None:
                                           the core's slower path),
                                           ``kernels`` ([])
Event       ``wait``, ``is_complete``      (the base event is already complete)
==========  =============================  ==========================================

Stateful ops (control flow, variables) get a :class:`Runtime` through ``CompileOptions``;
its optional services let a session run loops and branches faster.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from .graph import Model, Node, Subgraph, Tensor
from .ops.registry import OpDef, TensorSpec
from .steps import Bound, Step, run_steps   # noqa: F401  (part of the contract)


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
    """Services the core offers to kernels of stateful ops (control flow, variables).

    A backend hands it (``CompileOptions.runtime``) to ``OpDef.execute(inputs, attrs,
    runtime)`` and ``OpDef.bind(inputs, outputs, attrs, runtime)`` of the stateful nodes
    it runs (the cpu backend runs them all); it does not call the services itself.

    ``call_subgraph(index, inputs)`` runs a subgraph and returns new output arrays;
    ``resources`` holds resource variables across runs. The other services are optional
    (None: the ops in ``litegpu.ops.control`` take their plain path); a session supplies
    them all:

    - ``while_loop(cond, body, values, limit, truth)``: WHILE's loop, the final values
      as new arrays, or None when ``limit`` iterations did not end it (WHILE then raises
      its limit error). ``truth(array, what)`` reads a condition. Default: WHILE iterates
      ``call_subgraph`` from Python.
    - ``branch(index, inputs)``: IF's call of the branch it picked. Default (and when
      None is given): ``call_subgraph``.
    - ``bind_while(cond, body, inputs, outputs, limit, limit_error)``: a WHILE node over
      fixed arrays as one call of no arguments, or None; for WHILE's ``OpDef.bind``.
      Default: None (the node runs through ``execute``).
    - ``bind_if(then, orelse, inputs, outputs)``: the same for IF; default None.
    """

    call_subgraph: Callable[[int, list[np.ndarray]], list[np.ndarray]]
    resources: dict[Any, np.ndarray]
    max_while_iterations: int = 10_000_000
    while_loop: Callable[..., list[np.ndarray] | None] | None = None
    branch: Callable[[int, list[np.ndarray]], list[np.ndarray]] | None = None
    bind_while: Callable[..., Callable[[], None] | None] | None = None
    bind_if: Callable[..., Callable[[], None] | None] | None = None

    def __post_init__(self) -> None:
        if self.branch is None:   # IF's branch is a plain subgraph call unless a session offers more
            self.branch = self.call_subgraph


#: The ``CompileOptions.extra`` key (a delegate option: ``load_delegate(name, {HALF_ARITHMETIC:
#: False})``) that keeps fp32 arithmetic over fp16 storage when precision loss is allowed:
#: TFLite GPU's F32_F16 (see :func:`litegpu.codegen.requested_precision`).
HALF_ARITHMETIC = "half_arithmetic"


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


#: The name of a kernel that is the op's numpy reference (see :meth:`Program.kernels`): a
#: slow path, which ``litegpu inspect --kernels`` and ``bench --profile`` point out.
REFERENCE = "reference"


class Program:
    """A compiled partition, returned by :meth:`Backend.compile`.

    ``run`` is required. The other members are optional: the core reads them as plain
    attributes, so a subclass overrides what it offers and inherits the rest.
    """

    #: One line for the delegation report and the compile log (precision, kernels,
    #: memory, cache hit), or "" for none. Read by the executor after ``compile``; may
    #: be a property.
    summary: str = ""

    #: The partition this program was compiled from, or None. The profiler names the
    #: nodes of a partition's slices from it (with None, the slices name no nodes).
    partition: Partition | None = None

    def run(self, inputs: Sequence[Any], outputs: list, wait_for: Sequence[Event] = ()) -> Event:
        """Run on ``inputs``, writing ``outputs`` (both in partition order,
        ``Partition.inputs`` and ``Partition.outputs``); return the run's :class:`Event`.

        Called by the executor on every run of the subgraph. ``wait_for`` are events of
        earlier work this run must follow: wait for them, or chain them into the device's
        queue, before reading the inputs.

        A device program (``Backend.host_memory`` False) gets the backend's buffers (from
        :meth:`Backend.allocate` or :meth:`Backend.wrap`) and may return before the device
        is done. A host program gets numpy arrays and is done when it returns; its
        ``outputs`` is a list whose entries are:

        - an array, for every output whose shape was known at compile time: write the
          result into it in place and leave the entry as it is (the core binds its fast
          paths to these arrays);
        - ``None``, for an output whose shape is decided only at run time (its spec was
          unknown when the partition compiled; ``NodeContext.dynamic``): *the program
          supplies the array*. It stores an array holding the result into the list
          (``outputs[k] = array``) before returning. The executor reads the list back
          after the call and takes that array as the tensor's value, for later partitions
          and for the caller, until the next run: so it may be an array the program owns
          and overwrites on its next run. Where a subgraph also has device partitions, a
          run-time-shaped output arrives instead as the array the previous run supplied;
          replace it the same way when this run's shape differs.
        """
        raise NotImplementedError("need run")

    def bind(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> Bound | None:
        """Optional fast path: this program on exactly these host arrays as a
        :class:`Bound` (its :class:`Step` s, in order), or None.

        The executor binds a host-only subgraph once, on its first run, when every tensor
        crossing a partition has a fixed array (no run-time shapes, so no ``None`` among
        ``outputs``); later runs only make the steps' calls (:func:`run_steps`). Control
        flow binds the programs of a WHILE's condition and body to arrays of its choosing
        and runs them as one list. Binding must not disturb what :meth:`run` works on: a
        program may be bound to several sets of arrays at once (a loop alternating between
        two). Give each step the nodes it computes, so the profiler names them. Default:
        None, and every run calls :meth:`run` on those arrays.
        """
        return None

    def kernels(self) -> list[tuple[tuple[int, ...], str]]:
        """Optional: what runs each step, in run order: (the node indices of the step, the
        name of its kernel), the name starting with :data:`REFERENCE` where the op's numpy
        reference runs it. Read by the executor into the delegation report (``litegpu
        inspect --kernels``) after ``compile``. Default: nothing said."""
        return []

    def run_profiled(self, inputs: Sequence[Any], outputs: list, wait_for: Sequence[Event],
                     profiler: Any) -> Event | None:
        """Optional: :meth:`run` while recording what ran into ``profiler`` (a
        ``litegpu.profile.Profiler``), e.g. one ``Slice`` per kernel with the device's own
        times; or None, having run nothing.

        Called by the profiler instead of :meth:`run` while a ``litegpu.profile()`` block is
        active, with the same arguments and conventions as :meth:`run`; for device
        programs, whose work the host cannot time. Default: None, and the profiler runs
        :meth:`run`: a host program whose ``run`` runs its steps through :func:`run_steps`
        gets a slice per step, any other one slice for the partition, its time split
        evenly among its nodes.
        """
        return None


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
    one-element bool ``flag`` is true, else ``orelse``; each a list of :class:`Step` s
    (see ``CompiledSubgraph.bind``)."""

    flag: np.ndarray
    then: list
    orelse: list


@dataclass
class Loop:
    """WHILE over fixed arrays, for :meth:`Backend.bind_control`: the ``enter`` steps,
    then iterations alternating between the two ``phases``. Phase ``(cond, flag, body,
    exit)`` runs the ``cond`` steps and, when its one-element bool ``flag`` is true, the
    ``body`` steps (iteration ``n`` is phase ``n % 2``), else its ``exit`` steps, which end
    the loop; each a list of :class:`Step` s. Before the body runs more than ``limit[0]``
    times (an int64 array, which the caller may change between runs) the loop stops with
    ``limit_error()``."""

    enter: list
    phases: list
    limit: np.ndarray
    limit_error: Callable[[], Exception]


class Backend:
    """Base class of backends. Subclasses set ``name`` and implement ``supports`` and
    ``compile``; every other member has a default that suits a host backend."""

    #: The backend's unique name: how users ask for it (``load_delegate``, ``backend=``),
    #: and how the delegation report, the CLI and test ids name it. Required.
    name: str = ""
    #: True: chosen when a user asks for "GPU" (``HardwareAccelerator.GPU``), and a
    #: quantized model then runs in its float view. Read by the session.
    is_gpu: bool = False
    #: Among available GPU backends, "GPU" prefers the highest (cuda 30, metal 20,
    #: opencl 10; a third party's default 0 comes after them).
    gpu_priority: int = 0
    #: True: programs read and write host numpy arrays. False: they take the backend's own
    #: device buffers (from ``allocate``); the executor keeps tensors in device memory
    #: between partitions of the backend and inserts copy_in/copy_out at device boundaries.
    host_memory: bool = True

    def available(self) -> tuple[bool, str]:
        """Whether this backend can be used here, and why not.

        Called when the backend is asked for (by name or as "GPU") and by ``litegpu
        backends``; probe the device here, lazily, not when the plugin loads. Default:
        always available.
        """
        return True, ""

    def device_info(self) -> dict:
        """Device, driver, library versions and features: shown by ``litegpu backends``
        and part of the measured placement's cache key; called only when available.
        Default: nothing known.

        Two keys are read by the core: ``"device"`` (the device's name, shown in the
        delegation report) and ``"type"`` (``"GPU"``, ``"CPU"`` or ``"accelerator"``): a
        request for "GPU" passes over a GPU backend whose device is a ``"CPU"`` (PoCL's
        OpenCL), which users then ask for by name.
        """
        return {}

    def supports(self, node: NodeContext, model: Model) -> Support:
        """Whether this backend can run ``node`` (``Support(False, reason)`` when not).

        Called by the partitioner for every node, in the user's order of preference, when
        a subgraph is planned. Required.
        """
        raise NotImplementedError(f"backend {self.name!r} does not implement supports(), which is required")

    def schedule(self, nodes: list[NodeContext], outputs: list[int]) -> list[list[int]]:
        """Group the partition's nodes into steps that run as one kernel (default: one node each).

        ``outputs`` are the tensors read after the partition. Called by the executor
        before ``compile``; memory is planned per step and the result is
        ``Partition.steps``.
        """
        return [[i] for i in range(len(nodes))]

    def compile(self, partition: Partition, options: CompileOptions) -> Program:
        """Compile a partition into a runnable :class:`Program` (an instance of it).

        Called by the executor once per partition and input shapes. An op or model kind
        the backend cannot compile after all raises ``UnsupportedError`` naming node and
        op. Required.
        """
        raise NotImplementedError(f"backend {self.name!r} does not implement compile(), which is required")

    def prebuild(self, directory: str | None = None) -> str | None:
        """Compile, for this machine, the kernels that depend on no model, so that a first
        process starts like a warm one: ``litegpu prebuild`` calls it once, at install
        (``directory``: where to keep them instead of the backend's own place). Returns one
        line saying what was built; None (the default): nothing to build ahead of time."""
        return None

    def bind_control(self, control: Branch | Loop) -> Callable[[], None] | None:
        """``control`` (its steps from this backend's programs) as one call of no
        arguments, e.g. a compiled table with jumps; None (the default) leaves it to the
        core, which runs the steps from Python. Called by the session on the cpu backend
        (which runs control flow) when it binds a WHILE or IF node."""
        return None

    def allocate(self, spec: TensorSpec, options: CompileOptions) -> Any:
        """Device memory for a tensor of ``spec``, in the storage format programs compiled
        with ``options`` use (e.g. half for float32 when precision loss is allowed).

        Called by the transfer plan for the tensors kept on the device and by
        ``CompiledModel`` for device ``TensorBuffer`` s. Default: a numpy array (host
        backends)."""
        return np.empty(spec.shape, spec.dtype)

    def wrap(self, native: Any, spec: TensorSpec, options: CompileOptions) -> Any:
        """A buffer of this backend around a user's native device buffer (e.g. a
        ``pyopencl.Buffer``) holding a tensor of ``spec``, without copying it.

        Called by ``TensorBuffer.create_from_device_buffer``. Default: refuses
        (NotImplementedError)."""
        raise NotImplementedError(f"backend {self.name!r} cannot wrap native buffers")

    def nbytes(self, buffer: Any) -> int:
        """Bytes a copy of ``buffer`` moves; the transfer plan counts them. Default:
        ``buffer.nbytes``."""
        return int(buffer.nbytes)

    def copy_in(self, buffer: Any, array: np.ndarray, wait_for: Sequence[Event] = ()) -> Event:
        """Copy a host array into device memory (the host array may be reused on return)
        after ``wait_for``; called by the transfer plan and ``TensorBuffer``. Default:
        ``np.copyto``."""
        for e in wait_for:
            e.wait()
        np.copyto(buffer, array)
        return COMPLETE

    def copy_out(self, buffer: Any, array: np.ndarray, wait_for: Sequence[Event] = ()) -> Event:
        """Copy device memory into a host array after ``wait_for``; done when this
        returns. Called by the transfer plan and ``TensorBuffer``. Default: ``np.copyto``."""
        for e in wait_for:
            e.wait()
        np.copyto(array, buffer)
        return COMPLETE


# Names users type in lists (``LITEGPU_TEST_BACKENDS=cpu,opencl``), on command lines and
# in test ids: one word, so that no list or id needs quoting.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
_FLAGS = ("is_gpu", "host_memory")
# Every method of the contract: a subclass may override each, but not with a non-callable.
_METHODS = tuple(n for n, v in vars(Backend).items() if callable(v) and not n.startswith("_"))


def device_is_cpu(backend: Backend) -> bool:
    """True when a GPU backend's :meth:`Backend.device_info` says its device is a CPU
    (OpenCL on PoCL): a request for "GPU" passes over it."""
    return backend.is_gpu and str(backend.device_info().get("type", "")).upper() == "CPU"


def device_label(backend: Backend) -> str:
    """A backend with its device, as the delegation report names it: ``opencl
    (pthread-skylake-avx512-AMD EPYC, a CPU)``; the bare name for a host backend or an
    unnamed device."""
    device = str(backend.device_info().get("device", "")).strip() if backend.is_gpu else ""
    if not device:
        return backend.name
    return f"{backend.name} ({device}, a CPU)" if device_is_cpu(backend) else f"{backend.name} ({device})"


def contract_problems(backend: object) -> list[str]:
    """What is wrong with ``backend`` as a registered backend; empty when nothing is.

    The plugin manager runs this on every backend a plugin returns, and rejects one with
    problems, naming them; a backend author can call it in their own tests. It reads
    attributes only (no probing: ``available()`` is not called).
    """
    if not isinstance(backend, Backend):
        return [f"a {type(backend).__module__}.{type(backend).__qualname__} is not a "
                "litegpu.backend.Backend (subclass it)"]
    problems = []
    name = backend.name
    if not isinstance(name, str) or not name:
        problems.append(f"name must be a non-empty str, got {name!r}")
    elif not _NAME.fullmatch(name):
        problems.append(f"name {name!r} must be one word of letters, digits and _ . + -")
    elif name.upper() == "GPU":
        problems.append(f"name {name!r} is reserved: it asks for any GPU backend")
    for flag in _FLAGS:
        if not isinstance(getattr(backend, flag), bool):
            problems.append(f"{flag} must be a bool, got {getattr(backend, flag)!r}")
    priority = backend.gpu_priority
    if not isinstance(priority, int) or isinstance(priority, bool):
        problems.append(f"gpu_priority must be an int, got {priority!r}")
    for method in _METHODS:
        if not callable(getattr(backend, method)):
            problems.append(f"{method} must be a method, got {getattr(backend, method)!r}")
    return problems

