"""Integer references of SUM, ABS, NEG, SQRT, RSQRT, DIV and LOG_SOFTMAX.

Like :mod:`litegpu.ops.quantized`, each op gets ``OpDef.quantized`` (the integer
reference) and ``OpDef.quantized_attrs`` (the check of the node's quantization and what
can be precomputed: multipliers, tables, clamp ranges). MEAN (int16 included) and ADD/SUB
(the int16 power-of-two kernel included) live in :mod:`litegpu.ops.quantized`;
REDUCE_MAX/REDUCE_MIN in :mod:`litegpu.ops.quantized_act`.

Whose arithmetic, as LiteRT's default interpreter runs it (checked node by node against
``BUILTIN_WITHOUT_DEFAULT_DELEGATES``; a delegated node shows as a ``DELEGATE`` node):

- SUM on int8/uint8 goes to the XNNPACK delegate: the int32 sum of the raw values, then
  a float32 multiply-add rounded to nearest even (shared with MEAN). int16 SUM (and an
  8-bit SUM XNNPACK refuses: axes empty or not constant) runs TFLite's optimized
  ``QuantizedMeanOrSum``: float32 ``sum * scale + bias`` rounded half away from zero.
- ABS, NEG, SQRT, RSQRT, DIV and LOG_SOFTMAX stay on TFLite's builtin kernels
  (``elementwise.cc``, ``neg.cc``, ``div.cc``, ``activations.cc``): fixed-point
  multipliers of ``QuantizeMultiplier``, gemmlowp's Newton-Raphson reciprocal and inverse
  square root, the interpolated int16 table of ``LUTPopulate``; SQRT and 8-bit
  LOG_SOFTMAX compute in float32.

LiteRT refuses uint8 ABS, NEG, SQRT and RSQRT, int16 LOG_SOFTMAX, and fails at invoke on
data it cannot take (SQRT/RSQRT of negative values, DIV by the zero point): the first at
compile time here, the rest as :class:`~litegpu.errors.ExecutionError` when run.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import ExecutionError, UnsupportedError
from ..graph import Node, Tensor
from ..quant import (QuantParams, activation_range, multiply_by_quantized_multiplier, quantize_multiplier,
                     round_half_away, saturating_rounding_doubling_high_mul)
from .quantized import I8, I16, U8, _attach, _params, xnn_sum_requant
from .quantized_act import _all_values, _f32_of, _Fx, _newton_reciprocal, _wrap, lut16_lookup, tflite_lut16
from .reduce import reduction_axes
from .registry import const_input

F32 = np.float32


def _same_type_params(q, op: str, dtypes: tuple, symmetric16: bool = True) -> tuple[QuantParams, QuantParams]:
    """Input 0's and the output's params, of one type among ``dtypes``; int16 ones with zero
    points 0 (TFLite's ``GenericPrepare`` and reductions insist) when ``symmetric16``."""
    x = _params(q, 0, "input 0", dtypes)
    out = _params(q, 0, "the output", (x.dtype,), output=True)
    if symmetric16 and x.dtype == I16 and (x.zero_point != 0 or out.zero_point != 0):
        raise UnsupportedError(f"int16 {op} needs zero points 0 (symmetric int16; LiteRT refuses others)")
    return x, out


def _bit_length(x) -> np.ndarray:
    """The bit length of non-negative integers below 2^53 (frexp's exponent is exact)."""
    return np.frexp(np.asarray(x, np.int64).astype(np.float64))[1].astype(np.int64)


def _clz32(x) -> np.ndarray:
    """``CountLeadingZeros`` of uint32 values (32 for 0)."""
    return 32 - _bit_length(x)


def _clrsb32(x) -> np.ndarray:
    """``CountLeadingSignBits`` of int32 values: leading bits equal to the sign, less one (31 for 0)."""
    x = np.asarray(x, np.int64)
    return 31 - _bit_length(np.where(x >= 0, x, ~x))


# -- SUM ----------------------------------------------------------------------------------------


def _sum_attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
    x, out = _same_type_params(base["quant"], "SUM", (I8, U8, I16))
    axes = const_input(node, tensors, 1)
    # XNNPACK takes 8-bit sums over constant, non-empty axes; the rest stays on TFLite.
    xnn = x.dtype != I16 and axes is not None and np.asarray(axes).size > 0
    return {"sum": {"ratio": F32(F32(x.scale) / F32(out.scale)), "x_zp": x.zero_point, "zp": out.zero_point,
                    "qmin": out.qmin, "qmax": out.qmax, "dtype": out.dtype, "xnn": xnn}}


def _tflite_sum(total: np.ndarray, count: int, m: dict) -> np.ndarray:
    """TFLite's optimized ``QuantizedMeanOrSum`` (sum): ``round(float(sum) * scale + bias)``
    in float32, ties away from zero, plus the output zero point, saturated; ``scale`` is
    in/out scale and ``bias = -in_zp * scale * count`` (float32, left to right)."""
    scale = m["ratio"]
    bias = F32(F32(F32(-m["x_zp"]) * scale) * F32(count))
    value = round_half_away(total.astype(F32) * scale + bias).astype(np.int64) + m["zp"]
    return np.clip(value, m["qmin"], m["qmax"]).astype(m["dtype"])


def _sum_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """Quantized SUM: the sum of the raw values over the axes (int64, exact), requantized
    as XNNPACK does (int8/uint8) or as TFLite's kernel (int16, or axes XNNPACK refuses)."""
    x, m = inputs[0], attrs["sum"]
    axes = reduction_axes(inputs[1], x.ndim)
    count = int(np.prod([x.shape[a] for a in axes], dtype=np.int64)) if axes else 1
    total = np.sum(x, axis=axes, keepdims=attrs["keep_dims"], dtype=np.int64)
    if m["xnn"]:
        return [xnn_sum_requant(total, count, m, mean=False)]
    if x.size == 0:     # TFLite leaves the zero-initialized output
        return [np.zeros(total.shape, m["dtype"])]
    return [_tflite_sum(total, count, m)]


_attach("SUM", _sum_q, _sum_attrs)


# -- ABS, NEG ---------------------------------------------------------------------------------------


def _abs_attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
    x, out = _same_type_params(base["quant"], "ABS", (I8, I16))
    # TFLite rescales only when the (float32) scales differ; otherwise it adds the zero point.
    rescale = None
    if F32(x.scale) != F32(out.scale):
        m, shift = quantize_multiplier(np.float64(F32(F32(x.scale) / F32(out.scale))))
        rescale = (int(m), int(shift))
    return {"abs": {"x_zp": x.zero_point, "zp": out.zero_point, "rescale": rescale, "qmin": out.qmin,
                    "qmax": out.qmax, "dtype": out.dtype}}


def _abs_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """Quantized ABS as TFLite's kernel: ``|x - x_zp|``, times the fixed-point ratio of the
    scales when they differ, plus the output zero point, saturated."""
    p = attrs["abs"]
    value = np.abs(inputs[0].astype(np.int64) - p["x_zp"])
    if p["rescale"] is not None:
        value = multiply_by_quantized_multiplier(value, *p["rescale"])
    return [np.clip(value + p["zp"], p["qmin"], p["qmax"]).astype(p["dtype"])]


def _neg_attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
    # LiteRT negates int8/int16 storage and looks at no scale or zero point (uint8 fails).
    x = _params(base["quant"], 0, "input 0", (I8, I16))
    _params(base["quant"], 0, "the output", (x.dtype,), output=True)
    return {}


def _neg_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """Quantized NEG as TFLite's kernel: the stored integers negated, wrapping like the C++
    narrowing (-(-128) is -128). The quantization is ignored, as LiteRT ignores it: only a
    zero point of 0 with the output on the input's scale means ``-x``."""
    x = inputs[0]
    return [_wrap(-x.astype(np.int64), 8 * x.dtype.itemsize).astype(x.dtype)]


_attach("ABS", _abs_q, _abs_attrs)
_attach("NEG", _neg_q, _neg_attrs)


# -- SQRT, RSQRT -------------------------------------------------------------------------------------


def _sqrt_attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
    x, out = _same_type_params(base["quant"], "SQRT", (I8, I16))
    return {"sqrt": {"x": x, "out": out}}


def _sqrt_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """Quantized SQRT as TFLite's kernel, in float32: ``sqrt(scale * (x - zp))`` divided
    by the output scale, truncated toward zero (a cast, not a rounding), plus the zero
    point, saturated. A negative input fails, as in LiteRT."""
    x, out = attrs["sqrt"]["x"], attrs["sqrt"]["out"]
    real = F32(x.scale) * (inputs[0].astype(np.int64) - x.zero_point).astype(F32)
    if np.any(real < 0):
        raise ExecutionError("SQRT is only defined for non-negative values (LiteRT fails too)")
    value = np.trunc(np.sqrt(real) / F32(out.scale)).astype(np.int64) + out.zero_point
    return [np.clip(value, out.qmin, out.qmax).astype(out.dtype)]


def _inv_sqrt_multiplier(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """TFLite's ``GetInvSqrtQuantizedMultiplierExp`` (``reverse_shift`` -1) of integers in
    [2, 2^29): 1/sqrt(v) as an int32 multiplier and a (left-positive) shift, by five
    Newton-Raphson steps in gemmlowp's Q3 fixed point on ``v`` normalized to [2^27, 2^29)."""
    v = np.asarray(values, np.int64)
    pairs = (_clz32(v) - 1) // 2 - 1
    shift = 11 - pairs
    v = v << (2 * pairs)
    fx_input = _Fx(v >> 1, 3, 32)
    half_input = fx_input.mul_pot(-1)
    half_three = fx_input.const((1 << 28) + (1 << 27), 3)
    x = fx_input.one(3)
    for _ in range(5):
        x3 = (x * x * x).rescale(3)
        x = (half_three * x - half_input * x3).rescale(3)
    x = x * x.const(1518500250, 0)        # sqrt(2)/2 in Q0.31
    raw = np.where(shift < 0, _wrap(x.raw << np.maximum(-shift, 0), 32), x.raw)
    return raw, -np.maximum(shift, 0)


def _rsqrt_attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
    x, out = _same_type_params(base["quant"], "RSQRT", (I8, I16))
    if x.dtype == I16:
        # LUTPopulate of the float32 1/sqrt; non-positive inputs map to the largest value.
        def fn(v):
            v = np.asarray(v, F32)
            with np.errstate(divide="ignore", invalid="ignore"):
                r = F32(1.0) / np.sqrt(np.maximum(v, F32(0)))
            return np.where(v <= 0, F32(32767) * F32(out.scale), r).astype(F32)
        return {"rsqrt": {"x_zp": 0, "lut16": tflite_lut16(fn, x.scale, 0, out.scale, 0)}}
    # int8: TFLite's per-value fixed point, tabulated over the 256 inputs.
    m, s = quantize_multiplier(1.0 / np.float64(F32(np.sqrt(F32(x.scale)) * F32(out.scale))))
    q = _all_values(x.dtype)
    d = np.maximum(q - x.zero_point, 1)
    inv, inv_shift = _inv_sqrt_multiplier(np.maximum(d, 2))
    inv = np.where(d <= 1, (1 << 31) - 1, inv)      # 0 and 1 are special-cased: multiplier INT32_MAX
    inv_shift = np.where(d <= 1, 0, inv_shift)
    k = 20      # the kernel's shift keeping 1/sqrt(v) an integer
    data = multiply_by_quantized_multiplier(np.ones_like(q), inv, inv_shift + k)
    y = multiply_by_quantized_multiplier(data, int(m), int(s) - k) + out.zero_point
    y = np.where(q == x.zero_point, out.qmax, np.clip(y, out.qmin, out.qmax))   # 0: the largest value
    return {"rsqrt": {"x_zp": x.zero_point, "table": y, "dtype": out.dtype}}


def _rsqrt_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """Quantized RSQRT as TFLite's kernel: int8 by its fixed-point inverse square root per
    value (tabulated at compile time), int16 by its interpolated 513-entry table. An
    input below the zero point (a negative value) fails, as in LiteRT."""
    p, x = attrs["rsqrt"], inputs[0]
    if np.any(x < p["x_zp"]):
        raise ExecutionError("RSQRT is only defined for positive values (LiteRT fails too)")
    if "lut16" in p:
        return [lut16_lookup(x, p["lut16"]).astype(np.int16)]
    return [p["table"][x.astype(np.int64) - np.iinfo(x.dtype).min].astype(p["dtype"])]


_attach("SQRT", _sqrt_q, _sqrt_attrs)
_attach("RSQRT", _rsqrt_q, _rsqrt_attrs)


# -- DIV --------------------------------------------------------------------------------------------


def _div_attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
    q = base["quant"]
    a = _params(q, 0, "input 0", (I8, U8, I16))
    b = _params(q, 1, "input 1", (a.dtype,))
    out = _params(q, 0, "the output", (a.dtype,), output=True)
    # The kernel's ratio is float32 arithmetic widened to double.
    real = F32(F32(a.scale) / F32(F32(b.scale) * F32(out.scale)))
    m, shift = quantize_multiplier(np.float64(real))
    # The final shift stays a right shift only while the multiplier is below 2^(headroom of a
    # dividend): 22 bits for 8-bit operands, 15 for int16 (beyond, the C++ shift is undefined).
    if int(shift) > (15 if a.dtype == I16 else 22):
        raise UnsupportedError(f"DIV scale ratio {float(real):g} is too large for TFLite's kernel")
    lo, hi = activation_range(base.get("activation", "NONE"), out, "tflite")
    return {"div": {"a_zp": a.zero_point, "b_zp": b.zero_point, "zp": out.zero_point, "multiplier": int(m),
                    "shift": int(shift), "lo": lo, "hi": hi, "dtype": out.dtype}}


def _reciprocal(d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """TFLite's ``GetReciprocal(d, 31)`` of positive int32 ``d``: 1/d as a Q0.31 fraction
    (gemmlowp's ``one_over_one_plus_x_for_x_in_0_1`` of ``d`` normalized to [1, 2)) and
    the number of bits ``d`` has above the unit."""
    headroom_plus_one = _clz32(d)
    bits_over_unit = 31 - headroom_plus_one
    shifted_minus_one = ((d << headroom_plus_one) & 0xFFFFFFFF) - (1 << 31)
    x = _newton_reciprocal(_Fx(shifted_minus_one, 0, 32))
    return _Fx(x.raw, 1, 32).rescale(0).raw, bits_over_unit      # ExactMulByPot<-1>, Rescale<0>


def _divide_by_pot_c(x: np.ndarray, exponent: np.ndarray) -> np.ndarray:
    """gemmlowp's int32 ``RoundingDivideByPOT`` as LiteRT's x86 build computes it, exponents
    past 31 included (DIV reaches them for tiny dividends): the mask ``(1 << e) - 1``
    narrowed to int32 is all ones there, and the hardware shift counts modulo 32."""
    exponent = np.asarray(exponent, np.int64)
    inside = exponent <= 31
    safe = np.where(inside, exponent, 0)
    mask = np.where(inside, (np.int64(1) << safe) - 1, -1)
    threshold = (mask >> 1) + (x < 0)
    shifted = x >> np.where(inside, exponent, exponent & 31)
    return shifted + ((x & mask) > threshold)


def _div_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """Quantized DIV as TFLite's kernel (XNNPACK does not take it): the divisor's signs
    moved to the dividend, its reciprocal by Newton-Raphson, the dividend normalized to
    its headroom and multiplied, then the output multiplier with the shifts combined,
    plus the zero point, clamped to the fused activation. Dividing by the zero point
    fails, as in LiteRT."""
    p = attrs["div"]
    a = inputs[0].astype(np.int64) - p["a_zp"]
    b = inputs[1].astype(np.int64) - p["b_zp"]
    if np.any(b == 0):
        raise ExecutionError("DIV: division by zero (a divisor equal to its zero point; LiteRT fails too)")
    a, b = np.broadcast_arrays(np.where(b < 0, -a, a), np.abs(b))
    inverse, recip_shift = _reciprocal(b)
    headroom = _clrsb32(a)
    unscaled = saturating_rounding_doubling_high_mul(a << headroom, inverse)
    total_shift = p["shift"] - recip_shift - headroom
    high = saturating_rounding_doubling_high_mul(unscaled, p["multiplier"])
    y = _divide_by_pot_c(high, -total_shift) + p["zp"]
    return [np.clip(y, p["lo"], p["hi"]).astype(p["dtype"])]


_attach("DIV", _div_q, _div_attrs)


# -- LOG_SOFTMAX -------------------------------------------------------------------------------------


# LiteRT's fixed output quantization of 8-bit LOG_SOFTMAX: [-16, 0) over the type's range.
_LOG_SOFTMAX_OUT = {I8: 127, U8: 255}


def _log_softmax_attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
    x, out = _same_type_params(base["quant"], "LOG_SOFTMAX", (I8, U8))
    zp = _LOG_SOFTMAX_OUT[x.dtype]
    if float(out.scale) != 16.0 / 256 or out.zero_point != zp:
        raise UnsupportedError(f"{x.dtype.name} LOG_SOFTMAX output scale {out.scale:g} and zero point "
                               f"{out.zero_point} (LiteRT requires exactly 16/256 and {zp})")
    # expf(-scale * d) for d = max - x in 0..255 (PopulateSoftmaxLookupTable, beta 1).
    table = _f32_of(np.exp)(F32(-F32(x.scale)) * np.arange(256).astype(F32))
    return {"log_softmax": {"table": table, "in_scale": F32(x.scale), "out_scale": F32(out.scale), "zp": zp,
                            "qmin": out.qmin, "qmax": out.qmax, "dtype": out.dtype}}


def _log_softmax_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """8-bit LOG_SOFTMAX as TFLite's optimized kernel, in float32 over the last axis: the
    exponentials of the distances to the row's maximum from a table, summed left to right,
    their ``logf``; then ``(in_scale / out_scale) * x - (in_scale * max + log_sum) /
    out_scale`` rounded to nearest even, plus the zero point, saturated. (The stored
    integers stand in for the real values: the input zero point cancels.)"""
    p, x = attrs["log_softmax"], inputs[0]
    if x.size == 0:
        return [np.empty(x.shape, p["dtype"])]
    xi = x.astype(np.int64)
    row_max = xi.max(axis=-1, keepdims=True)
    e = p["table"][row_max - xi]
    total = np.zeros(e.shape[:-1], F32)
    for j in range(e.shape[-1]):        # sequential float32 sum, as the kernel's loop
        total = total + e[..., j]
    log_sum = _f32_of(np.log)(total)[..., None]
    scale = F32(p["in_scale"] / p["out_scale"])
    precomputed = (p["in_scale"] * row_max.astype(F32) + log_sum) / p["out_scale"]
    log_prob = scale * xi.astype(F32) - precomputed
    y = np.rint(log_prob).astype(np.int64) + p["zp"]
    return [np.clip(y, p["qmin"], p["qmax"]).astype(p["dtype"])]


_attach("LOG_SOFTMAX", _log_softmax_q, _log_softmax_attrs)
