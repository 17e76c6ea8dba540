"""Hybrid (dynamic-range) CONV_2D and DEPTHWISE_CONV_2D: float activations, constant
symmetric int8 weights, float results, bit for bit as the ops' hybrid references
(:mod:`litegpu.ops.hybrid`) and so as LiteRT.

The two ops follow different arithmetic, because LiteRT runs them in different places:

- CONV_2D is XNNPACK's qd8-f32-qc8w convolution. A 1x1 stride-1 conv (``attrs["pointwise"]``)
  is XNNPACK's fully connected layer over the pixels: :class:`.qd8gemm.DynamicQuantizedMatmul`
  on x as [N*H*W, C], each pixel quantized on its own. Any other ungrouped conv quantizes
  each image as one row (:func:`.qd8gemm.bind_quantize_rows`, its scale and correction
  written for every output pixel of the image), takes the int8 im2col of the quantized
  image with that image's zero point as padding (:class:`.qconv.Im2col`: padding then adds
  ``(zp - zp) * w = 0``, as XNNPACK's), then the product on those rows
  (:meth:`~.qd8gemm.DynamicQuantizedMatmul.bind_quantized`); with channels a multiple of
  4 the product reads the taps where they lie instead (XNNPACK's IGEMM: no im2col to write
  and read back, :func:`_indirect_conv`).
- DEPTHWISE_CONV_2D is TFLite's builtin ``DepthwiseConvHybridPerChannel`` (XNNPACK does not
  take it): each image quantized asymmetrically in TFLite's own way
  (:func:`_tflite_quantize_task`), int32 sums of ``(q - zp) * w`` over the taps inside the
  image (:func:`_depthwise_task`, tiled as :mod:`.qdepthwise`), then, in float32, the
  sums scaled in the channel-dependent order TFLite's kernel uses, the bias, the clamp.

Grouped convolutions get None (their hybrid reference).
"""
from __future__ import annotations

import math

import numpy as np
from llvmlite import ir

from litegpu.backend import NodeContext

from ..jit import intrinsic, njit, types
from .common import clamp_bounds, optional_input, window_geometry
from .packed import NR, VECTOR, clamp_vector, load_vector, splat_vector, store_vector
from .qconv import Im2col
from .qd8gemm import DynamicQuantizedMatmul, bind_quantize_rows, bind_row_pieces, row_piece, row_range
from .qdepthwise import PIXELS, inner_pixels, pixel_sums, tap_sums
from .qgemm import _SUMS
from .registry import bindable, kernel, named
from .threads import current as current_threads
from .tasks import bind_task, in_sequence, int32_pointer, int8_pointer, task_function

F32 = np.dtype(np.float32)
I8 = np.dtype(np.int8)


def _hybrid_constants(ctx: NodeContext) -> tuple[np.ndarray, np.ndarray] | None:
    """A hybrid node's constant int8 filter and float32 bias, or None when the node is not
    hybrid or they are not constants of those types on a float32 input and output (the
    hybrid attrs already refuse most of that; the reference then runs the rest)."""
    if not ctx.attrs.get("hybrid"):
        return None
    w_spec, bias_spec = ctx.inputs[1], optional_input(ctx, 2)
    if w_spec.value is None or np.dtype(w_spec.dtype) != I8 or np.asarray(w_spec.value).ndim != 4 \
            or np.dtype(ctx.inputs[0].dtype) != F32 or np.dtype(ctx.outputs[0].dtype) != F32:
        return None
    if bias_spec is None or bias_spec.value is None or np.dtype(bias_spec.dtype) != F32:
        return None
    return np.asarray(w_spec.value, np.int8), np.asarray(bias_spec.value, np.float32).reshape(-1)


def _threads() -> int:
    return current_threads()


# -- CONV_2D (XNNPACK's qd8-f32-qc8w) -------------------------------------------------------


