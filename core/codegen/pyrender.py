"""Scalar numba-Python source of :mod:`.ir` expressions: the cpu backend's fused kernels.

The cpu backend generates its fused elementwise kernels as Python that numba compiles
(:mod:`litegpu_cpu.fusion`); the float formulas it shares with the GPU kernels
(:mod:`.formulas`) are rendered here, one expression at a time. Only expressions are
rendered (no statements, loads or vectors): the caller names the operands, as
:class:`~.ir.Sym` values whose name is the text to write (a Python name, an array read,
or a ``{a}`` placeholder of a template).

Values stay float32 in numba: a float literal is ``np.float32(<shortest repr>)``, which
numba folds to a float32 constant (a bare ``0.5`` would promote its operand to float64),
and the math functions are numpy's, which keep float32 (:data:`FUNCTIONS`; the caller
may spell some differently, e.g. through its own vectorizable functions). Operators are
Python's, parenthesized by precedence, so the operations and their order are the tree's.

A choice (:func:`~.ir.select`) is Python's conditional expression, except a choice
between a value and a constant bound it is compared with, the clamps, which is Python's
``min`` or ``max``: numba computes ``max(u, v)`` as ``v if v > u else u`` (one compare and
select, as ``a if a > b else b``), and the value is written once rather than in both the
condition and a branch.
"""
from __future__ import annotations

import re
from typing import Mapping

import numpy as np

from . import ir

#: Math functions (:data:`litegpu.codegen.ir.MATH`) as Python templates of their
#: arguments ``{0}``, ``{1}``...: numpy's float32 functions, Python's ``abs``/``min``/``max``.
#: ``clamp`` is ``min(max(x, lo), hi)``: NaN goes through, as XNNPACK's clamps do.
FUNCTIONS: dict[str, str] = {
    **{fn: f"np.{fn}({{0}})" for fn in ("exp", "exp2", "expm1", "log", "log2", "sqrt", "sin", "cos", "tanh",
                                          "floor", "ceil", "rint", "trunc", "sign", "isnan", "isinf", "signbit")},
    "fabs": "abs({0})",
    "abs": "abs({0})",
    "rsqrt": "np.float32(1.0) / np.sqrt({0})",
    "fmax": "np.fmax({0}, {1})",
    "fmin": "np.fmin({0}, {1})",
    "fmod": "np.fmod({0}, {1})",
    "pow": "np.power({0}, {1})",
    "min": "min({0}, {1})",
    "max": "max({0}, {1})",
    "clamp": "min(max({0}, {1}), {2})",
    "opaque": "({0})",
}

# Python's precedence, lowest first: a child binding less tightly than its place needs is
# parenthesized. Calls, names and subscripts bind tightest (_ATOM). The logical ``&&`` and
# ``||`` of conditions are ``&`` and ``|`` of bools: both sides are evaluated, no branch.
_CONDITIONAL, _NOT, _COMPARE, _ATOM = 0, 3, 4, 12
_BINARY = {"||": (5, "|"), "^": (6, "^"), "&&": (7, "&"), "|": (5, "|"), "&": (7, "&"), "<<": (8, "<<"),
           ">>": (8, ">>"), "+": (9, "+"), "-": (9, "-"), "*": (10, "*"), "/": (10, "/"), "%": (10, "%"),
           **{op: (_COMPARE, op) for op in ("<", "<=", ">", ">=", "==", "!=")}}
_UNARY = 11
_CASTS = {"float": "np.float32", "real": "np.float32", "half": "np.float16", "int": "np.int32", "long": "np.int64",
          "uint": "np.uint32", "short": "np.int16", "char": "np.int8", "uchar": "np.uint8", "bool": "bool"}


def py_float(x: float) -> str:
    """A float32 constant: ``np.float32(...)`` of the shortest text that reads back as it."""
    x = np.float32(x)
    if np.isnan(x):
        return "np.float32(np.nan)"
    if np.isinf(x):
        return "np.float32(np.inf)" if x > 0 else "np.float32(-np.inf)"
    return f"np.float32({str(x)})"   # numpy's shortest float32 text (format() gives the float64 digits)


