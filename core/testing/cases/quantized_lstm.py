"""Conformance cases for the full-integer LSTM (:mod:`litegpu.ops.integer_lstm`): LSTM and
UNIDIRECTIONAL_SEQUENCE_LSTM as TensorFlow's converter writes them for int8 models.

:func:`int8_lstm` builds such a node: int8 input, output and output state; int8
symmetric gate, recurrent and projection weights; int16 peephole and layer-norm
coefficients; int32 biases; an int16 cell state with a power-of-two scale; and the
node's five ``intermediates``, whose quantization carries the gate matmul output scales
(read with layer norm only) and the hidden state's scale and zero point. Every scale is
drawn at random around what calibration gives (gates in about [-8, 8], the hidden state
in (-1, 1)), so the gates neither saturate nor stay still.

LiteRT computes such a node with integer arithmetic only; litegpu's cpu reference
reproduces it exactly (tests/test_ops_integer_lstm.py asserts equality on many more
models). The cases allow one quantum (``quanta=1``), what a GPU's float view of the node
reaches (measured on opencl/PoCL: 4 of these 6 cases equal, 2 off by one quantum).
"""
from __future__ import annotations

import numpy as np

from ..builder import ModelBuilder
from . import Case

GATES = ("input", "forget", "cell", "output")
F32 = np.float32


def _symmetric(real: np.ndarray, dtype) -> tuple[np.ndarray, float]:
    """``real`` quantized symmetrically to ``dtype`` with one scale (its largest magnitude)."""
    top = np.iinfo(dtype).max
    scale = float(F32(max(float(np.abs(real).max()), 1e-3) / top))
    return np.clip(np.round(real / scale), -top, top).astype(dtype), scale


