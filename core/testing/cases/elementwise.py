"""Conformance cases for elementwise ops: arithmetic with fused activations and
broadcasting, comparisons, logical ops, SELECT, unary math and activations, CAST,
ADD_N, PRELU and complex parts.

Inputs are seeded per case and kept away from discontinuities (no zero divisors, ROUND
off the .5 boundaries except exact halves, logs of positive values).
"""
from __future__ import annotations

import zlib
from typing import Any, Callable, Sequence

import numpy as np

from ..builder import ModelBuilder
from . import Case

F32, I8, U8, I32, I64, BOOL = np.float32, np.int8, np.uint8, np.int32, np.int64, np.bool_


class Const:
    """Marks an argument of :func:`single_op_model` as a constant tensor of the model."""

    def __init__(self, array: Any) -> None:
        self.array = np.asarray(array)


def single_op_model(op: str, args: Sequence[Any], out_shapes: Sequence[Sequence[int]],
                    out_dtypes: Sequence[Any], **options: Any) -> tuple[bytes, list[np.ndarray]]:
    """A model of one ``op``: arrays in ``args`` become inputs (fed in order), :class:`Const` s
    become constants. Returns ``(model_bytes, inputs)``."""
    b = ModelBuilder()
    ids, feeds = [], []
    for i, a in enumerate(args):
        if isinstance(a, Const):
            ids.append(b.const(f"const{i}", a.array))
        else:
            a = np.asarray(a)
            ids.append(b.input(f"input{i}", a.shape, a.dtype))
            feeds.append(a)
    outs = [b.tensor(f"output{j}", s, d) for j, (s, d) in enumerate(zip(out_shapes, out_dtypes))]
    b.op(op, ids, outs, **options)
    b.output(*outs)
    return b.build(), feeds


Maker = Callable[[np.random.Generator], tuple[list, Sequence[int], Any]]


def op_case(op: str, variant: str, make: Maker, *, tol: float = 1e-5, **options: Any) -> Case:
    """A one-op case: ``make(rng)`` returns ``(args, out_shape, out_dtype)``; the rng is seeded
    from the case id so every run sees the same inputs."""
    def build() -> tuple[bytes, list[np.ndarray]]:
        rng = np.random.default_rng(zlib.crc32(f"{op}-{variant}".encode()))
        args, shape, dtype = make(rng)
        return single_op_model(op, args, [shape], [dtype], **options)
    return Case(op, variant, build, tol)


def normal(rng: np.random.Generator, shape: Sequence[int], scale: float = 3.0, dtype: Any = F32) -> np.ndarray:
    """Standard normal values times ``scale``."""
    return (rng.standard_normal(shape) * scale).astype(dtype)


def ints(rng: np.random.Generator, shape: Sequence[int], low: int, high: int, dtype: Any = I32,
         nonzero: bool = False) -> np.ndarray:
    """Uniform integers in ``[low, high]``; ``nonzero`` replaces zeros by 1."""
    x = rng.integers(low, high + 1, size=shape).astype(dtype)
    if nonzero:
        x[x == 0] = 1
    return x


def away_from_zero(rng: np.random.Generator, shape: Sequence[int], low: float = 0.5, high: float = 4.0) -> np.ndarray:
    """Float32 values with ``low <= |x| <= high`` and random signs (safe divisors)."""
    mag = rng.uniform(low, high, size=shape)
    return (mag * rng.choice([-1.0, 1.0], size=shape)).astype(F32)


def bcast(*shapes: Sequence[int]) -> tuple[int, ...]:
    """Broadcast shape of the operands (the output shape of a broadcasting op)."""
    return tuple(np.broadcast_shapes(*[tuple(s) for s in shapes]))


def binary_case(op: str, variant: str, a_shape, b_shape, gen_a, gen_b, *, out_dtype=None,
                const_b: bool = False, tol: float = 1e-5, **options) -> Case:
    """A broadcasting binary case; ``gen_a(rng, shape)`` / ``gen_b`` draw the operands."""
    def make(rng):
        a, b = gen_a(rng, a_shape), gen_b(rng, b_shape)
        return [a, Const(b) if const_b else b], bcast(a_shape, b_shape), out_dtype or a.dtype
    return op_case(op, variant, make, tol=tol, **options)


def _f(rng, shape):
    return normal(rng, shape)


def _fdiv(rng, shape):
    return away_from_zero(rng, shape)


def _positive(rng, shape):
    return rng.uniform(0.2, 3.0, size=shape).astype(F32)


def _int_gen(dtype, low=-20, high=20, nonzero=False):
    return lambda rng, shape: ints(rng, shape, low, high, dtype, nonzero)


