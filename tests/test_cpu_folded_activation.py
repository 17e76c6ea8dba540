"""A conv, depthwise conv or FC with no fused activation followed by a RELU-family node
that alone reads its output runs as one cpu step, the clamp applied on store; results
equal the reference, and the pair is not folded when anything else reads the conv's output."""
from __future__ import annotations

import numpy as np
import pytest

import litegpu
from litegpu.testing.builder import ModelBuilder

RNG = np.random.default_rng(7)


def model(op: str, clamp: str, shared: bool) -> bytes:
    """x -> op (activation NONE) -> clamp -> out; with ``shared``, the op's output is also
    an input of an ADD whose result is a second output."""
    b = ModelBuilder()
    if op == "FULLY_CONNECTED":
        x = b.input("x", (3, 20))
        w = b.const("w", RNG.standard_normal((24, 20)).astype(np.float32))
        y = b.tensor("y", (3, 24))
        b.op(op, [x, w, b.const("bias", RNG.standard_normal(24).astype(np.float32))], [y])
        shape = (3, 24)
    else:
        x = b.input("x", (1, 9, 9, 8))
        shape = (1, 9, 9, 8)
        wshape = (8, 3, 3, 8) if op == "CONV_2D" else (1, 3, 3, 8)
        w = b.const("w", RNG.standard_normal(wshape).astype(np.float32))
        y = b.tensor("y", shape)
        extra = {} if op == "CONV_2D" else {"depth_multiplier": 1}
        b.op(op, [x, w, b.const("bias", RNG.standard_normal(8).astype(np.float32))], [y], padding="SAME",
             stride_w=1, stride_h=1, **extra)
    out = b.tensor("out", shape)
    b.op(clamp, [y], [out])
    b.output(out)
    if shared:
        other = b.tensor("other", shape)
        b.op("ADD", [y, y], [other])
        b.output(other)
    return b.build()


def run(content: bytes, **options) -> tuple[list[np.ndarray], litegpu.Interpreter]:
    interp = litegpu.Interpreter(model_content=content, **options)
    interp.allocate_tensors()
    (d,) = interp.get_input_details()
    interp.set_tensor(d["index"], np.random.default_rng(1).standard_normal(d["shape"]).astype(np.float32) * 3)
    interp.invoke()
    return [interp.get_tensor(o["index"]) for o in interp.get_output_details()], interp


@pytest.mark.parametrize("op", ["CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"])
@pytest.mark.parametrize("clamp", ["RELU", "RELU6", "RELU_N1_TO_1"])
@pytest.mark.parametrize("shared", [False, True])
def test_folded_clamp_matches_the_reference(op, clamp, shared, monkeypatch):
    content = model(op, clamp, shared)
    got, interp = run(content)
    with litegpu.profile() as p:
        interp.invoke()
    steps = [s.name for s in p.slices if s.cat == "node"]
    assert any(op in name and clamp in name for name in steps) is not shared, steps
    monkeypatch.setenv("LITEGPU_CPU_FUSION", "0")   # every node its own step
    want, _ = run(content)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    assert got[0].min() >= {"RELU": 0, "RELU6": 0, "RELU_N1_TO_1": -1}[clamp]
