"""Quantized int8 DEPTHWISE_CONV_2D (multiplier 1): ``out = requantize(bias + sum over taps
(x - zx) * w)`` per channel, as LiteRT's XNNPACK path computes it.

A task is one output row. Where a pixel's window lies inside the image (most pixels), a
tile written in LLVM IR (:func:`_tile_codegen`) computes ``PIXELS`` neighbouring pixels x
16 channels: their int32 sums stay in registers over all the taps (int8 loads widened to
int32, multiplied, added: XNNPACK's ``mul32`` scheme), starting from ``bias - zx * sum
of the taps' weights`` so no tap subtracts the zero point; then the requantization of
:mod:`.qgemm`. The other pixels (the border, whose taps outside the image are skipped:
LiteRT pads with the zero point, which adds ``(zx - zx) * w = 0``) and channels past the
last 16 go through a plain loop whose sums live in a scratch row of the task's.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir

from ..jit import intrinsic, njit, types
from .packed import NR, carried_loop
from .qgemm import _FLOATS, _SUMS, requantizer
from .tasks import bind_task, int32_pointer, int8_pointer, task_function

# Neighbouring output pixels per tile (their sums: PIXELS vector registers).
PIXELS = 8

# ip layout of :func:`_qdepthwise_task`.
_H, _W, _C, _OH, _OW, _KH, _KW, _SH, _SW, _DH, _DW, _PT, _PL, _ZX, _ZO, _LO, _HI, _CP = range(18)

_I64 = ir.IntType(64)
_BYTES = ir.VectorType(ir.IntType(8), NR)


def tap_sums(builder, x_ptr, w_ptr, init, taps_ptr, x_at, x_step, left, taps, cpad, cb):
    """Emit the tap loop of a tile: up to PIXELS pixels (``left`` of them; the rest recompute
    the last) x 16 channels from ``cb``, their int32 sums ``init + sum over taps x * w`` in
    PIXELS registers (``init``: 16 int32 lanes; x: the window corner at byte ``x_at``,
    pixels ``x_step`` bytes apart; w: ``[taps, cpad]`` bytes; ``taps_ptr``: each tap's int64
    offset from the corner). Returns the sums and each pixel's index (i64), by pixel."""
    byte_ptr = ir.IntType(8).as_pointer()
    x_bytes, w_bytes = builder.bitcast(x_ptr, byte_ptr), builder.bitcast(w_ptr, byte_ptr)
    last = builder.sub(left, ir.Constant(_I64, 1))
    pixel = []
    for i in range(PIXELS):
        at = ir.Constant(_I64, i)
        pixel.append(builder.select(builder.icmp_signed("<", at, last), at, last))
    x_pixels = [builder.add(x_at, builder.mul(p, x_step)) for p in pixel]
    offsets = builder.bitcast(taps_ptr, _I64.as_pointer())

    def load_bytes(pointer, at):
        vector = builder.load(builder.bitcast(builder.gep(pointer, [at]), _BYTES.as_pointer()), align=1)
        return builder.sext(vector, _SUMS)

    def step(tap, sums):
        offset = builder.load(builder.gep(offsets, [tap]))
        w = load_bytes(w_bytes, builder.add(builder.mul(tap, cpad), cb))
        return [builder.add(s, builder.mul(load_bytes(x_bytes, builder.add(xp, offset)), w))
                for s, xp in zip(sums, x_pixels)]

    return carried_loop(builder, taps, [init] * PIXELS, step, "qdw.tap"), pixel


def _tile_codegen(context, builder, signature, args):
    """:func:`tap_sums`, then each pixel's 16 sums requantized and stored as int8."""
    (x_ptr, w_ptr, init_ptr, scale_ptr, out_ptr, taps_ptr, x_at, x_step, out_at, out_step, left, taps, cpad, cb,
     zo, lo, hi) = args
    init = builder.load(builder.bitcast(builder.gep(builder.bitcast(init_ptr, _SUMS.element.as_pointer()), [cb]),
                                        _SUMS.as_pointer()), align=4)
    acc, pixel = tap_sums(builder, x_ptr, w_ptr, init, taps_ptr, x_at, x_step, left, taps, cpad, cb)
    out_bytes = builder.bitcast(out_ptr, ir.IntType(8).as_pointer())
    requantize = requantizer(builder, zo, lo, hi)
    scale = builder.load(builder.bitcast(builder.gep(scale_ptr, [cb]), _FLOATS.as_pointer()), align=4)
    for sums, p in zip(acc, pixel):
        at = builder.gep(out_bytes, [builder.add(out_at, builder.mul(p, out_step))])
        builder.store(requantize(sums, scale), builder.bitcast(at, _BYTES.as_pointer()), align=1)
    return context.get_dummy_value()


