"""Neural-network ops: convolutions, pooling, fully connected, matmul, resize, embeddings,
LSTM and normalization.

Layouts follow TFLite: activations are NHWC, convolution filters ``[O, KH, KW, I]``,
depthwise filters ``[1, KH, KW, I*M]``. Padding arithmetic lives in :func:`same_padding`
and :func:`conv_output_size` only; kernels reuse them so that every backend pads alike.

The references are written for clarity first and vectorized by looping over filter taps
(a handful of iterations) while each tap is one matmul or broadcast over the whole image.
"""
from __future__ import annotations

import struct
from typing import Sequence

import numpy as np

from ..errors import ExecutionError, ModelFormatError, UnsupportedError
from ..graph import Node, Tensor
from ..model.schema import PADDING
from .registry import (OpDef, TensorSpec, activation_attr, apply_activation, broadcast_shapes,
                       check_inputs, register, value_of)

# -- padding arithmetic (the one source of truth) ----------------------------------------


def same_padding(in_size: int, k: int, stride: int, dilation: int = 1) -> tuple[int, int]:
    """TF "SAME" padding along one axis: ``(output size, padding before)``.

    The output is ``ceil(in / stride)``; the total padding is whatever makes the last
    window fit, never negative, and the odd pixel goes after (``before = total // 2``).
    """
    effective = (k - 1) * dilation + 1
    out = (in_size + stride - 1) // stride
    total = max((out - 1) * stride + effective - in_size, 0)
    return out, total // 2


