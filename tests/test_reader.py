"""The model reader against LiteRT's own view of the same files.

Every shared model and every fetched real model (:mod:`litegpu.testing.realmodels`) is
read by litegpu and by ``ai_edge_litert``; tensors, shapes, dtypes, quantization,
signatures and operators must agree. Small models written here
with the ``flatbuffers`` + ``tflite`` packages (independent of litegpu's schema tables)
cover the layouts the shared models lack: external buffers (offset/size after the
flatbuffer), old-style opcodes, and sparse weights behind DENSIFY.
"""
from __future__ import annotations

import mmap
from pathlib import Path

import flatbuffers
import numpy as np
import pytest
import tflite

import litegpu
from litegpu.testing.realmodels import REAL_MODELS
from litegpu.testing.shared_models import NONE, shared_model_names

# (fixture, model name): every shared model (NONE where there are none: it skips saying
# so) and every real model, fetched once into the cache outside the repository.
STRUCTURE_MODELS = [*(("shared_model", name) for name in shared_model_names() or [NONE]),
                    *(("real_model", name) for name in REAL_MODELS)]
# Tensor types with no numpy dtype: LiteRT reports ``object``, litegpu keeps the type name.
OPAQUE_TYPES = {"RESOURCE", "STRING", "VARIANT"}

import ai_edge_litert.interpreter as litert  # a test dependency: never skipped


def litert_interpreter(**kwargs):
    """A LiteRT interpreter with no default delegate, so its node list is the file's."""
    return litert.Interpreter(
        experimental_op_resolver_type=litert.OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES, **kwargs)


