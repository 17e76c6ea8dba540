"""Integer references: quantized nodes computed with LiteRT's own integer arithmetic.

Each op's attrs and shape inference stay where the op is defined; this module adds to
its :class:`OpDef` the ``quantized`` reference and ``quantized_attrs`` (the check of the
node's quantization and everything precomputable: scales, multipliers, clamp ranges).
A node reaches its integer reference through ``attrs["quant"]`` (see
:mod:`litegpu.ops.registry`).

Whose arithmetic: LiteRT's default CPU path hands int8 CONV_2D, DEPTHWISE_CONV_2D,
FULLY_CONNECTED, ADD, SUB, MUL, MEAN, QUANTIZE and DEQUANTIZE to its XNNPACK delegate,
so those follow XNNPACK (float32 requantization rounded to nearest even; ADD/SUB with
21-bit integer multipliers); HARD_SWISH and AVERAGE_POOL_2D on int8 stay on LiteRT's
builtin kernels, so they follow TFLite's fixed-point reference kernels. The two differ by
a quantum here and there, which grows through a deep network (mobilenet_v2_int8's
logits differ by up to 18 quanta between LiteRT's two paths), so each op follows the one
LiteRT really runs. The facts live in :mod:`litegpu.quant`.

Sums of int8 products are accumulated in float64 (BLAS), exact: every partial sum stays
far below 2^53.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import ModelFormatError, UnsupportedError
from ..graph import Node, Tensor
from ..quant import (QuantParams, activation_range, dequantize, fp32_scale, multiply_by_quantized_multiplier,
                     multiply_by_quantized_multiplier_64, quantize, quantize_multiplier, requantize_fp32,
                     round_half_away, rounding_divide_by_pot, saturating_rounding_doubling_high_mul, xnn_add,
                     xnn_add_params)
from .nn import (_pad_hw, _spatial_plan, _tap, bilinear_axis, conv_sums, depthwise_sums, pool_input_4d,
                 transpose_conv_out_hw, transpose_conv_sums)
from .registry import OpDef, TensorSpec, const_input, get_op, register
from .reduce import reduction_axes

I8, U8, I16 = np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int16)


def _attach(op: str, reference, attrs=None) -> None:
    """Give the registered ``op`` its integer reference (and quantization check)."""
    opdef = get_op(op)
    opdef.quantized = reference
    opdef.quantized_attrs = attrs


def _params(q, i: int | None, what: str, dtypes=(I8,), per_tensor: bool = True,
            output: bool = False, zero_scale: bool = False) -> QuantParams:
    """Operand ``i``'s params (the output's with ``output``), refused unless quantized
    with one of ``dtypes`` (and per tensor when asked). With ``zero_scale`` an int16 input
    may have scale 0: TFLite's 16x8 converter gives a GRU's all-zero initial state scale
    0, and the ops that pass it (products, MUL) then have multiplier 0, every result the
    output's zero point, as in LiteRT's kernels."""
    p = q.output(i or 0) if output else q.input(i)
    if p is None:
        raise UnsupportedError(f"{what} is not quantized while other operands are (hybrid / dynamic-range "
                               "quantization is not supported)")
    if p.dtype not in dtypes:
        raise UnsupportedError(f"{what} is quantized {p.dtype.name}; the integer kernels take "
                               f"{'/'.join(d.name for d in dtypes)}")
    if per_tensor and not p.per_tensor:
        raise UnsupportedError(f"{what} is quantized per channel; only per-tensor is supported")
    if zero_scale and p.dtype == I16 and not output and np.all(p.scales == 0):
        pass
    elif not np.all(np.isfinite(p.scales) & (p.scales > 0)):
        raise ModelFormatError(f"{what} has scales {p.scales[:4].tolist()}: they must be positive and finite")
    if np.any((p.zero_points < p.qmin) | (p.zero_points > p.qmax)):
        raise ModelFormatError(f"{what} has zero points outside the {p.dtype.name} range")
    return p


# -- CONV_2D, DEPTHWISE_CONV_2D, FULLY_CONNECTED ----------------------------------------


def _weights_params(q, x: QuantParams, channel_axis: int) -> QuantParams:
    """The weights' params. int8 and int16 inputs take symmetric int8 weights (zero points
    0), per tensor or per output channel along ``channel_axis``; uint8 inputs take uint8
    weights with one scale and any zero point (the legacy asymmetric scheme)."""
    if x.dtype == U8:
        return _params(q, 1, "the filter", dtypes=(U8,))
    w = _params(q, 1, "the filter", per_tensor=False)
    if not w.per_tensor and w.axis != channel_axis:
        raise UnsupportedError(f"filter quantized along axis {w.axis}, expected the output channels "
                               f"(axis {channel_axis})")
    if np.any(w.zero_points != 0):
        raise UnsupportedError("filter zero points must be 0 (symmetric int8 weights)")
    return w


def _bias_check(node: Node, tensors: Sequence[Tensor], index: int, x: QuantParams) -> None:
    if len(node.inputs) <= index or node.inputs[index] < 0:
        return
    allowed = (np.int32, np.int64) if x.dtype == I16 else (np.int32,)
    if tensors[node.inputs[index]].dtype not in allowed:
        raise UnsupportedError(f"bias has type {tensors[node.inputs[index]].type_name}; "
                               f"{x.dtype.name} kernels take {'/'.join(np.dtype(d).name for d in allowed)}")


def gemm_requant(q, node: Node, tensors: Sequence[Tensor], activation: str, channel_axis: int,
                 x_index: int = 0, bias_index: int = 2, int16_style: str = "tflite16",
                 int8_style: str = "xnnpack") -> dict:
    """The requantization of a product-summing node (conv, FC, transpose conv, BATCH_MATMUL).

    int8 and uint8 follow XNNPACK (LiteRT delegates them): ``scale`` the float32
    input*filter/output per output channel, rounded to nearest even. int16 (16x8) follows
    TFLite's kernels: ``multiplier``/``shift`` from the double ratio, then the
    single-rounding int64 multiply of the conv kernels (``int16_style`` "tflite16") or
    the double-rounding int32 one of FULLY_CONNECTED ("tflite"). An int8 node XNNPACK
    refuses names its builtin kernel's fixed point in ``int8_style`` ("tflite_neon": see
    :func:`tflite_quantize`), with the same multipliers and TFLite's activation range.
    """
    x = _params(q, x_index, f"input {x_index}", dtypes=(I8, U8, I16), zero_scale=True)
    w = _weights_params(q, x, channel_axis)
    out = _params(q, 0, "the output", dtypes=(x.dtype,), output=True)
    _bias_check(node, tensors, bias_index, x)
    base = {"x_zp": x.zero_point, "w_zp": int(w.zero_points[0]) if x.dtype == U8 else 0,
            "zp": out.zero_point, "dtype": out.dtype}
    if x.dtype == I16 or (x.dtype == I8 and int8_style != "xnnpack"):
        if x.dtype == I16 and (x.zero_point != 0 or out.zero_point != 0):
            raise UnsupportedError("int16 activations must be symmetric (zero point 0)")
        m, shift = quantize_multiplier(np.float64(x.scale) * w.scales.astype(np.float64) / np.float64(out.scale))
        lo, hi = activation_range(activation, out, "tflite")
        return {**base, "style": int16_style if x.dtype == I16 else int8_style, "multiplier": m, "shift": shift,
                "lo": lo, "hi": hi}
    # XNNPACK's requantization scale, per output channel: input * filter / output in float32.
    scale = fp32_scale(x.scale, w.scales, out.scale)
    if np.any(scale >= 256):
        raise UnsupportedError("requantization scale input*filter/output >= 256 (XNNPACK refuses it)")
    lo, hi = activation_range(activation, out)
    return {**base, "style": "xnnpack", "scale": scale, "lo": lo, "hi": hi}


def _gemm_attrs(channel_axis: int, int16_style: str = "tflite16"):
    """quantized_attrs of CONV_2D / DEPTHWISE_CONV_2D / FULLY_CONNECTED."""
    def attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
        return {"requant": gemm_requant(base["quant"], node, tensors, base.get("activation", "NONE"),
                                        channel_axis, int16_style=int16_style)}
    return attrs


def finish_sums(acc: np.ndarray, bias, r: dict) -> np.ndarray:
    """Exact integer sums (int64, or float64 holding integers) plus the bias, requantized
    as :func:`gemm_requant` says, in the output's type."""
    acc = np.rint(acc).astype(np.int64)
    if bias is not None:
        acc = acc + np.asarray(bias, np.int64)
    if r["style"] == "tflite_neon":
        return np.clip(tflite_quantize(acc, r["multiplier"], r["shift"]) + r["zp"], r["lo"], r["hi"]).astype(r["dtype"])
    if r["style"] in ("tflite16", "tflite"):
        multiply = multiply_by_quantized_multiplier_64 if r["style"] == "tflite16" else multiply_by_quantized_multiplier
        y = multiply(acc, r["multiplier"], r["shift"]) + r["zp"]
        return np.clip(y, r["lo"], r["hi"]).astype(r["dtype"])
    return requantize_fp32(acc, r["scale"], r["zp"], r["lo"], r["hi"]).astype(r["dtype"])


