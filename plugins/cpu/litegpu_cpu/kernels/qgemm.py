"""Quantized products with a constant int8 weight: ``out = requantize(x @ W + bias)``.

The integer core of int8 FULLY_CONNECTED and CONV_2D: x [M, K] int8 activations with a
zero point, W [K, N] int8 weights (symmetric, per output channel or per tensor), an int32
bias, int8 results. As in :mod:`.packed`, W is packed once into panels of 16 output
columns, here ``[N/16][K/4][16][4]`` bytes: one 64-byte vector holds four K steps of
sixteen columns, the operand of one ``vpdpbusd`` (AVX-512 VNNI: sixty-four 8-bit
multiplies summed in fours into sixteen int32 lanes). The tiles (LLVM IR, :func:`_tile_codegen`)
keep ``MR`` rows of sixteen int32 sums in registers over all of K; rows left over (an FC's
one row) go one at a time over four panels (1x1280x1000 on 2 threads: 17 us).

``vpdpbusd`` multiplies an unsigned byte by a signed one, so the activations are read
as ``x + 128`` (a flip of the sign bit, done as they are broadcast) and the bias absorbs
the difference: ``sum (x - zx) w = sum (x + 128) w - (128 + zx) sum w``, the last term a
constant per column computed here with the bias (:func:`initial_sums`). Without VNNI the
same sums come from plain LLVM vector arithmetic (widened multiplies and adds), exact
and slower.

Requantization is LiteRT's XNNPACK path (its default for int8 models on the CPU): the
int32 sum times a float32 scale per column (``input_scale * weight_scale /
output_scale``), rounded to nearest even, plus the output zero point, clamped to the
activation's range in the quantized domain.
"""
from __future__ import annotations

import numpy as np
from llvmlite import binding, ir

from litegpu.quant import row_sums

from ..jit import cgutils, intrinsic, njit, types
from .packed import NR, carried_loop, splat_vector
from .tasks import bind_task, task_function

# Rows per tile: MR accumulators of NR int32 lanes.
MR = 6
# Below this many multiply-adds a product runs as one task.
SPLIT_MIN_MACS = 1 << 18
_TASKS = 8

VNNI = bool(binding.get_host_cpu_features().get("avx512vnni", False))

_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_SUMS = ir.VectorType(_I32, NR)             # sixteen int32 sums
_BYTES = ir.VectorType(ir.IntType(8), 4 * NR)   # the same 64 bytes as int8 lanes
_FLOATS = ir.VectorType(ir.FloatType(), NR)


def _dot4(builder, acc, xs, w, vnni: bool):
    """``acc + `` the sums of four products of each lane's four unsigned bytes of ``xs``
    with the four signed bytes of ``w`` (both ``<16 x i32>``): ``vpdpbusd``, or the same
    arithmetic spelled out for LLVM where the instruction is missing."""
    if vnni:
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_SUMS, [_SUMS] * 3),
                                            "llvm.x86.avx512.vpdpbusd.512")
        return builder.call(fn, [acc, xs, w])
    wide = ir.VectorType(_I32, 4 * NR)
    products = builder.mul(builder.zext(builder.bitcast(xs, _BYTES), wide),
                           builder.sext(builder.bitcast(w, _BYTES), wide))
    total = acc
    for j in range(4):
        part = builder.shuffle_vector(products, ir.Constant(wide, ir.Undefined),
                                      ir.Constant(ir.VectorType(_I32, NR), list(range(j, 4 * NR, 4))))
        total = builder.add(total, part)
    return total


def tile_sums(builder, vnni: bool, rows: int, panels: int, x_ptr, w_ptr, init_ptr, r_, last_, stride_, groups_,
              p_, plast_):
    """Emit the K loop of a tile of ``rows`` rows x ``panels`` panels of 16 columns: their
    int32 sums ``init + sum (x + 128) w`` in ``rows * panels`` registers (``init_ptr``:
    each column's starting sum; None: zeros). Rows past ``last`` and panels past
    ``plast`` are computed as the last ones (the same values, so no partial tiles).

    Returns ``(sums, row_of, jbs)``: the sums by row then panel, each row's index and each
    panel's first column (i64 values)."""
    row_of, jbs, w_panels = tile_geometry(builder, rows, panels, r_, last_, p_, plast_, groups_)
    x_rows = [builder.mul(row, stride_) for row in row_of]
    if init_ptr is None:
        inits = [ir.Constant(_SUMS, [0] * NR)] * panels
    else:
        inits = [builder.load(builder.bitcast(builder.gep(builder.bitcast(init_ptr, _I32.as_pointer()), [jb]),
                                              _SUMS.as_pointer()), align=4) for jb in jbs]
    step = k_steps(builder, vnni, panels, w_ptr, w_panels, x_ptr, x_rows)
    flat = carried_loop(builder, groups_, inits * rows, step, "qtile.k")
    return [flat[r * panels:(r + 1) * panels] for r in range(rows)], row_of, jbs


