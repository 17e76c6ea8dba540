"""Data-movement kernels: reshapes as flat copies, constant PAD as row copies, strided
copies (TRANSPOSE with a constant permutation, constant slices)."""
from __future__ import annotations

from functools import partial

import numpy as np

from litegpu.backend import NodeContext

from ..jit import njit
from .common import optional_input
from .registry import bindable, kernel
from .tasks import (bind_task, bound_tasks, int16_pointer, int32_pointer, int64_pointer, task_function,
                    uint8_pointer)


@kernel("RESHAPE", "SQUEEZE", "EXPAND_DIMS")
def reshape(ctx: NodeContext):
    """Same bytes, new shape: one flat copy into the output (no shape logic at run time);
    nothing where the arena placed the output on its input (see ``litegpu.executor``)."""
    if int(np.prod(ctx.inputs[0].shape)) != int(np.prod(ctx.outputs[0].shape)):
        return None

    return bindable(lambda inputs, outputs: copy_call(inputs[0], outputs[0]))


def copy_call(x: np.ndarray, out: np.ndarray):
    """A call of no arguments copying ``x`` into ``out`` (same size and dtype, any shapes):
    a task function when both are C-contiguous, so it chains with its neighbours; one of no
    bytes when ``out`` is ``x``'s own bytes (still a task, so the plan stays one chain)."""
    if x.dtype == out.dtype and x.flags.c_contiguous and out.flags.c_contiguous:
        nbytes = 0 if x.ctypes.data == out.ctypes.data else x.nbytes
        return bound_tasks(_copy_task, 1, (x, out), np.array([nbytes], np.int64))
    # ``out[...] = x`` copies like np.copyto, without its dispatch overhead. (Reshaping a
    # non-contiguous ``x`` copies it: only arrays of one shape may be bound for later runs.)
    if x.shape == out.shape:
        return partial(out.__setitem__, Ellipsis, x)
    return partial(out.reshape(-1).__setitem__, Ellipsis, x.reshape(-1))


@task_function()
def _copy_task(t, xp, outp, _a2, _a3, _a4, _a5, _a6, _a7, ip, _fp):
    """Copy ``ip[0]`` bytes."""
    x, out = uint8_pointer(xp), uint8_pointer(outp)
    for i in range(ip[0]):
        out[i] = x[i]


# -- PAD -----------------------------------------------------------------------------------------

# Output rows (see _pad_rows) past which PAD keeps to numpy (its table would be large),
# and output bytes from which its rows are split into tasks over the threads.
_PAD_MAX_ROWS = 1 << 20
_PAD_PARALLEL_BYTES = 1 << 16
_PAD_TASKS = 8


