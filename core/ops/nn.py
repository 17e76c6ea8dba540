"""Neural-network ops: convolutions, pooling, fully connected, matmul, resize, embeddings,
LSTM and normalization.

Layouts follow TFLite: activations are NHWC, convolution filters ``[O, KH, KW, I]``,
depthwise filters ``[1, KH, KW, I*M]``. Padding arithmetic lives in :func:`same_padding`
and :func:`conv_output_size` only; kernels reuse them so that every backend pads alike.

The references are written for clarity first and vectorized by looping over filter taps
(a handful of iterations) while each tap is one matmul or broadcast over the whole image.

Normalized attributes (kernels are written against these names):

- CONV_2D: ``padding`` ("SAME"/"VALID"), ``stride`` (sh, sw), ``dilation`` (dh, dw),
  ``activation``; grouped when input channels = groups x filter I.
- DEPTHWISE_CONV_2D: the same plus ``depth_multiplier`` (from the shapes, not the option).
- TRANSPOSE_CONV, Convolution2DTransposeBias: ``padding``, ``stride``, ``activation``.
- AVERAGE/MAX/L2_POOL_2D: ``padding``, ``stride``, ``filter`` (fh, fw), ``activation``.
- FULLY_CONNECTED: ``activation``, ``keep_num_dims``. BATCH_MATMUL: ``adj_x``, ``adj_y``.
- RESIZE_BILINEAR / RESIZE_NEAREST_NEIGHBOR: ``align_corners``, ``half_pixel_centers``;
  RESIZE_BILINEAR also ``xnnpack`` (its size is a constant, so LiteRT runs XNNPACK's kernel).
- LSTM / UNIDIRECTIONAL_SEQUENCE_LSTM: ``activation``, ``cell_clip``, ``proj_clip``,
  ``state_writeback`` (and ``time_major``); see the LSTM section for state handling.
- LOCAL_RESPONSE_NORMALIZATION: ``radius``, ``bias``, ``alpha``, ``beta``.
  (L2_NORMALIZATION lives in :mod:`litegpu.ops.reduce`.)

``activation`` of the conv-like ops and pools is what LiteRT's float kernels really do:
TANH and SIGN_BIT become NONE (see :func:`_clamp_activation`).
"""
from __future__ import annotations

import functools
import struct
from typing import Sequence

import numpy as np

from ..errors import ExecutionError, ModelFormatError, UnsupportedError
from ..graph import Node, Tensor
from ..model.schema import PADDING
from ..quant import is_quantized
from .registry import (ACTIVATION_RANGES, CLAMP_ACTIVATIONS, OpDef, TensorSpec, activation_attr, apply_activation,
                       broadcast_shapes, check_inputs, need_rank, register, value_of)

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


def _need_spatial(x: Sequence[int], what: str = "input 0") -> None:
    """LiteRT's conv kernels refuse an empty image (height or width 0); an empty batch runs."""
    if x[1] < 1 or x[2] < 1:
        raise ModelFormatError(f"{what} has shape {list(x)}: height and width must be positive")


def _check_float(t: Tensor, what: str) -> None:
    # Quantized integers are checked by the op's integer reference (litegpu.ops.quantized).
    if t.dtype != np.float32 and not is_quantized(t):
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


# LiteRT's float kernels turn a fused activation into a clamp range
# (CalculateActivationRange); TANH and SIGN_BIT have no range there, so conv, depthwise,
# transpose conv and pooling silently ignore them. The normalized attr says what runs.
_CLAMP_ACTIVATIONS = CLAMP_ACTIVATIONS


def _clamp_activation(options: dict) -> str:
    """The fused activation a LiteRT float kernel really applies: a clamp, or NONE."""
    name = activation_attr(options)
    return name if name in _CLAMP_ACTIVATIONS else "NONE"


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
    if attrs.get("window_clamped"):
        # XNNPACK shrinks a VALID window larger than the input to the input: one output.
        oh, ow = (max(oh, 1) if x_shape[1] else 0), (max(ow, 1) if x_shape[2] else 0)
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
    _check_float(x, "input")
    _check_float(w, "filter")
    _conv_operands(x.shape, w.shape)
    _check_bias(node, tensors, 2, w.shape[0])
    o = node.options
    return {"padding": _padding_attr(o), "stride": _stride(o), "dilation": _dilation(o),
            "activation": _clamp_activation(o), "filter_constant": w.is_constant}


def _conv_plan_check(planned: list, inputs: list[TensorSpec], attrs: dict) -> None:
    """LiteRT refuses a CONV_2D whose input channels changed from the planned ones.

    With a constant filter (fp16 weights behind a DEQUANTIZE count as constant too)
    LiteRT runs CONV_2D in XNNPACK, which fixes the groups from the input's channels when
    it plans the node: the resized count for a subgraph input, the declared count for a
    tensor inside the model. A resize that changes the channels reaching a convolution
    inside the model (resnet18_fp16 at 6 input channels: its first CONV_2D reads a PAD's
    output, declared with 3) then fails there; a runtime filter runs on LiteRT's builtin
    kernel, which re-derives the groups.
    """
    x, declared = inputs[0].shape, planned[0]
    if attrs.get("filter_constant") and len(x) == 4 and len(declared) == 4 and x[3] != declared[3]:
        raise ModelFormatError(f"input 0 has shape {list(x)} ({x[3]} channels); the model declares "
                               f"{list(declared)} and LiteRT fixes the convolution's groups from those "
                               f"{declared[3]} channels")


def _conv_operands(x: Sequence[int], w: Sequence[int]) -> None:
    """Input and filter shapes agree: ranks, and input channels = groups x filter I."""
    need_rank(x, 4, "input 0")
    need_rank(w, 4, "filter [O, KH, KW, I]")
    cin, cper, cout = x[3], w[3], w[0]
    # Grouped convolution: the input's channels split into groups of the filter's I.
    if cper < 1 or cin % cper:
        raise ModelFormatError(f"input 0 has shape {list(x)} ({cin} channels), not a multiple of the "
                               f"{cper} input channels of the filter, shape {list(w)}")
    groups = cin // cper
    if groups < 1 or cout % groups:  # groups 0: an input with no channels (LiteRT divides by it)
        raise ModelFormatError(f"the filter's {cout} output channels (shape {list(w)}) do not split into the "
                               f"{groups} groups of input 0, shape {list(x)}")


def _conv_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    x, w = inputs[0], inputs[1]
    # A resized input whose channels are a multiple of the filter's runs as a grouped
    # conv, as in LiteRT.
    _conv_operands(x.shape, w.shape)
    if len(inputs) < 3 or inputs[2] is None:
        if x.shape[3] != w.shape[3]:
            # LiteRT's kernel takes a grouped conv only with a bias (conv.cc: has_bias).
            raise ModelFormatError(f"input 0 has shape {list(x.shape)}: a grouped convolution "
                                   f"(filter {list(w.shape)}) needs a bias (input 2)")
    _need_spatial(x.shape)
    (oh, ow), _ = _spatial_plan(x.shape, (w.shape[1], w.shape[2]), attrs)
    return [TensorSpec((x.shape[0], oh, ow, w.shape[0]), x.dtype)]


