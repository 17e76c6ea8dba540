"""Per-step timings of runs: a LiteRT-style per-op summary and a Chrome trace writer.

Profiling is off unless a :class:`Profiler` is active (``with litegpu.profile() as p:``).
Off, it costs one attribute check per run: :data:`STATE` ``.active`` is None and the
executor takes its usual fast path. On, the executor hands each run to
:func:`run_profiled`, which runs partition by partition. A host program runs its bound
steps (:mod:`litegpu.steps`), and :meth:`Profiler.run_steps` times each as one slice (a
fused step attributed to its nodes); a device program offers ``run_profiled`` (opencl:
one slice per kernel, timed by the device's own profiling events). A program that does
neither is timed as a whole and its time split evenly among its nodes.

Times are kept in seconds of ``time.perf_counter``; device timestamps are mapped onto
that clock through the device's ``queued`` time of each partition's first launch.
"""
from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from .backend import COMPLETE, REFERENCE, Event
from .steps import STATE, failure

log = logging.getLogger("litegpu")
clock = time.perf_counter

HOST = "host"
RUNS, CPU_STEPS, TRANSFERS = "runs and partitions (host dispatch)", "cpu steps", "host<->device copies"


# -- what a node is ------------------------------------------------------------------------
@dataclass(frozen=True)
class NodeInfo:
    """A node as the tables show it: index, op, shapes and the FLOPs of one run (0: not counted)."""

    index: int
    op: str
    inputs: tuple[tuple[int, ...] | None, ...]
    outputs: tuple[tuple[int, ...], ...]
    flops: int = 0


def node_flops(op: str, inputs: Sequence[tuple[int, ...] | None], outputs: Sequence[tuple[int, ...]],
               attrs: dict | None = None) -> int:
    """Multiply-adds × 2 of one run of a conv, depthwise conv, transpose conv, fully connected
    or batch matmul node, from its shapes; 0 for any other op (no GFLOP/s is shown)."""
    attrs = attrs or {}
    try:
        out = math.prod(outputs[0])
        if op == "CONV_2D":                       # filter [cout, kh, kw, cin]
            _, kh, kw, cin = inputs[1]
            return 2 * out * kh * kw * cin
        if op == "DEPTHWISE_CONV_2D":             # filter [1, kh, kw, cout]
            return 2 * out * inputs[1][1] * inputs[1][2]
        if op == "FULLY_CONNECTED":               # weights [units, k]
            return 2 * out * inputs[1][-1]
        if op == "BATCH_MATMUL":
            a = inputs[0]
            return 2 * out * (a[-2] if attrs.get("adj_x") else a[-1])
        if op == "TRANSPOSE_CONV":                # (output shape, filter [cout, kh, kw, cin], input)
            _, kh, kw, cout = (*inputs[1][:3], inputs[1][0])
            return 2 * math.prod(inputs[2]) * kh * kw * cout
    except (TypeError, IndexError, ValueError):   # an omitted or unknown shape: no figure
        return 0
    return 0


_infos: dict[int, tuple[Any, NodeInfo]] = {}


def node_info(ctx) -> NodeInfo:
    """The :class:`NodeInfo` of a ``NodeContext`` (cached by identity: profiled runs repeat)."""
    hit = _infos.get(id(ctx))
    if hit is not None and hit[0] is ctx:
        return hit[1]
    ins = tuple(None if s is None else tuple(int(d) for d in s.shape) for s in ctx.inputs)
    outs = tuple(tuple(int(d) for d in s.shape) for s in ctx.outputs)
    info = NodeInfo(ctx.node.index, ctx.node.op, ins, outs, node_flops(ctx.node.op, ins, outs, ctx.attrs))
    _infos[id(ctx)] = (ctx, info)   # the entry keeps ctx alive, so its id stays its own
    return info


def nodes_label(nodes: Sequence[NodeInfo]) -> str:
    """``node 7 (CONV_2D)`` or, for a fused step, ``nodes 3-5 (ADD+RELU+MUL)``."""
    if len(nodes) == 1:
        return f"node {nodes[0].index} ({nodes[0].op})"
    if not nodes:
        return "(no nodes)"
    ops = "+".join(n.op for n in nodes) if len(nodes) <= 6 else f"{len(nodes)} nodes"
    return f"nodes {nodes[0].index}-{nodes[-1].index} ({ops})"


def _shape(s) -> str:
    return "-" if s is None else "x".join(map(str, s)) or "scalar"


def _shapes(nodes: Sequence[NodeInfo]) -> str:
    if not nodes:
        return ""
    return (",".join(_shape(s) for s in nodes[0].inputs) + " -> " + ",".join(_shape(s) for s in nodes[-1].outputs))


