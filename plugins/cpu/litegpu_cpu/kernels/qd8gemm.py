"""Dynamically quantized products: float rows times a constant int8 weight, float results.

The kernel of hybrid (dynamic-range) FULLY_CONNECTED and CONV_2D (:mod:`.qd8conv`), in
XNNPACK's qd8-f32-qc8w arithmetic (what LiteRT's default interpreter runs for these nodes,
and what the ops' hybrid references compute, :mod:`litegpu.ops.hybrid`):

1. each row of the float input is quantized to int8 with its own scale and zero point
   (:func:`_quantize_rows_task`, XNNPACK's f32 -> qd8 convert, float32 step by step; a
   convolution quantizes each image as one row);
2. the int8 rows times the packed weight: the K loop of :mod:`.qgemm`'s tiles
   (``vpdpbusd`` where the host has it), which sums ``(q + 128) w``; the epilogue takes
   ``(128 + zp_row) * sum_k w`` off to get the exact ``sum (q - zp) w``. A convolution's
   rows are its im2col of the quantized images, or, read in place through a table of
   where each tap lies, the images themselves (the indirect tiles);
3. each sum to float32, times the row's scale, then one fused multiply-add with the
   column's weight scale and the bias, clamped by the fused activation, stored.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir

from litegpu.backend import NodeContext
from litegpu.quant import row_sums

from ..jit import intrinsic, njit, types
from .common import clamp_bounds, optional_input
from .mathfn import maxnum32, minnum32, row_range32

from .packed import NR, carried_loop, clamp_vector, fma_function, load_vector, splat_vector, store_panel
from .qgemm import (_ROW_PANELS, _SUMS, _TILE_PANELS, _WIDE_PANELS, MR, VNNI, _task_share, k_steps, pack, split,
                    tile_geometry, tile_sums, wide_end)
from .registry import bindable
from .shared_weights import shared_packing
from .threads import current as current_threads
from .tasks import bind_task, in_sequence, int8_pointer, int32_pointer, task_function

_I32 = ir.IntType(32)
_I64 = ir.IntType(64)


def _dequantize_store(builder, acc, row_of, jbs, colsum_ptr, wscale_ptr, bias_ptr, rowscale_ptr, rowc_ptr, out_ptr,
                      n_, lo_, hi_) -> None:
    """A tile's epilogue (the module docstring's step 3): each of its sums ``acc`` (by row,
    then panel; ``row_of``: the rows, ``jbs``: the panels' first columns) made exact, scaled
    back to float32, clamped and stored."""
    colsums = builder.bitcast(colsum_ptr, _I32.as_pointer())
    row_cs = builder.bitcast(rowc_ptr, _I32.as_pointer())
    lo, hi = splat_vector(builder, lo_), splat_vector(builder, hi_)
    fma = fma_function(builder)
    # Per row: the zero-point correction factor and the scale, loaded once per tile.
    row_c = [splat_vector(builder, builder.load(builder.gep(row_cs, [r])), _SUMS) for r in row_of]
    row_scale = [splat_vector(builder, builder.load(builder.gep(rowscale_ptr, [r]))) for r in row_of]
    for j, jb in enumerate(jbs):
        colsum = builder.load(builder.bitcast(builder.gep(colsums, [jb]), _SUMS.as_pointer()), align=4)
        wscale, bias = load_vector(builder, wscale_ptr, jb), load_vector(builder, bias_ptr, jb)
        left = builder.sub(n_, jb)
        whole = builder.icmp_signed(">=", left, ir.Constant(_I64, NR))
        for row, r, c, scale in zip(acc, row_of, row_c, row_scale):
            exact = builder.sub(row[j], builder.mul(c, colsum))
            value = builder.fmul(builder.sitofp(exact, scale.type), scale)
            value = clamp_vector(builder, builder.call(fma, [value, wscale, bias]), lo, hi)
            store_panel(builder, value, out_ptr, builder.add(builder.mul(r, n_), jb), whole, left)


def _tile_codegen(vnni: bool, rows: int, panels: int):
    """The IR of a tile of :func:`.qgemm.tile_sums` whose sums are dequantized and stored as
    float32 (:func:`_dequantize_store`)."""
    def codegen(context, builder, signature, args):
        (x_ptr, w_ptr, colsum_ptr, wscale_ptr, bias_ptr, rowscale_ptr, rowc_ptr, out_ptr,
         r_, last_, stride_, groups_, n_, p_, plast_, lo_, hi_) = args
        acc, row_of, jbs = tile_sums(builder, vnni, rows, panels, x_ptr, w_ptr, None, r_, last_, stride_,
                                     groups_, p_, plast_)
        _dequantize_store(builder, acc, row_of, jbs, colsum_ptr, wscale_ptr, bias_ptr, rowscale_ptr, rowc_ptr,
                          out_ptr, n_, lo_, hi_)
        return context.get_dummy_value()
    return codegen


def _make_tile(vnni: bool, rows: int, panels: int):
    @intrinsic
    def tile(typingctx, xp, wp, colsump, wscalep, biasp, rowscalep, rowcp, outp, r, last, stride, groups, n, p,
             plast, lo, hi):
        """``rows`` rows from ``r`` (clamped to ``last``) x ``panels`` panels from ``p``
        (clamped to ``plast``) of the dequantized product, clamped to [lo, hi]."""
        sig = types.void(xp, wp, colsump, wscalep, biasp, rowscalep, rowcp, outp, *[types.int64] * 7,
                         types.float32, types.float32)
        return sig, _tile_codegen(vnni, rows, panels)
    return tile


_tile_vnni, _wide_vnni, _row_vnni = (_make_tile(True, MR, _TILE_PANELS), _make_tile(True, MR, _WIDE_PANELS),
                                     _make_tile(True, 1, _ROW_PANELS))
_tile_plain, _wide_plain, _row_plain = (_make_tile(False, MR, _TILE_PANELS), _make_tile(False, MR, _WIDE_PANELS),
                                        _make_tile(False, 1, _ROW_PANELS))


# -- the product of a convolution without its im2col (indirect) ----------------------------
#
# A convolution's row (an output pixel) is its window's taps one after the other, C bytes
# each. Rather than copying those bytes into rows (the im2col, as large as the image times
# the taps and written and read again on every run), the indirect tiles read each tap's C
# bytes where the image holds them: an indirection table gives, per row and tap, its
# offset in the quantized images (or in a row of the image's zero point, for taps in the
# padding), as XNNPACK's IGEMM does. C is a multiple of 4, so a tap is whole K steps.
# The table follows the product's parameters in ``ip``: taps, C / 4, then [M, taps] int64.
_TAPS, _TAP_GROUPS, _TABLE = 8, 9, 10


def _indirect_sums(builder, vnni: bool, rows: int, panels: int, x_ptr, w_ptr, ip_ptr, r_, last_, p_, plast_):
    """:func:`.qgemm.tile_sums` (the same sums, registers and steps) with each row's bytes
    of a tap found in the indirection table: a loop over the taps around the loop over
    the tap's K steps."""
    taps_ = builder.load(builder.gep(ip_ptr, [ir.Constant(_I64, _TAPS)]))
    tap_groups_ = builder.load(builder.gep(ip_ptr, [ir.Constant(_I64, _TAP_GROUPS)]))
    table = builder.gep(ip_ptr, [ir.Constant(_I64, _TABLE)])
    row_of, jbs, w_panels = tile_geometry(builder, rows, panels, r_, last_, p_, plast_,
                                          builder.mul(taps_, tap_groups_))
    row_taps = [builder.mul(row, taps_) for row in row_of]

    def tap_step(tap, sums):
        x_rows = [builder.load(builder.gep(table, [builder.add(at, tap)])) for at in row_taps]
        step = k_steps(builder, vnni, panels, w_ptr, w_panels, x_ptr, x_rows, builder.mul(tap, tap_groups_))
        return carried_loop(builder, tap_groups_, sums, step, "qi.k")

    flat = carried_loop(builder, taps_, [ir.Constant(_SUMS, [0] * NR)] * (rows * panels), tap_step, "qi.tap")
    return [flat[r * panels:(r + 1) * panels] for r in range(rows)], row_of, jbs


def _make_indirect_tile(vnni: bool, rows: int, panels: int):
    def codegen(context, builder, signature, args):
        (x_ptr, w_ptr, colsum_ptr, wscale_ptr, bias_ptr, rowscale_ptr, rowc_ptr, out_ptr, ip_ptr,
         r_, last_, n_, p_, plast_, lo_, hi_) = args
        acc, row_of, jbs = _indirect_sums(builder, vnni, rows, panels, x_ptr, w_ptr, ip_ptr, r_, last_, p_, plast_)
        _dequantize_store(builder, acc, row_of, jbs, colsum_ptr, wscale_ptr, bias_ptr, rowscale_ptr, rowc_ptr,
                          out_ptr, n_, lo_, hi_)
        return context.get_dummy_value()

    @intrinsic
    def tile(typingctx, xp, wp, colsump, wscalep, biasp, rowscalep, rowcp, outp, ip, r, last, n, p, plast, lo, hi):
        """:func:`_make_tile`'s tile reading x through the indirection table in ``ip``."""
        sig = types.void(xp, wp, colsump, wscalep, biasp, rowscalep, rowcp, outp, ip, *[types.int64] * 5,
                         types.float32, types.float32)
        return sig, codegen
    return tile


_itile_vnni, _irow_vnni = _make_indirect_tile(True, MR, _TILE_PANELS), _make_indirect_tile(True, 1, _ROW_PANELS)
_itile_plain, _irow_plain = _make_indirect_tile(False, MR, _TILE_PANELS), _make_indirect_tile(False, 1, _ROW_PANELS)


@njit(cache=True, inline="always")
def tiled_rows(r0, r1):
    """Where the tiles of MR rows end in rows ``r0 .. r1``: after the last whole tile, or at
    ``r1`` when the rows left over make half a tile or more. Those then go in one more tile
    (its rows past ``r1`` repeat the last) on the panels whose weights are in cache, rather
    than one row at a time over all the panels, each row streaming the whole weight again:
    with 16 rows (a 4x4 image's 1x1 conv, 1-2 MB of weights) that ran at a quarter of
    the tiles' speed."""
    whole = r0 + (r1 - r0) // MR * MR
    return r1 if r1 - whole >= MR // 2 else whole


# One task function per instruction set, as in .qgemm: the VNNI one is never compiled on
# a host without it.
@task_function(requires=("avx512vnni",))
def _qd8_vnni(t, qp, wp, colsump, wscalep, biasp, rowscalep, rowcp, outp, ip, fp):
    """Task ``t`` of the product (``ip`` as :func:`.qgemm._qgemm_vnni`'s first eight; ``fp``:
    the clamp's lo, hi)."""
    r0, r1, p0, p1 = _task_share(t, ip)
    tiled = tiled_rows(r0, r1)
    wide = wide_end(p0, p1)
    for p in range(p0, wide, _WIDE_PANELS):
        for r in range(r0, tiled, MR):
            _wide_vnni(qp, wp, colsump, wscalep, biasp, rowscalep, rowcp, outp, r, r1 - 1, ip[3], ip[1], ip[2],
                       p, p1 - 1, fp[0], fp[1])
    for p in range(wide, p1, _TILE_PANELS):
        for r in range(r0, tiled, MR):
            _tile_vnni(qp, wp, colsump, wscalep, biasp, rowscalep, rowcp, outp, r, r1 - 1, ip[3], ip[1], ip[2],
                       p, p1 - 1, fp[0], fp[1])
    for r in range(tiled, r1):
        for p in range(p0, p1, _ROW_PANELS):
            _row_vnni(qp, wp, colsump, wscalep, biasp, rowscalep, rowcp, outp, r, r, ip[3], ip[1], ip[2],
                      p, p1 - 1, fp[0], fp[1])


@task_function()
def _qd8_plain(t, qp, wp, colsump, wscalep, biasp, rowscalep, rowcp, outp, ip, fp):
    """:func:`_qd8_vnni` in plain LLVM vector arithmetic."""
    r0, r1, p0, p1 = _task_share(t, ip)
    tiled = tiled_rows(r0, r1)
    wide = wide_end(p0, p1)
    for p in range(p0, wide, _WIDE_PANELS):
        for r in range(r0, tiled, MR):
            _wide_plain(qp, wp, colsump, wscalep, biasp, rowscalep, rowcp, outp, r, r1 - 1, ip[3], ip[1], ip[2],
                       p, p1 - 1, fp[0], fp[1])
    for p in range(wide, p1, _TILE_PANELS):
        for r in range(r0, tiled, MR):
            _tile_plain(qp, wp, colsump, wscalep, biasp, rowscalep, rowcp, outp, r, r1 - 1, ip[3], ip[1], ip[2],
                        p, p1 - 1, fp[0], fp[1])
    for r in range(tiled, r1):
        for p in range(p0, p1, _ROW_PANELS):
            _row_plain(qp, wp, colsump, wscalep, biasp, rowscalep, rowcp, outp, r, r, ip[3], ip[1], ip[2],
                       p, p1 - 1, fp[0], fp[1])


@task_function(requires=("avx512vnni",))
def _qd8_indirect_vnni(t, qp, wp, colsump, wscalep, biasp, rowscalep, rowcp, outp, ip, fp):
    """:func:`_qd8_vnni` with indirect tiles (``q``: the quantized images)."""
    r0, r1, p0, p1 = _task_share(t, ip)
    tiled = tiled_rows(r0, r1)
    for p in range(p0, p1, _TILE_PANELS):
        for r in range(r0, tiled, MR):
            _itile_vnni(qp, wp, colsump, wscalep, biasp, rowscalep, rowcp, outp, ip, r, r1 - 1, ip[2], p, p1 - 1,
                        fp[0], fp[1])
    for r in range(tiled, r1):
        for p in range(p0, p1, _ROW_PANELS):
            _irow_vnni(qp, wp, colsump, wscalep, biasp, rowscalep, rowcp, outp, ip, r, r, ip[2], p, p1 - 1,
                       fp[0], fp[1])


@task_function()
def _qd8_indirect_plain(t, qp, wp, colsump, wscalep, biasp, rowscalep, rowcp, outp, ip, fp):
    """:func:`_qd8_indirect_vnni` in plain LLVM vector arithmetic."""
    r0, r1, p0, p1 = _task_share(t, ip)
    tiled = tiled_rows(r0, r1)
    for p in range(p0, p1, _TILE_PANELS):
        for r in range(r0, tiled, MR):
            _itile_plain(qp, wp, colsump, wscalep, biasp, rowscalep, rowcp, outp, ip, r, r1 - 1, ip[2], p, p1 - 1,
                         fp[0], fp[1])
    for r in range(tiled, r1):
        for p in range(p0, p1, _ROW_PANELS):
            _irow_plain(qp, wp, colsump, wscalep, biasp, rowscalep, rowcp, outp, ip, r, r, ip[2], p, p1 - 1,
                        fp[0], fp[1])


# The rows of a float x [M, K] are quantized by tasks over pieces of them, whose int64
# parameters are M, K, K4 (q's row length), chunk, repeat, parts: ``chunk`` whole rows a
# task, or (few long rows: a convolution's image) each row cut in ``parts`` pieces, after
# a first pass of :func:`_range_task` over the same pieces finds their ranges.


@njit(cache=True, inline="always")
def row_piece(t, ip):
    """Task ``t``'s rows ``r0 .. r1`` and columns ``i0 .. i1`` of x: ``chunk`` whole rows, or a
    ``parts``-th of one row (whole vectors of NR floats)."""
    m, k, chunk, parts = ip[0], ip[1], ip[3], ip[5]
    if parts == 1:
        return t * chunk, min(m, (t + 1) * chunk), 0, k
    r, part = t // parts, t % parts
    size = -(-k // (parts * NR)) * NR
    return r, r + 1, min(k, part * size), min(k, (part + 1) * size)


@njit(cache=True, inline="always")
def row_range(xp, rangesp, r, ip):
    """Row ``r``'s (min, max) widened to hold 0, NaNs skipped: from the row itself, or folded
    from the ranges of its pieces (:func:`_range_task`)."""
    k, parts = ip[1], ip[5]
    if parts == 1:
        return row_range32(xp, r * k, k, np.float32(0), np.float32(0))
    lo, hi = np.float32(0), np.float32(0)
    for piece in range(r * parts, (r + 1) * parts):
        lo, hi = minnum32(lo, rangesp[2 * piece]), maxnum32(hi, rangesp[2 * piece + 1])
    return lo, hi


@task_function()
def _range_task(t, xp, rangesp, _a2, _a3, _a4, _a5, _a6, _a7, ip, fp):
    """Piece ``t`` of a row cut in parts (:func:`row_piece`): its (min, max) into
    ``ranges[2t], ranges[2t + 1]``, which every piece of the row then folds."""
    r, _, i0, i1 = row_piece(t, ip)
    lo, hi = row_range32(xp, r * ip[1] + i0, i1 - i0, np.float32(0), np.float32(0))
    rangesp[2 * t] = lo
    rangesp[2 * t + 1] = hi


def bind_row_pieces(task, x: np.ndarray, outputs: tuple, dtypes: tuple, k4: int, repeat: int, threads: int):
    """The call running ``task(t, x, ranges, *outputs)`` (``dtypes``: the outputs') over the
    pieces of float x [M, K] (:func:`row_piece`) cut for ``threads``: whole rows, or, when
    there are fewer rows than threads and they are long (an image, which one thread would
    quantize while the others wait), each row in one piece a thread, after a pass of
    :func:`_range_task`. ``k4`` and ``repeat`` are passed on to ``task``."""
    m, k = x.shape
    parts = threads if m < threads and k >= 1 << 14 else 1
    if parts == 1:
        # (From 4096 elements: BERT's 64 x 128 rows gain from two threads inside a plan's
        # parallel region, where an extra row of tasks costs well under a microsecond.)
        chunk = -(-m // max(1, min(m, threads if m * k >= 1 << 12 else 1)))
        tasks = -(-m // chunk)
    else:
        chunk, tasks = 1, m * parts
    ranges = np.zeros(2 * tasks, np.float32)
    params = np.array([m, k, k4, chunk, repeat, parts], np.int64)
    call = bind_task(task, tasks, (x, ranges), outputs, params, dtypes=(np.float32, np.float32, *dtypes))
    if parts == 1:
        return call
    return in_sequence([bind_task(_range_task, tasks, (x,), (ranges,), params), call])


@task_function()
def _quantize_rows_task(t, xp, rangesp, qp, scalep, cp, _a5, _a6, _a7, ip, fp):
    """Piece ``t`` (:func:`row_piece`) of float x [M, K] quantized into int8 q [M, K4] (zeros
    past K), as XNNPACK's ``xnn_qd8_asymmetric_quantization_params`` and f32 -> qd8
    convert, every step in float32: the row's range widened to hold 0, ``inv = 255 / (max
    - min)`` (1 for an empty range), the zero point from the end that loses less, rounded
    to nearest even; ``q = rint(x * inv) + zp``, saturated. The row's first piece writes
    its scale ``1 / inv`` and ``128 + zp`` (the epilogue's correction factor) for each of
    the ``repeat`` product rows it feeds (1 for a fully connected layer; a convolution's
    image feeds all its output pixels)."""
    k, k4, repeat = ip[1], ip[2], ip[4]
    q, c = int8_pointer(qp), int32_pointer(cp)
    r0, r1, i0, i1 = row_piece(t, ip)
    for r in range(r0, r1):
        row = r * k
        lo, hi = row_range(xp, rangesp, r, ip)   # NaNs skipped (they quantize to zp)
        inv = np.float32(1) if lo == hi else np.float32(255) / (hi - lo)
        low_scaled, high_scaled = lo * inv, hi * inv
        if (np.float32(-128) + low_scaled) + (np.float32(127) + high_scaled) > np.float32(0):
            zp_real = np.float32(-128) - low_scaled
        else:
            zp_real = np.float32(127) - high_scaled
        zp = int(np.rint(min(max(zp_real, np.float32(-128)), np.float32(127))))
        zpf = np.float32(zp)
        for i in range(i0, i1):
            # rint(x * inv) + zp is exact in float32 wherever it lands inside [-128, 127]
            # (beyond, it saturates anyway), so the saturation is done in float and only
            # int8 values are converted. NaN quantizes to the zero point. (Selects and
            # llvm.minnum/maxnum: the loop vectorizes, in float32 lanes.)
            v = np.rint(xp[row + i] * inv)
            v = minnum32(maxnum32((v if v == v else np.float32(0)) + zpf, np.float32(-128)), np.float32(127))
            q[r * k4 + i] = np.int8(v)
        if i1 == k:
            for i in range(k, k4):
                q[r * k4 + i] = 0
        if i0 == 0:
            for i in range(r * repeat, (r + 1) * repeat):
                scalep[i] = np.float32(1) / inv
                c[i] = 128 + zp


def bind_quantize_rows(x: np.ndarray, q: np.ndarray, scale: np.ndarray, correction: np.ndarray, threads: int,
                       repeat: int = 1):
    """The call quantizing each row of float x [M, K] into int8 q [M, K4] (K4 >= K, zeros
    past K) as XNNPACK does (:func:`_quantize_rows_task`), writing its scale and correction
    factor ``128 + zp`` into ``scale`` and ``correction`` [M * repeat] for each of the
    ``repeat`` product rows that follow from it; ``threads``: the threads the rows
    are cut for (:func:`bind_row_pieces`)."""
    m, k = x.shape
    if q.shape[0] != m or q.shape[1] < k or scale.shape != (m * repeat,) or correction.shape != (m * repeat,):
        raise ValueError(f"quantizing rows {x.shape} x {repeat} given {q.shape}, {scale.shape}, {correction.shape}")
    return bind_row_pieces(_quantize_rows_task, x, (q, scale, correction), (np.int8, np.float32, np.int32),
                           q.shape[1], repeat, threads)


class SharedRowsProduct:
    """A product of float rows x [M, K] quantized on the fly (:func:`bind_quantize_rows`)
    with a constant weight: ``bind(x, out) -> call`` quantizes x, then runs
    :meth:`bind_quantized` (the subclass's product) on the quantized rows.

    Products that read the same x (a transformer's query, key and value projections)
    need x quantized once: :meth:`read_rows_of` makes this product use another's
    quantized rows instead of quantizing x itself."""

    def __init__(self, k: int, threads: int) -> None:
        self.k, self.threads = k, threads
        self._rows: dict[int, tuple] = {}       # M -> x's quantized rows, their scales and corrections
        self._source: SharedRowsProduct | None = None

    def read_rows_of(self, source: "SharedRowsProduct") -> None:
        """Read the quantized rows ``source`` writes (same K) instead of quantizing x here.
        The caller promises that ``source`` runs first in every run, on the same x: the
        cpu backend pairs the products of one program that read one tensor."""
        if source.k != self.k or source is self:
            raise ValueError("products share quantized rows of one K only")
        self._source = source

    def rows(self, m: int) -> tuple:
        """The scratch x's quantized rows go into, for M rows (K rounded up to 4): made
        once, so every binding of this product (and of those reading its rows) uses the
        same arrays."""
        if m not in self._rows:
            self._rows[m] = (np.empty((m, -(-self.k // 4) * 4), np.int8), np.empty(m, np.float32),
                             np.empty(m, np.int32))
        return self._rows[m]

    def bind(self, x: np.ndarray, out: np.ndarray):
        """The call on these arrays: x quantized into :meth:`rows` (unless another product
        does it, see :meth:`read_rows_of`), then the product."""
        m = out.shape[0]
        if x.shape != (m, self.k) or out.shape[0] != m:
            raise ValueError(f"dynamically quantized product [M, {self.k}] given {x.shape} -> {out.shape}")
        q, row_scale, row_c = (self._source or self).rows(m)
        product = self.bind_quantized(q, row_scale, row_c, out)
        if self._source is not None:
            return product
        return in_sequence([bind_quantize_rows(x, q, row_scale, row_c, self.threads), product])

    def bind_quantized(self, q: np.ndarray, row_scale: np.ndarray, row_c: np.ndarray, out: np.ndarray):
        """The product alone, on rows quantized elsewhere: int8 ``q`` [M, K4] (K rounded up
        to 4, zeros past K), each row's float32 scale and int32 correction factor ``128 +
        zp`` [M] (what :func:`bind_quantize_rows` writes)."""
        raise NotImplementedError


class DynamicQuantizedMatmul(SharedRowsProduct):
    """``bind(x [M, K] float32, out [M, N] float32) -> call`` computing XNNPACK's
    qd8-f32-qc8w product of x with the constant int8 ``w_kn`` [K, N] (symmetric), float32
    ``weight_scale`` per column, float32 ``bias`` (or None), clamped to ``[lo, hi]``,
    packed here once; ``threads``: the threads the tasks are cut for."""

    def __init__(self, w_kn: np.ndarray, weight_scale: np.ndarray, bias: np.ndarray | None, lo: float, hi: float,
                 threads: int, vnni: bool | None = None, packed: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        k, n = w_kn.shape
        if w_kn.dtype != np.int8 or k == 0 or n == 0:
            raise ValueError(f"dynamically quantized product takes a non-empty int8 weight, not "
                             f"{w_kn.dtype} {w_kn.shape}")
        super().__init__(k, threads)
        self.n = n
        # (``packed``: :meth:`pack_weights` of ``w_kn``, made once for every node reading it)
        self.weights, self.colsums = self.pack_weights(w_kn) if packed is None else packed
        columns = self.weights.shape[0] * NR
        self.weight_scale = np.zeros(columns, np.float32)
        self.weight_scale[:n] = np.broadcast_to(np.asarray(weight_scale, np.float32), (n,))
        self.bias = np.zeros(columns, np.float32)
        if bias is not None:
            self.bias[:n] = np.asarray(bias, np.float32).reshape(-1)
        self.clamp = np.array([lo, hi], np.float32)
        vnni = VNNI if vnni is None else vnni
        self.task = _qd8_vnni if vnni else _qd8_plain
        self.indirect_task = _qd8_indirect_vnni if vnni else _qd8_indirect_plain

    @staticmethod
    def pack_weights(w_kn: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``w_kn`` [K, N] packed for the tiles, and its column sums (padded columns 0)."""
        weights = pack(w_kn)
        colsums = np.zeros(weights.shape[0] * NR, np.int32)
        colsums[:w_kn.shape[1]] = row_sums(w_kn.T)
        return weights, colsums

    def bind_quantized(self, q: np.ndarray, row_scale: np.ndarray, row_c: np.ndarray, out: np.ndarray):
        """The product alone, on rows quantized elsewhere: int8 ``q`` [M, K4] (K rounded up
        to 4, zeros past K), each row's float32 scale and int32 correction factor ``128 +
        zp`` [M] (what :func:`bind_quantize_rows` writes). A convolution's rows are its
        im2col of an image quantized as a whole."""
        m, k4 = out.shape[0], self.weights.shape[1] * 4
        if q.shape != (m, k4):
            raise ValueError(f"dynamically quantized product [M, {k4}] -> [M, {self.n}] given {q.shape}")
        return self._bind_task(self.task, [k4], q, row_scale, row_c, out)

    def bind_indirect(self, images: np.ndarray, table: np.ndarray, row_scale: np.ndarray, row_c: np.ndarray,
                      out: np.ndarray):
        """The product of a convolution without its im2col (see ``_TABLE``): row ``r``'s K
        bytes are the ``taps`` runs of K / taps bytes at ``images[table[r, tap]]`` (int8
        ``images``: the quantized images and their zero-point rows; ``table`` [M, taps]
        int64, each offset with K / taps bytes after it), with each row's scale and
        correction factor as :meth:`bind_quantized`'s."""
        m, taps = table.shape
        if self.k % (4 * taps) or self.weights.shape[1] * 4 != self.k or table.shape[0] != out.shape[0] \
                or table.min() < 0 or table.max() + self.k // taps > images.size:
            raise ValueError(f"indirect product over K = {self.k} given a table {table.shape} into {images.size} "
                             "bytes")
        return self._bind_task(self.indirect_task, [0, taps, self.k // taps // 4, *table.reshape(-1)], images,
                               row_scale, row_c, out)

    def _bind_task(self, task, more: list, q: np.ndarray, row_scale: np.ndarray, row_c: np.ndarray,
                   out: np.ndarray):
        """``task`` over the product's tiles, on x's bytes ``q`` (the rows, or the images of an
        indirect product); ``more``: the int64 parameters after the split (x's row stride,
        then the indirection's)."""
        m = out.shape[0]
        if row_scale.shape != (m,) or row_c.shape != (m,) or out.shape != (m, self.n):
            raise ValueError(f"dynamically quantized product [M, {self.k}] -> [M, {self.n}] given row scales "
                             f"{row_scale.shape}, {row_c.shape} -> {out.shape}")
        rows = split(m, self.n, self.k, self.threads)
        params = np.array([m, self.weights.shape[1], self.n, more[0], *rows, *more[1:]], np.int64)
        return bind_task(task, rows[1] * rows[3],
                         (q, self.weights, self.colsums, self.weight_scale, self.bias, row_scale, row_c),
                         (out,), params, self.clamp,
                         dtypes=(np.int8, np.int8, np.int32, np.float32, np.float32, np.float32, np.int32,
                                 np.float32))


def hybrid_fully_connected(ctx: NodeContext):
    """The kernel of a hybrid FULLY_CONNECTED (float input and output, constant int8
    weights): :class:`DynamicQuantizedMatmul`; None (the hybrid reference) for a node it
    cannot take (a bias computed at run time, other dtypes)."""
    w_spec, bias_spec = ctx.inputs[1], optional_input(ctx, 2)
    if w_spec.value is None or np.dtype(w_spec.dtype) != np.int8 or np.asarray(w_spec.value).ndim != 2 \
            or np.dtype(ctx.inputs[0].dtype) != np.float32 or np.dtype(ctx.outputs[0].dtype) != np.float32:
        return None
    if bias_spec is not None and (bias_spec.value is None or np.dtype(bias_spec.dtype) != np.float32):
        return None
    if "block_size" in ctx.attrs:      # blockwise (INT4) weights
        from .qb4w import blockwise_fully_connected   # (it builds on this module's row quantization)
        return blockwise_fully_connected(ctx)
    w = np.asarray(w_spec.value, np.int8)
    o, k = w.shape
    m = int(np.prod(ctx.inputs[0].shape)) // k
    lo, hi = clamp_bounds(ctx.attrs["activation"])
    held = shared_packing("qd8", (w,), (), lambda: DynamicQuantizedMatmul.pack_weights(w.T))
    product = DynamicQuantizedMatmul(w.T, ctx.attrs["weight_scale"], None if bias_spec is None else bias_spec.value,
                                     lo, hi, current_threads(), packed=held.value)
    product.held = held
    run = bindable(lambda inputs, outputs: product.bind(inputs[0].reshape(m, k), outputs[0].reshape(m, o)))
    run.quantized_rows = product      # for the backend to pair products reading one x
    return run
