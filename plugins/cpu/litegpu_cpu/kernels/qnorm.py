"""int8 SQUARED_DIFFERENCE and RSQRT, the integer pieces of a converted layer norm
(``x - mean`` squared, the variance's inverse square root), both on LiteRT's builtin
kernels' fixed point. Each output depends on its input bytes alone, so each op is a
table of its own integer reference, evaluated at compile time (exact by construction),
and a gather at run time:

- SQUARED_DIFFERENCE: 65536 entries, one per pair of bytes, gathered over any broadcast
  of rank up to 4 (the layer norm's ``[1, T, D] - [1, T, 1]``) by a task function that
  walks the output with each operand's strides;
- RSQRT: 256 entries and the bytes the reference refuses (a negative value): the task
  notes such a byte and the call raises the reference's own error
  (:class:`~litegpu.errors.ExecutionError`) instead of returning a value.
"""
from __future__ import annotations

import numpy as np

from litegpu.backend import NodeContext
from litegpu.errors import ExecutionError

from .registry import bindable, kernel, named
from .tasks import bind_task, row_tasks, task_function, uint8_pointer

I8 = np.dtype(np.int8)
_BYTES = (np.dtype(np.int8), np.dtype(np.uint8))
_RANK = 4
# Outputs from which a gather is cut into tasks the threads share, and the tasks.
_PARALLEL_SIZE = 1 << 15
_TASKS = 8


def every_byte(dtype: np.dtype) -> np.ndarray:
    """The 256 values of an 8-bit ``dtype``, in the order of their bytes (entry ``i`` is the
    value stored as byte ``i``)."""
    return np.arange(256, dtype=np.uint8).view(dtype)


# -- SQUARED_DIFFERENCE ---------------------------------------------------------------------------


def broadcast_strides(shapes: list[tuple], out_shape: tuple, rank: int = _RANK) -> tuple[list, list] | None:
    """``(dims, strides)`` walking an output of ``out_shape`` as ``rank`` nested loops:
    ``dims`` the loops' lengths, ``strides[i]`` operand ``i``'s element strides along them
    (0 where it is broadcast), with adjacent axes merged wherever every operand allows and
    padded with 1s in front; None when more than ``rank`` loops remain."""
    out_shape = tuple(out_shape)
    padded = [(1,) * (len(out_shape) - len(s)) + tuple(s) for s in shapes]
    columns = []        # per output axis longer than 1: its length and each operand's stride
    for axis, size in enumerate(out_shape):
        if size == 1:
            continue
        steps = [0 if shape[axis] == 1 else int(np.prod(shape[axis + 1:], dtype=np.int64)) for shape in padded]
        if columns and all(prev == step * size for prev, step in zip(columns[-1][1], steps)):
            columns[-1] = (columns[-1][0] * size, steps)       # contiguous with the axis before: one loop
        else:
            columns.append((size, steps))
    if len(columns) > rank:
        return None
    columns = [(1, [0] * len(shapes))] * (rank - len(columns)) + columns
    return [c[0] for c in columns], [[c[1][i] for c in columns] for i in range(len(shapes))]


def _pair_table(ctx: NodeContext, dtype: np.dtype) -> np.ndarray:
    """The node's integer reference on every pair of bytes: entry ``a * 256 + b`` is its
    output for the values stored as bytes ``a`` and ``b``."""
    values = every_byte(dtype)
    table = ctx.opdef.reference_for(ctx.attrs)([np.repeat(values, 256), np.tile(values, 256)], ctx.attrs)[0]
    return np.ascontiguousarray(table)


@task_function()
def _pair_lookup_task(t, tablep, ap, bp, outp, _a4, _a5, _a6, _a7, ip, _fp):
    """Rows ``t * ip[12] ..`` of ``out = table[a byte * 256 + b byte]`` over four nested loops,
    a row being one run of the innermost (``ip``: their lengths, a's strides, b's strides,
    rows per task)."""
    table, a, b, out = uint8_pointer(tablep), uint8_pointer(ap), uint8_pointer(bp), uint8_pointer(outp)
    d1, d2, d3 = ip[1], ip[2], ip[3]
    for row in range(t * ip[12], min(ip[0] * d1 * d2, (t + 1) * ip[12])):
        i0, i1, i2 = row // (d1 * d2), row // d2 % d1, row % d2
        ao = i0 * ip[4] + i1 * ip[5] + i2 * ip[6]
        bo = i0 * ip[8] + i1 * ip[9] + i2 * ip[10]
        o = row * d3
        for i3 in range(d3):
            out[o + i3] = table[(np.int64(a[ao + i3 * ip[7]]) << 8) | np.int64(b[bo + i3 * ip[11]])]


