"""Read LiteRT-LM's ``.litertlm`` bundles: models, tokenizer and metadata of a decoder LLM.

The layout, as LiteRT-LM's ``schema/core`` reads it and its ``litert-lm-builder`` writes it::

    bytes  0..8    magic b"LITERTLM"
    bytes  8..20   major, minor, patch version: three little-endian uint32
    bytes 20..24   zero padding
    bytes 24..32   header_end_offset: little-endian uint64
    bytes 32..header_end_offset
                   the header, a flatbuffer (root ``LiteRTLMMetaData``, no file identifier):
                   system_metadata (key/value pairs) and section_metadata (one
                   ``SectionObject`` per section: items, begin_offset, end_offset, data_type)
    then           the sections: byte ranges [begin_offset, end_offset) of the file, each
                   starting on a 16 KiB boundary (:data:`BLOCK_SIZE`) after the previous one

A reader refuses another major version (minor versions only add section types, so an
unknown ``data_type`` is kept as a number). ``TFLiteModel`` and ``TFLiteWeights`` sections
name the model they are in an item ``model_type`` (``"tf_lite_prefill_decode"``,
``"tf_lite_embedder"``...; the key matched case-insensitively, a section without one is the
prefill/decode model, as LiteRT-LM's loader has it); where several sections answer the same
question the last one wins, as in LiteRT-LM's loader.

:class:`Bundle` memory-maps the file; every offset is checked against the file before use,
and section data are zero-copy ``memoryview`` slices of the mapping. A damaged file raises
one :class:`~litegpu.errors.ModelFormatError` naming what is wrong.
"""
from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from ..errors import InvalidArgumentError, ModelFormatError
from ..graph import Model
from ..model import load_model
from ..model.flatbuf import Buffer, Table
from .protobuf import Message
from .tokenizer import TOKENIZER_KINDS, Tokenizer, load_tokenizer

__all__ = ["Bundle", "Section", "LlmMetadata", "TokenUnion", "PromptAffixes", "PromptTemplates",
           "SamplerParams", "LlmModelType", "MAGIC", "MAJOR_VERSION", "HEADER_BEGIN", "BLOCK_SIZE",
           "SECTION_TYPES", "VDATA_TYPES", "LLM_MODEL_TYPES", "SAMPLER_TYPES", "DEFAULT_MODEL_TYPE",
           "normalize_model_type"]

MAGIC = b"LITERTLM"
MAJOR_VERSION = 1                 # LiteRT-LM's LITERTLM_MAJOR_VERSION
HEADER_END_FIELD = 24             # where the uint64 header_end_offset lies
HEADER_BEGIN = 32                 # where the header flatbuffer begins
BLOCK_SIZE = 16 * 1024            # sections start on multiples of this
# AnySectionDataType, in schema order (litert-lm-builder 0.18.1's generated schema).
SECTION_TYPES = ("NONE", "GenericBinaryData", "Deprecated", "TFLiteModel", "SP_Tokenizer", "LlmMetadataProto",
                 "HF_Tokenizer_Zlib", "TFLiteWeights", "EmbeddingMetadataProto", "ExecutorMetadataProto",
                 "TtsMetadataProto", "AsrMetadataProto")
# The VData union: type index -> (table name, flatbuffer scalar kind of its one field `value`).
VDATA_TYPES = {1: ("UInt8", "ubyte"), 2: ("Int8", "byte"), 3: ("UInt16", "ushort"), 4: ("Int16", "short"),
               5: ("UInt32", "uint"), 6: ("Int32", "int"), 7: ("Float32", "float"), 8: ("Bool", "bool"),
               9: ("StringValue", "string"), 10: ("UInt64", "ulong"), 11: ("Int64", "long"), 12: ("Double", "double")}
DEFAULT_MODEL_TYPE = "prefill_decode"
# LlmModelType's oneof members: field number -> name (runtime/proto/llm_model_type.proto). Field 13
# is `minicpmv4` in litert-lm-builder 0.18.1; one earlier revision of the .proto named it `gemma3270m`.
LLM_MODEL_TYPES = {1: "generic_model", 2: "gemma3n", 3: "function_gemma", 4: "gemma3", 5: "qwen3", 7: "qwen2p5",
                   8: "gemma4", 9: "fast_vlm", 11: "lfm2", 12: "minicpm5", 13: "minicpmv4"}