def tile_geometry(builder, rows: int, panels: int, r_, last_, p_, plast_, groups_) -> tuple[list, list, list]:
    """A tile's rows and panels (those past ``last`` / ``plast`` clamped to the last):
    each row's index, each panel's first column and each panel's first byte of the packed
    W (``groups_`` steps of four K values per panel), as i64 values."""
    def clamped(first, i, last):
        at = builder.add(first, ir.Constant(_I64, i))
        return builder.select(builder.icmp_signed("<", at, last), at, last)

    row_of = [clamped(r_, i, last_) for i in range(rows)]
    panel_of = [clamped(p_, j, plast_) for j in range(panels)]
    jbs = [builder.mul(p, ir.Constant(_I64, NR)) for p in panel_of]
    w_panels = [builder.mul(p, builder.mul(groups_, ir.Constant(_I64, 4 * NR))) for p in panel_of]
    return row_of, jbs, w_panels


def k_steps(builder, vnni: bool, panels: int, w_ptr, w_panels: list, x_ptr, x_rows: list, w_first=None):
    """The body of a tile's K loop, ``step(g, sums)``: four K steps at group ``g``, each
    panel's 64 bytes of W (from group ``w_first + g``: an indirect tile's tap starts
    later in W) times each row's four bytes of x at ``x_rows[r] + 4 g``, plus 128 (the
    bytes flipped, so ``vpdpbusd`` reads them unsigned), added to ``sums`` (by row, then
    panel)."""
    byte_ptr = ir.IntType(8).as_pointer()
    x_bytes, w_bytes = builder.bitcast(x_ptr, byte_ptr), builder.bitcast(w_ptr, byte_ptr)
    flip = ir.Constant(_I32, -0x7F7F7F80)      # 0x80808080: x + 128 in every byte

    def step(g, sums):
        at = builder.mul(g if w_first is None else builder.add(w_first, g), ir.Constant(_I64, 4 * NR))
        ws = [builder.load(builder.bitcast(builder.gep(w_bytes, [builder.add(wp, at)]), _SUMS.as_pointer()),
                           align=1) for wp in w_panels]
        k_at = builder.mul(g, ir.Constant(_I64, 4))
        out = []
        for r, x_row in enumerate(x_rows):
            four = builder.load(builder.bitcast(builder.gep(x_bytes, [builder.add(x_row, k_at)]),
                                                _I32.as_pointer()), align=1)
            xs = splat_vector(builder, builder.xor(four, flip), _SUMS)
            out += [_dot4(builder, a, xs, w, vnni) for a, w in zip(sums[r * panels:(r + 1) * panels], ws)]
        return out
    return step


def _tile_codegen(vnni: bool, rows: int, panels: int):
    """The IR of a requantizing tile (:func:`tile_sums`, then each sum scaled, rounded,
    shifted by the output zero point, clamped and stored as int8)."""
    def codegen(context, builder, signature, args):
        x_ptr, w_ptr, init_ptr, scale_ptr, out_ptr, r_, last_, stride_, groups_, n_, p_, plast_, zp_, lo_, hi_ = args
        acc, row_of, jbs = tile_sums(builder, vnni, rows, panels, x_ptr, w_ptr, init_ptr, r_, last_, stride_,
                                     groups_, p_, plast_)
        out_bytes = builder.bitcast(out_ptr, ir.IntType(8).as_pointer())

        requantize = requantizer(builder, zp_, lo_, hi_)
        for j, jb in enumerate(jbs):
            scale = builder.load(builder.bitcast(builder.gep(scale_ptr, [jb]), _FLOATS.as_pointer()), align=4)
            left = builder.sub(n_, jb)
            whole = builder.icmp_signed(">=", left, ir.Constant(_I64, NR))
            for row, r in zip(acc, row_of):
                q = requantize(row[j], scale)
                at = builder.gep(out_bytes, [builder.add(builder.mul(r, n_), jb)])
                with builder.if_else(whole) as (full, partial):
                    with full:
                        builder.store(q, builder.bitcast(at, q.type.as_pointer()), align=1)
                    with partial:
                        _store_first_bytes(builder, q, at, left)
        return context.get_dummy_value()
    return codegen


