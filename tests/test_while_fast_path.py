"""WHILE loops run by the session over its compiled subgraphs' fixed arrays: values that
swap places or pass through unchanged, several invokes in a row, and results equal to a
plain Python loop and to LiteRT."""
from __future__ import annotations

import numpy as np
import pytest

import litegpu
from litegpu.testing.builder import ModelBuilder


def less_than_cond(mb: ModelBuilder, steps: int, *values: tuple, signatures: dict | None = None):
    """Add a loop condition over ``values`` (``(name, shape[, dtype])`` each, the first the
    int32 counter): counter < ``steps``. ``signatures``: shape signatures by name."""
    cond = mb.subgraph("cond")
    inputs = [cond.input(*value, shape_signature=(signatures or {}).get(value[0])) for value in values]
    flag = cond.tensor("flag", (), np.bool_)
    cond.op("LESS", [inputs[0], cond.const("steps", np.array(steps, np.int32))], [flag])
    cond.output(flag)
    return cond


def swap_model(steps: int, swap: bool = True) -> bytes:
    """(i, a, b, c) -> while i < steps: (i + 1, b, a + c, c) when ``swap`` (a and b change
    places: body output 1 is input 2's array, which the session must not take as output
    1's), else (i + 1, a + c, b, c); c (and b without swap) pass through unchanged."""
    mb = ModelBuilder()
    cond = less_than_cond(mb, steps, ("i", (), np.int32), ("a", (3,)), ("b", (3,)), ("c", (3,)))
    body = mb.subgraph("body")
    bi = body.input("i", (), np.int32)
    ba = body.input("a", (3,))
    bb = body.input("b", (3,))
    bc = body.input("c", (3,))
    ni = body.tensor("ni", (), np.int32)
    body.op("ADD", [bi, body.const("one", np.array(1, np.int32))], [ni])
    nb = body.tensor("nb", (3,))
    body.op("ADD", [ba, bc], [nb])
    for t in ((ni, bb, nb, bc) if swap else (ni, nb, bb, bc)):
        body.output(t)
    i = mb.input("i", (), np.int32)
    a = mb.input("a", (3,))
    b = mb.input("b", (3,))
    c = mb.input("c", (3,))
    outs = [mb.tensor(n, (), np.int32) if n == "oi" else mb.tensor(n, (3,)) for n in ("oi", "oa", "ob", "oc")]
    mb.op("WHILE", [i, a, b, c], outs, cond_subgraph_index=cond.index, body_subgraph_index=body.index)
    for t in outs:
        mb.output(t)
    return mb.build()


def expected(steps: int, a, b, c, swap: bool = True):
    i = 0
    while i < steps:
        i, a, b = (i + 1, b, a + c) if swap else (i + 1, a + c, b)
    return i, a, b, c


def invoke(interp, values):
    interp.allocate_tensors()
    for d, v in zip(interp.get_input_details(), values):
        interp.set_tensor(d["index"], v)
    interp.invoke()
    return [interp.get_tensor(d["index"]) for d in interp.get_output_details()]


@pytest.mark.parametrize("steps", [0, 1, 2, 7])
@pytest.mark.parametrize("swap", [True, False])
def test_swapping_and_pass_through_values(steps, swap):
    rng = np.random.default_rng(steps)
    a, b, c = (rng.standard_normal(3).astype(np.float32) for _ in range(3))
    interp = litegpu.Interpreter(model_content=swap_model(steps, swap))
    values = [np.array(0, np.int32), a, b, c]
    want = expected(steps, a, b, c, swap)
    # Twice: the second invoke reuses the cached loop and must start from the new inputs.
    for _ in range(2):
        got = invoke(interp, values)
        assert int(got[0]) == want[0]
        for g, w in zip(got[1:], want[1:]):
            np.testing.assert_allclose(g, w, rtol=1e-6)
    if steps >= 2:
        # Swapped values run on the subgraphs' own arrays (copied in and out each
        # iteration); the rest alternate between two sets of arrays.
        assert loop_kind(interp) == ("copying" if swap else "alternating")


def test_results_are_not_overwritten_by_the_next_invoke():
    interp = litegpu.Interpreter(model_content=swap_model(3))
    first = invoke(interp, [np.array(0, np.int32), np.ones(3, np.float32), np.zeros(3, np.float32),
                            np.ones(3, np.float32)])
    kept = [np.array(x) for x in first]
    invoke(interp, [np.array(0, np.int32), np.full(3, 5, np.float32), np.zeros(3, np.float32),
                    np.full(3, 2, np.float32)])
    for x, k in zip(first, kept):
        np.testing.assert_array_equal(x, k)