def multiply_by_quantized_multiplier_half_up(x, multiplier, shift) -> np.ndarray:
    """TFLite's vector requantization, NEON's ``vshlq_s32``, ``vqrdmulhq_s32`` and
    ``vrshlq_s32`` (x86 builds of LiteRT run them through an SSE emulation of NEON): ``x *
    2^left``, the doubling high multiply rounded half up, then the right shift rounded half
    up, where :func:`multiply_by_quantized_multiplier` rounds both ties away from zero."""
    x, m, shift = np.asarray(x, np.int64), np.asarray(multiplier, np.int64), np.asarray(shift, np.int64)
    right = np.maximum(-shift, 0)
    high = ((x << np.maximum(shift, 0)) * m + (np.int64(1) << 30)) >> 31
    return (high + ((np.int64(1) << right) >> 1)) >> right


def tflite_quantize(acc: np.ndarray, multiplier, shift) -> np.ndarray:
    """TFLite's optimized per-channel ``Quantize`` of int32 sums (channels on the last axis),
    the last step of its int8 TRANSPOSE_CONV kernel: whole groups of eight channels go
    through the vector loop (:func:`multiply_by_quantized_multiplier_half_up`), the channels
    after the last whole group one value at a time through ``MultiplyByQuantizedMultiplier``
    (ties away from zero). Measured against LiteRT 2.3: unet's int8 convert, and 1 to 24
    channels with every fused activation."""
    channels = acc.shape[-1]
    m = np.broadcast_to(np.asarray(multiplier, np.int64), (channels,))
    s = np.broadcast_to(np.asarray(shift, np.int64), (channels,))
    vector = np.arange(channels) < channels // 8 * 8
    return np.where(vector, multiply_by_quantized_multiplier_half_up(acc, m, s),
                    multiply_by_quantized_multiplier(acc, m, s))


def _centered(x: np.ndarray, zero_point: int) -> np.ndarray:
    """Integers minus their zero point, as float64 (exact: BLAS sums stay below 2^53)."""
    return x.astype(np.float64) - zero_point


def _conv_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """Quantized CONV_2D: sums of ``(x - x_zp) * (w - w_zp)`` (padding contributes 0) plus
    the bias, requantized per output channel."""
    x, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    r = attrs["requant"]
    return [finish_sums(conv_sums(_centered(x, r["x_zp"]), _centered(w, r["w_zp"]), attrs), bias, r)]


def _depthwise_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """Quantized DEPTHWISE_CONV_2D: output channel ``c*M + m`` sums ``(x_c - x_zp) * w``."""
    x, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    r = attrs["requant"]
    return [finish_sums(depthwise_sums(_centered(x, r["x_zp"]), _centered(w, r["w_zp"]), attrs), bias, r)]