@intrinsic
def _tile(typingctx, xp, wp, initp, scalep, outp, tapsp, x_at, x_step, out_at, out_step, left, taps, cpad, cb, zo,
          lo, hi):
    """The tile at input offset ``x_at`` (the first pixel's window corner, channel ``cb``)
    and output offset ``out_at``; pixels ``x_step`` / ``out_step`` bytes apart."""
    return types.void(xp, wp, initp, scalep, outp, tapsp, *[types.int64] * 11), _tile_codegen


@njit(cache=True, inline="always")
def pixel_sums(x, wt, init, acc, ip, image, y, ox, c0, c1, acc_at, zx, cpad):
    """The int32 sums of output pixel ``ox`` of row ``y`` of ``image``, channels ``c0 ..
    c1``, into ``acc[acc_at + ch]``: ``init[ch]`` plus ``(x - zx) * w`` over the taps inside
    the image (those outside are skipped: padding with the zero point adds ``(zx - zx) * w
    = 0``). ``ip`` starts with the geometry H, W, C, OH, OW, KH, KW, SH, SW, DH, DW, PT, PL;
    w is ``[taps, cpad]``."""
    h, w, c = ip[_H], ip[_W], ip[_C]
    kh, kw, sh, sw, dh, dw, pt, pl = ip[_KH], ip[_KW], ip[_SH], ip[_SW], ip[_DH], ip[_DW], ip[_PT], ip[_PL]
    for ch in range(c0, c1):
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
            w_at = (ky * kw + kx) * cpad
            for ch in range(c0, c1):
                acc[acc_at + ch] += (np.int32(x[x_at + ch]) - zx) * np.int32(wt[w_at + ch])


