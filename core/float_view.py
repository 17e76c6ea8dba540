"""The float view of a quantized model, as LiteRT's GPU delegate runs one.

GPUs run quantized models in float: constant tensors are dequantized once, quantized
inputs are dequantized and quantized outputs quantized at the model's edges, and after
every op whose output was quantized a *quantization simulation* (``QUANT_SIM``: round to
the tensor's integer grid, clamp to its type's range, back to float) keeps activations
on the values the model learned. :func:`float_view` rewrites a model that way; the
result is an ordinary float model every backend runs with its float kernels (a GPU
backend folds ``QUANT_SIM`` into the producing kernel's store like any elementwise
follower). Dynamic-range (hybrid) models get their weights dequantized, but for a
hybrid FULLY_CONNECTED, which runs as XNNPACK runs it: its input quantized row by row on
the fly (``ROW_QUANTIZE``: int8 codes and each row's scale and zero point, every step in
float32 in XNNPACK's order), then ``HYBRID_FULLY_CONNECTED``: exact integer sums of those
codes with the weights' own int8 or int4 codes, scaled back as XNNPACK's qd8 GEMMs do
(per output channel, or block by block with bf16-rounded block scales). That is LiteRT's
result to the bit; the weights dequantized alone leave the input's quantization error out
(1-3 % of a decoder's logits), and a float product of the quantized rows rounds in
another order.

Where float arithmetic on real values would drift from LiteRT's integers, the view
computes on the integers themselves, still in float:

- an 8-bit CONV_2D / DEPTHWISE_CONV_2D / FULLY_CONNECTED / TRANSPOSE_CONV (XNNPACK's
  arithmetic on cpu) sums integer-valued floats, ``(x - x_zp) * (w - w_zp)``, which
  float32 adds exactly while partial sums stay below 2^24; the bias is added, the sum
  multiplied by XNNPACK's float32 requantization scale and rounded, as XNNPACK does:
  the same integers, not a quantum off on a tie;
- an 8-bit ADD / SUB / MUL / MEAN does XNNPACK's arithmetic on the inputs' integers
  (``GRID_ADD`` with its multipliers, rounded half up; ``GRID_MUL``, the exact product
  times its scale; MEAN as an exact SUM then its scale and offset);
- a 16x8 CONV_2D / DEPTHWISE_CONV_2D / FULLY_CONNECTED / TRANSPOSE_CONV (int16
  activations, int8 filter: TFLite's reference kernels, int64 sums) splits the int16
  grid value ``x`` into ``x = 256 * h + l`` (``h = rint(x / 256)`` by a ``QUANT_SIM``,
  ``l`` by a ``GRID_ADD``, both in [-128, 128]) and runs the node twice, on ``h`` and
  on ``l``, with the filter times 2^-12: each sum is exact in float32 while below 2^24
  filter units (the scaling keeps it far from half's overflow in F32_F16 storage).
  ``GRID_REQUANT16`` then reads both back as integers, forms ``256 * A + B + bias`` in
  int64 and requantizes with TFLite's fixed point (the conv kernels' int64
  ``MultiplyByQuantizedMultiplier``, FULLY_CONNECTED's double-rounding one), clamps:
  TFLite's integers, which a float32 product of real values misses by a quantum on ~4 %
  of elements;
- an int16 ADD / SUB / MUL and MEAN form TFLite's int32 value before its requantization
  exactly, as ``256 * high + low`` in float32, and requantize it with ``GRID_REQUANT16``
  (the double-rounding multiply): MUL splits one operand into bytes, each times the other
  (``GRID_MUL``, exact); ADD / SUB take the coarser operand times 2^14 (its scaled value,
  exactly) and the other's scaled value from two tables of the reference's arithmetic over
  its codes (``QUANT_LUT``: high part and low byte); MEAN sums the bytes of its input
  apart, as a 16x8 sum. The real-valued view rounded the real result once, to even; TFLite's fixed
  point rounds its operands, then the result away from zero: a quantum apart on 1 to 4
  in 10000 elements (on 3 % of a MEAN's), which a deep network gathers (nasnet_mobile
  16x8: 3 output quanta);
- an int16 AVERAGE_POOL_2D runs the float pool on grid values (an exact sum divided by the
  count of real pixels) and rounds half away from zero as TFLite's kernel (``QUANT_SIM``
  rounding ``"half_away"``; to even, 1.7 % of nasnet's pooled values were a quantum off);
- a one-input op on 8-bit or int16 integers (HARD_SWISH, LOGISTIC, TANH, requantizing
  QUANTIZE, ...) becomes ``QUANT_LUT``: a table of its own integer reference over every
  input code (65536 entries for int16), looked up with the input's code (an int16 clamp,
  RELU or RELU6, where it requantizes onto another scale);
- an int16 SOFTMAX runs TFLite's ``SoftmaxInt16`` on grid values: each value's distance
  to its row's maximum (REDUCE_MAX, SUB: exact) looked up in a table of the reference's
  exponentials (``QUANT_LUT``), their exact SUM normalized to its leading bit
  (``INV_FLOOR_POW2``, a power-of-two MUL, ``QUANT_SIM`` half up onto 17 bits), the
  reference's reciprocal of that (``QUANT_LUT``) back at the sum's scale, and each
  exponential times it rounded half up (``GRID_MUL_ROUND``): LiteRT's integers while a
  row's sum stays below 2^24 (rows of up to 512 values always). A float softmax misses
  them by the hundreds of quanta where logits spread wider than 10 / beta: the kernel's
  exponential table stops at -10, so every value further below the maximum counts as
  exp(-10) (nasnet_mobile 16x8: 869 of 1000 logits, 322 quanta);
- an int16 RESIZE_BILINEAR whose float taps equal TFLite's integer ones (1/1024ths) and
  are multiples of 1/16 (2x upscaling, say) runs the float op on grid values, exact, and
  rounds half away from zero as TFLite's kernel (``QUANT_SIM`` rounding ``"half_away"``);
  other sizes keep the real-valued view;
- a tensor whose every reader takes integers (those nodes, and data movement between
  them) is kept as integer-valued floats ``q - zp`` (its *grid form*, exact in half
  precision too for 8 bits); other tensors keep real values, and an integer reader of
  one gets its grid form from a ``QUANT_SIM`` that rounds it there.

The 16x8 path lands on LiteRT's integers (unet_small_int16x8, nasnet_mobile 16x8: every
output element). Requantizing int16 ops without a plan (CONCATENATION across scales, the
last ``size % 16`` outputs of a same-shape ADD, where LiteRT leaves its vector loop) keep
the real-valued view or its arithmetic: a quantum off on a tie.

Tensors whose values half precision would change are marked ``full_precision`` (see
:class:`litegpu.graph.Tensor`), so a backend storing float32 as half (F32_F16) keeps
them float32: every int16 activation's view (its codes need 16 bits, half keeps 11), the
float value DEQUANTIZE makes of one, the view's own sums and unrounded values, and a float
tensor a QUANTIZE rounds (in half, values near the rounding's ties would move a quantum).
8-bit grid values, filters of 8-bit integers and the split bytes of a 16x8 sum are exact
in half and stay narrow.

The model's interface is unchanged: the input and output tensors keep their indices,
types and quantization, so the Interpreter API reads and writes the same integers.
Tensors added by the rewrite are appended after the model's own; added nodes get
indices after the file's.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from .errors import LiteGpuError, ModelFormatError
from .graph import Int4Constant, LazyConstant, Model, Node, Subgraph, Tensor
from .ops.registry import OpDef, TensorSpec, get_op, register
from .quant import QuantParams, dequantize, is_quantized

MODE = "float view + quant sim"
F32 = np.dtype(np.float32)
_TYPE_NAMES = {F32: "FLOAT32", np.dtype(np.int8): "INT8"}   # of the view's own tensors

# Sum-of-products ops computed on integer grid values: (activation, filter, bias) positions.
EXACT_SUMS = {"CONV_2D": (0, 1, 2), "DEPTHWISE_CONV_2D": (0, 1, 2), "FULLY_CONNECTED": (0, 1, 2),
              "TRANSPOSE_CONV": (2, 1, 3)}
# Binary ops on grid values: 8-bit ADD / SUB / MUL with XNNPACK's arithmetic.
GRID_BINARY = ("ADD", "SUB", "MUL")
# One-input ops whose quantized output depends on nothing but the input's code.
LOOKUP_OPS = ("HARD_SWISH", "LOGISTIC", "TANH", "ELU", "GELU", "LEAKY_RELU", "RELU", "RELU6", "RELU_N1_TO_1",
              "RELU_0_TO_1", "QUANTIZE", "ABS", "NEG", "SQRT", "RSQRT", "EXP", "LOG", "SQUARE")
# Data movement that carries a grid form through unchanged (same quantization in and out;
# PAD's implicit padding is the zero point, i.e. 0 in grid form).
PASS_THROUGH = ("RESHAPE", "SQUEEZE", "EXPAND_DIMS", "TRANSPOSE", "PAD", "SPACE_TO_DEPTH", "DEPTH_TO_SPACE",
                "SLICE", "STRIDED_SLICE")
# Tables cover 8-bit and 16-bit inputs (65536 entries). Not NEG / ABS, whose int16
# kernels wrap at -32768 (a code rounded past it would read the wrapped entry), nor the
# clamps that keep their input's quantization: those are exact in float on int16 values
# anyway. A clamp onto another scale is tabled: TFLite's fixed-point requantization
# rounds ties away from zero where the float view would round them to even.
_LOOKUP_LIMIT = 1 << 16
_NO_WIDE_LOOKUP = ("ABS", "NEG")
_CLAMPS = ("RELU", "RELU6", "RELU_N1_TO_1", "RELU_0_TO_1")
# 16x8 sums: the int16 grid value x is split as x = 256 * h + l (h = rint(x / 256), both
# in [-128, 128]) and each half summed with the filter times _SUMS16_STEP, whose sums are
# exact in float32 while below 2^24 in filter units; the power-of-two step keeps them far
# from half's overflow (65504) in F32_F16 storage and is exact for int8 filters there too.
_SUMS16_STEP = 2.0 ** -12


def is_quantized_model(model: Model) -> bool:
    """True when some tensor of the model is a quantized integer (weights included)."""
    return any(is_quantized(t) for sg in model.subgraphs for t in sg.tensors)


def float_view(model: Model) -> Model:
    """``model`` rewritten to float as the module docstring says: integer grid arithmetic
    where LiteRT's integers can be reproduced exactly, QUANT_SIM after the other ops."""
    next_node = max((n.index for sg in model.subgraphs for n in (*sg.nodes, *sg.folded_at_load)), default=-1) + 1
    subgraphs = []
    for sg in model.subgraphs:
        rewritten, next_node = _Rewrite(sg, next_node).run()
        subgraphs.append(rewritten)
    return replace(model, subgraphs=tuple(subgraphs))


