"""litert-torch's composites as fused task functions: ``odml.rms_norm`` and
``odml.scaled_dot_product_attention`` (:mod:`litegpu.ops.composite` says what they compute).

Both compute what LiteRT's CPU path computes, step for step, so that a quantized decoder's
next layer (whose inputs are quantized on the fly from their row's range) sees the same
floats:

- rms norm (LiteRT runs its decomposition with XNNPACK): per row, the squares in float32,
  their mean, plus epsilon, the reciprocal square root, then ``(x * r) * w``; where LiteRT
  runs XNNPACK's AVX-512F kernels, the mean is ``sum * (1 / D)``, the sum of squares in
  the order of XNNPACK's fused ``reduce_sum_squared`` (:func:`.xnn_order.rsum2_avx512f`),
  and the root its estimate and Newton step (:func:`.mathfn.xnn_rsqrt32`): LiteRT's
  bits (checked by the tests). Elsewhere a float64 sum and ``1 / sqrt``;
- attention (LiteRT's XNNPACK lowers the composite itself: q times the scale, a batched
  matmul with k, the mask added, softmax, a batched matmul with v): per (batch, query row,
  head), ``q * scale``; each score a fused multiply-add chain over the head dimension in
  order, as XNNPACK's GEMM microkernels accumulate; the logit cap; the mask; the cpu
  SOFTMAX's row (:mod:`.misc`); each output a multiply-add chain over the keys in order.
  A task takes a run of rows with their scores in its own part of a scratch array.
"""
from __future__ import annotations

import numpy as np

from litegpu.backend import NodeContext

from ..jit import carray, njit
from .common import F32, all_float32
from .mathfn import row_range32, tanh32, xnn_rsqrt32
from .attention import visible_span
from .misc import softmax_row
from .registry import bindable, kernel
from .tasks import advanced, bind_task, in_sequence, int64_pointer, row_tasks, task_function
from .xnn_order import RSUM_MATCHES_LITERT, madd, rsum2_avx512f

# Rows (times their width) from which a node is cut into tasks over the threads.
_PARALLEL_WORK = 1 << 14


# -- odml.rms_norm ------------------------------------------------------------------------------

@task_function(requires=("avx512f",))
def _rms_norm_xnn_task(t, xp, wp, outp, _a3, _a4, _a5, _a6, _a7, ip, fp):
    """Rows ``t * chunk ..`` of ``out = (x * r) * w``, ``r = rsqrt(mean(x * x) + epsilon)``
    over rows of D, as LiteRT's XNNPACK computes it on AVX-512F (``ip``: rows, D, chunk;
    ``fp``: epsilon, ``1 / D``): XNNPACK turns the mean of the squares into one sum of
    squares (:func:`.xnn_order.rsum2_avx512f`)."""
    rows, d, chunk = ip[0], ip[1], ip[2]
    epsilon, inverse = fp[0], fp[1]
    for row in range(t * chunk, min(rows, (t + 1) * chunk)):
        base = row * d
        mean = np.float32(0) + rsum2_avx512f(carray(advanced(xp, base), d), 0, d) * inverse
        _scale_by(xp, wp, outp, base, d, xnn_rsqrt32(mean + epsilon))


@task_function()
def _rms_norm_task(t, xp, wp, outp, _a3, _a4, _a5, _a6, _a7, ip, fp):
    """:func:`_rms_norm_xnn_task` on any host: the squares summed in float64, ``1 / sqrt``."""
    rows, d, chunk = ip[0], ip[1], ip[2]
    epsilon = fp[0]
    for row in range(t * chunk, min(rows, (t + 1) * chunk)):
        base = row * d
        total = 0.0
        for j in range(d):
            square = xp[base + j] * xp[base + j]
            total += square
        mean = np.float32(total / d)
        _scale_by(xp, wp, outp, base, d, np.float32(1) / np.sqrt(mean + epsilon))


@njit(cache=True, inline="always")
def _scale_by(xp, wp, outp, base, d, r):
    """``out[base + j] = (x[base + j] * r) * w[j]`` for j < d."""
    for j in range(d):
        outp[base + j] = (xp[base + j] * r) * wp[j]


