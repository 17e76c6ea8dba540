"""Densify constant tensors stored in LiteRT's sparse (TACO-style) format."""
from __future__ import annotations

import numpy as np

from ..errors import ModelFormatError, ResourceLimitError
from .flatbuf import Table

_INDEX_VECTOR_KINDS = {1: "[int]", 2: "[ushort]", 3: "[ubyte]"}
# The largest dense tensor a sparse constant may expand to at load time. The sparse
# form is bounded by the file size, its dense form only by this; raise it (assign to
# ``litegpu.model.sparse.MAX_DENSE_BYTES``) for models with bigger sparse weights.
MAX_DENSE_BYTES = 1 << 30


def _index_vector(dm: Table, type_slot: int, value_slot: int, what: str) -> np.ndarray:
    kind = dm.scalar(type_slot, "ubyte", 0, f"{what}_type")
    if kind not in _INDEX_VECTOR_KINDS:
        raise ModelFormatError(f"{dm.path}.{what}: unknown index vector type {kind}")
    table = dm.table(value_slot, what)
    arr = None if table is None else table.array(0, _INDEX_VECTOR_KINDS[kind], "values")
    if arr is None:
        raise ModelFormatError(f"{dm.path}.{what}: missing")
    return arr.astype(np.int64)


def densify(raw: np.ndarray, dtype: np.dtype, shape: tuple[int, ...], sp: Table) -> np.ndarray:
    """Expand the sparse buffer ``raw`` into a dense read-only array of ``shape``."""
    n = len(shape)
    count = int(np.prod(shape, dtype=np.int64)) if n else 1
    if count * dtype.itemsize > MAX_DENSE_BYTES:
        raise ResourceLimitError(
            f"{sp.path}: densifying shape {list(shape)} needs {count * dtype.itemsize} bytes, over the limit of "
            f"{MAX_DENSE_BYTES} (litegpu.model.sparse.MAX_DENSE_BYTES)")
    if raw.size % dtype.itemsize:
        raise ModelFormatError(f"{sp.path}: sparse values hold {raw.size} bytes, not a whole number of "
                               f"{dtype} elements")
    order = sp.array(0, "[int]", "traversal_order")
    block_map = sp.array(1, "[int]", "block_map")
    order = [] if order is None else [int(x) for x in order]
    block_map = [] if block_map is None else [int(x) for x in block_map]
    levels = sp.tables(2, "dim_metadata")
    k = len(block_map)
    if len(order) != n + k or len(levels) != n + k or sorted(order) != list(range(n + k)):
        raise ModelFormatError(f"{sp.path}: traversal_order {order} does not fit shape {list(shape)} "
                               f"with {k} block dimensions and {len(levels)} dim_metadata entries")
    if any(not 0 <= b < n for b in block_map):
        raise ModelFormatError(f"{sp.path}.block_map: {block_map} out of range for rank {n}")
    values = np.frombuffer(raw.tobytes(), dtype=dtype.newbyteorder("<")).astype(dtype)
    pos = np.zeros(1, np.int64)
    coords: list[np.ndarray] = []
    sizes: dict[int, int] = {}
    for level, dm in enumerate(levels):
        fmt = dm.scalar(0, "byte", 0, "format")
        if fmt == 0:
            size = dm.scalar(1, "int", 0, "dense_size")
            # Positions per level never exceed the dense element count; more means a hostile size.
            if size < 0 or pos.size * max(size, 1) > count:
                raise ModelFormatError(f"{dm.path}.dense_size: {size} is invalid")
            coords = [np.repeat(c, size) for c in coords]
            coords.append(np.tile(np.arange(size, dtype=np.int64), pos.size))
            pos = (pos[:, None] * size + np.arange(size, dtype=np.int64)).ravel()
            sizes[order[level]] = size
        elif fmt == 1:
            seg = _index_vector(dm, 2, 3, "array_segments")
            idx = _index_vector(dm, 4, 5, "array_indices")
            if pos.size and (pos.max() + 1 >= seg.size):
                raise ModelFormatError(f"{dm.path}.array_segments: too short ({seg.size})")
            if np.any(np.diff(seg) < 0) or (seg.size and (seg[0] < 0 or seg[-1] > idx.size)):
                raise ModelFormatError(f"{dm.path}.array_segments: not a valid segment list")
            start, stop = seg[pos], seg[pos + 1]
            counts = stop - start
            total = int(counts.sum())
            if total > count:
                raise ModelFormatError(f"{dm.path}: {total} stored elements, more than the {count} of the tensor")
            # Every range start..stop, concatenated, without a Python loop over rows.
            first = np.repeat(start - (np.cumsum(counts) - counts), counts)
            new_pos = np.arange(total, dtype=np.int64) + first
            coords = [np.repeat(c, counts) for c in coords]
            coords.append(idx[new_pos])
            pos = new_pos
        else:
            raise ModelFormatError(f"{dm.path}.format: unknown dimension type {fmt}")
    if pos.size and pos.max() >= values.size:
        raise ModelFormatError(f"{sp.path}: sparse indices reach element {int(pos.max())} of {values.size}")
    full = [np.zeros(pos.size, np.int64) for _ in range(n)]
    for level, dim in enumerate(order):
        if dim < n:
            block = next((sizes.get(n + j, 1) for j, b in enumerate(block_map) if b == dim), 1)
            full[dim] += coords[level] * block
        else:
            full[block_map[dim - n]] += coords[level]
    dense = np.zeros(shape, dtype)
    for d in range(n):
        if full[d].size and (full[d].max() >= shape[d] or full[d].min() < 0):
            raise ModelFormatError(f"{sp.path}: sparse index out of range in dimension {d}")
    if n:
        dense[tuple(full)] = values[pos]
    dense.flags.writeable = False
    return dense
