"""Quantization facts shared by every backend.

A quantized tensor stores integers ``q`` meaning ``real = scale * (q - zero_point)``, with
one scale and zero point for the whole tensor or one per slice along ``axis`` (weights).
This module holds, once:

- :class:`QuantParams`: a tensor's scales, zero points, axis and storage range, built
  from a :class:`litegpu.graph.Tensor`; :class:`NodeQuant` the params of a node's operands.
- TFLite's fixed-point requantization (``quantization_util.cc`` ``QuantizeMultiplier``,
  ``common.h`` ``MultiplyByQuantizedMultiplier``): a real multiplier becomes an int32
  multiplier in [2^30, 2^31) and a power-of-two shift; a product is rounded twice
  (``SaturatingRoundingDoublingHighMul``, then ``RoundingDivideByPOT``). LiteRT's builtin
  kernels (e.g. int8 HARD_SWISH, which its XNNPACK delegate does not take) use it.
  Its 16x8 kernels sum in int64 and use a single-rounding variant
  (``multiply_by_quantized_multiplier_64``).
- XNNPACK's float32 requantization, which LiteRT's default CPU path (the XNNPACK delegate)
  uses for int8 CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED, MUL and MEAN: the int32
  sum as float32 times a float32 scale, rounded to nearest even; and its ADD/SUB, which
  scale both operands by 21-bit integer multipliers and shift right.
- quantize / dequantize of float arrays, and the fused activations' clamp ranges in the
  quantized domain.

Every function is vectorized over numpy integer arrays (per-channel multipliers broadcast
like any operand). The arithmetic is int64 so nothing wraps before the step where TFLite
or XNNPACK would saturate.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .errors import UnsupportedError
from .graph import Tensor

# Tensor types whose values are quantized integers (when the tensor carries scales).
QUANTIZED_TYPES = ("INT8", "UINT8", "INT16", "INT4")
# Storage ranges narrower than the numpy dtype's: INT4 values are unpacked to int8 at load.
_RANGES = {"INT4": (-8, 7)}
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1


@dataclass(frozen=True)
class QuantParams:
    """A tensor's affine quantization: ``real = scales * (q - zero_points)``.

    ``scales`` (float32) and ``zero_points`` (int64) are 1-D; with ``axis`` None they hold
    one value (per tensor), else one per index along ``axis`` (per channel).
    ``qmin``/``qmax`` are the storage type's range.
    """

    scales: np.ndarray
    zero_points: np.ndarray
    axis: int | None
    dtype: np.dtype
    qmin: int
    qmax: int
    #: Blockwise (INT4 LLM weights): ``scales`` is [channels, blocks], one per ``block_size``
    #: values along the last axis; 0 for affine params (``scales`` 1-D).
    block_size: int = 0

    @classmethod
    def of(cls, tensor: Tensor) -> "QuantParams | None":
        """The params of ``tensor``, or None when it is not a quantized integer tensor."""
        if not is_quantized(tensor):
            return None
        q = tensor.quantization
        low, high = _RANGES.get(tensor.type_name, (None, None))
        if q.block_size:
            return cls(np.asarray(q.scales, np.float32), np.zeros(1, np.int64), 0, np.dtype(tensor.dtype),
                       low, high, q.block_size)
        scales = np.asarray(q.scales, np.float32).reshape(-1)
        zps = np.asarray(q.zero_points, np.int64).reshape(-1)
        if zps.size == 0:
            zps = np.zeros(1, np.int64)
        per_channel = scales.size > 1
        if per_channel and zps.size == 1:
            zps = np.repeat(zps, scales.size)
        info = np.iinfo(tensor.dtype)
        return cls(scales, zps, int(q.quantized_dimension) if per_channel else None, np.dtype(tensor.dtype),
                   int(info.min) if low is None else low, int(info.max) if high is None else high)

    @property
    def per_tensor(self) -> bool:
        """True when one scale and zero point cover the whole tensor."""
        return self.axis is None

    @property
    def scale(self) -> float:
        """The per-tensor scale (float32 value as a Python float)."""
        self._need_per_tensor()
        return float(self.scales[0])

    @property
    def zero_point(self) -> int:
        """The per-tensor zero point."""
        self._need_per_tensor()
        return int(self.zero_points[0])

    def _need_per_tensor(self) -> None:
        if not self.per_tensor:
            raise UnsupportedError(f"per-channel quantization (axis {self.axis}) where one scale is expected")

    def along(self, values: np.ndarray, ndim: int) -> np.ndarray:
        """``values`` (one per channel) shaped to broadcast against a rank-``ndim`` array."""
        if self.axis is None:
            return values.reshape(())
        shape = [1] * ndim
        shape[self.axis] = values.size
        return values.reshape(shape)

    def same_as(self, other: "QuantParams | None") -> bool:
        """True when both describe the same integers (scales, zero points, type)."""
        return other is not None and self.dtype == other.dtype and np.array_equal(self.scales, other.scales) \
            and np.array_equal(self.zero_points, other.zero_points)


def is_quantized(tensor: Tensor | None) -> bool:
    """True for an INT8/UINT8/INT16/INT4 tensor that carries scales (a quantized integer)."""
    return tensor is not None and tensor.type_name in QUANTIZED_TYPES and tensor.quantization is not None \
        and tensor.quantization.is_set


@dataclass(frozen=True)
class NodeQuant:
    """The :class:`QuantParams` of a node's inputs and outputs (None: not quantized),
    and the same for the int32 bias-like operands (their scale is informative only)."""

    inputs: tuple
    outputs: tuple

    def input(self, i: int) -> QuantParams | None:
        """Input ``i``'s params (None when absent or not quantized)."""
        return self.inputs[i] if i < len(self.inputs) else None

    def output(self, i: int = 0) -> QuantParams | None:
        """Output ``i``'s params."""
        return self.outputs[i] if i < len(self.outputs) else None

    @property
    def hybrid(self) -> bool:
        """True for a dynamic-range node: its first input and its outputs are not
        quantized integers, some other input (a weight) is."""
        return self.input(0) is None and all(p is None for p in self.outputs) \
            and any(p is not None for p in self.inputs)


