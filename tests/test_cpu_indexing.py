"""The cpu backend's indexing and predicate kernels (GATHER, SPLIT, SPLIT_V, STRIDED_SLICE,
SLICE, SELECT, comparisons, logical ops) against the op registry's references.

Each case builds the NodeContext the backend builds at compile time (index operands are
constants carrying their value), runs the factory's kernel on outputs pre-filled with
garbage and compares bit for bit: these ops move or compare values, so nothing may differ.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from litegpu.backend import NodeContext
from litegpu.errors import ExecutionError
from litegpu.graph import Node
from litegpu.ops import get_op
from litegpu.ops.registry import TensorSpec
from litegpu_cpu.kernels import KERNELS

RNG = np.random.default_rng(7)
SS_MASKS = ("begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask", "shrink_axis_mask")


def kernel_for(op: str, attrs: dict, inputs: list, consts: tuple = ()):
    """The kernel and garbage-filled outputs (shapes and dtypes from the op's own inference)."""
    specs = [TensorSpec(tuple(np.shape(a)), np.asarray(a).dtype, np.asarray(a) if i in consts else None)
             for i, a in enumerate(inputs)]
    infer_specs = [TensorSpec(s.shape, s.dtype, np.asarray(inputs[i]) if i in consts else None)
                   for i, s in enumerate(specs)]
    outs = get_op(op).infer(infer_specs, attrs)
    outs = [TensorSpec(tuple(o.shape), np.dtype(o.dtype)) for o in outs]
    node = Node(index=0, op=op, opcode=0, version=1, inputs=tuple(range(len(inputs))),
                outputs=tuple(range(len(inputs), len(inputs) + len(outs))))
    ctx = NodeContext(node=node, opdef=get_op(op), attrs=attrs, inputs=specs, outputs=outs)
    run = KERNELS[op](ctx)
    assert run is not None, f"{op} kernel declined {attrs}"
    garbage = [np.full(o.shape, 7, o.dtype) if o.dtype != np.bool_ else np.ones(o.shape, bool) for o in outs]
    return run, garbage


def check(op: str, attrs: dict, inputs: list, consts: tuple = ()) -> None:
    """The kernel's outputs equal the reference's exactly (values, shapes and dtypes)."""
    run, outs = kernel_for(op, attrs, inputs, consts)
    run([np.asarray(a) for a in inputs], outs)
    want = get_op(op).reference([np.asarray(a) for a in inputs], attrs)
    assert len(outs) == len(want)
    for got, ref in zip(outs, want):
        assert got.dtype == ref.dtype and got.shape == ref.shape
        np.testing.assert_array_equal(got, ref)


# -- GATHER -------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,axis,ix_shape,dtype", [
    ((1000, 32), 0, (1, 32), np.float32),     # an embedding lookup
    ((32, 1, 32), 0, (), np.float32),         # the LSTM's step input: one scalar index
    ((2, 5, 3), 1, (3, 2), np.float32),
    ((2, 4), -1, (3,), np.int32),
    ((3, 4), 1, (), np.bool_),
    ((6,), 0, (4,), np.int8),
])
@pytest.mark.parametrize("ix_dtype", [np.int32, np.int64])
def test_gather_matches_reference(shape, axis, ix_shape, dtype, ix_dtype):
    params = (RNG.standard_normal(shape) * 10).astype(dtype)
    limit = shape[axis]
    indices = RNG.integers(0, limit, ix_shape).astype(ix_dtype)
    check("GATHER", {"axis": axis, "batch_dims": 0}, [params, indices])


@pytest.mark.parametrize("ix_shape", [(), (4,)])
@pytest.mark.parametrize("bad", [-1, 5])
def test_gather_out_of_range_raises_execution_error(ix_shape, bad):
    params = RNG.standard_normal((5, 3)).astype(np.float32)
    indices = np.zeros(ix_shape, np.int32)
    indices.reshape(-1)[-1] = bad
    run, outs = kernel_for("GATHER", {"axis": 0, "batch_dims": 0}, [params, indices])
    with pytest.raises(ExecutionError, match=f"index {bad} out of range"):
        run([params, indices], outs)