@kernel("CONV_2D", quantized=True)
def hybrid_conv(ctx: NodeContext):
    """A hybrid CONV_2D as XNNPACK computes it (see the module docstring); None for a node
    that is not hybrid, a grouped one, or one whose constants are missing."""
    found = _hybrid_constants(ctx)
    if found is None:
        return None
    w, bias = found
    n, h, wd, c = ctx.inputs[0].shape
    o, kh, kw, ci = w.shape
    if ci != c:
        return None                     # grouped: the reference
    k = kh * kw * c
    lo, hi = clamp_bounds(ctx.attrs["activation"])
    product = DynamicQuantizedMatmul(np.ascontiguousarray(w.reshape(o, k).T), ctx.attrs["weight_scale"], bias,
                                     lo, hi, _threads())
    if ctx.attrs["pointwise"]:
        return _pointwise(product, n * h * wd, c, o)
    _, oh, ow, _ = ctx.outputs[0].shape
    convolve = _indirect_conv if c % 4 == 0 else _im2col_conv
    return convolve(product, (n, h, wd, c), (kh, kw), window_geometry(ctx.attrs, h, wd, kh, kw), oh, ow)


def _pointwise(product: DynamicQuantizedMatmul, m: int, c: int, o: int):
    """The product over the ``m`` pixels, each quantized as a row of its own (XNNPACK's fully
    connected layer). Like a hybrid FULLY_CONNECTED it offers its quantized rows to the
    backend, which lets products reading the same tensor quantize it once."""
    run = bindable(lambda inputs, outputs: product.bind(inputs[0].reshape(m, c), outputs[0].reshape(m, o)))
    run.quantized_rows = product
    return named(run, "qd8 GEMM over the pixels (1x1, each pixel quantized)")


def _im2col_conv(product: DynamicQuantizedMatmul, x_shape: tuple, kernel_hw: tuple, geometry: tuple, oh: int,
                 ow: int):
    """Each image quantized as one row, its int8 im2col padded with its zero point, then the
    product, every pixel row with its image's scale and correction: one plan of task rows."""
    n, h, wd, c = x_shape
    pixels = oh * ow
    im2col = Im2col(x_shape, kernel_hw, geometry, oh, ow)
    images = np.empty((n, h * wd * c), np.int8)           # no padding: im2col reads them as [N, H, W, C]
    cols = np.empty(im2col.shape, np.int8)
    scale, correction = np.empty(n * pixels, np.float32), np.empty(n * pixels, np.int32)
    threads = product.threads

    def bind(inputs, outputs):
        quantize = bind_quantize_rows(inputs[0].reshape(n, -1), images, scale, correction, threads, repeat=pixels)
        return in_sequence([quantize, im2col.bind(images, correction, pixels, cols),
                            product.bind_quantized(cols, scale, correction, outputs[0].reshape(n * pixels, -1))])
    kh, kw = kernel_hw
    return named(bindable(bind), f"qd8 im2col ({kh}x{kw}/{geometry[0]}) + GEMM, each image quantized")


def _indirect_conv(product: DynamicQuantizedMatmul, x_shape: tuple, kernel_hw: tuple, geometry: tuple, oh: int,
                   ow: int):
    """Each image quantized as one row, a row of its zero point after the images, then the
    product reading each pixel's taps where they lie, through :func:`_indirection` (no
    im2col). The channels must be a multiple of 4 (a tap is whole K steps); other convs
    go through :func:`_im2col_conv`."""
    n, h, wd, c = x_shape
    pixels = oh * ow
    table = _indirection(x_shape, kernel_hw, geometry, oh, ow)
    images = np.empty(n * h * wd * c + n * c, np.int8)     # the images, then their zero-point rows
    scale, correction = np.empty(n * pixels, np.float32), np.empty(n * pixels, np.int32)
    threads = product.threads
    params = np.array([n * h * wd * c, c, pixels], np.int64)

    def bind(inputs, outputs):
        quantize = bind_quantize_rows(inputs[0].reshape(n, -1), images[:n * h * wd * c].reshape(n, -1), scale,
                                      correction, threads, repeat=pixels)
        padding = bind_task(_zero_point_rows_task, n, (correction,), (images,), params, dtypes=(np.int32, I8))
        out = outputs[0].reshape(n * pixels, -1)
        return in_sequence([quantize, padding, product.bind_indirect(images, table, scale, correction, out)])
    kh, kw = kernel_hw
    return named(bindable(bind), f"qd8 indirect GEMM ({kh}x{kw}/{geometry[0]}), each image quantized")


