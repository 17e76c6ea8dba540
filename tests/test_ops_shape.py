"""Shape/layout/indexing op definitions: attrs validation, shape inference, references.

The references are checked against independent formulations (numpy basic indexing for
STRIDED_SLICE, explicit loops for GATHER, hand-worked small examples); agreement with
LiteRT itself is covered by the conformance cases in litegpu.testing.cases.shape.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from litegpu.errors import ExecutionError, ModelFormatError, UnsupportedError
from litegpu.graph import Node, Quantization, Tensor
from litegpu.ops import DynamicShape, TensorSpec, get_op

SHAPE_OPS = ["RESHAPE", "SQUEEZE", "EXPAND_DIMS", "CONCATENATION", "SPLIT", "SPLIT_V", "PACK", "UNPACK",
             "TRANSPOSE", "STRIDED_SLICE", "SLICE", "PAD", "PADV2", "MIRROR_PAD", "GATHER", "GATHER_ND",
             "SHAPE", "FILL", "RANGE", "TILE", "BROADCAST_TO", "REVERSE_V2", "DEPTH_TO_SPACE",
             "SPACE_TO_DEPTH", "SPACE_TO_BATCH_ND", "BATCH_TO_SPACE_ND", "ONE_HOT", "WHERE"]


def make_node(op: str, in_specs, out_specs, **options):
    """A Node with tensors: each spec is (shape, dtype) or an ndarray (a constant)."""
    tensors = []
    for spec in list(in_specs) + list(out_specs):
        if isinstance(spec, np.ndarray):
            data, shape, dtype = spec, spec.shape, spec.dtype
        else:
            data, (shape, dtype) = None, spec
        tensors.append(Tensor(index=len(tensors), name=f"t{len(tensors)}", dtype=np.dtype(dtype),
                              shape=tuple(shape), shape_signature=tuple(shape), stored=data))
    n_in = len(in_specs)
    node = Node(index=7, op=op, opcode=0, version=1, inputs=tuple(range(n_in)),
                outputs=tuple(range(n_in, len(tensors))), options=options)
    return node, tensors


def attrs_of(op, in_specs, out_specs, **options) -> dict:
    node, tensors = make_node(op, in_specs, out_specs, **options)
    return get_op(op).node_attrs(node, tensors)


def run(op, inputs, attrs):
    return get_op(op).reference([np.asarray(x) if x is not None else None for x in inputs], attrs)


def infer(op, inputs, attrs):
    """Infer with constants' values known and arrays given as specs (shape/dtype only) when wrapped."""
    specs = [x if isinstance(x, TensorSpec) else TensorSpec.of(np.asarray(x)) for x in inputs]
    return get_op(op).infer(specs, attrs)


def unknown(shape, dtype=np.int32) -> TensorSpec:
    """A spec whose value is not known before running."""
    return TensorSpec(tuple(shape), np.dtype(dtype))


@pytest.mark.parametrize("op", SHAPE_OPS)
def test_every_op_is_registered_with_a_doc(op):
    opdef = get_op(op)
    assert opdef is not None and opdef.doc


# -- STRIDED_SLICE against numpy indexing ------------------------------------------------

def _encode(spec):
    """TF-style begin/end/strides and masks for a numpy index tuple."""
    begin, end, strides = [], [], []
    masks = dict(begin_mask=0, end_mask=0, ellipsis_mask=0, new_axis_mask=0, shrink_axis_mask=0)
    for i, item in enumerate(spec):
        bit = 1 << i
        if item is Ellipsis:
            masks["ellipsis_mask"] |= bit
            begin.append(0), end.append(0), strides.append(1)
        elif item is None:
            masks["new_axis_mask"] |= bit
            begin.append(0), end.append(0), strides.append(1)
        elif isinstance(item, int):
            masks["shrink_axis_mask"] |= bit
            begin.append(item), end.append(item + 1), strides.append(1)
        else:
            step = 1 if item.step is None else item.step
            if item.start is None:
                masks["begin_mask"] |= bit
            if item.stop is None:
                masks["end_mask"] |= bit
            # masked entries carry junk values that must be ignored
            begin.append(99 if item.start is None else item.start)
            end.append(-99 if item.stop is None else item.stop)
            strides.append(step)
    return np.array(begin, np.int32), np.array(end, np.int32), np.array(strides, np.int32), masks


