"""Control flow and variables bound into their caller's program once its arrays settle:
IF and WHILE as rows of one plan (jumps, copies, an iteration count), resource variables
as bound calls that hand the node back when a variable changes shape."""
from __future__ import annotations

import numpy as np
import pytest

import litegpu
from litegpu.testing.builder import ModelBuilder
from litegpu_cpu.kernels.tasks import (COPY, COUNT_DOWN, JUMP, JUMP_IF_FALSE, SET, STOP_IF_SET, Check, control_row,
                                       is_plan, plan_call)


def table(*rows) -> np.ndarray:
    return np.concatenate(rows)


def test_control_rows_branch_copy_and_count_down():
    """JUMP_IF_FALSE skips the rows it jumps over only when the flag is false; COUNT_DOWN
    stops the table and sets its word once the count goes below zero."""
    src, dst = np.arange(5, dtype=np.float32), np.zeros(5, np.float32)
    other = np.zeros(5, np.float32)
    flag = np.zeros(1, np.bool_)
    words = np.array([0, 0, 2], np.int64)   # count, its check word, the start count
    a = lambda arr: arr.ctypes.data   # noqa: E731
    rows = table(control_row(SET, a(words), a(words) + 16),
                 control_row(JUMP_IF_FALSE, a(flag), 2),          # false: skip the next row
                 control_row(COPY, a(src), a(dst), src.nbytes),
                 control_row(COPY, a(src), a(other), 8),          # two floats
                 control_row(COUNT_DOWN, a(words), a(words) + 8),
                 control_row(COUNT_DOWN, a(words), a(words) + 8),
                 control_row(STOP_IF_SET, a(words) + 8),
                 control_row(JUMP, 0, 2),
                 control_row(COPY, a(src), a(dst), 4))             # jumped over
    call = plan_call(rows, (src, dst, other, flag, words), (Check((words, 1, lambda p: ValueError("limit"))),))
    call()
    np.testing.assert_array_equal(dst, 0)
    np.testing.assert_array_equal(other, [0, 1, 0, 0, 0])
    assert words[0] == 0 and words[1] == 0
    flag[0] = True
    words[2] = 1   # now the second COUNT_DOWN goes below zero: the plan stops and raises
    with pytest.raises(ValueError, match="limit"):
        call()
    np.testing.assert_array_equal(dst, src)
    assert words[1] == 0   # the check reset its word


# -- IF ------------------------------------------------------------------------------------------

def _adding_branch(mb: ModelBuilder):
    """The then branch of both IF models here: ``y = x + w``, [4] each."""
    then = mb.subgraph("then")
    tx, tw = then.input("x", (4,)), then.input("w", (4,))
    ty = then.tensor("y", (4,))
    then.op("ADD", [tx, tw], [ty])
    then.output(ty)
    return then


def if_model() -> bytes:
    """y = IF(sum(x) > 0, x, w) + x: the then branch adds w, the else branch passes x
    through unchanged (its output is its input: a copy)."""
    mb = ModelBuilder()
    then = _adding_branch(mb)
    other = mb.subgraph("else")
    ox = other.input("x", (4,))
    other.input("w", (4,))
    other.output(ox)
    x = mb.input("x", (4,))
    total, flag = mb.tensor("total", ()), mb.tensor("flag", (), np.bool_)
    mb.op("SUM", [x, mb.const("axis", np.array([0], np.int32))], [total], keep_dims=False)
    mb.op("GREATER", [total, mb.const("zero", np.array(0, np.float32))], [flag])
    chosen, y = mb.tensor("chosen", (4,)), mb.tensor("y", (4,))
    mb.op("IF", [flag, x, mb.const("w", np.array([1, 2, 3, 4], np.float32))], [chosen],
          then_subgraph_index=then.index, else_subgraph_index=other.index)
    mb.op("ADD", [chosen, x], [y])
    mb.output(y)
    return mb.build()


def run(interp, x):
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    return interp.get_tensor(interp.get_output_details()[0]["index"])


def test_if_bound_as_a_plan_takes_both_branches_like_litert():
    import ai_edge_litert.interpreter as litert
    model = if_model()
    ours, theirs = litegpu.Interpreter(model_content=model), litert.Interpreter(model_content=model)
    for interp in (ours, theirs):
        interp.allocate_tensors()
    rng = np.random.default_rng(7)
    for step in range(8):   # the first invoke runs step by step, later ones bound
        x = (rng.standard_normal(4) + (2 if step % 3 else -2)).astype(np.float32)
        np.testing.assert_array_equal(run(ours, x), run(theirs, x))
    # Both branches give [4], so the IF's output is static and the subgraph binds as a
    # whole: SUM, GREATER, IF and ADD chained into one plan.
    (step,) = ours._compiled._bound.steps
    assert is_plan(step.call) and {ctx.node.op for ctx in step.nodes} == {"SUM", "GREATER", "IF", "ADD"}


