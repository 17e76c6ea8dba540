"""Indexing kernels: GATHER and EMBEDDING_LOOKUP (a bounds-checked task function), DYNAMIC_UPDATE_SLICE, SPLIT / SPLIT_V / UNPACK and STRIDED_SLICE / SLICE
with constant parameters (precomputed strided copies), SELECT / SELECT_V2 (np.where into the output).

Each factory works out the shapes, axes and slice objects when the model is compiled, so
``run`` is one or a few numpy calls on the arrays it is handed. Out-of-range GATHER
indices raise :class:`~litegpu.errors.ExecutionError` as the reference does.
"""
from __future__ import annotations

from functools import partial

import numpy as np

from litegpu.backend import NodeContext
from litegpu.errors import ExecutionError
from litegpu.graph import Int4Constant

from ..jit import njit
from .common import optional_input
from .layout import strided_copy
from .registry import bindable, kernel
from .tasks import (ARRAYS, bind_task, bound_tasks, chained, int8_pointer, int16_pointer, int32_pointer,
                    int64_pointer, task_function, uint8_pointer)

_INDEX_DTYPES = (np.dtype(np.int16), np.dtype(np.int32), np.dtype(np.int64))


def _const_ints(ctx: NodeContext, i: int) -> list[int] | None:
    """Input ``i``'s constant value as a flat list of ints, or None when it is not constant."""
    spec = optional_input(ctx, i)
    if spec is None or spec.value is None:
        return None
    return [int(v) for v in np.asarray(spec.value).reshape(-1)]


# -- GATHER -------------------------------------------------------------------------------------

@njit(cache=True, inline="always")
def _index(ix16, ix32, ix64, size, j):
    """Index ``j`` of an index array of ``size``-byte integers, as int64."""
    return ix64[j] if size == 8 else (np.int64(ix32[j]) if size == 4 else np.int64(ix16[j]))


@njit(cache=True, inline="always")
def _indices_fit(ix16, ix32, ix64, size, n, limit, ip, at):
    """True when the ``n`` indices all lie in ``[0, limit)``; else the first that does not
    is stored at ``ip[at + 1]`` after a 1 at ``ip[at]`` (a task's check word, see
    :func:`.tasks.bound_tasks`)."""
    for j in range(n):
        k = _index(ix16, ix32, ix64, size, j)
        if k < 0 or k >= limit:
            ip[at] = 1
            ip[at + 1] = k
            return False
    return True


@task_function()
def _gather_task(t, pp, ixp, outp, _a3, _a4, _a5, _a6, _a7, ip, _fp):
    """``out[o, j, :] = params[o, indices[j], :]`` over bytes; ``ip``: outer, limit, row
    bytes, number of indices, index size (2, 4 or 8 bytes), then the check word and the
    bad index: an index outside ``[0, limit)`` is stored there and nothing is written."""
    outer, limit, inner, n, size = ip[0], ip[1], ip[2], ip[3], ip[4]
    params, out = uint8_pointer(pp), uint8_pointer(outp)
    ix16, ix32, ix64 = int16_pointer(ixp), int32_pointer(ixp), int64_pointer(ixp)
    if not _indices_fit(ix16, ix32, ix64, size, n, limit, ip, 5):
        return
    for o in range(outer):
        for j in range(n):
            k = _index(ix16, ix32, ix64, size, j)
            src, dst = (o * limit + k) * inner, (o * n + j) * inner
            for e in range(inner):
                out[dst + e] = params[src + e]


@kernel("GATHER")
def gather(ctx: NodeContext):
    """GATHER along a constant axis without batch dims: a task function copying rows of a
    ``[outer, axis, inner]`` view (so it chains with its neighbours; an LSTM's per-step
    input row is one)."""
    if ctx.attrs.get("batch_dims", 0) != 0:
        return None
    p_spec, ix_spec, out_spec = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
    if np.dtype(ix_spec.dtype) not in _INDEX_DTYPES or np.dtype(p_spec.dtype) != np.dtype(out_spec.dtype):
        return None
    shape = tuple(p_spec.shape)
    rank = len(shape)
    axis = int(ctx.attrs.get("axis", 0))
    if not -rank <= axis < rank:
        return None
    axis %= rank
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    limit = shape[axis]
    inner = int(np.prod(shape[axis + 1:], dtype=np.int64)) * np.dtype(p_spec.dtype).itemsize
    n = int(np.prod(ix_spec.shape, dtype=np.int64))
    dtypes = (np.dtype(p_spec.dtype), np.dtype(ix_spec.dtype), np.dtype(out_spec.dtype))

    def error(params: np.ndarray) -> ExecutionError:
        return ExecutionError(f"GATHER index {int(params[6])} out of range [0, {limit})")

    def bind(inputs, outputs):
        params = np.array([outer, limit, inner, n, dtypes[1].itemsize, 0, 0], np.int64)
        return bind_task(_gather_task, 1, tuple(inputs[:2]), tuple(outputs), params, dtypes=dtypes,
                         checks=((5, error),))
    return bindable(bind)