def _small_floats(rng, shape):
    """Floats drawn from a few integers, so equality comparisons see equal pairs."""
    return rng.integers(-2, 3, size=shape).astype(F32)


def _bools(rng, shape):
    return rng.random(shape) < 0.5


ACTIVATIONS = ["NONE", "RELU", "RELU_N1_TO_1", "RELU6", "TANH", "SIGN_BIT"]
BROADCASTS = {
    "same": ((2, 3, 4, 5), (2, 3, 4, 5)),
    "scalar": ((2, 3, 4), ()),
    "rank4-rank1": ((1, 4, 4, 8), (8,)),
    "both": ((2, 1, 4, 1), (1, 3, 1, 5)),
    "rank1-rank4": ((5,), (2, 3, 1, 5)),
    "rank5": ((2, 1, 3, 1, 4), (1, 2, 1, 3, 1)),
    "rank6": ((2, 1, 2, 3, 1, 4), (1, 3, 1, 1, 2, 1)),
}


def _arithmetic_cases() -> list[Case]:
    cases = []
    for op in ("ADD", "SUB", "MUL", "DIV"):
        gen_b = _fdiv if op == "DIV" else _f
        for act in ACTIVATIONS:
            cases.append(binary_case(op, f"f32-{act.lower()}", (2, 3, 4, 5), (2, 3, 4, 5), _f, gen_b,
                                     fused_activation_function=act))
        for name, (sa, sb) in BROADCASTS.items():
            if name == "same":
                continue
            cases.append(binary_case(op, f"f32-bcast-{name}", sa, sb, _f, gen_b))
        cases.append(binary_case(op, "f32-const-rank1-relu6", (1, 3, 3, 4), (4,), _f, gen_b, const_b=True,
                                 fused_activation_function="RELU6"))
    for op in ("ADD", "SUB", "MUL"):
        for dt in (I32, I64):
            name = np.dtype(dt).name
            cases.append(binary_case(op, f"{name}-bcast", (3, 4, 5), (4, 1), _int_gen(dt), _int_gen(dt)))
            cases.append(binary_case(op, f"{name}-relu", (3, 4), (3, 4), _int_gen(dt), _int_gen(dt),
                                     fused_activation_function="RELU"))
        cases.append(binary_case(op, "int32-relu6", (10,), (10,), _int_gen(I32, -5, 5), _int_gen(I32, -5, 5),
                                 fused_activation_function="RELU6"))
        cases.append(binary_case(op, "int32-relu_n1_to_1", (10,), (10,), _int_gen(I32, -5, 5),
                                 _int_gen(I32, -5, 5), fused_activation_function="RELU_N1_TO_1"))
    cases.append(binary_case("DIV", "int32-truncates", (4, 6), (4, 6), _int_gen(I32, -50, 50),
                             _int_gen(I32, -7, 7, nonzero=True)))
    cases.append(binary_case("DIV", "int32-bcast-relu6", (3, 1, 5), (4, 1), _int_gen(I32, -50, 50),
                             _int_gen(I32, -7, 7, nonzero=True), fused_activation_function="RELU6"))

    def complex_gen(rng, shape):
        return (normal(rng, shape) + 1j * normal(rng, shape)).astype(np.complex64)
    cases.append(binary_case("MUL", "complex64", (2, 3), (3,), complex_gen, complex_gen))
    return cases


