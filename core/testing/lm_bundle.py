"""Write small ``.litertlm`` bundles from Python, for tests.

The layout is the one :mod:`litegpu.lm.bundle` documents and LiteRT-LM's
``litert-lm-builder`` writes: magic, version, header end, the header flatbuffer from byte
32, then each section on the next 16 KiB boundary. ``LlmMetadata`` is serialized by the
small protobuf encoder here, from the reader's own dataclass, so a round trip checks both::

    w = BundleWriter()
    w.system_metadata("Authors", "litegpu tests")
    w.llm_metadata(LlmMetadata(start_token=TokenUnion(ids=(2,)), max_num_tokens=1024))
    w.sentencepiece(model_proto)
    w.model(tflite_bytes, "prefill_decode")
    data = w.build()                      # or w.write(path)

A section may be given explicit ``offsets=(begin, end)`` (its data then is not written),
to make hostile files.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any, Iterable, Mapping

import flatbuffers

from ..errors import InvalidArgumentError
from ..lm.bundle import (BLOCK_SIZE, HEADER_BEGIN, HEADER_END_FIELD, MAGIC, SAMPLER_BACKENDS, SAMPLER_TYPES,
                         SECTION_TYPES, VDATA_TYPES, LlmMetadata, PromptAffixes, TokenUnion)
from ..lm.tokenizer import compress_hf_tokenizer

__all__ = ["BundleWriter", "DEFAULT_VERSION", "encode_llm_metadata", "pb_varint", "pb_bytes", "pb_string",
           "pb_float", "pb_packed_int32", "encode_varint"]

# The version litert-lm-builder 0.18.1 writes.
DEFAULT_VERSION = (1, 7, 0)
_VDATA_CODES = {name: code for code, (name, _) in VDATA_TYPES.items()}
# Builder method that writes a VData table's `value` field, per flatbuffer scalar kind.
_SLOT_WRITERS = {"ubyte": "PrependUint8Slot", "byte": "PrependInt8Slot", "ushort": "PrependUint16Slot",
                 "short": "PrependInt16Slot", "uint": "PrependUint32Slot", "int": "PrependInt32Slot",
                 "float": "PrependFloat32Slot", "bool": "PrependBoolSlot", "ulong": "PrependUint64Slot",
                 "long": "PrependInt64Slot", "double": "PrependFloat64Slot"}


# ------------------------------------------------------------------------------------------
# A minimal protobuf encoder
# ------------------------------------------------------------------------------------------
def encode_varint(value: int) -> bytes:
    """A varint; a negative value is written as its 64-bit two's complement (10 bytes), as
    protobuf writes negative ``int32``/``int64``."""
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def pb_varint(number: int, value: int) -> bytes:
    """A varint field (``int32``, ``int64``, ``bool``, enum)."""
    return encode_varint(number << 3) + encode_varint(int(value))


def pb_bytes(number: int, data: bytes) -> bytes:
    """A length-delimited field (``bytes``, a sub-message)."""
    return encode_varint(number << 3 | 2) + encode_varint(len(data)) + bytes(data)


def pb_string(number: int, text: str) -> bytes:
    """A ``string`` field."""
    return pb_bytes(number, text.encode("utf-8"))


def pb_float(number: int, value: float) -> bytes:
    """A ``float`` field (32-bit)."""
    return encode_varint(number << 3 | 5) + struct.pack("<f", value)


def pb_packed_int32(number: int, values: Iterable[int]) -> bytes:
    """A packed ``repeated int32`` field; nothing when ``values`` is empty."""
    payload = b"".join(encode_varint(int(v)) for v in values)
    return pb_bytes(number, payload) if payload else b""


def _token_union(token: TokenUnion) -> bytes:
    if token.ids is not None:
        return pb_bytes(1, pb_packed_int32(1, token.ids))
    if token.text is not None:
        return pb_string(2, token.text)
    return b""


def _affixes(affixes: PromptAffixes) -> bytes:
    return (pb_string(1, affixes.prefix) if affixes.prefix else b"") + \
           (pb_string(2, affixes.suffix) if affixes.suffix else b"")


def _code(names: dict[int, str], name: str) -> int:
    codes = {v: k for k, v in names.items()}
    return codes[name] if name in codes else int(name)


def encode_llm_metadata(md: LlmMetadata) -> bytes:
    """Serialize ``md`` as a ``litert.lm.proto.LlmMetadata`` (fields in number order, proto3
    defaults of non-optional fields left out, optional fields written when not ``None``)."""
    out = bytearray()
    if md.start_token is not None:
        out += pb_bytes(1, _token_union(md.start_token))
    for token in md.stop_tokens:
        out += pb_bytes(2, _token_union(token))
    if md.prompt_templates is not None:
        t = md.prompt_templates
        out += pb_bytes(3, b"".join(pb_bytes(n, _affixes(a)) for n, a in ((1, t.user), (2, t.model), (3, t.system))
                                    if a is not None))
    if md.sampler_params is not None:
        s = md.sampler_params
        msg = bytearray()
        for number, value in ((1, _code(SAMPLER_TYPES, s.type)), (2, s.k)):
            msg += pb_varint(number, value) if value else b""
        msg += (pb_float(3, s.p) if s.p else b"") + (pb_float(4, s.temperature) if s.temperature else b"")
        msg += b"" if s.seed is None else pb_varint(5, s.seed)
        backend = _code(SAMPLER_BACKENDS, s.backend)
        msg += (pb_varint(6, backend) if backend else b"") + \
               (pb_varint(7, 1) if s.compute_exact_log_probs else b"")
        out += pb_bytes(4, bytes(msg))
    if md.max_num_tokens:
        out += pb_varint(5, md.max_num_tokens)
    if md.model_type is not None:
        m = md.model_type
        out += pb_bytes(6, pb_bytes(m.field, m.raw) if m.field else b"")
    if md.jinja_prompt_template is not None:
        out += pb_string(7, md.jinja_prompt_template)
    if md.suppress_tokens:
        out += pb_bytes(9, pb_packed_int32(1, md.suppress_tokens))
    for number, flag in ((11, md.supports_thinking), (12, md.supports_function_calling)):
        if flag is not None:
            out += pb_varint(number, flag)
    if md.pad_token is not None:
        out += pb_bytes(13, _token_union(md.pad_token))
    if md.min_runtime_version is not None:
        out += pb_string(14, md.min_runtime_version)
    return bytes(out)


# ------------------------------------------------------------------------------------------
# The bundle writer
# ------------------------------------------------------------------------------------------
def _typed(value: Any) -> tuple[str, Any]:
    """``(VData type name, value)``: a ``(name, value)`` pair as given, else by Python type
    (bool -> Bool, int -> Int32 or Int64, float -> Double, str -> StringValue)."""
    if isinstance(value, tuple):
        name, raw = value
        if name not in _VDATA_CODES:
            raise InvalidArgumentError(f"unknown VData type {name!r}; known: {list(_VDATA_CODES)}")
        return name, raw
    if isinstance(value, bool):
        return "Bool", value
    if isinstance(value, int):
        return ("Int32" if -(1 << 31) <= value < (1 << 31) else "Int64"), value
    if isinstance(value, float):
        return "Double", value
    if isinstance(value, str):
        return "StringValue", value
    raise InvalidArgumentError(f"cannot store {value!r} ({type(value).__name__}) as a key/value item")


@dataclass
class _Section:
    data_type: int
    data: bytes
    items: list[tuple[str, tuple[str, Any]]]
    offsets: tuple[int, int] | None


class BundleWriter:
    """Collects system metadata and sections, then writes them as one ``.litertlm`` file.

    :param version: ``(major, minor, patch)`` written after the magic."""

    def __init__(self, version: tuple[int, int, int] = DEFAULT_VERSION) -> None:
        self.version = version
        self._system: list[tuple[str, tuple[str, Any]]] = []
        self._sections: list[_Section] = []

    def system_metadata(self, key: str, value: Any) -> "BundleWriter":
        """Add a system metadata entry (``value`` as :func:`_typed` reads it)."""
        self._system.append((key, _typed(value)))
        return self

    def section(self, data_type: str | int, data: bytes | bytearray | memoryview = b"",
                items: Mapping[str, Any] | None = None, offsets: tuple[int, int] | None = None) -> "BundleWriter":
        """Add a section of ``data_type`` (a name of :data:`SECTION_TYPES` or a code).

        :param offsets: ``(begin, end)`` to write instead of the section's real place; its
            data is then not written (for hostile files)."""
        if isinstance(data_type, str):
            if data_type not in SECTION_TYPES:
                raise InvalidArgumentError(f"unknown section type {data_type!r}; known: {list(SECTION_TYPES)}")
            data_type = SECTION_TYPES.index(data_type)
        typed = [(key, _typed(value)) for key, value in (items or {}).items()]
        self._sections.append(_Section(data_type, bytes(data), typed, offsets))
        return self

    def model(self, tflite: bytes | bytearray | memoryview, model_type: str | None = "prefill_decode",
              **items: Any) -> "BundleWriter":
        """Add a ``TFLiteModel`` section; its ``model_type`` item is written as the builder
        does (``"tf_lite_" + model_type``), or not at all when ``model_type`` is ``None``."""
        if model_type is not None:
            items = {"model_type": f"tf_lite_{model_type}", **items}
        return self.section("TFLiteModel", tflite, items)

    def sentencepiece(self, model_proto: bytes | bytearray | memoryview, **items: Any) -> "BundleWriter":
        """Add an ``SP_Tokenizer`` section holding a serialized SentencePiece model."""
        return self.section("SP_Tokenizer", model_proto, items)

    def hf_tokenizer(self, tokenizer_json: str | bytes, **items: Any) -> "BundleWriter":
        """Add an ``HF_Tokenizer_Zlib`` section: ``tokenizer_json`` compressed as the builder does."""
        return self.section("HF_Tokenizer_Zlib", compress_hf_tokenizer(tokenizer_json), items)

    def llm_metadata(self, metadata: LlmMetadata | bytes, **items: Any) -> "BundleWriter":
        """Add an ``LlmMetadataProto`` section (a dataclass is encoded by :func:`encode_llm_metadata`)."""
        data = encode_llm_metadata(metadata) if isinstance(metadata, LlmMetadata) else metadata
        return self.section("LlmMetadataProto", data, items)

    # -- serialization ----------------------------------------------------------------
    def _header(self, places: list[tuple[int, int]]) -> bytes:
        b = flatbuffers.Builder(1024)
        b.ForceDefaults(True)    # every scalar written: the header's size does not depend on the offsets

        def key_values(pairs: list[tuple[str, tuple[str, Any]]]) -> list[int]:
            offsets = []
            for key, (type_name, value) in pairs:
                key_off = b.CreateString(key)
                kind = VDATA_TYPES[_VDATA_CODES[type_name]][1]
                value_str = b.CreateString(value) if kind == "string" else None
                b.StartObject(1)
                if kind == "string":
                    b.PrependUOffsetTRelativeSlot(0, value_str, 0)
                else:
                    getattr(b, _SLOT_WRITERS[kind])(0, value, 0)
                value_off = b.EndObject()
                b.StartObject(3)
                b.PrependUOffsetTRelativeSlot(0, key_off, 0)
                b.PrependUint8Slot(1, _VDATA_CODES[type_name], 0)
                b.PrependUOffsetTRelativeSlot(2, value_off, 0)
                offsets.append(b.EndObject())
            return offsets

        def vector(offsets: list[int]) -> int:
            b.StartVector(4, len(offsets), 4)
            for off in reversed(offsets):
                b.PrependUOffsetTRelative(off)
            return b.EndVector()

        objects = []
        for section, (begin, end) in zip(self._sections, places):
            items = vector(key_values(section.items))
            b.StartObject(4)
            b.PrependUOffsetTRelativeSlot(0, items, 0)
            b.PrependUint64Slot(1, begin, 0)
            b.PrependUint64Slot(2, end, 0)
            b.PrependUint8Slot(3, section.data_type, 0)
            objects.append(b.EndObject())
        objects_vec = vector(objects)
        b.StartObject(1)
        b.PrependUOffsetTRelativeSlot(0, objects_vec, 0)
        section_metadata = b.EndObject()
        entries = vector(key_values(self._system))
        b.StartObject(1)
        b.PrependUOffsetTRelativeSlot(0, entries, 0)
        system_metadata = b.EndObject()
        b.StartObject(2)
        b.PrependUOffsetTRelativeSlot(0, system_metadata, 0)
        b.PrependUOffsetTRelativeSlot(1, section_metadata, 0)
        b.Finish(b.EndObject())
        return bytes(b.Output())

    def build(self) -> bytes:
        """The file's bytes."""
        header_size = len(self._header([(1, 1)] * len(self._sections)))
        offset = _round_up(HEADER_BEGIN + header_size)
        places, placed = [], []
        for section in self._sections:
            if section.offsets is not None:
                places.append(section.offsets)
                continue
            places.append((offset, offset + len(section.data)))
            placed.append((offset, section.data))
            offset = _round_up(offset + len(section.data))
        header = self._header(places)
        assert len(header) == header_size
        end = max([HEADER_BEGIN + header_size, *(at + len(data) for at, data in placed)])
        out = bytearray(end)
        out[:8] = MAGIC
        struct.pack_into("<III", out, 8, *self.version)
        struct.pack_into("<Q", out, HEADER_END_FIELD, HEADER_BEGIN + header_size)
        out[HEADER_BEGIN:HEADER_BEGIN + header_size] = header
        for at, data in placed:
            out[at:at + len(data)] = data
        return bytes(out)

    def write(self, path: str | PathLike) -> Path:
        """Write the file to ``path``; returns it."""
        path = Path(path)
        path.write_bytes(self.build())
        return path


def _round_up(offset: int) -> int:
    return -(-offset // BLOCK_SIZE) * BLOCK_SIZE
