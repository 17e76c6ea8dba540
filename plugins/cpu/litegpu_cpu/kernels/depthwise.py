"""DEPTHWISE_CONV_2D (numba) with LiteRT's bits: every kernel here sums in XNNPACK's order
(:mod:`.xnn_order`): from the bias, one multiply-add a tap (fused where the host has
FMA), column by column through a window of at most 25 taps with multiplier 1, row by
row otherwise; a tap in the padding multiplies 0. Fast paths for the common
convolutions reuse each loaded input and weight vector for several outputs:

- 3x3, stride 1 (any dilation), :func:`_s1_task`: an output row's interior, flattened
  over (column, channel), is a sum of nine contiguous input-row segments times weights
  repeated along the row, so one long loop vectorizes at full width for any C; four
  output rows share six input rows (four independent chains of nine);
- 3x3, stride 2, :func:`_s2_task`: 2x2 output pixels per channel loop share a 5x5 input
  window. Its arrays are ``noalias`` pointers, so LLVM vectorizes the channel loop with
  no run-time alias checks (with them it gives up: "too many memory checks").

Pixels whose window crosses the border take :func:`_edge_pixel`. These are task
functions run by :func:`.tasks.run_plan` (see :mod:`.tasks`: as ``prange`` kernels they
took 4-6 s each to compile cold).

5x5 (stride 1 or 2, multiplier 1, no dilation, C >= 16) takes :func:`_k5_task`: a task
is one block of 16 channels (one AVX-512 vector) over a band of output rows. It copies
its band of the input, those 16 channels, into a zero-padded frame (``[rows][cols][16]``,
in L1/L2), so no pixel needs an edge test; then its 25 weight vectors stay in registers
for every pixel, each tap one FMA with a memory operand, three pixels' chains of 25 at
a time. The frame copy and zero fill go by 16-float vector intrinsics (:func:`_copy16`,
zeros copied from one :func:`_zero16` vector: numba leaves LLVM's SLP vectorizer off, so
a 16-iteration copy loop is unrolled into scalar moves, and LLVM turns runs of zero
stores into a memset call each: 3-4x slower fills). 14x14x240 stride 1 on one thread:
0.113 ms summed tap by tap in memory, 0.050 ms as five partial sums a pixel (not
XNNPACK's order), 0.05 ms as now.

Every other depthwise conv takes :func:`_any_task`, an output row a task, its taps in
XNNPACK's order from its parameters.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir

from litegpu.backend import NodeContext

from ..jit import carray, intrinsic, njit, types
from .common import F32, clamp_bounds, constant_bias, window_geometry
from .registry import bindable, kernel
from .threads import current as current_threads
from .tasks import TaskFunction, advanced, bind_task, claim_word, fetch_add, task_function, wait_a_little
from .xnn_order import clamp16, depthwise_taps, load16, madd, madd16, splat16, store16

# Floats of an output row per pass of :func:`_rows4`, so that its ten weight rows stay in
# L1 (96x96x16 .. 14x14x576: 256-1024 alike; weights repeated along whole rows, 9*OW*C
# floats, up to 290 KB a layer, were no faster).
_CHUNK = 512


@njit(cache=True)
def _edge_pixel(x, wt, bias, out, n, oh, ow, ih0, iw0, dh, dw, lo, hi):
    """Output pixel ``out[n, oh, ow]`` of a 3x3 depthwise conv (multiplier 1) whose window at
    (ih0, iw0) may cross the border, in XNNPACK's order (column by column, one
    :func:`.xnn_order.madd` a tap from the bias): a tap outside the image multiplies 0, as
    XNNPACK's zero buffer does. It reads a clamped, valid pixel that is then replaced by 0,
    so the nine taps still sum in a register: 1.7-2.3x faster than a pass over the
    channels per tap (28x28x144, 56x56x16). Indexes the arrays directly (no views), so
    that it keeps the callers' parallel bodies alias-free (see the module docstring).
    Called, not inlined: inlined at its five call sites it made the two parallel kernels
    take 24 s to compile cold instead of 10 s, for no measurable speed."""
    h, w = x.shape[1], x.shape[2]
    i0, i1, i2 = min(max(ih0, 0), h - 1), min(max(ih0 + dh, 0), h - 1), min(max(ih0 + 2 * dh, 0), h - 1)
    j0, j1, j2 = min(max(iw0, 0), w - 1), min(max(iw0 + dw, 0), w - 1), min(max(iw0 + 2 * dw, 0), w - 1)
    r0, r1, r2 = i0 == ih0, i1 == ih0 + dh, i2 == ih0 + 2 * dh          # which taps lie inside
    c0, c1, c2 = j0 == iw0, j1 == iw0 + dw, j2 == iw0 + 2 * dw
    zero = np.float32(0)
    for c in range(out.shape[3]):
        v = bias[c]
        v = madd(x[n, i0, j0, c] if r0 and c0 else zero, wt[0, 0, c], v)
        v = madd(x[n, i1, j0, c] if r1 and c0 else zero, wt[1, 0, c], v)
        v = madd(x[n, i2, j0, c] if r2 and c0 else zero, wt[2, 0, c], v)
        v = madd(x[n, i0, j1, c] if r0 and c1 else zero, wt[0, 1, c], v)
        v = madd(x[n, i1, j1, c] if r1 and c1 else zero, wt[1, 1, c], v)
        v = madd(x[n, i2, j1, c] if r2 and c1 else zero, wt[2, 1, c], v)
        v = madd(x[n, i0, j2, c] if r0 and c2 else zero, wt[0, 2, c], v)
        v = madd(x[n, i1, j2, c] if r1 and c2 else zero, wt[1, 2, c], v)
        v = madd(x[n, i2, j2, c] if r2 and c2 else zero, wt[2, 2, c], v)
        out[n, oh, ow, c] = min(max(v, lo), hi)


@njit(cache=True, inline="always")
def _taps3x3(b, x00, x10, x20, x01, x11, x21, x02, x12, x22, w0, w1, w2, w3, w4, w5, w6, w7, w8):
    """``b + sum x_{ky kx} * w_{3 ky + kx}`` in XNNPACK's order: column by column, one
    :func:`.xnn_order.madd` a tap."""
    v = madd(x00, w0, b)
    v = madd(x10, w3, v)
    v = madd(x20, w6, v)
    v = madd(x01, w1, v)
    v = madd(x11, w4, v)
    v = madd(x21, w7, v)
    v = madd(x02, w2, v)
    v = madd(x12, w5, v)
    return madd(x22, w8, v)


@njit(cache=True)
def _rows4(y0, y1, y2, y3, x0, x1, x2, x3, x4, x5, a, s, wp, lo, hi):
    """Four flattened output-row segments of a stride-1 3x3 depthwise conv:
    ``y_i[j] = clamp(bias + sum_{k, kw} x_{i+k}[a + kw*s + j] * w[k, kw])``, rows ``x0..x5``
    flattened over (column, channel), ``s`` the tap step (dilation * C). ``wp`` holds the
    nine weight rows and the bias (row 9), each repeated along ``P`` floats, ``P`` a
    multiple of C: the segment goes in passes of ``P``, so the weights stay cached.
    Each input value loaded serves up to three output rows (28 loads per 4 outputs
    where a pixel at a time takes 19 per output); the four sums are independent chains
    of XNNPACK's order (:func:`_taps3x3`)."""
    length = y0.size
    p = wp.shape[1]
    for j0 in range(0, length, p):
        m = min(p, length - j0)
        b = a + j0
        p0, p1, p2 = x0[b:b + m], x0[b + s:b + s + m], x0[b + 2 * s:b + 2 * s + m]
        q0, q1, q2 = x1[b:b + m], x1[b + s:b + s + m], x1[b + 2 * s:b + 2 * s + m]
        r0, r1, r2 = x2[b:b + m], x2[b + s:b + s + m], x2[b + 2 * s:b + 2 * s + m]
        t0, t1, t2 = x3[b:b + m], x3[b + s:b + s + m], x3[b + 2 * s:b + 2 * s + m]
        u0, u1, u2 = x4[b:b + m], x4[b + s:b + s + m], x4[b + 2 * s:b + 2 * s + m]
        v0, v1, v2 = x5[b:b + m], x5[b + s:b + s + m], x5[b + 2 * s:b + 2 * s + m]
        w0, w1, w2, w3, w4 = wp[0, :m], wp[1, :m], wp[2, :m], wp[3, :m], wp[4, :m]
        w5, w6, w7, w8, wb = wp[5, :m], wp[6, :m], wp[7, :m], wp[8, :m], wp[9, :m]
        z0, z1, z2, z3 = y0[j0:j0 + m], y1[j0:j0 + m], y2[j0:j0 + m], y3[j0:j0 + m]
        for j in range(m):
            a0, a1, a2, a3, a4, a5, a6, a7, a8 = w0[j], w1[j], w2[j], w3[j], w4[j], w5[j], w6[j], w7[j], w8[j]
            bj = wb[j]
            Q0, Q1, Q2, R0, R1, R2, T0, T1, T2 = q0[j], q1[j], q2[j], r0[j], r1[j], r2[j], t0[j], t1[j], t2[j]
            U0, U1, U2 = u0[j], u1[j], u2[j]
            P0, P1, P2, V0, V1, V2 = p0[j], p1[j], p2[j], v0[j], v1[j], v2[j]
            o0 = _taps3x3(bj, P0, Q0, R0, P1, Q1, R1, P2, Q2, R2, a0, a1, a2, a3, a4, a5, a6, a7, a8)
            o1 = _taps3x3(bj, Q0, R0, T0, Q1, R1, T1, Q2, R2, T2, a0, a1, a2, a3, a4, a5, a6, a7, a8)
            o2 = _taps3x3(bj, R0, T0, U0, R1, T1, U1, R2, T2, U2, a0, a1, a2, a3, a4, a5, a6, a7, a8)
            o3 = _taps3x3(bj, T0, U0, V0, T1, U1, V1, T2, U2, V2, a0, a1, a2, a3, a4, a5, a6, a7, a8)
            z0[j] = min(max(o0, lo), hi)
            z1[j] = min(max(o1, lo), hi)
            z2[j] = min(max(o2, lo), hi)
            z3[j] = min(max(o3, lo), hi)


