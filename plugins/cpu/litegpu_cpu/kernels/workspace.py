"""Scratch memory the steps of one cpu program share.

A program's steps run one after another, so a scratch array one step fills and reads
within its run can be the same memory for every step: a decoder's attention steps (one a
layer, in each signature) each bound a copy of their packed keys and values and their
scores, ~44 MB at 100M parameters where one set of the largest does. A program makes its
kernels inside :func:`making`; a kernel factory takes :func:`current` (None outside one:
a kernel made on its own keeps its own scratch).
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

import numpy as np

_MAKING = threading.local()


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


@contextmanager
def making(workspace: Workspace) -> Iterator[Workspace]:
    """Kernels made in this block (on this thread) share ``workspace`` (:func:`current`)."""
    before = getattr(_MAKING, "workspace", None)
    _MAKING.workspace = workspace
    try:
        yield workspace
    finally:
        _MAKING.workspace = before


def current() -> Workspace | None:
    """The workspace of the program whose kernels are being made on this thread, if any."""
    return getattr(_MAKING, "workspace", None)