def test_gather_with_batch_dims_is_left_to_the_reference():
    params = np.zeros((2, 5, 3), np.float32)
    indices = np.zeros((2, 2), np.int32)
    spec = [TensorSpec(params.shape, params.dtype), TensorSpec(indices.shape, indices.dtype)]
    node = Node(index=0, op="GATHER", opcode=0, version=1, inputs=(0, 1), outputs=(2,))
    ctx = NodeContext(node=node, opdef=get_op("GATHER"), attrs={"axis": 1, "batch_dims": 1}, inputs=spec,
                      outputs=[TensorSpec((2, 2, 3), np.dtype(np.float32))])
    assert KERNELS["GATHER"](ctx) is None


@pytest.mark.parametrize("shape,ix_shape,dtype", [
    ((128, 1, 1, 128), (16, 1), np.float32),   # a legacy decoder's mask rows, by position
    ((4, 5, 3), (2, 3, 2), np.float32),         # tuples of two
    ((4, 5, 3), (6, 3), np.int32),              # whole elements
    ((7,), (3, 1), np.bool_),
])
@pytest.mark.parametrize("ix_dtype", [np.int32, np.int64])
def test_gather_nd_matches_reference(shape, ix_shape, dtype, ix_dtype):
    params = (RNG.standard_normal(shape) * 10).astype(dtype)
    depth = ix_shape[-1]
    indices = np.stack([RNG.integers(0, shape[d], ix_shape[:-1]) for d in range(depth)], axis=-1).astype(ix_dtype)
    check("GATHER_ND", {}, [params, indices])


@pytest.mark.parametrize("bad", [-1, 5])
def test_gather_nd_out_of_range_raises_execution_error(bad):
    params = RNG.standard_normal((4, 5, 3)).astype(np.float32)
    indices = np.zeros((3, 2), np.int32)
    indices[-1, 1] = bad
    run, outs = kernel_for("GATHER_ND", {}, [params, indices])
    with pytest.raises(ExecutionError, match=f"GATHER_ND index {bad} out of range"):
        run([params, indices], outs)


@pytest.mark.parametrize("shapes,axis,dtype", [([(), (), (), ()], 0, np.int32), ([(2, 3)] * 3, 1, np.float32),
                                               ([(4,)] * 2, 1, np.int64), ([(2, 2)] * 7, 2, np.float32)])
def test_pack_matches_reference(shapes, axis, dtype):
    check("PACK", {"axis": axis, "values_count": len(shapes)},
          [(RNG.standard_normal(s) * 10).astype(dtype) for s in shapes])


@pytest.mark.parametrize("op", ["REDUCE_ALL", "REDUCE_ANY"])
@pytest.mark.parametrize("shape,axes,keep", [((16, 1), (1,), False), ((3, 5, 4), (1,), True),
                                             ((3, 5, 4), (0, 1), False), ((2, 6), (-1,), True),
                                             ((4, 0, 3), (1,), False)])
def test_bool_reductions_match_reference(op, shape, axes, keep):
    x = RNG.random(shape) < 0.8
    x.reshape(-1)[::7] = True
    check(op, {"keep_dims": keep}, [x, np.array(axes, np.int32)], consts=(1,))


# -- SPLIT / SPLIT_V ----------------------------------------------------------------------------

@pytest.mark.parametrize("shape,axis,n", [((1, 256), 1, 4), ((6, 2, 3), 0, 3), ((2, 2, 4), -1, 2),
                                          ((4, 2), 0, 1)])
def test_split_matches_reference(shape, axis, n):
    x = RNG.standard_normal(shape).astype(np.float32)
    check("SPLIT", {"num_splits": n}, [np.array(axis, np.int32), x], consts=(0,))


@pytest.mark.parametrize("shape,sizes,axis", [((2, 7), [1, -1, 2], 1), ((3, 4), [3, 1], -1),
                                              ((5, 2), [2, 0, 3], 0)])
def test_split_v_matches_reference(shape, sizes, axis):
    x = RNG.integers(-100, 100, shape).astype(np.int32)
    check("SPLIT_V", {"num_splits": len(sizes)}, [x, np.array(sizes, np.int32), np.array(axis, np.int32)],
          consts=(1, 2))


# -- STRIDED_SLICE / SLICE ----------------------------------------------------------------------

def ss_attrs(**masks) -> dict:
    attrs = {m: 0 for m in SS_MASKS}
    attrs.update(masks)
    attrs.setdefault("offset", False)
    return attrs


