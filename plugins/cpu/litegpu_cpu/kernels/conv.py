"""Convolutions: CONV_2D (the packed GEMM of :mod:`.packed`: directly for 1x1, as an
implicit GEMM over the padded input otherwise; im2col + GEMM where that does not fit) and
TRANSPOSE_CONV (a GEMM + a gather task). DEPTHWISE_CONV_2D is in :mod:`.depthwise`.

Layouts are TFLite's: activations NHWC, CONV_2D filter [O, KH, KW, I], depthwise
filter [1, KH, KW, I*M], transpose-conv filter [O, KH, KW, I]. Weights are repacked
once, at compile time, into the layout the GEMM wants.
"""
from __future__ import annotations

import numpy as np

from litegpu.backend import NodeContext

from ..jit import carray
from .common import (F32, clamp_bounds, constant_bias, transpose_pad_before,
                     window_geometry)
from . import gemm
from .misc import constant_product
from .packed import MR, PackedMatmul, packed_matmul
from .registry import bindable, kernel
from .tasks import bind_task, bound_tasks, in_sequence, row_tasks, task_function
from .threads import current as current_threads, ensure_gemm_policy

# Rows of the im2col matrix built per GEMM call: bounds the scratch (and keeps it
# nearer the caches) on big feature maps; small layers take one block.
_IM2COL_BLOCK_BYTES = 4 << 20


# Output pixels per im2col task: few enough for an even split, enough to amortize a task.
_IM2COL_TASK_ROWS = 64


@task_function()
def _im2col_task(t, xp, colsp, _a2, _a3, _a4, _a5, _a6, _a7, ip, _fp):
    """Rows ``t*64 ..`` of :func:`im2col`'s matrix: ``cols[r, (kh*KW + kw)*C + c]`` for
    output pixel ``row0 + r`` (flattened over N, OH, OW) is the input value under tap
    (kh, kw), 0 in padding. When a filter row lies inside the image (dilation 1) its
    ``KW*C`` values are one contiguous run, copied as such. ``ip``: N, H, W, C, row0,
    rows, OH, OW, KH, KW, sh, sw, dh, dw, pt, pl."""
    q = carray(ip, 16)
    n_size, h, w, c_size, row0, rows, oh_size, ow_size = q[0], q[1], q[2], q[3], q[4], q[5], q[6], q[7]
    kh_size, kw_size, sh, sw, dh, dw, pt, pl = q[8], q[9], q[10], q[11], q[12], q[13], q[14], q[15]
    x = carray(xp, n_size * h * w * c_size)
    span = kw_size * c_size
    cols = carray(colsp, (rows, kh_size * span))
    per_image = oh_size * ow_size
    for r in range(t * _IM2COL_TASK_ROWS, min(rows, (t + 1) * _IM2COL_TASK_ROWS)):
        p = row0 + r
        n = p // per_image
        q2 = p - n * per_image
        oh = q2 // ow_size
        ow = q2 - oh * ow_size
        iw0 = ow * sw - pl
        inside_w = dw == 1 and iw0 >= 0 and iw0 + kw_size <= w
        for kh in range(kh_size):
            ih = oh * sh - pt + kh * dh
            col = kh * span
            if ih < 0 or ih >= h:
                for j in range(span):
                    cols[r, col + j] = 0.0
            elif inside_w:
                base = ((n * h + ih) * w + iw0) * c_size
                for j in range(span):
                    cols[r, col + j] = x[base + j]
            else:
                for kw in range(kw_size):
                    iw = iw0 + kw * dw
                    if 0 <= iw < w:
                        base = ((n * h + ih) * w + iw) * c_size
                        for c in range(c_size):
                            cols[r, col + c] = x[base + c]
                    else:
                        for c in range(c_size):
                            cols[r, col + c] = 0.0
                    col += c_size


def im2col(x: np.ndarray, x_shape: tuple, cols: np.ndarray, row0: int, oh: int, ow: int, kh: int, kw: int,
           sh: int, sw: int, dh: int, dw: int, pt: int, pl: int):
    """A call of no arguments filling ``cols`` (C-contiguous [rows, KH*KW*C]) with the
    im2col rows of output pixels ``row0 ..`` (:func:`_im2col_task`) from ``x``, the NHWC
    input of ``x_shape``, C-contiguous, over the plan's threads."""
    rows = cols.shape[0]
    params = np.array([*x_shape, row0, rows, oh, ow, kh, kw, sh, sw, dh, dw, pt, pl], np.int64)
    tasks = (rows + _IM2COL_TASK_ROWS - 1) // _IM2COL_TASK_ROWS
    return bound_tasks(_im2col_task, tasks, (x, cols), params)


