"""Integer references of litegpu.ops.quantized_math (SUM, ABS, NEG, SQRT, RSQRT, DIV,
LOG_SOFTMAX), int16 MEAN, int16 power-of-two ADD/SUB and requantizing REDUCE_MAX/MIN,
against LiteRT's default interpreter.

Each model is built with ModelBuilder and run by litegpu's cpu backend (integer kernels
set aside: the op's integer reference runs) and by LiteRT's default interpreter (XNNPACK
for 8-bit SUM and REDUCE_MAX/MIN, builtin kernels for the rest). Unary ops are fed every
value of their input type they accept; binary ops and reductions random tensors over the
whole range. Results must agree exactly: no element may differ.

What LiteRT refuses is refused here at compile time, naming the op; what it fails on at
invoke (data-dependent: SQRT of a negative value, DIV by the zero point) fails here when
run, with an ExecutionError.
"""
from __future__ import annotations

import numpy as np
import pytest

import litegpu
from litegpu.errors import ExecutionError, ModelFormatError, UnsupportedError
from litegpu.testing.builder import ModelBuilder

from ai_edge_litert.interpreter import Interpreter as LiteRT  # a test dependency: never skipped
# The integer references alone (autouse fixture), compared element by element.
from test_ops_quantized_act import check, references_only  # noqa: E402,F401

RNG_SEED = 31
I8, U8, I16 = np.int8, np.uint8, np.int16


def random_q(rng, dtype, shape) -> np.ndarray:
    """Random values over the whole range of ``dtype``."""
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


def values_from(dtype, low: int) -> np.ndarray:
    """Every value of an integer type from ``low`` up."""
    return np.arange(low, np.iinfo(dtype).max + 1).astype(dtype)


def unary_model(op: str, dtype, in_q: tuple, out_q: tuple, n: int, **options) -> bytes:
    """A one-op model on a vector of ``n`` (``in_q``/``out_q``: scale, zero point)."""
    b = ModelBuilder()
    x = b.input("x", (n,), dtype, scale=[in_q[0]], zero_point=[in_q[1]])
    y = b.tensor("y", (n,), dtype, scale=[out_q[0]], zero_point=[out_q[1]])
    b.op(op, [x], [y], **options)
    b.output(y)
    return b.build()


def check_unary(op: str, dtype, in_q: tuple, out_q: tuple, low: int | None = None) -> None:
    """``op`` on every value of ``dtype`` from ``low`` (default: the type's minimum)."""
    x = values_from(dtype, np.iinfo(dtype).min if low is None else low)
    check(unary_model(op, dtype, in_q, out_q, x.size), [x])


def reduce_model(op: str, dtype, shape: tuple, axes: list, keep: bool, in_q: tuple, out_q: tuple,
                 const_axes: bool = True) -> bytes:
    b = ModelBuilder()
    x = b.input("x", shape, dtype, scale=[in_q[0]], zero_point=[in_q[1]])
    axes_t = b.const("axes", np.array(axes, np.int32)) if const_axes else b.input("axes", (len(axes),), np.int32)
    out_shape = tuple((1 if i in axes else n) for i, n in enumerate(shape) if keep or i not in axes)
    y = b.tensor("y", out_shape, dtype, scale=[out_q[0]], zero_point=[out_q[1]])
    b.op(op, [x, axes_t], [y], keep_dims=keep)
    b.output(y)
    return b.build()


def binary_model(op: str, dtype, a_shape: tuple, b_shape: tuple, qs: list, **options) -> bytes:
    """``op`` of two quantized inputs (``qs``: scale, zero point of a, b, output)."""
    b = ModelBuilder()
    x = b.input("x", a_shape, dtype, scale=[qs[0][0]], zero_point=[qs[0][1]])
    z = b.input("z", b_shape, dtype, scale=[qs[1][0]], zero_point=[qs[1][1]])
    y = b.tensor("y", tuple(np.broadcast_shapes(a_shape, b_shape)), dtype, scale=[qs[2][0]], zero_point=[qs[2][1]])
    b.op(op, [x, z], [y], **options)
    b.output(y)
    return b.build()


def compile_ours(model: bytes) -> None:
    litegpu.Interpreter(model_content=model).allocate_tensors()


