"""Pooling: MAX_POOL_2D and AVERAGE_POOL_2D in numba kernels (NHWC, any window, stride
and padding). Padded pixels never win a max and are not counted in an average, as in
TFLite (but see :func:`litegpu.ops.nn.pool_divisor_is_window`). NaN and infinities come
out as from the kernel LiteRT runs (``litert_kernel``, "NaN in pools" in
:mod:`litegpu.ops.nn`). Where LiteRT runs XNNPACK's pools, so do these: its max pool
(:func:`_xnn_max_task`) and its average pool, whose sums and scale are XNNPACK's to the
bit (:func:`_xnn_avg_task`, the order in :mod:`.xnn_order`)."""
from __future__ import annotations

import numpy as np

from litegpu.backend import NodeContext
from litegpu.ops.nn import builtin_pool_range, pool_divisor_is_window, xnn_max_pool_passes

from ..jit import carray, njit
from .common import all_float32, clamp_bounds, window_geometry
from .registry import bindable, kernel
from .tasks import bind_task, int64_pointer, row_tasks, task_function
from .xnn_order import pool_passes, scale32, sum9

_LOWEST = np.float32(np.finfo(np.float32).min)
_F32, _I64 = np.dtype(np.float32), np.dtype(np.int64)
_U = np.uint64     # unsigned indices: numba adds no negative-index wraparound (which makes LLVM gather)


# ip layout of the row tasks (:func:`_builtin_pool_task`, :func:`_xnn_max_task`).
_ROWS, _CHUNK, _H, _W, _C, _OH, _OW, _FH, _FW, _SH, _SW, _PT, _PL, _IS_MAX, _WHOLE = range(15)
# Pools of at least this many outputs are cut into tasks over the threads.
_PARALLEL_SIZE = 1 << 14


@task_function()
def _builtin_pool_task(t, xp, accp, outp, _a3, _a4, _a5, _a6, _a7, ip, fp):
    """Output rows ``t * chunk ..`` (image-major) of a max (``ip[_IS_MAX]``: a NaN never
    wins, from the lowest float, as TFLite's kernel) or an average over each window's real
    pixels (over the whole window with ``ip[_WHOLE]``), clamped to ``fp`` [lo, hi] (a NaN
    passes the clamp): TFLite's builtin pools, and XNNPACK's 1x1 pool that is a clamp.
    ``acc``: C floats per task; the channel loops vectorize."""
    h, w, c_size, oh_size, ow_size = ip[_H], ip[_W], ip[_C], ip[_OH], ip[_OW]
    fh, fw, sh, sw, pt, pl = ip[_FH], ip[_FW], ip[_SH], ip[_SW], ip[_PT], ip[_PL]
    lo, hi = fp[0], fp[1]
    acc = t * c_size
    for r in range(t * ip[_CHUNK], min(ip[_ROWS], (t + 1) * ip[_CHUNK])):
        n, oh = r // oh_size, r % oh_size
        h0 = oh * sh - pt
        hs, he = max(h0, 0), min(h0 + fh, h)
        for ow in range(ow_size):
            w0 = ow * sw - pl
            ws, we = max(w0, 0), min(w0 + fw, w)
            if ip[_IS_MAX]:
                for c in range(c_size):
                    accp[acc + c] = _LOWEST
                for ih in range(hs, he):
                    for iw in range(ws, we):
                        at = ((n * h + ih) * w + iw) * c_size
                        for c in range(c_size):
                            v = xp[at + c]
                            accp[acc + c] = v if accp[acc + c] < v else accp[acc + c]
            else:
                for c in range(c_size):
                    accp[acc + c] = 0.0
                for ih in range(hs, he):
                    for iw in range(ws, we):
                        at = ((n * h + ih) * w + iw) * c_size
                        for c in range(c_size):
                            accp[acc + c] += xp[at + c]
                count = np.float32(fh * fw if ip[_WHOLE] else max((he - hs) * (we - ws), 1))
                for c in range(c_size):
                    accp[acc + c] = accp[acc + c] / count
            dst = (r * ow_size + ow) * c_size
            for c in range(c_size):
                v = accp[acc + c]
                v = lo if v < lo else v
                outp[dst + c] = hi if v > hi else v


@njit(inline="always")
def _x86_max(a, b):
    """x86's ``maxps(a, b)``: ``b`` whenever either is NaN."""
    return a if a > b else b


@njit(inline="always")
def _tap_at(ip, n, y0, x0, ky, kx):
    """The index of the first channel of window tap (ky, kx) of the window at (y0, x0), its
    coordinates clamped into the image as XNNPACK's are."""
    iy = min(max(y0 + ky, 0), ip[_H] - 1)
    ix = min(max(x0 + kx, 0), ip[_W] - 1)
    return ((n * ip[_H] + iy) * ip[_W] + ix) * ip[_C]