@kernel("SQUARED_DIFFERENCE", quantized=True)
def quantized_squared_difference(ctx: NodeContext):
    """int8 SQUARED_DIFFERENCE as a table of every pair of bytes (see the module
    docstring); a broadcast needing more than four loops keeps the reference."""
    specs = (*ctx.inputs[:2], ctx.outputs[0])
    if len(ctx.inputs) != 2 or any(np.dtype(s.dtype) != I8 for s in specs):
        return None
    walk = broadcast_strides([tuple(s.shape) for s in ctx.inputs], tuple(ctx.outputs[0].shape))
    if walk is None:
        return None
    dims, (a_strides, b_strides) = walk
    table = _pair_table(ctx, I8)
    if table.shape != (1 << 16,) or table.dtype != I8:
        return None
    tasks, chunk = row_tasks(dims[0] * dims[1] * dims[2], int(np.prod(dims, dtype=np.int64)), _PARALLEL_SIZE,
                             _TASKS)
    params = np.array([*dims, *a_strides, *b_strides, chunk], np.int64)

    def bind(inputs, outputs):
        return bind_task(_pair_lookup_task, tasks, (table, inputs[0], inputs[1]), (outputs[0],), params,
                         dtypes=(I8,) * 4)
    return named(bindable(bind), "int8 pair table task")


# -- RSQRT ----------------------------------------------------------------------------------------


def _checked_byte_table(ctx: NodeContext, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    """``(table, refused)``: the node's integer reference on every input byte, and 1 for the
    bytes it raises :class:`ExecutionError` for (their entries are 0)."""
    reference = ctx.opdef.reference_for(ctx.attrs)
    values = every_byte(dtype)
    try:
        return np.ascontiguousarray(reference([values], ctx.attrs)[0]), np.zeros(256, np.uint8)
    except ExecutionError:
        pass
    table = np.zeros(256, np.dtype(ctx.outputs[0].dtype))
    refused = np.zeros(256, np.uint8)
    for byte, value in enumerate(values):      # one at a time, to learn which ones it refuses
        try:
            table[byte] = reference([values[byte:byte + 1]], ctx.attrs)[0][0]
        except ExecutionError:
            refused[byte] = 1
    return table, refused


@task_function()
def _checked_lookup_task(t, tablep, refusedp, xp, outp, _a4, _a5, _a6, _a7, ip, _fp):
    """``out[i] = table[x[i] as a byte]`` for elements ``t * chunk ..`` (``ip``: size, chunk,
    then the check word and the refused byte): one pass that also notes whether a refused
    byte came by, and only then a second one to find it."""
    table, refused, x, out = uint8_pointer(tablep), uint8_pointer(refusedp), uint8_pointer(xp), uint8_pointer(outp)
    start = t * ip[1]
    end = min(ip[0], start + ip[1])
    bad = np.uint8(0)
    for i in range(start, end):
        bad |= refused[x[i]]
        out[i] = table[x[i]]
    if bad:
        for i in range(start, end):
            if refused[x[i]]:
                ip[3] = x[i]
                ip[2] = 1
                return


@kernel("RSQRT", quantized=True)
def quantized_rsqrt(ctx: NodeContext):
    """8-bit RSQRT as a 256-entry table of its integer reference; an input byte the
    reference refuses raises the reference's own error at run time."""
    dtype = np.dtype(ctx.inputs[0].dtype)
    if len(ctx.inputs) != 1 or dtype not in _BYTES or np.dtype(ctx.outputs[0].dtype) != dtype:
        return None
    table, refused = _checked_byte_table(ctx, dtype)
    if table.shape != (256,) or table.dtype != dtype:
        return None
    reference = ctx.opdef.reference_for(ctx.attrs)
    size = int(np.prod(ctx.inputs[0].shape, dtype=np.int64))
    tasks, chunk = row_tasks(size, size, _PARALLEL_SIZE, _TASKS)

    def error(params: np.ndarray) -> Exception:
        """What the reference raises for the byte the task noted."""
        byte = np.array([params[3]], np.uint8).view(dtype)
        try:
            reference([byte], ctx.attrs)
        except ExecutionError as exc:
            return exc
        return ExecutionError(f"{ctx.node.op}: input value {int(byte[0])} is refused")

    def bind(inputs, outputs):
        params = np.array([size, chunk, 0, 0], np.int64)
        return bind_task(_checked_lookup_task, tasks, (table, refused, inputs[0]), (outputs[0],), params,
                         dtypes=(dtype, np.dtype(np.uint8), dtype, dtype), checks=((2, error),))
    return named(bindable(bind), "8-bit checked table task")
