"""STABLEHLO_COMPOSITE: decompositions inlined at load, fused ops by name, and the
FlexBuffers reader of their attributes. LiteRT (which calls the decomposition subgraph)
is the oracle for the values."""
from __future__ import annotations

import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter as LiteRT
from flatbuffers import flexbuffers

import litegpu
from litegpu.errors import ModelFormatError
from litegpu.model import load_model
from litegpu.model.flexbuffers import loads
from litegpu.ops.registry import OpDef, TensorSpec, _REGISTRY, register
from litegpu.testing.builder import ModelBuilder

SHAPE = (2, 8)


def _norm_body(d, x_shape=SHAPE):
    """x * rsqrt(mean(x*x) + eps): an rms norm as litert-torch decomposes it."""
    x = d.input("x", x_shape, np.float32)
    sq = d.tensor("sq", x_shape, np.float32)
    d.op("MUL", [x, x], [sq])
    mean = d.tensor("mean", (x_shape[0], 1), np.float32)
    d.op("MEAN", [sq, d.const("axes", np.array([1], np.int32))], [mean], keep_dims=True)
    shifted = d.tensor("shifted", (x_shape[0], 1), np.float32)
    d.op("ADD", [mean, d.const("eps", np.array(1e-6, np.float32))], [shifted])
    r = d.tensor("r", (x_shape[0], 1), np.float32)
    d.op("RSQRT", [shifted], [r])
    out = d.tensor("out", x_shape, np.float32)
    d.op("MUL", [x, r], [out])
    d.output(out)


def _composite(b, inputs, outputs, body: int, name: str = "odml.test_norm", attributes=None):
    b.op("STABLEHLO_COMPOSITE", inputs, outputs, name=name, decomposition_subgraph_index=body,
         composite_attributes=flexbuffers.Dumps(attributes if attributes is not None else {"epsilon": 1e-6}))


def norm_model(name: str = "odml.test_norm", attributes=None) -> bytes:
    b = ModelBuilder()
    x = b.input("x", SHAPE, np.float32)
    y = b.tensor("y", SHAPE, np.float32)
    _norm_body(b.subgraph("decomposition"))
    _composite(b, [x], [y], 1, name, attributes)
    z = b.tensor("z", SHAPE, np.float32)
    b.op("ADD", [y, x], [z])
    b.output(z)
    return b.build()


def _run(make, data: bytes, feeds: list[np.ndarray]) -> list[np.ndarray]:
    it = make(data)
    it.allocate_tensors()
    for d, v in zip(it.get_input_details(), feeds):
        it.set_tensor(d["index"], v)
    it.invoke()
    return [it.get_tensor(d["index"]) for d in it.get_output_details()]


