"""litert-torch's composites as fused kernels: ``odml.rms_norm`` and
``odml.scaled_dot_product_attention`` (:mod:`litegpu.ops.composite` says what they
compute), written as :mod:`litegpu.codegen.ir` kernels so every dialect renders them.

Sums, scores and the softmax are ``float`` whatever the storage or arithmetic precision
(as in :mod:`.pool`); only the stored values are ``real``.

- rms norm: one work-item per row of the last axis (a work-group of ``NodeGen.lanes``
  sharing the row where there are several): the sum of squares in XNNPACK's order
  (the decomposition's, which LiteRT runs), ``RSQRT(0 + sum * (1 / D) + epsilon)`` (the
  formula of the RSQRT op), then ``(x * r) * w`` stored through the epilogue, read four
  at a time where the row allows.
- attention: one work-group per (batch, query position, head) row, of ``NodeGen.lanes``
  work-items (:func:`..render.kernel_lanes`: 64 on a GPU, 1 on a CPU device; more where
  one would loop too long, see :func:`_attention_lanes`), with the
  row's scaled query and its S scores in local memory: the scores
  (a fused multiply-add chain per key, the logit cap, the mask) and their maximum, then
  the SOFTMAX op's exponentials and sum (XNNPACK's, as :mod:`.pool`), then each output
  element a fused multiply-add chain of ``p_s = e_s * (1 / sum)`` times ``v_s``: the steps
  LiteRT's XNNPACK lowers the composite to. The local memory (D + S + lanes floats)
  must fit the dialect's ``max_local_bytes``, else the node declines (and runs on cpu):
  16 KiB in WebGPU holds about 4000 keys.
- a decoder's attention written as nodes (:mod:`litegpu.chains`) runs as the same kernel:
  its keys and values in either layout, the ops before the mask as their formulas, the
  mask's rows from a table.
"""
from __future__ import annotations

import numpy as np

from .. import formulas, ir
from ..ir import FLOAT, call
from ..nodegen import KernelSpec, NodeGen
from . import Decline, generator
from .pool import _grouped_rows, xnn_row_total, xnn_row_total_shared

_F32 = np.dtype(np.float32)
_INT_MAX = 2**31 - 1


def _float_operands(g: NodeGen, count: int) -> None:
    """Inputs ``0 .. count-1`` and the output float32, and every tensor indexable by ``int``."""
    specs = [*g.ctx.inputs[:count], *g.ctx.outputs]
    if any(spec is None or np.dtype(spec.dtype) != _F32 for spec in specs):
        raise Decline(f"{g.ctx.node.op} on tensors that are not all float32")
    if any(int(np.prod(spec.shape, dtype=np.int64)) > _INT_MAX for spec in specs):
        raise Decline("tensor has more than 2**31-1 elements")


@generator("odml.rms_norm", epilogue=True)
def rms_norm(g: NodeGen) -> list[KernelSpec]:
    """``(x * rsqrt(mean(x * x) + epsilon)) * w`` per row of the last axis."""
    _float_operands(g, 2)
    shape = tuple(int(n) for n in g.ctx.inputs[0].shape)
    d = shape[-1]
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    b = g.new_kernel()
    x, w = g.input(b, 0), g.input(b, 1)
    if rows == 0 or d == 0:
        return [g.kernel(b, (0,))]
    # With lanes, a work-group per row shares the sum (the same bits) and the outputs.
    grouped = _grouped_rows(g)
    if grouped:
        lid = b.let("lid", b.local_id(0))
        base = b.let("base", b.group_id(1) * d)
        first, step, width = lid, g.lanes, 1
    else:
        width = 4 if d % 4 == 0 and g.dialect.max_lanes >= 4 else 1
        base = b.let("base", b.global_id(0) * d)
        lid, first, step = None, 0, width
    r = rms_factor(g, b, x, base, d, g.attrs["epsilon"], lid)
    with b.for_("k", first, d, step) as k:
        y = b.let("y", (x.load(base + k, width, as_float=True) * r) * w.load(k, width, as_float=True))
        g.store_output(b, base + k, y.cast(ir.REAL.with_lanes(width)))
    return [g.kernel(b, (g.lanes, rows), (g.lanes, 1)) if grouped else g.kernel(b, (rows,))]


def rms_factor(g: NodeGen, b: ir.KernelBuilder, x: ir.Buffer, base: ir.Expr, d: int, epsilon: float,
               lid: ir.Expr | None = None) -> ir.Sym:
    """``rsqrt(mean(x * x) + epsilon)`` of the row of ``d`` values at ``base`` of ``x``, the
    mean as LiteRT's XNNPACK computes the decomposition's (a folded sum of squares in its
    rsum2 order, times 1 / D: see pool's MEAN); with ``lid``, by the row's work-group of
    ``g.lanes`` (ending with a barrier), else by one work-item."""
    if lid is not None:
        total = xnn_row_total_shared(b, lambda i: x.load(i, as_float=True), base, d, "rsum2", lid, g.lanes)
    else:
        total = xnn_row_total(b, lambda i, n: x.load(i, n, as_float=True), base, d, "rsum2")
    mean = b.let("mean", 0.0 + b.let("total", total, FLOAT) * float(np.float32(1) / np.float32(d)), FLOAT)
    return b.let("r", formulas.UNARY["RSQRT"](mean + float(np.float32(epsilon)), {}))


