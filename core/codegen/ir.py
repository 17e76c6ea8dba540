"""Kernels as a small typed tree, rendered per GPU API.

A generator builds a kernel with a :class:`KernelBuilder`: declarations, loops, ifs,
tensor loads and stores through :class:`Buffer` accessors (which know each tensor's
storage: float, half, or float32 kept at full precision in half storage; integers),
vectors, local memory and barriers, and the kernel language's math library
(:data:`MATH`). Every value is an :class:`Expr` with a :class:`Type`, so a renderer
never guesses: one C-family renderer (:mod:`.crender`: OpenCL C, CUDA C++ and MSL,
which differ only in spellings, see :mod:`.dialect`) and one WGSL renderer
(:mod:`.wgsl`) turn the same tree into source.

Types are C's scalar names plus ``real``, the arithmetic type of the precision mode
(``float``, or ``half`` in F16), with 1, 2, 4, 8 or 16 lanes. Operators follow the
kernel language: arithmetic takes operands of one type (a Python number becomes a
literal of the other operand's type; a scalar operand of a vector operation is
broadcast), a comparison gives a ``bool`` of the operands' lanes, and a choice
between values is :func:`select`. Integer ``/`` and ``%`` truncate, as in C and WGSL.

Python's ``==`` stays object identity (the nodes are hashed and compared as objects);
equality of values is :meth:`Expr.eq` / :meth:`Expr.ne`.
"""
from __future__ import annotations

import contextlib
import hashlib
import re
from dataclasses import dataclass, field, fields
from typing import Iterator, Sequence, Union

import numpy as np

FLOATS = ("float", "half", "real")
INTS = ("int", "uint", "long", "short", "char", "uchar", "ulong")   # ulong: wrapping 64-bit sums
SCALARS = FLOATS + INTS + ("bool",)
LANES = (1, 2, 4, 8, 16)
_UNSIGNED_BITS = {"uchar": 8, "uint": 32, "ulong": 64}
# Names a kernel's own variables never take: parameters (``t0``, and ``t0_b``/``t0_o`` in C),
# the renderers' builtins (``lg_*``), and the keywords and builtins of the APIs.
_RESERVED = re.compile(r"t\d+(_[bo])?|lg_.*|main|KERNEL|real4?|FT|LD4?|ST4?|TO_REAL4|"
                       r"(let|var|fn|for|if|else|loop|return|const|int|uint|float|half|bool|char|uchar|short|long|"
                       r"device|kernel|thread|threadgroup|constant|global|local|private|select|clamp|min|max|"
                       r"struct|switch|case|default|break|continue|while|do|true|false|vec[234]|array|ptr)")


@dataclass(frozen=True)
class Type:
    """A scalar type (see :data:`SCALARS`) with ``lanes`` lanes."""

    scalar: str
    lanes: int = 1

    def __post_init__(self) -> None:
        if self.scalar not in SCALARS or self.lanes not in LANES:
            raise ValueError(f"no kernel type {self.scalar} x {self.lanes}")

    @property
    def is_float(self) -> bool:
        """A floating-point type."""
        return self.scalar in FLOATS

    @property
    def is_bool(self) -> bool:
        """The result type of a comparison."""
        return self.scalar == "bool"

    def with_lanes(self, lanes: int) -> "Type":
        """This scalar type with ``lanes`` lanes."""
        return Type(self.scalar, lanes)

    def __str__(self) -> str:
        return self.scalar if self.lanes == 1 else f"{self.scalar}{self.lanes}"


FLOAT, HALF, REAL, INT, UINT, LONG, BOOL = (Type(s) for s in ("float", "half", "real", "int", "uint", "long", "bool"))
UCHAR, CHAR, SHORT = Type("uchar"), Type("char"), Type("short")
REAL4, FLOAT4 = Type("real", 4), Type("float", 4)

