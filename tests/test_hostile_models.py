"""Broken and hostile model files: each gives a clean ModelFormatError naming the field.

The files are made by writing small models with wrong values (with the ``tflite``
package's builder functions, see ``test_reader.tflite_bytes``) and by editing the
bytes of valid models, both built ones and copies of the shared models (in
``tmp_path``; each test on a shared model skips, saying so, where they are not here).
A bit flip may leave a model valid; then it must load cleanly.
"""
from __future__ import annotations

import random
import re
import struct
from pathlib import Path

import numpy as np
import pytest
import tflite

import litegpu
from litegpu.executor import Limits
from litegpu.model.flatbuf import Buffer, Table
from litegpu.ops.shape import strided_slice_plan
from litegpu.testing.builder import ModelBuilder
import built_models
from test_reader import ADD, add_const_model, add_options, tflite_bytes

F32 = tflite.TensorType.FLOAT32


def expect_error(source, *patterns: str, error: type = litegpu.ModelFormatError) -> str:
    """Load ``source``; it must raise ``error`` whose message matches every regex pattern."""
    with pytest.raises(error) as info:
        litegpu.load_model(source)
    message = str(info.value)
    for p in patterns:
        assert re.search(p, message), f"{p!r} not in {message!r}"
    return message


def small_model() -> bytes:
    """``y = x + w`` on [2, 3] float32: a valid model of a few hundred bytes."""
    return add_const_model(np.arange(6, dtype=np.float32).reshape(2, 3))


def graph(tensors: list[dict], ops: list[dict], inputs=(0,), outputs=None, extra_subgraphs=(),
          opcodes=None, buffers=None, signatures=()) -> bytes:
    """A model from a tensor list and an op list (defaults: ADD opcodes, empty buffer 0)."""
    main = {"tensors": tensors, "ops": ops, "inputs": list(inputs),
            "outputs": list(outputs if outputs is not None else [len(tensors) - 1])}
    return tflite_bytes([main, *extra_subgraphs], buffers or [b""], opcodes or [ADD], signatures)


def t(shape=(2,), **kw) -> dict:
    """A float32 tensor description."""
    return {"shape": list(shape), "type": F32, **kw}


def add(inputs, outputs) -> dict:
    """An ADD operator description (opcode 0)."""
    return {"opcode": 0, "inputs": list(inputs), "outputs": list(outputs),
            "options": (tflite.BuiltinOptions.AddOptions, add_options)}


# ---------------------------------------------------------------------------------------------
# Locating fields in real files, to edit their bytes.
# ---------------------------------------------------------------------------------------------
def root(data: bytes) -> Table:
    """The Model table of ``data`` (read with litegpu's checked accessors)."""
    return Buffer(data).root(b"TFL3")


def vector_at(table: Table, slot: int) -> tuple[int, int]:
    """(position of the first element, element count) of vector field ``slot``."""
    start, n = table._vector(slot, 1, f"slot{slot}")
    assert start, f"{table.path} has no field {slot}"
    return start, n


def patched(data: bytes, pos: int, fmt: str, value) -> bytes:
    """``data`` with ``value`` packed as ``fmt`` at ``pos``."""
    out = bytearray(data)
    struct.pack_into(fmt, out, pos, value)
    return bytes(out)


@pytest.fixture(params=["built", "dynamic_batch_mlp"])
def mlp(request, tmp_path: Path, shared_model) -> tuple[Path, bytes]:
    """An MLP in tmp_path, and its bytes: one written by litegpu's builder (everywhere), and
    a copy of the shared dynamic_batch_mlp, as TensorFlow's converter laid it out."""
    data = built_models.mlp() if request.param == "built" else shared_model(request.param).read_bytes()
    path = tmp_path / "mlp.tflite"
    path.write_bytes(data)
    return path, data


# ---------------------------------------------------------------------------------------------
# Not a model at all.
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("source, pattern", [
    (b"", "empty"),
    (bytearray(), "empty"),
    (b"TFL3", "too short"),
    (b"\x00" * 7, "too short"),
    (12345, "path or bytes"),
    (None, "path or bytes"),
    ([1, 2, 3], "path or bytes"),
    (3.5, "path or bytes"),
])
def test_not_a_model(source, pattern: str) -> None:
    expect_error(source, pattern)


def test_empty_file_and_missing_file(tmp_path: Path) -> None:
    empty = tmp_path / "empty.tflite"
    empty.write_bytes(b"")
    expect_error(empty, "empty")
    expect_error(tmp_path / "missing.tflite", "cannot read")
    expect_error(tmp_path, "cannot read")  # a directory


def test_wrong_file_identifier(mlp) -> None:
    path, data = mlp
    path.write_bytes(data[:4] + b"TFL2" + data[8:])
    expect_error(path, "file identifier", "TFL2")
    expect_error(b"\x10\x00\x00\x00PK\x03\x04" + bytes(64), "file identifier")


