"""A reader of FlexBuffers, the schema-less format of a StableHLO composite's attributes
(and of some custom ops' options): bytes in, plain Python values out.

A FlexBuffer ends with its root: the root's packed type in the byte before last and the
root's byte width in the last. A packed type is ``type << 2 | log2(bit width)``; a value
that does not fit inline (a string, vector, map) is an unsigned offset, stored at the
parent's width, counted back from where it is stored. Every offset and size is checked
against the buffer, so damaged bytes raise :class:`ModelFormatError`, never read outside.
"""
from __future__ import annotations

import struct
from typing import Any

from ..errors import ModelFormatError

_NULL, _INT, _UINT, _FLOAT, _KEY, _STRING, _INDIRECT_INT, _INDIRECT_UINT, _INDIRECT_FLOAT, _MAP, _VECTOR = range(11)
_VECTOR_INT, _VECTOR_UINT, _VECTOR_FLOAT, _VECTOR_KEY, _VECTOR_STRING = range(11, 16)
_FIXED_VECTORS = range(16, 25)        # VECTOR_INT2 ... VECTOR_FLOAT4: no size field
_BLOB, _BOOL, _VECTOR_BOOL = 25, 26, 36
_MAX_DEPTH = 64

_INTS = {1: "<b", 2: "<h", 4: "<i", 8: "<q"}
_UINTS = {1: "<B", 2: "<H", 4: "<I", 8: "<Q"}
_FLOATS = {4: "<f", 8: "<d"}


def loads(data: bytes, what: str = "flexbuffer") -> Any:
    """The value a FlexBuffer holds: dicts, lists, str, bytes, int, float, bool or None.
    ``what`` names the bytes in errors."""
    data = bytes(data)
    if len(data) < 3:
        raise ModelFormatError(f"{what}: {len(data)} bytes is too short for a flexbuffer")
    width = data[-1]
    if width not in _UINTS:
        raise ModelFormatError(f"{what}: root byte width {width} is not 1, 2, 4 or 8")
    return _Reader(data, what).value(len(data) - 2 - width, width, data[-2], 0)


class _Reader:
    def __init__(self, data: bytes, what: str) -> None:
        self.data, self.what = data, what

    def _check(self, at: int, size: int) -> None:
        if at < 0 or size < 0 or at + size > len(self.data):
            raise ModelFormatError(f"{self.what}: reads {size} bytes at {at}, outside its {len(self.data)} bytes")

    def _unpack(self, formats: dict[int, str], at: int, width: int):
        if width not in formats:
            raise ModelFormatError(f"{self.what}: a {width}-byte value of this type does not exist")
        self._check(at, width)
        return struct.unpack_from(formats[width], self.data, at)[0]

    def _target(self, at: int, width: int) -> int:
        """Where the offset stored at ``at`` (``width`` bytes) points."""
        target = at - self._unpack(_UINTS, at, width)
        self._check(target, 0)
        return target

    def _size(self, target: int, width: int) -> int:
        size = self._unpack(_UINTS, target - width, width)
        self._check(target, size * width)
        return size

    def value(self, at: int, parent_width: int, packed: int, depth: int) -> Any:
        """The value stored at ``at`` in a slot ``parent_width`` bytes wide."""
        if depth > _MAX_DEPTH:
            raise ModelFormatError(f"{self.what}: nested deeper than {_MAX_DEPTH}")
        kind, width = packed >> 2, 1 << (packed & 3)
        if kind == _NULL:
            return None
        if kind in (_INT, _UINT, _FLOAT, _BOOL):
            return self._scalar(kind, at, parent_width)
        target = self._target(at, parent_width)
        if kind in (_INDIRECT_INT, _INDIRECT_UINT, _INDIRECT_FLOAT):
            return self._scalar(kind - _INDIRECT_INT + _INT, target, width)
        if kind == _KEY:
            return self._key(target)
        if kind in (_STRING, _BLOB):
            raw = self.data[target:target + self._size(target, width)]
            return raw.decode("utf-8", "replace") if kind == _STRING else raw
        if kind == _MAP:
            keys_at = self._target(target - 3 * width, width)
            keys_width = self._unpack(_UINTS, target - 2 * width, width)
            keys = [self._key(self._target(keys_at + i * keys_width, keys_width))
                    for i in range(self._size(keys_at, keys_width))]
            return dict(zip(keys, self._vector(target, width, depth)))
        if kind == _VECTOR:
            return self._vector(target, width, depth)
        if kind in (_VECTOR_INT, _VECTOR_UINT, _VECTOR_FLOAT, _VECTOR_KEY, _VECTOR_BOOL):
            element = _BOOL if kind == _VECTOR_BOOL else _KEY if kind == _VECTOR_KEY else kind - _VECTOR_INT + _INT
            count = self._size(target, width)
            return [self._element(element, target + i * width, width) for i in range(count)]
        if kind in _FIXED_VECTORS:
            element, count = (kind - 16) % 3 + _INT, (kind - 16) // 3 + 2
            self._check(target, count * width)
            return [self._scalar(element, target + i * width, width) for i in range(count)]
        raise ModelFormatError(f"{self.what}: unknown flexbuffer type {kind}")

    def _vector(self, target: int, width: int, depth: int) -> list:
        """An untyped vector's elements: ``count`` slots, then a packed type per slot."""
        count = self._size(target, width)
        types_at = target + count * width
        self._check(types_at, count)
        return [self.value(target + i * width, width, self.data[types_at + i], depth + 1) for i in range(count)]

    def _element(self, kind: int, at: int, width: int) -> Any:
        return self._key(self._target(at, width)) if kind == _KEY else self._scalar(kind, at, width)

    def _scalar(self, kind: int, at: int, width: int) -> Any:
        if kind == _FLOAT:
            return self._unpack(_FLOATS, at, width)
        if kind == _BOOL:
            return bool(self._unpack(_UINTS, at, width))
        return self._unpack(_INTS if kind == _INT else _UINTS, at, width)

    def _key(self, target: int) -> str:
        end = self.data.find(b"\0", target)
        if end < 0:
            raise ModelFormatError(f"{self.what}: a key at {target} has no end")
        return self.data[target:end].decode("utf-8", "replace")