def _random_item(rng, d):
    if rng.random() < 0.2:
        return int(rng.integers(-d, d))  # a shrunk axis: must be in range
    step = int(rng.choice([1, 1, 2, 3, -1, -2]))
    start = None if rng.random() < 0.25 else int(rng.integers(-d - 2, d + 3))
    stop = None if rng.random() < 0.25 else int(rng.integers(-d - 2, d + 3))
    return slice(start, stop, step)


def _random_spec(rng, shape):
    """A random numpy index: slices/ints for some dims, maybe an ellipsis, maybe new axes."""
    rank = len(shape)
    use_ellipsis = rng.random() < 0.4
    # An ellipsis standing for no dimension at all is where LiteRT departs from numpy
    # (it always expands it to one dimension); see the dedicated test below.
    n_real = int(rng.integers(0, rank)) if use_ellipsis else int(rng.integers(1, rank + 1))
    if use_ellipsis:
        p = int(rng.integers(0, n_real + 1))  # items before the ellipsis index leading dims
        dims = list(shape[:p]) + list(shape[rank - (n_real - p):])
        items = [_random_item(rng, d) for d in dims]
        items.insert(p, Ellipsis)
    else:
        items = [_random_item(rng, d) for d in shape[:n_real]]
    for _ in range(int(rng.integers(0, 2))):
        items.insert(int(rng.integers(0, len(items) + 1)), None)
    return tuple(items)


def test_strided_slice_matches_numpy_indexing_on_random_specs():
    rng = np.random.default_rng(5)
    x = np.arange(3 * 4 * 5 * 2).reshape(3, 4, 5, 2).astype(np.float32)
    checked = 0
    for _ in range(400):
        spec = _random_spec(rng, x.shape)
        if len(spec) > 5 or x.ndim + spec.count(None) > 5:
            continue
        begin, end, strides, masks = _encode(spec)
        attrs = dict(masks, offset=False)
        want = x[spec]
        got = run("STRIDED_SLICE", [x, begin, end, strides], attrs)[0]
        assert got.shape == want.shape, spec
        np.testing.assert_array_equal(got, want, err_msg=str(spec))
        (out,) = infer("STRIDED_SLICE", [unknown(x.shape, np.float32), begin, end, strides], attrs)
        assert out.shape == want.shape, spec
        checked += 1
    assert checked > 300


def test_strided_slice_ellipsis_between_indices():
    x = np.arange(2 * 3 * 4 * 5).reshape(2, 3, 4, 5)
    for spec in [(1, Ellipsis, slice(None, None, -2)), (None, Ellipsis, 0), (slice(1, None), Ellipsis, None, 3)]:
        begin, end, strides, masks = _encode(spec)
        got = run("STRIDED_SLICE", [x, begin, end, strides], dict(masks, offset=False))[0]
        np.testing.assert_array_equal(got, x[spec], err_msg=str(spec))


def test_strided_slice_zero_width_ellipsis_expands_to_one_dimension_as_in_litert():
    # Observed with ai_edge_litert 2.3.0 on this input: (1, 4, 1) = x[0:1, :, 4:5, 1]
    # rather than numpy's (1, 1); the ellipsis takes dimension 1 and the rest shift right.
    x = np.arange(3 * 4 * 5 * 2).reshape(3, 4, 5, 2).astype(np.float32)
    begin, end, strides, masks = _encode((slice(0, None, 3), Ellipsis, slice(-1, None, 3), -1, 0))
    got = run("STRIDED_SLICE", [x, begin, end, strides], dict(masks, offset=False))[0]
    np.testing.assert_array_equal(got, np.array([9, 19, 29, 39], np.float32).reshape(1, 4, 1))


def test_strided_slice_offset_makes_end_relative_to_begin():
    x = np.arange(10)
    attrs = dict(begin_mask=0, end_mask=0, ellipsis_mask=0, new_axis_mask=0, shrink_axis_mask=0, offset=True)
    got = run("STRIDED_SLICE", [x, [2], [3], [1]], attrs)[0]
    np.testing.assert_array_equal(got, [2, 3, 4])


