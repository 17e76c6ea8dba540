"""Helpers shared by the cpu kernels: fused activations, padding, spec checks.

Fused activations come in two forms. Numba kernels take a clamp ``(lo, hi)`` applied
as they store (RELU, RELU6, RELU_N1_TO_1 and NONE are all clamps); the rare
non-clamp activations (TANH, SIGN_BIT) run afterwards in place. Numpy/BLAS kernels
take one in-place function for the whole activation.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from litegpu.backend import NodeContext
from litegpu.ops.nn import conv_output_size, transpose_conv_padding

F32 = np.dtype(np.float32)
INF = np.float32(np.inf)

# name -> (lo, hi) for the activations that are a clamp.
_CLAMPS: dict[str, tuple[float, float]] = {
    "NONE": (-np.inf, np.inf),
    "RELU": (0.0, np.inf),
    "RELU6": (0.0, 6.0),
    "RELU_N1_TO_1": (-1.0, 1.0),
    "TANH": (-np.inf, np.inf),       # not a clamp: see post_activation
    "SIGN_BIT": (-np.inf, np.inf),   # not a clamp: see post_activation
}

InPlace = Callable[[np.ndarray], None]


def clamp_bounds(activation: str) -> tuple[np.float32, np.float32]:
    """The float32 clamp a numba kernel applies on store for ``activation``."""
    lo, hi = _CLAMPS[activation]
    return np.float32(lo), np.float32(hi)


def _tanh(out: np.ndarray) -> None:
    np.tanh(out, out=out)


def _sign(out: np.ndarray) -> None:
    np.sign(out, out=out)


def post_activation(activation: str) -> InPlace | None:
    """The in-place step left after the clamp, for activations that are not clamps."""
    return {"TANH": _tanh, "SIGN_BIT": _sign}.get(activation)


def _relu(out: np.ndarray) -> None:
    np.maximum(out, 0, out=out)


def activation_in_place(activation: str) -> InPlace | None:
    """One in-place function applying ``activation`` to an array, or None for NONE."""
    if activation == "NONE":
        return None
    if activation == "RELU":
        return _relu
    post = post_activation(activation)
    if post is not None:
        return post
    lo, hi = _CLAMPS[activation]

    def clamp(out: np.ndarray) -> None:
        np.clip(out, lo, hi, out=out)

    return clamp


def all_float32(ctx: NodeContext, inputs: tuple[int, ...] = (0,)) -> bool:
    """True when the listed inputs and every output are float32 (the dtype we have kernels for)."""
    for i in inputs:
        spec = ctx.inputs[i] if i < len(ctx.inputs) else None
        if spec is None or np.dtype(spec.dtype) != F32:
            return False
    return all(np.dtype(o.dtype) == F32 for o in ctx.outputs)


def optional_input(ctx: NodeContext, i: int):
    """The spec of optional input ``i``, or None when omitted."""
    return ctx.inputs[i] if i < len(ctx.inputs) else None


def pad_before(padding: str, in_size: int, kernel: int, stride: int, dilation: int = 1) -> int:
    """Padding before the first element along one axis (the op definitions' rule, reused)."""
    return conv_output_size(in_size, kernel, stride, dilation, padding)[1]


def transpose_pad_before(padding: str, out_size: int, kernel: int, stride: int) -> int:
    """Padding before along one axis of TRANSPOSE_CONV (the op definitions' rule, reused)."""
    return transpose_conv_padding(out_size, kernel, stride, padding)