def _other_binary_cases() -> list[Case]:
    cases = []
    for op in ("MAXIMUM", "MINIMUM"):
        cases.append(binary_case(op, "f32-same", (2, 3, 4, 5), (2, 3, 4, 5), _f, _f))
        cases.append(binary_case(op, "f32-scalar", (2, 3, 4), (), _f, _f, const_b=True))
        cases.append(binary_case(op, "f32-rank4-rank1", (1, 4, 4, 8), (8,), _f, _f))
        cases.append(binary_case(op, "f32-rank5", (2, 1, 3, 1, 4), (1, 2, 1, 3, 1), _f, _f))
        for dt in (I32, I64, I8):
            cases.append(binary_case(op, f"{np.dtype(dt).name}-bcast", (3, 4), (4,), _int_gen(dt), _int_gen(dt)))
        cases.append(binary_case(op, "uint8-bcast", (3, 4), (3, 1), _int_gen(U8, 0, 255), _int_gen(U8, 0, 255)))
    cases += [
        binary_case("POW", "f32-same", (3, 4, 5), (3, 4, 5), _positive, _f),
        binary_case("POW", "f32-scalar-exponent", (3, 4, 5), (), _positive,
                    lambda rng, s: np.asarray(2.5, F32), const_b=True),
        binary_case("POW", "f32-rank4-rank1", (1, 2, 3, 4), (4,), _positive, _f),
        binary_case("POW", "int32", (3, 4), (3, 4), _int_gen(I32, -6, 6), _int_gen(I32, 0, 5)),
        binary_case("SQUARED_DIFFERENCE", "f32-same", (2, 3, 4, 5), (2, 3, 4, 5), _f, _f),
        binary_case("SQUARED_DIFFERENCE", "f32-rank4-rank1", (1, 4, 4, 8), (8,), _f, _f),
        binary_case("SQUARED_DIFFERENCE", "f32-scalar", (2, 3), (), _f, _f),
        binary_case("SQUARED_DIFFERENCE", "int32-bcast", (3, 4), (4,), _int_gen(I32), _int_gen(I32)),
    ]
    for op in ("FLOOR_DIV", "FLOOR_MOD"):
        cases.append(binary_case(op, "f32-same", (3, 4, 5), (3, 4, 5), _f, _fdiv))
        cases.append(binary_case(op, "f32-rank4-rank1", (1, 2, 3, 4), (4,), _f, _fdiv))
        cases.append(binary_case(op, "f32-scalar", (3, 5), (), _f, lambda rng, s: np.asarray(-1.75, F32),
                                 const_b=True))
        for dt in (I32, I8):
            cases.append(binary_case(op, f"{np.dtype(dt).name}-signs", (4, 6), (4, 6), _int_gen(dt, -50, 50),
                                     _int_gen(dt, -7, 7, nonzero=True)))
        cases.append(binary_case(op, "int32-bcast", (3, 1, 5), (4, 1), _int_gen(I32, -50, 50),
                                 _int_gen(I32, -7, 7, nonzero=True)))
    cases.append(binary_case("FLOOR_MOD", "int64-signs", (4, 6), (4, 6), _int_gen(I64, -50, 50),
                             _int_gen(I64, -7, 7, nonzero=True)))
    return cases


def _comparison_cases() -> list[Case]:
    cases = []
    for op in ("EQUAL", "NOT_EQUAL", "LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL"):
        cases.append(binary_case(op, "f32-same", (2, 3, 4, 5), (2, 3, 4, 5), _small_floats, _small_floats,
                                 out_dtype=BOOL))
        cases.append(binary_case(op, "f32-rank4-rank1", (1, 4, 4, 8), (8,), _small_floats, _small_floats,
                                 out_dtype=BOOL))
        cases.append(binary_case(op, "f32-scalar", (3, 4), (), _small_floats,
                                 lambda rng, s: np.asarray(0.0, F32), const_b=True, out_dtype=BOOL))
        cases.append(binary_case(op, "f32-rank5", (2, 1, 3, 1, 4), (1, 2, 1, 3, 1), _small_floats,
                                 _small_floats, out_dtype=BOOL))
        for dt in (I32, I64):
            cases.append(binary_case(op, f"{np.dtype(dt).name}-bcast", (3, 4), (4,), _int_gen(dt, -3, 3),
                                     _int_gen(dt, -3, 3), out_dtype=BOOL))
    for op in ("EQUAL", "NOT_EQUAL"):
        cases.append(binary_case(op, "bool-bcast", (3, 4), (4,), _bools, _bools, out_dtype=BOOL))
    for op in ("LOGICAL_AND", "LOGICAL_OR"):
        cases.append(binary_case(op, "same", (2, 3, 4), (2, 3, 4), _bools, _bools, out_dtype=BOOL))
        cases.append(binary_case(op, "bcast", (2, 3, 4), (3, 1), _bools, _bools, out_dtype=BOOL))
        cases.append(binary_case(op, "scalar", (2, 3), (), _bools, _bools, out_dtype=BOOL))
    return cases


def select_case(op: str, variant: str, c_shape, x_shape, y_shape, out_shape, dtype=F32) -> Case:
    """A SELECT / SELECT_V2 case with random condition and values."""
    def gen(rng, shape):
        if np.dtype(dtype) == np.bool_:
            return _bools(rng, shape)
        if np.dtype(dtype).kind in "iu":
            return ints(rng, shape, -20, 20, dtype)
        return normal(rng, shape)

    def make(rng):
        return [_bools(rng, c_shape), gen(rng, x_shape), gen(rng, y_shape)], out_shape, dtype
    return op_case(op, variant, make)