class _Dequantized(LazyConstant):
    """A quantized constant's float32 value, made when read (see
    :class:`~litegpu.graph.LazyConstant`): a hybrid decoder's products read their weights'
    codes, so the float copies of every weight, four times their bytes, were made and held
    for nothing."""

    __slots__ = ("source", "params")

    def __init__(self, source: Tensor, params: QuantParams) -> None:
        super().__init__(tuple(source.shape))
        self.source = source
        self.params = params

    def make(self) -> np.ndarray:
        return dequantize(self.source.data, self.params)


def _float_tensor(t: Tensor, index: int | None = None, name: str | None = None) -> Tensor:
    """``t`` as a float32 tensor (a constant dequantized when read), without quantization."""
    stored = None
    if t.is_constant:
        params = QuantParams.of(t) if is_quantized(t) else _bias_params(t)
        stored = _Dequantized(t, params) if params is not None else t.stored
    return replace(t, index=t.index if index is None else index, name=name or t.name, dtype=F32,
                   type_name="FLOAT32", stored=stored, quantization=None,
                   full_precision=stored is None and _wide(t))


def _wide(t: Tensor) -> bool:
    """True for a quantized tensor of more than 8 bits: its codes need more than half's
    11-bit significand, so its float view is kept at full precision."""
    return is_quantized(t) and np.dtype(t.dtype).itemsize > 1


def _bias_params(t: Tensor) -> QuantParams | None:
    """An int32/int64 constant with scales (a quantized bias) read as quantized values."""
    q = t.quantization
    if not t.is_constant or t.dtype not in (np.int32, np.int64) or q is None or not q.is_set:
        return None
    scales = np.asarray(q.scales, np.float32).reshape(-1)
    zps = np.zeros(scales.size, np.int64)
    info = np.iinfo(t.dtype)
    return QuantParams(scales, zps, int(q.quantized_dimension) if scales.size > 1 else None, np.dtype(t.dtype),
                       int(info.min), int(info.max))


# -- what each node becomes ----------------------------------------------------------------


@dataclass(frozen=True)
class _Sums:
    """An 8-bit sum-of-products node computed on grid values (see the module docstring)."""

    x: int            # input position of the activation
    weights: np.ndarray   # (w - w_zp) as float32, the filter's layout
    bias: np.ndarray | None
    requant: dict     # XNNPACK's: scale (per channel), zp, lo, hi


@dataclass(frozen=True)
class _Sums16:
    """A 16x8 sum-of-products node (int16 activations, int8 filter) on grid values: the
    activation split into its high and low bytes, two float sums of each with the filter
    times ``_SUMS16_STEP`` (exact), then ``GRID_REQUANT16``: the int64 sum ``256 * high +
    low + bias`` requantized with TFLite's fixed point (see the module docstring)."""

    x: int
    weights: np.ndarray   # w * _SUMS16_STEP as float32, the filter's layout
    requant: dict         # GRID_REQUANT16's options: bias, multiplier, shift, style, lo, hi


@dataclass(frozen=True)
class _HalfAway:
    """A node whose float op on grid values is exact (an AVERAGE_POOL_2D: a sum of integers
    divided by the count of real pixels; an int16 RESIZE_BILINEAR whose float taps are
    TFLite's 1/1024ths exactly and few bits long), then rounded half away from zero as
    TFLite's integer kernel rounds, and clamped to ``[lo, hi]`` (the fused activation's
    range, or the type's, in codes). TFLite's 8-bit average pool rounds the mean of the
    codes, zero point included (``zero_point``): it is added before the rounding."""

    lo: int
    hi: int
    zero_point: int = 0


@dataclass(frozen=True)
class _Mean16:
    """An int16 MEAN as TFLite's kernel: the grid values split into bytes as a 16x8 sum's
    (both in [-128, 128]), the SUM of each (exact in float32 for means of up to 2^17
    values), ``GRID_REQUANT16`` of the two with TFLite's fixed-point multiplier (see
    :func:`litegpu.ops.quantized.tflite_mean16_multiplier`)."""

    requant: dict     # GRID_REQUANT16's options


@dataclass(frozen=True)
class _Binary:
    """An 8-bit ADD/SUB/MUL on grid values. ADD/SUB: XNNPACK's ``(a * am + b * bm) /
    2^shift`` rounded half up (its bias holds the half), as the float32 multipliers
    ``am / 2^shift`` (``scale`` None); MUL: ``a * b`` (exact) times the float32 ``scale``,
    rounded to nearest even."""

    a_multiplier: float
    b_multiplier: float
    scale: float | None
    zp: int
    lo: int
    hi: int


@dataclass(frozen=True)
class _Binary16:
    """An int16 ADD/SUB/MUL as TFLite's kernel (zero points any): the exact int32 value
    before its requantization as ``256 * high + low`` in float32, then ``GRID_REQUANT16``
    with the output's fixed-point multiplier (``requant``).

    MUL (``tables`` None): the first operand split into bytes, each times the second
    (``GRID_MUL``, exact). ADD/SUB: TFLite scales each operand by ``2^15`` times its share
    of twice the larger input scale, so the coarser operand (``direct``) is its grid value
    times ``2^14`` exactly, and the other one's scaled value (up to 2^29) is looked up in
    two tables of :func:`litegpu.ops.quantized.add16_operand` over its codes (``tables``:
    its high part, a multiple of 256, and its low byte, signed for a subtrahend); LiteRT's
    vector arithmetic where it runs (same-shape ADD; its last ``size % 16`` outputs take
    the scalar code, which disagrees in about 1 value in 5000: not followed here), the
    scalar code elsewhere."""

    requant: dict                    # GRID_REQUANT16's options (lo, hi less the zero point)
    direct: int = 0                  # ADD/SUB: the input read as its grid value
    direct_multiplier: float = 0.0   # its 2^14 in steps of 256, signed for a subtrahend
    tables: tuple[np.ndarray, np.ndarray] | None = None   # high (in steps of 256), low byte
    codes: QuantParams | None = None     # the tabled input's quantization


@dataclass(frozen=True)
class _Mean:
    """An 8-bit MEAN as XNNPACK's: the integer sum of the codes times ``s`` plus ``z``
    (float32, two roundings), rounded to nearest even; ``codes_offset`` is the input zero
    point times the count, which turns a sum of grid values into the sum of codes."""

    codes_offset: int
    s: float
    z: float
    zp: int
    qmin: int
    qmax: int


@dataclass(frozen=True)
class _Softmax16:
    """An int16 SOFTMAX as TFLite's ``SoftmaxInt16`` on grid values (see the module
    docstring): its two tables of the integer reference's steps."""

    exps: np.ndarray     # the exponential of a distance to the row's maximum, -65535 .. 0
    reciprocals: np.ndarray   # the reciprocal of a sum normalized to 2^16 .. 2^17


@dataclass(frozen=True)
class _Lookup:
    """A one-input node as a table over every input code."""

    codes: QuantParams    # the input's quantization
    table: np.ndarray     # the integer reference's output for code qmin + k
    out: QuantParams


