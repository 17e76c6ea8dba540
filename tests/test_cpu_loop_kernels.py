"""Cpu kernels and bindings that loop bodies lean on: SPLIT into outputs wherever the arena
lays them out (a task function), nodes after a WHILE or READ_VARIABLE (shaped at
run time) getting the kernels of static nodes once their shapes are known, and resource
variables whose read values later assignments leave alone."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import litegpu
from litegpu.backend import NodeContext
from litegpu.graph import Node
from litegpu.ops import get_op
from litegpu.ops.registry import TensorSpec
from litegpu.testing.builder import ModelBuilder
from litegpu_cpu.backend import _run_in_place
from litegpu_cpu.kernels import KERNELS
from litegpu_cpu.kernels.tasks import is_plan


def split_kernel(x_shape, axis: int, pieces: int, dtype=np.float32):
    inputs = [TensorSpec((), np.dtype(np.int32), np.array(axis, np.int32)), TensorSpec(x_shape, np.dtype(dtype))]
    ctx = NodeContext(node=Node(index=0, op="SPLIT", opcode=0, version=1, inputs=(0, 1), outputs=(2,)),
                      opdef=get_op("SPLIT"), attrs={"num_splits": pieces}, inputs=inputs,
                      outputs=get_op("SPLIT").infer(inputs, {"num_splits": pieces}))
    return KERNELS["SPLIT"](ctx)


@pytest.mark.parametrize("layout", ["consecutive", "gaps", "reversed", "scattered"])
def test_split_into_outputs_at_any_distance(layout):
    x = np.random.default_rng(1).standard_normal((2, 12)).astype(np.float32)
    kernel = split_kernel(x.shape, 1, 4)
    arena = np.full(200, np.nan, np.float32)
    offsets = {"consecutive": [0, 6, 12, 18], "gaps": [0, 10, 20, 30], "reversed": [30, 20, 10, 0],
               "scattered": [0, 7, 20, 40]}[layout]
    outs = [arena[o:o + 6].reshape(2, 3) for o in offsets]
    call = kernel.bind([np.array(1, np.int32), x], outs)
    call()
    for k, out in enumerate(outs):
        np.testing.assert_array_equal(out, x[:, 3 * k:3 * k + 3])
    x[...] = 5   # a bound call reads the arrays it was bound to on every call
    call()
    for out in outs:
        np.testing.assert_array_equal(out, 5)


@pytest.mark.parametrize("shape, axis, pieces, dtype", [((3, 4, 6), 1, 2, np.int32), ((8, 2), 0, 8, np.float32),
                                                      ((2, 3, 10), 2, 5, np.bool_), ((6,), 0, 3, np.int64)])
def test_split_of_any_dtype_axis_and_count(shape, axis, pieces, dtype):
    """Bytes are bytes: int and bool pieces, a leading axis, and more pieces than a task
    function has array slots (eight: the per-piece copies)."""
    x = (np.arange(np.prod(shape)) % 7).reshape(shape).astype(dtype)
    kernel = split_kernel(shape, axis, pieces, dtype)
    outs = [np.empty(p.shape, dtype) for p in np.split(x, pieces, axis=axis)]
    kernel.bind([np.array(axis, np.int32), x], outs)()
    for out, piece in zip(outs, np.split(x, pieces, axis=axis)):
        np.testing.assert_array_equal(out, piece)


def test_positional_output_binding_warns_for_no_ufunc():
    """Elementwise kernels bind their output by position (cheaper), except for maximum and
    minimum, for which NumPy deprecates that form."""
    for op, dtype in (("ADD", np.float32), ("MAXIMUM", np.float32), ("MINIMUM", np.int32), ("LESS", np.float32),
                      ("LOGICAL_AND", np.bool_)):
        a, b = np.array([1, 5], dtype), np.array([3, 2], dtype)
        spec = TensorSpec((2,), np.dtype(dtype))
        out_spec = get_op(op).infer([spec, spec], {})[0]
        ctx = NodeContext(node=Node(index=0, op=op, opcode=0, version=1, inputs=(0, 1), outputs=(2,)),
                          opdef=get_op(op), attrs={"activation": "NONE"}, inputs=[spec, spec],
                          outputs=[TensorSpec(tuple(out_spec.shape), np.dtype(out_spec.dtype))])
        out = np.zeros(2, out_spec.dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            KERNELS[op](ctx).bind([a, b], [out])()
        np.testing.assert_array_equal(out, get_op(op).reference([a, b], {"activation": "NONE"})[0])


# -- nodes after a run-time-shaped one ------------------------------------------------------

def loop_then_slice_model() -> bytes:
    """(i, x [4, 3]) -> while i < 3: (i + 1, x * 2); then x[1:3] and a FULLY_CONNECTED of it."""
    mb = ModelBuilder()
    cond = mb.subgraph("cond")
    ci = cond.input("i", (), np.int32)
    cond.input("x", (4, 3))
    flag = cond.tensor("flag", (), np.bool_)
    cond.op("LESS", [ci, cond.const("n", np.array(3, np.int32))], [flag])
    cond.output(flag)
    body = mb.subgraph("body")
    bi, bx = body.input("i", (), np.int32), body.input("x", (4, 3))
    ni, nx = body.tensor("ni", (), np.int32), body.tensor("nx", (4, 3))
    body.op("ADD", [bi, body.const("one", np.array(1, np.int32))], [ni])
    body.op("MUL", [bx, body.const("two", np.array(2, np.float32))], [nx])
    body.output(ni, nx)
    i, x = mb.input("i", (), np.int32), mb.input("x", (4, 3))
    oi, ox = mb.tensor("oi", (), np.int32), mb.tensor("ox", (4, 3))
    mb.op("WHILE", [i, x], [oi, ox], cond_subgraph_index=cond.index, body_subgraph_index=body.index)
    part = mb.tensor("part", (2, 3))
    bounds = [mb.const(name, np.array(v, np.int32)) for name, v in (("b", [1, 0]), ("e", [3, 3]), ("s", [1, 1]))]
    mb.op("STRIDED_SLICE", [ox, *bounds], [part])
    y = mb.tensor("y", (2, 5))
    w = np.arange(15, dtype=np.float32).reshape(5, 3) / 7
    mb.op("FULLY_CONNECTED", [part, mb.const("w", w), mb.const("bias", np.ones(5, np.float32))], [y])
    mb.output(y)
    return mb.build()


def test_nodes_after_a_loop_get_static_kernels():
    import ai_edge_litert.interpreter as litert
    model = loop_then_slice_model()
    ours, theirs = litegpu.Interpreter(model_content=model), litert.Interpreter(model_content=model)
    rng = np.random.default_rng(5)
    for _ in range(3):
        values = [np.array(rng.integers(0, 4), np.int32), rng.standard_normal((4, 3)).astype(np.float32)]
        results = []
        for interp in (ours, theirs):
            interp.allocate_tensors()
            for d, v in zip(interp.get_input_details(), values):
                interp.set_tensor(d["index"], v)
            interp.invoke()
            results.append(interp.get_tensor(interp.get_output_details()[0]["index"]))
        np.testing.assert_allclose(results[0], results[1], rtol=1e-5, atol=1e-6)
    # The WHILE is bound into the program as a plan (its loop written as table rows), the
    # nodes after it as the static kernels of their shapes, task functions that chain with
    # it: the run is one plan, nothing runs in place.
    program = ours._compiled.programs[0][0]
    kinds = [(step.nodes[0].node.op, is_plan(step.call), getattr(step.call, "func", None) is _run_in_place)
             for step in program._replay]
    assert kinds == [("WHILE", True, False)]


# -- resource variables ---------------------------------------------------------------------

def accumulator_model() -> bytes:
    """A variable initialised to zeros (CALL_ONCE); each invoke reads it, adds x, assigns
    the sum and reads again: outputs (before, after)."""
    mb = ModelBuilder()
    init = mb.subgraph("init")
    ih = init.tensor("h", (), "RESOURCE")
    init.op("VAR_HANDLE", [], [ih], container="", shared_name="acc")
    init.op("ASSIGN_VARIABLE", [ih, init.const("zeros", np.zeros(3, np.float32))], [])
    x = mb.input("x", (3,))
    mb.op("CALL_ONCE", [], [], init_subgraph_index=init.index)
    h = mb.tensor("h", (), "RESOURCE")
    mb.op("VAR_HANDLE", [], [h], container="", shared_name="acc")
    before, total, after = mb.tensor("before", (3,)), mb.tensor("total", (3,)), mb.tensor("after", (3,))
    mb.op("READ_VARIABLE", [h], [before])
    mb.op("ADD", [before, x], [total])
    mb.op("ASSIGN_VARIABLE", [h, total], [])
    mb.op("READ_VARIABLE", [h], [after])
    mb.output(before, after)
    return mb.build()


def test_a_read_value_outlives_the_next_assignment():
    import ai_edge_litert.interpreter as litert
    model = accumulator_model()
    ours, theirs = litegpu.Interpreter(model_content=model), litert.Interpreter(model_content=model)
    for interp in (ours, theirs):
        interp.allocate_tensors()
    for step in range(4):
        x = np.full(3, step + 1, np.float32)
        results = []
        for interp in (ours, theirs):
            interp.set_tensor(interp.get_input_details()[0]["index"], x)
            interp.invoke()
            results.append([interp.get_tensor(d["index"]) for d in interp.get_output_details()])
        for got, want in zip(*results):
            np.testing.assert_array_equal(got, want)
        total = sum(range(1, step + 2))
        np.testing.assert_array_equal(results[0][0], np.full(3, total - (step + 1), np.float32))
        np.testing.assert_array_equal(results[0][1], np.full(3, total, np.float32))
