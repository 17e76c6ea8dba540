"""Elementwise kernels: unary math, broadcasting binary ops, comparisons, logical ops,
SELECT, ADD_N, CAST, ZEROS_LIKE; and the chain expressions.

The C expressions of ``CHAIN_UNARY`` / ``CHAIN_BINARY`` serve twice: as the body of a
standalone elementwise kernel, and as a follower folded into a producer's store. Each
is valid for ``real`` and ``real4`` operands alike (literals cast to ``(real)``,
builtins that take vectors, the vector-capable ``?:`` instead of ``if``).

Float kernels with broadcast operands store four consecutive elements per work-item
(``LD4``/``ST4``) when the innermost axis left after merging axes (see
:class:`Broadcast`) is a multiple of 4; an operand broadcast along that axis is loaded
once and splatted. Kernels without index math, and integer and bool kernels, do one
element per work-item (see :func:`_width` for the measurements behind this).
TANH and exact GELU use rational approximations that vectorize (see ``_tanh``/``_erf``).

LiteRT's quirks, as in ``litegpu.ops.elementwise``: MAXIMUM is ``a > b ? a : b`` and
MINIMUM ``a < b ? a : b`` (the second operand wins on NaN; the ``swapped`` attr says
which is first), integer DIV truncates,
FLOOR_DIV floors the rounded quotient, FLOOR_MOD takes the divisor's sign, ROUND is
half to even, CAST from float to an integer truncates and saturates with NaN becoming
the maximum.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from litegpu.ops.elementwise import GELU_TANH_CUBIC, SQRT_2_OVER_PI
from litegpu.ops.registry import CLAMP_ACTIVATIONS

from ..nodegen import CHAIN_BINARY, CHAIN_UNARY, KernelSpec, NodeGen, c_float, c_type, clamp_c, strides_of
from . import Decline, generator

_F32 = np.dtype(np.float32)
_BOOL = np.dtype(np.bool_)
_INTS = {np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.int32, np.int64)}


def _r(x: float) -> str:
    """A float32 literal cast to ``real`` (so it also works in half arithmetic)."""
    return f"((real){c_float(x)})"


# erf(z) ~= z * P(z^2) / Q(z^2) with z clamped to [-4, 4] (erf(4) is 1 within 1.6e-8): the
# rational fit the cpu backend uses (absolute error below 1.4e-8 in float64; a few float32
# ulp evaluated in float). Unlike the erf builtin, which PoCL runs per element, it vectorizes:
# exact GELU over [1, 128, 768] takes ~37 us instead of ~650 (float4 erf) or ~3000 (scalar erf).
_ERF_P = (1.1283791821076148, 0.18471032540518584, 0.05433253130274705, 0.0038395200405576656,
          0.00038268951545462036, 4.7804669528849866e-06, -1.3666401960424811e-08)
_ERF_Q = (1.0, 0.4970288092831258, 0.11382624375341038, 0.015453488301396088, 0.0013095735391557932,
          6.400858486599183e-05)


def _horner(coefs: Sequence[float], t: str) -> str:
    """``coefs[0] + t * (coefs[1] + t * (...))`` as C."""
    expr = _r(coefs[-1])
    for c in reversed(coefs[:-1]):
        expr = f"({_r(c)} + {t} * {expr})"
    return expr


def _saturating(z: str, bound: float, fit: str, g: NodeGen) -> str:
    """``fit`` (an odd function's rational fit, of ``z``) where ``|z| < bound``, else
    exactly -1 or 1 (``z`` clamped). Exact saturation is what LiteRT's GELU has: past its
    cut-off ``1 + erf`` (or ``1 + tanh``) is 0, so a large negative x gives -0 and -inf
    gives NaN (``-inf * 0``) where a fit's ``1 - 6e-8`` gave ``x * 3e-8`` (and -inf). NaN
    takes the fit, which keeps it. Against the old clamp of ``z`` (and TANH's NaN test)
    this adds a fabs, compare and select to erf and a fabs to tanh: on PoCL, TANH and GELU
    over 400k elements took the same time as before within the noise (2%)."""
    return g.choose(f"(fabs({z}) >= (real){bound})", f"clamp({z}, (real)-1, (real)1)", fit)


def _erf(z: str, g: NodeGen) -> str:
    """erf of the C expression ``z`` by the rational approximation above."""
    t = f"({z} * {z})"
    return _saturating(z, 4, f"({z} * {_horner(_ERF_P, t)} / {_horner(_ERF_Q, t)})", g)


# tanh(z) ~= z * P(z^2) / Q(z^2) with z clamped to [-9, 9] (tanh(9) is 1 within 3e-8): fitted
# for this module (least squares on the relative error, reweighted towards minimax, against
# numpy's tanh); evaluated in float32 the error is below 4.2e-7 absolute and relative. Q has
# positive coefficients, so no poles. Like the erf fit it vectorizes where the tanh builtin
# runs per element on PoCL: TANH over [1, 112, 112, 32] ~100 us instead of ~450-850, and
# approximate GELU over [1, 128, 768] ~40 us instead of ~140.
_TANH_P = (0.9999999883967433, 0.1294940942054203, 0.002952604031026913, 9.54172979243835e-06,
           -1.3526827803700403e-08, 1.9944962348361628e-11)
_TANH_Q = (1.0, 0.4628272889421511, 0.023895277916024946, 0.00023239962829071925)


def _tanh(z: str, g: NodeGen) -> str:
    """tanh of the C expression ``z`` by the rational approximation above (NaN stays NaN)."""
    t = f"({z} * {z})"
    return _saturating(z, 9, f"({z} * {_horner(_TANH_P, t)} / {_horner(_TANH_Q, t)})", g)


def _gelu(x: str, attrs: dict, g: NodeGen) -> str:
    """GELU: the tanh form with ``approximate``, else ``x * Phi(x)`` through erf."""
    if attrs.get("approximate", False):
        inner = f"{_r(SQRT_2_OVER_PI)} * ({x} + {_r(GELU_TANH_CUBIC)} * {x} * {x} * {x})"
        return f"({_r(0.5)} * {x} * ((real)1 + {_tanh(inner, g)}))"
    return f"({_r(0.5)} * {x} * ((real)1 + {_erf(f'({x} * {_r(0.7071067811865476)})', g)}))"


def _hard_swish(x: str) -> str:
    """HARD_SWISH as XNNPACK computes it, ``x * clamp(x / 6 + 1/2, 0, 1)`` (the multiply-add
    fused where the device contracts it, as XNNPACK's is): 3e38 stays finite, where
    ``x * relu6(x + 3) / 6`` overflows to inf."""
    return f"({x} * clamp({x} * {_r(1 / 6)} + {_r(0.5)}, (real)0, (real)1))"


def _floor_mod(x: str, y: str, attrs: dict, g: NodeGen) -> str:
    """FLOOR_MOD on floats: fmod moved to the divisor's sign when they differ."""
    r = f"fmod({x}, {y})"
    return g.choose(f"(({r} != (real)0) && (({r} < (real)0) != ({y} < (real)0)))", f"{r} + {y}", r)


def _quant_sim(x: str, a: dict, g: NodeGen) -> str:
    """QUANT_SIM (the float view of quantized models, litegpu.float_view): onto the
    tensor's integer grid (``x`` times the reciprocal input step, rounded to nearest
    even, half up, or half away from zero as C's ``round``, plus the zero point,
    clamped) and back in output steps (none: grid form)."""
    inv = float(np.float32(1) / np.float32(a["in_scale"]))
    zp = _r(a["zero_point"])
    steps = x if inv == 1.0 else f"{x} * {_r(inv)}"
    rounding = a.get("rounding", "even")
    rounded = (f"floor({steps} + {_r(0.5)})" if rounding == "half_up"
               else f"round({steps})" if rounding == "half_away" else f"rint({steps})")
    code = f"clamp({rounded}{'' if a.get('coded') else f' + {zp}'}, {_r(a['qmin'])}, {_r(a['qmax'])})"
    return f"({code} - {zp})" if a["out_scale"] == 1.0 else f"(({code} - {zp}) * {_r(a['out_scale'])})"


def _first_unless(op: str, x: str, y: str, a: dict, g: NodeGen) -> str:
    """MAXIMUM (``op`` ``>``) / MINIMUM (``<``) as LiteRT: the first operand where it wins
    the comparison, else the second (NaN too); ``y`` is first when the ``swapped`` attr
    says so (:func:`litegpu.ops.elementwise.max_min_swapped`)."""
    first, second = (y, x) if a.get("swapped") else (x, y)
    return g.choose(f"({first} {op} {second})", first, second)


CHAIN_UNARY.update({
    "ABS": lambda x, a, g: f"fabs({x})",
    "NEG": lambda x, a, g: f"(-{x})",
    "EXP": lambda x, a, g: f"exp({x})",
    "LOG": lambda x, a, g: f"log({x})",
    "SQRT": lambda x, a, g: f"sqrt({x})",
    "RSQRT": lambda x, a, g: f"rsqrt({x})",
    "SQUARE": lambda x, a, g: f"({x} * {x})",
    "SIN": lambda x, a, g: f"sin({x})",
    "COS": lambda x, a, g: f"cos({x})",
    "TANH": lambda x, a, g: _tanh(x, g),
    "LOGISTIC": lambda x, a, g: f"((real)1 / ((real)1 + exp(-{x})))",
    "HARD_SWISH": lambda x, a, g: _hard_swish(x),
    "GELU": _gelu,
    "LEAKY_RELU": lambda x, a, g: g.choose(f"({x} > (real)0)", x, f"{x} * {_r(a['alpha'])}"),
    "ELU": lambda x, a, g: g.choose(f"({x} < (real)0)", f"expm1({x})", x),
    "FLOOR": lambda x, a, g: f"floor({x})",
    "CEIL": lambda x, a, g: f"ceil({x})",
    "ROUND": lambda x, a, g: f"rint({x})",     # rint rounds half to even (the default rounding mode)
    "SIGN": lambda x, a, g: f"sign({x})",
    "QUANT_SIM": _quant_sim,
})
for _op in ("RELU", "RELU6", "RELU_N1_TO_1", "RELU_0_TO_1"):   # the same clamps as the fused activations
    CHAIN_UNARY[_op] = lambda x, a, g, op=_op: clamp_c(op, x, g=g)
CHAIN_BINARY.update({
    "ADD": lambda x, y, a, g: f"({x} + {y})",
    "GRID_ADD": lambda x, y, a, g: f"({x} * {_r(a['a_multiplier'])} + {y} * {_r(a['b_multiplier'])})",
    "GRID_MUL": lambda x, y, a, g: f"(({x} * {y}) * {_r(a['scale'])})",
    "SUB": lambda x, y, a, g: f"({x} - {y})",
    "MUL": lambda x, y, a, g: f"({x} * {y})",
    "DIV": lambda x, y, a, g: f"({x} / {y})",
    "MAXIMUM": lambda x, y, a, g: _first_unless(">", x, y, a, g),
    "MINIMUM": lambda x, y, a, g: _first_unless("<", x, y, a, g),
    "POW": lambda x, y, a, g: f"pow({x}, {y})",
    "SQUARED_DIFFERENCE": lambda x, y, a, g: f"(({x} - {y}) * ({x} - {y}))",
    "FLOOR_DIV": lambda x, y, a, g: f"floor({x} / {y})",
    "FLOOR_MOD": _floor_mod,
    "PRELU": lambda x, y, a, g: g.choose(f"({x} >= (real)0)", x, f"{x} * {y}"),   # y is alpha
})

# Integer and bool forms, of scalar operands a0, a1 (already loaded into variables).
_INT_UNARY: dict[str, Callable[[str], str]] = {
    "ABS": lambda a: f"({a} < 0 ? -{a} : {a})",
    "NEG": lambda a: f"(-{a})",
    "SIGN": lambda a: f"(({a} > 0) - ({a} < 0))",
    "LOGICAL_NOT": lambda a: f"(!{a})",
}
_INT_BINARY: dict[str, Callable[[str, str], str]] = {
    "ADD": lambda a, b: f"({a} + {b})",
    "SUB": lambda a, b: f"({a} - {b})",
    "MUL": lambda a, b: f"({a} * {b})",
    "DIV": lambda a, b: f"({a} / {b})",                  # C division truncates, as LiteRT's
    "MAXIMUM": lambda a, b: f"({a} > {b} ? {a} : {b})",
    "MINIMUM": lambda a, b: f"({a} < {b} ? {a} : {b})",
    "SQUARED_DIFFERENCE": lambda a, b: f"(({a} - {b}) * ({a} - {b}))",
    # truncation and floor differ by one where there is a remainder and the signs differ
    "FLOOR_DIV": lambda a, b: f"({a} / {b} - ({a} % {b} != 0 && ({a} < 0) != ({b} < 0)))",
    "FLOOR_MOD": lambda a, b: f"({a} % {b} != 0 && ({a} % {b} < 0) != ({b} < 0) ? {a} % {b} + {b} : {a} % {b})",
}
_COMPARE = {"EQUAL": "==", "NOT_EQUAL": "!=", "LESS": "<", "LESS_EQUAL": "<=", "GREATER": ">",
            "GREATER_EQUAL": ">=", "LOGICAL_AND": "&&", "LOGICAL_OR": "||"}
# LiteRT's fused activations on integer outputs: clamps in the output type.
_INT_ACTIVATION: dict[str, Callable[[str, str], str]] = {
    name: (lambda v, t, name=name: clamp_c(name, v, t, lower="max")) for name in CLAMP_ACTIVATIONS}
_INT_MAX = {"int": "INT_MAX", "long": "LONG_MAX", "uchar": "UCHAR_MAX", "char": "CHAR_MAX", "short": "SHRT_MAX"}


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

    def coord_lines(self, flat: str) -> list[str]:
        """Statements defining ``c<axis>``, the coordinates the operand indices need."""
        needed = sorted({j for k, st in enumerate(self.strides) if not self._is_flat(k)
                         for j, s in enumerate(st) if s})
        lines = []
        for j in needed:
            expr = flat if self.out_strides[j] == 1 else f"{flat} / {self.out_strides[j]}"
            if j:   # the outermost coordinate needs no wrap-around
                expr = f"({expr}) % {self.dims[j]}"
            lines.append(f"  const int c{j} = {expr};")
        return lines

    def index(self, k: int, flat: str) -> str:
        """Element index into operand ``k`` (after :meth:`coord_lines`)."""
        if self._is_flat(k):
            return flat
        terms = [f"c{j}" if s == 1 else f"c{j} * {s}" for j, s in enumerate(self.strides[k]) if s]
        return " + ".join(terms) or "0"


def _size(shape: Sequence[int]) -> int:
    return int(np.prod(tuple(shape), dtype=np.int64))


def _width(g: NodeGen, bc: Broadcast) -> int:
    """4 when the kernel should store float4s, else 1.

    float4 pays where operands need broadcast indexing: the index math is done once
    per four outputs and an operand broadcast along the innermost axis is loaded once
    (measured on PoCL: ADD [1,56,56,24]+[1,56,56,1] 2.5x, MUL by a channel vector 1.4x
    faster). Where every operand is the output's shape or a scalar there is no index
    math, and PoCL vectorizes one-element work-items across the work-group better than
    it runs float4 work-items (HARD_SWISH 1.8x, TANH and GELU 1.5x, ADD 1.2x faster
    scalar), so those stay scalar.

    float4 needs the innermost merged axis to be a multiple of 4 (four consecutive
    outputs share every other coordinate) and, when a folded follower reads a vector
    over the output's channels, the channel count too (its ``LD4`` must not wrap).
    """
    if len(bc.dims) < 2 or bc.dims[-1] % 4:
        return 1
    channels = int(g.ctx.outputs[0].shape[-1])
    if channels % 4 and any(f.kind == "channel" for f in g.followers):
        return 1
    return 4


def _operand(g: NodeGen, pos: int, bc: Broadcast, k: int, width: int) -> str:
    """Expression loading input ``pos`` (operand ``k`` of ``bc``) at the work-item's element(s).

    A constant float scalar is inlined as a literal.
    """
    spec = g.ctx.inputs[pos]
    dtype = np.dtype(spec.dtype)
    if dtype == _F32 and spec.value is not None and np.asarray(spec.value).size == 1:
        lit = _r(np.asarray(spec.value).reshape(-1)[0])
        return g.vector("real4", lit) if width == 4 else lit
    ptr, idx = g.input(pos), bc.index(k, "i")
    if width == 4:
        return g.load4(ptr, idx) if bc.last_varies(k) else g.vector("real4", g.load(ptr, idx))
    return g.load(ptr, idx, dtype)


def _value_type(dtype: np.dtype, width: int) -> str:
    """C type of a loaded operand value."""
    if np.dtype(dtype) == _F32:
        return "real4" if width == 4 else "real"
    return c_type(dtype)


Compute = Callable[[list[str]], "str | tuple[list[str], str]"]


def pointwise(g: NodeGen, positions: Sequence[int], compute: Compute, *, width: int = 1,
              shapes: Sequence[Sequence[int]] | None = None, activation: str = "NONE") -> KernelSpec:
    """The kernel of an elementwise node: operands ``positions`` loaded into ``a0, a1, ...``,
    ``compute`` of those names gives the value (or ``(statements, value)``), which is stored.

    One work-item per ``width`` consecutive outputs; ``shapes`` overrides the operands'
    shapes for indexing (SELECT's rank-1 condition). A float output goes through the
    epilogue (fused activation and followers); an integer or bool output is converted
    to its type, ``activation`` clamping it.
    """
    out_spec = g.ctx.outputs[0]
    out_dtype = np.dtype(out_spec.dtype)
    bc = Broadcast(out_spec.shape, shapes or [g.ctx.inputs[p].shape for p in positions])
    n = _size(out_spec.shape)
    # The global size is exactly the work, so no bounds check is needed.
    lines = [f"  const int i = {g.global_id(0)}" + (" * 4;" if width == 4 else ";")]
    lines += bc.coord_lines("i")
    names = []
    for k, pos in enumerate(positions):
        names.append(f"a{k}")
        lines.append(f"  const {_value_type(g.ctx.inputs[pos].dtype, width)} a{k} = "
                     f"{_operand(g, pos, bc, k, width)};")
    value = compute(names)
    if isinstance(value, tuple):
        lines += value[0]
        value = value[1]
    if out_dtype == _F32:
        lines.append("  " + (g.store_output4("i", value) if width == 4 else g.store_output("i", value)))
    else:
        ctype = c_type(out_dtype)
        lines.append(f"  const {ctype} r = ({ctype})({value});")
        lines.append(f"  {g.output(0)}[i] = {_INT_ACTIVATION[activation]('r', ctype)};")
    return g.kernel("\n".join(lines), (n // width,))


def _dtype(g: NodeGen, pos: int) -> np.dtype:
    return np.dtype(g.ctx.inputs[pos].dtype)


def _check_int(g: NodeGen, *dtypes: np.dtype) -> None:
    """Decline integer types OpenCL has no plain scalar for here."""
    for dt in dtypes:
        if dt != _F32 and dt != _BOOL and dt not in _INTS:
            raise Decline(f"{g.ctx.node.op} on {dt} tensors")


def _float_width(g: NodeGen, positions: Sequence[int]) -> int:
    return _width(g, Broadcast(g.ctx.outputs[0].shape, [g.ctx.inputs[p].shape for p in positions]))


# -- generators --------------------------------------------------------------------------

@generator(*CHAIN_UNARY, "LOGICAL_NOT", epilogue=True)
def unary(g: NodeGen) -> list[KernelSpec]:
    """``out = f(in)``: floats through ``CHAIN_UNARY`` (four per work-item when the size
    allows), integers and bools through their own forms."""
    op, dtype = g.ctx.node.op, _dtype(g, 0)
    if dtype == _F32:
        if op not in CHAIN_UNARY:
            raise Decline(f"{op} on float tensors")
        return [pointwise(g, [0], lambda v: CHAIN_UNARY[op](v[0], g.attrs, g), width=_float_width(g, [0]))]
    _check_int(g, dtype)
    if op not in _INT_UNARY:
        raise Decline(f"{op} on {dtype} tensors")
    return [pointwise(g, [0], lambda v: _INT_UNARY[op](v[0]))]


def _int_pow(v: list[str], ctype: str) -> tuple[list[str], str]:
    """Integer POW by squaring (LiteRT rejects negative exponents, which give 1 here)."""
    a, b = v
    return ([f"  {ctype} p = 1, base = {a};",
             f"  for ({ctype} e = {b}; e > 0; e >>= 1) {{ if (e & 1) p *= base; base *= base; }}"], "p")


@generator(*CHAIN_BINARY, epilogue=True)
def binary(g: NodeGen) -> list[KernelSpec]:
    """Broadcasting binary arithmetic: floats through ``CHAIN_BINARY`` (float4 when the
    innermost merged axis allows), integers through their own forms with the fused
    activation as a clamp."""
    op, dtype = g.ctx.node.op, _dtype(g, 0)
    if dtype == _F32:
        return [pointwise(g, [0, 1], lambda v: CHAIN_BINARY[op](v[0], v[1], g.attrs, g),
                          width=_float_width(g, [0, 1]))]
    _check_int(g, dtype)
    ctype = c_type(dtype)
    if op == "POW":
        return [pointwise(g, [0, 1], lambda v: _int_pow(v, ctype))]
    if op not in _INT_BINARY:
        raise Decline(f"{op} on {dtype} tensors")
    _check_int_divisor(g, op)
    return [pointwise(g, [0, 1], lambda v: _INT_BINARY[op](*v), activation=g.attrs.get("activation", "NONE"))]


def _check_int_divisor(g: NodeGen, op: str) -> None:
    """Integer division by zero is LiteRT's run-time error (and undefined in OpenCL C): a
    divisor that is not a constant free of zeros is declined, so cpu checks it."""
    if op not in ("DIV", "FLOOR_DIV", "FLOOR_MOD"):
        return
    divisor = g.ctx.inputs[1].value
    if divisor is None:
        raise Decline(f"integer {op} by a run-time divisor (cpu raises LiteRT's error on a zero)")
    if np.any(np.asarray(divisor) == 0):
        raise Decline(f"integer {op} by a constant holding zero")


@generator(*_COMPARE)
def compare(g: NodeGen) -> list[KernelSpec]:
    """Comparisons and LOGICAL_AND/OR: bool (uchar 0/1) outputs of broadcast operands."""
    _check_int(g, _dtype(g, 0))
    sign = _COMPARE[g.ctx.node.op]
    return [pointwise(g, [0, 1], lambda v: f"{v[0]} {sign} {v[1]}")]


@generator("SELECT", "SELECT_V2", epilogue=True)
def select(g: NodeGen) -> list[KernelSpec]:
    """``cond ? x : y`` with the condition, x and y broadcast (SELECT's rank-1 condition
    picks whole slices along axis 0)."""
    _check_int(g, _dtype(g, 1))
    shapes = [tuple(s.shape) for s in g.ctx.inputs[:3]]
    out_rank = len(g.ctx.outputs[0].shape)
    if g.ctx.node.op == "SELECT" and len(shapes[0]) == 1 and out_rank > 1:
        shapes[0] = shapes[0] + (1,) * (out_rank - 1)
    return [pointwise(g, [0, 1, 2], lambda v: f"{v[0]} ? {v[1]} : {v[2]}", shapes=shapes)]


@generator("ADD_N", epilogue=True)
def add_n(g: NodeGen) -> list[KernelSpec]:
    """The sum of equal-shaped inputs, added in input order."""
    positions = list(range(len(g.ctx.inputs)))
    dtype = _dtype(g, 0)
    _check_int(g, dtype)

    def total(v: list[str]) -> str:
        expr = v[0]
        for name in v[1:]:
            expr = f"({expr} + {name})"
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
        return [pointwise(g, [0], lambda v: f"{v[0]} != 0")]
    if dst == _F32:
        width = _float_width(g, [0]) if src == _F32 else 1
        return [pointwise(g, [0], lambda v: v[0] if src == _F32 else f"(real){v[0]}", width=width)]
    ctype = c_type(dst)
    if src == _F32:
        return [pointwise(g, [0], lambda v: f"isnan({v[0]}) ? {_INT_MAX[ctype]} : convert_{ctype}_sat({v[0]})")]
    return [pointwise(g, [0], lambda v: f"({ctype}){v[0]}")]


@generator("ZEROS_LIKE", epilogue=True)
def zeros_like(g: NodeGen) -> list[KernelSpec]:
    """Zeros of the input's shape and type (the input is not read)."""
    dtype = np.dtype(g.ctx.outputs[0].dtype)
    _check_int(g, dtype)
    if dtype != _F32:
        return [pointwise(g, [], lambda v: "0")]
    width = _width(g, Broadcast(g.ctx.outputs[0].shape, []))
    return [pointwise(g, [], lambda v: g.vector("real4", "0") if width == 4 else "(real)0", width=width)]


# -- the float view of quantized models (litegpu.float_view) -----------------------------


@generator("QUANT_LUT", epilogue=True)
def quant_lut(g: NodeGen) -> list[KernelSpec]:
    """A quantized one-input op of the float view: the input's code (rounded in float,
    NaN and strays clamped into the table) indexes its table of outputs, kept float32."""
    table = g.ctx.inputs[1].value
    if table is None:
        raise Decline("QUANT_LUT with a table computed at run time")
    ptr = g.const(np.asarray(table, np.float32).reshape(-1), storage=False)
    inv = float(np.float32(1) / np.float32(g.attrs["in_scale"]))
    last = c_float(np.asarray(table).size - 1)

    def compute(v: list[str]) -> str:
        code = f"rint((float){v[0]} * {c_float(inv)}) + {c_float(g.attrs['offset'])}"
        return f"(real){ptr}[(int)fmin(fmax({code}, 0.0f), {last})]"
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
    inv = c_float(float(np.float32(1) / np.float32(a["step"])))
    bias = g.const(a["bias"].astype(np.int64))
    lo, hi = f"{a['lo']}L", f"{a['hi']}L"
    lines = [f"  const int ch = i % {channels};",
             f"  const long acc = convert_long_rte((float)a0 * {inv}) * 256L + convert_long_rte((float)a1 * {inv})"
             f" + {bias}[ch];"]
    if a["style"] == "tflite16":
        # TFLite's int64 MultiplyByQuantizedMultiplier: the multiplier cut to 16 bits,
        # one rounding (half up) by 2^(15 - shift).
        m = a["multiplier"]
        reduced = np.where(m < 0x7FFF0000, (m + (1 << 15)) >> 16, 0x7FFF).astype(np.int64)
        total = (15 - a["shift"]).astype(np.int32)
        if np.any(total < 1) or np.any(total > 62):
            raise Decline("GRID_REQUANT16 shift out of range")
        tm, ts = g.const(reduced), g.const(total)
        lines.append(f"  const long q = (acc * {tm}[ch] + (1L << ({ts}[ch] - 1))) >> {ts}[ch];")
    else:
        # MultiplyByQuantizedMultiplier (int32): left shift, SaturatingRoundingDoublingHighMul
        # (ties away from zero), RoundingDivideByPOT.
        left = np.maximum(a["shift"], 0).astype(np.int32)
        right = np.maximum(-a["shift"], 0).astype(np.int32)
        tm, tl, tr = g.const(a["multiplier"].astype(np.int64)), g.const(left), g.const(right)
        lines += [f"  const long ab = (acc << {tl}[ch]) * {tm}[ch];",
                  "  const long nudged = ab + (ab >= 0 ? (1L << 30) : (1L - (1L << 30)));",
                  "  const long high = nudged >= 0 ? (nudged >> 31) : -((-nudged) >> 31);",
                  f"  const int e = {tr}[ch];",
                  "  const long mask = (1L << e) - 1;",
                  "  const long q = (high >> e) + ((high & mask) > ((mask >> 1) + (high < 0)));"]
    return [pointwise(g, [0, 1], lambda v: (lines, f"(real)clamp(q, {lo}, {hi})"))]


@generator("QUANTIZE", "DEQUANTIZE", epilogue=True)
def convert_quantized(g: NodeGen) -> list[KernelSpec]:
    """The float view's edges: DEQUANTIZE of integers ``(q - zp) * scale`` (of floats: a
    copy), QUANTIZE of floats ``clamp(rint(x / scale) + zp)`` in float32; per-tensor
    params only (integer-to-integer requantization stays on cpu)."""
    src = _dtype(g, 0)
    params = g.attrs.get("in" if g.ctx.node.op == "DEQUANTIZE" else "out")
    if g.ctx.node.op == "DEQUANTIZE" and src == _F32:
        return [pointwise(g, [0], lambda v: v[0], width=_float_width(g, [0]))]
    if params is None or not params.per_tensor:
        raise Decline(f"{g.ctx.node.op} without per-tensor quantization")
    scale, zp = c_float(params.scale), c_float(params.zero_point)
    if g.ctx.node.op == "DEQUANTIZE":
        _check_int(g, src)
        return [pointwise(g, [0], lambda v: f"(real)(((float){v[0]} - {zp}) * {scale})")]
    if src != _F32:
        raise Decline("integer-to-integer QUANTIZE")
    inv = c_float(float(np.float32(1) / np.float32(params.scale)))
    lo, hi = c_float(params.qmin), c_float(params.qmax)
    return [pointwise(g, [0], lambda v: f"clamp(rint((float){v[0]} * {inv}) + {zp}, {lo}, {hi})")]