def _plan(node: Node, tensors: Sequence[Tensor]) -> _Sums | _Sums16 | _Binary | _Mean | _Mean16 | _Lookup | \
        _HalfAway | _Softmax16 | str | None:
    """How ``node`` is rewritten: grid sums, a grid ADD/SUB/MUL, MEAN or int16 SOFTMAX, a
    lookup, a float op on grid values rounded half away, "pass" (data movement that keeps
    grid form), or None (float op and QUANT_SIM)."""
    kind = ("sums" if node.op in EXACT_SUMS else "binary" if node.op in GRID_BINARY else "mean" if node.op == "MEAN"
            else "lookup" if node.op in LOOKUP_OPS else "pass" if node.op in PASS_THROUGH
            else "resize" if node.op == "RESIZE_BILINEAR" else "pool" if node.op == "AVERAGE_POOL_2D"
            else "softmax" if node.op == "SOFTMAX" else None)
    opdef = get_op(node.op)
    if kind is None or opdef is None or opdef.quantized is None:
        return None
    outs = [tensors[o] for o in node.outputs if o >= 0]
    if not outs or not all(is_quantized(t) and t.data is None for t in outs):
        return None
    try:
        attrs = opdef.node_attrs(node, tensors)
    except LiteGpuError:
        return None   # not LiteRT's integer arithmetic: the real-valued view stays
    if "quant" not in attrs or attrs.get("hybrid"):
        return None
    if kind == "pass":
        x = tensors[node.inputs[0]]
        return "pass" if is_quantized(x) and x.data is None and (node.op != "PAD" or len(node.inputs) == 2) else None
    if kind == "sums":
        return _sums_plan(node, tensors, attrs)
    if kind == "binary":
        return _binary_plan(node, tensors, attrs)
    if kind == "mean":
        return _mean_plan(node, tensors, attrs)
    if kind == "resize":
        return _resize_plan(node, tensors, attrs)
    if kind == "pool":
        return _pool16_plan(tensors[node.inputs[0]], attrs)
    if kind == "softmax":
        return _softmax16_plan(tensors[node.inputs[0]], attrs)
    return _lookup_plan(node, tensors, attrs, opdef)


def _binary_plan(node: Node, tensors: Sequence[Tensor], attrs: dict) -> _Binary | _Binary16 | None:
    if "add16" in attrs or "multiplier" in attrs.get("requant", {}):
        return _binary16_plan(node, tensors, attrs)
    p = attrs.get("add")
    if p is not None:
        step = np.float32(2.0 ** -p.shift)
        return _Binary(float(np.float32(p.a_multiplier) * step), float(np.float32(p.b_multiplier) * step), None,
                       attrs["zp"], attrs["lo"], attrs["hi"])
    r = attrs.get("requant")
    if r is None or "scale" not in r:
        return None   # int16: TFLite's fixed point
    return _Binary(1.0, 1.0, float(r["scale"]), r["zp"], r["lo"], r["hi"])


def _binary16_plan(node: Node, tensors: Sequence[Tensor], attrs: dict) -> _Binary16 | None:
    """int16 ADD/SUB (TFLite's general kernel) or MUL with multipliers below one (TFLite's
    kernels take none above: the int32 sums would overflow); an output of rank 0 keeps
    the real-valued view (GRID_REQUANT16 works per channel of the last axis)."""
    from .ops.quantized import add16_operand, add16_vector_end
    out = tensors[node.outputs[0]]
    if not out.shape:
        return None
    p = attrs.get("add16")
    if p is not None:
        (multiplier, shift), zp, lo, hi = p["out"], attrs["zp"], attrs["lo"], attrs["hi"]
    else:
        r = attrs["requant"]
        (multiplier, shift), zp, lo, hi = r["multiplier"], r["zp"], r["lo"], r["hi"]
    channels = int(out.shape[-1])
    requant = {"bias": (0,) * channels, "multiplier": (int(multiplier),) * channels, "shift": (int(shift),) * channels,
               "style": "tflite", "step": 1.0, "lo": int(lo) - zp, "hi": int(hi) - zp}
    if p is None:
        return _Binary16(requant) if shift <= 0 else None
    half = (1 << 30, 0)   # twice the larger scale's share of it, 1/2: the operand times 2^14
    direct = 0 if tuple(p["a"][1:]) == half else 1 if tuple(p["b"][1:]) == half else None
    if direct is None or max(p["a"][2], p["b"][2], shift) > 0:
        return None
    tabled = 1 - direct
    x = QuantParams.of(tensors[node.inputs[tabled]])
    codes = np.arange(x.qmin, x.qmax + 1)
    a, b = (tensors[i] for i in node.inputs[:2])
    vector = add16_vector_end(node.op, a.shape, b.shape) > 0
    scaled = add16_operand(codes, *p["b" if tabled else "a"], vector) * (p["sign"] if tabled else 1)
    high = scaled >> 8
    tables = (high.astype(np.float32), (scaled - 256 * high).astype(np.float32))
    return _Binary16(requant, direct, 64.0 * (p["sign"] if direct == 1 else 1), tables, x)


def _mean_plan(node: Node, tensors: Sequence[Tensor], attrs: dict) -> _Mean | None:
    from .ops.quantized import xnn_sum_constants
    from .ops.reduce import reduction_axes
    m = attrs.get("mean")
    x, axes = tensors[node.inputs[0]], tensors[node.inputs[1]]
    if m is None or axes.data is None:
        return None
    reduced = reduction_axes(axes.data, len(x.shape))
    if any(x.shape_signature[a] < 0 for a in reduced) if x.shape_signature else False:
        return None   # the count is known at run time only
    count = int(np.prod([x.shape[a] for a in reduced], dtype=np.int64))
    if "tflite" in m:
        return _mean16_plan(tensors[node.outputs[0]], count, m)
    s, z = xnn_sum_constants(count, m, mean=True)
    return _Mean(count * m["x_zp"], float(s), float(z), m["zp"], m["qmin"], m["qmax"])


def _mean16_plan(out: Tensor, count: int, m: dict) -> _Mean16 | None:
    """int16 MEAN (zero points 0) of ``count`` values per output, the multiplier per
    channel of the output's last axis, as GRID_REQUANT16 reads it (an output of rank 0,
    or no values, keeps the real-valued view)."""
    from .ops.quantized import tflite_mean16_multiplier
    if not out.shape or count < 1:
        return None
    channels = int(out.shape[-1])
    multiplier, shift = tflite_mean16_multiplier(count, *m["tflite"])
    return _Mean16({"bias": (0,) * channels, "multiplier": (int(multiplier),) * channels,
                    "shift": (int(shift),) * channels, "style": "tflite", "step": 1.0,
                    "lo": int(m["qmin"]), "hi": int(m["qmax"])})


def _sums_plan(node: Node, tensors: Sequence[Tensor], attrs: dict) -> _Sums | None:
    r = attrs.get("requant")
    xi, wi, bi = EXACT_SUMS[node.op]
    if r is None or tensors[node.inputs[wi]].data is None:
        return None
    if r.get("style") in ("tflite16", "tflite"):
        return _sums16_plan(node, tensors, r)
    if r.get("style") != "xnnpack":
        return None
    weights = (tensors[node.inputs[wi]].data.astype(np.float32) - np.float32(r["w_zp"]))
    bias = None
    if len(node.inputs) > bi and node.inputs[bi] >= 0:
        b = tensors[node.inputs[bi]]
        if b.data is None:
            return None
        bias = b.data.astype(np.float32)
    return _Sums(xi, weights, bias, r)


def _sums16_plan(node: Node, tensors: Sequence[Tensor], r: dict) -> _Sums16 | None:
    xi, wi, bi = EXACT_SUMS[node.op]
    w = tensors[node.inputs[wi]]
    if w.dtype != np.int8 or r.get("x_zp", 0) != 0 or r.get("w_zp", 0) != 0 or r.get("zp", 0) != 0:
        return None
    channels = int(w.shape[3] if node.op == "DEPTHWISE_CONV_2D" else w.shape[0])
    bias = np.zeros(channels, np.int64)
    if len(node.inputs) > bi and node.inputs[bi] >= 0:
        b = tensors[node.inputs[bi]]
        if b.data is None or b.data.size != channels:
            return None
        bias = b.data.astype(np.int64).reshape(-1)

    def per_channel(v) -> tuple[int, ...]:
        return tuple(int(k) for k in np.broadcast_to(np.asarray(v, np.int64).reshape(-1), (channels,)))

    options = {"bias": per_channel(bias), "multiplier": per_channel(r["multiplier"]),
               "shift": per_channel(r["shift"]), "style": r["style"], "step": _SUMS16_STEP,
               "lo": int(r["lo"]), "hi": int(r["hi"])}
    weights = (w.data.astype(np.float64) * _SUMS16_STEP).astype(np.float32)
    return _Sums16(xi, weights, options)


def _pool16_plan(x: Tensor, attrs: dict) -> _HalfAway | None:
    """AVERAGE_POOL_2D on int16 (zero point 0), int8 or uint8: the float pool of grid values
    sums integers exactly (windows of up to 512 pixels) and divides by the count of real
    pixels, as TFLite's kernel; the quotient is exact on a tie and, for windows below 512
    pixels, too far from one to be rounded across it. Not a VALID window larger than the
    input, which the float pool divides by its whole area as XNNPACK does
    (``window_clamped``)."""
    p = QuantParams.of(x)
    if p is None or not p.per_tensor or p.dtype not in (np.dtype(np.int16), np.dtype(np.int8), np.dtype(np.uint8)) \
            or (p.dtype == np.int16 and p.zero_point != 0) or max(attrs["filter"][0] * attrs["filter"][1], 1) >= 512:
        return None
    if attrs.get("window_clamped") and any(f > d for f, d in zip(attrs["filter"], x.shape[1:3])):
        return None
    return _HalfAway(*attrs["clamp"], zero_point=p.zero_point)


