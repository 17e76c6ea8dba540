"""Write small ``.tflite`` models from Python, for tests and conformance cases.

Field layouts come from :mod:`litegpu.model.schema` (the same tables the reader uses),
so the schema is written down once. The output is an ordinary flatbuffer with the
``TFL3`` identifier that LiteRT loads::

    b = ModelBuilder()
    x = b.input("x", (1, 8, 8, 3), np.float32)
    w = b.const("w", weights)
    y = b.tensor("y", (1, 8, 8, 4), np.float32)
    b.op("CONV_2D", [x, w, bias], [y], padding="SAME", stride_w=1, stride_h=1)
    b.output(y)
    data = b.build()

Option keyword arguments use the schema's field names; enum-valued fields also
accept their names (``padding="SAME"``, ``fused_activation_function="RELU6"``,
``out_type="INT64"`` or ``out_type=np.int64``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import flatbuffers
import numpy as np

from ..errors import InvalidArgumentError
from ..model import schema

# Enum-valued option fields: field name -> {enum name: code}. TensorType fields share one map.
_TENSOR_TYPE_CODES = {name: code for code, (name, _) in schema.TENSOR_TYPES.items()}
_TENSOR_TYPE_FIELDS = ("in_data_type", "out_data_type", "output_type", "out_type", "idx_out_type",
                       "key_dtype", "value_dtype", "quantized_bias_type")
ENUM_FIELDS: dict[str, dict[str, int]] = {
    "padding": {name: code for code, name in schema.PADDING.items()},
    "fused_activation_function": {name: code for code, name in schema.ACTIVATIONS.items()},
    "mode": {name: code for code, name in schema.MIRROR_PAD_MODES.items()},
    # Small enums of schema.fbs that the reader keeps as integers.
    "weights_format": {"DEFAULT": 0, "SHUFFLED4x16INT8": 1},
    "kernel_type": {"FULL": 0, "BASIC": 1},
    "type": {"UNKNOWN": 0, "SPARSE": 1, "DENSE": 2},
    "combiner": {"SUM": 0, "MEAN": 1, "SQRTN": 2},
    **{name: _TENSOR_TYPE_CODES for name in _TENSOR_TYPE_FIELDS},
}

# How each schema scalar type is written: (Builder slot method, Python type it takes).
_SLOT_WRITERS = {
    "bool": ("PrependBoolSlot", bool), "byte": ("PrependInt8Slot", int), "ubyte": ("PrependUint8Slot", int),
    "short": ("PrependInt16Slot", int), "ushort": ("PrependUint16Slot", int),
    "int": ("PrependInt32Slot", int), "uint": ("PrependUint32Slot", int),
    "long": ("PrependInt64Slot", int), "ulong": ("PrependUint64Slot", int),
    "float": ("PrependFloat32Slot", float), "double": ("PrependFloat64Slot", float),
}
_VECTOR_DTYPES = {"[int]": np.dtype("<i4"), "[float]": np.dtype("<f4"), "[long]": np.dtype("<i8"),
                  "[ubyte]": np.dtype("u1"), "[uint]": np.dtype("<u4"), "[bool]": np.dtype("u1")}
_UPPER_TABLES = {name.upper(): name for name, _ in schema.BUILTIN_OPTIONS}
# QuantizationDetails union members: name -> (union type, fields).
_DETAILS_BY_NAME = {name: (i + 1, fields) for i, (name, fields) in enumerate(schema.QUANTIZATION_DETAILS)}


def options_table_for(op: str) -> str | None:
    """The BuiltinOptions table the converter writes for ``op``, or ``None``.

    :data:`schema.OP_OPTIONS` first; otherwise the table named after the op
    (``REVERSE_SEQUENCE`` -> ``ReverseSequenceOptions``), as schema.fbs names them.
    """
    if op in schema.OP_OPTIONS:
        return schema.OP_OPTIONS[op]
    if op in schema.OP_OPTIONS_2:
        return schema.OP_OPTIONS_2[op]
    return _UPPER_TABLES.get(op.replace("_", "") + "OPTIONS")


def tensor_type_code(dtype: Any) -> int:
    """The TensorType code of a numpy dtype or a TensorType name (``"RESOURCE"``)."""
    if isinstance(dtype, str) and dtype.upper() in _TENSOR_TYPE_CODES:
        return _TENSOR_TYPE_CODES[dtype.upper()]
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise InvalidArgumentError(f"unknown tensor type {dtype!r}") from None
    if dt not in schema.DTYPE_TO_TENSOR_TYPE:
        raise InvalidArgumentError(f"dtype {dt} has no TensorType")
    return schema.DTYPE_TO_TENSOR_TYPE[dt]


def _enum_value(table: str, name: str, value: Any) -> Any:
    """Translate an enum name (or numpy dtype for TensorType fields) into its code."""
    names = ENUM_FIELDS.get(name)
    if names is None or isinstance(value, (bool, int, np.integer)):
        return value
    if isinstance(value, str):
        by_upper = {k.upper(): v for k, v in names.items()}
        if value.upper() in by_upper:
            return by_upper[value.upper()]
        raise InvalidArgumentError(f"{table}.{name}: unknown value {value!r}; expected one of {sorted(names)}")
    if names is _TENSOR_TYPE_CODES:
        return tensor_type_code(value)
    raise InvalidArgumentError(f"{table}.{name}: cannot use {value!r}")


@dataclass
class _Tensor:
    name: str
    shape: tuple[int, ...]
    type_code: int
    buffer: int = 0
    shape_signature: tuple[int, ...] | None = None
    is_variable: bool = False
    quant: dict | None = None


@dataclass
class _Op:
    opcode: int
    inputs: list[int]
    outputs: list[int]
    options_table: str | None
    options: dict
    custom_options: bytes | None
    intermediates: list[int]


@dataclass
class _Subgraph:
    name: str
    tensors: list[_Tensor] = field(default_factory=list)
    ops: list[_Op] = field(default_factory=list)
    inputs: list[int] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)


class SubgraphBuilder:
    """Adds tensors and ops to one subgraph; ``index`` is its position in the model."""

    def __init__(self, model: "ModelBuilder", index: int) -> None:
        self.model = model
        self.index = index

    @property
    def _sg(self) -> _Subgraph:
        return self.model._subgraphs[self.index]

    # -- tensors ------------------------------------------------------------------
    def tensor(self, name: str, shape: Sequence[int], dtype: Any = np.float32, *,
               shape_signature: Sequence[int] | None = None, is_variable: bool = False,
               scale: Any = None, zero_point: Any = None, quantized_dimension: int = 0,
               min: Any = None, max: Any = None, details: tuple[str, Mapping[str, Any]] | None = None) -> int:
        """Add an activation (or variable) tensor; returns its index in this subgraph.

        ``dtype`` is a numpy dtype or a TensorType name (``"RESOURCE"``, ``"STRING"``).
        ``scale``/``zero_point`` (scalars or per-channel sequences) add quantization;
        ``details`` sets its QuantizationDetails union, as (member table, field values), e.g.
        ``("BlockwiseQuantization", {"scales": 3, "zero_points": 4, "block_size": 32})``.
        """
        quant = None
        if details is not None and details[0] not in _DETAILS_BY_NAME:
            raise InvalidArgumentError(f"unknown QuantizationDetails member {details[0]!r}; "
                                       f"expected one of {sorted(_DETAILS_BY_NAME)}")
        if any(v is not None for v in (scale, zero_point, min, max, details)):
            quant = {"scale": scale, "zero_point": zero_point, "quantized_dimension": quantized_dimension,
                     "min": min, "max": max, "details": details}
        t = _Tensor(name=name, shape=tuple(int(d) for d in shape), type_code=tensor_type_code(dtype),
                    shape_signature=None if shape_signature is None else tuple(int(d) for d in shape_signature),
                    is_variable=is_variable, quant=quant)
        self._sg.tensors.append(t)
        return len(self._sg.tensors) - 1

    def input(self, name: str, shape: Sequence[int], dtype: Any = np.float32, *,
              shape_signature: Sequence[int] | None = None, **quant: Any) -> int:
        """Add a tensor and append it to this subgraph's inputs; returns its index."""
        idx = self.tensor(name, shape, dtype, shape_signature=shape_signature, **quant)
        self._sg.inputs.append(idx)
        return idx

    def const(self, name: str, array: Any, dtype: Any = None, **quant: Any) -> int:
        """Add a constant tensor with its own buffer; returns its index.

        ``dtype`` converts the array first (e.g. ``np.float16`` for fp16 weights). ``"INT4"``
        packs values in [-8, 7] two a byte, the first in the low nibble (LiteRT's layout).
        """
        if isinstance(dtype, str) and dtype.upper() == "INT4":
            nibbles = np.asarray(array, np.int8)
            flat = np.append(nibbles.ravel(), np.zeros(nibbles.size % 2, np.int8)).astype(np.uint8) & 0xF
            idx = self.tensor(name, nibbles.shape, "INT4", **quant)
            self._sg.tensors[idx].buffer = self.model._add_buffer((flat[0::2] | (flat[1::2] << 4)).tobytes())
            return idx
        arr = np.asarray(array)
        if dtype is not None:
            arr = arr.astype(dtype)
        if arr.dtype not in schema.DTYPE_TO_TENSOR_TYPE:
            raise InvalidArgumentError(f"constant {name!r}: dtype {arr.dtype} has no TensorType")
        raw = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()
        idx = self.tensor(name, arr.shape, arr.dtype, **quant)
        self._sg.tensors[idx].buffer = self.model._add_buffer(raw)
        return idx

    def output(self, *tensors: int) -> None:
        """Append tensors to this subgraph's outputs."""
        self._sg.outputs.extend(int(t) for t in tensors)

    # -- operators ----------------------------------------------------------------
    def op(self, name: str, inputs: Sequence[int], outputs: Sequence[int], /, *, version: int = 1,
           options_table: str | None = None, intermediates: Sequence[int] = (), **options: Any) -> int:
        """Add a builtin op; option kwargs use the schema's field names. Returns the op index.

        ``-1`` in ``inputs`` is an omitted optional input. ``options_table`` overrides the
        table written (default: :func:`options_table_for`).
        """
        if name not in schema.BUILTIN_CODES or name == "CUSTOM":
            raise InvalidArgumentError(f"unknown builtin op {name!r} (use custom_op for custom ops)")
        table = options_table or options_table_for(name)
        if table is None and options:
            raise InvalidArgumentError(f"{name} takes no options table; got {sorted(options)}")
        if table is not None:
            union = schema.OPTIONS_BY_NAME.get(table) or schema.OPTIONS_2_BY_NAME.get(table)
            if union is None:
                raise InvalidArgumentError(f"unknown options table {table!r}")
            fields = {f[0] for f in union[1]}
            unknown = sorted(set(options) - fields)
            if unknown:
                raise InvalidArgumentError(f"{name}: {table} has no field {unknown}; fields: {sorted(fields)}")
            options = {k: _enum_value(table, k, v) for k, v in options.items()}
        opcode = self.model._opcode(schema.BUILTIN_CODES[name], "", version)
        return self._add_op(_Op(opcode, list(inputs), list(outputs), table, options, None, list(intermediates)))

    def custom_op(self, name: str, inputs: Sequence[int], outputs: Sequence[int], *,
                  custom_options: bytes = b"", version: int = 1) -> int:
        """Add a custom op (``OperatorCode.custom_code = name``); returns the op index."""
        opcode = self.model._opcode(schema.CUSTOM_CODE, name, version)
        return self._add_op(_Op(opcode, list(inputs), list(outputs), None, {}, bytes(custom_options), []))

    def _add_op(self, op: _Op) -> int:
        n = len(self._sg.tensors)
        for i in op.inputs + op.outputs + op.intermediates:
            if not -1 <= i < n:
                raise InvalidArgumentError(f"tensor index {i} out of range ({n} tensors in subgraph {self.index})")
        self._sg.ops.append(op)
        return len(self._sg.ops) - 1

    # -- model-level calls, available from any subgraph builder --------------------
    def subgraph(self, name: str = "") -> "SubgraphBuilder":
        """A builder for a new subgraph of the same model."""
        return self.model.subgraph(name)


