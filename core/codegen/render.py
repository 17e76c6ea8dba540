"""The renderer: a partition's kernels as one program source of a dialect, with launch sizes.

It knows no device. A GPU plugin compiles the source its own way and launches each
:class:`~litegpu.codegen.nodegen.KernelSpec` (global and local sizes in work-items,
as OpenCL counts them; see :func:`blocks` for APIs that launch whole groups).
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Callable, Sequence

from litegpu import env
from litegpu.backend import Partition
from litegpu.errors import InvalidArgumentError, KernelBuildError, UnsupportedError
from litegpu.ops import VIEW_OPS

from .dialect import Dialect
from .fusion import followers, is_region, step_producer
from .kernels.region import region_kernels
from .kernels import Decline, load_all
from .nodegen import KernelSpec, NodeGen, Precision
from .opencl import OPENCL


#: Work-items that share one row or output in the kernels that split one (an attention
#: row, a product of a few rows) on a GPU.
GPU_LANES = 64
LANES_ENV = "LITEGPU_GPU_LANES"


def kernel_lanes(on_cpu: bool = False) -> int:
    """The work-items a kernel puts on one row or output where it can split one: a GPU's
    :data:`GPU_LANES`; 1 on a CPU device (PoCL, lavapipe), which runs a work-group on one
    core, where a barrier costs more than the lanes save. ``$LITEGPU_GPU_LANES`` overrides
    both (tests, tuning). Any count gives the same results."""
    raw = os.environ.get(LANES_ENV, "").strip()
    if raw:
        if not raw.isdigit() or int(raw) < 1:
            raise InvalidArgumentError(f"{LANES_ENV}={raw!r} is not a positive count of work-items")
        return int(raw)
    return 1 if on_cpu else GPU_LANES


def generate(ctx, precision: Precision, specs, step_followers=None, out_tensor=None,
             dialect: Dialect = OPENCL, lanes: int = 1) -> list[KernelSpec]:
    """The kernels of one node (with its followers); raises Decline or UnsupportedError."""
    gen = load_all().get(ctx.node.op)
    if gen is None:
        raise Decline(f"no GPU kernel for {ctx.node.op}")
    return gen.fn(NodeGen(ctx, precision, specs, step_followers, out_tensor, dialect, lanes))


def partition_kernels(partition: Partition, precision: Precision, dialect: Dialect = OPENCL,
                      lanes: int | None = None) -> list[list[KernelSpec]]:
    """The kernels of each step of ``partition`` (a node with its followers); ``lanes``:
    see :func:`kernel_lanes` (default: a GPU's)."""
    lanes = kernel_lanes() if lanes is None else lanes
    nodes = partition.nodes
    step_kernels: list[list[KernelSpec]] = []
    for step in partition.steps or [[i] for i in range(len(nodes))]:
        ctx, _ = step_producer(nodes, step)
        out_tensor = nodes[step[-1]].node.outputs[0]
        try:
            if is_region(nodes, step):
                kernels = region_kernels([nodes[p] for p in step], precision, partition.specs, dialect, lanes)
            else:
                kernels = generate(ctx, precision, partition.specs, followers(nodes, step), out_tensor, dialect,
                                   lanes)
        except Decline as exc:   # supports() said yes: a disagreement is our bug, named clearly
            raise UnsupportedError(f"node {ctx.node.index} ({ctx.node.op}): {exc}") from None
        step_kernels.append(kernels)
    return _alias_views(partition, step_kernels, precision)


def _alias_views(partition: Partition, step_kernels: list[list[KernelSpec]], precision: Precision
                 ) -> list[list[KernelSpec]]:
    """The steps with each lone view (a reshape not fused into a producer) launching
    nothing and the kernels after it reading its input in its place: a decoder step has
    ~90 reshapes, each a copy kernel and a launch. A view whose output the partition hands
    out (bound per run), or whose storage differs from its input's, still copies."""
    specs, nodes = partition.specs, partition.nodes
    keep = set(partition.outputs)
    renamed: dict[int, int] = {}
    out: list[list[KernelSpec]] = []
    for step, kernels in zip(partition.steps or [[i] for i in range(len(nodes))], step_kernels):
        kernels = [k if not any(a.tensor in renamed for a in k.args) else
                   replace(k, args=[replace(a, tensor=renamed[a.tensor]) if a.tensor in renamed else a
                                    for a in k.args],
                           copy_of=k.copy_of and tuple(renamed.get(t, t) for t in k.copy_of)) for k in kernels]
        node = nodes[step[0]].node
        if len(step) == 1 and node.op in VIEW_OPS and node.inputs and node.outputs[0] not in keep:
            source, view = node.inputs[0], node.outputs[0]
            source = renamed.get(source, source)
            if specs[view].value is None and precision.storage_of(specs[source]) == precision.storage_of(specs[view]):
                renamed[view] = source
                kernels = []
        out.append(kernels)
    return out


def assemble(step_kernels: list[list[KernelSpec]], precision: Precision, dialect: Dialect = OPENCL
             ) -> tuple[str, int]:
    """One program source for these kernels (the dialect's prelude, one function per
    distinct source, named ``k_<digest>``) and its number of functions."""
    (source, names), = assemble_parts(step_kernels, precision, dialect, per_part=None)
    return source, len(names)


def assemble_parts(step_kernels: list[list[KernelSpec]], precision: Precision, dialect: Dialect,
                   per_part: int | None) -> list[tuple[str, list[str]]]:
    """The kernels as programs of ``per_part`` functions each (None: one program), each
    with the dialect's prelude: ``(source, function names)`` in order of first use. Parts
    compile on their own, so a compiler that runs in several threads at once (NVRTC)
    builds them in parallel; a part's source depends only on its kernels, so the kernel
    cache keys it the same on every machine."""
    sources: dict[str, str] = {}
    for kernels in step_kernels:
        for k in kernels:
            sources.setdefault(f"k_{k.digest}", k.source.replace("KERNEL", f"k_{k.digest}", 1))
    names = list(sources)
    size = max(1, len(names) if per_part is None else per_part)
    prelude = dialect.prelude(precision.name)
    return [(prelude + "\n".join(sources[n] for n in names[i:i + size]), names[i:i + size])
            for i in range(0, max(len(names), 1), size)]


def program_source(partition: Partition, precision: Precision, dialect: Dialect = OPENCL) -> str:
    """The program of ``partition`` in ``precision`` and ``dialect``, as a plugin builds it."""
    return assemble(partition_kernels(partition, precision, dialect), precision, dialect)[0]


def blocks(spec: KernelSpec, default_block: int = 128) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(grid, block) of a launch in whole groups, for APIs that launch so (CUDA).

    The kernel's own local size when it has one (its global size is then a multiple);
    else ``default_block`` work-items along axis 0 (fewer when the axis is short),
    and the kernel's guard (``Dialect.exact_grid``) ends the surplus.
    """
    size = tuple(spec.global_size) + (1,) * (3 - len(spec.global_size))
    if spec.local_size is not None:
        block = tuple(spec.local_size) + (1,) * (3 - len(spec.local_size))
    else:
        block = (min(default_block, max(size[0], 1)), 1, 1)
    grid = tuple(-(-g // b) for g, b in zip(size, block))
    return grid, block


def build_failure(partition: Partition, step_kernels: list[list[KernelSpec]], precision: Precision,
                  dialect: Dialect, build: Callable[[str], object], log: str) -> KernelBuildError:
    """The error for a program whose build failed with ``log``: names the node at fault.

    Each step is built alone (the prelude and its kernels) until one fails; its source
    and the compiler's log are saved under the cache root (``failed-kernels/``) so the
    user can open them, and the error carries the source's path, the node, the op and
    the log (its first lines in the message). When no step fails alone (a fault of the
    whole program), the whole source is saved instead.
    """
    nodes = partition.nodes
    for step, kernels in zip(partition.steps or [[i] for i in range(len(nodes))], step_kernels):
        source = assemble([kernels], precision, dialect)[0]
        try:
            build(source)
        except Exception as exc:   # noqa: BLE001 - whatever the API's compiler raises is the report
            ctx = nodes[step[0]]
            one_log = str(getattr(exc, "log", exc))
            path = _save_failed(source, one_log, dialect)
            return KernelBuildError(f"the {dialect.name} kernel of node {ctx.node.index} ({ctx.node.op}) failed "
                                    f"to build; its source is in {path}:\n{_head(one_log, path)}",
                                    ctx.node.index, ctx.node.op, str(path), one_log)
    source = assemble(step_kernels, precision, dialect)[0]
    path = _save_failed(source, log, dialect)
    return KernelBuildError(f"the {dialect.name} program failed to build (no single node's kernel fails alone); "
                            f"its source is in {path}:\n{_head(log, path)}", source_path=str(path), log=log)


def _head(log: str, path: Path, lines: int = 20) -> str:
    """The first ``lines`` of a compiler log, saying where the rest is."""
    all_lines = log.strip().splitlines()
    if len(all_lines) <= lines:
        return "\n".join(all_lines)
    return "\n".join(all_lines[:lines] + [f"... ({len(all_lines) - lines} more lines in {path.with_suffix('.log')})"])


def _save_failed(source: str, log: str, dialect: Dialect) -> Path:
    """Write a source that failed to build, and its log beside it, where the user can read
    them; the source's path."""
    directory = env.cache_root() / "failed-kernels"
    path = directory / f"{hashlib.sha256(source.encode()).hexdigest()[:16]}{dialect.suffix}"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
        path.with_suffix(".log").write_text(log)
    except OSError:   # an unwritable cache root: a temp file still shows the source
        with tempfile.NamedTemporaryFile("w", suffix=dialect.suffix, delete=False) as f:
            f.write(source)
        path = Path(f.name)
    return path


def launched(partition: Partition, step_kernels: list[list[KernelSpec]]) -> list[tuple[KernelSpec, list]]:
    """Each kernel to launch (none with an empty global size), in order, with the nodes
    it runs: its step's, and those of the steps before it that launch nothing (a view its
    readers read in place, an empty output), so a profile accounts for every node. Steps
    launching nothing at the end go with the last launch."""
    steps = partition.steps or [[i] for i in range(len(partition.nodes))]
    out: list[tuple[KernelSpec, list]] = []
    waiting: list = []
    for step, kernels in zip(steps, step_kernels):
        nodes = waiting + [partition.nodes[p] for p in step]
        kernels = [k for k in kernels if all(g > 0 for g in k.global_size)]
        if not kernels:
            waiting = nodes
            continue
        out += [(k, nodes) for k in kernels]
        waiting = []
    if waiting and out:
        kernel, nodes = out[-1]
        out[-1] = (kernel, nodes + waiting)
    return out


class IoBindings:
    """A program's partition inputs and outputs bound to device tensors (each launch has
    ``io``, the ``(parameter position, tensor)`` pairs bound per run, and ``copy_of``): a
    binding changes only the launches that use the tensor (a decoder's steps rebind their
    caches: ~40 tensors, each used by a few of ~500 launches), and :attr:`running` is the
    launches a run on the bound tensors makes (:func:`running`)."""

    def __init__(self, launches: list) -> None:
        self.launches = launches
        self.bound: dict[int, object] = {}
        self.running = launches
        self._uses: dict[int, list[tuple[object, int]]] = {}
        for launch in launches:
            for position, t in launch.io:
                self._uses.setdefault(t, []).append((launch, position))
        self._copies = [launch for launch in launches if launch.copy_of]

    def bind(self, tensors: Sequence[int], given: Sequence, attach: Callable[[int, object, list], None]) -> None:
        """Bind device tensor ``given[k]`` to tensor ``tensors[k]``: for each not bound to it
        already, ``attach(t, tensor, uses)`` checks it and points ``uses`` (the ``(launch,
        parameter position)`` pairs that read or write ``t``) at it."""
        changed = False
        for t, x in zip(tensors, given):
            if self.bound.get(t) is not x:
                attach(t, x, self._uses.get(t, ()))
                self.bound[t] = x
                changed = True
        if changed and self._copies:
            self.running = running(self.launches, self._copies, self.bound)


def running(launches: list, copies: list, bound: dict) -> list:
    """The launches a run makes with ``bound`` tensors (``{tensor: device tensor}``, a
    partition's inputs and outputs) bound: all but the ``copies`` (the launches with a
    ``copy_of``, see :class:`~litegpu.codegen.nodegen.KernelSpec`) whose source and
    destination are one device tensor, which would copy each element onto itself (a
    DYNAMIC_UPDATE_SLICE whose operand and result are one buffer: a KV cache updated where
    it lies)."""
    skipped = {id(c) for c in copies if bound.get(c.copy_of[0]) is not None
               and bound.get(c.copy_of[0]) is bound.get(c.copy_of[1])}
    return [launch for launch in launches if id(launch) not in skipped] if skipped else launches


def lifetimes(step_kernels: list[list[KernelSpec]], io: set[int], specs) -> dict[int, tuple[int, int]]:
    """(first step, last step) each intermediate tensor is used in: what an arena plans by.

    Partition inputs and outputs (``io``, bound per run) and constants are not intermediates.
    """
    used: dict[int, tuple[int, int]] = {}
    for s, kernels in enumerate(step_kernels):
        for k in kernels:
            for a in k.args:
                if a.tensor is not None and a.tensor not in io and specs[a.tensor].value is None:
                    first, _ = used.get(a.tensor, (s, s))
                    used[a.tensor] = (first, s)
    return used
