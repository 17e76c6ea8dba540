"""Hybrid (dynamic-range) TRANSPOSE_CONV: float input and output, constant symmetric int8
weights, bit for bit as the op's hybrid reference (:mod:`litegpu.ops.hybrid`) and so as
LiteRT, which runs such a node one of two ways (``attrs["xnnpack"]``):

- XNNPACK's qd8-f32-qc8w deconvolution, when the output shape, weights and bias are
  constants of the file and the activation a clamp: each image quantized as XNNPACK's
  f32 -> qd8 convert, exact int32 sums, then ``float(sum) * image_scale`` and one fused
  multiply-add with the weight's scale and the bias (in float64, rounded once, as the
  reference), then the clamp;
- TFLite's builtin ``HybridTransposeConv`` otherwise (a Keras Conv2DTranspose with a
  dynamic batch computes its output shape with SHAPE and PACK: unet's decoder): each image
  quantized as its ``AsymmetricQuantizeFloats``, then every product ``float(q * w) *
  channel_scale * image_scale`` added in float32, one at a time, in the kernel's order
  (input row, column, channel), then the bias and the clamp.

Two task functions chained into one plan: :func:`_quantize_task` (an image per task) writes
each value's ``q - zp`` as int32 and the image's scale; :func:`_builtin_task` or
:func:`_xnnpack_task` (a block of output rows per task) gathers, for each output pixel, the
taps that land on it. Walking the taps backwards (a later tap row meets an earlier input
row) and the channels forwards visits a pixel's products in TFLite's order; the inner
loop runs over the output channels, contiguous, and vectorizes.
"""
from __future__ import annotations

import numpy as np

from litegpu.backend import NodeContext

from ..jit import njit
from .common import clamp_bounds, optional_input, transpose_pad_before
from .registry import bindable, kernel, named
from .tasks import bind_task, in_sequence, int32_pointer, row_tasks, task_function

F32 = np.dtype(np.float32)
I8 = np.dtype(np.int8)
# Outputs from which the gather is cut into tasks (blocks of output rows), and the tasks.
_PARALLEL_SIZE = 1 << 15
_TASKS = 8

# ip layout of the quantize and gather tasks.
_N, _H, _W, _C, _OH, _OW, _O, _KH, _KW, _SH, _SW, _PT, _PL, _ROWS, _CHUNK, _STYLE = range(16)
_XNNPACK, _TFLITE = 0, 1


# -- input quantization (one image per task) ----------------------------------------------------


@njit(cache=True, inline="always")
def _xnnpack_params(lo, hi):   # pragma: no cover - compiled
    """``(1 / scale, zp)`` of XNNPACK's ``xnn_qd8_asymmetric_quantization_params`` for the
    range [lo, hi] (holding 0), all in float32 (see :func:`litegpu.ops.hybrid.xnn_quantize_rows`)."""
    inv = np.float32(1) if lo == hi else np.float32(255) / (hi - lo)
    low_scaled, high_scaled = lo * inv, hi * inv
    if (np.float32(-128) + low_scaled) + (np.float32(127) + high_scaled) > np.float32(0):
        zp = np.float32(-128) - low_scaled
    else:
        zp = np.float32(127) - high_scaled
    zp = np.rint(min(max(zp, np.float32(-128)), np.float32(127)))
    return inv, np.int32(zp)


@njit(cache=True, inline="always")
def _tflite_params(lo, hi):   # pragma: no cover - compiled
    """``(scale, zp)`` of TFLite's ``AsymmetricQuantizeFloats`` for the range [lo, hi]
    (holding 0, not empty): the span in float32 divided in float64, the zero point from the
    end with the smaller error, rounded half away from zero, clamped (see
    :func:`litegpu.ops.hybrid.tflite_quantize_rows`)."""
    wide = np.float64(hi - lo) / 255.0
    rmin, rmax = np.float64(lo) / wide, np.float64(hi) / wide
    zp_real = -128.0 - rmin if 128.0 + abs(rmin) < 127.0 + abs(rmax) else 127.0 - rmax
    if zp_real <= -128.0:
        zp = -128.0
    elif zp_real >= 127.0:
        zp = 127.0
    else:
        zp = np.trunc(zp_real + np.copysign(0.5, zp_real))
    return np.float32(wide), np.int32(zp)


