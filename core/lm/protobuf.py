"""A minimal, bounds-checked protobuf wire-format decoder.

LiteRT-LM keeps an LLM's metadata (``litert.lm.proto.LlmMetadata``) as a serialized
protobuf inside its ``.litertlm`` bundle. Reading the handful of fields litegpu needs
does not justify a dependency on ``protobuf`` and generated code, so this module reads
the wire format itself: :meth:`Message.parse` splits one level of a message into
``{field number: [values]}`` and typed accessors read those values the way protobuf's
own parsers do:

- a singular scalar that occurs more than once takes its last value;
- a singular sub-message that occurs more than once is the merge of all occurrences
  (parsing their concatenation is exactly protobuf's merge);
- a repeated scalar accepts packed and unpacked encodings, even mixed;
- of a ``oneof``, the member seen last wins (:meth:`Message.which`);
- fields the caller never asks for are skipped, groups (the deprecated wire types 3 and
  4) included.

Every varint, length and field number is checked against the bytes that remain, and a
field read with a wire type its declaration cannot have is an error, so damaged bytes
raise one :class:`~litegpu.errors.ModelFormatError` that names the field's path
(``LlmMetadata.sampler_params.temperature``) and the byte where reading stopped.
"""
from __future__ import annotations

import struct

from ..errors import ModelFormatError

__all__ = ["VARINT", "I64", "LEN", "I32", "Message"]

# Wire types (https://protobuf.dev/programming-guides/encoding/).
VARINT, I64, LEN, SGROUP, EGROUP, I32 = 0, 1, 2, 3, 4, 5
_WIRE_NAMES = {VARINT: "varint", I64: "64-bit", LEN: "length-delimited", SGROUP: "start-group",
               EGROUP: "end-group", I32: "32-bit"}
_MAX_FIELD_NUMBER = (1 << 29) - 1
_MAX_GROUP_DEPTH = 100  # protobuf's default recursion limit


def _varint(data: memoryview, pos: int, what: str) -> tuple[int, int]:
    """The unsigned varint at ``pos`` and the position after it."""
    value = shift = 0
    end = min(pos + 10, len(data))
    start = pos
    while pos < end:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if value >> 64:
                raise ModelFormatError(f"{what}: varint at byte {start} exceeds 64 bits")
            return value, pos
        shift += 7
    if pos - start == 10:
        raise ModelFormatError(f"{what}: varint at byte {start} is longer than 10 bytes")
    raise ModelFormatError(f"{what}: varint at byte {start} is cut off by the end of the message")


def _signed(value: int, bits: int) -> int:
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