def _fc_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """Quantized FULLY_CONNECTED: rows of ``x - x_zp`` times ``(w - w_zp)^T`` plus the bias."""
    x, w = inputs[0], inputs[1]
    bias = inputs[2] if len(inputs) > 2 else None
    r = attrs["requant"]
    rows = _centered(x.reshape(-1, w.shape[1]), r["x_zp"])
    y = finish_sums(rows @ _centered(w, r["w_zp"]).T, bias, r)
    shape = (*x.shape[:-1], w.shape[0]) if attrs["keep_num_dims"] else (rows.shape[0], w.shape[0])
    return [y.reshape(shape)]


def _transpose_conv_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """Quantized TRANSPOSE_CONV (inputs: output shape, weights [O,KH,KW,I], input, bias?):
    the scattered sums of ``(x - x_zp) * (w - w_zp)`` plus the bias, requantized."""
    x, w = inputs[2], inputs[1]
    bias = inputs[3] if len(inputs) > 3 else None
    r = attrs["requant"]
    sums = transpose_conv_sums(_centered(x, r["x_zp"]), _centered(w, r["w_zp"]), transpose_conv_out_hw(inputs, attrs),
                               attrs["padding"], attrs["stride"])
    return [finish_sums(sums, bias, r)]


def _transpose_conv_attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
    """XNNPACK takes an int8 TRANSPOSE_CONV only when its output shape, weights and bias are
    constants of the file; LiteRT's builtin kernel runs the others in its own fixed point
    ("tflite_neon"): a Keras Conv2DTranspose converted with a dynamic batch computes its
    output shape with SHAPE and PACK (unet's int8 convert was 6e-3 off LiteRT for that)."""
    constant = all(const_input(node, tensors, i) is not None for i in (0, 1)) and \
        (len(node.inputs) <= 3 or node.inputs[3] < 0 or const_input(node, tensors, 3) is not None)
    return {"requant": gemm_requant(base["quant"], node, tensors, base.get("activation", "NONE"), 0,
                                    x_index=2, bias_index=3, int8_style="xnnpack" if constant else "tflite_neon")}


_attach("TRANSPOSE_CONV", _transpose_conv_q, _transpose_conv_attrs)
_attach("CONV_2D", _conv_q, _gemm_attrs(0))
_attach("DEPTHWISE_CONV_2D", _depthwise_q, _gemm_attrs(3))
_attach("FULLY_CONNECTED", _fc_q, _gemm_attrs(0, int16_style="tflite"))


# -- BATCH_MATMUL (LiteRT's builtin kernel: TFLite's fixed point) ---------------------------


def _bmm_attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
    q = base["quant"]
    a = _params(q, 0, "input 0", (I8, I16))
    b = _params(q, 1, "input 1", (I8, I16) if a.dtype == I16 else (a.dtype,))
    out = _params(q, 0, "the output", (a.dtype,), output=True)
    m, shift = quantize_multiplier(np.float64(a.scale) * np.float64(b.scale) / np.float64(out.scale))
    info = np.iinfo(out.dtype)
    return {"requant": {"a_zp": a.zero_point, "b_zp": b.zero_point, "zp": out.zero_point, "multiplier": int(m),
                        "shift": int(shift), "lo": int(info.min), "hi": int(info.max), "dtype": out.dtype,
                        "style": "tflite16" if a.dtype == I16 else "tflite"}}


def _bmm_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """Quantized BATCH_MATMUL as TFLite's kernel (XNNPACK does not take it): sums of
    ``(a - za) * (b - zb)`` over the shared axis (adj_x / adj_y transpose, batch axes
    broadcast), then the fixed-point multiplier (int64's single rounding for int16)."""
    r = attrs["requant"]
    a, b = _centered(inputs[0], r["a_zp"]), _centered(inputs[1], r["b_zp"])
    if attrs["adj_x"]:
        a = np.swapaxes(a, -1, -2)
    if attrs["adj_y"]:
        b = np.swapaxes(b, -1, -2)
    return [finish_sums(np.matmul(a, b), None, r)]


_attach("BATCH_MATMUL", _bmm_q, _bmm_attrs)


# -- ADD, SUB, MUL -------------------------------------------------------------------------


def _binary_params(base: dict, zero_scale: bool = False) -> tuple[QuantParams, QuantParams, QuantParams, int, int]:
    """Both inputs' and the output's params (int8, uint8 or int16, all the same type) and
    the fused activation's clamp range (TFLite's rounding for int16, never delegated);
    ``zero_scale`` as :func:`_params`."""
    q = base["quant"]
    a = _params(q, 0, "input 0", (I8, U8, I16), zero_scale=zero_scale)
    b = _params(q, 1, "input 1", (a.dtype,), zero_scale=zero_scale)
    out = _params(q, 0, "the output", (a.dtype,), output=True)
    lo, hi = activation_range(base.get("activation", "NONE"), out, "tflite" if a.dtype == I16 else "xnnpack")
    return a, b, out, lo, hi


def _add_attrs(subtract: bool):
    def attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
        a, b, out, lo, hi = _binary_params(base)
        common = {"zp": out.zero_point, "lo": lo, "hi": hi, "dtype": out.dtype}
        if a.dtype != I16:
            return {**common, "add": xnn_add_params(a, b, out, subtract)}
        pot = _pot_shifts(node, tensors, a, b, out) if node.options.get("pot_scale_int16", True) else None
        if pot is not None:
            return {**common, "add16_pot": pot, "sign": -1 if subtract else 1}
        # TFLite's general int16 ADD/SUB: both inputs on twice the larger input scale,
        # shifted left by 15, each scaled by a multiplier below one, summed, rescaled.
        twice_max = 2.0 * max(np.float64(a.scale), np.float64(b.scale))
        m = [quantize_multiplier(np.float64(p.scale) / twice_max) for p in (a, b)]
        mo = quantize_multiplier(twice_max / ((1 << 15) * np.float64(out.scale)))
        return {**common, "add16": {"a": (a.zero_point, *m[0]), "b": (b.zero_point, *m[1]), "out": mo,
                                    "sign": -1 if subtract else 1}}
    return attrs


