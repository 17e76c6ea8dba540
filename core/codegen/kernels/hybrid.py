"""The float view's hybrid product (:mod:`litegpu.float_view`): ROW_QUANTIZE and
HYBRID_FULLY_CONNECTED, XNNPACK's dynamic-range FULLY_CONNECTED to the bit.

ROW_QUANTIZE runs one work-item per row: the row's range and zero point in float32 in
XNNPACK's order (as :func:`litegpu.ops.hybrid.xnn_quantize_rows`), then the int8 codes.
HYBRID_FULLY_CONNECTED runs one work-item per output element over int8 weight codes kept
as int8 in device memory (a quarter of the dequantized floats' bytes), stored ``[K, N]``
so neighbouring work-items read neighbouring bytes; for a few rows (a decode step) a
work-group per output element (each taking several in turn past one launch axis's
:data:`..nodegen.MAX_GROUPS` work-groups), its work-items summing segments of K. Its sums are int32,
exact; the scaling is XNNPACK's float32 arithmetic step by step: per output channel
``fma(float(sum) * row_scale, weight_scale, bias)``; per block (INT4 LLM weights) a float32
accumulator from the block zero-point sums times ``zp + 128``, one fused multiply-add per
block of its exact sum of ``(q + 128) w`` with the block's scale, times the row's scale,
plus the bias. Every scale is read in float32, whatever the storage precision.
"""
from __future__ import annotations

import numpy as np
from litegpu.ops.hybrid import blockwise_zero_point_sums

from .. import ir
from ..ir import call, select
from ..nodegen import KernelSpec, NodeGen, group_per_output
from . import Decline, generator
from .pool import _grouped_rows, _Rows

_F32 = np.dtype(np.float32)


@generator("ROW_QUANTIZE")
def row_quantize(g: NodeGen) -> list[KernelSpec]:
    """ROW_QUANTIZE (:func:`litegpu.float_view.row_quantize`): the row's range widened to
    hold 0 (NaNs skipped), ``inv = 255 / (max - min)`` (1 for an empty range), the zero
    point from the end that loses less, rounded to even; the codes
    ``clamp(rint(x * inv) + zp, -128, 127)`` (a NaN is quantized to zp); the row's
    ``(1 / inv, zp)``. One work-item per row, or with several lanes (see
    :func:`..render.kernel_lanes`) a work-group: each work-item takes every lanes-th
    value, and the range is the same whatever the order (a ``-0`` for ``0`` changes
    nothing after it)."""
    if "rms_epsilon" in g.attrs:
        return [_rms_row_quantize(g)]
    r = _Rows(g, float_output=False)
    if _grouped_rows(g):
        return [_row_quantize_split(g, r.n, r.rows)]
    b = r.b
    lo = b.let("lo", r.fold(0.0, lambda a, v, n: call("fmin", a, v)).cast(ir.FLOAT), ir.FLOAT)
    hi = b.let("hi", r.fold(0.0, lambda a, v, n: call("fmax", a, v)).cast(ir.FLOAT), ir.FLOAT)
    _quantize_row(g, b, lo, hi, b.global_id(0), r.base, r.n, 0, 1, lambda k: r.x.load(r.base + k, as_float=True))
    return r.kernel()