@kernel("odml.rms_norm")
def rms_norm(ctx: NodeContext):
    """RMS norm over the last axis, rows cut into tasks (:func:`_rms_norm_task`)."""
    if not all_float32(ctx, (0, 1)):
        return None
    shape = ctx.inputs[0].shape
    d = int(shape[-1])
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    if d == 0 or rows == 0:
        return None
    tasks, chunk = row_tasks(rows, rows * d, _PARALLEL_WORK)
    params = np.array([rows, d, chunk], np.int64)
    floats = np.array([ctx.attrs["epsilon"], np.float32(1) / np.float32(d)], F32)

    def bind(inputs, outputs):
        if not RSUM_MATCHES_LITERT:
            return bind_task(_rms_norm_task, tasks, (inputs[0], inputs[1]), (outputs[0],), params, floats)
        return bind_task(_rms_norm_xnn_task, tasks, (inputs[0], inputs[1]), (outputs[0],), params, floats)
    return bindable(bind)


# -- odml.scaled_dot_product_attention -----------------------------------------------------------

# ip layout of :func:`_attention_task`.
_ROWS, _CHUNK, _T, _H, _KV, _S, _D, _MASK_B, _MASK_H, _MASK_T, _CAP = range(11)


@task_function()
def _visible_task(t, maskp, spanp, _a2, _a3, _a4, _a5, _a6, _a7, ip, _fp):
    """The keys the attention takes (:func:`.attention.visible_span` of the mask, as its
    rows of S: ``ip``: rows, S), into ``span[0]``."""
    int64_pointer(spanp)[0] = visible_span(maskp, ip[0], ip[1])


# Keys per task of :func:`_keys_by_dimension_task`, and per block it moves at a time: a
# block's keys are read once (16 keys x D floats stay in L1 while each dimension's 16
# values are written as one cache line).
_KEY_CHUNK = 256
_KEY_BLOCK = 16


@task_function()
def _keys_by_dimension_task(t, kp, spanp, ktp, _a3, _a4, _a5, _a6, _a7, ip, _fp):
    """``kt[b, g, j, s] = k[b, s, g, j]`` for the visible keys of task ``t``'s (batch, kv
    head) and chunk of keys (``ip``: B, S, KV, D, chunks per head): the keys laid out so
    that :func:`_attention_task` reads a dimension of every key in a row. (One key at a
    time, every write went to another page: 8 ms for a 4096-entry cache.)"""
    s_size, kv_heads, d, chunks = ip[1], ip[2], ip[3], ip[4]
    span = int64_pointer(spanp)[0]
    head, chunk = t // chunks, t % chunks
    b, g = head // kv_heads, head % kv_heads
    dst = head * d * s_size
    for s0 in range(chunk * _KEY_CHUNK, min(span, (chunk + 1) * _KEY_CHUNK), _KEY_BLOCK):
        s1 = min(span, s0 + _KEY_BLOCK)
        for j in range(d):
            row = dst + j * s_size
            for s in range(s0, s1):
                ktp[row + s] = kp[((b * s_size + s) * kv_heads + g) * d + j]