def litert_fails(model: bytes, inputs: list[np.ndarray] | None = None) -> bool:
    """True when LiteRT's default interpreter refuses ``model``: at prepare, or at invoke
    on ``inputs`` (default: zeros, for refusals that wait for the first invoke)."""
    try:
        interp = LiteRT(model_content=model)
        interp.allocate_tensors()
        details = interp.get_input_details()
        if inputs is None:
            inputs = [np.zeros(d["shape"], d["dtype"]) for d in details]
        for d, x in zip(details, inputs):
            interp.set_tensor(d["index"], x)
        interp.invoke()
    except (RuntimeError, ValueError):
        return True
    return False


# -- SUM, MEAN -----------------------------------------------------------------------------------------


REDUCE_QUANT = {  # (input, output) quantizations: same, and a rescaling one
    I8: [((0.05, -3), (0.05, -3)), ((0.05, -3), (0.4, 7)), ((0.02, 100), (0.01, -128))],
    U8: [((0.05, 120), (0.05, 120)), ((0.05, 120), (0.3, 100)), ((0.01, 0), (0.08, 255))],
    I16: [((0.001, 0), (0.001, 0)), ((0.001, 0), (0.004, 0)), ((0.0002, 0), (0.01, 0))]}
REDUCE_AXES = [((3, 7, 5), [1], False), ((3, 7, 5), [0, 2], True), ((2, 5, 6, 3), [1, 2], True),
               ((4, 9), [-1], False), ((3, 7, 5), [0, 1, 2], False)]


@pytest.mark.parametrize("op", ["SUM", "MEAN"])
@pytest.mark.parametrize("dtype", [I8, U8, I16], ids=["int8", "uint8", "int16"])
@pytest.mark.parametrize("quant", [0, 1, 2], ids=["same", "rescale", "other"])
@pytest.mark.parametrize("shape,axes,keep", REDUCE_AXES, ids=["mid", "outer-keep", "hw-keep", "last", "all"])
def test_sum_and_mean(op: str, dtype, quant: int, shape: tuple, axes: list, keep: bool) -> None:
    rng = np.random.default_rng(RNG_SEED)
    in_q, out_q = REDUCE_QUANT[dtype][quant]
    check(reduce_model(op, dtype, shape, axes, keep, in_q, out_q), [random_q(rng, dtype, shape)])


@pytest.mark.parametrize("dtype", [I8, U8], ids=["int8", "uint8"])
def test_sum_with_runtime_axes_runs_tflites_kernel(dtype) -> None:
    # XNNPACK takes constant axes only: these run TFLite's float32 formula instead.
    rng = np.random.default_rng(RNG_SEED)
    in_q, out_q = REDUCE_QUANT[dtype][1]
    model = reduce_model("SUM", dtype, (3, 7, 5), [1], False, in_q, out_q, const_axes=False)
    check(model, [random_q(rng, dtype, (3, 7, 5)), np.array([1], np.int32)])


def test_sum_of_many_int16_values() -> None:
    # Sums far past float32's 2^24 (rounded when converted), and saturating.
    rng = np.random.default_rng(RNG_SEED)
    check(reduce_model("SUM", I16, (2, 3000), [1], False, (0.001, 0), (0.5, 0)), [random_q(rng, I16, (2, 3000))])
    check(reduce_model("SUM", I16, (2, 3000), [1], False, (0.001, 0), (1.0, 0)),
          [np.full((2, 3000), 32000, np.int16)])


# -- REDUCE_MAX, REDUCE_MIN with another output quantization --------------------------------------------


@pytest.mark.parametrize("op", ["REDUCE_MAX", "REDUCE_MIN"])
@pytest.mark.parametrize("dtype", [I8, U8], ids=["int8", "uint8"])
@pytest.mark.parametrize("shape,axes,keep", REDUCE_AXES[:3], ids=["mid", "outer-keep", "hw-keep"])
def test_requantizing_reduce_max_min(op: str, dtype, shape: tuple, axes: list, keep: bool) -> None:
    # LiteRT's XNNPACK returns the extreme stored integer as it is (no rescaling).
    rng = np.random.default_rng(RNG_SEED)
    in_q, out_q = REDUCE_QUANT[dtype][1]
    check(reduce_model(op, dtype, shape, axes, keep, in_q, out_q), [random_q(rng, dtype, shape)])


