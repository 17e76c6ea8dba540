"""Assign nodes to backends and cut the subgraph into partitions.

Each backend in the user's preference order answers ``supports(node)``; a node goes to
the first that says yes, else to cpu. Contiguous runs on one backend form partitions;
``max_delegated_partitions`` keeps the largest delegated ones and returns the rest to
cpu. The result carries a :class:`DelegationReport`.
"""
from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

from .backend import REFERENCE, Backend, NodeContext, Support, device_label
from .errors import UnsupportedError
from .graph import Model

log = logging.getLogger("litegpu")
CPU = "cpu"
MEASURED = "measured:"   # how the reason of a node a measured placement moved to cpu starts


@dataclass(frozen=True)
class Assignment:
    """Where one node runs, and why it is not on the preferred backend."""

    node: int
    op: str
    backend: str
    reason: str = ""


@dataclass
class DelegationReport:
    """Per-node placement of a subgraph, printable and inspectable."""

    subgraph: int
    requested: list[str]
    assignments: list[Assignment] = field(default_factory=list)
    # (backend, positions into ``assignments``) per partition, in execution order
    partitions: list[tuple[str, list[int]]] = field(default_factory=list)
    folded: list[int] = field(default_factory=list)   # nodes folded at compile time (shape arithmetic)
    # (node, op) of the nodes the reader folded into constants (weight DEQUANTIZE/DENSIFY)
    folded_at_load: list[tuple[int, str]] = field(default_factory=list)
    # (node, name, nodes it became) of the STABLEHLO_COMPOSITE nodes replaced by their decomposition
    inlined_composites: list[tuple[int, str, int]] = field(default_factory=list)
    arena_bytes: int = 0
    arena_naive_bytes: int = 0
    bytes_moved: int = 0          # copied between host and devices per run (host buffers in and out)
    programs: list[str] = field(default_factory=list)   # each program's own summary (precision, kernels)
    # Why this subgraph runs where it does when control flow calls it (e.g. "body of WHILE
    # node 4 in subgraph 0"); empty for a signature's own subgraph.
    role: str = ""
    # Reports of the subgraphs this one calls through control flow, transitively, by index:
    # with them the report covers every node that a run of this subgraph can execute.
    called: list["DelegationReport"] = field(default_factory=list)
    # One line per subgraph of the model that a run of this one never reaches.
    unreached: list[str] = field(default_factory=list)
    # How the placement was chosen when it was not first-that-supports (placement="measure"):
    # the measured times of the candidates, or that the decision came from the cache.
    placement: str = ""
    # How the model is quantized and run ("int8", "int16x8", "hybrid", "float view + quant
    # sim"; "" for float), and the nodes the float view added (DEQUANTIZE/QUANT_SIM/QUANTIZE).
    quantization: str = ""
    added_nodes: int = 0
    # Each device backend's device, as partition lines name it ("opencl (<device>, a CPU)").
    devices: dict[str, str] = field(default_factory=dict)
    # What runs each node, where the backend says (``Program.kernels``): (node, op, backend,
    # kernel), in run order; a node computed when compiled has no line.
    kernels: list[tuple[int, str, str, str]] = field(default_factory=list)

    def nodes_on(self, backend: str) -> int:
        """How many nodes of this subgraph run on ``backend`` (see :meth:`all_assignments` for
        the subgraphs it calls)."""
        return sum(a.backend == backend for a in self.assignments)

    def reference_nodes(self) -> list[tuple[int, str, str, str]]:
        """The :attr:`kernels` lines of nodes a numpy reference runs (the slow paths)."""
        return [k for k in self.kernels if k[3].startswith(REFERENCE)]

    def subgraph_reports(self) -> list["DelegationReport"]:
        """This report followed by those of the subgraphs it calls."""
        return [self, *self.called]

    def all_assignments(self) -> list[tuple[int, Assignment]]:
        """(subgraph, assignment) for every node of this subgraph and of those it calls."""
        return [(r.subgraph, a) for r in self.subgraph_reports() for a in r.assignments]

    @property
    def nodes_in_file(self) -> int:
        """The subgraph's operator count in the file, which is LiteRT's node count:
        nodes that run plus nodes folded at load and at compile time."""
        return (len(self.assignments) + len(self.folded) + len(self.folded_at_load) - self.added_nodes
                - sum(n - 1 for _, _, n in self.inlined_composites))

    @property
    def fully_delegated(self) -> bool:
        """True when every node runs on the first requested backend (cpu when none was requested)."""
        target = self.requested[0] if self.requested else CPU
        return all(a.backend == target for a in self.assignments)

    def counts(self) -> str:
        """One sentence reconciling the file's node count with the nodes that run."""
        parts = []
        if self.folded_at_load:
            ops = Counter(op for _, op in self.folded_at_load)
            parts.append(f"{len(self.folded_at_load)} folded into constants at load "
                         f"({', '.join(f'{op}x{n}' for op, n in ops.most_common())} of constant weights)")
        if self.inlined_composites:
            names = Counter(name for _, name, _ in self.inlined_composites)
            parts.append(f"{len(self.inlined_composites)} composites replaced by their decomposition's "
                         f"{sum(n for _, _, n in self.inlined_composites)} nodes "
                         f"({', '.join(f'{name}x{n}' for name, n in names.most_common())})")
        if self.folded:
            parts.append(f"{len(self.folded)} folded at compile time (values known from constants and shapes)")
        parts.append(f"{len(self.assignments)} run in {len(self.partitions)} "
                     f"partition{'s' if len(self.partitions) != 1 else ''}"
                     + (f" ({self.added_nodes} of them added by the float view)" if self.added_nodes else ""))
        total = self.nodes_in_file
        return f"{total} node{'s' if total != 1 else ''} in the file: " + ", ".join(parts)

    def partition_lines(self) -> list[str]:
        """One line per partition: its backend, node count and range of file node indices."""
        skipped = {*self.folded, *(n for n, _ in self.folded_at_load)}
        lines = []
        for i, (backend, positions) in enumerate(self.partitions):
            first, last = self.assignments[positions[0]].node, self.assignments[positions[-1]].node
            # Node numbers are the file's; folded nodes inside the range explain a gap.
            gap = sum(first <= n <= last for n in skipped)
            span = f"node {first}" if first == last else f"nodes {first}..{last}"
            lines.append(f"partition {i}: {self.devices.get(backend, backend)}, {len(positions)} node{'s' if len(positions) != 1 else ''} "
                         f"({span}" + (f", {gap} folded in between)" if gap else ")"))
        return lines

    def __str__(self) -> str:
        lines = self._own_lines()
        for report in self.called:
            lines.extend(report._own_lines())
        lines.extend(self.unreached)
        return "\n".join(lines)

    def _own_lines(self) -> list[str]:
        """This subgraph's block of :meth:`__str__`, without the subgraphs it calls."""
        role = f" ({self.role})" if self.role else ""
        # The arena planned here is host memory; a device partition plans its own and says
        # so on its line (an "arena 0.00 MB" here read as the whole model's).
        where = "arena" if all(b == CPU for b, _ in self.partitions) else "host arena"
        lines = [f"subgraph {self.subgraph}{role}: {self.counts()} (requested {', '.join(self.requested) or 'cpu'}); "
                 f"{where} {self.arena_bytes / 1e6:.2f} MB (unshared {self.arena_naive_bytes / 1e6:.2f} MB)"]
        if self.placement:
            lines.append(f"  {self.placement}")
        if self.quantization:
            lines.append(f"  quantized model, every partition runs it as: {self.quantization}")
        lines.extend(f"  {line}" for line in self.partition_lines())
        if self.bytes_moved:
            lines.append(f"  host<->device copies: {self.bytes_moved} bytes per run")
        lines.extend(f"  {p}" for p in self.programs)
        said = set()
        for a in self.assignments:
            if a.reason.startswith(MEASURED):
                # One line per moved partition: the reason names its nodes.
                if a.reason not in said:
                    said.add(a.reason)
                    lines.append(f"  on {a.backend}: {a.reason}")
            elif a.reason:
                lines.append(f"  node {a.node} ({a.op}) on {a.backend}: {a.reason}")
        return lines