def test_strided_slice_errors():
    x = np.zeros((3, 4), np.float32)
    attrs = dict(begin_mask=0, end_mask=0, ellipsis_mask=0, new_axis_mask=0, shrink_axis_mask=0, offset=False)
    with pytest.raises(ModelFormatError, match="non-zero"):
        run("STRIDED_SLICE", [x, [0, 0], [3, 4], [1, 0]], attrs)
    with pytest.raises(ModelFormatError, match="lengths differ"):
        run("STRIDED_SLICE", [x, [0, 0], [3], [1, 1]], attrs)
    with pytest.raises(ModelFormatError, match="shrink index"):
        run("STRIDED_SLICE", [x, [5], [6], [1]], dict(attrs, shrink_axis_mask=1))
    with pytest.raises(DynamicShape):
        infer("STRIDED_SLICE", [unknown((3, 4), np.float32), unknown((2,)), np.array([3, 4]), np.array([1, 1])],
              attrs)


def test_strided_slice_attrs_read_masks_and_check_index_dtypes():
    a = attrs_of("STRIDED_SLICE", [((4,), np.float32), ((1,), np.int32), ((1,), np.int32), ((1,), np.int32)],
                 [((2,), np.float32)], begin_mask=1, shrink_axis_mask=0, offset=True)
    assert a == dict(begin_mask=1, end_mask=0, ellipsis_mask=0, new_axis_mask=0, shrink_axis_mask=0, offset=True)
    with pytest.raises(ModelFormatError, match="node 7 .*begin"):
        attrs_of("STRIDED_SLICE", [((4,), np.float32), ((1,), np.float32), ((1,), np.int32), ((1,), np.int32)],
                 [((2,), np.float32)])
    with pytest.raises(ModelFormatError, match="expects 4 inputs"):
        attrs_of("STRIDED_SLICE", [((4,), np.float32), ((1,), np.int32)], [((2,), np.float32)])


# -- RESHAPE, SQUEEZE, EXPAND_DIMS -------------------------------------------------------

def test_reshape_takes_shape_from_int32_vector_input_else_options():
    a = attrs_of("RESHAPE", [((2, 3), np.float32), ((2,), np.int32)], [((3, 2), np.float32)], new_shape=[6])
    assert a["shape_from_input"]
    (out,) = infer("RESHAPE", [unknown((2, 3), np.float32), np.array([3, -1], np.int32)], a)
    assert out.shape == (3, 2)
    with pytest.raises(DynamicShape):
        infer("RESHAPE", [unknown((2, 3), np.float32), unknown((2,))], a)
    # an int64 shape tensor is ignored by LiteRT in favour of the options
    a = attrs_of("RESHAPE", [((2, 3), np.float32), ((2,), np.int64)], [((6,), np.float32)], new_shape=[6])
    assert not a["shape_from_input"] and a["new_shape"] == (6,)
    a = attrs_of("RESHAPE", [((1,), np.float32)], [((), np.float32)], new_shape=[0])
    assert a["new_shape"] == ()


@pytest.mark.parametrize("in_shape, target, want", [
    ((2, 3, 4), [-1], (24,)),
    ((2, 3, 4), [4, -1, 2], (4, 3, 2)),
    ((1,), [], ()),
    ((), [1, 1], (1, 1)),
    ((0, 3), [-1, 3], (0, 3)),
])
def test_reshape_infers_the_minus_one_dimension(in_shape, target, want):
    a = {"shape_from_input": True, "new_shape": ()}
    (out,) = infer("RESHAPE", [unknown(in_shape, np.float32), np.array(target, np.int32)], a)
    assert out.shape == want
    x = np.arange(int(np.prod(in_shape))).reshape(in_shape)
    np.testing.assert_array_equal(run("RESHAPE", [x, np.array(target, np.int32)], a)[0].ravel(), x.ravel())


@pytest.mark.parametrize("target, match", [([-1, -1], "more than one"), ([5, -1], "cannot"), ([7], "cannot"),
                                           ([-2, 3], "negative")])
def test_reshape_rejects_bad_targets(target, match):
    a = {"shape_from_input": True, "new_shape": ()}
    with pytest.raises(ModelFormatError, match=match):
        infer("RESHAPE", [unknown((2, 3), np.float32), np.array(target, np.int32)], a)


