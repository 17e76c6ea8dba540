"""litegpu.codegen.pyrender: the formula table (litegpu.codegen.formulas) as numba-Python.

Every UNARY and BINARY entry is rendered over float32 operands and evaluated, element by
element with numpy float32 scalars, against the op's reference (litegpu.ops) over a grid
of values with the extremes, infinities and NaN: to the bit where the formula is the
reference's arithmetic, within the fit's error where it is a rational fit. Numba compiles
the same text to float32 functions that give the same bits. The cpu fusion's templates
(litegpu_cpu.fusion) come from the same table, clamps as Python's min and max.
"""
from __future__ import annotations

import numpy as np
import pytest

from litegpu.codegen import formulas, ir
from litegpu.codegen.pyrender import PyRenderer, operand, py_float, render
from litegpu.ops import get_op

F32 = np.float32
GRID = np.concatenate([
    np.array([0, -0.0, 0.5, -0.5, 1, -1, 2.5, -2.5, 3, -3, 6, -6, 7, -7, 9.5, -9.5, 20, -20, 88, -88,
              1e-30, -1e-30, 1e-45, 3e38, -3e38, np.inf, -np.inf, np.nan], F32),
    np.linspace(-10, 10, 81, dtype=F32)])
# Pairs for the binary ops: every value of a smaller set against every other.
_PAIR_VALUES = np.array([0, -0.0, 0.5, -1.5, 2, -3, 7, 1e-30, 3e38, -3e38, np.inf, -np.inf, np.nan], F32)
PAIRS_A, PAIRS_B = (g.reshape(-1) for g in np.meshgrid(_PAIR_VALUES, _PAIR_VALUES))

ATTRS = {"LEAKY_RELU": {"alpha": 0.2}, "GELU": {"approximate": False},
         "QUANT_SIM": {"in_scale": 0.5, "out_scale": 0.25, "zero_point": 3, "qmin": -128, "qmax": 127},
         "GRID_ADD": {"a_multiplier": 2.0, "b_multiplier": 3.0}, "GRID_MUL": {"scale": 0.5}}
# Rational fits and libm functions: within a few float32 ulp of the reference (the fits'
# own error is below 4.2e-7, see formulas); everything else is the reference's arithmetic.
APPROXIMATE = {"TANH": 5e-7, "GELU": 5e-7, "EXP": 3e-7, "LOG": 3e-7, "SIN": 3e-7, "COS": 3e-7,
               "LOGISTIC": 3e-7, "ELU": 3e-7, "RSQRT": 3e-7, "SQRT": 3e-7, "POW": 3e-7}


def fma(a, b, c) -> np.float32:
    """``a * b + c`` as the ops reference computes HARD_SWISH's: the float32 product is exact
    in float64, the sum rounded to float64 and then float32."""
    return F32(np.float64(a) * np.float64(b) + np.float64(c))


FUNCTIONS = {"fma": "_fma({0}, {1}, {2})"}


def evaluate(source: str, *columns: np.ndarray) -> np.ndarray:
    """``source`` (over ``a`` and ``b``) evaluated per element with numpy float32 scalars."""
    code = compile(source, "<pyrender>", "eval")
    out = np.empty(columns[0].shape, F32)
    with np.errstate(all="ignore"):
        for i in range(out.size):
            value = eval(code, {"np": np, "_fma": fma}, dict(zip("ab", (c[i] for c in columns))))
            assert isinstance(value, np.float32), f"{source} gave a {type(value).__name__}"
            out[i] = value
    return out