_warned: set[tuple[str, str, str]] = set()

# Ops the core keeps on cpu whatever the backends say, as LiteRT's GPU delegate does:
# control flow calls subgraphs from the host, and resource variables are host state.
# Each control-flow op's called subgraphs: the op's attr naming one (see litegpu.ops.control)
# and what to call it in a report.
CONTROL_FLOW = {"WHILE": (("cond", "condition"), ("body", "body")),
                "IF": (("then", "then branch"), ("else", "else branch")),
                "CALL_ONCE": (("init", "init"),)}
RESOURCE_VARIABLES = frozenset({"VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE"})
CONTROL_FLOW_REASON = "control flow runs on cpu (LiteRT's GPU delegate leaves it to the CPU)"
VARIABLE_REASON = "resource variables live on the host (LiteRT's GPU delegate leaves them to the CPU)"


def host_only_reason(op: str) -> str:
    """Why the core keeps nodes of ``op`` on cpu without asking the backends; "" when it does not."""
    if op in CONTROL_FLOW:
        return CONTROL_FLOW_REASON
    if op in RESOURCE_VARIABLES:
        return VARIABLE_REASON
    return ""


def _explain_dynamic(nodes: list[NodeContext]) -> None:
    """Set ``dynamic_reason`` on each dynamic node: the node its unknown shape comes from.

    A node is dynamic either by itself (its output shape follows from input values, or it
    is stateful) or because an input's shape is unknown; the second kind names the
    producer, and the node where the unknown shape starts when that is further up.
    """
    origin: dict[int, NodeContext] = {}   # tensor with an unknown shape -> node where that starts
    producer: dict[int, NodeContext] = {}
    for ctx in nodes:
        unknown = [t for t, spec in zip(ctx.node.inputs, ctx.inputs) if t >= 0 and spec is None and t in producer]
        if not ctx.dynamic:
            continue
        root = ctx
        if ctx.opdef.stateful:
            # Its outputs come from state or called subgraphs, not from its inputs'
            # shapes: an unknown shape starts here.
            ctx.dynamic_reason = host_only_reason(ctx.node.op) or "a stateful op: its output shapes are known " \
                                                                  "only at run time"
        elif unknown:
            t = unknown[0]
            direct, root = producer[t], origin[t]
            why = f"its input (tensor {t}) comes from node {direct.node.index} ({direct.node.op}), " \
                  "whose output shapes are known only at run time"
            if root is not direct:
                why += f" (they follow from node {root.node.index} ({root.node.op}))"
            ctx.dynamic_reason = why
        for o in ctx.node.outputs:
            producer[o], origin[o] = ctx, root