def test_squeeze_and_expand_dims():
    assert infer("SQUEEZE", [unknown((1, 3, 1), np.float32)], {"squeeze_dims": ()})[0].shape == (3,)
    assert infer("SQUEEZE", [unknown((1, 3, 1), np.float32)], {"squeeze_dims": (-1,)})[0].shape == (1, 3)
    with pytest.raises(ModelFormatError, match="size 3"):
        infer("SQUEEZE", [unknown((1, 3, 1), np.float32)], {"squeeze_dims": (1,)})
    for axis, want in [(0, (1, 2, 3)), (2, (2, 3, 1)), (-1, (2, 3, 1)), (-3, (1, 2, 3))]:
        assert infer("EXPAND_DIMS", [unknown((2, 3), np.float32), np.array(axis, np.int32)], {})[0].shape == want
    with pytest.raises(ModelFormatError, match="out of range"):
        infer("EXPAND_DIMS", [unknown((2, 3), np.float32), np.array(3, np.int32)], {})
    with pytest.raises(DynamicShape):
        infer("EXPAND_DIMS", [unknown((2, 3), np.float32), unknown(())], {})


# -- CONCATENATION, PACK, UNPACK, SPLIT, SPLIT_V -----------------------------------------

def test_concatenation_attrs_normalize_activation_like_litert():
    a = attrs_of("CONCATENATION", [((2, 2), np.float32)] * 2, [((2, 4), np.float32)], axis=-1,
                 fused_activation_function=1)
    assert a == {"axis": -1, "activation": "NONE", "declared_activation": "RELU"}
    with pytest.raises(UnsupportedError, match="RELU"):
        attrs_of("CONCATENATION", [((2,), np.int32)] * 2, [((4,), np.int32)], fused_activation_function=1)


def test_concatenation_infer_normalizes_negative_axis_and_checks_shapes():
    specs = [unknown((2, 3, 4), np.float32), unknown((2, 5, 4), np.float32)]
    assert infer("CONCATENATION", specs, {"axis": -2, "activation": "NONE"})[0].shape == (2, 8, 4)
    with pytest.raises(ModelFormatError, match="differ outside axis"):
        infer("CONCATENATION", specs, {"axis": 0, "activation": "NONE"})
    with pytest.raises(ModelFormatError, match="mix"):
        infer("CONCATENATION", [unknown((2,), np.float32), unknown((2,), np.int32)], {"axis": 0, "activation": "NONE"})


def test_concatenation_refuses_a_mix_of_quantized_and_plain_integers():
    node, tensors = make_node("CONCATENATION", [((2,), np.int8)] * 2, [((4,), np.int8)], axis=0)
    q = Quantization(np.array([0.5], np.float32), np.array([1], np.int64))
    tensors[0] = Tensor(0, "a", np.dtype(np.int8), (2,), (2,), type_name="INT8", quantization=q)
    with pytest.raises(UnsupportedError, match="not quantized"):
        get_op("CONCATENATION").node_attrs(node, tensors)


def test_pack_unpack_round_trip_and_count_checks():
    a = attrs_of("PACK", [((2, 3), np.float32)] * 3, [((2, 3, 3), np.float32)], values_count=3, axis=-1)
    assert a == {"axis": -1, "count": 3}
    xs = [np.full((2, 3), i, np.float32) for i in range(3)]
    packed = run("PACK", xs, a)[0]
    assert packed.shape == (2, 3, 3) and packed[1, 2, 2] == 2 and packed[0, 0, 1] == 1
    u = attrs_of("UNPACK", [((2, 3, 3), np.float32)], [((2, 3), np.float32)] * 3, num=3, axis=2)
    for i, part in enumerate(run("UNPACK", [packed], u)):
        np.testing.assert_array_equal(part, xs[i])
    with pytest.raises(ModelFormatError, match="values_count"):
        attrs_of("PACK", [((2,), np.float32)] * 2, [((3, 2), np.float32)], values_count=3)
    with pytest.raises(ModelFormatError, match="expects 2 outputs"):
        attrs_of("UNPACK", [((2, 3), np.float32)], [((3,), np.float32)], num=2)
    with pytest.raises(ModelFormatError, match="num 2"):
        infer("UNPACK", [unknown((3, 2), np.float32)], {"axis": 0, "count": 2})


