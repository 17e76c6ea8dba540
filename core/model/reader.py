"""Read a ``.tflite`` file into a validated :class:`litegpu.graph.Model`.

Every index, offset, size and enum is checked before use; constant buffers are
zero-copy views into the (memory-mapped) file. Weight-only DEQUANTIZE (fp16 or
int8 weights) and DENSIFY (sparse weights) are folded into constants here.
"""
from __future__ import annotations

import logging
import mmap
import os
from dataclasses import replace
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import ModelFormatError, UnsupportedError
from ..graph import Int4Constant, Model, Node, Quantization, Signature, Subgraph, Tensor
from ..quant import dequantize_blocks
from . import schema
from .composites import as_op_node, lower_composites
from .flatbuf import Buffer, Table
from .sparse import densify

log = logging.getLogger(__name__)

MAX_RANK = 16
MAX_ELEMENTS = 1 << 40  # per tensor; real limits on allocation are applied when planning memory
_SUBGRAPH_OPTION_FIELDS = {
    "IF": ("then_subgraph_index", "else_subgraph_index"),
    "WHILE": ("cond_subgraph_index", "body_subgraph_index"),
    "CALL_ONCE": ("init_subgraph_index",),
    "STABLEHLO_COMPOSITE": ("decomposition_subgraph_index",),
}


def _never_fused(composite: Node, tensors: Sequence[Tensor], decomposition: Subgraph) -> None:
    """``load_model(fuse_composites=False)``: every composite runs its decomposition."""
    return None


def load_model(source: str | os.PathLike | bytes | bytearray | memoryview, fuse_composites: bool = True) -> Model:
    """Read and validate a model from a path (memory-mapped) or from bytes.

    ``fuse_composites``: a STABLEHLO_COMPOSITE litegpu has an op for (``odml.rms_norm`` ...)
    becomes one node of that op; without it, or for any other composite, its decomposition
    subgraph's nodes take its place (see :mod:`litegpu.model.composites`)."""
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size == 0:
                    raise ModelFormatError(f"{path}: file is empty")
                data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as exc:
            raise ModelFormatError(f"cannot read model file {path}: {exc.strerror or exc}") from exc
        return _Reader(data, fuse_composites).read()
    if isinstance(source, (bytes, bytearray, memoryview)):
        if len(source) == 0:
            raise ModelFormatError("model content is empty")
        return _Reader(bytes(source) if isinstance(source, bytearray) else source, fuse_composites).read()
    raise ModelFormatError(f"model must be a path or bytes, got {type(source).__name__}")


