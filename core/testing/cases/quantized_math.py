"""Conformance cases for the integer references of :mod:`litegpu.ops.quantized_math`
(SUM, ABS, NEG, SQRT, RSQRT, DIV, LOG_SOFTMAX), int16 MEAN and int16 ADD/SUB with
power-of-two scales.

Integer outputs must land within ``quanta`` of LiteRT's: one quantum by default (what a
GPU's float view reaches on one op). Inputs cover the whole integer range except where
LiteRT fails on data (SQRT/RSQRT below the zero point, DIV by the zero point) or wraps
(NEG of the type's minimum, whose negation does not fit).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..builder import ModelBuilder
from . import Case
from .quantized import full_range

# Per kind: the activation type and (input, output) scale and zero point; int16 is symmetric.
KINDS = {
    "int8": (np.int8, (0.05, -5), (0.3, 9)),
    "uint8": (np.uint8, (0.05, 120), (0.3, 131)),
    "int16": (np.int16, (0.0005, 0), (0.003, 0)),
}


def _q(op: str, variant: str, build: Callable, quanta: int = 1) -> Case:
    return Case(op, variant, build, tol=0.0, quanta=quanta)


def _reduce(kind: str, op: str) -> Callable:
    """``op`` over the spatial axes of a 4-D tensor, kept, onto another scale."""
    def build():
        rng = np.random.default_rng(21)
        dtype, (sx, zx), (sy, zy) = KINDS[kind]
        b = ModelBuilder()
        x = b.input("x", (2, 5, 6, 3), dtype, scale=[sx], zero_point=[zx])
        y = b.tensor("y", (2, 1, 1, 3), dtype, scale=[sy * (10 if op == "SUM" else 1)], zero_point=[zy])
        b.op(op, [x, b.const("axes", np.array([1, 2], np.int32))], [y], keep_dims=True)
        b.output(y)
        return b.build(), [full_range(rng, dtype, (2, 5, 6, 3))]
    return build


def _unary(kind: str, op: str, low: int | None = None, rescale: bool = True) -> Callable:
    """``op`` on every value of the kind's type from ``low`` (default: its minimum), onto
    the output scale (or the input's, without ``rescale``)."""
    def build():
        dtype, (sx, zx), (sy, zy) = KINDS[kind]
        if not rescale:
            sy, zy = sx, zx
        info = np.iinfo(dtype)
        x = np.arange(info.min if low is None else low, info.max + 1).astype(dtype)
        b = ModelBuilder()
        xi = b.input("x", x.shape, dtype, scale=[sx], zero_point=[zx])
        y = b.tensor("y", x.shape, dtype, scale=[sy], zero_point=[zy])
        b.op(op, [xi], [y])
        b.output(y)
        return b.build(), [x]
    return build


def _root(kind: str, op: str) -> Callable:
    """SQRT / RSQRT on every value at or above the zero point (LiteRT fails below it),
    onto an output scale that fits the result. int16 RSQRT starts at 2048: below, LiteRT's
    interpolated table (one sample per 128 inputs) strays from 1/sqrt by up to 15000
    quanta, which no float computation reproduces; from 2048 up it is within one."""
    def build():
        dtype, (sx, zx), _ = KINDS[kind]
        info = np.iinfo(dtype)
        low = 2048 if (op, kind) == ("RSQRT", "int16") else zx
        x = np.arange(low, info.max + 1).astype(dtype)
        top = np.sqrt(sx * (info.max - zx)) if op == "SQRT" else 1.0 / np.sqrt(sx)
        b = ModelBuilder()
        xi = b.input("x", x.shape, dtype, scale=[sx], zero_point=[zx])
        y = b.tensor("y", x.shape, dtype, scale=[float(top) / (info.max - 1)], zero_point=[0])
        b.op(op, [xi], [y])
        b.output(y)
        return b.build(), [x]
    return build


def _neg(kind: str) -> Callable:
    """NEG with zero point 0 and one scale (LiteRT negates the stored integers), the
    type's minimum left out (its negation wraps in LiteRT)."""
    def build():
        dtype = KINDS[kind][0]
        info = np.iinfo(dtype)
        x = np.arange(info.min + 1, info.max + 1).astype(dtype)
        b = ModelBuilder()
        xi = b.input("x", x.shape, dtype, scale=[KINDS[kind][1][0]], zero_point=[0])
        y = b.tensor("y", x.shape, dtype, scale=[KINDS[kind][1][0]], zero_point=[0])
        b.op("NEG", [xi], [y])
        b.output(y)
        return b.build(), [x]
    return build


def _div(kind: str, broadcast: bool) -> Callable:
    """DIV onto a finer output. Dividends within 16 of their zero point are moved away:
    for them LiteRT's kernel shifts an int32 right by 32 bits or more (undefined in C++;
    its x86 build then answers e.g. the zero point plus one for 0 / x, or saturates),
    which the cpu reference reproduces and a float computation rightly does not."""
    def build():
        rng = np.random.default_rng(22)
        dtype, (sa, za), (sy, zy) = KINDS[kind]
        sb, zb = sa * 4, za // 2
        b_shape = (1, 4, 1) if broadcast else (3, 4, 5)
        b = ModelBuilder()
        x = b.input("x", (3, 4, 5), dtype, scale=[sa], zero_point=[za])
        z = b.input("z", b_shape, dtype, scale=[sb], zero_point=[zb])
        y = b.tensor("y", (3, 4, 5), dtype, scale=[sy / 10], zero_point=[zy])
        b.op("DIV", [x, z], [y], fused_activation_function="RELU" if broadcast else "NONE")
        b.output(y)
        divisor = full_range(rng, dtype, b_shape)
        divisor[divisor == zb] = zb + 1         # LiteRT fails on a zero divisor
        dividend = full_range(rng, dtype, (3, 4, 5)).astype(np.int64)
        near = np.abs(dividend - za) < 16
        dividend[near] = za + np.where(dividend[near] >= za, 16, -16)
        return b.build(), [dividend.astype(dtype), divisor]
    return build


def _log_softmax(kind: str) -> Callable:
    def build():
        rng = np.random.default_rng(23)
        dtype, (sx, zx), _ = KINDS[kind]
        b = ModelBuilder()
        x = b.input("x", (4, 30), dtype, scale=[sx * 2], zero_point=[zx])
        y = b.tensor("y", (4, 30), dtype, scale=[16 / 256], zero_point=[127 if kind == "int8" else 255])
        b.op("LOG_SOFTMAX", [x], [y])
        b.output(y)
        return b.build(), [full_range(rng, dtype, (4, 30))]
    return build


def _pot_add(op: str) -> Callable:
    """int16 ADD/SUB with power-of-two scales (TFLite's LSTM kernel): input 1 finer."""
    def build():
        rng = np.random.default_rng(24)
        b = ModelBuilder()
        x = b.input("x", (2, 4, 6), np.int16, scale=[2.0 ** -10], zero_point=[0])
        z = b.input("z", (2, 4, 6), np.int16, scale=[2.0 ** -12], zero_point=[0])
        y = b.tensor("y", (2, 4, 6), np.int16, scale=[2.0 ** -10], zero_point=[0])
        b.op(op, [x, z], [y], pot_scale_int16=True, version=3)
        b.output(y)
        return b.build(), [full_range(rng, np.int16, (2, 4, 6)), full_range(rng, np.int16, (2, 4, 6))]
    return build


CASES = [
    *(_q("SUM", f"{kind}-hw-keep", _reduce(kind, "SUM")) for kind in KINDS),
    _q("MEAN", "int16-hw-keep", _reduce("int16", "MEAN")),
    _q("ABS", "int8-rescale", _unary("int8", "ABS")),
    _q("ABS", "int8-same-scale", _unary("int8", "ABS", rescale=False)),
    _q("ABS", "int16-rescale", _unary("int16", "ABS")),
    *(_q("NEG", f"{kind}-symmetric", _neg(kind)) for kind in ("int8", "int16")),
    *(_q(op, kind, _root(kind, op)) for op in ("SQRT", "RSQRT") for kind in ("int8", "int16")),
    *(_q("DIV", f"{kind}-{'broadcast-relu' if bc else 'same-shape'}", _div(kind, bc))
      for kind in KINDS for bc in (False, True)),
    *(_q("LOG_SOFTMAX", kind, _log_softmax(kind)) for kind in ("int8", "uint8")),
    *(_q(op, "int16-pot", _pot_add(op)) for op in ("ADD", "SUB")),
]