SAMPLER_TYPES = {0: "TYPE_UNSPECIFIED", 1: "TOP_K", 2: "TOP_P", 3: "GREEDY"}
SAMPLER_BACKENDS = {0: "UNSPECIFIED", 1: "CPU", 2: "GPU"}


def normalize_model_type(model_type: str) -> str:
    """``"TF_LITE_PREFILL_DECODE"`` / ``"tf_lite_prefill_decode"`` / ``"prefill_decode"`` ->
    ``"prefill_decode"``: lower case, without the ``tf_lite_`` prefix the files carry."""
    if not isinstance(model_type, str) or not model_type.strip():
        raise InvalidArgumentError(f"model_type must be a non-empty string, got {model_type!r}")
    name = model_type.strip().lower()
    return name[len("tf_lite_"):] if name.startswith("tf_lite_") else name


# ------------------------------------------------------------------------------------------
# Sections
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Section:
    """One section: the byte range ``[begin, end)`` of the file, its ``data_type`` (an
    ``AnySectionDataType`` code) and its ``items`` (key -> int, float, bool or str)."""

    index: int
    data_type: int
    begin: int
    end: int
    items: dict[str, Any] = field(default_factory=dict)

    @property
    def type_name(self) -> str:
        """The data type's schema name (``"TFLiteModel"``), or ``"AnySectionDataType(N)"``
        for a type newer than litegpu."""
        if 0 <= self.data_type < len(SECTION_TYPES):
            return SECTION_TYPES[self.data_type]
        return f"AnySectionDataType({self.data_type})"

    @property
    def size(self) -> int:
        """Length in bytes."""
        return self.end - self.begin

    @property
    def model_type(self) -> str | None:
        """The item ``model_type`` (key in any case), normalized (:func:`normalize_model_type`),
        or ``None`` when the section has none."""
        value = None
        for key, item in self.items.items():
            if key.lower() == "model_type" and isinstance(item, str):
                value = item
        return normalize_model_type(value) if value and value.strip() else None

    def describe(self) -> str:
        """One line: index, type, model type, byte range."""
        kind = f" {self.model_type}" if self.model_type else ""
        return f"section {self.index}: {self.type_name}{kind} [{self.begin}, {self.end}) {self.size} bytes"


# ------------------------------------------------------------------------------------------
# LlmMetadata (runtime/proto/llm_metadata.proto and the messages it uses)
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TokenUnion:
    """``litert.lm.proto.TokenUnion``: token ids, or a string (``"<end_of_turn>"``) to be
    looked up in the tokenizer. At most one of ``ids`` and ``text`` is set."""

    ids: tuple[int, ...] | None = None
    text: str | None = None

    def resolve(self, tokenizer: Tokenizer) -> tuple[int, ...]:
        """The ids: ``ids`` as they are; ``text`` as one vocabulary entry when it is one, else
        its encoding (how LiteRT-LM turns a ``token_str`` into ids)."""
        if self.ids is not None:
            return self.ids
        if self.text is None:
            raise ModelFormatError("LlmMetadata: a TokenUnion sets neither token_ids nor token_str")
        token = tokenizer.piece_to_id(self.text)
        return (token,) if token is not None else tuple(tokenizer.encode(self.text))


@dataclass(frozen=True)
class PromptAffixes:
    """Text around one role's turn: ``prefix`` before it, ``suffix`` after it."""

    prefix: str = ""
    suffix: str = ""


@dataclass(frozen=True)
class PromptTemplates:
    """The affixes per role; ``None`` where the metadata sets none."""

    user: PromptAffixes | None = None
    model: PromptAffixes | None = None
    system: PromptAffixes | None = None


