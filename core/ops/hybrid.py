"""Hybrid (dynamic-range) references: float activations, quantized constant weights.

TensorFlow's converter with ``Optimize.DEFAULT`` and no representative dataset stores
weights as symmetric int8 (per output channel or per tensor) and keeps activations in
float32. A node is hybrid when its first input and its outputs are float and another
input is a quantized integer (:attr:`litegpu.quant.NodeQuant.hybrid`); this module gives
such nodes of each op its ``hybrid`` reference and ``hybrid_attrs`` (the check of the
weights' quantization and everything precomputable), on the op's existing :class:`OpDef`.

Whose arithmetic: LiteRT's default interpreter hands hybrid FULLY_CONNECTED,
BATCH_MATMUL and CONV_2D to its XNNPACK delegate, which runs them "dynamically
quantized" (qd8-f32-qc8w): each row of the float input (each image, for CONV_2D) is
quantized to int8 with its own asymmetric scale and zero point from the row's min and
max, the int32 sums are exact, and each output is ``float(sum) * input_scale`` then one
fused multiply-add with the weight's scale and the bias. Those references follow XNNPACK
(:func:`xnn_quantize_rows`, :func:`xnn_dequantize_sums`), whatever the op's
``asymmetric_quantize_inputs`` option says: XNNPACK always quantizes asymmetrically.
XNNPACK does not take hybrid DEPTHWISE_CONV_2D or EMBEDDING_LOOKUP: those follow
LiteRT's builtin kernels (:func:`tflite_quantize_rows` for the input), as LiteRT 2.3.0's
x86 build computes them; the details that were measured rather than read are marked.
TRANSPOSE_CONV goes to XNNPACK when its output shape, weights and bias are constants and
its activation a clamp, else to the builtin kernel (:func:`tflite_asymmetric_quantize_rows`).
Each reference was checked bit for bit against LiteRT (tests/test_ops_hybrid.py).

Combinations LiteRT refuses, or would run on builtin kernels litegpu does not reproduce
yet (weights computed at run time), are refused at compile time with the reason. LSTM
and UNIDIRECTIONAL_SEQUENCE_LSTM have theirs in :mod:`litegpu.ops.hybrid_lstm`.

Sums of int8 products are computed in float64 (BLAS), exact: every partial sum stays far
below 2^53.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import ModelFormatError, UnsupportedError
from ..graph import Node, Tensor
from ..quant import QuantParams, round_half_away, row_sums
from .nn import (_embedding_reference, conv_sums, depthwise_sums, transpose_conv_out_hw, transpose_conv_padding,
                 transpose_conv_sums)
from .registry import CLAMP_ACTIVATIONS, activation_attr, apply_activation, get_op

I8 = np.dtype(np.int8)
F32 = np.float32


def _attach(op: str, reference, attrs) -> None:
    """Give the registered ``op`` its hybrid reference and the check of its weights."""
    opdef = get_op(op)
    opdef.hybrid = reference
    opdef.hybrid_attrs = attrs


# -- XNNPACK's dynamic quantization (qd8) ---------------------------------------------------


def xnn_quantize_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """XNNPACK's f32 -> qd8 convert of each row of ``rows`` [M, K] (float32).

    Per row, as ``xnn_qd8_asymmetric_quantization_params``: the range [min, max] widened
    to hold 0, ``inv = 255 / (max - min)`` (1 when the range is empty: a row of zeros),
    the zero point from whichever end loses less (``-128 - min*inv`` or ``127 -
    max*inv``), clamped and rounded to nearest even; the values ``rint(x * inv) + zp``,
    saturated to int8. All in float32, in XNNPACK's order.

    Returns ``(q - zp)`` as float64 [M, K] (what the sums use), the quantization scales
    ``1 / inv`` (float32 [M]) and the zero points (int64 [M]).
    """
    x = np.asarray(rows, F32)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        lo = np.fmin(F32(0), np.fmin.reduce(x, axis=1))     # NaNs skipped, as the cpu kernel does
        hi = np.fmax(F32(0), np.fmax.reduce(x, axis=1))
        inv = np.where(lo == hi, F32(1), F32(255) / (hi - lo)).astype(F32)
        low_scaled, high_scaled = lo * inv, hi * inv
        from_min = F32(-128) + low_scaled
        from_max = F32(127) + high_scaled
        zp = np.where(from_min + from_max > 0, F32(-128) - low_scaled, F32(127) - high_scaled)
        zp = np.rint(np.clip(zp, F32(-128), F32(127))).astype(np.int64)
        q = np.rint(x * inv[:, None])
    q = np.clip(np.nan_to_num(q, nan=0.0) + zp[:, None], -128, 127)
    scale = (F32(1) / inv).astype(F32)
    return q - zp[:, None].astype(np.float64), scale, zp


def xnn_dequantize_sums(sums: np.ndarray, input_scale: np.ndarray, weight_scale: np.ndarray,
                        bias: np.ndarray | None) -> np.ndarray:
    """XNNPACK's qd8-f32-qc8w GEMM output: ``fma(float32(sum) * input_scale, weight_scale,
    bias)`` in float32. ``sums`` [..., M, N] (exact integers), ``input_scale`` [..., M]
    (one per quantized row), ``weight_scale`` and ``bias`` [N].

    The multiply-add is fused on x86 (one rounding): the product of two float32 values is
    exact in float64, so adding the bias in float64 and rounding once to float32 gives the
    fused result except in the rare case where the float64 sum itself rounds onto a
    float32 tie (a double rounding; about once in 2^29 values).
    """
    y = np.asarray(sums).astype(F32) * input_scale[..., None]
    y = y.astype(np.float64) * np.asarray(weight_scale, np.float64)
    if bias is not None:
        y = y + np.asarray(bias, F32).astype(np.float64)
    return y.astype(F32)


# -- TFLite's builtin hybrid kernels: input quantization (tensor_utils) ----------------------


def tflite_quantize_rows(rows: np.ndarray, asymmetric: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """TFLite's ``BatchQuantizeFloats`` of each row of ``rows`` [M, K] (float32).

    Symmetric (``SymmetricQuantizeFloats``): ``range = max(|min|, |max|)``, scale
    ``range / 127`` and values ``round(x * (127 / range))`` (float32, ties away from zero)
    clamped to [-127, 127]; a row of zeros gets scale 1 and zeros.
    Asymmetric (``AsymmetricQuantizeFloats``): the range [min, max] widened to hold 0;
    ``scale = (max - min) / 255`` with the difference taken in float32 and the division
    in float64 (the version LiteRT 2.3.0 ships: measured, bit for bit; newer sources
    subtract in float64), the zero point from the end with the smaller error (float64),
    rounded half away from zero and clamped to [-128, 127]; the scale stored as float32,
    the values ``round(zp + x * (1 / scale))`` in float32, saturated. A row of zeros
    quantizes to zeros (its scale does not matter: every sum is 0).

    Returns ``(q - zp)`` as float64 [M, K], the scales (float32 [M]) and zero points
    (int64 [M]), as :func:`xnn_quantize_rows`.
    """
    x = np.asarray(rows, F32)
    lo, hi = x.min(axis=1), x.max(axis=1)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if not asymmetric:
            span = np.maximum(np.abs(lo), np.abs(hi))
            empty = span == 0
            scale = np.where(empty, F32(1), span / F32(127)).astype(F32)
            inv = np.where(empty, F32(0), F32(127) / span).astype(F32)
            q = np.clip(round_half_away(x * inv[:, None]), -127, 127)
            return np.nan_to_num(q), scale, np.zeros(len(x), np.int64)
        rmin, rmax = np.minimum(F32(0), lo), np.maximum(F32(0), hi)
        empty = rmin == rmax
        wide = np.where(empty, 1.0, (rmax - rmin).astype(np.float64) / 255.0)
        rmin, rmax = rmin.astype(np.float64), rmax.astype(np.float64)
        from_min, from_max = -128.0 - rmin / wide, 127.0 - rmax / wide
        use_min = 128.0 + np.abs(rmin / wide) < 127.0 + np.abs(rmax / wide)
        zp_real = np.where(use_min, from_min, from_max)
        zp = np.where(zp_real <= -128, -128, np.where(zp_real >= 127, 127, round_half_away(zp_real)))
        zp = np.where(empty, 0, zp).astype(np.int64)
        scale = np.where(empty, F32(1), wide.astype(F32)).astype(F32)
        inv = (F32(1) / scale).astype(F32)
        q = round_half_away(zp[:, None].astype(F32) + x * inv[:, None])
        q = np.where(empty[:, None], 0, np.clip(np.nan_to_num(q), -128, 127))
    return q - zp[:, None].astype(np.float64), scale, zp


def tflite_asymmetric_quantize_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """TFLite's ``AsymmetricQuantizeFloats`` of each row of ``rows`` [M, K] (float32) as
    LiteRT 2.3.0's x86 build runs it: its NEON kernel, through NEON_2_SSE. The scale and
    zero point are :func:`tflite_quantize_rows`'s; the values are ``round(x * (1 /
    scale)) + zp`` (rounded, then the zero point added), saturated to int8, where the
    first ``K // 8 * 8`` values of a row (the vector loop) round as ARMv7's
    ``RoundToNearest``, ``trunc(v + copysign(0.5, v))`` with the addition in float32
    (0.49999997 becomes 1), and the rest (the scalar tail) as ``std::round``, exactly.

    Measured on single-op TRANSPOSE_CONV and DEPTHWISE_CONV_2D models with inputs chosen
    so that ``x * (1 / scale)`` is a tie: ``v = 10.5`` with zero point -64 gives 11 - 64
    (:func:`tflite_quantize_rows`, ``round(zp + v)``, gives 10 - 64), and 0.49999997
    gives 1 in the vector loop, 0 in the tail. Returns what :func:`tflite_quantize_rows`
    returns."""
    x = np.asarray(rows, F32)
    _, scale, zp = tflite_quantize_rows(x, asymmetric=True)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        v = x * (F32(1) / scale)[:, None]
        vector = np.trunc(v + np.copysign(F32(0.5), v))
        tail = round_half_away(v.astype(np.float64))       # exact: v + 0.5 is exact in float64
        q = np.where(np.arange(x.shape[1]) < x.shape[1] // 8 * 8, vector, tail)
    q = np.clip(np.nan_to_num(q, nan=0.0) + zp[:, None], -128, 127)
    return q - zp[:, None].astype(np.float64), scale, zp


def _weights(q, i: int, what: str, channel_axis: int, ndim: int) -> QuantParams:
    """Input ``i``'s int8 params: symmetric (zero points 0), per tensor or per channel
    along ``channel_axis`` (the only layout LiteRT's kernels take)."""
    w = q.input(i)
    if w is None:
        raise UnsupportedError(f"{what} (input {i}) is not quantized in a hybrid node")
    if w.dtype != I8:
        raise UnsupportedError(f"{what} is quantized {w.dtype.name}; hybrid kernels take int8")
    if not w.per_tensor and w.axis != channel_axis % ndim:
        raise UnsupportedError(f"{what} is quantized along axis {w.axis}; LiteRT's hybrid kernel takes "
                               f"axis {channel_axis % ndim} (the output channels)")
    if np.any(w.zero_points != 0):
        raise UnsupportedError(f"{what} has nonzero zero points (hybrid kernels take symmetric int8)")
    if not np.all(np.isfinite(w.scales)):
        raise ModelFormatError(f"{what} has scales {w.scales[:4].tolist()}: they must be finite")
    return w


def _channel_scales(w: QuantParams, channels: int, what: str) -> np.ndarray:
    """One float32 scale per output channel (a per-tensor scale repeated, as XNNPACK's
    delegate does)."""
    if w.per_tensor:
        return np.full(channels, w.scales[0], F32)
    if w.scales.size != channels:
        raise ModelFormatError(f"{what} has {w.scales.size} scales for {channels} output channels")
    return w.scales.astype(F32)


def _constant(node: Node, tensors: Sequence[Tensor], i: int, what: str) -> np.ndarray:
    """Input ``i``'s constant value; the hybrid kernels need their weights at compile time."""
    t = tensors[node.inputs[i]]
    if t.data is None:
        raise UnsupportedError(f"{what} (input {i}) is quantized but not constant: LiteRT's hybrid kernels "
                               "take constant weights")
    return t.data


def _float_bias(node: Node, tensors: Sequence[Tensor], i: int = 2) -> None:
    if len(node.inputs) > i and node.inputs[i] >= 0:
        bias = tensors[node.inputs[i]]
        if bias.dtype != np.float32:
            raise UnsupportedError(f"bias has type {bias.type_name}; a hybrid node takes a FLOAT32 bias")
        if bias.data is None:
            raise UnsupportedError("the bias is computed at run time (XNNPACK, which runs hybrid nodes in "
                                   "LiteRT, takes a constant bias)")


def _clamp(y: np.ndarray, activation: str) -> np.ndarray:
    """The fused activation (a clamp) in float32, after the bias, as XNNPACK applies it."""
    return apply_activation(y, activation).astype(F32, copy=False)


# -- FULLY_CONNECTED (XNNPACK) --------------------------------------------------------------


def _fc_attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
    w = _weights(base["quant"], 1, "the weights", 0, 2)
    data = _constant(node, tensors, 1, "the weights")
    _float_bias(node, tensors)
    if w.block_size:
        return {"block_scale": bfloat16_rounded(w.scales), "block_size": w.block_size}
    return {"weight_scale": _channel_scales(w, data.shape[0], "the weights")}


def bfloat16_rounded(values: np.ndarray) -> np.ndarray:
    """float32 ``values`` rounded to bfloat16 (to nearest, ties to even), as XNNPACK packs
    the block scales of qb4w weights (ai-edge-quantizer writes them bf16-exact already)."""
    bits = np.asarray(values, F32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return rounded.view(F32)


def xnn_hybrid_product(rows: np.ndarray, scale: np.ndarray, zp: np.ndarray, w: np.ndarray, scales: np.ndarray,
                       block: int, bias: np.ndarray | None) -> np.ndarray:
    """XNNPACK's hybrid product of quantized rows (``rows`` the codes less their zero
    points [M, K], ``scale`` and ``zp`` the rows', from :func:`xnn_quantize_rows`) with
    integer weights ``w`` [N, K]: per output channel (``scales`` [N],
    :func:`xnn_dequantize_sums`) or per block of ``block`` (``scales`` [N, K / block],
    bf16-rounded, :func:`xnn_blockwise_dequantize`), plus the bias."""
    if block:
        y = xnn_blockwise_dequantize(rows, scale, zp, w, scales, block)
        return y if bias is None else y + np.asarray(bias, F32)
    return xnn_dequantize_sums(rows @ np.asarray(w, np.float64).T, scale, scales, bias)


def _fc_hybrid(inputs: list, attrs: dict) -> list[np.ndarray]:
    """Hybrid FULLY_CONNECTED as XNNPACK's qd8-f32-qc8w fully connected: each input row
    quantized on the fly (:func:`xnn_quantize_rows`), exact int32 sums with the int8
    weights, scaled back per row and output channel (:func:`xnn_dequantize_sums`), then
    clamped by the fused activation. Blockwise weights (INT4 LLM weights) as XNNPACK's
    qd8-f32-qb4w: see :func:`xnn_blockwise_product`."""
    x, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    units, k = w.shape
    flat = np.asarray(x, F32).reshape(-1, k)
    block = attrs.get("block_size") or 0
    y = xnn_hybrid_product(*xnn_quantize_rows(flat), w, attrs["block_scale"] if block else attrs["weight_scale"],
                           block, bias)
    shape = (*x.shape[:-1], units) if attrs["keep_num_dims"] else (flat.shape[0], units)
    return [_clamp(y, attrs["activation"]).reshape(shape)]


def blockwise_zero_point_sums(w: np.ndarray, scales: np.ndarray, block: int) -> np.ndarray:
    """Each output channel's ``-sum_b scale_b sum w_b`` over the blocks of ``w`` ([N, K],
    ``scales`` [N, K / block]) as XNNPACK's qb4w packing computes it: each block's product
    rounded to float32, taken off a float32 running value block by block. A row's zero
    point multiplies it to start the row's accumulators."""
    n, k = w.shape
    sums = row_sums(w.reshape(n * (k // block), block)).astype(F32).reshape(n, k // block)
    out = np.zeros(n, F32)
    for b in range(k // block):
        out = out - sums[:, b] * np.asarray(scales[:, b], F32)
    return out


def xnn_blockwise_product(x: np.ndarray, w: np.ndarray, scales: np.ndarray, block: int) -> np.ndarray:
    """XNNPACK's qd8-f32-qb4w GEMM of float rows ``x`` [M, K] with int4 ``w`` [N, K] scaled
    per block (``scales`` [N, K / block], bf16-rounded), before the bias: each row quantized
    (:func:`xnn_quantize_rows`); per row and channel a float32 accumulator starting at
    :func:`blockwise_zero_point_sums` times ``128 + zp``; per block, the exact integer sum
    of ``(q + 128) w`` fused multiply-added with the block's scale; times the row's scale.
    (The fused multiply-add is the float64 product, exact, plus the accumulator, rounded
    once to float32; only a float64 sum that lands on a float32 tie could differ.)"""
    rows, scale, zp = xnn_quantize_rows(x)
    return xnn_blockwise_dequantize(rows, scale, zp, w, scales, block)


def xnn_blockwise_dequantize(rows: np.ndarray, scale: np.ndarray, zp: np.ndarray, w: np.ndarray,
                             scales: np.ndarray, block: int) -> np.ndarray:
    """The rest of :func:`xnn_blockwise_product` once the rows are quantized: ``rows`` the
    codes less their zero points [M, K], ``scale`` and ``zp`` the rows' (from
    :func:`xnn_quantize_rows`)."""
    m, (n, k) = rows.shape[0], w.shape
    codes = (rows + (zp + 128)[:, None]).reshape(m, k // block, block)
    sums = np.einsum("mbk,nbk->mnb", codes, w.reshape(n, k // block, block).astype(np.float64))
    acc = blockwise_zero_point_sums(w, scales, block)[None, :] * (zp + 128).astype(F32)[:, None]
    for b in range(k // block):
        acc = (sums[:, :, b] * np.asarray(scales[:, b], np.float64) + acc).astype(F32)
    return acc * scale[:, None]


_attach("FULLY_CONNECTED", _fc_hybrid, _fc_attrs)


# -- BATCH_MATMUL (XNNPACK) -----------------------------------------------------------------


def _bmm_attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
    data = _constant(node, tensors, 1, "rhs")
    # The output channels are rhs's columns: its last axis, or the one before with adj_y.
    channel_axis = -2 if base["adj_y"] else -1
    w = _weights(base["quant"], 1, "rhs", channel_axis, data.ndim)
    return {"weight_scale": _channel_scales(w, data.shape[channel_axis], "rhs")}


def _bmm_hybrid(inputs: list, attrs: dict) -> list[np.ndarray]:
    """Hybrid BATCH_MATMUL as XNNPACK's dynamically quantized batch matrix multiply: each
    row of lhs (after the adj_x transpose) quantized on the fly, exact sums with the int8
    rhs (batch axes broadcast), scaled back per row and rhs column."""
    a, b = np.asarray(inputs[0], F32), inputs[1]
    if attrs["adj_x"]:
        a = np.swapaxes(a, -1, -2)
    if attrs["adj_y"]:
        b = np.swapaxes(b, -1, -2)
    rows, scale, _ = xnn_quantize_rows(a.reshape(-1, a.shape[-1]))
    sums = np.matmul(rows.reshape(a.shape), b.astype(np.float64))
    scale = np.broadcast_to(scale.reshape(a.shape[:-1]), sums.shape[:-1])
    return [xnn_dequantize_sums(sums, scale, attrs["weight_scale"], None)]


_attach("BATCH_MATMUL", _bmm_hybrid, _bmm_attrs)


# -- CONV_2D (XNNPACK) ---------------------------------------------------------------------


def _conv_attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
    w = _weights(base["quant"], 1, "the filter", 0, 4)
    data = _constant(node, tensors, 1, "the filter")
    if len(node.inputs) < 3 or node.inputs[2] < 0:
        # XNNPACK takes no convolution without a bias; LiteRT's builtin kernel then fails
        # to prepare it ("Tensor at index 2 was optional but was expected").
        raise UnsupportedError("hybrid CONV_2D without a bias (LiteRT refuses it too)")
    _float_bias(node, tensors)
    o, kh, kw, _ = data.shape
    # XNNPACK runs an ungrouped 1x1, stride-1, unpadded convolution as a fully connected
    # layer over the pixels (subgraph/convolution-2d.c), and then quantizes each pixel
    # rather than each image. SAME padding of a 1x1 stride-1 filter is no padding.
    pointwise = (kh, kw) == (1, 1) and tuple(base["stride"]) == (1, 1) and data.shape[3] + o > 2
    return {"weight_scale": _channel_scales(w, o, "the filter"), "pointwise": pointwise}


def _conv_hybrid(inputs: list, attrs: dict) -> list[np.ndarray]:
    """Hybrid CONV_2D as XNNPACK's qd8-f32-qc8w convolution: each image quantized on the
    fly as one row (each pixel, for a convolution XNNPACK turns into a fully connected
    one), exact sums in which padding adds nothing (XNNPACK pads with the zero point),
    scaled back per image and output channel, then the fused activation."""
    x, w, bias = np.asarray(inputs[0], F32), inputs[1], inputs[2]
    grouped = x.shape[3] != w.shape[3]
    if attrs["pointwise"] and not grouped:
        rows, scale, _ = xnn_quantize_rows(x.reshape(-1, x.shape[3]))
        sums = (rows @ w.reshape(w.shape[0], -1).astype(np.float64).T).reshape(*x.shape[:3], w.shape[0])
        scale = scale.reshape(x.shape[:3])
    else:
        rows, scale, _ = xnn_quantize_rows(x.reshape(x.shape[0], -1))
        sums = conv_sums(rows.reshape(x.shape), w.astype(np.float64), attrs)
        scale = np.broadcast_to(scale[:, None, None], sums.shape[:3])
    return [_clamp(xnn_dequantize_sums(sums, scale, attrs["weight_scale"], bias), attrs["activation"])]


_attach("CONV_2D", _conv_hybrid, _conv_attrs)


# -- DEPTHWISE_CONV_2D (TFLite's builtin kernel) -----------------------------------------------


def _depthwise_attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
    w = _weights(base["quant"], 1, "the filter", 3, 4)
    data = _constant(node, tensors, 1, "the filter")
    if w.per_tensor and data.shape[3] != 1:
        # depthwise_conv.cc's Prepare wants one scale per output channel.
        raise UnsupportedError("hybrid DEPTHWISE_CONV_2D with one filter scale for "
                               f"{data.shape[3]} channels (LiteRT refuses it: one scale per channel)")
    if len(node.inputs) < 3 or node.inputs[2] < 0:
        raise UnsupportedError("hybrid DEPTHWISE_CONV_2D without a bias (LiteRT's hybrid kernel reads one)")
    _float_bias(node, tensors)
    return {"weight_scale": _channel_scales(w, data.shape[3], "the filter")}


def _depthwise_hybrid(inputs: list, attrs: dict) -> list[np.ndarray]:
    """Hybrid DEPTHWISE_CONV_2D as TFLite's ``DepthwiseConvHybridPerChannel`` (XNNPACK does
    not take it): each image quantized asymmetrically as one row
    (:func:`tflite_asymmetric_quantize_rows`, whatever ``asymmetric_quantize_inputs``
    says), int32
    sums of ``(q - zp) * w`` over the pixels inside the image, then in float32
    the scaling in float32, plus the bias, clamped.

    The scaling's order depends on the channel: the kernel's vector loop (NEON intrinsics,
    mapped to SSE on x86) takes channels four at a time and computes ``sum *
    channel_scale * input_scale``; the channels left over (``C mod 4`` of them, at the
    end) go through its scalar loop, ``sum * input_scale * channel_scale``."""
    x, w, bias = np.asarray(inputs[0], F32), inputs[1], inputs[2]
    rows, scale, _ = tflite_asymmetric_quantize_rows(x.reshape(x.shape[0], -1))
    sums = depthwise_sums(rows.reshape(x.shape), w.astype(np.float64), attrs).astype(F32)
    channel, image = attrs["weight_scale"], scale[:, None, None, None]
    vector = np.arange(sums.shape[3]) < sums.shape[3] // 4 * 4
    y = np.where(vector, sums * channel * image, sums * image * channel) + np.asarray(bias, F32)
    return [_clamp(y, attrs["activation"])]


_attach("DEPTHWISE_CONV_2D", _depthwise_hybrid, _depthwise_attrs)


# -- EMBEDDING_LOOKUP (TFLite's builtin kernel) ------------------------------------------------


def _embedding_attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
    table = base["quant"].input(1)
    if table is None or table.dtype not in (I8, np.dtype(np.uint8)):
        raise UnsupportedError("a hybrid EMBEDDING_LOOKUP takes an int8 or uint8 table")
    if np.any(table.zero_points != 0):
        raise UnsupportedError("table zero points must be 0 (LiteRT's hybrid lookup is symmetric)")
    rows = tensors[node.inputs[1]].shape[0]
    if table.block_size:
        return {"block_scale": table.scales, "block_size": table.block_size}
    if not table.per_tensor and (table.axis != 0 or table.scales.size != rows):
        raise UnsupportedError(f"table quantized along axis {table.axis} with {table.scales.size} scales; "
                               f"LiteRT takes one scale per row (axis 0, {rows} scales)")
    return {"row_scale": np.broadcast_to(table.scales.astype(F32), (rows,)).copy()}


def _embedding_hybrid(inputs: list, attrs: dict) -> list[np.ndarray]:
    """Hybrid EMBEDDING_LOOKUP as TFLite's ``EvalHybrid``: the selected rows of the table
    times their scale (one per row, or the tensor's), ``int8 * float32`` in float32. The
    kernel reads every table as int8, a uint8 one too (values above 127 wrap). A blockwise
    table (INT4 LLM embeddings) scales each block of a row by its own scale."""
    ids, table = inputs
    found = _embedding_reference([ids, np.asarray(table).view(np.int8)], attrs)[0]
    if attrs.get("block_size"):
        scales = np.repeat(attrs["block_scale"][ids.astype(np.int64).reshape(-1)], attrs["block_size"], axis=-1)
        return [found.astype(F32) * scales.reshape(found.shape)]
    scale = attrs["row_scale"][ids.astype(np.int64)]
    return [found.astype(F32) * scale.reshape(-1, *([1] * (found.ndim - 1)))]


_attach("EMBEDDING_LOOKUP", _embedding_hybrid, _embedding_attrs)


# -- TRANSPOSE_CONV (XNNPACK or TFLite's builtin kernel) ---------------------------------------


def _transpose_conv_attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
    """Which kernel LiteRT runs the node on, and the weights' scales. XNNPACK takes a hybrid
    TRANSPOSE_CONV as a dynamically quantized deconvolution when its output shape, weights
    and bias are constants of the file and its activation is a clamp; the builtin kernel
    runs the rest (a Keras Conv2DTranspose with a dynamic batch computes its output shape
    with SHAPE and PACK: unet's decoder). Measured on LiteRT 2.3.0: each path matches its
    reference bit for bit and the other's by a few ulps only."""
    w = _weights(base["quant"], 1, "the weights", 0, 4)
    data = _constant(node, tensors, 1, "the weights")
    bias = tensors[node.inputs[3]] if len(node.inputs) > 3 and node.inputs[3] >= 0 else None
    if bias is not None and bias.dtype != np.float32:
        raise UnsupportedError(f"bias has type {bias.type_name}; a hybrid node takes a FLOAT32 bias")
    xnnpack = tensors[node.inputs[0]].data is not None and (bias is None or bias.data is not None) \
        and activation_attr(node.options) in CLAMP_ACTIVATIONS
    # The builtin kernel holds the batch and size to output_shape; XNNPACK takes them from
    # the input (litegpu.ops.nn's TRANSPOSE_CONV infer, "size_from_input").
    return {"weight_scale": _channel_scales(w, data.shape[0], "the weights"), "xnnpack": xnnpack,
            "size_from_input": xnnpack}


def _tflite_transpose_conv_sums(q: np.ndarray, w: np.ndarray, image_scale: np.ndarray, channel_scale: np.ndarray,
                                out_hw: tuple[int, int], padding: str, stride: tuple[int, int]) -> np.ndarray:
    """TFLite's ``reference_ops::HybridTransposeConv`` before its bias: a float32 scatter of
    ``float(q * w) * channel_scale * image_scale``, one term at a time, onto outputs that
    start at 0, in its loop order (input row, column, channel, then the taps). ``q``
    [N, H, W, C] holds ``q - zp`` (int32), ``image_scale`` [N], ``channel_scale`` [O].

    For one output the terms come in order of input row, column, channel: walking the taps
    backwards (a later tap row meets an earlier input row) and the channels forwards adds
    each output's terms in that order, a tap and channel at a time over all outputs."""
    n, h, wd, c = q.shape
    o, kh, kw, _ = w.shape
    top = transpose_conv_padding(out_hw[0], kh, stride[0], padding)
    left = transpose_conv_padding(out_hw[1], kw, stride[1], padding)
    full_h = max((h - 1) * stride[0] + kh, top + out_hw[0])
    full_w = max((wd - 1) * stride[1] + kw, left + out_hw[1])
    full = np.zeros((n, full_h, full_w, o), F32)
    scale = image_scale.astype(F32)[:, None, None, None]
    w = w.astype(np.int32)
    for i in reversed(range(kh)):
        for j in reversed(range(kw)):
            view = full[:, i:i + (h - 1) * stride[0] + 1:stride[0], j:j + (wd - 1) * stride[1] + 1:stride[1], :]
            for ch in range(c):
                view += (q[..., ch:ch + 1] * w[:, i, j, ch]).astype(F32) * channel_scale * scale
    return full[:, top:top + out_hw[0], left:left + out_hw[1], :]


def _transpose_conv_hybrid(inputs: list, attrs: dict) -> list[np.ndarray]:
    """Hybrid TRANSPOSE_CONV (inputs: output shape, int8 weights [O, KH, KW, I], float
    input, bias?), each image quantized on the fly as one row, then:

    - XNNPACK's qd8-f32-qc8w deconvolution (``attrs["xnnpack"]``): the image quantized as
      :func:`xnn_quantize_rows`, exact sums scattered as the float op's, then
      :func:`xnn_dequantize_sums` with the bias, and the clamp;
    - else TFLite's builtin ``EvalHybrid``: the image quantized as its
      ``AsymmetricQuantizeFloats`` (:func:`tflite_asymmetric_quantize_rows`), each
      product scaled and added in float32 in the kernel's order
      (:func:`_tflite_transpose_conv_sums`), then the bias and the clamp, in float32 (an
      activation that is no clamp, TANH say, is not applied: LiteRT's
      ``CalculateActivationRange`` leaves the range open)."""
    w, x = inputs[1], np.asarray(inputs[2], F32)
    bias = inputs[3] if len(inputs) > 3 else None
    out_hw = transpose_conv_out_hw(inputs, attrs)
    quantize = xnn_quantize_rows if attrs["xnnpack"] else tflite_asymmetric_quantize_rows
    rows, scale, _ = quantize(x.reshape(x.shape[0], -1))
    if attrs["xnnpack"]:
        sums = transpose_conv_sums(rows.reshape(x.shape), w.astype(np.float64), out_hw, attrs["padding"],
                                   attrs["stride"])
        y = xnn_dequantize_sums(sums, np.broadcast_to(scale[:, None, None], sums.shape[:3]), attrs["weight_scale"],
                                bias)
    else:
        y = _tflite_transpose_conv_sums(rows.reshape(x.shape).astype(np.int32), w, scale, attrs["weight_scale"],
                                        out_hw, attrs["padding"], attrs["stride"])
        if bias is not None:
            y = y + np.asarray(bias, F32)
    return [_clamp(y, attrs["activation"])]


_attach("TRANSPOSE_CONV", _transpose_conv_hybrid, _transpose_conv_attrs)


def hybrid_ops() -> list[str]:
    """The ops with a hybrid (dynamic-range) reference, sorted."""
    from .registry import all_ops
    return sorted(name for name, opdef in all_ops().items() if opdef.hybrid is not None)


__all__ = ["hybrid_ops", "xnn_dequantize_sums", "xnn_quantize_rows"]