@task_function()
def _quantize_task(t, xp, qp, scalep, _a3, _a4, _a5, _a6, _a7, ip, fp):   # pragma: no cover - compiled
    """Image ``t`` of x [N, H*W*C] into ``q - zp`` (int32, same shape) and its scale
    ``scale[t]``, as XNNPACK (style 0) or TFLite (style 1) quantizes it. TFLite's values:
    ``round(x * (1 / scale)) + zp``, its vector loop (the first K // 8 * 8) rounding as
    ``trunc(v + copysign(0.5, v))`` in float32, its tail exactly (see
    :func:`litegpu.ops.hybrid.tflite_asymmetric_quantize_rows`)."""
    k = ip[_H] * ip[_W] * ip[_C]
    q = int32_pointer(qp)
    start = t * k
    lo, hi = np.float32(0), np.float32(0)
    for i in range(start, start + k):
        lo = min(lo, xp[i])
        hi = max(hi, xp[i])
    if ip[_STYLE] == _XNNPACK:
        inv, zp = _xnnpack_params(lo, hi)
        scalep[t] = np.float32(1) / inv
        for i in range(start, start + k):
            r = np.int32(np.rint(xp[i] * inv))
            q[i] = min(max(r + zp, np.int32(-128)), np.int32(127)) - zp
        return
    if lo == hi:
        scalep[t] = np.float32(1)
        for i in range(start, start + k):
            q[i] = np.int32(0)
        return
    scale, zp = _tflite_params(lo, hi)
    scalep[t] = scale
    inv = np.float32(1) / scale
    vector = start + k // 8 * 8
    for i in range(start, vector):
        v = xp[i] * inv
        r = np.int32(np.trunc(v + (np.float32(-0.5) if v < 0 else np.float32(0.5))))   # float32 addition
        q[i] = min(max(r + zp, np.int32(-128)), np.int32(127)) - zp
    for i in range(vector, start + k):
        v = np.float64(xp[i] * inv)
        r = np.int32(np.trunc(v + (-0.5 if v < 0 else 0.5)))                           # exact
        q[i] = min(max(r + zp, np.int32(-128)), np.int32(127)) - zp


# -- the gather (a block of output rows per task) -----------------------------------------------


@njit(cache=True, inline="always")
def _tap(out, pad, k, stride, size):   # pragma: no cover - compiled
    """The input index that tap ``k`` of output index ``out`` reads, or -1 when none."""
    y = out + pad - k
    if y < 0 or y % stride != 0 or y // stride >= size:
        return -1
    return y // stride


@task_function()
def _builtin_task(t, qp, wp, channelp, biasp, imagep, outp, accp, _a7, ip, fp):   # pragma: no cover - compiled
    """Output rows ``t * chunk ..`` of TFLite's hybrid transpose conv: per pixel, from 0,
    ``float(q * w) * channel_scale * image_scale`` for each tap (backwards) and input
    channel (forwards) in float32, then ``+ bias`` and the clamp ``fp[0], fp[1]``. q: [N,
    H, W, C] int32, w: [KH, KW, C, O] float32 (exact small integers), acc: O floats per task."""
    q = int32_pointer(qp)
    h, w, c, oh, ow, o = ip[_H], ip[_W], ip[_C], ip[_OH], ip[_OW], ip[_O]
    kh, kw = ip[_KH], ip[_KW]
    at = t * o
    for row in range(t * ip[_CHUNK], min(ip[_ROWS], (t + 1) * ip[_CHUNK])):
        n, oy = row // oh, row % oh
        scale = imagep[n]
        for ox in range(ow):
            for j in range(o):
                accp[at + j] = np.float32(0)
            for fy in range(kh - 1, -1, -1):
                iy = _tap(oy, ip[_PT], fy, ip[_SH], h)
                if iy < 0:
                    continue
                for fx in range(kw - 1, -1, -1):
                    ix = _tap(ox, ip[_PL], fx, ip[_SW], w)
                    if ix < 0:
                        continue
                    x_at, w_at = ((n * h + iy) * w + ix) * c, (fy * kw + fx) * c * o
                    for ch in range(c):
                        v = np.float32(q[x_at + ch])
                        base = w_at + ch * o
                        for j in range(o):
                            accp[at + j] += v * wp[base + j] * channelp[j] * scale
            dst = (row * ow + ox) * o
            for j in range(o):
                outp[dst + j] = min(max(accp[at + j] + biasp[j], fp[0]), fp[1])


