"""Pooling: MAX_POOL_2D and AVERAGE_POOL_2D in numba kernels (NHWC, any window, stride
and padding). Padded pixels never win a max and are not counted in an average, as in
TFLite (but see :func:`litegpu.ops.nn.pool_divisor_is_window`). NaN and infinities come
out as from the kernel LiteRT runs (``litert_kernel``, "NaN in pools" in
:mod:`litegpu.ops.nn`): XNNPACK's max pool has its own kernel (:func:`xnn_max_pool2d`)."""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from litegpu.backend import NodeContext
from litegpu.ops.nn import builtin_pool_range, pool_divisor_is_window, xnn_max_pool_passes

from .common import all_float32, clamp_bounds, window_geometry
from .registry import kernel

_LOWEST = np.float32(np.finfo(np.float32).min)


@njit(cache=True, parallel=True)
def pool2d(x, out, fh, fw, sh, sw, pt, pl, is_max, lo, hi, whole_window, nan_to_lo):
    """Max (``is_max``: a NaN never wins, from the lowest float, as TFLite's kernel) or
    average over each window's real pixels (over the whole window with
    ``whole_window``), clamped to [lo, hi]: a NaN passes the clamp, or becomes ``lo``
    with ``nan_to_lo`` (XNNPACK's clamp). Parallel over output rows; the channel loop
    vectorizes."""
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
                    acc[c] = _LOWEST
                for ih in range(hs, he):
                    for iw in range(ws, we):
                        for c in range(c_size):
                            v = x[n, ih, iw, c]
                            acc[c] = v if acc[c] < v else acc[c]
            else:
                for c in range(c_size):
                    acc[c] = 0.0
                for ih in range(hs, he):
                    for iw in range(ws, we):
                        for c in range(c_size):
                            acc[c] += x[n, ih, iw, c]
                count = np.float32(fh * fw if whole_window else max((he - hs) * (we - ws), 1))
                for c in range(c_size):
                    acc[c] = acc[c] / count
            for c in range(c_size):
                v = acc[c]
                if nan_to_lo:
                    v = v if v > lo else lo
                    out[n, oh, ow, c] = v if v < hi else hi
                else:
                    v = lo if v < lo else v
                    out[n, oh, ow, c] = hi if v > hi else v


@njit(inline="always")
def _x86_max(a, b):
    """x86's ``maxps(a, b)``: ``b`` whenever either is NaN."""
    return a if a > b else b


@njit(inline="always")
def _tap(x, n, y0, x0, tap):
    """The channels of window tap ``tap`` (ky, kx) of the window at (y0, x0), its
    coordinates clamped into the image as XNNPACK's are."""
    iy = min(max(y0 + tap[0], 0), x.shape[1] - 1)
    ix = min(max(x0 + tap[1], 0), x.shape[2] - 1)
    return x[n, iy, ix]


@njit(cache=True, parallel=True)
def xnn_max_pool2d(x, out, passes, sh, sw, pt, pl, lo, hi):
    """XNNPACK's max pool, NaN and all: ``passes`` [P, 9, 2] of taps (ky, kx), read at
    coordinates clamped into the image and folded by the tree of
    :func:`litegpu.ops.nn.xnn_max9` with x86's max; the first pass clamped
    ``min(max(m, lo), hi)``, each later one ``min(max(acc, m), hi)``."""
    c_size = x.shape[3]
    n_size, oh_size, ow_size = out.shape[0], out.shape[1], out.shape[2]
    n_pass = passes.shape[0]
    for r in prange(n_size * oh_size):
        n = r // oh_size
        oh = r - n * oh_size
        for ow in range(ow_size):
            for p in range(n_pass):
                # each tap's channel row, so the channel loop reads contiguous memory
                y0, x0 = oh * sh - pt, ow * sw - pl
                t0 = _tap(x, n, y0, x0, passes[p, 0])
                t1 = _tap(x, n, y0, x0, passes[p, 1])
                t2 = _tap(x, n, y0, x0, passes[p, 2])
                t3 = _tap(x, n, y0, x0, passes[p, 3])
                t4 = _tap(x, n, y0, x0, passes[p, 4])
                t5 = _tap(x, n, y0, x0, passes[p, 5])
                t6 = _tap(x, n, y0, x0, passes[p, 6])
                t7 = _tap(x, n, y0, x0, passes[p, 7])
                t8 = _tap(x, n, y0, x0, passes[p, 8])
                for c in range(c_size):
                    v0, v1, v2, v3, v4, v5, v6, v7, v8 = t0[c], t1[c], t2[c], t3[c], t4[c], t5[c], t6[c], t7[c], t8[c]
                    m018 = _x86_max(_x86_max(v0, v1), v8)
                    m2345 = _x86_max(_x86_max(v2, v3), _x86_max(v4, v5))
                    m = _x86_max(m2345, _x86_max(m018, _x86_max(v6, v7)))
                    m = _x86_max(m, lo) if p == 0 else _x86_max(out[n, oh, ow, c], m)
                    out[n, oh, ow, c] = m if m < hi else hi


def _pool_factory(ctx: NodeContext, is_max: bool):
    if not all_float32(ctx) or len(ctx.inputs[0].shape) != 4:
        return None     # a rank-5 MAX_POOL_2D input runs in the reference
    attrs = ctx.attrs
    _, h, w, _ = ctx.inputs[0].shape
    fh, fw = attrs["filter"]
    sh, sw, _, _, pt, pl = window_geometry(attrs, h, w, fh, fw)
    kernel = attrs.get("litert_kernel", "builtin")
    lo, hi = clamp_bounds(attrs["activation"])
    if kernel == "xnnpack" and is_max:
        passes = np.array(xnn_max_pool_passes(fh, fw), np.int64)

        def run(inputs, outputs):
            xnn_max_pool2d(inputs[0], outputs[0], passes, sh, sw, pt, pl, lo, hi)
        return run
    if kernel == "builtin":
        lo, hi = (np.float32(b) for b in builtin_pool_range(attrs["activation"]))
    whole_window = pool_divisor_is_window(attrs)
    # A 1x1 max pool that XNNPACK runs as a clamp is its one tap: an average keeps its NaN.
    as_max = is_max and kernel != "xnnpack_clamp"
    nan_to_lo = kernel == "xnnpack" and not is_max

    def run(inputs, outputs):
        pool2d(inputs[0], outputs[0], fh, fw, sh, sw, pt, pl, as_max, lo, hi, whole_window, nan_to_lo)
    return run


@kernel("MAX_POOL_2D")
def max_pool2d(ctx: NodeContext):
    """MAX_POOL_2D."""
    return _pool_factory(ctx, True)


@kernel("AVERAGE_POOL_2D")
def average_pool2d(ctx: NodeContext):
    """AVERAGE_POOL_2D (the count excludes padding)."""
    return _pool_factory(ctx, False)
