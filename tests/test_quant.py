"""litegpu.quant: the fixed-point and float32 requantization helpers, on hand-computed values.

The expected numbers are worked out by hand from TFLite's definitions
(quantization_util.cc QuantizeMultiplier, gemmlowp's SaturatingRoundingDoublingHighMul
and RoundingDivideByPOT) and XNNPACK's (fp32 requantization, ADD's integer multipliers).
"""
from __future__ import annotations

import numpy as np
import pytest

from litegpu.graph import Quantization, Tensor
from litegpu.quant import (INT32_MAX, INT32_MIN, QuantParams, activation_range, dequantize, is_quantized,
                           multiply_by_quantized_multiplier, node_quantization, quantize, quantize_multiplier,
                           requantize_fp32, rounding_divide_by_pot, saturating_rounding_doubling_high_mul,
                           xnn_add, xnn_add_params)

M_HALF = 1 << 30                  # 0.5 as a Q31 multiplier
M_075 = 1610612736                # 0.75 * 2^31


@pytest.mark.parametrize("real,multiplier,shift", [
    (0.5, M_HALF, 0),
    (1.0, M_HALF, 1),             # frexp(1) = 0.5 * 2^1
    (0.75, M_075, 0),
    (0.1, 1717986918, -3),        # 0.8 * 2^31 = 1717986918.4, rounded down
    (-0.75, -M_075, 0),
    (1 - 2.0 ** -40, M_HALF, 1),  # the fraction rounds up to 2^31: halved, exponent + 1
    (2.0 ** -40, 0, 0),           # below 2^-31: zero
    (0.0, 0, 0),
])
def test_quantize_multiplier(real: float, multiplier: int, shift: int) -> None:
    m, s = quantize_multiplier(real)
    assert (int(m), int(s)) == (multiplier, shift)


def test_quantize_multiplier_is_vectorized_per_channel() -> None:
    m, s = quantize_multiplier(np.array([0.5, 0.75, 0.1]))
    assert m.tolist() == [M_HALF, M_075, 1717986918] and s.tolist() == [0, 0, -3]


@pytest.mark.parametrize("a,b,want", [
    (100, M_HALF, 50),
    (3, M_HALF, 2),               # 1.5: the nudge rounds a tie up
    (-3, M_HALF, -1),             # -1.5: up too (toward +inf), gemmlowp's asymmetry
    (-5, M_075, -4),              # -3.75
    (INT32_MIN, INT32_MIN, INT32_MAX),   # the one overflow saturates
    (INT32_MAX, INT32_MAX, INT32_MAX - 1),
])
def test_saturating_rounding_doubling_high_mul(a: int, b: int, want: int) -> None:
    assert int(saturating_rounding_doubling_high_mul(a, b)) == want


@pytest.mark.parametrize("x,exponent,want", [
    (5, 1, 3), (-5, 1, -3),       # +-2.5: ties away from zero
    (-3, 1, -2), (7, 2, 2), (-7, 2, -2), (6, 2, 2), (-6, 2, -2),
    (12, 0, 12),
])
def test_rounding_divide_by_pot(x: int, exponent: int, want: int) -> None:
    assert int(rounding_divide_by_pot(x, exponent)) == want


def test_multiply_by_quantized_multiplier_shifts_and_double_rounding() -> None:
    # Left shift: 3 * 4 * 0.5.
    assert int(multiply_by_quantized_multiplier(3, M_HALF, 2)) == 6
    # Right shift: 5 * 0.75 / 2 = 1.875 -> 2.
    assert int(multiply_by_quantized_multiplier(5, M_075, -1)) == 2
    # Rounded twice: 1 * 0.75 / 2 = 0.375 becomes 1 (0.75 -> 1, then 0.5 -> 1), as TFLite does.
    assert int(multiply_by_quantized_multiplier(1, M_075, -1)) == 1
    assert int(multiply_by_quantized_multiplier(-1, M_075, -1)) == -1
    # Per channel: multipliers and shifts broadcast against the values.
    got = multiply_by_quantized_multiplier(np.array([[10, 10, 10], [-10, -10, -10]]),
                                           np.array([M_HALF, M_HALF, M_075]), np.array([0, 1, -1]))
    assert got.tolist() == [[5, 10, 4], [-5, -10, -4]]


def test_requantize_fp32_rounds_half_to_even_and_clamps() -> None:
    got = requantize_fp32(np.array([1, 3, 5, -1, -3, 1000, -1000]), 0.5, 0, -128, 127)
    assert got.tolist() == [0, 2, 2, 0, -2, 127, -128]
    # Per-channel scales, the zero point added after rounding, the clamp includes it.
    got = requantize_fp32(np.array([[3, 3], [300, -300]]), np.array([0.5, 1.0], np.float32), 10, -128, 127)
    assert got.tolist() == [[12, 13], [127, -128]]


