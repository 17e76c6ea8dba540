"""Integer references of activations, softmax and element-wise comparisons/reductions.

Like :mod:`litegpu.ops.quantized`, each op gets ``OpDef.quantized`` (the integer
reference) and ``OpDef.quantized_attrs`` (the check of the node's quantization and
everything precomputable: multipliers, lookup tables, clamp ranges).

Whose arithmetic: LiteRT's default interpreter hands int8/uint8 LOGISTIC, TANH,
LEAKY_RELU and int8 ELU to its XNNPACK delegate; XNNPACK computes those ops as a
256-entry table, each entry the float function of the dequantized input, requantized
(round to nearest even). Every other op here runs on TFLite's builtin kernels: tables
built by ``LUTPopulate`` (float32, ties away from zero), the fixed-point multipliers of
``QuantizeMultiplier``, gemmlowp's fixed-point exp/tanh/logistic for int16, and for
int8/uint8 SOFTMAX a float32 table of exponentials. Which path ran was checked node by
node against LiteRT (a delegated node shows as a ``DELEGATE`` node in its plan).

The numbers are reproduced exactly: float steps are done in float32 where the kernels
use float, transcendental functions in float64 rounded once to float32 (what glibc's
``expf``/``tanhf`` return), integer steps in int64 with the wrap-around or saturation of
the C++ types they mimic.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ..errors import UnsupportedError
from ..graph import Node, Tensor
from ..quant import (QuantParams, multiply_by_quantized_multiplier, quantize_multiplier,
                     round_half_away, rounding_divide_by_pot, saturating_rounding_doubling_high_mul)
from .quantized import I8, I16, U8, _attach, _high_mul16, _params
from .registry import ACTIVATION_RANGES, const_input, get_op

F32 = np.float32


# -- gemmlowp's fixed point (fixedpoint.h), vectorized ----------------------------------------


def _wrap(x, bits: int) -> np.ndarray:
    """``x`` wrapped to a signed ``bits``-bit integer (C++ narrowing / two's complement)."""
    half = 1 << (bits - 1)
    return ((np.asarray(x, np.int64) + half) & ((1 << bits) - 1)) - half


class _Fx:
    """A gemmlowp ``FixedPoint<int{bits}, ibits>``: raw integers meaning ``raw / 2^(bits-1-ibits)``.

    Only what LiteRT's int16 LOGISTIC/TANH need: +, -, negation wrap like the raw type;
    ``*`` is the saturating rounding doubling high multiply (integer bits add up).
    """

    __slots__ = ("raw", "ibits", "bits")

    def __init__(self, raw, ibits: int, bits: int) -> None:
        self.raw = np.asarray(raw, np.int64)
        self.ibits = ibits
        self.bits = bits

    @property
    def frac(self) -> int:
        return self.bits - 1 - self.ibits

    def _like(self, raw, ibits: int | None = None) -> "_Fx":
        return _Fx(raw, self.ibits if ibits is None else ibits, self.bits)

    def __add__(self, other: "_Fx") -> "_Fx":
        return self._like(_wrap(self.raw + other.raw, self.bits))

    def __sub__(self, other: "_Fx") -> "_Fx":
        return self._like(_wrap(self.raw - other.raw, self.bits))

    def __neg__(self) -> "_Fx":
        return self._like(_wrap(-self.raw, self.bits))

    def __mul__(self, other: "_Fx") -> "_Fx":
        if self.bits == 16:
            raw = _high_mul16(self.raw, other.raw)
        else:
            raw = saturating_rounding_doubling_high_mul(self.raw, other.raw)
        return _Fx(raw, self.ibits + other.ibits, self.bits)

    def const(self, raw32: int, ibits: int) -> "_Fx":
        """A constant given as its int32 raw value (rounded to 16 bits for int16)."""
        raw = raw32 if self.bits == 32 else int(rounding_divide_by_pot(raw32, 16))
        return _Fx(raw, ibits, self.bits)

    def pot(self, exponent: int, ibits: int | None = None) -> "_Fx":
        """``ConstantPOT``: exactly 2^exponent."""
        ibits = self.ibits if ibits is None else ibits
        return _Fx(1 << (self.bits - 1 - ibits + exponent), ibits, self.bits)

    def one(self, ibits: int | None = None) -> "_Fx":
        """``One()``: 1, or the largest raw value with no integer bits."""
        ibits = self.ibits if ibits is None else ibits
        raw = (1 << (self.bits - 1)) - 1 if ibits == 0 else 1 << (self.bits - 1 - ibits)
        return _Fx(raw, ibits, self.bits)

    def mul_pot(self, exponent: int) -> "_Fx":
        """``SaturatingRoundingMultiplyByPOT``: a saturating left shift or a rounding right shift."""
        return self._like(_mul_pot(self.raw, exponent, self.bits))

    def rescale(self, ibits: int) -> "_Fx":
        """``Rescale``: the same value with ``ibits`` integer bits (saturating / rounding)."""
        return _Fx(_mul_pot(self.raw, self.ibits - ibits, self.bits), ibits, self.bits)

    def where(self, mask, other: "_Fx") -> "_Fx":
        return self._like(np.where(mask, self.raw, other.raw))


def _mul_pot(x: np.ndarray, exponent: int, bits: int) -> np.ndarray:
    if exponent == 0:
        return x
    if exponent < 0:
        return rounding_divide_by_pot(x, -exponent)
    threshold = (1 << (bits - 1 - exponent)) - 1
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return np.where(x > threshold, hi, np.where(x < -threshold, lo, x << exponent))


def _rounding_half_sum(a: _Fx, b: _Fx) -> _Fx:
    """``RoundingHalfSum``: (a + b) / 2 rounded half away from zero."""
    total = a.raw + b.raw
    half = total + np.where(total >= 0, 1, -1)
    return a._like(np.where(half >= 0, half // 2, -((-half) // 2)))


def _exp_on_interval(a: _Fx) -> _Fx:
    """gemmlowp's exp(a) for a in [-1/4, 0): a Taylor expansion around -1/8 (a: 0 integer bits)."""
    constant_term = a.const(1895147668, 0)          # exp(-1/8)
    one_third = a.const(715827883, 0)
    x = a + a.pot(-3)
    x2 = x * x
    x3 = x2 * x
    x4 = x2 * x2
    x4_over_4 = x4.mul_pot(-2)
    poly = (((x4_over_4 + x3) * one_third) + x2).mul_pot(-1)
    scaled = constant_term * (x + poly)
    total = constant_term.raw + scaled.raw
    if a.bits == 16:   # AddSaturatingIf16Bit
        raw = np.clip(total, -32768, 32767)
    else:
        raw = _wrap(total, 32)
    return a._like(raw)


# exp(-2^k) for k = -2..4 in Q0.31: the barrel shifter of exp_on_negative_values.
_EXP_BARREL = ((-2, 1672461947), (-1, 1302514674), (0, 790015084), (1, 290630308), (2, 39332535),
               (3, 720401), (4, 242))


def _exp_on_negative_values(a: _Fx) -> _Fx:
    """gemmlowp's exp(a) for a <= 0: exp of a mod 1/4, times exp(-2^k) per set bit of the rest."""
    quarter = a.pot(-2)
    mask = quarter.raw - 1
    a_mod = a._like(a.raw & mask) - quarter
    result = _exp_on_interval(a_mod.rescale(0))
    remainder = (a_mod - a).raw
    for exponent, multiplier in _EXP_BARREL:
        if a.ibits > exponent:
            bit = 1 << (a.frac + exponent)
            result = (result * result.const(multiplier, 0)).where((remainder & bit) != 0, result)
    if a.ibits > 5:
        clamp = a.const(-(1 << (36 - a.ibits)), a.ibits)
        result = result._like(np.where(a.raw < clamp.raw, 0, result.raw))
    return result._like(np.where(a.raw == 0, result.one().raw, result.raw))


def _newton_reciprocal(a: _Fx) -> _Fx:
    """1 / (1 + a) for a in (0, 1), Newton-Raphson on half the denominator (Q2 result)."""
    half_denominator = _rounding_half_sum(a, a.one(0))
    x = a.const(1515870810, 2) + half_denominator * a.const(-1010580540, 2)   # 48/17 - 32/17 * d
    for _ in range(3):
        one_minus = a.one(2) - half_denominator * x
        x = x + (x * one_minus).rescale(2)
    return x


def _fx_logistic(a: _Fx) -> _Fx:
    """gemmlowp's logistic for any ``a`` (result with 0 integer bits)."""
    positive = a.raw > 0
    abs_a = a.where(positive, -a)
    reciprocal = _newton_reciprocal(_exp_on_negative_values(-abs_a))
    if_positive = _Fx(reciprocal.raw, 1, a.bits).rescale(0)        # ExactMulByPot<-1>, then Rescale<0>
    if_negative = if_positive.one() - if_positive
    half = if_positive.const(1 << 30, 0)
    out = if_positive.where(positive, if_negative)
    return out._like(np.where(a.raw == 0, half.raw, out.raw))


def _fx_tanh(a: _Fx) -> _Fx:
    """gemmlowp's tanh for any ``a``: (1 - exp(-2|a|)) / (1 + exp(-2|a|)), signed."""
    negative = a.raw < 0
    n = a.where(negative, -a)
    e = _exp_on_negative_values(_Fx(n.raw, n.ibits + 1, n.bits))   # ExactMulByPot<1>
    t = (_newton_reciprocal(e) - e.one(2)).rescale(0)
    out = (-t).where(negative, t)
    return out._like(np.where(a.raw == 0, 0, out.raw))


# -- lookup tables -------------------------------------------------------------------------


def _f32_of(fn64):
    """A float function computed in float64 and rounded once to float32 (glibc's ``expf``,
    ``tanhf`` ... are correctly rounded but for rare cases)."""
    def fn(x):
        return fn64(np.asarray(x, np.float32).astype(np.float64)).astype(np.float32)
    return fn


def _all_values(dtype: np.dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    return np.arange(info.min, info.max + 1, dtype=np.int64)


def xnn_lut(fn, x: QuantParams, out: QuantParams) -> np.ndarray:
    """XNNPACK's table for a quantized unary op (``init_lut_op_with_config``), indexed by
    ``value - qmin``: each input dequantized in float32 (``(q - zp) * scale``), mapped by
    the float32 function ``fn``, requantized as ``rint(y * (1 / out_scale) + out_zp)``,
    saturated."""
    q = _all_values(x.dtype)
    real = (q.astype(F32) - F32(x.zero_point)) * F32(x.scale)
    with np.errstate(over="ignore", invalid="ignore"):
        y = np.asarray(fn(real), F32)
        scaled = y * (F32(1.0) / F32(out.scale)) + F32(out.zero_point)
    scaled = np.nan_to_num(scaled, nan=0.0)
    return np.clip(np.rint(scaled), out.qmin, out.qmax).astype(np.int64)


def tflite_lut8(fn, x: QuantParams, out: QuantParams) -> np.ndarray:
    """TFLite's 256-entry ``LUTPopulate`` (int8/uint8), indexed by ``value - qmin``: the
    input dequantized as ``scale * (q - zp)`` in float32, ``fn`` in float32, times ``1 /
    out_scale``, rounded half away from zero, plus the zero point, saturated."""
    q = _all_values(x.dtype)
    real = F32(x.scale) * (q - x.zero_point).astype(F32)
    with np.errstate(over="ignore", invalid="ignore"):
        y = np.asarray(fn(real), F32) * (F32(1.0) / F32(out.scale))
    rescaled = np.clip(round_half_away(np.nan_to_num(y, nan=0.0)), -2.0 ** 31, 2.0 ** 31 - 1)
    return np.clip(rescaled.astype(np.int64) + out.zero_point, out.qmin, out.qmax)


def tflite_lut16(fn, in_scale, in_zp: int, out_scale, out_zp: int, ftype=F32) -> np.ndarray:
    """TFLite's 513-entry int16 ``LUTPopulate``: 512 samples of ``fn`` over the input
    range, each biased by half the error its linear interpolation makes at the midpoint,
    plus the last point; arithmetic in ``ftype`` (float32, or float64 for SOFTMAX's)."""
    t = ftype
    in_scale, out_scale = t(in_scale), t(out_scale)
    input_min = in_scale * t(-32768 - in_zp)
    input_max = in_scale * t(32767 - in_zp)
    output_min = out_scale * t(-32768 - out_zp)
    output_max = out_scale * t(32767 - out_zp)
    step = (input_max - input_min) / t(512)
    half_step = step / t(2)
    inv = t(65536) / (output_max - output_min)
    i = np.arange(512).astype(t)
    with np.errstate(over="ignore", invalid="ignore"):
        val = fn(input_min + i * step)
        mid = fn(input_min + i * step + half_step)
        nxt = fn(input_min + (i + t(1)) * step)
        sample = round_half_away(val * inv)
        interp = round_half_away((nxt * inv + round_half_away(val * inv)) / t(2))
        mid_err = interp - round_half_away(mid * inv)
        bias = round_half_away(mid_err / t(2))
        last = round_half_away(fn(np.asarray([input_max], t)) * inv)
    table = np.concatenate([np.clip(sample - bias, -32768, 32767), np.clip(last, -32768, 32767)])
    return table.astype(np.int64)


def lut16_lookup(x, table: np.ndarray) -> np.ndarray:
    """TFLite's int16 ``LUTLookup``: the top 9 bits index the table, the low 7 interpolate
    (rounded, ``+ 64 >> 7``), the sum wrapped to int16."""
    x = np.asarray(x, np.int64)
    index = 256 + (x >> 7)
    offset = x & 0x7F
    base = table[index]
    slope = table[index + 1] - base
    return _wrap(base + ((slope * offset + 64) >> 7), 16)


def _lookup(x: np.ndarray, table: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """An 8-bit table lookup (tables are indexed by ``value - qmin``)."""
    return table[x.astype(np.int64) - np.iinfo(x.dtype).min].astype(dtype)


# -- LOGISTIC, TANH -------------------------------------------------------------------------


def _sigmoid64(x):
    with np.errstate(over="ignore"):
        e = np.exp(x)
        return np.where(x > 100, 1.0, np.where(x < -100, 0.0, e / (1.0 + e)))


_XNN_FUNCTIONS = {"LOGISTIC": _f32_of(_sigmoid64), "TANH": _f32_of(np.tanh)}

# TFLite's sigmoid(i / 24) in unsigned Q0.16 (common.h ``sigmoid_table_uint16``), shared by
# its int16 LOGISTIC and TANH (tanh(x) = 2 sigmoid(2x) - 1). A table of data, not computed.
_SIGMOID_Q16 = np.array([
    32768, 33451, 34133, 34813, 35493, 36169, 36843, 37513, 38180, 38841, 39498, 40149, 40794, 41432, 42064,
    42688, 43304, 43912, 44511, 45102, 45683, 46255, 46817, 47369, 47911, 48443, 48964, 49475, 49975, 50464,
    50942, 51409, 51865, 52311, 52745, 53169, 53581, 53983, 54374, 54755, 55125, 55485, 55834, 56174, 56503,
    56823, 57133, 57433, 57724, 58007, 58280, 58544, 58800, 59048, 59288, 59519, 59743, 59959, 60168, 60370,
    60565, 60753, 60935, 61110, 61279, 61441, 61599, 61750, 61896, 62036, 62172, 62302, 62428, 62549, 62666,
    62778, 62886, 62990, 63090, 63186, 63279, 63368, 63454, 63536, 63615, 63691, 63765, 63835, 63903, 63968,
    64030, 64090, 64148, 64204, 64257, 64308, 64357, 64405, 64450, 64494, 64536, 64576, 64614, 64652, 64687,
    64721, 64754, 64786, 64816, 64845, 64873, 64900, 64926, 64950, 64974, 64997, 65019, 65039, 65060, 65079,
    65097, 65115, 65132, 65149, 65164, 65179, 65194, 65208, 65221, 65234, 65246, 65258, 65269, 65280, 65291,
    65301, 65310, 65319, 65328, 65337, 65345, 65352, 65360, 65367, 65374, 65381, 65387, 65393, 65399, 65404,
    65410, 65415, 65420, 65425, 65429, 65433, 65438, 65442, 65445, 65449, 65453, 65456, 65459, 65462, 65465,
    65468, 65471, 65474, 65476, 65479, 65481, 65483, 65485, 65488, 65489, 65491, 65493, 65495, 65497, 65498,
    65500, 65501, 65503, 65504, 65505, 65507, 65508, 65509, 65510, 65511, 65512, 65513, 65514, 65515, 65516,
    65517, 65517, 65518, 65519, 65520, 65520, 65521, 65522, 65522, 65523, 65523, 65524, 65524, 65525, 65525,
    65526, 65526, 65526, 65527, 65527, 65528, 65528, 65528, 65529, 65529, 65529, 65529, 65530, 65530, 65530,
    65530, 65531, 65531, 65531, 65531, 65531, 65532, 65532, 65532, 65532, 65532, 65532, 65533, 65533, 65533,
    65533, 65533, 65533, 65533, 65533, 65534, 65534, 65534, 65534, 65534, 65534, 65534, 65534, 65534, 65534,
    65535], np.int64)


def checked_log2(scale: float) -> tuple[bool, int]:
    """TFLite's ``CheckedLog2``: (is ``scale`` a power of two within 1e-3 in log2, that power)."""
    x_log2 = F32(F32(np.log(F32(scale))) * F32(1.0 / np.log(2.0)))
    rounded = F32(round_half_away(x_log2))
    return bool(abs(F32(x_log2 - rounded)) < F32(1e-3)), int(rounded)


def _int16_sigmoid_plan(op: str, x: QuantParams, out: QuantParams) -> dict:
    """TFLite's int16 LOGISTIC/TANH preparation: a power-of-two input scale (2^-12, or
    2^-11 for TANH) runs gemmlowp's Q3 fixed point; any other scale is rescaled to
    1/(3*4096) for the interpolated sigmoid table."""
    if x.zero_point != 0 or out.zero_point != 0:
        raise UnsupportedError(f"int16 {op} needs zero points 0 (symmetric int16)")
    pot, log2 = checked_log2(x.scale)
    left_shift = 12 + log2
    pot = pot and (left_shift in ((0, 1) if op == "TANH" else (0,)))
    out_pot, out_log2 = checked_log2(out.scale)
    if op == "LOGISTIC" and float(out.scale) != 1.0 / 32768:
        raise UnsupportedError(f"int16 LOGISTIC output scale {out.scale:g} (LiteRT requires 1/32768)")
    if not out_pot or out_log2 != -15:
        raise UnsupportedError(f"int16 {op} output scale {out.scale:g} (LiteRT requires 2^-15)")
    if pot:
        return {"fixed_point": True, "left_shift": left_shift}
    multiplier = float(x.scale) * 4096.0 * 3.0
    shift = 0
    while multiplier <= 32767.0 / 2.0 and shift <= 30:
        shift += 1
        multiplier *= 2.0
    return {"fixed_point": False, "multiplier": int(multiplier), "shift": shift}


def _int16_logistic(x: np.ndarray, p: dict) -> np.ndarray:
    """TFLite's int16 LOGISTIC: gemmlowp's Q3 logistic, or the interpolated sigmoid table."""
    if p["fixed_point"]:
        return _fx_logistic(_Fx(x, 3, 16)).raw
    v = _int16_rescaled(x, p)
    a = np.abs(v)
    hi = a >> 9
    idx = np.minimum(hi, 254)
    ua, ub = _SIGMOID_Q16[idx], _SIGMOID_Q16[idx + 1]
    result = np.where(hi >= 255, 0x7FFF << 10, (ua << 9) + (a & 0x1FF) * (ub - ua))
    result = np.where(v >= 0, result + (1 << 9), (1 << 25) - result + (1 << 9) - 1)
    return _wrap(result >> 10, 16)


def _int16_tanh(x: np.ndarray, p: dict) -> np.ndarray:
    """TFLite's int16 TANH: gemmlowp's Q3 tanh (after doubling for an input scale of
    2^-11), or the interpolated sigmoid table (tanh(x) = 2 sigmoid(2x) - 1)."""
    if p["fixed_point"]:
        raw = x if p["left_shift"] == 0 else _mul_pot(x, 1, 16)
        return _fx_tanh(_Fx(raw, 3, 16)).raw
    v = _int16_rescaled(x, p)
    a = np.abs(v)
    hi = a >> 8
    idx = np.minimum(hi, 254)
    ua, ub = _SIGMOID_Q16[idx], _SIGMOID_Q16[idx + 1]
    result = np.where(hi >= 255, 0xFFFF << 8, (ua << 8) + (a & 0xFF) * (ub - ua))
    result = np.where(v >= 0, result - (1 << 23) + (1 << 7), -result + (1 << 23) + (1 << 7) - 1)
    return _wrap(result >> 8, 16)


def _int16_rescaled(x: np.ndarray, p: dict) -> np.ndarray:
    shift = p["shift"]
    rounding = 1 << (shift - 1) if shift > 0 else 0
    return (x.astype(np.int64) * p["multiplier"] + rounding) >> shift


def _sigmoid_attrs(op: str):
    def attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
        q = base["quant"]
        x = _params(q, 0, "input 0", (I8, U8, I16))
        out = _params(q, 0, "the output", (x.dtype,), output=True)
        if x.dtype == I16:
            return {"int16": _int16_sigmoid_plan(op, x, out)}
        return {"lut": xnn_lut(_XNN_FUNCTIONS[op], x, out), "dtype": out.dtype}
    return attrs


def _logistic_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """LOGISTIC: int8/uint8 as XNNPACK (its table of the float sigmoid); int16 as TFLite
    (gemmlowp fixed point for an input scale of 2^-12, else the interpolated table)."""
    x = inputs[0]
    if "int16" in attrs:
        return [_int16_logistic(x, attrs["int16"]).astype(np.int16)]
    return [_lookup(x, attrs["lut"], attrs["dtype"])]


def _tanh_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """TANH: int8/uint8 as XNNPACK (its table of the float tanh); int16 as TFLite."""
    x = inputs[0]
    if "int16" in attrs:
        return [_int16_tanh(x, attrs["int16"]).astype(np.int16)]
    return [_lookup(x, attrs["lut"], attrs["dtype"])]


_attach("LOGISTIC", _logistic_q, _sigmoid_attrs("LOGISTIC"))
_attach("TANH", _tanh_q, _sigmoid_attrs("TANH"))


# -- SOFTMAX --------------------------------------------------------------------------------


def _exp32(x) -> np.ndarray:
    """``expf``: exp in float64 of a float32 argument, rounded once to float32."""
    return _f32_of(np.exp)(x)


def _softmax_attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
    q = base["quant"]
    x = _params(q, 0, "input 0", (I8, U8, I16))
    out = _params(q, 0, "the output", (x.dtype, I16), output=True)
    beta = float(base["beta"])
    if x.dtype == I16 or out.dtype == x.dtype == I8:
        # LiteRT checks the params of these outputs (to a 0.1% tolerance).
        scale, zp = (1 / 32768, 0) if out.dtype == I16 else (1 / 256, -128)
        if out.zero_point != zp or abs(out.scale - scale) > 0.001 * scale:
            raise UnsupportedError(f"{x.dtype.name} SOFTMAX output scale {out.scale:g} and zero point "
                                   f"{out.zero_point} (LiteRT requires {scale:g} and {zp})")
    if x.dtype == I16:
        if out.dtype != I16 or x.zero_point != 0:
            raise UnsupportedError("int16 SOFTMAX needs an int16 output and zero points 0")
        # The input difference rescaled so that [-65535, 0] means [-10, 0]; double-precision tables
        # of exp on [-10, 0] and of 1 / (1 + x) on [0, 1], both with outputs on [-1, 1].
        m, shift = quantize_multiplier(float(x.scale) * beta / (10.0 / 65535.0))
        exp_lut = tflite_lut16(np.exp, 10.0 / 65535, 32767, 2.0 / 65535, 0, np.float64)
        recip_lut = tflite_lut16(lambda v: 1.0 / (1.0 + v), 1.0 / 65535, -32768, 2.0 / 65535, 0, np.float64)
        return {"softmax16": {"multiplier": int(m), "shift": int(shift), "exp_lut": exp_lut,
                              "recip_lut": recip_lut}}
    # exp(-scale * beta * d) for d = max - x in 0..255 (float32, as PopulateSoftmaxLookupTable).
    table = _exp32(F32(-F32(x.scale) * F32(beta)) * np.arange(256).astype(F32))
    return {"softmax8": {"table": table, "scale": F32(out.scale), "zp": out.zero_point, "dtype": out.dtype,
                         "truncate": out.dtype == U8}}


def _softmax8(x: np.ndarray, p: dict) -> np.ndarray:
    """TFLite's optimized int8/uint8 SOFTMAX (x86: the float table, not the uint16 LUT):
    exp of each distance to the row's maximum from the table, summed in float32 left to
    right, times ``1 / (sum * out_scale)``; rounded half away from zero plus the zero
    point (uint8 output: ``+ 0.5`` truncated, the zero point ignored, as LiteRT does)."""
    xi = x.astype(np.int64)
    e = p["table"][xi.max(axis=-1, keepdims=True) - xi]
    total = np.zeros(e.shape[:-1], F32)
    for j in range(e.shape[-1]):        # sequential float32 sum, as the kernel's loop
        total = total + e[..., j]
    inv = F32(1.0) / (total * p["scale"])
    prob = e * inv[..., None]
    if p["truncate"]:
        # The kernel's uint8 rounding (x86) is ``int(prob + 0.5f)`` and drops the zero point.
        q = np.trunc(prob + F32(0.5)).astype(np.int64)
    else:
        q = round_half_away(prob).astype(np.int64) + p["zp"]
    info = np.iinfo(p["dtype"])
    return np.clip(q, info.min, info.max).astype(p["dtype"])


def _softmax16(x: np.ndarray, p: dict) -> np.ndarray:
    """TFLite's int16 SOFTMAX (``SoftmaxInt16``): exp of the rescaled difference to the
    row's maximum from a table, the int32 sum normalized to its leading bit, its
    reciprocal from a second table, each exp times it, shifted back."""
    xi = x.astype(np.int64)
    diff = xi - xi.max(axis=-1, keepdims=True)
    scaled = multiply_by_quantized_multiplier(diff, p["multiplier"], p["shift"])
    e = lut16_lookup(np.clip(scaled + 32767, -32768, 32767), p["exp_lut"])
    total = e.sum(axis=-1, keepdims=True)
    headroom_plus_one = 32 - np.floor(np.log2(np.maximum(total, 1))).astype(np.int64) - 1   # count leading zeros
    shifted = ((total << (headroom_plus_one - 1)) + (1 << 13)) >> 14
    recip = lut16_lookup(np.clip(shifted - (1 << 15) - (1 << 16), -32768, 32767), p["recip_lut"])
    right_shift = 31 - headroom_plus_one
    result = (e * recip + (np.int64(1) << (right_shift - 1))) >> right_shift
    return np.clip(result, 0, 32767).astype(np.int16)


def _softmax_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """SOFTMAX as TFLite's builtin kernel (XNNPACK takes float only): int8/uint8 input to
    int8/uint8/int16 output through a float32 table; int16 through fixed-point tables."""
    if inputs[0].size == 0:   # an empty axis: nothing to normalize
        return [np.empty(inputs[0].shape, attrs["quant"].output(0).dtype)]
    if "softmax16" in attrs:
        return [_softmax16(inputs[0], attrs["softmax16"])]
    return [_softmax8(inputs[0], attrs["softmax8"])]


_attach("SOFTMAX", _softmax_q, _softmax_attrs)


# -- RELU, RELU6, RELU_N1_TO_1, RELU_0_TO_1 ---------------------------------------------------


def _tflite_multiplier(real_f32) -> tuple[int, int]:
    """``QuantizeMultiplier`` of a ratio the kernels compute in float32 (then widen)."""
    m, shift = quantize_multiplier(np.float64(F32(real_f32)))
    return int(m), int(shift)


def _requantize(x, zp_in: int, multiplier: int, shift: int, zp_out: int) -> np.ndarray:
    """``zp_out + MultiplyByQuantizedMultiplier(x - zp_in, multiplier, shift)`` (int64)."""
    return multiply_by_quantized_multiplier(np.asarray(x, np.int64) - zp_in, multiplier, shift) + zp_out


_RELU_OPS = ("RELU", "RELU6", "RELU_N1_TO_1", "RELU_0_TO_1")


def _relu_attrs(op: str):
    def attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
        q = base["quant"]
        # LiteRT's int16 kernels exist for RELU and RELU6 only (the others fail when invoked).
        dtypes = (I8, U8, I16) if op in ("RELU", "RELU6") else (I8, U8)
        x = _params(q, 0, "input 0", dtypes)
        out = _params(q, 0, "the output", (x.dtype,), output=True)
        if x.dtype == I16 and (x.zero_point != 0 or out.zero_point != 0):
            raise UnsupportedError(f"int16 {op} needs zero points 0 (symmetric int16)")
        low, high = ACTIVATION_RANGES[op]
        # roundf(bound / scale) in float32, ties away from zero, intersected with the type's range.
        lo = max(out.qmin, out.zero_point + int(round_half_away(F32(F32(low) / F32(out.scale)))))
        hi = out.qmax if np.isinf(high) else \
            min(out.qmax, out.zero_point + int(round_half_away(F32(F32(high) / F32(out.scale)))))
        m, shift = _tflite_multiplier(F32(x.scale) / F32(out.scale))
        return {"relu": (x.zero_point, m, shift, out.zero_point, lo, hi), "dtype": out.dtype}
    return attrs


def _relu_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """RELU / RELU6 / RELU_N1_TO_1 / RELU_0_TO_1 as TFLite's ``ReluX`` (XNNPACK takes float
    only): the input requantized to the output's scale by the fixed-point multiplier,
    clamped to the quantized bounds of the activation."""
    zp_in, m, shift, zp_out, lo, hi = attrs["relu"]
    return [np.clip(_requantize(inputs[0], zp_in, m, shift, zp_out), lo, hi).astype(attrs["dtype"])]


for _op in _RELU_OPS:
    _attach(_op, _relu_q, _relu_attrs(_op))


# -- LEAKY_RELU, PRELU ----------------------------------------------------------------------------


def _xnn_leaky_relu_multipliers(x: QuantParams, out: QuantParams, alpha: float) -> tuple[int, int] | None:
    """XNNPACK's 8.8 fixed-point multipliers ``rint(256 * scale)`` of the two slopes, or
    None where LiteRT's delegate refuses the scales (the builtin kernel then runs)."""
    alpha32 = F32(alpha)
    if not np.isfinite(alpha32) or alpha32 == 0 or abs(alpha32) < np.finfo(F32).tiny:
        return None
    positive = F32(F32(x.scale) / F32(out.scale))
    negative = F32(positive * alpha32)
    if not 2.0 ** -8 <= positive <= 128.0:
        return None
    if not -127.99609375 <= negative <= 128.0 or abs(negative) < 2.0 ** -8:
        return None
    return int(np.rint(F32(256.0) * positive)), int(np.rint(F32(256.0) * negative))


def _leaky_relu_attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
    q = base["quant"]
    x = _params(q, 0, "input 0", (I8, U8, I16))
    out = _params(q, 0, "the output", (x.dtype,), output=True)
    alpha = float(base["alpha"])
    p = {"x_zp": x.zero_point, "zp": out.zero_point, "qmin": out.qmin, "qmax": out.qmax, "dtype": out.dtype}
    if x.dtype != I16:
        xnn = _xnn_leaky_relu_multipliers(x, out, alpha)
        if xnn is not None:
            return {"leaky_relu": {**p, "xnn": xnn}}
    elif x.zero_point != 0 or out.zero_point != 0:
        raise UnsupportedError("int16 LEAKY_RELU needs zero points 0 (symmetric int16)")
    return {"leaky_relu": {**p, "identity": _tflite_multiplier(F32(x.scale) / F32(out.scale)),
                           "alpha": _tflite_multiplier(F32(F32(x.scale) * F32(alpha)) / F32(out.scale))}}


def _leaky_relu_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """LEAKY_RELU: int8/uint8 as XNNPACK (``(zp << 8) + 0x80 + (x - x_zp) * m >> 8`` with
    the 8.8 multiplier of the input's sign) where LiteRT delegates it; otherwise (int16,
    or scales XNNPACK refuses) as TFLite: one fixed-point multiplier per sign."""
    p = attrs["leaky_relu"]
    d = inputs[0].astype(np.int64) - p["x_zp"]
    if "xnn" in p:
        pos, neg = p["xnn"]
        y = (((p["zp"] << 8) + 0x80) + d * np.where(d >= 0, pos, neg)) >> 8
    else:
        y = np.where(d >= 0, multiply_by_quantized_multiplier(d, *p["identity"]),
                     multiply_by_quantized_multiplier(d, *p["alpha"])) + p["zp"]
    return [np.clip(y, p["qmin"], p["qmax"]).astype(p["dtype"])]


def _prelu_attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
    q = base["quant"]
    x = _params(q, 0, "input 0", (I8, U8, I16))
    alpha = _params(q, 1, "alpha (input 1)", (I8,) if x.dtype == I16 else (x.dtype,))
    out = _params(q, 0, "the output", (x.dtype,), output=True)
    return {"prelu": {"x_zp": x.zero_point, "a_zp": alpha.zero_point, "zp": out.zero_point,
                      "positive": _tflite_multiplier(F32(x.scale) / F32(out.scale)),
                      "negative": _tflite_multiplier(F32(F32(x.scale) * F32(alpha.scale)) / F32(out.scale)),
                      "qmin": out.qmin, "qmax": out.qmax, "dtype": out.dtype}}


def _prelu_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """PRELU as TFLite's builtin kernel (XNNPACK takes float only): ``x - x_zp`` by one
    fixed-point multiplier where non-negative, else ``(x - x_zp) * (alpha - a_zp)`` by
    another; alpha broadcast into the input."""
    p = attrs["prelu"]
    d = inputs[0].astype(np.int64) - p["x_zp"]
    a = inputs[1].astype(np.int64) - p["a_zp"]
    y = np.where(d >= 0, multiply_by_quantized_multiplier(d, *p["positive"]),
                 multiply_by_quantized_multiplier(d * a, *p["negative"])) + p["zp"]
    return [np.clip(y, p["qmin"], p["qmax"]).astype(p["dtype"])]


_attach("LEAKY_RELU", _leaky_relu_q, _leaky_relu_attrs)
_attach("PRELU", _prelu_q, _prelu_attrs)


# -- ELU, GELU ------------------------------------------------------------------------------------


def _elu64(x):
    return np.where(x < 0, np.expm1(np.minimum(x, 0)), x)


def _elu_attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
    q = base["quant"]
    # LiteRT: int8 goes to XNNPACK; its builtin kernel has no uint8/int16 ELU.
    x = _params(q, 0, "input 0", (I8,))
    out = _params(q, 0, "the output", (I8,), output=True)
    return {"lut": xnn_lut(_f32_of(_elu64), x, out), "dtype": out.dtype}


def _elu_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """int8 ELU as XNNPACK: its table of the float ``expm1(x)`` (x < 0) or ``x``."""
    return [_lookup(inputs[0], attrs["lut"], attrs["dtype"])]


_attach("ELU", _elu_q, _elu_attrs)


_erfc64 = np.vectorize(math.erfc, otypes=[np.float64])
_SQRT_2_OVER_PI = F32(1.1283791670955126 * 0.7071067811865476)   # float(M_2_SQRTPI * M_SQRT1_2)


def _gelu32(x) -> np.ndarray:
    """TFLite's ``GeluTransform`` in float32: ``0.5f * x * erfcf(x * -sqrt(1/2))``."""
    x = np.asarray(x, F32)
    erfc = _erfc64((x * F32(-0.7071067811865476)).astype(np.float64)).astype(F32)
    return (F32(0.5) * x) * erfc


def _gelu_approx32(x) -> np.ndarray:
    """TFLite's ``GeluTransformApproximate`` in float32, in the kernel's order."""
    x = np.asarray(x, F32)
    inner = _SQRT_2_OVER_PI * (x + ((F32(0.044715) * x) * x) * x)
    return (F32(0.5) * x) * (F32(1.0) + _f32_of(np.tanh)(inner))


def _gelu_attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
    q = base["quant"]
    x = _params(q, 0, "input 0", (I8, U8, I16))
    out = _params(q, 0, "the output", (x.dtype,), output=True)
    fn = _gelu_approx32 if base["approximate"] else _gelu32
    if x.dtype == I16:
        return {"lut16": tflite_lut16(fn, x.scale, x.zero_point, out.scale, out.zero_point)}
    return {"lut": tflite_lut8(fn, x, out), "dtype": out.dtype}


def _gelu_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """GELU as TFLite's builtin kernel (XNNPACK takes float only): its 256-entry table for
    int8/uint8, its interpolated 513-entry table for int16."""
    if "lut16" in attrs:
        return [lut16_lookup(inputs[0], attrs["lut16"]).astype(np.int16)]
    return [_lookup(inputs[0], attrs["lut"], attrs["dtype"])]


_attach("GELU", _gelu_q, _gelu_attrs)


# -- MAXIMUM, MINIMUM, SQUARED_DIFFERENCE, comparisons ------------------------------------------------


def _raw_binary_attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
    q = base["quant"]
    a = _params(q, 0, "input 0", (I8, U8, I16))
    _params(q, 1, "input 1", (a.dtype,))
    _params(q, 0, "the output", (a.dtype,), output=True)
    return {}


def _maximum_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """MAXIMUM as TFLite's builtin kernel: the larger stored integer, quantization ignored
    (LiteRT does not rescale; the converter gives inputs and output one quantization)."""
    a, b = inputs
    return [np.where(a > b, a, b)]


def _minimum_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """MINIMUM as TFLite's builtin kernel: the smaller stored integer (see MAXIMUM)."""
    a, b = inputs
    return [np.where(a < b, a, b)]


_attach("MAXIMUM", _maximum_q, _raw_binary_attrs)
_attach("MINIMUM", _minimum_q, _raw_binary_attrs)


def _smaller_than_one(real: float, what: str) -> tuple[int, int]:
    """``QuantizeMultiplierSmallerThanOneExp``: refused (as TFLite would fail) above 1."""
    m, shift = quantize_multiplier(np.float64(real))
    if int(shift) > 0:
        raise UnsupportedError(f"{what} multiplier {real:g} is not below 1 (LiteRT refuses it)")
    return int(m), int(shift)


def _squared_difference_attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
    q = base["quant"]
    a = _params(q, 0, "input 0", (I8,))
    b = _params(q, 1, "input 1", (I8,))
    out = _params(q, 0, "the output", (I8,), output=True)
    twice_max = np.float64(F32(2) * max(F32(a.scale), F32(b.scale)))
    return {"sqdiff": {"a": (a.zero_point, *_smaller_than_one(np.float64(F32(a.scale)) / twice_max, "input 0")),
                       "b": (b.zero_point, *_smaller_than_one(np.float64(F32(b.scale)) / twice_max, "input 1")),
                       "out": _smaller_than_one(twice_max * twice_max / np.float64(F32(16384) * F32(out.scale)),
                                                "output"),
                       "zp": out.zero_point}}


def _squared_difference_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """int8 SQUARED_DIFFERENCE as TFLite's builtin kernel: both inputs (times 2^7) on a
    common scale (twice the larger input scale), the difference squared, requantized."""
    p = attrs["sqdiff"]
    za, ma, sa = p["a"]
    zb, mb, sb = p["b"]
    da = multiply_by_quantized_multiplier((inputs[0].astype(np.int64) - za) << 7, ma, sa)
    db = multiply_by_quantized_multiplier((inputs[1].astype(np.int64) - zb) << 7, mb, sb)
    diff = da - db
    y = multiply_by_quantized_multiplier(diff * diff, *p["out"]) + p["zp"]
    return [np.clip(y, -128, 127).astype(np.int8)]


_attach("SQUARED_DIFFERENCE", _squared_difference_q, _squared_difference_attrs)


_COMPARISONS = {"EQUAL": np.equal, "NOT_EQUAL": np.not_equal, "LESS": np.less, "LESS_EQUAL": np.less_equal,
                "GREATER": np.greater, "GREATER_EQUAL": np.greater_equal}


def _comparison_attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
    q = base["quant"]
    a = _params(q, 0, "input 0", (I8, U8, I16))
    b = _params(q, 1, "input 1", (a.dtype,))
    if a.dtype == I16 and node.op not in ("EQUAL", "NOT_EQUAL"):
        return {"compare": None}    # LiteRT's int16 LESS/GREATER... compare the stored integers
    # Each input's own scale (float32 widened) as a multiplier below one.
    return {"compare": [(p.zero_point, *_smaller_than_one(np.float64(F32(p.scale)), f"input {i} scale"))
                        for i, p in enumerate((a, b))]}


def _comparison_q(op: str):
    fn = _COMPARISONS[op]

    def reference(inputs: list, attrs: dict) -> list[np.ndarray]:
        if attrs["compare"] is None:
            return [fn(*inputs)]
        scaled = [multiply_by_quantized_multiplier((x.astype(np.int64) - zp) << 8, m, shift)
                  for x, (zp, m, shift) in zip(inputs, attrs["compare"])]
        return [fn(*scaled)]
    reference.__doc__ = (f"{op} on quantized inputs as TFLite's builtin kernel: each input minus its zero "
                         "point, times 2^8, times its own scale as a fixed-point multiplier; the results "
                         "compared. (int16 LESS/LESS_EQUAL/GREATER/GREATER_EQUAL compare the stored integers, "
                         "as LiteRT does.)")
    return reference


for _op in _COMPARISONS:
    _attach(_op, _comparison_q(_op), _comparison_attrs)


# -- ARG_MAX, ARG_MIN, REDUCE_MAX, REDUCE_MIN: order-only ops on the stored integers ---------------


def _arg_attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
    # LiteRT refuses int16 inputs ("only float32, int types and bool").
    _params(base["quant"], 0, "input 0", (I8, U8))
    return {}


def _extreme_attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
    q = base["quant"]
    x = _params(q, 0, "input 0", (I8, U8, I16))
    out = _params(q, 0, "the output", (x.dtype,), output=True)
    if x.same_as(out):
        return {}
    # Output quantization other than the input's: TFLite's kernel refuses it (int16 always
    # runs there). XNNPACK, which LiteRT hands int8/uint8 reductions over constant axes,
    # asserts equal quantization only in debug builds: the released one returns the extreme
    # stored integer unchanged, reinterpreted on the output's scale. That is what we do.
    axes = const_input(node, tensors, 1)
    if x.dtype == I16 or axes is None or np.asarray(axes).size == 0:
        raise UnsupportedError("input and output quantization differ (LiteRT's kernel refuses a requantizing "
                               f"{x.dtype.name} {node.op}; XNNPACK takes 8-bit ones over constant axes only)")
    return {}


for _op in ("ARG_MAX", "ARG_MIN"):
    # The first index of the extreme stored integer: the float reference is right on them
    # (an affine map with a positive scale keeps the order).
    _attach(_op, get_op(_op).reference, _arg_attrs)
for _op in ("REDUCE_MAX", "REDUCE_MIN"):
    # The extreme of the stored integers (XNNPACK for int8/uint8, the builtin kernel for
    # int16: both pick, neither rescales, even when the output's quantization differs).
    _attach(_op, get_op(_op).reference, _extreme_attrs)