def _select_cases() -> list[Case]:
    return [
        select_case("SELECT", "same", (2, 3, 4), (2, 3, 4), (2, 3, 4), (2, 3, 4)),
        select_case("SELECT", "rank1-condition", (4,), (4, 3, 2), (4, 3, 2), (4, 3, 2)),
        select_case("SELECT", "scalar-condition", (), (3, 5), (3, 5), (3, 5)),
        select_case("SELECT", "int32", (3, 4), (3, 4), (3, 4), (3, 4), I32),
        select_case("SELECT", "int64-rank1", (3,), (3, 4), (3, 4), (3, 4), I64),
        select_case("SELECT", "bool", (5,), (5,), (5,), (5,), BOOL),
        select_case("SELECT", "uint8", (2, 3), (2, 3), (2, 3), (2, 3), U8),
        select_case("SELECT_V2", "same", (2, 3, 4), (2, 3, 4), (2, 3, 4), (2, 3, 4)),
        select_case("SELECT_V2", "condition-last-axis", (4,), (3, 4), (3, 4), (3, 4)),
        select_case("SELECT_V2", "all-broadcast", (2, 1, 4), (1, 3, 1), (3, 4), (2, 3, 4)),
        select_case("SELECT_V2", "scalar-condition", (), (3, 5), (3, 5), (3, 5)),
        select_case("SELECT_V2", "scalar-y", (2, 3), (2, 3), (), (2, 3)),
        select_case("SELECT_V2", "rank5", (2, 1, 3, 1, 2), (1, 2, 1, 4, 1), (2, 2, 3, 4, 2), (2, 2, 3, 4, 2)),
        select_case("SELECT_V2", "int32", (3, 1), (3, 4), (4,), (3, 4), I32),
        select_case("SELECT_V2", "int8", (3, 4), (3, 4), (3, 4), (3, 4), I8),
    ]


def unary_case(op: str, variant: str, gen: Callable, shape=(2, 3, 4, 5), *, out_dtype=None,
               tol: float = 1e-5, **options) -> Case:
    """A one-input case; ``gen(rng, shape)`` draws the input."""
    def make(rng):
        x = gen(rng, shape)
        return [x], shape, out_dtype or x.dtype
    return op_case(op, variant, make, tol=tol, **options)


def _round_inputs(rng, shape):
    """Values whose fraction is far from .5, plus exact halves (ties go to even)."""
    base = rng.integers(-10, 11, size=shape).astype(np.float64)
    frac = rng.choice([0.1, 0.3, 0.7, 0.9, 0.5], size=shape)
    return (base + frac).astype(F32)


def _unary_cases() -> list[Case]:
    wide = _f
    pos = _positive
    cases = [
        unary_case("ABS", "f32", wide), unary_case("ABS", "int32", _int_gen(I32)),
        unary_case("NEG", "f32", wide), unary_case("NEG", "int32", _int_gen(I32)),
        unary_case("NEG", "int64", _int_gen(I64)), unary_case("NEG", "int8", _int_gen(I8, -100, 100)),
        unary_case("SIGN", "f32", _small_floats), unary_case("SIGN", "int32", _int_gen(I32, -2, 2)),
        unary_case("SIGN", "f64", lambda r, s: _small_floats(r, s).astype(np.float64)),
        unary_case("EXP", "f32", wide), unary_case("EXP", "f32-rank1", wide, (17,)),
        unary_case("LOG", "f32", pos), unary_case("SIN", "f32", wide), unary_case("COS", "f32", wide),
        unary_case("SQRT", "f32", pos), unary_case("RSQRT", "f32", pos),
        unary_case("SQUARE", "f32", wide), unary_case("TANH", "f32", wide),
        unary_case("LOGISTIC", "f32", wide), unary_case("LOGISTIC", "f32-large", lambda r, s: normal(r, s, 30.0)),
        unary_case("RELU", "f32", wide), unary_case("RELU6", "f32", wide),
        unary_case("RELU_N1_TO_1", "f32", wide), unary_case("RELU_0_TO_1", "f32", lambda r, s: normal(r, s, 1.0)),
        unary_case("ELU", "f32", wide), unary_case("HARD_SWISH", "f32", wide),
        unary_case("GELU", "f32-exact", wide, approximate=False),
        unary_case("GELU", "f32-approximate", wide, approximate=True),
        unary_case("LEAKY_RELU", "f32-alpha0.2", wide, alpha=0.2),
        unary_case("LEAKY_RELU", "f32-alpha1.5", wide, alpha=1.5),
        unary_case("FLOOR", "f32", _round_inputs), unary_case("CEIL", "f32", _round_inputs),
        unary_case("ROUND", "f32-half-to-even", _round_inputs),
        unary_case("ZEROS_LIKE", "f32", wide), unary_case("ZEROS_LIKE", "int32", _int_gen(I32)),
        unary_case("ZEROS_LIKE", "int64", _int_gen(I64)),
        unary_case("LOGICAL_NOT", "bool", _bools),
        unary_case("TANH", "f32-scalar", wide, ()),
    ]
    return cases