def reference(op: str, *columns: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        return get_op(op).reference(list(columns), {"activation": "NONE", **ATTRS.get(op, {})})[0]


def assert_same(op: str, got: np.ndarray, want: np.ndarray) -> None:
    """NaN where the reference has NaN; elsewhere the same values (a zero's sign aside: the
    clamps keep -0.0 where numpy's reference gives 0.0), or within the op's error."""
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{op}: NaN positions")
    keep = ~np.isnan(want)
    if op in APPROXIMATE:
        np.testing.assert_allclose(got[keep], want[keep], rtol=APPROXIMATE[op], atol=APPROXIMATE[op], err_msg=op)
    else:
        np.testing.assert_array_equal(got[keep], want[keep], err_msg=op)


def rendered(op: str) -> str:
    a, b = operand("a"), operand("b")
    attrs = ATTRS.get(op, {})
    expr = formulas.UNARY[op](a, attrs) if op in formulas.UNARY else formulas.BINARY[op](a, b, attrs)
    return render(expr, FUNCTIONS)


# SIN and COS are XNNPACK's (its reduction by 2 pi in two parts): past about 1e19 the
# reduced argument is too large for the fit, and the result is NaN, as LiteRT gives it.
_HUGE_ARGUMENT = {"SIN": 1e19, "COS": 1e19}


@pytest.mark.parametrize("op", sorted(formulas.UNARY))
def test_unary_formula_matches_reference(op):
    got = evaluate(rendered(op), GRID)
    want = reference(op, GRID)
    if op in _HUGE_ARGUMENT:
        huge = np.abs(GRID) > _HUGE_ARGUMENT[op]
        assert huge.any() and np.isnan(got[huge]).all()
        got, want = got[~huge], want[~huge]
    assert_same(op, got, want)


@pytest.mark.parametrize("op", sorted(formulas.BINARY))
def test_binary_formula_matches_reference(op):
    a, b = PAIRS_A, PAIRS_B
    if op == "FLOOR_DIV":   # the reference refuses a zero divisor
        a, b = a[b != 0], b[b != 0]
    if op == "POW":   # numpy's float32 power gives NaN for (-inf, 0.5), powf and the reference inf
        a, b = a[a != -np.inf], b[a != -np.inf]
    assert_same(op, evaluate(rendered(op), a, b), reference(op, a, b))


@pytest.mark.parametrize("swapped", [False, True])
@pytest.mark.parametrize("op", ["MAXIMUM", "MINIMUM"])
def test_max_min_nan_goes_to_the_second_operand(op, swapped):
    attrs = {"swapped": swapped}
    source = render(formulas.BINARY[op](operand("a"), operand("b"), attrs))
    got = evaluate(source, PAIRS_A, PAIRS_B)
    with np.errstate(all="ignore"):
        want = get_op(op).reference([PAIRS_A, PAIRS_B], attrs)[0]
    assert_same(op, got, want)


def test_clamps_are_min_and_max():
    """A clamp's operand is written once: Python's max(x, lo) is numba's ``lo if lo > x else x``."""
    x = operand("{a}")
    assert render(formulas.clamp("RELU", x)) == "max({a}, np.float32(0.0))"
    assert render(formulas.clamp("RELU6", x)) == "min(max({a}, np.float32(0.0)), np.float32(6.0))"
    assert render(formulas.clamp("RELU_N1_TO_1", x)) == "min(max({a}, np.float32(-1.0)), np.float32(1.0))"
    assert render(formulas.clamp("TANH", x)) == "{a}"
    # a choice between two values is Python's conditional, whatever the comparison
    assert render(ir.select(x > operand("y"), x, operand("y"))) == "{a} if {a} > y else y"
    assert render(formulas.UNARY["HARD_SWISH"](x, {}), FUNCTIONS) == \
        "{a} * min(max(_fma({a}, np.float32(0.16666667), np.float32(0.5)), np.float32(0.0)), np.float32(1.0))"


def test_precedence_keeps_the_order_of_operations():
    a, b, c = operand("a"), operand("b"), operand("c")
    assert render(a - (b - c)) == "a - (b - c)"
    assert render((a - b) - c) == "a - b - c"
    assert render(a + (b + c)) == "a + (b + c)"      # another float rounding order
    assert render((a + b) * c) == "(a + b) * c"
    assert render(a * b + c) == "a * b + c"
    assert render(-(a + b)) == "-(a + b)"
    assert render((a < b).ne(c < a)) == "(a < b) != (c < a)"
    assert render(ir.logical_and(a < b, ir.logical_not(c > a))) == "(a < b) & (not c > a)"
    assert render(ir.select(a > b, ir.select(b > c, a, c), b) + c) == "((a if b > c else c) if a > b else b) + c"
    assert render(ir.select(a > b, a, ir.select(b > c, b, c))) == "a if a > b else b if b > c else c"
    assert render(ir.call("rsqrt", a) * b) == "(np.float32(1.0) / np.sqrt(a)) * b"
    i = operand("i", ir.INT)
    assert render(i * -1) == "i * -1"
    assert render(i + 3) == "i + 3"


def test_float_literals_are_float32():
    assert py_float(1 / 6) == "np.float32(0.16666667)"
    assert py_float(0.2) == "np.float32(0.2)"
    assert py_float(-0.0) == "np.float32(-0.0)"
    assert py_float(3e38) == "np.float32(3e+38)"
    assert py_float(np.inf) == "np.float32(np.inf)" and py_float(-np.inf) == "np.float32(-np.inf)"
    assert py_float(np.nan) == "np.float32(np.nan)"
    for value in (1 / 6, 0.2, 1e-45, 3.4028235e38, -7.1e-12):
        assert eval(py_float(value), {"np": np}) == F32(value)


def test_unrenderable_things_raise_type_error():
    x = operand("x")
    with pytest.raises(TypeError, match="no numba rendering of fma"):
        render(ir.call("fma", x, 2.0, 1.0))          # the caller spells fma
    with pytest.raises(TypeError, match="scalars"):
        render(ir.vector(ir.REAL4, x))
    with pytest.raises(TypeError, match="saturating"):
        render(x.cast(ir.INT, saturate=True))
    i = operand("i", ir.INT)
    with pytest.raises(TypeError, match="int /"):   # C truncates, Python floors (and int / is a float)
        render(i / 2)
    with pytest.raises(TypeError, match="int %"):
        render(i % 2)


def test_numba_compiles_float32_functions_with_the_same_bits():
    """The rendered text in numba: float32 in, float32 out (no float64 promotion), and the
    values of the numpy evaluation (bit for bit where no libm function is involved)."""
    numba = pytest.importorskip("numba")
    from litegpu_cpu.kernels.mathfn import fma32

    renderer = PyRenderer({"fma": "_fma({0}, {1}, {2})"})
    ops = ["ABS", "NEG", "SQUARE", "SQRT", "RSQRT", "HARD_SWISH", "LEAKY_RELU", "ELU", "FLOOR", "CEIL", "RELU",
           "RELU6", "RELU_N1_TO_1", "RELU_0_TO_1", "ADD", "SUB", "MUL", "DIV", "MAXIMUM", "MINIMUM",
           "SQUARED_DIFFERENCE", "PRELU"]
    a, b = np.concatenate([GRID, PAIRS_A]), np.concatenate([GRID[::-1], PAIRS_B])
    for op in ops:
        x, y = operand("a"), operand("b")
        attrs = ATTRS.get(op, {})
        expr = formulas.UNARY[op](x, attrs) if op in formulas.UNARY else formulas.BINARY[op](x, y, attrs)
        source = renderer.expr(expr)
        namespace = {"np": np, "_fma": fma32}
        exec(f"def g(a, b):\n    return {source}\n", namespace)
        # error_model="numpy" as the cpu's task functions: x / 0 is inf, not an exception
        scalar = numba.njit(error_model="numpy")(namespace["g"])
        got = np.array([scalar(x, y) for x, y in zip(a, b)], F32)
        assert [s.return_type for s in scalar.nopython_signatures] == [numba.types.float32], (op, source)
        want = evaluate(source, a, b) if op != "HARD_SWISH" else evaluate(rendered(op), a, b)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=op)
        keep = ~np.isnan(want)
        if op in APPROXIMATE:
            np.testing.assert_allclose(got[keep], want[keep], rtol=APPROXIMATE[op], err_msg=op)
        else:
            np.testing.assert_array_equal(got[keep].view(np.uint32), want[keep].view(np.uint32), err_msg=op)


def test_cpu_fusion_takes_the_table():
    """The cpu fusion's float templates are the table's renderings (LOGISTIC and TANH its own)."""
    fusion = pytest.importorskip("litegpu_cpu.fusion")
    assert fusion._formula("RELU6", "f", 0.0, False) == "min(max({a}, np.float32(0.0)), np.float32(6.0))"
    assert fusion._formula("HARD_SWISH", "f", 0.0, False) == \
        "{a} * min(max(_fma32({a}, np.float32(0.16666667), np.float32(0.5)), np.float32(0.0)), np.float32(1.0))"
    assert fusion._formula("MAXIMUM", "f", 0.0, True) == "{b} if {b} > {a} else {a}"
    assert fusion._formula("EXP", "f", 0.0, False) == "_exp32({a})"
    assert fusion._formula("LOGISTIC", "f", 0.0, False) == "_sigmoid32({a})"
    assert fusion._clamp("RELU_N1_TO_1") == "min(max({a}, np.float32(-1.0)), np.float32(1.0))"
