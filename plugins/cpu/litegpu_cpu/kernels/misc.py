"""GEMM-shaped ops through BLAS (FULLY_CONNECTED, BATCH_MATMUL), reductions, SOFTMAX,
RESIZE_BILINEAR (numba) and CONCATENATION.

Everything shape-dependent (axes, slices, index tables, scratch) is worked out in the
factory; ``run`` only calls numpy/numba on the arrays it is handed.
"""
from __future__ import annotations

from functools import partial

import numpy as np

from litegpu.backend import NodeContext
from litegpu.ops.nn import bilinear_axis
from litegpu.ops.reduce import one_run, without_unit_reductions, x86_extreme

from ..jit import carray, njit
from .common import F32, activation_in_place, all_float32, clamp_bounds, optional_input
from . import gemm, gemv
from .mathfn import exp_sum32, fma32, row_range32, sum64, xnn_exp_nonpositive32
from . import xnn_order
from .xnn_order import madd, radd_avx512f, rsum2_avx512f, rsum_avx512f
from .packed import batched_product, fits, pack as gemm_panels, packed_matmul
from .registry import bindable, kernel
from .shared_weights import shared_packing
from .tasks import ARRAYS, advanced, bind_task, int64_pointer, row_tasks, task_function, uint8_pointer
from .threads import current as current_threads, ensure_gemm_policy


# -- FULLY_CONNECTED / BATCH_MATMUL -------------------------------------------------------------

def constant_product(m: int, k: int, w_ok: np.ndarray, bias: np.ndarray, activation: str):
    """For a product with a constant weight, ``bind(x [M, K], out [M, O]) -> call``
    computing ``out = clamp(x @ w_ok.T + bias)`` in one task function: the GEMV
    (:mod:`.gemv`) for a few rows, else the packed GEMM (:mod:`.packed`) where it fits;
    None otherwise, for the caller's BLAS path (:func:`.gemm.bind_matmul`, bias and clamp
    fused). Both take W in one packing, made once for every node reading it (a decoder's
    prefill runs the GEMM and its decode steps the GEMV on the same weights)."""
    if m > gemv.MAX_ROWS and not fits(m, w_ok.shape[0]):
        return None
    held = shared_packing("f32", (w_ok,), (), lambda: gemm_panels(w_ok.T))
    if m <= gemv.MAX_ROWS:
        bind = gemv.gemv(m, k, w_ok, bias, activation, packed=held.value)
    else:
        product = packed_matmul(w_ok.T, bias, *clamp_bounds(activation), m, packed=held.value)
        if product is None:
            return None
        bind = product.bind
    return lambda x, out, held=held: bind(x, out)


@kernel("FULLY_CONNECTED")
def fully_connected(ctx: NodeContext):
    """``out = x.reshape(-1, K) @ W^T + bias`` with the activation in place."""
    w_spec = ctx.inputs[1]
    if not all_float32(ctx, (0, 1)) or len(w_spec.shape) != 2:
        return None
    bias_spec = optional_input(ctx, 2)
    if bias_spec is not None and np.dtype(bias_spec.dtype) != F32:
        return None
    o, k = w_spec.shape
    m = int(np.prod(ctx.inputs[0].shape)) // k
    ensure_gemm_policy()
    act = activation_in_place(ctx.attrs["activation"])
    # W is [O, K] row-major, so W.T is a column-major [K, O]: BLAS reads it transposed for free,
    # and for one row (a GEMV) that layout is the faster one.
    wt = None if w_spec.value is None else np.ascontiguousarray(w_spec.value, dtype=F32).T
    bias = None
    if bias_spec is not None and bias_spec.value is not None:
        bias = np.ascontiguousarray(bias_spec.value, dtype=F32)
    has_bias = bias_spec is not None
    if wt is not None and (bias is not None or not has_bias):
        bias = bias if bias is not None else np.zeros(o, F32)
        product = constant_product(m, k, np.asarray(w_spec.value, dtype=F32), bias, ctx.attrs["activation"])
        if product is not None:
            return bindable(lambda inputs, outputs: product(inputs[0].reshape(m, k), outputs[0].reshape(m, o)))
        how = gemm.plan(m, o, k)
        w_rows = wt.T   # W itself, [O, K] C-contiguous: the GEMM reads it transposed
        epilogue = (bias, *clamp_bounds(ctx.attrs["activation"]))
        return bindable(lambda inputs, outputs: gemm.bind_matmul(
            inputs[0].reshape(m, k), w_rows, outputs[0].reshape(m, o), how, True, epilogue))

    # np.dot takes the 2-D BLAS path with less overhead than np.matmul (same GEMM, same
    # results); it matters for the one-row FCs of recurrent cells and small MLPs.
    def bind(inputs, outputs):
        out2 = outputs[0].reshape(m, o)
        x2 = inputs[0].reshape(m, k)
        w2 = inputs[1].T if wt is None else wt
        b = (inputs[2] if bias is None else bias) if has_bias else None
        if b is None and act is None:
            return partial(np.dot, x2, w2, out2)

        def call():
            np.dot(x2, w2, out=out2)
            if b is not None:
                np.add(out2, b, out=out2)
            if act is not None:
                act(out2)
        return call
    return bindable(bind)


