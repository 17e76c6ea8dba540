"""The float view (litegpu.float_view) of 16x8 models' requantizing ops on opencl against
LiteRT's integers: int16 SOFTMAX (its exponential table stops at -10, so logits spread
wider than that are not a float softmax: nasnet_mobile 16x8 was 322 output quanta off),
ADD / SUB / MUL (TFLite's fixed point), AVERAGE_POOL_2D and MEAN (rounded half away from
zero), and a RELU onto another scale; with the exactness of the two formulas the view
adds for them (INV_FLOOR_POW2, GRID_MUL_ROUND). The 8-bit average pool rounds as the int16
one does, its codes' mean with the zero point.

LiteRT runs 16x8 models on TFLite's reference kernels; every case here is all on the GPU
and equals LiteRT on every element, in F32 and F32_F16 storage."""
from __future__ import annotations

import numpy as np
import pytest

import litegpu
from litegpu.float_view import float_view, grid_mul_round, inv_floor_pow2
from litegpu.testing.builder import ModelBuilder

from ai_edge_litert.interpreter import Interpreter as LiteRT

I16 = np.int16
PRECISIONS = pytest.mark.parametrize("fp16", [False, True], ids=["F32", "F32_F16"])


def act(b: ModelBuilder, name: str, shape, scale: float) -> int:
    return b.tensor(name, shape, I16, scale=[scale], zero_point=[0])


def random16(rng, shape) -> np.ndarray:
    """int16 values over the whole range, the extremes included."""
    x = rng.integers(-32768, 32768, shape).astype(I16)
    x.reshape(-1)[:4] = [-32768, 32767, 0, -1][:x.size]
    return x


def run(model: bytes, inputs: list[np.ndarray], delegate=None) -> tuple[list[np.ndarray], object]:
    """Outputs of ``model`` on LiteRT (``delegate`` None) or on litegpu with ``delegate``."""
    if delegate is None:
        interp = LiteRT(model_content=model)
    else:
        interp = litegpu.Interpreter(model_content=model, experimental_delegates=[delegate])
    interp.allocate_tensors()
    for d, x in zip(interp.get_input_details(), inputs):
        interp.set_tensor(d["index"], x)
    interp.invoke()
    report = interp.get_delegation_report() if delegate is not None else None
    return [interp.get_tensor(d["index"]).copy() for d in interp.get_output_details()], report


def assert_opencl_is_litert(model: bytes, inputs: list[np.ndarray], fp16: bool) -> list[np.ndarray]:
    """Every node on opencl, every output element LiteRT's; LiteRT's outputs."""
    want, _ = run(model, inputs)
    got, report = run(model, inputs, litegpu.load_delegate("opencl", {"precision_loss_allowed": fp16}))
    assert report.nodes_on("cpu") == 0
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        differ = np.flatnonzero(g != w)
        assert differ.size == 0, (f"{differ.size} of {g.size} differ, first at {differ[:5].tolist()}: ours "
                                  f"{g.reshape(-1)[differ[:5]].tolist()}, LiteRT {w.reshape(-1)[differ[:5]].tolist()}")
    return want


def ops_of(model: bytes) -> list[str]:
    return [n.op for n in float_view(litegpu.load_model(model)).subgraphs[0].nodes]


# -- SOFTMAX ---------------------------------------------------------------------------------------


def softmax_model() -> bytes:
    """Logits over +-23 (a classifier's 1000, nasnet_mobile's spread), over +-16 with beta
    0.5, a short row and rows of one value."""
    b = ModelBuilder()
    outs = []
    for name, shape, scale, beta in (("wide", (2, 1000), 0.0007, 1.0), ("half", (3, 12), 2.0 ** -11, 0.5),
                                     ("one", (4, 1), 0.001, 1.0)):
        x = b.input(name, shape, I16, scale=[scale], zero_point=[0])
        y = act(b, f"{name}_p", shape, 1 / 32768)
        b.op("SOFTMAX", [x], [y], beta=beta)
        outs.append(y)
    b.output(*outs)
    return b.build()