# ---------------------------------------------------------------------------------------------
# Truncation and bit flips.
# ---------------------------------------------------------------------------------------------
_NAMES_A_PLACE = re.compile(r"Model|model is \d+ bytes|model content is empty|root table")


@pytest.mark.parametrize("which", ["built", "dynamic_batch_mlp", "stateful_counter"])
def test_truncated_everywhere(which: str, shared_model) -> None:
    data = small_model() if which == "built" else shared_model(which).read_bytes()
    n = len(data)
    cuts = sorted(set(range(64)) | {n * k // 100 for k in range(1, 100)} | {n - 1, n - 4})
    for cut in cuts:
        message = expect_error(data[:cut])
        assert _NAMES_A_PLACE.search(message), f"cut at {cut}: {message}"


def _load_or_clean_error(data: bytes) -> bool:
    """True when ``data`` loads; a LiteGpuError is fine; anything else fails the test.

    Mostly ModelFormatError; a ResourceLimitError when a flip makes a sparse weight huge.
    """
    try:
        litegpu.load_model(data)
        return True
    except litegpu.LiteGpuError as exc:
        assert str(exc)
        return False


def test_every_single_bit_flip_of_a_small_model() -> None:
    data = small_model()
    loaded = 0
    for pos in range(len(data)):
        for bit in range(8):
            mutated = bytearray(data)
            mutated[pos] ^= 1 << bit
            loaded += _load_or_clean_error(bytes(mutated))
    # Flips in names, weights and padding keep the file valid; flips in offsets must not.
    assert 0 < loaded < 8 * len(data)


@pytest.mark.parametrize("name", ["dynamic_batch_mlp", "lstm_classifier", "stateful_counter"])
def test_bit_flips_of_shared_models(name: str, shared_model) -> None:
    data = shared_model(name).read_bytes()
    rng = np.random.default_rng(7)
    positions = sorted(set(range(64)) | set(rng.integers(0, len(data), 250).tolist()))
    for pos in positions:
        mutated = bytearray(data)
        mutated[pos] ^= 1 << int(rng.integers(8))
        _load_or_clean_error(bytes(mutated))


# ---------------------------------------------------------------------------------------------
# Flatbuffer structure: offsets, vtables, lengths.
# ---------------------------------------------------------------------------------------------
def test_root_offset_outside(mlp) -> None:
    path, data = mlp
    path.write_bytes(patched(data, 0, "<I", len(data) + 100))
    expect_error(path, "root table offset", "outside")


def test_vtable_offset_pointing_outside(mlp) -> None:
    path, data = mlp
    model_pos = root(data).pos
    for soffset in (-(1 << 30), 1 << 30, model_pos + 1):  # after the end, before the start
        path.write_bytes(patched(data, model_pos, "<i", soffset))
        expect_error(path, r"Model vtable", "outside")


def test_vtable_field_offset_past_its_table(mlp) -> None:
    path, data = mlp
    sg = root(data).tables(2, "subgraphs")[0]
    # Field 0 (tensors) of the subgraph table: its entry in the vtable, pointed past the table.
    path.write_bytes(patched(data, sg._vt + 4, "<H", sg._objlen + 8))
    expect_error(path, r"Model\.subgraphs\[0\]\.tensors", "outside its table")


def test_vtable_size_invalid(mlp) -> None:
    path, data = mlp
    m = root(data)
    path.write_bytes(patched(data, m._vt, "<H", 3))
    expect_error(path, "Model: vtable size 3")


@pytest.mark.parametrize("length", [1 << 31, 0xFFFFFFFF, 1 << 20])
def test_vector_length_too_large(mlp, length: int) -> None:
    path, data = mlp
    sg = root(data).tables(2, "subgraphs")[0]
    start, _ = vector_at(sg, 0)  # tensors
    path.write_bytes(patched(data, start - 4, "<I", length))
    expect_error(path, r"Model\.subgraphs\[0\]\.tensors", f"{length} elements", "outside")


def test_shape_vector_length_too_large(mlp) -> None:
    path, data = mlp
    tensor = root(data).tables(2, "subgraphs")[0].tables(0, "tensors")[3]
    start, _ = vector_at(tensor, 0)
    path.write_bytes(patched(data, start - 4, "<I", 1 << 31))
    expect_error(path, r"tensors\[3\]\.shape")


def test_string_length_too_large(mlp) -> None:
    path, data = mlp
    tensor = root(data).tables(2, "subgraphs")[0].tables(0, "tensors")[1]
    start, _ = vector_at(tensor, 3)  # name
    path.write_bytes(patched(data, start - 4, "<I", 1 << 31))
    expect_error(path, r"tensors\[1\]\.name")


def test_table_offset_in_vector_outside(mlp) -> None:
    path, data = mlp
    start, _ = vector_at(root(data).tables(2, "subgraphs")[0], 3)  # operators
    path.write_bytes(patched(data, start + 4, "<I", 0xFFFFFF00))
    expect_error(path, r"operators\[1\]", "outside")


def test_zero_offset(mlp) -> None:
    path, data = mlp
    start, _ = vector_at(root(data), 2)  # subgraphs
    path.write_bytes(patched(data, start, "<I", 0))
    expect_error(path, r"Model\.subgraphs\[0\]")


# ---------------------------------------------------------------------------------------------
# Indices out of range.
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("index", [3, 1000, -2, 0x7FFFFFFF])
def test_operator_input_index_out_of_range(index: int) -> None:
    data = graph([t(), t(buffer=1), t()], [add([0, index], [2])],
                 buffers=[b"", np.ones(2, np.float32).tobytes()])
    expect_error(data, r"operators\[0\]\.inputs\[1\]", f"tensor index {index} out of range")


def test_operator_output_index_out_of_range() -> None:
    expect_error(graph([t(), t()], [add([0, 0], [5])]), r"operators\[0\]\.outputs\[0\]", "5 out of range")
    expect_error(graph([t(), t()], [add([0, 0], [-1])]), r"operators\[0\]\.outputs\[0\]", "-1 out of range")


def test_subgraph_input_and_output_index_out_of_range() -> None:
    expect_error(graph([t(), t()], [add([0, 0], [1])], inputs=[7]), r"subgraphs\[0\]\.inputs\[0\]")
    expect_error(graph([t(), t()], [add([0, 0], [1])], outputs=[-1]), r"subgraphs\[0\]\.outputs\[0\]")


def test_buffer_index_out_of_range() -> None:
    data = graph([t(), t(buffer=9), t()], [add([0, 1], [2])])
    expect_error(data, r"tensors\[1\]\.buffer", "buffer index 9 out of range")


def test_opcode_index_out_of_range() -> None:
    op = add([0, 0], [1])
    op["opcode"] = 4
    expect_error(graph([t(), t()], [op]), r"operators\[0\]\.opcode_index", "4 out of range")


def test_operator_input_index_edited_in_the_mlp(mlp) -> None:
    path, data = mlp
    ops = root(data).tables(2, "subgraphs")[0].tables(3, "operators")
    start, n = vector_at(ops[2], 1)  # operator 2's inputs
    ntensors = len(litegpu.load_model(data).subgraphs[0].tensors)
    path.write_bytes(patched(data, start + 4 * (n - 1), "<i", ntensors))
    expect_error(path, rf"operators\[2\]\.inputs\[{n - 1}\]", f"tensor index {ntensors} out of range")


def test_tensor_buffer_index_edited_in_the_mlp(mlp) -> None:
    path, data = mlp
    m = root(data)
    nbuffers = vector_at(m, 4)[1]
    tensor = m.tables(2, "subgraphs")[0].tables(0, "tensors")[2]
    pos = tensor._field(2, 4, "buffer")
    path.write_bytes(patched(data, pos, "<I", nbuffers + 3))
    expect_error(path, r"tensors\[2\]\.buffer", "out of range")


def test_signature_indices_out_of_range() -> None:
    tensors, ops = [t(), t()], [add([0, 0], [1])]
    expect_error(graph(tensors, ops, signatures=[("s", 3, {"x": 0}, {"y": 1})]), r"signature_defs\[0\]\.subgraph_index")
    expect_error(graph(tensors, ops, signatures=[("s", 0, {"x": 0}, {"y": 8})]),
                 r"signature_defs\[0\]\.outputs\[0\]\.tensor_index", "8 out of range")


# ---------------------------------------------------------------------------------------------
# Shapes and types.
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape, pattern", [
    ([-5, 3], r"tensors\[0\]\.shape\[0\]: dimension -5 is negative"),
    ([2, -1], r"tensors\[0\]\.shape\[1\]: dimension -1 is negative"),
    ([-(1 << 31)], r"tensors\[0\]\.shape\[0\]"),
    ([0x7FFFFFFF] * 3, r"tensors\[0\]\.shape.*over the limit"),
    ([1] * 17, r"tensors\[0\]\.shape: rank 17"),
])
def test_bad_shapes(shape, pattern: str) -> None:
    expect_error(graph([t(shape), t(shape)], [add([0, 0], [1])]), pattern)


