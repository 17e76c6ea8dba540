"""Integer kernel for quantized int8 / uint8 MEAN and SUM over a run of adjacent axes (a
global average pool: axes 1 and 2 of NHWC), in XNNPACK's arithmetic as the ops' integer
references compute it (:func:`litegpu.ops.quantized.xnn_sum_requant`): the exact sum of
the raw values, then ``sum * s + z`` in float32 (two roundings, as XNNPACK), rounded to
nearest even and clamped. Other axis sets, and the sums TFLite's kernels run, keep the
reference.
"""
from __future__ import annotations

import numba
import numpy as np

from litegpu.backend import NodeContext
from litegpu.ops.quantized import xnn_sum_constants
from litegpu.ops.reduce import reduction_axes

from .registry import bindable, kernel


@numba.njit(cache=True, nogil=True)
def _mean_loop(x, out, acc, s, z, lo, hi):   # pragma: no cover - compiled
    """``x`` [outer, count, inner] -> ``out`` [outer, inner]; ``acc``: inner int32 sums."""
    for o in range(x.shape[0]):
        acc[:] = 0
        for r in range(x.shape[1]):
            for i in range(x.shape[2]):
                acc[i] += np.int32(x[o, r, i])
        for i in range(x.shape[2]):
            value = np.rint(np.float32(acc[i]) * s + z)
            out[o, i] = min(max(value, lo), hi)


@kernel("MEAN", "SUM", quantized=True)
def quantized_mean(ctx: NodeContext):
    """MEAN or SUM of an 8-bit tensor over constant, adjacent axes, requantized as XNNPACK
    does; None (the reference) otherwise."""
    mean = ctx.node.op == "MEAN"
    m, axes_spec = ctx.attrs.get("mean" if mean else "sum"), ctx.inputs[1]
    x = ctx.inputs[0]
    # 8-bit MEAN always runs XNNPACK's arithmetic; a SUM says whether it does ("xnn").
    if m is None or axes_spec.value is None or np.dtype(x.dtype) not in (np.dtype(np.int8), np.dtype(np.uint8)) \
            or not m.get("xnn", mean):
        return None
    axes = sorted(set(reduction_axes(np.asarray(axes_spec.value), len(x.shape))))
    if not axes or axes != list(range(axes[0], axes[-1] + 1)):
        return None
    shape = tuple(x.shape)
    outer = int(np.prod(shape[:axes[0]], dtype=np.int64))
    count = int(np.prod(shape[axes[0]:axes[-1] + 1], dtype=np.int64))
    inner = int(np.prod(shape[axes[-1] + 1:], dtype=np.int64))
    if count == 0 or count * 255 >= 2 ** 31:
        return None
    s, z = xnn_sum_constants(count, m, mean)
    bounds = (np.float32(m["qmin"]), np.float32(m["qmax"]))
    acc = np.empty(inner, np.int32)

    def bind(inputs, outputs):
        xs, out = inputs[0].reshape(outer, count, inner), outputs[0].reshape(outer, inner)
        return lambda: _mean_loop(xs, out, acc, s, z, *bounds)
    return bindable(bind)
