"""Tokenizers of LiteRT-LM bundles: SentencePiece and HuggingFace ``tokenizers``.

A ``.litertlm`` bundle carries its tokenizer as a section: ``SP_Tokenizer`` (a serialized
SentencePiece ``ModelProto``) or ``HF_Tokenizer_Zlib`` (a HuggingFace ``tokenizer.json``,
zlib-compressed behind its uncompressed size as a little-endian uint64). Both are read
from memory, never from a temporary file, by the packages that define them
(``sentencepiece``, ``tokenizers``: litegpu's ``[lm]`` extra), imported only when a
tokenizer is made, so ``import litegpu.lm`` needs neither.

Both follow LiteRT-LM's use of them: ``encode`` adds no special tokens (the engine
prepends the bundle's start token itself), ``decode`` keeps the text of every token
(SentencePiece's control tokens have none).
"""
from __future__ import annotations

import struct
import zlib
from typing import Protocol, Sequence, runtime_checkable

from ..env import install_hint
from ..errors import InvalidArgumentError, ModelFormatError, UnsupportedError

__all__ = ["Tokenizer", "SentencePieceTokenizer", "HuggingFaceTokenizer", "TokenizerUnavailableError",
           "load_tokenizer", "decompress_hf_tokenizer", "compress_hf_tokenizer", "TOKENIZER_KINDS",
           "MAX_TOKENIZER_JSON_BYTES"]

# Section data type -> tokenizer kind. The kinds are also accepted by load_tokenizer.
TOKENIZER_KINDS = {"SP_Tokenizer": "sentencepiece", "HF_Tokenizer_Zlib": "huggingface"}
# A tokenizer.json larger than this is refused before it is inflated (real ones: Gemma 3's
# is ~33 MB); a hostile size field must not decide how much memory is taken.
MAX_TOKENIZER_JSON_BYTES = 1 << 30
# zlib's deflate cannot compress better than about 1032:1.
_ZLIB_MAX_RATIO = 1032


class TokenizerUnavailableError(UnsupportedError):
    """A tokenizer cannot be made here: an unknown kind, or its package is not installed.
    The message says what litegpu reads, or what to install."""


@runtime_checkable
class Tokenizer(Protocol):
    """What the generation loop needs of a tokenizer.

    ``bos_id``/``eos_id`` are the tokenizer's own begin/end-of-sequence ids where it
    defines them, else ``None``; a bundle's ``LlmMetadata`` start and stop tokens are the
    authority for generation (:meth:`litegpu.lm.TokenUnion.resolve`)."""

    kind: str

    @property
    def vocab_size(self) -> int:
        """Number of token ids; valid ids are ``0 .. vocab_size - 1``."""

    @property
    def bos_id(self) -> int | None:
        """The begin-of-sequence id, or ``None`` when the tokenizer defines none."""

    @property
    def eos_id(self) -> int | None:
        """The end-of-sequence id, or ``None`` when the tokenizer defines none."""

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, with no special tokens added."""

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``; an id outside the vocabulary is an :class:`InvalidArgumentError`."""

    def id_to_piece(self, token_id: int) -> str:
        """The vocabulary entry of ``token_id`` (``"▁the"``, ``"<eos>"``)."""

    def piece_to_id(self, piece: str) -> int | None:
        """The id of vocabulary entry ``piece``, or ``None`` when it is not one."""


def _missing_package(package: str, what: str) -> TokenizerUnavailableError:
    return TokenizerUnavailableError(f"{what} needs the {package!r} package, which is not installed: "
                                     f"{install_hint('lm')}")


def _check_ids(ids: Sequence[int], vocab_size: int, what: str) -> list[int]:
    out = []
    for i, token in enumerate(ids):
        try:
            value = int(token)
        except (TypeError, ValueError):
            raise InvalidArgumentError(f"{what}: token {i} is {token!r}, not an integer id") from None
        if not 0 <= value < vocab_size:
            raise InvalidArgumentError(f"{what}: token {i} is id {value}, outside the vocabulary "
                                       f"(0 .. {vocab_size - 1})")
        out.append(value)
    return out