def _resize_plan(node: Node, tensors: Sequence[Tensor], attrs: dict) -> _HalfAway | None:
    """int16 (TFLite's integer kernel, zero point 0) where, along both axes, the float
    op's taps (:func:`litegpu.ops.nn.bilinear_axis`) weigh each source row / column as
    TFLite's integer taps do and are multiples of 1/16: sums of int16 grid values times
    products of such taps keep 24 bits, exact in float32."""
    from .ops.nn import bilinear_axis
    from .ops.quantized import resize_axis_10
    x, size = tensors[node.inputs[0]], tensors[node.inputs[1]]
    p = QuantParams.of(x)
    if p is None or p.dtype != np.int16 or not p.per_tensor or p.zero_point != 0 or size.data is None \
            or len(x.shape) != 4 or any(d < 0 for d in (x.shape_signature or x.shape)):
        return None
    for axis, out_size in zip((1, 2), np.asarray(size.data).reshape(-1)[:2]):
        in_size, out_size = int(x.shape[axis]), int(out_size)
        lo, hi, f = bilinear_axis(in_size, out_size, attrs)
        scaled, lower, upper = resize_axis_10(in_size, out_size, attrs)
        ours, theirs = np.zeros((out_size, in_size)), np.zeros((out_size, in_size))
        rows = np.arange(out_size)
        np.add.at(ours, (rows, lo), 1.0 - f.astype(np.float64))
        np.add.at(ours, (rows, hi), f.astype(np.float64))
        upper_weight = (scaled - 1024 * lower) / 1024.0
        np.add.at(theirs, (rows, lower), 1.0 - upper_weight)
        np.add.at(theirs, (rows, upper), upper_weight)
        if not (np.array_equal(ours, theirs) and np.all(f * np.float32(16) == np.rint(f * np.float32(16)))):
            return None
    return _HalfAway(p.qmin, p.qmax)


def _softmax16_plan(x: Tensor, attrs: dict) -> _Softmax16 | None:
    """int16 SOFTMAX (the 8-bit one keeps the real-valued view): the reference's
    exponential of every distance to the row's maximum (rescaled by its multiplier, looked
    up in its exp table) and its reciprocal of every normalized sum (looked up in its
    1 / (1 + x) table), as ``_softmax16`` computes them."""
    from .ops.quantized_act import lut16_lookup
    from .quant import multiply_by_quantized_multiplier
    p = attrs.get("softmax16")
    if p is None or not x.shape or x.shape[-1] < 1:
        return None
    distance = np.arange(-65535, 1, dtype=np.int64)
    scaled = multiply_by_quantized_multiplier(distance, p["multiplier"], p["shift"])
    exps = lut16_lookup(np.clip(scaled + 32767, -32768, 32767), p["exp_lut"])
    normalized = np.arange(1 << 16, (1 << 17) + 1, dtype=np.int64)
    reciprocals = lut16_lookup(np.clip(normalized - (1 << 15) - (1 << 16), -32768, 32767), p["recip_lut"])
    return _Softmax16(exps.astype(np.float32), reciprocals.astype(np.float32))


def _lookup_plan(node: Node, tensors: Sequence[Tensor], attrs: dict, opdef: OpDef) -> _Lookup | None:
    if sum(1 for i in node.inputs if i >= 0 and tensors[i].data is None) != 1 or node.inputs[0] < 0:
        return None
    x, out = QuantParams.of(tensors[node.inputs[0]]), QuantParams.of(tensors[node.outputs[0]])
    if x is None or out is None or not (x.per_tensor and out.per_tensor) or x.qmax - x.qmin >= _LOOKUP_LIMIT:
        return None
    if x.qmax - x.qmin >= 1 << 8 and (node.op in _NO_WIDE_LOOKUP or node.op in _CLAMPS and x.same_as(out)):
        return None
    codes = np.arange(x.qmin, x.qmax + 1).astype(x.dtype)
    table = _table_where_defined(opdef.reference_for(attrs), attrs, codes)
    if table is None or table.shape != codes.shape:
        return None
    return _Lookup(x, table, out)


def _table_where_defined(reference, attrs: dict, codes: np.ndarray) -> np.ndarray | None:
    """The reference over ``codes``; where it refuses some (SQRT or RSQRT of a negative
    value: LiteRT fails at invoke), each refused code takes the output of the nearest code
    it accepts, so a GPU, which cannot raise mid-kernel, clamps to the op's domain rather
    than computing NaN into an integer (NVIDIA's Vulkan made that -128). A refused span is
    found by halving, a few dozen calls; None if no code is accepted."""
    def accepted(lo: int, hi: int) -> list[tuple[int, np.ndarray]]:
        try:
            return [(lo, np.asarray(reference([codes[lo:hi]], attrs)[0]))]
        except LiteGpuError:
            if hi - lo == 1:
                return []
            mid = (lo + hi) // 2
            return accepted(lo, mid) + accepted(mid, hi)
    pieces = accepted(0, codes.size)
    if not pieces:
        return None
    if len(pieces) == 1 and pieces[0][1].shape == codes.shape:
        return pieces[0][1]
    known = np.zeros(codes.size, bool)
    values = np.zeros(codes.size, pieces[0][1].dtype)
    for lo, part in pieces:
        if part.shape != (part.size,):
            return None
        values[lo:lo + part.size], known[lo:lo + part.size] = part, True
    where, idx = np.flatnonzero(known), np.arange(codes.size)
    after = where[np.minimum(np.searchsorted(where, idx), where.size - 1)]
    before = where[np.maximum(np.searchsorted(where, idx) - 1, 0)]
    return values[np.where(np.abs(before - idx) <= np.abs(after - idx), before, after)]


# -- the rewrite ---------------------------------------------------------------------------


