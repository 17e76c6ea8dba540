"""Hostile quantization parameters: a clean ModelFormatError at load, naming field and tensor.

Each bad case is a small quantized model written with :class:`ModelBuilder`, or a shared
quantized model with a few bytes edited (skipped, saying so, where the shared models are
not here). What LiteRT itself loads and runs from a real converter stays loadable:
``min``/``max``-only tables, a float tensor's unread table, a zero scale in one channel of
per-channel weights or on an int16 tensor (the ops that cannot take it refuse it), a
non-zero int32 bias zero point.
"""
from __future__ import annotations

import re
import struct
from pathlib import Path

import numpy as np
import pytest

import litegpu
from litegpu.model.flatbuf import Buffer, Table
from litegpu.testing.builder import ModelBuilder

NAN, INF = float("nan"), float("inf")
OK = {"scale": 0.5, "zero_point": 0}


def expect_error(data: bytes, *patterns: str) -> str:
    """``data`` must fail to load, through the Interpreter, with a ModelFormatError matching every pattern."""
    with pytest.raises(litegpu.ModelFormatError) as info:
        litegpu.Interpreter(model_content=data)
    message = str(info.value)
    for p in patterns:
        assert re.search(p, message), f"{p!r} not in {message!r}"
    return message


def add_model(x: dict, dtype=np.int8, c: dict = OK, y: dict = OK, shape=(1, 4)) -> bytes:
    """``y = x + c`` on quantized ``dtype``; tensors x (0), c (1), y (2) take the given quantization."""
    b = ModelBuilder()
    xi = b.input("x", shape, dtype, **x)
    ci = b.const("c", np.ones(shape, dtype), **c)
    yi = b.tensor("y", shape, dtype, **y)
    b.op("ADD", [xi, ci], [yi])
    b.output(yi)
    return b.build()


PER_CHANNEL = {"scale": [0.1, 0.2, 0.3, 0.4], "zero_point": [0] * 4, "quantized_dimension": 0}
BIAS = {"scale": [0.05, 0.1, 0.15, 0.2], "zero_point": [0] * 4, "quantized_dimension": 0}


def conv_model(w: dict = PER_CHANNEL, bias: dict = BIAS, dtype=np.int8, bias_dtype=np.int32) -> bytes:
    """An int8 (or 16x8) 1x1 CONV_2D: input (0), weights 'w' [4,1,1,2] (1), bias 'bias' (2), output (3)."""
    b = ModelBuilder()
    x = b.input("x", (1, 3, 3, 2), dtype, scale=0.5, zero_point=0)
    wi = b.const("w", np.ones((4, 1, 1, 2), np.int8), **w)
    bi = b.const("bias", np.zeros(4, bias_dtype), **bias)
    y = b.tensor("y", (1, 3, 3, 4), dtype, scale=0.25, zero_point=0)
    b.op("CONV_2D", [x, wi, bi], [y], padding="SAME", stride_w=1, stride_h=1)
    b.output(y)
    return b.build()


def loads(data: bytes) -> litegpu.Interpreter:
    """``data`` loads (the model is valid, whatever running it needs)."""
    return litegpu.Interpreter(model_content=data)


# ---------------------------------------------------------------------------------------------
# Scales.
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", [0.0, -0.5, NAN, INF, -INF])
@pytest.mark.parametrize("where", ["x", "c", "y"])
def test_bad_per_tensor_scale(where: str, value: float) -> None:
    index = "xcy".index(where)
    bad = {"scale": value, "zero_point": 0}
    data = add_model(**{"x": OK, where: bad})
    why = "only in a channel of per-channel constant weights" if value == 0 else "must be finite and positive"
    expect_error(data, rf"subgraphs\[0\]\.tensors\[{index}\]\.quantization\.scale\[0\]: tensor '{where}'",
                 f"scale {value!r}", why)


@pytest.mark.parametrize("value", [-0.2, NAN, INF])
def test_bad_scale_in_one_channel_of_weights(value: float) -> None:
    w = dict(PER_CHANNEL, scale=[0.1, 0.2, value, 0.4])
    expect_error(conv_model(w=w), r"tensors\[1\]\.quantization\.scale\[2\]: tensor 'w'", "finite and positive")


