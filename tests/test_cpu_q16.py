"""The cpu backend's integer kernels for 16x8 models (litegpu_cpu.kernels.q16): each is
chosen where it applies (the delegation report names it, not the reference) and equals
LiteRT's builtin kernels exactly: one-input ops over every int16 value and swish as one
table; ADD / SUB / MUL of one shape and with an operand repeating along the leading axes
(cut into tasks whose edges fall inside b's period), LiteRT's two roundings of the
same-shape ADD included; CONV_2D (1x1, im2col, dilated, strided, partial panels, sums in
several int32 blocks), FULLY_CONNECTED and DEPTHWISE_CONV_2D with int64 biases; pools,
MEAN, SOFTMAX and QUANTIZE of floats; fused activations and saturating inputs throughout."""
from __future__ import annotations

import numpy as np
import pytest

import litegpu
from litegpu.testing.builder import ModelBuilder

from test_ops_quantized import run_both

I16 = np.int16
EVERY = np.arange(-32768, 32768).astype(I16)


def kernels_of(model: bytes) -> dict[str, list[str]]:
    """The kernel names the cpu backend gives each op of ``model``."""
    interp = litegpu.Interpreter(model_content=model)
    interp.allocate_tensors()
    names: dict[str, list[str]] = {}
    for _, op, _, name in interp.get_delegation_report().kernels:
        names.setdefault(op, []).append(name)
    return names


def check(model: bytes, inputs: list[np.ndarray], op: str, kernel: str) -> None:
    """litegpu equals LiteRT on every element, and ``op``'s nodes ran ``kernel``."""
    ours, theirs = run_both(model, inputs)
    for got, want in zip(ours, theirs):
        assert got.dtype == want.dtype and got.shape == want.shape
        differ = np.flatnonzero(got != want)
        first = differ[:5]
        assert differ.size == 0, (f"{differ.size} of {got.size} differ, first at {first.tolist()}: ours "
                                  f"{got.reshape(-1)[first].tolist()}, LiteRT {want.reshape(-1)[first].tolist()}")
    names = kernels_of(model)[op]
    assert all(kernel in name for name in names), names


def random16(rng, shape) -> np.ndarray:
    """Random int16 values over the whole range, the extremes included."""
    x = rng.integers(-32768, 32768, shape).astype(I16)
    x.reshape(-1)[:4] = [-32768, 32767, 0, -1][:x.size]
    return x


# -- one-input ops as tables ---------------------------------------------------------------------------


def _unary(op: str, in_q: float, out_q: float | None, out_dtype=I16, **options) -> bytes:
    b = ModelBuilder()
    x = b.input("x", (2, 65536), I16, scale=[in_q], zero_point=[0])
    y = b.tensor("y", (2, 65536), out_dtype, **({"scale": [out_q], "zero_point": [0]} if out_q else {}))
    b.op(op, [x], [y], **options)
    b.output(y)
    return b.build()


UNARY = [
    ("LOGISTIC", 2.0 ** -12, 1 / 32768, I16, {}),
    ("LOGISTIC", 0.0004, 1 / 32768, I16, {}),
    ("TANH", 2.0 ** -11, 1 / 32768, I16, {}),
    ("TANH", 3.0 / 32768, 1 / 32768, I16, {}),
    ("RELU", 0.001, 0.0007, I16, {}),
    ("RELU6", 0.0002, 0.0002, I16, {}),
    ("LEAKY_RELU", 0.001, 0.0009, I16, {"alpha": 0.3}),
    ("GELU", 0.0003, 0.0002, I16, {}),
    ("QUANTIZE", 0.001, 0.0007, I16, {}),       # a requantization (NASNet's, DenseNet's joins)
    ("QUANTIZE", 0.001, 0.02, np.int8, {}),
    ("DEQUANTIZE", 0.001, None, np.float32, {"version": 2}),
]


@pytest.mark.parametrize("op,in_q,out_q,out_dtype,options", UNARY,
                         ids=[f"{u[0]}-{i}" for i, u in enumerate(UNARY)])
def test_int16_unary_table_chosen_and_exact(op, in_q, out_q, out_dtype, options) -> None:
    x = np.stack([EVERY, EVERY[::-1]])      # every int16 value, in two orders (several tasks)
    check(_unary(op, in_q, out_q, out_dtype, **options), [x], op, "int16 table")


