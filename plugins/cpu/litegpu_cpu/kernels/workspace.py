"""Scratch memory the steps of one cpu program share.

A program's steps run one after another, so a scratch array one step fills and reads
within its run can be the same memory for every step: a decoder's attention steps (one a
layer, in each signature) each bound a copy of their packed keys and values and their
scores, ~44 MB at 100M parameters where one set of the largest does.
"""
from __future__ import annotations

import numpy as np


class Workspace:
    """Float32 scratch arrays by kind, shared by the steps of one program: each step
    :meth:`reserve` s what it needs when it is made, and binds to :meth:`array`, which is
    made (zero-filled) at the largest size reserved."""

    def __init__(self) -> None:
        self._sizes: dict[str, int] = {}
        self._arrays: dict[str, np.ndarray] = {}

    def reserve(self, kind: str, size: int) -> None:
        """Ask for ``size`` floats of ``kind``."""
        self._sizes[kind] = max(self._sizes.get(kind, 0), int(size))

    def size(self, kind: str) -> int:
        """The floats reserved of ``kind``."""
        return self._sizes.get(kind, 0)

    def array(self, kind: str, size: int | None = None) -> np.ndarray:
        """The shared array of ``kind``: ``size`` floats (default: as many as reserved)."""
        size = self.size(kind) if size is None else int(size)
        made = self._arrays.get(kind)
        if made is None or made.size < size:
            made = self._arrays[kind] = np.zeros(max(size, self.size(kind)), np.float32)
        return made[:size]