# ---------------------------------------------------------------------------------------------
# A small .tflite writer for tests. Written with the `tflite` package's generated builder
# functions, so field slots come from LiteRT's schema, not from litegpu's.
# ---------------------------------------------------------------------------------------------
def tflite_bytes(subgraphs: list[dict], buffers: list, opcodes: list[dict], signatures: tuple = (),
                 identifier: bytes = b"TFL3") -> bytes:
    """Serialize a model described by plain dicts (see the tests for the keys).

    ``buffers``: each ``bytes`` (inline data) or ``("external", offset, size)``.
    ``opcodes``: dicts with optional ``deprecated``, ``builtin``, ``custom``, ``version``.
    A subgraph: ``tensors`` (dicts: ``shape``, ``type``, ``buffer``, ``name``, optional
    ``shape_signature``, ``scale``/``zero_point``, ``sparsity``), ``inputs``, ``outputs``,
    ``ops`` (dicts: ``opcode``, ``inputs``, ``outputs``, optional ``options`` = (union type, fn(builder) -> offset)).
    """
    b = flatbuffers.Builder(1024)

    def ivec(values, dtype=np.int32):
        return b.CreateNumpyVector(np.asarray(values, dtype=dtype))

    def table_vec(start_fn, offsets):
        start_fn(b, len(offsets))
        for o in reversed(offsets):
            b.PrependUOffsetTRelative(o)
        return b.EndVector()

    buf_offs = []
    for entry in buffers:
        data = None
        if isinstance(entry, (bytes, bytearray)) and entry:
            b.StartVector(1, len(entry), 16)  # schema.fbs: force_align 16
            b.head -= len(entry)
            b.Bytes[b.head:b.head + len(entry)] = entry
            data = b.EndVector()
        tflite.BufferStart(b)
        if data is not None:
            tflite.BufferAddData(b, data)
        if isinstance(entry, tuple):
            tflite.BufferAddOffset(b, entry[1])
            tflite.BufferAddSize(b, entry[2])
        buf_offs.append(tflite.BufferEnd(b))

    code_offs = []
    for oc in opcodes:
        custom = b.CreateString(oc["custom"]) if "custom" in oc else None
        tflite.OperatorCodeStart(b)
        if "deprecated" in oc:
            tflite.OperatorCodeAddDeprecatedBuiltinCode(b, oc["deprecated"])
        if "builtin" in oc:
            tflite.OperatorCodeAddBuiltinCode(b, oc["builtin"])
        if custom is not None:
            tflite.OperatorCodeAddCustomCode(b, custom)
        tflite.OperatorCodeAddVersion(b, oc.get("version", 1))
        code_offs.append(tflite.OperatorCodeEnd(b))

    sg_offs = []
    for sg in subgraphs:
        t_offs = []
        for t in sg["tensors"]:
            shape = ivec(t["shape"])
            sig = ivec(t["shape_signature"]) if "shape_signature" in t else None
            name = b.CreateString(t.get("name", ""))
            quant = None
            if "scale" in t:
                scale = ivec(np.atleast_1d(t["scale"]), np.float32)
                zp = ivec(np.atleast_1d(t.get("zero_point", 0)), np.int64)
                tflite.QuantizationParametersStart(b)
                tflite.QuantizationParametersAddScale(b, scale)
                tflite.QuantizationParametersAddZeroPoint(b, zp)
                tflite.QuantizationParametersAddQuantizedDimension(b, t.get("quantized_dimension", 0))
                quant = tflite.QuantizationParametersEnd(b)
            sparsity = t["sparsity"](b) if "sparsity" in t else None
            tflite.TensorStart(b)
            tflite.TensorAddShape(b, shape)
            tflite.TensorAddType(b, t.get("type", tflite.TensorType.FLOAT32))
            tflite.TensorAddBuffer(b, t.get("buffer", 0))
            tflite.TensorAddName(b, name)
            if sig is not None:
                tflite.TensorAddShapeSignature(b, sig)
            if quant is not None:
                tflite.TensorAddQuantization(b, quant)
            if sparsity is not None:
                tflite.TensorAddSparsity(b, sparsity)
            if t.get("is_variable"):
                tflite.TensorAddIsVariable(b, True)
            t_offs.append(tflite.TensorEnd(b))
        op_offs = []
        for op in sg["ops"]:
            ins, outs = ivec(op["inputs"]), ivec(op["outputs"])
            opts = op["options"][1](b) if "options" in op else None
            tflite.OperatorStart(b)
            tflite.OperatorAddOpcodeIndex(b, op["opcode"])
            tflite.OperatorAddInputs(b, ins)
            tflite.OperatorAddOutputs(b, outs)
            if opts is not None:
                tflite.OperatorAddBuiltinOptionsType(b, op["options"][0])
                tflite.OperatorAddBuiltinOptions(b, opts)
            op_offs.append(tflite.OperatorEnd(b))
        tensors = table_vec(tflite.SubGraphStartTensorsVector, t_offs)
        ops = table_vec(tflite.SubGraphStartOperatorsVector, op_offs)
        ins, outs = ivec(sg["inputs"]), ivec(sg["outputs"])
        name = b.CreateString(sg.get("name", ""))
        tflite.SubGraphStart(b)
        tflite.SubGraphAddTensors(b, tensors)
        tflite.SubGraphAddInputs(b, ins)
        tflite.SubGraphAddOutputs(b, outs)
        tflite.SubGraphAddOperators(b, ops)
        tflite.SubGraphAddName(b, name)
        sg_offs.append(tflite.SubGraphEnd(b))

    sig_offs = []
    for key, sg_index, inputs, outputs in signatures:
        maps = []
        for mapping in (inputs, outputs):
            entries = []
            for tname, idx in mapping.items():
                s = b.CreateString(tname)
                tflite.TensorMapStart(b)
                tflite.TensorMapAddName(b, s)
                tflite.TensorMapAddTensorIndex(b, idx)
                entries.append(tflite.TensorMapEnd(b))
            maps.append(table_vec(tflite.SignatureDefStartInputsVector, entries))
        k = b.CreateString(key)
        tflite.SignatureDefStart(b)
        tflite.SignatureDefAddInputs(b, maps[0])
        tflite.SignatureDefAddOutputs(b, maps[1])
        tflite.SignatureDefAddSignatureKey(b, k)
        tflite.SignatureDefAddSubgraphIndex(b, sg_index)
        sig_offs.append(tflite.SignatureDefEnd(b))

    codes = table_vec(tflite.ModelStartOperatorCodesVector, code_offs)
    sgs = table_vec(tflite.ModelStartSubgraphsVector, sg_offs)
    bufs = table_vec(tflite.ModelStartBuffersVector, buf_offs)
    sigs = table_vec(tflite.ModelStartSignatureDefsVector, sig_offs)
    desc = b.CreateString("litegpu reader test")
    tflite.ModelStart(b)
    tflite.ModelAddVersion(b, 3)
    tflite.ModelAddOperatorCodes(b, codes)
    tflite.ModelAddSubgraphs(b, sgs)
    tflite.ModelAddDescription(b, desc)
    tflite.ModelAddBuffers(b, bufs)
    tflite.ModelAddSignatureDefs(b, sigs)
    b.Finish(tflite.ModelEnd(b), file_identifier=identifier)
    return bytes(b.Output())