@task_function()
def _xnn_max_task(t, xp, passesp, outp, _a3, _a4, _a5, _a6, _a7, ip, fp):
    """Output rows ``t * chunk ..`` of XNNPACK's max pool, NaN and all: ``passes`` [P, 9, 2]
    of taps (ky, kx; ``ip[_FH]`` holds P), read at coordinates clamped into the image and
    folded by the tree of :func:`litegpu.ops.nn.xnn_max9` with x86's max; the first pass
    clamped ``min(max(m, lo), hi)``, each later one ``min(max(acc, m), hi)``."""
    passes = int64_pointer(passesp)
    c_size, oh_size, ow_size = ip[_C], ip[_OH], ip[_OW]
    sh, sw, pt, pl, n_pass = ip[_SH], ip[_SW], ip[_PT], ip[_PL], ip[_FH]
    lo, hi = fp[0], fp[1]
    for r in range(t * ip[_CHUNK], min(ip[_ROWS], (t + 1) * ip[_CHUNK])):
        n, oh = r // oh_size, r % oh_size
        y0 = oh * sh - pt
        for ow in range(ow_size):
            x0 = ow * sw - pl
            dst = (r * ow_size + ow) * c_size
            for p in range(n_pass):
                q = p * 18
                t0 = _tap_at(ip, n, y0, x0, passes[q], passes[q + 1])
                t1 = _tap_at(ip, n, y0, x0, passes[q + 2], passes[q + 3])
                t2 = _tap_at(ip, n, y0, x0, passes[q + 4], passes[q + 5])
                t3 = _tap_at(ip, n, y0, x0, passes[q + 6], passes[q + 7])
                t4 = _tap_at(ip, n, y0, x0, passes[q + 8], passes[q + 9])
                t5 = _tap_at(ip, n, y0, x0, passes[q + 10], passes[q + 11])
                t6 = _tap_at(ip, n, y0, x0, passes[q + 12], passes[q + 13])
                t7 = _tap_at(ip, n, y0, x0, passes[q + 14], passes[q + 15])
                t8 = _tap_at(ip, n, y0, x0, passes[q + 16], passes[q + 17])
                for c in range(c_size):
                    m018 = _x86_max(_x86_max(xp[t0 + c], xp[t1 + c]), xp[t8 + c])
                    m2345 = _x86_max(_x86_max(xp[t2 + c], xp[t3 + c]), _x86_max(xp[t4 + c], xp[t5 + c]))
                    m = _x86_max(m2345, _x86_max(m018, _x86_max(xp[t6 + c], xp[t7 + c])))
                    m = _x86_max(m, lo) if p == 0 else _x86_max(outp[dst + c], m)
                    outp[dst + c] = m if m < hi else hi


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


# Windows up to this many taps get XNNPACK's pass tables (18 int64 per 9 taps); a larger one
# (a hostile file's 2**29-row filter on a 10-row input) takes the builtin kernel's clipped
# window, whose memory does not grow with the filter.
_XNN_MAX_TAPS = 1 << 16


def _pool_factory(ctx: NodeContext, is_max: bool):
    if not all_float32(ctx) or len(ctx.inputs[0].shape) != 4:
        return None     # a rank-5 MAX_POOL_2D input runs in the reference
    attrs = ctx.attrs
    _, h, w, _ = ctx.inputs[0].shape
    fh, fw = attrs["filter"]
    sh, sw, _, _, pt, pl = window_geometry(attrs, h, w, fh, fw)
    kernel = attrs.get("litert_kernel", "builtin")
    lo, hi = clamp_bounds(attrs["activation"])
    n, h, w, c = ctx.inputs[0].shape
    _, oh, ow, _ = ctx.outputs[0].shape
    tasks, chunk = row_tasks(n * oh, n * oh * ow * c, _PARALLEL_SIZE)
    if kernel == "xnnpack" and fh * fw > _XNN_MAX_TAPS:
        kernel = "builtin"
    if kernel == "xnnpack" and is_max:
        passes = np.ascontiguousarray(np.array(xnn_max_pool_passes(fh, fw), np.int64).reshape(-1))
        params = np.array([n * oh, chunk, h, w, c, oh, ow, passes.size // 18, fw, sh, sw, pt, pl, 1, 0], np.int64)
        floats = np.array([lo, hi], np.float32)
        return bindable(lambda inputs, outputs: bind_task(_xnn_max_task, tasks, (inputs[0], passes), (outputs[0],),
                                                          params, floats, dtypes=(_F32, _I64, _F32)))
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

    params = np.array([n * oh, chunk, h, w, c, oh, ow, fh, fw, sh, sw, pt, pl, as_max, whole_window], np.int64)
    floats = np.array([lo, hi], np.float32)
    acc = np.empty(tasks * max(c, 1), np.float32)
    return bindable(lambda inputs, outputs: bind_task(_builtin_pool_task, tasks, (inputs[0], acc), (outputs[0],),
                                                      params, floats))


@kernel("MAX_POOL_2D")
def max_pool2d(ctx: NodeContext):
    """MAX_POOL_2D."""
    return _pool_factory(ctx, True)


@kernel("AVERAGE_POOL_2D")
def average_pool2d(ctx: NodeContext):
    """AVERAGE_POOL_2D (the count excludes padding)."""
    return _pool_factory(ctx, False)