def _pot_shifts(node: Node, tensors: Sequence[Tensor], a: QuantParams, b: QuantParams,
                out: QuantParams) -> tuple[int, int] | None:
    """The input right shifts of TFLite's int16 power-of-two ADD/SUB (``pot_scale_int16``,
    the LSTM kernel), or None when a scale is not a power of two (TFLite's ``CheckedLog2``,
    within 1e-3 in log2) and the general kernel runs. Refused where LiteRT refuses: zero
    points other than 0, both inputs off the output's scale, an input coarser than the
    output, and (ADD only) broadcasting, which LiteRT's kernel does not do (it reads past
    the smaller input and crashes)."""
    # Imported here: quantized_act imports this module (CheckedLog2 lives with its other users).
    from .quantized_act import checked_log2
    logs = [checked_log2(p.scale) for p in (a, b, out)]
    if not all(is_pot for is_pot, _ in logs):
        return None
    if a.zero_point or b.zero_point or out.zero_point:
        raise UnsupportedError("int16 ADD/SUB with power-of-two scales needs zero points 0")
    shifts = (logs[0][1] - logs[2][1], logs[1][1] - logs[2][1])
    if max(shifts) > 0 or 0 not in shifts:
        raise UnsupportedError(f"int16 {node.op} with power-of-two scales: input/output scale exponents "
                               f"{list(shifts)} (LiteRT takes one input finer than the output at most, "
                               "never coarser)")
    shapes = [tuple(tensors[t].shape) for t in (*node.inputs[:2], node.outputs[0])]
    if node.op == "ADD" and len(set(shapes)) != 1:
        raise UnsupportedError("int16 ADD with power-of-two scales and broadcasting (LiteRT's kernel "
                               "does not broadcast)")
    return -shifts[0], -shifts[1]


def add16_operand(x, zp: int, multiplier: int, shift: int, vector: bool) -> np.ndarray:
    """One operand of TFLite's general int16 ADD/SUB on its way to the sum (int64): less its
    zero point, shifted left by 15, times its multiplier (below one: ``shift`` <= 0). The
    scalar code rounds twice (``MultiplyByQuantizedMultiplier``: the doubling high multiply,
    then the right shift). The vector loop of LiteRT's ADD that broadcasts nothing
    (:func:`add16_vector_end`; ``AddElementwiseInt16``, NEON on x86 through NEON_2_SSE) folds
    the right shift into the left one, ``15 + shift`` (a right shift, flooring, when
    negative), and rounds once, in the high multiply: about 1 value in 5000 comes out a
    unit apart (measured against LiteRT, as the cpu kernel's ``q16._scaled_operand``)."""
    x = np.asarray(x, np.int64) - zp
    if not vector:
        return multiply_by_quantized_multiplier(x << 15, multiplier, shift)
    left = 15 + shift
    return saturating_rounding_doubling_high_mul(x << left if left >= 0 else x >> -left, multiplier)


def add16_vector_end(op: str, a_shape, b_shape) -> int:
    """Where the vector loop of LiteRT's int16 ADD ends: after the last whole block of 16
    outputs of an ADD whose operands both have the output's size (one shape, or shapes
    apart by axes of 1, (1, 48) and (48,): its broadcast dispatch finds nothing to
    broadcast and runs the elementwise loop, measured); 0 for SUB and an ADD that
    broadcasts (TFLite's scalar code throughout)."""
    size = int(np.prod(np.broadcast_shapes(tuple(a_shape), tuple(b_shape)), dtype=np.int64))
    elementwise = int(np.prod(a_shape, dtype=np.int64)) == int(np.prod(b_shape, dtype=np.int64)) == size
    return size // 16 * 16 if op == "ADD" and elementwise else 0


def _add_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """Quantized ADD / SUB. int8/uint8 as XNNPACK: ``(bias + a * ma + b * mb) >> shift +
    zp``, clamped; int16 as TFLite's general kernel (:func:`add16_operand`: LiteRT's vector
    arithmetic for the whole blocks of 16 outputs of an ADD that broadcasts nothing, its
    scalar code elsewhere; then the output's fixed-point multiplier), or with power-of-two
    scales its LSTM kernel: the finer input rounded (half away from zero) onto the
    output's scale, added or subtracted, clamped."""
    if "add" in attrs:
        y = xnn_add(inputs[0], inputs[1], attrs["add"], attrs["zp"], attrs["lo"], attrs["hi"])
        return [y.astype(attrs["dtype"])]
    if "add16_pot" in attrs:
        (sa, sb), sign = attrs["add16_pot"], attrs["sign"]
        total = rounding_divide_by_pot(inputs[0], sa) + sign * rounding_divide_by_pot(inputs[1], sb)
        return [np.clip(total, attrs["lo"], attrs["hi"]).astype(attrs["dtype"])]
    p = attrs["add16"]
    a, b = (np.asarray(x) for x in inputs[:2])
    shape = np.broadcast_shapes(a.shape, b.shape)
    end = add16_vector_end("ADD" if p["sign"] == 1 else "SUB", a.shape, b.shape)

    def total(vector: bool) -> np.ndarray:
        return add16_operand(a, *p["a"], vector) + p["sign"] * add16_operand(b, *p["b"], vector)
    flat = total(False).reshape(-1)
    if end:
        flat[:end] = total(True).reshape(-1)[:end]
    y = multiply_by_quantized_multiplier(flat.reshape(shape), *p["out"]) + attrs["zp"]
    return [np.clip(y, attrs["lo"], attrs["hi"]).astype(attrs["dtype"])]


def _mul_attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
    a, b, out, lo, hi = _binary_params(base, zero_scale=True)
    r = {"a_zp": a.zero_point, "b_zp": b.zero_point, "zp": out.zero_point, "lo": lo, "hi": hi, "dtype": out.dtype}
    if a.dtype == I16:
        # TFLite's int16 MUL: the product times a fixed-point multiplier of the ratio
        # computed in float32 (C++ float operands), as the kernel does.
        r["multiplier"] = quantize_multiplier(fp32_scale(a.scale, b.scale, out.scale))
    else:
        r["scale"] = fp32_scale(a.scale, b.scale, out.scale)
    return {"requant": r}