def add_options(b) -> int:
    """An AddOptions table (no fused activation)."""
    tflite.AddOptionsStart(b)
    return tflite.AddOptionsEnd(b)


ADD = {"deprecated": tflite.BuiltinOperator.ADD, "builtin": tflite.BuiltinOperator.ADD}


def add_const_model(weight: np.ndarray, *, buffer_entry=None, opcode=ADD, extra_buffers=()) -> bytes:
    """``y = x + w`` with ``w`` a float32 constant in buffer 1 (or ``buffer_entry``).

    AddOptions are written only when the opcode is ADD's.
    """
    shape = list(weight.shape)
    op = {"opcode": 0, "inputs": [0, 1], "outputs": [2]}
    if opcode is ADD:
        op["options"] = (tflite.BuiltinOptions.AddOptions, add_options)
    return tflite_bytes(
        subgraphs=[{
            "tensors": [{"shape": shape, "name": "x"},
                        {"shape": shape, "name": "w", "buffer": 1},
                        {"shape": shape, "name": "y"}],
            "inputs": [0], "outputs": [2],
            "ops": [op],
        }],
        buffers=[b"", weight.astype("<f4").tobytes() if buffer_entry is None else buffer_entry, *extra_buffers],
        opcodes=[opcode],
    )


# ---------------------------------------------------------------------------------------------
# Shared and real models: litegpu's structure equals LiteRT's.
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("source, name", STRUCTURE_MODELS,
                         ids=[name.removesuffix(".tflite") if source == "shared_model" else f"real-{name}"
                              for source, name in STRUCTURE_MODELS])
def test_structure_matches_litert(request, source: str, name: str) -> None:
    path = request.getfixturevalue(source)(name)
    model = litegpu.load_model(path)
    it = litert_interpreter(model_path=str(path))
    assert len(model.subgraphs) == it._interpreter.NumSubgraphs()
    for k, sg in enumerate(model.subgraphs):
        details = it.get_tensor_details(k)
        assert len(sg.tensors) == len(details), f"subgraph {k}"
        for d in details:
            t = sg.tensors[d["index"]]
            where = f"subgraph {k} tensor {d['index']}"
            assert t.index == d["index"]
            assert t.name == d["name"], where
            assert t.shape == tuple(int(x) for x in d["shape"]), where
            assert t.shape_signature == tuple(int(x) for x in d["shape_signature"]), where
            if np.dtype(d["dtype"]) == np.dtype(object):
                assert t.type_name in OPAQUE_TYPES, where
            else:
                assert t.dtype == np.dtype(d["dtype"]), where
            q = d["quantization_parameters"]
            scales = t.quantization.scales if t.quantization else np.zeros(0, np.float32)
            zps = t.quantization.zero_points if t.quantization else np.zeros(0, np.int64)
            np.testing.assert_array_equal(scales, q["scales"], err_msg=where)
            np.testing.assert_array_equal(zps, q["zero_points"], err_msg=where)
            if scales.size > 1:
                assert t.quantization.quantized_dimension == q["quantized_dimension"], where

    # Signatures: same keys, same input/output names, and the names map to LiteRT's tensors.
    expected = it.get_signature_list()
    assert {s.key for s in model.signatures} == set(expected)
    for sig in model.signatures:
        assert sorted(sig.inputs) == sorted(expected[sig.key]["inputs"])
        assert sorted(sig.outputs) == sorted(expected[sig.key]["outputs"])
        runner = it.get_signature_runner(sig.key)
        details = runner.get_input_details()
        for name, idx in sig.inputs.items():
            assert model.subgraphs[sig.subgraph_index].tensors[idx].name == \
                it.get_tensor_details(sig.subgraph_index)[details[name]["index"]]["name"]

    # Operators of the main subgraph: same op, inputs and outputs per original node index;
    # the nodes litegpu folded away are exactly LiteRT's DEQUANTIZE/DENSIFY of constants.
    ops = it._get_ops_details()
    mine = {n.index: n for n in model.subgraphs[0].nodes}
    for op in ops:
        node = mine.pop(op["index"], None)
        if node is None:
            assert op["op_name"] in ("DEQUANTIZE", "DENSIFY"), op
            assert model.subgraphs[0].tensors[int(op["outputs"][0])].is_constant
            continue
        assert node.op == op["op_name"]
        assert node.inputs == tuple(int(i) for i in op["inputs"])
        assert node.outputs == tuple(int(i) for i in op["outputs"])
    assert not mine, f"nodes LiteRT does not have: {sorted(mine)}"