def test_split_and_split_v():
    a = attrs_of("SPLIT", [np.array(1, np.int32), ((2, 6), np.float32)], [((2, 2), np.float32)] * 3, num_splits=3)
    assert a == {"num_splits": 3}
    x = np.arange(12).reshape(2, 6)
    parts = run("SPLIT", [np.array(-1, np.int32), x], a)
    np.testing.assert_array_equal(parts[1], [[2, 3], [8, 9]])
    with pytest.raises(ModelFormatError, match="divisible"):
        infer("SPLIT", [np.array(0, np.int32), unknown((2, 6), np.float32)], a)
    with pytest.raises(DynamicShape):
        infer("SPLIT", [unknown(()), unknown((2, 6), np.float32)], a)
    with pytest.raises(ModelFormatError, match="expects 3 outputs"):
        attrs_of("SPLIT", [np.array(1, np.int32), ((2, 6), np.float32)], [((2, 3), np.float32)] * 2, num_splits=3)

    v = {"num_splits": 3}
    outs = infer("SPLIT_V", [unknown((2, 7), np.float32), np.array([1, -1, 2]), np.array(1)], v)
    assert [o.shape for o in outs] == [(2, 1), (2, 4), (2, 2)]
    parts = run("SPLIT_V", [x, np.array([1, -1, 2]), np.array(-1)], v)
    np.testing.assert_array_equal(parts[1], [[1, 2, 3], [7, 8, 9]])
    for sizes, match in [([1, -1, -1], "invalid"), ([1, 1, 1], "do not sum"), ([5, 4, -1], "exceed")]:
        with pytest.raises(ModelFormatError, match=match):
            infer("SPLIT_V", [unknown((2, 7), np.float32), np.array(sizes), np.array(1)], v)


# -- TRANSPOSE, TILE, BROADCAST_TO, REVERSE_V2, SLICE ------------------------------------

def test_transpose_accepts_negative_perm_and_rejects_non_permutations():
    x = np.arange(24).reshape(2, 3, 4)
    np.testing.assert_array_equal(run("TRANSPOSE", [x, np.array([-1, 0, 1])], {})[0], x.transpose(2, 0, 1))
    with pytest.raises(ModelFormatError, match="permutation"):
        infer("TRANSPOSE", [unknown((2, 3, 4), np.float32), np.array([0, 0, 1])], {})
    with pytest.raises(DynamicShape):
        infer("TRANSPOSE", [unknown((2, 3, 4), np.float32), unknown((3,))], {})


def test_tile_broadcast_reverse():
    assert infer("TILE", [unknown((2, 3), np.float32), np.array([3, 2])], {})[0].shape == (6, 6)
    np.testing.assert_array_equal(run("TILE", [np.array([[1, 2]]), np.array([2, 2])], {})[0],
                                  [[1, 2, 1, 2], [1, 2, 1, 2]])
    with pytest.raises(ModelFormatError, match="multiples"):
        infer("TILE", [unknown((2, 3), np.float32), np.array([3])], {})
    assert infer("BROADCAST_TO", [unknown((3, 1), np.float32), np.array([2, 3, 4])], {})[0].shape == (2, 3, 4)
    with pytest.raises(ModelFormatError, match="cannot broadcast"):
        infer("BROADCAST_TO", [unknown((3, 2), np.float32), np.array([3, 4])], {})
    np.testing.assert_array_equal(run("REVERSE_V2", [np.array([[1, 2], [3, 4]]), np.array([0, -1])], {})[0],
                                  [[4, 3], [2, 1]])
    # the axes do not change the shape: inference works without their value
    assert infer("REVERSE_V2", [unknown((2, 5), np.float32), unknown((1,))], {})[0].shape == (2, 5)


def test_slice():
    x = np.arange(20).reshape(4, 5)
    np.testing.assert_array_equal(run("SLICE", [x, np.array([1, 2]), np.array([-1, 2])], {})[0], x[1:, 2:4])
    for begin, size in [([0, 4], [1, 2]), ([-1, 0], [1, 1]), ([0, 0], [1, -2])]:
        with pytest.raises(ModelFormatError, match="SLICE"):
            infer("SLICE", [unknown((4, 5), np.float32), np.array(begin), np.array(size)], {})


