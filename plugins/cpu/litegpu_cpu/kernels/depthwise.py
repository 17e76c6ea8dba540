"""DEPTHWISE_CONV_2D (numba): fast paths for the common 3x3, multiplier-1 convolutions.

The general kernel (:func:`.conv.depthwise`) and the earlier 3x3 one vectorize the loop
over one pixel's channels. Its trip count is known only at run time, so each pixel pays
the loop's setup and LLVM's run-time alias checks, and LLVM's vector body (64 floats)
leaves C = 16 or 32 to narrow or scalar epilogues: 10-20 GFLOP/s on the shapes of
face_landmark and mobilenet_v2 (1 thread, Zen 4). Both paths here reuse each loaded
input and weight vector for several outputs:

- stride 1 (any dilation), :func:`_s1_task`: an output row's interior, flattened
  over (column, channel), is a sum of nine contiguous input-row segments times weights
  repeated along the row, so one long loop vectorizes at full width for any C; four
  output rows share six input rows;
- stride 2, :func:`_s2_task`: 2x2 output pixels per channel loop share a 5x5 input
  window. Its arrays are ``noalias`` pointers, so LLVM vectorizes the channel loop with
  no run-time alias checks (with them it gives up: "too many memory checks").

Pixels whose window crosses the border take :func:`_edge_pixel`. Both are task functions
run by :func:`.tasks.run_plan` (see :mod:`.tasks`: as ``prange`` kernels they took
4-6 s each to compile cold).

5x5 (stride 1 or 2, multiplier 1, no dilation, C >= 16) takes :func:`_k5_task`: a task
is one block of 16 channels (one AVX-512 vector) over a band of output rows. It copies
its band of the input, those 16 channels, into a zero-padded frame (``[rows][cols][16]``,
in L1/L2), so no pixel needs an edge test; then its K*K weight vectors stay in registers
for every pixel, each tap one FMA with a memory operand. The general kernel instead
loads and stores its accumulator per tap (3 memory operations per FMA). The frame copy
and zero fill go by 16-float vector intrinsics (:func:`_copy16`, zeros copied from one
:func:`_zero16` vector: numba leaves LLVM's SLP vectorizer off, so a 16-iteration copy
loop is unrolled into scalar moves, and LLVM turns runs of zero stores into a memset
call each: 3-4x slower fills). The taps sum as K partial sums per row, not one chain
(four-cycle FMA latency), with only ``contract`` fastmath, so that LLVM does not
reassociate them back into a chain. 14x14x240 stride 1 on one thread: 0.113 -> 0.050 ms.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import carray, njit, types
from numba.extending import intrinsic

from litegpu.backend import NodeContext

from .common import F32, clamp_bounds, constant_bias, window_geometry
from .conv import _CONTRACT, depthwise
from .registry import bindable, kernel
from .tasks import TaskFunction, bind_task, task_function

# Floats of an output row per pass of :func:`_rows4`, so that its ten weight rows stay in
# L1 (96x96x16 .. 14x14x576: 256-1024 alike; weights repeated along whole rows, 9*OW*C
# floats, up to 290 KB a layer, were no faster).
_CHUNK = 512


@njit(cache=True)
def _edge_pixel(x, wt, bias, out, n, oh, ow, ih0, iw0, dh, dw, lo, hi):
    """Output pixel ``out[n, oh, ow]`` of a 3x3 depthwise conv (multiplier 1) whose window at
    (ih0, iw0) may cross the border: taps outside the image add 0, as in the reference's
    zero padding. They read a clamped, valid pixel whose product is then dropped, so the
    nine taps still sum in a register: 1.7-2.3x faster than a pass over the channels per
    tap (28x28x144, 56x56x16). Indexes the arrays directly (no views), so that it keeps
    the callers' parallel bodies alias-free (see the module docstring). Called, not
    inlined: inlined at its five call sites it made the two parallel kernels take 24 s to
    compile cold instead of 10 s, for no measurable speed."""
    h, w = x.shape[1], x.shape[2]
    i0, i1, i2 = min(max(ih0, 0), h - 1), min(max(ih0 + dh, 0), h - 1), min(max(ih0 + 2 * dh, 0), h - 1)
    j0, j1, j2 = min(max(iw0, 0), w - 1), min(max(iw0 + dw, 0), w - 1), min(max(iw0 + 2 * dw, 0), w - 1)
    r0, r1, r2 = i0 == ih0, i1 == ih0 + dh, i2 == ih0 + 2 * dh          # which taps lie inside
    c0, c1, c2 = j0 == iw0, j1 == iw0 + dw, j2 == iw0 + 2 * dw
    zero = np.float32(0)
    for c in range(out.shape[3]):
        v = bias[c]
        p = x[n, i0, j0, c] * wt[0, 0, c]
        v += p if r0 and c0 else zero
        p = x[n, i0, j1, c] * wt[0, 1, c]
        v += p if r0 and c1 else zero
        p = x[n, i0, j2, c] * wt[0, 2, c]
        v += p if r0 and c2 else zero
        p = x[n, i1, j0, c] * wt[1, 0, c]
        v += p if r1 and c0 else zero
        p = x[n, i1, j1, c] * wt[1, 1, c]
        v += p if r1 and c1 else zero
        p = x[n, i1, j2, c] * wt[1, 2, c]
        v += p if r1 and c2 else zero
        p = x[n, i2, j0, c] * wt[2, 0, c]
        v += p if r2 and c0 else zero
        p = x[n, i2, j1, c] * wt[2, 1, c]
        v += p if r2 and c1 else zero
        p = x[n, i2, j2, c] * wt[2, 2, c]
        v += p if r2 and c2 else zero
        out[n, oh, ow, c] = min(max(v, lo), hi)


@njit(cache=True, fastmath=_CONTRACT)
def _rows4(y0, y1, y2, y3, x0, x1, x2, x3, x4, x5, a, s, wp, lo, hi):
    """Four flattened output-row segments of a stride-1 3x3 depthwise conv:
    ``y_i[j] = clamp(bias + sum_{k, kw} x_{i+k}[a + kw*s + j] * w[k, kw])``, rows ``x0..x5``
    flattened over (column, channel), ``s`` the tap step (dilation * C). ``wp`` holds the
    nine weight rows and the bias (row 9), each repeated along ``P`` floats, ``P`` a
    multiple of C: the segment goes in passes of ``P``, so the weights stay cached.
    Each input value loaded serves up to three output rows (28 loads per 4 outputs
    where a pixel at a time takes 19 per output)."""
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
            o0 = (bj + p0[j] * a0 + p1[j] * a1 + p2[j] * a2 + Q0 * a3 + Q1 * a4 + Q2 * a5
                  + R0 * a6 + R1 * a7 + R2 * a8)
            o1 = bj + Q0 * a0 + Q1 * a1 + Q2 * a2 + R0 * a3 + R1 * a4 + R2 * a5 + T0 * a6 + T1 * a7 + T2 * a8
            o2 = bj + R0 * a0 + R1 * a1 + R2 * a2 + T0 * a3 + T1 * a4 + T2 * a5 + U0 * a6 + U1 * a7 + U2 * a8
            o3 = (bj + T0 * a0 + T1 * a1 + T2 * a2 + U0 * a3 + U1 * a4 + U2 * a5
                  + v0[j] * a6 + v1[j] * a7 + v2[j] * a8)
            z0[j] = min(max(o0, lo), hi)
            z1[j] = min(max(o1, lo), hi)
            z2[j] = min(max(o2, lo), hi)
            z3[j] = min(max(o3, lo), hi)


@task_function(fastmath=_CONTRACT)
def _s1_task(g, xp, wtp, biasp, wpp, zerop, outp, _a6, _a7, ip, fp):
    """Task ``g`` of the 3x3 depthwise conv, stride 1, multiplier 1, any dilation: the
    group of four output rows ``dh`` apart that :func:`depthwise3x3_s1` numbers ``g``
    (so that they share six input rows). ``wp``: see :func:`_rows4`; ``zero``: a row of
    zeros, W*C floats, standing for input rows in the padding, so only the border columns
    take :func:`_edge_pixel`. A group past the last row writes its missing rows to
    scratch."""
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
        # Distinct scratch rows: rows that may overlap would send LLVM to its scalar loop.
        spare = np.empty((3, j1 - j0 if oh0 + 3 * dh >= oh_size else 0), F32)
        y0 = out[n, oh0].reshape(ow_size * c)[j0:j1]
        y1 = out[n, oh0 + dh].reshape(ow_size * c)[j0:j1] if oh0 + dh < oh_size else spare[0]
        y2 = out[n, oh0 + 2 * dh].reshape(ow_size * c)[j0:j1] if oh0 + 2 * dh < oh_size else spare[1]
        y3 = out[n, oh0 + 3 * dh].reshape(ow_size * c)[j0:j1] if oh0 + 3 * dh < oh_size else spare[2]
        x0 = x[n, ih0].reshape(w * c) if 0 <= ih0 < h else zero
        x1 = x[n, ih0 + dh].reshape(w * c) if 0 <= ih0 + dh < h else zero
        x2 = x[n, ih0 + 2 * dh].reshape(w * c) if 0 <= ih0 + 2 * dh < h else zero
        x3 = x[n, ih0 + 3 * dh].reshape(w * c) if 0 <= ih0 + 3 * dh < h else zero
        x4 = x[n, ih0 + 4 * dh].reshape(w * c) if 0 <= ih0 + 4 * dh < h else zero
        x5 = x[n, ih0 + 5 * dh].reshape(w * c) if 0 <= ih0 + 5 * dh < h else zero
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
        v00 = b + a0 * w0 + a1 * w1 + a2 * w2 + b0 * w3 + b1 * w4 + b2 * w5 + c0 * w6 + c1 * w7 + c2 * w8
        v01 = b + a2 * w0 + a3 * w1 + a4 * w2 + b2 * w3 + b3 * w4 + b4 * w5 + c2 * w6 + c3 * w7 + c4 * w8
        v10 = b + c0 * w0 + c1 * w1 + c2 * w2 + d0 * w3 + d1 * w4 + d2 * w5 + e0 * w6 + e1 * w7 + e2 * w8
        v11 = b + c2 * w0 + c3 * w1 + c4 * w2 + d2 * w3 + d3 * w4 + d4 * w5 + e2 * w6 + e3 * w7 + e4 * w8
        out[n, oh, ow, c] = min(max(v00, lo), hi)
        out[n, oh, ow + 1, c] = min(max(v01, lo), hi)
        out[n, oh + 1, ow, c] = min(max(v10, lo), hi)
        out[n, oh + 1, ow + 1, c] = min(max(v11, lo), hi)


@task_function(fastmath=_CONTRACT)
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
    ih0 = 2 * oh0 - pt
    if rows == 2 and ih0 >= 0 and ih0 + 5 <= h:
        for ow in range(ow_lo, ow_mid, 2):
            _block2x2_s2(x, wt, bias, out, n, oh0, ow, ih0, 2 * ow - pl, lo, hi)
        for ow in range(ow_mid, ow_hi):
            _edge_pixel(x, wt, bias, out, n, oh0, ow, ih0, 2 * ow - pl, 1, 1, lo, hi)
            _edge_pixel(x, wt, bias, out, n, oh0 + 1, ow, ih0 + 2, 2 * ow - pl, 1, 1, lo, hi)
    else:
        for i in range(rows):
            for ow in range(ow_lo, ow_hi):
                _edge_pixel(x, wt, bias, out, n, oh0 + i, ow, ih0 + 2 * i, 2 * ow - pl, 1, 1, lo, hi)
    for i in range(rows):
        for ow in range(ow_lo):
            _edge_pixel(x, wt, bias, out, n, oh0 + i, ow, ih0 + 2 * i, 2 * ow - pl, 1, 1, lo, hi)
        for ow in range(ow_hi, ow_size):
            _edge_pixel(x, wt, bias, out, n, oh0 + i, ow, ih0 + 2 * i, 2 * ow - pl, 1, 1, lo, hi)


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
def _framed_setup(g, xp, ip, k):
    """The frame of task ``g`` of a ``k`` x ``k`` framed task such as :func:`_k5_task` (see
    :func:`framed_plan` for the parameters ``ip``): a new 64-byte aligned
    ``[fh][fw][16]`` array holding input rows ``oh0*s - pt ..`` and columns ``-pl ..``,
    channels ``cb .. cb + 15``, zero outside the image. Returns it with the task's image,
    first output row, row count and first channel."""
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
    buf = np.empty(size + 32, np.float32)
    first = (-buf.ctypes.data % 64) // 4
    frame = buf[first:first + size]
    ih0 = oh0 * s - pt
    jlo = min(pl, fw)
    jhi = max(min(w + pl, fw), jlo)
    zero = buf[first + size:first + size + 16]     # a zero vector behind the frame
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


@task_function(fastmath={"contract"})
def _k5_task(g, xp, wtp, biasp, outp, _a4, _a5, _a6, _a7, ip, fp):
    """Task ``g`` of a 5x5 depthwise conv (multiplier 1, no dilation, stride 1 or 2, C >= 16):
    16 channels over a band of output rows, from a zero-padded frame
    (:func:`_framed_setup`), the 25 weight vectors held in registers."""
    q = carray(ip, 12)
    n_size, c, oh_size, ow_size, s, fw = q[0], q[3], q[4], q[5], q[6], q[11]
    wt = carray(wtp, (25, c))
    bias = carray(biasp, c)
    out = carray(outp, (n_size, oh_size, ow_size, c))
    lo, hi = fp[0], fp[1]
    frame, n, oh0, nrows, cb = _framed_setup(g, xp, ip, 5)
    d1, d2, d3, d4, row = _U(16), _U(32), _U(48), _U(64), _U(fw * 16)
    for r in range(nrows):
        o = out[n, oh0 + r]
        for ow in range(ow_size):
            u = _U((r * s * fw + ow * s) * 16)
            oo = o[ow, cb:cb + 16]
            for j in range(16):
                cc = _U(cb + j)
                v = u + _U(j)
                p0 = (bias[cc] + frame[v] * wt[_U(0), cc] + frame[v + d1] * wt[_U(1), cc]
                      + frame[v + d2] * wt[_U(2), cc] + frame[v + d3] * wt[_U(3), cc] + frame[v + d4] * wt[_U(4), cc])
                v += row
                p1 = (frame[v] * wt[_U(5), cc] + frame[v + d1] * wt[_U(6), cc] + frame[v + d2] * wt[_U(7), cc]
                      + frame[v + d3] * wt[_U(8), cc] + frame[v + d4] * wt[_U(9), cc])
                v += row
                p2 = (frame[v] * wt[_U(10), cc] + frame[v + d1] * wt[_U(11), cc] + frame[v + d2] * wt[_U(12), cc]
                      + frame[v + d3] * wt[_U(13), cc] + frame[v + d4] * wt[_U(14), cc])
                v += row
                p3 = (frame[v] * wt[_U(15), cc] + frame[v + d1] * wt[_U(16), cc] + frame[v + d2] * wt[_U(17), cc]
                      + frame[v + d3] * wt[_U(18), cc] + frame[v + d4] * wt[_U(19), cc])
                v += row
                p4 = (frame[v] * wt[_U(20), cc] + frame[v + d1] * wt[_U(21), cc] + frame[v + d2] * wt[_U(22), cc]
                      + frame[v + d3] * wt[_U(23), cc] + frame[v + d4] * wt[_U(24), cc])
                oo[j] = min(max((p0 + p1) + (p2 + p3) + p4, lo), hi)


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


@kernel("DEPTHWISE_CONV_2D")
def depthwise_conv2d(ctx: NodeContext):
    """DEPTHWISE_CONV_2D with any depth multiplier, stride, dilation and padding: 5x5 with
    multiplier 1, no dilation, stride 1 or 2 and C >= 16 takes :func:`_k5_task`; 3x3 with
    multiplier 1 at stride 1 (any dilation) or stride 2 (no dilation) :func:`_s1_task` /
    :func:`_s2_task`; the rest :func:`.conv.depthwise`."""
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
    if (kh, kw, mult, dh, dw) == (5, 5, 1, 1, 1) and sh == sw and sh in (1, 2) and c >= 16:
        tasks, params = framed_plan((n, h, w, c), out_shape, kh, sh, pt, pl)
        return _task_kernel(_k5_task, tasks, params, (wt, bias), lo, hi, out_shape)
    if (kh, kw, mult, sh, sw) == (3, 3, 1, 1, 1):
        wp = repeated_weights(wt, bias)
        tasks, params = depthwise3x3_s1((n, h, w, c), out_shape, dh, dw, pt, pl, wp.shape[1])
        return _task_kernel(_s1_task, tasks, params, (wt, bias, wp, np.zeros(w * c, F32)), lo, hi, out_shape)
    if (kh, kw, mult, sh, sw, dh, dw) == (3, 3, 1, 2, 2, 1, 1):
        tasks, params = depthwise3x3_s2((n, h, w, c), out_shape, pt, pl)
        return _task_kernel(_s2_task, tasks, params, (wt, bias), lo, hi, out_shape)

    def run(inputs, outputs):
        depthwise(inputs[0], wt, bias, outputs[0], sh, sw, dh, dw, pt, pl, mult, lo, hi)
    return run


def _task_kernel(task: TaskFunction, tasks: int, params: np.ndarray, consts: tuple, lo, hi,
                 out_shape: tuple):
    """A bindable kernel running ``task`` over ``tasks`` tasks on input 0 (a0), the
    constant arrays ``consts`` (a1 ..) and output 0 (after them), with ``params`` and
    (lo, hi).
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
        return bind_task(task, tasks, (x, *consts), (out,), params, floats)
    return bindable(bind)
