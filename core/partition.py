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

from .backend import Backend, NodeContext
from .errors import UnsupportedError
from .graph import Model

log = logging.getLogger("litegpu")
CPU = "cpu"


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
    arena_bytes: int = 0
    arena_naive_bytes: int = 0
    bytes_moved: int = 0          # copied between host and devices per run (host buffers in and out)
    programs: list[str] = field(default_factory=list)   # each program's own summary (precision, kernels)

    def nodes_on(self, backend: str) -> int:
        """How many nodes run on ``backend``."""
        return sum(a.backend == backend for a in self.assignments)

    @property
    def nodes_in_file(self) -> int:
        """The subgraph's operator count in the file, which is LiteRT's node count:
        nodes that run plus nodes folded at load and at compile time."""
        return len(self.assignments) + len(self.folded) + len(self.folded_at_load)

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
        if self.folded:
            parts.append(f"{len(self.folded)} folded at compile time (values known from constants and shapes)")
        parts.append(f"{len(self.assignments)} run in {len(self.partitions)} "
                     f"partition{'s' if len(self.partitions) != 1 else ''}")
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
            lines.append(f"partition {i}: {backend}, {len(positions)} node{'s' if len(positions) != 1 else ''} "
                         f"({span}" + (f", {gap} folded in between)" if gap else ")"))
        return lines

    def __str__(self) -> str:
        lines = [f"subgraph {self.subgraph}: {self.counts()} (requested {', '.join(self.requested) or 'cpu'}); "
                 f"arena {self.arena_bytes / 1e6:.2f} MB (unshared {self.arena_naive_bytes / 1e6:.2f} MB)"]
        lines.extend(f"  {line}" for line in self.partition_lines())
        if self.bytes_moved:
            lines.append(f"  host<->device copies: {self.bytes_moved} bytes per run")
        lines.extend(f"  {p}" for p in self.programs)
        for a in self.assignments:
            if a.reason:
                lines.append(f"  node {a.node} ({a.op}) on {a.backend}: {a.reason}")
        return "\n".join(lines)


_warned: set[tuple[str, str, str]] = set()


def assign(nodes: list[NodeContext], model: Model, backends: list[Backend], cpu: Backend,
           subgraph: int = 0, max_delegated_partitions: int = 0) -> DelegationReport:
    """Place each node on the first backend in ``backends`` that supports it, else on cpu."""
    report = DelegationReport(subgraph, [b.name for b in backends])
    if 0 <= subgraph < len(model.subgraphs):
        report.folded_at_load = [(n.index, n.op) for n in model.subgraphs[subgraph].folded_at_load]
    for ctx in nodes:
        chosen, reasons = None, []
        for backend in backends:
            support = backend.supports(ctx, model)
            if support.ok:
                chosen = backend.name
                break
            reasons.append(f"{backend.name}: {support.reason}")
            key = (backend.name, ctx.node.op, support.reason)
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
        report.assignments.append(Assignment(ctx.node.index, ctx.node.op, chosen, "; ".join(reasons)
                                             if chosen != (backends[0].name if backends else CPU) else ""))
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