@kernel("BATCH_MATMUL")
def batch_matmul(ctx: NodeContext):
    """The product over the last two axes (adj_x / adj_y transposing them, batch
    dimensions broadcast): the float GEMM's tiles on B packed as it runs (one batch shape,
    at least MR rows: :func:`.packed.batched_product`), else one OpenBLAS call per batch
    over the plan's threads (:func:`.gemm.batched_matmul`), else np.matmul on transposed
    views."""
    if not all_float32(ctx, (0, 1)):
        return None
    adj_x, adj_y = bool(ctx.attrs.get("adj_x")), bool(ctx.attrs.get("adj_y"))
    a_shape, b_shape = tuple(ctx.inputs[0].shape), tuple(ctx.inputs[1].shape)
    if not adj_x:     # B packed as it runs, the float GEMM's tiles (an attention in a prefill)
        if len(a_shape) > 2 and int(np.prod(b_shape[:-2], dtype=np.int64)) == 1:
            # One B for every batch of A (a KV group read by several query heads): XNNPACK's
            # one GEMM over A's rows stacked, each output still one chain over K.
            a_shape, b_shape = (1, int(np.prod(a_shape[:-1], dtype=np.int64)), a_shape[-1]), (1, *b_shape[-2:])
        tiled = batched_product(a_shape, b_shape, adj_y, current_threads())
        if tiled is not None:
            return bindable(lambda inputs, outputs: tiled(inputs[0].reshape(a_shape), inputs[1].reshape(b_shape),
                                                          outputs[0].reshape(a_shape[:-1] + (-1,))))
    ensure_gemm_policy()
    batched = gemm.batched_matmul(tuple(ctx.inputs[0].shape), tuple(ctx.inputs[1].shape), adj_x, adj_y)
    if batched is not None:
        return bindable(lambda inputs, outputs: batched(inputs[0], inputs[1], outputs[0]))

    def run(inputs, outputs):
        a, b = inputs[0], inputs[1]
        if adj_x:
            a = np.swapaxes(a, -1, -2)
        if adj_y:
            b = np.swapaxes(b, -1, -2)
        np.matmul(a, b, out=outputs[0])
    return run


# -- reductions ---------------------------------------------------------------------------------

def _reduce_axes(ctx: NodeContext) -> tuple[int, ...] | None:
    """The constant reduction axes, normalized and deduplicated, or None when unknown/invalid."""
    spec = optional_input(ctx, 1)
    if spec is None or spec.value is None:
        return None
    rank = len(ctx.inputs[0].shape)
    axes = set()
    for a in np.asarray(spec.value).reshape(-1).tolist():
        if not -rank <= a < rank:
            return None
        axes.add(int(a) % rank)
    return tuple(sorted(axes))


@task_function()
def _xnn_rdsum_task(t, xp, outp, _a2, _a3, _a4, _a5, _a6, _a7, ip, fp):
    """``out[a, b] = 0 + (sum_j x[a, j, b]) * scale`` over ``x`` [outer, p, inner] (``ip``:
    those three, then 1 to sum squares; ``fp``: the scale) as XNNPACK's
    ``xnn_f32_rdsum_ukernel_7p7x`` computes a MEAN or SUM whose last axis is kept (a
    spatial mean: squeeze-excite, the classifier head): float32 sums from 0 in the zeroed
    output, rows added in order (squares fused-multiply-added, as ``rdsum2`` does), the
    channel loop vectorized; then times the scale (:mod:`.xnn_order`). One thread: a
    parallel version took seconds to compile for a kernel of tens of microseconds."""
    outer, p, inner, squared = ip[0], ip[1], ip[2], ip[3]
    scale = fp[0]
    x = carray(xp, (outer, p, inner))
    out = carray(outp, (outer, inner))
    zero = np.float32(0)
    for a in range(outer):
        o = out[a]
        for b in range(inner):
            o[b] = zero
        for j in range(p):
            row = x[a, j]
            if squared:
                for b in range(inner):
                    o[b] = madd(row[b], row[b], o[b])
            else:
                for b in range(inner):
                    o[b] = row[b] + o[b]
        for b in range(inner):
            o[b] = zero + o[b] * scale


