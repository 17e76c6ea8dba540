"""Quantized int8 DEPTHWISE_CONV_2D (multiplier 1): ``out = requantize(bias + sum over taps
(x - zx) * w)`` per channel, as LiteRT's XNNPACK path computes it.

A task is one output row. Its int32 sums for one pixel live in a scratch row of C lanes
(the task's own), each tap one pass over the channels: int8 loads widened to int32,
multiplied and added, which LLVM vectorizes across the channels. Taps outside the image
are skipped: they would add ``(zx - zx) * w = 0`` (LiteRT pads with the zero point).
The requantization is the one of :mod:`.qgemm`: the sum times a float32 scale per
channel, clamped to the activation's range less the output zero point, rounded to
nearest even, plus the zero point.
"""
from __future__ import annotations

import numpy as np

from .tasks import bind_task, int32_pointer, int8_pointer, task_function

# ip layout of :func:`_qdepthwise_task`.
_H, _W, _C, _OH, _OW, _KH, _KW, _SH, _SW, _DH, _DW, _PT, _PL, _ZX, _ZO, _LO, _HI = range(17)


@task_function()
def _qdepthwise_task(t, xp, wp, initp, scalep, outp, scratchp, _a6, _a7, ip, fp):
    """Output row ``t`` (image ``t // OH``, row ``t % OH``) of an int8 depthwise conv: ``x``
    [N, H, W, C], ``w`` [KH, KW, C], int32 ``init`` (the bias) and float32 ``scale`` per
    channel, ``out`` [N, OH, OW, C], ``scratch`` C int32 per task."""
    h, w, c, oh, ow = ip[_H], ip[_W], ip[_C], ip[_OH], ip[_OW]
    kh, kw, sh, sw, dh, dw, pt, pl = ip[_KH], ip[_KW], ip[_SH], ip[_SW], ip[_DH], ip[_DW], ip[_PT], ip[_PL]
    zx, zo = np.int32(ip[_ZX]), ip[_ZO]
    lo, hi = np.float32(ip[_LO] - zo), np.float32(ip[_HI] - zo)
    x, wt, out = int8_pointer(xp), int8_pointer(wp), int8_pointer(outp)
    init, acc = int32_pointer(initp), int32_pointer(scratchp)
    image, y = t // oh, t % oh
    acc_at = t * c
    for ox in range(ow):
        for ch in range(c):
            acc[acc_at + ch] = init[ch]
        for ky in range(kh):
            iy = y * sh - pt + ky * dh
            if iy < 0 or iy >= h:
                continue
            for kx in range(kw):
                ix = ox * sw - pl + kx * dw
                if ix < 0 or ix >= w:
                    continue
                x_at = ((image * h + iy) * w + ix) * c
                w_at = (ky * kw + kx) * c
                for ch in range(c):
                    acc[acc_at + ch] += (np.int32(x[x_at + ch]) - zx) * np.int32(wt[w_at + ch])
        out_at = ((image * oh + y) * ow + ox) * c
        for ch in range(c):
            value = min(max(np.float32(acc[acc_at + ch]) * scalep[ch], lo), hi)
            out[out_at + ch] = np.int8(np.int32(np.rint(value)) + zo)


class QuantizedDepthwise:
    """``bind(x [N, H, W, C] int8, out [N, OH, OW, C] int8) -> call`` for a multiplier-1
    depthwise conv with the constant int8 ``w`` [KH, KW, C], int32 ``bias`` (or None),
    float32 ``scales`` per channel (or one), the zero points and the activation's bounds
    ``lo .. hi`` (quantized); ``geometry``: (sh, sw, dh, dw, pt, pl)."""

    def __init__(self, w: np.ndarray, bias: np.ndarray | None, x_zero_point: int, scales: np.ndarray,
                 out_zero_point: int, lo: int, hi: int, geometry: tuple[int, ...]) -> None:
        if w.dtype != np.int8 or w.ndim != 3:
            raise ValueError(f"quantized depthwise takes int8 weights [KH, KW, C], not {w.dtype} {w.shape}")
        self.kh, self.kw, self.c = w.shape
        self.weights = np.ascontiguousarray(w)
        self.init = np.zeros(self.c, np.int32) if bias is None else np.ascontiguousarray(bias, np.int32)
        self.scales = np.ascontiguousarray(np.broadcast_to(np.asarray(scales, np.float32), (self.c,)))
        self.geometry = tuple(int(g) for g in geometry)
        self.quant = (int(x_zero_point), int(out_zero_point), int(lo), int(hi))

    def bind(self, x: np.ndarray, out: np.ndarray):
        """The call on these arrays (shapes checked: the kernel trusts them)."""
        n, h, w, c = x.shape
        on, oh, ow, oc = out.shape
        if x.dtype != np.int8 or out.dtype != np.int8 or c != self.c or oc != c or on != n:
            raise ValueError(f"quantized depthwise over {self.c} channels given {x.shape} {x.dtype} -> "
                             f"{out.shape} {out.dtype}")
        scratch = np.empty(n * oh * c, np.int32)
        params = np.array([h, w, c, oh, ow, self.kh, self.kw, *self.geometry, *self.quant], np.int64)
        return bind_task(_qdepthwise_task, n * oh, (x, self.weights, self.init, self.scales), (out, scratch), params,
                         dtypes=(np.int8, np.int8, np.int32, np.float32, np.int8, np.int32))