def _swish(follower: str, swapped: bool, shared: bool, shape=(2, 65536)) -> bytes:
    """x -> LOGISTIC -> ``follower``(x, sigmoid); with ``shared`` the sigmoid is an output too."""
    b = ModelBuilder()
    x = b.input("x", shape, I16, scale=[0.0005], zero_point=[0])
    s = b.tensor("s", shape, I16, scale=[1 / 32768], zero_point=[0])
    y = b.tensor("y", shape, I16, scale=[0.0004], zero_point=[0])
    b.op("LOGISTIC", [x], [s])
    b.op(follower, [s, x] if swapped else [x, s], [y], **({"version": 3} if follower != "MUL" else {}))
    b.output(y)
    if shared:
        b.output(s)
    return b.build()


@pytest.mark.parametrize("follower,swapped", [("MUL", False), ("MUL", True), ("ADD", False), ("SUB", True)])
@pytest.mark.parametrize("shared", [False, True])
def test_int16_swish_is_one_table(follower, swapped, shared) -> None:
    """x * LOGISTIC(x) (and its kin) on int16: one 65536-entry table of the pair, unless
    the sigmoid is read elsewhere (then a table and the binary task); every value equal
    to LiteRT either way."""
    model = _swish(follower, swapped, shared)
    x = np.stack([EVERY, np.roll(EVERY, 12345)])
    check(model, [x], "LOGISTIC", "int16 table")
    names = kernels_of(model)
    assert (names[follower] == names["LOGISTIC"]) != shared, names


# -- ADD, SUB, MUL ---------------------------------------------------------------------------------------


BINARY_SHAPES = [
    ((2, 5, 5, 8), (2, 5, 5, 8)),
    ((2, 5, 5, 8), (1, 1, 1, 8)),          # repeats along the leading axes (squeeze-and-excite)
    ((2, 5, 5, 8), (1,)),                  # a scalar
    ((1, 61, 83, 9), (1, 1, 1, 9)),        # 8 tasks, not on b's period
    ((1, 61, 83, 9), (1, 61, 83, 9)),      # 8 tasks, same shapes
]


def _binary(op: str, a_shape, b_shape, qs, act: str, small_first: bool, **options) -> bytes:
    b = ModelBuilder()
    x = b.input("x", a_shape, I16, scale=[qs[0]], zero_point=[0])
    z = b.input("z", b_shape, I16, scale=[qs[1]], zero_point=[0])
    y = b.tensor("y", a_shape, I16, scale=[qs[2]], zero_point=[0])
    b.op(op, [z, x] if small_first else [x, z], [y], fused_activation_function=act, **options)
    b.output(y)
    return b.build()


@pytest.mark.parametrize("op", ["ADD", "SUB"])
@pytest.mark.parametrize("shapes", BINARY_SHAPES, ids=["same", "excite", "scalar", "tasks", "tasks-same"])
@pytest.mark.parametrize("qs,act", [((0.0007, 0.0003, 0.0006), "NONE"), ((0.0002, 0.0009, 0.0001), "RELU6"),
                                    ((0.001, 0.001, 0.0005), "RELU")])
@pytest.mark.parametrize("small_first", [False, True])
def test_int16_add_chosen_and_exact(op, shapes, qs, act, small_first) -> None:
    """TFLite's general int16 ADD/SUB (what the converter writes: ``pot_scale_int16``
    false), saturating where the output scale is finer than the inputs'."""
    rng = np.random.default_rng(3)
    model = _binary(op, *shapes, qs, act, small_first, version=3, pot_scale_int16=False)
    check(model, [random16(rng, shapes[0]), random16(rng, shapes[1])], op, "int16 add")


def test_int16_add_follows_litert_vector_loop_and_scalar_tail() -> None:
    """LiteRT's same-shape int16 ADD rounds differently in its vector loop (whole blocks of
    16 outputs) and in its scalar code (the rest): the pairs of values where the two
    differ, found by LiteRT's same-shape ADD against its broadcasting one (b over two rows,
    the scalar code throughout), are put in both places, and the kernel equals LiteRT in
    each."""
    rng = np.random.default_rng(20)
    qs = (0.0007, 0.0003, 0.0006)
    n = 16 * 10000
    xs = [random16(rng, (1, n)), random16(rng, (1, n))]
    _, (vector,) = run_both(_binary("ADD", (1, n), (1, n), qs, "NONE", False, version=3, pot_scale_int16=False), xs)
    _, (scalar,) = run_both(_binary("ADD", (2, n), (1, n), qs, "NONE", False, version=3, pot_scale_int16=False),
                            [np.concatenate([xs[0], xs[0]]), xs[1]])
    pairs = np.flatnonzero(vector[0] != scalar[0])[:15]
    assert pairs.size == 15, "no pairs on which the two roundings differ"
    picked = [np.concatenate([x[0, pairs], x[0, :1], x[0, pairs]])[None] for x in xs]   # 16 + 15 outputs
    model = _binary("ADD", picked[0].shape, picked[0].shape, qs, "NONE", False, version=3, pot_scale_int16=False)
    check(model, picked, "ADD", "int16 add")


