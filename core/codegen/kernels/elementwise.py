"""Elementwise kernels: unary math, broadcasting binary ops, comparisons, logical ops,
SELECT, ADD_N, CAST, ZEROS_LIKE, and the float view's edges; written with
:mod:`litegpu.codegen.ir`, so every dialect (WGSL included) renders them.

The float formulas are :mod:`litegpu.codegen.formulas`' (the same a follower folded into a
producer's store computes). Float kernels with broadcast operands store four consecutive
elements per work-item when the innermost axis left after merging axes (see
:class:`Broadcast`) is a multiple of 4; an operand broadcast along that axis is loaded
once and splatted. Kernels without index math, and integer and bool kernels, do one
element per work-item (see :func:`_width` for the measurements behind this).

LiteRT's integer quirks, as in ``litegpu.ops.elementwise``: integer DIV truncates,
FLOOR_DIV floors the quotient, FLOOR_MOD takes the divisor's sign, CAST from float to an
integer truncates and saturates with NaN becoming the maximum. Integer values compute in
their own type, which C promotes to ``int`` (and WGSL holds in 32 bits); storing
converts back, wrapping as C does.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from litegpu.ops.registry import ACTIVATION_RANGES

from .. import formulas, ir
from ..ir import Expr, call, logical_and, logical_or, select
from ..nodegen import KernelSpec, NodeGen, strides_of
from . import Decline, generator

_F32 = np.dtype(np.float32)
_BOOL = np.dtype(np.bool_)
_INTS = {np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.int32, np.int64)}

# Integer and bool forms of one or two operands.
_INT_UNARY: dict[str, Callable[[Expr], Expr]] = {
    "ABS": lambda a: select(a < 0, -a, a),
    "NEG": lambda a: -a,
    "SIGN": lambda a: select(a > 0, ir.lit(1, a.type), select(a < 0, ir.lit(-1, a.type), ir.lit(0, a.type))),
    "LOGICAL_NOT": lambda a: a.eq(0),
}


def _floor_div(a: Expr, b: Expr) -> Expr:
    # truncation and floor differ by one where there is a remainder and the signs differ
    return a / b - select(logical_and((a % b).ne(0), (a < 0).ne(b < 0)), ir.lit(1, a.type), ir.lit(0, a.type))


def _floor_mod(a: Expr, b: Expr) -> Expr:
    r = a % b
    return select(logical_and(r.ne(0), (r < 0).ne(b < 0)), r + b, r)


_INT_BINARY: dict[str, Callable[[Expr, Expr], Expr]] = {
    "ADD": lambda a, b: a + b,
    "SUB": lambda a, b: a - b,
    "MUL": lambda a, b: a * b,
    "DIV": lambda a, b: a / b,                  # truncates, as LiteRT's
    "MAXIMUM": lambda a, b: select(a > b, a, b),
    "MINIMUM": lambda a, b: select(a < b, a, b),
    "SQUARED_DIFFERENCE": lambda a, b: (a - b) * (a - b),
    "FLOOR_DIV": _floor_div,
    "FLOOR_MOD": _floor_mod,
}
_COMPARE: dict[str, Callable[[Expr, Expr], Expr]] = {
    "EQUAL": lambda a, b: a.eq(b), "NOT_EQUAL": lambda a, b: a.ne(b), "LESS": lambda a, b: a < b,
    "LESS_EQUAL": lambda a, b: a <= b, "GREATER": lambda a, b: a > b, "GREATER_EQUAL": lambda a, b: a >= b,
    "LOGICAL_AND": lambda a, b: logical_and(a.ne(0), b.ne(0)),
    "LOGICAL_OR": lambda a, b: logical_or(a.ne(0), b.ne(0)),
}


def _int_activation(activation: str, r: Expr) -> Expr:
    """LiteRT's fused activation on an integer output: a clamp in the output type."""
    lo, hi = ACTIVATION_RANGES[activation]
    if lo == -np.inf:
        return r
    return call("max", r, int(lo)) if hi == np.inf else call("clamp", r, int(lo), int(hi))