def node_quantization(inputs: Sequence[int], outputs: Sequence[int], tensors: Sequence[Tensor]) -> NodeQuant | None:
    """The quantization of a node's operands (tensor indices, -1 omitted), or None when no
    operand is a quantized integer tensor."""
    def params(t: int) -> QuantParams | None:
        return QuantParams.of(tensors[t]) if 0 <= t < len(tensors) else None
    ins, outs = tuple(params(t) for t in inputs), tuple(params(t) for t in outputs)
    if all(p is None for p in (*ins, *outs)):
        return None
    return NodeQuant(ins, outs)


def quantization_mode(tensors: Sequence[Tensor]) -> str:
    """How a subgraph with these tensors is quantized: "" (float), "hybrid" (only constant
    weights are quantized: dynamic-range), "int16x8" (int16 activations), "uint8" or "int8"."""
    activations = {np.dtype(t.dtype) for t in tensors if is_quantized(t) and t.data is None}
    if not activations:
        return "hybrid" if any(is_quantized(t) for t in tensors) else ""
    if np.dtype(np.int16) in activations:
        return "int16x8"
    return "uint8" if np.dtype(np.uint8) in activations else "int8"


def describe(tensor: Tensor) -> str:
    """A tensor's quantization in words: type, scale(s), zero point(s), axis; "" if none."""
    p = QuantParams.of(tensor)
    if p is None:
        return ""
    if p.per_tensor:
        return f"{p.dtype.name} scale={p.scale:.6g} zero_point={p.zero_point}"
    shown = ", ".join(f"{s:.4g}" for s in p.scales[:4]) + (", ..." if p.scales.size > 4 else "")
    zps = "0" if not np.any(p.zero_points) else ", ".join(str(z) for z in p.zero_points[:4]) + ", ..."
    return f"{p.dtype.name} per-channel axis={p.axis} scales=[{shown}] ({p.scales.size}) zero_points=[{zps}]"


# -- TFLite's fixed-point arithmetic ----------------------------------------------------


