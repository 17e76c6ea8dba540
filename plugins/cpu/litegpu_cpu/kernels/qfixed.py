"""TFLite's fixed-point requantization as numba functions, for the integer kernels of ops
that LiteRT leaves to its builtin kernels (BATCH_MATMUL, TRANSPOSE_CONV without constant
operands): the same arithmetic, value for value, as :func:`litegpu.quant.multiply_by_quantized_multiplier`
and :func:`litegpu.ops.quantized.multiply_by_quantized_multiplier_half_up`, on int64
scalars (a multiplier below 2^31, a shift in [-31, 30]), so that loops over them
vectorize in int64 lanes.
"""
from __future__ import annotations

import numpy as np
from ..jit import njit

_HALF = np.int64(1) << 30           # a half of the doubling high multiply's 2^31


@njit(cache=True, inline="always")
def multiply_by_quantized_multiplier(x, multiplier, shift):   # pragma: no cover - compiled
    """TFLite's ``MultiplyByQuantizedMultiplier``: ``x * 2^left``, gemmlowp's doubling high
    multiply, then its rounding right shift, both rounding ties away from zero. (The
    doubling high multiply saturates only for two INT32_MINs: a multiplier is positive.)"""
    left = shift if shift > 0 else 0
    right = -shift if shift < 0 else 0
    product = (x << left) * multiplier
    total = product + (_HALF if product >= 0 else 1 - _HALF)
    high = total >> 31 if total >= 0 else -((-total) >> 31)     # C's division: toward zero
    mask = (np.int64(1) << right) - 1
    threshold = (mask >> 1) + (1 if high < 0 else 0)
    return (high >> right) + (1 if (high & mask) > threshold else 0)


@njit(cache=True, inline="always")
def multiply_by_quantized_multiplier_half_up(x, multiplier, shift):   # pragma: no cover - compiled
    """TFLite's vector loops (NEON's ``vqrdmulhq_s32`` then ``vrshlq_s32``): the same steps
    as :func:`multiply_by_quantized_multiplier`, each rounding ties up."""
    left = shift if shift > 0 else 0
    right = -shift if shift < 0 else 0
    high = ((x << left) * multiplier + _HALF) >> 31
    return (high + ((np.int64(1) << right) >> 1)) >> right