# -- ABS, NEG, SQRT, RSQRT -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,in_q,out_q", [
    (I8, (0.05, -3), (0.05, -3)), (I8, (0.05, -3), (0.05, 40)), (I8, (0.05, 10), (0.03, -128)),
    (I8, (0.02, 0), (0.1, 0)), (I16, (0.001, 0), (0.001, 0)), (I16, (0.001, 0), (0.0007, 0)),
    (I16, (0.0003, 0), (0.002, 0))])
def test_abs(dtype, in_q: tuple, out_q: tuple) -> None:
    check_unary("ABS", dtype, in_q, out_q)


@pytest.mark.parametrize("dtype,in_q,out_q", [
    (I8, (0.05, 0), (0.05, 0)), (I8, (0.05, -3), (0.02, 9)), (I16, (0.001, 0), (0.001, 0))])
def test_neg(dtype, in_q: tuple, out_q: tuple) -> None:
    check_unary("NEG", dtype, in_q, out_q)


@pytest.mark.parametrize("dtype,in_q,out_q", [
    (I8, (0.05, -3), (0.02, -128)), (I8, (0.1, -128), (0.05, -100)), (I8, (0.01, 20), (0.004, 0)),
    (I16, (0.001, 0), (0.0002, 0)), (I16, (0.0001, 0), (0.00006, 0))])
def test_sqrt(dtype, in_q: tuple, out_q: tuple) -> None:
    check_unary("SQRT", dtype, in_q, out_q, low=in_q[1])        # non-negative reals only


@pytest.mark.parametrize("dtype,in_q,out_q", [
    (I8, (0.05, -3), (0.02, -128)), (I8, (0.1, -128), (0.01, -128)), (I8, (0.01, 20), (0.1, 0)),
    (I8, (1.5, -100), (0.003, -128)), (I16, (0.001, 0), (0.001, 0)), (I16, (0.01, 0), (0.0001, 0))])
def test_rsqrt(dtype, in_q: tuple, out_q: tuple) -> None:
    check_unary("RSQRT", dtype, in_q, out_q, low=in_q[1])       # zero and positive reals only


# -- DIV ------------------------------------------------------------------------------------------------


DIV_QUANT = {I8: [[(0.05, -3), (0.03, 7), (0.04, 2)], [(0.02, 100), (0.1, -20), (0.5, -128)],
                  [(0.1, 0), (0.01, 0), (0.8, 5)]],
             U8: [[(0.05, 128), (0.03, 120), (0.04, 125)], [(0.02, 3), (0.1, 250), (0.3, 0)],
                  [(0.1, 128), (0.01, 128), (0.8, 128)]],
             I16: [[(0.0005, 0), (0.0003, 0), (0.004, 0)], [(0.001, 0), (0.002, 0), (0.0001, 0)],
                   [(0.0002, 0), (0.0001, 0), (0.0005, 0)]]}
SHAPES = [((3, 4, 5), (3, 4, 5)), ((3, 4, 5), (1, 4, 1)), ((5,), (3, 4, 5))]


@pytest.mark.parametrize("dtype", [I8, U8, I16], ids=["int8", "uint8", "int16"])
@pytest.mark.parametrize("quant", [0, 1, 2])
@pytest.mark.parametrize("shapes", SHAPES, ids=["same", "broadcast", "rank"])
@pytest.mark.parametrize("act", ["NONE", "RELU"])
def test_div(dtype, quant: int, shapes: tuple, act: str) -> None:
    rng = np.random.default_rng(RNG_SEED)
    qs = DIV_QUANT[dtype][quant]
    a, b = random_q(rng, dtype, shapes[0]), random_q(rng, dtype, shapes[1])
    b[b == qs[1][1]] = qs[1][1] + 1         # never the zero point: LiteRT fails on a zero divisor
    check(binary_model("DIV", dtype, *shapes, qs, fused_activation_function=act), [a, b])