@task_function()
def _xnn_rsum_task(t, xp, outp, _a2, _a3, _a4, _a5, _a6, _a7, ip, fp):
    """``out[a] = 0 + (sum_j x[a, j]) * scale`` over ``x`` [outer, p] (``ip``: those two,
    then 1 to sum squares; ``fp``: the scale), each row summed as XNNPACK's AVX-512F
    ``xnn_f32_rsum_ukernel__avx512f_u32_acc2`` sums it (:func:`.xnn_order.rsum_avx512f`;
    squares as its ``rsum2`` kernel, :func:`.xnn_order.rsum2_avx512f`): a MEAN or SUM over
    the last axes (LayerNorm's rows) on a host where LiteRT runs that kernel."""
    outer, p, squared = ip[0], ip[1], ip[2]
    scale = fp[0]
    x = carray(xp, outer * p)
    for a in range(outer):
        total = rsum2_avx512f(x, a * p, p) if squared else rsum_avx512f(x, a * p, p)
        outp[a] = np.float32(0) + total * scale


@task_function(fastmath={"reassoc"})
def _row_sum64_task(t, xp, outp, _a2, _a3, _a4, _a5, _a6, _a7, ip, _fp):
    """``out[a] = sum_j x[a, j] / divisor`` over ``x`` [outer, p] (``ip``: those two, the
    divisor, then 1 to sum float32 squares), summed in float64 in any order (``reassoc``
    lets the sum run in vector lanes): a MEAN or SUM over the last axes (LayerNorm's rows)
    on a host where XNNPACK's row sum is not :func:`.xnn_order.rsum_avx512f`."""
    outer, p, squared = ip[0], ip[1], ip[3]
    divisor = np.float64(ip[2])
    x1 = carray(xp, (outer, p))
    for a in range(outer):
        total = 0.0
        if squared:
            for j in range(p):
                total += np.float64(x1[a, j] * x1[a, j])
        else:
            for j in range(p):
                total += x1[a, j]
        outp[a] = np.float32(total / divisor)


def _reducer(ufunc, mean: bool):
    def factory(ctx: NodeContext):
        if not all_float32(ctx):
            return None
        squared = int(bool(ctx.attrs.get("squared")))   # of x, folded from MUL(x, x) (fusion)
        axes = _reduce_axes(ctx)
        if axes is None:
            return None
        shape = ctx.inputs[0].shape
        count = int(np.prod([shape[i] for i in axes], dtype=np.int64))
        if count == 0:
            return None
        scale = np.float32(count)
        if ufunc is np.add:
            shape, axes = without_unit_reductions(shape, axes)
        contiguous = one_run(axes)
        if contiguous:
            # One run of axes: reduce the middle of an [outer, count, inner] view.
            outer = int(np.prod(shape[:axes[0]], dtype=np.int64))
            inner = int(np.prod(shape[axes[-1] + 1:], dtype=np.int64))
            view_in, view_out = (outer, count, inner), (outer, inner)
        if ufunc is np.add and contiguous:
            # LiteRT runs XNNPACK's sums (:mod:`.xnn_order`): times ``1.0f / count`` for a
            # mean; a channel sum unless the run ends at the last axis (a kept last axis
            # of size 1 too: XNNPACK merges adjacent axes, it drops no size-1 one; a
            # reduced one is a single pass, dropped above), else a row sum, XNNPACK's
            # where its lanes are the AVX-512F kernel's, else float64 in any order.
            xnn_scale = np.array([np.float32(1) / np.float32(count) if mean else 1], F32)
            if axes[-1] != len(shape) - 1:
                params = np.array([outer, count, inner, squared], np.int64)
                task = _xnn_rdsum_task
            elif xnn_order.RSUM_MATCHES_LITERT:
                params = np.array([outer, count, squared], np.int64)
                task = _xnn_rsum_task
            else:
                params = np.array([outer, count, count if mean else 1, squared], np.int64)
                task = _row_sum64_task

            def bind(inputs, outputs):
                return bind_task(task, 1, (inputs[0],), (outputs[0],), params, xnn_scale)
            return bindable(bind)
        if ufunc is np.add and xnn_order.RSUM_MATCHES_LITERT:
            return _xnn_runs_reducer(shape, axes, count, mean, squared)
        if contiguous:
            def reduce(x, out):
                ufunc.reduce(x.reshape(view_in), axis=1, out=out.reshape(view_out))
        else:
            def reduce(x, out):
                ufunc.reduce(np.square(x) if squared else x, axis=axes, keepdims=True,
                             out=out.reshape(tuple(1 if i in axes else d for i, d in enumerate(shape))))
        if ufunc in (np.maximum, np.minimum):
            reduce = _in_litert_order(reduce, axes, ufunc is np.maximum, bool(ctx.attrs.get("empty_infinite")))

        if mean:
            def run(inputs, outputs):
                out = outputs[0]
                reduce(inputs[0], out)
                np.divide(out, scale, out=out)
        else:
            def run(inputs, outputs):
                reduce(inputs[0], outputs[0])
        return run
    factory.__doc__ = f"{'Mean' if mean else ufunc.__name__} over constant axes into the output."
    return factory


