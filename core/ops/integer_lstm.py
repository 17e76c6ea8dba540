"""Full-integer LSTM and UNIDIRECTIONAL_SEQUENCE_LSTM: int8 activations, int16 cell state.

TensorFlow's converter with a representative dataset and ``TFLITE_BUILTINS_INT8`` writes
an LSTM node with int8 input, output and output state, symmetric int8 gate, recurrent
and projection weights, int16 peephole and layer-norm coefficients, int32 biases, an
int16 cell state with a power-of-two scale, and five ``intermediates`` tensors that carry
only quantization: the four gates' matmul output scales (read with layer norm only;
without it each gate is Q3.12) and the hidden state's scale and zero point. LiteRT runs
it on its builtin kernel (lstm.cc ``PopulateQuantizedLstmParams8x8_16``, lstm_eval.cc
``EvalInteger8x8_16``; XNNPACK takes no LSTM), with integer arithmetic only, which this
module reproduces bit for bit. One step:

- each gate starts from 0 and adds, each saturated to int16: the input matmul (int32 sum
  of ``w * (x - x_zp)`` plus the bias, rescaled by ``QuantizeMultiplier`` of ``w_scale *
  x_scale / gate_scale`` with TFLite's double rounding), the same for the output state,
  then for peepholes ``w * cell`` rescaled; with layer norm the bias is left out of the
  matmuls and added inside TFLite's integer layer norm (``ApplyLayerNorm``), whose output
  is Q3.12;
- gemmlowp's int16 fixed-point logistic (input, forget and output gates) and tanh (cell
  gate) on Q3.12, giving Q0.15. The op's fused activation is not read: the integer
  kernel always uses tanh;
- the cell: ``forget * cell >> 15`` plus ``input * cell_gate >> (30 + cell_log2)``
  (CIFG: ``input = 32767 - forget``), rounded, saturated, clipped in the quantized domain
  (``cell_clip / cell_scale`` truncated to an integer);
- the hidden state: gemmlowp's int16 tanh of the cell read with ``15 + cell_log2``
  integer bits (``ApplyTanh``), times the output gate, rescaled to the hidden
  intermediate's scale, plus its zero point, int8; then the projection (int8 weights,
  the hidden zero point taken out with the weights' row sums, int32 bias, rescaled to the
  output state's scale and zero point, ``proj_clip`` applied to the stored int8 values
  with no regard to the zero point), or the hidden state is the output.

LiteRT's quirks are reproduced, not corrected: the peephole loop runs over ``n_output``
elements of the ``[n_batch, n_cell]`` gate (lstm_eval.cc passes ``n_output`` as the
vector length), so with a projection narrower than the cell only the first
``n_batch * n_output`` values of the flat gate get a peephole term, with weight ``k %
n_output`` (n_batch is the whole batch for LSTM and a time-major sequence; a batch-major
sequence runs row by row). What LiteRT cannot run, or runs past its buffers or with an
unwritten result, is refused when the node's attrs are computed
(:func:`_integer_lstm_attrs`).

The effective biases (bias plus zero point times the weights' row sums) are computed
from the operands on each call; LiteRT computes them once when it prepares the node.
Integer sums are exact in float64 (far below 2^53), then wrapped to int32 as the kernel's
accumulators.

Checked against LiteRT in tests/test_ops_integer_lstm.py: equal on every element, the
int8 output state starting at its zero point as in LiteRT
(:func:`litegpu.quant.variable_initial_value`).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import ModelFormatError, UnsupportedError
from ..graph import Node, Tensor
from ..quant import QuantParams, multiply_by_quantized_multiplier, quantize_multiplier, rounding_divide_by_pot
from .nn import LSTM_INPUT_NAMES
from .quantized import I8, I16, _attach
from .quantized_act import _Fx, _fx_logistic, _fx_tanh, _wrap, checked_log2
from .quantized_math import _inv_sqrt_multiplier

F32 = np.float32
I32 = np.dtype(np.int32)
GATES = ("input", "forget", "cell", "output")
_POS = {name: i for i, name in enumerate(LSTM_INPUT_NAMES)}
_INT8_WEIGHTS = (*(f"{k}_to_{g}" for k in ("input", "recurrent") for g in GATES), "projection_weights")
_INT16_COEFFICIENTS = ("cell_to_input", "cell_to_forget", "cell_to_output", "input_layer_norm",
                       "forget_layer_norm", "cell_layer_norm", "output_layer_norm")
_BIASES = ("input_gate_bias", "forget_gate_bias", "cell_gate_bias", "output_gate_bias", "projection_bias")
#: lstm_eval.cc's intermediates for the 8x8_16 kernel: the four gates, then the hidden state.
N_INTERMEDIATES = 5
_INTERMEDIATE_NAMES = ("input gate", "forget gate", "cell gate", "output gate", "hidden state")


# -- fixed-point pieces of TFLite's tensor_utils -----------------------------------------------


def _sat16(x) -> np.ndarray:
    return np.clip(x, -32768, 32767)


def _rescale(acc, multiplier: int, shift: int) -> np.ndarray:
    """TFLite's int32 ``MultiplyByQuantizedMultiplier`` of ``acc`` (its int32 wrap included:
    the accumulator and the left shift are int32 in C++)."""
    acc = _wrap(acc, 32)
    left = max(shift, 0)
    return multiply_by_quantized_multiplier(_wrap(acc << left, 32), multiplier, min(shift, 0))


def _matmul_accumulate(gate: np.ndarray, v: np.ndarray, zp: int, w: np.ndarray, bias, scale: tuple[int, int]
                       ) -> np.ndarray:
    """``MatrixBatchVectorMultiplyAccumulate`` (8x8_16): ``sum(w * (v - zp)) + bias``,
    rescaled, plus the gate so far, saturated to int16."""
    acc = np.rint((v.astype(np.float64) - zp) @ w.astype(np.float64).T).astype(np.int64)
    if bias is not None:
        acc = acc + bias.astype(np.int64)
    return _sat16(_rescale(acc, *scale) + gate)


def _peephole_accumulate(gate: np.ndarray, cell: np.ndarray, w: np.ndarray, scale: tuple[int, int],
                         n_output: int) -> np.ndarray:
    """``VectorBatchVectorCwiseProductAccumulate`` as lstm_eval.cc calls it, with
    ``n_output`` as the vector length: on the first ``n_batch * n_output`` values of the
    flat ``[n_batch, n_cell]`` gate and cell, weight ``k % n_output`` on value ``k`` (the
    whole arrays, as intended, when ``n_output == n_cell``)."""
    n_batch, n_cell = gate.shape
    if n_output == n_cell:
        return _sat16(_rescale(w.astype(np.int64) * cell, *scale) + gate)
    count = n_batch * n_output
    flat, c = gate.reshape(-1).copy(), cell.reshape(-1)[:count]
    weights = np.tile(w[:n_output].astype(np.int64), n_batch)
    flat[:count] = _sat16(_rescale(weights * c, *scale) + flat[:count])
    return flat.reshape(gate.shape)


def _divide(a: np.ndarray, b: int) -> np.ndarray:
    """C++ integer division: the quotient truncated toward zero."""
    q = np.abs(a) // b
    return np.where(a < 0, -q, q)


def _inv_sqrt(variance: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``GetInvSqrtQuantizedMultiplierExp`` (reverse shift -1) of positive int32 values:
    1 gives INT32_MAX (no shift); values from 2^29 are divided by 4 first."""
    v = np.asarray(variance, np.int64)
    big = v >= (1 << 29)
    reduced = np.where(big, v // 4, v)
    raw, shift = _inv_sqrt_multiplier(np.maximum(reduced, 2))
    shift = shift - big
    return np.where(v <= 1, (1 << 31) - 1, raw), np.where(v <= 1, 0, shift)


def _layer_norm(gate: np.ndarray, weights: np.ndarray, bias: np.ndarray, scale: tuple[int, int],
                variance_guard: int) -> np.ndarray:
    """TFLite's integer ``ApplyLayerNorm`` of each row of ``gate`` (int16): mean and
    variance in units of 2^-10, the rows scaled by the inverse standard deviation, times
    the int16 coefficients plus the int32 bias, to Q3.12 with the coefficients' scale."""
    n = gate.shape[-1]
    val = gate.astype(np.int64)
    total = val.sum(axis=-1, keepdims=True)
    squares = (val * val).sum(axis=-1, keepdims=True)
    mean = _divide(total * 1024, n)
    variance = squares * ((1 << 20) // n) - mean * mean
    variance = _wrap(_divide(variance, 1 << 20), 32)
    variance = np.where(variance < 1, variance_guard, variance)
    inv_a, inv_b = _inv_sqrt(variance)
    shifted = _wrap(1024 * val - mean, 32)
    rescaled = multiply_by_quantized_multiplier(shifted, inv_a, inv_b)
    val3 = _wrap(rescaled * weights.astype(np.int64) + bias.astype(np.int64), 32)
    val4 = _divide(np.where(val3 > 0, val3 + 512, val3 - 512), 1024)
    return _sat16(_rescale(val4, scale[0], scale[1] + 12))


def _sigmoid(gate: np.ndarray) -> np.ndarray:
    """``ApplySigmoid``: gemmlowp's logistic of int16 Q3.12, Q0.15 out."""
    return _fx_logistic(_Fx(gate, 3, 16)).raw


def _tanh(x: np.ndarray, integer_bits: int) -> np.ndarray:
    """``ApplyTanh(integer_bits, ...)``: gemmlowp's tanh of int16 with ``integer_bits``
    integer bits, Q0.15 out."""
    return _fx_tanh(_Fx(x, integer_bits, 16)).raw


# -- one step ---------------------------------------------------------------------------------


def _gate(name: str, x: np.ndarray, h: np.ndarray, c: np.ndarray, w: dict, p: dict) -> np.ndarray:
    """``CalculateLstmGateInteger8x8_16`` for gate ``name``: its int16 pre-activation
    (matmuls, peephole, layer norm) through its activation."""
    scales = p["scales"]
    layer_norm = w[f"{name}_layer_norm"] is not None
    bias = None if layer_norm else w[f"{name}_gate_bias"]
    gate = np.zeros((x.shape[0], p["n_cell"]), np.int64)
    gate = _matmul_accumulate(gate, x, p["x_zp"], w[f"input_to_{name}"], bias, scales[f"input_to_{name}"])
    gate = _matmul_accumulate(gate, h, p["h_zp"], w[f"recurrent_to_{name}"], None, scales[f"recurrent_to_{name}"])
    peephole = w.get(f"cell_to_{name}") if name != "cell" else None
    if peephole is not None:
        gate = _peephole_accumulate(gate, c, peephole, scales[f"cell_to_{name}"], p["n_output"])
    if layer_norm:
        gate = _layer_norm(gate, w[f"{name}_layer_norm"], w[f"{name}_gate_bias"], scales[f"{name}_layer_norm"],
                           p["variance_guard"][name])
    return _tanh(gate, 3) if name == "cell" else _sigmoid(gate)


def _step(x: np.ndarray, h: np.ndarray, c: np.ndarray, w: dict, p: dict) -> tuple[np.ndarray, np.ndarray]:
    """``LstmStepInteger8x8_16`` on ``n_batch`` rows: int8 input ``x`` and output state
    ``h``, int16 cell state ``c`` (int64 arrays); returns the new (output state, cell)."""
    cifg = w["input_to_input"] is None
    input_gate = None if cifg else _gate("input", x, h, c, w, p)
    forget = _gate("forget", x, h, c, w, p)
    cell_gate = _gate("cell", x, h, c, w, p)
    # UpdateLstmCellInteger: products rounded by powers of two, narrowed to int16.
    kept = _wrap(rounding_divide_by_pot(forget * c, 15), 16)
    if cifg:
        input_gate = 32767 - forget
    added = _wrap(rounding_divide_by_pot(input_gate * cell_gate, 30 + p["cell_log2"]), 16)
    c = _sat16(kept + added)
    if p["cell_clip"] > 0:
        c = np.clip(c, -p["cell_clip"], p["cell_clip"])
    output_gate = _gate("output", x, h, c, w, p)
    # CalculateLstmOutputInteger8x8_16: gemmlowp's tanh of the cell with its own integer bits.
    tanh_c = _tanh(c, 15 + p["cell_log2"])
    hidden = np.clip(_rescale(output_gate * tanh_c, *p["hidden_scale"]) + p["hidden_zp"], -128, 127)
    if w["projection_weights"] is None:
        return hidden, c
    acc = np.rint((hidden.astype(np.float64) - p["hidden_zp"]) @ w["projection_weights"].astype(np.float64).T)
    acc = acc.astype(np.int64)
    if w["projection_bias"] is not None:
        acc = acc + w["projection_bias"].astype(np.int64)
    out = np.clip(_rescale(acc, *p["scales"]["projection_weights"]) + p["h_zp"], -128, 127)
    if p["proj_clip"] > 0:
        out = np.clip(out, -p["proj_clip"], p["proj_clip"])
    return out, c


def _operands(inputs: list) -> dict:
    """The node's operands by name (None when omitted), integer arrays as int64."""
    w = {}
    for i, name in enumerate(LSTM_INPUT_NAMES):
        v = inputs[i] if i < len(inputs) else None
        w[name] = None if v is None else np.asarray(v).astype(np.int64)
    return w


def _lstm_integer(inputs: list, attrs: dict) -> list[np.ndarray]:
    """One full-integer LSTM step (see the module docstring); returns [output, new output
    state, new cell state] (see state_writeback)."""
    w, p = _operands(inputs), attrs["integer_lstm"]
    x = w["input"]
    h = w["output_state"].reshape(x.shape[0], -1)
    c = w["cell_state"].reshape(x.shape[0], -1)
    h, c = _step(x, h, c, w, p)
    h8 = h.astype(np.int8)
    return [h8.copy(), h8.reshape(np.shape(inputs[18])), c.astype(np.int16).reshape(np.shape(inputs[19]))]


def _seq_lstm_integer(inputs: list, attrs: dict) -> list[np.ndarray]:
    """The full-integer LSTM over a sequence: time-major input one batch per step,
    batch-major input row by row (as LiteRT loops; only the peephole quirk tells them
    apart); returns [outputs, final output state, final cell state]."""
    w, p = _operands(inputs), attrs["integer_lstm"]
    time_major = attrs["time_major"]
    x = w["input"] if time_major else np.swapaxes(w["input"], 0, 1)
    steps, batch = x.shape[0], x.shape[1]
    h = w["output_state"].reshape(batch, -1)
    c = w["cell_state"].reshape(batch, -1)
    y = np.zeros((steps, batch, p["n_output"]), np.int64)
    if time_major:
        for t in range(steps):
            h, c = _step(x[t], h, c, w, p)
            y[t] = h
    else:
        h, c = h.copy(), c.copy()
        for b in range(batch):
            hb, cb = h[b:b + 1], c[b:b + 1]
            for t in range(steps):
                hb, cb = _step(x[t, b:b + 1], hb, cb, w, p)
                y[t, b] = hb[0]
            h[b], c[b] = hb[0], cb[0]
        y = np.swapaxes(y, 0, 1)
    return [np.ascontiguousarray(y.astype(np.int8)), h.astype(np.int8).reshape(np.shape(inputs[18])),
            c.astype(np.int16).reshape(np.shape(inputs[19]))]


# -- attrs: LiteRT's checks and PopulateQuantizedLstmParams8x8_16 ----------------------------------


def _tensor(node: Node, tensors: Sequence[Tensor], name: str) -> Tensor | None:
    i = _POS[name]
    return tensors[node.inputs[i]] if i < len(node.inputs) and node.inputs[i] >= 0 else None


def _scale_of(node: Node, tensors: Sequence[Tensor], name: str, dtype: np.dtype) -> float | None:
    """The one scale of operand ``name`` (None when omitted), refused unless it is a
    per-tensor, symmetric ``dtype`` quantized tensor."""
    t = _tensor(node, tensors, name)
    if t is None:
        return None
    p = QuantParams.of(t)
    if p is None or p.dtype != dtype:
        raise UnsupportedError(f"{name} (input {_POS[name]}) has type {t.type_name}; a full-integer LSTM takes "
                               f"it quantized {np.dtype(dtype).name.upper()}")
    if p.scales.size != 1:
        raise UnsupportedError(f"{name} (input {_POS[name]}) has {p.scales.size} scales; LiteRT's integer LSTM "
                               "reads one scale per tensor (it would take a per-channel tensor's scale as 0)")
    if np.any(p.zero_points != 0) and name not in ("output_state",):
        raise UnsupportedError(f"{name} (input {_POS[name]}) has zero point {int(p.zero_points[0])}; LiteRT's "
                               "integer LSTM ignores it (symmetric only)")
    if not (np.isfinite(p.scales[0]) and p.scales[0] > 0):
        raise ModelFormatError(f"{name} (input {_POS[name]}) has scale {p.scales[0]}: it must be positive and "
                               "finite")
    return float(p.scales[0])


def _intermediates(node: Node, tensors: Sequence[Tensor]) -> list[QuantParams]:
    count = len(node.intermediates)
    if count == 12:
        raise UnsupportedError("12 intermediates: the experimental 8x8_8 integer LSTM kernel (only the 8x8_16 one, "
                               "with 5 intermediates, is supported)")
    if count != N_INTERMEDIATES:
        raise ModelFormatError(f"{count} intermediates; a full-integer LSTM needs {N_INTERMEDIATES} (the gates' "
                               "matmul scales and the hidden state's quantization), as LiteRT does")
    out = []
    for k, t in enumerate(node.intermediates):
        p = QuantParams.of(tensors[t]) if 0 <= t < len(tensors) else None
        if p is None:
            raise ModelFormatError(f"intermediate {k} ({_INTERMEDIATE_NAMES[k]}, tensor {t}) is not quantized; "
                                   "it carries the LSTM's scales")
        if not (np.isfinite(p.scales[0]) and p.scales[0] > 0):
            raise ModelFormatError(f"intermediate {k} ({_INTERMEDIATE_NAMES[k]}) has scale {p.scales[0]}")
        out.append(p)
    return out


def _multiplier(real) -> tuple[int, int]:
    m, s = quantize_multiplier(np.float64(F32(real)))
    return int(m), int(s)


def _integer_lstm_attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
    """Check the node's types as LiteRT's Prepare does and compute what
    ``PopulateQuantizedLstmParams8x8_16`` does: the effective scales as multipliers, the
    clips in the quantized domain, the layer-norm variance guards."""
    q = base["quant"]
    x, out = q.input(0), q.output(0)
    if x is None or x.dtype != I8:
        raise UnsupportedError(f"input has type {tensors[node.inputs[0]].type_name}; the integer LSTM takes "
                               "INT8 (the 16x8 LSTM is not supported)")
    if out is None or out.dtype != I8 or not out.per_tensor:
        raise UnsupportedError("the output of a full-integer LSTM must be per-tensor quantized INT8")
    for k, p in (("input", x), ("output", out)):
        if not (np.isfinite(p.scales[0]) and p.scales[0] > 0):
            raise ModelFormatError(f"the {k} has scale {p.scales[0]}: it must be positive and finite")
    s = {name: _scale_of(node, tensors, name, I8) for name in _INT8_WEIGHTS}
    s.update({name: _scale_of(node, tensors, name, I16) for name in _INT16_COEFFICIENTS})
    for name in _BIASES:
        t = _tensor(node, tensors, name)
        if t is not None and t.dtype != I32:
            raise UnsupportedError(f"{name} (input {_POS[name]}) has type {t.type_name}; a full-integer LSTM "
                                   "takes INT32 biases")
    h_scale = _scale_of(node, tensors, "output_state", I8)
    h_zp = int(QuantParams.of(_tensor(node, tensors, "output_state")).zero_point)
    c_scale = _scale_of(node, tensors, "cell_state", I16)
    pot, cell_log2 = checked_log2(c_scale)
    if not pot:
        raise UnsupportedError(f"cell_state scale {c_scale:g} is not a power of two: LiteRT's integer LSTM "
                               "needs one (it does not check, and its outputs are then meaningless)")
    if not -15 <= cell_log2 <= -9:
        # ApplyTanh(15 + log2) dispatches on 0..6 integer bits and writes nothing otherwise.
        raise UnsupportedError(f"cell_state scale 2^{cell_log2}: LiteRT's integer LSTM takes the tanh of the "
                               "cell with 0 to 6 integer bits (a scale from 2^-15 to 2^-9) and leaves its "
                               "result undefined otherwise")
    inter = _intermediates(node, tensors)
    n_cell, n_output = _tensor(node, tensors, "recurrent_to_forget").shape
    projection = s["projection_weights"] is not None
    cifg = s["input_to_input"] is None
    peephole = s["cell_to_output"] is not None
    layer_norm = s["forget_layer_norm"] is not None
    if peephole and n_output > n_cell:
        raise UnsupportedError(f"peephole weights with n_output {n_output} > n_cell {n_cell}: LiteRT's integer "
                               "kernel reads n_output peephole values per row, past the end of its buffers")
    gates = [g for g in GATES if not (cifg and g == "input")]
    for g in gates:
        if _tensor(node, tensors, f"{g}_gate_bias") is None:
            raise ModelFormatError(f"{g}_gate_bias is missing")
    if layer_norm and any(s[f"{g}_layer_norm"] is None for g in gates):
        raise ModelFormatError("layer norm needs the coefficients of every gate")
    if peephole and any(s[f"cell_to_{g}"] is None for g in gates if g != "cell"):
        raise ModelFormatError("peephole needs cell_to_forget and cell_to_output weights (and cell_to_input "
                               "without CIFG)")
    # Effective scales, in float32 as lstm.cc computes them (its powers of two in double).
    gate_scale = {g: (float(inter[k].scales[0]) if layer_norm else 2.0 ** -12) for k, g in enumerate(GATES)}
    x_scale = F32(x.scales[0])
    hidden = inter[4]
    scales = {}
    for g in gates:
        scales[f"input_to_{g}"] = _multiplier(F32(s[f"input_to_{g}"]) * x_scale / F32(gate_scale[g]))
        scales[f"recurrent_to_{g}"] = _multiplier(F32(s[f"recurrent_to_{g}"]) * F32(h_scale) / F32(gate_scale[g]))
        if peephole and g != "cell":
            scales[f"cell_to_{g}"] = _multiplier(2.0 ** cell_log2 * np.float64(F32(s[f"cell_to_{g}"]))
                                                 / np.float64(F32(gate_scale[g])))
        if layer_norm:
            scales[f"{g}_layer_norm"] = _multiplier(s[f"{g}_layer_norm"])
    if projection:
        scales["projection_weights"] = _multiplier(F32(s["projection_weights"]) * F32(hidden.scales[0])
                                                   / F32(h_scale))
    variance_guard = {g: max(1, int(np.trunc(F32(10000) * F32(s[f"{g}_layer_norm"])))) if layer_norm else 1
                      for g in gates}
    cell_clip = F32(base["cell_clip"]) / F32(c_scale) if base["cell_clip"] > 0 else 0
    proj_clip = F32(base["proj_clip"]) / F32(out.scales[0]) if base["proj_clip"] > 0 else 0
    return {"integer_lstm": {
        "n_cell": int(n_cell), "n_output": int(n_output), "x_zp": x.zero_point, "h_zp": h_zp,
        "cell_log2": cell_log2, "scales": scales, "variance_guard": variance_guard,
        "hidden_scale": _multiplier(2.0 ** -15 / np.float64(F32(hidden.scales[0])) * 2.0 ** -15),
        "hidden_zp": int(hidden.zero_points[0]),
        "cell_clip": int(np.trunc(np.clip(cell_clip, -32768, 32767))),
        "proj_clip": int(np.trunc(np.clip(proj_clip, -128, 127))),
    }}


_attach("LSTM", _lstm_integer, _integer_lstm_attrs)
_attach("UNIDIRECTIONAL_SEQUENCE_LSTM", _seq_lstm_integer, _integer_lstm_attrs)

__all__ = ["N_INTERMEDIATES"]