@pytest.mark.parametrize("dtype", [I8, U8], ids=["int8", "uint8"])
def test_div_of_every_pair(dtype) -> None:
    # All 256 x 255 dividend/divisor pairs (the divisor's zero point left out).
    qs = DIV_QUANT[dtype][0]
    a = np.repeat(values_from(dtype, np.iinfo(dtype).min), 255)
    divisors = values_from(dtype, np.iinfo(dtype).min)
    b = np.tile(divisors[divisors != qs[1][1]], 256)
    check(binary_model("DIV", dtype, a.shape, b.shape, qs), [a, b])


# -- LOG_SOFTMAX ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype,in_q", [(I8, (0.1, -3)), (I8, (0.02, 50)), (I8, (0.5, 0)), (U8, (0.08, 128)),
                                        (U8, (0.03, 7)), (U8, (0.3, 200))])
@pytest.mark.parametrize("shape", [(6, 10), (2, 3, 300), (4, 1)], ids=["rows10", "rows300", "rows1"])
def test_log_softmax(dtype, in_q: tuple, shape: tuple) -> None:
    rng = np.random.default_rng(RNG_SEED)
    out_q = (16 / 256, 127 if dtype == I8 else 255)
    b = ModelBuilder()
    x = b.input("x", shape, dtype, scale=[in_q[0]], zero_point=[in_q[1]])
    y = b.tensor("y", shape, dtype, scale=[out_q[0]], zero_point=[out_q[1]])
    b.op("LOG_SOFTMAX", [x], [y])
    b.output(y)
    check(b.build(), [random_q(rng, dtype, shape)])


# -- ADD, SUB: int16 with power-of-two scales --------------------------------------------------------------


@pytest.mark.parametrize("op", ["ADD", "SUB"])
@pytest.mark.parametrize("qs", [
    [(2 ** -10, 0), (2 ** -12, 0), (2 ** -10, 0)], [(2 ** -13, 0), (2 ** -11, 0), (2 ** -11, 0)],
    [(2 ** -12, 0), (2 ** -12, 0), (2 ** -12, 0)], [(2 ** -10 * 1.0004, 0), (2 ** -15, 0), (2 ** -10, 0)]],
    ids=["b-finer", "a-finer", "same", "near-pot"])
@pytest.mark.parametrize("act", ["NONE", "RELU6"])
def test_int16_pot_add_sub(op: str, qs: list, act: str) -> None:
    rng = np.random.default_rng(RNG_SEED)
    shape = (3, 4, 5)
    check(binary_model(op, I16, shape, shape, qs, pot_scale_int16=True, fused_activation_function=act,
                       version=3), [random_q(rng, I16, shape), random_q(rng, I16, shape)])


def test_int16_pot_sub_broadcasts() -> None:
    rng = np.random.default_rng(RNG_SEED)
    qs = [(2 ** -10, 0), (2 ** -12, 0), (2 ** -10, 0)]
    check(binary_model("SUB", I16, (3, 4, 5), (1, 4, 1), qs, pot_scale_int16=True, version=3),
          [random_q(rng, I16, (3, 4, 5)), random_q(rng, I16, (1, 4, 1))])


# -- what LiteRT refuses is refused at compile time ----------------------------------------------------------


def _refused_models() -> list:
    """(op, model) pairs LiteRT refuses (at prepare, or at invoke whatever the data)."""
    pot = [(2 ** -10, 0), (2 ** -10, 0), (2 ** -12, 0)]       # the output finer than both inputs
    return [
        ("SUM", reduce_model("SUM", I16, (3, 7), [1], False, (0.001, 3), (0.002, 0))),
        ("MEAN", reduce_model("MEAN", I16, (3, 7), [1], False, (0.001, 0), (0.002, -5))),
        ("REDUCE_MAX", reduce_model("REDUCE_MAX", I16, (3, 7), [1], False, (0.001, 0), (0.002, 0))),
        ("REDUCE_MIN", reduce_model("REDUCE_MIN", I16, (3, 7), [1], False, (0.001, 0), (0.002, 0))),
        ("ABS", unary_model("ABS", U8, (0.01, 128), (0.01, 128), 8)),
        ("NEG", unary_model("NEG", U8, (0.01, 128), (0.01, 128), 8)),
        ("SQRT", unary_model("SQRT", U8, (0.01, 0), (0.01, 0), 8)),
        ("RSQRT", unary_model("RSQRT", U8, (0.01, 0), (0.01, 0), 8)),
        ("RSQRT", unary_model("RSQRT", I16, (0.01, 4), (0.01, 0), 8)),
        ("LOG_SOFTMAX", unary_model("LOG_SOFTMAX", I16, (0.001, 0), (0.001, 0), 8)),
        ("LOG_SOFTMAX", unary_model("LOG_SOFTMAX", I8, (0.1, 0), (0.1, 127), 8)),
        ("ADD", binary_model("ADD", I16, (4,), (4,), pot, pot_scale_int16=True, version=3)),
        ("SUB", binary_model("SUB", I16, (4,), (4,), pot, pot_scale_int16=True, version=3)),
    ]