def int8_lstm(*, seq: bool = True, batch: int = 2, steps: int = 3, n_input: int = 5, n_cell: int = 4,
              n_output: int | None = None, cifg: bool = False, peephole: bool = False, layer_norm: bool = False,
              projection_bias: bool = True, time_major: bool = False, cell_clip: float = 0.0,
              proj_clip: float = 0.0, cell_log2: float = -11, hidden_zp: int | None = None,
              output_zp: int = 0, activation: str = "TANH", n_intermediates: int = 5,
              per_channel: bool = False, float_bias: bool = False, seed: int = 0,
              ) -> tuple[bytes, tuple[int, ...]]:
    """A one-node full-integer LSTM model (``seq``: UNIDIRECTIONAL_SEQUENCE_LSTM) and its
    input shape. The output state's quantization is the output's; without projection
    the output is the hidden state, with the hidden state's scale and (by default) zero
    point, as the converter writes it; with projection the hidden zero point is drawn at
    random; ``output_zp`` is the output's zero point (the state starts there).
    The cell state's scale is ``2^cell_log2``. ``n_intermediates``, ``per_channel``,
    ``float_bias`` and a ``cell_log2`` that is not an integer in [-15, -9] make models
    LiteRT or litegpu refuse."""
    rng = np.random.default_rng(seed)
    n_out = n_output or n_cell
    b = ModelBuilder()
    shape = ((steps, batch, n_input) if time_major else (batch, steps, n_input)) if seq else (batch, n_input)
    x_scale = float(rng.uniform(0.02, 0.05))
    x = b.input("x", shape, np.int8, scale=[x_scale], zero_point=[int(rng.integers(-20, 21))])
    hidden_scale = float(rng.uniform(0.007, 0.009))
    if hidden_zp is None:
        hidden_zp = int(rng.integers(-8, 9)) if n_output else output_zp
    out_scale = float(rng.uniform(0.02, 0.04)) if n_output else hidden_scale
    out_zp = output_zp

    def int8_weights(name: str, rows: int, cols: int) -> tuple[int, float]:
        real = rng.standard_normal((rows, cols)) * (1.2 / np.sqrt(cols))
        if per_channel:
            scales = (np.abs(real).max(axis=1) / 127).astype(F32)
            q = np.clip(np.round(real / scales[:, None]), -127, 127).astype(np.int8)
            return b.const(name, q, scale=scales, zero_point=[0] * rows, quantized_dimension=0), float(scales[0])
        q, scale = _symmetric(real, np.int8)
        return b.const(name, q, scale=[scale], zero_point=[0]), scale

    def int16_coefficients(name: str, real: np.ndarray) -> int:
        q, scale = _symmetric(real, np.int16)
        return b.const(name, q, scale=[scale], zero_point=[0]), scale

    def bias(name: str, real: np.ndarray, scale: float) -> int:
        if float_bias:
            return b.const(name, real.astype(F32))
        return b.const(name, np.round(real / scale).astype(np.int32), scale=[scale], zero_point=[0])

    args = [x]
    w_scales = {}
    for kind, cols in (("input", n_input), ("recurrent", n_out)):
        for g in GATES:
            if cifg and g == "input":
                args.append(-1)
                continue
            t, w_scales[f"{kind}_to_{g}"] = int8_weights(f"{kind}_to_{g}", n_cell, cols)
            args.append(t)
    for g in ("input", "forget", "output"):
        args.append(-1 if not peephole or (cifg and g == "input")
                    else int16_coefficients(f"cell_to_{g}", rng.standard_normal(n_cell) * 0.4)[0])
    norms = {}
    if layer_norm:
        for g in GATES:
            if not (cifg and g == "input"):
                norms[g] = int16_coefficients(f"{g}_layer_norm", 1 + rng.standard_normal(n_cell) * 0.2)
    for g in GATES:
        if cifg and g == "input":
            args.append(-1)
            continue
        real = rng.standard_normal(n_cell) * 0.5 + (1.0 if g == "forget" else 0.0)
        scale = norms[g][1] / 1024 if layer_norm else x_scale * w_scales[f"input_to_{g}"]
        args.append(bias(f"{g}_gate_bias", real, scale))
    if n_output:
        t, p_scale = int8_weights("projection", n_output, n_cell)
        args += [t, bias("projection_bias", rng.standard_normal(n_output) * 0.1, hidden_scale * p_scale)
                 if projection_bias else -1]
    else:
        args += [-1, -1]
    args.append(b.tensor("output_state", (batch, n_out), np.int8, is_variable=True, scale=[out_scale],
                         zero_point=[out_zp]))
    args.append(b.tensor("cell_state", (batch, n_cell), np.int16, is_variable=True, scale=[2.0 ** cell_log2],
                         zero_point=[0]))
    if layer_norm:
        args += [-1 if cifg and g == "input" else norms[g][0] for g in GATES]
    # The intermediates: each gate's matmul output (int16), then the hidden state (int8).
    intermediates = [b.tensor(f"{g}_intermediate", (0,), np.int16, scale=[float(rng.uniform(1e-4, 4e-4))],
                              zero_point=[0]) for g in GATES]
    intermediates.append(b.tensor("hidden", (0,), np.int8, scale=[hidden_scale], zero_point=[hidden_zp]))
    intermediates += [b.tensor(f"extra{i}", (0,), np.int16, scale=[2.0 ** -12], zero_point=[0])
                      for i in range(max(0, n_intermediates - 5))]
    out_shape = ((steps, batch, n_out) if time_major else (batch, steps, n_out)) if seq else (batch, n_out)
    y = b.tensor("y", out_shape, np.int8, scale=[out_scale], zero_point=[out_zp])
    options = dict(fused_activation_function=activation, cell_clip=cell_clip, proj_clip=proj_clip)
    if seq:
        b.op("UNIDIRECTIONAL_SEQUENCE_LSTM", args, [y], time_major=time_major, version=2,
             intermediates=intermediates[:n_intermediates], **options)
    else:
        b.op("LSTM", args, [y], version=4, intermediates=intermediates[:n_intermediates], **options)
    b.output(y)
    return b.build(), shape


def int8_input(shape: tuple[int, ...], seed: int = 1) -> np.ndarray:
    """int8 inputs over most of the range (about 2.5 standard deviations of 50)."""
    rng = np.random.default_rng(seed)
    return np.clip(np.round(rng.standard_normal(shape) * 50), -128, 127).astype(np.int8)


def _case(op: str, variant: str, **options) -> Case:
    def build():
        model, shape = int8_lstm(seq=op == "UNIDIRECTIONAL_SEQUENCE_LSTM", **options)
        return model, [int8_input(shape)]
    return Case(op, variant, build, tol=0.0, quanta=1)


CASES = [
    _case("LSTM", "int8", batch=2),
    _case("LSTM", "int8-cifg-peephole-projection-clips", cifg=True, peephole=True, n_cell=6, n_output=6,
          cell_clip=0.8, proj_clip=0.5),
    _case("LSTM", "int8-layer-norm", layer_norm=True, n_cell=8, batch=3),
    _case("UNIDIRECTIONAL_SEQUENCE_LSTM", "int8-batch-major", steps=4),
    _case("UNIDIRECTIONAL_SEQUENCE_LSTM", "int8-time-major-projection", time_major=True, n_cell=8, n_output=3),
    _case("UNIDIRECTIONAL_SEQUENCE_LSTM", "int8-layer-norm-peephole", layer_norm=True, peephole=True, n_cell=8,
          steps=5, seed=3),
]
