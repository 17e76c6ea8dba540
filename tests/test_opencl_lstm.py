"""The opencl LSTM / UNIDIRECTIONAL_SEQUENCE_LSTM kernel, on a real OpenCL device.

The executor hands a device partition the variable state tensors as inputs *and*
outputs, so the state the kernel writes back reaches the next invoke. Most tests compile
the node the same way, run it on the same device tensors invoke after invoke, and check
against LiteRT over several invokes (LiteRT carries its variable tensors from one invoke
to the next); one runs the public Interpreter.
"""
from __future__ import annotations

import numpy as np
import pytest

from litegpu.backend import CompileOptions, Partition
from litegpu.executor import infer_subgraph
from litegpu.model import load_model
from litegpu.ops import TensorSpec
from litegpu.testing.cases import all_cases
from litegpu.testing.cases.nn import lstm_args, one_op, rand
from litegpu.testing.conformance import max_rel_error

INVOKES = 3
FP16_TOL = 1e-2


def _lstm_cases():
    """The float LSTM cases (hybrid and int8 ones reach opencl through the float view,
    tested with the rest of the conformance suite)."""
    return [c for c in all_cases() if c.op in ("LSTM", "UNIDIRECTIONAL_SEQUENCE_LSTM")
            and not c.variant.startswith(("hybrid", "int8"))]


def _node(model_bytes: bytes, inputs):
    """(model, subgraph, node context with static output specs, specs) of a one-op case."""
    model = load_model(model_bytes)
    sg = model.subgraphs[0]
    given = {t: TensorSpec(np.asarray(x).shape, np.asarray(x).dtype) for t, x in zip(sg.inputs, inputs)}
    contexts, specs, _ = infer_subgraph(model, sg, given)
    return model, sg, contexts[0], specs


def _program(opencl, model_bytes, inputs, precision_loss: bool):
    """The node compiled as a partition reading and writing back its state tensors, and
    device tensors for x, y, h, c (allocated as the executor's runner would)."""
    _, sg, ctx, specs = _node(model_bytes, inputs)
    x, hs, cs = ctx.node.inputs[0], ctx.node.inputs[18], ctx.node.inputs[19]
    y = ctx.node.outputs[0]
    touched = {t: specs[t] for t in (*ctx.node.inputs, *ctx.node.outputs) if t >= 0}
    part = Partition("opencl", sg, [ctx], [x, hs, cs], [y, hs, cs], touched, None, [[0]])
    options = CompileOptions(precision_loss_allowed=precision_loss)
    program = opencl.compile(part, options)
    buffers = [opencl.allocate(specs[t], options) for t in (x, y, hs, cs)]
    return program, buffers


def _litert_invokes(model_bytes, x, n=INVOKES):
    from ai_edge_litert.interpreter import Interpreter
    interp = Interpreter(model_content=bytes(model_bytes))
    interp.allocate_tensors()
    (inp,), (out,) = interp.get_input_details(), interp.get_output_details()
    results = []
    for k in range(n):
        interp.set_tensor(inp["index"], x * (k + 1))   # a different input each time
        interp.invoke()
        results.append(np.array(interp.get_tensor(out["index"])))
    return results


def _opencl_invokes(opencl, program, buffers, x, n=INVOKES):
    """Outputs of ``n`` runs (input scaled like :func:`_litert_invokes`) from zero state,
    and the final (h, c) read back from the device."""
    xb, yb, hb, cb = buffers
    for b in (hb, cb):
        opencl.copy_in(b, np.zeros(b.shape, np.float32))
    results = []
    for k in range(n):
        opencl.copy_in(xb, x * (k + 1))
        event = program.run([xb, hb, cb], [yb, hb, cb])
        out = np.empty(yb.shape, np.float32)
        opencl.copy_out(yb, out, [event])
        results.append(out)
    h, c = np.empty(hb.shape, np.float32), np.empty(cb.shape, np.float32)
    opencl.copy_out(hb, h)
    opencl.copy_out(cb, c)
    return results, h, c