@task_function()
def _pad_task(t, xp, rowsp, _a2, _a3, _a4, _a5, _a6, _a7, ip, _fp):
    """Input row ``t`` of one NHWC image (its first ``cols`` pixels) into the interior of
    the zero-bordered padded image ``rows`` (``wp`` pixels wide); the border is never
    written, so it stays 0. ``ip``: W, C, pt, pl, wp, cols."""
    w, c, pt, pl, wp, cols = ip[0], ip[1], ip[2], ip[3], ip[4], ip[5]
    dst = ((t + pt) * wp + pl) * c
    src = t * w * c
    for j in range(cols * c):
        rowsp[dst + j] = xp[src + j]


def _implicit_conv(x_shape, w_value, bias, lo, hi, out_shape, geometry):
    """A conv as one implicit GEMM over the zero-padded input (no im2col): in the padded
    image, ``wp`` pixels a row, output pixel ``(y, x)`` reads pixel ``y * sh * wp + x * sw
    + offset`` under each filter tap, so :class:`.packed.PackedMatmul` with one offset
    per tap and an output row per segment computes it from the padded pixels directly
    (cheaper than im2col + BLAS: 172x264x8 -> 1, 5x5: 1.9 against 7.9 ms). None when
    output rows are shorter than a tile or the padding is negative."""
    n, h, w, c = x_shape
    o, kh, kw, _ = w_value.shape
    _, oh, ow, _ = out_shape
    sh, sw, dh, dw, pt, pl = geometry
    if pt < 0 or pl < 0 or ow < MR or oh < 1 or n < 1:
        return None
    hp, wp = (oh - 1) * sh + (kh - 1) * dh + 1, (ow - 1) * sw + (kw - 1) * dw + 1
    # Input rows and columns past the frame are never read (VALID with a remainder).
    rows_in, cols_in = max(0, min(h, hp - pt)), max(0, min(w, wp - pl))
    # One tap per filter row where its KW pixels are contiguous (dilation 1 along the width):
    # KW * C values in one run, rather than KW runs of C (1x512 over 1 channel: 512 runs of 1).
    offsets = [a * dh * wp for a in range(kh)] if dw == 1 else \
        [a * dh * wp + b * dw for a in range(kh) for b in range(kw)]
    wmat = np.asarray(w_value, F32).transpose(1, 2, 3, 0).reshape(kh * kw * c, o)   # [T*C, O]
    product = PackedMatmul(wmat, bias, lo, hi, current_threads(), offsets)
    rows = np.zeros((hp * wp, c), F32)
    pad = np.array([w, c, pt, pl, wp, cols_in], np.int64)
    segments = (ow, sh * wp, sw)

    def bind_implicit(inputs, outputs):
        x = np.ascontiguousarray(inputs[0], dtype=F32).reshape(n, h * w * c)
        out = outputs[0].reshape(n, oh * ow, o)
        calls = []
        for i in range(n):
            calls += [bind_task(_pad_task, rows_in, (x[i],), (rows,), pad), product.bind(rows, out[i], segments)]
        return in_sequence(calls)
    return bindable(bind_implicit)