# -- the record ----------------------------------------------------------------------------
@dataclass
class Slice:
    """One timed interval on one track: a run, a partition, a copy, a cpu step or a kernel."""

    name: str
    cat: str                          # "run", "partition", "copy", "node" (cpu step) or "kernel"
    process: str                      # the trace's process: "host" or a device backend
    thread: str                       # its track within the process (a queue, cpu steps, copies)
    start: float                      # seconds, perf_counter clock
    dur: float
    nodes: tuple[NodeInfo, ...] = ()
    backend: str = ""
    args: dict = field(default_factory=dict)


class Profiler:
    """Collects the slices of the runs made while it is active; see the module docstring."""

    def __init__(self) -> None:
        self.slices: list[Slice] = []
        self.runs = 0
        self._depth = 0
        self._pending: list[tuple[Any, float, Slice]] = []   # (device event, host enqueue time, slice)
        self._on_exit: list[Callable[[], None]] = []
        self._backend = "host"   # the backend whose partition is running (names step slices)
        self.t0 = clock()

    # -- activation ----------------------------------------------------------------------
    def __enter__(self) -> "Profiler":
        if STATE.active is not None:
            raise RuntimeError("a litegpu profiler is already active")
        self.t0 = clock()
        STATE.active = self
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.flush()
        finally:
            STATE.active = None
            _infos.clear()   # it keeps node contexts alive; slices hold NodeInfos of their own
            hooks, self._on_exit = self._on_exit, []
            for undo in reversed(hooks):
                undo()

    def on_exit(self, undo: Callable[[], None]) -> None:
        """Call ``undo`` when profiling ends (e.g. a backend putting back its usual queue)."""
        self._on_exit.append(undo)

    # -- recording ------------------------------------------------------------------------
    def add(self, item: Slice) -> None:
        """Record a finished slice."""
        self.slices.append(item)

    def run_steps(self, steps) -> None:
        """:func:`litegpu.steps.run_steps` while profiling: each step run and timed as one
        slice naming its nodes, or its parts in its place (a chained step's); a step of no
        nodes (a copy) is run untimed."""
        for step in steps:
            if step.parts:
                self.run_steps(step.parts)
                continue
            start = clock()
            try:
                step.call()
            except Exception as exc:
                raise failure(step, exc) from None
            if step.nodes:
                infos = tuple(node_info(c) for c in step.nodes)
                self.add(Slice(nodes_label(infos), "node", HOST, CPU_STEPS, start, clock() - start, infos,
                               self._backend, {"fused": len(infos) > 1, "kernel": step.kernel}))

    def add_device(self, event: Any, host_enqueued: float, item: Slice) -> None:
        """Record a slice whose times come from a device event (``event.profile.start/end``
        in ns) once it completes; ``host_enqueued`` is the host time it was enqueued at."""
        self._pending.append((event, host_enqueued, item))

    def flush(self) -> None:
        """Read the device times of completed work (waits for it)."""
        pending, self._pending = self._pending, []
        offset = None
        for event, host_enqueued, item in pending:
            event.wait()
            prof = event.profile
            if offset is None or item.args.get("first"):
                # Device clock → host clock: the device's queued time is our enqueue time.
                offset = host_enqueued - prof.queued * 1e-9
            item.args.pop("first", None)
            item.start = prof.start * 1e-9 + offset
            item.dur = max(prof.end - prof.start, 0) * 1e-9
            self.slices.append(item)

    # -- reading ----------------------------------------------------------------------------
    def _timed(self) -> list[Slice]:
        """The slices that time nodes (cpu steps and kernels)."""
        return [s for s in self.slices if s.cat in ("node", "kernel")]

    @property
    def run_seconds(self) -> float:
        """Total time of the profiled top-level runs."""
        return sum(s.dur for s in self.slices if s.cat == "run")

    def op_table(self) -> list[tuple[str, int, float, float, float]]:
        """Per op type: (op, nodes per run, ms per run, % of run, avg ms per node), slowest first.
        A slice of several nodes (a fused step) is split evenly among them."""
        runs = max(self.runs, 1)
        total: dict[str, float] = {}
        nodes: dict[str, set[int]] = {}
        for s in self._timed():
            for n in s.nodes:
                total[n.op] = total.get(n.op, 0.0) + s.dur / len(s.nodes)
                nodes.setdefault(n.op, set()).add(n.index)
        run_ms = self.run_seconds * 1e3 / runs
        rows = []
        for op, seconds in total.items():
            ms = seconds * 1e3 / runs
            rows.append((op, len(nodes[op]), ms, 100 * ms / run_ms if run_ms else 0.0, ms / len(nodes[op])))
        return sorted(rows, key=lambda r: -r[2])

    def step_table(self) -> list[tuple[str, str, str, str, float, float | None]]:
        """Per step (a node, or the nodes of one fused step): (label, op, shapes, backend,
        ms per run, GFLOP/s or None), slowest first. A step's kernels are summed."""
        runs = max(self.runs, 1)
        acc: dict[tuple, list] = {}
        for s in self._timed():
            key = (s.backend, tuple(n.index for n in s.nodes))
            entry = acc.setdefault(key, [s.nodes, 0.0, False])
            entry[1] += s.dur
            entry[2] |= str(s.args.get("kernel", "")).startswith(REFERENCE)
        rows = []
        for (backend, _), (nodes, seconds, reference) in acc.items():
            ms = seconds * 1e3 / runs
            flops = sum(n.flops for n in nodes)
            gflops = flops / (ms * 1e6) if flops and ms > 0 else None
            ops = "+".join(dict.fromkeys(n.op for n in nodes))
            # A step the op's numpy reference runs is a slow path: the label says so.
            label = nodes_label(nodes) + (f" [{REFERENCE}]" if reference else "")
            rows.append((label, ops, _shapes(nodes), backend, ms, gflops))
        return sorted(rows, key=lambda r: -r[4])

    def summary(self, top: int = 10) -> str:
        """The per-op-type table and the ``top`` slowest nodes, as LiteRT's
        ``benchmark_model --enable_op_profiling`` prints them."""
        runs = max(self.runs, 1)
        lines = [f"Profile of {self.runs} run{'s' if self.runs != 1 else ''}: "
                 f"{self.run_seconds * 1e3 / runs:.3f} ms per run (profiled; per-step timing adds overhead)"]
        ops = self.op_table()
        timed = sum(r[2] for r in ops)
        lines.append(f"Per op type ({sum(r[1] for r in ops)} nodes, {timed:.3f} ms of kernels per run):")
        lines.append(f"  {'op type':<26}{'count':>6}{'ms/run':>10}{'% run':>8}{'avg ms':>10}")
        for op, count, ms, pct, avg in ops:
            lines.append(f"  {op:<26}{count:>6}{ms:>10.3f}{pct:>7.1f}%{avg:>10.4f}")
        steps = self.step_table()
        lines.append(f"Slowest nodes (top {min(top, len(steps))} of {len(steps)} steps):")
        lines.append(f"  {'node':<30}{'backend':<9}{'ms':>9}{'GFLOP/s':>9}  shapes (in -> out)")
        for label, _, shapes, backend, ms, gflops in steps[:top]:
            g = f"{gflops:.2f}" if gflops is not None else "-"
            lines.append(f"  {label:<30}{backend:<9}{ms:>9.4f}{g:>9}  {shapes}")
        if any(len(s.nodes) > 1 for s in self._timed()):
            lines.append("  (a fused step's time is split evenly among its nodes in the per-op table)")
        return "\n".join(lines)

    def chrome_trace(self) -> dict:
        """The slices as a Chrome trace-event object (Perfetto, chrome://tracing): a process
        per host/device backend, a thread per track, complete ("X") events in µs."""
        self.flush()
        pids: dict[str, int] = {}
        tids: dict[tuple[str, str], int] = {}
        events: list[dict] = []
        for s in sorted(self.slices, key=lambda s: s.start):
            pid = pids.setdefault(s.process, len(pids) + 1)
            tid = tids.setdefault((s.process, s.thread), len(tids) + 1)
            args = dict(s.args)
            if s.nodes:
                args.update(nodes=[n.index for n in s.nodes], ops=[n.op for n in s.nodes], shapes=_shapes(s.nodes))
            if s.backend:
                args["backend"] = s.backend
            events.append({"name": s.name, "cat": s.cat, "ph": "X", "pid": pid, "tid": tid,
                           "ts": round((s.start - self.t0) * 1e6, 3), "dur": round(s.dur * 1e6, 3), "args": args})
        meta = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name}}
                for name, pid in pids.items()]
        meta += [{"name": "thread_name", "ph": "M", "pid": pids[p], "tid": tid, "args": {"name": t}}
                 for (p, t), tid in tids.items()]
        return {"traceEvents": meta + events, "displayTimeUnit": "ms"}

    def save_chrome_trace(self, path) -> None:
        """Write :meth:`chrome_trace` as JSON to ``path``."""
        trace = self.chrome_trace()
        with open(path, "w") as f:   # one event a line: readable, and still plain JSON
            f.write('{"displayTimeUnit": "ms", "traceEvents": [\n')
            f.write(",\n".join(json.dumps(e) for e in trace["traceEvents"]))
            f.write("\n]}\n")
        log.info("wrote a Chrome trace of %d slices to %s", len(self.slices), path)