class _Rewrite:
    """One subgraph's float view."""

    def __init__(self, sg: Subgraph, next_node: int) -> None:
        self.sg = sg
        self.next_node = next_node
        self.tensors = list(sg.tensors)
        self.nodes: list[Node] = []
        self.plans = {node.index: _plan(node, sg.tensors) for node in sg.nodes}
        self.grid = self._grid_form_tensors()
        self.grid_of: dict[int, int] = {}   # real-form tensor -> its rounded grid form
        # a hybrid product's input -> its ROW_QUANTIZE outputs (codes, params)
        self.rows_quantized: dict[int, tuple[int, int]] = {}
        edges = set(sg.inputs) | set(sg.outputs)
        # Where each quantized tensor's float value lives: in place, except at the edges,
        # whose integer tensors stay for the caller.
        self.real: dict[int, int] = {}
        for t in sg.tensors:
            if is_quantized(t) or _bias_params(t) is not None:
                if t.index in edges and t.data is None:
                    self.real[t.index] = self.new_tensor(_float_tensor(t), f"{t.name}/real",
                                                         full_precision=_wide(t))
                else:
                    self.tensors[t.index] = _float_tensor(t)

    def _grid_form_tensors(self) -> set[int]:
        """The quantized activations every reader of which takes grid values: produced in
        this subgraph, not an output, read only by grid sums (as their activation), lookups
        (as their input) or pass-through movement whose outputs are grid form too."""
        sg = self.sg
        readers: dict[int, list[tuple[Node, int]]] = {}
        produced: set[int] = set()
        for node in sg.nodes:
            for pos, i in enumerate(node.inputs):
                if i >= 0:
                    readers.setdefault(i, []).append((node, pos))
            produced.update(node.outputs)
        grid = {t.index for t in sg.tensors if t.index in produced and t.index not in sg.outputs
                and is_quantized(t) and t.data is None and t.index in readers}

        def takes_grid(node: Node, pos: int) -> bool:
            plan = self.plans[node.index]
            if isinstance(plan, (_Sums, _Sums16)):
                return pos == plan.x
            if isinstance(plan, (_Binary, _Binary16)):
                return pos in (0, 1)
            if isinstance(plan, (_Mean, _Mean16, _Lookup, _HalfAway, _Softmax16)):
                return pos == 0
            return plan == "pass" and pos == 0 and all(o in grid for o in node.outputs if o >= 0)

        # Any producer can write grid form (its QUANT_SIM rounds to it); a reader that
        # cannot take it takes the tensor out, which may take a movement's input out too.
        changed = True
        while changed:
            changed = False
            for t in sorted(grid):
                if not all(takes_grid(n, pos) for n, pos in readers[t]):
                    grid.discard(t)
                    changed = True
        return grid

    def new_tensor(self, like: Tensor, name: str, data: np.ndarray | LazyConstant | None = None,
                   full_precision: bool = True, dtype: np.dtype = F32) -> int:
        """Append a tensor of ``dtype`` (float32) shaped like ``like`` (or ``data``'s constant).

        The view's own tensors are integer sums, values about to be rounded onto a grid,
        or constants of that arithmetic: full precision unless the caller knows the values
        fit half (8-bit grid values, filters of 8-bit integers times a power of two).
        """
        index = len(self.tensors)
        if isinstance(data, LazyConstant):   # (made when read, as the model's own)
            like = replace(like, shape=tuple(data.shape), shape_signature=tuple(data.shape))
        elif data is not None:
            data = np.ascontiguousarray(data, dtype)
            data.setflags(write=False)
            like = replace(like, shape=tuple(data.shape), shape_signature=tuple(data.shape))
        dtype = np.dtype(dtype)
        self.tensors.append(replace(like, index=index, name=name, dtype=dtype, type_name=_TYPE_NAMES[dtype],
                                    stored=data,
                                    quantization=None, is_variable=False, sparsity=None,
                                    full_precision=full_precision))
        return index

    def add(self, op: str, inputs: tuple, outputs: tuple, options: dict | None = None) -> None:
        self.nodes.append(Node(self.next_node, op, -1, 1, tuple(inputs), tuple(outputs), options or {}))
        self.next_node += 1

    def mapped(self, indices: Sequence[int]) -> tuple[int, ...]:
        return tuple(self.real.get(i, i) if i >= 0 else i for i in indices)

    def grid_input(self, t: int) -> int:
        """Tensor ``t`` in grid form: itself, a constant's ``q - zp``, or rounded from its
        real values once."""
        if t in self.grid:
            return t
        source = self.sg.tensors[t]
        if t not in self.grid_of and source.data is not None:
            p = QuantParams.of(source)
            self.grid_of[t] = self.new_tensor(source, f"{source.name}/grid",
                                              source.data.astype(np.float64) - p.zero_points[0], _wide(source))
        elif t not in self.grid_of:
            src = self.mapped([t])[0]
            self.grid_of[t] = self.new_tensor(self.tensors[src], f"{self.sg.tensors[t].name}/grid",
                                              full_precision=_wide(source))
            self.add("QUANT_SIM", (src,), (self.grid_of[t],), self.onto_grid(t, 1.0))
        return self.grid_of[t]

    def onto_grid(self, t: int, out_scale: float) -> dict:
        """QUANT_SIM's options from real values onto ``t``'s grid, in steps of ``out_scale``."""
        p = QuantParams.of(self.sg.tensors[t])
        return _sim(_grid_step(p.scale), out_scale, p.zero_point, p.qmin, p.qmax)

    def out_scale(self, t: int) -> float:
        """What one step of ``t``'s grid is in its float view: 1 in grid form, else the scale."""
        return 1.0 if t in self.grid else QuantParams.of(self.sg.tensors[t]).scale

    def run(self) -> tuple[Subgraph, int]:
        sg = self.sg
        for i in sg.inputs:
            if i in self.real:
                self.add("DEQUANTIZE", (i,), (self.real[i],))
        for node in sg.nodes:
            plan = self.plans[node.index]
            if isinstance(plan, _Sums):
                self.sums(node, plan)
            elif isinstance(plan, _Sums16):
                self.sums16(node, plan)
            elif isinstance(plan, _Binary):
                self.grid_binary(node, plan)
            elif isinstance(plan, _Binary16):
                self.grid_binary16(node, plan)
            elif isinstance(plan, _Mean):
                self.mean(node, plan)
            elif isinstance(plan, _Lookup):
                self.lookup(node, plan)
            elif isinstance(plan, _Mean16):
                self.mean16(node, plan)
            elif isinstance(plan, _HalfAway):
                self.half_away(node, plan)
            elif isinstance(plan, _Softmax16):
                self.softmax16(node, plan)
            elif plan == "pass" and node.inputs[0] in self.grid:
                self.nodes.append(replace(node, inputs=self.mapped(node.inputs)))
            elif not self.hybrid_product(node) and not self.hybrid_lookup(node):
                self.simulated(node)
        for o in sg.outputs:
            if o in self.real:
                self.add("QUANTIZE", (self.real[o],), (o,))
        return replace(sg, tensors=tuple(self.tensors), nodes=tuple(self.nodes)), self.next_node

    def hybrid_product(self, node: Node) -> bool:
        """A hybrid FULLY_CONNECTED as XNNPACK runs it (see the module docstring): its input
        quantized row by row (``ROW_QUANTIZE``, once per input tensor), then
        ``HYBRID_FULLY_CONNECTED`` on those codes and the weights' own integers; False
        (nothing added) for any other node."""
        tensors = self.sg.tensors
        if node.op != "FULLY_CONNECTED" or len(node.inputs) < 2 or min(node.inputs[:2]) < 0:
            return False
        try:
            attrs = get_op(node.op).node_attrs(node, tensors)
        except LiteGpuError:
            return False
        w = tensors[node.inputs[1]]
        x = tensors[node.inputs[0]]
        if not attrs.get("hybrid") or w.data is None or w.data.ndim != 2 or not x.shape \
                or x.shape[-1] != w.data.shape[1]:
            return False
        inputs = self.mapped(node.inputs)
        if node.inputs[0] not in self.rows_quantized:
            like = self.tensors[inputs[0]]
            codes = self.new_tensor(like, f"{x.name}/row_codes", dtype=np.int8)
            params = self.new_tensor(replace(like, shape=(*like.shape[:-1], 2),
                                             shape_signature=(*like.shape_signature[:-1], 2)), f"{x.name}/row_params")
            self.add("ROW_QUANTIZE", (inputs[0],), (codes, params))
            self.rows_quantized[node.inputs[0]] = (codes, params)
        codes, params = self.rows_quantized[node.inputs[0]]
        block = int(attrs.get("block_size") or 0)
        scales = attrs["block_scale"] if block else attrs["weight_scale"]
        codes_of = w.stored if isinstance(w.stored, Int4Constant) else np.asarray(w.data, np.int8)
        weights = self.new_tensor(w, f"{w.name}/codes", codes_of, dtype=np.int8)
        scales_t = self.new_tensor(w, f"{w.name}/scales", np.asarray(scales, F32))
        bias = inputs[2] if len(inputs) > 2 else -1
        self.add("HYBRID_FULLY_CONNECTED", (codes, params, weights, bias, scales_t), node.outputs,
                 {"activation": attrs["activation"], "keep_num_dims": attrs["keep_num_dims"], "block_size": block})
        return True

    def hybrid_lookup(self, node: Node) -> bool:
        """A hybrid EMBEDDING_LOOKUP (float rows of a quantized table) of run-time ids, which
        no GPU runs (it could not report a bad id): kept as it is, on the table as the model
        stores it, for the cpu's lookup, which scales just the rows it reads. Its float view
        was the whole table dequantized: a decoder's vocabulary times its width in float32,
        in each signature. False (nothing added) for any other node."""
        if node.op != "EMBEDDING_LOOKUP" or len(node.inputs) != 2 or min(node.inputs) < 0 \
                or self.sg.tensors[node.inputs[0]].is_constant:
            return False
        try:
            hybrid = get_op(node.op).node_attrs(node, self.sg.tensors).get("hybrid")
        except LiteGpuError:
            return False
        if not hybrid:
            return False
        table = self.sg.tensors[node.inputs[1]]
        kept = len(self.tensors)
        self.tensors.append(replace(table, index=kept, name=f"{table.name}/codes"))
        self.nodes.append(replace(node, inputs=(self.mapped(node.inputs[:1])[0], kept)))
        return True

    def simulated(self, node: Node) -> None:
        """The float op, then QUANT_SIM onto each quantized output's grid."""
        tensors = self.sg.tensors
        quantized_out = [o for o in node.outputs if o >= 0 and is_quantized(tensors[o])]
        if node.op == "QUANTIZE" and quantized_out:
            # Float (or another grid) onto this tensor's grid: the simulation itself. A float
            # input is kept at full precision: half storage would move values across the
            # rounding's ties (mobilenet_v3_small_int8: 8 output quanta).
            o, x = node.outputs[0], node.inputs[0]
            if not is_quantized(tensors[x]):
                self.tensors[x] = replace(self.tensors[x], full_precision=True)
            self.add("QUANT_SIM", self.mapped(node.inputs), self.mapped(node.outputs),
                     self.onto_grid(o, self.out_scale(o)))
            return
        if node.op == "DEQUANTIZE" and _wide(tensors[node.inputs[0]]):
            # The float value of an int16 code has 16 significant bits: half keeps 11.
            o = node.outputs[0]
            self.tensors[o] = replace(self.tensors[o], full_precision=True)
        outputs = list(self.mapped(node.outputs))
        sims = []
        for k, o in enumerate(node.outputs):
            if o in quantized_out:
                raw = self.new_tensor(tensors[o], f"{tensors[o].name}/unrounded")
                sims.append((raw, outputs[k], self.onto_grid(o, self.out_scale(o))))
                outputs[k] = raw
        self.nodes.append(replace(node, inputs=self.mapped(node.inputs), outputs=tuple(outputs)))
        for raw, out, options in sims:
            self.add("QUANT_SIM", (raw,), (out,), options)

    def sums(self, node: Node, plan: _Sums) -> None:
        """Grid sums, plus the bias, times XNNPACK's scale, rounded and clamped."""
        o = node.outputs[0]
        name = self.sg.tensors[o].name
        inputs = list(node.inputs)
        xi, wi, bi = EXACT_SUMS[node.op]
        inputs[xi] = self.grid_input(node.inputs[xi])
        inputs[wi] = self.new_tensor(self.tensors[o], f"{name}/grid_filter", plan.weights, False)
        if len(inputs) > bi:
            inputs[bi] = -1
        acc = self.new_tensor(self.tensors[o], f"{name}/sums")
        self.nodes.append(replace(node, inputs=self.mapped(inputs), outputs=(acc,),
                                  options={**node.options, "fused_activation_function": 0}))
        if plan.bias is not None:
            biased = self.new_tensor(self.tensors[o], f"{name}/biased")
            self.add("ADD", (acc, self.new_tensor(self.tensors[o], f"{name}/grid_bias", plan.bias)), (biased,))
            acc = biased
        r = plan.requant
        scale = np.asarray(r["scale"], np.float32).reshape(-1)
        scaled = self.new_tensor(self.tensors[o], f"{name}/scaled")
        self.add("MUL", (acc, self.new_tensor(self.tensors[o], f"{name}/requant_scale", scale)), (scaled,))
        self.add("QUANT_SIM", (scaled,), self.mapped([o]), _sim(1.0, self.out_scale(o), r["zp"], r["lo"], r["hi"]))

    def sums16(self, node: Node, plan: _Sums16) -> None:
        """The int16 grid value split into bytes (QUANT_SIM by 256, GRID_ADD of the rest),
        the node's sums of each with the scaled filter, GRID_REQUANT16 of both, QUANT_SIM
        into the output's form."""
        o = node.outputs[0]
        name = self.sg.tensors[o].name
        xi, wi, bi = EXACT_SUMS[node.op]
        high, low = self.split_bytes(self.grid_input(node.inputs[xi]), f"{name}/input", 128, full_precision=False)
        weights = self.new_tensor(self.tensors[o], f"{name}/grid_filter", plan.weights, False)
        sums = []
        for part in (high, low):
            inputs = list(node.inputs)
            inputs[xi], inputs[wi] = part, weights
            if len(inputs) > bi:
                inputs[bi] = -1
            acc = self.new_tensor(self.tensors[o], f"{name}/sums_{'high' if part == high else 'low'}")
            options = {**node.options, "fused_activation_function": 0}
            index = node.index
            if part == low:   # the node's second copy: an added node
                index, self.next_node = self.next_node, self.next_node + 1
            self.nodes.append(replace(node, index=index, inputs=self.mapped(inputs), outputs=(acc,), options=options))
            sums.append(acc)
        code = self.new_tensor(self.tensors[o], f"{name}/requantized")
        self.add("GRID_REQUANT16", tuple(sums), (code,), plan.requant)
        r = plan.requant
        self.add("QUANT_SIM", (code,), self.mapped([o]), _sim(1.0, self.out_scale(o), 0, r["lo"], r["hi"]))

    def grid_binary(self, node: Node, plan: _Binary) -> None:
        """GRID_ADD of both inputs' grid forms rounded half up as XNNPACK's shift does, or
        GRID_MUL times the scale rounded to nearest even."""
        o = node.outputs[0]
        total = self.new_tensor(self.tensors[o], f"{self.sg.tensors[o].name}/unrounded")
        operands = tuple(self.grid_input(i) for i in node.inputs[:2])
        if plan.scale is None:
            self.add("GRID_ADD", operands, (total,), {"a_multiplier": plan.a_multiplier,
                                                      "b_multiplier": plan.b_multiplier})
        else:
            self.add("GRID_MUL", operands, (total,), {"scale": plan.scale})
        self.add("QUANT_SIM", (total,), self.mapped([o]),
                 _sim(1.0, self.out_scale(o), plan.zp, plan.lo, plan.hi, "even" if plan.scale else "half_up"))

    def grid_binary16(self, node: Node, plan: _Binary16) -> None:
        """TFLite's int16 ADD/SUB/MUL value before requantization as ``256 * high + low``
        (see :class:`_Binary16`), GRID_REQUANT16, QUANT_SIM into the output's form."""
        o = node.outputs[0]
        name = self.sg.tensors[o].name
        high, low, code = (self.new_tensor(self.tensors[o], f"{name}/{what}")
                           for what in ("high", "low", "requantized"))
        if plan.tables is None:
            a_high, a_low = self.split_bytes(self.grid_input(node.inputs[0]), f"{name}/input", 256)
            b = self.grid_input(node.inputs[1])
            self.add("GRID_MUL", (a_high, b), (high,), {"scale": 1.0})
            self.add("GRID_MUL", (a_low, b), (low,), {"scale": 1.0})
        else:
            x, tabled = self.grid_input(node.inputs[plan.direct]), node.inputs[1 - plan.direct]
            high_part, low_part = (self.lookup_codes(tabled, plan.codes, table, f"{name}/operand_{what}")
                                   for what, table in zip(("high", "low"), plan.tables))
            self.add("GRID_ADD", (x, high_part), (high,), {"a_multiplier": plan.direct_multiplier, "b_multiplier": 1.0})
            # the low byte broadcast over the output's shape (the other input times 0)
            self.add("GRID_ADD", (x, low_part), (low,), {"a_multiplier": 0.0, "b_multiplier": 1.0})
        self.add("GRID_REQUANT16", (high, low), (code,), plan.requant)
        r = plan.requant
        self.add("QUANT_SIM", (code,), self.mapped([o]), _sim(1.0, self.out_scale(o), 0, r["lo"], r["hi"]))

    def mean(self, node: Node, plan: _Mean) -> None:
        """SUM of the grid values (exact), plus the zero points back (the sum of codes),
        times ``s`` plus ``z`` as XNNPACK, rounded onto codes that already hold the zero point."""
        o = node.outputs[0]
        name = self.sg.tensors[o].name
        steps = [self.new_tensor(self.tensors[o], f"{name}/{what}") for what in ("grid_sum", "codes_sum", "scaled",
                                                                                 "unrounded")]
        self.nodes.append(replace(node, op="SUM", inputs=(self.grid_input(node.inputs[0]), node.inputs[1]),
                                  outputs=(steps[0],)))
        constant = [self.new_tensor(self.tensors[o], f"{name}/{what}", np.float32(v).reshape(1))
                    for what, v in (("codes_offset", plan.codes_offset), ("s", plan.s), ("z", plan.z))]
        self.add("ADD", (steps[0], constant[0]), (steps[1],))
        self.add("MUL", (steps[1], constant[1]), (steps[2],))
        self.add("ADD", (steps[2], constant[2]), (steps[3],))
        self.add("QUANT_SIM", (steps[3],), self.mapped([o]),
                 _sim(1.0, self.out_scale(o), plan.zp, plan.qmin, plan.qmax, coded=True))

    def half_away(self, node: Node, plan: _HalfAway) -> None:
        """The float op of the grid values (exact; its fused activation left to the
        clamp), rounded half away from zero and clamped."""
        o = node.outputs[0]
        raw = self.new_tensor(self.tensors[o], f"{self.sg.tensors[o].name}/unrounded")
        options = {**node.options, "fused_activation_function": 0} if "fused_activation_function" in node.options \
            else node.options
        self.nodes.append(replace(node, inputs=(self.grid_input(node.inputs[0]), *self.mapped(node.inputs[1:])),
                                  outputs=(raw,), options=options))
        if plan.zero_point:
            name = self.sg.tensors[o].name
            codes = self.new_tensor(self.tensors[o], f"{name}/unrounded_codes")
            zero = self.new_tensor(self.tensors[o], f"{name}/zero_point", np.float32(plan.zero_point).reshape(1))
            self.add("ADD", (raw, zero), (codes,))
            raw = codes
        self.add("QUANT_SIM", (raw,), self.mapped([o]),
                 _sim(1.0, self.out_scale(o), plan.zero_point, plan.lo, plan.hi, "half_away", coded=True))

    def mean16(self, node: Node, plan: _Mean16) -> None:
        """The grid values split into bytes, the SUM of each (exact), GRID_REQUANT16 with
        TFLite's mean multiplier, QUANT_SIM into the output's form."""
        o = node.outputs[0]
        name = self.sg.tensors[o].name
        sums = []
        parts = self.split_bytes(self.grid_input(node.inputs[0]), f"{name}/input", 128, full_precision=False)
        for part, what in zip(parts, ("high", "low")):
            total = self.new_tensor(self.tensors[o], f"{name}/sum_{what}")
            index = node.index
            if what == "low":   # the node's second copy: an added node
                index, self.next_node = self.next_node, self.next_node + 1
            self.nodes.append(replace(node, index=index, op="SUM", inputs=(part, node.inputs[1]), outputs=(total,)))
            sums.append(total)
        code = self.new_tensor(self.tensors[o], f"{name}/requantized")
        self.add("GRID_REQUANT16", tuple(sums), (code,), plan.requant)
        r = plan.requant
        self.add("QUANT_SIM", (code,), self.mapped([o]), _sim(1.0, self.out_scale(o), 0, r["lo"], r["hi"]))

    def split_bytes(self, x: int, name: str, limit: int, full_precision: bool = True) -> tuple[int, int]:
        """Integer-valued ``x`` as ``256 * high + low``: ``high = rint(x / 256)`` (a
        QUANT_SIM held to ``[-limit, limit]``) and ``low`` in [-128, 128] (a GRID_ADD)."""
        high, low = (self.new_tensor(self.tensors[x], f"{name}_{what}", full_precision=full_precision)
                     for what in ("high", "low"))
        self.add("QUANT_SIM", (x,), (high,), _sim(256.0, 1.0, 0, -limit, limit))
        self.add("GRID_ADD", (x, high), (low,), {"a_multiplier": 1.0, "b_multiplier": -256.0})
        return high, low

    def softmax16(self, node: Node, plan: _Softmax16) -> None:
        """TFLite's int16 SOFTMAX on the grid values of the last axis: the distances to the
        row's maximum, their exponentials from the reference's table, the exact row sum,
        its leading power of two and the sum normalized to 17 bits (rounded half up), the
        reference's reciprocal of that at the sum's scale, each exponential times it
        rounded half up, clamped to [0, 32767] in the output's form."""
        o = node.outputs[0]
        name = self.sg.tensors[o].name
        like = self.tensors[o]
        signature = like.shape_signature or like.shape
        rows = replace(like, shape=(*like.shape[:-1], 1), shape_signature=(*signature[:-1], 1))
        axis = self.new_axis(like, f"{name}/last_axis", len(like.shape) - 1)
        x = self.grid_input(node.inputs[0])
        top, total, step, normalized, shifted, reciprocal, factor = (
            self.new_tensor(rows, f"{name}/{what}") for what in ("row_max", "row_sum", "leading_step", "normalized",
                                                                 "shifted", "reciprocal", "factor"))
        distance, exps, code = (self.new_tensor(like, f"{name}/{what}") for what in ("distance", "exps", "code"))
        self.add("REDUCE_MAX", (x, axis), (top,), {"keep_dims": True})
        self.add("SUB", (x, top), (distance,))
        self.add("QUANT_LUT", (distance, self.new_tensor(like, f"{name}/exp_table", plan.exps)), (exps,),
                 {"in_scale": 1.0, "offset": plan.exps.size - 1})
        self.add("SUM", (exps, axis), (total,), {"keep_dims": True})
        self.add("INV_FLOOR_POW2", (total,), (step,))
        self.add("MUL", (total, step), (normalized,))
        self.add("QUANT_SIM", (normalized,), (shifted,), _sim(2.0 ** -16, 1.0, 0, 1 << 16, 1 << 17, "half_up"))
        self.add("QUANT_LUT", (shifted, self.new_tensor(like, f"{name}/reciprocal_table", plan.reciprocals)),
                 (reciprocal,), {"in_scale": 1.0, "offset": -(1 << 16)})
        self.add("MUL", (reciprocal, step), (factor,))
        self.add("GRID_MUL_ROUND", (exps, factor), (code,))
        self.add("QUANT_SIM", (code,), self.mapped([o]), _sim(1.0, self.out_scale(o), 0, 0, 32767))

    def new_axis(self, like: Tensor, name: str, axis: int) -> int:
        """Append an int32 constant holding ``axis`` (a reduction's axes input)."""
        index = len(self.tensors)
        data = np.array([axis], np.int32)
        data.setflags(write=False)
        self.tensors.append(replace(like, index=index, name=name, dtype=np.dtype(np.int32), type_name="INT32",
                                    shape=(1,), shape_signature=(1,), stored=data, quantization=None,
                                    is_variable=False, sparsity=None, full_precision=False))
        return index

    def lookup(self, node: Node, plan: _Lookup) -> None:
        """QUANT_LUT over the integer reference's outputs, in the output's form."""
        x, o = node.inputs[0], node.outputs[0]
        values = (plan.table.astype(np.float64) - plan.out.zero_point) * self.out_scale(o)
        self.lookup_codes(x, plan.codes, values.astype(np.float32), f"{self.sg.tensors[o].name}/table",
                          self.mapped([o])[0], _wide(self.sg.tensors[o]))

    def lookup_codes(self, x: int, codes: QuantParams, values: np.ndarray, name: str, out: int | None = None,
                     full_precision: bool = True) -> int:
        """QUANT_LUT of ``values`` (a table over ``x``'s codes from ``codes.qmin``) indexed by
        ``x``'s code, read from its grid or real form; into ``out``, or a new tensor of
        ``x``'s shape (for a constant ``x``, the values looked up now: a constant the
        compiler would fold without its ``full_precision``). Returns the output."""
        source = self.sg.tensors[x]
        if out is None and source.data is not None:
            return self.new_tensor(source, f"{name}_lookup", values[source.data.astype(np.int64) - codes.qmin],
                                   full_precision)
        table = self.new_tensor(source, name, values, full_precision)
        if out is None:
            out = self.new_tensor(source, f"{name}_lookup")
        x_scale = 1.0 if x in self.grid else _grid_step(codes.scale)
        self.add("QUANT_LUT", (self.mapped([x])[0], table), (out,),
                 {"in_scale": x_scale, "offset": codes.zero_point - codes.qmin})
        return out


