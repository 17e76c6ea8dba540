"""The in-memory model: tensors, nodes, subgraphs, signatures.

Built by :mod:`litegpu.model` and not changed afterwards; planning and execution
keep their own state.
"""
from __future__ import annotations

import hashlib
import mmap

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Quantization:
    """Affine quantization: ``real = scale * (q - zero_point)``, per tensor or per channel."""

    scales: np.ndarray
    zero_points: np.ndarray
    quantized_dimension: int = 0
    # Blockwise (INT4 weights of LLMs): ``scales`` is [channels, blocks], one per block of
    # ``block_size`` consecutive values along the last axis of each channel; 0: affine.
    block_size: int = 0

    @property
    def is_set(self) -> bool:
        """True when the tensor carries at least one scale."""
        return self.scales.size > 0


class LazyConstant:
    """A constant's value made from what the model stores when first read, and kept until
    :meth:`release`: after compiling, the kernels hold their own packings, and a copy held
    beside them (INT4 values unpacked, weights dequantized for the float view) doubled or
    quadrupled a decoder's memory. A subclass says how to :meth:`make` it."""

    __slots__ = ("shape", "_values")

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape
        self._values: np.ndarray | None = None

    def make(self) -> np.ndarray:
        """The value, computed anew."""
        raise NotImplementedError

    def values(self) -> np.ndarray:
        """The read-only value, shaped ``shape``."""
        values = self._values
        if values is None:
            values = self._values = np.asarray(self.make())   # (an array, where a 0-d one gives a scalar)
            values.flags.writeable = False
        return values

    def release(self) -> None:
        """Drop the value (the next :meth:`values` makes it again)."""
        self._values = None


class Int4Constant(LazyConstant):
    """An INT4 constant as the file stores it (``packed``: two values a byte, the first in
    the low nibble); its values are int8 in [-8, 7]."""

    __slots__ = ("packed",)

    def __init__(self, packed: np.ndarray, shape: tuple[int, ...]) -> None:
        super().__init__(shape)
        self.packed = packed

    def make(self) -> np.ndarray:
        count = int(np.prod(self.shape, dtype=np.int64))
        pairs = np.empty((self.packed.size, 2), np.int8)
        pairs[:, 0] = (self.packed << 4).view(np.int8) >> 4       # sign-extend each nibble
        pairs[:, 1] = self.packed.view(np.int8) >> 4
        return pairs.reshape(-1)[:count].reshape(self.shape)


def stored_value(stored: np.ndarray | LazyConstant | None) -> np.ndarray | None:
    """The value of a constant as a model holds it (an array, or a :class:`LazyConstant`
    made now); None for none."""
    return stored.values() if isinstance(stored, LazyConstant) else stored


@dataclass(frozen=True)
class Tensor:
    """A tensor of a subgraph.

    ``data`` is a read-only array for constants (a zero-copy view of the model
    bytes where the layout allows), ``None`` for activations. ``stored`` is how the model
    holds it: that array, or a :class:`LazyConstant` that ``data`` makes.
    """

    index: int
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    shape_signature: tuple[int, ...]
    type_name: str = "FLOAT32"
    stored: np.ndarray | LazyConstant | None = None
    quantization: Quantization | None = None
    is_variable: bool = False
    sparsity: Any = None
    # Values a narrower storage would change the answer with (the float view's int16 codes,
    # floats about to be rounded onto an integer grid): a device that stores float32 as
    # half keeps these in float32.
    full_precision: bool = False

    @property
    def data(self) -> np.ndarray | None:
        """The constant's read-only value; None for an activation."""
        return stored_value(self.stored)

    @property
    def is_constant(self) -> bool:
        """True when the tensor's value is stored in the model."""
        return self.stored is not None


@dataclass(frozen=True)
class Node:
    """One operator application. ``inputs`` uses -1 for an omitted optional input."""

    index: int
    op: str
    opcode: int
    version: int
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    options: dict[str, Any] = field(default_factory=dict)
    custom_options: bytes = b""
    intermediates: tuple[int, ...] = ()


@dataclass(frozen=True)
class Subgraph:
    """A list of tensors and nodes in execution order, with its inputs and outputs."""

    index: int
    name: str
    tensors: tuple[Tensor, ...]
    nodes: tuple[Node, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    # Nodes of the file the reader folded into constants (weight-only DEQUANTIZE/DENSIFY):
    # ``nodes`` keeps file indices, so these are the gaps; reports count them.
    folded_at_load: tuple[Node, ...] = ()
    # STABLEHLO_COMPOSITE nodes of the file replaced by their decomposition's nodes at
    # load (see litegpu.model.composites): (node, composite name, nodes it became).
    inlined_composites: tuple[tuple[int, str, int], ...] = ()

    @property
    def nodes_in_file(self) -> int:
        """How many operators the file lists for this subgraph (LiteRT's node count)."""
        return len(self.nodes) + len(self.folded_at_load) - sum(n - 1 for _, _, n in self.inlined_composites)


@dataclass(frozen=True)
class Signature:
    """A named entry point: input and output names mapped to tensor indices of a subgraph."""

    key: str
    subgraph_index: int
    inputs: dict[str, int]
    outputs: dict[str, int]


@dataclass(frozen=True)
class Model:
    """A whole validated model."""

    subgraphs: tuple[Subgraph, ...]
    signatures: tuple[Signature, ...]
    description: str = ""
    version: int = 3
    metadata: dict[str, bytes] = field(default_factory=dict)
    nbytes: int = 0
    # The file's bytes (a memory map or bytes), kept for :meth:`digest`.
    content: Any = field(default=None, repr=False, compare=False)

    def release_pages(self) -> None:
        """Drop what the compiled kernels no longer need: the values of lazy constants
        (:class:`LazyConstant`), and the model file's pages from this process's memory, where the model
        is a memory map (or a view of one). After compiling, the kernels hold their own
        packings of the weights, and a page read again comes back from the page cache, as a
        first read does. A 100M-parameter int8 decoder held its file's 100 MB resident beside
        its packed weights. The pages stay for bytes, or where the OS has no ``madvise``."""
        for sg in self.subgraphs:
            for t in sg.tensors:
                if isinstance(t.stored, LazyConstant):
                    t.stored.release()
        mapped = self.content.obj if isinstance(self.content, memoryview) else self.content
        if isinstance(mapped, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED") and not mapped.closed:
            try:
                mapped.madvise(mmap.MADV_DONTNEED)
            except (OSError, ValueError):   # (a mapping the OS will not advise: it keeps its pages)
                pass

    def digest(self) -> str:
        """SHA-256 of the model file (hex), computed once: part of compiled-kernel cache keys."""
        cached = self.__dict__.get("_digest")
        if cached is None:
            cached = hashlib.sha256(self.content if self.content is not None else b"").hexdigest()
            object.__setattr__(self, "_digest", cached)
        return cached
