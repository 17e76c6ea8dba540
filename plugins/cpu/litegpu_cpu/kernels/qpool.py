"""Integer kernels for int8, uint8 and int16 MAX_POOL_2D and AVERAGE_POOL_2D (NHWC, any
window, stride and padding), as the ops' integer references in :mod:`litegpu.ops.quantized`
compute them: the window's maximum, padding never winning; TFLite's builtin average, the
int32 sum of the window's real pixels divided by their count, rounded half away from
zero; both clamped to the fused activation's range. Input and output share their
quantization (the references refuse anything else). A task function over output rows.
"""
from __future__ import annotations

import numpy as np

from litegpu.backend import NodeContext

from ..jit import njit
from .common import window_geometry
from .registry import bindable, kernel, named
from .tasks import bind_task, int8_pointer, int16_pointer, int32_pointer, row_tasks, task_function, uint8_pointer



# ip layout of :func:`_qpool_task`.
_N, _H, _W, _C, _OH, _OW, _FH, _FW, _SH, _SW, _PT, _PL, _MAX, _LO, _HI, _KIND, _ROWS = range(17)
_KINDS = {np.dtype(np.uint8): 0, np.dtype(np.int8): 1, np.dtype(np.int16): 2}
_PARALLEL_SIZE = 1 << 13         # outputs from which the rows are cut into several tasks (~2.5 us of int8 max pool)


@njit(cache=True, inline="always")
def _span(at, size, stride, pad, window):   # pragma: no cover - compiled
    """The input indices ``start .. end`` of output index ``at``'s window along one axis
    that fall inside the image."""
    start = at * stride - pad
    return max(start, 0), min(start + window, size)


@njit(cache=True, inline="always")
def _max_rows(x, out, ip, r0, r1):   # pragma: no cover - compiled
    """Output rows ``r0 .. r1`` of a max pool, the maxima taken in the values' own type in
    the output itself (the max and average loops are apart so that each channel loop
    vectorizes: one loop branching on the kind per channel stayed scalar, and a 2x1 pool
    of 98x20x32 took 28 us)."""
    h, w, c_size, ow_size = ip[_H], ip[_W], ip[_C], ip[_OW]
    lo, hi = np.int32(ip[_LO]), np.int32(ip[_HI])
    for r in range(r0, r1):
        n = r // ip[_OH]
        hs, he = _span(r % ip[_OH], h, ip[_SH], ip[_PT], ip[_FH])
        for ow in range(ow_size):
            ws, we = _span(ow, w, ip[_SW], ip[_PL], ip[_FW])
            dst = (r * ow_size + ow) * c_size
            if he <= hs or we <= ws:      # a window of padding alone: the lowest value
                for c in range(c_size):
                    out[dst + c] = max(np.int32(-32768), lo)
                continue
            at = ((n * h + hs) * w + ws) * c_size
            for c in range(c_size):
                out[dst + c] = x[at + c]
            for iy in range(hs, he):
                for ix in range(ws, we):
                    at = ((n * h + iy) * w + ix) * c_size
                    for c in range(c_size):
                        out[dst + c] = max(out[dst + c], x[at + c])
            for c in range(c_size):
                out[dst + c] = min(max(np.int32(out[dst + c]), lo), hi)


@njit(cache=True, inline="always")
def _average_rows(x, out, acc, a0, ip, r0, r1):   # pragma: no cover - compiled
    """Output rows ``r0 .. r1`` of an average pool, ``acc[a0:]`` C int32 sums."""
    h, w, c_size, ow_size = ip[_H], ip[_W], ip[_C], ip[_OW]
    lo, hi = np.int32(ip[_LO]), np.int32(ip[_HI])
    for r in range(r0, r1):
        n = r // ip[_OH]
        hs, he = _span(r % ip[_OH], h, ip[_SH], ip[_PT], ip[_FH])
        for ow in range(ow_size):
            ws, we = _span(ow, w, ip[_SW], ip[_PL], ip[_FW])
            for c in range(c_size):
                acc[a0 + c] = 0
            for iy in range(hs, he):
                for ix in range(ws, we):
                    at = ((n * h + iy) * w + ix) * c_size
                    for c in range(c_size):
                        acc[a0 + c] += np.int32(x[at + c])
            count = np.int32(max((he - hs) * (we - ws), 1))
            half = count // 2
            at = (r * ow_size + ow) * c_size
            for c in range(c_size):
                v = acc[a0 + c]
                v = (v + half) // count if v > 0 else -((half - v) // count)
                out[at + c] = min(max(v, lo), hi)


@njit(cache=True, inline="always")
def _pool_rows(x, out, acc, a0, ip, r0, r1):   # pragma: no cover - compiled
    """Output rows ``r0 .. r1`` of the pool ``ip[_MAX]`` says."""
    if ip[_MAX]:
        _max_rows(x, out, ip, r0, r1)
    else:
        _average_rows(x, out, acc, a0, ip, r0, r1)


@task_function()
def _qpool_task(t, xp, accp, outp, _a3, _a4, _a5, _a6, _a7, ip, _fp):
    """Rows ``t * ip[_ROWS] ..`` of a pool on ``ip[_KIND]`` values (uint8, int8, int16);
    ``acc`` C int32 per task."""
    r0 = t * ip[_ROWS]
    r1 = min(ip[_N] * ip[_OH], r0 + ip[_ROWS])
    acc = int32_pointer(accp)
    if ip[_KIND] == 1:
        _pool_rows(int8_pointer(xp), int8_pointer(outp), acc, t * ip[_C], ip, r0, r1)
    elif ip[_KIND] == 0:
        _pool_rows(uint8_pointer(xp), uint8_pointer(outp), acc, t * ip[_C], ip, r0, r1)
    else:
        _pool_rows(int16_pointer(xp), int16_pointer(outp), acc, t * ip[_C], ip, r0, r1)


def _qpool_factory(ctx: NodeContext, is_max: bool):
    x = ctx.inputs[0]
    dtype = np.dtype(x.dtype)
    if len(x.shape) != 4 or dtype not in _KINDS or "clamp" not in ctx.attrs:
        return None
    fh, fw = ctx.attrs["filter"]
    if fh * fw >= 1 << 16:
        return None         # (the int32 sums hold a window of fewer than 65536 int16 pixels)
    n, h, w, c = x.shape
    _, oh, ow, _ = ctx.outputs[0].shape
    sh, sw, _, _, pt, pl = window_geometry(ctx.attrs, h, w, fh, fw)
    rows = n * oh
    tasks, per = row_tasks(rows, rows * ow * c, _PARALLEL_SIZE)
    params = np.array([n, h, w, c, oh, ow, fh, fw, sh, sw, pt, pl, is_max, *ctx.attrs["clamp"], _KINDS[dtype], per],
                      np.int64)
    acc = np.zeros(tasks * max(c, 1), np.int32)
    return named(bindable(lambda inputs, outputs: bind_task(_qpool_task, tasks, (inputs[0], acc), (outputs[0],),
                                                            params, dtypes=(dtype, np.dtype(np.int32), dtype))),
                 f"{dtype.name} {'max' if is_max else 'average'} pool {fh}x{fw}/{sh} task")


@kernel("MAX_POOL_2D", quantized=True)
def quantized_max_pool2d(ctx: NodeContext):
    """See the module docstring."""
    return _qpool_factory(ctx, True)


@kernel("AVERAGE_POOL_2D", quantized=True)
def quantized_average_pool2d(ctx: NodeContext):
    """See the module docstring."""
    return _qpool_factory(ctx, False)