def _grid_step(scale: float) -> float:
    """The step QUANT_SIM and QUANT_LUT divide real values by (as a float32 reciprocal) to
    put them on a tensor's grid: its scale, or 1 for a scale of 0 or so small that the
    reciprocal overflows. TFLite's 16x8 converter gives a GRU's zero state such scales
    (0, 3.6e-43): the tensor holds real zeros only, which any step puts on the zero point,
    where the reciprocal would turn them into NaN (0 * inf)."""
    with np.errstate(divide="ignore", over="ignore"):
        return float(scale) if np.isfinite(np.float32(1) / np.float32(scale)) else 1.0


def _sim(in_scale: float, out_scale: float, zero_point: int, qmin: int, qmax: int,
         rounding: str = "even", coded: bool = False) -> dict:
    return {"in_scale": float(in_scale), "out_scale": float(out_scale), "zero_point": int(zero_point),
            "qmin": int(qmin), "qmax": int(qmax), "rounding": rounding, "coded": coded}


# -- the ops the rewrite inserts -----------------------------------------------------------


def _sim_attrs(node: Node, tensors: Sequence[Tensor]) -> dict:
    o = node.options
    rounding = o.get("rounding", "even")
    if rounding not in ("even", "half_up", "half_away"):
        raise ModelFormatError(f"QUANT_SIM rounding {rounding!r} is not 'even', 'half_up' or 'half_away'")
    return {"in_scale": float(o["in_scale"]), "out_scale": float(o["out_scale"]),
            "zero_point": int(o["zero_point"]), "qmin": int(o["qmin"]), "qmax": int(o["qmax"]), "rounding": rounding,
            "coded": bool(o.get("coded", False))}