class SentencePieceTokenizer:
    """A SentencePiece model read from its serialized ``ModelProto`` bytes.

    :param model_proto: the bytes of a ``.model`` file (a bundle's ``SP_Tokenizer`` section).
    :param what: names the source in errors (``"section 3 (SP_Tokenizer)"``).
    :raises TokenizerUnavailableError: ``sentencepiece`` is not installed.
    :raises ModelFormatError: SentencePiece cannot load the bytes."""

    kind = "sentencepiece"

    def __init__(self, model_proto: bytes | bytearray | memoryview, what: str = "SentencePiece model") -> None:
        try:
            import sentencepiece
        except ImportError:
            raise _missing_package("sentencepiece", f"{what}: the SentencePiece tokenizer") from None
        self.what = what
        try:
            self._sp = sentencepiece.SentencePieceProcessor(model_proto=bytes(model_proto))
        except Exception as exc:  # sentencepiece raises RuntimeError/OSError with its status text
            raise ModelFormatError(f"{what}: SentencePiece cannot load it: {str(exc).strip() or type(exc).__name__}") \
                from exc
        self._size = self._sp.get_piece_size()

    @property
    def vocab_size(self) -> int:
        """Number of pieces."""
        return self._size

    @property
    def bos_id(self) -> int | None:
        """SentencePiece's ``bos_id`` (``None`` where the model has none)."""
        return self._sp.bos_id() if self._sp.bos_id() >= 0 else None

    @property
    def eos_id(self) -> int | None:
        """SentencePiece's ``eos_id`` (``None`` where the model has none)."""
        return self._sp.eos_id() if self._sp.eos_id() >= 0 else None

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no BOS/EOS added)."""
        return list(self._sp.encode(text))

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids`` (control tokens such as BOS/EOS have none)."""
        return self._sp.decode(_check_ids(ids, self._size, f"{self.what}: decode"))

    def id_to_piece(self, token_id: int) -> str:
        """The piece of ``token_id``."""
        (value,) = _check_ids([token_id], self._size, f"{self.what}: id_to_piece")
        return self._sp.id_to_piece(value)

    def piece_to_id(self, piece: str) -> int | None:
        """The id of ``piece``, or ``None`` (SentencePiece itself answers the unknown id)."""
        token = self._sp.piece_to_id(piece)
        return token if 0 <= token < self._size and self._sp.id_to_piece(token) == piece else None

    def __repr__(self) -> str:
        return f"SentencePieceTokenizer({self.what!r}, vocab_size={self._size})"


class HuggingFaceTokenizer:
    """A HuggingFace ``tokenizers`` tokenizer read from the text of its ``tokenizer.json``.

    ``bos_id``/``eos_id`` are ``None``: a ``tokenizer.json`` does not say which of its
    special tokens play those roles (``tokenizer_config.json`` does, and bundles do not
    carry it); the bundle's metadata does.

    :param tokenizer_json: the JSON text (``str`` or UTF-8 bytes).
    :param what: names the source in errors.
    :raises TokenizerUnavailableError: ``tokenizers`` is not installed.
    :raises ModelFormatError: the JSON is not a tokenizer ``tokenizers`` can load."""

    kind = "huggingface"

    def __init__(self, tokenizer_json: str | bytes | bytearray | memoryview,
                 what: str = "HuggingFace tokenizer") -> None:
        try:
            import tokenizers
        except ImportError:
            raise _missing_package("tokenizers", f"{what}: the HuggingFace tokenizer") from None
        self.what = what
        if not isinstance(tokenizer_json, str):
            try:
                tokenizer_json = str(tokenizer_json, "utf-8")
            except UnicodeDecodeError as exc:
                raise ModelFormatError(f"{what}: tokenizer.json is not UTF-8 (byte {exc.start})") from None
        try:
            self._tok = tokenizers.Tokenizer.from_str(tokenizer_json)
        except Exception as exc:  # tokenizers raises a bare Exception with serde's message
            raise ModelFormatError(f"{what}: tokenizers cannot load tokenizer.json: {exc}") from exc
        self._size = self._tok.get_vocab_size(with_added_tokens=True)

    @classmethod
    def from_zlib(cls, data: bytes | bytearray | memoryview, what: str = "HF_Tokenizer_Zlib section") \
            -> "HuggingFaceTokenizer":
        """From a bundle's ``HF_Tokenizer_Zlib`` section (see :func:`decompress_hf_tokenizer`)."""
        return cls(decompress_hf_tokenizer(data, what), what)

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return self._size

    @property
    def bos_id(self) -> int | None:
        """Always ``None`` (see the class)."""
        return None

    @property
    def eos_id(self) -> int | None:
        """Always ``None`` (see the class)."""
        return None

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, without the post-processor's special tokens (as LiteRT-LM encodes)."""
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """The text of ``ids``; special tokens keep their text unless ``skip_special_tokens``."""
        checked = _check_ids(ids, self._size, f"{self.what}: decode")
        return self._tok.decode(checked, skip_special_tokens=skip_special_tokens)

    def id_to_piece(self, token_id: int) -> str:
        """The vocabulary entry of ``token_id``."""
        (value,) = _check_ids([token_id], self._size, f"{self.what}: id_to_piece")
        piece = self._tok.id_to_token(value)
        if piece is None:   # ids of a tokenizer.json need not be contiguous
            raise InvalidArgumentError(f"{self.what}: id_to_piece: id {value} has no vocabulary entry")
        return piece

    def piece_to_id(self, piece: str) -> int | None:
        """The id of ``piece``, or ``None``."""
        return self._tok.token_to_id(piece)

    def __repr__(self) -> str:
        return f"HuggingFaceTokenizer({self.what!r}, vocab_size={self._size})"


