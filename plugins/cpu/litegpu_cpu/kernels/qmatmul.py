"""Exact int32 sums of int8 products, and int8 BATCH_MATMUL of two run-time operands.

The sums come from the tiles of :mod:`.qgemm` (its packed weights, its ``vpdpbusd`` K
loop, :func:`.qgemm.tile_sums`), stored as int32 instead of requantized, for the ops that
requantize in TFLite's fixed point rather than XNNPACK's float32, or after summing more
than one product:

- :class:`Int32Product`: x ``[M, K]`` times a constant int8 ``[K, N]``, ``sum_k (x - zx) w``
  (TRANSPOSE_CONV's products, :mod:`.qtransposeconv`);
- BATCH_MATMUL (attention's ``Q K^T`` and ``softmax(..) V``), in the arithmetic of LiteRT's
  builtin kernel (XNNPACK does not take it), as the integer reference
  :func:`litegpu.ops.quantized._bmm_q` computes it: ``sum_k (a - za) (b - zb)``, then
  TFLite's fixed-point multiplier (:func:`.qfixed.multiply_by_quantized_multiplier`) plus
  the output's zero point, clamped. Each task packs its batch's ``b`` as weights (the
  raw int8 values; adj_y's transpose done there) with ``-(128 + za) sum_k b`` as the
  columns' starting sums, copies its rows of ``a`` into rows of whole four-byte steps
  (adj_x's transpose) noting ``zb * sum_k (a - za)`` per row, runs the tiles, and takes
  the row's term off each sum as it requantizes. A batch is an offset into each
  operand, as :func:`.gemm.batched_matmul` has them (broadcast batches share one).
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir

from litegpu.backend import NodeContext

from ..jit import intrinsic, njit, types
from .packed import NR
from .qfixed import multiply_by_quantized_multiplier
from .qgemm import _ROW_PANELS, _SUMS, _TILE_PANELS, MR, VNNI, _task_share, initial_sums, pack, split, tile_sums
from .registry import bindable, kernel, named
from .threads import current as current_threads
from .tasks import bind_task, bound_tasks, int8_pointer, int32_pointer, task_function

I8 = np.dtype(np.int8)
_I32 = ir.IntType(32)
# A product whose sums could leave int32 (K * 255^2 >= 2^31) keeps the reference.
_MAX_K = (2 ** 31 - 1) // (255 * 255)
# Multiply-adds from which a product is cut into tasks the threads share, and the tasks.
_PARALLEL_MACS = 1 << 18
_TASKS = 8
# Bytes of scratch past which a product keeps the reference.
_MAX_SCRATCH = 1 << 28


# -- int32 tiles ------------------------------------------------------------------------------------


def _sums_codegen(vnni: bool, rows: int, panels: int):
    """The IR of a tile of :func:`.qgemm.tile_sums` whose int32 sums are stored as they are,
    in rows of ``npad`` (whole panels: every store is sixteen lanes)."""
    def codegen(context, builder, signature, args):
        x_ptr, w_ptr, init_ptr, out_ptr, r_, last_, stride_, groups_, npad_, p_, plast_ = args
        sums, row_of, jbs = tile_sums(builder, vnni, rows, panels, x_ptr, w_ptr, init_ptr, r_, last_, stride_,
                                      groups_, p_, plast_)
        out = builder.bitcast(out_ptr, _I32.as_pointer())
        for row, r in zip(sums, row_of):
            for value, jb in zip(row, jbs):
                at = builder.gep(out, [builder.add(builder.mul(r, npad_), jb)])
                builder.store(value, builder.bitcast(at, _SUMS.as_pointer()), align=4)
        return context.get_dummy_value()
    return codegen


def _make_tile(vnni: bool, rows: int, panels: int):
    @intrinsic
    def tile(typingctx, xp, wp, initp, outp, r, last, stride, groups, npad, p, plast):
        """``rows`` rows from ``r`` (clamped to ``last``) x ``panels`` panels from ``p``
        (clamped to ``plast``) of the int32 sums."""
        return types.void(xp, wp, initp, outp, *[types.int64] * 7), _sums_codegen(vnni, rows, panels)
    return tile


_tile_vnni, _row_vnni = _make_tile(True, MR, _TILE_PANELS), _make_tile(True, 1, _ROW_PANELS)
_tile_plain, _row_plain = _make_tile(False, MR, _TILE_PANELS), _make_tile(False, 1, _ROW_PANELS)


@intrinsic
def _advance(typingctx, pointer, nbytes):
    """``pointer`` moved on by ``nbytes`` bytes (a task's own part of a scratch array)."""
    def codegen(context, builder, signature, args):
        raw = builder.bitcast(args[0], ir.IntType(8).as_pointer())
        return builder.bitcast(builder.gep(raw, [args[1]]), args[0].type)
    return pointer(pointer, types.int64), codegen


# Each block in two spellings, as in .qgemm: the VNNI one is never compiled on a host
# without the instruction.
@njit(cache=True, inline="always")
def _block_vnni(xp, wp, initp, outp, r0, r1, stride, groups, npad, p0, p1):   # pragma: no cover - compiled
    """Rows ``r0 .. r1`` x panels ``p0 .. p1`` of the int32 sums: whole tiles of ``MR`` rows,
    then the rows left one at a time."""
    whole = r0 + (r1 - r0) // MR * MR
    for p in range(p0, p1, _TILE_PANELS):
        for r in range(r0, whole, MR):
            _tile_vnni(xp, wp, initp, outp, r, r1 - 1, stride, groups, npad, p, p1 - 1)
    for r in range(whole, r1):
        for p in range(p0, p1, _ROW_PANELS):
            _row_vnni(xp, wp, initp, outp, r, r, stride, groups, npad, p, p1 - 1)


@njit(cache=True, inline="always")
def _block_plain(xp, wp, initp, outp, r0, r1, stride, groups, npad, p0, p1):   # pragma: no cover - compiled
    """:func:`_block_vnni` in plain LLVM vector arithmetic."""
    whole = r0 + (r1 - r0) // MR * MR
    for p in range(p0, p1, _TILE_PANELS):
        for r in range(r0, whole, MR):
            _tile_plain(xp, wp, initp, outp, r, r1 - 1, stride, groups, npad, p, p1 - 1)
    for r in range(whole, r1):
        for p in range(p0, p1, _ROW_PANELS):
            _row_plain(xp, wp, initp, outp, r, r, stride, groups, npad, p, p1 - 1)


# -- a product with a constant weight ---------------------------------------------------------------


@task_function(requires=("avx512vnni",))
def _sums_vnni(t, xp, wp, initp, outp, _a4, _a5, _a6, _a7, ip, _fp):
    """Task ``t`` of :class:`Int32Product` (``ip``: M, K/4, N, x's row stride in bytes,
    row_chunk, row_tasks, panel_chunk, panel_tasks, the sums' row length)."""
    r0, r1, p0, p1 = _task_share(t, ip)
    _block_vnni(xp, wp, initp, outp, r0, r1, ip[3], ip[1], ip[8], p0, p1)


@task_function()
def _sums_plain(t, xp, wp, initp, outp, _a4, _a5, _a6, _a7, ip, _fp):
    """:func:`_sums_vnni` in plain LLVM vector arithmetic."""
    r0, r1, p0, p1 = _task_share(t, ip)
    _block_plain(xp, wp, initp, outp, r0, r1, ip[3], ip[1], ip[8], p0, p1)


@task_function()
def _widen_rows_task(t, xp, outp, _a2, _a3, _a4, _a5, _a6, _a7, ip, _fp):
    """Rows of ``ip[1]`` bytes into rows of ``ip[2]`` (``ip[0]`` rows; the bytes past them
    meet zero weights): the tiles read K in steps of four."""
    x, out = int8_pointer(xp), int8_pointer(outp)
    for r in range(ip[0]):
        for c in range(ip[1]):
            out[r * ip[2] + c] = x[r * ip[1] + c]


class Int32Product:
    """``bind(x) -> calls`` filling ``sums`` [m, npad] (int32; ``npad``: N rounded up to
    whole panels of sixteen) with ``sum_k (x - zx) w_kn`` for int8 ``x`` [m, K] and the
    constant int8 ``w_kn`` [K, N], packed here once."""

    def __init__(self, w_kn: np.ndarray, x_zero_point: int, m: int) -> None:
        k, n = w_kn.shape
        self.weights = pack(w_kn)
        self.init = initial_sums(w_kn, None, x_zero_point)
        self.npad = self.init.size
        self.sums = np.empty((m, self.npad), np.int32)
        k4 = self.weights.shape[1] * 4
        # x's rows widened to whole four-byte steps when K is not a multiple of four.
        self.widened = None if k4 == k else np.zeros((m, k4), np.int8)
        rows = split(m, n, k, current_threads())
        self.params = np.array([m, k4 // 4, n, k4, *rows, self.npad], np.int64)
        self.tasks = rows[1] * rows[3]
        self.widen = np.array([m, k, k4], np.int64)
        self.task = _sums_vnni if VNNI else _sums_plain

    def bind(self, x: np.ndarray) -> list:
        """The calls computing ``sums`` from ``x`` (int8, C-contiguous, m * K elements)."""
        if self.widened is None:
            return [bound_tasks(self.task, self.tasks, (x, self.weights, self.init, self.sums), self.params)]
        return [bound_tasks(_widen_rows_task, 1, (x, self.widened), self.widen),
                bound_tasks(self.task, self.tasks, (self.widened, self.weights, self.init, self.sums), self.params)]


# -- BATCH_MATMUL ---------------------------------------------------------------------------------

# ip's fixed part (see _bmm_vnni) before the batches' offsets.
_HEAD = 22


@njit(cache=True, inline="always")
def _pack_b(b, bo, sk, sn, za, k, n, k4, packed, init):   # pragma: no cover - compiled
    """One batch of ``b`` (element ``[kk, j]`` at ``bo + kk * sk + j * sn``) as the tiles'
    weights (:func:`.qgemm.pack`'s layout, zeros past K and N) and each column's starting
    sum ``-(128 + za) sum_k b``."""
    groups = k4 // 4
    panels = (n + NR - 1) // NR
    for i in range(panels * groups * 4 * NR):
        packed[i] = np.int8(0)
    for j in range(panels * NR):
        init[j] = np.int32(0)
    for kk in range(k):
        for j in range(n):
            v = b[bo + kk * sk + j * sn]
            packed[((j // NR) * groups + kk // 4) * 4 * NR + (j % NR) * 4 + kk % 4] = v
            init[j] += np.int32(v)
    for j in range(n):
        init[j] = np.int32(-(128 + np.int64(za)) * np.int64(init[j]))


@njit(cache=True, inline="always")
def _copy_a(a, ao, sm, sk, za, zb, r0, r1, k, k4, rows, terms):   # pragma: no cover - compiled
    """Rows ``r0 .. r1`` of one batch of ``a`` (element ``[r, kk]`` at ``ao + r * sm + kk *
    sk``) as rows of ``k4`` bytes, and each row's ``zb * sum_k (a - za)``."""
    for r in range(r0, r1):
        at = (r - r0) * k4
        total = np.int64(0)
        for kk in range(k):
            v = a[ao + r * sm + kk * sk]
            rows[at + kk] = v
            total += np.int64(v)
        terms[r - r0] = np.int32(np.int64(zb) * (total - np.int64(za) * k))


@njit(cache=True, inline="always")
def _requantize_rows(sums, terms, npad, out, o, rows, n, mult, shift, zp, lo, hi):   # pragma: no cover - compiled
    """``out[o ..]``, ``rows`` rows of ``n``: each sum less its row's term, times TFLite's
    fixed-point multiplier, plus the zero point, clamped."""
    for r in range(rows):
        term = np.int64(terms[r])
        for j in range(n):
            v = multiply_by_quantized_multiplier(np.int64(sums[r * npad + j]) - term, mult, shift) + zp
            out[o + r * n + j] = np.int8(min(max(v, lo), hi))


@njit(cache=True, inline="always")
def _bmm_layout(t, ip):   # pragma: no cover - compiled
    """Task ``t``'s scratch: the byte offsets of its packed ``b`` and rows of ``a``, and of
    its columns' starting sums, row terms and sums (see :func:`_bmm_vnni`'s ``ip``)."""
    k4, npad, chunk = ip[4], ip[5], ip[6]
    packed = t * ip[20]
    ints = t * ip[21]
    return packed, packed + npad * k4, ints, ints + 4 * npad, ints + 4 * (npad + chunk)


# One task function per instruction set (see _block_vnni); both share every step but the
# tiles.
@task_function(requires=("avx512vnni",))
def _bmm_vnni(t, ap, bp, bytesp, intsp, outp, _a5, _a6, _a7, ip, _fp):
    """Task ``t``: blocks ``t * ip[8] ..`` of the product, block ``q`` being rows ``(q %
    blocks) * chunk ..`` of batch ``q // blocks`` (``ip``: batches, M, N, K, K rounded up to
    four, N rounded up to sixteen, chunk, blocks, blocks per task, a's row and K strides,
    b's K and N strides, za, zb, multiplier, shift, output zero point, lo, hi, bytes and
    int32 bytes of scratch per task, then each batch's offset in a, then in b)."""
    a, b, out = int8_pointer(ap), int8_pointer(bp), int8_pointer(outp)
    batches, m, n, k, k4, npad, chunk, blocks = ip[0], ip[1], ip[2], ip[3], ip[4], ip[5], ip[6], ip[7]
    packed_at, rows_at, init_at, terms_at, sums_at = _bmm_layout(t, ip)
    packed, rows = _advance(bytesp, packed_at), _advance(bytesp, rows_at)
    init, terms, sums = _advance(intsp, init_at), _advance(intsp, terms_at), _advance(intsp, sums_at)
    held = -1               # the offset in b of the batch packed now
    for q in range(t * ip[8], min(batches * blocks, (t + 1) * ip[8])):
        i, r0 = q // blocks, (q % blocks) * chunk
        r1 = min(m, r0 + chunk)
        if ip[_HEAD + batches + i] != held:
            held = ip[_HEAD + batches + i]
            _pack_b(b, held, ip[11], ip[12], ip[13], k, n, k4, int8_pointer(packed), int32_pointer(init))
        _copy_a(a, ip[_HEAD + i], ip[9], ip[10], ip[13], ip[14], r0, r1, k, k4, int8_pointer(rows),
                int32_pointer(terms))
        _block_vnni(rows, packed, init, sums, 0, r1 - r0, k4, k4 // 4, npad, 0, npad // NR)
        _requantize_rows(int32_pointer(sums), int32_pointer(terms), npad, out, (i * m + r0) * n, r1 - r0, n,
                         ip[15], ip[16], ip[17], ip[18], ip[19])


@task_function()
def _bmm_plain(t, ap, bp, bytesp, intsp, outp, _a5, _a6, _a7, ip, _fp):
    """:func:`_bmm_vnni` in plain LLVM vector arithmetic."""
    a, b, out = int8_pointer(ap), int8_pointer(bp), int8_pointer(outp)
    batches, m, n, k, k4, npad, chunk, blocks = ip[0], ip[1], ip[2], ip[3], ip[4], ip[5], ip[6], ip[7]
    packed_at, rows_at, init_at, terms_at, sums_at = _bmm_layout(t, ip)
    packed, rows = _advance(bytesp, packed_at), _advance(bytesp, rows_at)
    init, terms, sums = _advance(intsp, init_at), _advance(intsp, terms_at), _advance(intsp, sums_at)
    held = -1
    for q in range(t * ip[8], min(batches * blocks, (t + 1) * ip[8])):
        i, r0 = q // blocks, (q % blocks) * chunk
        r1 = min(m, r0 + chunk)
        if ip[_HEAD + batches + i] != held:
            held = ip[_HEAD + batches + i]
            _pack_b(b, held, ip[11], ip[12], ip[13], k, n, k4, int8_pointer(packed), int32_pointer(init))
        _copy_a(a, ip[_HEAD + i], ip[9], ip[10], ip[13], ip[14], r0, r1, k, k4, int8_pointer(rows),
                int32_pointer(terms))
        _block_plain(rows, packed, init, sums, 0, r1 - r0, k4, k4 // 4, npad, 0, npad // NR)
        _requantize_rows(int32_pointer(sums), int32_pointer(terms), npad, out, (i * m + r0) * n, r1 - r0, n,
                         ip[15], ip[16], ip[17], ip[18], ip[19])


def _batch_offsets(shape: tuple, batch: tuple) -> np.ndarray:
    """Each output batch's element offset in an operand of ``shape`` (0 along the batch axes
    it broadcasts)."""
    lead = tuple(shape[:-2])
    index = np.arange(int(np.prod(lead, dtype=np.int64)), dtype=np.int64).reshape(lead)
    index = np.broadcast_to(index.reshape((1,) * (len(batch) - len(lead)) + lead), batch)
    return index.reshape(-1) * (shape[-1] * shape[-2])


def _work_split(batches: int, m: int, n: int, k: int, threads: int) -> tuple[int, int, int, int]:
    """``(rows per block, blocks per batch, blocks per task, tasks)``: one task for a small
    product; else whole batches shared out when there are enough of them, or each batch's
    rows cut in blocks, so that the threads get a few tasks each."""
    if threads < 2 or batches * m * n * k < _PARALLEL_MACS:
        return m, 1, batches, 1
    if batches >= _TASKS:
        per = -(-batches // _TASKS)
        return m, 1, per, -(-batches // per)
    chunk = -(-m // min(m, -(-_TASKS // batches)))
    blocks = -(-m // chunk)
    return chunk, blocks, 1, batches * blocks


@kernel("BATCH_MATMUL", quantized=True)
def quantized_batch_matmul(ctx: NodeContext):
    """int8 BATCH_MATMUL, any batch broadcast and adj_x / adj_y (see the module docstring);
    int16 and a K whose sums could overflow int32 keep the reference."""
    r = ctx.attrs.get("requant")
    a_shape, b_shape = tuple(ctx.inputs[0].shape), tuple(ctx.inputs[1].shape)
    if r is None or r.get("style") != "tflite" or np.dtype(r["dtype"]) != I8 or len(a_shape) < 2 \
            or len(b_shape) < 2 or any(np.dtype(s.dtype) != I8 for s in (*ctx.inputs[:2], ctx.outputs[0])):
        return None
    adj_x, adj_y = bool(ctx.attrs.get("adj_x")), bool(ctx.attrs.get("adj_y"))
    m, k = (a_shape[-1], a_shape[-2]) if adj_x else (a_shape[-2], a_shape[-1])
    n = b_shape[-2] if adj_y else b_shape[-1]
    batch = tuple(ctx.outputs[0].shape[:-2])
    batches = int(np.prod(batch, dtype=np.int64))
    if k > _MAX_K or min(m, n, k, batches) == 0:
        return None
    chunk, blocks, per_task, tasks = _work_split(batches, m, n, k, current_threads())
    k4, npad = -(-k // 4) * 4, -(-n // NR) * NR
    # Each task's scratch: packed b and rows of a (bytes); starting sums, row terms, sums (int32).
    task_bytes, task_ints = npad * k4 + chunk * k4, 4 * (npad + chunk + chunk * npad)
    if tasks * (task_bytes + task_ints) > _MAX_SCRATCH:
        return None
    # Strides in elements: a's along its rows and K, b's along K and N (the last two axes'
    # C order, swapped by adj).
    a_strides = (1, a_shape[-1]) if adj_x else (a_shape[-1], 1)
    b_strides = (1, b_shape[-1]) if adj_y else (b_shape[-1], 1)
    params = np.concatenate([
        np.array([batches, m, n, k, k4, npad, chunk, blocks, per_task, *a_strides, *b_strides, r["a_zp"], r["b_zp"],
                  int(r["multiplier"]), int(r["shift"]), r["zp"], r["lo"], r["hi"], task_bytes, task_ints], np.int64),
        _batch_offsets(a_shape, batch), _batch_offsets(b_shape, batch)])
    # (The node's own scratch: a model runs on one thread at a time.)
    scratch_bytes, scratch_ints = np.empty(tasks * task_bytes, np.int8), np.empty(tasks * task_ints // 4, np.int32)
    task = _bmm_vnni if VNNI else _bmm_plain

    def bind(inputs, outputs):
        return bind_task(task, tasks, (inputs[0], inputs[1], scratch_bytes, scratch_ints), (outputs[0],), params,
                         dtypes=(I8, I8, I8, np.dtype(np.int32), I8))
    return named(bindable(bind), "int8 batch matmul (packed GEMM)")
