"""Integer references: quantized nodes computed with LiteRT's own integer arithmetic.

Each op's attrs and shape inference stay where the op is defined; this module adds to
its :class:`OpDef` the ``quantized`` reference and ``quantized_attrs`` (the check of the
node's quantization and everything precomputable: scales, multipliers, clamp ranges).
A node reaches its integer reference through ``attrs["quant"]`` (see
:mod:`litegpu.ops.registry`).

Whose arithmetic: LiteRT's default CPU path hands int8 CONV_2D, DEPTHWISE_CONV_2D,
FULLY_CONNECTED, ADD, SUB, MUL, MEAN, QUANTIZE and DEQUANTIZE to its XNNPACK delegate,
so those follow XNNPACK (float32 requantization rounded to nearest even; ADD/SUB with
21-bit integer multipliers); HARD_SWISH and AVERAGE_POOL_2D on int8 stay on LiteRT's
builtin kernels, so they follow TFLite's fixed-point reference kernels. The two differ by
a quantum here and there, which grows through a deep network (mobilenet_v2_int8's
logits differ by up to 18 quanta between LiteRT's two paths), so each op follows the one
LiteRT really runs. The facts live in :mod:`litegpu.quant`.

Sums of int8 products are accumulated in float64 (BLAS), exact: every partial sum stays
far below 2^53.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import ModelFormatError, UnsupportedError
from ..graph import Node, Tensor
from ..quant import (QuantParams, activation_range, dequantize, fp32_scale, multiply_by_quantized_multiplier,
                     quantize, quantize_multiplier, requantize_fp32, xnn_add, xnn_add_params)
from .nn import _pad_hw, _spatial_plan, _tap, conv_sums, depthwise_sums, pool_input_4d
from .registry import OpDef, TensorSpec, get_op, register
from .reduce import reduction_axes

I8, U8, I16 = np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int16)


def _attach(op: str, reference, attrs=None) -> None:
    """Give the registered ``op`` its integer reference (and quantization check)."""
    opdef = get_op(op)
    opdef.quantized = reference
    opdef.quantized_attrs = attrs


def _params(q, i: int | None, what: str, dtypes=(I8,), per_tensor: bool = True,
            output: bool = False) -> QuantParams:
    """Operand ``i``'s params (the output's with ``output``), refused unless quantized
    with one of ``dtypes`` (and per tensor when asked)."""
    p = q.output(i or 0) if output else q.input(i)
    if p is None:
        raise UnsupportedError(f"{what} is not quantized while other operands are (hybrid / dynamic-range "
                               "quantization is not supported)")
    if p.dtype not in dtypes:
        raise UnsupportedError(f"{what} is quantized {p.dtype.name}; the integer kernels take "
                               f"{'/'.join(d.name for d in dtypes)}")
    if per_tensor and not p.per_tensor:
        raise UnsupportedError(f"{what} is quantized per channel; only per-tensor is supported")
    if not np.all(np.isfinite(p.scales) & (p.scales > 0)):
        raise ModelFormatError(f"{what} has scales {p.scales[:4].tolist()}: they must be positive and finite")
    if np.any((p.zero_points < p.qmin) | (p.zero_points > p.qmax)):
        raise ModelFormatError(f"{what} has zero points outside the {p.dtype.name} range")
    return p


# -- CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED ----------------------------------------


def _weights_params(q, tensors: Sequence[Tensor], node: Node, channel_axis: int) -> QuantParams:
    """The int8 weights' params: symmetric (zero points 0), per tensor or per output
    channel along ``channel_axis``, as LiteRT requires."""
    w = _params(q, 1, "the filter", per_tensor=False)
    if not w.per_tensor and w.axis != channel_axis:
        raise UnsupportedError(f"filter quantized along axis {w.axis}, expected the output channels "
                               f"(axis {channel_axis})")
    if np.any(w.zero_points != 0):
        raise UnsupportedError("filter zero points must be 0 (symmetric int8 weights)")
    return w


def _bias_check(node: Node, tensors: Sequence[Tensor]) -> None:
    if len(node.inputs) > 2 and node.inputs[2] >= 0 and tensors[node.inputs[2]].dtype != np.int32:
        raise UnsupportedError(f"bias has type {tensors[node.inputs[2]].type_name}; int8 kernels take INT32")


def _gemm_attrs(channel_axis: int):
    """quantized_attrs of CONV_2D / DEPTHWISE_CONV_2D / FULLY_CONNECTED (XNNPACK's)."""
    def attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
        q = base["quant"]
        x = _params(q, 0, "input 0")
        w = _weights_params(q, tensors, node, channel_axis)
        out = _params(q, 0, "the output", output=True)
        _bias_check(node, tensors)
        # XNNPACK's requantization scale, per output channel: input * filter / output in float32.
        scale = fp32_scale(x.scale, w.scales, out.scale)
        if np.any(scale >= 256):
            raise UnsupportedError("requantization scale input*filter/output >= 256 (XNNPACK refuses it)")
        lo, hi = activation_range(base.get("activation", "NONE"), out)
        return {"requant": {"x_zp": x.zero_point, "scale": scale, "zp": out.zero_point, "lo": lo, "hi": hi}}
    return attrs


def _finish(acc: np.ndarray, bias, r: dict, dtype=np.int8) -> np.ndarray:
    """int32 sums (exact float64) plus the bias, requantized as XNNPACK does."""
    acc = np.rint(acc).astype(np.int64)
    if bias is not None:
        acc = acc + np.asarray(bias, np.int64)
    return requantize_fp32(acc, r["scale"], r["zp"], r["lo"], r["hi"]).astype(dtype)


def _conv_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """int8 CONV_2D: sums of ``(x - x_zp) * w`` (padding contributes 0) plus the int32
    bias, requantized per output channel."""
    x, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    r = attrs["requant"]
    return [_finish(conv_sums(x.astype(np.float64) - r["x_zp"], w.astype(np.float64), attrs), bias, r)]


def _depthwise_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """int8 DEPTHWISE_CONV_2D: output channel ``c*M + m`` sums ``(x_c - x_zp) * w``."""
    x, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    r = attrs["requant"]
    return [_finish(depthwise_sums(x.astype(np.float64) - r["x_zp"], w.astype(np.float64), attrs), bias, r)]


def _fc_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """int8 FULLY_CONNECTED: rows of ``x - x_zp`` times ``w^T`` plus the int32 bias."""
    x, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    r = attrs["requant"]
    rows = x.reshape(-1, w.shape[1]).astype(np.float64) - r["x_zp"]
    y = _finish(rows @ w.astype(np.float64).T, bias, r)
    shape = (*x.shape[:-1], w.shape[0]) if attrs["keep_num_dims"] else (rows.shape[0], w.shape[0])
    return [y.reshape(shape)]


_attach("CONV_2D", _conv_q, _gemm_attrs(0))
_attach("DEPTHWISE_CONV_2D", _depthwise_q, _gemm_attrs(3))
_attach("FULLY_CONNECTED", _fc_q, _gemm_attrs(0))


# -- ADD, SUB, MUL -------------------------------------------------------------------------


def _binary_params(base: dict) -> tuple[QuantParams, QuantParams, QuantParams, int, int]:
    q = base["quant"]
    a, b = _params(q, 0, "input 0"), _params(q, 1, "input 1")
    out = _params(q, 0, "the output", output=True)
    lo, hi = activation_range(base.get("activation", "NONE"), out)
    return a, b, out, lo, hi


def _add_attrs(subtract: bool):
    def attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
        a, b, out, lo, hi = _binary_params(base)
        return {"add": xnn_add_params(a, b, out, subtract), "zp": out.zero_point, "lo": lo, "hi": hi}
    return attrs


def _add_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """int8 ADD / SUB as XNNPACK: ``(bias + a * ma + b * mb) >> shift + zp``, clamped."""
    y = xnn_add(inputs[0], inputs[1], attrs["add"], attrs["zp"], attrs["lo"], attrs["hi"])
    return [y.astype(np.int8)]


def _mul_attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
    a, b, out, lo, hi = _binary_params(base)
    scale = fp32_scale(a.scale, b.scale, out.scale)
    return {"requant": {"a_zp": a.zero_point, "b_zp": b.zero_point, "scale": scale, "zp": out.zero_point,
                        "lo": lo, "hi": hi}}


def _mul_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """int8 MUL as XNNPACK: ``(a - za) * (b - zb)`` requantized in float32."""
    r = attrs["requant"]
    acc = (inputs[0].astype(np.int64) - r["a_zp"]) * (inputs[1].astype(np.int64) - r["b_zp"])
    return [requantize_fp32(acc, r["scale"], r["zp"], r["lo"], r["hi"]).astype(np.int8)]


_attach("ADD", _add_q, _add_attrs(False))
_attach("SUB", _add_q, _add_attrs(True))
_attach("MUL", _mul_q, _mul_attrs)


# -- MEAN ----------------------------------------------------------------------------------


def _mean_attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
    q = base["quant"]
    x = _params(q, 0, "input 0")
    out = _params(q, 0, "the output", output=True)
    return {"mean": {"ratio": np.float32(np.float32(x.scale) / np.float32(out.scale)), "x_zp": x.zero_point,
                     "zp": out.zero_point, "qmin": out.qmin, "qmax": out.qmax}}


def _mean_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """int8 MEAN as XNNPACK: the int32 sum of the raw values, then ``sum * s + z`` in
    float32 rounded to nearest even, with ``s = (in_scale / out_scale) * (1 / n)`` and
    ``z = out_zp - (n * in_zp) * s`` (the input zero point folded into the output's)."""
    x, m = inputs[0], attrs["mean"]
    axes = reduction_axes(inputs[1], x.ndim)
    count = int(np.prod([x.shape[a] for a in axes], dtype=np.int64)) if axes else 1
    total = np.sum(x, axis=axes, keepdims=attrs["keep_dims"], dtype=np.int64)
    s = np.float32(m["ratio"] * (np.float32(1.0) / np.float32(max(count, 1))))
    z = np.float32(np.float32(m["zp"]) - np.float32(np.float32(count * m["x_zp"]) * s))
    f = total.astype(np.float32) * s + z
    return [np.clip(np.rint(f), m["qmin"], m["qmax"]).astype(np.int8)]


_attach("MEAN", _mean_q, _mean_attrs)


# -- HARD_SWISH (LiteRT's builtin kernel: TFLite's fixed-point reference) ------------------


def _high_mul16(a, b) -> np.ndarray:
    """gemmlowp's int16 ``SaturatingRoundingDoublingHighMul``: ``round(a * b / 2^15)``,
    ties away from zero."""
    ab = np.asarray(a, np.int64) * np.asarray(b, np.int64)
    total = ab + np.where(ab >= 0, 1 << 14, 1 - (1 << 14))
    high = np.where(total >= 0, total >> 15, -((-total) >> 15))
    both_min = (np.asarray(a) == -32768) & (np.asarray(b) == -32768)
    return np.where(both_min, 32767, high)


def _divide_pot(x, exponent: int) -> np.ndarray:
    """``RoundingDivideByPOT``: divide by 2^exponent, ties away from zero."""
    mask = (1 << exponent) - 1
    x = np.asarray(x, np.int64)
    return (x >> exponent) + ((x & mask) > ((mask >> 1) + (x < 0)))


def _to_int16_multiplier(m32: int) -> int:
    """TFLite's ``DownScaleInt32ToInt16Multiplier``: the top 16 bits, rounded."""
    if m32 >= (1 << 31) - 1 - (1 << 15):
        return 32767
    return (m32 + (1 << 15)) >> 16


def _saturate16(x) -> np.ndarray:
    return np.clip(x, -32768, 32767)


def _hard_swish_attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
    q = base["quant"]
    x = _params(q, 0, "input 0", dtypes=(I8, U8))
    out = _params(q, 0, "the output", dtypes=(I8, U8), output=True)
    hires = np.float32(np.float32(1.0 / 128.0) * np.float32(x.scale))
    out_m, out_e = quantize_multiplier(np.float32(hires / np.float32(out.scale)))
    relu_m, relu_e = quantize_multiplier(np.float32(hires / np.float32(3.0 / 32768.0)))
    if int(out_e) > 0:
        raise UnsupportedError("HARD_SWISH output multiplier above 1 (TFLite refuses it)")
    return {"hard_swish": {"x_zp": x.zero_point, "zp": out.zero_point, "out_m": _to_int16_multiplier(int(out_m)),
                           "out_e": int(out_e), "relu_m": _to_int16_multiplier(int(relu_m)),
                           "relu_e": int(relu_e), "qmin": out.qmin, "qmax": out.qmax, "dtype": out.dtype}}


def _hard_swish_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """TFLite's int8 HARD_SWISH: the input on a 2^7 finer scale; a "relu-ish" factor in
    [0, 1] (x rescaled so 3.0 is 2^15, saturated, moved to [0, 1]) times the input on the
    output scale (a truncating doubling high multiply), shifted right, plus the zero point."""
    p = attrs["hard_swish"]
    hires = (inputs[0].astype(np.int64) - p["x_zp"]) * 128
    preshift = _high_mul16(hires, p["out_m"])
    reluish = hires
    if p["relu_e"] > 0:
        reluish = _saturate16(reluish * (1 << (p["relu_e"] - 1)))
    reluish = _high_mul16(reluish, p["relu_m"])
    if p["relu_e"] > 0:
        reluish = _saturate16(reluish * 2)
    if p["relu_e"] < 0:
        reluish = _divide_pot(reluish, -p["relu_e"])
    reluish = (reluish + (1 << 15)) >> 1
    # SaturatingDoublingHighMul: truncation toward zero (no rounding nudge).
    ab = reluish * preshift
    product = np.where(ab >= 0, ab >> 15, -((-ab) >> 15))
    y = _divide_pot(product, -p["out_e"]) + p["zp"]
    return [np.clip(y, p["qmin"], p["qmax"]).astype(p["dtype"])]


_attach("HARD_SWISH", _hard_swish_q, _hard_swish_attrs)


# -- QUANTIZE, DEQUANTIZE (new ops: their float references are the conversions) ------------


def _convert_attrs(node: Node, tensors: Sequence[Tensor]) -> dict:
    if len(node.inputs) != 1 or len(node.outputs) != 1 or node.inputs[0] < 0:
        raise UnsupportedError(f"expects 1 input and 1 output, has {len(node.inputs)} and {len(node.outputs)}")
    return {}


def _convert_infer(dtype_of):
    def infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
        return [TensorSpec(tuple(inputs[0].shape), dtype_of(inputs[0], attrs))]
    return infer


def _quantize_attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
    q = base["quant"]
    out = _params(q, 0, "the output", dtypes=(I8, U8, I16), output=True, per_tensor=False)
    src = q.input(0)
    attrs = {"out": out, "in": src}
    if src is not None:
        if not (src.per_tensor and out.per_tensor):
            raise UnsupportedError("per-channel requantization")
        ratio = np.float32(np.float32(src.scale) / np.float32(out.scale))
        if src.dtype == out.dtype == I8 and 2.0 ** -8 <= ratio <= 2.0 ** 7:
            # XNNPACK's int8 -> int8 convert (LiteRT delegates it): an 8.8 fixed-point
            # multiplier, rint(256 * ratio), and a right shift by 8 rounding half up.
            attrs["xnn_multiplier"] = int(np.rint(np.float32(256.0) * ratio))
        else:
            # TFLite's Requantize: input/output scale in double, fixed-point multiplier.
            m, shift = quantize_multiplier(np.float64(src.scale) / np.float64(out.scale))
            attrs["requant"] = (int(m), int(shift))
    elif tensors[node.inputs[0]].dtype != np.float32:
        raise UnsupportedError(f"QUANTIZE of {tensors[node.inputs[0]].type_name}")
    return attrs


def _quantize_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """QUANTIZE: float32 -> int8/uint8 as XNNPACK (``x * (1/scale)`` rounded to nearest
    even); to int16 as TFLite's builtin kernel (``x / scale``, ties away from zero); int8
    -> int8 as XNNPACK's convert, other int -> int by TFLite's fixed-point requantization."""
    out, src = attrs["out"], attrs["in"]
    x = inputs[0]
    if src is None:
        return [quantize(x, out, "away" if out.dtype == I16 else "even")]
    if "xnn_multiplier" in attrs:
        m = attrs["xnn_multiplier"]
        acc = (out.zero_point << 8) - m * src.zero_point + 0x80 + x.astype(np.int64) * m
        return [np.clip(acc >> 8, out.qmin, out.qmax).astype(out.dtype)]
    m, shift = attrs["requant"]
    y = multiply_by_quantized_multiplier(x.astype(np.int64) - src.zero_point, m, shift) + out.zero_point
    return [np.clip(y, out.qmin, out.qmax).astype(out.dtype)]


def _dequantize_attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
    src = _params(base["quant"], 0, "input 0", dtypes=(I8, U8, I16), per_tensor=False)
    return {"in": src}


def _dequantize_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """DEQUANTIZE: ``(q - zero_point) * scale`` in float32."""
    return [dequantize(inputs[0], attrs["in"])]


# QUANTIZE's output dtype is its output tensor's, known from the node's quantization.
register(OpDef(name="QUANTIZE", attrs=_convert_attrs,
               infer=_convert_infer(lambda x, a: a["quant"].output(0).dtype if "quant" in a else x.dtype),
               reference=lambda inputs, attrs: [np.asarray(inputs[0])],
               quantized=_quantize_q, quantized_attrs=_quantize_attrs,
               doc="Quantize float32 to int8/uint8/int16, or requantize between integer types."))
register(OpDef(name="DEQUANTIZE", attrs=_convert_attrs, infer=_convert_infer(lambda x, a: np.dtype(np.float32)),
               reference=lambda inputs, attrs: [np.asarray(inputs[0], np.float32)],
               quantized=_dequantize_q, quantized_attrs=_dequantize_attrs,
               doc="Dequantize int8/uint8/int16 (or float16) to float32."))


# -- pools and clamps ----------------------------------------------------------------------


def _same_params_attrs(dtypes=(I8,), style: str = "xnnpack"):
    """quantized_attrs of ops that keep the input's quantization (pools): input and output
    params must agree; the fused activation becomes a quantized clamp range."""
    def attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
        q = base["quant"]
        x = _params(q, 0, "input 0", dtypes)
        out = _params(q, 0, "the output", dtypes, output=True)
        if not x.same_as(out):
            raise UnsupportedError("input and output quantization differ (requantizing pool is not supported)")
        lo, hi = activation_range(base.get("activation", "NONE"), out, style)
        return {"clamp": (lo, hi)}
    return attrs


def _max_pool_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """int8 MAX_POOL_2D: the window's maximum (padding never wins), clamped."""
    x = inputs[0]
    x4 = x.reshape(pool_input_4d(x.shape, attrs))
    out_hw, before = _spatial_plan(x4.shape, attrs["filter"], attrs)
    low = np.iinfo(x.dtype).min
    xp = _pad_hw(x4.astype(np.int64), out_hw, attrs["filter"], attrs["stride"], (1, 1), before, value=low - 1)
    taps = [_tap(xp, i, j, out_hw, attrs["stride"], (1, 1))
            for i in range(attrs["filter"][0]) for j in range(attrs["filter"][1])]
    lo, hi = attrs["clamp"]
    return [np.clip(np.maximum.reduce(taps), lo, hi).astype(x.dtype)]


def _avg_pool_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """int8 AVERAGE_POOL_2D as TFLite's builtin kernel: the int32 sum of the window's real
    pixels divided by their count, rounded half away from zero, clamped."""
    x = inputs[0]
    out_hw, before = _spatial_plan(x.shape, attrs["filter"], attrs)
    args = (out_hw, attrs["filter"], attrs["stride"], (1, 1), before)
    xp = _pad_hw(x.astype(np.int64), *args)
    ones = _pad_hw(np.ones((1, *x.shape[1:3], 1), np.int64), *args)
    fh, fw = attrs["filter"]
    total = sum(_tap(xp, i, j, out_hw, attrs["stride"], (1, 1)) for i in range(fh) for j in range(fw))
    count = sum(_tap(ones, i, j, out_hw, attrs["stride"], (1, 1)) for i in range(fh) for j in range(fw))
    count = np.maximum(count, 1)
    half = count // 2
    avg = np.where(total > 0, (total + half) // count, -((-total + half) // count))
    lo, hi = attrs["clamp"]
    return [np.clip(avg, lo, hi).astype(x.dtype)]


_attach("MAX_POOL_2D", _max_pool_q, _same_params_attrs())
_attach("AVERAGE_POOL_2D", _avg_pool_q, _same_params_attrs(style="tflite"))


# -- pure data movement: the float reference is right on integers ----------------------------


def _movement_attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
    """Data movement keeps values: every quantized input of the output's type must carry
    the output's quantization (LiteRT would requantize otherwise)."""
    q = base["quant"]
    out = q.output(0)
    for i, p in enumerate(q.inputs):
        if p is not None and out is not None and p.dtype == out.dtype and not p.same_as(out):
            raise UnsupportedError(f"input {i} and the output have different quantization "
                                   "(requantizing data movement is not supported)")
    return {}


DATA_MOVEMENT = ("RESHAPE", "SQUEEZE", "EXPAND_DIMS", "TRANSPOSE", "PAD", "PADV2", "CONCATENATION", "PACK",
                 "UNPACK", "SPLIT", "SPLIT_V", "GATHER", "GATHER_ND", "SLICE", "STRIDED_SLICE", "SPACE_TO_DEPTH",
                 "DEPTH_TO_SPACE", "BATCH_TO_SPACE_ND", "SPACE_TO_BATCH_ND", "TILE", "BROADCAST_TO", "SHAPE",
                 "REVERSE_V2")
for _op in DATA_MOVEMENT:
    if get_op(_op) is not None:
        _attach(_op, get_op(_op).reference, _movement_attrs)


def quantized_ops() -> list[str]:
    """The ops with an integer reference (data movement included), sorted."""
    from .registry import all_ops
    return sorted(name for name, opdef in all_ops().items() if opdef.quantized is not None)


__all__ = ["DATA_MOVEMENT", "quantized_ops"]