# numpy dtype -> the scalar type of a tensor of that dtype (bool tensors are bytes).
_DTYPE_SCALARS = {np.dtype(np.float32): "float", np.dtype(np.float16): "half", np.dtype(np.int32): "int",
                  np.dtype(np.int64): "long", np.dtype(np.uint8): "uchar", np.dtype(np.int8): "char",
                  np.dtype(np.int16): "short", np.dtype(np.uint32): "uint", np.dtype(np.bool_): "uchar"}


def scalar_of(dtype: np.dtype) -> str:
    """The kernel scalar type of a tensor element of ``dtype``."""
    try:
        return _DTYPE_SCALARS[np.dtype(dtype)]
    except KeyError:
        raise KeyError(f"no kernel type for tensors of {np.dtype(dtype)}") from None


# -- expressions ----------------------------------------------------------------------------------

Operand = Union["Expr", int, float, bool]


class Expr:
    """A typed value. Arithmetic, comparison and bitwise operators build new nodes."""

    type: Type

    def _bin(self, op: str, other: Operand, reverse: bool = False) -> "Expr":
        a, b = unify(self, other)
        if reverse:
            a, b = b, a
        result = a.type if a.type.lanes >= b.type.lanes else b.type
        if op in _COMPARISONS:
            result = BOOL.with_lanes(result.lanes)
        return Bin(op, a, b, result)

    def __add__(self, o): return self._bin("+", o)
    def __radd__(self, o): return self._bin("+", o, True)
    def __sub__(self, o): return self._bin("-", o)
    def __rsub__(self, o): return self._bin("-", o, True)
    def __mul__(self, o): return self._bin("*", o)
    def __rmul__(self, o): return self._bin("*", o, True)
    def __truediv__(self, o): return self._bin("/", o)
    def __rtruediv__(self, o): return self._bin("/", o, True)
    def __mod__(self, o): return self._bin("%", o)
    def __rmod__(self, o): return self._bin("%", o, True)
    def __lt__(self, o): return self._bin("<", o)
    def __le__(self, o): return self._bin("<=", o)
    def __gt__(self, o): return self._bin(">", o)
    def __ge__(self, o): return self._bin(">=", o)
    def __and__(self, o): return self._bin("&", o)
    def __or__(self, o): return self._bin("|", o)
    def __xor__(self, o): return self._bin("^", o)
    def __lshift__(self, o): return self._bin("<<", o)
    def __rshift__(self, o): return self._bin(">>", o)
    def __neg__(self): return Un("-", self, self.type)
    def __invert__(self): return Un("~", self, self.type)

    def eq(self, other: Operand) -> "Expr":
        """``self == other``, lane by lane (a ``bool``)."""
        return self._bin("==", other)

    def ne(self, other: Operand) -> "Expr":
        """``self != other``, lane by lane (a ``bool``)."""
        return self._bin("!=", other)

    def lane(self, j: int) -> "Expr":
        """Lane ``j`` of a vector."""
        if not 0 <= j < self.type.lanes:
            raise IndexError(f"lane {j} of a {self.type}")
        return Lane(self, j, self.type.with_lanes(1))

    def quad(self, j: int) -> "Expr":
        """Lanes ``4j`` .. ``4j + 3`` of an 8- or 16-lane vector, as a 4-lane vector (OpenCL's
        ``.lo``/``.hi``, ``.s0123``..); a 4-lane vector's quad 0 is the vector itself."""
        if self.type.lanes == 4 and j == 0:
            return self
        if self.type.lanes not in (8, 16) or not 0 <= j < self.type.lanes // 4:
            raise IndexError(f"quad {j} of a {self.type}")
        return Quad(self, j, self.type.with_lanes(4))

    def cast(self, type_: Type, saturate: bool = False) -> "Expr":
        """This value converted to ``type_`` (C's conversion: float to integer truncates;
        integer to a narrower integer wraps). ``saturate``: a float out of the integer
        type's range becomes its bound (OpenCL's ``convert_<type>_sat``; NaN becomes 0)."""
        if isinstance(type_, str):
            type_ = Type(type_, self.type.lanes)
        return self if type_ == self.type and not saturate else Cast(self, type_, saturate)


_COMPARISONS = ("<", "<=", ">", ">=", "==", "!=")