def profile() -> Profiler:
    """A profiler to use as a context manager: runs made inside the block are timed."""
    return Profiler()


# -- the profiled run -------------------------------------------------------------------
def _call_program(profiler: Profiler, program, backend: str, nodes, inputs, outputs, wait_for=()) -> Event:
    """Run ``program`` through its ``run_profiled`` (see :meth:`Program.run_profiled`);
    when that returns None (the default: not offered), its ``run``: a host program that
    runs bound steps (:func:`litegpu.steps.run_steps`) records a slice per step; any other
    is timed as a whole (waiting for its event), the time split evenly among ``nodes``."""
    event = program.run_profiled(inputs, outputs, wait_for, profiler)
    if event is not None:
        return event
    start, recorded, outer = clock(), len(profiler.slices), profiler._backend
    profiler._backend = backend
    try:
        event = program.run(inputs, outputs, wait_for)
    finally:
        profiler._backend = outer   # (a WHILE's subgraphs run inside a step of the outer program)
    event.wait()
    if len(profiler.slices) > recorded:
        return COMPLETE
    infos = tuple(node_info(c) for c in nodes)
    profiler.add(Slice(nodes_label(infos), "node", HOST, f"{backend} (whole partitions)", start, clock() - start,
                       infos, backend))
    return COMPLETE