# -- PAD, PADV2, MIRROR_PAD --------------------------------------------------------------

def test_pad_fills_zero_or_the_quantized_zero_point():
    a = attrs_of("PAD", [((2,), np.float32), np.array([[1, 2]], np.int32)], [((5,), np.float32)])
    np.testing.assert_array_equal(run("PAD", [np.array([7.0, 8.0], np.float32), np.array([[1, 2]])], a)[0],
                                  [0, 7, 8, 0, 0])
    node, tensors = make_node("PAD", [((2,), np.int8), np.array([[1, 1]], np.int32)], [((4,), np.int8)])
    q = Quantization(np.array([0.1], np.float32), np.array([-5], np.int64))
    for i in (0, 2):  # input and output share the quantization
        tensors[i] = Tensor(i, f"t{i}", np.dtype(np.int8), tensors[i].shape, tensors[i].shape, quantization=q)
    a = get_op("PAD").node_attrs(node, tensors)
    out = run("PAD", [np.array([3, 4], np.int8), np.array([[1, 1]])], a)[0]
    np.testing.assert_array_equal(out, [-5, 3, 4, -5])
    assert out.dtype == np.int8
    with pytest.raises(ModelFormatError, match="negative"):
        infer("PAD", [unknown((2,), np.float32), np.array([[-1, 0]])], a)
    with pytest.raises(ModelFormatError, match="expected"):
        infer("PAD", [unknown((2, 2), np.float32), np.array([[1, 0]])], a)
    np.testing.assert_array_equal(run("PADV2", [np.array([1, 2], np.int32), np.array([[0, 1]]), np.array(9, np.int32)],
                                      {"pad_value": 0})[0], [1, 2, 9])


def test_mirror_pad_modes_by_hand():
    x = np.array([1, 2, 3])
    pads = np.array([[2, 2]])
    a = attrs_of("MIRROR_PAD", [((3,), np.int64), pads.astype(np.int32)], [((7,), np.int64)], mode=0)
    assert a == {"mode": "REFLECT"}
    np.testing.assert_array_equal(run("MIRROR_PAD", [x, pads], a)[0], [3, 2, 1, 2, 3, 2, 1])
    np.testing.assert_array_equal(run("MIRROR_PAD", [x, pads], {"mode": "SYMMETRIC"})[0], [2, 1, 1, 2, 3, 3, 2])
    with pytest.raises(ModelFormatError, match="too large"):
        infer("MIRROR_PAD", [unknown((3,), np.float32), np.array([[3, 0]])], {"mode": "REFLECT"})
    assert infer("MIRROR_PAD", [unknown((3,), np.float32), np.array([[3, 0]])], {"mode": "SYMMETRIC"})[0].shape == (6,)
    with pytest.raises(ModelFormatError, match="mode 2"):
        attrs_of("MIRROR_PAD", [((3,), np.float32), pads.astype(np.int32)], [((7,), np.float32)], mode=2)


# -- GATHER, GATHER_ND -------------------------------------------------------------------

def test_gather_axis_and_batch_dims_against_loops():
    rng = np.random.default_rng(0)
    params = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    indices = rng.integers(0, 4, size=(2, 3, 6))
    a = {"axis": 2, "batch_dims": 2}
    out = run("GATHER", [params, indices], a)[0]
    assert out.shape == (2, 3, 6, 5)
    for b0, b1, k in itertools.product(range(2), range(3), range(6)):
        np.testing.assert_array_equal(out[b0, b1, k], params[b0, b1, indices[b0, b1, k]])
    a = {"axis": -2, "batch_dims": 0}
    ix = np.array([[3, 0]])
    out = run("GATHER", [params, ix], a)[0]
    assert out.shape == (2, 3, 1, 2, 5)
    np.testing.assert_array_equal(out[1, 2, 0, 0], params[1, 2, 3])
    assert infer("GATHER", [unknown(params.shape, np.float32), unknown((2, 3, 6))], {"axis": 2, "batch_dims": -1}
                 )[0].shape == (2, 3, 6, 5)