@dataclass(frozen=True, eq=False)
class Lit(Expr):
    """A literal of ``type`` (a float literal reads back as the same float32)."""

    value: float | int | bool
    type: Type


@dataclass(frozen=True, eq=False)
class Sym(Expr):
    """A named value: a declared variable or loop counter."""

    name: str
    type: Type


@dataclass(frozen=True, eq=False)
class Bin(Expr):
    op: str
    a: Expr
    b: Expr
    type: Type


@dataclass(frozen=True, eq=False)
class Un(Expr):
    op: str          # "-", "~", "!"
    a: Expr
    type: Type


@dataclass(frozen=True, eq=False)
class Call(Expr):
    """A function of the math library (:data:`MATH`)."""

    fn: str
    args: tuple[Expr, ...]
    type: Type


@dataclass(frozen=True, eq=False)
class Select(Expr):
    """``a`` where ``cond`` holds, else ``b`` (lane by lane for vectors)."""

    cond: Expr
    a: Expr
    b: Expr
    type: Type


@dataclass(frozen=True, eq=False)
class Cast(Expr):
    """``a`` converted to ``type`` (see :meth:`Expr.cast`), or with ``bits`` its bit pattern
    read as ``type`` (:func:`bitcast`)."""

    a: Expr
    type: Type
    saturate: bool = False
    bits: bool = False


@dataclass(frozen=True, eq=False)
class Lane(Expr):
    a: Expr
    j: int
    type: Type


@dataclass(frozen=True, eq=False)
class Quad(Expr):
    """Lanes ``4j`` .. ``4j + 3`` of an 8- or 16-lane vector (see :meth:`Expr.quad`)."""

    a: Expr
    j: int
    type: Type


@dataclass(frozen=True, eq=False)
class Vec(Expr):
    """A vector from lanes (or smaller vectors), or one scalar broadcast to every lane."""

    parts: tuple[Expr, ...]
    type: Type


@dataclass(frozen=True, eq=False)
class Id(Expr):
    """This work-item's ``kind`` id ("global", "local", "group") along ``axis``, an ``int``."""

    kind: str
    axis: int
    type: Type = INT


@dataclass(frozen=True, eq=False)
class Load(Expr):
    """``lanes`` consecutive elements of ``buffer`` from element ``index``.

    A float tensor's elements load as ``real`` (the arithmetic type); ``as_float`` loads
    them as ``float`` whatever the mode (accumulators). Integer tensors load as their own
    type."""

    buffer: "Buffer"
    index: Expr
    type: Type
    as_float: bool = False


@dataclass(frozen=True, eq=False)
class TableLoad(Expr):
    """Element ``index`` of a constant table of ``values`` (of ``type``), which the kernel
    declares once by :attr:`name` (see :func:`tables_of`)."""

    values: tuple
    index: Expr
    type: Type

    @property
    def name(self) -> str:
        """The table's name in source: the same values, the same name."""
        return "lg_tab_" + hashlib.sha256(repr((self.type.scalar, self.values)).encode()).hexdigest()[:12]


@dataclass(frozen=True, eq=False)
class LocalLoad(Expr):
    array: "LocalArray"
    index: Expr
    type: Type


def lit(value: float | int | bool, type_: Type) -> Lit:
    """A literal of ``type_`` (a vector type broadcasts it)."""
    scalar = type_.with_lanes(1)
    if scalar.is_float:
        value = float(np.float32(value))
    elif scalar.is_bool:
        value = bool(value)
    elif scalar.scalar in _UNSIGNED_BITS:   # C's conversion of a negative value: modulo 2^bits
        value = int(value) % (1 << _UNSIGNED_BITS[scalar.scalar])
    else:
        value = int(value)
    return Lit(value, scalar) if type_.lanes == 1 else Vec((Lit(value, scalar),), type_)


def as_expr(x: Operand, like: Type) -> Expr:
    """``x`` as an expression: a Python number becomes a literal of ``like``'s scalar type."""
    if isinstance(x, Expr):
        return x
    if isinstance(x, (bool, int, float, np.number)):
        return lit(x, like.with_lanes(1))
    raise TypeError(f"not a kernel value: {x!r}")


