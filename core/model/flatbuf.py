"""A bounds-checked flatbuffer reader.

Generated flatbuffer accessors trust every offset in the file. This reader checks
each offset, length and vtable entry against the buffer before it is used, and
names the schema path of the field in the error, so a hostile file gives a
:class:`ModelFormatError` and never an out-of-range read or an allocation sized
by an unchecked field.
"""
from __future__ import annotations

import struct

import numpy as np

from ..errors import ModelFormatError

_SCALARS = {
    "bool": ("<B", 1), "byte": ("<b", 1), "ubyte": ("<B", 1), "short": ("<h", 2),
    "ushort": ("<H", 2), "int": ("<i", 4), "uint": ("<I", 4), "long": ("<q", 8),
    "ulong": ("<Q", 8), "float": ("<f", 4), "double": ("<d", 8),
}
# Like the flatbuffers verifier's ``max_tables``: a vector of table offsets costs 4 bytes
# in the file but a Python object here, so a hostile file could ask for millions of them.
MAX_TABLES = 1_000_000
_VECTOR_DTYPES = {
    "[int]": np.dtype("<i4"), "[uint]": np.dtype("<u4"), "[float]": np.dtype("<f4"),
    "[long]": np.dtype("<i8"), "[ubyte]": np.dtype("u1"), "[bool]": np.dtype("u1"),
    "[ushort]": np.dtype("<u2"),
}


class Buffer:
    """A byte buffer with checked little-endian reads."""

    def __init__(self, data: bytes | memoryview | np.ndarray) -> None:
        self.view = memoryview(data).cast("B") if not isinstance(data, memoryview) else data.cast("B")
        self.size = len(self.view)
        self.tables_left = MAX_TABLES
        # Each vector element is read once in a well-formed model, so all vectors together
        # hold fewer elements than the file has bytes. Vectors shared by many tables (legal
        # in a flatbuffer, never written by converters) could otherwise multiply the work.
        self.elements_left = 2 * self.size + 4096

    def take_tables(self, n: int, what: str) -> None:
        """Count ``n`` more tables against :data:`MAX_TABLES`; raise past the limit."""
        self.tables_left -= n
        if self.tables_left < 0:
            raise ModelFormatError(f"{what}: the model has more than {MAX_TABLES} tables "
                                   "(litegpu.model.flatbuf.MAX_TABLES)")

    def check(self, pos: int, nbytes: int, what: str) -> None:
        """Raise unless ``[pos, pos + nbytes)`` lies inside the buffer."""
        if pos < 0 or nbytes < 0 or pos + nbytes > self.size:
            raise ModelFormatError(
                f"{what}: offset {pos} (+{nbytes} bytes) is outside the {self.size}-byte model")

    def scalar(self, pos: int, kind: str, what: str):
        """Read one scalar of schema type ``kind`` at ``pos``."""
        fmt, size = _SCALARS[kind]
        self.check(pos, size, what)
        value = struct.unpack_from(fmt, self.view, pos)[0]
        return bool(value) if kind == "bool" else value

    def uoffset(self, pos: int, what: str) -> int:
        """Follow a forward ``uoffset_t`` stored at ``pos``; returns the absolute target."""
        rel = self.scalar(pos, "uint", what)
        target = pos + rel
        if rel == 0 or target >= self.size:
            raise ModelFormatError(f"{what}: offset {rel} at byte {pos} points outside the model")
        return target

    def root(self, identifier: bytes | None) -> "Table":
        """The root table, after checking the file identifier."""
        if self.size < 8:
            raise ModelFormatError(f"model is {self.size} bytes, too short to be a flatbuffer")
        if identifier is not None and bytes(self.view[4:8]) != identifier:
            raise ModelFormatError(
                f"file identifier is {bytes(self.view[4:8])!r}, expected {identifier!r}: not a .tflite model")
        return Table(self, self.uoffset(0, "root table offset"), "Model")


