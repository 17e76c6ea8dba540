"""Hybrid (dynamic-range) LSTM and UNIDIRECTIONAL_SEQUENCE_LSTM: float activations and
state, int8 constant weights.

TensorFlow's converter with ``Optimize.DEFAULT`` and no representative dataset stores an
LSTM's gate matrices (and its projection and peephole weights) as symmetric int8 with one
scale per tensor and keeps the input, the biases, the layer-norm coefficients and the
state in float32. LiteRT runs such a node on its builtin hybrid kernel (lstm_eval.cc,
``LstmStepHybrid``); XNNPACK takes no LSTM, so its default interpreter gives the same
bits as the builtin resolver alone (measured). One step, as that kernel does it:

- the input rows and the output-state rows are quantized on the fly, each row on its
  own (:func:`litegpu.ops.hybrid.tflite_quantize_rows`: symmetric, or asymmetric with
  the op's ``asymmetric_quantize_inputs``); an input or output state that is all zeros
  is not quantized and contributes nothing;
- each gate starts from its bias (from 0 with layer norm), then adds, in this order,
  ``float(sum) * (row_scale * weight_scale)`` for the input and for the output state
  (exact integer sums; the zero point is taken out with the weights' row sums), then
  ``(peephole * scale) * cell``; each step rounds to float32 (the x86 build fuses no
  multiply-add);
- the gate math is the float step's (shared, :func:`litegpu.ops.nn._lstm_step`), with
  Eigen's activations as LiteRT's SSE build evaluates them (:func:`eigen_tanh`,
  :func:`eigen_logistic`);
- the projection starts from its bias and adds the quantized ``output_gate *
  act(cell)`` times the int8 projection weights, the same way.

The sequence op runs time-major input as one batch per step; batch-major input row by
row (LiteRT loops over the batch with ``n_batch = 1``), which decides which elements
the logistic computes in its scalar tail (see :func:`eigen_logistic`).

Checked against LiteRT in tests/test_ops_hybrid_lstm.py, layer norm included (it
follows the portable ``MeanStddevNormalization``: sequential float32 sums): bit for bit
wherever every gate vector is whole SIMD packets (``n_cell * batch``, or ``n_cell`` for a
batch-major sequence, a multiple of 4). Otherwise the logistic of a few values goes
through glibc's expf (:func:`_logistic_scalar`), where a gate value may differ by an ulp,
rarely; measured: 1 element of 84 off by 1 ulp in one of the test's 8 such cases.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import ModelFormatError, UnsupportedError
from ..graph import Node, Tensor
from .hybrid import tflite_quantize_rows
from .nn import (LAYER_NORM_EPSILON, LSTM_ACTIVATIONS, LSTM_INPUT_NAMES, LstmMath, _lstm_sequence, _lstm_step, _lstm_weights,
                 _write_back_state)
from .registry import get_op

F32 = np.float32
I8 = np.dtype(np.int8)

_MATRICES = tuple(f"{kind}_to_{gate}" for kind in ("input", "recurrent") for gate in ("input", "forget", "cell",
                                                                                     "output"))
_PEEPHOLES = ("cell_to_input", "cell_to_forget", "cell_to_output")
#: The int8 weights of a hybrid LSTM (those present), by name.
HYBRID_WEIGHTS = (*_MATRICES, *_PEEPHOLES, "projection_weights")
_FLOAT_OPERANDS = ("input_gate_bias", "forget_gate_bias", "cell_gate_bias", "output_gate_bias", "projection_bias",
                   "input_layer_norm", "forget_layer_norm", "cell_layer_norm", "output_layer_norm")

#: Floats per SIMD packet in Eigen as LiteRT's x86 wheel is built (SSE: 4; measured).
PACKET = 4


# -- Eigen's activations (LiteRT's tensor_utils::ApplyActivationToVector) ---------------------


def _polevl(x2: np.ndarray, coeffs: Sequence[float]) -> np.ndarray:
    """Horner's rule in float32, highest coefficient first, a multiply and an add each
    rounded (Eigen's ``ppolevl`` without FMA)."""
    p = np.full_like(x2, F32(coeffs[0]))
    for c in coeffs[1:]:
        p = p * x2 + F32(c)
    return p


def eigen_tanh(a: np.ndarray) -> np.ndarray:
    """Eigen's fast float tanh (``ptanh_float``, no FMA): the input clamped to
    +-7.90738964, then a [9/8] rational function of it; the same on packets and
    scalars. Bit for bit LiteRT's TANH on a grid of 200003 points in [-10, 10]."""
    clamp = F32(7.90738964080810547)
    x = np.clip(np.asarray(a, F32), -clamp, clamp)
    x2 = x * x
    x3 = x2 * x
    p = _polevl(x2, (1.394553628e-8, 2.102733560e-5, 3.520756727e-3, 1.340216100e-1))
    q = _polevl(x2, (8.015776984e-7, 3.326951409e-4, 2.597254514e-2, 4.673548340e-1, 1.0))
    return (x3 * p + x) / q


def _logistic_packet(a: np.ndarray) -> np.ndarray:
    """Eigen's packet logistic for float: ``e / (1 + e)`` with ``e = exp(x)`` from
    Cephes' range reduction on ``x / 2`` (a degree-5 polynomial, exact scaling by
    ``2^m``) squared; 0 below -104, the input clamped at 16.6355324."""
    f = F32
    x = np.minimum(np.asarray(a, f), f(16.6355324)) * f(0.5)
    m = np.floor(x * f(1.44269504088896341) + f(0.5))
    r = m * f(-0.693359375) + x
    r = m * f(2.12194440e-4) + r
    r2 = r * r
    even = r2 * f(4.1898667812347412109375e-2) + f(0.49999141693115234375)
    odd = r2 * f(8.33471305668354034423828125e-3) + f(0.16666877269744873046875)
    p = r2 * (r * odd + even) + (r + f(1))
    with np.errstate(over="ignore"):
        e = p * np.ldexp(f(1), m.astype(np.int32)).astype(f)
        e = e * e
        y = e / (f(1) + e)
    return np.where(np.asarray(a) < f(-104), f(0), y).astype(f)


def _logistic_scalar(a: np.ndarray) -> np.ndarray:
    """Eigen's scalar logistic for float: ``e / (1 + e)`` with ``e = expf(min(x,
    16.6355324))``. LiteRT calls glibc's expf, which is not correctly rounded (0.502 ulp;
    measured: 4 of 9000 random arguments in [-8, 8] give another logistic, by 1 ulp) and
    picks its code at run time by CPU (an FMA variant); here ``e`` is the correctly
    rounded exp."""
    with np.errstate(over="ignore"):
        e = np.exp(np.minimum(np.asarray(a, F32), F32(16.6355324)).astype(np.float64)).astype(F32)
        return e / (F32(1) + e)


def eigen_logistic(z: np.ndarray, offset: int = 0) -> np.ndarray:
    """The logistic of ``z`` as Eigen computes a vector of it that starts ``offset``
    floats after a packet-aligned address: whole packets of :data:`PACKET` aligned
    floats by :func:`_logistic_packet`, the unaligned head and the tail by
    :func:`_logistic_scalar` (they differ by up to 2 ulps)."""
    flat = np.asarray(z, F32).ravel()
    out = _logistic_packet(flat)
    head = min((-offset) % PACKET, flat.size)
    tail = head + (flat.size - head) // PACKET * PACKET
    out[:head] = _logistic_scalar(flat[:head])
    out[tail:] = _logistic_scalar(flat[tail:])
    return out.reshape(np.shape(z))


# -- the hybrid step -----------------------------------------------------------------------


def _mean_stddev_normalization(z: np.ndarray) -> np.ndarray:
    """TFLite's portable ``MeanStddevNormalization`` per row, in float32: sequential sums
    for the mean and for the squared deviations, ``1 / sqrt(variance + 1e-8)``."""
    z = np.asarray(z, F32)
    n = F32(z.shape[-1])
    total = np.zeros(z.shape[:-1], F32)
    for i in range(z.shape[-1]):
        total = total + z[..., i]
    mean = total / n
    squares = np.zeros(z.shape[:-1], F32)
    for i in range(z.shape[-1]):
        diff = z[..., i] - mean
        squares = squares + diff * diff
    inv = F32(1) / np.sqrt(squares / n + F32(LAYER_NORM_EPSILON))
    return (z - mean[..., None]) * inv[..., None]


class HybridLstmMath(LstmMath):
    """The arithmetic of LiteRT's ``LstmStepHybrid`` (see the module docstring) for
    :func:`litegpu.ops.nn._lstm_step`."""

    def __init__(self, x: np.ndarray, h: np.ndarray, w: dict, attrs: dict) -> None:
        super().__init__(x, h, w, attrs)
        asymmetric = attrs["asymmetric"]
        # An all-zero input or state is skipped, not quantized.
        self.x_rows = tflite_quantize_rows(x, asymmetric) if np.any(x) else None
        self.h_rows = tflite_quantize_rows(h, asymmetric) if np.any(h) else None
        # LiteRT's gate scratch buffers lie one after another from an aligned base, each
        # [n_batch, n_cell] (input, cell, forget, output; no input gate with CIFG); a
        # batch-major sequence runs row ``scratch_row`` of them alone. Where a gate's
        # values start decides which the logistic computes in whole packets.
        order = ("cell", "forget", "output") if w["input_to_input"] is None else ("input", "cell", "forget", "output")
        n_cell = w["input_to_forget"].shape[0]
        size = attrs.get("scratch_batch", x.shape[0]) * n_cell
        start = attrs.get("scratch_row", 0) * n_cell
        self.offset = {name: k * size + start for k, name in enumerate(order)}

    def _accumulate(self, z: np.ndarray, rows, weights: str) -> np.ndarray:
        """``z + float(sum) * (row_scale * weight_scale)`` per row and output unit."""
        if rows is None:
            return z
        q, row_scale, _ = rows
        sums = q @ self.w[weights].astype(np.float64).T
        factor = row_scale * self.attrs["weight_scale"][weights]
        return z + sums.astype(F32) * factor[:, None]

    def gate(self, name: str, peephole_c: np.ndarray | None) -> np.ndarray:
        w = self.w
        bias, norm = w[f"{name}_gate_bias"], w[f"{name}_layer_norm"]
        shape = (self.x.shape[0], bias.size)
        z = np.zeros(shape, F32) if norm is not None else np.broadcast_to(bias, shape).astype(F32)
        z = self._accumulate(z, self.x_rows, f"input_to_{name}")
        z = self._accumulate(z, self.h_rows, f"recurrent_to_{name}")
        if peephole_c is not None and w.get(f"cell_to_{name}") is not None:
            z = z + w[f"cell_to_{name}"] * self.attrs["weight_scale"][f"cell_to_{name}"] * peephole_c
        if norm is not None:
            z = _mean_stddev_normalization(z) * norm + bias
        return z

    def sigmoid(self, z: np.ndarray, name: str) -> np.ndarray:
        return eigen_logistic(z, self.offset[name])

    def act(self, z: np.ndarray) -> np.ndarray:
        activation = self.attrs["activation"]
        return eigen_tanh(z) if activation == "TANH" else LSTM_ACTIVATIONS[activation](z).astype(F32)

    def project(self, out: np.ndarray) -> np.ndarray:
        bias = self.w["projection_bias"]
        shape = (out.shape[0], self.w["projection_weights"].shape[0])
        z = np.zeros(shape, F32) if bias is None else np.broadcast_to(bias, shape).astype(F32)
        rows = tflite_quantize_rows(out, self.attrs["asymmetric"]) if np.any(out) else None
        return self._accumulate(z, rows, "projection_weights")


# -- attrs and references -------------------------------------------------------------------


def _hybrid_lstm_attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
    """Check that every weight present is symmetric per-tensor int8 and everything else
    float32; collect the weight scales and the input quantization mode."""
    quant = base["quant"]
    scales = {}
    for pos, name in enumerate(LSTM_INPUT_NAMES):
        if pos >= len(node.inputs) or node.inputs[pos] < 0:
            continue
        t = tensors[node.inputs[pos]]
        if name in HYBRID_WEIGHTS:
            p = quant.input(pos)
            if p is None or p.dtype != I8:
                raise UnsupportedError(f"{name} (input {pos}) has type {t.type_name}; a hybrid LSTM takes int8 "
                                       "weights (all of them)")
            if p.scales.size != 1:
                raise UnsupportedError(f"{name} (input {pos}) has {p.scales.size} scales; LiteRT's hybrid LSTM "
                                       "takes one scale per weight tensor")
            if np.any(p.zero_points != 0):
                raise UnsupportedError(f"{name} (input {pos}) has zero point {int(p.zero_points[0])}; hybrid "
                                       "weights are symmetric")
            if not np.isfinite(p.scales[0]):
                raise ModelFormatError(f"{name} (input {pos}) has scale {p.scales[0]}: it must be finite")
            scales[name] = F32(p.scales[0])
        elif name in _FLOAT_OPERANDS and t.dtype != np.float32:
            raise UnsupportedError(f"{name} (input {pos}) has type {t.type_name}; a hybrid LSTM takes it in "
                                   "FLOAT32")
    if base["activation"] == "NONE":
        # LiteRT leaves the cell gate's scratch unwritten for NONE (see LSTM_ACTIVATIONS).
        raise UnsupportedError("a hybrid LSTM with activation NONE (LiteRT's result is undefined)")
    return {"weight_scale": scales, "asymmetric": bool(node.options.get("asymmetric_quantize_inputs", False))}


def _lstm_hybrid(inputs: list, attrs: dict) -> list[np.ndarray]:
    """One hybrid LSTM step (see the module docstring); returns [output, new output
    state, new cell state] (see state_writeback)."""
    w = _lstm_weights(inputs)
    x = w["input"]
    h = w["output_state"].reshape(x.shape[0], -1)
    c = w["cell_state"].reshape(x.shape[0], -1)
    h, c = _lstm_step(x, h, c, w, attrs, HybridLstmMath)
    return [h.copy(), h.reshape(np.shape(inputs[18])), c.reshape(np.shape(inputs[19]))]


def _seq_lstm_hybrid(inputs: list, attrs: dict) -> list[np.ndarray]:
    """The hybrid LSTM over a sequence: time-major input one batch per step, batch-major
    input row by row, as LiteRT loops; returns [outputs, final output state, final cell
    state] (see state_writeback)."""
    w = _lstm_weights(inputs)
    x = w["input"] if attrs["time_major"] else np.swapaxes(w["input"], 0, 1)
    batch = x.shape[1]
    h = w["output_state"].reshape(batch, -1)
    c = w["cell_state"].reshape(batch, -1)
    if attrs["time_major"] or batch == 0:
        y, h, c = _lstm_sequence(x, h, c, w, attrs, HybridLstmMath)
    else:
        rows = [_lstm_sequence(x[:, b:b + 1], h[b:b + 1], c[b:b + 1], w,
                               {**attrs, "scratch_batch": batch, "scratch_row": b}, HybridLstmMath)
                for b in range(batch)]
        y = np.swapaxes(np.concatenate([r[0] for r in rows], axis=1), 0, 1)
        h = np.concatenate([r[1] for r in rows])
        c = np.concatenate([r[2] for r in rows])
    if not attrs["time_major"] and batch == 0:
        y = np.swapaxes(y, 0, 1)
    return [np.ascontiguousarray(y), h.reshape(np.shape(inputs[18])), c.reshape(np.shape(inputs[19]))]


def _attach(op: str, hybrid) -> None:
    """Give ``op`` its hybrid reference, and an ``execute`` that runs whichever reference
    the node's attrs select (float or hybrid) and writes the state back."""
    opdef = get_op(op)
    opdef.hybrid = hybrid
    opdef.hybrid_attrs = _hybrid_lstm_attrs
    opdef.execute = _write_back_state(lambda inputs, attrs: opdef.reference_for(attrs)(inputs, attrs))


_attach("LSTM", _lstm_hybrid)
_attach("UNIDIRECTIONAL_SEQUENCE_LSTM", _seq_lstm_hybrid)

__all__ = ["HYBRID_WEIGHTS", "HybridLstmMath", "eigen_logistic", "eigen_tanh"]
