"""Fast unit tests of the elementwise and reduction op definitions: attribute
normalization and its errors, shape inference, and reference semantics where LiteRT
differs from plain numpy (checked against LiteRT by the conformance cases)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from litegpu.errors import ExecutionError, ModelFormatError, UnsupportedError
from litegpu.graph import Node, Tensor
from litegpu.ops import DynamicShape, TensorSpec, get_op, registry
from litegpu.ops.elementwise import binary, cast_like_litert, unary

F32, I32, I64, BOOL = np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.bool_)


def make_node(op: str, inputs: list, outputs: list, **options) -> tuple[Node, list[Tensor]]:
    """A node over fresh tensors; each spec is ``(shape, dtype)`` or ``(shape, dtype, value)``."""
    tensors = []
    for spec in inputs + outputs:
        shape, dtype = spec[0], np.dtype(spec[1])
        data = np.asarray(spec[2], dtype) if len(spec) > 2 else None
        tensors.append(Tensor(index=len(tensors), name=f"t{len(tensors)}", dtype=dtype, shape=tuple(shape),
                              shape_signature=tuple(shape), stored=data))
    n_in = len(inputs)
    node = Node(index=7, op=op, opcode=0, version=1, inputs=tuple(range(n_in)),
                outputs=tuple(range(n_in, len(tensors))), options=options)
    return node, tensors


def attrs_of(op: str, inputs: list, outputs: list | None = None, **options) -> dict:
    node, tensors = make_node(op, inputs, outputs or [((1,), F32)], **options)
    return get_op(op).node_attrs(node, tensors)


def infer(op: str, specs: list[TensorSpec], attrs: dict | None = None) -> list[TensorSpec]:
    return get_op(op).infer(specs, attrs or {})


def spec(shape, dtype=F32, value=None) -> TensorSpec:
    return TensorSpec(tuple(shape), np.dtype(dtype), None if value is None else np.asarray(value))


def run(op: str, inputs: list, attrs: dict | None = None) -> np.ndarray:
    return get_op(op).reference([np.asarray(x) for x in inputs], attrs or {})[0]


# -- attributes ------------------------------------------------------------------------

@pytest.mark.parametrize("code,expected", [(0, "NONE"), (1, "RELU"), (2, "RELU_N1_TO_1"), (3, "RELU6"),
                                           (4, "NONE"), (5, "NONE")])
def test_fused_activation_is_normalized_to_a_clamp(code, expected):
    # LiteRT applies fused activations of ADD/SUB/MUL/DIV as a clamp range; TANH and
    # SIGN_BIT have none, so they must not be applied.
    a = attrs_of("ADD", [((2,), F32), ((2,), F32)], fused_activation_function=code)
    assert a == {"activation": expected}


def test_unknown_fused_activation_names_node():
    with pytest.raises(ModelFormatError, match=r"node 7 \(MUL\).*activation"):
        attrs_of("MUL", [((2,), F32), ((2,), F32)], fused_activation_function=42)


@pytest.mark.parametrize("op,n", [("ADD", 1), ("SUB", 3), ("EXP", 2), ("SELECT", 2), ("MEAN", 1), ("SOFTMAX", 0)])
def test_wrong_input_count(op, n):
    with pytest.raises(ModelFormatError, match="expects"):
        attrs_of(op, [((2,), F32)] * n)


@pytest.mark.parametrize("op,dtype", [("EXP", I32), ("LOG", I64), ("TANH", I32), ("LOGICAL_AND", F32),
                                      ("DIV", I64), ("POW", I64), ("SOFTMAX", I32), ("ROUND", I32)])
def test_unsupported_dtypes(op, dtype):
    n = 2 if op in ("LOGICAL_AND", "DIV", "POW") else 1
    with pytest.raises(UnsupportedError, match=np.dtype(dtype).name):
        attrs_of(op, [((3,), dtype)] * n)


def test_binary_inputs_must_share_dtype():
    with pytest.raises(ModelFormatError, match="different dtypes"):
        attrs_of("ADD", [((3,), F32), ((3,), I32)])


def test_option_attrs():
    assert attrs_of("SOFTMAX", [((2, 3), F32)], beta=0.25) == {"beta": 0.25}
    assert attrs_of("LEAKY_RELU", [((2,), F32)], alpha=0.5) == {"alpha": 0.5}
    assert attrs_of("GELU", [((2,), F32)], approximate=True) == {"approximate": True}
    assert attrs_of("GELU", [((2,), F32)]) == {"approximate": False}
    assert attrs_of("SUM", [((2, 3), F32), ((1,), I32, [1])], keep_dims=True) == {"keep_dims": True}
    assert attrs_of("CUMSUM", [((2, 3), F32), ((), I32, 1)], exclusive=True) == {"exclusive": True,
                                                                               "reverse": False}


def test_cast_reads_output_dtype():
    a = attrs_of("CAST", [((2,), F32)], [((2,), I64)])
    assert a == {"out_dtype": I64}
    assert infer("CAST", [spec((4, 2))], a)[0].dtype == I64


def test_arg_max_output_type():
    assert attrs_of("ARG_MAX", [((2, 3), F32), ((1,), I32, [1])], [((2,), I64)], output_type=4) == {"out_dtype": I64}
    with pytest.raises(ModelFormatError, match="output_type"):
        attrs_of("ARG_MIN", [((2, 3), F32), ((1,), I32, [1])], [((2,), I64)], output_type=0)


def test_l2_normalization_refuses_activation():
    with pytest.raises(UnsupportedError, match="RELU"):
        attrs_of("L2_NORMALIZATION", [((2, 3), F32)], fused_activation_function=1)


# -- shape inference -------------------------------------------------------------------

@pytest.mark.parametrize("a,b,out", [((2, 3, 4), (), (2, 3, 4)), ((1, 4, 4, 8), (8,), (1, 4, 4, 8)),
                                     ((2, 1, 4), (3, 1), (2, 3, 4)), ((5,), (2, 1, 1, 1, 1, 5), (2, 1, 1, 1, 1, 5))])
def test_binary_broadcast_shapes(a, b, out):
    assert infer("ADD", [spec(a), spec(b)])[0].shape == out
    got = infer("LESS", [spec(a), spec(b)])[0]
    assert (got.shape, got.dtype) == (out, BOOL)


def test_binary_shapes_that_do_not_broadcast():
    with pytest.raises(ModelFormatError, match="broadcast"):
        infer("MUL", [spec((2, 3)), spec((4,))])


def test_select_v1_rules():
    assert infer("SELECT", [spec((4,), BOOL), spec((4, 3)), spec((4, 3))])[0].shape == (4, 3)
    assert infer("SELECT", [spec((), BOOL), spec((4, 3)), spec((4, 3))])[0].shape == (4, 3)
    with pytest.raises(ModelFormatError, match="condition"):
        infer("SELECT", [spec((3,), BOOL), spec((4, 3)), spec((4, 3))])  # TF1 rule: dim 0, not the last
    with pytest.raises(ModelFormatError, match="same shape"):
        infer("SELECT", [spec((4, 3), BOOL), spec((4, 3)), spec((1, 3))])


def test_select_v2_broadcasts_all_three():
    assert infer("SELECT_V2", [spec((2, 1, 4), BOOL), spec((1, 3, 1)), spec((3, 4))])[0].shape == (2, 3, 4)


def test_prelu_alpha_may_not_grow_the_output():
    assert infer("PRELU", [spec((1, 4, 4, 3)), spec((1, 1, 3))])[0].shape == (1, 4, 4, 3)
    with pytest.raises(ModelFormatError, match="alpha"):
        infer("PRELU", [spec((4, 3)), spec((2, 4, 3))])


def test_add_n_requires_equal_shapes():
    assert infer("ADD_N", [spec((2, 3))] * 3)[0].shape == (2, 3)
    with pytest.raises(ModelFormatError, match="ADD_N input 1"):
        infer("ADD_N", [spec((2, 3)), spec((1, 3))])


@pytest.mark.parametrize("axes,keep,out", [([1, 2], False, (2, 5)), ([1, 2], True, (2, 1, 1, 5)),
                                           (-1, False, (2, 3, 4)), ([0, -4, 3], False, (3, 4)),
                                           (np.zeros(0, np.int32), False, (2, 3, 4, 5))])
def test_reduction_shapes(axes, keep, out):
    got = infer("MEAN", [spec((2, 3, 4, 5)), spec(np.shape(axes), I32, axes)], {"keep_dims": keep})[0]
    assert (got.shape, got.dtype) == (out, F32)


def test_reduction_needs_known_axes():
    with pytest.raises(DynamicShape):
        infer("SUM", [spec((2, 3)), spec((1,), I32)], {"keep_dims": False})


def test_reduction_axis_out_of_range():
    with pytest.raises(ModelFormatError, match="axis 2"):
        infer("REDUCE_MAX", [spec((2, 3)), spec((1,), I32, [2])], {"keep_dims": False})


def test_arg_max_shape():
    got = infer("ARG_MAX", [spec((2, 3, 4)), spec((1,), I32, [-2])], {"out_dtype": I64})[0]
    assert (got.shape, got.dtype) == ((2, 4), I64)


def test_rfft2d_shape():
    got = infer("RFFT2D", [spec((3, 5, 6)), spec((2,), I32, [8, 16])])[0]
    assert (got.shape, got.dtype) == ((3, 8, 9), np.dtype(np.complex64))
    with pytest.raises(UnsupportedError, match="powers of two"):
        infer("RFFT2D", [spec((5, 6)), spec((2,), I32, [8, 6])])
    with pytest.raises(DynamicShape):
        infer("RFFT2D", [spec((5, 6)), spec((2,), I32)])


def test_complex_parts_are_real():
    assert infer("COMPLEX_ABS", [spec((2,), np.complex64)])[0].dtype == F32
    assert infer("IMAG", [spec((2,), np.complex128)])[0].dtype == np.dtype(np.float64)


# -- reference semantics that differ from plain numpy ----------------------------------

def test_integer_division_family():
    a = np.array([-7, 7, -7, 7], np.int32)
    b = np.array([2, -2, -2, 2], np.int32)
    assert run("DIV", [a, b], {"activation": "NONE"}).tolist() == [-3, -3, 3, 3]  # truncates like C
    assert run("FLOOR_DIV", [a, b]).tolist() == [-4, -4, 3, 3]
    assert run("FLOOR_MOD", [a, b]).tolist() == [1, -1, -1, 1]
    with pytest.raises(ExecutionError, match="zero"):
        run("DIV", [a, np.array([1, 0, 1, 1], np.int32)], {"activation": "NONE"})
    with pytest.raises(ExecutionError, match="zero"):
        run("FLOOR_DIV", [a.astype(np.float32), np.zeros(4, np.float32)])


def test_float_floor_div_floors_the_quotient():
    # numpy's floor_divide(1, 0.1) is 9 (divmod-based); LiteRT computes floor(1 / 0.1) = 10.
    assert run("FLOOR_DIV", [np.float32([1.0]), np.float32([0.1])]).tolist() == [10.0]


def test_int_activation_is_applied():
    out = run("ADD", [np.int32([-5, 2, 9]), np.int32([1, 1, 1])], {"activation": "RELU6"})
    assert out.dtype == I32 and out.tolist() == [0, 3, 6]


def test_maximum_with_nan_prefers_second_operand():
    out = run("MAXIMUM", [np.float32([np.nan, 1.0]), np.float32([1.0, np.nan])])
    assert out[0] == 1.0 and np.isnan(out[1])


def test_cast_saturates_and_wraps():
    f = np.float32([np.nan, np.inf, -np.inf, -2.7, 2.7, 3e9])
    assert cast_like_litert(f, I32).tolist() == [2**31 - 1, 2**31 - 1, -2**31, -2, 2, 2**31 - 1]
    assert cast_like_litert(np.float32([-5.5, 300.0]), np.uint8).tolist() == [0, 255]
    assert cast_like_litert(np.int32([200, -129]), np.int8).tolist() == [-56, 127]
    assert cast_like_litert(np.float32([0.0, -0.5]), BOOL).tolist() == [False, True]
    assert cast_like_litert(np.complex64([3 + 4j]), F32).tolist() == [3.0]


def test_round_is_half_to_even():
    assert run("ROUND", [np.float32([0.5, 1.5, 2.5, -0.5, -1.5, 0.4])]).tolist() == [0, 2, 2, 0, -2, 0]


def test_gelu_exact_and_approximate():
    x = np.float32([-1.0, 0.5, 2.0])
    exact = [0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in x.tolist()]
    approx = [0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3))) for v in x.tolist()]
    np.testing.assert_allclose(run("GELU", [x], {"approximate": False}), exact, rtol=1e-6)
    np.testing.assert_allclose(run("GELU", [x], {"approximate": True}), approx, rtol=1e-6)
    assert not np.allclose(exact, approx, rtol=1e-6, atol=0)


def test_select_rank1_condition_picks_rows():
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    out = run("SELECT", [np.array([True, False, True]), x, -x])
    assert out.tolist() == [[0, 1], [-2, -3], [4, 5]]


def test_integer_mean_truncates_toward_zero():
    x = np.int32([[-7, -6, 5], [4, 3, -1]])
    assert run("MEAN", [x, np.int32([1])], {"keep_dims": False}).tolist() == [-2, 2]


def test_softmax_is_stable_and_normalized():
    x = np.float32([[1000.0, 1001.0, 999.0], [0.0, 0.0, 0.0]])
    y = run("SOFTMAX", [x], {"beta": 1.0})
    assert y.dtype == F32 and np.all(np.isfinite(y))
    np.testing.assert_allclose(y.sum(-1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(y[1], 1 / 3, rtol=1e-6)
    np.testing.assert_allclose(run("LOG_SOFTMAX", [x]), np.log(y), rtol=1e-5, atol=1e-6)


def test_l2_normalization_epsilon():
    y = run("L2_NORMALIZATION", [np.full((1, 4), 1e-8, np.float32)], {"epsilon": 1e-6})
    np.testing.assert_allclose(y, 1e-2, rtol=1e-5)  # norm 2e-8 is below epsilon 1e-6


def test_cumsum_variants():
    x = np.float32([[1, 2, 3], [4, 5, 6]])
    one = np.int32(1)
    assert run("CUMSUM", [x, one], {"exclusive": False, "reverse": False}).tolist() == [[1, 3, 6], [4, 9, 15]]
    assert run("CUMSUM", [x, one], {"exclusive": True, "reverse": True}).tolist() == [[5, 3, 0], [11, 6, 0]]


def test_arg_max_first_of_ties():
    x = np.int32([[1, 3, 3, 0], [2, 2, 1, 0]])
    assert run("ARG_MAX", [x, np.int32([1])], {"out_dtype": I64}).tolist() == [1, 0]
    assert run("ARG_MIN", [x, np.int32(0)], {"out_dtype": I32}).dtype == I32


# -- the helpers other op modules and plugins use ----------------------------------------

@pytest.fixture
def scratch_ops():
    names = []
    yield names
    for n in names:
        registry._REGISTRY.pop(n, None)


def test_unary_and_binary_helpers(scratch_ops):
    scratch_ops += ["LITEGPU_TEST_TWICE", "LITEGPU_TEST_HYPOT"]
    twice = unary("LITEGPU_TEST_TWICE", lambda x: x * 2)
    hyp = binary("LITEGPU_TEST_HYPOT", np.hypot, out_dtype=np.float64)
    assert get_op("LITEGPU_TEST_TWICE") is twice
    assert twice.reference([np.int32([1, 2])], {})[0].tolist() == [2, 4]
    out = hyp.reference([np.float32([3.0]), np.float32([4.0])], {})[0]
    assert out.dtype == np.float64 and out.tolist() == [5.0]
    assert hyp.infer([spec((2, 1)), spec((3,))], {})[0].shape == (2, 3)