@task_function()
def _attention_task(t, qp, ktp, vp, maskp, spanp, outp, scratchp, _a7, ip, fp):
    """Rows ``t * chunk ..`` of attention, a row being one (batch, query position, head) of
    q ``[B, T, H, D]`` (its flat row index), over k (as ``kt`` [B, KV, D, S],
    :func:`_keys_by_dimension_task`) and v ``[B, S, KV, D]`` (head h reads kv
    head ``h // (H / KV)``) and the mask (``ip``: its strides for batch, head and query
    position, 0 where it broadcasts; stride 1 over S). ``fp``: the scale, the logit cap
    (used where ``ip[_CAP]``). ``scratch``: S + D floats per task (the scores, the scaled
    query). Only the keys ``span[0]`` leaves visible are taken (see :mod:`.attention`: a
    key the mask hides in every row would add exact zeros)."""
    rows, chunk, t_size, heads, kv_heads = ip[_ROWS], ip[_CHUNK], ip[_T], ip[_H], ip[_KV]
    s_size, d = ip[_S], ip[_D]
    span = int64_pointer(spanp)[0]
    scale, cap = fp[0], fp[1]
    group = heads // kv_heads
    at = t * (s_size + d)
    scores = carray(advanced(scratchp, at), s_size)
    qs = carray(advanced(scratchp, at + s_size), d)
    for row in range(t * chunk, min(rows, (t + 1) * chunk)):
        h = row % heads
        position = (row // heads) % t_size
        b = row // (heads * t_size)
        kv = h // group
        for j in range(d):
            qs[j] = qp[row * d + j] * scale
        mask_row = b * ip[_MASK_B] + h * ip[_MASK_H] + position * ip[_MASK_T]
        # Every key at once: ``kt`` holds k by (batch, kv head, dimension, key), so each
        # score is still one multiply-add chain over the head dimension in order
        # (XNNPACK's), the chains side by side in vector lanes (one chain at a time left a
        # tiny decoder's prefill attention at ~12 GMAC/s).
        for s in range(span):
            scores[s] = np.float32(0)
        base = (b * kv_heads + kv) * d * s_size
        for j in range(d):
            q = qs[j]
            keys = base + j * s_size
            for s in range(span):
                scores[s] = madd(q, ktp[keys + s], scores[s])
        for s in range(span):
            acc = scores[s]
            if ip[_CAP]:
                acc = tanh32(acc / cap) * cap
            scores[s] = maskp[mask_row + s] + acc
        _softmax_in_place(scratchp, at, span)
        out = carray(advanced(outp, row * d), d)
        for j in range(d):
            out[j] = np.float32(0)
        for s in range(span):
            p = scores[s]
            value = ((b * s_size + s) * kv_heads + kv) * d
            for j in range(d):
                out[j] = madd(p, vp[value + j], out[j])


@njit(cache=True, inline="always")
def _softmax_in_place(p, start, count):
    """The cpu SOFTMAX's row (:func:`.misc.softmax_row`) on ``p[start:start + count]``."""
    lo, hi = row_range32(p, start, count, np.float32(np.inf), np.float32(-np.inf))
    softmax_row(p, p, start, count, hi)


def _mask_strides(mask_shape: tuple[int, ...]) -> tuple[int, int, int]:
    """The mask's element strides for batch, head and query position, right-aligned to
    ``[B, H, T, S]``, 0 along each axis it broadcasts."""
    shape = (1,) * (4 - len(mask_shape)) + tuple(int(n) for n in mask_shape)
    strides = [0, 0, 0]
    step = shape[3]
    for axis in (2, 1, 0):
        strides[axis] = step if shape[axis] > 1 else 0
        step *= shape[axis]
    return strides[0], strides[1], strides[2]


@kernel("odml.scaled_dot_product_attention")
def attention(ctx: NodeContext):
    """Grouped-query attention, one task per run of (batch, query, head) rows
    (:func:`_attention_task`)."""
    if not all_float32(ctx, (0, 1, 2, 3)):
        return None
    b, t, h, d = (int(n) for n in ctx.inputs[0].shape)
    s, kv = int(ctx.inputs[1].shape[1]), int(ctx.inputs[1].shape[2])
    rows = b * t * h
    if rows == 0 or d == 0 or s == 0:
        return None
    tasks, chunk = row_tasks(rows, rows * s * d, _PARALLEL_WORK)
    cap = float(ctx.attrs.get("logit_cap", 0.0))
    params = np.array([rows, chunk, t, h, kv, s, d, *_mask_strides(ctx.inputs[3].shape), int(cap > 0)],
                      np.int64)
    floats = np.array([ctx.attrs["scale"], cap or 1.0], F32)

    chunks = -(-s // _KEY_CHUNK)
    layout = np.array([b, s, kv, d, chunks], np.int64)
    mask_rows = np.array([int(np.prod(ctx.inputs[3].shape, dtype=np.int64)) // s, s], np.int64)
    i64 = np.dtype(np.int64)

    def bind(inputs, outputs):
        scratch = np.empty(tasks * (s + d), F32)
        kt = np.empty(b * kv * d * s, F32)
        span = np.array([s], np.int64)
        return in_sequence([bind_task(_visible_task, 1, (inputs[3],), (span,), mask_rows, dtypes=(F32, i64)),
                            bind_task(_keys_by_dimension_task, b * kv * chunks, (inputs[1], span), (kt,), layout,
                                      dtypes=(F32, i64, F32)),
                            bind_task(_attention_task, tasks, (inputs[0], kt, inputs[2], inputs[3], span),
                                      (outputs[0], scratch), params, floats, dtypes=(F32,) * 4 + (i64, F32, F32))])
    return bindable(bind)