@njit(cache=True, inline="always")
def _input_row(xp, n, ih, h, length, zero):
    """Input row ``ih`` of image ``n`` flattened (``length`` = W*C floats), or ``zero`` (a
    row of zeros) when ``ih`` lies in the padding."""
    if 0 <= ih < h:
        return carray(advanced(xp, (n * h + ih) * length), length)
    return zero


@task_function()
def _s1_task(g, xp, wtp, biasp, wpp, zerop, outp, sparep, _a7, ip, fp):
    """Task ``g`` of the 3x3 depthwise conv, stride 1, multiplier 1, any dilation: the
    group of four output rows ``dh`` apart that :func:`depthwise3x3_s1` numbers ``g``
    (so that they share six input rows). ``wp``: see :func:`_rows4`; ``zero``: a row of
    zeros, W*C floats, standing for input rows in the padding, so only the border columns
    take :func:`_edge_pixel`. A group past the last row writes its missing rows to
    ``spare`` (three rows of OW*C floats nobody reads; distinct rows, since rows that may
    overlap would send LLVM to its scalar loop). Rows are views made from pointers
    (:func:`.tasks.advanced`): a reshape, or an array made here, would need numba's
    runtime (:mod:`..objects`)."""
    q = carray(ip, 18)
    n_size, h, w, c, oh_size, ow_size, dh, dw, pt, pl = q[0], q[1], q[2], q[3], q[4], q[5], q[6], q[7], q[8], q[9]
    groups, ow_lo, ow_hi, j0, j1, a, s, p = q[10], q[11], q[12], q[13], q[14], q[15], q[16], q[17]
    x = carray(xp, (n_size, h, w, c))
    wt = carray(wtp, (3, 3, c))
    bias = carray(biasp, c)
    wp = carray(wpp, (10, p))
    zero = carray(zerop, w * c)
    out = carray(outp, (n_size, oh_size, ow_size, c))
    lo, hi = fp[0], fp[1]
    n = g // groups
    r = g - n * groups
    oh0 = r // dh * 4 * dh + r % dh
    ih0 = oh0 - pt
    if j1 > j0 and oh0 < oh_size:       # (with dilation the last span's phases may start past the end)
        row, span, length = ow_size * c, j1 - j0, w * c
        at = (n * oh_size + oh0) * row + j0
        y0 = carray(advanced(outp, at), span)
        y1 = carray(advanced(outp, at + dh * row) if oh0 + dh < oh_size else sparep, span)
        y2 = carray(advanced(outp, at + 2 * dh * row) if oh0 + 2 * dh < oh_size else advanced(sparep, row), span)
        y3 = carray(advanced(outp, at + 3 * dh * row) if oh0 + 3 * dh < oh_size else advanced(sparep, 2 * row),
                    span)
        x0 = _input_row(xp, n, ih0, h, length, zero)
        x1 = _input_row(xp, n, ih0 + dh, h, length, zero)
        x2 = _input_row(xp, n, ih0 + 2 * dh, h, length, zero)
        x3 = _input_row(xp, n, ih0 + 3 * dh, h, length, zero)
        x4 = _input_row(xp, n, ih0 + 4 * dh, h, length, zero)
        x5 = _input_row(xp, n, ih0 + 5 * dh, h, length, zero)
        _rows4(y0, y1, y2, y3, x0, x1, x2, x3, x4, x5, a, s, wp, lo, hi)
    for i in range(4):
        oh = oh0 + i * dh
        if oh < oh_size:
            for ow in range(ow_lo):
                _edge_pixel(x, wt, bias, out, n, oh, ow, oh - pt, ow - pl, dh, dw, lo, hi)
            for ow in range(ow_hi, ow_size):
                _edge_pixel(x, wt, bias, out, n, oh, ow, oh - pt, ow - pl, dh, dw, lo, hi)


