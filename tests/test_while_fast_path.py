"""WHILE loops run by the session over its compiled subgraphs' fixed arrays: values that
swap places or pass through unchanged, several invokes in a row, and results equal to a
plain Python loop and to LiteRT."""
from __future__ import annotations

import numpy as np
import pytest

import litegpu
from litegpu.testing.builder import ModelBuilder


def swap_model(steps: int, swap: bool = True) -> bytes:
    """(i, a, b, c) -> while i < steps: (i + 1, b, a + c, c) when ``swap`` (a and b change
    places: body output 1 is input 2's array, which the session must not take as output
    1's), else (i + 1, a + c, b, c); c (and b without swap) pass through unchanged."""
    mb = ModelBuilder()
    cond = mb.subgraph("cond")
    ci = cond.input("i", (), np.int32)
    cond.input("a", (3,))
    cond.input("b", (3,))
    cond.input("c", (3,))
    flag = cond.tensor("flag", (), np.bool_)
    cond.op("LESS", [ci, cond.const("steps", np.array(steps, np.int32))], [flag])
    cond.output(flag)
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
        # Swapped values keep to the general path; the rest run on fixed arrays.
        (loop,) = interp._session._loops.values()
        assert (loop is None) == swap


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


def test_iteration_limit_still_applies_on_the_fast_path():
    interp = litegpu.Interpreter(model_content=swap_model(10_000), limits=litegpu.Limits(max_while_iterations=50))
    with pytest.raises(litegpu.ResourceLimitError, match="50 iterations"):
        invoke(interp, [np.array(0, np.int32), np.ones(3, np.float32), np.ones(3, np.float32),
                        np.ones(3, np.float32)])


def test_later_invokes_enter_the_fixed_loop_at_once(monkeypatch):
    """Once a loop over fixed arrays exists, a WHILE starting from values of its shapes
    runs in it from the first iteration: any number of iterations (none included), with
    the iteration limit still counted from the first."""
    interp = litegpu.Interpreter(model_content=swap_model(6, swap=False),
                                 limits=litegpu.Limits(max_while_iterations=5))
    rng = np.random.default_rng(3)
    a, b, c = (rng.standard_normal(3).astype(np.float32) for _ in range(3))
    session = interp._session
    general = []
    call_subgraph = session.call_subgraph
    monkeypatch.setattr(session, "call_subgraph", lambda sg, values: (general.append(sg), call_subgraph(sg, values))[1])
    for start in (3, 6, 9, 2, 4):   # 3 iterations, none, none, 4, 2
        got = invoke(interp, [np.array(start, np.int32), a, b, c])
        want = expected(6 - start, a, b, c, swap=False)
        assert int(got[0]) == max(start, 6)
        for g, w in zip(got[1:], want[1:]):
            np.testing.assert_allclose(g, w, rtol=1e-6)
        # The first invoke's first iteration calls cond and body the general way; no other does.
        assert len(general) == 2
    (loop,) = session._loops.values()
    assert loop is not None
    with pytest.raises(litegpu.ResourceLimitError, match="5 iterations"):
        invoke(interp, [np.array(0, np.int32), a, b, c])
