"""Pooling: MAX_POOL_2D and AVERAGE_POOL_2D in one numba kernel (NHWC, any window,
stride and padding). Padded pixels never win a max and are not counted in an average,
as in TFLite (but see :func:`litegpu.ops.nn.pool_divisor_is_window`)."""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from litegpu.backend import NodeContext
from litegpu.ops.nn import pool_divisor_is_window

from .common import all_float32, clamp_bounds, window_geometry
from .registry import kernel


@njit(cache=True, parallel=True)
def pool2d(x, out, fh, fw, sh, sw, pt, pl, is_max, lo, hi, whole_window):
    """Max (``is_max``) or average over each window's real pixels (over the whole window
    with ``whole_window``), clamped to [lo, hi]. Parallel over output rows; the channel
    loop vectorizes."""
    h, w, c_size = x.shape[1], x.shape[2], x.shape[3]
    n_size, oh_size, ow_size = out.shape[0], out.shape[1], out.shape[2]
    for r in prange(n_size * oh_size):
        n = r // oh_size
        oh = r - n * oh_size
        acc = np.empty(c_size, np.float32)
        h0 = oh * sh - pt
        hs, he = max(h0, 0), min(h0 + fh, h)
        for ow in range(ow_size):
            w0 = ow * sw - pl
            ws, we = max(w0, 0), min(w0 + fw, w)
            if is_max:
                for c in range(c_size):
                    acc[c] = -np.inf
                for ih in range(hs, he):
                    for iw in range(ws, we):
                        for c in range(c_size):
                            acc[c] = max(acc[c], x[n, ih, iw, c])
                for c in range(c_size):
                    out[n, oh, ow, c] = min(max(acc[c], lo), hi)
            else:
                for c in range(c_size):
                    acc[c] = 0.0
                for ih in range(hs, he):
                    for iw in range(ws, we):
                        for c in range(c_size):
                            acc[c] += x[n, ih, iw, c]
                count = np.float32(fh * fw if whole_window else max((he - hs) * (we - ws), 1))
                for c in range(c_size):
                    out[n, oh, ow, c] = min(max(acc[c] / count, lo), hi)


def _pool_factory(ctx: NodeContext, is_max: bool):
    if not all_float32(ctx) or len(ctx.inputs[0].shape) != 4:
        return None     # a rank-5 MAX_POOL_2D input runs in the reference
    attrs = ctx.attrs
    _, h, w, _ = ctx.inputs[0].shape
    fh, fw = attrs["filter"]
    sh, sw, _, _, pt, pl = window_geometry(attrs, h, w, fh, fw)
    lo, hi = clamp_bounds(attrs["activation"])
    whole_window = pool_divisor_is_window(attrs)

    def run(inputs, outputs):
        pool2d(inputs[0], outputs[0], fh, fw, sh, sw, pt, pl, is_max, lo, hi, whole_window)
    return run


@kernel("MAX_POOL_2D")
def max_pool2d(ctx: NodeContext):
    """MAX_POOL_2D."""
    return _pool_factory(ctx, True)


@kernel("AVERAGE_POOL_2D")
def average_pool2d(ctx: NodeContext):
    """AVERAGE_POOL_2D (the count excludes padding)."""
    return _pool_factory(ctx, False)