def test_zero_scale_in_a_channel_of_per_channel_weights_loads() -> None:
    # TFLite's post-training quantizer writes scale 0 for an all-zero channel and its bias;
    # LiteRT runs such models, so they load.
    model = conv_model(w=dict(PER_CHANNEL, scale=[0.1, 0.0, 0.3, 0.4]), bias=dict(BIAS, scale=[0.05, 0, 0.15, 0.2]))
    w = litegpu.load_model(model).subgraphs[0].tensors[1]
    assert w.quantization.scales.tolist() == pytest.approx([0.1, 0.0, 0.3, 0.4])


def test_zero_scale_of_per_tensor_weights_is_an_error() -> None:
    expect_error(conv_model(w={"scale": 0.0, "zero_point": 0}, bias={"scale": 0.05, "zero_point": 0}),
                 r"tensors\[1\]\.quantization\.scale\[0\]: tensor 'w' has scale 0\.0")


def test_zero_scale_of_a_per_channel_activation_is_an_error() -> None:
    x = {"scale": [0.5, 0.0, 0.5, 0.5], "zero_point": [0] * 4, "quantized_dimension": 1}
    expect_error(add_model(x), r"tensors\[0\]\.quantization\.scale\[1\]: tensor 'x'")


def _zero_state_model(op: str, zero_output: bool = False, state_scale: float = 0.0) -> bytes:
    """A 16x8 GRU's first step as TFLite's converter writes it: an int16 all-zero state of
    scale ``state_scale`` (0, or a subnormal one; FILL of a constant) into ``op``
    (FULLY_CONNECTED, MUL or ADD) with a real int16 input; ``zero_output`` gives the op's
    output scale 0 too."""
    b = ModelBuilder()
    x = b.input("x", (1, 8), np.int16, scale=0.01, zero_point=0)
    dims = b.const("dims", np.array([1, 8], np.int32))
    zero = b.const("zero", np.int16(0), scale=state_scale, zero_point=0)
    state = b.tensor("state", (1, 8), np.int16, scale=state_scale, zero_point=0)
    b.op("FILL", [dims, zero], [state])
    y = b.tensor("y", (1, 8), np.int16, scale=0.0 if zero_output else 0.02, zero_point=0)
    if op == "FULLY_CONNECTED":
        w = b.const("w", np.arange(64, dtype=np.int8).reshape(8, 8), scale=0.05, zero_point=0)
        b.op(op, [state, w, -1], [y])
    else:
        b.op(op, [x, state], [y])
    b.output(y)
    return b.build()


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("state_scale", [0.0, 3.587324e-43])
@pytest.mark.parametrize("op", ["FULLY_CONNECTED", "MUL"])
def test_zero_scale_int16_state_runs_like_litert(op: str, state_scale: float, backend_name: str) -> None:
    """LiteRT runs a 16x8 GRU whose zero state has scale 0 (multiplier 0: every result the
    output's zero point), or one whose reciprocal overflows float32; so does litegpu, with
    the same integers, on cpu and in opencl's float view (no 0 * inf on the way)."""
    from ai_edge_litert.interpreter import Interpreter as LiteRT
    model = _zero_state_model(op, state_scale=state_scale)
    delegates = [] if backend_name == "cpu" else [litegpu.load_delegate(backend_name)]
    x = np.arange(-4, 4, dtype=np.int16).reshape(1, 8) * 1000
    results = []
    for interp in (litegpu.Interpreter(model_content=model, experimental_delegates=delegates),
                   LiteRT(model_content=model)):
        interp.allocate_tensors()
        interp.set_tensor(interp.get_input_details()[0]["index"], x)
        interp.invoke()
        results.append(interp.get_tensor(interp.get_output_details()[0]["index"]))
    np.testing.assert_array_equal(results[0], results[1])


@pytest.mark.parametrize("op,zero_output,what", [("ADD", False, "input 1"), ("MUL", True, "the output")])
def test_zero_scale_int16_where_the_arithmetic_needs_a_scale_is_an_error(op: str, zero_output: bool,
                                                                          what: str) -> None:
    """An int16 scale of 0 loads (LiteRT's loader takes it), but an op whose arithmetic
    divides by it, or a computed output of scale 0, is refused naming the operand."""
    with pytest.raises(litegpu.ModelFormatError, match=f"node 1 \\({op}\\): {what} has scales \\[0.0\\]"):
        litegpu.Interpreter(model_content=_zero_state_model(op, zero_output)).allocate_tensors()