def unify(a: Operand, b: Operand) -> tuple[Expr, Expr]:
    """``a`` and ``b`` as expressions of one scalar type, or a TypeError naming both."""
    if not isinstance(a, Expr) and not isinstance(b, Expr):
        raise TypeError("at least one operand must be a kernel value")
    a = as_expr(a, b.type if isinstance(b, Expr) else a.type)
    b = as_expr(b, a.type)
    if a.type.scalar != b.type.scalar:
        raise TypeError(f"operands of different types: {a.type} and {b.type}; cast one")
    if a.type.lanes != b.type.lanes and 1 not in (a.type.lanes, b.type.lanes):
        raise TypeError(f"operands of different widths: {a.type} and {b.type}")
    return a, b


# -- the math library -------------------------------------------------------------------------------

#: The kernel language's functions by name: (arity, result). ``same``: the first
#: argument's type; ``mask``: a bool of its lanes. Names and semantics are OpenCL's
#: (``rint`` rounds half to even, ``round`` half away from zero, ``fmax``/``fmin`` return
#: the other operand when one is NaN); a renderer spells each for its API.
MATH: dict[str, tuple[int, str]] = {
    **{fn: (1, "same") for fn in ("exp", "exp2", "expm1", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tanh",
                                    "fabs", "floor", "ceil", "rint", "round", "trunc", "sign", "abs")},
    **{fn: (2, "same") for fn in ("fmax", "fmin", "fmod", "pow", "min", "max")},
    "clamp": (3, "same"),
    "fma": (3, "same"),       # a * b + c rounded once (operands of one type: a scalar is splatted)
    # x itself, which no rewrite may combine with the operations around it: a sum of a
    # constant's high and low parts must round twice (WGSL cannot mark an operation exact,
    # and Mesa's compiler reassociates float sums it is not told are exact).
    "opaque": (1, "same"),
    "isnan": (1, "mask"),
    "isinf": (1, "mask"),
    "signbit": (1, "mask"),   # the sign bit is set (-0.0 and negative NaNs too)
}


def call(fn: str, *args: Operand) -> Call:
    """``fn(args)`` from :data:`MATH`; numbers take the first value's type."""
    if fn not in MATH:
        raise KeyError(f"no kernel function {fn!r}")
    arity, result = MATH[fn]
    if len(args) != arity:
        raise TypeError(f"{fn} takes {arity} arguments, got {len(args)}")
    first = next(a for a in args if isinstance(a, Expr))
    exprs = tuple(as_expr(a, first.type) for a in args)
    type_ = BOOL.with_lanes(first.type.lanes) if result == "mask" else exprs[0].type
    if result == "same" and exprs[0] is not first:
        type_ = first.type
    return Call(fn, exprs, type_)


def table_load(values: Sequence[int | float], scalar: str, index: Operand) -> TableLoad:
    """``values[index]`` from a constant table the kernel declares (a lookup a formula needs:
    an instruction's table, as :mod:`.rsqrt14`'s)."""
    t = Type(scalar)
    return TableLoad(tuple(lit(v, t).value for v in values), as_expr(index, INT), t)


def tables_of(tree: object) -> dict[str, TableLoad]:
    """The tables the expressions and statements of ``tree`` (a kernel, its body, a value)
    read, by name, in order of first use."""
    found: dict[str, TableLoad] = {}

    def walk(x: object) -> None:
        if isinstance(x, TableLoad):
            found.setdefault(x.name, x)
            walk(x.index)
        elif isinstance(x, (Expr, Stmt, Kernel)):
            for f in fields(x):
                walk(getattr(x, f.name))
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)

    walk(tree)
    return found


_BITCASTS = {("float", "int"), ("float", "uint"), ("int", "float"), ("uint", "float")}


