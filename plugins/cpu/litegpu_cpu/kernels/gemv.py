"""Products of a few rows with a constant weight (GEMVs): the FULLY_CONNECTED of MLP
heads, classifier tops and recurrent cells, ``out[M, O] = clamp(x[M, K] @ W[O, K].T + bias)``
for M up to :data:`MAX_ROWS`.

Such a product is bound by reading the weights (when they are large) or by the latency of
its chains of multiply-adds (when they are small), not by arithmetic. So W is packed into
panels of 64 output columns, ``[O / 64, K, 64]``: one K step of a panel is one contiguous
run of four vectors, the weights stream through the prefetchers in order, and the tile
(:func:`_panel_tile`, LLVM IR) keeps the panel's sums for two rows, eight independent
vector chains, in registers. Narrow, deep weights that would be padded by more than an
eighth keep W as it is and take dot products along K (:func:`_dot_columns`).

Measured on one Zen 4 core, a whole FULLY_CONNECTED call: 1x64x64 0.08 us against 0.65
for the earlier loop keeping its sums in memory (which :mod:`.misc` ran for small one-row
products), 1x20x64 0.05 against 0.33.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir

from ..jit import carray, intrinsic, njit, types
from .common import F32, clamp_bounds
from .gemm import SPLIT_MIN_MACS
from .packed import NR, carried_loop, clamp_vector, fma_function, load_vector, splat_vector, store_vector
from .tasks import bind_task, task_function

# Products of at most this many rows run here.
MAX_ROWS = 4
# Output columns per panel: four vectors.
PANEL = 4 * NR
# Weights this small (floats, padded) stay in panels however much padding they carry:
# they sit in cache, and the tile's time is its chain latency, not its reads.
_SMALL_WEIGHTS = 1 << 16


def _panel_codegen(context, builder, signature, args):
    """The IR of :func:`_tile_1` and :func:`_tile_2` (their row count: the offsets given)."""
    x_ptr, w_ptr, b_ptr, d_ptr, depth_, w0_, j0_, lo_, hi_, *offsets = args
    rows = len(offsets) // 2
    x_at, d_at = offsets[:rows], offsets[rows:]
    i64 = ir.IntType(64)
    fma = fma_function(builder)
    vectors = PANEL // NR
    bias = [load_vector(builder, b_ptr, builder.add(j0_, ir.Constant(i64, v * NR))) for v in range(vectors)]

    def step(q, sums):
        """One K step: the panel's four vectors of W, each row's x broadcast, FMAs."""
        w_at = builder.add(w0_, builder.mul(q, ir.Constant(i64, PANEL)))
        w = [load_vector(builder, w_ptr, builder.add(w_at, ir.Constant(i64, v * NR))) for v in range(vectors)]
        out = []
        for r, x_i in enumerate(x_at):
            xv = splat_vector(builder, builder.load(builder.gep(x_ptr, [builder.add(x_i, q)])))
            out += [builder.call(fma, [xv, wv, a]) for a, wv in zip(sums[r * vectors:(r + 1) * vectors], w)]
        return out

    flat = carried_loop(builder, depth_, bias * rows, step, "panel.k")
    acc = [flat[r * vectors:(r + 1) * vectors] for r in range(rows)]
    lo_v, hi_v = splat_vector(builder, lo_), splat_vector(builder, hi_)
    for row, d_i in zip(acc, d_at):
        for v, a in enumerate(row):
            store_vector(builder, clamp_vector(builder, a, lo_v, hi_v), d_ptr,
                         builder.add(d_i, ir.Constant(i64, v * NR)))
    return context.get_dummy_value()


_TILE_HEAD = (types.CPointer(types.float32),) * 4 + (types.int64,) * 3 + (types.float32,) * 2


@intrinsic
def _tile_1(typingctx, xp, wp, bp, dp, depth, w0, j0, lo, hi, x0, d0):
    """Row ``x0`` (a float offset into ``xp``) times the panel at float offset ``w0`` of the
    packed weights ``wp`` (``depth`` steps of 64 floats), plus the 64 biases of ``bp`` from
    ``j0``, clamped to ``lo .. hi``, stored at float offset ``d0`` of ``dp``. Its four
    vector sums start at the bias and stay in registers over all of K; NaN propagates."""
    return types.void(*_TILE_HEAD, types.int64, types.int64), _panel_codegen


@intrinsic
def _tile_2(typingctx, xp, wp, bp, dp, depth, w0, j0, lo, hi, x0, x1, d0, d1):
    """:func:`_tile_1` for two rows at once (``x0``, ``x1`` to ``d0``, ``d1``): each panel
    step loaded once for both, eight sums in registers."""
    return types.void(*_TILE_HEAD, *[types.int64] * 4), _panel_codegen


# Reassociation lets each dot product run in vector lanes (LiteRT's kernels reorder these
# sums too).
@njit(cache=True, fastmath={"reassoc", "contract", "nsz"})
def _dot_columns(x, w, bias, out, j, stop, lo, hi):
    """Columns ``j .. stop`` of ``out = clamp(x @ w.T + bias)``, ``w`` [O, K], as dot products
    along K. Four columns at a time: four independent sums in flight, where one sum's
    chain of dependent vector adds left the core waiting (1x1536x128: 13 -> 9.4 us)."""
    rows, depth = x.shape
    while j < stop:
        if j + 4 <= stop:
            for r in range(rows):
                s0 = s1 = s2 = s3 = np.float32(0)
                for q in range(depth):
                    v = x[r, q]
                    s0 += v * w[j, q]
                    s1 += v * w[j + 1, q]
                    s2 += v * w[j + 2, q]
                    s3 += v * w[j + 3, q]
                out[r, j] = min(max(s0 + bias[j], lo), hi)
                out[r, j + 1] = min(max(s1 + bias[j + 1], lo), hi)
                out[r, j + 2] = min(max(s2 + bias[j + 2], lo), hi)
                out[r, j + 3] = min(max(s3 + bias[j + 3], lo), hi)
            j += 4
            continue
        for r in range(rows):
            s0 = np.float32(0)
            for q in range(depth):
                s0 += x[r, q] * w[j, q]
            out[r, j] = min(max(s0 + bias[j], lo), hi)
        j += 1


@task_function()
def _gemv_task(t, xp, wp, biasp, outp, tailp, _a5, _a6, _a7, ip, fp):
    """Part ``t`` of ``ip[3]`` of the output columns of ``out = clamp(x @ w.T + bias)``
    for a few rows ``x`` [M, K]; ``ip``: M, K, O, parts, then 1 for ``w`` packed in panels
    (:func:`panels`; ``bias`` padded to whole panels, ``tailp`` scratch rows for a last
    panel wider than what is left of the output), 0 for ``w`` [O, K]
    (:func:`_dot_columns`); ``fp``: lo, hi. Rows go two at a time (the panel read once for
    both), an odd last row alone."""
    rows, depth, width, parts = ip[0], ip[1], ip[2], ip[3]
    lo, hi = fp[0], fp[1]
    if not ip[4]:
        part = (width + parts - 1) // parts
        _dot_columns(carray(xp, (rows, depth)), carray(wp, (width, depth)), biasp, carray(outp, (rows, width)),
                     t * part, min(width, (t + 1) * part), lo, hi)
        return
    count = (width + PANEL - 1) // PANEL
    part = (count + parts - 1) // parts
    for p in range(t * part, min(count, (t + 1) * part)):
        j0 = p * PANEL
        w0 = p * depth * PANEL
        # A last panel wider than what is left of the output goes through the scratch rows.
        whole = j0 + PANEL <= width
        dst, stride, at = (outp, width, j0) if whole else (tailp, PANEL, np.int64(0))
        for r in range(0, rows - 1, 2):
            _tile_2(xp, wp, biasp, dst, depth, w0, j0, lo, hi, r * depth, (r + 1) * depth, r * stride + at,
                    (r + 1) * stride + at)
        if rows % 2:
            _tile_1(xp, wp, biasp, dst, depth, w0, j0, lo, hi, (rows - 1) * depth, (rows - 1) * stride + at)
        if not whole:
            for r in range(rows):
                for c in range(width - j0):
                    outp[r * width + j0 + c] = tailp[r * PANEL + c]


def panels(w_ok: np.ndarray) -> np.ndarray:
    """``w_ok`` [O, K] as [ceil(O / 64), K, 64] panels of 64 output columns (zeros past O)."""
    o, k = w_ok.shape
    padded = np.zeros((-(-o // PANEL) * PANEL, k), F32)
    padded[:o] = w_ok
    return np.ascontiguousarray(padded.reshape(-1, PANEL, k).transpose(0, 2, 1))


def gemv(m: int, k: int, w_ok: np.ndarray, bias: np.ndarray, activation: str):
    """``bind(x [M, K], out [M, O]) -> call`` computing ``out = clamp(x @ w_ok.T + bias)``
    for ``m`` up to :data:`MAX_ROWS` as one :func:`_gemv_task`, its output columns in two
    halves (one per thread) when it is big enough to share."""
    o = w_ok.shape[0]
    floats = np.array(clamp_bounds(activation), F32)
    parts = 2 if m * k * o >= SPLIT_MIN_MACS else 1
    padded = -(-o // PANEL) * PANEL
    panelled = (padded - o) * 8 <= o or padded * k <= _SMALL_WEIGHTS
    if panelled:
        weights = panels(w_ok)
        bias = np.concatenate([np.asarray(bias, F32), np.zeros(padded - o, F32)])
    else:
        weights = np.ascontiguousarray(w_ok, dtype=F32)
        bias = np.ascontiguousarray(bias, dtype=F32)
    tail = np.empty(MAX_ROWS * PANEL, F32)
    params = np.array([m, k, o, parts, panelled], np.int64)
    return lambda x2, out2: bind_task(_gemv_task, parts, (x2, weights, bias), (out2, tail), params, floats)