@dataclass(frozen=True)
class SamplerParams:
    """``litert.lm.proto.SamplerParameters``: the bundle's default sampling.

    ``type`` is ``"TOP_K"``, ``"TOP_P"``, ``"GREEDY"`` or ``"TYPE_UNSPECIFIED"`` (a code
    litegpu does not know is kept as its digits); ``seed`` is ``None`` when unset."""

    type: str = "TYPE_UNSPECIFIED"
    k: int = 0
    p: float = 0.0
    temperature: float = 0.0
    seed: int | None = None
    backend: str = "UNSPECIFIED"
    compute_exact_log_probs: bool = False


@dataclass(frozen=True)
class LlmModelType:
    """Which member of ``LlmModelType``'s oneof is set: its ``field`` number, its ``name``
    (``"gemma3"``; ``"field_N"`` for one litegpu does not know) and its ``raw`` message
    bytes, for the family-specific options (image tokens, tool-call fences...)."""

    field: int | None = None
    name: str = ""
    raw: bytes = b""


@dataclass(frozen=True)
class LlmMetadata:
    """What a bundle's ``LlmMetadataProto`` section says (``litert.lm.proto.LlmMetadata``).

    Fields the proto marks optional are ``None`` when unset; ``max_num_tokens`` is 0 when
    unset (proto3's default)."""

    start_token: TokenUnion | None = None
    stop_tokens: tuple[TokenUnion, ...] = ()
    prompt_templates: PromptTemplates | None = None
    sampler_params: SamplerParams | None = None
    max_num_tokens: int = 0
    model_type: LlmModelType | None = None
    jinja_prompt_template: str | None = None
    suppress_tokens: tuple[int, ...] = ()
    supports_thinking: bool | None = None
    supports_function_calling: bool | None = None
    pad_token: TokenUnion | None = None
    min_runtime_version: str | None = None

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview, what: str = "LlmMetadata") -> "LlmMetadata":
        """Decode a serialized ``LlmMetadata``; damaged bytes raise :class:`ModelFormatError`
        naming the field (``what`` prefixes the path)."""
        msg = Message.parse(data, what)
        stop = tuple(_token_union(m) for m in msg.messages(2, "stop_tokens"))
        suppress = msg.message(9, "suppress_tokens")
        return cls(
            start_token=_token_union(msg.message(1, "start_token")),
            stop_tokens=stop,
            prompt_templates=_prompt_templates(msg.message(3, "prompt_templates")),
            sampler_params=_sampler_params(msg.message(4, "sampler_params")),
            max_num_tokens=msg.int32(5, "max_num_tokens"),
            model_type=_model_type(msg.message(6, "llm_model_type")),
            jinja_prompt_template=msg.string(7, "jinja_prompt_template") if msg.has(7) else None,
            suppress_tokens=() if suppress is None else tuple(suppress.repeated_int32(1, "ids")),
            supports_thinking=msg.boolean(11, "supports_thinking") if msg.has(11) else None,
            supports_function_calling=msg.boolean(12, "supports_function_calling") if msg.has(12) else None,
            pad_token=_token_union(msg.message(13, "pad_token")),
            min_runtime_version=msg.string(14, "min_runtime_version") if msg.has(14) else None,
        )


def _token_union(msg: Message | None) -> TokenUnion | None:
    if msg is None:
        return None
    member = msg.which(1, 2)
    if member == 1:
        ids = msg.message(1, "token_ids")
        return TokenUnion(ids=tuple(ids.repeated_int32(1, "ids")))
    if member == 2:
        return TokenUnion(text=msg.string(2, "token_str"))
    return TokenUnion()


def _affixes(msg: Message | None) -> PromptAffixes | None:
    if msg is None:
        return None
    return PromptAffixes(prefix=msg.string(1, "prefix"), suffix=msg.string(2, "suffix"))


def _prompt_templates(msg: Message | None) -> PromptTemplates | None:
    if msg is None:
        return None
    return PromptTemplates(user=_affixes(msg.message(1, "user")), model=_affixes(msg.message(2, "model")),
                           system=_affixes(msg.message(3, "system")))