def test_gather_rejects_bad_batch_dims_and_out_of_range_indices():
    with pytest.raises(ModelFormatError, match="batch_dims"):
        infer("GATHER", [unknown((2, 3), np.float32), unknown((2, 3))], {"axis": 0, "batch_dims": 1})
    with pytest.raises(ModelFormatError, match="batch dimensions differ"):
        infer("GATHER", [unknown((2, 3), np.float32), unknown((3, 1))], {"axis": 1, "batch_dims": 1})
    params = np.arange(5.0)
    for bad in (5, -1):
        with pytest.raises(ExecutionError, match=f"index {bad} out of range"):
            run("GATHER", [params, np.array([0, bad])], {"axis": 0, "batch_dims": 0})
    with pytest.raises(ExecutionError, match="GATHER_ND index 3"):
        run("GATHER_ND", [np.zeros((3, 2)), np.array([[1, 0], [3, 0]])], {})
    with pytest.raises(ModelFormatError, match="indices must be"):
        attrs_of("GATHER", [((3,), np.float32), ((1,), np.float32)], [((1,), np.float32)])


def test_gather_nd_by_hand():
    params = np.arange(24).reshape(2, 3, 4)
    out = run("GATHER_ND", [params, np.array([[1, 2], [0, 0]])], {})[0]
    np.testing.assert_array_equal(out, [params[1, 2], params[0, 0]])
    out = run("GATHER_ND", [params, np.array([[[1, 2, 3]]])], {})[0]
    assert out.shape == (1, 1) and out[0, 0] == params[1, 2, 3]
    with pytest.raises(ModelFormatError):
        infer("GATHER_ND", [unknown((2, 3), np.float32), unknown((1, 3))], {})


# -- SHAPE, FILL, RANGE, WHERE, ONE_HOT --------------------------------------------------

def test_shape_infer_gives_the_value_so_it_folds():
    a = attrs_of("SHAPE", [((2, 5, 1), np.float32)], [((3,), np.int64)], out_type=4)
    assert a == {"out_dtype": np.dtype(np.int64)}
    (out,) = infer("SHAPE", [unknown((2, 5, 1), np.float32)], a)
    assert out.shape == (3,) and out.dtype == np.int64
    np.testing.assert_array_equal(out.value, [2, 5, 1])
    assert out.value.dtype == np.int64
    assert infer("SHAPE", [unknown((), np.float32)], a)[0].value.shape == (0,)
    with pytest.raises(UnsupportedError):
        attrs_of("SHAPE", [((2,), np.float32)], [((1,), np.float32)])


def test_fill():
    (out,) = infer("FILL", [np.array([2, 3]), unknown((), np.int64)], {})
    assert out.shape == (2, 3) and out.dtype == np.int64
    got = run("FILL", [np.array([2, 1]), np.array(True)], {})[0]
    assert got.dtype == np.bool_ and got.shape == (2, 1) and got.all()
    with pytest.raises(ModelFormatError, match="negative"):
        infer("FILL", [np.array([-2]), unknown((), np.float32)], {})
    with pytest.raises(DynamicShape):
        infer("FILL", [unknown((2,)), unknown((), np.float32)], {})


@pytest.mark.parametrize("start, limit, delta, want", [
    (0, 10, 3, [0, 3, 6, 9]), (5, -4, -2, [5, 3, 1, -1, -3]), (2, 2, 1, []), (0, 1, 5, [0]),
])
def test_range_ints(start, limit, delta, want):
    args = [np.array(v, np.int32) for v in (start, limit, delta)]
    got = run("RANGE", args, {})[0]
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)
    assert infer("RANGE", args, {})[0].shape == (len(want),)


def test_range_float_accumulates_like_litert():
    start, limit, delta = np.float32(0.1), np.float32(5.0), np.float32(0.1)
    expected, v = [], start
    while len(expected) < int(np.ceil((limit - start) / delta)):
        expected.append(v)
        v = np.float32(v + delta)
    got = run("RANGE", [np.array(start), np.array(limit), np.array(delta)], {})[0]
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, np.array(expected, np.float32))


def test_range_errors():
    for start, limit, delta, match in [(0, 5, 0, "delta"), (0, 5, -1, "never ends"), (5, 0, 1, "never ends")]:
        with pytest.raises(ModelFormatError, match=match):
            infer("RANGE", [np.array(v, np.int32) for v in (start, limit, delta)], {})
    with pytest.raises(ModelFormatError, match="mix"):
        attrs_of("RANGE", [((), np.int32), ((), np.float32), ((), np.int32)], [((1,), np.int32)])