def test_shape_edited_in_the_mlp(mlp) -> None:
    path, data = mlp
    tensor = root(data).tables(2, "subgraphs")[0].tables(0, "tensors")[0]
    start, _ = vector_at(tensor, 0)
    path.write_bytes(patched(data, start + 4, "<i", -7))
    expect_error(path, r"tensors\[0\]\.shape\[1\]: dimension -7")


def test_huge_activation_is_a_limit_error_at_allocation() -> None:
    # Valid to read (a shape is only a number), but allocating it must be refused cleanly.
    shape = [1 << 20, 1 << 18]  # 2^38 float32 elements: 1 TiB
    data = graph([t(shape), t(shape)], [add([0, 0], [1])])
    model = litegpu.load_model(data)
    assert model.subgraphs[0].tensors[1].shape == tuple(shape)
    if not hasattr(litegpu, "Interpreter"):
        pytest.skip("no Interpreter yet")
    with pytest.raises(litegpu.LiteGpuError):
        it = litegpu.Interpreter(model_content=data)
        it.allocate_tensors()


def test_strided_slice_of_a_huge_dimension_is_planned_in_constant_memory() -> None:
    # Found by the fuzzer: the slice plan listed every index along each axis, so a
    # dimension of 860 million exhausted memory before the allocation limit was checked.
    b = ModelBuilder()
    x = b.input("x", (2, 3, 860_636_756, 5), np.float32)
    begin, end, strides = (b.const(n, np.array(v, np.int32)) for n, v in
                           (("begin", [0, 0]), ("end", [1, 2]), ("strides", [1, 1])))
    y = b.tensor("y", (1, 2, 860_636_756, 5), np.float32)
    b.op("STRIDED_SLICE", [x, begin, end, strides], [y])
    b.output(y)
    with pytest.raises(litegpu.ResourceLimitError, match="bytes of tensor memory"):
        it = litegpu.Interpreter(model_content=b.build(), limits=Limits(max_bytes=1 << 28))
        it.allocate_tensors()
    eff_shape, indices, out_shape = strided_slice_plan((2, 3, 860_636_756, 5), [0, 0], [1, 2], [1, 1],
                                                       {"begin_mask": 0, "end_mask": 0, "ellipsis_mask": 0,
                                                        "new_axis_mask": 0, "shrink_axis_mask": 0,
                                                        "offset": False})
    assert out_shape == (1, 2, 860_636_756, 5) and len(indices[2]) == 860_636_756