def _both(data: bytes, feeds: list[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    return (_run(lambda d: litegpu.Interpreter(model_content=d), data, feeds),
            _run(lambda d: LiteRT(model_content=d), data, feeds))


X = np.random.default_rng(7).standard_normal(SHAPE).astype(np.float32)


def _close(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    """Within a float32 ulp or two: XNNPACK's RSQRT and MEAN round their own way."""
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)


def test_a_composite_runs_as_its_decomposition():
    _close(*_both(norm_model(), [X]))
    sg = load_model(norm_model()).subgraphs[0]
    # Inlined nodes come after the file's two operators; the file's count is unchanged.
    assert [(n.index, n.op) for n in sg.nodes] == [(2, "MUL"), (3, "MEAN"), (4, "ADD"), (5, "RSQRT"), (6, "MUL"),
                                                   (1, "ADD")]
    assert sg.nodes_in_file == 2
    assert sg.inlined_composites == ((0, "odml.test_norm", 5),)
    assert [t.name for t in sg.tensors[3:]] == [f"odml.test_norm/{n}" for n in
                                                ("sq", "axes", "mean", "eps", "shifted", "r")]
    assert sg.tensors[4].is_constant and sg.tensors[4].index == 4


def test_the_report_counts_the_file_s_nodes_and_names_the_inlined_composite():
    it = litegpu.Interpreter(model_content=norm_model())
    it.allocate_tensors()
    counts = it.get_delegation_report().counts()
    assert counts.startswith("2 nodes in the file: 1 composites replaced by their decomposition's 5 nodes "
                             "(odml.test_normx1)"), counts


def test_nested_composites_and_an_input_passed_straight_out():
    b = ModelBuilder()
    x = b.input("x", SHAPE, np.float32)
    y, same = b.tensor("y", SHAPE, np.float32), b.tensor("same", SHAPE, np.float32)
    outer = b.subgraph("outer")              # subgraph 1: calls the norm (2), and hands x back as is
    ox = outer.input("ox", SHAPE, np.float32)
    oy = outer.tensor("oy", SHAPE, np.float32)
    _composite(outer, [ox], [oy], 2, "odml.inner")
    outer.output(oy, ox)
    _norm_body(b.subgraph("inner"))
    _composite(b, [x], [y, same], 1, "odml.outer")
    b.output(y, same)
    data = b.build()
    _close(*_both(data, [X]))
    sg = load_model(data).subgraphs[0]
    assert [n.op for n in sg.nodes] == ["MUL", "MEAN", "ADD", "RSQRT", "MUL", "RESHAPE"]
    assert sg.nodes_in_file == 1


@pytest.fixture
def fused_norm():
    """A fused op registered under the composite's name, as litegpu.ops registers its own."""
    seen = []

    def reference(inputs, attrs):
        seen.append(attrs["epsilon"])
        x = inputs[0].astype(np.float32)
        return [x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(attrs["epsilon"]))]

    register(OpDef(name="odml.test_norm", infer=lambda ins, a: [TensorSpec(ins[0].shape, ins[0].dtype)],
                   reference=reference, attrs=lambda node, tensors: dict(node.options)))
    yield seen
    del _REGISTRY["odml.test_norm"]


def test_a_composite_litegpu_has_an_op_for_is_one_node_of_it(fused_norm):
    sg = load_model(norm_model()).subgraphs[0]
    assert [n.op for n in sg.nodes] == ["odml.test_norm", "ADD"]
    assert sg.nodes[0].options == {"epsilon": 1e-6, "decomposition_subgraph_index": 1}
    _close(*_both(norm_model(), [X]))
    assert fused_norm and fused_norm[0] == 1e-6
    # Asked not to fuse, the same file runs the decomposition.
    assert [n.op for n in load_model(norm_model(), fuse_composites=False).subgraphs[0].nodes][0] == "MUL"


def test_damaged_attributes_of_a_fused_composite_name_the_node(fused_norm):
    b = ModelBuilder()
    x = b.input("x", SHAPE, np.float32)
    y = b.tensor("y", SHAPE, np.float32)
    _norm_body(b.subgraph("decomposition"))
    b.op("STABLEHLO_COMPOSITE", [x], [y], name="odml.test_norm", decomposition_subgraph_index=1,
         composite_attributes=b"\x07\x00\x09\x20\x01")
    b.output(y)
    with pytest.raises(ModelFormatError, match=r"operator 0 \(odml.test_norm\) composite attributes"):
        load_model(b.build())


@pytest.mark.parametrize("body, why", [(5, "out of range"), (0, "cycle")])
def test_a_decomposition_out_of_range_or_calling_itself_is_refused(body, why):
    b = ModelBuilder()
    x = b.input("x", SHAPE, np.float32)
    y = b.tensor("y", SHAPE, np.float32)
    _composite(b, [x], [y], body)
    b.output(y)
    with pytest.raises(ModelFormatError, match=why):
        load_model(b.build())


def test_a_decomposition_of_another_arity_is_refused():
    b = ModelBuilder()
    x = b.input("x", SHAPE, np.float32)
    y = b.tensor("y", SHAPE, np.float32)
    _norm_body(b.subgraph("decomposition"))
    _composite(b, [x, x], [y], 1)
    b.output(y)
    with pytest.raises(ModelFormatError, match="takes 2 inputs and gives 1 outputs, its decomposition subgraph 1 1"):
        load_model(b.build())


VALUES = [{"epsilon": 1e-6, "name": "x", "flag": True, "n": 3, "big": 1 << 40, "neg": -5, "ints": [1, 2, 3],
           "floats": [1.5, 2.5], "mixed": [1, "a", 2.5, None, {"k": [True, False]}], "blob": b"\x00\x01",
           "nested": {"a": {"b": "c"}}},
          [1, 2], [1.0, 2.0, 3.0], "hello", 3.25, -7, True, None]


@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
def test_flexbuffers_read_what_the_flatbuffers_package_writes(value):
    data = flexbuffers.Dumps(value)
    assert loads(data) == flexbuffers.Loads(data)


def test_flexbuffers_typed_and_fixed_vectors():
    b = flexbuffers.Builder()
    with b.Map():
        b.Key("ints")
        b.TypedVectorFromElements([1, 2, 3])
        b.Key("fixed")
        b.FixedTypedVectorFromElements([1.0, 2.0, 3.0])
        b.Key("u")
        b.UInt(7)
    assert loads(b.Finish()) == {"ints": [1, 2, 3], "fixed": [1.0, 2.0, 3.0], "u": 7}


def test_damaged_flexbuffers_raise_model_format_errors_only():
    rng = np.random.default_rng(1)
    base = flexbuffers.Dumps(VALUES[0])
    refused = 0
    for _ in range(3000):
        data = bytearray(base)
        for _ in range(rng.integers(1, 4)):
            data[rng.integers(len(data))] = rng.integers(256)
        try:
            loads(bytes(data))
        except ModelFormatError:
            refused += 1
    assert refused > 100
    for short in (b"", b"\x01", b"\x00\x05"):
        with pytest.raises(ModelFormatError):
            loads(short)