def _quantize_row(g: NodeGen, b: ir.KernelBuilder, lo, hi, row, base, n: int, first, step: int, value) -> None:
    """ROW_QUANTIZE's scale, zero point and codes of the row with range ``lo .. hi``: its
    params at ``row`` (stored by the work-item with ``first`` 0), its codes ``first, first
    + step ..`` (``value(k)``: the row's value ``k``)."""
    inv = b.let("inv", select(lo.eq(hi), 1.0, 255.0 / (hi - lo)), ir.FLOAT)
    low_scaled = b.let("low_scaled", lo * inv, ir.FLOAT)
    high_scaled = b.let("high_scaled", hi * inv, ir.FLOAT)
    from_min = b.let("from_min", -128.0 + low_scaled, ir.FLOAT)
    from_max = b.let("from_max", 127.0 + high_scaled, ir.FLOAT)
    zp_real = select(from_min + from_max > 0.0, -128.0 - low_scaled, 127.0 - high_scaled)
    zp = b.let("zp", call("rint", call("clamp", zp_real, -128.0, 127.0)), ir.FLOAT)
    params = g.output(b, 1)

    def store_params():
        at = b.let("r2", row * 2)
        b.store(params, at, 1.0 / inv)
        b.store(params, at + 1, zp)
    if isinstance(first, int):
        store_params()
    else:
        with b.if_(first.eq(0)):
            store_params()
    codes = g.output(b, 0)
    with b.for_("k", first, n, step) as k:
        steps = b.let("steps", call("rint", value(k) * inv), ir.FLOAT)
        # fmax(s, 0) + fmin(s, 0) is s, and 0 for a NaN (each returns the other operand).
        steps = call("fmax", steps, 0.0) + call("fmin", steps, 0.0)
        b.store(codes, base + k, call("clamp", steps + zp, -128.0, 127.0).cast(ir.CHAR))


def _row_quantize_split(g: NodeGen, n: int, rows: int) -> KernelSpec:
    """ROW_QUANTIZE with a work-group of ``g.lanes`` per row of ``n`` (see :func:`row_quantize`)."""
    b = g.new_kernel()
    x = g.input(b, 0)
    lid = b.let("lid", b.local_id(0))
    row = b.let("row", b.group_id(1))
    base = b.let("base", row * n)

    def value(k):
        return x.load(base + k, as_float=True)
    lo, hi = _row_range(g, b, n, lid, g.lanes, value)
    _quantize_row(g, b, lo, hi, row, base, n, lid, g.lanes, value)
    return g.kernel(b, (g.lanes, rows), (g.lanes, 1))


def _row_range(g: NodeGen, b: ir.KernelBuilder, n: int, first, step: int, value) -> tuple[ir.Sym, ir.Sym]:
    """The row's range widened to hold 0: ``(lo, hi)`` over ``value(k)`` for ``k`` in
    ``first, first + step .. n``; with ``step`` lanes (``first`` the work-item's), merged
    through local memory. Min and max are exact, so any order gives the same range."""
    lo, hi = b.var("lo", 0.0, ir.FLOAT), b.var("hi", 0.0, ir.FLOAT)
    with b.for_("k", first, n, step) as k:
        v = b.let("v", value(k), ir.FLOAT)
        b.assign(lo, call("fmin", lo, v))
        b.assign(hi, call("fmax", hi, v))
    if step == 1:
        return lo, hi
    lows, highs = b.local_array("lows", ir.FLOAT, step), b.local_array("highs", ir.FLOAT, step)
    b.local_store(lows, first, lo)
    b.local_store(highs, first, hi)
    b.barrier()
    row_lo, row_hi = b.var("row_lo", 0.0, ir.FLOAT), b.var("row_hi", 0.0, ir.FLOAT)
    with b.for_("i", 0, step) as i:
        b.assign(row_lo, call("fmin", row_lo, lows.load(i)))
        b.assign(row_hi, call("fmax", row_hi, highs.load(i)))
    return row_lo, row_hi


def _rms_row_quantize(g: NodeGen) -> KernelSpec:
    """ROW_QUANTIZE of an rms norm's rows (:func:`..fusion.folded_rms_quantize`: inputs the
    norm's ``x`` and ``w``): each row's ``(x * r) * w`` as the norm's kernel computes it
    (:func:`.composite.rms_factor`), then its range and codes, by a work-item per row or
    a work-group with lanes. The normalized row is never stored: in half storage its codes
    come from the float32 values, which the norm's stored output would have rounded first."""
    from .composite import rms_factor
    shape = tuple(int(d) for d in g.ctx.inputs[0].shape)
    n = shape[-1] if shape else 1
    rows = int(np.prod(shape[:-1], dtype=np.int64)) if n else 0
    b = g.new_kernel()
    x, w = g.input(b, 0), g.input(b, 1)
    if rows == 0 or n == 0:
        return g.kernel(b, (0,))
    grouped = _grouped_rows(g)
    lid = b.let("lid", b.local_id(0)) if grouped else None
    row = b.let("row", b.group_id(1) if grouped else b.global_id(0))
    base = b.let("base", row * n)
    r = rms_factor(g, b, x, base, n, g.attrs["rms_epsilon"], lid)

    def value(k):
        return (x.load(base + k, as_float=True) * r) * w.load(k, as_float=True)
    first, step = (lid, g.lanes) if grouped else (0, 1)
    lo, hi = _row_range(g, b, n, first, step, value)
    _quantize_row(g, b, lo, hi, row, base, n, first, step, value)
    return g.kernel(b, (g.lanes, rows), (g.lanes, 1)) if grouped else g.kernel(b, (rows,))