def test_an_if_whose_branches_agree_on_shapes_has_static_outputs():
    """Both branches of :func:`if_model` give float32 [4]: the IF's output is planned with
    that shape, so the subgraph has no run-time shapes and binds as a whole."""
    ours = litegpu.Interpreter(model_content=if_model())
    ours.allocate_tensors()
    (chosen,) = [d for d in ours.get_tensor_details() if d["name"] == "chosen"]
    assert tuple(chosen["shape"]) == (4,)
    run(ours, np.ones(4, np.float32))
    assert ours._compiled._bound


def disagreeing_if_model() -> bytes:
    """IF(x[0] > 0, x, w) -> y, the then branch giving x + w ([4]), the else branch a
    constant [2]: y's shape is known only when the IF has run."""
    mb = ModelBuilder()
    then = _adding_branch(mb)
    other = mb.subgraph("else")
    other.input("x", (4,))
    other.input("w", (4,))
    other.output(other.const("pair", np.array([5, 6], np.float32)))
    x = mb.input("x", (4,))
    first, flag = mb.tensor("first", (1,)), mb.tensor("flag", (1,), np.bool_)
    mb.op("SLICE", [x, mb.const("begin", np.array([0], np.int32)), mb.const("size", np.array([1], np.int32))],
          [first])
    mb.op("GREATER", [first, mb.const("zero", np.array(0, np.float32))], [flag])
    y = mb.tensor("y", (4,))
    mb.op("IF", [flag, x, mb.const("w", np.array([1, 2, 3, 4], np.float32))], [y],
          then_subgraph_index=then.index, else_subgraph_index=other.index)
    mb.output(y)
    return mb.build()


def test_an_if_whose_branches_disagree_keeps_run_time_shapes_like_litert():
    import ai_edge_litert.interpreter as litert
    model = disagreeing_if_model()
    ours, theirs = litegpu.Interpreter(model_content=model), litert.Interpreter(model_content=model)
    for interp in (ours, theirs):
        interp.allocate_tensors()
    for x0 in (1.0, -1.0, 2.0, -3.0):
        x = np.array([x0, 1, 2, 3], np.float32)
        got, want = run(ours, x), run(theirs, x)
        assert got.shape == want.shape == ((4,) if x0 > 0 else (2,))
        np.testing.assert_array_equal(got, want)
    assert not ours._compiled._bound


# -- variables ---------------------------------------------------------------------------------

def shared_variable_model() -> bytes:
    """Signature "set" assigns its input (resizable) to variable v; "get" reads v twice
    around an ADD."""
    mb = ModelBuilder()
    setter = mb.subgraph("set")
    value = setter.input("value", (3,), shape_signature=(-1,))
    sh = setter.tensor("h", (), "RESOURCE")
    setter.op("VAR_HANDLE", [], [sh], container="", shared_name="v")
    setter.op("ASSIGN_VARIABLE", [sh, value], [])
    x = mb.input("x", (1,))
    h = mb.tensor("h", (), "RESOURCE")
    mb.op("VAR_HANDLE", [], [h], container="", shared_name="v")
    v, y = mb.tensor("v", (3,), shape_signature=(-1,)), mb.tensor("y", (3,), shape_signature=(-1,))
    mb.op("READ_VARIABLE", [h], [v])
    mb.op("ADD", [v, x], [y])
    mb.output(y)
    mb.signature("get", {"x": x}, {"y": y}, 0)
    mb.signature("set", {"value": value}, {}, setter.index)
    return mb.build()


def test_a_variable_assigned_a_new_shape_is_read_at_that_shape():
    interp = litegpu.Interpreter(model_content=shared_variable_model())
    get, put = interp.get_signature_runner("get"), interp.get_signature_runner("set")
    one = np.ones(1, np.float32)
    put(value=np.arange(3, dtype=np.float32))
    for _ in range(3):   # bound after the first
        np.testing.assert_array_equal(get(x=one)["y"], [1, 2, 3])
    put(value=np.arange(5, dtype=np.float32))
    np.testing.assert_array_equal(get(x=one)["y"], [1, 2, 3, 4, 5])
    put(value=np.full(3, 7, np.float32))
    for _ in range(2):
        np.testing.assert_array_equal(get(x=one)["y"], [8, 8, 8])


def test_reading_a_variable_after_reset_is_an_error():
    interp = litegpu.Interpreter(model_content=shared_variable_model())
    get, put = interp.get_signature_runner("get"), interp.get_signature_runner("set")
    put(value=np.arange(3, dtype=np.float32))
    for _ in range(3):
        get(x=np.ones(1, np.float32))
    interp.reset_all_variables()
    with pytest.raises(litegpu.ExecutionError, match=r"READ_VARIABLE\): READ_VARIABLE of resource 0, which "
                                                     r"was never assigned"):
        get(x=np.ones(1, np.float32))