def quantize_multiplier(real) -> tuple[np.ndarray, np.ndarray]:
    """TFLite's ``QuantizeMultiplier``: ``real ~= multiplier * 2^(shift - 31)``.

    ``multiplier`` is an int32 in [2^30, 2^31) (0 for 0), ``shift`` is positive for a left
    shift. frexp splits ``real`` (a float64) into a fraction in [0.5, 1) and an exponent;
    the fraction times 2^31 is rounded half away from zero (``std::round``); a fraction
    that rounds up to 2^31 is halved with the exponent one higher. Shifts below -31 give
    0; above 30 the multiplier saturates, as TFLite does.
    """
    real = np.asarray(real, np.float64)
    frac, shift = np.frexp(real)
    q = np.trunc(frac * 2.0 ** 31 + np.copysign(0.5, frac)).astype(np.int64)   # std::round
    carry = q == (1 << 31)
    q = np.where(carry, q // 2, q)
    shift = np.where(carry, shift + 1, shift).astype(np.int64)
    tiny = shift < -31
    q, shift = np.where(tiny, 0, q), np.where(tiny, 0, shift)
    big = shift > 30
    q, shift = np.where(big, INT32_MAX, q), np.where(big, 30, shift)
    return q.astype(np.int64), shift


def saturating_rounding_doubling_high_mul(a, b) -> np.ndarray:
    """gemmlowp's ``SaturatingRoundingDoublingHighMul``: ``round(a * b / 2^31)`` for int32
    ``a``, ``b``, ties away from zero, saturating the one overflow (INT32_MIN squared)."""
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    ab = a * b
    nudge = np.where(ab >= 0, 1 << 30, 1 - (1 << 30))
    total = ab + nudge
    # C++ integer division truncates toward zero.
    high = np.where(total >= 0, total >> 31, -((-total) >> 31))
    return np.where((a == INT32_MIN) & (b == INT32_MIN), INT32_MAX, high).astype(np.int64)


def rounding_divide_by_pot(x, exponent) -> np.ndarray:
    """gemmlowp's ``RoundingDivideByPOT``: ``x / 2^exponent`` rounded to nearest, ties
    away from zero (``exponent`` in [0, 31])."""
    x, exponent = np.asarray(x, np.int64), np.asarray(exponent, np.int64)
    mask = (np.int64(1) << exponent) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (x < 0)
    return (x >> exponent) + (remainder > threshold)


def multiply_by_quantized_multiplier(x, multiplier, shift) -> np.ndarray:
    """TFLite's ``MultiplyByQuantizedMultiplier`` (double rounding): ``x * multiplier *
    2^(shift - 31)`` for int32 ``x``; per-channel ``multiplier``/``shift`` broadcast."""
    x, shift = np.asarray(x, np.int64), np.asarray(shift, np.int64)
    left = np.maximum(shift, 0)
    right = np.maximum(-shift, 0)
    # x * 2^left stays an int32 in TFLite (the caller's range guarantees it).
    return rounding_divide_by_pot(saturating_rounding_doubling_high_mul(x << left, multiplier), right)


def multiply_by_quantized_multiplier_64(x, multiplier, shift) -> np.ndarray:
    """TFLite's int64 ``MultiplyByQuantizedMultiplier`` (16x8 kernels' int64 sums): the
    multiplier cut to its top 16 bits (rounded, at most 0x7FFF), ``x`` times it, one
    rounding (half up) by ``2^(15 - shift)``."""
    x, m, shift = np.asarray(x, np.int64), np.asarray(multiplier, np.int64), np.asarray(shift, np.int64)
    reduced = np.where(m < 0x7FFF0000, (m + (1 << 15)) >> 16, 0x7FFF)
    total = 15 - shift
    return (x * reduced + (np.int64(1) << (total - 1))) >> total


def round_half_away(x) -> np.ndarray:
    """``std::round`` / ``TfLiteRound``: nearest integer, ties away from zero."""
    x = np.asarray(x)
    return np.trunc(x + np.copysign(np.asarray(0.5, x.dtype), x))


# -- XNNPACK's arithmetic -----------------------------------------------------------------


def requantize_fp32(acc, scale, zero_point: int, lo: int, hi: int) -> np.ndarray:
    """XNNPACK's float32 requantization of int32 sums: ``float32(acc) * scale`` (float32,
    one rounding), clamped to ``[lo, hi] - zero_point``, rounded to nearest even, plus
    ``zero_point``. ``scale`` may be one per channel (broadcast like ``acc``)."""
    f = np.asarray(acc).astype(np.float32) * np.asarray(scale, np.float32)
    f = np.clip(f, np.float32(lo - zero_point), np.float32(hi - zero_point))
    return np.rint(f).astype(np.int64) + zero_point


def fp32_scale(a, b, c) -> np.ndarray:
    """XNNPACK's requantization scale ``a * b / c`` in float32, left to right (the order
    matters to the last bit); any argument may be per channel."""
    product = np.asarray(a, np.float32) * np.asarray(b, np.float32)
    return (product / np.asarray(c, np.float32)).astype(np.float32)


@dataclass(frozen=True)
class AddParams:
    """XNNPACK's int8 ADD/SUB: ``(bias + a * a_multiplier + b * b_multiplier) >> shift``."""

    a_multiplier: int
    b_multiplier: int
    bias: int
    shift: int


def xnn_add_params(a: QuantParams, b: QuantParams, out: QuantParams, subtract: bool = False) -> AddParams:
    """XNNPACK's ADD (or SUB: ``b``'s multiplier negated) parameters.

    Each input's scale over the output's (float32) becomes an integer multiplier with the
    larger one in [2^20, 2^21): ``shift = 20 - exponent(max ratio)`` and ``multiplier =
    rint(ratio * 2^shift)``. The bias holds the rounding half (``2^(shift-1)``, so the
    right shift rounds half up) and both zero points' contributions.
    """
    ra = np.float32(np.float32(a.scale) / np.float32(out.scale))
    rb = np.float32(np.float32(b.scale) / np.float32(out.scale))
    if subtract:
        rb = -rb
    largest = max(abs(ra), abs(rb))
    exponent = int(np.frexp(largest)[1]) - 1          # largest = m * 2^exponent, m in [1, 2)
    shift = 20 - exponent
    if not 12 <= shift <= 30:
        raise UnsupportedError(f"input/output scale ratio {float(largest):g} is outside XNNPACK's range "
                               "[2^-10, 2^8)")
    am = int(np.rint(np.float64(abs(ra)) * 2.0 ** shift)) * (-1 if ra < 0 else 1)
    bm = int(np.rint(np.float64(abs(rb)) * 2.0 ** shift)) * (-1 if rb < 0 else 1)
    bias = (1 << (shift - 1)) - am * a.zero_point - bm * b.zero_point
    return AddParams(am, bm, bias, shift)


def xnn_add(x, y, params: AddParams, zero_point: int, lo: int, hi: int) -> np.ndarray:
    """XNNPACK's int8 ADD of ``x`` and ``y`` (broadcast) with :func:`xnn_add_params`,
    plus the output zero point, clamped to ``[lo, hi]``."""
    acc = params.bias + np.asarray(x, np.int64) * params.a_multiplier + np.asarray(y, np.int64) * params.b_multiplier
    return np.clip((acc >> params.shift) + zero_point, lo, hi)


def xnn_quantize_bound(value: float, scale: float, zero_point: int, qmin: int, qmax: int) -> int:
    """XNNPACK's ``xnn_qs8_quantize`` of an activation bound: ``rint(value / scale + zp)``
    in float32, clamped to the type's range (infinite bounds give the range's ends)."""
    with np.errstate(over="ignore", invalid="ignore"):
        f = np.float32(np.float32(value) / np.float32(scale)) + np.float32(zero_point)
    return int(np.rint(np.clip(f, np.float32(qmin), np.float32(qmax))))


def activation_range(activation: str, out: QuantParams, style: str = "xnnpack") -> tuple[int, int]:
    """The quantized clamp range ``(lo, hi)`` of a fused activation on output ``out``.

    ``style`` "xnnpack": bounds quantized by :func:`xnn_quantize_bound` (round to nearest
    even); "tflite": TFLite's ``CalculateActivationRangeQuantized`` (``zp + round(v / s)``,
    ties away from zero, computed in float32), intersected with the type's range.
    """
    from .ops.registry import ACTIVATION_RANGES   # here: litegpu.ops imports this module
    low, high = ACTIVATION_RANGES[activation]
    scale, zp = out.scale, out.zero_point
    if style == "xnnpack":
        return (xnn_quantize_bound(low, scale, zp, out.qmin, out.qmax),
                xnn_quantize_bound(high, scale, zp, out.qmin, out.qmax))

    def bound(v: float, default: int) -> int:
        if not np.isfinite(v):
            return default
        return zp + int(round_half_away(np.float32(np.float32(v) / np.float32(scale))))
    return max(out.qmin, bound(low, out.qmin)), min(out.qmax, bound(high, out.qmax))


def variable_initial_value(tensor: Tensor) -> int:
    """What a variable tensor without data starts (and is reset) at, as TFLite's
    ``ResetVariableTensor``: its zero point for int8, else 0."""
    q = tensor.quantization
    if np.dtype(tensor.dtype) == np.int8 and q is not None and q.is_set and len(q.zero_points):
        return int(np.asarray(q.zero_points).reshape(-1)[0])
    return 0


# -- quantize / dequantize ----------------------------------------------------------------


def quantize(x: np.ndarray, params: QuantParams, rounding: str = "even") -> np.ndarray:
    """Float ``x`` to ``params``' integers, saturated to the type's range.

    ``rounding`` "even": XNNPACK's (and LiteRT's default path for QUANTIZE): ``x * (1 /
    scale)`` in float32, rounded to nearest even. "away": TFLite's reference (``x /
    scale`` in float32, rounded half away from zero).
    """
    x = np.asarray(x, np.float32)
    scales = params.along(params.scales, x.ndim)
    zps = params.along(params.zero_points, x.ndim)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        if rounding == "even":
            q = np.rint(x * (np.float32(1.0) / scales))
        else:
            q = round_half_away(x / scales)
    q = np.clip(np.nan_to_num(q, nan=0.0), params.qmin - zps, params.qmax - zps)
    return (q.astype(np.int64) + zps).astype(params.dtype)


def row_sums(w: np.ndarray) -> np.ndarray:
    """The exact int64 sums of the int8 (or narrower) rows of ``w`` [R, L], as packings of
    weights take them: through float32 products with BLAS where every partial sum is an
    integer below 2**24 (exact in any order; 5x numpy's integer reduction), a few rows at
    a time so the float copy stays small; else numpy's int64 reduction."""
    rows, length = w.shape
    if w.dtype.itemsize != 1 or length * 256 > 2 ** 24:
        return w.sum(axis=1, dtype=np.int64)
    ones, out = np.ones(length, np.float32), np.empty(rows, np.int64)
    chunk = max(1, (1 << 20) // max(length, 1))
    for r in range(0, rows, chunk):
        out[r:r + chunk] = w[r:r + chunk].astype(np.float32) @ ones
    return out


def dequantize_blocks(q: np.ndarray, scales: np.ndarray, block: int) -> np.ndarray:
    """Blockwise ``scale * q`` in float32: ``scales`` [channels, blocks], one per ``block``
    consecutive values along the last axis (symmetric: no zero points)."""
    q = np.asarray(q)
    values = q.reshape(scales.shape[0], scales.shape[1], block).astype(np.float32) * \
        np.asarray(scales, np.float32)[:, :, None]
    return values.reshape(q.shape)


def dequantize(q: np.ndarray, params: QuantParams) -> np.ndarray:
    """``scale * (q - zero_point)`` in float32 (per channel along ``params.axis``, or per
    block: :func:`dequantize_blocks`)."""
    q = np.asarray(q)
    if params.block_size:
        return dequantize_blocks(q, params.scales, params.block_size)
    scales = params.along(params.scales, q.ndim)
    zps = params.along(params.zero_points, q.ndim)
    return (q.astype(np.int64) - zps).astype(np.float32) * scales
