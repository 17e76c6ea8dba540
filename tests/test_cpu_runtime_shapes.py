"""A cpu partition with run-time-shaped steps (control flow, shapes read from a tensor):
its first run binds every step, later runs replay the bindings, results stay right when a
branch is taken the other way, and a changed shape binds again."""
from __future__ import annotations

import numpy as np

import litegpu
from litegpu.testing.builder import ModelBuilder
from litegpu_cpu.backend import CpuProgram
from litegpu_cpu.kernels.tasks import is_plan


def reshape_model(add_constant: bool = False) -> bytes:
    """``z = r + r`` (or ``r + ones((3, 2))``, which broadcasts only at that shape) with
    ``r = RESHAPE(x, s)`` (``s`` an input, so shaped at run time) and ``w = x * x``
    (static) in one partition."""
    b = ModelBuilder()
    x = b.input("x", (2, 3))
    s = b.input("s", (2,), np.int32)
    r = b.tensor("r", (3, 2), shape_signature=(-1, -1))
    b.op("RESHAPE", [x, s], [r])
    z = b.tensor("z", (3, 2), shape_signature=(-1, -1))
    b.op("ADD", [r, b.const("c", np.ones((3, 2), np.float32)) if add_constant else r], [z])
    w = b.tensor("w", (2, 3))
    b.op("MUL", [x, x], [w])
    b.output(z, w)
    return b.build()


def if_model() -> bytes:
    """``y = IF(c, x)``: ``x * 2`` or ``-x``, then ``y + x`` after the IF."""
    b = ModelBuilder()
    then = b.subgraph("then")
    tx = then.input("x", (3,))
    ty = then.tensor("y", (3,))
    then.op("MUL", [tx, then.const("two", np.full(3, 2, np.float32))], [ty])
    then.output(ty)
    other = b.subgraph("else")
    ex = other.input("x", (3,))
    ey = other.tensor("y", (3,))
    other.op("NEG", [ex], [ey])
    other.output(ey)
    c, x = b.input("c", (), np.bool_), b.input("x", (3,))
    y = b.tensor("y", (3,))
    b.op("IF", [c, x], [y], then_subgraph_index=then.index, else_subgraph_index=other.index)
    out = b.tensor("out", (3,))
    b.op("ADD", [y, x], [out])
    b.output(out)
    return b.build()


def programs(interp: litegpu.Interpreter) -> list[CpuProgram]:
    return [p for p, _, _ in interp._compiled.programs if isinstance(p, CpuProgram) and not p.static]


def test_if_alternating_branches_on_the_bound_program():
    interp = litegpu.Interpreter(model_content=if_model())
    interp.allocate_tensors()
    c, x = (d["index"] for d in interp.get_input_details())
    (out,) = (d["index"] for d in interp.get_output_details())
    rng = np.random.default_rng(0)
    kept, bindings = [], set()
    for n in range(12):
        xv = rng.standard_normal(3).astype(np.float32)
        flag = n % 3 == 0
        interp.set_tensor(c, np.array(flag))
        interp.set_tensor(x, xv)
        interp.invoke()
        got = interp.get_tensor(out)
        np.testing.assert_allclose(got, (xv * 2 if flag else -xv) + xv, rtol=1e-6)
        kept.append((got, got.copy()))
        bindings.add(id(interp._compiled._bound))
    # Earlier results are the caller's copies: later runs, which write in place, leave them be.
    for got, copy in kept:
        np.testing.assert_array_equal(got, copy)
    # Both branches give [3]: the IF's output is static, and the IF is bound over both
    # branches with the nodes around it, one plan; taking the other branch does not bind again.
    assert not programs(interp)
    (step,) = interp._compiled._bound.steps
    assert len(bindings) == 1 and is_plan(step.call)


def test_a_changed_run_time_shape_binds_again_and_an_unchanged_one_replays():
    interp = litegpu.Interpreter(model_content=reshape_model())
    interp.allocate_tensors()
    x, s = (d["index"] for d in interp.get_input_details())
    z, w = (d["index"] for d in interp.get_output_details())
    rng = np.random.default_rng(1)
    shapes = [(3, 2), (3, 2), (3, 2), (2, 3), (2, 3), (6, 1), (1, 6)] * 4
    replays = []
    for n, shape in enumerate(shapes):
        xv = rng.standard_normal((2, 3)).astype(np.float32)
        interp.set_tensor(x, xv)
        interp.set_tensor(s, np.array(shape, np.int32))
        interp.invoke()
        np.testing.assert_allclose(interp.get_tensor(z), (xv + xv).reshape(shape), rtol=1e-6)
        np.testing.assert_allclose(interp.get_tensor(w), xv * xv, rtol=1e-6)
        (program,) = programs(interp)
        replays.append(program._replay)
    for n in range(1, len(shapes)):
        assert (replays[n] is replays[n - 1]) == (shapes[n] == shapes[n - 1]), n


def test_error_in_a_bound_run_names_the_node():
    """A failing step on the bound path raises the litegpu error naming its node, as the
    step-by-step path does."""
    interp = litegpu.Interpreter(model_content=reshape_model())
    interp.allocate_tensors()
    x, s = (d["index"] for d in interp.get_input_details())
    interp.set_tensor(x, np.ones((2, 3), np.float32))
    interp.set_tensor(s, np.array((3, 2), np.int32))
    interp.invoke()
    interp.invoke()
    interp.set_tensor(s, np.array((4, 2), np.int32))   # 8 elements from 6
    try:
        interp.invoke()
    except litegpu.LiteGpuError as exc:
        assert "RESHAPE" in str(exc)
    else:
        raise AssertionError("a RESHAPE to the wrong element count ran")
    interp.set_tensor(s, np.array((1, 6), np.int32))
    interp.invoke()
    np.testing.assert_allclose(interp.get_tensor(interp.get_output_details()[0]["index"]), np.full((1, 6), 2.0))


def test_error_after_a_shape_change_names_its_own_node_once():
    """A shape change on the bound path hands the rest of the run to the step-by-step
    path; an error there is reported once, naming the node that failed."""
    interp = litegpu.Interpreter(model_content=reshape_model(add_constant=True))
    interp.allocate_tensors()
    xi, si = (d["index"] for d in interp.get_input_details())
    interp.set_tensor(xi, np.ones((2, 3), np.float32))
    for shape in ((3, 2), (3, 2), (3, 2)):
        interp.set_tensor(si, np.array(shape, np.int32))
        interp.invoke()
    interp.set_tensor(si, np.array((2, 3), np.int32))
    try:
        interp.invoke()
    except litegpu.LiteGpuError as exc:
        message = str(exc)
    else:
        raise AssertionError("ADD of (2, 3) and (3, 2) ran")
    assert message.startswith("node 1 (ADD): ") and message.count("node ") == 1, message
