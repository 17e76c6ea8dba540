"""Products of a few rows with a constant weight (GEMVs): the FULLY_CONNECTED of MLP
heads, classifier tops and recurrent cells, ``out[M, O] = clamp(x[M, K] @ W[O, K].T + bias)``
for M up to :data:`MAX_ROWS`.

Such a product is bound by reading the weights (when they are large) or by the latency of
its chains of multiply-adds (when they are small), not by arithmetic. W is in the float
GEMM's panels of 16 output columns, ``[O / 16, K, 16]`` (:func:`.packed.pack`: one packing
serves a decoder's prefill, which runs the GEMM, and its decode steps, which run this), and
the tile (:func:`_panel_codegen`, LLVM IR) takes four panels side by side, the weights
streaming through the prefetchers in four runs, keeping their sums for two rows, eight
independent vector chains, in registers. Up to three panels left over take a tile of one.

Each output is XNNPACK's one chain: from the bias, one fused multiply-add per K step in
order, as its ``f32_gemm`` microkernels add (LiteRT's bits). Dot products along K in
vector lanes were ~8x faster for a narrow, deep W (16x1536) and a few ulps off, which a
hybrid layer after it turns into a whole quantization step.

Measured on one Zen 4 core, a whole FULLY_CONNECTED call: 1x64x64 0.08 us against 0.65
for the earlier loop keeping its sums in memory (which :mod:`.misc` ran for small one-row
products), 1x20x64 0.05 against 0.33.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir

from ..jit import intrinsic, njit, types
from .common import F32, clamp_bounds
from .gemm import SPLIT_MIN_MACS
from .packed import NR, carried_loop, clamp_vector, fma_function, load_vector, pack, splat_vector, store_vector
from .tasks import bind_task, task_function

# Products of at most this many rows run here.
MAX_ROWS = 4
# Panels a wide tile takes side by side.
WIDE = 4
# K steps ahead of the tile each panel's weights are fetched (16 cache lines).
AHEAD = 16


def _panel_codegen(vectors: int):
    """The IR of a tile over ``vectors`` panels side by side (see :func:`_tiles`; its row
    count: the offsets given)."""
    def codegen(context, builder, signature, args):
        x_ptr, w_ptr, b_ptr, d_ptr, depth_, w0_, j0_, lo_, hi_, *offsets = args
        rows = len(offsets) // 2
        x_at, d_at = offsets[:rows], offsets[rows:]
        i64 = ir.IntType(64)
        fma = fma_function(builder)
        bias = [load_vector(builder, b_ptr, builder.add(j0_, ir.Constant(i64, v * NR))) for v in range(vectors)]
        panel_floats = builder.mul(depth_, ir.Constant(i64, NR))
        byte_ptr = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        prefetch = builder.module.declare_intrinsic("llvm.prefetch", fnty=ir.FunctionType(
            ir.VoidType(), [byte_ptr, i32, i32, i32]))

        def step(q, sums):
            """One K step: a vector of W from each panel, each row's x broadcast, FMAs; each
            panel's run fetched :data:`AHEAD` steps ahead, as the tile reads four runs at
            once (on the 100M float decoder the step stayed within noise of one 64-column
            run: 9.4-9.9 against 9.4-9.7 ms)."""
            w_at = builder.add(w0_, builder.mul(q, ir.Constant(i64, NR)))
            at = [builder.add(w_at, builder.mul(panel_floats, ir.Constant(i64, v))) for v in range(vectors)]
            for a in at:
                ahead = builder.gep(w_ptr, [builder.add(a, ir.Constant(i64, AHEAD * NR))])
                builder.call(prefetch, [builder.bitcast(ahead, byte_ptr), ir.Constant(i32, 0), ir.Constant(i32, 3),
                                        ir.Constant(i32, 1)])
            w = [load_vector(builder, w_ptr, a) for a in at]
            out = []
            for r, x_i in enumerate(x_at):
                xv = splat_vector(builder, builder.load(builder.gep(x_ptr, [builder.add(x_i, q)])))
                out += [builder.call(fma, [xv, wv, a]) for a, wv in zip(sums[r * vectors:(r + 1) * vectors], w)]
            return out

        flat = carried_loop(builder, depth_, bias * rows, step, "panel.k")
        lo_v, hi_v = splat_vector(builder, lo_), splat_vector(builder, hi_)
        for r, d_i in enumerate(d_at):
            for v, a in enumerate(flat[r * vectors:(r + 1) * vectors]):
                store_vector(builder, clamp_vector(builder, a, lo_v, hi_v), d_ptr,
                             builder.add(d_i, ir.Constant(i64, v * NR)))
        return context.get_dummy_value()
    return codegen


_TILE_HEAD = (types.CPointer(types.float32),) * 4 + (types.int64,) * 3 + (types.float32,) * 2


def _tiles(vectors: int):
    """The one- and two-row tiles over ``vectors`` panels side by side."""
    codegen = _panel_codegen(vectors)

    @intrinsic
    def tile_1(typingctx, xp, wp, bp, dp, depth, w0, j0, lo, hi, x0, d0):
        """Row ``x0`` (a float offset into ``xp``) times the panels from float offset ``w0`` of
        the packed weights ``wp`` (``depth`` steps of 16 floats each), plus their biases from
        ``bp[j0]``, clamped to ``lo .. hi``, stored at float offset ``d0`` of ``dp``. Its
        vector sums start at the bias and stay in registers over all of K; NaN propagates."""
        return types.void(*_TILE_HEAD, types.int64, types.int64), codegen

    @intrinsic
    def tile_2(typingctx, xp, wp, bp, dp, depth, w0, j0, lo, hi, x0, x1, d0, d1):
        """``tile_1`` for two rows at once (``x0``, ``x1`` to ``d0``, ``d1``): each step of
        the panels loaded once for both."""
        return types.void(*_TILE_HEAD, *[types.int64] * 4), codegen
    return tile_1, tile_2


_wide_1, _wide_2 = _tiles(WIDE)
_one_1, _one_2 = _tiles(1)


@njit(cache=True, inline="always")
def _panel_range(xp, wp, biasp, outp, tailp, rows, depth, width, p0, p1, lo, hi):
    """Panels ``p0 .. p1`` of ``out``: four at a time while they are whole, the rest one by
    one; two rows at a time (the weights read once for both), an odd last row alone; a
    last panel wider than what is left of the output through the scratch rows ``tailp``."""
    p = p0
    while p < p1:
        j0 = p * NR
        w0 = p * depth * NR
        wide = p + WIDE <= p1 and j0 + WIDE * NR <= width
        whole = j0 + NR <= width
        dst, stride, at = (outp, width, j0) if whole else (tailp, NR, np.int64(0))
        for r in range(0, rows - 1, 2):
            if wide:
                _wide_2(xp, wp, biasp, dst, depth, w0, j0, lo, hi, r * depth, (r + 1) * depth, r * stride + at,
                        (r + 1) * stride + at)
            else:
                _one_2(xp, wp, biasp, dst, depth, w0, j0, lo, hi, r * depth, (r + 1) * depth, r * stride + at,
                       (r + 1) * stride + at)
        if rows % 2:
            if wide:
                _wide_1(xp, wp, biasp, dst, depth, w0, j0, lo, hi, (rows - 1) * depth, (rows - 1) * stride + at)
            else:
                _one_1(xp, wp, biasp, dst, depth, w0, j0, lo, hi, (rows - 1) * depth, (rows - 1) * stride + at)
        if not whole:
            for r in range(rows):
                for c in range(width - j0):
                    outp[r * width + j0 + c] = tailp[r * NR + c]
        p += WIDE if wide else 1


@task_function()
def _gemv_task(t, xp, wp, biasp, outp, tailp, _a5, _a6, _a7, ip, fp):
    """Part ``t`` of ``ip[3]`` of the output panels of ``out = clamp(x @ w.T + bias)`` for a
    few rows ``x`` [M, K]; ``ip``: M, K, O, parts (``w``: :func:`.packed.pack`'s panels;
    ``bias`` padded to whole panels, ``tailp`` scratch rows for a last panel wider than
    what is left of the output); ``fp``: lo, hi. A part's panels are whole wide tiles but
    the last part's."""
    rows, depth, width, parts = ip[0], ip[1], ip[2], ip[3]
    count = (width + NR - 1) // NR
    share = (count + parts - 1) // parts
    part = (share + WIDE - 1) // WIDE * WIDE
    _panel_range(xp, wp, biasp, outp, tailp, rows, depth, width, t * part, min(count, (t + 1) * part), fp[0], fp[1])


def gemv(m: int, k: int, w_ok: np.ndarray, bias: np.ndarray, activation: str, packed: np.ndarray | None = None):
    """``bind(x [M, K], out [M, O]) -> call`` computing ``out = clamp(x @ w_ok.T + bias)``
    for ``m`` up to :data:`MAX_ROWS` as one :func:`_gemv_task`, its output panels in two
    parts (one per thread) when it is big enough to share. ``packed``: :func:`.packed.pack`
    of ``w_ok.T``, where it is made already."""
    o = w_ok.shape[0]
    floats = np.array(clamp_bounds(activation), F32)
    parts = 2 if m * k * o >= SPLIT_MIN_MACS else 1
    weights = pack(w_ok.T) if packed is None else packed
    bias = np.concatenate([np.asarray(bias, F32), np.zeros(weights.shape[0] * NR - o, F32)])
    tail = np.empty(MAX_ROWS * NR, F32)
    params = np.array([m, k, o, parts], np.int64)
    return lambda x2, out2: bind_task(_gemv_task, parts, (x2, weights, bias), (out2, tail), params, floats)