def bitcast(e: Expr, scalar: str) -> Expr:
    """The bits of the scalar ``e`` (a 32-bit float, int or uint) read as ``scalar``: OpenCL's
    ``as_int``, CUDA's ``__float_as_int``, MSL's ``as_type``, WGSL's ``bitcast``."""
    if e.type.lanes != 1 or (e.type.scalar, scalar) not in _BITCASTS:
        raise TypeError(f"no bitcast of a {e.type} to {scalar}")
    return Cast(e, Type(scalar), bits=True)


def plus(e: Expr, k: Operand) -> Expr:
    """``e + k`` for index arithmetic: ``e`` itself when ``k`` is the literal 0, ``e - |k|``
    when it is a negative literal (the generated source stays readable)."""
    if isinstance(k, int) and not isinstance(k, bool):
        return e if k == 0 else e - (-k) if k < 0 else e + k
    return e + k


def times(e: Expr, k: int) -> Expr:
    """``e * k``, or ``e`` itself when ``k`` is 1."""
    return e if k == 1 else e * k


def total(terms: Sequence[Expr]) -> Expr:
    """``terms[0] + terms[1] + ...``, added left to right."""
    out = terms[0]
    for term in terms[1:]:
        out = out + term
    return out


def select(cond: Expr, a: Operand, b: Operand) -> Expr:
    """``a`` where ``cond`` holds, else ``b`` (lane by lane when they are vectors)."""
    a, b = unify(a, b)
    type_ = a.type if a.type.lanes >= b.type.lanes else b.type
    if not cond.type.is_bool:
        raise TypeError(f"a choice needs a bool condition, got {cond.type}")
    return Select(cond, a, b, type_)


def logical_and(a: Expr, b: Expr) -> Expr:
    """Both conditions, lane by lane."""
    return Bin("&&", a, b, a.type)


def logical_or(a: Expr, b: Expr) -> Expr:
    """Either condition, lane by lane."""
    return Bin("||", a, b, a.type)


def logical_not(a: Expr) -> Expr:
    """The negated condition."""
    return Un("!", a, a.type)


def vector(type_: Type, *parts: Operand) -> Expr:
    """A ``type_`` vector of ``parts`` (lanes or smaller vectors), or of one scalar broadcast."""
    exprs = tuple(as_expr(p, type_.with_lanes(1)) for p in parts)
    if sum(p.type.lanes for p in exprs) not in (1, type_.lanes):
        raise TypeError(f"{len(exprs)} parts do not make a {type_}")
    return Vec(exprs, type_)


# -- buffers and local memory ---------------------------------------------------------------------------

@dataclass(eq=False)
class Buffer:
    """A tensor or constant the kernel takes as a parameter: its element dtype, whether the
    kernel writes it, and whether a float tensor stays float32 in half storage
    (``full_precision``, see :class:`litegpu.ops.TensorSpec`)."""

    name: str
    dtype: np.dtype
    writes: bool = False
    full_precision: bool = False

    @property
    def is_float(self) -> bool:
        """A float tensor (its storage depends on the precision mode)."""
        return np.dtype(self.dtype) == np.float32

    def element(self) -> Type:
        """The type an element loads as (``real`` for float tensors)."""
        return REAL if self.is_float else Type(scalar_of(self.dtype))

    def load(self, index: Operand, lanes: int = 1, as_float: bool = False) -> Load:
        """``lanes`` consecutive elements from ``index`` (see :class:`Load`)."""
        base = FLOAT if (as_float and self.is_float) else self.element()
        return Load(self, as_expr(index, INT), base.with_lanes(lanes), as_float and self.is_float)


@dataclass(eq=False)
class LocalArray:
    """An array in local (work-group) memory."""

    name: str
    type: Type
    size: int

    def load(self, index: Operand, lanes: int = 1) -> LocalLoad:
        """Element ``index``; with ``lanes``, that many consecutive elements of a scalar
        array from ``index``, as a vector (OpenCL's ``vload``)."""
        if lanes == 1:
            return LocalLoad(self, as_expr(index, INT), self.type)
        if self.type.lanes != 1:
            raise TypeError(f"a vector load from {self.name}, an array of {self.type}")
        return LocalLoad(self, as_expr(index, INT), self.type.with_lanes(lanes))