class Message:
    """One level of a protobuf message: field number -> values in the order they came.

    A value is an ``int`` for varint, 64-bit and 32-bit fields (the raw unsigned bits)
    and a ``memoryview`` for length-delimited ones; sub-messages are parsed only when
    asked for (:meth:`message`). ``path`` names the message in errors."""

    __slots__ = ("path", "_fields", "_last")

    def __init__(self, path: str) -> None:
        self.path = path
        self._fields: dict[int, list[tuple[int, int | memoryview]]] = {}
        self._last: dict[int, int] = {}   # field number -> index of its last occurrence

    @classmethod
    def parse(cls, data: bytes | bytearray | memoryview, path: str) -> "Message":
        """Split ``data`` into fields; raises :class:`ModelFormatError` on damaged bytes."""
        msg = cls(path)
        view = memoryview(data).cast("B") if not isinstance(data, memoryview) else data.cast("B")
        pos, n, index = 0, len(view), 0
        while pos < n:
            number, wire, value, pos, key_at = _field(view, pos, path)
            if wire == SGROUP:
                pos = _skip_group(view, pos, number, path)
                continue
            if wire == EGROUP:
                raise ModelFormatError(f"{path}: field {number} at byte {key_at} has an unmatched end-group")
            msg._fields.setdefault(number, []).append((wire, value))
            msg._last[number] = index
            index += 1
        return msg

    # -- presence ---------------------------------------------------------------------
    def has(self, number: int) -> bool:
        """Whether field ``number`` occurs at all."""
        return number in self._fields

    def numbers(self) -> list[int]:
        """The field numbers present, in the order of their first occurrence."""
        return list(self._fields)

    def which(self, *numbers: int) -> int | None:
        """Of the ``oneof`` members ``numbers``, the one seen last (protobuf's rule), or ``None``."""
        present = [(self._last[n], n) for n in numbers if n in self._last]
        return max(present)[1] if present else None

    # -- scalars ----------------------------------------------------------------------
    def _values(self, number: int, wires: tuple[int, ...], name: str) -> list[int | memoryview]:
        out = []
        for wire, value in self._fields.get(number, ()):
            if wire not in wires:
                expected = " or ".join(_WIRE_NAMES[w] for w in wires)
                raise ModelFormatError(f"{self.path}.{name} (field {number}): wire type {_WIRE_NAMES[wire]}, "
                                       f"expected {expected}")
            out.append(value)
        return out

    def _last_value(self, number: int, wire: int, name: str) -> int | memoryview | None:
        values = self._values(number, (wire,), name)
        return values[-1] if values else None

    def uint64(self, number: int, name: str, default: int = 0) -> int:
        """A ``uint64``/``uint32`` field (``uint32`` keeps the low 32 bits, as protobuf does)."""
        value = self._last_value(number, VARINT, name)
        return default if value is None else value

    def int32(self, number: int, name: str, default: int = 0) -> int:
        """An ``int32`` or enum field: the varint's low 32 bits, two's complement."""
        value = self._last_value(number, VARINT, name)
        return default if value is None else _signed(value, 32)

    def int64(self, number: int, name: str, default: int = 0) -> int:
        """An ``int64`` field."""
        value = self._last_value(number, VARINT, name)
        return default if value is None else _signed(value, 64)

    def boolean(self, number: int, name: str, default: bool = False) -> bool:
        """A ``bool`` field (any non-zero varint is true)."""
        value = self._last_value(number, VARINT, name)
        return default if value is None else value != 0

    def float32(self, number: int, name: str, default: float = 0.0) -> float:
        """A ``float`` field (32-bit IEEE), as a Python float holding the exact float32 value."""
        value = self._last_value(number, I32, name)
        return default if value is None else struct.unpack("<f", value.to_bytes(4, "little"))[0]

    def float64(self, number: int, name: str, default: float = 0.0) -> float:
        """A ``double`` field."""
        value = self._last_value(number, I64, name)
        return default if value is None else struct.unpack("<d", value.to_bytes(8, "little"))[0]

    def data(self, number: int, name: str, default: bytes = b"") -> bytes:
        """A ``bytes`` field."""
        value = self._last_value(number, LEN, name)
        return default if value is None else bytes(value)

    def string(self, number: int, name: str, default: str = "") -> str:
        """A ``string`` field; invalid UTF-8 is an error, as protobuf's proto3 parsers make it."""
        value = self._last_value(number, LEN, name)
        if value is None:
            return default
        try:
            return str(value, "utf-8")
        except UnicodeDecodeError as exc:
            raise ModelFormatError(f"{self.path}.{name} (field {number}): not valid UTF-8 "
                                   f"(byte {exc.start} of the string)") from None

    # -- repeated scalars -------------------------------------------------------------
    def repeated_int32(self, number: int, name: str) -> list[int]:
        """A ``repeated int32`` field, packed or not."""
        out = []
        for value in self._values(number, (VARINT, LEN), name):
            if isinstance(value, int):
                out.append(_signed(value, 32))
                continue
            pos = 0
            while pos < len(value):
                item, pos = _varint(value, pos, f"{self.path}.{name} (packed)")
                out.append(_signed(item, 32))
        return out

    def repeated_string(self, number: int, name: str) -> list[str]:
        """A ``repeated string`` field."""
        out = []
        for i, value in enumerate(self._values(number, (LEN,), name)):
            try:
                out.append(str(value, "utf-8"))
            except UnicodeDecodeError:
                raise ModelFormatError(f"{self.path}.{name}[{i}] (field {number}): not valid UTF-8") from None
        return out

    # -- sub-messages -----------------------------------------------------------------
    def message(self, number: int, name: str) -> "Message | None":
        """A singular sub-message (every occurrence merged), or ``None`` when absent."""
        values = self._values(number, (LEN,), name)
        if not values:
            return None
        data = values[0] if len(values) == 1 else b"".join(bytes(v) for v in values)
        return Message.parse(data, f"{self.path}.{name}")

    def messages(self, number: int, name: str) -> list["Message"]:
        """A ``repeated`` sub-message field, one :class:`Message` per occurrence."""
        return [Message.parse(v, f"{self.path}.{name}[{i}]")
                for i, v in enumerate(self._values(number, (LEN,), name))]

    def raw(self, number: int, name: str) -> bytes:
        """The bytes of a length-delimited field, every occurrence concatenated (what a
        singular sub-message merges), or ``b""`` when absent."""
        return b"".join(bytes(v) for v in self._values(number, (LEN,), name))

    def __repr__(self) -> str:
        return f"Message({self.path!r}, fields={sorted(self._fields)})"