def requantizer(builder, zp_, lo_, hi_):
    """``requantize(sums, scale) -> <16 x i8>``: XNNPACK's requantization of sixteen int32
    sums by float32 scales (``<16 x float>``), for output zero point ``zp_`` and the
    activation's range ``lo_ .. hi_`` (i64 values, quantized)."""
    zp = splat_vector(builder, builder.trunc(zp_, _I32), _SUMS)
    # Clamped in float first (to the activation's range less the zero point), so the
    # conversion back to int32 never overflows.
    lo = splat_vector(builder, builder.sitofp(builder.sub(lo_, zp_), ir.FloatType()), _FLOATS)
    hi = splat_vector(builder, builder.sitofp(builder.sub(hi_, zp_), ir.FloatType()), _FLOATS)
    rint = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_FLOATS, [_FLOATS]),
                                          f"llvm.rint.v{NR}f32")
    byte_vector = ir.VectorType(ir.IntType(8), NR)

    def requantize(sums, scale):
        value = builder.fmul(builder.sitofp(sums, _FLOATS), scale)
        value = builder.select(builder.fcmp_ordered("<", value, lo), lo, value)
        value = builder.select(builder.fcmp_ordered(">", value, hi), hi, value)
        return builder.trunc(builder.add(builder.fptosi(builder.call(rint, [value]), _SUMS), zp), byte_vector)
    return requantize


def _store_first_bytes(builder, value, pointer, count):
    """Store the first ``count`` of the NR bytes of ``value`` at ``pointer``, no further."""
    head = builder.block
    loop = builder.append_basic_block("qstore.lane")
    after = builder.append_basic_block("qstore.done")
    builder.branch(loop)
    builder.position_at_end(loop)
    lane = builder.phi(_I64)
    lane.add_incoming(ir.Constant(_I64, 0), head)
    builder.store(builder.extract_element(value, lane), builder.gep(pointer, [lane]))
    following = builder.add(lane, ir.Constant(_I64, 1))
    lane.add_incoming(following, loop)
    builder.cbranch(builder.icmp_signed("<", following, count), loop, after)
    builder.position_at_end(after)


def _make_tile(vnni: bool, rows: int, panels: int):
    @intrinsic
    def tile(typingctx, xp, wp, initp, scalep, outp, r, last, stride, groups, n, p, plast, zp, lo, hi):
        """``rows`` rows from ``r`` (past ``last``: clamped to it) of the quantized product
        for ``panels`` panels from ``p`` (past ``plast``: clamped): x's rows ``stride``
        bytes apart, ``groups`` K steps of four."""
        return types.void(xp, wp, initp, scalep, outp, *[types.int64] * 10), _tile_codegen(vnni, rows, panels)
    return tile


# Whole tiles of MR rows x two panels (each x broadcast feeds two vpdpbusd: 15-50 %
# faster than one panel on mobilenet's 1x1 convs); where a task's panels come in fours,
# wide tiles of MR rows x four panels (24 sums in registers, each broadcast feeding four
# vpdpbusd: eight 1x64x768 <-> 2048 hybrid FCs went from 1.10x LiteRT's time to 1.04x on
# Zen 5), never past the task's panels, so a narrow product wastes nothing; a last few
# rows (a product of one to five rows, an FC) one row x four panels at a time, four
# independent chains of sums instead of one row computed six times over.
_ROW_PANELS = 4
_TILE_PANELS = 2
_WIDE_PANELS = 4
_tile_vnni, _wide_vnni, _row_vnni = (_make_tile(True, MR, _TILE_PANELS), _make_tile(True, MR, _WIDE_PANELS),
                                     _make_tile(True, 1, _ROW_PANELS))
_tile_plain, _wide_plain, _row_plain = (_make_tile(False, MR, _TILE_PANELS), _make_tile(False, MR, _WIDE_PANELS),
                                        _make_tile(False, 1, _ROW_PANELS))


@njit(cache=True, inline="always")
def wide_end(p0, p1):
    """Where a task's panels ``p0 .. p1`` stop coming in whole :data:`_WIDE_PANELS`: its
    wide tiles cover ``p0 ..`` this, its two-panel tiles the rest."""
    return p0 + (p1 - p0) // _WIDE_PANELS * _WIDE_PANELS