def test_matches_litert():
    import ai_edge_litert.interpreter as litert
    model = swap_model(5)
    values = [np.array(0, np.int32), np.arange(3, dtype=np.float32), np.ones(3, np.float32),
              np.full(3, 0.5, np.float32)]
    ours = invoke(litegpu.Interpreter(model_content=model), values)
    theirs = invoke(litert.Interpreter(model_content=model), values)
    for g, w in zip(ours, theirs):
        np.testing.assert_allclose(g, w, rtol=1e-6)


@pytest.mark.parametrize("swap", [True, False])
def test_iteration_limit_still_applies_on_the_fast_path(swap):
    interp = litegpu.Interpreter(model_content=swap_model(10_000, swap), limits=litegpu.Limits(max_while_iterations=50))
    values = [np.array(0, np.int32), np.ones(3, np.float32), np.ones(3, np.float32), np.ones(3, np.float32)]
    for _ in range(2):   # the second invoke enters the fast loop at once (compiled without swap)
        with pytest.raises(litegpu.ResourceLimitError, match="50 iterations"):
            invoke(interp, values)
    assert compiled(interp) is not swap   # values changing places keep to a slower loop


def test_later_invokes_enter_the_fixed_loop_at_once(monkeypatch):
    """Once a loop over fixed arrays exists, a WHILE starting from values of its shapes
    runs in it from the first iteration: any number of iterations (none included), with
    the iteration limit still counted from the first."""
    interp = litegpu.Interpreter(model_content=swap_model(6, swap=False),
                                 limits=litegpu.Limits(max_while_iterations=5))
    rng = np.random.default_rng(3)
    a, b, c = (rng.standard_normal(3).astype(np.float32) for _ in range(3))
    control = interp._session.control
    general = []
    call_subgraph = control.call_subgraph
    monkeypatch.setattr(control, "call_subgraph", lambda sg, values: (general.append(sg), call_subgraph(sg, values))[1])
    for start in (3, 6, 9, 2, 4):   # 3 iterations, none, none, 4, 2
        got = invoke(interp, [np.array(start, np.int32), a, b, c])
        want = expected(6 - start, a, b, c, swap=False)
        assert int(got[0]) == max(start, 6)
        for g, w in zip(got[1:], want[1:]):
            np.testing.assert_allclose(g, w, rtol=1e-6)
        # The first invoke's first iteration calls cond and body the general way; no other does.
        assert len(general) == 2
    (loop,) = control._loops.values()
    assert loop is not None
    with pytest.raises(litegpu.ResourceLimitError, match="5 iterations"):
        invoke(interp, [np.array(0, np.int32), a, b, c])


# -- the loop over two sets of arrays ----------------------------------------------------------

def litert_invoke(model: bytes, values):
    import ai_edge_litert.interpreter as litert
    return invoke(litert.Interpreter(model_content=model), values)


def assert_same(got, want) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert np.shape(g) == np.shape(w)
        np.testing.assert_allclose(g, w, rtol=1e-6)


def loop_kind(interp) -> str:
    """Which loop the session built for the model's one WHILE: "alternating", "copying" or
    "general" (every iteration through call_subgraph)."""
    (loop,) = interp._session.control._loops.values()
    if loop is None:
        return "general"
    return loop.kind


def compiled(interp) -> bool:
    """Whether the model's one WHILE runs as one compiled call (every step a task function)."""
    (loop,) = interp._session.control._loops.values()
    if loop is None:
        return False
    return loop.compiled


@pytest.mark.parametrize("steps", [2, 3, 8, 9])   # ends after an even and after an odd iteration
def test_alternating_loop_matches_litert(steps):
    """Values computed into two sets of arrays by turns, passed-through ones (b, c) in one."""
    model = swap_model(steps, swap=False)
    rng = np.random.default_rng(steps)
    interp = litegpu.Interpreter(model_content=model)
    for start in (0, 1, 0):   # the second and third invokes enter the loop at once
        values = [np.array(start, np.int32), *(rng.standard_normal(3).astype(np.float32) for _ in range(3))]
        got = invoke(interp, values)
        assert_same(got, litert_invoke(model, values))
        np.testing.assert_array_equal(got[2], values[2])   # passed through, bit for bit
        np.testing.assert_array_equal(got[3], values[3])
    assert loop_kind(interp) == "alternating"
    assert compiled(interp)   # an int32 ADD and LESS, a float ADD: all task functions