class Broadcast:
    """How each operand of an elementwise op is indexed from the output's flat index.

    Output axes of size 1 are dropped and neighbouring axes along which every operand
    varies (or is broadcast) alike are merged, so ``(1, 4, 4, 8) + (8,)`` indexes as
    ``(16, 8) + (1, 8)``: fewer divisions per element. ``dims`` are the merged output
    axes; ``strides[k]`` are operand ``k``'s element strides along them (0: broadcast).
    """

    def __init__(self, out_shape: Sequence[int], in_shapes: Sequence[Sequence[int]]) -> None:
        out = tuple(int(d) for d in out_shape)
        full = [(1,) * (len(out) - len(s)) + tuple(int(d) for d in s) for s in in_shapes]
        self.dims: list[int] = []
        pattern: list[tuple[bool, ...]] = []
        for ax, d in enumerate(out):
            if d == 1:
                continue
            varies = tuple(f[ax] != 1 for f in full)
            if pattern and pattern[-1] == varies:
                self.dims[-1] *= d
            else:
                self.dims.append(d)
                pattern.append(varies)
        self.out_strides = strides_of(tuple(self.dims))
        self.strides: list[list[int]] = []
        for k in range(len(full)):
            own = strides_of(tuple(d if p[k] else 1 for d, p in zip(self.dims, pattern)))
            self.strides.append([s if p[k] else 0 for s, p in zip(own, pattern)])

    @property
    def size(self) -> int:
        """Number of output elements."""
        return int(np.prod(self.dims, dtype=np.int64))

    def last_varies(self, k: int) -> bool:
        """True when operand ``k`` changes along the innermost merged axis."""
        return bool(self.dims) and self.strides[k][-1] != 0

    def _is_flat(self, k: int) -> bool:
        return self.strides[k] == self.out_strides

    def coords(self, b: ir.KernelBuilder, flat: Expr) -> dict[int, Expr]:
        """The coordinates (by merged axis) that the operand indices need, declared in ``b``."""
        needed = sorted({j for k, st in enumerate(self.strides) if not self._is_flat(k)
                         for j, s in enumerate(st) if s})
        out = {}
        for j in needed:
            expr = flat if self.out_strides[j] == 1 else flat / self.out_strides[j]
            if j:   # the outermost coordinate needs no wrap-around
                expr = expr % self.dims[j]
            out[j] = b.let(f"c{j}", expr)
        return out

    def index(self, k: int, flat: Expr, coords: dict[int, Expr]) -> Expr:
        """Element index into operand ``k``."""
        if self._is_flat(k):
            return flat
        terms = [ir.times(coords[j], s) for j, s in enumerate(self.strides[k]) if s]
        return ir.total(terms) if terms else ir.lit(0, ir.INT)


def _size(shape: Sequence[int]) -> int:
    return int(np.prod(tuple(shape), dtype=np.int64))


def _width(g: NodeGen, bc: Broadcast) -> int:
    """4 when the kernel should store four floats per work-item, else 1.

    Four pay where operands need broadcast indexing: the index math is done once per four
    outputs and an operand broadcast along the innermost axis is loaded once (measured on
    PoCL: ADD [1,56,56,24]+[1,56,56,1] 2.5x, MUL by a channel vector 1.4x faster). Where
    every operand is the output's shape or a scalar there is no index math, and PoCL
    vectorizes one-element work-items across the work-group better than it runs float4
    work-items (HARD_SWISH 1.8x, TANH and GELU 1.5x, ADD 1.2x faster scalar), so those stay
    scalar.

    Four need the innermost merged axis to be a multiple of 4 (four consecutive outputs
    share every other coordinate) and, when a folded follower reads a vector over the
    output's channels, the channel count too (its four-lane load must not wrap).
    """
    if len(bc.dims) < 2 or bc.dims[-1] % 4:
        return 1
    channels = int(g.ctx.outputs[0].shape[-1])
    if channels % 4 and any(f.kind == "channel" for f in g.followers):
        return 1
    return 4