def _xnn_runs_reducer(shape: tuple[int, ...], axes: tuple[int, ...], count: int, mean: bool, squared: int):
    """MEAN or SUM over axes in several runs (kept axes between them), in XNNPACK's order
    (``xnn_compute_contiguous_reduce`` / ``xnn_compute_discontiguous_reduce`` in
    ``src/operator-run.c``): the innermost run is summed as for one run, and the output
    accumulates those sums, times the scale, over the outer runs' positions in order. When
    the last axis is reduced that is the row sum's ``out += sum * scale``, one fused
    multiply-add; else the channel sum's, a product then a sum. The input is first laid
    out [kept before, outer reduced, innermost run (, kept after)], a copy."""
    rank = len(shape)
    runs: list[list[int]] = []
    for a in axes:
        if runs and runs[-1][-1] == a - 1:
            runs[-1].append(a)
        else:
            runs.append([a])
    inner_run = runs[-1]
    outer_reduced = [a for run in runs[:-1] for a in run]
    after = list(range(inner_run[-1] + 1, rank))
    before = [i for i in range(rank) if i not in axes and i not in after]
    perm = before + outer_reduced + inner_run + after
    size = lambda dims: int(np.prod([shape[i] for i in dims], dtype=np.int64))    # noqa: E731
    view = (size(before), size(outer_reduced), size(inner_run), size(after))
    scale = np.float32(np.float32(1) / np.float32(count)) if mean else np.float32(1)
    rows = not after

    def run(inputs, outputs):
        x = np.ascontiguousarray(inputs[0].reshape(shape).transpose(perm)).reshape(view)
        if rows:
            _xnn_row_runs(x, outputs[0].reshape(view[0]), scale, squared)
        else:
            _xnn_channel_runs(x, outputs[0].reshape(view[0], view[3]), scale, squared)
    return run


@njit(cache=True)
def _xnn_row_runs(x, out, scale, squared):
    """``out[k] = fold(acc <- fma(rowsum(x[k, o]), scale, acc))`` from 0 over ``o`` (see
    :func:`_xnn_runs_reducer`); x [K, O, N]."""
    for k in range(x.shape[0]):
        acc = np.float32(0)
        for o in range(x.shape[1]):
            row = x[k, o]
            total = rsum2_avx512f(row, 0, row.size) if squared else rsum_avx512f(row, 0, row.size)
            acc = madd(total, scale, acc)
        out[k] = acc


@njit(cache=True)
def _xnn_channel_runs(x, out, scale, squared):
    """``out[k, c] = fold(acc <- acc + sum_r x[k, o, r, c] * scale)`` from 0 over ``o``,
    each channel sum from 0 with the rows in order (see :func:`_xnn_runs_reducer`); x
    [K, O, R, C]."""
    total = np.empty(x.shape[3], np.float32)
    for k in range(x.shape[0]):
        out[k, :] = 0
        for o in range(x.shape[1]):
            total[:] = 0
            for r in range(x.shape[2]):
                row = x[k, o, r]
                for c in range(row.size):
                    total[c] = madd(row[c], row[c], total[c]) if squared else row[c] + total[c]
            for c in range(total.size):
                out[k, c] = out[k, c] + total[c] * scale