def assign(nodes: list[NodeContext], model: Model, backends: list[Backend], cpu: Backend,
           subgraph: int = 0, max_delegated_partitions: int = 0,
           moved: dict[int, str] | None = None) -> DelegationReport:
    """Place each node on the first backend in ``backends`` that supports it, else on cpu.

    Control flow and resource variables go to cpu without asking (see :func:`host_only_reason`).
    ``moved`` maps node indices to the reason they run on cpu instead (a measured placement,
    see :mod:`litegpu.placement`); cpu must support them.
    """
    moved = moved or {}
    report = DelegationReport(subgraph, [b.name for b in backends],
                              devices={b.name: device_label(b) for b in backends if b.is_gpu})
    if 0 <= subgraph < len(model.subgraphs):
        report.folded_at_load = [(n.index, n.op) for n in model.subgraphs[subgraph].folded_at_load]
        report.inlined_composites = list(model.subgraphs[subgraph].inlined_composites)
    _explain_dynamic(nodes)
    preferred = backends[0].name if backends else CPU
    for ctx in nodes:
        chosen, reasons = None, []
        host_only = host_only_reason(ctx.node.op)
        if ctx.node.index in moved and cpu.supports(ctx, model).ok:
            report.assignments.append(Assignment(ctx.node.index, ctx.node.op, CPU, moved[ctx.node.index]))
            continue
        for backend in backends:
            support = backend.supports(ctx, model) if not host_only or backend.name == CPU \
                else Support(False, host_only)
            if support.ok:
                chosen = backend.name
                break
            reasons.append(f"{backend.name}: {support.reason}")
            # Once per op and reason, as LiteRT logs; dynamic reasons name tensors, so one for them all.
            key = (backend.name, ctx.node.op, "dynamic" if ctx.dynamic_reason else support.reason)
            if backend.name != CPU and key not in _warned:
                _warned.add(key)
                log.warning("op code #%d (%s) cannot be handled by this delegate: %s",
                            ctx.node.opcode, ctx.node.op, support.reason)
        if chosen is None:
            support = cpu.supports(ctx, model)
            if not support.ok:
                raise UnsupportedError(
                    f"node {ctx.node.index} ({ctx.node.op}) is not supported by any backend: "
                    + "; ".join(reasons + [f"cpu: {support.reason}"]))
            chosen = CPU
        report.assignments.append(Assignment(ctx.node.index, ctx.node.op, chosen,
                                             "; ".join(reasons) if chosen != preferred else ""))
    _cut(report, max_delegated_partitions)
    return report


def _cut(report: DelegationReport, max_delegated: int) -> None:
    """Group contiguous runs into partitions, honouring ``max_delegated`` (0: no limit)."""
    def runs():
        out: list[tuple[str, list[int]]] = []
        for pos, a in enumerate(report.assignments):
            if out and out[-1][0] == a.backend:
                out[-1][1].append(pos)
            else:
                out.append((a.backend, [pos]))
        return out

    parts = runs()
    delegated = [p for p in parts if p[0] != CPU]
    if max_delegated > 0 and len(delegated) > max_delegated:
        keep = sorted(delegated, key=lambda p: -len(p[1]))[:max_delegated]
        keep_ids = {id(p) for p in keep}
        for p in delegated:
            if id(p) not in keep_ids:
                for pos in p[1]:
                    a = report.assignments[pos]
                    report.assignments[pos] = Assignment(a.node, a.op, CPU,
                                                         f"max_delegated_partitions={max_delegated} reached")
        parts = runs()
    report.partitions = parts