def _owner(arr: np.ndarray):
    base = arr
    while isinstance(base, np.ndarray):
        base = base.base
    return base.obj if isinstance(base, memoryview) else base


def test_file_buffers_are_memory_mapped_views(real_model) -> None:
    # face_landmark stores its 116 weights as float32 (no fp16 copies to fold).
    model = litegpu.load_model(real_model("face_landmark"))
    consts = [t for t in model.subgraphs[0].tensors if t.is_constant]
    assert len(consts) > 50
    for t in consts:
        assert not t.data.flags.owndata and not t.data.flags.writeable, t.name
        assert isinstance(_owner(t.data), mmap.mmap), t.name


def test_bytes_buffers_are_views_of_the_content(real_model) -> None:
    content = real_model("oww_alexa").read_bytes()
    whole = np.frombuffer(content, np.uint8)
    model = litegpu.load_model(content)
    consts = [t for t in model.subgraphs[0].tensors if t.is_constant]
    assert consts
    for t in consts:
        assert np.shares_memory(t.data, whole), t.name


def test_constant_values_match_litert(real_model) -> None:
    path = real_model("oww_alexa")
    model = litegpu.load_model(path)
    it = litert_interpreter(model_path=str(path))
    it.allocate_tensors()
    for t in model.subgraphs[0].tensors:
        if t.is_constant:
            np.testing.assert_array_equal(t.data, it.get_tensor(t.index), err_msg=t.name)


@pytest.mark.parametrize("source, name, folded", [("shared_model", "resnet18_fp16", 42),
                                                   ("real_model", "blazeface_short_range", 74)])
def test_fp16_weights_are_folded_to_float32(request, source: str, name: str, folded: int) -> None:
    path = request.getfixturevalue(source)(name)
    model = litegpu.load_model(path)
    sg = model.subgraphs[0]
    assert not [n for n in sg.nodes if n.op == "DEQUANTIZE"]
    it = litert_interpreter(model_path=str(path))
    it.allocate_tensors()
    dequant = [op for op in it._get_ops_details() if op["op_name"] == "DEQUANTIZE"]
    assert len(dequant) == folded
    for op in dequant:
        src, dst = int(op["inputs"][0]), int(op["outputs"][0])
        half = it.get_tensor(src)
        assert half.dtype == np.float16
        folded = sg.tensors[dst]
        assert folded.dtype == np.float32 and folded.is_constant
        np.testing.assert_array_equal(folded.data, half.astype(np.float32), err_msg=folded.name)
    # Nothing reads the fp16 source any more; consumers read the float32 constant.
    readers = {i for n in sg.nodes for i in n.inputs}
    assert not readers & {int(op["inputs"][0]) for op in dequant}


# ---------------------------------------------------------------------------------------------
# Built models: layouts the shared models do not have.
# ---------------------------------------------------------------------------------------------
def _litert_add(content: bytes, x: np.ndarray) -> np.ndarray:
    it = litert_interpreter(model_content=content)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"])


def test_built_model_reads_back() -> None:
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    content = add_const_model(w)
    model = litegpu.load_model(content)
    sg = model.subgraphs[0]
    assert [t.name for t in sg.tensors] == ["x", "w", "y"]
    assert sg.inputs == (0,) and sg.outputs == (2,)
    assert [n.op for n in sg.nodes] == ["ADD"]
    np.testing.assert_array_equal(sg.tensors[1].data, w)
    # The writer is right if LiteRT agrees on the same bytes.
    np.testing.assert_array_equal(_litert_add(content, np.ones_like(w)), w + 1)