def test_alternating_loop_results_are_not_overwritten_by_the_next_invoke():
    interp = litegpu.Interpreter(model_content=swap_model(5, swap=False))
    control = interp._session.control
    first = invoke(interp, [np.array(0, np.int32), np.ones(3, np.float32), np.zeros(3, np.float32),
                            np.ones(3, np.float32)])
    # What the WHILE kernel returned, as the next nodes see it (the model's outputs are copies).
    kept = [np.array(x) for x in first]
    results = control.while_loop(1, 2, [np.array(0, np.int32), *(np.full(3, 9, np.float32) for _ in range(3))],
                                 100, lambda v, what: bool(v))
    again = control.while_loop(1, 2, [np.array(3, np.int32), *(np.full(3, 2, np.float32) for _ in range(3))],
                               100, lambda v, what: bool(v))
    np.testing.assert_array_equal(results[1], np.full(3, 9 + 5 * 9, np.float32))
    np.testing.assert_array_equal(again[1], np.full(3, 2 + 2 * 2, np.float32))
    for x, k in zip(first, kept):
        np.testing.assert_array_equal(x, k)


def grow_model(steps: int) -> bytes:
    """(i, x) -> while i < steps: (i + 1, concat(x, x)); then sum(x): x doubles in length
    on every iteration, so each iteration runs the body compiled for new shapes."""
    mb = ModelBuilder()
    cond = less_than_cond(mb, steps, ("i", (), np.int32), ("x", (1,)), signatures={"x": (-1,)})
    body = mb.subgraph("body")
    bi = body.input("i", (), np.int32)
    bx = body.input("x", (1,), shape_signature=(-1,))
    ni = body.tensor("ni", (), np.int32)
    body.op("ADD", [bi, body.const("one", np.array(1, np.int32))], [ni])
    nx = body.tensor("nx", (2,), shape_signature=(-1,))
    body.op("CONCATENATION", [bx, bx], [nx], axis=0)
    body.output(ni, nx)
    i = mb.input("i", (), np.int32)
    x = mb.input("x", (1,))
    oi = mb.tensor("oi", (), np.int32)
    ox = mb.tensor("ox", (1,), shape_signature=(-1,))
    mb.op("WHILE", [i, x], [oi, ox], cond_subgraph_index=cond.index, body_subgraph_index=body.index)
    total = mb.tensor("total", ())
    mb.op("SUM", [ox, mb.const("axis", np.array([0], np.int32))], [total])
    mb.output(oi, ox, total)
    return mb.build()


def test_loop_whose_shapes_change_every_iteration():
    model = grow_model(4)
    interp = litegpu.Interpreter(model_content=model)
    # 4, 4 again, then 2 iterations: the SUM after the loop sees a new shape.
    for start, x in ((0, 1.5), (0, -2.0), (2, 3.0)):
        values = [np.array(start, np.int32), np.array([x], np.float32)]
        assert_same(invoke(interp, values), litert_invoke(model, values))
    assert loop_kind(interp) == "general"


def flag_model(limit: int) -> bytes:
    """(go, i) -> while go: (i + 1 < limit, i + 1): the condition returns a loop value."""
    mb = ModelBuilder()
    cond = mb.subgraph("cond")
    go = cond.input("go", (), np.bool_)
    cond.input("i", (), np.int32)
    cond.output(go)
    body = mb.subgraph("body")
    body.input("go", (), np.bool_)
    bi = body.input("i", (), np.int32)
    ni = body.tensor("ni", (), np.int32)
    body.op("ADD", [bi, body.const("one", np.array(1, np.int32))], [ni])
    again = body.tensor("again", (), np.bool_)
    body.op("LESS", [ni, body.const("limit", np.array(limit, np.int32))], [again])
    body.output(again, ni)
    g = mb.input("go", (), np.bool_)
    i = mb.input("i", (), np.int32)
    og, oi = mb.tensor("og", (), np.bool_), mb.tensor("oi", (), np.int32)
    mb.op("WHILE", [g, i], [og, oi], cond_subgraph_index=cond.index, body_subgraph_index=body.index)
    mb.output(og, oi)
    return mb.build()


def test_condition_that_is_a_loop_value():
    model = flag_model(7)
    interp = litegpu.Interpreter(model_content=model)
    for go, start in ((True, 0), (True, 3), (False, 0), (True, 10)):
        values = [np.array(go), np.array(start, np.int32)]
        got = invoke(interp, values)
        assert_same(got, litert_invoke(model, values))
        assert int(got[1]) == (max(start + 1, 7) if go else start)
    assert loop_kind(interp) == "alternating"


def constant_output_model(steps: int) -> bytes:
    """(i, a) -> while i < steps: (i + 1, [1, 2, 3]): the body returns a constant."""
    mb = ModelBuilder()
    cond = less_than_cond(mb, steps, ("i", (), np.int32), ("a", (3,)))
    body = mb.subgraph("body")
    bi = body.input("i", (), np.int32)
    body.input("a", (3,))
    ni = body.tensor("ni", (), np.int32)
    body.op("ADD", [bi, body.const("one", np.array(1, np.int32))], [ni])
    body.output(ni, body.const("k", np.array([1, 2, 3], np.float32)))
    i, a = mb.input("i", (), np.int32), mb.input("a", (3,))
    oi, oa = mb.tensor("oi", (), np.int32), mb.tensor("oa", (3,))
    mb.op("WHILE", [i, a], [oi, oa], cond_subgraph_index=cond.index, body_subgraph_index=body.index)
    mb.output(oi, oa)
    return mb.build()