class _Reader:
    def __init__(self, data, fuse_composites: bool = True) -> None:
        self.data = data
        self.buf = Buffer(data)
        self.fuse_composites = fuse_composites
        # Arrays made from a buffer (INT4 unpacked, blockwise scales widened), once per buffer:
        # a decoder's prefill and decode subgraphs name the same weights.
        self.made: dict[tuple, np.ndarray | Int4Constant] = {}

    @staticmethod
    def fused(composite: Node, tensors: Sequence[Tensor], decomposition: Subgraph) -> Node | None:
        """The node of op ``name`` that ``composite`` becomes (see :func:`.composites.lower_composites`)
        when litegpu has that op and the op takes the node (its attributes and, where the op
        has one, its composite check); else None, saying why in the log, and the
        decomposition runs."""
        from ..ops.registry import get_op     # (the ops know the model; the reader asks them late)
        op = get_op(composite.options.get("name", ""))
        if op is None:
            return None
        node = as_op_node(composite)
        try:
            op.node_attrs(node, tensors)
            if op.composite_check is not None:
                op.composite_check(node, tensors, decomposition)
        except (ModelFormatError, UnsupportedError) as exc:
            log.info("STABLEHLO_COMPOSITE %s (operator %d) runs its decomposition: %s", op.name, node.index, exc)
            return None
        return node

    def read(self) -> Model:
        root = self.buf.root(schema.FILE_IDENTIFIER)
        self.buffers = [self._buffer(t) for t in root.tables(4, "buffers")]
        self.opcodes = [self._opcode(t) for t in root.tables(1, "operator_codes")]
        sg_tables = root.tables(2, "subgraphs")
        if not sg_tables:
            raise ModelFormatError("Model.subgraphs: the model has no subgraph")
        subgraphs = tuple(self._subgraph(i, t) for i, t in enumerate(sg_tables))
        _check_subgraph_calls(subgraphs)
        subgraphs = lower_composites(subgraphs, self.fused if self.fuse_composites else _never_fused)
        signatures = tuple(self._signature(t, subgraphs) for t in root.tables(7, "signature_defs"))
        metadata = {}
        for t in root.tables(6, "metadata"):
            idx = t.scalar(1, "uint", 0, "buffer")
            metadata[t.string(0, "name")] = bytes(self._buffer_data(idx, f"{t.path}.buffer"))
        return Model(subgraphs=subgraphs, signatures=signatures,
                     description=root.string(3, "description"),
                     version=root.scalar(0, "uint", 0, "version"),
                     metadata=metadata, nbytes=self.buf.size, content=self.data)

    # -- buffers and operator codes -------------------------------------------------
    def _buffer(self, t: Table) -> np.ndarray:
        offset = t.scalar(1, "ulong", 0, "offset")
        size = t.scalar(2, "ulong", 0, "size")
        if offset > 1:
            self.buf.check(offset, size, f"{t.path} (offset/size)")
            return np.frombuffer(self.buf.view, dtype=np.uint8, count=size, offset=offset)
        arr = t.array(0, "[ubyte]", "data")
        return np.zeros(0, np.uint8) if arr is None else arr

    def _buffer_data(self, index: int, what: str) -> np.ndarray:
        if not 0 <= index < len(self.buffers):
            raise ModelFormatError(f"{what}: buffer index {index} out of range (model has {len(self.buffers)})")
        return self.buffers[index]

    def _opcode(self, t: Table) -> tuple[int, str, int]:
        deprecated = t.scalar(0, "byte", 0, "deprecated_builtin_code")
        builtin = t.scalar(3, "int", 0, "builtin_code")
        code = max(deprecated, builtin)
        if code < 0:
            raise ModelFormatError(f"{t.path}.builtin_code: {code} is negative")
        version = t.scalar(2, "int", 1, "version")
        if code == schema.CUSTOM_CODE:
            name = t.string(1, "custom_code")
            if not name:
                raise ModelFormatError(f"{t.path}.custom_code: a CUSTOM operator needs a name")
        else:
            name = schema.builtin_name(code)
        return code, name, version

    # -- tensors ------------------------------------------------------------------
    def _subgraph(self, index: int, t: Table) -> Subgraph:
        tensors = [self._tensor(i, tt) for i, tt in enumerate(t.tables(0, "tensors"))]
        n = len(tensors)
        inputs = _indices(t.array(1, "[int]", "inputs"), n, f"{t.path}.inputs")
        outputs = _indices(t.array(2, "[int]", "outputs"), n, f"{t.path}.outputs")
        nodes = [self._node(i, ot, n, t.path) for i, ot in enumerate(t.tables(3, "operators"))]
        tensors = _resolve_blockwise(t.path, _written_empties_are_activations(nodes, tensors), self.made)
        in_file = nodes
        nodes, tensors = _fold_weight_ops(nodes, tensors)
        kept = {node.index for node in nodes}
        _check_dataflow(t.path, nodes, tensors, inputs, outputs)
        return Subgraph(index=index, name=t.string(4, "name"), tensors=tuple(tensors), nodes=tuple(nodes),
                        inputs=inputs, outputs=outputs,
                        folded_at_load=tuple(node for node in in_file if node.index not in kept))

    def _tensor(self, index: int, t: Table) -> Tensor:
        type_code = t.scalar(1, "byte", 0, "type")
        if type_code not in schema.TENSOR_TYPES:
            raise ModelFormatError(f"{t.path}.type: unknown tensor type {type_code}")
        type_name, dtype = schema.TENSOR_TYPES[type_code]
        shape = _shape(t.array(0, "[int]", "shape"), f"{t.path}.shape", allow_unknown=False)
        sig_arr = t.array(7, "[int]", "shape_signature")
        signature = shape if sig_arr is None else _shape(sig_arr, f"{t.path}.shape_signature", True)
        if len(signature) != len(shape):
            signature = shape
        name = t.string(3, "name")
        q = t.table(4, "quantization")
        sparsity = t.table(6, "sparsity")
        buffer_index = t.scalar(2, "uint", 0, "buffer")
        raw = self._buffer_data(buffer_index, f"{t.path}.buffer")
        quant = None if q is None else _quantization(q, name, type_name, dtype, shape, constant=raw.size > 0)
        data = None
        if type_name == "INT4" and raw.size:
            data = self.made.get(("int4", buffer_index, shape))
            if data is None:
                data = self.made["int4", buffer_index, shape] = _int4(raw, shape, f"{t.path}.buffer")
        elif buffer_index and raw.size == 0 and dtype is not None and 0 in shape:
            data = np.zeros(shape, dtype)  # a constant with no elements (e.g. empty reduction axes)
            data.flags.writeable = False
        elif raw.size and dtype is not None:
            if sparsity is not None:
                data = densify(raw, dtype, shape, sparsity)
            else:
                count = int(np.prod(shape, dtype=np.int64))
                if raw.size != count * dtype.itemsize:
                    raise ModelFormatError(
                        f"{t.path}.buffer: holds {raw.size} bytes, shape {list(shape)} of {type_name} "
                        f"needs {count * dtype.itemsize}")
                data = _view(raw, dtype, shape)
        elif raw.size and type_name == "STRING":
            data = raw  # kept raw; string tensors are not executed
        if dtype is None:  # resource/variant handles are int32 ids at run time; strings stay raw bytes
            dtype = np.dtype(np.int32) if type_name in ("RESOURCE", "VARIANT") else np.dtype(np.uint8)
        return Tensor(index=index, name=name, dtype=dtype,
                      shape=shape, shape_signature=signature, type_name=type_name, stored=data,
                      quantization=quant, is_variable=t.scalar(5, "bool", False, "is_variable"),
                      sparsity=sparsity is not None)

    # -- operators ----------------------------------------------------------------
    def _node(self, index: int, t: Table, ntensors: int, sg_path: str) -> Node:
        opcode_index = t.scalar(0, "uint", 0, "opcode_index")
        if opcode_index >= len(self.opcodes):
            raise ModelFormatError(
                f"{t.path}.opcode_index: {opcode_index} out of range ({len(self.opcodes)} operator codes)")
        code, name, version = self.opcodes[opcode_index]
        inputs = _indices(t.array(1, "[int]", "inputs"), ntensors, f"{t.path}.inputs", optional=True)
        outputs = _indices(t.array(2, "[int]", "outputs"), ntensors, f"{t.path}.outputs")
        intermediates = _indices(t.array(8, "[int]", "intermediates"), ntensors, f"{t.path}.intermediates",
                                 optional=True)
        options = _options(t, name, 3, "builtin_options", schema.BUILTIN_OPTIONS, schema.OP_OPTIONS)
        options.update(_options(t, name, 11, "builtin_options_2", schema.BUILTIN_OPTIONS_2, schema.OP_OPTIONS_2))
        custom = b""
        large_off = t.scalar(9, "ulong", 0, "large_custom_options_offset")
        if large_off > 1:
            size = t.scalar(10, "ulong", 0, "large_custom_options_size")
            self.buf.check(large_off, size, f"{t.path}.large_custom_options")
            custom = bytes(self.buf.view[large_off:large_off + size])
        else:
            arr = t.array(5, "[ubyte]", "custom_options")
            if arr is not None:
                custom = arr.tobytes()
        return Node(index=index, op=name, opcode=code, version=version, inputs=inputs, outputs=outputs,
                    options=options, custom_options=custom, intermediates=intermediates)

    def _signature(self, t: Table, subgraphs: tuple[Subgraph, ...]) -> Signature:
        sg = t.scalar(4, "uint", 0, "subgraph_index")
        if sg >= len(subgraphs):
            raise ModelFormatError(f"{t.path}.subgraph_index: {sg} out of range ({len(subgraphs)} subgraphs)")
        ntensors = len(subgraphs[sg].tensors)

        def tensor_map(slot: int, what: str) -> dict[str, int]:
            out = {}
            for m in t.tables(slot, what):
                idx = m.scalar(1, "uint", 0, "tensor_index")
                if idx >= ntensors:
                    raise ModelFormatError(f"{m.path}.tensor_index: {idx} out of range ({ntensors} tensors)")
                out[m.string(0, "name")] = idx
            return out

        return Signature(key=t.string(2, "signature_key"), subgraph_index=sg,
                         inputs=tensor_map(0, "inputs"), outputs=tensor_map(1, "outputs"))