def _sampler_params(msg: Message | None) -> SamplerParams | None:
    if msg is None:
        return None
    kind = msg.int32(1, "type")
    backend = msg.int32(6, "backend")
    return SamplerParams(type=SAMPLER_TYPES.get(kind, str(kind)), k=msg.int32(2, "k"), p=msg.float32(3, "p"),
                         temperature=msg.float32(4, "temperature"),
                         seed=msg.int32(5, "seed") if msg.has(5) else None,
                         backend=SAMPLER_BACKENDS.get(backend, str(backend)),
                         compute_exact_log_probs=msg.boolean(7, "compute_exact_log_probs"))


def _model_type(msg: Message | None) -> LlmModelType | None:
    if msg is None:
        return None
    numbers = msg.numbers()
    member = msg.which(*numbers) if numbers else None
    if member is None:
        return LlmModelType()
    name = LLM_MODEL_TYPES.get(member, f"field_{member}")
    return LlmModelType(field=member, name=name, raw=msg.raw(member, name))


# ------------------------------------------------------------------------------------------
# The bundle
# ------------------------------------------------------------------------------------------
class Bundle:
    """A ``.litertlm`` file: its version, system metadata and sections, with the models,
    metadata and tokenizer they hold.

    ``Bundle.open(path)`` memory-maps the file (the mapping lives as long as the bundle or
    any view of it); ``Bundle.from_bytes(data)`` reads bytes already in memory. Both check
    the whole header and every section's range before returning."""

    def __init__(self, data: bytes | bytearray | memoryview | mmap.mmap, name: str = "<bytes>") -> None:
        self.name = name
        self._data = data
        self._view = memoryview(data).cast("B") if not isinstance(data, memoryview) else data.cast("B")
        self.nbytes = len(self._view)
        self.version, self.header_end = self._read_prefix()
        try:
            self.system_metadata, self.sections = self._read_header()
        except ModelFormatError as exc:
            raise ModelFormatError(f"{self.name}: header (bytes {HEADER_BEGIN}..{self.header_end}): {exc}") from None
        for section in self.sections:
            self._check_range(section)
        self._tokenizers: dict[str, Tokenizer] = {}

    @classmethod
    def open(cls, path: str | os.PathLike) -> "Bundle":
        """Memory-map and read the bundle at ``path``."""
        path = Path(path)
        try:
            with open(path, "rb") as f:
                if os.fstat(f.fileno()).st_size == 0:
                    raise ModelFormatError(f"{path}: file is empty")
                data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as exc:
            raise ModelFormatError(f"cannot read .litertlm file {path}: {exc.strerror or exc}") from exc
        return cls(data, str(path))

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview, name: str = "<bytes>") -> "Bundle":
        """Read a bundle held in memory (a ``bytearray`` is copied, so later edits cannot
        change what was checked)."""
        return cls(bytes(data) if isinstance(data, bytearray) else data, name)

    # -- reading the header ---------------------------------------------------------------
    def _read_prefix(self) -> tuple[tuple[int, int, int], int]:
        view, size = self._view, self.nbytes
        head = bytes(view[:8])
        if head != MAGIC[:len(head)]:
            raise ModelFormatError(f"{self.name}: not a .litertlm bundle: starts with {head!r}, expected {MAGIC!r}"
                                   f"{_what_it_is(bytes(view[:8]))}")
        if size < HEADER_BEGIN:
            raise ModelFormatError(f"{self.name}: truncated: {size} bytes, the fixed header alone takes "
                                   f"{HEADER_BEGIN}")
        major, minor, patch = struct.unpack_from("<III", view, 8)
        if major != MAJOR_VERSION:
            raise ModelFormatError(f"{self.name}: format version {major}.{minor}.{patch}; litegpu reads major "
                                   f"version {MAJOR_VERSION} (a new major version changes the layout)")
        (header_end,) = struct.unpack_from("<Q", view, HEADER_END_FIELD)
        if not HEADER_BEGIN < header_end <= size:
            raise ModelFormatError(f"{self.name}: header_end_offset is {header_end}; it must lie after byte "
                                   f"{HEADER_BEGIN} and within the {size}-byte file"
                                   f"{' (truncated?)' if header_end > size else ''}")
        return (major, minor, patch), header_end

    def _read_header(self) -> tuple[dict[str, Any], tuple[Section, ...]]:
        buf = Buffer(self._view[HEADER_BEGIN:self.header_end])
        root = Table(buf, buf.uoffset(0, "LiteRTLMMetaData root offset"), "LiteRTLMMetaData")
        system = root.table(0, "system_metadata")
        system_metadata = {} if system is None else _key_values(system.tables(0, "entries"))
        section_metadata = root.table(1, "section_metadata")
        if section_metadata is None:
            raise ModelFormatError("LiteRTLMMetaData.section_metadata is missing (the schema requires it)")
        sections = []
        for i, t in enumerate(section_metadata.tables(0, "objects")):
            sections.append(Section(index=i, data_type=t.scalar(3, "ubyte", 0, "data_type"),
                                    begin=t.scalar(1, "ulong", 0, "begin_offset"),
                                    end=t.scalar(2, "ulong", 0, "end_offset"),
                                    items=_key_values(t.tables(0, "items"))))
        return system_metadata, tuple(sections)

    def _check_range(self, s: Section) -> None:
        where = f"{self.name}: {s.type_name} section {s.index}"
        if s.begin > s.end:
            raise ModelFormatError(f"{where}: begin_offset {s.begin} is after end_offset {s.end}")
        if s.end > self.nbytes:
            raise ModelFormatError(f"{where}: ends at byte {s.end}, past the end of the {self.nbytes}-byte file "
                                   "(truncated?)")
        if s.begin < self.header_end:
            raise ModelFormatError(f"{where}: begins at byte {s.begin}, inside the header "
                                   f"(which ends at byte {self.header_end})")

    # -- sections ----------------------------------------------------------------------
    def data(self, section: Section) -> memoryview:
        """The bytes of ``section``: a zero-copy, read-only view of the file."""
        return self._view[section.begin:section.end].toreadonly()

    def find(self, type_name: str, model_type: str | None = None) -> list[Section]:
        """The sections of data type ``type_name`` (``"TFLiteModel"``), in file order; with
        ``model_type``, only those of that model type (a ``TFLiteModel``, ``TFLiteWeights``
        or tokenizer section without one counts as ``prefill_decode``)."""
        found = [s for s in self.sections if s.type_name == type_name]
        if model_type is None:
            return found
        wanted = normalize_model_type(model_type)
        return [s for s in found if (s.model_type or DEFAULT_MODEL_TYPE) == wanted]

    def model_types(self) -> list[str]:
        """The model types of the ``TFLiteModel`` sections, in file order (``["embedder", "prefill_decode"]``)."""
        return [s.model_type or DEFAULT_MODEL_TYPE for s in self.find("TFLiteModel")]

    def _one(self, type_name: str, model_type: str | None, required: str) -> Section | None:
        found = self.find(type_name, model_type)
        if found:
            return found[-1]          # LiteRT-LM's loader keeps the last section of a kind
        if required:
            raise ModelFormatError(f"{self.name}: {required}; its sections: {self._contents()}")
        return None

    def _contents(self, limit: int = 20) -> str:
        names = [f"{s.index}: {s.type_name}" + (f" ({s.model_type})" if s.model_type else "")
                 for s in self.sections[:limit]]
        more = f" and {len(self.sections) - limit} more" if len(self.sections) > limit else ""
        return (", ".join(names) or "none") + more

    def model_section(self, model_type: str = DEFAULT_MODEL_TYPE) -> Section:
        """The ``TFLiteModel`` section of ``model_type``; raises when the bundle has none."""
        kind = normalize_model_type(model_type)
        section = self._one("TFLiteModel", kind, f"no TFLiteModel section of model_type {kind!r}")
        if section.size == 0:
            raise ModelFormatError(f"{self.name}: TFLiteModel section {section.index} ({kind}) is empty")
        return section

    def model_bytes(self, model_type: str = DEFAULT_MODEL_TYPE) -> memoryview:
        """The ``.tflite`` model of ``model_type`` (``"prefill_decode"``, ``"embedder"``...): a
        zero-copy view that :func:`litegpu.load_model` reads as it is."""
        return self.data(self.model_section(model_type))

    def weights_bytes(self, model_type: str = DEFAULT_MODEL_TYPE) -> memoryview | None:
        """The external weights (``TFLiteWeights``) of the model of ``model_type``, or ``None``."""
        section = self._one("TFLiteWeights", model_type, "")
        return None if section is None else self.data(section)

    def load_model(self, model_type: str = DEFAULT_MODEL_TYPE, **kwargs: Any) -> Model:
        """The model of ``model_type`` read by :func:`litegpu.load_model` (``kwargs`` go to
        it), its constants zero-copy views of this bundle."""
        section = self.model_section(model_type)
        try:
            return load_model(self.data(section), **kwargs)
        except ModelFormatError as exc:
            raise ModelFormatError(f"{self.name}: TFLiteModel section {section.index}: {exc}") from None

    # -- metadata and tokenizer -------------------------------------------------------------
    @cached_property
    def metadata(self) -> LlmMetadata | None:
        """The ``LlmMetadataProto`` section decoded, or ``None`` when the bundle has none."""
        section = self._one("LlmMetadataProto", None, "")
        if section is None:
            return None
        return LlmMetadata.from_bytes(bytes(self.data(section)),
                                      f"{self.name}: LlmMetadataProto section {section.index}: LlmMetadata")

    def tokenizer(self, model_type: str = DEFAULT_MODEL_TYPE) -> Tokenizer:
        """The tokenizer of the model of ``model_type``: the ``SP_Tokenizer`` section if there
        is one, else the ``HF_Tokenizer_Zlib`` one (LiteRT-LM's order). Made once per bundle.

        :raises ModelFormatError: the bundle has no tokenizer, or a damaged one.
        :raises TokenizerUnavailableError: its package is not installed (``litegpu[lm]``)."""
        kind = normalize_model_type(model_type)
        if kind not in self._tokenizers:
            section = None
            for type_name in TOKENIZER_KINDS:
                section = section or self._one(type_name, kind, "")
            if section is None:
                raise ModelFormatError(f"{self.name}: no tokenizer section ({' or '.join(TOKENIZER_KINDS)}) for "
                                       f"model_type {kind!r}; its sections: {self._contents()}")
            self._tokenizers[kind] = load_tokenizer(section.type_name, self.data(section),
                                                    f"{self.name}: {section.type_name} section {section.index}")
        return self._tokenizers[kind]

    def describe(self) -> str:
        """A few lines: version, system metadata, one line per section."""
        lines = [f"{self.name}: LiteRT-LM bundle {'.'.join(map(str, self.version))}, {self.nbytes} bytes"]
        lines += [f"  {key} = {value!r}" for key, value in self.system_metadata.items()]
        lines += [f"  {s.describe()}" for s in self.sections]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"Bundle({self.name!r}, version={self.version}, sections={len(self.sections)})"