@PRECISIONS
def test_softmax_spread_past_the_exp_table_is_litert_on_opencl(opencl, fp16: bool) -> None:
    rng = np.random.default_rng(1)
    model = softmax_model()
    wide = np.clip(rng.normal(0, 7000, (2, 1000)), -32768, 32767).astype(I16)    # logits of std 4.9
    inputs = [wide, random16(rng, (3, 12)), random16(rng, (4, 1))]
    want = assert_opencl_is_litert(model, inputs, fp16)
    # What the float softmax of the real values gives is far off (860 quanta): most logits
    # lie more than 10 below the maximum, where LiteRT's exponential is exp(-10).
    logits = wide.astype(np.float64) * np.float32(0.0007)
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    assert np.abs(np.rint(e / e.sum(axis=-1, keepdims=True) * 32768) - want[0]).max() > 100
    assert "SOFTMAX" not in ops_of(model)


def test_softmax_formulas_are_exact_on_their_domain() -> None:
    """INV_FLOOR_POW2 at and around every power of two; GRID_MUL_ROUND (in float32, as the
    kernels compute it) equals ``floor(a * b + 0.5)`` for integers ``|a| < 2^15`` and
    ``b`` of 15 significant bits times 2^-s, s up to 23, ties included."""
    powers = 2.0 ** np.arange(32)
    x = np.concatenate([powers, powers[1:] - 1, powers + 1, [0.0, 0.5, np.nan, np.inf]]).astype(np.float32)
    x = x[np.isnan(x) | (x < 2.0 ** 32)]
    want = np.where(x >= 1, 2.0 ** -np.floor(np.log2(np.where(x >= 1, x.astype(np.float64), 1))), 1)
    np.testing.assert_array_equal(inv_floor_pow2(x), np.where(np.isinf(x), 2.0 ** -31, want).astype(np.float32))

    rng = np.random.default_rng(2)
    a = rng.integers(-(1 << 15) + 1, 1 << 15, 200_000)
    k = rng.integers(0, 1 << 15, a.size)
    s = rng.integers(7, 24, a.size)
    b = k * 2.0 ** -s
    a[:1000], b[:1000] = 1, (2 * rng.integers(0, 1 << 14, 1000) + 1) * 2.0 ** -1   # ties: k / 2
    got = grid_mul_round(a.astype(np.float32), b.astype(np.float32))
    np.testing.assert_array_equal(got, np.floor(a * b + 0.5))


# -- ADD, SUB, MUL ---------------------------------------------------------------------------------


def binary_model(op: str, a_shape, b_shape, qs, act_name: str) -> bytes:
    b = ModelBuilder()
    x = b.input("x", a_shape, I16, scale=[qs[0]], zero_point=[0])
    z = b.input("z", b_shape, I16, scale=[qs[1]], zero_point=[0])
    y = act(b, "y", a_shape, qs[2])
    options = {"version": 3, "pot_scale_int16": False} if op != "MUL" else {}
    b.op(op, [x, z], [y], fused_activation_function=act_name, **options)
    b.output(y)
    return b.build()


SHAPE = (1, 32, 64, 16)    # enough elements for the real-valued view to miss a few (1 to 4 in 10000)
BINARY_CASES = [
    ("ADD", SHAPE, SHAPE, (0.0007, 0.0003, 0.0006), "NONE"),             # LiteRT's vector loop
    ("ADD", SHAPE, (1, 1, 1, 16), (0.0002, 0.0009, 0.0012), "RELU"),     # broadcast: its scalar code
    ("SUB", SHAPE, SHAPE, (0.0003, 0.0007, 0.0006), "RELU"),
    ("MUL", SHAPE, SHAPE, (0.0007, 0.0003, 0.00001), "NONE"),
    ("MUL", SHAPE, (16,), (0.0002, 0.0009, 0.0001), "RELU6"),
]


@PRECISIONS
@pytest.mark.parametrize("op,a_shape,b_shape,qs,act_name", BINARY_CASES,
                         ids=["add-same", "add-broadcast", "sub", "mul-same", "mul-broadcast"])
def test_int16_add_sub_mul_are_litert_on_opencl(opencl, op, a_shape, b_shape, qs, act_name, fp16: bool) -> None:
    rng = np.random.default_rng(3)
    model = binary_model(op, a_shape, b_shape, qs, act_name)
    assert "GRID_REQUANT16" in ops_of(model)
    assert_opencl_is_litert(model, [random16(rng, a_shape), random16(rng, b_shape)], fp16)