@njit(cache=True)
def _fill(outp, lo, hi, size, bits):
    """Bytes ``[lo, hi)`` of ``outp`` (multiples of ``size``) set to the ``size``-byte value
    ``bits``; all-zero bits written as bytes (a loop LLVM turns into a memset)."""
    if bits == 0 or size == 1:
        out = uint8_pointer(outp)
        for i in range(lo, hi):
            out[i] = bits
    elif size == 4:
        out4 = int32_pointer(outp)
        for i in range(lo // 4, hi // 4):
            out4[i] = bits
    elif size == 2:
        out2 = int16_pointer(outp)
        for i in range(lo // 2, hi // 2):
            out2[i] = bits
    else:
        out8 = int64_pointer(outp)
        for i in range(lo // 8, hi // 8):
            out8[i] = bits


@task_function()
def _pad_task(t, xp, srcp, outp, _a3, _a4, _a5, _a6, _a7, ip, _fp):
    """Output rows ``[t * ip[1], ..)`` of a constant PAD: row ``r`` is the pad value, or
    (``src[r] >= 0``) ``ip[2]`` bytes of it, then the input's row at byte ``src[r]``
    (``ip[3]`` bytes), then the pad value up to the row's ``ip[4]`` bytes. The value is
    ``ip[6]`` (its bits) of ``ip[5]`` bytes."""
    x, out, src = uint8_pointer(xp), uint8_pointer(outp), int64_pointer(srcp)
    rows, per, before, width, row_bytes, size, bits = ip[0], ip[1], ip[2], ip[3], ip[4], ip[5], ip[6]
    for r in range(t * per, min(rows, (t + 1) * per)):
        base = r * row_bytes
        at = src[r]
        if at < 0:
            _fill(outp, base, base + row_bytes, size, bits)
            continue
        _fill(outp, base, base + before, size, bits)
        for i in range(width):
            out[base + before + i] = x[at + i]
        _fill(outp, base + before + width, base + row_bytes, size, bits)


def _pad_rows(in_shape: tuple, pads: np.ndarray, itemsize: int):
    """PAD as rows of bytes: the output split at the last padded axis ``k`` into rows of
    ``out_shape[k] * inner`` bytes (``inner``: the unpadded axes after ``k``), with the
    byte offset of each row's input row (-1 for a row of padding only), the bytes before
    the input's part, its bytes and the row's bytes. None when nothing is padded."""
    padded = [k for k, (b, a) in enumerate(pads) if b or a]
    if not padded:
        return None
    k = padded[-1]
    inner = int(np.prod(in_shape[k + 1:], dtype=np.int64)) * itemsize
    out_shape = [d + int(b) + int(a) for d, (b, a) in zip(in_shape, pads)]
    # The input row of each output row over the axes before k, in row-major order.
    src = np.zeros(1, np.int64)
    for d, (b, _), size in zip(in_shape[:k], pads[:k], out_shape[:k]):
        at = np.arange(size) - int(b)
        inside = (at >= 0) & (at < d)
        src = np.where((src[:, None] >= 0) & inside[None, :], src[:, None] * d + at[None, :], -1).reshape(-1)
    row_in = in_shape[k] * inner
    src = np.where(src >= 0, src * row_in, -1).astype(np.int64)
    return src, int(pads[k][0]) * inner, row_in, out_shape[k] * inner


@kernel("PAD", "PADV2")
def pad(ctx: NodeContext):
    """Constant padding. With a constant value (and 1 to 8 bytes an element): a task
    function over output rows (see :func:`_pad_task`); else fill the output with the
    value read at run time, then copy the input into its interior."""
    pads_spec, value_spec = optional_input(ctx, 1), optional_input(ctx, 2)
    x_spec, out_spec = ctx.inputs[0], ctx.outputs[0]
    dtype = np.dtype(x_spec.dtype)
    if pads_spec is None or pads_spec.value is None or dtype != np.dtype(out_spec.dtype):
        return None
    pads = np.asarray(pads_spec.value, np.int64).reshape(-1, 2)
    if pads.shape[0] != len(x_spec.shape) or np.any(pads < 0):
        return None
    # Without a value: zeros, or the zero point of a quantized tensor (the op's pad_value).
    default = dtype.type(ctx.attrs.get("pad_value", 0))
    if value_spec is None or value_spec.value is not None:
        value = default if value_spec is None else np.asarray(value_spec.value).reshape(-1)[0].astype(dtype)
        planned = _pad_rows(tuple(x_spec.shape), pads, dtype.itemsize) if dtype.itemsize in (1, 2, 4, 8) else None
        if planned is not None and len(planned[0]) <= _PAD_MAX_ROWS:
            return _pad_rows_kernel(*planned, value)
    interior = tuple(slice(int(b), int(b) + d) for (b, _), d in zip(pads, x_spec.shape))

    def run(inputs, outputs):
        out = outputs[0]
        out.fill(inputs[2].reshape(-1)[0] if len(inputs) > 2 and inputs[2] is not None else default)
        out[interior] = inputs[0]
    return run


def _pad_rows_kernel(src: np.ndarray, before: int, width: int, row_bytes: int, value: np.generic):
    """The PAD kernel over the rows :func:`_pad_rows` planned, ``value`` in the padding."""
    rows = len(src)
    tasks = min(rows, _PAD_TASKS) if rows * row_bytes >= _PAD_PARALLEL_BYTES else 1
    per = -(-rows // tasks) if rows else 0
    dtype = value.dtype
    bits = int(np.array(value).view(f"i{dtype.itemsize}"))   # (as signed: it fits the int64 parameters)
    params = np.array([rows, per, before, width, row_bytes, dtype.itemsize, bits], np.int64)
    dtypes = (dtype, np.dtype(np.int64), dtype)
    return bindable(lambda inputs, outputs: bind_task(_pad_task, tasks, (inputs[0], src), (outputs[0],),
                                                      params, dtypes=dtypes))


# -- strided copies: TRANSPOSE, constant slices ---------------------------------------------------

_COPY_RANK = 6                      # dimensions of the strided copy's loop nest (fewer are padded with 1s)
# (A many-task row costs little more than a one-task row inside a plan's parallel region,
# see .tasks.run_plan: attention's 32 KB head transposes gain from two threads.)
_COPY_PARALLEL_BYTES = 1 << 14


@njit(cache=True, inline="always")
def _strided_nest(x, out, t, ip, contiguous):
    """The loop nest of :func:`_strided_copy_task` over pointers of one element type, its
    rows plain copies where ``contiguous`` (a literal: each case is its own loop, which
    LLVM vectorizes; a type or stride switch inside the nest kept every copy scalar, a 32-float
    row at 70 cycles)."""
    chunk, origin = ip[1], ip[14]
    d0, d1, d2, d3, d4, d5 = ip[2], ip[3], ip[4], ip[5], ip[6], ip[7]
    s0, s1, s2, s3, s4, s5 = ip[8], ip[9], ip[10], ip[11], ip[12], ip[13]
    for i0 in range(t * chunk, min(d0, (t + 1) * chunk)):
        for i1 in range(d1):
            for i2 in range(d2):
                for i3 in range(d3):
                    for i4 in range(d4):
                        base = origin + i0 * s0 + i1 * s1 + i2 * s2 + i3 * s3 + i4 * s4
                        at = ((((i0 * d1 + i1) * d2 + i2) * d3 + i3) * d4 + i4) * d5
                        if contiguous:
                            for j in range(d5):
                                out[at + j] = x[base + j]
                        else:
                            for j in range(d5):
                                out[at + j] = x[base + j * s5]


@njit(cache=True, inline="always")
def _strided_copy_of_size(xp, outp, t, ip, contiguous):
    """:func:`_strided_nest` over the element size ``ip[0]`` (1, 2, 4 or 8 bytes)."""
    size = ip[0]
    if size == 4:
        _strided_nest(xp, outp, t, ip, contiguous)
    elif size == 1:
        _strided_nest(uint8_pointer(xp), uint8_pointer(outp), t, ip, contiguous)
    elif size == 2:
        _strided_nest(int16_pointer(xp), int16_pointer(outp), t, ip, contiguous)
    else:
        _strided_nest(int64_pointer(xp), int64_pointer(outp), t, ip, contiguous)


@task_function()
def _strided_copy_task(t, xp, outp, _a2, _a3, _a4, _a5, _a6, _a7, ip, _fp):
    """Rows ``t * chunk ..`` of the outermost output dimension of a strided copy: the output
    written in order, each element read at its input offset. ``ip``: element size (1, 2,
    4 or 8 bytes), chunk, the 6 output dimensions, the input's element strides along
    them (any sign), the input offset of the first element."""
    if ip[13] == 1:
        _strided_copy_of_size(xp, outp, t, ip, True)
    else:
        _strided_copy_of_size(xp, outp, t, ip, False)


def merged_dims(dims, steps) -> tuple[list[int], list[int]]:
    """Output dimensions and the input's element strides along them with size-1 dimensions
    dropped and each dimension merged into the one before where the input walks them as
    one (a head split [1, 64, 4, 32] -> [1, 4, 64, 32] becomes [4, 64, 32], its rows of 32
    contiguous)."""
    out_dims: list[int] = []
    out_steps: list[int] = []
    for d, step in zip(dims, steps):
        if d == 1:
            continue
        if out_dims and out_steps[-1] == step * d:
            out_dims[-1] *= d
            out_steps[-1] = step
        else:
            out_dims.append(int(d))
            out_steps.append(int(step))
    return out_dims or [1], out_steps or [1]


def strided_copy(dtype: np.dtype, dims, steps, origin: int = 0):
    """The kernel copying the elements of its input at ``origin + sum(i_k * steps[k])``
    (element strides of any sign) into its output of shape ``dims`` in order: a task
    function over the merged dimensions (so it chains with its neighbours), or None when
    more than six remain or the element size is not 1, 2, 4 or 8 bytes."""
    dims, steps = merged_dims(dims, steps)
    itemsize = np.dtype(dtype).itemsize
    if len(dims) > _COPY_RANK or itemsize not in (1, 2, 4, 8):
        return None
    # Size-1 dimensions pad the nest to six after the outermost one, which the tasks split
    # (padded in front, the split dimension was a 1 and every copy ran as one task).
    pad = [1] * (_COPY_RANK - len(dims))
    split_at = min(1, len(dims) - 1)
    dims = dims[:split_at] + pad + dims[split_at:]
    steps = steps[:split_at] + [0] * len(pad) + steps[split_at:]
    nbytes = int(np.prod(dims, dtype=np.int64)) * itemsize
    tasks = min(dims[0], 8) if nbytes >= _COPY_PARALLEL_BYTES else 1
    chunk = max(1, -(-dims[0] // tasks))      # (an empty outermost dimension: one empty task)
    tasks = max(1, -(-dims[0] // chunk))
    params = np.array([itemsize, chunk, *dims, *steps, origin], np.int64)
    return bindable(lambda inputs, outputs: bind_task(_strided_copy_task, tasks, (inputs[0],), (outputs[0],), params,
                                                      dtypes=(dtype, dtype)))


@kernel("BROADCAST_TO")
def broadcast_to(ctx: NodeContext):
    """A strided copy reading each broadcast axis with stride 0 (:func:`strided_copy`: a
    task function, so a decoder's grouped-query expansion of its KV cache chains with the
    steps around it); None (the reference) for more than six merged axes."""
    shape, out = tuple(ctx.inputs[0].shape), tuple(ctx.outputs[0].shape)
    if len(shape) > len(out):
        return None
    aligned = (1,) * (len(out) - len(shape)) + shape
    if any(a not in (1, o) for a, o in zip(aligned, out)):
        return None
    strides = [int(np.prod(aligned[d + 1:], dtype=np.int64)) for d in range(len(out))]
    return strided_copy(np.dtype(ctx.inputs[0].dtype), list(out),
                        [0 if a == 1 else step for a, step in zip(aligned, strides)])


@kernel("TRANSPOSE")
def transpose(ctx: NodeContext):
    """A strided copy with the permutation fixed at compile time (:func:`strided_copy`),
    else numpy (more than six merged dimensions, other element sizes)."""
    perm_spec = ctx.inputs[1]
    if perm_spec is None or perm_spec.value is None:
        return None
    shape = tuple(ctx.inputs[0].shape)
    rank = len(shape)
    perm = tuple(int(p) % max(rank, 1) for p in np.asarray(perm_spec.value).reshape(-1))
    strides = [int(np.prod(shape[d + 1:], dtype=np.int64)) for d in range(rank)]
    copy = None
    if sorted(perm) == list(range(rank)):
        copy = strided_copy(np.dtype(ctx.inputs[0].dtype), [shape[p] for p in perm], [strides[p] for p in perm])
    if copy is None:
        def run(inputs, outputs):
            np.copyto(outputs[0], inputs[0].transpose(perm))
        return run
    return copy
