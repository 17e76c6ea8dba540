"""Convolutions and matrix products: CONV_2D, DEPTHWISE_CONV_2D, TRANSPOSE_CONV,
Convolution2DTransposeBias, FULLY_CONNECTED and BATCH_MATMUL; written with
:mod:`litegpu.codegen.ir`, so every dialect (WGSL included) renders them.

Every kernel here has the same shape, the *output tile* (:class:`Tile`): the output is
seen as ``[rows, pixels, channels]`` and one work-item computes ``vec`` consecutive
output channels (a ``float16``, ``float8`` or ``float4`` accumulator, see
:func:`channel_vector`; ``float4`` only where the dialect's widest vector is 4, as in
WGSL) for ``P`` pixels of one row, with the ``P`` accumulators in registers. Dimension 0
of the launch walks the channel groups (the fastest output index in NHWC, so
neighbouring work-items store neighbouring bytes), dimension 1 the pixel blocks of a row
and dimension 2 the rows.

The weights are repacked at compile time (:func:`pack_oc`) to ``[O/vec][K][vec]``, K
being the reduction (``kh, kw, i`` for a convolution): one vector load then gives the
output channels of a work-item, and the reduction walks the weights contiguously.
Output channels that are not a multiple of 4 take float4 tiles padded with zero
weights; the last tile computes the padding lanes and stores lane by lane, skipping them.

Inner products go through :func:`dot`, which reads the input four reduction steps at
a time (one four-lane load per pixel, shared by four weight vectors) when the input is
contiguous along the reduction. Windows that may leave the input (padding) take a
second, masked copy of the loop that only border tiles run (:func:`window_dot`); window
rows outside the input are skipped by an ``if`` around the row's work.

Accumulation is in ``float`` (loads ``as_float``); outputs go through
``NodeGen.store_output`` a ``real4`` at a time (a wide accumulator's quads in turn),
so fused activations and folded elementwise followers apply.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
from litegpu.ops.nn import conv_output_size, transpose_conv_padding

from .. import ir
from ..ir import FLOAT, Expr, call, logical_and, select
from ..nodegen import KernelSpec, NodeGen, group_per_output
from . import Decline, generator

_F32 = np.dtype(np.float32)

#: The weights' ``float{vec}`` at a reduction step (an expression or a literal step).
WeightLoad = Callable[[ir.Operand], Expr]


# -- shared helpers -----------------------------------------------------------------------

def channel_vector(channels: int, most: int = 16) -> int:
    """Output channels per work-item: 16, 8 or 4, the widest (up to ``most``, the
    dialect's ``max_lanes``) that divides ``channels`` (4 when none does: the last group
    is then padded and stored lane by lane).

    Measured on PoCL (AVX-512): a 1x1 conv runs ~90 GFLOP/s with float4 tiles, ~145
    with float8 and ~280 with float16, per two cores' worth of CPU time.
    """
    return next((v for v in (16, 8) if v <= most and channels % v == 0), 4)


def pack_oc(w: np.ndarray, vec: int) -> np.ndarray:
    """Weights ``[..., O, K]`` repacked to ``[..., ceil(O/vec), K, vec]``.

    Element ``[.., g, k, l]`` is ``w[.., vec*g + l, k]``: one vector load gives the
    ``vec`` output channels of a work-item at reduction step ``k``, and the reduction
    walks memory contiguously. The lanes past ``O`` are zero.
    """
    w = np.asarray(w, np.float32)
    *lead, o, k = w.shape
    groups = -(-o // vec)
    padded = np.zeros((*lead, groups * vec, k), np.float32)
    padded[..., :o, :] = w
    return np.ascontiguousarray(padded.reshape(*lead, groups, vec, k).swapaxes(-1, -2))


def pixels_per_item(pixels: int, most: int = 4) -> int:
    """How many pixels one work-item computes (the ``P`` of the tile), at most ``most``.

    Among ``most`` and the sizes down to half of it, the one wasting the fewest pixels
    at the end of a row is taken (e.g. 7 for rows of 14 with ``most`` 8). Measured on
    PoCL with float16 tiles: 4 pixels suit the reductions (1x1 and KxK convs, matmuls;
    8 is no faster, and slower for KxK), depthwise convs take 8 (see there).
    """
    if pixels <= most:
        return max(pixels, 1)
    candidates = range(most, most // 2, -1)
    return min(candidates, key=lambda p: (-(-pixels // p) * p - pixels, -p))


def _floats(lanes: int) -> ir.Type:
    """The accumulator type of ``lanes`` lanes."""
    return ir.FLOAT.with_lanes(lanes)








def _gather(buf: ir.Buffer, indices: Sequence[ir.Operand]) -> Expr:
    """A ``float{n}`` of separately indexed elements (the lanes of a strided operand)."""
    return ir.vector(_floats(len(indices)), *(buf.load(i, as_float=True) for i in indices))


def _constant(g: NodeGen, pos: int, what: str) -> np.ndarray:
    """The value of constant input ``pos``; Decline when it is computed at run time."""
    spec = g.ctx.inputs[pos]
    if spec.value is None:
        raise Decline(f"{what} must be constant (it is repacked at compile time)")
    return np.asarray(spec.value, np.float32)


def _check_float(g: NodeGen, skip: int | None = None) -> None:
    """Decline unless every tensor of the node (but input ``skip``) is float32."""
    specs = [s for i, s in enumerate(g.ctx.inputs) if i != skip and s is not None] + list(g.ctx.outputs)
    if any(s.dtype != _F32 for s in specs):
        raise Decline(f"{g.ctx.node.op} on non-float32 tensors")


def _bias(g: NodeGen, b: ir.KernelBuilder, pos: int, channels: int, vec: int, oc: Expr) -> Expr | None:
    """The ``float{vec}`` bias of channel group ``oc``, or None without bias."""
    if pos >= len(g.ctx.inputs) or g.ctx.inputs[pos] is None:
        return None
    spec = g.ctx.inputs[pos]
    if spec.value is not None:
        padded = np.zeros(-(-channels // vec) * vec, np.float32)
        padded[:channels] = np.asarray(spec.value, np.float32).reshape(-1)
        return g.const(b, padded).load(oc * vec, vec, as_float=True)
    return _gather(g.input(b, pos), [call("min", ir.plus(oc * vec, lane), channels - 1) for lane in range(vec)])


def _in_range(i: Expr, size: int) -> Expr:
    """``0 <= i < size``."""
    return logical_and(i >= 0, i < size)


def dot(b: ir.KernelBuilder, accs: Sequence[ir.Sym], n: int, x: ir.Buffer, xaddr: Sequence[Expr],
        wload: WeightLoad, vec: int, xstride: int = 1, masks: Sequence[Expr] | None = None) -> None:
    """Add ``sum_k x_p[k] * w[k]`` to ``accs[p]`` for every pixel ``p``, one fused
    multiply-add per step in the order of ``k``: XNNPACK's GEMM and IGEMM microkernels
    (which start from the bias, as the accumulators do), so a float product gives
    LiteRT's bits where its reduction order is XNNPACK's.

    ``x_p[k]`` is element ``xaddr[p] + k * xstride`` of ``x``; ``wload(k)`` is the
    ``float{vec}`` of the output channels' weights at reduction step ``k``; ``masks[p]``
    (a bool, false where pixel ``p``'s window leaves the image) selects 0 for its input
    there (XNNPACK reads a zero buffer there): a select, not a multiply by 0, which would
    turn an infinite neighbour read at the clamped address into NaN. With a contiguous
    input the loop takes four steps at a time: one four-lane load per pixel feeds four
    weight vectors.
    """
    step4 = n - n % 4 if xstride == 1 else 0
    if step4:
        with b.for_("k", 0, step4, 4) as k:
            ws = [b.let(f"w{j}", wload(ir.plus(k, j)), _floats(vec)) for j in range(4)]
            for p, acc in enumerate(accs):
                v = x.load(xaddr[p] + k, 4, as_float=True)
                if masks:
                    v = select(masks[p], v, ir.lit(0.0, ir.FLOAT4))
                v = b.let("v", v, ir.FLOAT4)
                chain: Expr = acc
                for j in range(4):
                    chain = call("fma", ws[j], v.lane(j), chain)
                b.assign(acc, chain)
    rest = n - step4
    if not rest:
        return

    def step(k: ir.Operand) -> None:
        w = b.let("w", wload(k), _floats(vec))
        for p, acc in enumerate(accs):
            v = x.load(ir.plus(xaddr[p], k if xstride == 1 else k * xstride), as_float=True)
            if masks:
                v = select(masks[p], v, 0.0)
            b.assign(acc, call("fma", w, v, acc))

    if rest <= 4:   # a short tail is unrolled (k a literal)
        for j in range(rest):
            step(step4 + j)
    else:           # a strided reduction loops one step at a time
        with b.for_("k", step4, n) as k:
            step(k)


def window_dot(b: ir.KernelBuilder, accs: Sequence[ir.Sym], n: int, x: ir.Buffer, cols: Sequence[Expr],
               width: int, addr: Callable[[Expr], Expr], wload: WeightLoad, vec: int, may_leave: bool) -> None:
    """:func:`dot` over pixels whose input column ``cols[p]`` may lie outside ``[0, width)``.

    ``addr(col)`` is the element index of the window's first input at column ``col``.
    Columns grow with ``p``, so a tile is inside when its first and last are; inside
    tiles (nearly all) run the plain loop, border tiles a copy with clamped addresses
    and masks selecting 0. ``may_leave`` False (checked at compile time) keeps the plain loop only.
    """
    if not may_leave:
        dot(b, accs, n, x, [addr(c) for c in cols], wload, vec)
        return
    with b.if_(logical_and(cols[0] >= 0, cols[-1] < width)):
        dot(b, accs, n, x, [addr(c) for c in cols], wload, vec)
    with b.else_():
        clamped, masks = [], []
        for p, c in enumerate(cols):
            clamped.append(b.let(f"q{p}", call("clamp", c, 0, width - 1)))
            masks.append(b.let(f"m{p}", c.eq(clamped[-1]), ir.BOOL))
        dot(b, accs, n, x, [addr(q) for q in clamped], wload, vec, masks=masks)


class Tile:
    """The output-tile kernel every generator here builds (see the module docstring).

    Work-item ``(oc, cb, r)`` owns output channels ``vec*oc .. vec*oc+vec-1`` of
    ``pixels`` pixels of row ``r``; its ids are the kernel's first statements. The
    generator declares what it needs of ``cb`` and ``r``, then :meth:`accumulators`,
    adds into them, and :meth:`finish` stores them.
    """

    def __init__(self, g: NodeGen, b: ir.KernelBuilder, vec: int, pixels: int) -> None:
        self.g, self.b, self.vec, self.pixels = g, b, vec, pixels
        self.oc = b.let("oc", b.global_id(0))
        self.cb = b.let("cb", b.global_id(1))
        self.r = b.let("r", b.global_id(2))
        self.accs: list[ir.Sym] = []

    def row_of(self, rows: int) -> tuple[ir.Sym, ir.Sym]:
        """``(batch, row)`` of ``r`` when the launch's rows are ``rows`` rows per batch."""
        batch = self.b.let("b", self.r / rows)
        return batch, self.b.let("oh", self.r - batch * rows)

    def accumulators(self, bias: Expr | None) -> list[ir.Sym]:
        """The ``pixels`` accumulators, each starting at the bias (a ``float{vec}`` of ``oc``)."""
        b, t = self.b, _floats(self.vec)
        init: Expr = bias if bias is not None else ir.lit(0.0, t)
        if bias is not None and self.pixels > 1:
            init = b.let("bias", bias, t)
        self.accs = [b.var(f"acc{p}", init, t) for p in range(self.pixels)]
        return self.accs

    def finish(self, *, rows: int, blocks: int, channels: int, pixel: Sequence[Expr],
               exists: Sequence[Expr] | None) -> KernelSpec:
        """Store the accumulators and render: ``pixel[p]`` is pixel ``p``'s flat index over
        the output's leading axes and ``exists[p]`` (None: always) whether it is inside
        the output."""
        g, b, vec = self.g, self.b, self.vec
        assert channels % vec == 0 or vec == 4, "only float4 tiles pad their last group"
        if 0 in (rows, blocks, channels):   # an empty output: never launched (its indices might divide by 0)
            return g.kernel(g.new_kernel(), (0, 0, 0))
        for p, acc in enumerate(self.accs):
            idx = pixel[p] * channels + self.oc * vec
            if exists:
                with b.if_(exists[p]):
                    self._store(acc, idx, channels)
            else:
                self._store(acc, idx, channels)
        return g.kernel(b, (-(-channels // vec), blocks, rows))

    def _store(self, acc: ir.Sym, idx: Expr, channels: int) -> None:
        g, b, vec = self.g, self.b, self.vec
        if channels % 4 == 0:
            # Stored a real4 at a time: that is what the epilogue (followers) is written for.
            for q in range(vec // 4):
                g.store_output(b, ir.plus(idx, 4 * q), acc.quad(q).cast(ir.REAL4))
            return
        # Scalar stores skip the padding lanes of the last channel group.
        g.store_output(b, idx, acc.lane(0).cast(ir.REAL))
        for lane in range(1, 4):
            with b.if_(self.oc * 4 + lane < channels):
                g.store_output(b, idx + lane, acc.lane(lane).cast(ir.REAL))


def _blocked(b: ir.KernelBuilder, count: int, pixels: int, start: Expr, name: str
             ) -> tuple[list[Expr], list[Expr] | None, list[ir.Sym]]:
    """The pixels ``start + p`` of a block along an axis of ``count``.

    Returns their index expressions, their existence conditions (None when every block
    is full) and ``{name}{p}`` declared: the index clamped inside the axis, so the
    missing pixels of the last block read real memory (their results are not stored).
    """
    ragged = count % pixels != 0
    index = [ir.plus(start, p) for p in range(pixels)]
    syms = [b.let(f"{name}{p}", call("min", i, count - 1) if ragged else i) for p, i in enumerate(index)]
    return index, ([i < count for i in index] if ragged else None), syms


def _gemm_rows(g: NodeGen, tile: Tile, x: ir.Buffer, count: int, stride: int, k: int, channels: int,
               wload: WeightLoad, bias: Expr | None, xbase: Expr | None = None) -> KernelSpec:
    """``count`` independent rows of ``k`` inputs (row ``m`` of ``x`` starts at
    ``m * stride`` plus ``xbase``), each times the weights: pointwise convolutions and
    FULLY_CONNECTED."""
    pixels = tile.pixels
    index, exists, rows = _blocked(tile.b, count, pixels, tile.cb * pixels, "m")
    accs = tile.accumulators(bias)
    xaddr = [ir.times(m, stride) if xbase is None else ir.times(m, stride) + xbase for m in rows]
    dot(tile.b, accs, k, x, xaddr, wload, tile.vec)
    return tile.finish(rows=1, blocks=-(-count // pixels), channels=channels, pixel=index, exists=exists)


def _weights(wp: ir.Buffer, base: Expr, vec: int) -> WeightLoad:
    """Loads of packed weights ``[.., K, vec]`` whose step 0 is at element ``base``."""
    return lambda k: wp.load(ir.plus(base, k * vec), vec, as_float=True)


# -- CONV_2D ------------------------------------------------------------------------------


def _window_rows(b: ir.KernelBuilder, kh: int, top: Expr, dh: int, h: int, rows_leave: bool,
                 row: Callable[[Expr, Expr], None]) -> None:
    """``row(kh, ih)`` for each of the window's ``kh`` rows, ``ih = top + kh * dh`` being the
    input row; when a window may leave the input (``rows_leave``), only rows inside it."""
    with b.for_("kh", 0, kh) as kh_:
        ih = b.let("ih", top + ir.times(kh_, dh))
        if rows_leave:
            with b.if_(_in_range(ih, h)):
                row(kh_, ih)
        else:
            row(kh_, ih)


@generator("CONV_2D", epilogue=True)
def conv2d(g: NodeGen) -> list[KernelSpec]:
    """CONV_2D (strides, dilations, SAME/VALID, groups): a pointwise conv with stride 1
    is a product of the ``[pixels, C]`` input with the weights; other convs walk the
    window's rows and, per row, its ``kw * I`` inputs contiguously (dilation 1) or
    each tap's ``I`` inputs."""
    _check_float(g)
    w = _constant(g, 1, "the filter")
    n, h, wd, c = g.ctx.inputs[0].shape
    o, kh, kw, i = w.shape
    _, oh, ow, _ = g.ctx.outputs[0].shape
    (sh, sw), (dh, dw) = g.attrs["stride"], g.attrs["dilation"]
    _, pt = conv_output_size(h, kh, sh, dh, g.attrs["padding"])
    _, pl = conv_output_size(wd, kw, sw, dw, g.attrs["padding"])
    most = g.dialect.max_lanes
    groups = c // i
    per_group = o // groups
    vec = channel_vector(per_group if groups > 1 else o, most)
    if groups > 1 and per_group % 4:
        # The lanes of a tile would read different groups: run it as a dense conv with
        # zero weights outside each output channel's group (grouped convs are rare).
        dense = np.zeros((o, kh, kw, c), np.float32)
        for grp in range(groups):
            dense[grp * per_group:(grp + 1) * per_group, :, :, grp * i:(grp + 1) * i] = \
                w[grp * per_group:(grp + 1) * per_group]
        w, i, groups, vec = dense, c, 1, channel_vector(o, most)
    pointwise = kh == kw == 1 and sh == sw == 1 and (oh, ow) == (h, wd) and pt == pl == 0
    b = g.new_kernel()
    x = g.input(b, 0)
    wp = g.const(b, pack_oc(w.reshape(o, kh * kw * i), vec))
    tile = Tile(g, b, vec, pixels_per_item(n * h * wd if pointwise else ow))
    oc = tile.oc
    bias = _bias(g, b, 2, o, vec, oc)
    gbase = (oc * vec / per_group) * i if groups > 1 else None
    wgroup = kh * kw * i * vec   # packed weights of one channel group

    if pointwise:
        return [_gemm_rows(g, tile, x, n * h * wd, c, i, o, _weights(wp, oc * wgroup, vec), bias, gbase)]

    pixels = tile.pixels
    batch, orow = tile.row_of(oh)
    index, exists, ows = _blocked(b, ow, pixels, tile.cb * pixels, "ow")
    iws = [b.let(f"iw{p}", ir.plus(ir.times(o_, sw), -pl)) for p, o_ in enumerate(ows)]
    accs = tile.accumulators(bias)
    rows_leave = pt > 0 or (oh - 1) * sh - pt + (kh - 1) * dh >= h
    cols_leave = pl > 0 or (ow - 1) * sw - pl + (kw - 1) * dw >= wd

    def addr(xr: Expr) -> Callable[[Expr], Expr]:
        return lambda col: ir.times(xr + col, c) if gbase is None else ir.times(xr + col, c) + gbase

    def per_tap(kh_: Expr, xr: Expr) -> None:
        with b.for_("kw", 0, kw) as kw_:
            wk = b.let("wk", oc * wgroup + (kh_ * kw + kw_) * (i * vec))
            window_dot(b, accs, i, x, [iw + ir.times(kw_, dw) for iw in iws], wd, addr(xr),
                       _weights(wp, wk, vec), vec, cols_leave)

    def whole_row(kh_: Expr, xr: Expr) -> None:
        # Dilation 1: the kw * I inputs of a window row are contiguous, one dot covers them.
        wk = b.let("wk", oc * wgroup + kh_ * (kw * i * vec))
        dot(b, accs, kw * i, x, [ir.times(xr + iw, c) for iw in iws], _weights(wp, wk, vec), vec)

    def row(kh_: Expr, ih: Expr) -> None:
        xr = b.let("xr", (batch * h + ih) * wd)
        if not (dw == 1 and groups == 1 and kw > 1):
            per_tap(kh_, xr)
        elif cols_leave:
            with b.if_(logical_and(iws[0] >= 0, iws[-1] + (kw - 1) < wd)):
                whole_row(kh_, xr)
            with b.else_():
                per_tap(kh_, xr)
        else:
            whole_row(kh_, xr)

    _window_rows(b, kh, ir.plus(ir.times(orow, sh), -pt), dh, h, rows_leave, row)
    return [tile.finish(rows=n * oh, blocks=-(-ow // pixels), channels=o,
                        pixel=[tile.r * ow + e for e in index], exists=exists)]


# -- DEPTHWISE_CONV_2D ----------------------------------------------------------------------


@generator("DEPTHWISE_CONV_2D", epilogue=True)
def depthwise_conv2d(g: NodeGen) -> list[KernelSpec]:
    """DEPTHWISE_CONV_2D with any depth multiplier, stride, dilation and padding.

    Per window row, the input columns the tile's pixels need are loaded once each
    (a stride-1 3x3 tile of 8 pixels loads 10 columns, not 24) and every tap reuses
    them. Output channel ``o`` reads input channel ``o / M``: with ``M = 1`` that is
    one vector load, else the lanes are gathered (float4 tiles).
    """
    _check_float(g)
    w = _constant(g, 1, "the filter")
    n, h, wd, c = g.ctx.inputs[0].shape
    _, kh, kw, o = w.shape
    _, oh, ow, _ = g.ctx.outputs[0].shape
    mult = o // c
    (sh, sw), (dh, dw) = g.attrs["stride"], g.attrs["dilation"]
    _, pt = conv_output_size(h, kh, sh, dh, g.attrs["padding"])
    _, pl = conv_output_size(wd, kw, sw, dw, g.attrs["padding"])
    contiguous = mult == 1 and c % 4 == 0
    vec = channel_vector(o, g.dialect.max_lanes) if contiguous else 4
    b = g.new_kernel()
    x = g.input(b, 0)
    wp = g.const(b, pack_oc(w.reshape(kh * kw, o).T, vec))   # [O/vec][kh*kw][vec]
    # A tile keeps its row of inputs, (P - 1) * sw + (kw - 1) * dw + 1 vectors, and P
    # accumulators in registers: 8 pixels at stride 1, 4 at stride 2 (measured faster).
    tile = Tile(g, b, vec, pixels_per_item(ow, 8 if sw == 1 else 4))
    oc, pixels = tile.oc, tile.pixels
    bias = _bias(g, b, 2, o, vec, oc)
    batch, orow = tile.row_of(oh)
    index, exists, ows = _blocked(b, ow, pixels, tile.cb * pixels, "ow")
    if contiguous:
        def load(xr: Expr, col: Expr) -> Expr:
            return x.load((xr + col) * c + oc * vec, vec, as_float=True)
    else:
        ci = [b.let(f"ci{lane}", call("min", ir.plus(oc * 4, lane), o - 1) / mult) for lane in range(4)]

        def load(xr: Expr, col: Expr) -> Expr:
            return _gather(x, [(xr + col) * c + ci[lane] for lane in range(4)])
    iw = b.let("iw", ir.plus(ir.times(ows[0], sw), -pl))
    accs = tile.accumulators(bias)
    # Input column j (from iw) feeds pixel p through tap t when j = p * sw + t * dw.
    used = sorted({p * sw + t * dw for p in range(pixels) for t in range(kw)})
    rows_leave = pt > 0 or (oh - 1) * sh - pt + (kh - 1) * dh >= h
    cols_leave = pl > 0 or (ow - 1) * sw - pl + (kw - 1) * dw >= wd or ow % pixels != 0
    t = _floats(vec)

    def taps(xr: Expr, ws: list[ir.Sym], masked: bool) -> None:
        xs = {}
        for j in used:
            if masked:
                q = b.let(f"q{j}", call("clamp", ir.plus(iw, j), 0, wd - 1))
                # a select, not a multiply by 0: inf * 0 would be NaN
                xs[j] = b.let(f"x{j}", select(ir.plus(iw, j).eq(q), load(xr, q), ir.lit(0.0, t)), t)
            else:
                xs[j] = b.let(f"x{j}", load(xr, ir.plus(iw, j)), t)
        for p, acc in enumerate(accs):
            b.assign(acc, ir.total([xs[p * sw + tap * dw] * ws[tap] for tap in range(kw)]), "+")

    def row(kh_: Expr, ih: Expr) -> None:
        xr = b.let("xr", (batch * h + ih) * wd)
        ws = [b.let(f"w{tap}", wp.load(ir.plus(oc * (kh * kw) + kh_ * kw, tap) * vec, vec, as_float=True), t)
              for tap in range(kw)]
        if cols_leave:
            with b.if_(logical_and(iw >= 0, iw + used[-1] < wd)):
                taps(xr, ws, False)
            with b.else_():
                taps(xr, ws, True)
        else:
            taps(xr, ws, False)

    _window_rows(b, kh, ir.plus(ir.times(orow, sh), -pt), dh, h, rows_leave, row)
    return [tile.finish(rows=n * oh, blocks=-(-ow // pixels), channels=o,
                        pixel=[tile.r * ow + e for e in index], exists=exists)]


# -- TRANSPOSE_CONV and Convolution2DTransposeBias ------------------------------------------


def _transpose_conv(g: NodeGen, x_pos: int, w_pos: int, bias_pos: int) -> list[KernelSpec]:
    """Transpose convolution as a gather: output pixel ``(oh, ow)`` sums, over the taps
    ``(kh, kw)`` with ``oh + top - kh`` and ``ow + left - kw`` divisible by the stride,
    input pixel ``((oh + top - kh) / sh, (ow + left - kw) / sw)`` times tap ``(kh, kw)``.

    A tile's pixels are ``sw`` apart (``ow = phase + sw * j``), so every pixel of a tile
    takes the same taps and the divisibility test is one branch per tap.
    """
    _check_float(g, skip=0 if x_pos == 2 else None)   # TRANSPOSE_CONV's output_shape is int32
    w = _constant(g, w_pos, "the weights")
    n, h, wd, c = g.ctx.inputs[x_pos].shape
    o, kh, kw, _ = w.shape
    _, oh, ow, _ = g.ctx.outputs[0].shape
    sh, sw = g.attrs["stride"]
    pt = transpose_conv_padding(oh, kh, sh, g.attrs["padding"])
    pl = transpose_conv_padding(ow, kw, sw, g.attrs["padding"])
    vec = channel_vector(o, g.dialect.max_lanes)
    b = g.new_kernel()
    x = g.input(b, x_pos)
    wp = g.const(b, pack_oc(w.reshape(o, kh * kw * c), vec))
    per_phase = -(-ow // sw)
    tile = Tile(g, b, vec, pixels_per_item(per_phase))
    oc, pixels = tile.oc, tile.pixels
    bias = _bias(g, b, bias_pos, o, vec, oc)
    blocks = -(-per_phase // pixels)
    batch, orow = tile.row_of(oh)
    phase = b.let("phase", tile.cb % sw)
    j0 = b.let("j0", (tile.cb / sw) * pixels)
    index = [phase + sw * ir.plus(j0, p) for p in range(pixels)]
    accs = tile.accumulators(bias)
    with b.for_("kh", 0, kh) as kh_:
        th = b.let("th", ir.plus(orow, pt) - kh_)
        with b.if_(logical_and(logical_and(th >= 0, (th % sh).eq(0)), th < h * sh)):
            xr = b.let("xr", (batch * h + th / sh) * wd)
            # tw is lifted by whole strides so that % and / never see a negative operand:
            # NVIDIA's Vulkan driver took -1 % 3 for divisible (a tap too many where the
            # stride is wider than the kernel), which C's and WGSL's rules both forbid.
            lift = -(-(kw - 1) // sw)
            with b.for_("kw", 0, kw) as kw_:
                tw = b.let("tw", ir.plus(phase, pl + sw * lift) - kw_)
                with b.if_((tw % sw).eq(0)):
                    wk = b.let("wk", oc * (kh * kw * c * vec) + (kh_ * kw + kw_) * (c * vec))
                    window_dot(b, accs, c, x, [ir.plus(tw / sw + j0, p - lift) for p in range(pixels)], wd,
                               lambda col: (xr + col) * c, _weights(wp, wk, vec), vec, True)
    return [tile.finish(rows=n * oh, blocks=blocks * sw, channels=o, pixel=[tile.r * ow + e for e in index],
                        exists=[e < ow for e in index])]


@generator("TRANSPOSE_CONV", epilogue=True)
def transpose_conv(g: NodeGen) -> list[KernelSpec]:
    """TRANSPOSE_CONV: inputs (output_shape, weights [O, KH, KW, I], input, bias?)."""
    return _transpose_conv(g, x_pos=2, w_pos=1, bias_pos=3)


@generator("Convolution2DTransposeBias", epilogue=True)
def transpose_conv_bias(g: NodeGen) -> list[KernelSpec]:
    """MediaPipe's Convolution2DTransposeBias: inputs (input, weights [O, KH, KW, I], bias)."""
    return _transpose_conv(g, x_pos=0, w_pos=1, bias_pos=2)


# -- FULLY_CONNECTED and BATCH_MATMUL -------------------------------------------------------


@generator("FULLY_CONNECTED", epilogue=True)
def fully_connected(g: NodeGen) -> list[KernelSpec]:
    """FULLY_CONNECTED: the input flattened to rows of K times ``weights^T`` (+ bias).

    ``keep_num_dims`` only changes the output's shape, not its row-major layout.
    Constant weights are repacked; weights computed at run time are read in place,
    four rows of ``[O, K]`` gathered per step.
    """
    _check_float(g)
    o, k = g.ctx.inputs[1].shape
    count = int(np.prod(g.ctx.inputs[0].shape, dtype=np.int64)) // k
    if g.ctx.inputs[1].value is not None and _splits(g, count, k):
        return [_split_fully_connected(g, count, o, k)]
    b = g.new_kernel()
    x = g.input(b, 0)
    if g.ctx.inputs[1].value is not None:
        vec = channel_vector(o, g.dialect.max_lanes)
        wp = g.const(b, pack_oc(np.asarray(g.ctx.inputs[1].value, np.float32), vec))
        tile = Tile(g, b, vec, pixels_per_item(count))
        wload = _weights(wp, tile.oc * (k * vec), vec)
    else:
        vec, wt = 4, g.input(b, 1)
        tile = Tile(g, b, vec, pixels_per_item(count))
        rows = [call("min", ir.plus(tile.oc * 4, lane), o - 1) * k for lane in range(4)]

        def wload(step: ir.Operand) -> Expr:
            return _gather(wt, [ir.plus(row, step) for row in rows])
    return [_gemm_rows(g, tile, x, count, k, k, o, wload, _bias(g, b, 2, o, vec, tile.oc))]


# Rows up to which a product on a GPU puts a work-group on each output (a decoder's step).
_SPLIT_ROWS = 8


def _split_fully_connected(g: NodeGen, rows: int, o: int, k: int) -> KernelSpec:
    """FULLY_CONNECTED of a few rows on a GPU (``g.lanes`` > 1): :func:`_split_dot` over
    ``rows * o`` outputs, the weights ``[O, K]`` as the model holds them."""
    b = g.new_kernel()
    x = g.input(b, 0)
    w = g.const(b, np.asarray(g.ctx.inputs[1].value, np.float32))
    bias_spec = g.ctx.inputs[2] if len(g.ctx.inputs) > 2 else None
    bias = None if bias_spec is None else (g.const(b, np.asarray(bias_spec.value, np.float32).reshape(-1))
                                           if bias_spec.value is not None else g.input(b, 2))

    def output(e: Expr) -> tuple[Callable[[Expr], Expr], Callable[[Expr], Expr], Expr | None]:
        m, c = b.let("m", e / o), b.let("c", e % o)
        return (lambda kk: x.load(m * k + kk, as_float=True), lambda kk: w.load(c * k + kk, as_float=True),
                None if bias is None else bias.load(c, as_float=True))
    return _split_dot(g, b, rows * o, k, output)


def _split_dot(g: NodeGen, b: ir.KernelBuilder, outputs: int, k: int,
               output: Callable[[Expr], tuple[Callable[[Expr], Expr], Callable[[Expr], Expr], Expr | None]]
               ) -> KernelSpec:
    """A product of a few rows on a GPU: a work-group per output element ``e``, work-item
    ``l`` a fused multiply-add chain over steps ``l, l + lanes, ..`` of K (neighbouring
    work-items read neighbouring elements), then the first work-item adds the partial sums
    in order to the bias. ``output(e)`` declares the element's indices and gives its two
    operands at a step and its bias (or None). One chain over K per output (XNNPACK's order,
    which the tiled kernels keep) would leave a GPU nearly idle, each work-item walking all
    of K, so the sums here are in another order: within float32 rounding of LiteRT's, not
    its bits. Past :data:`..nodegen.MAX_GROUPS` outputs each work-group takes several in turn."""
    lanes = g.lanes
    partial = b.local_array("partial", FLOAT, lanes)
    lid = b.let("lid", b.local_id(0))

    def element(e: ir.Sym) -> None:
        lhs, rhs, bias = output(e)
        acc = b.var("acc", 0.0, FLOAT)
        with b.for_("kk", lid, k, lanes) as kk:
            b.assign(acc, call("fma", rhs(kk), lhs(kk), acc))
        b.local_store(partial, lid, acc)
        b.barrier()
        with b.if_(lid.eq(0)):
            total = b.var("total", bias if bias is not None else 0.0, FLOAT)
            with b.for_("i", 0, lanes) as i:
                b.assign(total, total + partial.load(i))
            g.store_output(b, e, total.cast(ir.REAL))
    return group_per_output(g, b, outputs, element)


def _splits(g: NodeGen, rows: int, k: int) -> bool:
    """Whether a product of ``rows`` rows (per matrix) over ``k`` takes :func:`_split_dot`:
    on a GPU, for a decoder step's few rows and a K worth splitting."""
    return g.lanes > 1 and 0 < rows <= _SPLIT_ROWS and k >= 4 * g.lanes and 4 * g.lanes <= g.dialect.max_local_bytes


def _batch_index(out_batch: tuple[int, ...], batch: tuple[int, ...], row: Expr) -> Expr:
    """Index of the matrix of an operand with batch shape ``batch`` that output matrix
    ``row`` (over ``out_batch``) reads, under broadcasting."""
    full = (1,) * (len(out_batch) - len(batch)) + tuple(batch)
    terms, out_stride, in_stride = [], 1, 1
    for d, od in zip(reversed(full), reversed(out_batch)):
        if d != 1:
            coord = (row / out_stride % od) if out_stride > 1 else (row % od)
            terms.append(ir.times(coord, in_stride))
        out_stride *= od
        in_stride *= d
    return ir.total(terms) if terms else ir.lit(0, ir.INT)


@generator("BATCH_MATMUL", epilogue=True)
def batch_matmul(g: NodeGen) -> list[KernelSpec]:
    """BATCH_MATMUL with adj_x / adj_y and broadcast batch axes.

    The tile's pixels are rows of the lhs, its channels columns of the rhs. A constant
    rhs is repacked per matrix to ``[N/vec][K][vec]``; a rhs computed at run time is
    read in place (one vector load per step when its rows are contiguous and
    ``N % 4 == 0``, else four lanes gathered). The first product of an attention folded
    into one step (``attrs["attention"]``) is the whole attention's kernel
    (:func:`.composite.attention_chain_kernel`).
    """
    if "attention" in g.attrs:
        from .composite import attention_chain_kernel
        return attention_chain_kernel(g)
    _check_float(g)
    a_shape, b_shape = tuple(g.ctx.inputs[0].shape), tuple(g.ctx.inputs[1].shape)
    out_shape = tuple(g.ctx.outputs[0].shape)
    adj_x, adj_y = g.attrs["adj_x"], g.attrs["adj_y"]
    m, n = out_shape[-2], out_shape[-1]
    k = a_shape[-2] if adj_x else a_shape[-1]
    out_batch = out_shape[:-2]
    most = g.dialect.max_lanes
    b = g.new_kernel()
    a = g.input(b, 0)
    if _splits(g, m, k):     # (a decode step's attention over a long cache: K is its length)
        rhs = g.input(b, 1)

        def output(e: Expr) -> tuple[Callable[[Expr], Expr], Callable[[Expr], Expr], None]:
            col, rest = b.let("col", e % n), b.let("rest", e / n)
            row, matrix = b.let("row", rest % m), b.let("matrix", rest / m)
            ab = b.let("ab", _batch_index(out_batch, a_shape[:-2], matrix) * (m * k))
            bb = b.let("bb", _batch_index(out_batch, b_shape[:-2], matrix) * (k * n))
            return (lambda kk: a.load(ab + (kk * m + row if adj_x else row * k + kk), as_float=True),
                    lambda kk: rhs.load(bb + (col * k + kk if adj_y else kk * n + col), as_float=True), None)
        return [_split_dot(g, b, int(np.prod(out_shape, dtype=np.int64)), k, output)]
    # The weight loads below read ``tile`` and ``bb``, declared once the rhs is bound and
    # its tile width known (a load is built only when dot runs).
    if g.ctx.inputs[1].value is not None:
        vec = channel_vector(n, most)
        value = np.asarray(g.ctx.inputs[1].value, np.float32).reshape(-1, *b_shape[-2:])
        rhs = g.const(b, pack_oc(value if adj_y else value.swapaxes(-1, -2), vec))   # [batch][N/vec][K][vec]

        def wload(step: ir.Operand) -> Expr:
            return rhs.load(((bb * -(-n // vec) + tile.oc) * k + step) * vec, vec, as_float=True)
    elif not adj_y and n % 4 == 0:
        vec, rhs = channel_vector(n, most), g.input(b, 1)

        def wload(step: ir.Operand) -> Expr:
            return rhs.load(ir.plus(bb * (k * n), ir.times(step, n)) + tile.oc * vec, vec, as_float=True)
    else:
        vec, rhs = 4, g.input(b, 1)

        def wload(step: ir.Operand) -> Expr:
            lane = [call("min", ir.plus(tile.oc * 4, j), n - 1) for j in range(4)]
            return _gather(rhs, [ir.plus(bb * (k * n) + lane[j] * k, step) if adj_y
                                 else ir.plus(bb * (k * n), ir.times(step, n)) + lane[j] for j in range(4)])
    tile = Tile(g, b, vec, pixels_per_item(m))
    ab = b.let("ab", _batch_index(out_batch, a_shape[:-2], tile.r))
    bb = b.let("bb", _batch_index(out_batch, b_shape[:-2], tile.r))
    pixels = tile.pixels
    index, exists, rows = _blocked(b, m, pixels, tile.cb * pixels, "m")
    accs = tile.accumulators(None)
    xaddr = [ab * (m * k) + (row if adj_x else row * k) for row in rows]
    dot(b, accs, k, a, xaddr, wload, vec, xstride=m if adj_x else 1)
    return [tile.finish(rows=int(np.prod(out_batch, dtype=np.int64)), blocks=-(-m // pixels), channels=n,
                        pixel=[tile.r * m + e for e in index], exists=exists)]