@pytest.mark.parametrize("value", [0.0, NAN, -1.0])
def test_float_tensor_quantization_is_carried_unread(value: float) -> None:
    # LiteRT loads and runs a float ADD whose input table says scale NaN, zero point 1000:
    # no kernel reads a float tensor's quantization. The table is still reported.
    data = add_model({"scale": value, "zero_point": 1000}, np.float32, c={}, y={})
    it = loads(data)
    q = it.get_input_details()[0]["quantization_parameters"]
    assert q["zero_points"].tolist() == [1000]
    np.testing.assert_array_equal(q["scales"], np.float32([value]))


def test_min_max_only_table_loads_without_quantization() -> None:
    x = litegpu.load_model(add_model({"min": -1.0, "max": 1.0})).subgraphs[0].tensors[0]
    assert x.quantization is not None and not x.quantization.is_set


def test_rank_0_tensor_with_one_scale_loads() -> None:
    b = ModelBuilder()
    x = b.input("x", (1, 4), np.int8, **OK)
    c = b.const("c", np.int8(3), scale=0.25, zero_point=0, quantized_dimension=3)  # an axis LiteRT ignores
    y = b.tensor("y", (1, 4), np.int8, **OK)
    b.op("ADD", [x, c], [y])
    b.output(y)
    c_tensor = litegpu.load_model(b.build()).subgraphs[0].tensors[c]
    assert c_tensor.shape == () and c_tensor.quantization.scales.tolist() == [0.25]


# ---------------------------------------------------------------------------------------------
# Zero points.
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype, zero_point, bounds", [
    (np.int8, 128, r"\[-128, 127\]"), (np.int8, -129, r"\[-128, 127\]"),
    (np.uint8, -1, r"\[0, 255\]"), (np.uint8, 256, r"\[0, 255\]"),
    (np.int16, 32768, r"\[-32768, 32767\]"), (np.int16, -40000, r"\[-32768, 32767\]"),
])
def test_zero_point_outside_the_storage_type(dtype, zero_point: int, bounds: str) -> None:
    ok = {"scale": 0.5, "zero_point": 0}
    data = add_model({"scale": 0.5, "zero_point": zero_point}, dtype, c=ok, y=ok)
    expect_error(data, r"tensors\[0\]\.quantization\.zero_point\[0\]: tensor 'x'", f"zero point {zero_point}", bounds)


@pytest.mark.parametrize("dtype, zero_point", [(np.int8, -128), (np.int8, 127), (np.uint8, 0), (np.uint8, 255),
                                                (np.int16, 0)])
def test_zero_point_at_the_storage_bounds_loads(dtype, zero_point: int) -> None:
    ok = {"scale": 0.5, "zero_point": 0}
    x = litegpu.load_model(add_model({"scale": 0.5, "zero_point": zero_point}, dtype, c=ok, y=ok)).subgraphs[0].tensors[0]
    assert x.quantization.zero_points.tolist() == [zero_point]


@pytest.mark.parametrize("bias_dtype", [np.int32, np.int64])
def test_bias_zero_point_outside_int32(bias_dtype) -> None:
    # LiteRT keeps zero points as int32: a wider one would silently become another value there.
    bias = dict(BIAS, zero_point=[0, 1 << 40, 0, 0])
    expect_error(conv_model(bias=bias, bias_dtype=bias_dtype),
                 r"tensors\[2\]\.quantization\.zero_point\[1\]: tensor 'bias'", str(1 << 40), r"\[-2147483648, ")


def test_non_zero_int32_bias_zero_point_loads() -> None:
    # LiteRT's builtin kernels ignore a bias zero point (its XNNPACK path refuses a non-zero one
    # when it prepares the node): not a format error.
    bias = litegpu.load_model(conv_model(bias=dict(BIAS, zero_point=[7] * 4))).subgraphs[0].tensors[2]
    assert bias.quantization.zero_points.tolist() == [7] * 4


