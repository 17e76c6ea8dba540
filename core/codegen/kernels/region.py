"""A fused region's kernel: index maps, joins and float formulas in one launch.

A region (see :func:`litegpu.codegen.fusion.fuse_regions`) is a set of nodes whose
intermediate tensors nothing outside it reads: walks (slices, reshapes, transposes,
broadcasts: :data:`.layout.WALKS`), CONCATENATION and float elementwise formulas
(:mod:`..formulas`), ending in one of them or in the update of a DYNAMIC_UPDATE_SLICE (a
KV-cache write). Its kernel puts one work-item on each element of the region's
output (its last node's) and computes it from the tensors the region reads, following
each node backwards from the element it needs: a walk moves the index into its input, a
join picks the input the index falls in, a formula combines its operands at their
broadcast indices. A decoder's rotary embedding (slices of the fused QKV product, four
products, a difference, a sum and a concatenation, for the queries and again for the
keys) is then one launch where it was ten.

Every value is computed as the nodes' own kernels compute it (the same formulas, no
contraction), so a region's output has the unfused kernels' bits in F32; in half
storage the intermediates are not rounded to half between nodes.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from litegpu.backend import NodeContext
from litegpu.ops import normalize_axis

from .. import formulas, ir
from ..ir import Expr
from ..nodegen import KernelSpec, NodeGen, Precision
from .elementwise import Broadcast
from .layout import WALKS, picked, update_slice, walk_source


class _Region:
    """The values of a region's tensors at the indices its output's element needs."""

    def __init__(self, nodes: Sequence[NodeContext], g: NodeGen, b: ir.KernelBuilder) -> None:
        self.g, self.b = g, b
        self.made = {ctx.node.outputs[0]: ctx for ctx in nodes}
        self._memo: dict[tuple[int, int], tuple[Expr, Expr]] = {}

    def value(self, t: int, index: Expr) -> Expr:
        """Tensor ``t`` at flat ``index``: loaded where the region reads it, else computed."""
        key = (t, id(index))
        if key not in self._memo:   # (the index is kept with its value: its id stays its own)
            self._memo[key] = (self._compute(t, index), index)
        return self._memo[key][0]

    def _compute(self, t: int, index: Expr) -> Expr:
        b, g = self.b, self.g
        ctx = self.made.get(t)
        if ctx is None:
            spec = g.specs[t]
            if spec.value is not None and np.asarray(spec.value).size == 1:
                return ir.lit(float(np.asarray(spec.value).reshape(-1)[0]), ir.REAL)
            return b.let("x", g.tensor(b, t).load(index))
        op, ins = ctx.node.op, ctx.node.inputs
        if op in WALKS:
            value = self.value(ins[0], b.let("j", self._walked(ctx, index)))
        elif op == "CONCATENATION":
            value = self._joined(ctx, index)
        elif op in formulas.UNARY:
            value = formulas.UNARY[op](self.value(ins[0], index), ctx.attrs)
        else:
            bc = Broadcast(ctx.outputs[0].shape, [s.shape for s in ctx.inputs])
            coords = bc.coords(b, index)
            operands = [self.value(i, bc.index(k, index, coords)) for k, i in enumerate(ins)]
            value = formulas.BINARY[op](*operands, ctx.attrs)
        activation = ctx.attrs.get("activation", "NONE")
        if activation != "NONE":
            value = formulas.clamp(activation, b.let("v", value))
        return b.let("v", value)

    def _walked(self, ctx: NodeContext, index: Expr) -> Expr:
        """The input element a walk node's element ``index`` copies."""
        return walk_source(WALKS[ctx.node.op](NodeGen(ctx, self.g.precision, self.g.specs, dialect=self.g.dialect)),
                           index)

    def _joined(self, ctx: NodeContext, index: Expr) -> Expr:
        """A CONCATENATION's element ``index``: the input its position on the axis falls in."""
        b = self.b
        shape = tuple(int(d) for d in ctx.outputs[0].shape)
        axis = normalize_axis(ctx.attrs["axis"], len(shape), "CONCATENATION axis")
        inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
        along = b.let("a", (index / inner if inner > 1 else index) % shape[axis])
        outer = b.let("o", index / (inner * shape[axis]))
        rest = b.let("r", index % inner) if inner > 1 else ir.lit(0, ir.INT)
        widths = [int(spec.shape[axis]) for spec in ctx.inputs]
        return picked(along, widths, lambda k, at: self.value(
            ctx.node.inputs[k], b.let("p", outer * (widths[k] * inner) + at * inner + rest)))


def region_kernels(nodes: Sequence[NodeContext], precision: Precision, specs, dialect, lanes: int = 1
                   ) -> list[KernelSpec]:
    """The kernel of a region of ``nodes`` (in order; the last one's output is the region's).
    A DYNAMIC_UPDATE_SLICE last (a KV-cache write) keeps its kernels, its update computed
    by the region's other nodes where its update kernel stores it."""
    root = nodes[-1]
    g = NodeGen(root, precision, specs, dialect=dialect, lanes=lanes)
    if root.node.op == "DYNAMIC_UPDATE_SLICE":
        return update_slice(g, lambda b, i: _Region(nodes[:-1], g, b).value(root.node.inputs[1], i))
    b = g.new_kernel()
    size = int(np.prod(root.outputs[0].shape, dtype=np.int64))
    if not size:
        return []
    flat = b.let("i", b.global_id(0))
    value = _Region(nodes, g, b).value(root.node.outputs[0], flat)
    b.store(g.output(b), flat, value)
    return [g.kernel(b, (size,))]