def test_body_returning_a_constant_keeps_to_the_copying_loop():
    model = constant_output_model(4)
    interp = litegpu.Interpreter(model_content=model)
    for start in (0, 5, 1):
        values = [np.array(start, np.int32), np.full(3, 7, np.float32)]
        assert_same(invoke(interp, values), litert_invoke(model, values))
    assert loop_kind(interp) == "copying"


def gather_model(steps: int) -> bytes:
    """(i, k, acc) -> while i < steps: (i + 1, k, acc + table[k]) over a table of 3 rows."""
    mb = ModelBuilder()
    cond = less_than_cond(mb, steps, ("i", (), np.int32), ("k", (), np.int32), ("acc", (2,)))
    body = mb.subgraph("body")
    bi = body.input("i", (), np.int32)
    bk = body.input("k", (), np.int32)
    acc = body.input("acc", (2,))
    ni = body.tensor("ni", (), np.int32)
    body.op("ADD", [bi, body.const("one", np.array(1, np.int32))], [ni])
    row = body.tensor("row", (2,))
    table = body.const("table", np.arange(6, dtype=np.float32).reshape(3, 2))
    body.op("GATHER", [table, bk], [row], axis=0)
    nacc = body.tensor("nacc", (2,))
    body.op("ADD", [acc, row], [nacc])
    body.output(ni, bk, nacc)
    i, k, a = mb.input("i", (), np.int32), mb.input("k", (), np.int32), mb.input("acc", (2,))
    oi, ok, oa = mb.tensor("oi", (), np.int32), mb.tensor("ok", (), np.int32), mb.tensor("oa", (2,))
    mb.op("WHILE", [i, k, a], [oi, ok, oa], cond_subgraph_index=cond.index, body_subgraph_index=body.index)
    mb.output(oi, ok, oa)
    return mb.build()


def test_kernel_error_in_the_loop_names_the_node():
    interp = litegpu.Interpreter(model_content=gather_model(3))
    start = [np.array(0, np.int32), np.array(1, np.int32), np.zeros(2, np.float32)]
    np.testing.assert_array_equal(invoke(interp, start)[2], [6, 9])   # 3 x row 1
    assert loop_kind(interp) == "alternating" and compiled(interp)
    # Row 3 of 3, gathered in the loop over fixed arrays (entered at once on this invoke).
    with pytest.raises(litegpu.ExecutionError, match=r"node 1 \(GATHER\): GATHER index 3 out of range"):
        invoke(interp, [np.array(0, np.int32), np.array(3, np.int32), np.zeros(2, np.float32)])
    # The loop is still usable afterwards.
    got = invoke(interp, [np.array(1, np.int32), np.array(2, np.int32), np.ones(2, np.float32)])
    np.testing.assert_array_equal(got[2], [9, 11])   # 1 + 2 x row 2


def test_call_depth_limit_applies_to_the_loop(monkeypatch):
    """The session's loop counts as a subgraph call. (A WHILE bound into its caller's
    plan after the first invoke calls no subgraph: nothing can nest there.)"""
    import litegpu.control_flow as control_flow
    interp = litegpu.Interpreter(model_content=swap_model(4, swap=False))
    values = [np.array(0, np.int32), *(np.ones(3, np.float32) for _ in range(3))]
    invoke(interp, values)
    assert loop_kind(interp) == "alternating"
    monkeypatch.setattr(control_flow, "_MAX_CALL_DEPTH", 0)
    with pytest.raises(litegpu.ResourceLimitError, match="nested deeper than 0"):
        interp._session.control.while_loop(1, 2, values, 100, lambda v, what: bool(v))


def test_profiled_loop_records_every_iteration():
    """Under a profiler every iteration goes through call_subgraph, whose runs record each
    node of the condition and the body; the results are those of the unprofiled loop."""
    interp = litegpu.Interpreter(model_content=swap_model(6, swap=False))
    values = [np.array(0, np.int32), *(np.full(3, k, np.float32) for k in (1, 2, 3))]
    want = invoke(interp, values)
    with litegpu.profile() as profiler:
        got = invoke(interp, values)
    assert_same(got, want)
    ops = [s.name for s in profiler.slices if s.cat == "node"]
    assert sum("LESS" in name for name in ops) == 7   # the condition: 6 true, 1 false