# Rows of x up to which a product puts a work-group on each output (a decode step's few
# rows: one work-item per output would leave a GPU nearly idle, each walking all of K).
_SPLIT_ROWS = 8


@generator("HYBRID_FULLY_CONNECTED", epilogue=True)
def hybrid_fully_connected(g: NodeGen) -> list[KernelSpec]:
    """HYBRID_FULLY_CONNECTED (:func:`litegpu.float_view.hybrid_fully_connected`), one
    output element per work-item, or per work-group for a few rows (see the module
    docstring)."""
    codes, weights, scales = g.ctx.inputs[0], g.ctx.inputs[2], g.ctx.inputs[4]
    if weights.value is None or scales.value is None:
        raise Decline("weights computed at run time")
    bias_spec = g.ctx.inputs[3] if len(g.ctx.inputs) > 3 else None
    if bias_spec is not None and bias_spec.value is None:
        raise Decline("a bias computed at run time")
    w = np.asarray(weights.value, np.int8)
    n, k = w.shape
    rows = int(np.prod(tuple(codes.shape), dtype=np.int64)) // k if k else 0
    block = int(g.attrs["block_size"])
    scale_values = np.asarray(scales.value, np.float32)
    segment = block or -(-k // g.lanes)
    if g.lanes > 1 and k and rows <= _SPLIT_ROWS and 4 * -(-k // segment) <= g.dialect.max_local_bytes:
        return [_split_product(g, w, rows, block, segment, scale_values, bias_spec)]
    b = g.new_kernel()
    q = g.input(b, 0)
    params = g.input(b, 1)
    wt = g.const(b, np.ascontiguousarray(w.T))
    o = b.let("o", b.global_id(0))
    m = b.let("m", o / n)
    c = b.let("c", o % n)
    row_scale = b.let("row_scale", params.load(m * 2, as_float=True), ir.FLOAT)
    zp = b.let("zp", params.load(m * 2 + 1, as_float=True), ir.FLOAT)
    first = b.let("q0", m * k)

    def sums(blk):
        """The exact integer sum over K (``blk`` None), or over block ``blk``."""
        start, count = (0, k) if blk is None else (b.let("k0", blk * block), block)
        offset = -b.let("zpi", zp.cast(ir.INT)) if blk is None else ir.lit(128, ir.INT)
        part = b.var("part", 0, ir.INT)
        with b.for_("i", 0, count) as i:
            kk = start + i
            b.assign(part, (q.load(first + kk).cast(ir.INT) + offset) * wt.load(kk * n + c).cast(ir.INT), "+")
        return part
    g.store_output(b, o, _scaled(g, b, w, block, scale_values, bias_spec, c, zp, row_scale, sums).cast(ir.REAL))
    return [g.kernel(b, (rows * n,))]


def _scaled(g: NodeGen, b: ir.KernelBuilder, w: np.ndarray, block: int, scale_values: np.ndarray, bias_spec,
            c, zp, row_scale, sums) -> ir.Expr:
    """Output element ``c`` from its row's scale and zero point and its exact integer sums
    (``sums(None)``: over K, per-channel weights; ``sums(blk)``: block ``blk``'s), scaled
    as XNNPACK scales them (see the module docstring)."""
    n, k = w.shape
    bias = (g.const(b, np.asarray(bias_spec.value, np.float32), storage=False).load(c, as_float=True)
            if bias_spec is not None else None)
    if not block:
        total = sums(None)
        channel_scale = g.const(b, scale_values, storage=False).load(c, as_float=True)
        y = call("fma", total.cast(ir.FLOAT) * row_scale, channel_scale,
                 bias if bias is not None else ir.lit(0.0, ir.FLOAT))
    else:
        zero_point_sums = g.const(b, blockwise_zero_point_sums(w, scale_values, block), storage=False)
        block_scales = g.const(b, np.ascontiguousarray(scale_values.T), storage=False)   # [K / block, N]
        acc = b.var("acc", zero_point_sums.load(c, as_float=True) * (zp + 128.0), ir.FLOAT)
        with b.for_("blk", 0, k // block) as blk:
            b.assign(acc, call("fma", sums(blk).cast(ir.FLOAT), block_scales.load(blk * n + c, as_float=True), acc))
        y = acc * row_scale
        if bias is not None:
            y = y + bias
    return b.let("y", y, ir.FLOAT)


def _split_product(g: NodeGen, w: np.ndarray, rows: int, block: int, segment: int, scale_values: np.ndarray,
                   bias_spec) -> KernelSpec:
    """The product with a work-group of ``g.lanes`` work-items per output element: K cut in
    segments of ``segment`` (a block of blockwise weights), each segment's exact integer
    sum by one work-item into local memory, then the first work-item scales them as the
    per-element kernel does (integer sums are the same in any order; the blocks' fused
    multiply-adds stay in order). The weights stay ``[N, K]``: a work-item reads its
    segment's bytes in a row. Past :data:`..nodegen.MAX_GROUPS` outputs (a large vocabulary's
    logits) each work-group takes every ``MAX_GROUPS``-th output in turn."""
    n, k = w.shape
    segments = -(-k // segment)
    b = g.new_kernel()
    q = g.input(b, 0)
    params = g.input(b, 1)
    weights = g.const(b, np.ascontiguousarray(w))
    sums = b.local_array("sums", ir.INT, segments)
    lid = b.let("lid", b.local_id(0))
    return group_per_output(g, b, rows * n, lambda o: _split_output(
        g, b, w, block, segment, scale_values, bias_spec, q, params, weights, sums, lid, o))


def _split_output(g: NodeGen, b: ir.KernelBuilder, w: np.ndarray, block: int, segment: int,
                  scale_values: np.ndarray, bias_spec, q, params, weights, sums, lid, o) -> None:
    """Output element ``o`` of :func:`_split_product`, by the work-group."""
    n, k = w.shape
    lanes, segments = g.lanes, -(-k // segment)
    m = b.let("m", o / n)
    c = b.let("c", o % n)
    zp = b.let("zp", params.load(m * 2 + 1, as_float=True), ir.FLOAT)
    # (blockwise: the codes plus 128, as XNNPACK's qb4w sums them; else minus the zero point)
    offset = b.let("offset", -zp.cast(ir.INT) if not block else ir.lit(128, ir.INT))
    with b.for_("seg", lid, segments, lanes) as seg:
        start = b.let("k0", seg * segment)
        stop = b.let("k1", call("min", start + segment, k))
        part = b.var("part", 0, ir.INT)
        with b.for_("i", start, stop) as i:
            b.assign(part, (q.load(m * k + i).cast(ir.INT) + offset) * weights.load(c * k + i).cast(ir.INT), "+")
        b.local_store(sums, seg, part)
    b.barrier()
    with b.if_(lid.eq(0)):
        row_scale = b.let("row_scale", params.load(m * 2, as_float=True), ir.FLOAT)

        def segment_sums(blk):
            if blk is not None:       # (blockwise: a segment is a block)
                return sums.load(blk)
            total = b.var("total", 0, ir.INT)
            with b.for_("s", 0, segments) as s:
                b.assign(total, sums.load(s), "+")
            return total
        g.store_output(b, o, _scaled(g, b, w, block, scale_values, bias_spec, c, zp, row_scale, segment_sums)
                       .cast(ir.REAL))