def test_convolution_of_an_input_without_channels_is_a_format_error() -> None:
    # Found by the fuzzer: 0 input channels make 0 groups, and the check of the filter's
    # output channels divided by them (ZeroDivisionError; LiteRT's C++ divides by zero too).
    b = ModelBuilder()
    x = b.input("x", (1, 8, 8, 0), np.float32)
    w = b.const("w", np.ones((6, 3, 3, 2), np.float32))
    y = b.tensor("y", (1, 6, 6, 6), np.float32)
    b.op("CONV_2D", [x, w, b.const("bias", np.zeros(6, np.float32))], [y], padding="VALID",
         stride_w=1, stride_h=1)
    b.output(y)
    with pytest.raises(litegpu.ModelFormatError, match=r"CONV_2D.*0 groups of input 0"):
        litegpu.Interpreter(model_content=b.build()).allocate_tensors()


def test_constant_size_does_not_match_its_shape() -> None:
    data = graph([t([2, 3]), t([2, 3], buffer=1), t([2, 3])], [add([0, 1], [2])],
                 buffers=[b"", np.ones(5, np.float32).tobytes()])
    expect_error(data, r"tensors\[1\]\.buffer: holds 20 bytes", "needs 24")


def test_unknown_tensor_type() -> None:
    expect_error(graph([t(type=99), t()], [add([0, 0], [1])]), r"tensors\[0\]\.type: unknown tensor type 99")


def test_quantization_does_not_fit() -> None:
    bad_dim = t([2, 3], scale=[0.5, 0.25, 0.125], zero_point=[0, 0, 0], quantized_dimension=5)
    expect_error(graph([bad_dim, t([2, 3])], [add([0, 0], [1])]), r"quantization\.quantized_dimension: 5")
    bad_zp = t([2, 3], scale=[0.5, 0.25, 0.125], zero_point=[0, 0], quantized_dimension=1)
    expect_error(graph([bad_zp, t([2, 3])], [add([0, 0], [1])]), "3 scales but 2 zero points")


# ---------------------------------------------------------------------------------------------
# Operators and dataflow.
# ---------------------------------------------------------------------------------------------
def test_node_reads_its_own_output() -> None:
    expect_error(graph([t(), t()], [add([0, 1], [1])]), r"operators\[0\].*reads its own output tensor 1")


def test_cycle() -> None:
    # op 0 reads tensor 2, which op 1 produces later; op 1 reads op 0's output.
    data = graph([t(), t(), t()], [add([0, 2], [1]), add([1, 0], [2])])
    expect_error(data, r"operators\[0\].*reads tensor 2 before any operator produces it")


def test_two_producers() -> None:
    data = graph([t(), t(), t()], [add([0, 0], [1]), add([0, 0], [1]), add([1, 1], [2])])
    expect_error(data, r"operators\[1\]: tensor 1 is already produced by operator 0")