@task_function()
def _xnnpack_task(t, qp, wp, channelp, biasp, imagep, outp, accp, _a7, ip, fp):   # pragma: no cover - compiled
    """Output rows ``t * chunk ..`` of XNNPACK's qd8 deconvolution: per pixel the exact
    int32 sums of ``q * w`` over the taps landing on it, then ``float(sum) * image_scale``
    in float32, times the channel's scale plus the bias in float64 rounded once (the fused
    multiply-add), the clamp ``fp[0], fp[1]``. q: [N, H, W, C] int32, w: [KH, KW, C, O]
    int32, acc: O int32 per task."""
    q, wt, acc = int32_pointer(qp), int32_pointer(wp), int32_pointer(accp)
    h, w, c, oh, ow, o = ip[_H], ip[_W], ip[_C], ip[_OH], ip[_OW], ip[_O]
    kh, kw = ip[_KH], ip[_KW]
    at = t * o
    for row in range(t * ip[_CHUNK], min(ip[_ROWS], (t + 1) * ip[_CHUNK])):
        n, oy = row // oh, row % oh
        scale = imagep[n]
        for ox in range(ow):
            for j in range(o):
                acc[at + j] = np.int32(0)
            for fy in range(kh):
                iy = _tap(oy, ip[_PT], fy, ip[_SH], h)
                if iy < 0:
                    continue
                for fx in range(kw):
                    ix = _tap(ox, ip[_PL], fx, ip[_SW], w)
                    if ix < 0:
                        continue
                    x_at, w_at = ((n * h + iy) * w + ix) * c, (fy * kw + fx) * c * o
                    for ch in range(c):
                        v = q[x_at + ch]
                        base = w_at + ch * o
                        for j in range(o):
                            acc[at + j] += v * wt[base + j]
            dst = (row * ow + ox) * o
            for j in range(o):
                y = np.float64(np.float32(acc[at + j]) * scale) * np.float64(channelp[j]) + np.float64(biasp[j])
                outp[dst + j] = min(max(np.float32(y), fp[0]), fp[1])


# -- the factory --------------------------------------------------------------------------------


@kernel("TRANSPOSE_CONV", quantized=True)
def hybrid_transpose_conv(ctx: NodeContext):
    """A hybrid TRANSPOSE_CONV's kernel (see the module docstring); None for any other
    node, and for a hybrid one it cannot take (weights not int8 [O, KH, KW, C], a bias
    not float32 or, on XNNPACK's path, computed at run time, an empty shape): the
    reference runs those."""
    attrs = ctx.attrs
    if not attrs.get("hybrid") or "xnnpack" not in attrs:
        return None
    w_spec, x_spec, bias_spec = ctx.inputs[1], ctx.inputs[2], optional_input(ctx, 3)
    if w_spec.value is None or np.dtype(w_spec.dtype) != I8 or np.asarray(w_spec.value).ndim != 4 \
            or np.dtype(x_spec.dtype) != F32 or np.dtype(ctx.outputs[0].dtype) != F32:
        return None
    if bias_spec is not None and np.dtype(bias_spec.dtype) != F32:
        return None
    if bias_spec is not None and bias_spec.value is None and attrs["xnnpack"]:
        return None
    n, h, w, c = x_spec.shape
    o, kh, kw, ci = np.asarray(w_spec.value).shape
    on, oh, ow, oc = ctx.outputs[0].shape
    if ci != c or oc != o or on != n or min(n, h, w, c, oh, ow, o) == 0:
        return None
    sh, sw = attrs["stride"]
    pt = transpose_pad_before(attrs["padding"], oh, kh, sh)
    pl = transpose_pad_before(attrs["padding"], ow, kw, sw)
    xnnpack = bool(attrs["xnnpack"])
    # [O, KH, KW, C] -> [KH, KW, C, O]: a tap's weights for one input channel are contiguous.
    w_taps = np.ascontiguousarray(np.asarray(w_spec.value).transpose(1, 2, 3, 0), np.int32 if xnnpack else F32)
    channel = np.ascontiguousarray(attrs["weight_scale"], F32)
    rows = n * oh
    tasks, chunk = row_tasks(rows, rows * ow * o, _PARALLEL_SIZE, _TASKS)
    params = np.array([n, h, w, c, oh, ow, o, kh, kw, sh, sw, pt, pl, rows, chunk,
                       _XNNPACK if xnnpack else _TFLITE], np.int64)
    clamp = np.array(clamp_bounds(attrs["activation"]), np.float32)
    q = np.empty(n * h * w * c, np.int32)
    image_scale = np.empty(n, np.float32)
    acc = np.empty(tasks * o, np.int32 if xnnpack else F32)
    zeros = np.zeros(o, F32)
    gather = _xnnpack_task if xnnpack else _builtin_task

    def bind(inputs, outputs):
        bias = zeros if bias_spec is None else inputs[3].reshape(-1)
        quantize = bind_task(_quantize_task, n, (inputs[2],), (q, image_scale), params,
                             dtypes=(F32, np.int32, F32))
        sums = bind_task(gather, tasks, (q, w_taps, channel, bias, image_scale), (outputs[0], acc), params, clamp,
                         dtypes=(np.int32, w_taps.dtype, F32, F32, F32, F32, acc.dtype))
        return in_sequence([quantize, sums])
    path = "XNNPACK's qd8 deconvolution" if xnnpack else "TFLite's hybrid kernel"
    return named(bindable(bind), f"hybrid transpose conv ({kh}x{kw}/{sh}): {path}")
