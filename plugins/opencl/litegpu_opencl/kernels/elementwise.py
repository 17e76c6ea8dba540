"""Elementwise kernels: unary math, broadcasting binary ops; and the chain expressions.

The C expressions of ``CHAIN_UNARY`` / ``CHAIN_BINARY`` serve twice: as the body of a
standalone elementwise kernel, and as a follower folded into a producer's store.
"""
from __future__ import annotations

import numpy as np

from ..codegen import CHAIN_BINARY, CHAIN_UNARY, NodeGen, strides_of
from . import Decline, generator

CHAIN_UNARY.update({
    "RELU": lambda x, a: f"fmax({x}, (real)0)",
    "RELU6": lambda x, a: f"clamp({x}, (real)0, (real)6)",
})
CHAIN_BINARY.update({
    "ADD": lambda x, y, a: f"({x} + {y})",
    "SUB": lambda x, y, a: f"({x} - {y})",
    "MUL": lambda x, y, a: f"({x} * {y})",
})

_F32 = np.dtype(np.float32)


def _broadcast_index(g: NodeGen, pos: int, out_shape: tuple[int, ...], flat: str) -> str:
    """Index into input ``pos`` for output flat index ``flat`` under numpy broadcasting."""
    shape = tuple(g.ctx.inputs[pos].shape)
    if shape == out_shape:
        return flat
    if int(np.prod(shape, dtype=np.int64)) == 1:
        return "0"
    full = (1,) * (len(out_shape) - len(shape)) + shape
    in_strides = strides_of(full)
    out_strides = strides_of(out_shape)
    terms = []
    for axis, (d, od) in enumerate(zip(full, out_shape)):
        if d == 1 or od == 1:
            continue
        coord = f"(({flat}) / {out_strides[axis]} % {od})" if axis else f"(({flat}) / {out_strides[axis]})"
        terms.append(f"{coord} * {in_strides[axis]}" if in_strides[axis] != 1 else coord)
    return " + ".join(terms) or "0"


@generator(*CHAIN_UNARY, epilogue=True)
def unary(g: NodeGen):
    """One work-item per element: ``out[i] = f(in[i])``."""
    if g.ctx.inputs[0].dtype != _F32:
        raise Decline(f"{g.ctx.node.op} on {g.ctx.inputs[0].dtype} tensors")
    n = int(np.prod(g.ctx.outputs[0].shape, dtype=np.int64))
    x = g.input(0)
    expr = CHAIN_UNARY[g.ctx.node.op]("v", g.attrs)
    body = (f"  const int i = get_global_id(0);\n  if (i >= {n}) return;\n"
            f"  const real v = LD({x}, i);\n  {g.store_output('i', expr)}")
    return [g.kernel(body, (n,))]


@generator(*CHAIN_BINARY, epilogue=True)
def binary(g: NodeGen):
    """One work-item per output element, inputs indexed by numpy broadcasting."""
    if any(s.dtype != _F32 for s in g.ctx.inputs) or g.ctx.outputs[0].dtype != _F32:
        raise Decline(f"{g.ctx.node.op} on non-float tensors")
    out_shape = tuple(g.ctx.outputs[0].shape)
    n = int(np.prod(out_shape, dtype=np.int64))
    a, b = g.input(0), g.input(1)
    ia, ib = _broadcast_index(g, 0, out_shape, "i"), _broadcast_index(g, 1, out_shape, "i")
    expr = CHAIN_BINARY[g.ctx.node.op](f"LD({a}, {ia})", f"LD({b}, {ib})", g.attrs)
    body = f"  const int i = get_global_id(0);\n  if (i >= {n}) return;\n  {g.store_output('i', expr)}"
    return [g.kernel(body, (n,))]