def _indirection(x_shape: tuple, kernel_hw: tuple, geometry: tuple, oh: int, ow: int) -> np.ndarray:
    """The indirect product's table [N * OH * OW, KH * KW]: for each output pixel and tap,
    the byte offset of the input pixel under the tap in the quantized images [N, H, W, C],
    or, for a tap in the padding, of the image's zero-point row after them."""
    n, h, w, c = x_shape
    kh, kw = kernel_hw
    sh, sw, dh, dw, pt, pl = geometry
    iy = (np.arange(oh) * sh - pt)[:, None, None, None] + (np.arange(kh) * dh)[None, None, :, None]
    ix = (np.arange(ow) * sw - pl)[None, :, None, None] + (np.arange(kw) * dw)[None, None, None, :]
    inside = (iy >= 0) & (iy < h) & (ix >= 0) & (ix < w)
    image = np.arange(n, dtype=np.int64)[:, None, None, None, None]
    offsets = np.where(inside, image * (h * w * c) + (iy * w + ix) * c, n * h * w * c + image * c)
    return np.ascontiguousarray(offsets.reshape(n * oh * ow, kh * kw), dtype=np.int64)


@task_function()
def _zero_point_rows_task(t, cp, imagesp, _a2, _a3, _a4, _a5, _a6, _a7, ip, fp):
    """Image ``t``'s zero-point row: C bytes of its zero point at ``images[base + t * C]``
    (the taps in the padding read it), from the correction factor ``128 + zp`` of its first
    product row. ``ip``: base, C, the product rows an image has."""
    base, c, pixels = ip[0], ip[1], ip[2]
    q = int8_pointer(imagesp)
    zp = np.int8(int32_pointer(cp)[t * pixels] - 128)
    for ch in range(c):
        q[base + t * c + ch] = zp


# -- DEPTHWISE_CONV_2D (TFLite's builtin hybrid kernel) --------------------------------------


@njit(cache=True, inline="always")
def _tflite_quantize(x, inv, zpf, vector):
    """One value as LiteRT 2.3.0's x86 build quantizes it (:func:`litegpu.ops.hybrid.
    tflite_asymmetric_quantize_rows`): ``v = x * inv`` in float32 rounded half away from
    zero, then the zero point added, saturated to int8; in the vector loop (``vector``:
    the first K // 8 * 8 values of an image) the rounding is ``trunc(v + copysign(0.5,
    v))`` with the addition in float32 (0.49999997 becomes 1), in the tail exact. NaN
    gives the zero point."""
    v = x * inv
    if vector:
        r = np.float64(np.trunc(v + np.copysign(np.float32(0.5), v)))
    else:
        w = np.float64(v)
        r = np.trunc(w + np.copysign(0.5, w))
    r = (r if r == r else 0.0) + np.float64(zpf)
    return np.int8(min(max(r, -128.0), 127.0))


@njit(cache=True, inline="always")
def _tflite_scale(lo, hi):
    """``(scale, zp)`` of TFLite's ``AsymmetricQuantizeFloats`` for the range [lo, hi]
    (float32, widened to hold 0, not empty): the span taken in float32 then divided in
    float64 (LiteRT 2.3.0's build, measured), the zero point from the end with the smaller
    error, in float64, rounded half away from zero and clamped to int8."""
    wide = np.float64(hi - lo) / 255.0
    rmin, rmax = np.float64(lo), np.float64(hi)
    if 128.0 + abs(rmin / wide) < 127.0 + abs(rmax / wide):
        zp_real = -128.0 - rmin / wide
    else:
        zp_real = 127.0 - rmax / wide
    if zp_real <= -128.0:
        zp = -128
    elif zp_real >= 127.0:
        zp = 127
    else:
        zp = int(math.trunc(zp_real + math.copysign(0.5, zp_real)))
    return np.float32(wide), zp