# -- statements ---------------------------------------------------------------------------------------------

class Stmt:
    """A statement of a kernel body."""


@dataclass(eq=False)
class Let(Stmt):
    """A constant: ``sym`` is ``value`` from here on."""

    sym: Sym
    value: Expr


@dataclass(eq=False)
class Var(Stmt):
    """A mutable variable, initialized."""

    sym: Sym
    value: Expr


@dataclass(eq=False)
class Assign(Stmt):
    """``target = value`` (``op``: ``+``, ``*``... for ``target op= value``)."""

    target: Sym
    value: Expr
    op: str = ""


@dataclass(eq=False)
class Store(Stmt):
    """Store ``value`` (``lanes`` consecutive elements) at element ``index`` of ``buffer``."""

    buffer: Buffer
    index: Expr
    value: Expr


@dataclass(eq=False)
class LocalStore(Stmt):
    array: LocalArray
    index: Expr
    value: Expr


@dataclass(eq=False)
class If(Stmt):
    cond: Expr
    body: list[Stmt]
    orelse: list[Stmt] = field(default_factory=list)


@dataclass(eq=False)
class For(Stmt):
    """``for (int sym = start; sym < stop; sym += step)``."""

    sym: Sym
    start: Expr
    stop: Expr
    step: int
    body: list[Stmt]
    unroll: bool = False    # a constant trip count the C compilers are asked to unroll fully


@dataclass(eq=False)
class Barrier(Stmt):
    """Every work-item of the group waits here; local memory stores are visible after it."""


@dataclass(eq=False)
class Return(Stmt):
    """This work-item is done."""


@dataclass(eq=False)
class Kernel:
    """A kernel: its parameters in order, local arrays, body, and launch sizes (global and
    local sizes in work-items, as OpenCL counts them)."""

    params: list[Buffer]
    locals: list[LocalArray]
    body: list[Stmt]
    global_size: tuple[int, ...]
    local_size: tuple[int, ...] | None = None