def test_operator_writes_a_subgraph_input() -> None:
    data = graph([t(), t()], [add([0, 0], [1]), add([1, 1], [0])], outputs=[0])
    expect_error(data, r"operators\[1\].*writes tensor 0, an input of the subgraph")


def test_operator_writes_a_constant() -> None:
    data = graph([t(), t(buffer=1)], [add([0, 0], [1])], buffers=[b"", np.ones(2, np.float32).tobytes()])
    expect_error(data, r"operators\[0\]: writes constant tensor 1")


def test_operator_may_write_a_zero_element_tensor_with_an_empty_buffer() -> None:
    # BirdNET's SPLIT_V writes a [0]-shaped tensor whose buffer index is not 0 but whose
    # buffer is empty. LiteRT makes a tensor read-only data only when its buffer holds
    # bytes, so this is an ordinary activation; so it is here.
    data = graph([t([0]), t([0], buffer=1)], [add([0, 0], [1])], buffers=[b"", b""])
    sg = litegpu.load_model(data).subgraphs[0]
    assert not sg.tensors[1].is_constant
    it = litegpu.Interpreter(model_content=data)
    it.allocate_tensors()
    it.set_tensor(0, np.zeros(0, np.float32))
    it.invoke()
    assert it.get_tensor(1).shape == (0,)
    # Unwritten, the same tensor is an empty constant (the axes of a reduction, say).
    unwritten = graph([t([0]), t([0], buffer=1), t([0])], [add([0, 1], [2])], buffers=[b"", b""])
    assert litegpu.load_model(unwritten).subgraphs[0].tensors[1].is_constant
    # A constant that holds data stays refused: LiteRT cannot resize a read-only tensor.
    test_operator_writes_a_constant()


def test_dynamic_fully_connected_input_stores_a_placeholder_shape() -> None:
    # BirdNET stores [1, 1] as the shape of a [-1, -1] FULLY_CONNECTED input made by a
    # RESHAPE: the stored shape is not the real one and must not be checked against K.
    b = ModelBuilder()
    x = b.input("x", (2, 4), np.float32, shape_signature=(-1, 4))
    rows = b.tensor("rows", (1, 1), np.float32, shape_signature=(-1, -1))
    b.op("RESHAPE", [x, b.const("shape", np.array([-1, 4], np.int32))], [rows])
    w = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    y = b.tensor("y", (1, 3), np.float32, shape_signature=(-1, 3))
    b.op("FULLY_CONNECTED", [rows, b.const("w", w), -1], [y])
    b.output(y)
    it = litegpu.Interpreter(model_content=b.build())
    it.allocate_tensors()
    xv = np.arange(8, dtype=np.float32).reshape(2, 4)
    it.set_tensor(0, xv)
    it.invoke()
    np.testing.assert_allclose(it.get_tensor(y), xv @ w.T, rtol=1e-6)


def test_output_never_produced() -> None:
    expect_error(graph([t(), t(), t()], [add([0, 0], [1])], outputs=[2]), r"subgraphs\[0\]\.outputs: tensor 2")


def test_no_subgraph() -> None:
    expect_error(tflite_bytes([], [b""], [ADD]), "Model.subgraphs: the model has no subgraph")


@pytest.mark.parametrize("codes, pattern", [
    ({"deprecated": -3, "builtin": -5}, r"operator_codes\[0\]\.builtin_code: -3 is negative"),
    ({"deprecated": -1, "builtin": -1}, r"operator_codes\[0\]\.builtin_code: -1 is negative"),
    ({"builtin": tflite.BuiltinOperator.CUSTOM}, r"operator_codes\[0\]\.custom_code: a CUSTOM operator needs a name"),
])
def test_bad_operator_codes(codes: dict, pattern: str) -> None:
    expect_error(graph([t(), t()], [{"opcode": 0, "inputs": [0, 0], "outputs": [1]}], opcodes=[codes]), pattern)


def test_options_of_the_wrong_table() -> None:
    def fc(b):
        tflite.FullyConnectedOptionsStart(b)
        return tflite.FullyConnectedOptionsEnd(b)
    op = {"opcode": 0, "inputs": [0, 0], "outputs": [1], "options": (tflite.BuiltinOptions.FullyConnectedOptions, fc)}
    expect_error(graph([t(), t()], [op]), r"operators\[0\]\.builtin_options: ADD carries FullyConnectedOptions")


def test_unknown_options_type(mlp) -> None:
    path, data = mlp
    op = root(data).tables(2, "subgraphs")[0].tables(3, "operators")[0]
    pos = op._field(3, 1, "builtin_options_type")
    assert pos, "operator 0 has options"
    path.write_bytes(patched(data, pos, "<B", 250))
    expect_error(path, r"operators\[0\]\.builtin_options_type: unknown options type 250")