@pytest.mark.parametrize("op", ["ADD", "SUB"])
@pytest.mark.parametrize("qs", [(2.0 ** -12, 2.0 ** -10, 2.0 ** -10), (2.0 ** -9, 2.0 ** -11, 2.0 ** -9)])
def test_int16_power_of_two_add_chosen_and_exact(op, qs) -> None:
    """TFLite's power-of-two int16 ADD/SUB (an LSTM's): same shapes only, as LiteRT."""
    rng = np.random.default_rng(4)
    shape = (1, 61, 83, 9)
    check(_binary(op, shape, shape, qs, "NONE", False, version=3), [random16(rng, shape), random16(rng, shape)],
          op, "int16 power-of-two add")


@pytest.mark.parametrize("shapes", BINARY_SHAPES, ids=["same", "excite", "scalar", "tasks", "tasks-same"])
@pytest.mark.parametrize("qs,act", [((0.0007, 0.0003, 0.00001), "NONE"), ((0.0002, 0.0009, 0.0001), "RELU6"),
                                    ((0.01, 0.03, 0.5), "RELU")])
@pytest.mark.parametrize("small_first", [False, True])
def test_int16_mul_chosen_and_exact(shapes, qs, act, small_first) -> None:
    rng = np.random.default_rng(5)
    check(_binary("MUL", *shapes, qs, act, small_first), [random16(rng, shapes[0]), random16(rng, shapes[1])],
          "MUL", "int16 mul")


def test_int16_binary_other_broadcasts_keep_the_reference() -> None:
    model = _binary("MUL", (1, 6, 6, 16), (1, 6, 1, 16), (0.001, 0.001, 0.001), "NONE", False)
    rng = np.random.default_rng(6)
    (ours,), (theirs,) = run_both(model, [random16(rng, (1, 6, 6, 16)), random16(rng, (1, 6, 1, 16))])
    np.testing.assert_array_equal(ours, theirs)
    assert kernels_of(model)["MUL"] == ["reference"]


# -- CONV_2D, FULLY_CONNECTED -----------------------------------------------------------------------------


def _weights(b: ModelBuilder, rng, shape, axis: int, big: bool = False):
    """Symmetric int8 weights, per output channel along ``axis``; ``big``: all of magnitude
    near 127, so that the sums need several int32 blocks."""
    values = rng.integers(-127, 128, shape)
    if big:
        values = np.where(values < 0, -127, 127) - rng.integers(0, 3, shape) * np.sign(values)
    scales = rng.uniform(0.002, 0.02, shape[axis]).astype(np.float32)
    w = b.const("w", values.astype(np.int8), scale=scales, zero_point=[0] * len(scales), quantized_dimension=axis)
    return w, scales


def _bias(b: ModelBuilder, rng, n: int, x_scale: float, w_scales, dtype=np.int64):
    values = rng.integers(-3_000_000, 3_000_000, n).astype(dtype)
    return b.const("b", values, scale=np.float32(x_scale) * w_scales, zero_point=[0] * n)


CONVS = [  # x shape, (O, KH, KW), stride, dilation, padding, activation
    ((1, 9, 9, 8), (24, 1, 1), 1, 1, "SAME", "NONE"),           # 1x1 over the pixels
    ((2, 12, 10, 6), (40, 1, 1), 1, 1, "VALID", "RELU6"),       # 1x1, two images, several tasks
    ((1, 9, 9, 7), (5, 1, 1), 1, 1, "SAME", "NONE"),            # 1x1 over odd channels: im2col pads
    ((1, 13, 11, 3), (16, 3, 3), 2, 1, "SAME", "RELU"),         # a stem
    ((1, 10, 10, 16), (33, 3, 3), 1, 1, "SAME", "NONE"),        # 33 columns: a partial panel
    ((1, 8, 9, 5), (7, 3, 2), (2, 1), 2, "SAME", "NONE"),       # dilated, strides differ
    ((1, 7, 7, 4), (6, 5, 5), 1, 1, "VALID", "RELU6"),
    ((1, 40, 40, 8), (48, 3, 3), 1, 1, "SAME", "NONE"),         # many row tasks
]


