"""Models the tests build, standing in for shared models where a test needs only their kind.

Each has the interface of the shared model it is named after (shapes, dynamic batch,
signature and tensor names, as ``MODELS.md`` beside the shared models lists them), so a
test written against that model runs unchanged on a machine without the shared models.
Weights are seeded random, scaled so that activations stay near unit spread.
"""
from __future__ import annotations

import numpy as np

from litegpu.testing.builder import ModelBuilder

# The names TensorFlow's converter gives a Keras model's signature input and output.
SIGNATURE_INPUT, SIGNATURE_OUTPUT = "keras_tensor", "output_0"


def _weights(rng, shape: tuple[int, ...]) -> np.ndarray:
    return (rng.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)


def _signed(b: ModelBuilder, x: int, y: int) -> None:
    """A serving_default signature, named as the converter names a Keras model's."""
    b.signature("serving_default", {SIGNATURE_INPUT: x}, {SIGNATURE_OUTPUT: y})


def mlp() -> bytes:
    """As ``dynamic_batch_mlp``: float32[-1, 20] -> float32[-1, 3], a dense layer with relu
    times a sigmoid gate (MUL), plus a tanh dense layer of that (ADD), then a last dense layer."""
    rng = np.random.default_rng(20)
    b = ModelBuilder()

    def act(name: str, width: int) -> int:
        return b.tensor(name, (1, width), shape_signature=(-1, width))

    def dense(x: int, name: str, n_in: int, n_out: int, activation: str = "NONE") -> int:
        y = act(name, n_out)
        b.op("FULLY_CONNECTED", [x, b.const(f"{name}/w", _weights(rng, (n_out, n_in))),
                                 b.const(f"{name}/b", rng.uniform(-0.1, 0.1, n_out).astype(np.float32))],
             [y], fused_activation_function=activation)
        return y

    x = b.input(f"serving_default_{SIGNATURE_INPUT}:0", (1, 20), shape_signature=(-1, 20))
    h = dense(x, "dense", 20, 32, "RELU")
    gate_in = dense(x, "gate", 20, 32)
    gate, gated, branch, summed = (act(n, 32) for n in ("sigmoid", "gated", "tanh", "sum"))
    b.op("LOGISTIC", [gate_in], [gate])
    b.op("MUL", [h, gate], [gated])
    b.op("TANH", [dense(gated, "branch", 32, 32)], [branch])
    b.op("ADD", [gated, branch], [summed])
    y = dense(summed, "StatefulPartitionedCall_1:0", 32, 3)
    b.output(y)
    _signed(b, x, y)
    return b.build()


def elementwise(n: int = 200) -> bytes:
    """As ``elementwise_200``: float32[1, 64] ``x`` -> ``Identity`` through ``n`` ops with
    [1, 64] constants (ADD, MUL, SUB, MAXIMUM in turn); no signature (tensor names only)."""
    rng = np.random.default_rng(200)
    b = ModelBuilder()
    x = b.input("x", (1, 64))
    for k in range(n):
        op = ("ADD", "MUL", "SUB", "MAXIMUM")[k % 4]
        # MUL by values near 1, so that 50 of them neither vanish nor overflow.
        c = rng.uniform(0.9, 1.1, (1, 64)) if op == "MUL" else rng.uniform(-0.5, 0.5, (1, 64))
        y = b.tensor("Identity" if k == n - 1 else f"t{k}", (1, 64))
        b.op(op, [x, b.const(f"c{k}", c.astype(np.float32))], [y])
        x = y
    b.output(x)
    return b.build()


def token_classifier() -> bytes:
    """As ``tiny_bert`` seen from outside: int32[1, 64] token ids (vocabulary 1000) ->
    float32[1, 2], a fixed batch of 1; an embedding GATHER, MEAN over the tokens, two dense layers."""
    rng = np.random.default_rng(64)
    b = ModelBuilder()
    ids = b.input(f"serving_default_{SIGNATURE_INPUT}:0", (1, 64), np.int32)
    table = b.const("embedding", rng.standard_normal((1000, 16)).astype(np.float32))
    embedded = b.tensor("embedded", (1, 64, 16))
    pooled, hidden = b.tensor("pooled", (1, 16)), b.tensor("hidden", (1, 16))
    b.op("GATHER", [table, ids], [embedded], axis=0)
    b.op("MEAN", [embedded, b.const("axis", np.array([1], np.int32))], [pooled], keep_dims=False)
    b.op("FULLY_CONNECTED", [pooled, b.const("w1", _weights(rng, (16, 16))), b.const("b1", np.zeros(16, np.float32))],
         [hidden], fused_activation_function="RELU")
    y = b.tensor("StatefulPartitionedCall_1:0", (1, 2))
    b.op("FULLY_CONNECTED", [hidden, b.const("w2", _weights(rng, (2, 16))), b.const("b2", np.zeros(2, np.float32))],
         [y])
    b.output(y)
    _signed(b, ids, y)
    return b.build()


def segmenter(size: int = 32) -> bytes:
    """As ``unet_small`` seen from outside, smaller: float32[1, size, size, 3] ->
    float32[1, size, size, 1], a per-pixel mask (two convolutions, then LOGISTIC)."""
    rng = np.random.default_rng(size)
    b = ModelBuilder()
    x = b.input(f"serving_default_{SIGNATURE_INPUT}:0", (1, size, size, 3))
    h, logits = b.tensor("features", (1, size, size, 8)), b.tensor("logits", (1, size, size, 1))
    b.op("CONV_2D", [x, b.const("w1", _weights(rng, (8, 3, 3, 3))), b.const("b1", np.zeros(8, np.float32))], [h],
         padding="SAME", stride_w=1, stride_h=1, fused_activation_function="RELU")
    b.op("CONV_2D", [h, b.const("w2", _weights(rng, (1, 1, 1, 8))), b.const("b2", np.zeros(1, np.float32))],
         [logits], padding="SAME", stride_w=1, stride_h=1)
    y = b.tensor("StatefulPartitionedCall_1:0", (1, size, size, 1))
    b.op("LOGISTIC", [logits], [y])
    b.output(y)
    _signed(b, x, y)
    return b.build()