def _mask_strides(mask_shape: tuple[int, ...]) -> tuple[int, int, int]:
    """The mask's element strides for batch, head and query position, right-aligned to
    ``[B, H, T, S]``, 0 along each axis it broadcasts (its stride over S is 1)."""
    shape = (1,) * (4 - len(mask_shape)) + tuple(int(n) for n in mask_shape)
    strides, step = [0, 0, 0], shape[3]
    for axis in (2, 1, 0):
        strides[axis] = step if shape[axis] > 1 else 0
        step *= shape[axis]
    return strides[0], strides[1], strides[2]


# Loop iterations a work-item of an attention kernel makes at most: llvmpipe (lavapipe, a
# Vulkan device on the CPU) silently stops an invocation's loops after 65535 iterations in
# all, which a row of 512 keys of 64 and 64 values made alone (wrong last outputs).
_ITERATIONS_PER_ITEM = 16384
# The most work-items an attention's work-group takes so (WebGPU's guaranteed limit).
MAX_ATTENTION_LANES = 256


def _attention_lanes(g: NodeGen, d: int, dv: int, s_size: int) -> int:
    """Work-items per row of an attention kernel: ``g.lanes``, doubled while one would loop
    over more than :data:`_ITERATIONS_PER_ITEM` of the row's scores and outputs; declined
    where the row (D + S + lanes floats) is over the dialect's local memory."""
    lanes = g.lanes
    while lanes < MAX_ATTENTION_LANES and -(-s_size * (d + dv) // lanes) > _ITERATIONS_PER_ITEM:
        lanes *= 2
    local_bytes = attention_local_bytes(d, s_size, lanes)
    if local_bytes > g.dialect.max_local_bytes:
        raise Decline(f"attention over {s_size} keys of {d} needs {local_bytes} bytes of local memory per row; "
                      f"{g.dialect.name} gives a work-group {g.dialect.max_local_bytes}")
    return lanes


def attention_local_bytes(d: int, s_size: int, lanes: int) -> int:
    """The local memory an attention kernel's work-group takes: the row's query, its scores
    and a float per work-item."""
    return 4 * (d + s_size + lanes)


def _attention_rows(g: NodeGen, b: ir.KernelBuilder, rows: int, d: int, dv: int, s_size: int, lanes: int,
                    lid: ir.Expr, row: ir.Expr, query, key, value, mask, logit) -> KernelSpec:
    """An attention kernel, a work-group of ``lanes`` per row of scores (see the module
    docstring): ``query(j)`` the row's query element ``j`` (a float), ``key(s, j)`` and
    ``value(s, j)`` key and value ``s``'s element ``j``, ``mask(s)`` the mask's value over key
    ``s``, ``logit(dot)`` the score of a key before the mask; the output element ``j`` of the
    row stored at ``row * dv + j``."""
    qs = b.local_array("qs", FLOAT, d)
    scores = b.local_array("scores", FLOAT, s_size)
    partial = b.local_array("partial", FLOAT, lanes)
    with b.for_("j", lid, d, lanes) as j:
        b.local_store(qs, j, query(j))
    b.barrier()
    # The scores and this work-item's largest.
    top = b.var("top", ir.lit(-np.inf, FLOAT))
    with b.for_("s", lid, s_size, lanes) as s:
        dot = b.var("dot", 0.0, FLOAT)
        with b.for_("j", 0, d) as j:
            b.assign(dot, call("fma", qs.load(j), key(s, j), dot))
        score = b.let("score", mask(s) + logit(dot))
        b.local_store(scores, s, score)
        b.assign(top, call("fmax", top, score))
    b.local_store(partial, lid, top)
    b.barrier()
    m = b.var("m", ir.lit(-np.inf, FLOAT))
    with b.for_("i", 0, lanes) as i:
        b.assign(m, call("fmax", m, partial.load(i)))
    # The exponentials (in place of the scores), and their sum in XNNPACK's order (each
    # work-item adds the whole row).
    with b.for_("s", lid, s_size, lanes) as s:
        b.local_store(scores, s, formulas.xnn_exp_nonpositive(b.let("d", scores.load(s) - m, FLOAT)))
    b.barrier()
    total = b.let("total", xnn_row_total(b, lambda i, lanes: scores.load(i, lanes), ir.lit(0, ir.INT), s_size,
                                         "radd"), FLOAT)
    inverse = b.let("inverse", 1.0 / total)
    # The outputs: this row's values, each the probabilities' products with the values
    # added in order (XNNPACK's batched matmul).
    with b.for_("j", lid, dv, lanes) as j:
        acc = b.var("acc", 0.0, FLOAT)
        with b.for_("s", 0, s_size) as s:
            p = scores.load(s) * inverse
            b.assign(acc, call("fma", p, value(s, j), acc))
        g.store_output(b, row * dv + j, acc.cast(ir.REAL))
    return g.kernel(b, (lanes, rows), (lanes, 1))


@generator("odml.scaled_dot_product_attention", epilogue=True)
def attention(g: NodeGen) -> list[KernelSpec]:
    """``softmax(mask + cap(q * scale @ k^T)) @ v`` per (batch, query, head) row, a work-group
    each (see the module docstring)."""
    _float_operands(g, 4)
    batch, t_size, heads, d = (int(n) for n in g.ctx.inputs[0].shape)
    s_size, kv_heads = int(g.ctx.inputs[1].shape[1]), int(g.ctx.inputs[1].shape[2])
    rows = batch * t_size * heads
    lanes = _attention_lanes(g, d, d, s_size)
    b = g.new_kernel()
    q, k, v, mask = (g.input(b, i) for i in range(4))
    if rows == 0 or s_size == 0 or d == 0:
        return [g.kernel(b, (0,))]
    scale, cap = float(np.float32(g.attrs["scale"])), float(np.float32(g.attrs.get("logit_cap", 0.0)))
    mask_b, mask_h, mask_t = _mask_strides(tuple(g.ctx.inputs[3].shape))
    group = heads // kv_heads
    lid = b.let("lid", b.local_id(0))
    row = b.let("row", b.group_id(1))
    h = b.let("h", row % heads)
    position = b.let("position", (row / heads) % t_size)
    n = b.let("n", row / (heads * t_size))
    kv_base = b.let("kv_base", n * (s_size * kv_heads * d) + (h / group) * d)
    terms = [ir.times(index, stride) for index, stride in ((n, mask_b), (h, mask_h), (position, mask_t)) if stride]
    mask_row = b.let("mask_row", ir.total(terms) if terms else 0)

    def logit(dot):
        return dot if not cap else b.let("capped", formulas.xnn_tanh(dot / cap) * cap)
    return [_attention_rows(g, b, rows, d, d, s_size, lanes, lid, row,
                            query=lambda j: q.load(row * d + j, as_float=True) * scale,
                            key=lambda s, j: k.load(kv_base + s * (kv_heads * d) + j, as_float=True),
                            value=lambda s, j: v.load(kv_base + s * (kv_heads * d) + j, as_float=True),
                            mask=lambda s: mask.load(mask_row + s, as_float=True), logit=logit)]


def attention_chain_kernel(g: NodeGen) -> list[KernelSpec]:
    """A decoder's attention written as nodes (:class:`litegpu.chains.AttentionChain`, the
    producer of :func:`..fusion.folded_attention`: inputs q, k, mask, v) as one kernel, a
    work-group per row of scores: each score a fused multiply-add chain over D in order (the
    scores' BATCH_MATMUL), through the ops before the mask as their formulas, plus the
    mask; the SOFTMAX; each output a fused multiply-add chain over the keys in order. The
    scores and probabilities are never stored: in half storage they keep float32."""
    chain = g.attrs["attention"]
    batches, m_size, d, s_size, dv = chain.sizes
    rows = batches * m_size
    lanes = _attention_lanes(g, d, dv, s_size)
    b = g.new_kernel()
    q, k, mask, v = (g.input(b, i) for i in range(4))
    mask_rows = g.const(b, chain.mask_rows().astype(np.int32))
    lid = b.let("lid", b.local_id(0))
    row = b.let("row", b.group_id(1))
    batch = b.let("batch", row / m_size)
    mask_row = b.let("mask_row", mask_rows.load(row))
    k_base, v_base = b.let("k_base", batch * (s_size * d)), b.let("v_base", batch * (s_size * dv))

    def key(s, j):
        return k.load(k_base + (s * d + j if chain.k_transposed else j * s_size + s), as_float=True)

    def value(s, j):
        return v.load(v_base + (j * s_size + s if chain.v_transposed else s * dv + j), as_float=True)

    def logit(dot):
        for op, constant in chain.score_ops:
            dot = b.let("capped", formulas.UNARY[op](dot, {}) if op == "TANH" else
                        formulas.BINARY[op](dot, ir.lit(constant, FLOAT), {}))
        return dot
    return [_attention_rows(g, b, rows, d, dv, s_size, lanes, lid, row,
                            query=lambda j: q.load(row * d + j, as_float=True), key=key, value=value,
                            mask=lambda s: mask.load(mask_row + s, as_float=True), logit=logit)]