@task_function()
def _tflite_quantize_task(t, xp, rangesp, qp, imagep, _a4, _a5, _a6, _a7, ip, fp):
    """Piece ``t`` (:func:`.qd8gemm.row_piece`) of the images x [N, K] quantized as TFLite's
    ``AsymmetricQuantizeFloats`` into q [N, K * M], each value repeated for the M output
    channels it feeds (``repeat``: the depth multiplier; the depthwise conv then reads one
    channel per output channel). Values as :func:`_tflite_quantize`; an image of zeros
    quantizes to zeros with scale 1. The image's
    first piece writes its scale and zero point (a small integer, exact in float32) to
    ``image[n]``."""
    k, mult = ip[1], ip[4]
    q = int8_pointer(qp)
    r0, r1, i0, i1 = row_piece(t, ip)
    for r in range(r0, r1):
        lo, hi = row_range(xp, rangesp, r, ip)
        scale, zp = (np.float32(1), 0) if lo == hi else _tflite_scale(lo, hi)
        inv, zpf = np.float32(1) / scale, np.float32(zp)
        if i0 == 0:
            imagep[2 * r] = scale
            imagep[2 * r + 1] = zpf
        start, out, whole = r * k, r * k * mult, k // 8 * 8
        if mult == 1:                   # (the loops that vectorize)
            for i in range(i0, min(i1, whole)):
                q[out + i] = _tflite_quantize(xp[start + i], inv, zpf, True)
            for i in range(max(i0, whole), i1):
                q[out + i] = _tflite_quantize(xp[start + i], inv, zpf, False)
            continue
        for i in range(i0, i1):
            value = _tflite_quantize(xp[start + i], inv, zpf, i < whole)
            for j in range(mult):
                q[out + i * mult + j] = value


# ip of :func:`_depthwise_task`: the geometry as :func:`.qdepthwise.pixel_sums` reads it
# (H, W, C, OH, OW, KH, KW, SH, SW, DH, DW, PT, PL; C the output channels), the padded
# channel count CP, then each tap's int64 offset from the window's corner.
_KH, _KW, _CP, _TAPS = 5, 6, 13, 14


def _tile_codegen(context, builder, signature, args):
    """:func:`.qdepthwise.tap_sums` from ``-zp * sum of the taps' weights`` (the tile's
    windows lie inside the image, so every tap subtracts the zero point), then each sum
    ``float(sum) * channel_scale * image_scale + bias`` in float32 (the order of TFLite's
    vector loop: a tile's channels all lie below C rounded down to 4), clamped, stored."""
    (q_ptr, w_ptr, wsum_ptr, channel_ptr, out_ptr, ip_ptr, x_at, x_step, out_at, out_step, left, cb, zp,
     image_scale, lo_, hi_) = args
    i64 = ir.IntType(64)
    cpad = builder.load(builder.gep(ip_ptr, [ir.Constant(i64, _CP)]))
    taps = builder.mul(builder.load(builder.gep(ip_ptr, [ir.Constant(i64, _KH)])),
                       builder.load(builder.gep(ip_ptr, [ir.Constant(i64, _KW)])))
    wsum = builder.load(builder.bitcast(builder.gep(builder.bitcast(wsum_ptr, _SUMS.element.as_pointer()), [cb]),
                                        _SUMS.as_pointer()), align=4)
    init = builder.mul(wsum, splat_vector(builder, builder.trunc(builder.neg(zp), _SUMS.element), _SUMS))
    acc, pixel = tap_sums(builder, q_ptr, w_ptr, init, builder.gep(ip_ptr, [ir.Constant(i64, _TAPS)]), x_at, x_step,
                          left, taps, cpad, cb)
    channel_scale, bias = load_vector(builder, channel_ptr, cb), load_vector(builder, channel_ptr,
                                                                             builder.add(cpad, cb))
    scale, lo, hi = (splat_vector(builder, v) for v in (image_scale, lo_, hi_))
    for sums, p in zip(acc, pixel):
        value = builder.fmul(builder.fmul(builder.sitofp(sums, VECTOR), channel_scale), scale)
        value = clamp_vector(builder, builder.fadd(value, bias), lo, hi)
        store_vector(builder, value, out_ptr, builder.add(out_at, builder.mul(p, out_step)))
    return context.get_dummy_value()