def conv_output_size(in_size: int, k: int, stride: int, dilation: int, padding: str) -> tuple[int, int]:
    """Output size and padding before along one axis for ``padding`` "SAME" or "VALID".

    VALID windows never leave the input, so the output can be empty (size 0) when the
    dilated filter is larger than the input.
    """
    if padding == "SAME":
        return same_padding(in_size, k, stride, dilation)
    if padding == "VALID":
        effective = (k - 1) * dilation + 1
        return max((in_size - effective) // stride + 1, 0), 0
    raise ModelFormatError(f"unknown padding {padding!r}")


def transpose_conv_padding(out_size: int, k: int, stride: int, padding: str) -> int:
    """Padding before along one axis of a transpose conv producing ``out_size``.

    TFLite computes it as the padding of the forward conv that maps the transpose
    conv's output back to its input (dilation 1): zero for VALID.
    """
    return conv_output_size(out_size, k, stride, 1, padding)[1]


# -- attribute helpers ------------------------------------------------------------------


def _input(node: Node, tensors: Sequence[Tensor], i: int) -> Tensor | None:
    """Input tensor ``i`` of ``node``, or ``None`` when omitted (-1 or past the end)."""
    if i >= len(node.inputs) or node.inputs[i] < 0:
        return None
    idx = node.inputs[i]
    if idx >= len(tensors):
        raise ModelFormatError(f"input {i} refers to tensor {idx}, which does not exist")
    return tensors[idx]


def _required(node: Node, tensors: Sequence[Tensor], i: int, what: str) -> Tensor:
    """Input tensor ``i``; a format error naming ``what`` when it is omitted."""
    t = _input(node, tensors, i)
    if t is None:
        raise ModelFormatError(f"{what} (input {i}) is missing")
    return t


def _check_rank(t: Tensor, ranks: int | tuple[int, ...], what: str) -> None:
    ranks = (ranks,) if isinstance(ranks, int) else ranks
    if len(t.shape) not in ranks:
        want = " or ".join(str(r) for r in ranks)
        raise ModelFormatError(f"{what} must have rank {want}, has shape {list(t.shape)}")


def _check_float(t: Tensor, what: str) -> None:
    if t.dtype != np.float32:
        raise UnsupportedError(f"{what} has type {t.type_name}; only FLOAT32 is supported")


def _padding_attr(options: dict) -> str:
    code = options.get("padding", 0)
    if code not in PADDING:
        raise ModelFormatError(f"unknown padding {code}")
    return PADDING[code]


def _positive(options: dict, fields: tuple[str, str], default: int, what: str) -> tuple[int, int]:
    """An (h, w) pair of options that must be >= 1 (strides, dilations, filter sizes)."""
    values = tuple(int(options.get(f, default)) for f in fields)
    if min(values) < 1:
        raise ModelFormatError(f"{what} must be >= 1, got {list(values)}")
    return values  # type: ignore[return-value]


def _stride(options: dict) -> tuple[int, int]:
    return _positive(options, ("stride_h", "stride_w"), 0, "stride")


def _dilation(options: dict) -> tuple[int, int]:
    return _positive(options, ("dilation_h_factor", "dilation_w_factor"), 1, "dilation")


def _opt(inputs: list, i: int):
    """Input ``i`` of a reference/infer call, ``None`` when omitted."""
    return inputs[i] if i < len(inputs) else None


def _check_bias(node: Node, tensors: Sequence[Tensor], i: int, channels: int) -> bool:
    """Validate an optional bias of ``channels`` elements; True when present."""
    bias = _input(node, tensors, i)
    if bias is None:
        return False
    if tuple(bias.shape) != (channels,):
        raise ModelFormatError(f"bias has shape {list(bias.shape)}, expected [{channels}]")
    return True


# -- shared reference machinery ---------------------------------------------------------


def _pad_hw(x: np.ndarray, out_hw: tuple[int, int], k_hw: tuple[int, int], stride: tuple[int, int],
            dilation: tuple[int, int], before: tuple[int, int], value: float = 0.0) -> np.ndarray:
    """Pad an NHWC array so every window of the output grid lies inside it."""
    pads = [(0, 0)]
    for axis in (0, 1):
        need = (out_hw[axis] - 1) * stride[axis] + (k_hw[axis] - 1) * dilation[axis] + 1
        after = max(need - x.shape[axis + 1] - before[axis], 0)
        pads.append((before[axis], after))
    pads.append((0, 0))
    return np.pad(x, pads, constant_values=value)


def _tap(xp: np.ndarray, i: int, j: int, out_hw: tuple[int, int], stride: tuple[int, int],
         dilation: tuple[int, int]) -> np.ndarray:
    """The input pixels filter tap (i, j) sees at every output position: [N, OH, OW, C]."""
    h0, w0 = i * dilation[0], j * dilation[1]
    return xp[:, h0:h0 + (out_hw[0] - 1) * stride[0] + 1:stride[0],
              w0:w0 + (out_hw[1] - 1) * stride[1] + 1:stride[1], :]


def _spatial_plan(x_shape: tuple[int, ...], k_hw: tuple[int, int], attrs: dict) -> tuple[tuple, tuple]:
    """Output (OH, OW) and padding before (top, left) of a windowed op."""
    dilation = attrs.get("dilation", (1, 1))
    oh, top = conv_output_size(x_shape[1], k_hw[0], attrs["stride"][0], dilation[0], attrs["padding"])
    ow, left = conv_output_size(x_shape[2], k_hw[1], attrs["stride"][1], dilation[1], attrs["padding"])
    return (oh, ow), (top, left)


def _finish(y: np.ndarray, bias: np.ndarray | None, activation: str) -> np.ndarray:
    if bias is not None:
        y = y + bias
    return apply_activation(y, activation).astype(np.float32, copy=False)


# -- CONV_2D ----------------------------------------------------------------------------


def _conv_attrs(node: Node, tensors: Sequence[Tensor]) -> dict:
    check_inputs(node, 2, 3)
    x = _required(node, tensors, 0, "input")
    w = _required(node, tensors, 1, "filter")
    _check_rank(x, 4, "input")
    _check_rank(w, 4, "filter [O, KH, KW, I]")
    _check_float(x, "input")
    cin, cper, cout = x.shape[3], w.shape[3], w.shape[0]
    # Grouped convolution: the input's channels split into groups of the filter's I.
    if cper < 1 or cin % cper:
        raise ModelFormatError(f"input has {cin} channels, not a multiple of the filter's {cper}")
    groups = cin // cper
    if cout % groups:
        raise ModelFormatError(f"{cout} output channels do not split into {groups} groups")
    _check_bias(node, tensors, 2, cout)
    o = node.options
    return {"padding": _padding_attr(o), "stride": _stride(o), "dilation": _dilation(o),
            "activation": activation_attr(o)}


def _conv_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    x, w = inputs[0], inputs[1]
    (oh, ow), _ = _spatial_plan(x.shape, (w.shape[1], w.shape[2]), attrs)
    return [TensorSpec((x.shape[0], oh, ow, w.shape[0]), x.dtype)]


def _conv_reference(inputs: list, attrs: dict) -> list[np.ndarray]:
    """2-D convolution (grouped when input channels = groups x filter channels)."""
    x, w, bias = inputs[0], inputs[1], _opt(inputs, 2)
    n, _, _, cin = x.shape
    cout, kh, kw, cper = w.shape
    groups = cin // cper
    out_hw, before = _spatial_plan(x.shape, (kh, kw), attrs)
    stride, dilation = attrs["stride"], attrs["dilation"]
    xp = _pad_hw(x.astype(np.float32), out_hw, (kh, kw), stride, dilation, before)
    acc = np.zeros((n, *out_hw, cout), np.float32)
    w_groups = w.reshape(groups, cout // groups, kh, kw, cper)
    for i in range(kh):
        for j in range(kw):
            patch = _tap(xp, i, j, out_hw, stride, dilation)
            if groups == 1:
                acc += patch @ w[:, i, j, :].T
            else:
                grouped = patch.reshape(n, *out_hw, groups, cper)
                acc += np.einsum("nhwgc,goc->nhwgo", grouped, w_groups[:, :, i, j, :]).reshape(acc.shape)
    return [_finish(acc, bias, attrs["activation"])]


register(OpDef(name="CONV_2D", attrs=_conv_attrs, infer=_conv_infer, reference=_conv_reference,
               doc="2-D convolution, NHWC input, [O, KH, KW, I] filter, optional bias, grouped."))


# -- DEPTHWISE_CONV_2D ------------------------------------------------------------------


def _depthwise_attrs(node: Node, tensors: Sequence[Tensor]) -> dict:
    check_inputs(node, 2, 3)
    x = _required(node, tensors, 0, "input")
    w = _required(node, tensors, 1, "filter")
    _check_rank(x, 4, "input")
    _check_rank(w, 4, "filter [1, KH, KW, I*M]")
    _check_float(x, "input")
    if w.shape[0] != 1:
        raise ModelFormatError(f"depthwise filter must have shape [1, KH, KW, I*M], has {list(w.shape)}")
    cin, cout = x.shape[3], w.shape[3]
    # Like LiteRT (since op version 2), the multiplier comes from the shapes; the option
    # field is often stale in converted models, so it is not trusted.
    if cin < 1 or cout % cin:
        raise ModelFormatError(f"filter has {cout} channels, not a multiple of the input's {cin}")
    _check_bias(node, tensors, 2, cout)
    o = node.options
    return {"padding": _padding_attr(o), "stride": _stride(o), "dilation": _dilation(o),
            "activation": activation_attr(o), "depth_multiplier": cout // cin}


def _depthwise_reference(inputs: list, attrs: dict) -> list[np.ndarray]:
    """Depthwise convolution: output channel ``c*M + m`` filters input channel ``c``."""
    x, w, bias = inputs[0], inputs[1], _opt(inputs, 2)
    n, _, _, cin = x.shape
    _, kh, kw, cout = w.shape
    m = cout // cin
    out_hw, before = _spatial_plan(x.shape, (kh, kw), attrs)
    stride, dilation = attrs["stride"], attrs["dilation"]
    xp = _pad_hw(x.astype(np.float32), out_hw, (kh, kw), stride, dilation, before)
    w_split = w.reshape(kh, kw, cin, m)
    acc = np.zeros((n, *out_hw, cin, m), np.float32)
    for i in range(kh):
        for j in range(kw):
            acc += _tap(xp, i, j, out_hw, stride, dilation)[..., None] * w_split[i, j]
    return [_finish(acc.reshape(n, *out_hw, cout), bias, attrs["activation"])]


def _depthwise_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    x, w = inputs[0], inputs[1]
    (oh, ow), _ = _spatial_plan(x.shape, (w.shape[1], w.shape[2]), attrs)
    return [TensorSpec((x.shape[0], oh, ow, w.shape[3]), x.dtype)]


register(OpDef(name="DEPTHWISE_CONV_2D", attrs=_depthwise_attrs, infer=_depthwise_infer,
               reference=_depthwise_reference,
               doc="Depthwise 2-D convolution with depth multiplier, NHWC, [1, KH, KW, I*M] filter."))
