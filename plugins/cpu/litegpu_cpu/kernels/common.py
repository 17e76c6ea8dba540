"""Helpers shared by the cpu kernels: fused activations, padding, spec checks.

A fused activation is an output clamp, as in LiteRT's float kernels
(CalculateActivationRange): RELU, RELU6, RELU_N1_TO_1 clamp, NONE does nothing, and
TANH / SIGN_BIT have no range there, so they do nothing either (the ranges are
``litegpu.ops.registry.ACTIVATION_RANGES``). Numba kernels take the clamp ``(lo, hi)`` and apply it as
they store; numpy/BLAS kernels take one in-place function.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from litegpu.backend import NodeContext
from litegpu.ops.nn import conv_output_size, transpose_conv_padding
from litegpu.ops.registry import ACTIVATION_RANGES

F32 = np.dtype(np.float32)
INF = np.float32(np.inf)

InPlace = Callable[[np.ndarray], None]


def clamp_bounds(activation: str) -> tuple[np.float32, np.float32]:
    """The float32 clamp a numba kernel applies on store for ``activation``."""
    lo, hi = ACTIVATION_RANGES[activation]
    return np.float32(lo), np.float32(hi)


def _relu(out: np.ndarray) -> None:
    np.maximum(out, 0, out=out)


def activation_in_place(activation: str) -> InPlace | None:
    """One in-place function applying ``activation`` to an array, or None for NONE."""
    lo, hi = ACTIVATION_RANGES[activation]
    if lo == -np.inf and hi == np.inf:
        return None
    if activation == "RELU":
        return _relu

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


def constant_bias(ctx: NodeContext, w_index: int, x_index: int, bias_index: int) -> np.ndarray | None:
    """For conv-like nodes: the bias as a contiguous float32 array of the output channels
    (zeros when omitted), or None when the node has no float32 kernel here (non-float32
    input or weights, weights or bias computed at run time)."""
    w_spec = ctx.inputs[w_index]
    if w_spec.value is None or not all_float32(ctx, (w_index, x_index)):
        return None
    bias_spec = optional_input(ctx, bias_index)
    channels = ctx.outputs[0].shape[-1]
    if bias_spec is None:
        return np.zeros(channels, F32)
    if bias_spec.value is None:
        return None
    return np.ascontiguousarray(bias_spec.value, dtype=F32).reshape(channels)


def pad_before(padding: str, in_size: int, kernel: int, stride: int, dilation: int = 1) -> int:
    """Padding before the first element along one axis (the op definitions' rule, reused)."""
    return conv_output_size(in_size, kernel, stride, dilation, padding)[1]


def window_geometry(attrs: dict, h: int, w: int, kh: int, kw: int) -> tuple[int, int, int, int, int, int]:
    """``(sh, sw, dh, dw, pt, pl)`` of a conv or pool node with a ``kh`` x ``kw`` window over
    an ``h`` x ``w`` input: strides, dilations (1 for ops without) and padding before."""
    sh, sw = attrs["stride"]
    dh, dw = attrs.get("dilation", (1, 1))
    return sh, sw, dh, dw, pad_before(attrs["padding"], h, kh, sh, dh), pad_before(attrs["padding"], w, kw, sw, dw)


def transpose_pad_before(padding: str, out_size: int, kernel: int, stride: int) -> int:
    """Padding before along one axis of TRANSPOSE_CONV (the op definitions' rule, reused)."""
    return transpose_conv_padding(out_size, kernel, stride, padding)