def _options(t: Table, op: str, type_slot: int, what: str, union: list, expected_by_op: dict[str, str]) -> dict:
    """The fields of the options table an Operator carries in the union at ``type_slot``
    (its type) and the slot after it (the table): BuiltinOptions or BuiltinOptions2."""
    otype = t.scalar(type_slot, "ubyte", 0, f"{what}_type")
    if not otype:
        return {}
    if otype > len(union):
        raise ModelFormatError(f"{t.path}.{what}_type: unknown options type {otype}")
    table_name, fields = union[otype - 1]
    expected = expected_by_op.get(op)
    if expected is not None and expected != table_name:
        raise ModelFormatError(f"{t.path}.{what}: {op} carries {table_name}, expected {expected}")
    table = t.table(type_slot + 1, what)
    return {} if table is None else table.read_fields(fields)


def _indices(arr, n: int, what: str, optional: bool = False) -> tuple[int, ...]:
    if arr is None:
        return ()
    values = tuple(int(x) for x in arr)
    low = -1 if optional else 0
    for i, v in enumerate(values):
        if not low <= v < n:
            raise ModelFormatError(f"{what}[{i}]: tensor index {v} out of range ({n} tensors)")
    return values


def _shape(arr, what: str, allow_unknown: bool) -> tuple[int, ...]:
    if arr is None:
        return ()
    if len(arr) > MAX_RANK:
        raise ModelFormatError(f"{what}: rank {len(arr)} exceeds the limit of {MAX_RANK}")
    dims = tuple(int(x) for x in arr)
    count = 1
    for i, d in enumerate(dims):
        if d < 0 and not (allow_unknown and d == -1):
            raise ModelFormatError(f"{what}[{i}]: dimension {d} is negative")
        count *= max(d, 1)
    if count > MAX_ELEMENTS:
        raise ModelFormatError(f"{what}: {list(dims)} has {count} elements, over the limit of {MAX_ELEMENTS}")
    return dims