@pytest.mark.parametrize("case", _lstm_cases(), ids=lambda c: c.id)
def test_every_case_matches_litert_over_invokes_fp32(opencl, case):
    model_bytes, inputs = case.build()
    program, buffers = _program(opencl, model_bytes, inputs, precision_loss=False)
    want = _litert_invokes(model_bytes, inputs[0])
    got, _, _ = _opencl_invokes(opencl, program, buffers, inputs[0])
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape
        assert max_rel_error(g, w) <= case.tol, f"invoke {k}: {max_rel_error(g, w):.3g}"
    # The carried state really changes the answer, so persistence is being tested.
    assert max_rel_error(want[1], _litert_invokes(model_bytes, inputs[0] * 2, 1)[0]) > 10 * case.tol


@pytest.mark.parametrize("case", _lstm_cases(), ids=lambda c: c.id)
def test_every_case_matches_litert_over_invokes_f32_f16(opencl, case):
    model_bytes, inputs = case.build()
    program, buffers = _program(opencl, model_bytes, inputs, precision_loss=True)
    want = _litert_invokes(model_bytes, inputs[0])
    got, _, _ = _opencl_invokes(opencl, program, buffers, inputs[0])
    for k, (g, w) in enumerate(zip(got, want)):
        assert np.isfinite(g).all()
        assert max_rel_error(g, w) <= FP16_TOL, f"invoke {k}: {max_rel_error(g, w):.3g}"


def _model(rng, steps, batch, n_input, n_cell, n_output=None, time_major=False, activation="TANH", **flags):
    """A UNIDIRECTIONAL_SEQUENCE_LSTM model bigger than the conformance cases."""
    x = rand(rng, steps, batch, n_input) if time_major else rand(rng, batch, steps, n_input)
    args = lstm_args(rng, x, n_cell, n_output=n_output, batch=batch, **flags)
    lead = (steps, batch) if time_major else (batch, steps)
    return one_op("UNIDIRECTIONAL_SEQUENCE_LSTM", args, [(*lead, n_output or n_cell)],
                  fused_activation_function=activation, time_major=time_major)


# Several cell blocks (40 cells: 5 blocks of 8; 24: 2 blocks of 12), masked output
# columns (6 outputs), and work-groups of 3 lanes, which share the blocks and meet at
# barriers: every path of the generator that the default shape does not take.
@pytest.mark.parametrize("lanes", [1, 3])
@pytest.mark.parametrize("shape", [
    {"steps": 3, "batch": 2, "n_input": 12, "n_cell": 40, "time_major": True, "layer_norm": True,
     "peephole": True},
    {"steps": 4, "batch": 3, "n_input": 7, "n_cell": 24, "n_output": 6, "cifg": True},
], ids=["ln-peephole-40", "cifg-projection-24x6"])
def test_blocks_masks_and_lanes_match_litert(opencl, monkeypatch, lanes, shape):
    from litegpu.codegen.kernels import lstm
    monkeypatch.setattr(lstm, "LANES", lanes)
    model_bytes, inputs = _model(np.random.default_rng(7), **shape)
    program, buffers = _program(opencl, model_bytes, inputs, precision_loss=False)
    want = _litert_invokes(model_bytes, inputs[0], 2)
    got, _, _ = _opencl_invokes(opencl, program, buffers, inputs[0], 2)
    for k, (g, w) in enumerate(zip(got, want)):
        assert max_rel_error(g, w) <= 1e-5, f"invoke {k}: {max_rel_error(g, w):.3g}"


@pytest.mark.parametrize("variant", ["layer-norm-cifg-peephole-projection", "time-major"])
def test_cases_with_three_lanes(opencl, monkeypatch, variant):
    from litegpu.codegen.kernels import lstm
    monkeypatch.setattr(lstm, "LANES", 3)
    case = next(c for c in _lstm_cases() if c.variant == variant)
    model_bytes, inputs = case.build()
    program, buffers = _program(opencl, model_bytes, inputs, precision_loss=False)
    want = _litert_invokes(model_bytes, inputs[0])
    got, _, _ = _opencl_invokes(opencl, program, buffers, inputs[0])
    for g, w in zip(got, want):
        assert max_rel_error(g, w) <= case.tol