def _mul_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """Quantized MUL: ``(a - za) * (b - zb)`` requantized in float32 as XNNPACK
    (int8/uint8), or by TFLite's fixed-point multiplier (int16)."""
    r = attrs["requant"]
    acc = (inputs[0].astype(np.int64) - r["a_zp"]) * (inputs[1].astype(np.int64) - r["b_zp"])
    if "multiplier" in r:
        y = np.clip(multiply_by_quantized_multiplier(acc, *r["multiplier"]) + r["zp"], r["lo"], r["hi"])
    else:
        y = requantize_fp32(acc, r["scale"], r["zp"], r["lo"], r["hi"])
    return [y.astype(r["dtype"])]


_attach("ADD", _add_q, _add_attrs(False))
_attach("SUB", _add_q, _add_attrs(True))
_attach("MUL", _mul_q, _mul_attrs)


# -- MEAN ----------------------------------------------------------------------------------


def _mean_attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
    q = base["quant"]
    x = _params(q, 0, "input 0", (I8, U8, I16))
    out = _params(q, 0, "the output", (x.dtype,), output=True)
    m = {"ratio": np.float32(np.float32(x.scale) / np.float32(out.scale)), "x_zp": x.zero_point,
         "zp": out.zero_point, "qmin": out.qmin, "qmax": out.qmax, "dtype": out.dtype}
    if x.dtype == I16:
        # XNNPACK takes 8-bit only: int16 runs TFLite's kernel, which is symmetric-only.
        if x.zero_point != 0 or out.zero_point != 0:
            raise UnsupportedError("int16 MEAN needs zero points 0 (LiteRT refuses others)")
        multiplier, shift = quantize_multiplier(np.float64(x.scale) / np.float64(out.scale))
        m["tflite"] = (int(multiplier), int(shift))
    return {"mean": m}


def xnn_sum_constants(count: int, m: dict, mean: bool) -> tuple[np.float32, np.float32]:
    """``(s, z)`` of XNNPACK's requantization of the sums of ``count`` raw 8-bit values
    (its reduce operator, MEAN and SUM alike): ``s = (in_scale / out_scale) * f`` (``f``:
    ``1 / count`` for a mean, 1 for a sum) and ``z = out_zp - (count * in_zp) * s`` (the
    input zero point folded into the output's), float32 step by step. ``m``: ratio, x_zp,
    zp, qmin, qmax, dtype."""
    factor = np.float32(1.0) / np.float32(max(count, 1)) if mean else np.float32(1.0)
    s = np.float32(m["ratio"] * factor)
    return s, np.float32(np.float32(m["zp"]) - np.float32(np.float32(count * m["x_zp"]) * s))


def xnn_sum_requant(total: np.ndarray, count: int, m: dict, mean: bool) -> np.ndarray:
    """XNNPACK's requantization of int32 sums: ``sum * s + z`` (:func:`xnn_sum_constants`)
    in float32, two roundings, rounded to nearest even, saturated."""
    s, z = xnn_sum_constants(count, m, mean)
    f = total.astype(np.float32) * s + z
    return np.clip(np.rint(f), m["qmin"], m["qmax"]).astype(m["dtype"])


def tflite_mean16_multiplier(count: int, multiplier: int, shift: int) -> tuple[int, int]:
    """The fixed-point multiplier and shift of TFLite's integer mean of ``count`` values
    (``QuantizedMeanOrSum``, symmetric int16): the ratio's multiplier times ``2^k / count``
    (``k = floor(log2 count)``, at most 32 and ``31 + shift``; truncated), ``shift - k``."""
    k = min(max(count, 1).bit_length() - 1, 32, 31 + shift)
    return (multiplier << k) // max(count, 1), shift - k


def _tflite_mean16(total: np.ndarray, count: int, multiplier: int, shift: int) -> np.ndarray:
    """TFLite's integer mean of int32 sums: the double-rounding multiply by
    :func:`tflite_mean16_multiplier`'s."""
    return multiply_by_quantized_multiplier(total, *tflite_mean16_multiplier(count, multiplier, shift))


def _mean_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """Quantized MEAN. int8/uint8 as XNNPACK (:func:`xnn_sum_requant` of the int32 sum
    of the raw values); int16 as TFLite's kernel (:func:`_tflite_mean16`), saturated."""
    x, m = inputs[0], attrs["mean"]
    axes = reduction_axes(inputs[1], x.ndim)
    count = int(np.prod([x.shape[a] for a in axes], dtype=np.int64)) if axes else 1
    total = np.sum(x, axis=axes, keepdims=attrs["keep_dims"], dtype=np.int64)
    if "tflite" not in m:
        return [xnn_sum_requant(total, count, m, mean=True)]
    if x.size == 0:     # LiteRT writes a NaN cast to the type: 0
        return [np.zeros(total.shape, m["dtype"])]
    y = _tflite_mean16(total, count, *m["tflite"]) + m["zp"]
    return [np.clip(y, m["qmin"], m["qmax"]).astype(m["dtype"])]


_attach("MEAN", _mean_q, _mean_attrs)


# -- HARD_SWISH (LiteRT's builtin kernel: TFLite's fixed-point reference) ------------------


def _high_mul16(a, b) -> np.ndarray:
    """gemmlowp's int16 ``SaturatingRoundingDoublingHighMul``: ``round(a * b / 2^15)``,
    ties away from zero."""
    ab = np.asarray(a, np.int64) * np.asarray(b, np.int64)
    total = ab + np.where(ab >= 0, 1 << 14, 1 - (1 << 14))
    high = np.where(total >= 0, total >> 15, -((-total) >> 15))
    both_min = (np.asarray(a) == -32768) & (np.asarray(b) == -32768)
    return np.where(both_min, 32767, high)


def _divide_pot(x, exponent: int) -> np.ndarray:
    """``RoundingDivideByPOT``: divide by 2^exponent, ties away from zero."""
    mask = (1 << exponent) - 1
    x = np.asarray(x, np.int64)
    return (x >> exponent) + ((x & mask) > ((mask >> 1) + (x < 0)))


def _to_int16_multiplier(m32: int) -> int:
    """TFLite's ``DownScaleInt32ToInt16Multiplier``: the top 16 bits, rounded."""
    if m32 >= (1 << 31) - 1 - (1 << 15):
        return 32767
    return (m32 + (1 << 15)) >> 16