# A zero point is a value of the tensor's storage type (LiteRT's XNNPACK path refuses any other
# when it prepares a node). Wider integer types get LiteRT's own bound: it keeps zero points as
# int32, so a larger one would silently become another value there.
_ZERO_POINT_RANGES = {"INT8": (-128, 127), "UINT8": (0, 255), "INT16": (-32768, 32767), "UINT16": (0, 65535)}
_INT32_RANGE = (-(1 << 31), (1 << 31) - 1)


def _quantization(q: Table, name: str, type_name: str, dtype: np.dtype | None, shape: tuple[int, ...],
                  constant: bool) -> Quantization:
    """Read and check one tensor's QuantizationParameters; errors name the field and the tensor.

    A table without scales (absent, empty, or ``min``/``max`` only) quantizes nothing, as in
    LiteRT. With scales, the checks of LiteRT's loader apply to every tensor: one zero point or
    one per scale, ``quantized_dimension`` an axis of the shape, one scale or one per channel of
    that axis. The values are checked on integer tensors, the only ones whose quantization
    LiteRT's kernels read (a float tensor's table is carried along unread, as LiteRT does): each
    scale finite and positive, each zero point a value of the storage type. Zero scales are
    allowed where TFLite's post-training quantizer writes them and LiteRT runs the models:
    a channel of per-channel constant weights that is all zero (and its bias), and int16
    tensors (16x8 models: a GRU's all-zero initial state); the ops refuse a zero scale
    where their arithmetic needs a positive one (:func:`litegpu.ops.quantized._params`).
    """
    details = q.scalar(4, "ubyte", 0, "details_type")
    if details:
        kinds = schema.QUANTIZATION_DETAILS
        kind = kinds[details - 1][0] if details <= len(kinds) else f"unknown QuantizationDetails type {details}"
        if kind != "BlockwiseQuantization":
            raise ModelFormatError(f"{q.path}.details_type: tensor {name!r} uses {kind}; only affine and blockwise "
                                   "quantization are supported")
        return _blockwise(q, name, shape)
    scales = q.array(2, "[float]", "scale")
    zps = q.array(3, "[long]", "zero_point")
    scales = np.zeros(0, np.float32) if scales is None else np.array(scales, np.float32)
    zps = np.zeros(0, np.int64) if zps is None else np.array(zps, np.int64)
    qdim = q.scalar(6, "int", 0, "quantized_dimension")
    quant = Quantization(scales, zps, qdim)
    n, rank = scales.size, len(shape)
    if n == 0:
        return quant
    if zps.size not in (1, n):
        raise ModelFormatError(f"{q.path}.zero_point: tensor {name!r} has {n} scales but {zps.size} zero points "
                               f"(expected 1 or {n})")
    # As LiteRT: an axis of the shape; a rank-0 tensor has none to check, except that scales per
    # channel need axis 0 (its only dimension when the shape is filled in).
    limit = rank if rank else (1 if n > 1 else None)
    if qdim < 0 or (limit is not None and qdim >= limit):
        raise ModelFormatError(f"{q.path}.quantized_dimension: {qdim} out of range for rank {rank} "
                               f"of tensor {name!r}")
    if n > 1 and rank and shape[qdim] != n:
        raise ModelFormatError(f"{q.path}.scale: tensor {name!r} has {n} scales, but dimension {qdim} of its "
                               f"shape {list(shape)} has {shape[qdim]} channels (expected 1 or {shape[qdim]})")
    if dtype is None or dtype.kind not in "iu":
        return quant
    bad = ~(np.isfinite(scales) & (scales > 0))
    if (constant and n > 1) or type_name == "INT16":
        bad &= scales != 0
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        why = "a scale of 0 is allowed only in a channel of per-channel constant weights and on int16 tensors" \
            if scales[k] == 0 else "a scale must be finite and positive"
        raise ModelFormatError(f"{q.path}.scale[{k}]: tensor {name!r} has scale {float(scales[k])!r}; {why}")
    lo, hi = _ZERO_POINT_RANGES.get(type_name, _INT32_RANGE)
    outside = (zps < lo) | (zps > hi)
    if outside.any():
        k = int(np.flatnonzero(outside)[0])
        raise ModelFormatError(f"{q.path}.zero_point[{k}]: tensor {name!r} ({type_name}) has zero point "
                               f"{int(zps[k])}, outside [{lo}, {hi}]")
    return quant