@task_function()
def _gather_nd_task(t, pp, ixp, outp, _a3, _a4, _a5, _a6, _a7, ip, _fp):
    """``out[j, :] = params[indices[j, 0], .., indices[j, depth - 1], :]`` over bytes;
    ``ip``: number of tuples, depth, slice bytes, index size, the check word and the bad
    index (as :func:`_gather_task`), then params' first ``depth`` dimensions. An index
    outside its dimension is stored there and nothing is written."""
    n, depth, inner, size = ip[0], ip[1], ip[2], ip[3]
    params, out = uint8_pointer(pp), uint8_pointer(outp)
    ix16, ix32, ix64 = int16_pointer(ixp), int32_pointer(ixp), int64_pointer(ixp)
    for j in range(n):
        for d in range(depth):
            k = _index(ix16, ix32, ix64, size, j * depth + d)
            if k < 0 or k >= ip[6 + d]:
                ip[4] = 1
                ip[5] = k
                return
    for j in range(n):
        row = 0
        for d in range(depth):
            row = row * ip[6 + d] + _index(ix16, ix32, ix64, size, j * depth + d)
        for e in range(inner):
            out[j * inner + e] = params[row * inner + e]


@kernel("GATHER_ND")
def gather_nd(ctx: NodeContext):
    """GATHER_ND as a task function copying whole slices (a legacy decoder's mask row picked
    by position), so it chains with its neighbours."""
    p_spec, ix_spec, out_spec = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
    if np.dtype(ix_spec.dtype) not in _INDEX_DTYPES or np.dtype(p_spec.dtype) != np.dtype(out_spec.dtype) \
            or not ix_spec.shape:
        return None
    shape, depth = tuple(p_spec.shape), int(ix_spec.shape[-1])
    if not 1 <= depth <= len(shape):
        return None
    inner = int(np.prod(shape[depth:], dtype=np.int64)) * np.dtype(p_spec.dtype).itemsize
    n = int(np.prod(ix_spec.shape[:-1], dtype=np.int64))
    dtypes = (np.dtype(p_spec.dtype), np.dtype(ix_spec.dtype), np.dtype(out_spec.dtype))
    limits = [int(d) for d in shape[:depth]]

    def error(params: np.ndarray) -> ExecutionError:
        return ExecutionError(f"GATHER_ND index {int(params[5])} out of range")

    def bind(inputs, outputs):
        params = np.array([n, depth, inner, dtypes[1].itemsize, 0, 0, *limits], np.int64)
        return bind_task(_gather_nd_task, 1, tuple(inputs[:2]), tuple(outputs), params, dtypes=dtypes,
                         checks=((4, error),))
    return bindable(bind)


@kernel("EMBEDDING_LOOKUP")
def embedding_lookup(ctx: NodeContext):
    """EMBEDDING_LOOKUP of a table in the ids' dtype-independent bytes: GATHER's task along
    axis 0 (a decoder's token embedding, once a step), with LiteRT's out-of-range error. A
    hybrid lookup (an int8 or int4 table with scales) takes its own reference."""
    ids_spec, table_spec, out_spec = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
    if "quant" in ctx.attrs or np.dtype(table_spec.dtype) != np.dtype(out_spec.dtype) \
            or np.dtype(ids_spec.dtype) not in _INDEX_DTYPES:
        return None
    rows = int(table_spec.shape[0])
    inner = int(np.prod(table_spec.shape[1:], dtype=np.int64)) * np.dtype(table_spec.dtype).itemsize
    n = int(np.prod(ids_spec.shape, dtype=np.int64))
    dtypes = (np.dtype(table_spec.dtype), np.dtype(ids_spec.dtype), np.dtype(out_spec.dtype))

    def error(params: np.ndarray) -> ExecutionError:
        return ExecutionError(f"EMBEDDING_LOOKUP: id {int(params[6])} out of range [0, {rows})")

    def bind(inputs, outputs):
        params = np.array([1, rows, inner, n, dtypes[1].itemsize, 0, 0], np.int64)
        return bind_task(_gather_task, 1, (inputs[1], inputs[0]), tuple(outputs), params, dtypes=dtypes,
                         checks=((5, error),))
    return bindable(bind)