def _saturate16(x) -> np.ndarray:
    return np.clip(x, -32768, 32767)


def _hard_swish_attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
    q = base["quant"]
    x = _params(q, 0, "input 0", dtypes=(I8, U8))
    out = _params(q, 0, "the output", dtypes=(I8, U8), output=True)
    hires = np.float32(np.float32(1.0 / 128.0) * np.float32(x.scale))
    out_m, out_e = quantize_multiplier(np.float32(hires / np.float32(out.scale)))
    relu_m, relu_e = quantize_multiplier(np.float32(hires / np.float32(3.0 / 32768.0)))
    if int(out_e) > 0:
        raise UnsupportedError("HARD_SWISH output multiplier above 1 (TFLite refuses it)")
    return {"hard_swish": {"x_zp": x.zero_point, "zp": out.zero_point, "out_m": _to_int16_multiplier(int(out_m)),
                           "out_e": int(out_e), "relu_m": _to_int16_multiplier(int(relu_m)),
                           "relu_e": int(relu_e), "qmin": out.qmin, "qmax": out.qmax, "dtype": out.dtype}}


def _hard_swish_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """TFLite's int8 HARD_SWISH: the input on a 2^7 finer scale; a "relu-ish" factor in
    [0, 1] (x rescaled so 3.0 is 2^15, saturated, moved to [0, 1]) times the input on the
    output scale (a truncating doubling high multiply), shifted right, plus the zero point."""
    p = attrs["hard_swish"]
    hires = (inputs[0].astype(np.int64) - p["x_zp"]) * 128
    preshift = _high_mul16(hires, p["out_m"])
    reluish = hires
    if p["relu_e"] > 0:
        reluish = _saturate16(reluish * (1 << (p["relu_e"] - 1)))
    reluish = _high_mul16(reluish, p["relu_m"])
    if p["relu_e"] > 0:
        reluish = _saturate16(reluish * 2)
    if p["relu_e"] < 0:
        reluish = _divide_pot(reluish, -p["relu_e"])
    reluish = (reluish + (1 << 15)) >> 1
    # SaturatingDoublingHighMul: truncation toward zero (no rounding nudge).
    ab = reluish * preshift
    product = np.where(ab >= 0, ab >> 15, -((-ab) >> 15))
    y = _divide_pot(product, -p["out_e"]) + p["zp"]
    return [np.clip(y, p["qmin"], p["qmax"]).astype(p["dtype"])]


_attach("HARD_SWISH", _hard_swish_q, _hard_swish_attrs)


# -- QUANTIZE, DEQUANTIZE (new ops: their float references are the conversions) ------------


def _convert_attrs(node: Node, tensors: Sequence[Tensor]) -> dict:
    if len(node.inputs) != 1 or len(node.outputs) != 1 or node.inputs[0] < 0:
        raise UnsupportedError(f"expects 1 input and 1 output, has {len(node.inputs)} and {len(node.outputs)}")
    return {}


def _convert_infer(dtype_of):
    def infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
        return [TensorSpec(tuple(inputs[0].shape), dtype_of(inputs[0], attrs))]
    return infer


def _quantize_attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
    q = base["quant"]
    out = _params(q, 0, "the output", dtypes=(I8, U8, I16), output=True, per_tensor=False)
    src = q.input(0)
    attrs = {"out": out, "in": src}
    if src is not None:
        if not (src.per_tensor and out.per_tensor):
            raise UnsupportedError("per-channel requantization")
        ratio = np.float32(np.float32(src.scale) / np.float32(out.scale))
        if src.dtype == out.dtype == I8 and 2.0 ** -8 <= ratio <= 2.0 ** 7:
            # XNNPACK's int8 -> int8 convert (LiteRT delegates it): an 8.8 fixed-point
            # multiplier, rint(256 * ratio), and a right shift by 8 rounding half up.
            attrs["xnn_multiplier"] = int(np.rint(np.float32(256.0) * ratio))
        else:
            # TFLite's Requantize: input/output scale in double, fixed-point multiplier.
            m, shift = quantize_multiplier(np.float64(src.scale) / np.float64(out.scale))
            attrs["requant"] = (int(m), int(shift))
    elif tensors[node.inputs[0]].dtype != np.float32:
        raise UnsupportedError(f"QUANTIZE of {tensors[node.inputs[0]].type_name}")
    return attrs


def _quantize16(x: np.ndarray, out: QuantParams) -> np.ndarray:
    """TFLite's float32 -> int16 QUANTIZE (per tensor): ``x * (1/scale)`` rounded to
    nearest even, converted to int32 (on x86 a value past int32's range, an infinity or
    NaN converts to INT32_MIN, which then saturates to -32768: measured), plus the zero
    point in int32 (wrapping, as in C++), clamped."""
    with np.errstate(over="ignore", invalid="ignore"):
        v = np.rint(np.asarray(x, np.float32) * (np.float32(1.0) / np.float32(out.scale)))
        inside = (v >= np.float32(-2.0 ** 31)) & (v < np.float32(2.0 ** 31))   # NaN is not
    q = np.where(inside, v, np.float32(-2.0 ** 31)).astype(np.int64) + out.zero_point
    q = (q + (1 << 31)) % (1 << 32) - (1 << 31)
    return np.clip(q, out.qmin, out.qmax).astype(out.dtype)


def _quantize_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """QUANTIZE: float32 -> int8/uint8 as XNNPACK (``x * (1/scale)`` rounded to nearest
    even, saturated), -> int16 as TFLite's kernel (:func:`_quantize16`: the same on finite
    values within int32's range, -32768 past it); int8 -> int8 as XNNPACK's convert, other
    int -> int by TFLite's fixed-point requantization."""
    out, src = attrs["out"], attrs["in"]
    x = inputs[0]
    if src is None:
        return [_quantize16(x, out) if out.dtype == I16 and out.per_tensor else quantize(x, out, "even")]
    if "xnn_multiplier" in attrs:
        m = attrs["xnn_multiplier"]
        acc = (out.zero_point << 8) - m * src.zero_point + 0x80 + x.astype(np.int64) * m
        return [np.clip(acc >> 8, out.qmin, out.qmax).astype(out.dtype)]
    m, shift = attrs["requant"]
    y = multiply_by_quantized_multiplier(x.astype(np.int64) - src.zero_point, m, shift) + out.zero_point
    return [np.clip(y, out.qmin, out.qmax).astype(out.dtype)]