def depthwise3x3_s1(x_shape, out_shape, dh, dw, pt, pl, wp_width):
    """The task count and int64 parameters of :func:`_s1_task` for these shapes: tasks are
    groups of four output rows ``dh`` apart (``dh`` phases per span of 4*dh rows), and the
    interior columns, whose taps ``ow - pl .. ow - pl + 2*dw`` all lie inside the row, go
    by flattened row segments. 1.5-4x faster than the per-pixel kernel (1 thread: 96x96x16
    221 -> 57 us, 48x48x32 76 -> 29 us, 112x112x32 384 -> 117 us, 56x56x144 311 -> 150 us,
    7x7x960 35 -> 23 us; dilation 2, 64x64x32: 180 -> 64 us)."""
    n_size, h, w, c = x_shape
    oh_size, ow_size = out_shape[1], out_shape[2]
    ow_lo = min(pl, ow_size)
    ow_hi = max(min(w - 2 * dw + pl, ow_size), ow_lo)
    groups = (oh_size + 4 * dh - 1) // (4 * dh) * dh
    params = (n_size, h, w, c, oh_size, ow_size, dh, dw, pt, pl, groups, ow_lo, ow_hi,
              ow_lo * c, ow_hi * c, (ow_lo - pl) * c, dw * c, wp_width)
    return n_size * groups, np.array(params, np.int64)