def test_where_and_one_hot():
    cond = np.array([[True, False], [False, True]])
    np.testing.assert_array_equal(run("WHERE", [cond], {})[0], [[0, 0], [1, 1]])
    assert run("WHERE", [cond], {})[0].dtype == np.int64
    assert infer("WHERE", [cond], {})[0].shape == (2, 2)
    with pytest.raises(DynamicShape):
        infer("WHERE", [unknown((2, 2), np.bool_)], {})
    out = run("ONE_HOT", [np.array([1, 3, -1]), np.array(3), np.array(5.0, np.float32), np.array(0.0, np.float32)],
              {"axis": -1})[0]
    np.testing.assert_array_equal(out, [[0, 5, 0], [0, 0, 0], [0, 0, 0]])
    out = run("ONE_HOT", [np.array([0, 2]), np.array(3), np.array(1, np.int32), np.array(0, np.int32)], {"axis": 0})[0]
    np.testing.assert_array_equal(out, [[1, 0], [0, 0], [0, 1]])


# -- block rearrangements ----------------------------------------------------------------

def test_depth_to_space_by_hand_and_inverse():
    x = np.arange(8).reshape(1, 1, 1, 8)  # one pixel, depth laid out (row, col, channel)
    y = run("DEPTH_TO_SPACE", [x], {"block_size": 2})[0]
    assert y.shape == (1, 2, 2, 2)
    np.testing.assert_array_equal(y[0, :, :, 0], [[0, 2], [4, 6]])
    np.testing.assert_array_equal(y[0, 1, 0], [4, 5])
    back = run("SPACE_TO_DEPTH", [y], {"block_size": 2})[0]
    np.testing.assert_array_equal(back, x)
    with pytest.raises(UnsupportedError, match="4-D"):
        attrs_of("DEPTH_TO_SPACE", [((2, 8), np.float32)], [((2, 8), np.float32)], block_size=2)
    with pytest.raises(ModelFormatError, match="block_size"):
        attrs_of("SPACE_TO_DEPTH", [((1, 2, 2, 1), np.float32)], [((1, 1, 1, 4), np.float32)], block_size=0)
    with pytest.raises(ModelFormatError, match="divisible"):
        infer("DEPTH_TO_SPACE", [unknown((1, 2, 2, 6), np.float32)], {"block_size": 2})


def test_space_to_batch_by_hand_and_batch_to_space_inverts_it():
    x = np.arange(16).reshape(1, 4, 4, 1)
    y = run("SPACE_TO_BATCH_ND", [x, np.array([2, 2]), np.zeros((2, 2), np.int32)], {"pad_value": 0})[0]
    assert y.shape == (4, 2, 2, 1)
    # batch b = (row offset, column offset) of the block: b=1 holds x[0::2, 1::2]
    np.testing.assert_array_equal(y[1, :, :, 0], x[0, 0::2, 1::2, 0])
    np.testing.assert_array_equal(y[2, :, :, 0], x[0, 1::2, 0::2, 0])
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 4, 2)).astype(np.float32)
    block, pads = np.array([2, 3]), np.array([[1, 0], [1, 1]])
    y = run("SPACE_TO_BATCH_ND", [x, block, pads], {"pad_value": 0})[0]
    assert y.shape == infer("SPACE_TO_BATCH_ND", [unknown(x.shape, np.float32), block, pads], {})[0].shape
    assert y.shape == (12, 2, 2, 2)
    back = run("BATCH_TO_SPACE_ND", [y, block, pads], {})[0]
    np.testing.assert_array_equal(back, x)
    with pytest.raises(ModelFormatError, match="divisible"):
        infer("SPACE_TO_BATCH_ND", [unknown((1, 3, 4, 1), np.float32), np.array([2, 2]), np.zeros((2, 2))], {})


def test_every_op_here_has_conformance_cases():
    from litegpu.testing.cases.shape import CASES
    covered = {c.op for c in CASES}
    assert set(SHAPE_OPS) <= covered, sorted(set(SHAPE_OPS) - covered)