# ---------------------------------------------------------------------------------------------
# Counts and the per-channel axis.
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("qdim", [4, -1, 1000])
def test_per_channel_axis_out_of_range(qdim: int) -> None:
    expect_error(conv_model(w=dict(PER_CHANNEL, quantized_dimension=qdim)),
                 rf"tensors\[1\]\.quantization\.quantized_dimension: {qdim} out of range for rank 4 of tensor 'w'")


def test_per_tensor_axis_out_of_range() -> None:
    # LiteRT's loader checks the axis of any tensor with scales, one scale or many.
    expect_error(add_model(dict(OK, quantized_dimension=5)), r"quantized_dimension: 5 out of range for rank 2")


@pytest.mark.parametrize("scales, qdim, channels", [([0.1, 0.2, 0.3], 0, 4), ([0.1] * 4, 3, 2), ([0.1] * 5, 0, 4)])
def test_scale_count_does_not_match_the_channels(scales, qdim: int, channels: int) -> None:
    w = {"scale": scales, "zero_point": [0] * len(scales), "quantized_dimension": qdim}
    expect_error(conv_model(w=w), rf"tensors\[1\]\.quantization\.scale: tensor 'w' has {len(scales)} scales",
                 f"dimension {qdim} of its shape \\[4, 1, 1, 2\\] has {channels} channels")


@pytest.mark.parametrize("zero_points", [[0, 0], [0] * 5, []])
def test_zero_point_count(zero_points) -> None:
    expect_error(conv_model(w=dict(PER_CHANNEL, zero_point=zero_points)),
                 r"tensors\[1\]\.quantization\.zero_point: tensor 'w'",
                 f"4 scales but {len(zero_points)} zero points")


def test_one_scale_without_zero_point() -> None:
    expect_error(add_model({"scale": 0.5}), r"tensors\[0\]\.quantization\.zero_point", "1 scales but 0 zero points")


def test_one_zero_point_for_every_channel_loads() -> None:
    # LiteRT wants one per scale; one shared zero point has one meaning, so it is read as that.
    w = litegpu.load_model(conv_model(w=dict(PER_CHANNEL, zero_point=[0]))).subgraphs[0].tensors[1]
    assert w.quantization.zero_points.tolist() == [0] and w.quantization.scales.size == 4


# ---------------------------------------------------------------------------------------------
# Quantization litegpu does not read.
# ---------------------------------------------------------------------------------------------
def test_custom_quantization_details_are_unsupported() -> None:
    details = ("CustomQuantization", {"custom": b"\x01\x02\x03"})
    expect_error(conv_model(w=dict(PER_CHANNEL, details=details)),
                 r"tensors\[1\]\.quantization\.details_type: tensor 'w' uses CustomQuantization")


def test_blockwise_quantization_with_zero_points_is_refused() -> None:
    # (Blockwise INT4 weights themselves, and their other faults: tests/test_int4_weights.py.)
    details = ("BlockwiseQuantization", {"scales": 0, "zero_points": -1, "block_size": 1})
    expect_error(conv_model(w=dict(PER_CHANNEL, details=details)),
                 r"tensors\[1\]\.quantization\.details: tensor 'w' has blockwise zero points")


def test_unknown_quantization_details_type() -> None:
    data = conv_model(w=dict(PER_CHANNEL, details=("CustomQuantization", {"custom": b"\x01"})))
    q = Buffer(data).root(b"TFL3").tables(2, "subgraphs")[0].tables(0, "tensors")[1].table(4, "quantization")
    pos = q._field(4, 1, "details_type")
    assert data[pos] == 1
    edited = data[:pos] + bytes([9]) + data[pos + 1:]
    expect_error(edited, r"tensors\[1\]\.quantization\.details_type", "unknown QuantizationDetails type 9")


def test_details_without_scales_are_still_unsupported() -> None:
    data = add_model({"min": -1.0, "max": 1.0, "details": ("CustomQuantization", {"custom": b"x"})})
    expect_error(data, r"tensors\[0\]\.quantization\.details_type", "CustomQuantization")