def _in_litert_order(reduce, axes: tuple[int, ...], largest: bool, empty_infinite: bool):
    """``reduce`` (numpy's maximum / minimum, which keep every NaN they meet) followed,
    where an output came out NaN, by LiteRT's fold in order
    (:func:`litegpu.ops.reduce.x86_extreme`), which keeps a NaN only as the last element.
    The common case pays one ``isnan(out).any()`` over the output."""
    lowest = np.finfo(np.float32).min if largest else np.finfo(np.float32).max
    initial = (-np.inf if largest else np.inf) if empty_infinite else lowest

    def reduce_in_order(x, out):
        reduce(x, out)
        if np.isnan(out).any():
            out[...] = x86_extreme(x, axes, True, initial, largest).reshape(out.shape)
    return reduce_in_order


kernel("MEAN")(_reducer(np.add, mean=True))
kernel("SUM")(_reducer(np.add, mean=False))
kernel("REDUCE_MAX")(_reducer(np.maximum, mean=False))

@task_function()
def _bool_reduce_task(t, xp, outp, _a2, _a3, _a4, _a5, _a6, _a7, ip, _fp):
    """``out[a, b] = all / any of x[a, :, b]`` over bools (bytes) of ``x`` [outer, count,
    inner] (``ip``: those three, then 1 for all, 0 for any)."""
    outer, count, inner, every = ip[0], ip[1], ip[2], ip[3]
    x, out = uint8_pointer(xp), uint8_pointer(outp)
    for a in range(outer):
        for b in range(inner):
            hit = every
            for j in range(count):
                if (x[(a * count + j) * inner + b] != 0) != (every != 0):
                    hit = 1 - every
                    break
            out[a * inner + b] = hit


def _bool_reducer(every: bool):
    def factory(ctx: NodeContext):
        """REDUCE_ALL / REDUCE_ANY over one run of constant axes as a task function (a
        legacy decoder's mask test), so it chains with its neighbours."""
        axes = _reduce_axes(ctx)
        shape = tuple(ctx.inputs[0].shape)
        if axes is None or not one_run(axes) \
                or np.dtype(ctx.inputs[0].dtype) != np.bool_:
            return None
        outer = int(np.prod(shape[:axes[0]], dtype=np.int64))
        count = int(np.prod(shape[axes[0]:axes[-1] + 1], dtype=np.int64))
        inner = int(np.prod(shape[axes[-1] + 1:], dtype=np.int64))
        params = np.array([outer, count, inner, int(every)], np.int64)

        def bind(inputs, outputs):
            return bind_task(_bool_reduce_task, 1, (inputs[0],), (outputs[0],), params,
                             dtypes=(np.dtype(np.bool_), np.dtype(np.bool_)))
        return bindable(bind)
    return factory


kernel("REDUCE_ALL")(_bool_reducer(True))
kernel("REDUCE_ANY")(_bool_reducer(False))

kernel("REDUCE_MIN")(_reducer(np.minimum, mean=False))


# -- SOFTMAX ------------------------------------------------------------------------------------

@task_function(fastmath={"contract"})
def _softmax_task(t, xp, outp, _a2, _a3, _a4, _a5, _a6, _a7, ip, fp):
    """Rows ``t * chunk ..`` of ``out[r] = exp(beta * (x[r] - m)) / sum`` (``ip``: rows, D,
    chunk; ``fp``: beta), m the row's maximum (its minimum when beta < 0, so that the
    exponent is never positive and cannot overflow), in passes that vectorize:
    :func:`.mathfn.row_range32`; the exponentials in float32 lanes written to the output
    (:func:`_exponentials`); their sum in float64 (:func:`.mathfn.sum64`); the output
    times 1 / sum (:func:`_scale_row`). Within ~2 ulps of float64. Beta 1, the softmax
    LiteRT hands XNNPACK, is :func:`softmax_row`. A NaN makes its row NaN and -inf
    entries give 0, as in the reference. A task function, so it chains with its
    neighbours. (No ``reassoc`` here: it would fold the error terms.)"""
    rows, d, chunk = ip[0], ip[1], ip[2]
    beta = fp[0]
    for r in range(t * chunk, min(rows, (t + 1) * chunk)):
        x = r * d
        lo, hi = row_range32(xp, x, d, np.float32(np.inf), np.float32(-np.inf))
        if beta == np.float32(1):
            softmax_row(xp, outp, x, d, hi)
            continue
        _exponentials(xp, outp, x, d, hi if beta >= np.float32(0) else lo, beta)
        _scale_row(outp, x, d, 1.0 / sum64(outp, x, d))


