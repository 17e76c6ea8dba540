"""Fused cpu kernels over int32 and bool values: int32 arithmetic wraps as numpy's does,
comparisons, logical ops and SELECT chain in one task function with float32 nodes, and
nodes they cannot take (an int32 op with a fused activation, SELECT's per-row
condition) are left alone."""
from __future__ import annotations

import numpy as np
import pytest

from litegpu.backend import NodeContext
from litegpu.graph import Node
from litegpu.ops import get_op
from litegpu.ops.registry import TensorSpec
from litegpu_cpu.fusion import fusable, make_fused_kernel, plan_group

F32, I32, BOOL = np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.bool_)


def node(index: int, op: str, inputs: list[TensorSpec], ins: tuple, out: int, shape, dtype,
         attrs: dict | None = None) -> NodeContext:
    n = Node(index=index, op=op, opcode=0, version=1, inputs=ins, outputs=(out,))
    return NodeContext(node=n, opdef=get_op(op), attrs=attrs or {}, inputs=inputs,
                       outputs=[TensorSpec(shape, dtype)])


@pytest.mark.parametrize("shape", [(), (7,), (3, 5), (2, 3, 40)], ids=str)
def test_int_bool_float_chain_matches_the_references(shape):
    """i + 2**30 (wraps), * j (wraps), max with a constant, < a per-channel limit, AND a
    bool input, then SELECT between two float32 inputs, and a float EQUAL: one kernel."""
    rng = np.random.default_rng(len(shape))
    c = shape[-1] if shape else 1
    i = rng.integers(-2**31, 2**31 - 1, shape, dtype=np.int64).astype(np.int32)
    j = rng.integers(-9, 9, shape).astype(np.int32)
    flags = rng.random(shape) < 0.7
    x, y = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    limit = rng.integers(-2**31, 2**31 - 1, (c,) if shape else (), dtype=np.int64).astype(np.int32)
    big, floor = np.array(2**30, np.int32), np.array(-5, np.int32)
    full = {d: TensorSpec(shape, d) for d in (F32, I32, BOOL)}
    none = {"activation": "NONE"}
    nodes = [
        node(0, "ADD", [full[I32], TensorSpec((), I32, value=big)], (0, 1), 2, shape, I32, none),
        node(1, "MUL", [full[I32], full[I32]], (2, 3), 4, shape, I32, none),
        node(2, "MAXIMUM", [full[I32], TensorSpec((), I32, value=floor)], (4, 5), 6, shape, I32),
        node(3, "LESS", [full[I32], TensorSpec(limit.shape, I32, value=limit)], (6, 7), 8, shape, BOOL),
        node(4, "LOGICAL_AND", [full[BOOL], full[BOOL]], (8, 9), 10, shape, BOOL),
        node(5, "SELECT_V2", [full[BOOL], full[F32], full[F32]], (10, 11, 12), 13, shape, F32),
        node(6, "EQUAL", [full[F32], full[F32]], (13, 11), 14, shape, BOOL),
    ]
    assert all(map(fusable, nodes))
    group = plan_group(nodes, {6, 13, 14})
    assert group is not None and group.inputs == [0, 3, 9, 11, 12]
    outs = [np.full(shape, 99, I32), np.full(shape, np.nan, F32), np.zeros(shape, BOOL)]
    make_fused_kernel(group)([i, j, flags, x, y], outs)
    ref = {n.node.op: get_op(n.node.op).reference for n in nodes}
    v2 = ref["ADD"]([i, big], none)[0]
    v4 = ref["MUL"]([v2, j], none)[0]
    v6 = ref["MAXIMUM"]([v4, floor], {})[0]
    v8 = ref["LESS"]([v6, limit], {})[0]
    v10 = ref["LOGICAL_AND"]([v8, flags], {})[0]
    v13 = ref["SELECT_V2"]([v10, x, y], {})[0]
    v14 = ref["EQUAL"]([v13, x], {})[0]
    for out, want in zip(outs, (v6, v13, v14)):
        assert out.dtype == want.dtype
        np.testing.assert_array_equal(out, want)


def test_nodes_the_generator_cannot_take_are_left_alone():
    i3 = TensorSpec((4, 3), I32)
    assert not fusable(node(0, "ADD", [i3, i3], (0, 1), 2, (4, 3), I32, {"activation": "RELU"}))
    assert not fusable(node(0, "DIV", [i3, i3], (0, 1), 2, (4, 3), I32, {"activation": "NONE"}))
    b3, f3 = TensorSpec((4, 3), BOOL), TensorSpec((4, 3), F32)
    assert not fusable(node(0, "LESS", [b3, b3], (0, 1), 2, (4, 3), BOOL))   # bool order: not a kernel here
    # SELECT (TF1) with a rank-1 condition picks whole rows: not an elementwise broadcast.
    assert not fusable(node(0, "SELECT", [TensorSpec((4,), BOOL), f3, f3], (0, 1, 2), 3, (4, 3), F32))
    assert fusable(node(0, "SELECT", [b3, f3, f3], (0, 1, 2), 3, (4, 3), F32))
    assert fusable(node(0, "LOGICAL_NOT", [b3], (0,), 1, (4, 3), BOOL))