# ---------------------------------------------------------------------------------------------
# Control flow: subgraph indices and recursion.
# ---------------------------------------------------------------------------------------------
WHILE = {"deprecated": tflite.BuiltinOperator.WHILE, "builtin": tflite.BuiltinOperator.WHILE}
IF = {"deprecated": tflite.BuiltinOperator.IF, "builtin": tflite.BuiltinOperator.IF}
CALL_ONCE = {"deprecated": 127, "builtin": tflite.BuiltinOperator.CALL_ONCE}


def while_options(cond: int, body: int):
    def write(b):
        tflite.WhileOptionsStart(b)
        tflite.WhileOptionsAddCondSubgraphIndex(b, cond)
        tflite.WhileOptionsAddBodySubgraphIndex(b, body)
        return tflite.WhileOptionsEnd(b)
    return (tflite.BuiltinOptions.WhileOptions, write)


def if_options(then: int, other: int):
    def write(b):
        tflite.IfOptionsStart(b)
        tflite.IfOptionsAddThenSubgraphIndex(b, then)
        tflite.IfOptionsAddElseSubgraphIndex(b, other)
        return tflite.IfOptionsEnd(b)
    return (tflite.BuiltinOptions.IfOptions, write)


def call_once_options(init: int):
    def write(b):
        tflite.CallOnceOptionsStart(b)
        tflite.CallOnceOptionsAddInitSubgraphIndex(b, init)
        return tflite.CallOnceOptionsEnd(b)
    return (tflite.BuiltinOptions.CallOnceOptions, write)


def identity_subgraph(name: str, ops=()) -> dict:
    """A subgraph ``y = x + x`` plus ``ops`` (control-flow calls)."""
    return {"name": name, "tensors": [t(), t()], "inputs": [0], "outputs": [1],
            "ops": [add([0, 0], [1]), *ops]}


def control_flow_model(options, opcode: dict, extra: list[dict]) -> bytes:
    """Main subgraph: one control-flow op (opcode 1) from tensor 0 to tensor 1."""
    op = {"opcode": 1, "inputs": [0], "outputs": [1], "options": options}
    return graph([t(), t()], [op], extra_subgraphs=extra, opcodes=[ADD, opcode])


@pytest.mark.parametrize("options, opcode, pattern", [
    (while_options(1, 5), WHILE, r"WHILE\)\.body_subgraph_index: subgraph 5 out of range \(3 subgraphs\)"),
    (while_options(-1, 2), WHILE, r"WHILE\)\.cond_subgraph_index: subgraph -1 out of range"),
    (if_options(9, 1), IF, r"IF\)\.then_subgraph_index: subgraph 9 out of range"),
    (if_options(1, 1 << 30), IF, r"IF\)\.else_subgraph_index"),
    (call_once_options(3), CALL_ONCE, r"CALL_ONCE\)\.init_subgraph_index: subgraph 3"),
])
def test_control_flow_subgraph_index_out_of_range(options, opcode: dict, pattern: str) -> None:
    data = control_flow_model(options, opcode, [identity_subgraph("cond"), identity_subgraph("body")])
    expect_error(data, pattern)


def test_control_flow_subgraphs_in_range_load() -> None:
    data = control_flow_model(while_options(1, 2), WHILE, [identity_subgraph("cond"), identity_subgraph("body")])
    model = litegpu.load_model(data)
    assert model.subgraphs[0].nodes[0].options["body_subgraph_index"] == 2


def test_while_passing_the_wrong_number_of_tensors_is_a_format_error() -> None:
    # Found by the mutation run (a vector length edited in lstm_classifier): the loop's
    # condition takes two tensors, the WHILE passes one. The model is at fault, not the caller.
    b = ModelBuilder()
    cond = b.subgraph("cond")
    a, c = cond.input("a", (1,), np.float32), cond.input("c", (1,), np.float32)
    less = cond.tensor("less", (1,), np.bool_)
    cond.op("LESS", [a, c], [less])
    cond.output(less)
    body = b.subgraph("body")
    v = body.input("v", (1,), np.float32)
    w = body.tensor("w", (1,), np.float32)
    body.op("ADD", [v, v], [w])
    body.output(w)
    x = b.input("x", (1,), np.float32)
    y = b.tensor("y", (1,), np.float32)
    b.op("WHILE", [x], [y], cond_subgraph_index=cond.index, body_subgraph_index=body.index)
    b.output(y)
    with pytest.raises(litegpu.ModelFormatError, match="subgraph 1 takes 2 inputs, its caller passes 1"):
        it = litegpu.Interpreter(model_content=b.build())
        it.allocate_tensors()
        it.set_tensor(0, np.ones(1, np.float32))
        it.invoke()