def _conv(x_shape, wshape, stride, dilation, padding, act, bias_dtype=np.int64, big=False, seed=7) -> bytes:
    from litegpu.ops.nn import conv_output_size
    rng = np.random.default_rng(seed)
    sh, sw = (stride, stride) if isinstance(stride, int) else stride
    o, kh, kw = wshape
    oh = conv_output_size(x_shape[1], kh, sh, dilation, padding)[0]
    ow = conv_output_size(x_shape[2], kw, sw, dilation, padding)[0]
    b = ModelBuilder()
    x = b.input("x", x_shape, I16, scale=[0.0005], zero_point=[0])
    w, ws = _weights(b, rng, (o, kh, kw, x_shape[3]), 0, big)
    inputs = [x, w] + ([] if bias_dtype is None else [_bias(b, rng, o, 0.0005, ws, bias_dtype)])
    y = b.tensor("y", (x_shape[0], oh, ow, o), I16, scale=[0.004 if not big else 0.2], zero_point=[0])
    b.op("CONV_2D", inputs, [y], padding=padding, stride_h=sh, stride_w=sw, dilation_h_factor=dilation,
         dilation_w_factor=dilation, fused_activation_function=act, version=3)
    b.output(y)
    return b.build()


@pytest.mark.parametrize("x_shape,wshape,stride,dilation,padding,act", CONVS)
def test_int16_conv_chosen_and_exact(x_shape, wshape, stride, dilation, padding, act) -> None:
    rng = np.random.default_rng(8)
    check(_conv(x_shape, wshape, stride, dilation, padding, act), [random16(rng, x_shape)], "CONV_2D", "int16")


def test_int16_conv_sums_in_several_blocks() -> None:
    """3x3 x 512 channels of weights near 127: a column's int32 sums could overflow over
    all of K, so they run in blocks added in int64; inputs at the int16 extremes."""
    shape = (1, 6, 6, 512)
    rng = np.random.default_rng(9)
    x = np.where(rng.integers(0, 2, shape) == 0, -32768, 32767).astype(I16)
    check(_conv(shape, (20, 3, 3), 1, 1, "SAME", "NONE", big=True), [x], "CONV_2D", "int16")


def run_ours(model: bytes, inputs: list[np.ndarray]) -> list[np.ndarray]:
    interp = litegpu.Interpreter(model_content=model)
    interp.allocate_tensors()
    for d, x in zip(interp.get_input_details(), inputs):
        interp.set_tensor(d["index"], x)
    interp.invoke()
    return [interp.get_tensor(d["index"]) for d in interp.get_output_details()]


@pytest.mark.parametrize("bias_dtype", [np.int32, None])
def test_int16_conv_other_biases_sum_the_same(bias_dtype) -> None:
    """An int32 bias is the same int64 sums (LiteRT's int32-bias 16x8 kernel saturates
    every output, and it refuses no bias, so the int64-bias model is the expectation)."""
    shape = (1, 10, 10, 16)
    x = random16(np.random.default_rng(10), shape)
    rng = np.random.default_rng(11)
    values = rng.integers(-3000, 3000, 33) if bias_dtype is not None else np.zeros(33, np.int64)
    outputs = []
    for dtype in (np.int64, bias_dtype):
        b = ModelBuilder()
        xi = b.input("x", shape, I16, scale=[0.0005], zero_point=[0])
        w, ws = _weights(b, np.random.default_rng(12), (33, 3, 3, 16), 0)
        bias = [] if dtype is None else [b.const("b", values.astype(dtype), scale=np.float32(0.0005) * ws,
                                                 zero_point=[0] * 33)]
        y = b.tensor("y", (1, 10, 10, 33), I16, scale=[0.004], zero_point=[0])
        b.op("CONV_2D", [xi, w, *bias], [y], padding="SAME", stride_h=1, stride_w=1, version=3)
        b.output(y)
        outputs.append(run_ours(b.build(), [x])[0])
        assert all("int16" in name for name in kernels_of(b.build())["CONV_2D"])
    np.testing.assert_array_equal(outputs[0], outputs[1])