def _params(scale: float, zero_point: int = 0, dtype=np.int8) -> QuantParams:
    info = np.iinfo(dtype)
    return QuantParams(np.array([scale], np.float32), np.array([zero_point]), None, np.dtype(dtype),
                       int(info.min), int(info.max))


def test_xnnpack_add_multipliers_and_rounding() -> None:
    p = xnn_add_params(_params(0.5), _params(0.25), _params(1.0))
    # The larger ratio (0.5 = 2^-1) gets a multiplier in [2^20, 2^21): shift 21.
    assert (p.a_multiplier, p.b_multiplier, p.shift, p.bias) == (1 << 20, 1 << 19, 21, 1 << 20)
    a, b = np.array([1, -1, 1, 1, 3]), np.array([0, 0, 1, 2, 0])
    # 0.5 -> 1 and -0.5 -> 0 (ties up), 0.75 -> 1, 1.0, 1.5 -> 2.
    assert xnn_add(a, b, p, 0, -128, 127).tolist() == [1, 0, 1, 1, 2]
    sub = xnn_add_params(_params(0.5), _params(0.25), _params(1.0), subtract=True)
    assert sub.b_multiplier == -(1 << 19)
    # Zero points are folded into the bias.
    pz = xnn_add_params(_params(0.5, 4), _params(0.25, -2), _params(1.0))
    assert xnn_add(a + 4, b - 2, pz, 7, -128, 127).tolist() == [8, 7, 8, 8, 9]


def test_quantize_and_dequantize() -> None:
    p = _params(0.5, 3)
    x = np.array([0.25, -0.75, 0.75, 1.25, 1000.0, -1000.0, np.nan], np.float32)
    # x / 0.5 = 0.5, -1.5, 1.5, 2.5: to even, or away from zero; then + 3, saturated.
    assert quantize(x, p, "even").tolist() == [3, 1, 5, 5, 127, -128, 3]
    assert quantize(x, p, "away").tolist() == [4, 1, 5, 6, 127, -128, 3]
    assert dequantize(np.array([3, 5, -128], np.int8), p).tolist() == [0.0, 1.0, -65.5]
    per_channel = QuantParams(np.array([0.5, 2.0], np.float32), np.array([0, 1]), 1, np.dtype(np.int8), -128, 127)
    q = np.array([[2, 3], [-2, 1]], np.int8)
    assert dequantize(q, per_channel).tolist() == [[1.0, 4.0], [-1.0, 0.0]]
    assert quantize(dequantize(q, per_channel), per_channel).tolist() == q.tolist()


def test_activation_ranges_xnnpack_and_tflite() -> None:
    out = _params(0.05, -3)
    assert activation_range("RELU6", out) == (-3, 117) == activation_range("RELU6", out, "tflite")
    assert activation_range("NONE", out) == (-128, 127)
    assert activation_range("RELU", _params(0.05, 125)) == (125, 127)
    # 6 / 12 = 0.5 exactly: XNNPACK rounds the bound to even (0), TFLite away from zero (1).
    assert activation_range("RELU6", _params(12.0)) == (0, 0)
    assert activation_range("RELU6", _params(12.0), "tflite") == (0, 1)


def _tensor(index: int, dtype, scales=None, zero_points=None, axis: int = 0, type_name: str = "INT8") -> Tensor:
    q = None if scales is None else Quantization(np.array(scales, np.float32), np.array(zero_points), axis)
    return Tensor(index, f"t{index}", np.dtype(dtype), (2, 3), (2, 3), type_name, quantization=q)


def test_params_of_tensors_and_nodes() -> None:
    per_tensor = _tensor(0, np.int8, [0.1], [-4])
    per_channel = _tensor(1, np.int8, [0.1, 0.2, 0.3], [0, 0, 0], axis=1)
    plain = _tensor(2, np.float32, type_name="FLOAT32")
    unquantized_int8 = _tensor(3, np.int8)
    assert is_quantized(per_tensor) and not is_quantized(plain) and not is_quantized(unquantized_int8)
    p = QuantParams.of(per_tensor)
    assert (p.scale, p.zero_point, p.axis, p.qmin, p.qmax) == (np.float32(0.1), -4, None, -128, 127)
    c = QuantParams.of(per_channel)
    assert c.axis == 1 and c.along(c.scales, 2).shape == (1, 3)
    with pytest.raises(Exception, match="per-channel"):
        c.scale
    tensors = [per_tensor, per_channel, plain, unquantized_int8]
    nq = node_quantization((0, 1, -1), (2,), tensors)
    assert nq.input(0) == p and nq.input(2) is None and nq.output(0) is None
    assert node_quantization((2, 3), (2,), tensors) is None