def test_int4_weights_per_channel_run_as_litert_runs_them() -> None:
    from ai_edge_litert.interpreter import Interpreter as LiteRT
    w = np.array([[-8, 7, 0, 1]] * 3, np.int8)
    b = ModelBuilder()
    x = b.input("x", (2, 4), np.float32)
    wi = b.const("w4", w, "INT4", scale=[0.5, 0.25, 0.125], zero_point=[0] * 3)
    y = b.tensor("y", (2, 3), np.float32)
    b.op("FULLY_CONNECTED", [x, wi, -1], [y], version=5)
    b.output(y)
    data = b.build()
    w4 = litegpu.load_model(data).subgraphs[0].tensors[1]
    assert w4.type_name == "INT4" and w4.data.tolist() == w.tolist()
    feed = np.array([[0.5, -1.0, 2.0, 0.25], [3.0, 0.0, -0.5, 1.0]], np.float32)
    outs = []
    for make in (LiteRT, litegpu.Interpreter):
        it = make(model_content=data)
        it.allocate_tensors()
        it.set_tensor(it.get_input_details()[0]["index"], feed)
        it.invoke()
        outs.append(it.get_tensor(it.get_output_details()[0]["index"]))
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-6, atol=1e-6)


def test_builder_packs_int4_two_a_byte() -> None:
    b = ModelBuilder()
    b.const("w4", np.array([-8, 7, 1], np.int8), "INT4")
    data = b.build()
    buf = Buffer(data).root(b"TFL3").tables(4, "buffers")[1]
    assert buf.array(0, "[ubyte]", "data").tolist() == [0x78, 0x01]


def test_dequantize_of_bad_int8_weights_fails_before_folding() -> None:
    b = ModelBuilder()
    x = b.input("x", (1, 4), np.float32)
    w = b.const("w8", np.ones((1, 4), np.int8), scale=NAN, zero_point=0)
    wf = b.tensor("wf", (1, 4), np.float32)
    y = b.tensor("y", (1, 4), np.float32)
    b.op("DEQUANTIZE", [w], [wf])
    b.op("ADD", [x, wf], [y])
    b.output(y)
    expect_error(b.build(), r"tensors\[1\]\.quantization\.scale\[0\]: tensor 'w8' has scale nan")


def test_fp16_weights_with_an_unread_table_fold() -> None:
    b = ModelBuilder()
    x = b.input("x", (1, 4), np.float32)
    w = b.const("w16", np.full((1, 4), 2, np.float16), scale=NAN, zero_point=7)
    wf = b.tensor("wf", (1, 4), np.float32)
    y = b.tensor("y", (1, 4), np.float32)
    b.op("DEQUANTIZE", [w], [wf])
    b.op("ADD", [x, wf], [y])
    b.output(y)
    sg = litegpu.load_model(b.build()).subgraphs[0]
    assert [n.op for n in sg.nodes] == ["ADD"] and sg.tensors[wf].data.tolist() == [[2.0] * 4]


# ---------------------------------------------------------------------------------------------
# Shared quantized models with edited bytes.
# ---------------------------------------------------------------------------------------------
@pytest.fixture
def shared(shared_model):
    """``f(name)``: the bytes of a shared model (through the ``shared_model`` fixture)."""
    return lambda name: shared_model(name).read_bytes()


def quant_table(data: bytes, tensor: int) -> Table:
    return Buffer(data).root(b"TFL3").tables(2, "subgraphs")[0].tables(0, "tensors")[tensor].table(4, "quantization")


def element(q: Table, slot: int, size: int, k: int) -> int:
    """Byte position of element ``k`` of vector field ``slot`` (elements of ``size`` bytes)."""
    start, n = q._vector(slot, size, f"slot{slot}")
    assert start and k < n
    return start + size * k


def edit(data: bytes, pos: int, fmt: str, value) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, pos, value)
    return bytes(out)


def first_conv(data: bytes) -> tuple[int, int, int, str, str]:
    """mobilenet_v2_int8's first CONV_2D: (input, weights, bias) indices, input and weights names."""
    sg = litegpu.load_model(data).subgraphs[0]
    node = next(n for n in sg.nodes if n.op == "CONV_2D")
    x, w, bias = node.inputs
    assert sg.tensors[w].quantization.scales.size == sg.tensors[w].shape[0] > 1  # per-channel weights
    return x, w, bias, sg.tensors[x].name, sg.tensors[w].name