def _tile_use(rows: int) -> float:
    """The share of the GEMM's ``MR``-row tiles that ``rows`` rows fill (0 for none)."""
    return rows / (-(-rows // MR) * MR) if rows > 0 else 0.0


def _im2col_fills_tiles_better(m: int, ow: int, o: int) -> bool:
    """True when the implicit GEMM's rows of ``ow`` pixels fill under 80% of its tiles (each
    output row ends in a tile moved back over rows it already computed: 7 pixels are a tile
    of 6 and one recomputing 5) and im2col's one matrix of ``m`` rows fills them clearly
    better, and the product is wide enough (``o`` outputs) that im2col's copy costs little
    beside it. (At 32 pixels, 89% of the tiles, unet_small's 32x32 convs ran slower
    through im2col's 4.7 MB of columns.)"""
    return o >= 64 and _tile_use(ow) < 0.8 and _tile_use(m) > _tile_use(ow) + 0.1


@kernel("CONV_2D")
def conv2d(ctx: NodeContext):
    """CONV_2D as GEMM, bias and clamp in its epilogue: 1x1 stride-1 convs multiply the
    input directly; the others run an implicit GEMM over the padded input
    (:func:`_implicit_conv`: against im2col + GEMM, 2 threads, 224x224x3 -> 16 3x3/2 99 /
    352 us, 112x112x32 -> 64 3x3/2 633 / 980 us, 128x128x16 -> 16 3x3/1 385 / 1148 us);
    where that does not fit (output rows shorter than a tile) or fills the GEMM's tiles
    much worse than one matrix would (a small image: :func:`_im2col_fills_tiles_better`;
    ResNet-18's 7x7x512 3x3 convs 1.80 -> 1.32 ms on 2 threads) im2col blocks into a
    scratch matrix.

    Every GEMM is [pixels, K] x [K, O], also for few output channels: computing it
    transposed and storing the transpose was slower with numpy 2.4's OpenBLAS on this
    VM (9216x8 -> 32: 432 us against 56; 12544x27 -> 32: 291 against 182), the
    transposing store alone costing up to 380 us where the pixel count is a multiple of
    1024 (every strided read landing in one cache set)."""
    w_spec = ctx.inputs[1]
    bias = constant_bias(ctx, w_index=1, x_index=0, bias_index=2)
    if bias is None:
        return None
    attrs = ctx.attrs
    n, h, w, c = ctx.inputs[0].shape
    o, kh, kw, ci = w_spec.shape
    _, oh, ow, _ = ctx.outputs[0].shape
    if ci != c:
        return None    # grouped conv: leave it to the reference
    sh, sw, dh, dw, pt, pl = window_geometry(attrs, h, w, kh, kw)
    k = kh * kw * c
    m = n * oh * ow
    ensure_gemm_policy()
    wmat = np.ascontiguousarray(np.asarray(w_spec.value, dtype=F32).reshape(o, k).T)   # [K, O]
    lo, hi = clamp_bounds(attrs["activation"])
    epilogue = (bias, lo, hi)   # applied by the GEMM itself, per thread on its half

    pointwise = kh == 1 and kw == 1 and sh == 1 and sw == 1 and pt == 0 and pl == 0 and (oh, ow) == (h, w)
    if not pointwise and not _im2col_fills_tiles_better(m, ow, o):
        implicit = _implicit_conv((n, h, w, c), w_spec.value, bias, lo, hi, (n, oh, ow, o),
                                  (sh, sw, dh, dw, pt, pl))
        if implicit is not None:
            return implicit
    if pointwise:
        # A 1x1 conv is an FC: few-row kernels on a few pixels (squeeze-excite, a conv
        # classifier head), else the packed GEMM where it fits.
        product = constant_product(m, k, wmat.T, bias, attrs["activation"])
        if product is not None:
            return bindable(lambda inputs, outputs: product(inputs[0].reshape(m, c), outputs[0].reshape(m, o)))
        how = gemm.plan(m, o, k)
        return bindable(lambda inputs, outputs: gemm.bind_matmul(
            inputs[0].reshape(m, c), wmat, outputs[0].reshape(m, o), how, epilogue=epilogue))

    block = max(1, min(m, _IM2COL_BLOCK_BYTES // (4 * k)))
    cols = np.empty((block, k), F32)
    blocks = [(r0, min(block, m - r0)) for r0 in range(0, m, block)]
    packed = packed_matmul(wmat, bias, lo, hi, min(m, MR))

    def product(rows: np.ndarray, out_rows: np.ndarray):
        """``out_rows = clamp(rows @ wmat + bias)``: packed where it fits (a short last block may not)."""
        if packed is not None and rows.shape[0] >= MR:
            return packed.bind(rows, out_rows)
        return gemm.bind_matmul(rows, wmat, out_rows, gemm.plan(rows.shape[0], o, k), epilogue=epilogue)

    def bind_im2col(inputs, outputs):
        x = np.ascontiguousarray(inputs[0], dtype=F32)
        out2 = outputs[0].reshape(m, o)
        calls = []
        for r0, rows in blocks:
            calls.append(im2col(x, (n, h, w, c), cols[:rows], r0, oh, ow, kh, kw, sh, sw, dh, dw, pt, pl))
            calls.append(product(cols[:rows], out2[r0:r0 + rows]))
        return in_sequence(calls)
    return bindable(bind_im2col)


# Reassociation and FMA contraction only: NaN and inf still propagate as in the reference.
_CONTRACT = {"contract", "reassoc", "nsz"}


@task_function()
def _col2im_task(t, colsp, biasp, accp, outp, _a4, _a5, _a6, _a7, ip, fp):
    """Transpose-conv gather, output rows ``t * chunk ..`` (image-major; ``ip``: N*OH,
    chunk, H, W, OH, OW, O, KH, KW, SH, SW, PT, PL; ``fp``: lo, hi): ``out[n,oh,ow,:] =
    bias + sum cols[pixel(ih,iw), tap(kh,kw), :]`` over the taps with ``oh = ih*sh - pt +
    kh`` (and the same along w), added in (kh, kw) order and clamped to [lo, hi].
    ``cols`` is [N*H*W, KH*KW*O]; ``acc`` one row of O per task."""
    h, w, oh_size, ow_size, o_size = ip[2], ip[3], ip[4], ip[5], ip[6]
    kh_size, kw_size, sh, sw, pt, pl = ip[7], ip[8], ip[9], ip[10], ip[11], ip[12]
    lo, hi = fp[0], fp[1]
    acc = t * o_size
    row_length = kh_size * kw_size * o_size
    for r in range(t * ip[1], min(ip[0], (t + 1) * ip[1])):
        n, oh = r // oh_size, r % oh_size
        for ow in range(ow_size):
            for o in range(o_size):
                accp[acc + o] = biasp[o]
            for kh in range(kh_size):
                y = oh + pt - kh
                if y < 0 or y % sh != 0 or y // sh >= h:
                    continue
                for kw in range(kw_size):
                    u = ow + pl - kw
                    if u < 0 or u % sw != 0 or u // sw >= w:
                        continue
                    src = ((n * h + y // sh) * w + u // sw) * row_length + (kh * kw_size + kw) * o_size
                    for o in range(o_size):
                        accp[acc + o] += colsp[src + o]
            at = (r * ow_size + ow) * o_size
            for o in range(o_size):
                outp[at + o] = min(max(accp[acc + o], lo), hi)


# Transpose convs of at least this many outputs gather in several tasks.
_COL2IM_PARALLEL = 1 << 14


@kernel("TRANSPOSE_CONV")
def transpose_conv(ctx: NodeContext):
    """TRANSPOSE_CONV: inputs (output_shape, weights, x, bias?)."""
    return _transpose_conv(ctx, x_index=2, w_index=1, bias_index=3)


@kernel("Convolution2DTransposeBias")
def transpose_conv_bias(ctx: NodeContext):
    """MediaPipe's Convolution2DTransposeBias: inputs (x, weights, bias)."""
    return _transpose_conv(ctx, x_index=0, w_index=1, bias_index=2)


def _transpose_conv(ctx: NodeContext, x_index: int, w_index: int, bias_index: int):
    """One GEMM of the input against all taps, then a gather per output pixel."""
    w_spec = ctx.inputs[w_index]
    bias = constant_bias(ctx, w_index, x_index, bias_index)
    if bias is None:
        return None
    attrs = ctx.attrs
    n, h, w, c = ctx.inputs[x_index].shape
    o, kh, kw, ci = w_spec.shape
    _, oh, ow, _ = ctx.outputs[0].shape
    if ci != c:
        return None
    sh, sw = attrs["stride"]
    pt = transpose_pad_before(attrs["padding"], oh, kh, sh)
    pl = transpose_pad_before(attrs["padding"], ow, kw, sw)
    # [O, KH, KW, I] -> [I, KH*KW*O] so cols = x @ wmat has the taps of one pixel in a row.
    wmat = np.ascontiguousarray(np.asarray(w_spec.value, dtype=F32).transpose(3, 1, 2, 0).reshape(c, kh * kw * o))
    activation = attrs.get("activation", "NONE")
    lo, hi = clamp_bounds(activation)
    m = n * h * w
    cols = np.empty((m, kh * kw * o), F32)
    ensure_gemm_policy()

    how = gemm.plan(m, kh * kw * o, c)
    packed = packed_matmul(wmat, None, -np.inf, np.inf, m)

    rows = n * oh
    tasks, chunk = row_tasks(rows, rows * ow * o, _COL2IM_PARALLEL)
    acc = np.empty(tasks * o, F32)
    params = np.array([rows, chunk, h, w, oh, ow, o, kh, kw, sh, sw, pt, pl], np.int64)
    bounds = np.array([lo, hi], F32)
    bias32 = np.ascontiguousarray(bias, F32)

    def bind(inputs, outputs):
        x2 = inputs[x_index].reshape(m, c)
        taps = packed.bind(x2, cols) if packed is not None else gemm.bind_matmul(x2, wmat, cols, how)
        gather = bind_task(_col2im_task, tasks, (cols, bias32, acc), (outputs[0],), params, bounds)
        return in_sequence([taps, gather])
    return bindable(bind)