def _key_values(tables: list[Table]) -> dict[str, Any]:
    """``KeyValuePair`` tables as a dict (a repeated key keeps its last value)."""
    out: dict[str, Any] = {}
    for t in tables:
        if not t.has(0):
            raise ModelFormatError(f"{t.path}.key is missing (the schema requires it)")
        key = t.string(0, "key")
        value_type = t.scalar(1, "ubyte", 0, "value_type")
        value = t.table(2, "value")
        if value_type == 0 or value is None:
            raise ModelFormatError(f"{t.path} ({key!r}): the value is missing (the schema requires it)")
        if value_type not in VDATA_TYPES:
            raise ModelFormatError(f"{t.path} ({key!r}): value type {value_type} is not a VData member "
                                   f"(1..{max(VDATA_TYPES)})")
        name, kind = VDATA_TYPES[value_type]
        value.path = f"{t.path}.value<{name}>"
        out[key] = value.string(0, "value") if kind == "string" else value.scalar(0, kind, 0, "value")
    return out


def _what_it_is(head: bytes) -> str:
    if head[4:8] == b"TFL3":
        return " (this is a .tflite model: read it with litegpu.load_model)"
    if head[:2] == b"PK":
        return " (this is a zip archive, perhaps a MediaPipe .task bundle, which litegpu does not read)"
    return ""
