"""Full-integer LSTM and UNIDIRECTIONAL_SEQUENCE_LSTM (litegpu.ops.integer_lstm) against
LiteRT.

Each model is built by :func:`litegpu.testing.cases.quantized_lstm.int8_lstm` as
TensorFlow's converter writes an int8 LSTM (int8 activations and weights, int16 cell
state, peephole and layer-norm coefficients, int32 biases, five quantized
intermediates), with seeded random weights and scales. Each runs three invokes (the
state carries over; the second on the negated input) on litegpu's cpu backend and on
LiteRT's default interpreter, which runs the node on its builtin integer kernel (XNNPACK
takes no LSTM). The outputs must be equal on every element: LiteRT's arithmetic here is
integer only.

The models' output zero point is 0: LiteRT starts an int8 state variable at its zero
point, litegpu's session at 0 (:func:`test_nonzero_output_zero_point`).
"""
from __future__ import annotations

import numpy as np
import pytest

import litegpu
from litegpu.errors import ModelFormatError, UnsupportedError
from litegpu.model.reader import load_model
from litegpu.ops.registry import get_op
from litegpu.testing.cases.quantized_lstm import int8_input, int8_lstm

LiteRT = pytest.importorskip("ai_edge_litert.interpreter").Interpreter
INVOKES = 3