def _operand(g: NodeGen, b: ir.KernelBuilder, pos: int, bc: Broadcast, k: int, width: int, flat: Expr,
             coords: dict[int, Expr]) -> Expr:
    """Input ``pos`` (operand ``k`` of ``bc``) at the work-item's element(s); a constant
    float scalar is a literal."""
    spec = g.ctx.inputs[pos]
    if np.dtype(spec.dtype) == _F32 and spec.value is not None and np.asarray(spec.value).size == 1:
        return ir.lit(float(np.asarray(spec.value).reshape(-1)[0]), ir.REAL.with_lanes(width))
    buf, idx = g.input(b, pos), bc.index(k, flat, coords)
    if width == 4:
        return buf.load(idx, 4) if bc.last_varies(k) else ir.vector(ir.REAL4, buf.load(idx))
    return buf.load(idx)


#: A kernel's value from its loaded operands (declared as ``a0, a1, ...``); it may add
#: statements to the builder first.
Compute = Callable[[ir.KernelBuilder, list[Expr]], Expr]


def pointwise(g: NodeGen, positions: Sequence[int], compute: Compute, *, width: int = 1,
              shapes: Sequence[Sequence[int]] | None = None, activation: str = "NONE") -> KernelSpec:
    """The kernel of an elementwise node: operands ``positions`` loaded, ``compute`` of
    them gives the value, which is stored.

    One work-item per ``width`` consecutive outputs; ``shapes`` overrides the operands'
    shapes for indexing (SELECT's rank-1 condition). A float output goes through the
    epilogue (fused activation and followers); an integer or bool output is converted
    to its type, ``activation`` clamping it.
    """
    out_spec = g.ctx.outputs[0]
    bc = Broadcast(out_spec.shape, shapes or [g.ctx.inputs[p].shape for p in positions])
    b = g.new_kernel()
    # The global size is exactly the work (a whole-group API's renderer adds the guard).
    flat = b.let("i", b.global_id(0) * 4 if width == 4 else b.global_id(0))
    coords = bc.coords(b, flat)
    values = [b.let(f"a{k}", _operand(g, b, pos, bc, k, width, flat, coords)) for k, pos in enumerate(positions)]
    value = compute(b, values)
    if np.dtype(out_spec.dtype) == _F32:
        g.store_output(b, flat, value)
    else:
        out = g.output(b)
        r = b.let("r", value.cast(out.element()))
        b.store(out, flat, _int_activation(activation, r))
    return g.kernel(b, (_size(out_spec.shape) // width,))


def _dtype(g: NodeGen, pos: int) -> np.dtype:
    return np.dtype(g.ctx.inputs[pos].dtype)


def _check_int(g: NodeGen, *dtypes: np.dtype) -> None:
    """Decline tensor types the kernels have no plain scalar for."""
    for dt in dtypes:
        if dt != _F32 and dt != _BOOL and dt not in _INTS:
            raise Decline(f"{g.ctx.node.op} on {dt} tensors")


def _float_width(g: NodeGen, positions: Sequence[int]) -> int:
    return _width(g, Broadcast(g.ctx.outputs[0].shape, [g.ctx.inputs[p].shape for p in positions]))


# -- generators --------------------------------------------------------------------------

@generator(*formulas.UNARY, "LOGICAL_NOT", epilogue=True)
def unary(g: NodeGen) -> list[KernelSpec]:
    """``out = f(in)``: floats through :data:`formulas.UNARY` (four per work-item when the
    size allows), integers and bools through their own forms."""
    op, dtype = g.ctx.node.op, _dtype(g, 0)
    if dtype == _F32:
        if op not in formulas.UNARY:
            raise Decline(f"{op} on float tensors")
        return [pointwise(g, [0], lambda b, v: formulas.UNARY[op](v[0], g.attrs), width=_float_width(g, [0]))]
    _check_int(g, dtype)
    if op not in _INT_UNARY:
        raise Decline(f"{op} on {dtype} tensors")
    return [pointwise(g, [0], lambda b, v: _INT_UNARY[op](v[0]))]


def _int_pow(b: ir.KernelBuilder, v: list[Expr], bits: int) -> Expr:
    """Integer POW by squaring, one exponent bit per step (LiteRT rejects negative
    exponents, which give 1 here)."""
    a, exponent = v
    p = b.var("p", 1, a.type)
    base = b.var("base", a)
    e = b.var("e", exponent)
    with b.for_("bit", 0, bits):
        with b.if_(logical_and(e > 0, (e & 1).ne(0))):
            b.assign(p, base, "*")
        b.assign(base, base, "*")
        b.assign(e, e >> 1)
    return p


@generator(*formulas.BINARY, epilogue=True)
def binary(g: NodeGen) -> list[KernelSpec]:
    """Broadcasting binary arithmetic: floats through :data:`formulas.BINARY` (four per
    work-item when the innermost merged axis allows), integers through their own forms with
    the fused activation as a clamp."""
    op, dtype = g.ctx.node.op, _dtype(g, 0)
    if dtype == _F32:
        return [pointwise(g, [0, 1], lambda b, v: formulas.BINARY[op](v[0], v[1], g.attrs),
                          width=_float_width(g, [0, 1]))]
    _check_int(g, dtype)
    if op == "POW":
        return [pointwise(g, [0, 1], lambda b, v: _int_pow(b, v, 8 * dtype.itemsize))]
    if op not in _INT_BINARY:
        raise Decline(f"{op} on {dtype} tensors")
    _check_int_divisor(g, op)
    return [pointwise(g, [0, 1], lambda b, v: _INT_BINARY[op](*v), activation=g.attrs.get("activation", "NONE"))]


def _check_int_divisor(g: NodeGen, op: str) -> None:
    """Integer division by zero is LiteRT's run-time error (and undefined in C): a divisor
    that is not a constant free of zeros is declined, so cpu checks it."""
    if op not in ("DIV", "FLOOR_DIV", "FLOOR_MOD"):
        return
    divisor = g.ctx.inputs[1].value
    if divisor is None:
        raise Decline(f"integer {op} by a run-time divisor (cpu raises LiteRT's error on a zero)")
    if np.any(np.asarray(divisor) == 0):
        raise Decline(f"integer {op} by a constant holding zero")


@generator(*_COMPARE)
def compare(g: NodeGen) -> list[KernelSpec]:
    """Comparisons and LOGICAL_AND/OR: bool (0/1 byte) outputs of broadcast operands."""
    _check_int(g, _dtype(g, 0))
    test = _COMPARE[g.ctx.node.op]
    return [pointwise(g, [0, 1], lambda b, v: test(v[0], v[1]))]


@generator("SELECT", "SELECT_V2", epilogue=True)
def select_op(g: NodeGen) -> list[KernelSpec]:
    """``cond ? x : y`` with the condition, x and y broadcast (SELECT's rank-1 condition
    picks whole slices along axis 0)."""
    _check_int(g, _dtype(g, 1))
    shapes = [tuple(s.shape) for s in g.ctx.inputs[:3]]
    out_rank = len(g.ctx.outputs[0].shape)
    if g.ctx.node.op == "SELECT" and len(shapes[0]) == 1 and out_rank > 1:
        shapes[0] = shapes[0] + (1,) * (out_rank - 1)
    return [pointwise(g, [0, 1, 2], lambda b, v: select(v[0].ne(0), v[1], v[2]), shapes=shapes)]


@generator("ADD_N", epilogue=True)
def add_n(g: NodeGen) -> list[KernelSpec]:
    """The sum of equal-shaped inputs, added in input order."""
    positions = list(range(len(g.ctx.inputs)))
    dtype = _dtype(g, 0)
    _check_int(g, dtype)

    def total(b: ir.KernelBuilder, v: list[Expr]) -> Expr:
        expr = v[0]
        for value in v[1:]:
            expr = expr + value
        return expr
    width = _float_width(g, positions) if dtype == _F32 else 1
    return [pointwise(g, positions, total, width=width)]


@generator("CAST", epilogue=True)
def cast(g: NodeGen) -> list[KernelSpec]:
    """CAST as LiteRT converts: float to integer truncates and saturates (NaN to the
    maximum), to bool is ``!= 0``, integer to integer wraps."""
    src, dst = _dtype(g, 0), np.dtype(g.ctx.outputs[0].dtype)
    _check_int(g, src, dst)
    if dst == _BOOL:
        return [pointwise(g, [0], lambda b, v: v[0].ne(0))]
    if dst == _F32:
        width = _float_width(g, [0]) if src == _F32 else 1
        return [pointwise(g, [0], lambda b, v: v[0] if src == _F32 else v[0].cast(ir.REAL), width=width)]
    t = ir.Type(ir.scalar_of(dst))
    if src == _F32:
        top = ir.lit(int(np.iinfo(dst).max), t)
        return [pointwise(g, [0], lambda b, v: select(call("isnan", v[0]), top, v[0].cast(t, saturate=True)))]
    return [pointwise(g, [0], lambda b, v: v[0].cast(t))]


@generator("ZEROS_LIKE", epilogue=True)
def zeros_like(g: NodeGen) -> list[KernelSpec]:
    """Zeros of the input's shape and type (the input is not read)."""
    dtype = np.dtype(g.ctx.outputs[0].dtype)
    _check_int(g, dtype)
    if dtype != _F32:
        return [pointwise(g, [], lambda b, v: ir.lit(0, ir.Type(ir.scalar_of(dtype))))]
    width = _width(g, Broadcast(g.ctx.outputs[0].shape, []))
    return [pointwise(g, [], lambda b, v: ir.lit(0.0, ir.REAL.with_lanes(width)), width=width)]


# -- the float view of quantized models (litegpu.float_view) -----------------------------


@generator("QUANT_LUT", epilogue=True)
def quant_lut(g: NodeGen) -> list[KernelSpec]:
    """A quantized one-input op of the float view: the input's code (rounded in float,
    NaN and strays clamped into the table) indexes its table of outputs, kept float32."""
    table = g.ctx.inputs[1].value
    if table is None:
        raise Decline("QUANT_LUT with a table computed at run time")
    inv = float(np.float32(1) / np.float32(g.attrs["in_scale"]))
    last = float(np.asarray(table).size - 1)

    def compute(b: ir.KernelBuilder, v: list[Expr]) -> Expr:
        buf = g.const(b, np.asarray(table, np.float32).reshape(-1), storage=False)
        code = call("rint", v[0].cast(ir.FLOAT) * inv) + float(g.attrs["offset"])
        return buf.load(call("fmin", call("fmax", code, 0.0), last).cast(ir.INT))
    return [pointwise(g, [0], compute)]


@generator("GRID_REQUANT16", epilogue=True)
def grid_requant16(g: NodeGen) -> list[KernelSpec]:
    """The 16x8 sums of the float view (litegpu.float_view.grid_requant16): the high and
    low sums read back as integers (in float32, then ``long``), ``256 * high + low +
    bias`` in 64 bits, TFLite's fixed-point requantization per channel (the last axis),
    clamped; the code as a float."""
    a = g.attrs
    shape = tuple(g.ctx.outputs[0].shape)
    channels = int(shape[-1]) if shape else 1
    if tuple(g.ctx.inputs[0].shape) != shape or tuple(g.ctx.inputs[1].shape) != shape or a["bias"].size != channels:
        raise Decline("GRID_REQUANT16 operands must have the output's shape")
    inv = float(np.float32(1) / np.float32(a["step"]))
    if a["style"] == "tflite16":
        m = a["multiplier"]
        reduced = np.where(m < 0x7FFF0000, (m + (1 << 15)) >> 16, 0x7FFF).astype(np.int64)
        total = (15 - a["shift"]).astype(np.int32)
        if np.any(total < 1) or np.any(total > 62):
            raise Decline("GRID_REQUANT16 shift out of range")

    def code(x: Expr) -> Expr:
        """A float sum's integer value (round to nearest even, as convert_long_rte)."""
        return call("rint", x.cast(ir.FLOAT) * inv).cast(ir.LONG)

    def compute(b: ir.KernelBuilder, v: list[Expr]) -> Expr:
        ch = b.let("ch", b.global_id(0) % channels)
        bias = g.const(b, a["bias"].astype(np.int64))
        acc = b.let("acc", code(v[0]) * 256 + code(v[1]) + bias.load(ch))
        one = ir.lit(1, ir.LONG)
        if a["style"] == "tflite16":
            # TFLite's int64 MultiplyByQuantizedMultiplier: the multiplier cut to 16 bits,
            # one rounding (half up) by 2^(15 - shift).
            tm, ts = g.const(b, reduced), g.const(b, total)
            shift = b.let("sh", ts.load(ch).cast(ir.LONG))
            q = b.let("q", (acc * tm.load(ch) + (one << (shift - 1))) >> shift)
        else:
            # MultiplyByQuantizedMultiplier (int32): left shift, SaturatingRoundingDoublingHighMul
            # (ties away from zero), RoundingDivideByPOT.
            left = np.maximum(a["shift"], 0).astype(np.int32)
            right = np.maximum(-a["shift"], 0).astype(np.int32)
            tm, tl, tr = g.const(b, a["multiplier"].astype(np.int64)), g.const(b, left), g.const(b, right)
            ab = b.let("ab", (acc << tl.load(ch).cast(ir.LONG)) * tm.load(ch))
            nudged = b.let("nudged", ab + select(ab >= 0, one << 30, one - (one << 30)))
            high = b.let("high", select(nudged >= 0, nudged >> 31, -((-nudged) >> 31)))
            e = b.let("e", tr.load(ch).cast(ir.LONG))
            mask = b.let("mask", (one << e) - 1)
            zero = ir.lit(0, ir.LONG)
            q = b.let("q", (high >> e) + select((high & mask) > ((mask >> 1) + select(high < 0, one, zero)), one, zero))
        return call("clamp", q, int(a["lo"]), int(a["hi"])).cast(ir.REAL)
    return [pointwise(g, [0, 1], compute)]


@generator("QUANTIZE", "DEQUANTIZE", epilogue=True)
def convert_quantized(g: NodeGen) -> list[KernelSpec]:
    """The float view's edges: DEQUANTIZE of integers ``(q - zp) * scale`` (of floats: a
    copy), QUANTIZE of floats ``clamp(rint(x / scale) + zp)`` in float32; per-tensor
    params only (integer-to-integer requantization stays on cpu)."""
    src = _dtype(g, 0)
    params = g.attrs.get("in" if g.ctx.node.op == "DEQUANTIZE" else "out")
    if g.ctx.node.op == "DEQUANTIZE" and src == _F32:
        return [pointwise(g, [0], lambda b, v: v[0], width=_float_width(g, [0]))]
    if params is None or not params.per_tensor:
        raise Decline(f"{g.ctx.node.op} without per-tensor quantization")
    scale, zp = float(params.scale), float(params.zero_point)
    if g.ctx.node.op == "DEQUANTIZE":
        _check_int(g, src)
        return [pointwise(g, [0], lambda b, v: ((v[0].cast(ir.FLOAT) - zp) * scale).cast(ir.REAL))]
    if src != _F32:
        raise Decline("integer-to-integer QUANTIZE")
    inv = float(np.float32(1) / np.float32(params.scale))
    lo, hi = float(params.qmin), float(params.qmax)
    return [pointwise(g, [0], lambda b, v: call("clamp", call("rint", v[0].cast(ir.FLOAT) * inv) + zp, lo, hi))]