@pytest.mark.parametrize("codes, expected", [
    ({"deprecated": 18}, "MUL"),                       # old file: only the byte-sized code
    ({"builtin": 18}, "MUL"),                          # new writer that skips the deprecated code
    ({"deprecated": 127, "builtin": 150}, "GELU"),     # placeholder byte, real code in builtin_code
    ({"deprecated": 0, "builtin": 128}, "CUMSUM"),
])
def test_opcode_is_max_of_both_fields(codes: dict, expected: str) -> None:
    model = litegpu.load_model(add_const_model(np.ones((2,), np.float32), opcode=codes))
    node = model.subgraphs[0].nodes[0]
    assert node.op == expected
    assert node.opcode == max(codes.get("deprecated", 0), codes.get("builtin", 0))


def _external_buffer_model(w: np.ndarray) -> bytes:
    """The flatbuffer, then 16-aligned weight bytes it points at by Buffer.offset/size."""
    raw = w.astype("<f4").tobytes()
    placeholder = add_const_model(w, buffer_entry=("external", 1 << 40, len(raw)))
    offset = (len(placeholder) + 15) // 16 * 16
    head = add_const_model(w, buffer_entry=("external", offset, len(raw)))
    assert len(head) == len(placeholder)  # the offset is a fixed-width field
    return head + bytes(offset - len(head)) + raw


def test_external_buffers_are_read(tmp_path: Path) -> None:
    w = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    content = _external_buffer_model(w)
    np.testing.assert_array_equal(_litert_add(content, np.zeros_like(w)), w)  # LiteRT reads it too
    for source in (content, tmp_path / "ext.tflite"):
        if isinstance(source, Path):
            source.write_bytes(content)
        model = litegpu.load_model(source)
        np.testing.assert_array_equal(model.subgraphs[0].tensors[1].data, w)


def test_external_buffer_past_the_end_is_an_error() -> None:
    w = np.ones((4,), np.float32)
    content = _external_buffer_model(w)[:-4]  # the last weight lies beyond the file
    with pytest.raises(litegpu.ModelFormatError, match="buffers"):
        litegpu.load_model(content)


# ---------------------------------------------------------------------------------------------
# Sparse weights behind DENSIFY.
# ---------------------------------------------------------------------------------------------
def _dim(b, dense_size=None, segments=None, indices=None) -> int:
    """One DimensionMetadata: DENSE with ``dense_size``, or SPARSE_CSR with int32 index vectors."""
    if dense_size is not None:
        tflite.DimensionMetadataStart(b)
        tflite.DimensionMetadataAddFormat(b, tflite.DimensionType.DENSE)
        tflite.DimensionMetadataAddDenseSize(b, dense_size)
        return tflite.DimensionMetadataEnd(b)
    vecs = []
    for values in (segments, indices):
        arr = b.CreateNumpyVector(np.asarray(values, np.int32))
        tflite.Int32VectorStart(b)
        tflite.Int32VectorAddValues(b, arr)
        vecs.append(tflite.Int32VectorEnd(b))
    tflite.DimensionMetadataStart(b)
    tflite.DimensionMetadataAddFormat(b, tflite.DimensionType.SPARSE_CSR)
    tflite.DimensionMetadataAddArraySegmentsType(b, tflite.SparseIndexVector.Int32Vector)
    tflite.DimensionMetadataAddArraySegments(b, vecs[0])
    tflite.DimensionMetadataAddArrayIndicesType(b, tflite.SparseIndexVector.Int32Vector)
    tflite.DimensionMetadataAddArrayIndices(b, vecs[1])
    return tflite.DimensionMetadataEnd(b)


def _sparsity(order, block_map, dims):
    """A SparsityParameters writer; ``dims`` are (kwargs for :func:`_dim`)."""
    def write(b) -> int:
        dim_offs = [_dim(b, **d) for d in dims]
        order_vec = b.CreateNumpyVector(np.asarray(order, np.int32))
        block_vec = b.CreateNumpyVector(np.asarray(block_map, np.int32)) if block_map else None
        tflite.SparsityParametersStartDimMetadataVector(b, len(dim_offs))
        for o in reversed(dim_offs):
            b.PrependUOffsetTRelative(o)
        dims_vec = b.EndVector()
        tflite.SparsityParametersStart(b)
        tflite.SparsityParametersAddTraversalOrder(b, order_vec)
        if block_vec is not None:
            tflite.SparsityParametersAddBlockMap(b, block_vec)
        tflite.SparsityParametersAddDimMetadata(b, dims_vec)
        return tflite.SparsityParametersEnd(b)
    return write