class Table:
    """A flatbuffer table whose vtable has been checked."""

    __slots__ = ("buf", "pos", "path", "_vt", "_vtlen", "_objlen")

    def __init__(self, buf: Buffer, pos: int, path: str) -> None:
        self.buf = buf
        self.pos = pos
        self.path = path
        buf.take_tables(1, path)
        soff = buf.scalar(pos, "int", f"{path} vtable offset")
        vt = pos - soff
        buf.check(vt, 4, f"{path} vtable")
        vtlen = buf.scalar(vt, "ushort", f"{path} vtable size")
        objlen = buf.scalar(vt + 2, "ushort", f"{path} table size")
        if vtlen < 4 or vtlen % 2:
            raise ModelFormatError(f"{path}: vtable size {vtlen} is invalid")
        buf.check(vt, vtlen, f"{path} vtable")
        buf.check(pos, objlen, f"{path} table")
        self._vt, self._vtlen, self._objlen = vt, vtlen, objlen

    def _field(self, slot: int, width: int, name: str) -> int:
        """Absolute position of field ``slot``, or 0 when absent."""
        entry = 4 + 2 * slot
        if entry + 2 > self._vtlen:
            return 0
        rel = self.buf.scalar(self._vt + entry, "ushort", f"{self.path}.{name} vtable entry")
        if rel == 0:
            return 0
        if rel + width > self._objlen:
            raise ModelFormatError(f"{self.path}.{name}: field lies outside its table")
        return self.pos + rel

    def has(self, slot: int) -> bool:
        """True when field ``slot`` is present."""
        return self._field(slot, 1, f"slot{slot}") != 0

    def scalar(self, slot: int, kind: str, default, name: str):
        """A scalar field, or ``default`` when absent."""
        pos = self._field(slot, _SCALARS[kind][1], name)
        return default if pos == 0 else self.buf.scalar(pos, kind, f"{self.path}.{name}")

    def _indirect(self, slot: int, name: str) -> int:
        pos = self._field(slot, 4, name)
        return 0 if pos == 0 else self.buf.uoffset(pos, f"{self.path}.{name}")

    def table(self, slot: int, name: str) -> "Table | None":
        """A sub-table field, or ``None`` when absent."""
        pos = self._indirect(slot, name)
        return None if pos == 0 else Table(self.buf, pos, f"{self.path}.{name}")

    def _vector(self, slot: int, elem_size: int, name: str) -> tuple[int, int]:
        pos = self._indirect(slot, name)
        if pos == 0:
            return 0, 0
        n = self.buf.scalar(pos, "uint", f"{self.path}.{name} length")
        self.buf.check(pos + 4, n * elem_size, f"{self.path}.{name} ({n} elements)")
        self.buf.elements_left -= n
        if self.buf.elements_left < 0:
            raise ModelFormatError(f"{self.path}.{name}: vectors read so far hold more elements than twice "
                                   f"the {self.buf.size} model bytes (vectors shared by many tables?)")
        return pos + 4, n

    def string(self, slot: int, name: str, default: str = "") -> str:
        """A string field, decoded as UTF-8 (invalid bytes replaced)."""
        start, n = self._vector(slot, 1, name)
        if start == 0:
            return default
        return bytes(self.buf.view[start:start + n]).decode("utf-8", errors="replace")

    def array(self, slot: int, kind: str, name: str) -> np.ndarray | None:
        """A vector of scalars as a read-only numpy view, or ``None`` when absent."""
        dtype = _VECTOR_DTYPES[kind]
        start, n = self._vector(slot, dtype.itemsize, name)
        if start == 0:
            return None
        arr = np.frombuffer(self.buf.view, dtype=dtype, count=n, offset=start)
        return arr

    def tables(self, slot: int, name: str) -> list["Table"]:
        """A vector of tables (empty when absent)."""
        start, n = self._vector(slot, 4, name)
        if n > self.buf.tables_left:  # fail before building any of them
            self.buf.take_tables(n, f"{self.path}.{name} ({n} tables)")
        return [Table(self.buf, self.buf.uoffset(start + 4 * i, f"{self.path}.{name}[{i}]"),
                      f"{self.path}.{name}[{i}]") for i in range(n)]

    def read_fields(self, fields: list[tuple[str, str, object]]) -> dict:
        """Decode a whole table described as ``(name, type, default)`` per slot."""
        out = {}
        for slot, (name, kind, default) in enumerate(fields):
            if kind in _SCALARS:
                out[name] = self.scalar(slot, kind, default, name)
            elif kind == "string":
                out[name] = self.string(slot, name, default or "")
            else:
                arr = self.array(slot, kind, name)
                out[name] = None if arr is None else [x.item() for x in arr]
        return out