class KernelBuilder:
    """Builds a kernel body statement by statement (see the module docstring).

    ``with b.if_(cond):`` / ``with b.else_():`` / ``with b.for_("i", 0, n) as i:`` open
    blocks; every other method appends to the innermost open block."""

    def __init__(self) -> None:
        self.params: list[Buffer] = []
        self.locals: list[LocalArray] = []
        self._blocks: list[list[Stmt]] = [[]]
        self._names: set[str] = set()

    # -- parameters and memory --------------------------------------------------------------
    def buffer(self, dtype: np.dtype, writes: bool = False, full_precision: bool = False) -> Buffer:
        """A new parameter (named ``t<position>``)."""
        buf = Buffer(f"t{len(self.params)}", np.dtype(dtype), writes, full_precision)
        self.params.append(buf)
        return buf

    def local_array(self, name: str, type_: Type, size: int) -> LocalArray:
        """An array of ``size`` elements in local memory."""
        array = LocalArray(self._fresh(name), type_, int(size))
        self.locals.append(array)
        return array

    # -- statements ------------------------------------------------------------------------------
    def _fresh(self, name: str) -> str:
        if _RESERVED.fullmatch(name):
            name += "_"
        base, k = name, 1
        while name in self._names:
            name, k = f"{base}_{k}", k + 1
        self._names.add(name)
        return name

    def _add(self, stmt: Stmt) -> None:
        self._blocks[-1].append(stmt)

    def _named(self, value: Expr) -> Expr:
        """``value`` with its shared subexpressions declared as constants before the
        statement about to be added (:mod:`.cse`)."""
        from .cse import hoist

        def declare(e: Expr) -> Sym:
            sym = Sym(self._fresh("cs"), e.type)
            self._add(Let(sym, e))
            return sym
        return hoist(value, declare)

    def let(self, name: str, value: Operand, type_: Type = INT) -> Sym:
        """A constant named after ``name`` holding ``value``."""
        value = self._named(as_expr(value, type_))
        sym = Sym(self._fresh(name), value.type)
        self._add(Let(sym, value))
        return sym

    def var(self, name: str, value: Operand, type_: Type = INT) -> Sym:
        """A mutable variable named after ``name``, initialized to ``value``."""
        value = self._named(as_expr(value, type_))
        sym = Sym(self._fresh(name), value.type)
        self._add(Var(sym, value))
        return sym

    def assign(self, target: Sym, value: Operand, op: str = "") -> None:
        """``target = value``, or ``target op= value``."""
        value = as_expr(value, target.type)
        if value.type.scalar != target.type.scalar:
            raise TypeError(f"assigning a {value.type} to {target.name}, a {target.type}")
        self._add(Assign(target, self._named(value), op))

    def store(self, buffer: Buffer, index: Operand, value: Operand) -> None:
        """Store ``value`` (one element, or a vector's lanes) at ``index`` of ``buffer``."""
        value = as_expr(value, buffer.element())
        if not buffer.writes:
            raise TypeError(f"{buffer.name} is read-only")
        index = self._named(as_expr(index, INT))
        self._add(Store(buffer, index, self._named(value)))

    def local_store(self, array: LocalArray, index: Operand, value: Operand) -> None:
        """Store ``value`` at ``index`` of a local array (a vector into an array of scalars:
        its lanes at consecutive elements from ``index``, OpenCL's ``vstore``)."""
        index = self._named(as_expr(index, INT))
        self._add(LocalStore(array, index, self._named(as_expr(value, array.type))))

    def barrier(self) -> None:
        """See :class:`Barrier`."""
        self._add(Barrier())

    def ret(self) -> None:
        """See :class:`Return`."""
        self._add(Return())

    @contextlib.contextmanager
    def _block(self) -> Iterator[list[Stmt]]:
        self._blocks.append([])
        try:
            yield self._blocks[-1]
        finally:
            self._blocks.pop()

    @contextlib.contextmanager
    def if_(self, cond: Expr) -> Iterator[None]:
        """The statements of the block run where ``cond`` holds."""
        if not cond.type.is_bool or cond.type.lanes != 1:
            raise TypeError(f"an if needs a scalar bool condition, got {cond.type}")
        with self._block() as body:
            yield
        self._add(If(self._named(cond), body))

    @contextlib.contextmanager
    def else_(self) -> Iterator[None]:
        """The other branch of the if just closed."""
        block = self._blocks[-1]
        if not block or not isinstance(block[-1], If) or block[-1].orelse:
            raise TypeError("else_ must follow an if_ block")
        with self._block() as body:
            yield
        block[-1].orelse = body

    @contextlib.contextmanager
    def for_(self, name: str, start: Operand, stop: Operand, step: int = 1, unroll: bool = False) -> Iterator[Sym]:
        """A counted loop; yields the counter (an ``int``). ``unroll``: ask the compiler to
        unroll it fully (C's ``#pragma unroll``; WGSL has no such hint)."""
        sym = Sym(self._fresh(name), INT)
        with self._block() as body:
            yield sym
        self._add(For(sym, as_expr(start, INT), as_expr(stop, INT), int(step), body, bool(unroll)))

    def global_id(self, axis: int = 0) -> Id:
        """This work-item's global id along ``axis``."""
        return Id("global", axis)

    def local_id(self, axis: int = 0) -> Id:
        """This work-item's id in its group along ``axis``."""
        return Id("local", axis)

    def group_id(self, axis: int = 0) -> Id:
        """This work-item's group's id along ``axis``."""
        return Id("group", axis)

    def kernel(self, global_size: Sequence[int], local_size: Sequence[int] | None = None) -> Kernel:
        """The kernel built so far, launched over ``global_size`` work-items."""
        if len(self._blocks) != 1:
            raise TypeError("a block is still open")
        return Kernel(list(self.params), list(self.locals), list(self._blocks[0]),
                      tuple(int(g) for g in global_size), None if local_size is None else tuple(int(x) for x in local_size))