def _same_shape_f32(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    return [TensorSpec(tuple(inputs[0].shape), F32)]


def quant_sim(x: np.ndarray, attrs: dict) -> np.ndarray:
    """``(clamp(rint(x / in_scale) + zp, qmin, qmax) - zp) * out_scale`` in float32: onto
    a grid whose step is ``in_scale`` in ``x`` (times the reciprocal, rounded to nearest
    even as XNNPACK quantizes, half up with ``rounding="half_up"``, half away from zero
    with ``"half_away"`` as TFLite's ``std::round``) and back in steps
    of ``out_scale`` (1: grid form). With ``coded`` the rounded value is already the code
    (the zero point is not added)."""
    inv = np.float32(1) / np.float32(attrs["in_scale"])
    zp = np.float32(attrs["zero_point"])
    steps = np.asarray(x, np.float32) * inv
    rounding = attrs.get("rounding", "even")
    if rounding == "half_up":
        rounded = np.floor(steps + np.float32(0.5))
    elif rounding == "half_away":
        whole = np.trunc(steps)
        rounded = whole + np.where(np.abs(steps - whole) >= np.float32(0.5), np.sign(steps), np.float32(0))
    else:
        rounded = np.rint(steps)
    q = np.clip(rounded if attrs.get("coded") else rounded + zp, attrs["qmin"], attrs["qmax"])
    return ((q - zp) * np.float32(attrs["out_scale"])).astype(np.float32)


def _lut_attrs(node: Node, tensors: Sequence[Tensor]) -> dict:
    return {"in_scale": float(node.options["in_scale"]), "offset": int(node.options["offset"])}


def quant_lut(x: np.ndarray, table: np.ndarray, attrs: dict) -> np.ndarray:
    """``table[rint(x / in_scale) + offset]``: the input's code (clamped into the table)
    indexes the integer reference's outputs."""
    inv = np.float32(1) / np.float32(attrs["in_scale"])
    k = np.rint(np.asarray(x, np.float32) * inv) + np.float32(attrs["offset"])
    k = np.clip(np.nan_to_num(k, nan=0.0), 0, table.size - 1).astype(np.int64)
    return np.asarray(table, np.float32).reshape(-1)[k]


def row_quantize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """ROW_QUANTIZE: each row of ``x``'s last axis quantized to int8 as XNNPACK's dynamic
    quantization (:func:`litegpu.ops.hybrid.xnn_quantize_rows`): the codes (int8, ``x``'s
    shape) and each row's ``(scale, zero point)`` (float32, ``[..., 2]``)."""
    from .ops.hybrid import xnn_quantize_rows   # (the ops package imports this module's ops late)
    x = np.asarray(x, F32)
    if x.size == 0:
        return np.zeros(x.shape, np.int8), np.zeros((*x.shape[:-1], 2), F32)
    rows, scale, zp = xnn_quantize_rows(x.reshape(-1, x.shape[-1]))
    codes = (rows + zp[:, None]).astype(np.int8).reshape(x.shape)
    return codes, np.stack([scale, zp.astype(F32)], axis=-1).reshape(*x.shape[:-1], 2)


def hybrid_fully_connected(inputs: list, attrs: dict) -> np.ndarray:
    """HYBRID_FULLY_CONNECTED: XNNPACK's hybrid product of rows quantized by ROW_QUANTIZE
    (``codes``, ``params``) with int8 (or int4) weight codes ``[N, K]`` and their scales
    (per output channel, or ``[N, K / block_size]`` per block, bf16-rounded), plus the
    bias, clamped by the fused activation (:func:`litegpu.ops.hybrid.xnn_dequantize_sums`,
    :func:`litegpu.ops.hybrid.xnn_blockwise_dequantize`)."""
    from .ops.hybrid import _clamp, xnn_hybrid_product
    codes, params, w, bias, scales = inputs
    n, k = w.shape
    p = np.asarray(params, F32).reshape(-1, 2)
    scale, zp = p[:, 0], p[:, 1].astype(np.int64)
    rows = np.asarray(codes, np.float64).reshape(-1, k) - zp[:, None]
    y = xnn_hybrid_product(rows, scale, zp, np.asarray(w, np.int64), np.asarray(scales, F32), attrs["block_size"], bias)
    shape = (*np.shape(codes)[:-1], n) if attrs["keep_num_dims"] else (rows.shape[0], n)
    return _clamp(y, attrs["activation"]).reshape(shape)


def _row_quantize_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    shape = tuple(inputs[0].shape)
    return [TensorSpec(shape, np.dtype(np.int8)), TensorSpec((*shape[:-1], 2), F32)]


def _hybrid_fc_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    shape, (n, k) = tuple(inputs[0].shape), tuple(inputs[2].shape)
    rows = int(np.prod(shape, dtype=np.int64)) // k if k else 0
    return [TensorSpec((*shape[:-1], n) if attrs["keep_num_dims"] else (rows, n), F32)]


def _hybrid_fc_attrs(node: Node, tensors: Sequence[Tensor]) -> dict:
    return {"activation": node.options["activation"], "keep_num_dims": bool(node.options["keep_num_dims"]),
            "block_size": int(node.options["block_size"])}


register(OpDef(name="ROW_QUANTIZE", attrs=lambda node, tensors: {}, infer=_row_quantize_infer,
               reference=lambda inputs, attrs: list(row_quantize(inputs[0])),
               doc="A hybrid product's input quantized row by row as XNNPACK does: int8 codes and each "
                   "row's (scale, zero point)."))
register(OpDef(name="HYBRID_FULLY_CONNECTED", attrs=_hybrid_fc_attrs, infer=_hybrid_fc_infer,
               reference=lambda inputs, attrs: [hybrid_fully_connected(inputs, attrs)],
               doc="XNNPACK's hybrid FULLY_CONNECTED of rows ROW_QUANTIZE quantized, with int8 or "
                   "blockwise int4 weight codes: exact integer sums, scaled as XNNPACK scales them."))
register(OpDef(name="QUANT_SIM", attrs=_sim_attrs, infer=_same_shape_f32,
               reference=lambda inputs, attrs: [quant_sim(inputs[0], attrs)],
               doc="Quantization simulation of the float view: round to a tensor's integer grid and back."))
def _grid_add_attrs(node: Node, tensors: Sequence[Tensor]) -> dict:
    return {"a_multiplier": float(node.options["a_multiplier"]), "b_multiplier": float(node.options["b_multiplier"])}


def grid_add(a: np.ndarray, b: np.ndarray, attrs: dict) -> np.ndarray:
    """``a * a_multiplier + b * b_multiplier`` in float32 (broadcast): two grids summed in
    steps of the output's grid."""
    am, bm = np.float32(attrs["a_multiplier"]), np.float32(attrs["b_multiplier"])
    return (np.asarray(a, np.float32) * am + np.asarray(b, np.float32) * bm).astype(np.float32)


def _grid_add_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    return [TensorSpec(tuple(np.broadcast_shapes(tuple(inputs[0].shape), tuple(inputs[1].shape))), F32)]


def grid_mul(a: np.ndarray, b: np.ndarray, attrs: dict) -> np.ndarray:
    """``(a * b) * scale`` in float32 (broadcast): the exact product of two grids, times
    the requantization scale once."""
    return ((np.asarray(a, np.float32) * np.asarray(b, np.float32)) * np.float32(attrs["scale"])).astype(np.float32)


def inv_floor_pow2(x: np.ndarray) -> np.ndarray:
    """``2^-floor(log2 x)`` in float32: one over the largest power of two not above ``x``,
    for ``x`` in [1, 2^32) (1 below 1 and for NaN, 2^-31 from 2^31 up, inf included)."""
    x = np.asarray(x, np.float32)
    _, exponent = np.frexp(np.where(np.isfinite(x), x, np.float32(2.0 ** 31)))
    leading = np.where(x >= 1, np.clip(exponent - 1, 0, 31), 0)
    return np.ldexp(np.float32(1), -leading).astype(np.float32)


def grid_mul_round(a: np.ndarray, b: np.ndarray, attrs: dict | None = None) -> np.ndarray:
    """``floor(a * b + 0.5)`` (broadcast): an integer grid times a fixed-point factor,
    rounded half up as an integer product shifted right with its half added; in float32
    as the kernels' formula computes it (:func:`litegpu.codegen.formulas.grid_mul_round`),
    exact for integers ``|a| < 2^15`` and ``b`` of at most 15 significant bits, a multiple
    of 2^-23: ``a`` split at 2^7, each part's product with ``b`` exact, their integer parts
    and their fractions added apart."""
    a, b = np.asarray(a, F32), np.asarray(b, F32)
    with np.errstate(invalid="ignore", over="ignore"):
        high = np.floor(a * np.float32(2.0 ** -7)) * np.float32(128)
        x, y = high * b, (a - high) * b
        whole_x, whole_y = np.floor(x), np.floor(y)
        return (whole_x + whole_y + np.floor((x - whole_x) + (y - whole_y) + np.float32(0.5))).astype(F32)


def _requant16_attrs(node: Node, tensors: Sequence[Tensor]) -> dict:
    o = node.options
    style = o["style"]
    if style not in ("tflite16", "tflite"):
        raise ModelFormatError(f"GRID_REQUANT16 style {style!r} is not 'tflite16' or 'tflite'")
    bias, multiplier, shift = (np.asarray(o[k], np.int64).reshape(-1) for k in ("bias", "multiplier", "shift"))
    if not bias.size == multiplier.size == shift.size:
        raise ModelFormatError("GRID_REQUANT16 needs as many biases, multipliers and shifts")
    return {"bias": bias, "multiplier": multiplier, "shift": shift, "style": style, "step": float(o["step"]),
            "lo": int(o["lo"]), "hi": int(o["hi"])}


def grid_requant16(high: np.ndarray, low: np.ndarray, attrs: dict) -> np.ndarray:
    """The 16x8 sums' requantization as TFLite's kernels: ``acc = 256 * high + low + bias``
    in int64, where ``high`` and ``low`` are sums in steps of ``step`` (read back as
    integers), per channel over the last axis; then TFLite's fixed-point multiply
    (``tflite16``: the conv kernels' int64 one; ``tflite``: FULLY_CONNECTED's double
    rounding), clamped to ``[lo, hi]``; the codes as float32 (zero point 0)."""
    from .quant import multiply_by_quantized_multiplier, multiply_by_quantized_multiplier_64
    inv = np.float32(1) / np.float32(attrs["step"])
    acc = (np.rint(np.asarray(high, np.float32) * inv).astype(np.int64) * 256
           + np.rint(np.asarray(low, np.float32) * inv).astype(np.int64) + attrs["bias"])
    multiply = multiply_by_quantized_multiplier_64 if attrs["style"] == "tflite16" else multiply_by_quantized_multiplier
    y = multiply(acc, attrs["multiplier"], attrs["shift"])
    return np.clip(y, attrs["lo"], attrs["hi"]).astype(np.float32)


def _requant16_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    shape = tuple(inputs[0].shape)
    if tuple(inputs[1].shape) != shape or not shape or shape[-1] != attrs["bias"].size:
        raise ModelFormatError(f"GRID_REQUANT16 of shapes {list(shape)} and {list(inputs[1].shape)} with "
                               f"{attrs['bias'].size} channels")
    return [TensorSpec(shape, F32)]


register(OpDef(name="GRID_ADD", attrs=_grid_add_attrs, infer=_grid_add_infer,
               reference=lambda inputs, attrs: [grid_add(inputs[0], inputs[1], attrs)],
               doc="ADD/SUB of the float view on two grids: each times its multiplier, summed."))
register(OpDef(name="GRID_MUL", attrs=lambda node, tensors: {"scale": float(node.options["scale"])},
               infer=_grid_add_infer, reference=lambda inputs, attrs: [grid_mul(inputs[0], inputs[1], attrs)],
               doc="MUL of the float view on two grids: the product times the requantization scale."))
register(OpDef(name="GRID_MUL_ROUND", attrs=lambda node, tensors: {}, infer=_grid_add_infer,
               reference=lambda inputs, attrs: [grid_mul_round(inputs[0], inputs[1])],
               doc="A grid times a fixed-point factor, rounded half up (int16 SOFTMAX's last step)."))
register(OpDef(name="INV_FLOOR_POW2", attrs=lambda node, tensors: {}, infer=_same_shape_f32,
               reference=lambda inputs, attrs: [inv_floor_pow2(inputs[0])],
               doc="One over the largest power of two not above x: a sum's leading bit, as a float step."))
register(OpDef(name="GRID_REQUANT16", attrs=_requant16_attrs, infer=_requant16_infer,
               reference=lambda inputs, attrs: [grid_requant16(inputs[0], inputs[1], attrs)],
               doc="16x8 sums of the float view: high and low grid sums, bias, TFLite's fixed-point requantization."))
register(OpDef(name="QUANT_LUT", attrs=_lut_attrs, infer=_same_shape_f32,
               reference=lambda inputs, attrs: [quant_lut(inputs[0], inputs[1], attrs)],
               doc="A quantized one-input op of the float view: its integer reference tabled by input code."))


__all__ = ["EXACT_SUMS", "GRID_BINARY", "LOOKUP_OPS", "MODE", "PASS_THROUGH", "float_view", "grid_add", "grid_mul",
           "grid_mul_round", "grid_requant16", "inv_floor_pow2", "is_quantized_model", "quant_lut", "quant_sim",
           "hybrid_fully_connected", "row_quantize"]