@njit(cache=True, inline="always")
def _block2x2_s2(x, wt, bias, out, n, oh, ow, ih, iw, lo, hi):
    """Output pixels (oh, ow) .. (oh + 1, ow + 1) of a stride-2 3x3 conv from the 5x5 input
    window at (ih, iw): 25 input and 10 weight loads per channel for 4 outputs, where a
    pixel at a time takes 19 per output."""
    for c in range(out.shape[3]):
        w0, w1, w2 = wt[0, 0, c], wt[0, 1, c], wt[0, 2, c]
        w3, w4, w5 = wt[1, 0, c], wt[1, 1, c], wt[1, 2, c]
        w6, w7, w8 = wt[2, 0, c], wt[2, 1, c], wt[2, 2, c]
        b = bias[c]
        a0, a1, a2, a3, a4 = x[n, ih, iw, c], x[n, ih, iw + 1, c], x[n, ih, iw + 2, c], x[n, ih, iw + 3, c], \
            x[n, ih, iw + 4, c]
        b0, b1, b2, b3, b4 = x[n, ih + 1, iw, c], x[n, ih + 1, iw + 1, c], x[n, ih + 1, iw + 2, c], \
            x[n, ih + 1, iw + 3, c], x[n, ih + 1, iw + 4, c]
        c0, c1, c2, c3, c4 = x[n, ih + 2, iw, c], x[n, ih + 2, iw + 1, c], x[n, ih + 2, iw + 2, c], \
            x[n, ih + 2, iw + 3, c], x[n, ih + 2, iw + 4, c]
        d0, d1, d2, d3, d4 = x[n, ih + 3, iw, c], x[n, ih + 3, iw + 1, c], x[n, ih + 3, iw + 2, c], \
            x[n, ih + 3, iw + 3, c], x[n, ih + 3, iw + 4, c]
        e0, e1, e2, e3, e4 = x[n, ih + 4, iw, c], x[n, ih + 4, iw + 1, c], x[n, ih + 4, iw + 2, c], \
            x[n, ih + 4, iw + 3, c], x[n, ih + 4, iw + 4, c]
        v00 = _taps3x3(b, a0, b0, c0, a1, b1, c1, a2, b2, c2, w0, w1, w2, w3, w4, w5, w6, w7, w8)
        v01 = _taps3x3(b, a2, b2, c2, a3, b3, c3, a4, b4, c4, w0, w1, w2, w3, w4, w5, w6, w7, w8)
        v10 = _taps3x3(b, c0, d0, e0, c1, d1, e1, c2, d2, e2, w0, w1, w2, w3, w4, w5, w6, w7, w8)
        v11 = _taps3x3(b, c2, d2, e2, c3, d3, e3, c4, d4, e4, w0, w1, w2, w3, w4, w5, w6, w7, w8)
        out[n, oh, ow, c] = min(max(v00, lo), hi)
        out[n, oh, ow + 1, c] = min(max(v01, lo), hi)
        out[n, oh + 1, ow, c] = min(max(v10, lo), hi)
        out[n, oh + 1, ow + 1, c] = min(max(v11, lo), hi)


@task_function()
def _s2_task(g, xp, wtp, biasp, outp, _a4, _a5, _a6, _a7, ip, fp):
    """Task ``g`` of the 3x3 depthwise conv, stride 2, multiplier 1, dilation 1: output
    rows ``2g``, ``2g + 1`` of an image. Where both rows' windows lie inside the image,
    interior columns go by 2x2 blocks (:func:`_block2x2_s2`); other pixels take
    :func:`_edge_pixel`."""
    q = carray(ip, 11)
    n_size, h, w, c, oh_size, ow_size, pt, pl, ow_lo, ow_hi, ow_mid = \
        q[0], q[1], q[2], q[3], q[4], q[5], q[6], q[7], q[8], q[9], q[10]
    x = carray(xp, (n_size, h, w, c))
    wt = carray(wtp, (3, 3, c))
    bias = carray(biasp, c)
    out = carray(outp, (n_size, oh_size, ow_size, c))
    lo, hi = fp[0], fp[1]
    groups = (oh_size + 1) // 2
    n = g // groups
    oh0 = (g - n * groups) * 2
    rows = min(2, oh_size - oh0)
    # Dilation 1 as an int64, not a literal: the literal would make numba compile
    # _edge_pixel a second time (~0.45 s of a cold start) for the same code.
    unit = np.int64(1)
    ih0 = 2 * oh0 - pt
    if rows == 2 and ih0 >= 0 and ih0 + 5 <= h:
        for ow in range(ow_lo, ow_mid, 2):
            _block2x2_s2(x, wt, bias, out, n, oh0, ow, ih0, 2 * ow - pl, lo, hi)
        for ow in range(ow_mid, ow_hi):
            _edge_pixel(x, wt, bias, out, n, oh0, ow, ih0, 2 * ow - pl, unit, unit, lo, hi)
            _edge_pixel(x, wt, bias, out, n, oh0 + 1, ow, ih0 + 2, 2 * ow - pl, unit, unit, lo, hi)
    else:
        for i in range(rows):
            for ow in range(ow_lo, ow_hi):
                _edge_pixel(x, wt, bias, out, n, oh0 + i, ow, ih0 + 2 * i, 2 * ow - pl, unit, unit, lo, hi)
    for i in range(rows):
        for ow in range(ow_lo):
            _edge_pixel(x, wt, bias, out, n, oh0 + i, ow, ih0 + 2 * i, 2 * ow - pl, unit, unit, lo, hi)
        for ow in range(ow_hi, ow_size):
            _edge_pixel(x, wt, bias, out, n, oh0 + i, ow, ih0 + 2 * i, 2 * ow - pl, unit, unit, lo, hi)