class PyRenderer(ir.Renderer):
    """Renders scalar expressions as numba-Python source. ``functions`` respells math
    functions (name -> template, as :data:`FUNCTIONS`) over the defaults."""

    def __init__(self, functions: Mapping[str, str] | None = None) -> None:
        self.functions = {**FUNCTIONS, **(functions or {})}

    def expr(self, e: ir.Expr) -> str:
        """``e`` as Python source (scalars only)."""
        if e.type.lanes != 1:
            raise TypeError(f"numba source renders scalars, not a {e.type}")
        return super().expr(e)

    def _child(self, e: ir.Expr, least: int) -> str:
        """``e``, parenthesized unless it binds at least as tightly as ``least``."""
        text = self.expr(e)
        return text if self.precedence(e) >= least else f"({text})"

    def precedence(self, e: ir.Expr) -> int:
        """How tightly ``e``'s rendering binds (Python's precedence levels, as :data:`_BINARY`)."""
        if isinstance(e, ir.Select):
            return _ATOM if _min_max(e) is not None else _CONDITIONAL
        if isinstance(e, ir.Bin):
            return _BINARY[e.op][0]
        if isinstance(e, ir.Un):
            return _NOT if e.op == "!" else _UNARY
        if isinstance(e, ir.Lit) and not e.type.is_float and not e.type.is_bool and e.value < 0:
            return _UNARY
        if isinstance(e, ir.Call) and not _is_call(self.functions.get(e.fn, "")):
            return _CONDITIONAL   # an operator template (rsqrt's division): parenthesized as an operand
        return _ATOM

    # -- expressions ---------------------------------------------------------------------------------
    def _lit(self, e: ir.Lit) -> str:
        if e.type.is_float:
            return py_float(e.value)
        if e.type.is_bool:
            return "True" if e.value else "False"
        return str(int(e.value))

    def _sym(self, e: ir.Sym) -> str:
        return e.name

    def _bin(self, e: ir.Bin) -> str:
        if e.op == "%" or (e.op == "/" and not e.a.type.is_float):
            # C's truncating integer / and %: Python's floor, and its int / gives a float
            raise TypeError(f"no numba rendering of {e.a.type} {e.op}")
        prec, op = _BINARY[e.op]
        # Left to right: the right operand of the same precedence keeps its parentheses
        # (a - (b - c), and float a + (b + c) is another order of operations); comparisons
        # never chain.
        left = prec + 1 if prec == _COMPARE else prec
        return f"{self._child(e.a, left)} {op} {self._child(e.b, prec + 1)}"

    def _un(self, e: ir.Un) -> str:
        if e.op == "!":
            return f"not {self._child(e.a, _NOT)}"
        return f"{e.op}{self._child(e.a, _UNARY)}"

    def _call(self, e: ir.Call) -> str:
        if e.fn not in self.functions:
            raise TypeError(f"no numba rendering of {e.fn}")
        # A template's arguments stand where any expression may (in a call's parentheses).
        return self.functions[e.fn].format(*(self.expr(a) for a in e.args))

    def _select(self, e: ir.Select) -> str:
        bound = _min_max(e)
        if bound is not None:
            fn, value, limit = bound
            return f"{fn}({self.expr(value)}, {self.expr(limit)})"
        return (f"{self._child(e.a, _CONDITIONAL + 1)} if {self._child(e.cond, _CONDITIONAL + 1)} "
                f"else {self._child(e.b, _CONDITIONAL)}")

    def _tableload(self, e: ir.TableLoad) -> str:
        return f"{_CASTS[e.type.scalar]}(({', '.join(map(repr, e.values))},)[{self.expr(e.index)}])"

    def _cast(self, e: ir.Cast) -> str:
        if e.bits:
            return f"{_CASTS[e.a.type.scalar]}({self.expr(e.a)}).view({_CASTS[e.type.scalar]})"
        if e.saturate:
            raise TypeError("no numba rendering of a saturating conversion")
        return f"{_CASTS[e.type.scalar]}({self.expr(e.a)})"


def _same(a: ir.Expr, b: ir.Expr) -> bool:
    """The same value: one node, or equal literals (a formula's ``lo`` is a new literal in
    each place it is written)."""
    if a is b:
        return True
    return isinstance(a, ir.Lit) and isinstance(b, ir.Lit) and a.type == b.type and a.value == b.value


def _min_max(e: ir.Select) -> tuple[str, ir.Expr, ir.Expr] | None:
    """(``max`` or ``min``, value, bound) when ``e`` chooses between a value and a constant
    bound by comparing them: ``select(x < lo, lo, x)`` is numba's ``max(x, lo)`` (``lo if
    lo > x else x``) and ``select(x > hi, hi, x)`` its ``min(x, hi)``, NaN going through
    either way. Else None."""
    c = e.cond
    if not isinstance(c, ir.Bin) or c.op not in ("<", ">"):
        return None
    for value, bound, op in ((c.a, c.b, c.op), (c.b, c.a, {"<": ">", ">": "<"}[c.op])):
        # ``bound op' value`` flipped to ``value op bound``; the bound is the chosen branch
        if isinstance(bound, ir.Lit) and _same(e.a, bound) and _same(e.b, value):
            return ("max" if op == "<" else "min"), value, bound
    return None


def _is_call(template: str) -> bool:
    """Whether ``template`` is one call, ``name(...)``, whose first parenthesis closes at its end."""
    m = re.match(r"[\w.]+\(", template)
    if m is None or not template.endswith(")"):
        return False
    depth = 0
    for k in range(m.end() - 1, len(template)):
        depth += {"(": 1, ")": -1}.get(template[k], 0)
        if depth == 0:
            return k == len(template) - 1
    return False


def render(e: ir.Expr, functions: Mapping[str, str] | None = None) -> str:
    """``e`` as numba-Python source (see :class:`PyRenderer`)."""
    return PyRenderer(functions).expr(e)


def operand(name: str, type_: ir.Type = ir.REAL) -> ir.Sym:
    """An operand the caller names: ``name`` is written as it is, so it must bind as a name
    does (a name, a subscript ``x0[r * c + j]``, a call, or a ``{a}`` placeholder for one)."""
    return ir.Sym(name, type_)