def _csr(dense: np.ndarray) -> tuple[list[int], list[int], np.ndarray]:
    segments, indices, values = [0], [], []
    for row in dense:
        nz = np.flatnonzero(row)
        indices.extend(int(i) for i in nz)
        values.extend(row[nz])
        segments.append(len(indices))
    return segments, indices, np.asarray(values, np.float32)


def _densify_model(shape, values: np.ndarray, sparsity) -> bytes:
    """``y = x + densify(w_sparse)``: DENSIFY then ADD, as the converter writes sparse weights."""
    return tflite_bytes(
        subgraphs=[{
            "tensors": [{"shape": list(shape), "name": "x"},
                        {"shape": list(shape), "name": "w_sparse", "buffer": 1, "sparsity": sparsity},
                        {"shape": list(shape), "name": "w"},
                        {"shape": list(shape), "name": "y"}],
            "inputs": [0], "outputs": [3],
            "ops": [{"opcode": 0, "inputs": [1], "outputs": [2]},
                    {"opcode": 1, "inputs": [0, 2], "outputs": [3],
                     "options": (tflite.BuiltinOptions.AddOptions, add_options)}],
        }],
        buffers=[b"", values.astype("<f4").tobytes()],
        opcodes=[{"deprecated": tflite.BuiltinOperator.DENSIFY, "builtin": tflite.BuiltinOperator.DENSIFY},
                 ADD],
    )


def _check_densified(content: bytes, dense: np.ndarray) -> None:
    # LiteRT's DENSIFY is the judge of the encoding; litegpu must fold to the same values.
    np.testing.assert_array_equal(_litert_add(content, np.zeros_like(dense)), dense)
    sg = litegpu.load_model(content).subgraphs[0]
    assert [n.op for n in sg.nodes] == ["ADD"]
    w = sg.tensors[2]
    assert w.is_constant and w.dtype == np.float32
    np.testing.assert_array_equal(w.data, dense)


def test_sparse_csr_weights_are_densified() -> None:
    rng = np.random.default_rng(5)
    dense = rng.standard_normal((5, 7)).astype(np.float32)
    dense[rng.random(dense.shape) < 0.6] = 0
    dense[2] = 0  # an empty row
    segments, indices, values = _csr(dense)
    sp = _sparsity([0, 1], None, [{"dense_size": 5}, {"segments": segments, "indices": indices}])
    _check_densified(_densify_model(dense.shape, values, sp), dense)


def test_block_sparse_weights_are_densified() -> None:
    # 4x8 with 1x4 blocks: dims (row, block column, column in block); block_map = [1].
    rng = np.random.default_rng(6)
    dense = np.zeros((4, 8), np.float32)
    blocks = [(0, 1), (1, 0), (1, 1), (3, 0)]
    for r, c in blocks:
        dense[r, 4 * c:4 * c + 4] = rng.standard_normal(4).astype(np.float32) + 3
    segments, indices = [0], []
    for r in range(4):
        indices.extend(c for rr, c in blocks if rr == r)
        segments.append(len(indices))
    values = np.concatenate([dense[r, 4 * c:4 * c + 4] for r, c in blocks])
    sp = _sparsity([0, 1, 2], [1], [{"dense_size": 4}, {"segments": segments, "indices": indices},
                                    {"dense_size": 4}])
    _check_densified(_densify_model(dense.shape, values, sp), dense)


def test_sparse_index_out_of_range_is_an_error() -> None:
    dense = np.eye(3, dtype=np.float32)
    segments, indices, values = _csr(dense)
    indices[-1] = 7  # column 7 of a 3-column matrix
    sp = _sparsity([0, 1], None, [{"dense_size": 3}, {"segments": segments, "indices": indices}])
    with pytest.raises(litegpu.ModelFormatError, match="sparse"):
        litegpu.load_model(_densify_model(dense.shape, values, sp))
