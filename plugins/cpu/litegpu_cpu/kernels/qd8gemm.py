"""Dynamically quantized products: float rows times a constant int8 weight, float results.

The kernel of hybrid (dynamic-range) FULLY_CONNECTED, in XNNPACK's qd8-f32-qc8w arithmetic
(what LiteRT's default interpreter runs for these nodes, and what the op's hybrid reference
computes, :mod:`litegpu.ops.hybrid`):

1. each row of the float input is quantized to int8 with its own scale and zero point
   (:func:`_quantize_rows_task`, XNNPACK's f32 -> qd8 convert, float32 step by step);
2. the int8 rows times the packed weight: the K loop of :mod:`.qgemm`'s tiles
   (``vpdpbusd`` where the host has it), which sums ``(q + 128) w``; the epilogue takes
   ``(128 + zp_row) * sum_k w`` off to get the exact ``sum (q - zp) w``;
3. each sum to float32, times the row's scale, then one fused multiply-add with the
   column's weight scale and the bias, clamped by the fused activation, stored.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from litegpu.backend import NodeContext

from .common import clamp_bounds, optional_input
from .mathfn import maxnum32, minnum32, row_range32

from .packed import NR, clamp_vector, fma_function, load_vector, splat_vector, store_panel
from .qgemm import _ROW_PANELS, _SUMS, _TILE_PANELS, MR, VNNI, _task_share, pack, split, tile_sums
from .registry import bindable
from .tasks import bind_task, in_sequence, int8_pointer, int32_pointer, task_function

_I32 = ir.IntType(32)
_I64 = ir.IntType(64)


def _tile_codegen(vnni: bool, rows: int, panels: int):
    """The IR of a tile of :func:`.qgemm.tile_sums` whose sums are dequantized and stored as
    float32 (the module docstring's step 3)."""
    def codegen(context, builder, signature, args):
        (x_ptr, w_ptr, colsum_ptr, wscale_ptr, bias_ptr, rowscale_ptr, rowc_ptr, out_ptr,
         r_, last_, stride_, groups_, n_, p_, plast_, lo_, hi_) = args
        acc, row_of, jbs = tile_sums(builder, vnni, rows, panels, x_ptr, w_ptr, None, r_, last_, stride_,
                                     groups_, p_, plast_)
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


_tile_vnni, _row_vnni = _make_tile(True, MR, _TILE_PANELS), _make_tile(True, 1, _ROW_PANELS)
_tile_plain, _row_plain = _make_tile(False, MR, _TILE_PANELS), _make_tile(False, 1, _ROW_PANELS)


# One task function per instruction set, as in .qgemm: the VNNI one is never compiled on
# a host without it.
@task_function()
def _qd8_vnni(t, qp, wp, colsump, wscalep, biasp, rowscalep, rowcp, outp, ip, fp):
    """Task ``t`` of the product (``ip`` as :func:`.qgemm._qgemm_vnni`'s first eight; ``fp``:
    the clamp's lo, hi)."""
    r0, r1, p0, p1 = _task_share(t, ip)
    whole = r0 + (r1 - r0) // MR * MR
    for p in range(p0, p1, _TILE_PANELS):
        for r in range(r0, whole, MR):
            _tile_vnni(qp, wp, colsump, wscalep, biasp, rowscalep, rowcp, outp, r, r1 - 1, ip[3], ip[1], ip[2],
                       p, p1 - 1, fp[0], fp[1])
    for r in range(whole, r1):
        for p in range(p0, p1, _ROW_PANELS):
            _row_vnni(qp, wp, colsump, wscalep, biasp, rowscalep, rowcp, outp, r, r, ip[3], ip[1], ip[2],
                      p, p1 - 1, fp[0], fp[1])


@task_function()
def _qd8_plain(t, qp, wp, colsump, wscalep, biasp, rowscalep, rowcp, outp, ip, fp):
    """:func:`_qd8_vnni` in plain LLVM vector arithmetic."""
    r0, r1, p0, p1 = _task_share(t, ip)
    whole = r0 + (r1 - r0) // MR * MR
    for p in range(p0, p1, _TILE_PANELS):
        for r in range(r0, whole, MR):
            _tile_plain(qp, wp, colsump, wscalep, biasp, rowscalep, rowcp, outp, r, r1 - 1, ip[3], ip[1], ip[2],
                        p, p1 - 1, fp[0], fp[1])
    for r in range(whole, r1):
        for p in range(p0, p1, _ROW_PANELS):
            _row_plain(qp, wp, colsump, wscalep, biasp, rowscalep, rowcp, outp, r, r, ip[3], ip[1], ip[2],
                       p, p1 - 1, fp[0], fp[1])


@task_function()
def _quantize_rows_task(t, xp, qp, scalep, cp, _a4, _a5, _a6, _a7, ip, fp):
    """Rows ``t * chunk ..`` of float x [M, K] quantized into int8 q [M, K4] (zeros past K),
    as XNNPACK's ``xnn_qd8_asymmetric_quantization_params`` and f32 -> qd8 convert, every
    step in float32: the row's range widened to hold 0, ``inv = 255 / (max - min)`` (1
    for an empty range), the zero point from the end that loses less, rounded to nearest
    even; ``q = rint(x * inv) + zp``, saturated. Writes the row's scale ``1 / inv`` and
    ``128 + zp`` (the epilogue's correction factor) for each of the ``repeat`` product
    rows it feeds (1 for a fully connected layer; a convolution's image feeds all its
    output pixels). ``ip``: M, K, K4, chunk, repeat."""
    m, k, k4, chunk, repeat = ip[0], ip[1], ip[2], ip[3], ip[4]
    q, c = int8_pointer(qp), int32_pointer(cp)
    for r in range(t * chunk, min(m, (t + 1) * chunk)):
        row = r * k
        lo, hi = row_range32(xp, row, k, np.float32(0), np.float32(0))   # NaNs skipped (they quantize to zp)
        inv = np.float32(1) if lo == hi else np.float32(255) / (hi - lo)
        low_scaled, high_scaled = lo * inv, hi * inv
        if (np.float32(-128) + low_scaled) + (np.float32(127) + high_scaled) > np.float32(0):
            zp_real = np.float32(-128) - low_scaled
        else:
            zp_real = np.float32(127) - high_scaled
        zp = int(np.rint(min(max(zp_real, np.float32(-128)), np.float32(127))))
        zpf = np.float32(zp)
        for i in range(k):
            # rint(x * inv) + zp is exact in float32 wherever it lands inside [-128, 127]
            # (beyond, it saturates anyway), so the saturation is done in float and only
            # int8 values are converted. NaN quantizes to the zero point. (Selects and
            # llvm.minnum/maxnum: the loop vectorizes, in float32 lanes.)
            v = np.rint(xp[row + i] * inv)
            v = minnum32(maxnum32((v if v == v else np.float32(0)) + zpf, np.float32(-128)), np.float32(127))
            q[r * k4 + i] = np.int8(v)
        for i in range(k, k4):
            q[r * k4 + i] = 0
        for i in range(r * repeat, (r + 1) * repeat):
            scalep[i] = np.float32(1) / inv
            c[i] = 128 + zp


def bind_quantize_rows(x: np.ndarray, q: np.ndarray, scale: np.ndarray, correction: np.ndarray, threads: int,
                       repeat: int = 1):
    """The call quantizing each row of float x [M, K] into int8 q [M, K4] (K4 >= K, zeros
    past K) as XNNPACK does (:func:`_quantize_rows_task`), writing its scale and correction
    factor ``128 + zp`` into ``scale`` and ``correction`` [M * repeat] for each of the
    ``repeat`` product rows that follow from it; ``threads``: the numba threads the rows
    are cut for."""
    m, k = x.shape
    if q.shape[0] != m or q.shape[1] < k or scale.shape != (m * repeat,) or correction.shape != (m * repeat,):
        raise ValueError(f"quantizing rows {x.shape} x {repeat} given {q.shape}, {scale.shape}, {correction.shape}")
    # (From 4096 elements: BERT's 64 x 128 rows gain from two threads inside a plan's
    # parallel region, where an extra row of tasks costs well under a microsecond.)
    tasks = max(1, min(m, threads if m * k >= 1 << 12 else 1))
    chunk = -(-m // tasks)
    return bind_task(_quantize_rows_task, -(-m // chunk), (x,), (q, scale, correction),
                     np.array([m, k, q.shape[1], chunk, repeat], np.int64),
                     dtypes=(np.float32, np.int8, np.float32, np.int32))


class DynamicQuantizedMatmul:
    """``bind(x [M, K] float32, out [M, N] float32) -> call`` computing XNNPACK's
    qd8-f32-qc8w product of x with the constant int8 ``w_kn`` [K, N] (symmetric), float32
    ``weight_scale`` per column, float32 ``bias`` (or None), clamped to ``[lo, hi]``,
    packed here once; ``threads``: the numba threads the tasks are cut for.

    Products that read the same x (a transformer's query, key and value projections)
    need x quantized once: :meth:`read_rows_of` makes this product use another's
    quantized rows instead of quantizing x itself."""

    def __init__(self, w_kn: np.ndarray, weight_scale: np.ndarray, bias: np.ndarray | None, lo: float, hi: float,
                 threads: int, vnni: bool | None = None) -> None:
        k, n = w_kn.shape
        if w_kn.dtype != np.int8 or k == 0 or n == 0:
            raise ValueError(f"dynamically quantized product takes a non-empty int8 weight, not "
                             f"{w_kn.dtype} {w_kn.shape}")
        self.k, self.n, self.threads = k, n, threads
        self.weights = pack(w_kn)
        columns = self.weights.shape[0] * NR
        self.colsums = np.zeros(columns, np.int32)
        self.colsums[:n] = w_kn.astype(np.int64).sum(axis=0)
        self.weight_scale = np.zeros(columns, np.float32)
        self.weight_scale[:n] = np.broadcast_to(np.asarray(weight_scale, np.float32), (n,))
        self.bias = np.zeros(columns, np.float32)
        if bias is not None:
            self.bias[:n] = np.asarray(bias, np.float32).reshape(-1)
        self.clamp = np.array([lo, hi], np.float32)
        self.task = _qd8_vnni if (VNNI if vnni is None else vnni) else _qd8_plain
        self._rows: dict[int, tuple] = {}       # M -> x's quantized rows, their scales and corrections
        self._source: DynamicQuantizedMatmul | None = None

    def read_rows_of(self, source: "DynamicQuantizedMatmul") -> None:
        """Read the quantized rows ``source`` writes (same K) instead of quantizing x here.
        The caller promises that ``source`` runs first in every run, on the same x: the
        cpu backend pairs the products of one program that read one tensor."""
        if source.k != self.k or source is self:
            raise ValueError("products share quantized rows of one K only")
        self._source = source

    def rows(self, m: int) -> tuple:
        """The scratch x's quantized rows go into, for M rows: made once, so every binding
        of this product (and of those reading its rows) uses the same arrays."""
        if m not in self._rows:
            k4 = self.weights.shape[1] * 4
            self._rows[m] = (np.empty((m, k4), np.int8), np.empty(m, np.float32), np.empty(m, np.int32))
        return self._rows[m]

    def bind(self, x: np.ndarray, out: np.ndarray):
        """The call on these arrays: x quantized into :meth:`rows` (unless another product
        does it, see :meth:`read_rows_of`), then the product."""
        m = out.shape[0]
        if x.shape != (m, self.k) or out.shape != (m, self.n):
            raise ValueError(f"dynamically quantized product [M, {self.k}] -> [M, {self.n}] given {x.shape} -> "
                             f"{out.shape}")
        q, row_scale, row_c = (self._source or self).rows(m)
        product = self.bind_quantized(q, row_scale, row_c, out)
        if self._source is not None:
            return product
        return in_sequence([bind_quantize_rows(x, q, row_scale, row_c, self.threads), product])

    def bind_quantized(self, q: np.ndarray, row_scale: np.ndarray, row_c: np.ndarray, out: np.ndarray):
        """The product alone, on rows quantized elsewhere: int8 ``q`` [M, K4] (K rounded up
        to 4, zeros past K), each row's float32 scale and int32 correction factor ``128 +
        zp`` [M] (what :func:`bind_quantize_rows` writes). A convolution's rows are its
        im2col of an image quantized as a whole."""
        m, k4 = out.shape[0], self.weights.shape[1] * 4
        if q.shape != (m, k4) or row_scale.shape != (m,) or row_c.shape != (m,) or out.shape != (m, self.n):
            raise ValueError(f"dynamically quantized product [M, {k4}] -> [M, {self.n}] given {q.shape}, "
                             f"{row_scale.shape}, {row_c.shape} -> {out.shape}")
        rows = split(m, self.n, self.k, self.threads)
        params = np.array([m, k4 // 4, self.n, k4, *rows], np.int64)
        return bind_task(self.task, rows[1] * rows[3],
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
    import numba
    w = np.asarray(w_spec.value, np.int8)
    o, k = w.shape
    m = int(np.prod(ctx.inputs[0].shape)) // k
    lo, hi = clamp_bounds(ctx.attrs["activation"])
    product = DynamicQuantizedMatmul(np.ascontiguousarray(w.T), ctx.attrs["weight_scale"],
                                     None if bias_spec is None else bias_spec.value, lo, hi, numba.get_num_threads())
    run = bindable(lambda inputs, outputs: product.bind(inputs[0].reshape(m, k), outputs[0].reshape(m, o)))
    run.quantized_rows = product      # for the backend to pair products reading one x
    return run
