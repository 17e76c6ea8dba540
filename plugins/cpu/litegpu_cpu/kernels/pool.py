"""Pooling: MAX_POOL_2D and AVERAGE_POOL_2D in numba kernels (NHWC, any window, stride
and padding). Padded pixels never win a max and are not counted in an average, as in
TFLite (but see :func:`litegpu.ops.nn.pool_divisor_is_window`). NaN and infinities come
out as from the kernel LiteRT runs (``litert_kernel``, "NaN in pools" in
:mod:`litegpu.ops.nn`). Where LiteRT runs XNNPACK's pools, so do these: its max pool
(:func:`xnn_max_pool2d`) and its average pool, whose sums and scale are XNNPACK's to the
bit (:func:`_xnn_avg_task`, the order in :mod:`.xnn_order`)."""
from __future__ import annotations

import numpy as np
from numba import carray, njit, prange

from litegpu.backend import NodeContext
from litegpu.ops.nn import builtin_pool_range, pool_divisor_is_window, xnn_max_pool_passes

from .common import all_float32, clamp_bounds, window_geometry
from .registry import bindable, kernel
from .tasks import bind_task, task_function
from .xnn_order import pool_passes, scale32, sum9

_LOWEST = np.float32(np.finfo(np.float32).min)
_U = np.uint64     # unsigned indices: numba adds no negative-index wraparound (which makes LLVM gather)