def _dequantize_attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
    src = _params(base["quant"], 0, "input 0", dtypes=(I8, U8, I16), per_tensor=False)
    return {"in": src}


def _dequantize_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """DEQUANTIZE: ``(q - zero_point) * scale`` in float32."""
    return [dequantize(inputs[0], attrs["in"])]


# QUANTIZE's output dtype is its output tensor's, known from the node's quantization.
register(OpDef(name="QUANTIZE", attrs=_convert_attrs,
               infer=_convert_infer(lambda x, a: a["quant"].output(0).dtype if "quant" in a else x.dtype),
               reference=lambda inputs, attrs: [np.asarray(inputs[0])],
               quantized=_quantize_q, quantized_attrs=_quantize_attrs,
               doc="Quantize float32 to int8/uint8/int16, or requantize between integer types."))
register(OpDef(name="DEQUANTIZE", attrs=_convert_attrs, infer=_convert_infer(lambda x, a: np.dtype(np.float32)),
               reference=lambda inputs, attrs: [np.asarray(inputs[0], np.float32)],
               quantized=_dequantize_q, quantized_attrs=_dequantize_attrs,
               doc="Dequantize int8/uint8/int16 (or float16) to float32."))


# -- pools and clamps ----------------------------------------------------------------------


def _same_params_attrs(style: str = "xnnpack"):
    """quantized_attrs of ops that keep the input's quantization (pools, resize) on int8,
    uint8 or int16: input and output params must agree; the fused activation (if the op
    has one) becomes a quantized clamp range, quantized as ``style`` says (int16 is never
    delegated: always TFLite's)."""
    def attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
        q = base["quant"]
        x = _params(q, 0, "input 0", (I8, U8, I16))
        out = _params(q, 0, "the output", (x.dtype,), output=True)
        if not x.same_as(out):
            raise UnsupportedError(f"input and output quantization differ (requantizing {node.op} is not supported)")
        lo, hi = activation_range(base.get("activation", "NONE"), out, "tflite" if x.dtype == I16 else style)
        return {"clamp": (lo, hi)}
    return attrs


def _max_pool_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """int8 MAX_POOL_2D: the window's maximum (padding never wins), clamped."""
    x = inputs[0]
    x4 = x.reshape(pool_input_4d(x.shape, attrs))
    out_hw, before = _spatial_plan(x4.shape, attrs["filter"], attrs)
    low = np.iinfo(x.dtype).min
    xp = _pad_hw(x4.astype(np.int64), out_hw, attrs["filter"], attrs["stride"], (1, 1), before, value=low - 1)
    taps = [_tap(xp, i, j, out_hw, attrs["stride"], (1, 1))
            for i in range(attrs["filter"][0]) for j in range(attrs["filter"][1])]
    lo, hi = attrs["clamp"]
    return [np.clip(np.maximum.reduce(taps), lo, hi).astype(x.dtype)]