@njit(cache=True, inline="always")
def _task_share(t, ip):
    """Task ``t``'s rows ``r0 .. r1`` and panels ``p0 .. p1`` (``ip``: M, K/4, N, x's row
    stride in bytes, row_chunk, row_tasks, panel_chunk, panel_tasks, ...)."""
    m, n = ip[0], ip[2]
    row_chunk, row_tasks, panel_chunk, panel_tasks = ip[4], ip[5], ip[6], ip[7]
    row_task = t // panel_tasks
    r0 = row_task * row_chunk
    r1 = m if row_task == row_tasks - 1 else r0 + row_chunk
    p0 = (t % panel_tasks) * panel_chunk
    return r0, r1, p0, min((n + NR - 1) // NR, p0 + panel_chunk)


# Two task functions, one per tile: the VNNI one must never be compiled on a CPU without
# the instruction (LLVM cannot select it), and module-level functions stay in numba's cache.
@task_function(requires=("avx512vnni",))
def _qgemm_vnni(t, xp, wp, initp, scalep, outp, _a5, _a6, _a7, ip, fp):
    """Task ``t`` of the quantized product with ``vpdpbusd`` (``ip``: M, K/4, N, x's row
    stride in bytes, row_chunk, row_tasks, panel_chunk, panel_tasks, output zero point,
    qmin, qmax)."""
    r0, r1, p0, p1 = _task_share(t, ip)
    whole = r0 + (r1 - r0) // MR * MR
    wide = wide_end(p0, p1)
    for p in range(p0, wide, _WIDE_PANELS):
        for r in range(r0, whole, MR):
            _wide_vnni(xp, wp, initp, scalep, outp, r, r1 - 1, ip[3], ip[1], ip[2], p, p1 - 1, ip[8], ip[9], ip[10])
    for p in range(wide, p1, _TILE_PANELS):
        for r in range(r0, whole, MR):
            _tile_vnni(xp, wp, initp, scalep, outp, r, r1 - 1, ip[3], ip[1], ip[2], p, p1 - 1, ip[8], ip[9], ip[10])
    for r in range(whole, r1):
        for p in range(p0, p1, _ROW_PANELS):
            _row_vnni(xp, wp, initp, scalep, outp, r, r, ip[3], ip[1], ip[2], p, p1 - 1, ip[8], ip[9], ip[10])


@task_function()
def _qgemm_plain(t, xp, wp, initp, scalep, outp, _a5, _a6, _a7, ip, fp):
    """:func:`_qgemm_vnni` in plain LLVM vector arithmetic."""
    r0, r1, p0, p1 = _task_share(t, ip)
    whole = r0 + (r1 - r0) // MR * MR
    wide = wide_end(p0, p1)
    for p in range(p0, wide, _WIDE_PANELS):
        for r in range(r0, whole, MR):
            _wide_plain(xp, wp, initp, scalep, outp, r, r1 - 1, ip[3], ip[1], ip[2], p, p1 - 1, ip[8], ip[9], ip[10])
    for p in range(wide, p1, _TILE_PANELS):
        for r in range(r0, whole, MR):
            _tile_plain(xp, wp, initp, scalep, outp, r, r1 - 1, ip[3], ip[1], ip[2], p, p1 - 1, ip[8], ip[9], ip[10])
    for r in range(whole, r1):
        for p in range(p0, p1, _ROW_PANELS):
            _row_plain(xp, wp, initp, scalep, outp, r, r, ip[3], ip[1], ip[2], p, p1 - 1, ip[8], ip[9], ip[10])


def pack(w_kn: np.ndarray) -> np.ndarray:
    """int8 W [K, N] as ``[ceil(N/16), ceil(K/4), 16, 4]`` bytes, zeros past K and N."""
    k, n = w_kn.shape
    k4, n16 = -(-k // 4) * 4, -(-n // NR) * NR
    padded = np.zeros((n16, k4), np.int8)
    padded[:n, :k] = w_kn.T
    # (a column's four K steps are one int32 word: moving words, not bytes, is ~10x faster)
    return panel_words(padded.view(np.int32)).view(np.int8).reshape(n16 // NR, k4 // 4, NR, 4)


def panel_words(words: np.ndarray) -> np.ndarray:
    """Words ``[N, G]`` (N a multiple of 16) as ``[N/16, G, 16]``: each panel's 16 columns
    side by side for every group of K steps."""
    n, groups = words.shape
    return np.ascontiguousarray(words.reshape(n // NR, NR, groups).transpose(0, 2, 1))


def initial_sums(w_kn: np.ndarray, bias: np.ndarray | None, x_zero_point: int) -> np.ndarray:
    """Each column's starting sum, ``bias - (128 + zx) * sum_k w``, padded to whole panels:
    what turns the tile's ``sum (x + 128) w`` into ``bias + sum (x - zx) w``."""
    k, n = w_kn.shape
    sums = np.zeros(-(-n // NR) * NR, np.int64)
    sums[:n] = (0 if bias is None else np.asarray(bias, np.int64)) \
        - (128 + int(x_zero_point)) * row_sums(w_kn.T)
    if np.abs(sums).max(initial=0) >= 2 ** 31:
        raise ValueError("quantized product: a column's bias and weight sum overflow int32")
    return sums.astype(np.int32)


def split(m: int, n: int, k: int, threads: int) -> tuple[int, int, int, int]:
    """``(row_chunk, row_tasks, panel_chunk, panel_tasks)``: one task for small products,
    else the rows (whole tiles) or the panels, whichever is the larger, cut in a few
    tasks per thread."""
    panels = -(-n // NR)
    if threads < 2 or m * n * k < SPLIT_MIN_MACS:
        return m, 1, panels, 1
    if m >= n:
        row_chunk = -(-(-(-m // _TASKS)) // MR) * MR
        return row_chunk, -(-m // row_chunk), panels, 1
    # Whole tiles of panels per task (wide ones where there are enough panels): a task's
    # last tile never recomputes a panel.
    step = _WIDE_PANELS if panels >= 4 * _WIDE_PANELS else _TILE_PANELS
    panel_chunk = -(-(-(-panels // _TASKS)) // step) * step
    return m, 1, panel_chunk, -(-panels // panel_chunk)


class QuantizedMatmul:
    """``bind(x [M, K] int8, out [M, N] int8) -> call`` computing ``out = clamp(round((x -
    zx) @ w_kn + bias) * scales) + zo, lo, hi)`` for the constant int8 ``w_kn`` [K, N],
    int32 ``bias`` (or None), float32 ``scales`` per column (or one), packed here once;
    ``threads``: the threads the tasks are cut for. ``vnni``: use ``vpdpbusd``
    (default: when the host has it)."""

    def __init__(self, w_kn: np.ndarray, bias: np.ndarray | None, x_zero_point: int, scales: np.ndarray,
                 out_zero_point: int, lo: int, hi: int, threads: int, vnni: bool | None = None) -> None:
        k, n = w_kn.shape
        if w_kn.dtype != np.int8 or k == 0 or n == 0:
            raise ValueError(f"quantized product takes a non-empty int8 weight, not {w_kn.dtype} {w_kn.shape}")
        self.k, self.n, self.threads = k, n, threads
        self.weights = pack(w_kn)
        self.init = initial_sums(w_kn, bias, x_zero_point)
        self.scales = np.zeros(self.init.size, np.float32)
        self.scales[:n] = np.broadcast_to(np.asarray(scales, np.float32), (n,))
        self.bounds = (int(out_zero_point), int(lo), int(hi))
        self.task = _qgemm_vnni if (VNNI if vnni is None else vnni) else _qgemm_plain

    def bind(self, x: np.ndarray, out: np.ndarray):
        """The call on these arrays: ``x`` [M, K rounded up to a multiple of 4] (the bytes
        past K are multiplied by zero weights), ``out`` [M, N]."""
        m, k4 = out.shape[0], self.weights.shape[1] * 4
        if x.dtype != np.int8 or out.dtype != np.int8 or x.shape != (m, k4) or out.shape != (m, self.n):
            raise ValueError(f"quantized product [M, {k4}] -> [M, {self.n}] given {x.shape} {x.dtype} -> "
                             f"{out.shape} {out.dtype}")
        rows = split(m, self.n, self.k, self.threads)
        params = np.array([m, k4 // 4, self.n, k4, *rows, *self.bounds], np.int64)
        return bind_task(self.task, rows[1] * rows[3], (x, self.weights, self.init, self.scales), (out,), params,
                         dtypes=(np.int8, np.int8, np.int32, np.float32, np.int8))