@PRECISIONS
def test_int16_add_of_a_constant_is_litert_on_opencl(opencl, fp16: bool) -> None:
    """A batch norm's ADD of a constant vector (nasnet_mobile's): the finer constant's
    scaled values (up to 2^29) are looked up when the view is made, constants kept float32
    in half storage."""
    rng = np.random.default_rng(6)
    b = ModelBuilder()
    x = b.input("x", SHAPE, I16, scale=[0.0005], zero_point=[0])
    c = b.const("c", random16(rng, (16,)), scale=[0.00006], zero_point=[0])
    y = act(b, "y", SHAPE, 0.0005)
    b.op("ADD", [x, c], [y], version=3, pot_scale_int16=False)
    b.output(y)
    assert_opencl_is_litert(b.build(), [random16(rng, SHAPE)], fp16)


def test_int16_add_after_litert_vector_loop_within_a_quantum(opencl) -> None:
    """The last ``size % 16`` outputs of a same-shape ADD, where LiteRT's scalar code rounds
    apart from its vector loop about once in 5000, take the vector arithmetic here."""
    rng = np.random.default_rng(4)
    shape = (1, 9, 9, 5)     # 405 = 25 * 16 + 5
    model = binary_model("ADD", shape, shape, (0.0007, 0.0003, 0.0006), "NONE")
    inputs = [random16(rng, shape), random16(rng, shape)]
    (want,), _ = run(model, inputs)
    (got,), report = run(model, inputs, litegpu.load_delegate("opencl"))
    assert report.nodes_on("cpu") == 0
    diff = np.abs(got.astype(np.int64) - want).reshape(-1)
    assert diff[:400].max() == 0 and diff.max() <= 1


# -- AVERAGE_POOL_2D, MEAN, RELU onto another scale ---------------------------------------------------


@PRECISIONS
def test_int16_average_pool_mean_and_requantizing_relu_are_litert_on_opencl(opencl, fp16: bool) -> None:
    """A SAME 3x3 pool (4, 6 or 9 real pixels: ties at the borders) with its RELU, a global
    MEAN of it, and RELU / RELU6 onto finer scales."""
    b = ModelBuilder()
    x = b.input("x", (1, 7, 7, 8), I16, scale=[0.0003], zero_point=[0])
    pooled = act(b, "pooled", (1, 7, 7, 8), 0.0003)
    b.op("AVERAGE_POOL_2D", [x], [pooled], padding="SAME", stride_h=1, stride_w=1, filter_height=3, filter_width=3,
         fused_activation_function="RELU")
    mean = act(b, "mean", (1, 8), 0.0001)
    b.op("MEAN", [pooled, b.const("axes", np.array([1, 2], np.int32))], [mean], keep_dims=False)
    relu = act(b, "relu", (1, 7, 7, 8), 0.0002)
    b.op("RELU", [x], [relu])
    relu6 = act(b, "relu6", (1, 7, 7, 8), 0.00007)
    b.op("RELU6", [x], [relu6])
    b.output(pooled, mean, relu, relu6)
    model = b.build()
    ops = ops_of(model)
    assert ops.count("QUANT_LUT") == 2 and "GRID_REQUANT16" in ops
    rng = np.random.default_rng(5)
    assert_opencl_is_litert(model, [random16(rng, (1, 7, 7, 8))], fp16)


@pytest.mark.parametrize("dtype,zero_point", [(np.int8, -3), (np.uint8, 131), (np.int8, 0)])
def test_8bit_average_pool_rounds_codes_half_away_on_opencl(opencl, dtype, zero_point: int) -> None:
    """LiteRT's 8-bit AVERAGE_POOL_2D (its builtin kernel) rounds the mean of the codes, zero
    point included, half away from zero: a SAME 3x3 pool (4, 6 or 9 real pixels: ties) on
    every node of opencl, every element LiteRT's (the real-valued view was a quantum off on
    4 % of them, and NASNet's int8 float view 12 quanta off at its output)."""
    b = ModelBuilder()
    x = b.input("x", (1, 9, 9, 16), dtype, scale=[0.05], zero_point=[zero_point])
    y = b.tensor("y", (1, 9, 9, 16), dtype, scale=[0.05], zero_point=[zero_point])
    b.op("AVERAGE_POOL_2D", [x], [y], padding="SAME", stride_h=1, stride_w=1, filter_height=3, filter_width=3)
    b.output(y)
    info = np.iinfo(dtype)
    xs = np.random.default_rng(1).integers(info.min, info.max + 1, (1, 9, 9, 16)).astype(dtype)
    assert_opencl_is_litert(b.build(), [xs], False)