@njit(cache=True, inline="always")
def _accurate_softmax_row(xp, outp, x, d, m):
    """``out[x:x + d]``: the softmax of ``x[x:x + d]`` (beta 1, ``m`` its maximum) within
    ~2 ulps of float64 (:func:`_softmax_task`)."""
    _exponentials_beta1(xp, outp, x, d, m)
    _scale_row(outp, x, d, 1.0 / sum64(outp, x, d))


@njit(cache=True, inline="always")
def _xnn_softmax_row(xp, outp, x, d, m):
    """:func:`_accurate_softmax_row` as LiteRT's XNNPACK computes it on AVX-512F, to the
    bit (see :mod:`.xnn_order`): its exponentials, summed in its order, times ``1 / sum``
    in float32. A row whose maximum is not finite takes the accurate path."""
    if not (np.abs(m) < np.float32(np.inf)):
        _accurate_softmax_row(xp, outp, x, d, m)
        return
    for j in range(d):
        outp[x + j] = xnn_exp_nonpositive32(xp[x + j] - m)
    r = np.float32(1) / radd_avx512f(carray(advanced(outp, x), d), 0, d)
    for j in range(d):
        outp[x + j] = outp[x + j] * r


softmax_row = _xnn_softmax_row if xnn_order.RSUM_MATCHES_LITERT else _accurate_softmax_row
"""SOFTMAX (beta 1) of one row, ``(xp, outp, x, d, m)``: LiteRT's bits on AVX-512F hosts;
the accurate row elsewhere. XNNPACK's exponentials are up to ~2 ulps from float64, and a
hybrid product after an attention quantizes its input from the row's range."""


@njit(cache=True, inline="always")
def _difference(a, m):
    """``a - m`` as ``(s, e)``: the rounded difference and its exact rounding error
    (two-difference: ``s + e == a - m``)."""
    s = a - m
    a1 = s + m
    b1 = s - a1
    return s, (a - a1) + (-m - b1)


@njit(cache=True, inline="always")
def _exponentials(xp, outp, x, d, m, beta):
    """``out[x + j] = exp(beta * (x[x + j] - m))`` for j < d, each exponent as ``h + lo``
    with ``lo`` the exact rounding error of ``x - m`` and of the product by beta
    (:func:`.mathfn.exp_sum32`: a float32 ``beta * (x - m)`` alone was up to 6 ulps off
    in small outputs)."""
    for j in range(d):
        s, e = _difference(xp[x + j], m)
        h = s * beta
        err = fma32(s, beta, -h) + e * beta
        # (err is NaN only where s is infinite or NaN, when h alone decides)
        outp[x + j] = exp_sum32(h, err if err == err else np.float32(0))


@njit(cache=True, inline="always")
def _exponentials_beta1(xp, outp, x, d, m):
    """:func:`_exponentials` for beta = 1 (the usual softmax, and attention's, whose scale
    is a MUL before it): the product by beta and its error term drop out (they are
    exactly ``s`` and 0), the same results in fewer operations."""
    for j in range(d):
        s, e = _difference(xp[x + j], m)
        outp[x + j] = exp_sum32(s, e if e == e else np.float32(0))


@njit(cache=True, inline="always")
def _scale_row(outp, x, d, inv):
    """``out[x + j] *= inv`` (a float64) for j < d, rounded once: ``inv`` split into two
    float32s, ``fma(o, hi, o * lo)`` (the small product's rounding is ~2**-48 of the
    result), so the pass runs in 16 float32 lanes where converting to float64 and back
    took 8 and three operations."""
    hi = np.float32(inv)
    lo = np.float32(inv - np.float64(hi))
    for j in range(d):
        o = outp[x + j]
        outp[x + j] = fma32(o, hi, o * lo)


# Softmaxes of at least this many elements are cut into tasks over the threads (at ~1 ns
# an element the split pays for the parallel region's start when the workers are awake,
# as they are inside a model's run).
_SOFTMAX_PARALLEL = 1 << 13