@pytest.mark.parametrize("value", [NAN, INF, -0.25])
def test_shared_model_weight_scale_edited(value: float, shared) -> None:
    data = shared("mobilenet_v2_int8")
    _, w, _, _, name = first_conv(data)
    edited = edit(data, element(quant_table(data, w), 2, 4, 5), "<f", value)
    expect_error(edited, rf"tensors\[{w}\]\.quantization\.scale\[5\]: tensor '{re.escape(name)}'")


@pytest.mark.parametrize("value", [0.0, NAN])
def test_shared_model_input_scale_edited(value: float, shared) -> None:
    data = shared("mobilenet_v2_int8")
    x, _, _, name, _ = first_conv(data)
    edited = edit(data, element(quant_table(data, x), 2, 4, 0), "<f", value)
    expect_error(edited, rf"tensors\[{x}\]\.quantization\.scale\[0\]: tensor '{re.escape(name)}' has scale")


def test_shared_model_weight_channel_scale_zero_loads(shared) -> None:
    data = shared("mobilenet_v2_int8")
    _, w, _, _, _ = first_conv(data)
    edited = edit(data, element(quant_table(data, w), 2, 4, 5), "<f", 0.0)
    assert litegpu.load_model(edited).subgraphs[0].tensors[w].quantization.scales[5] == 0


def test_shared_model_zero_point_edited(shared) -> None:
    data = shared("mobilenet_v2_int8")
    x, _, _, name, _ = first_conv(data)
    edited = edit(data, element(quant_table(data, x), 3, 8, 0), "<q", 200)
    expect_error(edited, rf"tensors\[{x}\]\.quantization\.zero_point\[0\]: tensor '{re.escape(name)}' \(INT8\)",
                 r"zero point 200, outside \[-128, 127\]")


def test_shared_model_scale_count_edited(shared) -> None:
    data = shared("mobilenet_v2_int8")
    _, w, _, _, name = first_conv(data)
    q = quant_table(data, w)
    n = q._vector(2, 4, "scale")[1]
    fewer_scales = edit(data, element(q, 2, 4, 0) - 4, "<I", n - 1)
    expect_error(fewer_scales, rf"tensors\[{w}\]\.quantization\.zero_point: tensor '{re.escape(name)}' "
                 f"has {n - 1} scales but {n} zero points")
    both = edit(fewer_scales, element(q, 3, 8, 0) - 4, "<I", n - 1)
    expect_error(both, rf"tensors\[{w}\]\.quantization\.scale: tensor '{re.escape(name)}' has {n - 1} scales",
                 f"has {n} channels")


def test_shared_16x8_model_int16_zero_point_edited(shared) -> None:
    data = shared("unet_small_int16x8")
    sg = litegpu.load_model(data).subgraphs[0]
    x = next(t for t in sg.tensors if t.type_name == "INT16" and t.quantization and t.quantization.is_set)
    edited = edit(data, element(quant_table(data, x.index), 3, 8, 0), "<q", 40000)
    expect_error(edited, rf"tensors\[{x.index}\]\.quantization\.zero_point\[0\]", r"outside \[-32768, 32767\]")


@pytest.mark.parametrize("name", ["mobilenet_v2_int8", "mobilenet_v3_small_int8", "tiny_bert_dynamic",
                                  "unet_small_int16x8"])
def test_shared_quantized_models_load(name: str, shared) -> None:
    model = litegpu.load_model(shared(name))
    quantized = [t for sg in model.subgraphs for t in sg.tensors if t.quantization and t.quantization.is_set]
    assert quantized and all(np.all(np.isfinite(t.quantization.scales)) for t in quantized)


def test_shared_model_path_is_used(tmp_path: Path, shared) -> None:
    # An edited file on disk (memory-mapped) fails the same way as bytes.
    data = shared("mobilenet_v2_int8")
    x, _, _, _, _ = first_conv(data)
    path = tmp_path / "bad.tflite"
    path.write_bytes(edit(data, element(quant_table(data, x), 2, 4, 0), "<f", INF))
    with pytest.raises(litegpu.ModelFormatError, match=rf"tensors\[{x}\]\.quantization\.scale\[0\]"):
        litegpu.Interpreter(model_path=str(path))