@njit(cache=True, inline="always")
def inner_pixels(ip, y):
    """``(ox0, ox1)``: the pixels of output row ``y`` whose every tap lies inside the image
    (the tiles' pixels; ``ip`` starts with the geometry, as for :func:`pixel_sums`), none
    (0, 0) when the row's windows leave the image at the top or bottom."""
    h, w, ow = ip[_H], ip[_W], ip[_OW]
    kh, kw, sh, sw, dh, dw, pt, pl = ip[_KH], ip[_KW], ip[_SH], ip[_SW], ip[_DH], ip[_DW], ip[_PT], ip[_PL]
    iy = y * sh - pt
    if iy < 0 or iy + (kh - 1) * dh >= h:
        return 0, 0
    ox0 = min(ow, (pl + sw - 1) // sw)
    return ox0, max(ox0, min(ow, (w - 1 + pl - (kw - 1) * dw) // sw + 1))


@njit(cache=True, inline="always")
def _plain_pixels(x, wt, init, scalep, out, acc, ip, image, y, ox0, ox1, c0, c1, acc_at):
    """Pixels ``ox0 .. ox1`` of output row ``y``, channels ``c0 .. c1``, taps outside the
    image skipped; sums in ``acc`` (the task's scratch row)."""
    c, oh, ow = ip[_C], ip[_OH], ip[_OW]
    zx, zo = np.int32(ip[_ZX]), ip[_ZO]
    lo, hi = np.float32(ip[_LO] - zo), np.float32(ip[_HI] - zo)
    for ox in range(ox0, ox1):
        pixel_sums(x, wt, init, acc, ip, image, y, ox, c0, c1, acc_at, zx, ip[_CP])
        out_at = ((image * oh + y) * ow + ox) * c
        for ch in range(c0, c1):
            value = min(max(np.float32(acc[acc_at + ch]) * scalep[ch], lo), hi)
            out[out_at + ch] = np.int8(np.int32(np.rint(value)) + zo)


@task_function()
def _qdepthwise_task(t, xp, wp, initp, innerp, scalep, tapsp, outp, scratchp, ip, fp):
    """Output row ``t`` (image ``t // OH``, row ``t % OH``) of an int8 depthwise conv: ``x``
    [N, H, W, C], ``w`` [KH * KW, CP] (CP: C rounded up to 16), int32 ``init`` (the bias)
    and ``inner`` (the tiles' starting sums) and float32 ``scale`` per channel, ``taps``
    the int64 input offset of each tap from the window's corner, ``out`` [N, OH, OW, C],
    ``scratch`` C int32 per task."""
    h, w, c, oh, ow = ip[_H], ip[_W], ip[_C], ip[_OH], ip[_OW]
    sh, sw, pt, pl = ip[_SH], ip[_SW], ip[_PT], ip[_PL]
    x, wt, out = int8_pointer(xp), int8_pointer(wp), int8_pointer(outp)
    init, acc = int32_pointer(initp), int32_pointer(scratchp)
    image, y = t // oh, t % oh
    acc_at = t * c
    whole = c // NR * NR
    ox0, ox1 = inner_pixels(ip, y) if whole else (0, 0)
    iy = y * sh - pt
    _plain_pixels(x, wt, init, scalep, out, acc, ip, image, y, 0, ox0, 0, c, acc_at)
    for ox in range(ox0, ox1, PIXELS):
        x_at = ((image * h + iy) * w + ox * sw - pl) * c
        out_at = ((image * oh + y) * ow + ox) * c
        for cb in range(0, whole, NR):
            _tile(xp, wp, innerp, scalep, outp, tapsp, x_at + cb, sw * c, out_at + cb, c, min(PIXELS, ox1 - ox),
                  ip[_KH] * ip[_KW], ip[_CP], cb, ip[_ZO], ip[_LO], ip[_HI])
    _plain_pixels(x, wt, init, scalep, out, acc, ip, image, y, ox0, ox1, whole, c, acc_at)
    _plain_pixels(x, wt, init, scalep, out, acc, ip, image, y, ox1, ow, 0, c, acc_at)


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
        cpad = -(-self.c // NR) * NR
        taps = w.reshape(self.kh * self.kw, self.c)
        self.weights = np.zeros((len(taps), cpad), np.int8)
        self.weights[:, :self.c] = taps
        self.init = np.zeros(cpad, np.int32)
        if bias is not None:
            self.init[:self.c] = bias
        # A window inside the image: every tap's -zx * w summed into the start.
        self.inner = (self.init - int(x_zero_point) * self.weights.sum(axis=0, dtype=np.int64)).astype(np.int32)
        self.scales = np.zeros(cpad, np.float32)
        self.scales[:self.c] = np.broadcast_to(np.asarray(scales, np.float32), (self.c,))
        self.geometry = tuple(int(g) for g in geometry)
        self.quant = (int(x_zero_point), int(out_zero_point), int(lo), int(hi))

    def bind(self, x: np.ndarray, out: np.ndarray):
        """The call on these arrays (shapes checked: the kernel trusts them)."""
        n, h, w, c = x.shape
        on, oh, ow, oc = out.shape
        if x.dtype != np.int8 or out.dtype != np.int8 or c != self.c or oc != c or on != n:
            raise ValueError(f"quantized depthwise over {self.c} channels given {x.shape} {x.dtype} -> "
                             f"{out.shape} {out.dtype}")
        _, _, dh, dw, _, _ = self.geometry
        taps = np.array([(ky * dh * w + kx * dw) * c for ky in range(self.kh) for kx in range(self.kw)], np.int64)
        scratch = np.empty(n * oh * c, np.int32)
        params = np.array([h, w, c, oh, ow, self.kh, self.kw, *self.geometry, *self.quant, self.weights.shape[1]],
                          np.int64)
        return bind_task(_qdepthwise_task, n * oh, (x, self.weights, self.init, self.inner, self.scales, taps),
                         (out, scratch), params,
                         dtypes=(np.int8, np.int8, np.int32, np.int32, np.float32, np.int64, np.int8, np.int32))