def _field(view: memoryview, pos: int, path: str, where: str = "") -> tuple[int, int, object, int, int]:
    """The field whose key is at ``pos``: ``(number, wire type, value, position after it,
    position of its key)``; the value is an int (varint, 64- and 32-bit), a memoryview
    (length-delimited) or None (a group's start or end, which the caller follows).
    ``where`` says where in the message the key lies, for errors."""
    n, key_at = len(view), pos
    key, pos = _varint(view, pos, f"{path}: field key{where}")
    number, wire = key >> 3, key & 7
    if not 1 <= number <= _MAX_FIELD_NUMBER:
        raise ModelFormatError(f"{path}: field number {number} at byte {key_at} is invalid")
    value = None
    if wire == VARINT:
        value, pos = _varint(view, pos, f"{path}: field {number}")
    elif wire in (I64, I32):
        size = 8 if wire == I64 else 4
        if pos + size > n:
            raise ModelFormatError(f"{path}: field {number} at byte {key_at} needs {size} bytes, {n - pos} remain")
        value = int.from_bytes(view[pos:pos + size], "little")
        pos += size
    elif wire == LEN:
        size, pos = _varint(view, pos, f"{path}: field {number} length")
        if size > n - pos:
            raise ModelFormatError(f"{path}: field {number} at byte {key_at} declares {size} bytes, "
                                   f"{n - pos} remain")
        value = view[pos:pos + size]
        pos += size
    elif wire not in (SGROUP, EGROUP):
        raise ModelFormatError(f"{path}: field {number} at byte {key_at} has invalid wire type {wire}")
    return number, wire, value, pos, key_at


def _skip_group(view: memoryview, pos: int, number: int, path: str) -> int:
    """The position after the group that started just before ``pos`` (field ``number``)."""
    stack = [number]
    while stack:
        if pos >= len(view):
            raise ModelFormatError(f"{path}: group of field {stack[-1]} is not closed before the end")
        inner, wire, _, pos, key_at = _field(view, pos, path, " in a group")
        if wire == SGROUP:
            if len(stack) >= _MAX_GROUP_DEPTH:
                raise ModelFormatError(f"{path}: groups nested deeper than {_MAX_GROUP_DEPTH} at byte {key_at}")
            stack.append(inner)
        elif wire == EGROUP:
            if inner != stack[-1]:
                raise ModelFormatError(f"{path}: end-group of field {inner} at byte {key_at} closes the group "
                                       f"of field {stack[-1]}")
            stack.pop()
    return pos