@pytest.mark.parametrize("rows,k,n", [(1, 1280, 1000), (3, 30, 7), (2, 31, 40), (9, 64, 12)])
def test_int16_fully_connected_chosen_and_exact(rows, k, n) -> None:
    rng = np.random.default_rng(13)
    b = ModelBuilder()
    x = b.input("x", (rows, k), I16, scale=[0.0005], zero_point=[0])
    w, ws = _weights(b, rng, (n, k), 0)
    y = b.tensor("y", (rows, n), I16, scale=[0.01], zero_point=[0])
    b.op("FULLY_CONNECTED", [x, w, _bias(b, rng, n, 0.0005, ws)], [y], fused_activation_function="RELU", version=5)
    b.output(y)
    check(b.build(), [random16(rng, (rows, k))], "FULLY_CONNECTED", "int16")


@pytest.mark.parametrize("style", ["tflite16", "tflite"])
@pytest.mark.parametrize("m,k,n", [(37, 100, 50), (5, 7, 3), (200, 1200, 70)])
def test_int16_product_equals_the_reference(style, m, k, n) -> None:
    """The product with both requantizations, a bias at int64 sizes and weights of the
    whole int8 range, equals the reference's arithmetic (:func:`finish_sums`)."""
    from litegpu.ops.quantized import finish_sums
    from litegpu.quant import quantize_multiplier
    from litegpu_cpu.kernels.q16 import QuantizedMatmul16
    rng = np.random.default_rng(14)
    x = random16(rng, (m, -(-k // 2) * 2))
    x[:, k:] = 0
    w = rng.integers(-128, 128, (k, n)).astype(np.int8)
    bias = rng.integers(-10**9, 10**9, n)
    mult, shift = quantize_multiplier(rng.uniform(1e-6, 1e-4, n))
    requant = {"style": style, "multiplier": mult, "shift": shift, "lo": -32768, "hi": 32767, "zp": 0,
               "dtype": np.dtype(I16)}
    want = finish_sums(x[:, :k].astype(np.int64) @ w.astype(np.int64), bias, requant)
    out = np.empty((m, n), I16)
    QuantizedMatmul16(w, bias, requant, 2).bind(x, out)()
    np.testing.assert_array_equal(out, want)


DEPTHWISE = [  # x shape, (KH, KW), stride, dilation, padding, activation
    ((1, 9, 9, 32), (3, 3), 1, 1, "SAME", "NONE"),
    ((2, 11, 10, 24), (3, 3), 2, 1, "SAME", "RELU6"),
    ((1, 12, 12, 20), (5, 5), 2, 1, "SAME", "NONE"),
    ((1, 8, 9, 7), (3, 2), (1, 2), 2, "VALID", "RELU"),
    ((1, 6, 6, 672), (5, 5), 1, 1, "SAME", "NONE"),
]


@pytest.mark.parametrize("x_shape,khw,stride,dilation,padding,act", DEPTHWISE)
def test_int16_depthwise_chosen_and_exact(x_shape, khw, stride, dilation, padding, act) -> None:
    from litegpu.ops.nn import conv_output_size
    rng = np.random.default_rng(15)
    sh, sw = (stride, stride) if isinstance(stride, int) else stride
    c = x_shape[3]
    oh = conv_output_size(x_shape[1], khw[0], sh, dilation, padding)[0]
    ow = conv_output_size(x_shape[2], khw[1], sw, dilation, padding)[0]
    b = ModelBuilder()
    x = b.input("x", x_shape, I16, scale=[0.0005], zero_point=[0])
    w, ws = _weights(b, rng, (1, *khw, c), 3)
    y = b.tensor("y", (x_shape[0], oh, ow, c), I16, scale=[0.003], zero_point=[0])
    b.op("DEPTHWISE_CONV_2D", [x, w, _bias(b, rng, c, 0.0005, ws)], [y], padding=padding, stride_h=sh,
         stride_w=sw, dilation_h_factor=dilation, dilation_w_factor=dilation, depth_multiplier=1,
         fused_activation_function=act, version=3)
    b.output(y)
    check(b.build(), [random16(rng, x_shape)], "DEPTHWISE_CONV_2D", "int16 depthwise")


# -- pools ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["MAX_POOL_2D", "AVERAGE_POOL_2D"])
@pytest.mark.parametrize("shape,filt,stride,padding,act", [
    ((1, 9, 7, 5), (3, 3), (2, 2), "SAME", "NONE"),
    ((2, 8, 8, 16), (2, 2), (2, 2), "VALID", "RELU6"),
    ((1, 63, 63, 32), (3, 3), (2, 2), "SAME", "NONE"),        # NASNet's
    ((1, 7, 7, 40), (7, 7), (1, 1), "VALID", "RELU")])         # a global average
def test_int16_pool_chosen_and_exact(op, shape, filt, stride, padding, act) -> None:
    from litegpu.ops.nn import conv_output_size
    out_hw = [conv_output_size(d, k, s, 1, padding)[0] for d, k, s in zip(shape[1:3], filt, stride)]
    b = ModelBuilder()
    x = b.input("x", shape, I16, scale=[0.0005], zero_point=[0])
    y = b.tensor("y", (shape[0], *out_hw, shape[3]), I16, scale=[0.0005], zero_point=[0])
    b.op(op, [x], [y], padding=padding, stride_h=stride[0], stride_w=stride[1], filter_height=filt[0],
         filter_width=filt[1], fused_activation_function=act)
    b.output(y)
    check(b.build(), [random16(np.random.default_rng(16), shape)], op, "int16")


# -- MEAN ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape,axes,keep", [((1, 7, 7, 64), (1, 2), True), ((2, 5, 3, 20), (1, 2), False),
                                             ((3, 10, 8), (2,), False), ((1, 80, 80, 32), (1, 2), True),
                                             ((2, 6, 4, 8), (0, 2), True)])
@pytest.mark.parametrize("scales", [(0.0005, 0.0005), (0.0005, 0.0002), (0.0003, 0.002)])
def test_int16_mean_chosen_and_exact(shape, axes, keep, scales) -> None:
    b = ModelBuilder()
    x = b.input("x", shape, I16, scale=[scales[0]], zero_point=[0])
    out_shape = tuple(1 if i in axes else d for i, d in enumerate(shape) if keep or i not in axes)
    y = b.tensor("y", out_shape, I16, scale=[scales[1]], zero_point=[0])
    b.op("MEAN", [x, b.const("axes", np.array(axes, np.int32))], [y], keep_dims=keep)
    b.output(y)
    model = b.build()
    for x in (random16(np.random.default_rng(17), shape), np.full(shape, -32768, I16)):   # the second saturates
        (ours,), (theirs,) = run_both(model, [x])
        np.testing.assert_array_equal(ours, theirs)
    assert kernels_of(model)["MEAN"] == ["int16 mean" if axes != (0, 2) else "reference"]


# -- SOFTMAX, QUANTIZE of float32 ---------------------------------------------------------------------------------


@pytest.mark.parametrize("in_scale,beta", [(0.0005, 1.0), (2.0 ** -10, 0.5), (0.003, 1.0)])
@pytest.mark.parametrize("shape,spread", [((6, 10), 8), ((2, 3, 1000), 8), ((4, 12), 1), ((3, 1), 1)])
def test_int16_softmax_chosen_and_exact(in_scale, beta, shape, spread) -> None:
    """Differences within the exp table's range and (``spread`` 1: the whole int16 range)
    far beyond it."""
    b = ModelBuilder()
    x = b.input("x", shape, I16, scale=[in_scale], zero_point=[0])
    y = b.tensor("y", shape, I16, scale=[1 / 32768], zero_point=[0])
    b.op("SOFTMAX", [x], [y], beta=beta)
    b.output(y)
    xs = (random16(np.random.default_rng(18), shape) // spread).astype(I16)
    check(b.build(), [xs], "SOFTMAX", "int16 softmax")


def test_int16_quantize_of_floats_chosen_and_exact() -> None:
    """Ties, saturation, and values past int32's range, infinities and NaN (LiteRT: the
    lowest int16, its conversion to int32 having overflowed)."""
    b = ModelBuilder()
    x = b.input("x", (3, 1000), np.float32)
    y = b.tensor("y", (3, 1000), I16, scale=[0.001], zero_point=[0])
    b.op("QUANTIZE", [x], [y])
    b.output(y)
    rng = np.random.default_rng(19)
    values = (rng.normal(size=(3, 1000)) * 20).astype(np.float32)      # many saturate
    values[0, :8] = [1e30, -1e30, np.inf, -np.inf, np.nan, 2.1e6, 2.2e6, -2.2e6]
    values[1, :200] = (np.arange(200, dtype=np.float32) - 100) * np.float32(0.0005)   # ties at half quanta
    check(b.build(), [values], "QUANTIZE", "int16 quantize")