@njit(cache=True, parallel=True)
def pool2d(x, out, fh, fw, sh, sw, pt, pl, is_max, lo, hi, whole_window):
    """Max (``is_max``: a NaN never wins, from the lowest float, as TFLite's kernel) or
    average over each window's real pixels (over the whole window with
    ``whole_window``), clamped to [lo, hi] (a NaN passes the clamp): TFLite's builtin
    pools, and XNNPACK's 1x1 pool that is a clamp. Parallel over output rows; the channel
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


@njit(cache=True, inline="always")
def _sum_inside(x, a, c):
    """One pass of taps, all inside the image: their sum (:func:`.xnn_order.sum9`) in
    channel ``c``, tap ``i`` at ``x[a[i] + c]``."""
    c = _U(c)
    return sum9(x[a[0] + c], x[a[1] + c], x[a[2] + c], x[a[3] + c], x[a[4] + c], x[a[5] + c], x[a[6] + c],
                x[a[7] + c], x[a[8] + c])


@njit(cache=True, inline="always")
def _sum_some(x, a, inside, c):
    """:func:`_sum_inside` where tap ``i`` adds 0 unless ``inside[i]`` (``a[i]`` then a valid
    pixel all the same, so that the loads vectorize)."""
    z = np.float32(0)
    c = _U(c)
    return sum9(x[a[0] + c] if inside[0] else z, x[a[1] + c] if inside[1] else z, x[a[2] + c] if inside[2] else z,
                x[a[3] + c] if inside[3] else z, x[a[4] + c] if inside[4] else z, x[a[5] + c] if inside[5] else z,
                x[a[6] + c] if inside[6] else z, x[a[7] + c] if inside[7] else z, x[a[8] + c] if inside[8] else z)


@njit(cache=True, inline="always")
def _avg_tap(passes, p, i, n, y0, x0, h, w, c_size):
    """Where tap ``i`` of pass ``p`` (:func:`_xnn_avg_task`) of the window at (y0, x0) starts
    in the flat input, clamped into the image, and whether it is a tap inside the image."""
    ky, kx = passes[18 * p + 2 * i], passes[18 * p + 2 * i + 1]
    iy, ix = y0 + ky, x0 + kx
    inside = ky >= 0 and 0 <= iy < h and 0 <= ix < w
    return _U(((n * h + min(max(iy, 0), h - 1)) * w + min(max(ix, 0), w - 1)) * c_size), inside


@njit(cache=True, inline="always")
def _clamp_x86(v, lo, hi):
    """``min(max(v, lo), hi)`` with x86's max and min (XNNPACK's clamp: a NaN becomes ``lo``)."""
    v = v if v > lo else lo
    return v if v < hi else hi


@njit(cache=True, inline="always")
def _pass_some(x, a, inside, o, first):
    """One pass of taps into ``o``, tap ``i`` adding 0 unless ``inside[i]``: ``o + sum``, or
    ``0 + sum`` in the ``first`` pass."""
    if first:
        for c in range(o.size):
            o[c] = np.float32(0) + _sum_some(x, a, inside, c)
    else:
        for c in range(o.size):
            o[c] = o[c] + _sum_some(x, a, inside, c)


@task_function()
def _xnn_avg_task(t, xp, outp, _a2, _a3, _a4, _a5, _a6, _a7, ip, fp):
    """Output row ``t`` of XNNPACK's average pool (``xnn_f32_avgpool_minmax_ukernel_9p``):
    each pixel's window in passes of nine taps (``ip`` after the geometry: the passes'
    (ky, kx), -1 for a zero; :func:`.xnn_order.pool_passes`), a tap outside the image
    adding 0; each pass summed by :func:`.xnn_order.sum9` and added to the running sum
    (from 0, kept in the output between passes); then times ``1 / count`` (the window's
    real pixels with SAME padding, else the whole window) and :func:`_clamp_x86`. The
    channel loops vectorize; a window of one pass inside the image takes loads without
    selects, in one loop; other windows sum each pass, then scale and clamp in a loop of
    their own (a loop for each case made the cold compile 3.9 s instead of 2.5, for no
    measured gain)."""
    q = carray(ip, 13)
    n_size, h, w, c_size, oh_size, ow_size, fh, fw, sh, sw, pt, pl, pixelwise = \
        q[0], q[1], q[2], q[3], q[4], q[5], q[6], q[7], q[8], q[9], q[10], q[11], q[12]
    n_pass = carray(ip, 14)[13]
    passes = carray(ip, 14 + 18 * n_pass)[14:]
    x = carray(xp, n_size * h * w * c_size)
    out = carray(outp, n_size * oh_size * ow_size * c_size)
    lo, hi = fp[0], fp[1]
    n = t // oh_size
    oh = t - n * oh_size
    y0 = oh * sh - pt
    rows = min(y0 + fh, h) - max(y0, 0)
    whole = scale32(fh * fw)
    for ow in range(ow_size):
        x0 = ow * sw - pl
        scale = scale32(rows * (min(x0 + fw, w) - max(x0, 0))) if pixelwise else whole
        ob = (t * ow_size + ow) * c_size
        for p in range(n_pass):
            a0, i0 = _avg_tap(passes, p, 0, n, y0, x0, h, w, c_size)
            a1, i1 = _avg_tap(passes, p, 1, n, y0, x0, h, w, c_size)
            a2, i2 = _avg_tap(passes, p, 2, n, y0, x0, h, w, c_size)
            a3, i3 = _avg_tap(passes, p, 3, n, y0, x0, h, w, c_size)
            a4, i4 = _avg_tap(passes, p, 4, n, y0, x0, h, w, c_size)
            a5, i5 = _avg_tap(passes, p, 5, n, y0, x0, h, w, c_size)
            a6, i6 = _avg_tap(passes, p, 6, n, y0, x0, h, w, c_size)
            a7, i7 = _avg_tap(passes, p, 7, n, y0, x0, h, w, c_size)
            a8, i8 = _avg_tap(passes, p, 8, n, y0, x0, h, w, c_size)
            a = (a0, a1, a2, a3, a4, a5, a6, a7, a8)
            ins = (i0, i1, i2, i3, i4, i5, i6, i7, i8)
            every = i0 and i1 and i2 and i3 and i4 and i5 and i6 and i7 and i8
            o = out[ob:ob + c_size]
            if every and n_pass == 1:           # the common case, in one loop
                for c in range(c_size):
                    o[c] = _clamp_x86((np.float32(0) + _sum_inside(x, a, c)) * scale, lo, hi)
                continue
            _pass_some(x, a, ins, o, p == 0)
            if p == n_pass - 1:                 # the same roundings as XNNPACK's one expression
                for c in range(c_size):
                    o[c] = _clamp_x86(o[c] * scale, lo, hi)


def xnn_avg_pool_plan(x_shape, out_shape, fh, fw, sh, sw, pt, pl, pixelwise):
    """The task count (output rows) and int64 parameters of :func:`_xnn_avg_task`."""
    n, h, w, c = x_shape
    passes = pool_passes(fh, fw)
    params = (n, h, w, c, out_shape[1], out_shape[2], fh, fw, sh, sw, pt, pl, int(pixelwise), len(passes))
    return n * out_shape[1], np.concatenate([np.array(params, np.int64), passes.reshape(-1)])


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
    if kernel == "xnnpack":      # an average pool (a max pool returned above)
        # SAME: the real pixels of each window; VALID: the whole window (XNNPACK's avgpool
        # counts a window past the input's end in full).
        x_shape, out_shape = tuple(ctx.inputs[0].shape), tuple(ctx.outputs[0].shape)
        tasks, params = xnn_avg_pool_plan(x_shape, out_shape, fh, fw, sh, sw, pt, pl, attrs["padding"] == "SAME")
        floats = np.array([lo, hi], np.float32)

        def bind(inputs, outputs):
            x, out = inputs[0], outputs[0]
            if x.shape != x_shape or out.shape != out_shape:
                raise ValueError(f"average pool built for input {x_shape} and output {out_shape}, "
                                 f"given {x.shape} and {out.shape}")
            return bind_task(_xnn_avg_task, tasks, (x,), (out,), params, floats)
        return bindable(bind)
    if kernel == "builtin":
        lo, hi = (np.float32(b) for b in builtin_pool_range(attrs["activation"]))
    whole_window = pool_divisor_is_window(attrs)
    # A 1x1 max pool that XNNPACK runs as a clamp is its one tap: an average keeps its NaN.
    as_max = is_max and kernel != "xnnpack_clamp"

    def run(inputs, outputs):
        pool2d(inputs[0], outputs[0], fh, fw, sh, sw, pt, pl, as_max, lo, hi, whole_window)
    return run


@kernel("MAX_POOL_2D")
def max_pool2d(ctx: NodeContext):
    """MAX_POOL_2D."""
    return _pool_factory(ctx, True)


@kernel("AVERAGE_POOL_2D")
def average_pool2d(ctx: NodeContext):
    """AVERAGE_POOL_2D (the count excludes padding)."""
    return _pool_factory(ctx, False)