@intrinsic
def _tile(typingctx, qp, wp, wsump, channelp, outp, ip, x_at, x_step, out_at, out_step, left, cb, zp, image_scale,
          lo, hi):
    """The tile of PIXELS pixels (``left`` of them) x 16 channels from ``cb``: the first
    window's corner at byte ``x_at`` of q, its output at float ``out_at``, pixels
    ``x_step`` / ``out_step`` apart."""
    sig = types.void(qp, wp, wsump, channelp, outp, ip, *[types.int64] * 7, types.float32, types.float32,
                     types.float32)
    return sig, _tile_codegen


@njit(cache=True, inline="always")
def _plain_pixels(q, wt, zeros, channel, image_scale, zp, out, acc, ip, image, y, ox0, ox1, c0, c1, acc_at, lo,
                  hi):
    """Pixels ``ox0 .. ox1`` of output row ``y``, channels ``c0 .. c1``: the exact sums
    (:func:`.qdepthwise.pixel_sums`, taps outside the image skipped), then in float32 the
    scaling in TFLite's order for the channel (below C rounded down to 4, its vector loop:
    ``sum * channel_scale * image_scale``; above, its scalar loop: ``sum * image_scale *
    channel_scale``), the bias, the clamp (NaN kept)."""
    c, oh, ow, cpad = ip[2], ip[3], ip[4], ip[_CP]
    vector_channels = c // 4 * 4
    for ox in range(ox0, ox1):
        pixel_sums(q, wt, zeros, acc, ip, image, y, ox, c0, c1, acc_at, zp, cpad)
        out_at = ((image * oh + y) * ow + ox) * c
        for ch in range(c0, c1):
            total = np.float32(acc[acc_at + ch])
            if ch < vector_channels:
                value = total * channel[ch] * image_scale
            else:
                value = total * image_scale * channel[ch]
            value = value + channel[cpad + ch]
            value = lo if value < lo else value
            out[out_at + ch] = hi if value > hi else value


@task_function()
def _depthwise_task(t, qp, wp, wsump, zerosp, channelp, imagep, outp, scratchp, ip, fp):
    """Output row ``t`` (image ``t // OH``, row ``t % OH``) of a hybrid depthwise conv: ``q``
    [N, H, W, C] int8 (x quantized, one channel per output channel), ``w`` [KH * KW, CP]
    int8, int32 ``wsum`` (each channel's sum of weights) and ``zeros`` [CP], float32
    ``channel`` [2, CP] (the weight scales, the bias), ``image`` [N, 2] (each image's scale
    and zero point), ``out`` [N, OH, OW, C] float32, ``scratch`` C int32 per task; ``fp``:
    the clamp. The tiles take the pixels whose windows lie inside the image, 16 channels
    at a time; a plain loop the rest (as :func:`.qdepthwise._qdepthwise_task`)."""
    h, w, c, oh, ow, sh, sw, pt, pl = ip[0], ip[1], ip[2], ip[3], ip[4], ip[7], ip[8], ip[11], ip[12]
    q, wt = int8_pointer(qp), int8_pointer(wp)
    zeros, acc = int32_pointer(zerosp), int32_pointer(scratchp)
    lo, hi = fp[0], fp[1]
    image, y = t // oh, t % oh
    image_scale, zp = imagep[2 * image], np.int32(imagep[2 * image + 1])
    acc_at = t * c
    whole = c // NR * NR
    ox0, ox1 = inner_pixels(ip, y) if whole else (0, 0)
    _plain_pixels(q, wt, zeros, channelp, image_scale, zp, outp, acc, ip, image, y, 0, ox0, 0, c, acc_at, lo, hi)
    iy = y * sh - pt
    for ox in range(ox0, ox1, PIXELS):
        x_at = ((image * h + iy) * w + ox * sw - pl) * c
        out_at = ((image * oh + y) * ow + ox) * c
        for cb in range(0, whole, NR):
            _tile(qp, wp, wsump, channelp, outp, ip, x_at + cb, sw * c, out_at + cb, c, min(PIXELS, ox1 - ox), cb,
                  np.int64(zp), image_scale, lo, hi)
    _plain_pixels(q, wt, zeros, channelp, image_scale, zp, outp, acc, ip, image, y, ox0, ox1, whole, c, acc_at, lo,
                  hi)
    _plain_pixels(q, wt, zeros, channelp, image_scale, zp, outp, acc, ip, image, y, ox1, ow, 0, c, acc_at, lo, hi)