def _avg_pool_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """int8 AVERAGE_POOL_2D as TFLite's builtin kernel: the int32 sum of the window's real
    pixels divided by their count, rounded half away from zero, clamped."""
    x = inputs[0]
    out_hw, before = _spatial_plan(x.shape, attrs["filter"], attrs)
    args = (out_hw, attrs["filter"], attrs["stride"], (1, 1), before)
    xp = _pad_hw(x.astype(np.int64), *args)
    ones = _pad_hw(np.ones((1, *x.shape[1:3], 1), np.int64), *args)
    fh, fw = attrs["filter"]
    total = sum(_tap(xp, i, j, out_hw, attrs["stride"], (1, 1)) for i in range(fh) for j in range(fw))
    count = sum(_tap(ones, i, j, out_hw, attrs["stride"], (1, 1)) for i in range(fh) for j in range(fw))
    count = np.maximum(count, 1)
    half = count // 2
    avg = np.where(total > 0, (total + half) // count, -((-total + half) // count))
    lo, hi = attrs["clamp"]
    return [np.clip(avg, lo, hi).astype(x.dtype)]


_attach("MAX_POOL_2D", _max_pool_q, _same_params_attrs())
_attach("AVERAGE_POOL_2D", _avg_pool_q, _same_params_attrs(style="tflite"))


# -- RESIZE_BILINEAR (TFLite's integer kernel) ---------------------------------------------


def resize_axis_10(in_size: int, out_size: int, attrs: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """TFLite's integer bilinear taps along one axis: source positions in 1/1024ths
    (``scaled``), the lower and upper source index; C++ division truncates toward zero."""
    if attrs["align_corners"] and out_size > 1:
        scale = ((1 << 10) * (in_size - 1) + (out_size - 1) // 2) // (out_size - 1)
    else:
        scale = ((1 << 10) * in_size + out_size // 2) // out_size
    v = np.arange(out_size, dtype=np.int64)
    scaled = v * scale + (scale // 2 - (1 << 9) if attrs["half_pixel_centers"] else 0)
    lower = np.maximum(np.trunc(scaled / 1024).astype(np.int64), 0)
    upper = np.minimum((scaled + 1023) // 1024, in_size - 1)   # scaled + 1023 is never negative
    return scaled, lower, upper


def _resize_bilinear_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """Quantized RESIZE_BILINEAR as TFLite's ``ResizeBilinearInteger`` (the input's
    quantization is kept): weights in 1/1024ths per axis, the four products summed in
    int64 (units of 2^-20), rounded half away from zero."""
    x = inputs[0].astype(np.int64)
    oh, ow = (int(v) for v in np.asarray(inputs[1]).reshape(-1)[:2])
    sy, y0, y1 = resize_axis_10(x.shape[1], oh, attrs)
    sx, x0, x1 = resize_axis_10(x.shape[2], ow, attrs)
    fy1 = (sy - 1024 * y0)[None, :, None, None]
    fx1 = (sx - 1024 * x0)[None, None, :, None]
    fy0, fx0 = 1024 - fy1, 1024 - fx1
    total = (x[:, y0][:, :, x0] * fy0 * fx0 + x[:, y1][:, :, x0] * fy1 * fx0
             + x[:, y0][:, :, x1] * fy0 * fx1 + x[:, y1][:, :, x1] * fy1 * fx1)
    rounded = total + np.where(total > 0, 1 << 19, -(1 << 19))
    y = np.where(rounded >= 0, rounded >> 20, -((-rounded) >> 20))
    return [y.astype(inputs[0].dtype)]


def _xnn_bilinear_axis(in_size: int, out_size: int, attrs: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """XNNPACK's bilinear taps along one axis (``xnn_indirection_init_resize_bilinear2d_
    hwc_q11``): the source position in float32, its lower and upper index, and the
    upper tap's weight in 1/2048ths rounded to nearest even. Without half-pixel centers
    (TensorFlow's legacy mode, or align_corners) the position is ``out * scale``; with
    them ``out * scale + (scale / 2 - 1/2)``, clamped into the image: the float taps of
    :func:`litegpu.ops.nn.bilinear_axis`, the weight quantized."""
    lower, upper, weight = bilinear_axis(in_size, out_size, {**attrs, "xnnpack": True})
    return lower, upper, np.rint(weight * np.float32(2048)).astype(np.int64)


def _resize_bilinear_xnn(inputs: list, attrs: dict) -> list[np.ndarray]:
    """int8/uint8 RESIZE_BILINEAR as XNNPACK (LiteRT delegates it): horizontal then
    vertical interpolation in Q11 integers, one rounding (half up) by 2^22."""
    x = inputs[0].astype(np.int64)
    oh, ow = (int(v) for v in np.asarray(inputs[1]).reshape(-1)[:2])
    y0, y1, ay = _xnn_bilinear_axis(x.shape[1], oh, attrs)
    x0, x1, ax = _xnn_bilinear_axis(x.shape[2], ow, attrs)
    ax, ay = ax[None, None, :, None], ay[None, :, None, None]
    top = (x[:, y0][:, :, x0] << 11) + (x[:, y0][:, :, x1] - x[:, y0][:, :, x0]) * ax
    bottom = (x[:, y1][:, :, x0] << 11) + (x[:, y1][:, :, x1] - x[:, y1][:, :, x0]) * ax
    acc = (top << 11) + (bottom - top) * ay
    return [((acc + (1 << 21)) >> 22).astype(inputs[0].dtype)]


def _resize_bilinear_any(inputs: list, attrs: dict) -> list[np.ndarray]:
    """Quantized RESIZE_BILINEAR: XNNPACK's for int8/uint8, TFLite's for int16."""
    if inputs[0].dtype == I16:
        return _resize_bilinear_q(inputs, attrs)
    return _resize_bilinear_xnn(inputs, attrs)


_attach("RESIZE_BILINEAR", _resize_bilinear_any, _same_params_attrs())


# -- CONCATENATION (inputs on other scales are rescaled, as TFLite's kernel does) -----------


def _concat_attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
    q = base["quant"]
    out = _params(q, 0, "the output", (I8, U8, I16), output=True)
    rescale = []
    for i in range(len(node.inputs)):
        p = _params(q, i, f"input {i}", (out.dtype,))
        # TFLite's ConcatenationWithScaling: scale and bias in float32 (1/out_scale first).
        scale = np.float32(np.float32(p.scale) * (np.float32(1.0) / np.float32(out.scale)))
        rescale.append(None if p.same_as(out) else (scale, np.float32(-p.zero_point * scale)))
    return {"rescale": rescale, "zp": out.zero_point, "dtype": out.dtype}


def _concat_q(inputs: list, attrs: dict) -> list[np.ndarray]:
    """Quantized CONCATENATION: an input with the output's quantization is copied; one on
    another scale becomes ``round(x * s + b) + zp`` (float32, ties away from zero) as in
    TFLite's kernel, saturated to the type."""
    parts = []
    for x, r in zip(inputs, attrs["rescale"]):
        if r is not None:
            x = round_half_away(x.astype(np.float32) * r[0] + r[1]).astype(np.int64) + attrs["zp"]
        parts.append(x)
    info = np.iinfo(attrs["dtype"])
    return [np.clip(np.concatenate(parts, axis=attrs["axis"]), info.min, info.max).astype(attrs["dtype"])]


_attach("CONCATENATION", _concat_q, _concat_attrs)


# -- pure data movement: the float reference is right on integers ----------------------------


def _movement_attrs(node: Node, tensors: Sequence[Tensor], base: dict) -> dict:
    """Data movement keeps values: every quantized input of the output's type must carry
    the output's quantization (LiteRT would requantize otherwise)."""
    q = base["quant"]
    out = q.output(0)
    for i, p in enumerate(q.inputs):
        if p is not None and out is not None and p.dtype == out.dtype and not p.same_as(out):
            raise UnsupportedError(f"input {i} and the output have different quantization "
                                   "(requantizing data movement is not supported)")
    return {}


DATA_MOVEMENT = ("RESHAPE", "SQUEEZE", "EXPAND_DIMS", "TRANSPOSE", "PAD", "PADV2", "PACK",
                 "UNPACK", "SPLIT", "SPLIT_V", "GATHER", "GATHER_ND", "SLICE", "STRIDED_SLICE", "SPACE_TO_DEPTH",
                 "DEPTH_TO_SPACE", "BATCH_TO_SPACE_ND", "RESIZE_NEAREST_NEIGHBOR", "SPACE_TO_BATCH_ND", "TILE", "BROADCAST_TO", "SHAPE",
                 "REVERSE_V2", "FILL", "DYNAMIC_UPDATE_SLICE")
for _op in DATA_MOVEMENT:
    if get_op(_op) is not None:
        _attach(_op, get_op(_op).reference, _movement_attrs)


def quantized_ops() -> list[str]:
    """The ops with an integer reference (data movement included), sorted."""
    from .registry import all_ops
    return sorted(name for name, opdef in all_ops().items() if opdef.quantized is not None)


__all__ = ["DATA_MOVEMENT", "quantized_ops"]