class ModelBuilder(SubgraphBuilder):
    """Builds a whole model; it is itself the builder of the main subgraph (index 0)."""

    def __init__(self, name: str = "main", description: str = "litegpu test model") -> None:
        self._subgraphs: list[_Subgraph] = [_Subgraph(name)]
        self._buffers: list[bytes] = [b""]  # buffer 0: the empty sentinel LiteRT expects
        self._opcodes: list[tuple[int, str, int]] = []
        self._signatures: list[tuple[str, dict, dict, int]] = []
        self._metadata: list[tuple[str, int]] = []
        self.description = description
        super().__init__(self, 0)

    def subgraph(self, name: str = "") -> SubgraphBuilder:
        """Start a new subgraph; the returned builder has the same methods, index ``len-1``."""
        self._subgraphs.append(_Subgraph(name or f"subgraph{len(self._subgraphs)}"))
        return SubgraphBuilder(self, len(self._subgraphs) - 1)

    def signature(self, key: str, inputs: Mapping[str, int], outputs: Mapping[str, int],
                  subgraph: int = 0) -> None:
        """Add a SignatureDef mapping names to tensor indices of ``subgraph``."""
        self._signatures.append((key, dict(inputs), dict(outputs), subgraph))

    def metadata(self, name: str, data: bytes) -> None:
        """Attach a metadata entry (stored in its own buffer)."""
        self._metadata.append((name, self._add_buffer(bytes(data))))

    def _add_buffer(self, raw: bytes) -> int:
        self._buffers.append(raw)
        return len(self._buffers) - 1

    def _opcode(self, code: int, custom: str, version: int) -> int:
        key = (code, custom, version)
        if key not in self._opcodes:
            self._opcodes.append(key)
        return self._opcodes.index(key)

    # -- serialization --------------------------------------------------------------
    def build(self) -> bytes:
        """Serialize the model to ``.tflite`` bytes."""
        return _Writer(self).write()


