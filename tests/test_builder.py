"""The test-model builder writes models that LiteRT and litegpu both read as intended.

Three independent readers check it: LiteRT (it runs the models), the ``tflite`` package's
generated accessors (they check the field slots of every options table), and litegpu's
own reader.
"""
from __future__ import annotations

import numpy as np
import pytest
import tflite
from ai_edge_litert.interpreter import Interpreter, OpResolverType

import litegpu
from litegpu.errors import InvalidArgumentError
from litegpu.model import schema
from litegpu.testing.builder import ENUM_FIELDS, ModelBuilder, options_table_for


def _litert(data: bytes) -> Interpreter:
    interp = Interpreter(model_content=data,
                         experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    interp.allocate_tensors()
    return interp


def _run_litert(data: bytes, *inputs: np.ndarray) -> list[np.ndarray]:
    interp = _litert(data)
    for d, x in zip(interp.get_input_details(), inputs):
        interp.set_tensor(d["index"], x)
    interp.invoke()
    return [interp.get_tensor(d["index"]) for d in interp.get_output_details()]


def _tflite_model(data: bytes) -> tflite.Model:
    return tflite.Model.GetRootAsModel(data, 0)


def _multi_op_model() -> bytes:
    rng = np.random.default_rng(0)
    b = ModelBuilder()
    x = b.input("x", (1, 6, 6, 3), np.float32)
    w = b.const("w", rng.standard_normal((4, 3, 3, 3)).astype(np.float32))
    bias = b.const("bias", rng.standard_normal(4).astype(np.float32))
    c = b.tensor("conv", (1, 3, 3, 4), np.float32)
    b.op("CONV_2D", [x, w, bias], [c], padding="SAME", stride_w=2, stride_h=2, fused_activation_function="RELU6")
    dw = b.const("dw", rng.standard_normal((1, 3, 3, 4)).astype(np.float32))
    d = b.tensor("dw_out", (1, 3, 3, 4), np.float32)
    dwb = b.const("dw_bias", np.zeros(4, np.float32))
    b.op("DEPTHWISE_CONV_2D", [c, dw, dwb], [d], padding="SAME", stride_w=1, stride_h=1, depth_multiplier=1)
    shape = b.const("shape", np.array([1, 36], np.int32))
    r = b.tensor("flat", (1, 36), np.float32)
    b.op("RESHAPE", [d, shape], [r], new_shape=[1, 36])
    fw = b.const("fc_w", rng.standard_normal((5, 36)).astype(np.float16), dtype=np.float16)
    fw32 = b.tensor("fc_w32", (5, 36), np.float32)
    b.op("DEQUANTIZE", [fw], [fw32])
    f = b.tensor("fc", (1, 5), np.float32)
    b.op("FULLY_CONNECTED", [r, fw32, -1], [f], fused_activation_function="NONE")
    s = b.tensor("probs", (1, 5), np.float32)
    b.op("SOFTMAX", [f], [s], beta=1.0)
    b.output(s, f)
    b.signature("serving_default", inputs={"image": x}, outputs={"probs": s, "logits": f})
    return b.build()


def test_multi_op_model_has_the_same_structure_in_litert_and_litegpu():
    data = _multi_op_model()
    interp = _litert(data)
    model = litegpu.load_model(data)
    sg = model.subgraphs[0]
    ops = interp._get_ops_details()
    # litegpu folds the fp16 DEQUANTIZE of a constant at load time; LiteRT keeps the node.
    assert [o["op_name"] for o in ops] == ["CONV_2D", "DEPTHWISE_CONV_2D", "RESHAPE", "DEQUANTIZE",
                                           "FULLY_CONNECTED", "SOFTMAX"]
    kept = [o for o in ops if o["op_name"] != "DEQUANTIZE"]
    assert [n.op for n in sg.nodes] == [o["op_name"] for o in kept]
    for node, o in zip(sg.nodes, kept):
        assert list(node.inputs) == list(o["inputs"])
        assert list(node.outputs) == list(o["outputs"])
    details = {d["index"]: d for d in interp.get_tensor_details()}
    # LiteRT may append internal scratch tensors after the model's own.
    assert len(details) >= len(sg.tensors)
    for t in sg.tensors:
        d = details[t.index]
        assert d["name"] == t.name
        assert tuple(d["shape"]) == t.shape
        assert np.dtype(d["dtype"]) == t.dtype
    assert [d["name"] for d in interp.get_input_details()] == ["x"]
    assert [sg.tensors[i].name for i in sg.outputs] == ["probs", "fc"]
    assert interp.get_signature_list() == {"serving_default": {"inputs": ["image"], "outputs": ["logits", "probs"]}}
    sig = model.signatures[0]
    assert (sig.key, sig.inputs, sig.outputs) == ("serving_default", {"image": 0}, {"probs": sg.outputs[0],
                                                                                    "logits": sg.outputs[1]})
    fp16 = next(t for t in sg.tensors if t.name == "fc_w32")
    assert fp16.is_constant and fp16.dtype == np.float32


def test_litert_executes_conv_options_as_written():
    """Stride, padding and fused activation reach LiteRT: compare with a direct numpy conv."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 7, 7, 2)).astype(np.float32)
    w = rng.standard_normal((3, 3, 3, 2)).astype(np.float32) * 2
    bias = np.array([0.5, -0.5, 4.0], np.float32)
    b = ModelBuilder()
    xi = b.input("x", x.shape, np.float32)
    y = b.tensor("y", (1, 3, 3, 3), np.float32)
    b.op("CONV_2D", [xi, b.const("w", w), b.const("b", bias)], [y], padding="VALID", stride_w=2, stride_h=2,
         fused_activation_function="RELU6")
    b.output(y)
    (got,) = _run_litert(b.build(), x)
    want = np.zeros((1, 3, 3, 3), np.float64)
    for i in range(3):
        for j in range(3):
            patch = x[0, 2 * i:2 * i + 3, 2 * j:2 * j + 3, :]
            want[0, i, j] = np.tensordot(w, patch, axes=([1, 2, 3], [0, 1, 2])) + bias
    np.testing.assert_allclose(got, np.clip(want, 0, 6), rtol=1e-5, atol=1e-5)


def test_broadcast_add_with_fused_relu_runs_in_litert():
    a = np.linspace(-2, 2, 12, dtype=np.float32).reshape(1, 3, 4)
    c = np.array([1.0, -1.0, 0.25, 0.0], np.float32)
    b = ModelBuilder()
    ai = b.input("a", a.shape, np.float32)
    y = b.tensor("y", a.shape, np.float32)
    b.op("ADD", [ai, b.const("c", c)], [y], fused_activation_function="RELU")
    b.output(y)
    (got,) = _run_litert(b.build(), a)
    np.testing.assert_array_equal(got, np.maximum(a + c, 0))


def test_while_loop_across_subgraphs_runs_in_litert():
    b = ModelBuilder()
    i0 = b.input("i", (), np.int32)
    out = b.tensor("out", (), np.int32)
    cond = b.subgraph("cond")
    ci = cond.input("i", (), np.int32)
    cb = cond.tensor("keep", (), np.bool_)
    cond.op("LESS", [ci, cond.const("limit", np.array(5, np.int32))], [cb])
    cond.output(cb)
    body = b.subgraph("body")
    bi = body.input("i", (), np.int32)
    bo = body.tensor("next", (), np.int32)
    body.op("ADD", [bi, body.const("one", np.array(1, np.int32))], [bo])
    body.output(bo)
    assert (cond.index, body.index) == (1, 2)
    b.op("WHILE", [i0], [out], cond_subgraph_index=cond.index, body_subgraph_index=body.index)
    b.output(out)
    data = b.build()
    assert int(_run_litert(data, np.array(-2, np.int32))[0]) == 5
    model = litegpu.load_model(data)
    assert [sg.name for sg in model.subgraphs] == ["main", "cond", "body"]
    assert model.subgraphs[0].nodes[0].options == {"cond_subgraph_index": 1, "body_subgraph_index": 2}


def test_opcodes_set_both_builtin_code_fields():
    b = ModelBuilder()
    x = b.input("x", (2, 3), np.float32)
    y = b.tensor("y", (2, 3), np.float32)
    b.op("GELU", [x], [y], approximate=True)
    z = b.tensor("z", (2, 3), np.float32)
    b.op("ADD", [y, x], [z])
    b.output(z)
    data = b.build()
    m = _tflite_model(data)
    codes = [m.OperatorCodes(i) for i in range(m.OperatorCodesLength())]
    assert [(c.BuiltinCode(), c.DeprecatedBuiltinCode()) for c in codes] == [
        (tflite.BuiltinOperator.GELU, 127), (tflite.BuiltinOperator.ADD, tflite.BuiltinOperator.ADD)]
    x_val = np.linspace(-3, 3, 6, dtype=np.float32).reshape(2, 3)
    (got,) = _run_litert(data, x_val)
    assert got.shape == (2, 3) and got[0, 0] < x_val[0, 0] + 0.1  # gelu(-3) ~ 0, plus -3


def test_builtin_names_match_litert_s_schema():
    """Every op code and BuiltinOptions2 table of the schema LiteRT ships (ai_edge_litert's
    generated accessors), so no op of a current model is named ``BUILTIN_<n>``."""
    from ai_edge_litert import schema_py_generated as current
    codes = {name: code for name, code in vars(current.BuiltinOperator).items() if not name.startswith("_")}
    assert codes == schema.BUILTIN_CODES
    assert schema.builtin_name(max(codes.values())) == "STABLEHLO_CASE"
    tables = {name: code for name, code in vars(current.BuiltinOptions2).items() if isinstance(code, int) and code}
    assert tables == {name: code for name, (code, _) in schema.OPTIONS_2_BY_NAME.items()}
    for name, (_, fields) in schema.OPTIONS_2_BY_NAME.items():
        accessors = {a for a in dir(getattr(current, name)) if a[0].isupper()}
        assert {"".join(w.capitalize() for w in f.split("_")) for f, _, _ in fields} <= accessors, name


def test_custom_op_quantization_variable_and_signature_round_trip():
    b = ModelBuilder()
    x = b.input("x", (1, 4, 4, 8), np.int8, scale=[0.1, 0.2] * 4, zero_point=[0, 1] * 4, quantized_dimension=3,
                shape_signature=(-1, 4, 4, 8))
    v = b.tensor("state", (1, 8), np.float32, is_variable=True)
    y = b.tensor("y", (1, 8, 8, 2), np.float32)
    b.custom_op("Convolution2DTransposeBias", [x, v], [y], custom_options=b"\x01\x02\x03")
    b.output(y)
    data = b.build()
    sg = litegpu.load_model(data).subgraphs[0]
    node = sg.nodes[0]
    assert (node.op, node.opcode, node.custom_options) == ("Convolution2DTransposeBias", schema.CUSTOM_CODE,
                                                           b"\x01\x02\x03")
    tx, tv = sg.tensors[x], sg.tensors[v]
    assert tx.dtype == np.int8 and tx.shape == (1, 4, 4, 8) and tx.shape_signature == (-1, 4, 4, 8)
    np.testing.assert_array_equal(tx.quantization.scales, np.array([0.1, 0.2] * 4, np.float32))
    np.testing.assert_array_equal(tx.quantization.zero_points, [0, 1] * 4)
    assert tx.quantization.quantized_dimension == 3
    assert tv.is_variable and not tx.is_variable
    m = _tflite_model(data)
    t = m.Subgraphs(0).Tensors(x)
    assert t.Quantization().QuantizedDimension() == 3
    assert list(t.ShapeSignatureAsNumpy()) == [-1, 4, 4, 8]
    assert m.Subgraphs(0).Tensors(v).IsVariable()
    assert m.OperatorCodes(0).CustomCode() == b"Convolution2DTransposeBias"


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int8, np.uint8, np.int16, np.int32, np.int64,
                                   np.bool_, np.float64])
def test_constants_keep_dtype_and_values(dtype):
    value = (np.arange(24).reshape(2, 3, 4) % 5).astype(dtype)
    b = ModelBuilder()
    c = b.const("c", value)
    x = b.input("x", (2, 3, 4), dtype)
    b.output(c, x)
    model = litegpu.load_model(b.build())
    got = model.subgraphs[0].tensors[c]
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got.data, value)
    assert got.data.ctypes.data % 16 == 0 or dtype in (np.bool_,)  # force_align 16 of Buffer.data


def test_const_dtype_converts_the_array():
    b = ModelBuilder()
    c = b.const("w", np.array([1.5, -2.25], np.float64), dtype=np.float16)
    b.output(c)
    got = litegpu.load_model(b.build()).subgraphs[0].tensors[c]
    assert got.type_name == "FLOAT16" and got.data.tolist() == [1.5, -2.25]


def test_resource_tensors_take_tensor_type_names():
    b = ModelBuilder()
    h = b.tensor("h", (), "RESOURCE")
    b.op("VAR_HANDLE", [], [h], container="c", shared_name="var0")
    b.output(h)
    sg = litegpu.load_model(b.build()).subgraphs[0]
    assert sg.tensors[h].type_name == "RESOURCE"
    assert sg.nodes[0].options == {"container": "c", "shared_name": "var0"}


def _nondefault(field: str, kind: str, default):
    """A value for ``field`` different from its default, and how the reader returns it."""
    if field in ENUM_FIELDS:
        names = ENUM_FIELDS[field]
        name = next(n for n, code in sorted(names.items(), key=lambda kv: kv[1]) if code != default and code > 0)
        return name, names[name]
    if kind == "bool":
        return (not default), (not default)
    if kind in ("byte", "ubyte"):
        return 1 if default != 1 else 2, 1 if default != 1 else 2
    if kind in ("int", "uint", "long", "ulong"):
        return default + 3, default + 3
    if kind in ("float", "double"):
        return 0.375, 0.375
    if kind == "string":
        return "name_x", "name_x"
    if kind == "[int]":
        return [3, -1, 7], [3, -1, 7]
    if kind == "[float]":
        return [0.5, 1.25], [0.5, 1.25]
    raise AssertionError(f"no test value for {kind}")


def _camel(field: str) -> str:
    return "".join(p[:1].upper() + p[1:] for p in field.split("_"))


_DEPRECATED_FIELDS = {("ResizeBilinearOptions", "new_height"), ("ResizeBilinearOptions", "new_width")}
_TABLE_OPS = {}
for _op, _table in schema.OP_OPTIONS.items():
    _TABLE_OPS.setdefault(_table, _op)


@pytest.mark.parametrize("table", sorted(_TABLE_OPS))
def test_options_round_trip(table):
    op = _TABLE_OPS[table]
    fields = schema.OPTIONS_BY_NAME[table][1]
    kwargs, expected = {}, {}
    for name, kind, default in fields:
        kwargs[name], expected[name] = _nondefault(name, kind, default)
    b = ModelBuilder()
    for _ in range(4):  # control-flow options name subgraphs: make the indices valid
        sub = b.subgraph()
        sub.output(sub.input("s", (1,), np.float32))
    if op in ("IF", "WHILE", "CALL_ONCE"):
        kwargs = {k: 1 + (v % 3) for k, v in kwargs.items()}
        expected = dict(kwargs)
    x = b.input("x", (1,), np.float32)
    y = b.tensor("y", (1,), np.float32)
    b.op(op, [x], [y], **kwargs)
    b.output(y)
    data = b.build()

    node = litegpu.load_model(data).subgraphs[0].nodes[0]
    assert node.op == op
    assert node.options == expected

    # Independent reader: the tflite package's generated accessors, slot by slot.
    top = _tflite_model(data).Subgraphs(0).Operators(0)
    assert top.BuiltinOptionsType() == getattr(tflite.BuiltinOptions, table)
    raw = top.BuiltinOptions()
    opts = getattr(tflite, table)()
    opts.Init(raw.Bytes, raw.Pos)
    for name, kind, _ in fields:
        accessor = _camel(name)
        if not hasattr(opts, accessor) and not hasattr(opts, accessor + "AsNumpy"):
            # Deprecated in schema.fbs (the slot is kept, the accessor is not generated).
            assert (table, name) in _DEPRECATED_FIELDS
            continue
        if kind.startswith("["):
            value = getattr(opts, accessor + "AsNumpy")().tolist()
        else:
            value = getattr(opts, accessor)()
            if kind == "string":
                value = value.decode()
        if isinstance(value, float):
            assert value == pytest.approx(expected[name]), name
        else:
            assert value == expected[name], name


def test_options_table_defaults_follow_schema_names():
    assert options_table_for("CONV_2D") == "Conv2DOptions"
    assert options_table_for("REVERSE_SEQUENCE") == "ReverseSequenceOptions"
    assert options_table_for("TOPK_V2") == "TopKV2Options"
    assert options_table_for("RELU") is None


@pytest.mark.parametrize("call, message", [
    (lambda b, x, y: b.op("NOT_AN_OP", [x], [y]), "NOT_AN_OP"),
    (lambda b, x, y: b.op("CONV_2D", [x], [y], strides=2), "strides"),
    (lambda b, x, y: b.op("CONV_2D", [x], [y], padding="SOMETIMES"), "SOMETIMES"),
    (lambda b, x, y: b.op("RELU", [x], [y], alpha=0.1), "RELU"),
    (lambda b, x, y: b.op("ADD", [x, 7], [y]), "7"),
    (lambda b, x, y: b.tensor("s", (1,), "NOT_A_TYPE"), "NOT_A_TYPE"),
    (lambda b, x, y: b.const("c", np.array(["a"])), "c"),
])
def test_mistakes_raise_invalid_argument_naming_them(call, message):
    b = ModelBuilder()
    x = b.input("x", (1,), np.float32)
    y = b.tensor("y", (1,), np.float32)
    with pytest.raises(InvalidArgumentError, match=message):
        call(b, x, y)