class Renderer:
    """What every renderer shares: expressions dispatch to ``_<node class>`` methods, and the
    block structure (if/else, loops, assignments, local stores, returns) is laid out once.
    A renderer spells the rest: :meth:`declare`, :meth:`store`, :meth:`for_head`,
    :meth:`local_store_vector` and :attr:`BARRIER`."""

    BARRIER = ""   # the statement that makes every work-item of the group wait

    def expr(self, e: Expr) -> str:
        """``e`` as source text."""
        return getattr(self, f"_{type(e).__name__.lower()}")(e)

    def declare(self, sym: Sym, value: Expr, mutable: bool) -> str:
        """The declaration of ``sym`` holding ``value`` (a constant unless ``mutable``)."""
        raise NotImplementedError

    def store(self, s: Store) -> str:
        """A store into a tensor."""
        raise NotImplementedError

    def for_head(self, s: For) -> str:
        """A counted loop's header, up to its opening brace."""
        raise NotImplementedError

    def local_store_vector(self, s: LocalStore) -> str:
        """A vector's lanes stored at consecutive elements of a local array of scalars."""
        raise NotImplementedError

    def stmts(self, body: list[Stmt], indent: str = "  ") -> list[str]:
        """The lines of ``body``."""
        return [line for s in body for line in self.stmt(s, indent)]

    def stmt(self, s: Stmt, indent: str) -> list[str]:
        """The lines of one statement."""
        if isinstance(s, (Let, Var)):
            return [indent + self.declare(s.sym, s.value, isinstance(s, Var))]
        if isinstance(s, Assign):
            return [f"{indent}{s.target.name} {s.op}= {self.expr(s.value)};"]
        if isinstance(s, Store):
            return [indent + self.store(s)]
        if isinstance(s, LocalStore):
            if s.value.type.lanes != s.array.type.lanes:   # a vector's lanes into a scalar array
                return [indent + self.local_store_vector(s)]
            return [f"{indent}{s.array.name}[{self.expr(s.index)}] = {self.expr(s.value)};"]
        if isinstance(s, If):
            lines = [f"{indent}if ({self.expr(s.cond)}) {{", *self.stmts(s.body, indent + "  ")]
            if s.orelse:
                lines += [f"{indent}}} else {{", *self.stmts(s.orelse, indent + "  ")]
            return lines + [f"{indent}}}"]
        if isinstance(s, For):
            return [indent + self.for_head(s), *self.stmts(s.body, indent + "  "), f"{indent}}}"]
        if isinstance(s, Barrier):
            return [indent + self.BARRIER]
        if isinstance(s, Return):
            return [f"{indent}return;"]
        raise TypeError(f"{type(self).__name__} has no rendering of {type(s).__name__}")


def float_arithmetic(kernel: Kernel) -> Kernel:
    """``kernel`` computing in ``float`` where it computed in ``real``: every ``real`` value,
    variable and local array becomes ``float``, and float tensors load as float (their
    storage is unchanged; stores convert). :meth:`litegpu.codegen.NodeGen.kernel` renders
    a kernel so in F16 when it touches a tensor kept at full precision: half arithmetic,
    with its 11-bit significand, cannot hold a 16-bit grid."""
    seen: dict[object, object] = {}   # each variable and local array is rebuilt once, kept by identity

    def widen(t: Type) -> Type:
        return Type("float", t.lanes) if t.scalar == "real" else t

    def conv(x):
        if isinstance(x, Type):
            return widen(x)
        if isinstance(x, (Sym, LocalArray)):
            if x not in seen:
                seen[x] = type(x)(**{f.name: conv(getattr(x, f.name)) for f in fields(x)})
            return seen[x]
        if isinstance(x, Load):
            return Load(x.buffer, conv(x.index), widen(x.type), x.as_float or x.type.scalar == "real")
        if isinstance(x, (Expr, Stmt)):
            return type(x)(**{f.name: conv(getattr(x, f.name)) for f in fields(x)})
        if isinstance(x, list):
            return [conv(v) for v in x]
        if isinstance(x, tuple):
            return tuple(conv(v) for v in x)
        return x   # buffers, numbers, names

    return Kernel(list(kernel.params), conv(kernel.locals), conv(kernel.body), kernel.global_size, kernel.local_size)