def _partition_slice(profiler: Profiler, compiled, index: int, start: float) -> None:
    backend, positions = compiled.report.partitions[index]
    first, last = (compiled.report.assignments[positions[p]].node for p in (0, -1)) if positions else (0, 0)
    dispatch = "" if backend == "cpu" else " dispatch"
    profiler.add(Slice(f"partition {index} ({backend}{dispatch}, nodes {first}-{last})", "partition", HOST, RUNS,
                       start, clock() - start, backend=backend, args={"nodes": len(positions)}))


def run_profiled(compiled, bound=None, wait_for: Sequence[Event] = ()) -> Event:
    """Run a ``CompiledSubgraph`` partition by partition under the active profiler,
    synchronously; the executor calls this instead of its fast paths while profiling."""
    profiler = STATE.active
    profiler._depth += 1
    start = clock()
    try:
        event = _run_host(profiler, compiled, wait_for) if compiled.runner is None else \
            _run_devices(profiler, compiled, bound, wait_for)
        event.wait()
    finally:
        profiler._depth -= 1
    if profiler._depth == 0:
        profiler.runs += 1
        profiler.add(Slice(f"run {profiler.runs}", "run", HOST, RUNS, start, clock() - start))
        profiler.flush()
    return COMPLETE


def _nodes_of(compiled, index: int) -> list:
    program = compiled.programs[index][0]
    part = program.partition   # (None: a program that does not say which nodes it runs)
    return list(part.nodes) if part is not None else []


def _run_host(profiler: Profiler, compiled, wait_for: Sequence[Event]) -> Event:
    for e in wait_for:
        e.wait()
    host, specs = compiled.host, compiled.specs
    for index, (program, ins, outs) in enumerate(compiled.programs):
        start = clock()
        out_arrays = [host.get(o) if specs.get(o) is not None else None for o in outs]
        _call_program(profiler, program, compiled.report.partitions[index][0], _nodes_of(compiled, index),
                      [host[i] for i in ins], out_arrays)
        for o, arr in zip(outs, out_arrays):
            host[o] = arr
        _partition_slice(profiler, compiled, index, start)
    return COMPLETE


def _run_devices(profiler: Profiler, compiled, bound, wait_for: Sequence[Event]) -> Event:
    """The runner's plan replayed command by command: copies timed on the host (a copy to
    the host blocks until the device is done), partitions through :func:`_call_program`."""
    runner = compiled.runner
    plan = runner.plan(bound)
    runner.bound = bound or {}
    host = runner.host
    event: Event = COMPLETE
    waits = list(wait_for)
    for command, kind in zip(plan.commands, plan.kinds):
        start = clock()
        if kind[0] != "run":
            direction, t, place = kind
            event = command(waits)
            arrow = "host -> " + place if direction == "in" else place + " -> host"
            profiler.add(Slice(f"copy tensor {t} {arrow}", "copy", HOST, TRANSFERS, start, clock() - start,
                               backend=place, args={"tensor": t, "bytes": int(host[t].nbytes)}))
        else:
            index = kind[1]
            program, backend, ins, outs = runner.programs[index]
            if backend.host_memory:
                for e in waits:
                    e.wait()
                out_arrays = [host.get(o) for o in outs]
                event = _call_program(profiler, program, backend.name, _nodes_of(compiled, index),
                                      [host[i] for i in ins], out_arrays)
                for o, arr in zip(outs, out_arrays):
                    host[o] = arr
            else:
                event = _call_program(profiler, program, backend.name, _nodes_of(compiled, index),
                                      [runner.buffer(backend, i) for i in ins],
                                      [runner.buffer(backend, o) for o in outs], waits)
            _partition_slice(profiler, compiled, index, start)
        waits = [event] if event is not COMPLETE else []
    return event