def conv_sums(x: np.ndarray, w: np.ndarray, attrs: dict) -> np.ndarray:
    """The sums of a 2-D convolution (grouped when input channels = groups x filter
    channels) of ``x`` [N, H, W, I], zero-padded, by ``w`` [O, KH, KW, I / groups], in
    ``x``'s dtype; no bias, no activation. The float reference and the integer one (on
    ``x`` less its zero point, exact in float64) share it."""
    n, _, _, cin = x.shape
    cout, kh, kw, cper = w.shape
    groups = cin // cper
    out_hw, before = _spatial_plan(x.shape, (kh, kw), attrs)
    stride, dilation = attrs["stride"], attrs["dilation"]
    xp = _pad_hw(x, out_hw, (kh, kw), stride, dilation, before)
    acc = np.zeros((n, *out_hw, cout), x.dtype)
    w_groups = w.reshape(groups, cout // groups, kh, kw, cper)
    for i in range(kh):
        for j in range(kw):
            patch = _tap(xp, i, j, out_hw, stride, dilation)
            if groups == 1:
                acc += patch @ w[:, i, j, :].T
            else:
                grouped = patch.reshape(n, *out_hw, groups, cper)
                acc += np.einsum("nhwgc,goc->nhwgo", grouped, w_groups[:, :, i, j, :]).reshape(acc.shape)
    return acc


def _conv_reference(inputs: list, attrs: dict) -> list[np.ndarray]:
    """2-D convolution (grouped when input channels = groups x filter channels)."""
    x, w, bias = inputs[0], inputs[1], _opt(inputs, 2)
    return [_finish(conv_sums(x.astype(np.float32), w, attrs), bias, attrs["activation"])]


register(OpDef(name="CONV_2D", attrs=_conv_attrs, infer=_conv_infer, reference=_conv_reference,
               plan_check=_conv_plan_check,
               doc="2-D convolution, NHWC input, [O, KH, KW, I] filter, optional bias, grouped."))


# -- DEPTHWISE_CONV_2D ------------------------------------------------------------------


def _depthwise_attrs(node: Node, tensors: Sequence[Tensor]) -> dict:
    check_inputs(node, 2, 3)
    x = _required(node, tensors, 0, "input")
    w = _required(node, tensors, 1, "filter")
    _check_float(x, "input")
    _check_float(w, "filter")
    _depthwise_operands(x.shape, w.shape)
    _check_bias(node, tensors, 2, w.shape[3])
    o = node.options
    return {"padding": _padding_attr(o), "stride": _stride(o), "dilation": _dilation(o),
            "activation": _clamp_activation(o), "depth_multiplier": w.shape[3] // x.shape[3],
            "fixed_multiplier": activation_attr(o) in _CLAMP_ACTIVATIONS}


def _depthwise_operands(x: Sequence[int], w: Sequence[int]) -> None:
    """Input and filter shapes agree: ranks, a [1, KH, KW, I*M] filter, I*M a multiple of
    the input's channels. Like LiteRT (since op version 2), the multiplier comes from the
    shapes; the option field is often stale in converted models, so it is not trusted."""
    need_rank(x, 4, "input 0")
    need_rank(w, 4, "filter [1, KH, KW, I*M]")
    if w[0] != 1:
        raise ModelFormatError(f"depthwise filter must have shape [1, KH, KW, I*M], has {list(w)}")
    cin, cout = x[3], w[3]
    if cin < 1 or cout % cin:
        raise ModelFormatError(f"the filter's {cout} channels (shape {list(w)}) are not a multiple of the "
                               f"{cin} channels of input 0, shape {list(x)}")


def depthwise_sums(x: np.ndarray, w: np.ndarray, attrs: dict) -> np.ndarray:
    """The sums of a depthwise convolution of ``x`` [N, H, W, C], zero-padded, by ``w``
    [1, KH, KW, C * M] (output channel ``c*M + m`` filters input channel ``c``), in
    ``x``'s dtype; no bias, no activation (shared like :func:`conv_sums`)."""
    n, _, _, cin = x.shape
    _, kh, kw, cout = w.shape
    m = cout // cin
    out_hw, before = _spatial_plan(x.shape, (kh, kw), attrs)
    stride, dilation = attrs["stride"], attrs["dilation"]
    xp = _pad_hw(x, out_hw, (kh, kw), stride, dilation, before)
    w_split = w.reshape(kh, kw, cin, m)
    acc = np.zeros((n, *out_hw, cin, m), x.dtype)
    for i in range(kh):
        for j in range(kw):
            acc += _tap(xp, i, j, out_hw, stride, dilation)[..., None] * w_split[i, j]
    return acc.reshape(n, *out_hw, cout)


def _depthwise_reference(inputs: list, attrs: dict) -> list[np.ndarray]:
    """Depthwise convolution: output channel ``c*M + m`` filters input channel ``c``."""
    x, w, bias = inputs[0], inputs[1], _opt(inputs, 2)
    return [_finish(depthwise_sums(x.astype(np.float32), w, attrs), bias, attrs["activation"])]


def _depthwise_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    x, w = inputs[0], inputs[1]
    _depthwise_operands(x.shape, w.shape)
    if attrs.get("fixed_multiplier", True) and x.shape[3] * attrs["depth_multiplier"] != w.shape[3]:
        # LiteRT's default (XNNPACK) path keeps the model's multiplier: a resized input
        # must keep its channel count. (Its builtin kernel, which runs nodes with a TANH
        # or SIGN_BIT activation, takes any divisor of the filter's channels.)
        raise ModelFormatError(f"input 0 has shape {list(x.shape)}; the filter, shape {list(w.shape)}, "
                               f"needs {w.shape[3] // attrs['depth_multiplier']} input channels")
    _need_spatial(x.shape)
    (oh, ow), _ = _spatial_plan(x.shape, (w.shape[1], w.shape[2]), attrs)
    return [TensorSpec((x.shape[0], oh, ow, w.shape[3]), x.dtype)]


register(OpDef(name="DEPTHWISE_CONV_2D", attrs=_depthwise_attrs, infer=_depthwise_infer,
               reference=_depthwise_reference,
               doc="Depthwise 2-D convolution with depth multiplier, NHWC, [1, KH, KW, I*M] filter."))


# -- TRANSPOSE_CONV and MediaPipe's Convolution2DTransposeBias ---------------------------


def transpose_conv_sums(x: np.ndarray, w: np.ndarray, out_hw: tuple[int, int], padding: str,
                        stride: tuple[int, int]) -> np.ndarray:
    """Transpose convolution's sums, in ``x``'s dtype: each input pixel scatters ``x @
    W[:, i, j, :]^T`` to ``y*s + i``; the full (unpadded) result is cropped by the forward
    conv's padding. Shared by the float and the integer references."""
    n, h, wd, _ = x.shape
    cout, kh, kw, _ = w.shape
    top = transpose_conv_padding(out_hw[0], kh, stride[0], padding)
    left = transpose_conv_padding(out_hw[1], kw, stride[1], padding)
    full_h = max((h - 1) * stride[0] + kh, top + out_hw[0])
    full_w = max((wd - 1) * stride[1] + kw, left + out_hw[1])
    full = np.zeros((n, full_h, full_w, cout), x.dtype)
    w = w.astype(x.dtype)
    for i in range(kh):
        for j in range(kw):
            full[:, i:i + (h - 1) * stride[0] + 1:stride[0],
                 j:j + (wd - 1) * stride[1] + 1:stride[1], :] += x @ w[:, i, j, :].T
    return full[:, top:top + out_hw[0], left:left + out_hw[1], :]


def _transpose_conv_core(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None, out_hw: tuple[int, int],
                         padding: str, stride: tuple[int, int], activation: str) -> np.ndarray:
    """Float transpose convolution: the sums plus bias, then the activation."""
    y = transpose_conv_sums(x.astype(np.float32), w, out_hw, padding, stride)
    return _finish(y, bias, activation)


def _transpose_conv_attrs(node: Node, tensors: Sequence[Tensor]) -> dict:
    check_inputs(node, 3, 4)
    shape = _required(node, tensors, 0, "output_shape")
    w = _required(node, tensors, 1, "weights")
    x = _required(node, tensors, 2, "input")
    if tuple(shape.shape) != (4,) or shape.dtype != np.int32:
        raise ModelFormatError(f"output_shape must be int32[4], is {shape.type_name}{list(shape.shape)}")
    _check_float(x, "input")
    _check_float(w, "weights")
    _transpose_conv_operands(x.shape, w.shape, 2)
    _check_bias(node, tensors, 3, w.shape[0])
    if shape.data is not None and int(shape.data[3]) != w.shape[0]:
        raise ModelFormatError(f"output_shape has {int(shape.data[3])} channels, weights have {w.shape[0]}")
    o = node.options
    # LiteRT's default path (XNNPACK, which takes float nodes with a constant output_shape
    # and a clamp activation) takes the batch from the input and, for VALID, the output
    # size from the input too; its builtin kernel holds both to output_shape.
    xnnpack = shape.data is not None and activation_attr(o) in _CLAMP_ACTIVATIONS
    return {"padding": _padding_attr(o), "stride": _stride(o), "activation": _clamp_activation(o),
            "size_from_input": xnnpack}


def _transpose_conv_operands(x: Sequence[int], w: Sequence[int], x_pos: int) -> None:
    """Input and weights agree: ranks and channels."""
    need_rank(w, 4, "weights [O, KH, KW, I]")
    need_rank(x, 4, f"input {x_pos}")
    if x[3] != w[3]:
        raise ModelFormatError(f"input {x_pos} has shape {list(x)} ({x[3]} channels), the weights, shape "
                               f"{list(w)}, expect {w[3]}")


def _transposed_input_check(x: Sequence[int], out_hw: Sequence[int], k_hw: Sequence[int], attrs: dict,
                            x_pos: int, what: str) -> None:
    """The input must be what the forward conv makes of the output (LiteRT's check)."""
    _need_spatial(x, f"input {x_pos}")
    want = [conv_output_size(out_hw[a], k_hw[a], attrs["stride"][a], 1, attrs["padding"])[0] for a in (0, 1)]
    if list(x[1:3]) != want:
        raise ModelFormatError(f"input {x_pos} has shape {list(x)}; {what} {list(out_hw)} (HxW) needs an "
                               f"input of {want[0]}x{want[1]}")


def _transpose_conv_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    x, w = inputs[2], inputs[1]
    _transpose_conv_operands(x.shape, w.shape, 2)
    shape = tuple(int(v) for v in np.asarray(value_of(inputs[0])).reshape(-1))
    if len(shape) != 4 or min(shape) < 0:
        raise ModelFormatError(f"output_shape {list(shape)} is not a valid NHWC shape")
    if shape[3] != w.shape[0]:
        raise ModelFormatError(f"output_shape {list(shape)} has {shape[3]} channels, the weights, shape "
                               f"{list(w.shape)}, make {w.shape[0]}")
    if x.shape[0] < 1 or (x.shape[0] != shape[0] and not attrs.get("size_from_input")):
        raise ModelFormatError(f"input 2 has shape {list(x.shape)}, its batch differs from output_shape "
                               f"{list(shape)}")
    k_hw = w.shape[1:3]
    if attrs.get("size_from_input"):
        out_hw = list(shape[1:3])
        if attrs["padding"] == "VALID":
            # XNNPACK keeps the model's adjustment (the output rows past the last window)
            # and grows the output with the input.
            _need_spatial(x.shape, "input 2")
            s = attrs["stride"]
            out_hw = [(x.shape[1 + a] - 1) * s[a] + k_hw[a] + (shape[1 + a] - k_hw[a]) % s[a] for a in (0, 1)]
        else:
            _transposed_input_check(x.shape, out_hw, k_hw, attrs, 2, "output_shape")
        shape = (x.shape[0], *out_hw, shape[3])
    else:
        _transposed_input_check(x.shape, shape[1:3], k_hw, attrs, 2, "output_shape")
    return [TensorSpec(shape, x.dtype)]


def transpose_conv_out_hw(inputs: list, attrs: dict) -> tuple[int, int]:
    """TRANSPOSE_CONV's output height and width from its run-time inputs (an
    ExecutionError when they do not fit together)."""
    x, w = inputs[2], inputs[1]
    try:
        spec = _transpose_conv_infer([TensorSpec.of(np.asarray(inputs[0])), TensorSpec.of(w), TensorSpec.of(x)],
                                     attrs)[0]
    except ModelFormatError as exc:
        raise ExecutionError(str(exc)) from None
    return spec.shape[1], spec.shape[2]


def _transpose_conv_reference(inputs: list, attrs: dict) -> list[np.ndarray]:
    """TFLite TRANSPOSE_CONV: inputs (output_shape, weights [O,KH,KW,I], input, bias?)."""
    return [_transpose_conv_core(inputs[2], inputs[1], _opt(inputs, 3), transpose_conv_out_hw(inputs, attrs),
                                 attrs["padding"], attrs["stride"], attrs["activation"])]


register(OpDef(name="TRANSPOSE_CONV", attrs=_transpose_conv_attrs, infer=_transpose_conv_infer,
               reference=_transpose_conv_reference,
               doc="Transpose convolution; the output shape is input 0's value."))

# TfLitePadding as MediaPipe serializes it in the custom options (0 is "unknown").
_TFLITE_PADDING = {1: "SAME", 2: "VALID"}


def parse_transpose_conv_bias_options(custom: bytes) -> dict:
    """Decode MediaPipe's raw ``TfLiteTransposeConvParams`` custom options.

    The struct is little-endian ``{int32 padding, int32 stride_width, int32 stride_height}``
    with padding 1 = SAME, 2 = VALID. Bytes past the first 12 are ignored, as the XNNPACK
    delegate copies at most the struct it knows.
    """
    if len(custom) < 12:
        raise ModelFormatError(f"custom options must hold 12 bytes (padding, stride_w, stride_h), has {len(custom)}")
    padding, stride_w, stride_h = struct.unpack_from("<iii", custom, 0)
    if padding not in _TFLITE_PADDING:
        raise ModelFormatError(f"unknown padding {padding} (expected 1 = SAME or 2 = VALID)")
    if stride_w < 1 or stride_h < 1:
        raise ModelFormatError(f"stride must be >= 1, got {[stride_h, stride_w]}")
    return {"padding": _TFLITE_PADDING[padding], "stride": (stride_h, stride_w), "activation": "NONE"}


def _transpose_conv_bias_attrs(node: Node, tensors: Sequence[Tensor]) -> dict:
    check_inputs(node, 3)
    x = _required(node, tensors, 0, "input")
    w = _required(node, tensors, 1, "weights")
    _required(node, tensors, 2, "bias")
    _check_float(x, "input")
    _check_float(w, "weights")
    _transpose_conv_operands(x.shape, w.shape, 0)
    _check_bias(node, tensors, 2, w.shape[0])
    attrs = parse_transpose_conv_bias_options(node.custom_options)
    # LiteRT runs this op only through XNNPACK, which holds a SAME node's input to the
    # model's declared output size (a VALID one grows with its input).
    out = tensors[node.outputs[0]].shape if node.outputs and node.outputs[0] >= 0 else ()
    if len(out) == 4:
        attrs["declared_out_hw"] = tuple(out[1:3])
    return attrs


def transpose_conv_bias_output_hw(in_hw: tuple[int, int], k_hw: tuple[int, int], stride: tuple[int, int],
                                  padding: str) -> tuple[int, int]:
    """Output (H, W) of Convolution2DTransposeBias: SAME in*s, VALID (in-1)*s + k."""
    if padding == "SAME":
        return in_hw[0] * stride[0], in_hw[1] * stride[1]
    return (in_hw[0] - 1) * stride[0] + k_hw[0], (in_hw[1] - 1) * stride[1] + k_hw[1]


def _transpose_conv_bias_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    x, w = inputs[0], inputs[1]
    _transpose_conv_operands(x.shape, w.shape, 0)
    if x.shape[0] < 1:
        raise ModelFormatError(f"input 0 has shape {list(x.shape)}: the batch must be positive")
    _need_spatial(x.shape)
    if "declared_out_hw" in attrs and attrs["padding"] == "SAME":
        _transposed_input_check(x.shape, attrs["declared_out_hw"], w.shape[1:3], attrs, 0, "the declared output")
    oh, ow = transpose_conv_bias_output_hw(x.shape[1:3], w.shape[1:3], attrs["stride"], attrs["padding"])
    return [TensorSpec((x.shape[0], oh, ow, w.shape[0]), x.dtype)]


def _transpose_conv_bias_reference(inputs: list, attrs: dict) -> list[np.ndarray]:
    """MediaPipe's transpose conv with bias: inputs (input, weights [O,KH,KW,I], bias)."""
    x, w, bias = inputs[0], inputs[1], inputs[2]
    out_hw = transpose_conv_bias_output_hw(x.shape[1:3], w.shape[1:3], attrs["stride"], attrs["padding"])
    return [_transpose_conv_core(x, w, bias, out_hw, attrs["padding"], attrs["stride"], "NONE")]


register(OpDef(name="Convolution2DTransposeBias", attrs=_transpose_conv_bias_attrs,
               infer=_transpose_conv_bias_infer, reference=_transpose_conv_bias_reference,
               doc="MediaPipe custom transpose convolution with bias (raw struct custom options)."))


# -- pooling ----------------------------------------------------------------------------


def _pool_attrs(node: Node, tensors: Sequence[Tensor]) -> dict:
    check_inputs(node, 1)
    x = _required(node, tensors, 0, "input")
    need_rank(x.shape, 4, "input")
    _check_float(x, "input")
    o = node.options
    padding = _padding_attr(o)
    # LiteRT's MAX_POOL_2D on XNNPACK pools a rank-5 input as its first four dims; that is
    # the same data only when the fifth dim is 1 (see pool_input_4d).
    # LiteRT's default path for float AVERAGE/MAX pools with a clamp activation is XNNPACK.
    xnnpack = node.op != "L2_POOL_2D" and activation_attr(o) in _CLAMP_ACTIVATIONS
    stride = _stride(o)
    filt = _positive(o, ("filter_height", "filter_width"), 0, "filter size")
    return {"padding": padding, "stride": stride, "filter": filt,
            "activation": _clamp_activation(o), "window_clamped": xnnpack and padding == "VALID",
            "rank5_tail_ok": node.op == "MAX_POOL_2D" and xnnpack,
            "litert_kernel": _pool_kernel(xnnpack, filt, stride)}


# -- NaN in pools -----------------------------------------------------------------------
#
# Which of LiteRT's kernels runs a float pool decides what a NaN does (probed against
# ai_edge_litert 2.3 on x86-64, the oracle here; on ARM XNNPACK's max/min keep NaN):
#
# - "builtin": a stride larger than the filter along an axis, which XNNPACK refuses, so
#   TFLite's own kernel runs: a NaN never wins a max (which starts from the lowest float)
#   and passes through an average and the activation, whose range is finite even
#   without one (+-inf become +-FLT_MAX: :func:`builtin_pool_range`).
# - "xnnpack_clamp": a 1x1 filter with stride 1, which the XNNPACK delegate runs as its
#   clamp: NaN passes through.
# - "xnnpack": XNNPACK's pooling kernels. Their output clamp is ``max(v, lo)`` then
#   ``min(v, hi)`` with x86's max/min (the second operand whenever either is NaN), so an
#   average that is NaN comes out as ``lo`` (-inf without an activation). A max pool
#   reads its taps column by column (kx outer, ky inner), coordinates clamped into the
#   image instead of skipping padding, in passes of 9 (a short pass repeats its first
#   tap) combined by a fixed tree of x86 maxes (:func:`xnn_max9`): whether a NaN tap
#   survives depends on its place. The first pass is clamped as above (NaN -> lo);
#   each later pass is ``min(max(previous, pass), hi)`` (NaN -> hi).

def _pool_kernel(xnnpack: bool, filt: tuple[int, int], stride: tuple[int, int]) -> str:
    if not xnnpack or stride[0] > filt[0] or stride[1] > filt[1]:
        return "builtin"
    return "xnnpack_clamp" if filt == (1, 1) else "xnnpack"


def builtin_pool_range(activation: str) -> tuple[float, float]:
    """The clamp TFLite's own pooling kernels apply (CalculateActivationRange): the
    activation's range within the finite floats."""
    lo, hi = ACTIVATION_RANGES[activation]
    big = float(np.finfo(np.float32).max)
    return max(lo, -big), min(hi, big)


#: Taps per pass of XNNPACK's max pool kernel.
XNN_MAX_PASS = 9


def x86_max(a, b):
    """x86's ``maxps(a, b)``: ``a > b ? a : b``, so ``b`` whenever either is NaN (numpy)."""
    return np.where(a > b, a, b)


def x86_min(a, b):
    """x86's ``minps(a, b)``: ``a < b ? a : b`` (numpy)."""
    return np.where(a < b, a, b)


def xnn_max9(v: Sequence, mx):
    """XNNPACK's max of the 9 taps ``v`` of one pass, as its tree of ``mx(a, b)`` (x86 max:
    the order of the operands decides which NaN survives). Generic over what ``mx``
    combines: numpy arrays here, C expressions in the GPU kernel."""
    m018 = mx(mx(v[0], v[1]), v[8])
    m2345 = mx(mx(v[2], v[3]), mx(v[4], v[5]))
    return mx(m2345, mx(m018, mx(v[6], v[7])))


def xnn_max_pool_passes(fh: int, fw: int) -> list[list[tuple[int, int]]]:
    """The window taps ``(ky, kx)`` of each pass of XNNPACK's max pool, 9 per pass (a short
    pass repeats its first tap), in the order :func:`xnn_max9` reads them."""
    taps = [(ky, kx) for kx in range(fw) for ky in range(fh)]
    passes = []
    for start in range(0, len(taps), XNN_MAX_PASS):
        chunk = taps[start:start + XNN_MAX_PASS]
        passes.append(chunk + [chunk[0]] * (XNN_MAX_PASS - len(chunk)))
    return passes


def pool_input_4d(shape: Sequence[int], attrs: dict) -> tuple[int, ...]:
    """The NHWC shape a pool reads its input as: the input's, or for MAX_POOL_2D a rank-5
    ``[N, H, W, C, 1]`` input's first four dims, as LiteRT does. LiteRT reads any rank-5
    input that way, a prefix of its data when the fifth dim is not 1: refused here."""
    if len(shape) == 5 and shape[4] == 1 and attrs.get("rank5_tail_ok"):
        return tuple(shape[:4])
    need_rank(shape, 4, "input 0")
    return tuple(shape)


def _pool_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    x = inputs[0]
    shape = pool_input_4d(x.shape, attrs)
    (oh, ow), _ = _spatial_plan(shape, attrs["filter"], attrs)
    return [TensorSpec((shape[0], oh, ow, shape[3]), x.dtype)]


def _pool_taps(x: np.ndarray, attrs: dict, pad_value: float) -> tuple[list[np.ndarray], np.ndarray]:
    """Every filter tap over the output grid, and how many real (unpadded) pixels each window has."""
    out_hw, before = _spatial_plan(x.shape, attrs["filter"], attrs)
    fh, fw = attrs["filter"]
    args = (out_hw, (fh, fw), attrs["stride"], (1, 1), before)
    xp = _pad_hw(x.astype(np.float32), *args, value=pad_value)
    mask = _pad_hw(np.ones((1, *x.shape[1:3], 1), np.float32), *args, value=0.0)
    taps = [_tap(xp, i, j, out_hw, attrs["stride"], (1, 1)) for i in range(fh) for j in range(fw)]
    count = sum(_tap(mask, i, j, out_hw, attrs["stride"], (1, 1)) for i in range(fh) for j in range(fw))
    return taps, count


def pool_divisor_is_window(attrs: dict) -> bool:
    """Whether AVERAGE_POOL_2D divides by the whole window rather than by its real pixels.

    XNNPACK (``window_clamped``: VALID padding) counts a window larger than the input in
    full, the missing pixels as zeros: a 7x7 VALID window over a 6x7 input divides the
    sum of its 42 pixels by 49. Elsewhere a VALID window lies inside the input anyway.
    """
    return bool(attrs.get("window_clamped"))


def _avg_pool_reference(inputs: list, attrs: dict) -> list[np.ndarray]:
    """Average over each window; padded pixels are not counted (as TF does), except that a
    VALID window larger than the input divides by its whole area (as XNNPACK does). A NaN
    average leaves XNNPACK's kernel as the activation's lower bound (see "NaN in pools")."""
    taps, count = _pool_taps(inputs[0], attrs, 0.0)
    if pool_divisor_is_window(attrs):
        count = np.float32(attrs["filter"][0] * attrs["filter"][1])
    y = sum(taps) / np.maximum(count, 1)
    kernel = attrs.get("litert_kernel", "builtin")
    if kernel == "builtin":
        return [_builtin_clamp(y, attrs["activation"])]
    y = _finish(y, None, attrs["activation"])
    if kernel == "xnnpack":
        y = np.where(np.isnan(y), np.float32(ACTIVATION_RANGES[attrs["activation"]][0]), y)
    return [y]


def _builtin_clamp(y: np.ndarray, activation: str) -> np.ndarray:
    lo, hi = (np.float32(b) for b in builtin_pool_range(activation))
    return np.minimum(np.maximum(y, lo), hi).astype(np.float32, copy=False)


def _max_pool_reference(inputs: list, attrs: dict) -> list[np.ndarray]:
    """Maximum over each window, padding never winning; NaN as the kernel LiteRT runs
    treats it (see "NaN in pools")."""
    x = inputs[0]
    x = x.reshape(pool_input_4d(x.shape, attrs))
    kernel = attrs.get("litert_kernel", "builtin")
    if kernel == "xnnpack":
        return [_xnn_max_pool(x, attrs)]
    if kernel == "xnnpack_clamp":
        return [_finish(x[:, ::attrs["stride"][0], ::attrs["stride"][1]], None, attrs["activation"])]
    taps, _ = _pool_taps(x, attrs, -np.inf)
    lowest = np.full(taps[0].shape, np.finfo(np.float32).min, np.float32)
    return [_builtin_clamp(functools.reduce(lambda m, t: np.where(m < t, t, m), taps, lowest), attrs["activation"])]


def _xnn_max_pool(x: np.ndarray, attrs: dict) -> np.ndarray:
    """XNNPACK's max pool: passes of :func:`xnn_max9` over taps at clamped coordinates."""
    (oh, ow), (top, left) = _spatial_plan(x.shape, attrs["filter"], attrs)
    sh, sw = attrs["stride"]
    rows = lambda ky: np.clip(np.arange(oh) * sh + ky - top, 0, x.shape[1] - 1)   # noqa: E731
    cols = lambda kx: np.clip(np.arange(ow) * sw + kx - left, 0, x.shape[2] - 1)  # noqa: E731
    lo, hi = (np.float32(b) for b in ACTIVATION_RANGES[attrs["activation"]])
    y = None
    for taps in xnn_max_pool_passes(*attrs["filter"]):
        m = xnn_max9([x[:, rows(ky)][:, :, cols(kx)] for ky, kx in taps], x86_max)
        y = x86_min(x86_max(m, lo), hi) if y is None else x86_min(x86_max(y, m), hi)
    return y.astype(np.float32, copy=False)


def _l2_pool_reference(inputs: list, attrs: dict) -> list[np.ndarray]:
    """sqrt(mean of squares) over each window's real pixels."""
    taps, count = _pool_taps(inputs[0], attrs, 0.0)
    squares = sum(t * t for t in taps)
    return [_finish(np.sqrt(squares / np.maximum(count, 1)), None, attrs["activation"])]


for _name, _ref in (("AVERAGE_POOL_2D", _avg_pool_reference), ("MAX_POOL_2D", _max_pool_reference),
                    ("L2_POOL_2D", _l2_pool_reference)):
    register(OpDef(name=_name, attrs=_pool_attrs, infer=_pool_infer, reference=_ref,
                   doc=(_ref.__doc__ or "").strip()))


# -- FULLY_CONNECTED --------------------------------------------------------------------


def _fc_attrs(node: Node, tensors: Sequence[Tensor]) -> dict:
    check_inputs(node, 2, 3)
    x = _required(node, tensors, 0, "input")
    w = _required(node, tensors, 1, "weights")
    _check_float(x, "input")
    _check_float(w, "weights")
    need_rank(w.shape, 2, "weights [O, K]")
    o = node.options
    if o.get("weights_format", 0) != 0:
        raise UnsupportedError(f"weights_format {o.get('weights_format')} (only DEFAULT is supported)")
    out_ch, k = w.shape
    # A dynamic input's stored shape is a placeholder (BirdNET stores [1, 1] for [-1, -1]):
    # its rows are checked by _fc_infer once the real shape is known.
    keep = bool(o.get("keep_num_dims", False))
    if -1 not in x.shape_signature:
        _fc_operands(x.shape, w.shape, keep)
    elif k < 1:
        raise ModelFormatError(f"weights of shape {list(w.shape)} have no columns")
    _check_bias(node, tensors, 2, out_ch)
    activation = activation_attr(o)
    if activation not in _CLAMP_ACTIVATIONS:
        # LiteRT refuses these at prepare time rather than ignoring them.
        raise UnsupportedError(f"fused activation {activation} on FULLY_CONNECTED")
    return {"activation": activation, "keep_num_dims": keep}


def _fc_out_shape(x_shape: tuple[int, ...], w_shape: tuple[int, ...], keep: bool) -> tuple[int, ...]:
    if keep:
        return (*x_shape[:-1], w_shape[0])
    return (int(np.prod(x_shape)) // w_shape[1], w_shape[0])


def _fc_operands(x: Sequence[int], w: Sequence[int], keep: bool) -> None:
    """Input and weights agree: [O, K] weights, the input flattens into rows of K."""
    need_rank(w, 2, "weights [O, K]")
    k = w[1]
    if k < 1 or int(np.prod(x)) % k:
        raise ModelFormatError(f"input 0 has shape {list(x)}, which does not flatten into rows of {k} "
                               f"(K of the weights, shape {list(w)})")
    if keep and (len(x) < 1 or x[-1] != k):
        raise ModelFormatError(f"keep_num_dims needs the last dim of input 0, shape {list(x)}, to be K = {k} "
                               f"of the weights, shape {list(w)}")


def _fc_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    x, w = inputs[0], inputs[1]
    _fc_operands(x.shape, w.shape, attrs["keep_num_dims"])
    bias = inputs[2] if len(inputs) > 2 else None
    if bias is not None and int(np.prod(bias.shape)) != w.shape[0]:
        # Runtime weights may be resized away from the bias: one bias per output unit.
        raise ModelFormatError(f"bias (input 2) has shape {list(bias.shape)}; the weights, shape {list(w.shape)}, "
                               f"have {w.shape[0]} output units")
    return [TensorSpec(_fc_out_shape(x.shape, w.shape, attrs["keep_num_dims"]), x.dtype)]


def _fc_reference(inputs: list, attrs: dict) -> list[np.ndarray]:
    """``x`` flattened to rows of K, times ``weights^T`` [K, O], plus bias."""
    x, w, bias = inputs[0], inputs[1], _opt(inputs, 2)
    y = x.reshape(-1, w.shape[1]).astype(np.float32) @ w.astype(np.float32).T
    y = _finish(y, bias, attrs["activation"])
    return [y.reshape(_fc_out_shape(x.shape, w.shape, attrs["keep_num_dims"]))]


register(OpDef(name="FULLY_CONNECTED", attrs=_fc_attrs, infer=_fc_infer, reference=_fc_reference,
               doc="Fully connected layer: [..., K] x [O, K]^T (+ bias), optional keep_num_dims."))


# -- BATCH_MATMUL -----------------------------------------------------------------------


def _bmm_shapes(a: tuple[int, ...], b: tuple[int, ...], attrs: dict) -> tuple[int, ...]:
    """Output shape of a batch matmul, or a format error naming the mismatch."""
    for shape, what in ((a, "lhs (input 0)"), (b, "rhs (input 1)")):
        # LiteRT's builtin kernel takes ranks 2 to 5, but LiteRT hands BATCH_MATMUL to
        # XNNPACK, which takes up to 6 (XNN_MAX_TENSOR_DIMS) and refuses 7.
        if not 2 <= len(shape) <= 6:
            raise ModelFormatError(f"{what} must have rank 2 to 6, has shape {list(shape)}")
    m, ka = (a[-1], a[-2]) if attrs["adj_x"] else (a[-2], a[-1])
    kb, n = (b[-1], b[-2]) if attrs["adj_y"] else (b[-2], b[-1])
    if ka != kb:
        raise ModelFormatError(f"inner dimensions differ: lhs (input 0) {list(a)} x rhs (input 1) {list(b)} "
                               f"(adj_x={attrs['adj_x']}, adj_y={attrs['adj_y']})")
    return (*broadcast_shapes(a[:-2], b[:-2]), m, n)


def _bmm_attrs(node: Node, tensors: Sequence[Tensor]) -> dict:
    check_inputs(node, 2)
    a = _required(node, tensors, 0, "lhs")
    b = _required(node, tensors, 1, "rhs")
    for t, what in ((a, "lhs"), (b, "rhs")):
        if len(t.shape) < 2:
            raise ModelFormatError(f"{what} must have rank >= 2, has shape {list(t.shape)}")
    _check_float(a, "lhs")
    _check_float(b, "rhs")
    attrs = {"adj_x": bool(node.options.get("adj_x", False)), "adj_y": bool(node.options.get("adj_y", False))}
    _bmm_shapes(a.shape, b.shape, attrs)
    return attrs


def _bmm_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    return [TensorSpec(_bmm_shapes(inputs[0].shape, inputs[1].shape, attrs), inputs[0].dtype)]


def _bmm_reference(inputs: list, attrs: dict) -> list[np.ndarray]:
    """Matmul over the last two axes (optionally transposed), broadcasting the batch axes."""
    a, b = inputs
    if attrs["adj_x"]:
        a = np.swapaxes(a, -1, -2)
    if attrs["adj_y"]:
        b = np.swapaxes(b, -1, -2)
    return [np.matmul(a, b).astype(inputs[0].dtype, copy=False)]


register(OpDef(name="BATCH_MATMUL", attrs=_bmm_attrs, infer=_bmm_infer, reference=_bmm_reference,
               doc="Batched matmul with adj_x / adj_y and broadcast batch dimensions."))


# -- RESIZE_BILINEAR / RESIZE_NEAREST_NEIGHBOR ------------------------------------------


def _resize_attrs(node: Node, tensors: Sequence[Tensor]) -> dict:
    check_inputs(node, 2)
    x = _required(node, tensors, 0, "input")
    size = _required(node, tensors, 1, "size")
    need_rank(x.shape, 4, "input")
    _check_float(x, "input")
    if tuple(size.shape) != (2,) or size.dtype != np.int32:
        raise ModelFormatError(f"size must be int32[2], is {size.type_name}{list(size.shape)}")
    if size.data is not None and int(np.min(size.data)) < 1:
        raise ModelFormatError(f"size {size.data.tolist()} must be positive")
    align = bool(node.options.get("align_corners", False))
    half = bool(node.options.get("half_pixel_centers", False))
    if align and half and node.op == "RESIZE_BILINEAR":
        # LiteRT's builtin bilinear kernel refuses both flags, but its default CPU path
        # (XNNPACK) runs them with align_corners winning; we match what users get.
        # Nearest neighbour defines the combination (align_corners scale, half-pixel offset).
        half = False
    attrs = {"align_corners": align, "half_pixel_centers": half}
    if node.op == "RESIZE_BILINEAR":
        # LiteRT delegates a constant size to XNNPACK; a size computed at run time stays
        # with its builtin kernel, whose taps and formula differ (see bilinear_axis).
        attrs["xnnpack"] = size.is_constant
    return attrs


def _resize_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    x = inputs[0]
    need_rank(x.shape, 4, "input 0")
    if tuple(inputs[1].shape) != (2,):
        raise ModelFormatError(f"size (input 1) must have shape [2], has {list(inputs[1].shape)}")
    h, w = (int(v) for v in np.asarray(value_of(inputs[1])).reshape(-1)[:2])
    out = (x.shape[0], h, w, x.shape[3])
    if 0 in x.shape[1:3] and 0 not in out:
        # Nothing to interpolate from (LiteRT crashes or refuses).
        raise ModelFormatError(f"input 0 has shape {list(x.shape)}: an empty image cannot be resized to "
                               f"{h}x{w}")
    return [TensorSpec(out, x.dtype)]


def _resize_scale(in_size: int, out_size: int, align_corners: bool) -> np.float32:
    """Output-to-input coordinate scale, in float32 as TFLite computes it."""
    if align_corners and out_size > 1:
        return np.float32(in_size - 1) / np.float32(out_size - 1)
    return np.float32(in_size) / np.float32(out_size)


def _out_size(inputs: list) -> tuple[int, int]:
    size = [int(v) for v in np.asarray(inputs[1]).reshape(-1)]
    if len(size) != 2 or min(size) < 1:
        raise ExecutionError(f"resize size {size} must be two positive integers")
    return size[0], size[1]


def bilinear_axis(in_size: int, out_size: int, attrs: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """RESIZE_BILINEAR's source taps along one axis resized from ``in_size`` to ``out_size``.

    Returns, per output index, the lower and upper source index (int64 arrays) and the
    weight of the upper one (float32; the lower's is 1 minus it), under the node's
    ``align_corners`` and ``half_pixel_centers`` attrs, as the kernel LiteRT runs computes
    them (``xnnpack``, the default, or its builtin kernel): XNNPACK clamps a half-pixel
    position into the image and always takes the next index as the upper one (weight 0
    on a whole position), where the builtin kernel takes ``ceil`` (the same index) and
    lets the weight go negative before the first pixel. Finite results agree; an infinity
    at a tap of weight 0 does not (``inf * 0`` is NaN).
    """
    if not attrs.get("xnnpack", True):
        return _builtin_bilinear_axis(in_size, out_size, attrs)
    scale = _resize_scale(in_size, out_size, attrs["align_corners"])
    v = np.arange(out_size, dtype=np.float32)
    if attrs["half_pixel_centers"] and not attrs["align_corners"]:
        src = v * scale + (np.float32(0.5) * scale - np.float32(0.5))
        src = np.minimum(np.maximum(src, np.float32(0)), np.float32(in_size - 1))
    else:
        src = v * scale
    lo = src.astype(np.int64)
    hi = np.minimum(lo + 1, in_size - 1)
    return lo, hi, (src - lo.astype(np.float32)).astype(np.float32)


def _builtin_bilinear_axis(in_size: int, out_size: int, attrs: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`bilinear_axis` of TFLite's builtin kernel (``ComputeInterpolationValues``)."""
    scale = _resize_scale(in_size, out_size, attrs["align_corners"])
    v = np.arange(out_size, dtype=np.float32)
    src = (v + np.float32(0.5)) * scale - np.float32(0.5) if attrs["half_pixel_centers"] else v * scale
    lo = np.maximum(np.floor(src), 0).astype(np.int64)
    hi = np.minimum(np.ceil(src), in_size - 1).astype(np.int64)
    return lo, hi, (src - lo).astype(np.float32)


def bilinear_lerp(tl, tr, bl, br, wx, wy):
    """One bilinear sample from its four taps (top/bottom, left/right) and the right and
    bottom weights, in XNNPACK's order: ``t = tl + (tr - tl) * wx``, likewise ``b``, then
    ``t + (b - t) * wy``. An infinite tap gives NaN (``inf - inf`` or ``inf * 0``) even
    where its weight is 0, as LiteRT's does; every backend computes this form."""
    t = tl + (tr - tl) * wx
    b = bl + (br - bl) * wx
    return t + (b - t) * wy


def _resize_bilinear_reference(inputs: list, attrs: dict) -> list[np.ndarray]:
    """Bilinear resize with TF's align_corners / half_pixel_centers coordinate rules, as
    LiteRT's kernel computes it: XNNPACK's (:func:`bilinear_lerp`) for a constant size,
    else the builtin kernel's sum of four weighted taps (whose exact 2x upscale path,
    which reads only the taps it weighs, is not reproduced)."""
    x = inputs[0].astype(np.float32)
    oh, ow = _out_size(inputs)
    y0, y1, fy = bilinear_axis(x.shape[1], oh, attrs)
    x0, x1, fx = bilinear_axis(x.shape[2], ow, attrs)
    fy, fx = fy[None, :, None, None], fx[None, None, :, None]
    taps = x[:, y0][:, :, x0], x[:, y0][:, :, x1], x[:, y1][:, :, x0], x[:, y1][:, :, x1]
    with np.errstate(invalid="ignore", over="ignore"):
        if attrs.get("xnnpack", True):
            y = bilinear_lerp(*taps, fx, fy)
        else:
            tl, tr, bl, br = taps
            y = tl * ((1 - fy) * (1 - fx)) + tr * ((1 - fy) * fx) + bl * (fy * (1 - fx)) + br * (fy * fx)
    return [y.astype(np.float32)]


def nearest_axis(in_size: int, out_size: int, attrs: dict) -> np.ndarray:
    """RESIZE_NEAREST_NEIGHBOR's source index (an int64 array) per output index along one axis.

    Follows TFLite's rounding for each combination of the node's ``align_corners`` and
    ``half_pixel_centers`` attrs.
    """
    scale = _resize_scale(in_size, out_size, attrs["align_corners"])
    offset = np.float32(0.5) if attrs["half_pixel_centers"] else np.float32(0)
    src = (np.arange(out_size, dtype=np.float32) + offset) * scale
    if attrs["align_corners"]:
        # round half away from zero (std::round); src is never negative here
        floor = np.floor(src)
        idx = np.where(src - floor >= 0.5, floor + 1, floor)
    else:
        idx = np.floor(src)
    idx = np.minimum(idx.astype(np.int64), in_size - 1)
    return np.maximum(idx, 0) if attrs["half_pixel_centers"] else idx


def _resize_nearest_reference(inputs: list, attrs: dict) -> list[np.ndarray]:
    """Nearest-neighbour resize with TFLite's index rounding."""
    x = inputs[0]
    oh, ow = _out_size(inputs)
    rows = nearest_axis(x.shape[1], oh, attrs)
    cols = nearest_axis(x.shape[2], ow, attrs)
    return [x[:, rows][:, :, cols]]


register(OpDef(name="RESIZE_BILINEAR", attrs=_resize_attrs, infer=_resize_infer,
               reference=_resize_bilinear_reference, doc=_resize_bilinear_reference.__doc__ or ""))
register(OpDef(name="RESIZE_NEAREST_NEIGHBOR", attrs=_resize_attrs, infer=_resize_infer,
               reference=_resize_nearest_reference, doc=_resize_nearest_reference.__doc__ or ""))


# -- EMBEDDING_LOOKUP -------------------------------------------------------------------


def _embedding_attrs(node: Node, tensors: Sequence[Tensor]) -> dict:
    check_inputs(node, 2)
    ids = _required(node, tensors, 0, "ids")
    table = _required(node, tensors, 1, "table")
    need_rank(ids.shape, 1, "ids")
    if ids.dtype != np.int32:
        raise ModelFormatError(f"ids must be INT32, are {ids.type_name}")
    if len(table.shape) < 2:
        raise ModelFormatError(f"table must have rank >= 2, has shape {list(table.shape)}")
    _check_float(table, "table")
    return {}


def _embedding_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    ids, table = inputs
    need_rank(ids.shape, 1, "ids (input 0)")
    # A hybrid lookup (int8 table) gives float32 rows.
    return [TensorSpec((ids.shape[0], *table.shape[1:]), np.dtype(np.float32) if attrs.get("hybrid") else table.dtype)]


def _embedding_reference(inputs: list, attrs: dict) -> list[np.ndarray]:
    """Rows of ``table`` selected by ``ids``; an id out of range is an error, as in LiteRT."""
    ids, table = inputs
    bad = (ids < 0) | (ids >= table.shape[0])
    if np.any(bad):
        raise ExecutionError(f"EMBEDDING_LOOKUP: id {int(ids[bad][0])} out of range [0, {table.shape[0]})")
    return [table[ids.astype(np.int64)]]


register(OpDef(name="EMBEDDING_LOOKUP", attrs=_embedding_attrs, infer=_embedding_infer,
               reference=_embedding_reference, doc=_embedding_reference.__doc__ or ""))


# -- LSTM and UNIDIRECTIONAL_SEQUENCE_LSTM ----------------------------------------------
#
# Both ops keep their state in two *variable* input tensors (18: output/activation state
# [batch, n_output], 19: cell state [batch, n_cell]) that LiteRT updates in place on each
# invoke. The pure ``reference`` cannot write its inputs, so it returns the new states
# after the node's own output: ``[output, new_output_state, new_cell_state]``;
# ``attrs["state_writeback"]`` lists the ``(reference result index, node input index)``
# pairs, ``((1, 18), (2, 19))``. The ops are registered ``stateful`` and their
# ``execute(inputs, attrs, runtime)`` runs the reference, copies the new states into the
# variable input arrays in place (as LiteRT does) and returns only ``[output]``.
# ``infer`` describes only the node's real output.

LSTM_INPUT_NAMES = (
    "input", "input_to_input", "input_to_forget", "input_to_cell", "input_to_output",
    "recurrent_to_input", "recurrent_to_forget", "recurrent_to_cell", "recurrent_to_output",
    "cell_to_input", "cell_to_forget", "cell_to_output",
    "input_gate_bias", "forget_gate_bias", "cell_gate_bias", "output_gate_bias",
    "projection_weights", "projection_bias", "output_state", "cell_state",
    "input_layer_norm", "forget_layer_norm", "cell_layer_norm", "output_layer_norm",
)
_LSTM_STATE_WRITEBACK = ((1, 18), (2, 19))

# Inside an LSTM the activation is a real function on the cell input and cell state
# (TFLite's ApplyActivationToVector), not a fused output clamp: TANH really is tanh here.
# NONE is the identity; LiteRT's kernel leaves its scratch buffer unwritten for NONE, so
# its result is undefined there and no conformance case can pin it down.
LSTM_ACTIVATIONS = {
    **{name: (lambda x, name=name: apply_activation(x, name)) for name in CLAMP_ACTIVATIONS},
    "TANH": np.tanh,
    "SIGN_BIT": lambda x: np.signbit(x).astype(np.float32),
}
LAYER_NORM_EPSILON = 1e-8  # TFLite's kLayerNormEpsilon (the LSTM's layer norm)


def _lstm_attrs_common(node: Node, tensors: Sequence[Tensor], seq: bool) -> dict:
    check_inputs(node, 20, 24)
    if len(node.outputs) != 1:
        raise UnsupportedError(f"{len(node.outputs)} outputs (only the 1-output full LSTM kernel is supported)")
    t = {name: _input(node, tensors, i) for i, name in enumerate(LSTM_INPUT_NAMES)}
    for i, name in enumerate(LSTM_INPUT_NAMES):
        required = name in ("input", "input_to_forget", "input_to_cell", "input_to_output",
                            "recurrent_to_forget", "recurrent_to_cell", "recurrent_to_output",
                            "forget_gate_bias", "cell_gate_bias", "output_gate_bias",
                            "output_state", "cell_state")
        if required and t[name] is None:
            raise ModelFormatError(f"{name} (input {i}) is missing")
    x = t["input"]
    _check_float(x, "input")
    need_rank(x.shape, 3 if seq else 2, "input")
    n_cell, n_input = t["input_to_forget"].shape if len(t["input_to_forget"].shape) == 2 else (-1, -1)
    if n_input != x.shape[-1]:
        raise ModelFormatError(f"input_to_forget weights {list(t['input_to_forget'].shape)} do not match "
                               f"input {list(x.shape)}")
    n_output = t["recurrent_to_forget"].shape[-1]
    if t["projection_weights"] is None and n_output != n_cell:
        raise ModelFormatError(f"without projection n_output ({n_output}) must equal n_cell ({n_cell})")
    expect = {"input_to_input": (n_cell, n_input), "input_to_forget": (n_cell, n_input),
              "input_to_cell": (n_cell, n_input), "input_to_output": (n_cell, n_input),
              "recurrent_to_input": (n_cell, n_output), "recurrent_to_forget": (n_cell, n_output),
              "recurrent_to_cell": (n_cell, n_output), "recurrent_to_output": (n_cell, n_output),
              "cell_to_input": (n_cell,), "cell_to_forget": (n_cell,), "cell_to_output": (n_cell,),
              "input_gate_bias": (n_cell,), "forget_gate_bias": (n_cell,), "cell_gate_bias": (n_cell,),
              "output_gate_bias": (n_cell,), "projection_weights": (n_output, n_cell),
              "projection_bias": (n_output,), "input_layer_norm": (n_cell,), "forget_layer_norm": (n_cell,),
              "cell_layer_norm": (n_cell,), "output_layer_norm": (n_cell,)}
    for name, shape in expect.items():
        # A full-integer LSTM (int8 input) has int32 biases; ops/integer_lstm.py checks its types.
        if t[name] is not None and not is_quantized(x):
            _check_float(t[name], name)
        if t[name] is not None and tuple(t[name].shape) != shape:
            raise ModelFormatError(f"{name} has shape {list(t[name].shape)}, expected {list(shape)}")
    batch = x.shape[1] if seq and node.options.get("time_major", False) else x.shape[0]
    for name, width in (("output_state", n_output), ("cell_state", n_cell)):
        if int(np.prod(t[name].shape)) != batch * width:
            raise ModelFormatError(f"{name} has shape {list(t[name].shape)}, expected [{batch}, {width}]")
    cifg = t["input_to_input"] is None
    if cifg and (t["recurrent_to_input"] is not None or t["input_gate_bias"] is not None):
        raise ModelFormatError("CIFG (no input_to_input weights) but input gate recurrent weights or bias given")
    if not cifg and (t["recurrent_to_input"] is None or t["input_gate_bias"] is None):
        raise ModelFormatError("input gate needs recurrent_to_input weights and input_gate_bias")
    o = node.options
    if o.get("kernel_type", 0) != 0:
        raise UnsupportedError("LSTM kernel_type BASIC (only FULL is supported)")
    if seq and o.get("diagonal_recurrent_tensors", False):
        raise UnsupportedError("diagonal_recurrent_tensors")
    cell_clip, proj_clip = float(o.get("cell_clip", 0.0)), float(o.get("proj_clip", 0.0))
    if cell_clip < 0 or proj_clip < 0:
        raise ModelFormatError(f"cell_clip {cell_clip} / proj_clip {proj_clip} must not be negative")
    attrs = {"activation": activation_attr(o), "cell_clip": cell_clip, "proj_clip": proj_clip,
             "state_writeback": _LSTM_STATE_WRITEBACK}
    if seq:
        attrs["time_major"] = bool(o.get("time_major", False))
    return attrs


def _layer_norm(z: np.ndarray) -> np.ndarray:
    """Normalize each row to mean 0 and variance 1 (TFLite's MeanStddevNormalization)."""
    mean = z.mean(axis=-1, keepdims=True)
    var = (z * z).mean(axis=-1, keepdims=True) - mean * mean
    return (z - mean) / np.sqrt(np.maximum(var, 0) + LAYER_NORM_EPSILON)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-z))


class LstmMath:
    """The arithmetic of one LSTM step that a kernel may do its own way: each gate's
    pre-activation, the activations and the projection. This class is the float
    kernel's; the hybrid LSTM (ops/hybrid_lstm.py) subclasses it, so both share the
    step itself (:func:`_lstm_step`: gate order, CIFG, the cell update, the clips).
    """

    def __init__(self, x: np.ndarray, h: np.ndarray, w: dict, attrs: dict) -> None:
        self.x, self.h, self.w, self.attrs = x, h, w, attrs

    def gate(self, name: str, peephole_c: np.ndarray | None) -> np.ndarray:
        """The pre-activation of gate ``name`` (bias, peephole and layer norm included)."""
        w = self.w
        z = self.x @ w[f"input_to_{name}"].T + self.h @ w[f"recurrent_to_{name}"].T
        if peephole_c is not None and w.get(f"cell_to_{name}") is not None:
            z = z + w[f"cell_to_{name}"] * peephole_c
        if w[f"{name}_layer_norm"] is not None:
            z = _layer_norm(z) * w[f"{name}_layer_norm"]
        return z + w[f"{name}_gate_bias"]

    def sigmoid(self, z: np.ndarray, name: str) -> np.ndarray:
        """The logistic of gate ``name``'s pre-activation."""
        return _sigmoid(z)

    def act(self, z: np.ndarray) -> np.ndarray:
        """The op's activation (on the cell gate and on the cell state)."""
        return LSTM_ACTIVATIONS[self.attrs["activation"]](z)

    def project(self, out: np.ndarray) -> np.ndarray:
        """The projection of ``output_gate * act(cell)``, before proj_clip."""
        out = out @ self.w["projection_weights"].T
        if self.w["projection_bias"] is not None:
            out = out + self.w["projection_bias"]
        return out


def _lstm_step(x: np.ndarray, h: np.ndarray, c: np.ndarray, w: dict, attrs: dict,
               math: type[LstmMath] = LstmMath) -> tuple[np.ndarray, np.ndarray]:
    """One LSTM time step on a [batch, n_input] input; returns (new output state, new cell state)."""
    m = math(x, h, w, attrs)
    forget = m.sigmoid(m.gate("forget", c), "forget")
    # CIFG couples the input gate to the forget gate.
    input_gate = 1 - forget if w["input_to_input"] is None else m.sigmoid(m.gate("input", c), "input")
    cell = forget * c + input_gate * m.act(m.gate("cell", None))
    if attrs["cell_clip"] > 0:
        cell = np.clip(cell, -attrs["cell_clip"], attrs["cell_clip"])
    output_gate = m.sigmoid(m.gate("output", cell), "output")
    out = output_gate * m.act(cell)
    if w["projection_weights"] is not None:
        out = m.project(out)
        if attrs["proj_clip"] > 0:
            out = np.clip(out, -attrs["proj_clip"], attrs["proj_clip"])
    return out.astype(np.float32), cell.astype(np.float32)


def _lstm_sequence(x: np.ndarray, h: np.ndarray, c: np.ndarray, w: dict, attrs: dict,
                   math: type[LstmMath] = LstmMath) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_lstm_step` over ``x`` [T, batch, n_input] from states ``h``, ``c``;
    returns (outputs [T, batch, n_output], final output state, final cell state)."""
    steps = []
    for t in range(x.shape[0]):
        h, c = _lstm_step(x[t], h, c, w, attrs, math)
        steps.append(h)
    y = np.stack(steps) if steps else np.zeros((0, x.shape[1], h.shape[1]), np.float32)
    return y, h, c


def _lstm_weights(inputs: list) -> dict:
    w = {name: _opt(inputs, i) for i, name in enumerate(LSTM_INPUT_NAMES)}
    return {k: (None if v is None else np.asarray(v, np.float32)) for k, v in w.items()}


def _lstm_attrs(node: Node, tensors: Sequence[Tensor]) -> dict:
    return _lstm_attrs_common(node, tensors, seq=False)


def _lstm_operands(inputs: list[TensorSpec], seq: bool, time_major: bool) -> None:
    """The input agrees with the weights (n_input) and the state tensors (batch)."""
    x = inputs[0].shape
    # LiteRT accepts a [B, I, 1] LSTM input but gives another answer than for the same
    # data as [B, I] (or crashes, with CIFG): refused here.
    need_rank(x, 3 if seq else 2, "input 0")
    n_cell, n_input = inputs[2].shape
    n_output = inputs[8].shape[-1] if inputs[16] is None else inputs[16].shape[0]
    if x[-1] != n_input:
        raise ModelFormatError(f"input 0 has shape {list(x)}; input_to_forget weights, shape "
                               f"{list(inputs[2].shape)}, expect {n_input} features")
    batch = x[1] if seq and time_major else x[0]
    for pos, width in ((18, n_output), (19, n_cell)):
        state = inputs[pos].shape
        if int(np.prod(state)) != batch * width:
            # The state tensors are variables of the model's batch; LiteRT refuses another.
            raise ModelFormatError(f"input 0 has shape {list(x)} (batch {batch}); {LSTM_INPUT_NAMES[pos]} "
                                   f"(input {pos}) has shape {list(state)}, not [{batch}, {width}]")


def _lstm_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    _lstm_operands(inputs, False, False)
    return [TensorSpec((inputs[0].shape[0], inputs[8].shape[-1] if inputs[16] is None else inputs[16].shape[0]),
                       inputs[0].dtype)]


def _lstm_reference(inputs: list, attrs: dict) -> list[np.ndarray]:
    """One LSTM step; returns [output, new output state, new cell state] (see state_writeback)."""
    w = _lstm_weights(inputs)
    x = w["input"]
    h = w["output_state"].reshape(x.shape[0], -1)
    c = w["cell_state"].reshape(x.shape[0], -1)
    h, c = _lstm_step(x, h, c, w, attrs)
    return [h.copy(), h.reshape(np.shape(inputs[18])), c.reshape(np.shape(inputs[19]))]


def _write_back_state(reference):
    """``execute`` for an LSTM op: run ``reference``, store the new states in place."""
    def execute(inputs: list, attrs: dict, runtime=None) -> list[np.ndarray]:
        results = reference(inputs, attrs)
        for result, index in attrs["state_writeback"]:
            state = inputs[index]
            if not isinstance(state, np.ndarray) or not state.flags.writeable:
                raise ExecutionError(f"variable state tensor (input {index}) is not writable")
            np.copyto(state, results[result].reshape(state.shape))
        return results[:1]
    return execute


register(OpDef(name="LSTM", attrs=_lstm_attrs, infer=_lstm_infer, reference=_lstm_reference, stateful=True,
               execute=_write_back_state(_lstm_reference), doc=_lstm_reference.__doc__ or ""))


def _seq_lstm_attrs(node: Node, tensors: Sequence[Tensor]) -> dict:
    return _lstm_attrs_common(node, tensors, seq=True)


def _seq_lstm_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    x = inputs[0]
    _lstm_operands(inputs, True, attrs["time_major"])
    n_output = inputs[8].shape[-1] if inputs[16] is None else inputs[16].shape[0]
    return [TensorSpec((x.shape[0], x.shape[1], n_output), x.dtype)]


def _seq_lstm_reference(inputs: list, attrs: dict) -> list[np.ndarray]:
    """LSTM over a sequence ([T, B, I] when time_major else [B, T, I]); returns
    [outputs, final output state, final cell state] (see state_writeback)."""
    w = _lstm_weights(inputs)
    x = w["input"] if attrs["time_major"] else np.swapaxes(w["input"], 0, 1)
    batch = x.shape[1]
    h = w["output_state"].reshape(batch, -1)
    c = w["cell_state"].reshape(batch, -1)
    y, h, c = _lstm_sequence(x, h, c, w, attrs)
    if not attrs["time_major"]:
        y = np.swapaxes(y, 0, 1)
    return [np.ascontiguousarray(y), h.reshape(np.shape(inputs[18])), c.reshape(np.shape(inputs[19]))]


register(OpDef(name="UNIDIRECTIONAL_SEQUENCE_LSTM", attrs=_seq_lstm_attrs, infer=_seq_lstm_infer,
               reference=_seq_lstm_reference, stateful=True, execute=_write_back_state(_seq_lstm_reference),
               doc=(_seq_lstm_reference.__doc__ or "").strip()))


# -- LOCAL_RESPONSE_NORMALIZATION ------------------------------------------------------

# L2_NORMALIZATION is defined in reduce.py (an op along the last axis).


def _same_shape(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    return [TensorSpec(inputs[0].shape, inputs[0].dtype)]


def _lrn_attrs(node: Node, tensors: Sequence[Tensor]) -> dict:
    check_inputs(node, 1)
    x = _required(node, tensors, 0, "input")
    need_rank(x.shape, 4, "input")
    _check_float(x, "input")
    o = node.options
    radius = int(o.get("radius", 0))
    if radius < 0:
        raise ModelFormatError(f"radius {radius} must not be negative")
    return {"radius": radius, "bias": float(o.get("bias", 0.0)), "alpha": float(o.get("alpha", 0.0)),
            "beta": float(o.get("beta", 0.0))}


def _lrn_reference(inputs: list, attrs: dict) -> list[np.ndarray]:
    """x * (bias + alpha * sum of x^2 over channels c-radius..c+radius) ^ -beta."""
    x = inputs[0].astype(np.float32)
    r = attrs["radius"]
    sq = np.pad(x * x, [(0, 0)] * 3 + [(r, r)])
    depth = x.shape[3]
    window = sum(sq[..., d:d + depth] for d in range(2 * r + 1))
    scale = np.power(attrs["bias"] + attrs["alpha"] * window, -attrs["beta"])
    return [(x * scale).astype(np.float32)]


def _lrn_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    need_rank(inputs[0].shape, 4, "input 0")
    return _same_shape(inputs, attrs)


register(OpDef(name="LOCAL_RESPONSE_NORMALIZATION", attrs=_lrn_attrs, infer=_lrn_infer,
               reference=_lrn_reference, doc=_lrn_reference.__doc__ or ""))