def test_while_calling_its_own_subgraph() -> None:
    data = control_flow_model(while_options(1, 0), WHILE, [identity_subgraph("cond")])
    expect_error(data, "subgraphs call each other in a cycle: 0 -> 0")


def test_recursion_through_several_subgraphs() -> None:
    # 0 -WHILE-> 2 -IF-> 3 -CALL_ONCE-> 2: a cycle not through the main subgraph.
    call_back = {"opcode": 3, "inputs": [], "outputs": [], "options": call_once_options(2)}
    call_on = {"opcode": 2, "inputs": [0], "outputs": [], "options": if_options(3, 1)}
    sub1 = identity_subgraph("cond")
    sub2 = identity_subgraph("body", [call_on])
    sub3 = identity_subgraph("then", [call_back])
    main_op = {"opcode": 1, "inputs": [0], "outputs": [1], "options": while_options(1, 2)}
    data = graph([t(), t()], [main_op], extra_subgraphs=[sub1, sub2, sub3], opcodes=[ADD, WHILE, IF, CALL_ONCE])
    expect_error(data, r"cycle: .*2 -> 3 -> 2")


def test_while_body_index_edited_in_shared_model(tmp_path: Path, shared_model) -> None:
    data = shared_model("lstm_classifier").read_bytes()
    model = litegpu.load_model(data)
    node = next(n for n in model.subgraphs[0].nodes if n.op == "WHILE")
    op = root(data).tables(2, "subgraphs")[0].tables(3, "operators")[node.index]
    options = op.table(4, "builtin_options")
    pos = options._field(1, 4, "body_subgraph_index")
    path = tmp_path / "lstm.tflite"
    for value, pattern in ((len(model.subgraphs), "out of range"), (0, "cycle: 0 -> 0")):
        path.write_bytes(patched(data, pos, "<i", value))
        expect_error(path, pattern)


# ---------------------------------------------------------------------------------------------
# Weights.
# ---------------------------------------------------------------------------------------------
def test_external_buffer_outside_the_file() -> None:
    w = np.ones(4, np.float32)
    expect_error(add_const_model(w, buffer_entry=("external", 1 << 40, 16)), r"buffers\[1\] \(offset/size\)")
    expect_error(add_const_model(w, buffer_entry=("external", 64, 1 << 62)), r"buffers\[1\] \(offset/size\)")


def test_dequantize_fold_shape_mismatch() -> None:
    dequant = {"deprecated": tflite.BuiltinOperator.DEQUANTIZE, "builtin": tflite.BuiltinOperator.DEQUANTIZE}
    half = np.ones(3, np.float16).tobytes()
    data = graph([t([3], type=tflite.TensorType.FLOAT16, buffer=1), t([4]), t([4]), t([4])],
                 [{"opcode": 1, "inputs": [0], "outputs": [1]}, add([2, 1], [3])],
                 inputs=[2], opcodes=[ADD, dequant], buffers=[b"", half])
    expect_error(data, r"operator 0 \(DEQUANTIZE\): input shape \[3\] does not match output shape \[4\]")


def test_sparse_tensor_densifying_too_large() -> None:
    from test_reader import _densify_model, _sparsity
    shape = (1 << 16, 1 << 16)  # 16 GiB dense
    segments = [0] + [1] * (1 << 16)  # one stored value, in row 0
    sp = _sparsity([0, 1], None, [{"dense_size": 1 << 16}, {"segments": segments, "indices": [5]}])
    with pytest.raises(litegpu.LiteGpuError, match=r"sparsity.*over the limit"):
        litegpu.load_model(_densify_model(shape, np.ones(1, np.float32), sp))


def test_sparse_dense_size_bigger_than_the_tensor() -> None:
    from test_reader import _densify_model, _sparsity
    sp = _sparsity([0, 1], None, [{"dense_size": 1 << 30}, {"segments": [0, 1], "indices": [0]}])
    expect_error(_densify_model((4, 4), np.ones(1, np.float32), sp), r"dim_metadata\[0\]\.dense_size")


def test_mutated_sparse_models_load_or_fail_cleanly() -> None:
    # Densify is the most index-heavy code in the reader; fuzz it with the mutation harness's edits.
    from test_reader import _csr, _densify_model, _sparsity

    from litegpu.testing.mutation import field_map, mutate

    rng = np.random.default_rng(5)
    dense = rng.standard_normal((5, 7)).astype(np.float32)
    dense[rng.random(dense.shape) < 0.6] = 0
    segments, indices, values = _csr(dense)
    csr = _densify_model(dense.shape, values, _sparsity([0, 1], None, [{"dense_size": 5},
                                                                      {"segments": segments, "indices": indices}]))
    block = _densify_model((4, 8), np.ones(8, np.float32), _sparsity(
        [0, 1, 2], [1], [{"dense_size": 4}, {"segments": [0, 1, 1, 1, 2], "indices": [1, 0]}, {"dense_size": 4}]))
    pyrng = random.Random(11)
    for data in (csr, block):
        fm = field_map(data)
        assert fm.indices and fm.shapes
        loaded = sum(_load_or_clean_error(mutate(data, fm, pyrng)[0]) for _ in range(600))
        assert loaded < 600