def _inputs(x: np.ndarray) -> list[np.ndarray]:
    """The input of each invoke: ``x``, ``-x``, ``x / 2``."""
    wide = x.astype(np.int16)
    return [x, np.clip(-wide, -128, 127).astype(np.int8), (wide // 2).astype(np.int8)][:INVOKES]


def invoke(interp, x: np.ndarray) -> list[np.ndarray]:
    """The output of each of ``INVOKES`` invokes (the state carries over)."""
    interp.allocate_tensors()
    outs = []
    for value in _inputs(x):
        interp.set_tensor(interp.get_input_details()[0]["index"], value)
        interp.invoke()
        outs.append(interp.get_tensor(interp.get_output_details()[0]["index"]).copy())
    return outs


def litert_state(interp, name: str) -> np.ndarray:
    """A state variable of a LiteRT interpreter, by tensor name."""
    (index,) = [d["index"] for d in interp.get_tensor_details() if d["name"] == name]
    return interp.get_tensor(index)


def check(model: bytes, shape: tuple[int, ...], seed: int = 1) -> LiteRT:
    """litegpu against LiteRT over ``INVOKES`` invokes, equal on every element; returns
    the LiteRT interpreter (its states after the last invoke)."""
    x = int8_input(shape, seed)
    theirs = LiteRT(model_content=model)
    want = invoke(theirs, x)
    got = invoke(litegpu.Interpreter(model_content=model), x)
    for k, (a, b) in enumerate(zip(got, want)):
        assert a.dtype == b.dtype == np.int8 and a.shape == b.shape
        differ = np.count_nonzero(a != b)
        assert differ == 0, f"invoke {k}: {differ} of {a.size} differ, by up to " \
                            f"{int(np.abs(a.astype(int) - b).max())}"
    # The gates move: not every output the same value.
    assert len(np.unique(np.concatenate([w.ravel() for w in want]))) > 3
    return theirs


VARIANTS = {
    "basic": {},
    "batch1": dict(batch=1),
    "wide": dict(batch=3, n_input=24, n_cell=16),
    "projection": dict(n_output=3),
    "projection-no-bias": dict(n_output=3, projection_bias=False),
    "cifg": dict(cifg=True),
    "peephole": dict(peephole=True),
    "cifg-peephole": dict(cifg=True, peephole=True, n_cell=6),
    # LiteRT's peephole runs over n_output values per row (see litegpu.ops.integer_lstm).
    "peephole-narrow-projection": dict(peephole=True, n_cell=6, n_output=4, batch=3),
    "layer-norm": dict(layer_norm=True, n_cell=8),
    "layer-norm-n6": dict(layer_norm=True, n_cell=6),
    "layer-norm-cifg-peephole-projection": dict(layer_norm=True, cifg=True, peephole=True, n_cell=8, n_output=5),
    "layer-norm-peephole-projection": dict(layer_norm=True, peephole=True, n_cell=8, n_output=8, n_input=3),
    "hidden-zero-point": dict(hidden_zp=6),
    "cell-scale-2^-15": dict(cell_log2=-15),
    "cell-scale-2^-9": dict(cell_log2=-9),
    "relu-activation": dict(activation="RELU"),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_lstm(variant: str) -> None:
    check(*int8_lstm(seq=False, seed=len(variant), **VARIANTS[variant]))


SEQ_VARIANTS = {
    "basic": {},
    "batch1": dict(batch=1, steps=5),
    "one-step": dict(steps=1, batch=3),
    "long": dict(steps=8, n_input=10, n_cell=12),
    "projection-peephole": dict(n_output=3, peephole=True),
    "cifg-projection": dict(cifg=True, n_cell=6, n_output=3, steps=4),
    "layer-norm": dict(layer_norm=True, n_cell=8, steps=5),
    "layer-norm-cifg-peephole": dict(layer_norm=True, cifg=True, peephole=True, n_cell=5),
    "peephole-narrow-projection": dict(peephole=True, n_cell=6, n_output=4, batch=3),
}


@pytest.mark.parametrize("time_major", [False, True], ids=["batch-major", "time-major"])
@pytest.mark.parametrize("variant", list(SEQ_VARIANTS))
def test_sequence_lstm(variant: str, time_major: bool) -> None:
    check(*int8_lstm(time_major=time_major, seed=100 + len(variant), **SEQ_VARIANTS[variant]))


@pytest.mark.parametrize("seed", range(12))
def test_random_configurations(seed: int) -> None:
    """Random sizes and options, one model per seed."""
    rng = np.random.default_rng(1000 + seed)
    n_cell = int(rng.integers(2, 12))
    options = dict(seq=bool(rng.integers(2)), time_major=bool(rng.integers(2)), batch=int(rng.integers(1, 4)),
                   steps=int(rng.integers(1, 5)), n_input=int(rng.integers(1, 9)), n_cell=n_cell,
                   n_output=int(rng.integers(1, n_cell + 1)) if rng.integers(2) else None,
                   cifg=bool(rng.integers(2)), layer_norm=bool(rng.integers(2)),
                   cell_log2=int(rng.integers(-15, -8)), seed=seed)
    options["peephole"] = bool(rng.integers(2))
    check(*int8_lstm(**options), seed=seed)


@pytest.mark.parametrize("seq", [False, True], ids=["LSTM", "SEQUENCE"])
def test_cell_clip(seq: bool) -> None:
    """``cell_clip`` is ``clip / cell_scale`` truncated (0.37 * 2048 = 757.76: 757)."""
    theirs = check(*int8_lstm(seq=seq, cell_clip=0.37, n_cell=8, seed=5))
    assert np.abs(litert_state(theirs, "cell_state")).max() == 757


@pytest.mark.parametrize("seq", [False, True], ids=["LSTM", "SEQUENCE"])
def test_projection_clip(seq: bool) -> None:
    """``proj_clip`` clamps the stored int8 values to +-(clip / scale), truncated."""
    model, shape = int8_lstm(seq=seq, n_output=5, n_cell=8, proj_clip=0.3, cell_clip=0.9, seed=6)
    theirs = check(model, shape)
    scale = load_model(model).subgraphs[0].tensors[-1].quantization.scales[0]
    bound = int(np.float32(0.3) / np.float32(scale))
    assert np.abs(litert_state(theirs, "output_state")).max() == bound


def test_fused_activation_is_not_read() -> None:
    """LiteRT's integer kernel always uses tanh: RELU and TANH models agree."""
    x = int8_input(int8_lstm(seed=7)[1])
    tanh = invoke(LiteRT(model_content=int8_lstm(seed=7)[0]), x)
    relu = invoke(LiteRT(model_content=int8_lstm(seed=7, activation="RELU")[0]), x)
    assert all(np.array_equal(a, b) for a, b in zip(tanh, relu))


def test_reader_keeps_intermediates() -> None:
    model, _ = int8_lstm()
    sg = load_model(model).subgraphs[0]
    node = sg.nodes[0]
    assert len(node.intermediates) == 5
    assert sg.tensors[node.intermediates[4]].name == "hidden"


def _reference_step(model: bytes, x: np.ndarray, output_state: int) -> np.ndarray:
    """One invoke by the op's integer reference, the output state starting at ``output_state``."""
    sg = load_model(model).subgraphs[0]
    node = sg.nodes[0]
    opdef = get_op(node.op)
    attrs = opdef.node_attrs(node, sg.tensors)
    args = [None if i < 0 else sg.tensors[i].data if sg.tensors[i].data is not None
            else np.zeros(sg.tensors[i].shape, sg.tensors[i].dtype) for i in node.inputs]
    args[0] = x
    args[18] = np.full(args[18].shape, output_state, np.int8)
    return opdef.reference_for(attrs)(args, attrs)[0]


def test_nonzero_output_zero_point() -> None:
    """LiteRT starts an int8 state variable at its zero point (``ResetVariableTensor``),
    and so does litegpu (``litegpu.quant.variable_initial_value``)."""
    model, shape = int8_lstm(n_output=3, output_zp=7)
    x = int8_input(shape)
    want = invoke(LiteRT(model_content=model), x)
    assert np.array_equal(_reference_step(model, x, 7), want[0])
    for got, expected in zip(invoke(litegpu.Interpreter(model_content=model), x), want):
        np.testing.assert_array_equal(got, expected)


# -- what is refused ----------------------------------------------------------------------------


def _litert_fails(model: bytes, match: str) -> None:
    with pytest.raises(RuntimeError, match=match):
        LiteRT(model_content=model).allocate_tensors()


@pytest.mark.parametrize("count", [0, 4])
@pytest.mark.parametrize("seq", [False, True], ids=["LSTM", "SEQUENCE"])
def test_intermediates_count_refused_like_litert(count: int, seq: bool) -> None:
    model, _ = int8_lstm(seq=seq, n_intermediates=count)
    _litert_fails(model, "num_intermediate_tensors")
    with pytest.raises(ModelFormatError, match=f"{count} intermediates; a full-integer LSTM needs 5"):
        litegpu.Interpreter(model_content=model).allocate_tensors()


@pytest.mark.parametrize("seq", [False, True], ids=["LSTM", "SEQUENCE"])
def test_twelve_intermediates_refused(seq: bool) -> None:
    """The experimental 8x8_8 kernel: the sequence op refuses it in LiteRT; the LSTM op
    brings LiteRT's process down (not run here)."""
    model, _ = int8_lstm(seq=seq, n_intermediates=12)
    if seq:
        _litert_fails(model, "num_intermediate_tensors == 5")
    with pytest.raises(UnsupportedError, match="12 intermediates: the experimental 8x8_8"):
        litegpu.Interpreter(model_content=model).allocate_tensors()


def test_float_bias_refused_like_litert() -> None:
    model, _ = int8_lstm(float_bias=True)
    _litert_fails(model, "input_gate_bias->type != kTfLiteInt32")
    with pytest.raises(UnsupportedError, match="input_gate_bias .*takes INT32 biases"):
        litegpu.Interpreter(model_content=model).allocate_tensors()


@pytest.mark.parametrize("options, match", [
    (dict(per_channel=True), "4 scales; LiteRT's integer LSTM reads one scale per tensor"),
    (dict(cell_log2=-11.5), "not a power of two"),
    (dict(cell_log2=-8), r"cell_state scale 2\^-8: .*0 to 6 integer bits"),
    (dict(cell_log2=-16), r"cell_state scale 2\^-16"),
    (dict(peephole=True, n_output=6), "n_output 6 > n_cell 4"),
], ids=["per-channel", "cell-scale-not-pot", "cell-scale-2^-8", "cell-scale-2^-16", "peephole-wide-projection"])
def test_undefined_in_litert_refused(options: dict, match: str) -> None:
    """LiteRT runs these without complaint but computes nothing meaningful (a per-channel
    weight's scale read as 0, an unwritten tanh, reads past its buffers): refused."""
    model, _ = int8_lstm(**options)
    with pytest.raises(UnsupportedError, match=match):
        litegpu.Interpreter(model_content=model).allocate_tensors()