@kernel("SOFTMAX")
def softmax(ctx: NodeContext):
    """Softmax over the last axis, one row at a time (see :func:`_softmax_task`)."""
    if not all_float32(ctx):
        return None
    shape = ctx.inputs[0].shape
    if not shape or shape[-1] == 0:
        return None
    d = shape[-1]
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    tasks = min(rows, 8) if rows * d >= _SOFTMAX_PARALLEL else 1
    chunk = -(-rows // max(tasks, 1))
    tasks = -(-rows // chunk) if rows else 1
    params = np.array([rows, d, chunk], np.int64)
    beta = np.array([ctx.attrs.get("beta", 1.0)], F32)

    def bind(inputs, outputs):
        return bind_task(_softmax_task, tasks, (inputs[0],), (outputs[0],), params, beta)
    return bindable(bind)


# -- RESIZE_BILINEAR ----------------------------------------------------------------------------

@task_function(fastmath={"contract"})
def _resize_bilinear_task(t, xp, indexp, weightp, outp, _a4, _a5, _a6, _a7, ip, _fp):
    """Output rows ``t * chunk ..`` (image-major; ``ip``: N*OH, chunk, H, W, C, OH, OW) of
    bilinear interpolation from per-axis tables (``index``: the lower then the upper
    source row of each output row, then the same for columns; ``weight``: each output
    row's upper weight, then each column's) in XNNPACK's order
    (:func:`litegpu.ops.nn.bilinear_lerp`), so an infinite tap gives NaN where LiteRT's
    does. ``contract`` fuses each multiply-add (which changes no NaN or infinity): without
    it this form ran ~15% slower than the weighted sum it replaced."""
    index = int64_pointer(indexp)
    h, w, c_size, oh_size, ow_size = ip[2], ip[3], ip[4], ip[5], ip[6]
    for r in range(t * ip[1], min(ip[0], (t + 1) * ip[1])):
        n, oh = r // oh_size, r % oh_size
        top_row = (n * h + index[oh]) * w
        bottom_row = (n * h + index[oh_size + oh]) * w
        wy = weightp[oh]
        for ow in range(ow_size):
            b0, b1, wx = index[2 * oh_size + ow], index[2 * oh_size + ow_size + ow], weightp[oh_size + ow]
            tl, tr = (top_row + b0) * c_size, (top_row + b1) * c_size
            bl, br = (bottom_row + b0) * c_size, (bottom_row + b1) * c_size
            at = (r * ow_size + ow) * c_size
            for c in range(c_size):
                top = xp[tl + c] + (xp[tr + c] - xp[tl + c]) * wx
                bottom = xp[bl + c] + (xp[br + c] - xp[bl + c]) * wx
                outp[at + c] = top + (bottom - top) * wy


# Resizes of at least this many outputs are cut into tasks over the threads.
_RESIZE_PARALLEL = 1 << 14


@kernel("RESIZE_BILINEAR")
def resize_bilinear_kernel(ctx: NodeContext):
    """RESIZE_BILINEAR with index/weight tables built at compile time (the op module's,
    :func:`litegpu.ops.nn.bilinear_axis`), a task function over output rows. A size the
    model computes leaves LiteRT on its builtin kernel, whose formula the reference has."""
    if not all_float32(ctx) or not ctx.attrs.get("xnnpack", True):
        return None
    n, h, w, c = ctx.inputs[0].shape
    _, oh, ow, _ = ctx.outputs[0].shape
    if min(h, w, oh, ow) < 1:
        return None
    y0, y1, fy = bilinear_axis(h, oh, ctx.attrs)
    x0, x1, fx = bilinear_axis(w, ow, ctx.attrs)
    index = np.concatenate([y0, y1, x0, x1]).astype(np.int64)
    weight = np.concatenate([fy, fx]).astype(F32)
    rows = n * oh
    tasks, chunk = row_tasks(rows, rows * ow * c, _RESIZE_PARALLEL)
    params = np.array([rows, chunk, h, w, c, oh, ow], np.int64)

    def bind(inputs, outputs):
        return bind_task(_resize_bilinear_task, tasks, (inputs[0], index, weight), (outputs[0],), params,
                         dtypes=(F32, np.dtype(np.int64), F32, F32))
    return bindable(bind)


# -- CONCATENATION ---------------------------------------------------------------------

@kernel("CONCATENATION")
def concatenation(ctx: NodeContext):
    """Copy each input into its slice of the output along the axis; activation in place."""
    out_shape = ctx.outputs[0].shape
    rank = len(out_shape)
    axis = int(ctx.attrs["axis"])
    if not -rank <= axis < max(rank, 1):
        return None
    axis %= max(rank, 1)
    dtype = np.dtype(ctx.outputs[0].dtype)
    activation = ctx.attrs.get("activation", "NONE")
    if activation != "NONE" and dtype != F32:
        return None
    act = activation_in_place(activation)
    slices, offset = [], 0
    for spec in ctx.inputs:
        size = spec.shape[axis]
        slices.append((slice(None),) * axis + (slice(offset, offset + size),))
        offset += size
    if offset != out_shape[axis]:
        return None

    def run(inputs, outputs):
        out = outputs[0]
        for sl, x in zip(slices, inputs):
            out[sl] = x
        if act is not None:
            act(out)
    if act is not None or not 1 <= len(ctx.inputs) < ARRAYS:
        return run
    # Without an activation: one task copying each input's rows into its columns, so the
    # step chains with its neighbours (a decoder's RoPE halves, its KV heads).
    outer = int(np.prod(out_shape[:axis], dtype=np.int64))
    inner = int(np.prod(out_shape[axis + 1:], dtype=np.int64)) * dtype.itemsize
    return _as_concat_task(run, dtype, outer, [int(spec.shape[axis]) * inner for spec in ctx.inputs])


def _as_concat_task(run, dtype: np.dtype, outer: int, widths: list[int]):
    """``run`` (the numpy kernel) binding :func:`_concat_task` over ``outer`` rows of the
    inputs' ``widths`` bytes each, where the arrays are C-contiguous."""
    params = np.array([outer, sum(widths), len(widths), *widths], np.int64)

    def bind(inputs, outputs):
        if not all(x.flags.c_contiguous for x in (*inputs, outputs[0])):
            return partial(run, inputs, outputs)
        return bind_task(_concat_task, 1, tuple(inputs), (outputs[0],), params,
                         dtypes=(dtype,) * (len(inputs) + 1))
    run.bind = bind
    return run


@kernel("PACK")
def pack(ctx: NodeContext):
    """PACK as :func:`_concat_task` (each input one slot of the new axis), so it chains with
    its neighbours (a legacy decoder stacks its cache position's four scalars)."""
    out_shape, axis = ctx.outputs[0].shape, int(ctx.attrs["axis"])
    rank = len(out_shape)
    if not -rank <= axis < rank or not 1 <= len(ctx.inputs) < ARRAYS:
        return None
    axis %= rank
    dtype = np.dtype(ctx.outputs[0].dtype)
    outer = int(np.prod(out_shape[:axis], dtype=np.int64))
    inner = int(np.prod(out_shape[axis + 1:], dtype=np.int64)) * dtype.itemsize

    def run(inputs, outputs):
        np.stack(inputs, axis=axis, out=outputs[0])
    return _as_concat_task(run, dtype, outer, [inner] * len(ctx.inputs))


@njit(cache=True, inline="always")
def _concat_pointer(k, a0, a1, a2, a3, a4, a5, a6):
    """Array argument ``k`` of a task, as bytes."""
    p = a0 if k == 0 else a1 if k == 1 else a2 if k == 2 else a3 if k == 3 else a4 if k == 4 else a5 if k == 5 else a6
    return uint8_pointer(p)


@task_function()
def _concat_task(t, a0, a1, a2, a3, a4, a5, a6, a7, ip, _fp):
    """CONCATENATION of ``ip[2]`` inputs (arrays 0 ..), the output after them: each of the
    ``ip[0]`` outer rows of the output (``ip[1]`` bytes) is the inputs' rows side by side,
    input ``k``'s ``ip[3 + k]`` bytes wide."""
    outer, total, count = ip[0], ip[1], ip[2]
    out = _concat_pointer(count, a0, a1, a2, a3, a4, a5, a6) if count < 7 else uint8_pointer(a7)
    offset = 0
    for k in range(count):
        width = ip[3 + k]
        x = _concat_pointer(k, a0, a1, a2, a3, a4, a5, a6)
        for o in range(outer):
            for e in range(width):
                out[o * total + offset + e] = x[o * width + e]
        offset += width