def test_omitted_required_input_is_a_clean_error() -> None:
    data = graph([t(), t()], [add([0, -1], [1])])
    litegpu.load_model(data)  # -1 is legal in the file format: the op decides what is optional
    with pytest.raises(litegpu.LiteGpuError, match="ADD"):
        it = litegpu.Interpreter(model_content=data)
        it.allocate_tensors()
        it.set_tensor(0, np.ones(2, np.float32))
        it.invoke()


def _many_operators(data: bytes, n: int) -> bytes:
    """``data`` with subgraph 0's operators replaced by ``n`` offsets to one tiny appended Operator."""
    sg = root(data).tables(2, "subgraphs")[0]
    field = sg._field(3, 4, "operators")
    out = bytearray(data) + bytes(-len(data) % 4)
    vec = len(out)
    vtable = vec + 4 + 4 * n
    table = vtable + 8
    elements = vec + 4 + 4 * np.arange(n, dtype=np.int64)
    out += struct.pack("<I", n) + (table - elements).astype("<u4").tobytes()
    out += struct.pack("<HHH", 6, 8, 4) + bytes(2)  # vtable: opcode_index at +4
    out += struct.pack("<iI", table - vtable, 0)     # the Operator: opcode_index 0
    struct.pack_into("<I", out, field, vec - field)
    return bytes(out)


def test_table_count_is_bounded(mlp) -> None:
    # Millions of 4-byte offsets to one table would cost a Python object each: refused up front.
    _, data = mlp
    expect_error(_many_operators(data, 1_000_001), r"operators \(1000001 tables\)", "more than 1000000 tables")
    # Below the limit the same trick is read, and fails on the dataflow instead.
    expect_error(_many_operators(data, 1000), r"never produced|already produced")


def test_vector_shared_by_many_tables_is_refused(mlp) -> None:
    # 2000 operators (one table, referenced 2000 times) whose inputs vector holds 100k entries:
    # 2e8 indices to decode from a file of 0.4 MB. A converter never shares vectors like this.
    _, data = mlp
    n, k = 2000, 100_000
    sg = root(data).tables(2, "subgraphs")[0]
    field = sg._field(3, 4, "operators")
    out = bytearray(data) + bytes(-len(data) % 4)
    vec = len(out)
    vtable = vec + 4 + 4 * n
    table = vtable + 8
    inputs = table + 12
    elements = vec + 4 + 4 * np.arange(n, dtype=np.int64)
    out += struct.pack("<I", n) + (table - elements).astype("<u4").tobytes()
    out += struct.pack("<HHHH", 8, 12, 4, 8)                      # opcode_index at +4, inputs at +8
    out += struct.pack("<iII", table - vtable, 0, inputs - (table + 8))
    out += struct.pack("<I", k) + bytes(4 * k)                    # k inputs, all tensor 0
    struct.pack_into("<I", out, field, vec - field)
    expect_error(bytes(out), r"operators\[\d+\]\.inputs", "more elements than twice")


@pytest.mark.parametrize("op", ["MAX_POOL_2D", "AVERAGE_POOL_2D"])
def test_a_pool_window_of_billions_of_taps_runs_on_what_it_covers(op) -> None:
    """A fuzzed file's 2**29-row filter over a 10-row input (SAME): the cpu takes the window
    clipped to the input, in memory that does not grow with the filter (XNNPACK's tap
    tables needed gigabytes), and each output is the pool of the pixels it covers."""
    b = ModelBuilder()
    x = b.input("x", (1, 10, 11, 2), np.float32)
    y = b.tensor("y", (1, 4, 4, 2), np.float32)
    b.op(op, [x], [y], padding="SAME", stride_w=3, stride_h=3, filter_width=4, filter_height=(1 << 29) + 4)
    b.output(y)
    it = litegpu.Interpreter(model_content=b.build())
    it.allocate_tensors()
    xv = np.random.default_rng(0).standard_normal((1, 10, 11, 2)).astype(np.float32)
    it.set_tensor(it.get_input_details()[0]["index"], xv)
    it.invoke()
    got = it.get_tensor(it.get_output_details()[0]["index"])
    pool = np.max if op == "MAX_POOL_2D" else np.mean
    for j, (c0, c1) in enumerate([(0, 3), (2, 6), (5, 9), (8, 11)]):    # every row, the columns in the window
        want = pool(xv[0, :, c0:c1], axis=(0, 1))
        np.testing.assert_allclose(got[0, :, j], np.broadcast_to(want, (4, 2)), rtol=1e-6)
