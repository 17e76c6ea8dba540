"""Integer kernels for int8, uint8 and int16 MAX_POOL_2D and AVERAGE_POOL_2D (NHWC, any
window, stride and padding), as the ops' integer references in :mod:`litegpu.ops.quantized`
compute them: the window's maximum, padding never winning; TFLite's builtin average, the
int32 sum of the window's real pixels divided by their count, rounded half away from
zero; both clamped to the fused activation's range. Input and output share their
quantization (the references refuse anything else). A task function over output rows.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from litegpu.backend import NodeContext

from .common import window_geometry
from .registry import bindable, kernel, named
from .tasks import bind_task, int8_pointer, int16_pointer, int32_pointer, task_function, uint8_pointer



# ip layout of :func:`_qpool_task`.
_N, _H, _W, _C, _OH, _OW, _FH, _FW, _SH, _SW, _PT, _PL, _MAX, _LO, _HI, _KIND, _ROWS = range(17)
_KINDS = {np.dtype(np.uint8): 0, np.dtype(np.int8): 1, np.dtype(np.int16): 2}
_PARALLEL_SIZE = 1 << 15         # outputs from which the rows are cut into several tasks


@njit(cache=True, inline="always")
def _pool_rows(x, out, acc, a0, ip, r0, r1):   # pragma: no cover - compiled
    """Output rows ``r0 .. r1`` (image-major) of the pool, ``acc[a0:]`` C int32 sums or
    maxima; the channel loops vectorize."""
    h, w, c_size, oh_size, ow_size = ip[_H], ip[_W], ip[_C], ip[_OH], ip[_OW]
    fh, fw, sh, sw, pt, pl, is_max = ip[_FH], ip[_FW], ip[_SH], ip[_SW], ip[_PT], ip[_PL], ip[_MAX]
    lo, hi = np.int32(ip[_LO]), np.int32(ip[_HI])
    for r in range(r0, r1):
        n, oh = r // oh_size, r % oh_size
        h0 = oh * sh - pt
        hs, he = max(h0, 0), min(h0 + fh, h)
        for ow in range(ow_size):
            w0 = ow * sw - pl
            ws, we = max(w0, 0), min(w0 + fw, w)
            start = np.int32(-32768) if is_max else np.int32(0)
            for c in range(c_size):
                acc[a0 + c] = start
            for iy in range(hs, he):
                for ix in range(ws, we):
                    at = ((n * h + iy) * w + ix) * c_size
                    if is_max:
                        for c in range(c_size):
                            acc[a0 + c] = max(acc[a0 + c], np.int32(x[at + c]))
                    else:
                        for c in range(c_size):
                            acc[a0 + c] += np.int32(x[at + c])
            count = np.int32(max((he - hs) * (we - ws), 1))
            half = count // 2
            at = (r * ow_size + ow) * c_size
            for c in range(c_size):
                v = acc[a0 + c]
                if not is_max:
                    v = (v + half) // count if v > 0 else -((half - v) // count)
                out[at + c] = min(max(v, lo), hi)


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
    tasks = min(rows, 8) if rows * ow * c >= _PARALLEL_SIZE else 1
    per = max(1, -(-rows // max(tasks, 1)))
    tasks = max(1, -(-rows // per))
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