def decompress_hf_tokenizer(data: bytes | bytearray | memoryview, what: str = "HF_Tokenizer_Zlib section") -> bytes:
    """The ``tokenizer.json`` bytes of an ``HF_Tokenizer_Zlib`` section: a little-endian
    uint64 uncompressed size, then a zlib stream of exactly that many bytes (the layout
    LiteRT-LM's ``DecompressData`` reads and its builder writes).

    :raises ModelFormatError: too short, a size over :data:`MAX_TOKENIZER_JSON_BYTES` or
        impossible for the compressed length, a damaged stream, or a length mismatch."""
    view = memoryview(data).cast("B") if not isinstance(data, memoryview) else data.cast("B")
    if len(view) < 8:
        raise ModelFormatError(f"{what}: {len(view)} bytes, too short for the 8-byte uncompressed size")
    (size,) = struct.unpack_from("<Q", view, 0)
    packed = view[8:]
    if size > MAX_TOKENIZER_JSON_BYTES:
        raise ModelFormatError(f"{what}: declares a {size}-byte tokenizer.json, over the limit of "
                               f"{MAX_TOKENIZER_JSON_BYTES} (litegpu.lm.tokenizer.MAX_TOKENIZER_JSON_BYTES)")
    if size > _ZLIB_MAX_RATIO * len(packed) + 64:
        raise ModelFormatError(f"{what}: declares a {size}-byte tokenizer.json, more than "
                               f"{len(packed)} compressed bytes can hold")
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(packed, size + 1)
    except zlib.error as exc:
        raise ModelFormatError(f"{what}: the zlib stream is damaged: {exc}") from None
    if len(out) > size:
        raise ModelFormatError(f"{what}: the zlib stream holds more than the {size} bytes its header says")
    if not inflater.eof:
        raise ModelFormatError(f"{what}: the zlib stream ends early, after {len(out)} of {size} bytes")
    if len(out) < size:
        raise ModelFormatError(f"{what}: the zlib stream holds {len(out)} bytes, its header says {size}")
    return out


def compress_hf_tokenizer(tokenizer_json: str | bytes) -> bytes:
    """An ``HF_Tokenizer_Zlib`` section's bytes for ``tokenizer_json`` (the inverse of
    :func:`decompress_hf_tokenizer`)."""
    raw = tokenizer_json.encode("utf-8") if isinstance(tokenizer_json, str) else bytes(tokenizer_json)
    return struct.pack("<Q", len(raw)) + zlib.compress(raw)


def load_tokenizer(kind: str, data: bytes | bytearray | memoryview, what: str = "") -> Tokenizer:
    """A tokenizer of ``kind`` from its bytes as a bundle stores them.

    :param kind: ``"sentencepiece"`` (or the section type ``"SP_Tokenizer"``): a serialized
        SentencePiece model; ``"huggingface"`` (or ``"HF_Tokenizer_Zlib"``): a size-prefixed,
        zlib-compressed ``tokenizer.json``.
    :raises TokenizerUnavailableError: an unknown kind, or the kind's package is missing.
    :raises ModelFormatError: the bytes are not a tokenizer of that kind."""
    name = TOKENIZER_KINDS.get(kind, kind)
    if name == "sentencepiece":
        return SentencePieceTokenizer(data, what or "SentencePiece model")
    if name == "huggingface":
        return HuggingFaceTokenizer.from_zlib(data, what or "HF_Tokenizer_Zlib data")
    known = ", ".join(f"{k!r} ({section} sections)" for section, k in TOKENIZER_KINDS.items())
    raise TokenizerUnavailableError(f"{what + ': ' if what else ''}unknown tokenizer kind {kind!r}; "
                                    f"litegpu reads {known}")