def _prelu_cases() -> list[Case]:
    def prelu(variant, x_shape, a_shape, const=True):
        def make(rng):
            alpha = rng.uniform(0.05, 0.5, size=a_shape).astype(F32)
            return [normal(rng, x_shape), Const(alpha) if const else alpha], x_shape, F32
        return op_case("PRELU", variant, make)
    return [
        prelu("per-channel", (1, 4, 4, 3), (1, 1, 3)),
        prelu("channel-vector", (2, 5, 6), (6,)),
        prelu("full-shape", (2, 3, 4), (2, 3, 4)),
        prelu("single-alpha", (2, 3, 4), (1,)),
        prelu("alpha-input", (1, 4, 4, 3), (1, 1, 3), const=False),
    ]


def _cast_cases() -> list[Case]:
    def cast(variant, gen, out_dtype, shape=(3, 7)):
        def make(rng):
            return [gen(rng, shape)], shape, out_dtype
        return op_case("CAST", variant, make)

    def saturating(rng, shape):
        x = normal(rng, shape, 100.0)
        x.flat[:4] = [3e9, -3e9, 1e20, -1e20]
        return x
    return [
        cast("f32-int32-truncates", _f, I32),
        cast("f32-int32-saturates", saturating, I32),
        cast("f32-int64", _f, I64),
        cast("f32-uint8-saturates", lambda r, s: normal(r, s, 200.0), U8),
        cast("f32-int8-saturates", lambda r, s: normal(r, s, 200.0), I8),
        cast("f32-bool", _small_floats, BOOL),
        cast("f32-float16", _f, np.float16),
        cast("int32-f32", _int_gen(I32, -1000, 1000), F32),
        cast("int32-int8-wraps", _int_gen(I32, -1000, 1000), I8),
        cast("int32-bool", _int_gen(I32, -2, 2), BOOL),
        cast("int64-int32", _int_gen(I64, -10**6, 10**6), I32),
        cast("int64-f32", _int_gen(I64, -10**6, 10**6), F32),
        cast("uint8-f32", _int_gen(U8, 0, 255), F32),
        cast("uint8-int32", _int_gen(U8, 0, 255), I32),
        cast("int8-f32", _int_gen(I8, -128, 127), F32),
        cast("bool-f32", _bools, F32),
        cast("bool-int32", _bools, I32),
        cast("f32-complex64", _f, np.complex64),
        cast("f32-f64", _f, np.float64),
        cast("f64-int32", lambda r, s: normal(r, s, 100.0, np.float64), I32),
        cast("float16-f32", lambda r, s: normal(r, s, 10.0, np.float16), F32),
        cast("int32-uint16-wraps", _int_gen(I32, -1000, 70000), np.uint16),
        cast("f32-uint32-saturates", lambda r, s: normal(r, s, 1e9), np.uint32),
        cast("int16-int32", _int_gen(np.int16, -30000, 30000), I32),
        cast("complex64-f32", lambda r, s: (normal(r, s) + 1j * normal(r, s)).astype(np.complex64), F32),
    ]


def _misc_cases() -> list[Case]:
    def add_n(variant, n, shape, dtype):
        def make(rng):
            gen = _f if dtype == F32 else _int_gen(dtype)
            return [gen(rng, shape) for _ in range(n)], shape, dtype
        return op_case("ADD_N", variant, make)

    def complex_in(rng, shape):
        return (normal(rng, shape) + 1j * normal(rng, shape)).astype(np.complex64)
    return [
        add_n("f32-three", 3, (2, 3, 4), F32), add_n("f32-five", 5, (7,), F32),
        add_n("int32-two", 2, (3, 4), I32),
        unary_case("COMPLEX_ABS", "complex64", complex_in, (2, 3, 4), out_dtype=F32),
        unary_case("REAL", "complex64", complex_in, (2, 3, 4), out_dtype=F32),
        unary_case("IMAG", "complex64", complex_in, (2, 3, 4), out_dtype=F32),
    ]


CASES: list[Case] = (_arithmetic_cases() + _other_binary_cases() + _comparison_cases() + _select_cases()
                     + _unary_cases() + _prelu_cases() + _cast_cases() + _misc_cases())