SS_CASES = [
    ((1, 1, 64), [0, -1, 0], [0, 0, 0], [1, 1, 1], ss_attrs(begin_mask=5, end_mask=5, shrink_axis_mask=2)),
    ((4, 6), [1, 0], [4, 5], [2, 2], ss_attrs()),
    ((4, 6), [3, 5], [0, 0], [-1, -2], ss_attrs()),               # negative strides
    ((4, 6), [-1, 0], [-5, 6], [-2, 3], ss_attrs()),
    ((2, 3, 4), [0, 1], [0, 3], [1, 1], ss_attrs(ellipsis_mask=1)),
    ((2, 3, 4), [0, 0, 1], [0, 0, 3], [1, 1, 1], ss_attrs(new_axis_mask=2, begin_mask=1, end_mask=1)),
    ((5,), [2], [3], [1], ss_attrs(shrink_axis_mask=1)),
    ((3, 4, 5), [0, 0, 0], [3, 4, 5], [1, 1, 1], ss_attrs()),     # the whole tensor
    ((3, 4), [1, 0], [2, 4], [1, 1], ss_attrs(offset=True)),
]


@pytest.mark.parametrize("shape,begin,end,strides,attrs", SS_CASES)
def test_strided_slice_matches_reference(shape, begin, end, strides, attrs):
    x = RNG.standard_normal(shape).astype(np.float32)
    check("STRIDED_SLICE", attrs, [x, np.array(begin, np.int32), np.array(end, np.int32),
                                   np.array(strides, np.int32)], consts=(1, 2, 3))


@pytest.mark.parametrize("shape,begin,end,strides,attrs", [c for c in SS_CASES if len(c[0]) > 1])
def test_constant_slices_are_strided_copy_tasks(shape, begin, end, strides, attrs):
    """A slice with constant bounds is a task function (it chains into a plan with its
    neighbours: a GRU's 69 gate slices were Python calls between 65 plans)."""
    from litegpu_cpu.kernels.tasks import is_plan
    x = RNG.standard_normal(shape).astype(np.float32)
    kernel, outs = kernel_for("STRIDED_SLICE", attrs, [x, np.array(begin, np.int32), np.array(end, np.int32),
                                                       np.array(strides, np.int32)], consts=(1, 2, 3))
    assert is_plan(kernel.bind([x], outs))


@pytest.mark.parametrize("begin,size", [([0, 1, 0], [2, 2, 4]), ([1, 0, 2], [-1, 3, 1])])
def test_slice_matches_reference(begin, size):
    x = RNG.integers(-9, 9, (2, 3, 4)).astype(np.int64)
    check("SLICE", {}, [x, np.array(begin, np.int32), np.array(size, np.int32)], consts=(1, 2))


def test_every_small_strided_slice_of_a_3x4_matches():
    """Exhaustive over begin/end/stride per axis (no masks): every clamp and direction rule."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    values = [-5, -1, 0, 2, 5]
    for b0, e0, s0 in itertools.product(values, values, (-2, -1, 1, 3)):
        check("STRIDED_SLICE", ss_attrs(), [x, np.array([b0, 1], np.int32), np.array([e0, 4], np.int32),
                                            np.array([s0, 1], np.int32)], consts=(1, 2, 3))


# -- SELECT / predicates ------------------------------------------------------------------------

@pytest.mark.parametrize("op,c_shape,shape", [("SELECT", (2, 3), (2, 3)), ("SELECT", (4,), (4, 3, 2)),
                                              ("SELECT", (), (3, 5)), ("SELECT_V2", (2, 1, 4), (3, 4))])
def test_select_matches_reference(op, c_shape, shape):
    cond = RNG.random(c_shape) < 0.5
    x = RNG.integers(-50, 50, shape).astype(np.int32)
    y = RNG.integers(-50, 50, shape).astype(np.int32)
    check(op, {}, [cond, x, y])


@pytest.mark.parametrize("op", ["LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL", "EQUAL", "NOT_EQUAL"])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_comparisons_match_reference(op, dtype):
    a = RNG.integers(-3, 3, (2, 1, 5)).astype(dtype)
    b = RNG.integers(-3, 3, (4, 1)).astype(dtype)
    check(op, {}, [a, b])


@pytest.mark.parametrize("op", ["LOGICAL_AND", "LOGICAL_OR"])
def test_logical_match_reference(op):
    check(op, {}, [RNG.random((3, 4)) < 0.5, RNG.random((4,)) < 0.5])


def test_logical_not_matches_reference():
    check("LOGICAL_NOT", {}, [RNG.random((3, 4)) < 0.5])