class _Writer:
    """Serializes a ModelBuilder. Flatbuffers are written back to front: children first."""

    def __init__(self, model: ModelBuilder) -> None:
        self.m = model
        size = 1024 + sum(len(b) + 32 for b in model._buffers)
        self.b = flatbuffers.Builder(size)

    def write(self) -> bytes:
        b, m = self.b, self.m
        buffers = [self._buffer(raw) for raw in m._buffers]
        opcodes = [self._opcode(*k) for k in m._opcodes]
        subgraphs = [self._subgraph(sg) for sg in m._subgraphs]
        signatures = [self._signature(*s) for s in m._signatures]
        metadata = [self._table([("string", b.CreateString(name)), ("uint", buf)]) for name, buf in m._metadata]
        description = b.CreateString(m.description)
        fields = [("uint", 3), ("vec", self._offsets(opcodes)), ("vec", self._offsets(subgraphs)),
                  ("string", description), ("vec", self._offsets(buffers)), None,
                  ("vec", self._offsets(metadata)) if metadata else None,
                  ("vec", self._offsets(signatures)) if signatures else None]
        root = self._table(fields)
        b.Finish(root, file_identifier=schema.FILE_IDENTIFIER)
        return bytes(b.Output())

    # Generic table writer: fields in slot order as (kind, value) or None for absent.
    def _table(self, fields: list) -> int:
        b = self.b
        b.StartObject(len(fields))
        for slot, f in enumerate(fields):
            if f is None:
                continue
            kind, value = f
            if kind in ("string", "vec", "table"):
                b.PrependUOffsetTRelativeSlot(slot, value, 0)
            else:
                method, _ = _SLOT_WRITERS[kind]
                # Written even when equal to the schema default, so what was asked for is explicit.
                getattr(b, method.replace("Slot", ""))(value)
                b.Slot(slot)
        return b.EndObject()

    def _offsets(self, offsets: list[int]) -> int:
        b = self.b
        b.StartVector(4, len(offsets), 4)
        for o in reversed(offsets):
            b.PrependUOffsetTRelative(o)
        return b.EndVector()

    def _numbers(self, values: Iterable, dtype: np.dtype) -> int:
        arr = np.asarray(list(values) if not isinstance(values, np.ndarray) else values, dtype=dtype)
        return self._raw_vector(arr.tobytes(), dtype.itemsize, len(arr), dtype.itemsize)

    def _raw_vector(self, raw: bytes, elem_size: int, n: int, alignment: int) -> int:
        b = self.b
        b.StartVector(elem_size, n, alignment)
        b.head = b.head - len(raw)
        b.Bytes[b.head:b.head + len(raw)] = raw
        return b.EndVector()

    def _buffer(self, raw: bytes) -> int:
        if not raw:
            return self._table([])
        # schema.fbs: Buffer.data has force_align 16, so typed views of weights are aligned.
        return self._table([("vec", self._raw_vector(raw, 1, len(raw), 16))])

    def _opcode(self, code: int, custom: str, version: int) -> int:
        name = self.b.CreateString(custom) if custom else None
        # LiteRT writes both: the byte-sized deprecated code (capped at 127) and the int code.
        return self._table([("byte", min(code, 127)), ("string", name) if name else None,
                            ("int", version), ("int", code)])

    def _quant(self, q: dict) -> int:
        def vec(key, dtype):
            v = q.get(key)
            return None if v is None else ("vec", self._numbers(np.atleast_1d(v), np.dtype(dtype)))
        details_type = details = None
        if q.get("details") is not None:
            member, values = q["details"]
            union_type, fields = _DETAILS_BY_NAME[member]
            details_type, details = ("ubyte", union_type), ("table", self._fields_table(fields, values))
        return self._table([vec("min", "<f4"), vec("max", "<f4"), vec("scale", "<f4"),
                            vec("zero_point", "<i8"), details_type, details,
                            ("int", int(q.get("quantized_dimension", 0)))])

    def _tensor(self, t: _Tensor) -> int:
        b = self.b
        shape = self._numbers(t.shape, np.dtype("<i4"))
        name = b.CreateString(t.name)
        quant = self._quant(t.quant) if t.quant else None
        sig = None if t.shape_signature is None else self._numbers(t.shape_signature, np.dtype("<i4"))
        return self._table([("vec", shape), ("byte", t.type_code), ("uint", t.buffer), ("string", name),
                            ("table", quant) if quant else None, ("bool", True) if t.is_variable else None,
                            None, ("vec", sig) if sig is not None else None])

    def _options(self, table: str, values: dict) -> tuple[int, int]:
        union_type, fields = schema.OPTIONS_BY_NAME.get(table) or schema.OPTIONS_2_BY_NAME[table]
        return union_type, self._fields_table(fields, values)

    def _fields_table(self, fields: list[tuple[str, str, object]], values: Mapping[str, Any]) -> int:
        """A table described as ``(name, type, default)`` per slot; fields absent from ``values`` are not written."""
        out: list = []
        for name, kind, _default in fields:
            if name not in values or values[name] is None:
                out.append(None)
            elif kind == "string":
                out.append(("string", self.b.CreateString(str(values[name]))))
            elif kind in _VECTOR_DTYPES:
                value = values[name]
                if isinstance(value, (bytes, bytearray)):
                    value = np.frombuffer(value, np.uint8)
                out.append(("vec", self._numbers(np.atleast_1d(value), _VECTOR_DTYPES[kind])))
            else:
                out.append((kind, _SLOT_WRITERS[kind][1](values[name])))
        return self._table(out)

    def _op(self, op: _Op) -> int:
        inputs = self._numbers(op.inputs, np.dtype("<i4"))
        outputs = self._numbers(op.outputs, np.dtype("<i4"))
        opts = self._options(op.options_table, op.options) if op.options_table else None
        custom = self._numbers(np.frombuffer(op.custom_options, np.uint8), np.dtype("u1")) \
            if op.custom_options else None
        inter = self._numbers(op.intermediates, np.dtype("<i4")) if op.intermediates else None
        # BuiltinOptions2 (the StableHLO ops' tables) goes in slots 11 and 12, BuiltinOptions in 3 and 4.
        second = op.options_table in schema.OPTIONS_2_BY_NAME
        union = [("ubyte", opts[0]), ("table", opts[1])] if opts else [None, None]
        return self._table([("uint", op.opcode), ("vec", inputs), ("vec", outputs),
                            *([None, None] if second else union),
                            ("vec", custom) if custom is not None else None, None, None,
                            ("vec", inter) if inter is not None else None,
                            *([None, None, *union] if second else [])])

    def _subgraph(self, sg: _Subgraph) -> int:
        tensors = self._offsets([self._tensor(t) for t in sg.tensors])
        inputs = self._numbers(sg.inputs, np.dtype("<i4"))
        outputs = self._numbers(sg.outputs, np.dtype("<i4"))
        ops = self._offsets([self._op(op) for op in sg.ops])
        name = self.b.CreateString(sg.name)
        return self._table([("vec", tensors), ("vec", inputs), ("vec", outputs), ("vec", ops), ("string", name)])

    def _signature(self, key: str, inputs: dict, outputs: dict, subgraph: int) -> int:
        def maps(d: dict) -> int:
            return self._offsets([self._table([("string", self.b.CreateString(n)), ("uint", int(i))])
                                  for n, i in d.items()])
        ins, outs = maps(inputs), maps(outputs)
        key_off = self.b.CreateString(key)
        return self._table([("vec", ins), ("vec", outs), ("string", key_off), None, ("uint", subgraph)])


def two_layer_mlp() -> bytes:
    """A model of two fully connected layers on (8, 256), seeded: big enough that every
    runtime splits the work over threads (used by the thread tests and the GPU acceptance
    script)."""
    rng = np.random.default_rng(1)
    b = ModelBuilder()
    x = b.input("x", (8, 256))
    h, y = b.tensor("h", (8, 512)), b.tensor("y", (8, 128))
    b.op("FULLY_CONNECTED", [x, b.const("w1", rng.standard_normal((512, 256)).astype(np.float32) * 0.05),
                             b.const("b1", np.zeros(512, np.float32))], [h], fused_activation_function="RELU")
    b.op("FULLY_CONNECTED", [h, b.const("w2", rng.standard_normal((128, 512)).astype(np.float32) * 0.05),
                             b.const("b2", np.zeros(128, np.float32))], [y])
    b.output(y)
    return b.build()
