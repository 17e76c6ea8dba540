"""Conformance cases for shape, layout and indexing ops (core/ops/shape.py).

Each case is a one-op model (a few ops for the folding chain) whose operands are model
inputs (``In``) or constants (``Const``); the expected output shapes are written out
by hand here, independently of litegpu's shape inference, and LiteRT decides the values.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from . import Case
from ..builder import ModelBuilder


@dataclass
class In:
    """An operand fed as a model input at run time."""
    value: np.ndarray


@dataclass
class Const:
    """An operand stored in the model as a constant tensor."""
    value: np.ndarray


Out = tuple  # (shape, dtype) of one output


def _model(op: str, operands: Sequence[In | Const | None], outputs: Sequence[Out],
           dynamic: bool, **options: Any) -> bytes:
    b = ModelBuilder()
    idx = []
    for i, operand in enumerate(operands):
        if operand is None:
            idx.append(-1)
        elif isinstance(operand, In):
            v = np.asarray(operand.value)
            idx.append(b.input(f"in{i}", v.shape, v.dtype))
        else:
            idx.append(b.const(f"c{i}", np.asarray(operand.value)))
    outs = []
    for k, (shape, dtype) in enumerate(outputs):
        sig = tuple(-1 for _ in shape) if dynamic else None
        outs.append(b.tensor(f"out{k}", shape, dtype, shape_signature=sig))
    b.op(op, idx, outs, **options)
    b.output(*outs)
    return b.build()


def case(op: str, variant: str, operands: Sequence[In | Const | None], outputs: Sequence[Out], *,
         dynamic: bool = False, tol: float = 0.0, **options: Any) -> Case:
    """A one-op case; ``dynamic`` marks outputs whose shape LiteRT only knows when running."""
    def build() -> tuple[bytes, list[np.ndarray]]:
        data = _model(op, operands, outputs, dynamic, **options)
        return data, [np.asarray(o.value) for o in operands if isinstance(o, In)]
    return Case(op, variant, build, tol)


_RNG = np.random.default_rng(20261122)


def f32(*shape: int) -> np.ndarray:
    """Random float32 data (a fresh draw per call, reproducible across runs)."""
    return _RNG.standard_normal(shape).astype(np.float32)


def ints(dtype, *shape: int, low: int = -50, high: int = 50) -> np.ndarray:
    """Random integers of ``dtype``."""
    return _RNG.integers(low, high, size=shape).astype(dtype)


def bools(*shape: int) -> np.ndarray:
    """Random booleans."""
    return _RNG.random(shape) > 0.5


def i32(*values: int) -> np.ndarray:
    """An int32 vector."""
    return np.array(values, np.int32)


def i64(*values: int) -> np.ndarray:
    """An int64 vector."""
    return np.array(values, np.int64)


def s32(value: int) -> np.ndarray:
    """An int32 scalar."""
    return np.array(value, np.int32)


F, I32, I64, I8, B = np.float32, np.int32, np.int64, np.int8, np.bool_

CASES: list[Case] = []
add = CASES.append

# -- RESHAPE -----------------------------------------------------------------------------
add(case("RESHAPE", "input-minus1", [In(f32(2, 3, 4)), Const(i32(4, -1))], [((4, 6), F)]))
add(case("RESHAPE", "options", [In(f32(2, 6))], [((3, 4), F)], new_shape=[3, 4]))
add(case("RESHAPE", "options-minus1", [In(f32(2, 6))], [((2, 2, 3), F)], new_shape=[2, -1, 3]))
add(case("RESHAPE", "input-wins-over-options", [In(f32(2, 6)), Const(i32(12))], [((12,), F)],
         new_shape=[3, 4]))
add(case("RESHAPE", "to-scalar", [In(f32(1, 1)), In(np.zeros((0,), np.int32))], [((), F)], dynamic=True))
add(case("RESHAPE", "legacy-zero-means-scalar", [In(f32(1,))], [((), F)], new_shape=[0]))
add(case("RESHAPE", "from-scalar", [In(np.array(2.5, np.float32)), Const(i32(1, 1))], [((1, 1), F)]))
add(case("RESHAPE", "int64", [In(ints(I64, 4))], [((2, 2), I64)], new_shape=[2, 2]))
add(case("RESHAPE", "bool", [In(bools(2, 2)), Const(i32(-1))], [((4,), B)]))
add(case("RESHAPE", "int8", [In(ints(I8, 2, 3))], [((3, 2), I8)], new_shape=[3, 2]))
add(case("RESHAPE", "shape-at-runtime", [In(f32(2, 3, 4)), In(i32(6, -1))], [((6, 4), F)], dynamic=True))

# -- SQUEEZE, EXPAND_DIMS ----------------------------------------------------------------
add(case("SQUEEZE", "all", [In(f32(1, 3, 1, 2))], [((3, 2), F)]))
add(case("SQUEEZE", "dims", [In(f32(1, 3, 1, 2))], [((1, 3, 2), F)], squeeze_dims=[2]))
add(case("SQUEEZE", "negative-dims", [In(f32(1, 3, 1, 2))], [((3, 2), F)], squeeze_dims=[0, -2]))
add(case("SQUEEZE", "int8", [In(ints(I8, 1, 4))], [((4,), I8)], squeeze_dims=[0]))
add(case("EXPAND_DIMS", "axis0", [In(f32(3, 4)), Const(s32(0))], [((1, 3, 4), F)]))
add(case("EXPAND_DIMS", "axis-minus1", [In(f32(3, 4)), Const(s32(-1))], [((3, 4, 1), F)]))
add(case("EXPAND_DIMS", "axis1-int64-axis", [In(ints(I32, 3, 4)), Const(np.array([1], np.int64))],
         [((3, 1, 4), I32)]))
add(case("EXPAND_DIMS", "bool", [In(bools(2)), Const(s32(-2))], [((1, 2), B)]))

# -- CONCATENATION -----------------------------------------------------------------------
add(case("CONCATENATION", "axis3", [In(f32(1, 2, 2, 3)), In(f32(1, 2, 2, 1)), Const(f32(1, 2, 2, 2))],
         [((1, 2, 2, 6), F)], axis=3))
add(case("CONCATENATION", "axis-minus3", [In(f32(2, 3, 4)), In(f32(2, 1, 4))], [((2, 4, 4), F)], axis=-2))
add(case("CONCATENATION", "negative-axis", [In(f32(2, 3)), In(f32(2, 5))], [((2, 8), F)], axis=-1))
# LiteRT's float path ignores the fused activation: negatives must survive RELU.
add(case("CONCATENATION", "relu-ignored", [In(f32(2, 3)), In(f32(2, 3))], [((4, 3), F)], axis=0,
         fused_activation_function="RELU"))
add(case("CONCATENATION", "int32", [In(ints(I32, 2, 2)), In(ints(I32, 3, 2))], [((5, 2), I32)], axis=0))
add(case("CONCATENATION", "int64", [In(ints(I64, 2, 1)), In(ints(I64, 2, 2))], [((2, 3), I64)], axis=1))
add(case("CONCATENATION", "int8", [In(ints(I8, 1, 2)), In(ints(I8, 1, 3))], [((1, 5), I8)], axis=1))
add(case("CONCATENATION", "bool", [In(bools(2)), In(bools(3))], [((5,), B)], axis=0))
add(case("CONCATENATION", "single-input", [In(f32(2, 3))], [((2, 3), F)], axis=1))

# -- SPLIT, SPLIT_V ----------------------------------------------------------------------
add(case("SPLIT", "axis1", [Const(s32(1)), In(f32(2, 6))], [((2, 2), F)] * 3, num_splits=3))
add(case("SPLIT", "axis-minus1-int32", [Const(s32(-1)), In(ints(I32, 2, 2, 4))], [((2, 2, 2), I32)] * 2,
         num_splits=2))
add(case("SPLIT", "one", [Const(s32(0)), In(f32(4, 2))], [((4, 2), F)], num_splits=1))
add(case("SPLIT_V", "minus1", [In(f32(2, 7)), Const(i32(1, -1, 2)), Const(s32(1))],
         [((2, 1), F), ((2, 4), F), ((2, 2), F)], num_splits=3))
add(case("SPLIT_V", "axis-minus1-int64", [In(ints(I64, 3, 4)), Const(i32(3, 1)), Const(s32(-1))],
         [((3, 3), I64), ((3, 1), I64)], num_splits=2))
add(case("SPLIT_V", "zero-size-part", [In(f32(5, 2)), Const(i32(2, 0, 3)), Const(s32(0))],
         [((2, 2), F), ((0, 2), F), ((3, 2), F)], num_splits=3))

# -- PACK, UNPACK ------------------------------------------------------------------------
add(case("PACK", "axis0", [In(f32(2, 3)), In(f32(2, 3)), In(f32(2, 3))], [((3, 2, 3), F)],
         values_count=3, axis=0))
add(case("PACK", "axis-minus1", [In(f32(2, 3)), In(f32(2, 3))], [((2, 3, 2), F)], values_count=2, axis=-1))
add(case("PACK", "int32-axis1", [In(ints(I32, 4)), In(ints(I32, 4))], [((4, 2), I32)],
         values_count=2, axis=1))
add(case("PACK", "scalars-int64", [In(np.array(3, np.int64)), In(np.array(-4, np.int64))], [((2,), I64)],
         values_count=2, axis=0))
add(case("UNPACK", "axis0", [In(f32(3, 2, 4))], [((2, 4), F)] * 3, num=3, axis=0))
add(case("UNPACK", "axis-minus1", [In(f32(2, 3, 2))], [((2, 3), F)] * 2, num=2, axis=-1))
add(case("UNPACK", "int32-axis1", [In(ints(I32, 2, 3))], [((2,), I32)] * 3, num=3, axis=1))

# -- TRANSPOSE ---------------------------------------------------------------------------
add(case("TRANSPOSE", "nhwc-to-nchw", [In(f32(2, 3, 4, 5)), Const(i32(0, 3, 1, 2))], [((2, 5, 3, 4), F)]))
add(case("TRANSPOSE", "2d-int32", [In(ints(I32, 3, 5)), Const(i32(1, 0))], [((5, 3), I32)]))
add(case("TRANSPOSE", "negative-perm", [In(f32(2, 3, 4)), Const(i32(-1, 0, 1))], [((4, 2, 3), F)]))
add(case("TRANSPOSE", "5d", [In(f32(2, 1, 3, 2, 2)), Const(i32(4, 2, 0, 3, 1))], [((2, 3, 2, 2, 1), F)]))
add(case("TRANSPOSE", "6d-bool", [In(bools(1, 2, 1, 3, 2, 2)), Const(i32(5, 4, 3, 2, 1, 0))],
         [((2, 2, 3, 1, 2, 1), B)]))
add(case("TRANSPOSE", "int8", [In(ints(I8, 2, 3, 4)), Const(i32(2, 0, 1))], [((4, 2, 3), I8)]))
add(case("TRANSPOSE", "perm-at-runtime", [In(f32(2, 3, 4)), In(i32(1, 2, 0))], [((3, 4, 2), F)],
         dynamic=True))

# -- STRIDED_SLICE -----------------------------------------------------------------------
X4 = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)


def ss(variant: str, x: np.ndarray, begin, end, strides, out_shape, **masks) -> Case:
    """A STRIDED_SLICE case with constant int32 begin/end/strides."""
    return case("STRIDED_SLICE", variant, [In(x), Const(i32(*begin)), Const(i32(*end)), Const(i32(*strides))],
                [(out_shape, x.dtype)], **masks)


add(ss("basic", f32(4, 6), (1, 0), (3, 6), (1, 2), (2, 3)))
add(ss("negative-begin-end", f32(5, 6), (-4, -5), (-1, -1), (1, 1), (3, 4)))
add(ss("negative-stride", f32(5, 6), (4, -1), (0, 0), (-1, -2), (4, 3)))
add(ss("negative-stride-to-start", f32(6,), (-1,), (-100,), (-2,), (3,)))
add(ss("clamped-ends", f32(5, 6), (-100, 2), (100, 100), (2, 3), (3, 2)))
add(ss("begin-end-mask", X4, (1, 1, 1, 1), (2, 2, 3, 4), (1, 1, 1, 2), (2, 3, 2, 2), begin_mask=0b0011,
       end_mask=0b0101))
add(ss("masks-negative-stride", f32(4, 5), (0, 0), (0, 0), (-1, -2), (4, 3), begin_mask=3, end_mask=3))
add(ss("shrink", X4, (1, 0, 2, 0), (2, 3, 3, 5), (1, 1, 1, 1), (3, 5), shrink_axis_mask=0b0101))
add(ss("shrink-negative-index", f32(4, 5), (-1, -2), (0, 0), (1, 1), (), shrink_axis_mask=3))
add(ss("shrink-and-masks", X4, (1, 0, 0, 3), (0, 0, 0, 0), (1, 1, 2, 1), (3, 2), begin_mask=0b0110,
       end_mask=0b0110, shrink_axis_mask=0b1001))
add(ss("fewer-indices-than-rank", X4, (1, 1), (2, 3), (1, 1), (1, 2, 4, 5)))
add(ss("ellipsis-first", X4, (0, 1), (0, 3), (1, 1), (2, 3, 4, 2), ellipsis_mask=1))
add(ss("ellipsis-middle", X4, (1, 0, 1), (2, 0, 4), (1, 1, 2), (1, 3, 4, 2), ellipsis_mask=0b010))
add(ss("ellipsis-shrink", X4, (0, -1), (0, 0), (1, 1), (2, 3, 4), ellipsis_mask=1, shrink_axis_mask=0b10))
add(ss("new-axis", f32(3, 4), (0, 0, 1), (0, 0, 3), (1, 1, 1), (1, 3, 2), new_axis_mask=1))
add(ss("new-axis-middle", f32(3, 4), (0, 0, 0), (2, 0, 4), (1, 1, 2), (2, 1, 2), new_axis_mask=0b010))
add(ss("ellipsis-new-axis", X4, (0, 0), (0, 0), (1, 1), (2, 3, 4, 5, 1), ellipsis_mask=1,
       new_axis_mask=0b10))
add(ss("offset", f32(6, 4), (1, 0), (3, 2), (1, 1), (3, 2), offset=True))
add(ss("int32", ints(I32, 4, 4), (0, 3), (4, 0), (2, -1), (2, 3)))
add(ss("int64", ints(I64, 6), (1,), (6,), (2,), (3,)))
add(ss("bool", bools(3, 4), (0, 1), (3, 4), (1, 2), (3, 2)))
add(ss("int8", ints(I8, 5, 2), (4, 0), (0, 2), (-2, 1), (2, 2)))
add(case("STRIDED_SLICE", "indices-at-runtime", [In(f32(4, 6)), In(i32(1, 0)), In(i32(4, 5)), In(i32(2, 2))],
         [((2, 3), F)], dynamic=True))

# -- SLICE -------------------------------------------------------------------------------
add(case("SLICE", "basic", [In(f32(4, 5)), Const(i32(1, 2)), Const(i32(2, 3))], [((2, 3), F)]))
add(case("SLICE", "size-minus1", [In(X4), Const(i32(1, 0, 1, 2)), Const(i32(-1, 2, -1, 2))],
         [((1, 2, 3, 2), F)]))
add(case("SLICE", "int64-indices", [In(ints(I32, 3, 4)), Const(i64(0, 1)), Const(i64(3, 2))], [((3, 2), I32)]))
add(case("SLICE", "bool", [In(bools(4, 3)), Const(i32(2, 0)), Const(i32(2, -1))], [((2, 3), B)]))
add(case("SLICE", "int8", [In(ints(I8, 6)), Const(i32(3)), Const(i32(2))], [((2,), I8)]))

# -- PAD, PADV2, MIRROR_PAD --------------------------------------------------------------
add(case("PAD", "4d", [In(f32(1, 3, 3, 2)), Const(np.array([[0, 0], [1, 2], [2, 1], [0, 0]], np.int32))],
         [((1, 6, 6, 2), F)]))
add(case("PAD", "int32", [In(ints(I32, 2, 3)), Const(np.array([[1, 0], [0, 2]], np.int32))], [((3, 5), I32)]))
add(case("PAD", "int64-paddings", [In(f32(3,)), Const(np.array([[2, 3]], np.int64))], [((8,), F)]))
add(case("PAD", "int8", [In(ints(I8, 2, 2)), Const(np.array([[1, 1], [1, 1]], np.int32))], [((4, 4), I8)]))
add(case("PAD", "paddings-at-runtime", [In(f32(2, 3)), In(np.array([[1, 0], [2, 1]], np.int32))],
         [((3, 6), F)], dynamic=True))
add(case("PADV2", "constant", [In(f32(2, 3)), Const(np.array([[1, 1], [0, 2]], np.int32)),
                               Const(np.array(1.5, np.float32))], [((4, 5), F)]))
add(case("PADV2", "int32-constant", [In(ints(I32, 3)), Const(np.array([[2, 1]], np.int32)),
                                     Const(np.array([-7], np.int32))], [((6,), I32)]))
add(case("MIRROR_PAD", "reflect", [In(f32(3, 4)), Const(np.array([[2, 1], [3, 3]], np.int32))],
         [((6, 10), F)], mode="REFLECT"))
add(case("MIRROR_PAD", "symmetric", [In(f32(2, 3, 4)), Const(np.array([[1, 2], [3, 0], [0, 4]], np.int32))],
         [((5, 6, 8), F)], mode="SYMMETRIC"))
add(case("MIRROR_PAD", "reflect-int32", [In(ints(I32, 4, 2)), Const(np.array([[3, 0], [1, 1]], np.int32))],
         [((7, 4), I32)], mode="REFLECT"))
add(case("MIRROR_PAD", "symmetric-int64-paddings", [In(f32(3,)), Const(np.array([[3, 2]], np.int64))],
         [((8,), F)], mode="SYMMETRIC"))

# -- GATHER, GATHER_ND -------------------------------------------------------------------
# -- DYNAMIC_UPDATE_SLICE (a decoder's KV-cache write) -------------------------------------
add(case("DYNAMIC_UPDATE_SLICE", "const-start", [In(f32(4, 5)), In(f32(2, 3)), Const(i32(1, 2))], [((4, 5), F)]))
add(case("DYNAMIC_UPDATE_SLICE", "kv-cache-row", [In(f32(1, 8, 2, 4)), In(f32(1, 1, 2, 4)), In(i32(0, 5, 0, 0))],
         [((1, 8, 2, 4), F)]))
add(case("DYNAMIC_UPDATE_SLICE", "kv-cache-prefill", [In(f32(1, 8, 2, 4)), In(f32(1, 3, 2, 4)), In(i32(0, 2, 0, 0))],
         [((1, 8, 2, 4), F)]))
add(case("DYNAMIC_UPDATE_SLICE", "start-clamped-high", [In(f32(6, 3)), In(f32(2, 3)), In(i32(5, 1))], [((6, 3), F)]))
add(case("DYNAMIC_UPDATE_SLICE", "start-clamped-negative", [In(f32(6, 3)), In(f32(2, 2)), In(i32(-3, -1))],
         [((6, 3), F)]))
add(case("DYNAMIC_UPDATE_SLICE", "int64-start", [In(f32(3, 4, 5)), In(f32(1, 4, 2)), In(i64(2, 0, 3))],
         [((3, 4, 5), F)]))
add(case("DYNAMIC_UPDATE_SLICE", "whole", [In(f32(2, 3)), In(f32(2, 3)), In(i32(1, 1))], [((2, 3), F)]))
add(case("DYNAMIC_UPDATE_SLICE", "int32", [In(ints(I32, 5, 4)), In(ints(I32, 1, 4)), In(i32(3, 0))], [((5, 4), I32)]))
add(case("DYNAMIC_UPDATE_SLICE", "int8", [In(ints(I8, 5, 4)), In(ints(I8, 2, 1)), In(i32(1, 2))], [((5, 4), I8)]))
add(case("DYNAMIC_UPDATE_SLICE", "bool", [In(bools(4, 4)), In(bools(2, 2)), In(i32(2, 2))], [((4, 4), B)]))

add(case("GATHER", "axis0", [In(f32(5, 3)), Const(i32(4, 0, 2, 2))], [((4, 3), F)], axis=0))
add(case("GATHER", "axis1-2d-indices", [In(f32(2, 5, 3)), Const(np.array([[0, 4], [1, 1], [3, 2]], np.int32))],
         [((2, 3, 2, 3), F)], axis=1))
add(case("GATHER", "axis-minus1", [In(f32(2, 4)), Const(i32(3, 1))], [((2, 2), F)], axis=-1))
add(case("GATHER", "scalar-index", [In(f32(4, 3)), Const(s32(2))], [((3,), F)], axis=0))
add(case("GATHER", "batch-dims1", [In(f32(2, 5, 3)), Const(np.array([[0, 4, 1], [2, 2, 3]], np.int32))],
         [((2, 3, 3), F)], axis=1, batch_dims=1))
add(case("GATHER", "batch-dims1-axis2", [In(f32(2, 3, 4)), Const(np.array([[3, 0], [1, 1]], np.int32))],
         [((2, 3, 2), F)], axis=2, batch_dims=1))
add(case("GATHER", "batch-dims-minus1", [In(f32(3, 4)), Const(np.array([[1, 0], [3, 3], [2, 1]], np.int32))],
         [((3, 2), F)], axis=1, batch_dims=-1))
add(case("GATHER", "int64-indices", [In(f32(6,)), Const(i64(5, 0, 3))], [((3,), F)], axis=0))
add(case("GATHER", "int32-params", [In(ints(I32, 4, 2)), Const(i32(1, 3))], [((2, 2), I32)], axis=0))
add(case("GATHER", "bool-params", [In(bools(3, 4)), Const(i32(0, 3))], [((3, 2), B)], axis=1))
add(case("GATHER", "int8-params", [In(ints(I8, 5)), Const(i32(4, 4, 1))], [((3,), I8)], axis=0))
add(case("GATHER", "indices-at-runtime", [In(f32(5, 2)), In(i32(3, 0, 4))], [((3, 2), F)], axis=0))
add(case("GATHER_ND", "depth2", [In(f32(3, 4, 2)), Const(np.array([[0, 1], [2, 3], [1, 0]], np.int32))],
         [((3, 2), F)]))
add(case("GATHER_ND", "depth1", [In(f32(4, 3)), Const(np.array([[3], [0]], np.int32))], [((2, 3), F)]))
add(case("GATHER_ND", "full-depth", [In(f32(2, 3)), Const(np.array([[[1, 2]], [[0, 0]]], np.int32))],
         [((2, 1), F)]))
add(case("GATHER_ND", "int64-indices-int32", [In(ints(I32, 3, 3)), Const(np.array([[2, 1], [0, 2]], np.int64))],
         [((2,), I32)]))

# -- SHAPE, FILL, RANGE ------------------------------------------------------------------
add(case("SHAPE", "int32", [In(f32(2, 3, 5))], [((3,), I32)], out_type=I32))
add(case("SHAPE", "int64", [In(bools(4, 1))], [((2,), I64)], out_type=I64))
add(case("FILL", "float", [Const(i32(2, 3)), In(np.array(1.25, np.float32))], [((2, 3), F)]))
add(case("FILL", "int32-int64-dims", [Const(i64(3, 1, 2)), In(np.array(-4, np.int32))], [((3, 1, 2), I32)]))
add(case("FILL", "bool", [Const(i32(4)), In(np.array(True))], [((4,), B)]))
add(case("FILL", "dims-at-runtime", [In(i32(2, 2)), In(np.array(7, np.int64))], [((2, 2), I64)], dynamic=True))
add(case("RANGE", "int32", [Const(s32(0)), Const(s32(10)), Const(s32(3))], [((4,), I32)]))
add(case("RANGE", "int32-negative-delta", [Const(s32(5)), Const(s32(-4)), Const(s32(-2))], [((5,), I32)]))
add(case("RANGE", "int64", [Const(np.array(-3, np.int64)), Const(np.array(4, np.int64)),
                            Const(np.array(2, np.int64))], [((4,), I64)]))
add(case("RANGE", "float", [Const(np.array(0.5, F)), Const(np.array(2.0, F)), Const(np.array(0.1, F))],
         [((15,), F)], tol=1e-6))
add(case("RANGE", "float-at-runtime", [In(np.array(-1.0, F)), In(np.array(1.0, F)), In(np.array(0.3, F))],
         [((7,), F)], dynamic=True, tol=1e-6))

# -- TILE, BROADCAST_TO, REVERSE_V2 ------------------------------------------------------
add(case("TILE", "3d", [In(f32(2, 1, 3)), Const(i32(2, 3, 1))], [((4, 3, 3), F)]))
add(case("TILE", "int32-int64-multiples", [In(ints(I32, 2, 2)), Const(i64(1, 3))], [((2, 6), I32)]))
add(case("TILE", "bool", [In(bools(3)), Const(i32(2))], [((6,), B)]))
add(case("BROADCAST_TO", "expand-rank", [In(f32(3, 1)), Const(i32(2, 3, 4))], [((2, 3, 4), F)],
         version=2))
add(case("BROADCAST_TO", "int32-int64-shape", [In(ints(I32, 1, 2)), Const(i64(3, 2))], [((3, 2), I32)],
         version=2))
add(case("BROADCAST_TO", "kv-groups", [In(f32(1, 2, 1, 16, 8)), Const(i32(1, 2, 3, 16, 8))], [((1, 2, 3, 16, 8), F)],
         version=2))
add(case("BROADCAST_TO", "bool-middle-axis", [In(bools(2, 1, 3)), Const(i32(2, 5, 3))], [((2, 5, 3), B)], version=2))
add(case("REVERSE_V2", "axis1", [In(f32(3, 4, 2)), Const(i32(1))], [((3, 4, 2), F)]))
add(case("REVERSE_V2", "axis-minus1", [In(f32(3, 4)), Const(i32(-1))], [((3, 4), F)]))
add(case("REVERSE_V2", "two-axes", [In(f32(2, 3, 4)), Const(i32(0, 1))], [((2, 3, 4), F)]))
add(case("REVERSE_V2", "int32", [In(ints(I32, 5)), Const(i32(0))], [((5,), I32)]))

# -- DEPTH_TO_SPACE, SPACE_TO_DEPTH, SPACE_TO_BATCH_ND, BATCH_TO_SPACE_ND ----------------
add(case("DEPTH_TO_SPACE", "block2", [In(f32(1, 2, 3, 8))], [((1, 4, 6, 2), F)], block_size=2))
add(case("DEPTH_TO_SPACE", "block3-int32", [In(ints(I32, 2, 1, 2, 9))], [((2, 3, 6, 1), I32)], block_size=3))
add(case("SPACE_TO_DEPTH", "block2", [In(f32(1, 4, 6, 3))], [((1, 2, 3, 12), F)], block_size=2))
add(case("SPACE_TO_DEPTH", "block3-int8", [In(ints(I8, 2, 3, 3, 1))], [((2, 1, 1, 9), I8)], block_size=3))
add(case("SPACE_TO_BATCH_ND", "block2", [In(f32(1, 4, 4, 2)), Const(i32(2, 2)),
                                         Const(np.zeros((2, 2), np.int32))], [((4, 2, 2, 2), F)]))
add(case("SPACE_TO_BATCH_ND", "padded", [In(f32(2, 3, 2, 1)), Const(i32(2, 3)),
                                         Const(np.array([[1, 0], [2, 2]], np.int32))], [((12, 2, 2, 1), F)]))
add(case("SPACE_TO_BATCH_ND", "3d", [In(f32(1, 5, 2)), Const(i32(2)), Const(np.array([[0, 1]], np.int32))],
         [((2, 3, 2), F)]))
add(case("BATCH_TO_SPACE_ND", "block2", [In(f32(4, 2, 2, 1)), Const(i32(2, 2)),
                                         Const(np.zeros((2, 2), np.int32))], [((1, 4, 4, 1), F)]))
add(case("BATCH_TO_SPACE_ND", "cropped", [In(f32(12, 2, 2, 3)), Const(i32(2, 3)),
                                          Const(np.array([[1, 0], [2, 2]], np.int32))], [((2, 3, 2, 3), F)]))
add(case("BATCH_TO_SPACE_ND", "3d", [In(f32(2, 3, 2)), Const(i32(2)), Const(np.array([[0, 1]], np.int32))],
         [((1, 5, 2), F)]))

# -- ONE_HOT, WHERE ----------------------------------------------------------------------
add(case("ONE_HOT", "last-axis", [In(i32(0, 2, 5, -1)), Const(s32(4)), Const(np.array(1.0, F)),
                                  Const(np.array(0.0, F))], [((4, 4), F)], axis=-1))
add(case("ONE_HOT", "axis0-int32", [In(np.array([[1, 0], [2, 2]], np.int32)), Const(s32(3)),
                                    Const(np.array(5, np.int32)), Const(np.array(-1, np.int32))],
         [((3, 2, 2), I32)], axis=0))
add(case("ONE_HOT", "int64-indices-bool", [In(i64(1, 0, 3)), Const(s32(3)), Const(np.array(True)),
                                           Const(np.array(False))], [((3, 3), B)], axis=1))
add(case("WHERE", "bool", [In(bools(3, 4))], [((0, 2), I64)], dynamic=True))
add(case("WHERE", "float", [In(np.array([[0.0, 1.5], [-2.0, 0.0]], F))], [((0, 2), I64)], dynamic=True))


# -- a shape-arithmetic chain the planner folds: SHAPE -> STRIDED_SLICE -> PACK -> RESHAPE --
_CHAIN_X = f32(2, 3, 4)


def _folding_chain() -> tuple[bytes, list[np.ndarray]]:
    b = ModelBuilder()
    x = b.input("x", (2, 3, 4), F)
    shape = b.tensor("shape", (3,), I32)
    b.op("SHAPE", [x], [shape], out_type=I32)
    batch = b.tensor("batch", (), I32)
    b.op("STRIDED_SLICE", [shape, b.const("b", i32(0)), b.const("e", i32(1)), b.const("s", i32(1))], [batch],
         shrink_axis_mask=1)
    target = b.tensor("target", (2,), I32)
    b.op("PACK", [batch, b.const("m1", s32(-1))], [target], values_count=2, axis=0)
    y = b.tensor("y", (2, 12), F)
    b.op("RESHAPE", [x, target], [y])
    b.output(y)
    return b.build(), [_CHAIN_X]


add(Case("RESHAPE", "shape-chain-folds", _folding_chain, 0.0))