@pytest.mark.parametrize("activation", ["RELU_N1_TO_1", "SIGN_BIT"])
def test_other_activations_match_litert(opencl, activation):
    """The activations no conformance case uses (NONE is undefined in LiteRT)."""
    model_bytes, inputs = _model(np.random.default_rng(3), 3, 2, 5, 8, activation=activation)
    program, buffers = _program(opencl, model_bytes, inputs, precision_loss=False)
    want = _litert_invokes(model_bytes, inputs[0], 2)
    got, _, c = _opencl_invokes(opencl, program, buffers, inputs[0], 2)
    assert np.abs(c).max() > 0.1
    for g, w in zip(got, want):
        assert max_rel_error(g, w) <= 1e-5


def test_final_state_is_written_back_like_the_reference(opencl):
    """The state tensors end as the reference's new states (h is the last output row)."""
    case = next(c for c in _lstm_cases() if c.variant == "cifg-peephole-projection")
    model_bytes, inputs = case.build()
    program, buffers = _program(opencl, model_bytes, inputs, precision_loss=False)
    _, _, ctx, _ = _node(model_bytes, inputs)
    _, h, c = _opencl_invokes(opencl, program, buffers, inputs[0], n=1)
    args = [None if s is None else (s.value if s.value is not None else None) for s in ctx.inputs]
    args[0] = inputs[0]
    args[18], args[19] = np.zeros(buffers[2].shape, np.float32), np.zeros(buffers[3].shape, np.float32)
    _, want_h, want_c = ctx.opdef.reference(args, ctx.attrs)
    assert np.abs(c).max() > 0.05
    np.testing.assert_allclose(h, want_h, atol=1e-5)
    np.testing.assert_allclose(c, want_c, atol=1e-5)


def test_non_constant_weights_are_declined(opencl):
    case = next(c for c in _lstm_cases() if c.variant == "basic")
    model_bytes, inputs = case.build()
    model, _, ctx, _ = _node(model_bytes, inputs)
    ctx.inputs[2] = TensorSpec(ctx.inputs[2].shape, np.dtype(np.float32))   # input_to_forget fed at run time
    answer = opencl.supports(ctx, model)
    assert not answer and "input_to_forget" in answer.reason


@pytest.mark.parametrize("case", _lstm_cases()[:3], ids=lambda c: c.id)
def test_interpreter_keeps_the_state_on_opencl_across_invokes(opencl, case):
    import litegpu
    model_bytes, inputs = case.build()
    interp = litegpu.Interpreter(model_content=model_bytes, experimental_delegates=[litegpu.load_delegate("opencl")])
    interp.allocate_tensors()
    assert interp.get_delegation_report().fully_delegated
    want = _litert_invokes(model_bytes, inputs[0])
    for k, w in enumerate(want):
        interp.set_tensor(interp.get_input_details()[0]["index"], inputs[0] * (k + 1))
        interp.invoke()
        got = interp.get_tensor(interp.get_output_details()[0]["index"])
        assert max_rel_error(got, w) <= case.tol, f"invoke {k}: {max_rel_error(got, w):.3g}"


@pytest.mark.parametrize("backend_name", ["cpu", "opencl"])
def test_reset_all_variables_zeroes_the_state_like_litert(opencl, backend_name):
    import litegpu
    from ai_edge_litert.interpreter import Interpreter
    model_bytes, inputs = _lstm_cases()[0].build()
    ours = litegpu.Interpreter(model_content=model_bytes,
                               experimental_delegates=[litegpu.load_delegate(backend_name)])
    theirs = Interpreter(model_content=bytes(model_bytes))
    results = []
    for interp in (ours, theirs):
        interp.allocate_tensors()
        interp.set_tensor(interp.get_input_details()[0]["index"], inputs[0])
        interp.invoke()
        first = np.array(interp.get_tensor(interp.get_output_details()[0]["index"]))
        interp.invoke()
        interp.reset_all_variables()
        interp.invoke()
        results.append((first, np.array(interp.get_tensor(interp.get_output_details()[0]["index"]))))
    (ours_first, ours_after), (_, theirs_after) = results
    assert max_rel_error(ours_after, theirs_after) <= 1e-5
    np.testing.assert_allclose(ours_after, ours_first, rtol=1e-6, atol=1e-6)   # state was zeroed