def _blockwise(q: Table, name: str, shape: tuple[int, ...]) -> Quantization:
    """A BlockwiseQuantization, its scales still to be read from the tensor it names (see
    :func:`_resolve_blockwise`): kept meanwhile as that tensor's index in ``scales``."""
    table = q.table(5, "details")
    fields = {} if table is None else table.read_fields(dict(schema.QUANTIZATION_DETAILS)["BlockwiseQuantization"])
    block = fields.get("block_size", 0)
    if len(shape) < 1 or block <= 0 or shape[-1] % block:
        raise ModelFormatError(f"{q.path}.details: tensor {name!r} of shape {list(shape)} has block size {block} "
                               "(it must divide the last dimension)")
    if fields.get("zero_points", -1) not in (-1, 0) or q.array(3, "[long]", "zero_point") is not None:
        raise ModelFormatError(f"{q.path}.details: tensor {name!r} has blockwise zero points; only symmetric "
                               "blockwise quantization (no zero points) is supported")
    return Quantization(np.array([fields.get("scales", 0)], np.int64), np.zeros(0, np.int64),
                        q.scalar(6, "int", 0, "quantized_dimension"), block)


def _resolve_blockwise(path: str, tensors: list[Tensor], made: dict[tuple, np.ndarray]) -> list[Tensor]:
    """Blockwise quantizations with their scales: [channels, blocks] float32 from the
    constant tensor each names (the quantizer writes them as FLOAT16 beside the weights),
    widened once per stored array (``made``)."""
    for i, t in enumerate(tensors):
        q = t.quantization
        if q is None or not q.block_size:
            continue
        where = f"{path}.tensors[{i}].quantization.details"
        k = int(q.scales[0])
        if not 0 <= k < len(tensors) or tensors[k].data is None:
            raise ModelFormatError(f"{where}: scales tensor {k} of {t.name!r} is not a constant tensor of the subgraph")
        scales = tensors[k].data
        expected = (int(np.prod(t.shape[:-1], dtype=np.int64)), t.shape[-1] // q.block_size)
        if scales.dtype.kind != "f" or scales.size != expected[0] * expected[1]:
            raise ModelFormatError(f"{where}: scales tensor {k} ({scales.dtype}, shape {list(scales.shape)}) does not "
                                   f"hold one float per block of {t.name!r}: {expected[0]} x {expected[1]}")
        key = ("scales", scales.__array_interface__["data"][0], scales.dtype.str, scales.size, expected)
        widened = made.get(key)
        if widened is None:
            widened = scales.astype(np.float32).reshape(expected)
            if not np.all(np.isfinite(widened)):
                raise ModelFormatError(f"{where}: scales of {t.name!r} must be finite")
            widened.flags.writeable = False
            made[key] = widened
        scales = widened
        tensors[i] = replace(t, quantization=replace(q, scales=scales))
    return tensors


def _int4(raw: np.ndarray, shape: tuple[int, ...], what: str) -> Int4Constant:
    """INT4 constant data, its size checked (two values a byte)."""
    count = int(np.prod(shape, dtype=np.int64))
    if raw.size != (count + 1) // 2:
        raise ModelFormatError(f"{what}: holds {raw.size} bytes, shape {list(shape)} of INT4 needs {(count + 1) // 2}")
    return Int4Constant(raw, shape)


def _view(raw: np.ndarray, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """A read-only typed view of ``raw`` (copied when misaligned or big-endian-hostile)."""
    arr = raw.view(dtype.newbyteorder("<")) if raw.ctypes.data % dtype.alignment == 0 else \
        np.frombuffer(raw.tobytes(), dtype.newbyteorder("<"))
    arr = arr.astype(dtype, copy=False).reshape(shape)
    arr.flags.writeable = False
    return arr


def _dequantize(t: Tensor) -> np.ndarray:
    data = t.data
    if data.dtype == np.float16:
        return data.astype(np.float32)
    q = t.quantization
    if q is None or not q.is_set:
        raise ModelFormatError(f"tensor {t.name!r}: DEQUANTIZE of {t.type_name} without quantization")
    if q.block_size:
        return dequantize_blocks(data, q.scales, q.block_size)
    shape = [1] * data.ndim
    scales = q.scales.astype(np.float32)
    # One zero point may serve every channel (_quantization allows 1 or one per scale).
    zps = np.broadcast_to(q.zero_points, scales.shape)
    if scales.size > 1:
        if data.ndim == 0 or data.shape[q.quantized_dimension] != scales.size:
            raise ModelFormatError(f"tensor {t.name!r}: {scales.size} scales do not match its shape")
        shape[q.quantized_dimension] = scales.size
    return ((data.astype(np.float32) - zps.reshape(shape).astype(np.float32)) * scales.reshape(shape))


def _fold_weight_ops(nodes: list[Node], tensors: list[Tensor]) -> tuple[list[Node], list[Tensor]]:
    """Replace DEQUANTIZE/DENSIFY of constants by constant outputs."""
    kept = []
    for node in nodes:
        if node.op in ("DEQUANTIZE", "DENSIFY") and len(node.inputs) == 1 and len(node.outputs) == 1 \
                and node.inputs[0] >= 0 and tensors[node.inputs[0]].is_constant:
            src, dst = tensors[node.inputs[0]], tensors[node.outputs[0]]
            value = _dequantize(src) if node.op == "DEQUANTIZE" else src.data
            if value.shape != dst.shape:
                raise ModelFormatError(
                    f"operator {node.index} ({node.op}): input shape {list(value.shape)} does not match "
                    f"output shape {list(dst.shape)}")
            value = np.ascontiguousarray(value, dtype=dst.dtype)
            value.flags.writeable = False
            tensors[dst.index] = Tensor(index=dst.index, name=dst.name, dtype=dst.dtype, shape=dst.shape,
                                        shape_signature=dst.shape_signature, type_name=dst.type_name,
                                        stored=value, quantization=dst.quantization)
            continue
        kept.append(node)
    return kept, tensors


def _written_empties_are_activations(nodes: list[Node], tensors: list[Tensor]) -> list[Tensor]:
    """Tensors with no elements that an operator writes are activations, not constants.

    LiteRT makes a tensor read-only model data only when its buffer holds bytes; an empty
    buffer, whatever its index, gives an ordinary read-write tensor. Converters give
    zero-element outputs such an empty buffer (BirdNET's SPLIT_V writes a ``[0]``-shaped
    piece), so such a tensor is an activation when an operator writes it. Unwritten, it
    stays an empty constant (e.g. the empty axes of a reduction), which it is either way.
    """
    written = {o for node in nodes for o in node.outputs}
    for o in written:
        t = tensors[o]
        if t.data is not None and t.data.size == 0:
            tensors[o] = replace(t, stored=None)
    return tensors


def _check_dataflow(path: str, nodes: list[Node], tensors: list[Tensor], inputs, outputs) -> None:
    """Each activation is produced once, before it is read; no node reads its own output."""
    produced_by: dict[int, int] = {}
    graph_inputs = set(inputs)
    available = set(inputs)
    for t in tensors:
        if t.is_constant or t.is_variable:
            available.add(t.index)
    for node in nodes:
        for o in node.outputs:
            if o in produced_by:
                raise ModelFormatError(
                    f"{path}.operators[{node.index}]: tensor {o} is already produced by operator {produced_by[o]}")
            if tensors[o].is_constant:
                raise ModelFormatError(f"{path}.operators[{node.index}]: writes constant tensor {o}")
            if o in graph_inputs:
                raise ModelFormatError(f"{path}.operators[{node.index}] ({node.op}): writes tensor {o}, "
                                       "an input of the subgraph (two producers)")
            produced_by[o] = node.index
        for i in node.inputs:
            if i < 0 or i in available:
                continue
            if i in node.outputs:
                raise ModelFormatError(f"{path}.operators[{node.index}] ({node.op}) reads its own output tensor {i}")
            raise ModelFormatError(
                f"{path}.operators[{node.index}] ({node.op}) reads tensor {i} before any operator produces it "
                "(cycle or missing producer)")
        available.update(node.outputs)
    for o in outputs:
        if o not in available:
            raise ModelFormatError(f"{path}.outputs: tensor {o} is never produced")


def _check_subgraph_calls(subgraphs: tuple[Subgraph, ...]) -> None:
    """Subgraph indices in control-flow options are in range and never recurse."""
    n = len(subgraphs)
    calls: dict[int, set[int]] = {}
    for sg in subgraphs:
        targets = set()
        for node in sg.nodes:
            for field in _SUBGRAPH_OPTION_FIELDS.get(node.op, ()):
                idx = node.options.get(field, 0)
                if not 0 <= idx < n:
                    raise ModelFormatError(
                        f"subgraph {sg.index} operator {node.index} ({node.op}).{field}: subgraph {idx} "
                        f"out of range ({n} subgraphs)")
                targets.add(idx)
        calls[sg.index] = targets
    # Iterative depth-first search: a hostile model may chain thousands of subgraphs.
    state: dict[int, int] = {}
    for start in range(n):
        if state.get(start):
            continue
        stack = [(start, iter(sorted(calls[start])))]
        state[start] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                path = [s for s, _ in stack] + [nxt]
                raise ModelFormatError(f"subgraphs call each other in a cycle: {' -> '.join(map(str, path))}")
            elif not state.get(nxt):
                state[nxt] = 1
                stack.append((nxt, iter(sorted(calls[nxt]))))