@pytest.mark.parametrize("case", range(len(_refused_models())))
def test_what_litert_refuses_is_refused(case: int) -> None:
    op, model = _refused_models()[case]
    assert litert_fails(model), f"LiteRT accepts the {op} model"
    with pytest.raises((UnsupportedError, ModelFormatError), match=rf"node 0 \({op}\)"):
        compile_ours(model)


@pytest.mark.parametrize("op", ["REDUCE_MAX", "REDUCE_MIN"])
def test_requantizing_reduce_max_min_over_runtime_axes_is_refused(op: str) -> None:
    # XNNPACK takes constant axes only; TFLite's kernel refuses other output quantization.
    model = reduce_model(op, I8, (3, 7), [1], False, (0.05, -3), (0.2, 5), const_axes=False)
    assert litert_fails(model, [np.zeros((3, 7), I8), np.array([1], np.int32)])
    with pytest.raises(UnsupportedError, match=rf"node 0 \({op}\): input and output quantization differ"):
        compile_ours(model)


def test_div_of_mixed_types_is_refused() -> None:
    b = ModelBuilder()
    x = b.input("x", (4,), I8, scale=[0.1], zero_point=[0])
    z = b.input("z", (4,), U8, scale=[0.1], zero_point=[128])
    y = b.tensor("y", (4,), I8, scale=[0.1], zero_point=[0])
    b.op("DIV", [x, z], [y])
    b.output(y)
    model = b.build()
    assert litert_fails(model)
    with pytest.raises((UnsupportedError, ModelFormatError), match=r"node 0 \(DIV\)"):
        compile_ours(model)


def test_int16_pot_add_with_broadcasting_is_refused() -> None:
    # LiteRT's power-of-two kernel does not broadcast (it reads past the smaller input, and
    # crashes the process): refused, and not run on LiteRT here.
    qs = [(2 ** -10, 0), (2 ** -12, 0), (2 ** -10, 0)]
    model = binary_model("ADD", I16, (3, 4, 5), (1, 4, 1), qs, pot_scale_int16=True, version=3)
    with pytest.raises(UnsupportedError, match=r"node 0 \(ADD\).*broadcasting"):
        compile_ours(model)


# -- what LiteRT fails on when invoked fails when run ----------------------------------------------------------


@pytest.mark.parametrize("op,dtype,x,in_q", [
    ("SQRT", I8, [3, -4, 9], (0.1, 0)), ("SQRT", I16, [0, -1], (0.001, 0)),
    ("RSQRT", I8, [5, 2, 1], (0.1, 2)), ("RSQRT", I16, [1, -3], (0.001, 0))])
def test_negative_roots_fail_when_run(op: str, dtype, x: list, in_q: tuple) -> None:
    model = unary_model(op, dtype, in_q, (0.01, 0), len(x))
    inputs = [np.array(x, dtype)]
    assert litert_fails(model, inputs)
    interp = litegpu.Interpreter(model_content=model)
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], inputs[0])
    with pytest.raises(ExecutionError, match=op):
        interp.invoke()


def test_div_by_the_zero_point_fails_when_run() -> None:
    qs = DIV_QUANT[I8][0]
    model = binary_model("DIV", I8, (3,), (3,), qs)
    inputs = [np.array([1, 2, 3], I8), np.array([1, qs[1][1], 3], I8)]
    assert litert_fails(model, inputs)
    interp = litegpu.Interpreter(model_content=model)
    interp.allocate_tensors()
    for d, x in zip(interp.get_input_details(), inputs):
        interp.set_tensor(d["index"], x)
    with pytest.raises(ExecutionError, match="DIV"):
        interp.invoke()
