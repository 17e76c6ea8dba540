"""Integer kernels for int8 / uint8 MAX_POOL_2D and AVERAGE_POOL_2D (NHWC, any window,
stride and padding), as the ops' integer references in :mod:`litegpu.ops.quantized`
compute them: the window's maximum, padding never winning; TFLite's builtin average, the
int32 sum of the window's real pixels divided by their count, rounded half away from
zero; both clamped to the fused activation's range. Input and output share their
quantization (the references refuse anything else). int16 keeps the reference.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from litegpu.backend import NodeContext

from .common import window_geometry
from .registry import bindable, kernel, named

_BYTES = (np.dtype(np.int8), np.dtype(np.uint8))


@njit(cache=True, parallel=True)
def _qpool(x, out, fh, fw, sh, sw, pt, pl, is_max, lo, hi):   # pragma: no cover - compiled
    """Parallel over output rows; the channel loop vectorizes."""
    h, w, c_size = x.shape[1], x.shape[2], x.shape[3]
    n_size, oh_size, ow_size = out.shape[0], out.shape[1], out.shape[2]
    for r in prange(n_size * oh_size):
        n = r // oh_size
        oh = r - n * oh_size
        acc = np.empty(c_size, np.int32)
        h0 = oh * sh - pt
        hs, he = max(h0, 0), min(h0 + fh, h)
        for ow in range(ow_size):
            w0 = ow * sw - pl
            ws, we = max(w0, 0), min(w0 + fw, w)
            start = np.int32(-32768) if is_max else np.int32(0)
            for c in range(c_size):
                acc[c] = start
            for iy in range(hs, he):
                for ix in range(ws, we):
                    for c in range(c_size):
                        v = np.int32(x[n, iy, ix, c])
                        acc[c] = max(acc[c], v) if is_max else acc[c] + v
            count = np.int32(max((he - hs) * (we - ws), 1))
            half = count // 2
            for c in range(c_size):
                v = acc[c]
                if not is_max:
                    v = (v + half) // count if v > 0 else -((half - v) // count)
                out[n, oh, ow, c] = min(max(v, lo), hi)


def _qpool_factory(ctx: NodeContext, is_max: bool):
    x = ctx.inputs[0]
    if len(x.shape) != 4 or np.dtype(x.dtype) not in _BYTES or "clamp" not in ctx.attrs:
        return None
    fh, fw = ctx.attrs["filter"]
    _, h, w, _ = x.shape
    sh, sw, _, _, pt, pl = window_geometry(ctx.attrs, h, w, fh, fw)
    lo, hi = (np.int32(b) for b in ctx.attrs["clamp"])
    args = (fh, fw, sh, sw, pt, pl, is_max, lo, hi)

    def bind(inputs, outputs):
        xs, ys = inputs[0], outputs[0]
        return lambda: _qpool(xs, ys, *args)
    return named(bindable(bind), f"int8 {'max' if is_max else 'average'} pool {fh}x{fw}/{sh}")


@kernel("MAX_POOL_2D", quantized=True)
def quantized_max_pool2d(ctx: NodeContext):
    """See the module docstring."""
    return _qpool_factory(ctx, True)


@kernel("AVERAGE_POOL_2D", quantized=True)
def quantized_average_pool2d(ctx: NodeContext):
    """See the module docstring."""
    return _qpool_factory(ctx, False)