def depthwise3x3_s2(x_shape, out_shape, pt, pl):
    """The task count and int64 parameters of :func:`_s2_task`: tasks are pairs of output
    rows; interior columns (input columns 2*ow - pl .. +2 inside the row) go by 2x2 blocks
    from ``ow_lo`` to ``ow_mid``, an odd one left up to ``ow_hi``. 1.4-2x faster than the
    per-pixel kernel (1 thread: 112x112x96 229 -> 142 us, 56x56x144 73 -> 50 us, 96x96x16
    60 -> 30 us)."""
    n_size, h, w, c = x_shape
    oh_size, ow_size = out_shape[1], out_shape[2]
    ow_lo = min((pl + 1) // 2, ow_size)
    ow_hi = max(min((w - 3 + pl) // 2 + 1, ow_size), ow_lo)
    ow_mid = ow_lo + (ow_hi - ow_lo) // 2 * 2
    params = (n_size, h, w, c, oh_size, ow_size, pt, pl, ow_lo, ow_hi, ow_mid)
    return n_size * ((oh_size + 1) // 2), np.array(params, np.int64)


_V16 = ir.VectorType(ir.FloatType(), 16)


@intrinsic
def _copy16(typingctx, dst, di, src, si):
    """``dst[di:di + 16] = src[si:si + 16]`` (1-D float32 arrays) as one vector load and store."""
    sig = types.void(dst, di, src, si)

    def codegen(context, builder, signature, args):
        d = context.make_array(signature.args[0])(context, builder, args[0])
        s = context.make_array(signature.args[2])(context, builder, args[2])
        v = builder.load(builder.bitcast(builder.gep(s.data, [args[3]]), _V16.as_pointer()), align=4)
        builder.store(v, builder.bitcast(builder.gep(d.data, [args[1]]), _V16.as_pointer()), align=4)
        return context.get_dummy_value()
    return sig, codegen


@intrinsic
def _zero16(typingctx, dst, di):
    """``dst[di:di + 16] = 0`` (a 1-D float32 array) as one vector store."""
    sig = types.void(dst, di)

    def codegen(context, builder, signature, args):
        d = context.make_array(signature.args[0])(context, builder, args[0])
        builder.store(ir.Constant(_V16, None), builder.bitcast(builder.gep(d.data, [args[1]]), _V16.as_pointer()),
                      align=4)
        return context.get_dummy_value()
    return sig, codegen


_U = np.uint64     # unsigned indices: numba adds no negative-index wraparound (which makes LLVM gather)


@njit(cache=True, inline="always")
def _framed_setup(g, xp, ip, k, base):
    """The frame of task ``g`` of a ``k`` x ``k`` framed task such as :func:`_k5_task` (see
    :func:`framed_plan` for the parameters ``ip``): at ``base`` (64-byte aligned, a slot
    of :func:`_claim_frame`), a ``[fh][fw][16]`` array holding input rows ``oh0*s - pt ..``
    and columns ``-pl ..``, channels ``cb .. cb + 15``, zero outside the image. Returns it
    with the task's image, first output row, row count and first channel."""
    q = carray(ip, 12)
    n_size, h, w, c, oh_size, s, pt, pl, rows, groups, fw = \
        q[0], q[1], q[2], q[3], q[4], q[6], q[7], q[8], q[9], q[10], q[11]
    x = carray(xp, (n_size, h, w * c))
    blocks = (c + 15) // 16
    band = g // blocks
    cb = min((g - band * blocks) * 16, c - 16)      # a last partial block overlaps the one before
    n = band // groups
    oh0 = (band - n * groups) * rows
    nrows = min(rows, oh_size - oh0)
    fh = (nrows - 1) * s + k
    size = fh * fw * 16
    frame = carray(base, size)
    ih0 = oh0 * s - pt
    jlo = min(pl, fw)
    jhi = max(min(w + pl, fw), jlo)
    zero = carray(advanced(base, size), 16)        # a zero vector behind the frame
    _zero16(zero, 0)
    for r in range(fh):
        ih = ih0 + r
        fr = frame[r * fw * 16:(r + 1) * fw * 16]
        if 0 <= ih < h:
            xr = x[n, ih]
            for j in range(jlo):
                _copy16(fr, j * 16, zero, 0)
            for j in range(jlo, jhi):
                _copy16(fr, j * 16, xr, (j - pl) * c + cb)
            for j in range(jhi, fw):
                _copy16(fr, j * 16, zero, 0)
        else:
            for j in range(fw):
                _copy16(fr, j * 16, zero, 0)
    return frame, n, oh0, nrows, cb


@njit(cache=True, inline="always")
def _column5_x3(frame, v0, v1, v2, row, w, a0, a1, a2):
    """``a0 .. a2`` plus the five taps of one window column (``ky`` = 0 .. 4: frame values
    ``row`` apart from ``v0 .. v2`` on) of three pixels, 16 channels, a tap at a time
    (XNNPACK's order within a column, :func:`.xnn_order.madd16`)."""
    a0 = madd16(load16(frame, v0), w[0], a0)
    a1 = madd16(load16(frame, v1), w[0], a1)
    a2 = madd16(load16(frame, v2), w[0], a2)
    a0 = madd16(load16(frame, v0 + row), w[1], a0)
    a1 = madd16(load16(frame, v1 + row), w[1], a1)
    a2 = madd16(load16(frame, v2 + row), w[1], a2)
    a0 = madd16(load16(frame, v0 + 2 * row), w[2], a0)
    a1 = madd16(load16(frame, v1 + 2 * row), w[2], a1)
    a2 = madd16(load16(frame, v2 + 2 * row), w[2], a2)
    a0 = madd16(load16(frame, v0 + 3 * row), w[3], a0)
    a1 = madd16(load16(frame, v1 + 3 * row), w[3], a1)
    a2 = madd16(load16(frame, v2 + 3 * row), w[3], a2)
    a0 = madd16(load16(frame, v0 + 4 * row), w[4], a0)
    a1 = madd16(load16(frame, v1 + 4 * row), w[4], a1)
    a2 = madd16(load16(frame, v2 + 4 * row), w[4], a2)
    return a0, a1, a2


@njit(cache=True, inline="always")
def _window_at(f, ow_size, s, fw):
    """Where in the frame the window of the band's pixel ``f`` (row-major) starts."""
    r = f // ow_size
    return (r * s * fw + (f - r * ow_size) * s) * 16


@njit(cache=True, inline="always")
def _weights5(wt, kx, c, cb):
    """The five weight vectors (channels ``cb ..``) of window column ``kx``, ``ky`` = 0 .. 4."""
    return (load16(wt, kx * c + cb), load16(wt, (5 + kx) * c + cb), load16(wt, (10 + kx) * c + cb),
            load16(wt, (15 + kx) * c + cb), load16(wt, (20 + kx) * c + cb))


@njit(cache=True, inline="always")
def _claim_frame(ip):
    """A free slot of the frames (``ip[12]`` floats each, ``ip[13]`` of them, the first at
    float ``ip[14]``; their words at ``ip[15] ..``), taken; waits while every slot is taken
    (never for long: as many slots as threads run the plan). Give it back with
    :func:`_release_frame`."""
    slots = ip[13]
    words = carray(ip, 15 + slots).ctypes.data + 8 * 15
    spins = 0
    while True:
        for slot in range(slots):
            if claim_word(words + 8 * slot):
                return slot
        wait_a_little(spins)
        spins += 1


@njit(cache=True, inline="always")
def _release_frame(ip, slot):
    fetch_add(carray(ip, 16 + slot).ctypes.data + 8 * (15 + slot), np.int64(-1))


def framed_scratch(params: np.ndarray, k: int, threads: int) -> tuple[np.ndarray, np.ndarray]:
    """``(params, frames)``: :func:`framed_plan`'s parameters with the frame slots'
    geometry and words appended, and the frames themselves, one slot per thread (a task
    takes a free one: :func:`_claim_frame`), each 64-byte aligned with a zero vector behind
    its largest frame."""
    s, rows, fw = int(params[6]), int(params[9]), int(params[11])
    slot = -(-(((rows - 1) * s + k) * fw * 16 + 16) // 16) * 16
    frames = np.empty(threads * slot + 16, F32)
    first = (-frames.ctypes.data % 64) // 4
    return np.concatenate([params, np.array([slot, threads, first] + [0] * threads, np.int64)]), frames


@task_function()
def _k5_task(g, xp, wtp, biasp, outp, framesp, _a5, _a6, _a7, ip, fp):
    """Task ``g`` of a 5x5 depthwise conv (multiplier 1, no dilation, stride 1 or 2, C >= 16):
    16 channels over a band of output rows, from a zero-padded frame
    (:func:`_framed_setup`). Each sum is one chain of 25 dependent multiply-adds in
    XNNPACK's order (column by column), so the band's pixels go three at a time, in
    row-major order across rows (the last three overlapping the ones before: the same
    values written twice; output rows of three pixels at least), their chains
    interleaved a tap at a time (:func:`_column5_x3`), the 25 weight vectors in
    registers: 16-float vectors spelled out (:mod:`.xnn_order`), which LLVM's loop
    vectorizer did not keep in registers. Four pixels at a time ran 5-10% slower, two or
    five 10-20%, one chain of 25 after another 30-80%."""
    q = carray(ip, 12)
    n_size, c, oh_size, ow_size, s, fw = q[0], q[3], q[4], q[5], q[6], q[11]
    wt = carray(wtp, 25 * c)
    bias = carray(biasp, c)
    out = carray(outp, (n_size, oh_size * ow_size * c))
    lo, hi = fp[0], fp[1]
    slot = _claim_frame(ip)
    frame, n, oh0, nrows, cb = _framed_setup(g, xp, ip, 5, advanced(framesp, ip[14] + slot * ip[12]))
    w0, w1, w2, w3, w4 = _weights5(wt, 0, c, cb), _weights5(wt, 1, c, cb), _weights5(wt, 2, c, cb), \
        _weights5(wt, 3, c, cb), _weights5(wt, 4, c, cb)
    b = load16(bias, cb)
    row = fw * 16
    o = out[n]
    total = nrows * ow_size
    start = oh0 * ow_size
    for f in range(0, total, 3):                        # (the factory sees to OW >= 3)
        first = min(f, total - 3)
        v0, v1, v2 = _window_at(first, ow_size, s, fw), _window_at(first + 1, ow_size, s, fw), \
            _window_at(first + 2, ow_size, s, fw)
        a0, a1, a2 = _column5_x3(frame, v0, v1, v2, row, w0, b, b, b)
        a0, a1, a2 = _column5_x3(frame, v0 + 16, v1 + 16, v2 + 16, row, w1, a0, a1, a2)
        a0, a1, a2 = _column5_x3(frame, v0 + 32, v1 + 32, v2 + 32, row, w2, a0, a1, a2)
        a0, a1, a2 = _column5_x3(frame, v0 + 48, v1 + 48, v2 + 48, row, w3, a0, a1, a2)
        a0, a1, a2 = _column5_x3(frame, v0 + 64, v1 + 64, v2 + 64, row, w4, a0, a1, a2)
        store16(o, (start + first) * c + cb, clamp16(a0, lo, hi))
        store16(o, (start + first + 1) * c + cb, clamp16(a1, lo, hi))
        store16(o, (start + first + 2) * c + cb, clamp16(a2, lo, hi))
    _release_frame(ip, slot)


# Output rows per band of :func:`framed_plan` at most (a frame of 20 rows of a 112-wide
# image is 143 KB: L2).
_BAND = 16


def framed_plan(x_shape, out_shape, k, s, pt, pl, min_tasks=8):
    """The task count and int64 parameters of :func:`_k5_task` (``k`` 5): tasks are (image,
    band of output rows, block of 16 channels), bands of up to ``_BAND`` rows, halved
    while that leaves under ``min_tasks`` tasks (for threads)."""
    n_size, h, w, c = x_shape
    oh_size, ow_size = out_shape[1], out_shape[2]
    blocks = (c + 15) // 16
    rows = max(1, min(oh_size, _BAND))
    while rows > 1 and n_size * blocks * -(-oh_size // rows) < min_tasks:
        rows = -(-rows // 2)
    groups = -(-oh_size // rows)
    fw = (ow_size - 1) * s + k
    params = (n_size, h, w, c, oh_size, ow_size, s, pt, pl, rows, groups, fw)
    return n_size * groups * blocks, np.array(params, np.int64)


def repeated_weights(wt: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """The ``wp`` of :func:`_rows4`: the nine taps of ``wt`` [3, 3, C] and the bias, each
    repeated along a multiple of lcm(C, 16) floats near ``_CHUNK`` (whole channel groups,
    whole 16-float vectors), as a [10, P] array."""
    c = bias.size
    base = int(np.lcm(c, 16))
    reps = max(1, round(_CHUNK / base)) * base // c
    rows = np.concatenate([wt.reshape(9, c), bias.reshape(1, c)])
    return np.ascontiguousarray(np.tile(rows, (1, reps)), dtype=F32)


@task_function()
def _any_task(t, xp, wtp, biasp, outp, _a4, _a5, _a6, _a7, ip, fp):
    """Task ``t`` of any depthwise conv: output row ``t % OH`` of image ``t // OH``, each
    pixel from the bias through its taps in the order ``ip`` lists them
    (:func:`.xnn_order.depthwise_taps`), one :func:`.xnn_order.madd` a tap over the
    pixel's channels: in registers, 16 channels a vector, for multiplier 1 and C >= 16
    (:func:`_any_row_blocks`), else in the output row (the channel loop vectorizes). A tap
    in the padding multiplies 0, as XNNPACK's zero buffer does, unless ``ip`` says that
    this changes nothing (:func:`any_plan`)."""
    q = carray(ip, 17)
    n_size, h, w, c, oh_size, ow_size, kh, kw, sh, sw, dh, dw, pt, pl, mult, skip_padding, ntaps = \
        q[0], q[1], q[2], q[3], q[4], q[5], q[6], q[7], q[8], q[9], q[10], q[11], q[12], q[13], q[14], q[15], q[16]
    taps = carray(ip, 17 + 2 * ntaps)[17:]
    oc = c * mult
    lo, hi = fp[0], fp[1]
    n = t // oh_size
    oh = t - n * oh_size
    if mult == 1 and c >= 16:
        _any_row_blocks(xp, wtp, biasp, outp, n, oh, taps, ntaps, q, lo, hi)
        return
    x = carray(xp, (n_size, h, w, c))
    wt = carray(wtp, (kh * kw, oc))
    bias = carray(biasp, oc)
    out = carray(outp, (n_size, oh_size, ow_size, oc))
    zero = np.float32(0)
    for ow in range(ow_size):
        oo = out[n, oh, ow]
        for o in range(oc):
            oo[o] = bias[o]
        for k in range(ntaps):
            ky, kx = taps[2 * k], taps[2 * k + 1]
            ih, iw = oh * sh - pt + ky * dh, ow * sw - pl + kx * dw
            wv = wt[ky * kw + kx]
            if ih < 0 or ih >= h or iw < 0 or iw >= w:
                if not skip_padding:
                    for o in range(oc):
                        oo[o] = madd(zero, wv[o], oo[o])
            elif mult == 1:
                xv = x[n, ih, iw]
                for o in range(oc):
                    oo[o] = madd(xv[o], wv[o], oo[o])
            else:
                xv = x[n, ih, iw]
                for m in range(mult):
                    for ci in range(c):
                        o = ci * mult + m
                        oo[o] = madd(xv[ci], wv[o], oo[o])
        for o in range(oc):
            oo[o] = min(max(oo[o], lo), hi)


@njit(cache=True, inline="always")
def _any_row_blocks(xp, wtp, biasp, outp, n, oh, taps, ntaps, q, lo, hi):
    """:func:`_any_task`'s row for multiplier 1 and C >= 16: four blocks of 16 channels at a
    time over the row's pixels, their sums in registers through all the taps (four
    independent chains), so that the blocks' weights stay in L1 (7x7 x 168 channels: 33
    KB of weights a pixel). Summed in the output instead, each tap waited for the last
    one's store (1.1-1.4x slower than the kernel before XNNPACK's order, whose adds were
    shorter); the pixels of each group of blocks in turn, weights and all, were 1.1-1.2x
    slower. A last partial block overlaps the one before, and a group past the last
    block repeats it: the same values written twice."""
    n_size, h, w, c, oh_size, ow_size, kh, kw, sh, sw, dh, dw, pt, pl, _, skip_padding = \
        q[0], q[1], q[2], q[3], q[4], q[5], q[6], q[7], q[8], q[9], q[10], q[11], q[12], q[13], q[14], q[15]
    x = carray(xp, n_size * h * w * c)
    wt = carray(wtp, kh * kw * c)
    bias = carray(biasp, c)
    out = carray(outp, n_size * oh_size * ow_size * c)
    blocks = (c + 15) // 16
    last = c - 16
    zeros = splat16(np.float32(0))
    for g in range(0, blocks, 4):
        c0, c1, c2, c3 = min(16 * g, last), min(16 * g + 16, last), min(16 * g + 32, last), min(16 * g + 48, last)
        for ow in range(ow_size):
            ob = ((n * oh_size + oh) * ow_size + ow) * c
            a0, a1, a2, a3 = load16(bias, c0), load16(bias, c1), load16(bias, c2), load16(bias, c3)
            for k in range(ntaps):
                ky, kx = taps[2 * k], taps[2 * k + 1]
                ih, iw = oh * sh - pt + ky * dh, ow * sw - pl + kx * dw
                wb = (ky * kw + kx) * c
                if 0 <= ih < h and 0 <= iw < w:
                    xb = ((n * h + ih) * w + iw) * c
                    a0 = madd16(load16(x, xb + c0), load16(wt, wb + c0), a0)
                    a1 = madd16(load16(x, xb + c1), load16(wt, wb + c1), a1)
                    a2 = madd16(load16(x, xb + c2), load16(wt, wb + c2), a2)
                    a3 = madd16(load16(x, xb + c3), load16(wt, wb + c3), a3)
                elif not skip_padding:
                    a0 = madd16(zeros, load16(wt, wb + c0), a0)
                    a1 = madd16(zeros, load16(wt, wb + c1), a1)
                    a2 = madd16(zeros, load16(wt, wb + c2), a2)
                    a3 = madd16(zeros, load16(wt, wb + c3), a3)
            store16(out, ob + c0, clamp16(a0, lo, hi))
            store16(out, ob + c1, clamp16(a1, lo, hi))
            store16(out, ob + c2, clamp16(a2, lo, hi))
            store16(out, ob + c3, clamp16(a3, lo, hi))


def any_plan(x_shape, out_shape, kh, kw, sh, sw, dh, dw, pt, pl, mult, wt, bias):
    """The task count (output rows) and int64 parameters of :func:`_any_task`: the
    geometry, whether taps in the padding may be skipped, then the taps in XNNPACK's
    order. Adding ``0 * w`` leaves a sum as it is when ``w`` is finite, unless the sum is
    -0 (then +0); a sum from a bias that is not -0 never is (a sum that comes out zero
    is +0), so with finite weights and no -0 in the bias the padding is skipped (a 7x7
    SAME window over 21x21 pixels: 16% of the taps)."""
    n_size, h, w, c = x_shape
    taps = depthwise_taps(kh, kw, mult)
    skip_padding = bool(np.isfinite(wt).all() and not (np.signbit(bias) & (bias == 0)).any())
    params = (n_size, h, w, c, out_shape[1], out_shape[2], kh, kw, sh, sw, dh, dw, pt, pl, mult, int(skip_padding),
              len(taps))
    return n_size * out_shape[1], np.concatenate([np.array(params, np.int64), taps.reshape(-1)])


@kernel("DEPTHWISE_CONV_2D")
def depthwise_conv2d(ctx: NodeContext):
    """DEPTHWISE_CONV_2D with any depth multiplier, stride, dilation and padding: 5x5 with
    multiplier 1, no dilation, stride 1 or 2, C >= 16 and output rows of 3 pixels or more
    takes :func:`_k5_task`; 3x3 with
    multiplier 1 at stride 1 (any dilation) or stride 2 (no dilation) :func:`_s1_task` /
    :func:`_s2_task`; the rest :func:`_any_task`. All sum in XNNPACK's order (the module
    docstring)."""
    w_spec = ctx.inputs[1]
    bias = constant_bias(ctx, w_index=1, x_index=0, bias_index=2)
    if bias is None:
        return None
    attrs = ctx.attrs
    n, h, w, c = ctx.inputs[0].shape
    _, kh, kw, oc = w_spec.shape
    if oc % c:
        return None
    mult = oc // c
    sh, sw, dh, dw, pt, pl = window_geometry(attrs, h, w, kh, kw)
    wt = np.ascontiguousarray(np.asarray(w_spec.value, dtype=F32).reshape(kh, kw, oc))
    lo, hi = clamp_bounds(attrs["activation"])

    out_shape = tuple(ctx.outputs[0].shape)
    if (kh, kw, mult, dh, dw) == (5, 5, 1, 1, 1) and sh == sw and sh in (1, 2) and c >= 16 and out_shape[2] >= 3:
        tasks, params = framed_plan((n, h, w, c), out_shape, kh, sh, pt, pl)
        params, frames = framed_scratch(params, kh, current_threads())
        return _task_kernel(_k5_task, tasks, params, (wt, bias), lo, hi, out_shape, scratch=(frames,))
    if (kh, kw, mult, sh, sw) == (3, 3, 1, 1, 1):
        wp = repeated_weights(wt, bias)
        tasks, params = depthwise3x3_s1((n, h, w, c), out_shape, dh, dw, pt, pl, wp.shape[1])
        return _task_kernel(_s1_task, tasks, params, (wt, bias, wp, np.zeros(w * c, F32)), lo, hi, out_shape,
                            scratch=(np.empty(3 * out_shape[2] * c, F32),))
    if (kh, kw, mult, sh, sw, dh, dw) == (3, 3, 1, 2, 2, 1, 1):
        tasks, params = depthwise3x3_s2((n, h, w, c), out_shape, pt, pl)
        return _task_kernel(_s2_task, tasks, params, (wt, bias), lo, hi, out_shape)

    tasks, params = any_plan((n, h, w, c), out_shape, kh, kw, sh, sw, dh, dw, pt, pl, mult, wt, bias)
    return _task_kernel(_any_task, tasks, params, (wt.reshape(kh * kw, oc), bias), lo, hi, out_shape)


def _task_kernel(task: TaskFunction, tasks: int, params: np.ndarray, consts: tuple, lo, hi,
                 out_shape: tuple, scratch: tuple = ()):
    """A bindable kernel running ``task`` over ``tasks`` tasks on input 0 (a0), the
    constant arrays ``consts`` (a1 ..), output 0 and the ``scratch`` arrays (after them),
    with ``params`` and (lo, hi).
    The task reads the shapes from ``params``, so the arrays are checked against them;
    :func:`.tasks.bind_task` copies an input, and writes an output through scratch, that
    is not C-contiguous float32."""
    floats = np.array([lo, hi], F32)
    in_shape = tuple(int(v) for v in params[:4])

    def bind(inputs: list, outputs: list):
        x, out = inputs[0], outputs[0]
        if x.shape != in_shape or out.shape != out_shape:
            raise ValueError(f"depthwise kernel built for input {in_shape} and output {out_shape}, "
                             f"given {x.shape} and {out.shape}")
        return bind_task(task, tasks, (x, *consts), (out, *scratch), params, floats)
    return bindable(bind)