class HybridDepthwise:
    """``bind(x [N, H, W, C] float32, out [N, OH, OW, C * M] float32) -> call`` computing
    TFLite's hybrid depthwise conv with the constant int8 ``w`` [KH, KW, C * M] (output
    channel ``c * M + m`` filters input channel ``c``), float32 ``weight_scale`` and
    ``bias`` per output channel, clamped to ``[lo, hi]``; ``geometry``: (sh, sw, dh, dw,
    pt, pl); ``threads``: the threads the quantization is cut for."""

    def __init__(self, w: np.ndarray, weight_scale: np.ndarray, bias: np.ndarray, multiplier: int, lo: float,
                 hi: float, geometry: tuple[int, ...], threads: int) -> None:
        if w.dtype != np.int8 or w.ndim != 3:
            raise ValueError(f"hybrid depthwise takes int8 weights [KH, KW, C], not {w.dtype} {w.shape}")
        self.kh, self.kw, self.c = w.shape
        self.multiplier = multiplier
        cpad = -(-self.c // NR) * NR
        self.weights = np.zeros((self.kh * self.kw, cpad), np.int8)
        self.weights[:, :self.c] = w.reshape(-1, self.c)
        self.wsum = self.weights.sum(axis=0, dtype=np.int32)
        self.zeros = np.zeros(cpad, np.int32)
        self.channel = np.zeros((2, cpad), np.float32)
        self.channel[0, :self.c] = weight_scale
        self.channel[1, :self.c] = bias
        self.clamp = np.array([lo, hi], np.float32)
        self.geometry = tuple(int(g) for g in geometry)
        self.threads = threads

    def bind(self, x: np.ndarray, out: np.ndarray):
        """The call on these arrays (shapes checked: the tasks trust them): x quantized image
        by image into scratch, then the depthwise rows."""
        n, h, w, cin = x.shape
        on, oh, ow, oc = out.shape
        if x.dtype != F32 or out.dtype != F32 or oc != self.c or cin * self.multiplier != oc or on != n:
            raise ValueError(f"hybrid depthwise over {self.c} channels given {x.shape} {x.dtype} -> "
                             f"{out.shape} {out.dtype}")
        q = np.empty((n, h, w, oc), np.int8)
        image = np.empty((n, 2), np.float32)
        quantize = bind_row_pieces(_tflite_quantize_task, x.reshape(n, -1), (q, image), (I8, F32), 0,
                                   self.multiplier, self.threads)
        _, _, dh, dw, _, _ = self.geometry
        taps = [(ky * dh * w + kx * dw) * oc for ky in range(self.kh) for kx in range(self.kw)]
        params = np.array([h, w, oc, oh, ow, self.kh, self.kw, *self.geometry, self.weights.shape[1], *taps], np.int64)
        scratch = np.empty(n * oh * oc, np.int32)
        conv = bind_task(_depthwise_task, n * oh, (q, self.weights, self.wsum, self.zeros, self.channel, image),
                         (out, scratch), params, self.clamp, dtypes=(I8, I8, np.int32, np.int32, F32, F32, F32,
                                                                      np.int32))
        return in_sequence([quantize, conv])


@kernel("DEPTHWISE_CONV_2D", quantized=True)
def hybrid_depthwise(ctx: NodeContext):
    """A hybrid DEPTHWISE_CONV_2D as TFLite's builtin kernel computes it (see the module
    docstring), any depth multiplier; None for a node that is not hybrid."""
    found = _hybrid_constants(ctx)
    if found is None:
        return None
    w, bias = found
    _, h, wd, c = ctx.inputs[0].shape
    _, kh, kw, o = w.shape
    if o % c:
        return None
    lo, hi = clamp_bounds(ctx.attrs["activation"])
    conv = HybridDepthwise(w.reshape(kh, kw, o), ctx.attrs["weight_scale"], bias, o // c, lo, hi,
                           window_geometry(ctx.attrs, h, wd, kh, kw), _threads())
    return named(bindable(lambda inputs, outputs: conv.bind(inputs[0], outputs[0])),
                 f"hybrid depthwise {kh}x{kw} (TFLite's arithmetic)")