@task_function()
def _hybrid_lookup_task(t, tablep, ixp, scalep, outp, _a4, _a5, _a6, _a7, ip, _fp):
    """``out[j, :] = table[ids[j], :] * scale`` in float32, the scale the row's own
    (``ip[6] == 0``) or its block's (``scale`` [rows, D / block], ``ip[6]``: block); ``ip``:
    rows, D, number of ids, id size, the check word and the bad id (as :func:`_gather_task`),
    the block, and whether the table is INT4 as the model stores it (two values a byte, the
    first in the low nibble) rather than int8."""
    rows, d, n, size, block, nibbles = ip[0], ip[1], ip[2], ip[3], ip[6], ip[7]
    table = int8_pointer(tablep)
    ix16, ix32, ix64 = int16_pointer(ixp), int32_pointer(ixp), int64_pointer(ixp)
    if not _indices_fit(ix16, ix32, ix64, size, n, rows, ip, 4):
        return
    for j in range(n):
        k = _index(ix16, ix32, ix64, size, j)
        for e in range(d):
            i = k * d + e
            if nibbles:
                pair = np.int64(table[i >> 1])
                code = ((pair & 15) ^ 8) - 8 if (i & 1) == 0 else pair >> 4   # (sign-extended)
            else:
                code = np.int64(table[i])
            scale = scalep[k] if block == 0 else scalep[k * (d // block) + e // block]
            outp[j * d + e] = np.float32(code) * scale


@kernel("EMBEDDING_LOOKUP", quantized=True)
def hybrid_embedding_lookup(ctx: NodeContext):
    """A hybrid EMBEDDING_LOOKUP (an int8 or INT4 table, with a scale per row
    or per block of a row; LLMs' token embeddings): :func:`_hybrid_lookup_task`, TFLite's
    ``EvalHybrid`` arithmetic (one float32 product an element)."""
    attrs, ids_spec, table_spec, out_spec = ctx.attrs, ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
    if not attrs.get("hybrid") or table_spec.value is None or np.dtype(out_spec.dtype) != np.float32 \
            or np.dtype(ids_spec.dtype) not in _INDEX_DTYPES or len(table_spec.shape) != 2:
        return None
    rows, d = (int(n) for n in table_spec.shape)
    block = int(attrs.get("block_size") or 0)
    scales = np.ascontiguousarray(attrs["block_scale"] if block else attrs["row_scale"], np.float32)
    if (block and (d % block or scales.shape != (rows, d // block))) or (not block and scales.shape != (rows,)):
        return None
    # An INT4 table is read as the model stores it: its unpacked copy would be twice that.
    nibbles = isinstance(table_spec.stored, Int4Constant)
    table = table_spec.stored.packed if nibbles else np.ascontiguousarray(np.asarray(table_spec.value).view(np.int8))
    n = int(np.prod(ids_spec.shape, dtype=np.int64))

    def error(params: np.ndarray) -> ExecutionError:
        return ExecutionError(f"EMBEDDING_LOOKUP: id {int(params[5])} out of range [0, {rows})")

    def bind(inputs, outputs):
        params = np.array([rows, d, n, np.dtype(ids_spec.dtype).itemsize, 0, 0, block, nibbles], np.int64)
        return bind_task(_hybrid_lookup_task, 1, (table, inputs[0], scales), tuple(outputs), params,
                         dtypes=(table.dtype, np.dtype(ids_spec.dtype), np.float32, np.float32),
                         checks=((4, error),))
    run = bindable(bind)
    run.packed_inputs = (1,)
    return run


# -- DYNAMIC_UPDATE_SLICE -----------------------------------------------------------------------

_UPDATE_RANK = 8


@task_function()
def _update_slice_task(t, xp, up, sp, outp, _a4, _a5, _a6, _a7, ip, _fp):
    """``out = x`` (skipped when they are one array: the update is then in place), then the
    update's rows written at the start indices, each clamped so the update fits, as LiteRT
    clamps them. ``ip``: rank, index size (4 or 8 bytes), element bytes, in place (x is out),
    then the operand's dims and the update's, ``_UPDATE_RANK`` each (leading ones padded
    with 1)."""
    rank, size, item = ip[0], ip[1], ip[2]
    x, upd, out = uint8_pointer(xp), uint8_pointer(up), uint8_pointer(outp)
    s32, s64 = int32_pointer(sp), int64_pointer(sp)
    dims, udims = 4, 4 + _UPDATE_RANK       # where the operand's and the update's dims start in ip
    total = item
    for d in range(_UPDATE_RANK):
        total *= ip[dims + d]
    if not ip[3]:
        for e in range(total):
            out[e] = x[e]
    # The start of each (padded) dimension, clamped; then the byte offset of the update's origin.
    origin = 0
    stride = item
    for d in range(_UPDATE_RANK - 1, -1, -1):
        k = d - (_UPDATE_RANK - rank)
        start = 0
        if k >= 0:
            start = s64[k] if size == 8 else np.int64(s32[k])
        start = min(max(start, 0), ip[dims + d] - ip[udims + d])
        origin += start * stride
        stride *= ip[dims + d]
    row = ip[udims + _UPDATE_RANK - 1] * item
    rows = 1
    for d in range(_UPDATE_RANK - 1):
        rows *= ip[udims + d]
    for r in range(rows):
        # The row's offset in the operand: its update coordinates (all but the last) in x's strides.
        rest, offset, stride = r, origin, ip[dims + _UPDATE_RANK - 1] * item
        for d in range(_UPDATE_RANK - 2, -1, -1):
            offset += (rest % ip[udims + d]) * stride
            rest //= ip[udims + d]
            stride *= ip[dims + d]
        for e in range(row):
            out[offset + e] = upd[r * row + e]


@kernel("DYNAMIC_UPDATE_SLICE")
def dynamic_update_slice(ctx: NodeContext):
    """DYNAMIC_UPDATE_SLICE (a decoder's KV-cache write): a task function reading the start
    indices when it runs, so it chains with its neighbours; in place when the backend hands
    it the operand as its output."""
    x_spec, u_spec, s_spec = ctx.inputs
    rank = len(x_spec.shape)
    if rank > _UPDATE_RANK or np.dtype(s_spec.dtype) not in _INDEX_DTYPES[1:]:
        return None
    pad = (1,) * (_UPDATE_RANK - rank)
    params = np.array([rank, np.dtype(s_spec.dtype).itemsize, np.dtype(x_spec.dtype).itemsize, 0,
                       *pad, *x_spec.shape, *pad, *u_spec.shape], np.int64)
    dtypes = (np.dtype(x_spec.dtype), np.dtype(u_spec.dtype), np.dtype(s_spec.dtype), np.dtype(x_spec.dtype))

    def bind(inputs, outputs):
        bound = params.copy()
        bound[3] = inputs[0].ctypes.data == outputs[0].ctypes.data
        return bind_task(_update_slice_task, 1, tuple(inputs), tuple(outputs), bound, dtypes=dtypes)
    return bindable(bind)


# -- SPLIT / SPLIT_V ----------------------------------------------------------------------------

def _split_kernel(ctx: NodeContext, x_index: int, axis: int):
    """Copy consecutive slices of input ``x_index`` along ``axis`` into the outputs."""
    x_shape = tuple(ctx.inputs[x_index].shape)
    rank = len(x_shape)
    if not -rank <= axis < rank:
        return None
    axis %= rank
    slices, offset = [], 0
    for spec in ctx.outputs:
        size = spec.shape[axis]
        slices.append((slice(None),) * axis + (slice(offset, offset + size),))
        offset += size
    if offset != x_shape[axis]:
        return None
    outer = int(np.prod(x_shape[:axis], dtype=np.int64))
    inner = int(np.prod(x_shape[axis + 1:], dtype=np.int64)) * np.dtype(ctx.inputs[x_index].dtype).itemsize
    sizes = [spec.shape[axis] * inner for spec in ctx.outputs]
    return _byte_split_kernel(x_index, outer, x_shape[axis] * inner, sizes, slices)


def _byte_split_kernel(x_index: int, outer: int, row: int, sizes: list[int], pieces: list[tuple]):
    """A kernel copying input ``x_index``, as ``outer`` rows of ``row`` bytes, into the
    outputs: output ``i`` takes ``sizes[i]`` bytes of each row, after output ``i - 1``'s.
    :func:`_split_task` over seven outputs at a time, chained into one plan (a GRU
    unrolled over 24 steps UNPACKs into 24); numpy copies of ``x[pieces[i]]`` when an
    array is not C-contiguous."""
    offsets = np.cumsum([0, *sizes[:-1]])
    group = ARRAYS - 1
    starts = range(0, len(sizes), group)
    params = [np.array([outer, row, len(sizes[g:g + group]), *offsets[g:g + group], *sizes[g:g + group]], np.int64)
              for g in starts]

    def bind(inputs, outputs):
        x = inputs[x_index]
        if all(a.flags.c_contiguous for a in (x, *outputs)):
            return chained([bound_tasks(_split_task, 1, (x, *outputs[g:g + group]), p) for g, p in zip(starts, params)])
        pairs = [(out, x[sl]) for out, sl in zip(outputs, pieces)]

        def call():
            for out, piece in pairs:
                out[...] = piece
        return call
    return bindable(bind)


@task_function()
def _split_task(t, xp, y0, y1, y2, y3, y4, y5, y6, ip, _fp):
    """SPLIT's copies over bytes: ``x`` as ``[outer, ip[1]]`` rows, output ``i`` of ``ip[2]``
    takes ``ip[3 + n + i]`` bytes of each row from offset ``ip[3 + i]`` (n outputs)."""
    outer, row, n = ip[0], ip[1], ip[2]
    x = uint8_pointer(xp)
    ys = (uint8_pointer(y0), uint8_pointer(y1), uint8_pointer(y2), uint8_pointer(y3), uint8_pointer(y4),
          uint8_pointer(y5), uint8_pointer(y6))
    for i in range(n):
        y, offset, size = ys[i], ip[3 + i], ip[3 + n + i]
        for o in range(outer):
            for e in range(size):
                y[o * size + e] = x[o * row + offset + e]


@kernel("SPLIT")
def split(ctx: NodeContext):
    """SPLIT with a constant axis: one slice copy per output."""
    axis = _const_ints(ctx, 0)
    if axis is None or len(axis) != 1:
        return None
    return _split_kernel(ctx, 1, axis[0])


@kernel("SPLIT_V")
def split_v(ctx: NodeContext):
    """SPLIT_V with constant sizes and axis (sizes already resolved in the output shapes)."""
    axis = _const_ints(ctx, 2)
    if axis is None or len(axis) != 1 or _const_ints(ctx, 1) is None:
        return None
    return _split_kernel(ctx, 0, axis[0])


@kernel("UNPACK")
def unpack(ctx: NodeContext):
    """UNPACK (any dtype: data movement): output ``i`` is the input's slice ``i`` along the
    axis, the bytes SPLIT would copy into pieces of one."""
    x_shape = tuple(ctx.inputs[0].shape)
    rank = len(x_shape)
    axis = int(ctx.attrs.get("axis", 0))
    if not -rank <= axis < rank:
        return None
    axis %= rank
    count = x_shape[axis]
    if count != len(ctx.outputs) or any(np.dtype(s.dtype) != np.dtype(ctx.inputs[0].dtype) for s in ctx.outputs):
        return None
    outer = int(np.prod(x_shape[:axis], dtype=np.int64))
    inner = int(np.prod(x_shape[axis + 1:], dtype=np.int64)) * np.dtype(ctx.inputs[0].dtype).itemsize
    pieces = [(slice(None),) * axis + (i,) for i in range(count)]
    return _byte_split_kernel(0, outer, count * inner, [inner] * count, pieces)


# -- STRIDED_SLICE / SLICE ----------------------------------------------------------------------

def _as_slice(flat: np.ndarray, shape: tuple[int, ...]):
    """Basic-indexing slices of a C-contiguous input of ``shape`` that pick exactly the flat
    positions ``flat`` (in its order, up to a reshape), or None when no slice does.

    Each output axis longer than 1 must step through the positions by a fixed amount that
    is a multiple of one input axis's stride; the candidate is checked by applying it to an
    array of positions, so a wrong guess only costs the faster path, never correctness.
    """
    if flat.size == 0 or flat.ndim == 0:
        return None
    strides = [int(np.prod(shape[d + 1:], dtype=np.int64)) for d in range(len(shape))]
    origin = int(flat.reshape(-1)[0])
    first = np.unravel_index(origin, shape)
    steps: dict[int, tuple[int, int]] = {}      # input axis -> (step in elements of that axis, count)
    for a, count in enumerate(flat.shape):
        if count <= 1:
            continue
        sel = [0] * flat.ndim
        sel[a] = 1
        step = int(flat[tuple(sel)]) - origin
        for d, s in enumerate(strides):
            if d not in steps and step != 0 and step % s == 0 and abs(step // s) < shape[d]:
                steps[d] = (step // s, count)
                break
        else:
            return None
    index = []
    for d in range(len(shape)):
        start = int(first[d])
        step, count = steps.get(d, (1, 1))
        stop = start + step * count
        index.append(slice(start, stop if stop >= 0 else None, step))
    index = tuple(index)
    probe = np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int64).reshape(shape)[index]
    if probe.size != flat.size or not np.array_equal(probe.reshape(-1), flat.reshape(-1)):
        return None
    return index


def _nothing(inputs: list, outputs: list) -> None:
    """The kernel of a node with an empty output."""


def _constant_index_kernel(ctx: NodeContext):
    """A data-movement node whose index operands are constant: the reference, run once on an
    array of positions, says which input element each output element is; the kernel copies
    them by basic slicing when that selection is a slice, else by ``np.take``."""
    x_spec, out_spec = ctx.inputs[0], ctx.outputs[0]
    if any(s is None or s.value is None for s in ctx.inputs[1:]):
        return None
    if np.dtype(x_spec.dtype) != np.dtype(out_spec.dtype):
        return None
    shape = tuple(x_spec.shape)
    size = int(np.prod(shape, dtype=np.int64))
    if int(np.prod(out_spec.shape, dtype=np.int64)) == 0:
        return _nothing
    if size == 0 or size >= 1 << 31:
        return None
    positions = np.arange(size, dtype=np.int64).reshape(shape)
    values = [positions] + [s.value for s in ctx.inputs[1:]]
    try:
        (flat,) = ctx.opdef.reference(values, ctx.attrs)
    except Exception:  # noqa: BLE001  (an invalid node: the reference kernel reports it at run time)
        return None
    flat = np.asarray(flat)
    if tuple(flat.shape) != tuple(out_spec.shape):
        return None
    index = _as_slice(flat, shape)
    if index is not None:
        # The slice of an array of positions: its shape, element strides and first position
        # are the strided copy's (a task function: it chains with its neighbours).
        piece = positions[index]
        copy = strided_copy(np.dtype(x_spec.dtype), piece.shape, [s // piece.itemsize for s in piece.strides],
                            int(piece.reshape(-1)[0]))
        if copy is not None:
            return copy

        def bind(inputs, outputs):
            # The output (C-contiguous) takes the slice's shape: reshaping it is always a view.
            piece = inputs[0][index]
            return partial(outputs[0].reshape(piece.shape).__setitem__, Ellipsis, piece)
        return bindable(bind)
    take = np.ascontiguousarray(flat.reshape(-1).astype(np.intp))

    def bind_take(inputs, outputs):
        return partial(np.take, inputs[0].reshape(-1), take, out=outputs[0].reshape(-1))
    return bindable(bind_take)


@kernel("STRIDED_SLICE", "SLICE")
def strided_slice(ctx: NodeContext):
    """STRIDED_SLICE / SLICE with constant begin/end/strides: a precomputed slice copy."""
    return _constant_index_kernel(ctx)


# -- SELECT / SELECT_V2 -------------------------------------------------------------------------

@kernel("SELECT", "SELECT_V2")
def select(ctx: NodeContext):
    """``np.where(cond, x, y)`` into the output; SELECT's rank-1 condition picks along dim 0."""
    c_spec, x_spec, y_spec = ctx.inputs
    out_spec = ctx.outputs[0]
    dtype = np.dtype(out_spec.dtype)
    if np.dtype(x_spec.dtype) != dtype or np.dtype(y_spec.dtype) != dtype or np.dtype(c_spec.dtype) != np.bool_:
        return None
    c_view = None
    if ctx.node.op == "SELECT" and len(c_spec.shape) == 1 and len(x_spec.shape) > 1:
        c_view = tuple(c_spec.shape) + (1,) * (len(x_spec.shape) - 1)

    # numpy's where has no out=: y everywhere, then x where the condition holds.
    def bind(inputs, outputs):
        out, (c, x, y) = outputs[0], inputs
        where = c if c_view is None else c.reshape(c_view)

        def call():
            np.copyto(out, y)
            np.copyto(out, x, where=where)
        return call
    return bindable(bind)
