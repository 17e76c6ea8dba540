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
  SOFTMAX's row (:mod:`.misc`); each output a multiply-add chain over the keys in order:
  the float GEMM's tiles over the keys the mask leaves visible, as :mod:`.attention` runs
  a chain of nodes.
"""
from __future__ import annotations

import numpy as np

from litegpu.backend import NodeContext

from ..jit import carray, njit
from .common import F32, all_float32
from .attention import DIV, MUL, TANH, attention_step
from .mathfn import xnn_rsqrt32
from .registry import bindable, kernel
from .tasks import advanced, bind_task, row_tasks, task_function
from .workspace import current as current_workspace
from .xnn_order import RSUM_MATCHES_LITERT, rsum2_avx512f

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
    """Grouped-query attention as :func:`.attention.attention_step` runs a chain's: a batch
    per (batch, kv head), its rows the (query position, head) pairs of the heads reading
    that kv head; q scaled first, then the logit cap (``/ cap``, tanh, ``* cap``)."""
    if not all_float32(ctx, (0, 1, 2, 3)):
        return None
    b, t, h, d = (int(n) for n in ctx.inputs[0].shape)
    s, kv = int(ctx.inputs[1].shape[1]), int(ctx.inputs[1].shape[2])
    if b * t * h == 0 or d == 0 or s == 0:
        return None
    group = h // kv
    cap = float(ctx.attrs.get("logit_cap", 0.0))
    mask_b, mask_h, mask_t = _mask_strides(ctx.inputs[3].shape)
    # Row (position p, head g of the group) of batch (i, kv head j): q[i, p, j * group + g].
    i, j, p, g = np.meshgrid(np.arange(b), np.arange(kv), np.arange(t), np.arange(group), indexing="ij")
    heads = j * group + g
    rows = (((i * t + p) * h + heads) * d).reshape(-1)
    masks = (i * mask_b + heads * mask_h + p * mask_t).reshape(-1)
    bases = ((np.arange(b)[:, None] * s * kv + np.arange(kv)[None, :]) * d).reshape(-1)
    bind = attention_step(b * kv, t * group, d, s, d, masks, int(np.prod(ctx.inputs[3].shape, dtype=np.int64)),
                          rows, rows, bases, bases, (kv * d, True), (kv * d, False),
                          ((DIV, cap), (TANH, 0.0), (MUL, cap)) if cap > 0 else (), float(ctx.attrs["scale"]),
                          workspace=current_workspace())
    return bindable(lambda inputs, outputs: bind(inputs[0], inputs[1], inputs[3], inputs[2], outputs[0]))
