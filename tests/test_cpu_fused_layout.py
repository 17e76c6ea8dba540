"""Fused cpu kernels loop over the output as [rows, cols]: operands broadcast along the
last dimension, scalars and full-size operands (constant or not) must land on the right
elements for any shape, and the ops added to the generated set (LEAKY_RELU, ELU, LOG,
SIN, COS, FLOOR, CEIL) must match their numpy references."""
from __future__ import annotations


import numpy as np
import pytest

from litegpu.backend import NodeContext
from litegpu.graph import Node
from litegpu.ops import get_op
from litegpu.ops.registry import TensorSpec
from litegpu_cpu.fusion import MAX_COLS, generate_alone, make_fused_kernel, plan_group
from litegpu_cpu.kernels import mathfn
from numba import njit

F32 = np.dtype(np.float32)


def node(index: int, op: str, inputs: list[TensorSpec], ins: tuple[int, ...], out: int, shape,
         attrs: dict | None = None) -> NodeContext:
    n = Node(index=index, op=op, opcode=0, version=1, inputs=ins, outputs=(out,))
    return NodeContext(node=n, opdef=get_op(op), attrs=attrs or {}, inputs=inputs, outputs=[TensorSpec(shape, F32)])


SHAPES = [(1, 96, 96, 16), (3, 5, 7), (2, 1), (1, 1, 5000), (7,), (4, 0, 3), (1, 3, 2, 1)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_prelu_then_bias_then_scalar_match_the_references(shape):
    """x + y (full), PRELU by a per-channel slope (constant, last dim), + a per-channel
    input, * a constant scalar: one kernel, against the references one after another."""
    rng = np.random.default_rng(sum(shape))
    c = shape[-1]
    x, y = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    slope_shape = (1, c) if len(shape) > 1 else (c,)
    slope = rng.standard_normal(slope_shape).astype(np.float32)
    bias = rng.standard_normal((c,)).astype(np.float32)
    scale = np.float32(0.75)
    full = TensorSpec(shape, F32)
    nodes = [
        node(0, "ADD", [full, full], (0, 1), 2, shape, {"activation": "NONE"}),
        node(1, "PRELU", [full, TensorSpec(slope_shape, F32, value=slope)], (2, 3), 4, shape),
        node(2, "ADD", [full, TensorSpec((c,), F32)], (4, 5), 6, shape, {"activation": "RELU6"}),
        node(3, "MUL", [full, TensorSpec((), F32, value=np.array(scale))], (6, 7), 8, shape,
             {"activation": "NONE"}),
    ]
    group = plan_group(nodes, {4, 8})
    assert group is not None and group.inputs == [0, 1, 5]
    assert group.rows * group.cols == x.size or x.size == 0
    out4, out8 = np.full(shape, np.nan, np.float32), np.full(shape, np.nan, np.float32)
    make_fused_kernel(group)([x, y, bias], [out4, out8])
    ref = [get_op(n.node.op).reference for n in nodes]
    v2 = ref[0]([x, y], {"activation": "NONE"})[0]
    v4 = ref[1]([v2, slope], {})[0]
    v6 = ref[2]([v4, bias], {"activation": "RELU6"})[0]
    v8 = ref[3]([v6, np.array(scale)], {"activation": "NONE"})[0]
    np.testing.assert_array_equal(out4, v4)
    np.testing.assert_array_equal(out8, v8)


def test_columns_follow_the_last_dimension_only_when_an_operand_needs_it():
    shape = (2, 8, 8, 16)
    full = TensorSpec(shape, F32)
    alone = plan_group([node(0, "LEAKY_RELU", [full], (0,), 1, shape, {"alpha": 0.2})], {1})
    assert alone.cols == 8 * 8 * 16 <= MAX_COLS and alone.rows == 2   # merged up to MIN_COLS, rows kept
    per_channel = plan_group([node(0, "ADD", [full, TensorSpec((16,), F32)], (0, 2), 1, shape,
                                   {"activation": "NONE"})], {1})
    assert per_channel.cols == 16 and per_channel.rows == 2 * 8 * 8


@pytest.mark.parametrize("op,attrs", [("LEAKY_RELU", {"alpha": 0.2}), ("LEAKY_RELU", {"alpha": -1.5}),
                                      ("ELU", {}), ("LOG", {}), ("SIN", {}), ("COS", {}), ("FLOOR", {}),
                                      ("CEIL", {})])
def test_generated_unary_ops_match_their_references(op, attrs):
    x = np.concatenate([np.linspace(-30, 30, 40_001, dtype=np.float32),
                        np.array([0, -0.0, 1e-30, -1e-30, 0.5, -0.5, 2.5, np.inf, -np.inf, np.nan], np.float32)])
    ctx = node(0, op, [TensorSpec(x.shape, F32)], (0,), 1, x.shape, attrs)
    assert generate_alone(ctx)
    out = np.full_like(x, 7)
    make_fused_kernel(plan_group([ctx], {1}))([x], [out])
    with np.errstate(all="ignore"):
        want = get_op(op).reference([x], attrs)[0]
    np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
    ok = ~np.isnan(want)
    # libm's logf (ours, and LiteRT's) and numpy's own SIMD version differ by up to an ulp or
    # two; SIN and COS are XNNPACK's rational fits, LiteRT's bits (tests/test_cpu_xnnpack_order.py),
    # within ~3e-7 of the true value.
    atol = 4e-7 if op in ("SIN", "COS") else 1e-37
    np.testing.assert_allclose(out[ok], want[ok], rtol=3e-7, atol=atol)


def test_fused_tanh_matches_the_reference_across_its_range():
    """TANH in a fused chain is mathfn's tanh32 (XNNPACK's rational fit on an FMA host, else
    tanh64 rounded; both vectorize), not libm: within a few float32 ulps of np.tanh
    everywhere, exact at 0, -0, +-inf, and NaN stays NaN."""
    x = np.concatenate([np.linspace(-30, 30, 60_001, dtype=np.float32),
                        np.logspace(-38, 1, 2_000, dtype=np.float32),
                        -np.logspace(-38, 1, 2_000, dtype=np.float32),
                        np.array([0, -0.0, 0.0625, -0.0625, np.inf, -np.inf, np.nan, 1e-45], np.float32)])
    spec = TensorSpec(x.shape, F32)
    chain = [node(0, "TANH", [spec], (0,), 1, x.shape), node(1, "MUL", [spec, spec], (1, 1), 2, x.shape)]
    group = plan_group(chain, {1, 2})
    assert "_tanh32" in group.source
    tanh, square = np.full_like(x, 7), np.full_like(x, 7)
    make_fused_kernel(group)([x], [tanh, square])
    want = np.tanh(x)
    np.testing.assert_array_equal(np.isnan(tanh), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_allclose(tanh[ok], want[ok], rtol=3e-7, atol=1e-44)
    np.testing.assert_array_equal(np.signbit(tanh[ok]), np.signbit(want[ok]))
    assert (tanh[np.isinf(x)] == np.sign(x[np.isinf(x)])).all()
    np.testing.assert_array_equal(square, tanh * tanh)


@pytest.mark.parametrize("shape,stat_shape", [((1, 64, 128), (1, 64, 1)), ((3, 5, 7), (3, 5, 1)),
                                              ((2, 1, 4, 6), (2, 1, 4, 1)), ((6, 9), (6, 1)), ((1, 4, 3), (4, 1))],
                         ids=str)
def test_row_operands_broadcast_along_their_row(shape, stat_shape):
    """LayerNorm's pattern: (x - mean) * inv with one mean and one inv per last-dimension
    row ([..., 1] operands, one an input and one a constant) fuse into one kernel that
    reads them per row, against the references one after another."""
    rng = np.random.default_rng(len(shape))
    x = rng.standard_normal(shape).astype(np.float32)
    mean = rng.standard_normal(stat_shape).astype(np.float32)
    inv = rng.standard_normal(stat_shape).astype(np.float32)
    full = TensorSpec(shape, F32)
    nodes = [node(0, "SUB", [full, TensorSpec(stat_shape, F32)], (0, 1), 2, shape, {"activation": "NONE"}),
             node(1, "MUL", [full, TensorSpec(stat_shape, F32, value=inv)], (2, 3), 4, shape, {"activation": "NONE"})]
    group = plan_group(nodes, {4})
    assert group is not None and group.cols == shape[-1]
    out = np.full(shape, np.nan, np.float32)
    make_fused_kernel(group)([x, mean], [out])
    v2 = get_op("SUB").reference([x, mean], {"activation": "NONE"})[0]
    np.testing.assert_array_equal(out, get_op("MUL").reference([v2, inv], {"activation": "NONE"})[0])


def test_an_operand_broadcast_along_more_than_the_last_dimension_is_not_a_row():
    """[3, 4, 1] against [2, 3, 4, 6] also repeats along the first dimension: not fused."""
    full = TensorSpec((2, 3, 4, 6), F32)
    sub = node(0, "SUB", [full, TensorSpec((3, 4, 1), F32)], (0, 1), 2, (2, 3, 4, 6), {"activation": "NONE"})
    assert plan_group([sub], {2}) is None


@njit
def _host_gelu(x, approximate):
    out = np.empty_like(x)
    for i in range(x.size):
        out[i] = mathfn.gelu_tanh32(x[i]) if approximate else mathfn.gelu32(x[i])
    return out


@pytest.mark.parametrize("approximate", [False, True])
def test_generated_gelu_is_the_standalone_kernel_s(approximate):
    """GELU in a generated kernel (so FC -> GELU -> FC chains) is the standalone kernel's
    float32 arithmetic to the bit (kernels.mathfn.gelu32 / gelu_tanh32: XNNPACK's where
    LiteRT runs it, else the accurate one; tests/test_cpu_float_act_fast.py checks both)."""
    x = np.concatenate([np.linspace(-14, 12, 20001), [0.0, -0.0, 1e-30, 50, -50, 1e30]]).astype(np.float32)
    spec = TensorSpec(x.shape, F32)
    gelu = node(0, "GELU", [spec], (0,), 1, x.shape, {"approximate": approximate})
    assert generate_alone(gelu)
    out = np.full_like(x, np.nan)
    make_fused_kernel(plan_group([gelu], {1}))([x], [out])
    np.testing.assert_array_equal(out.view(np.uint32), _host_gelu(x, approximate).view(np.uint32))


@pytest.mark.parametrize("shape,other", [((1, 64, 128), (64, 128)), ((1, 1, 3, 5), (3, 5)), ((2, 3), (1, 2, 3))],
                         ids=str)
def test_operand_with_leading_ones_is_full_size(shape, other):
    """An operand with the output's elements and fewer (or more, size-1) leading dimensions
    (BERT's [64, 128] position table added to [1, 64, 128] embeddings) is read element
    for element, constant or not."""
    rng = np.random.default_rng(len(shape))
    out_shape = np.broadcast_shapes(shape, other)
    x = rng.standard_normal(shape).astype(np.float32)
    for value in (None, rng.standard_normal(other).astype(np.float32)):
        y = value if value is not None else rng.standard_normal(other).astype(np.float32)
        nodes = [node(0, "ADD", [TensorSpec(shape, F32), TensorSpec(other, F32, value=value)], (0, 1), 2,
                      out_shape, {"activation": "NONE"})]
        group = plan_group(nodes, {2})
        assert group is not None
        out = np.full(out_shape, np.nan, np.float32)
        make_fused_kernel(group)([x] if value is not None else [x, y], [out])
        np.testing.assert_array_equal(out, x + y)


@pytest.mark.parametrize("shape, table", [((1, 4, 16, 16), (16, 16)), ((2, 2, 16, 128), (1, 1, 16, 128)),
                                          ((3, 5, 7), (5, 7)), ((2, 3, 4, 5), (1, 3, 4, 5))], ids=str)
def test_operands_repeating_over_leading_dimensions(shape, table):
    """A decoder's RoPE: x * cos - y * sin, the tables [T, D] over the heads of [1, H, T, D],
    one of them a constant; its mask added over batch and heads. One kernel, each table
    read at row ``r % period``, against the references."""
    rng = np.random.default_rng(len(shape))
    x, y = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    cos, sin = (rng.standard_normal(table).astype(np.float32) for _ in range(2))
    full = TensorSpec(shape, F32)
    nodes = [
        node(0, "MUL", [full, TensorSpec(table, F32)], (0, 1), 2, shape, {"activation": "NONE"}),
        node(1, "MUL", [full, TensorSpec(table, F32, value=sin)], (3, 4), 5, shape, {"activation": "NONE"}),
        node(2, "SUB", [full, full], (2, 5), 6, shape, {"activation": "NONE"}),
    ]
    group = plan_group(nodes, {6})
    assert group is not None and group.inputs == [0, 1, 3] and group.periods
    out = np.full(shape, np.nan, np.float32)
    make_fused_kernel(group)([x, cos, y], [out])
    np.testing.assert_array_equal(out, x * cos - y * sin)
