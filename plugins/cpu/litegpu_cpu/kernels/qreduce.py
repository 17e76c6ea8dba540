"""Integer kernel for quantized int8 / uint8 MEAN and SUM over a run of adjacent axes (a
global average pool: axes 1 and 2 of NHWC), in XNNPACK's arithmetic as the ops' integer
references compute it (:func:`litegpu.ops.quantized.xnn_sum_requant`): the exact sum of
the raw values, then ``sum * s + z`` in float32 (two roundings, as XNNPACK), rounded to
nearest even and clamped. Other axis sets, and the sums TFLite's kernels run, keep the
reference.
"""
from __future__ import annotations

import numpy as np

from litegpu.backend import NodeContext
from litegpu.ops.quantized import xnn_sum_constants
from litegpu.ops.reduce import one_run, reduction_axes

from ..jit import njit
from .registry import bindable, kernel, named
from .tasks import bind_task, int8_pointer, int32_pointer, task_function, uint8_pointer


@task_function()
def _mean_task(t, xp, outp, accp, _a3, _a4, _a5, _a6, _a7, ip, fp):
    """``x`` [outer, count, inner] (int8, or uint8 when ``ip[3]`` is 0) -> ``out`` [outer,
    inner] of its dtype; ``acc``: inner int32 sums; ``ip``: outer, count, inner, signed;
    ``fp``: s, z, lo, hi. One task: the sums in order, as XNNPACK's."""
    outer, count, inner, signed = ip[0], ip[1], ip[2], ip[3]
    s, z, lo, hi = fp[0], fp[1], fp[2], fp[3]
    acc = int32_pointer(accp)
    signed_x, unsigned_x = int8_pointer(xp), uint8_pointer(xp)
    signed_out, unsigned_out = int8_pointer(outp), uint8_pointer(outp)
    for o in range(outer):
        for i in range(inner):
            acc[i] = 0
        for r in range(count):
            row = (o * count + r) * inner
            if signed:
                for i in range(inner):
                    acc[i] += np.int32(signed_x[row + i])
            else:
                for i in range(inner):
                    acc[i] += np.int32(unsigned_x[row + i])
        for i in range(inner):
            value = min(max(np.rint(np.float32(acc[i]) * s + z), lo), hi)
            if signed:
                signed_out[o * inner + i] = np.int8(value)
            else:
                unsigned_out[o * inner + i] = np.uint8(value)


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
    if not one_run(axes):
        return None
    shape = tuple(x.shape)
    outer = int(np.prod(shape[:axes[0]], dtype=np.int64))
    count = int(np.prod(shape[axes[0]:axes[-1] + 1], dtype=np.int64))
    inner = int(np.prod(shape[axes[-1] + 1:], dtype=np.int64))
    if count == 0 or count * 255 >= 2 ** 31:
        return None
    s, z = xnn_sum_constants(count, m, mean)
    floats = np.array([s, z, m["qmin"], m["qmax"]], np.float32)
    dtype = np.dtype(x.dtype)
    params = np.array([outer, count, inner, dtype == np.int8], np.int64)
    acc = np.empty(inner, np.int32)

    def bind(inputs, outputs):
        xs, out = inputs[0].reshape(outer, count, inner), outputs[0].reshape(outer, inner)
        return bind_task(_mean_task, 1, (xs,), (out, acc), params, floats, dtypes=(dtype, dtype, acc.dtype))
    return bindable(bind)


# -- SOFTMAX on int8 / uint8 ---------------------------------------------------------------------


@njit(cache=True, nogil=True)
def _softmax8_loop(x, out, e, table, scale, zp, lo, hi, truncate):   # pragma: no cover - compiled
    """Rows of ``x`` [rows, n] -> ``out``, as :func:`litegpu.ops.quantized_act._softmax8`:
    exp of each distance to the row's maximum from ``table``, summed in float32 left to
    right, times ``1 / (sum * scale)``, rounded half away from zero (``truncate``: uint8's
    ``int(p + 0.5)`` without the zero point), clamped."""
    for r in range(x.shape[0]):
        top = np.int32(x[r, 0])
        for j in range(1, x.shape[1]):
            top = max(top, np.int32(x[r, j]))
        total = np.float32(0)
        for j in range(x.shape[1]):
            e[j] = table[top - np.int32(x[r, j])]
            total += e[j]
        inv = np.float32(1) / (total * scale)
        for j in range(x.shape[1]):
            p = e[j] * inv
            q = np.int32(np.trunc(p + np.float32(0.5)))   # p >= 0: half away from zero
            if not truncate:
                q += zp
            out[r, j] = min(max(q, lo), hi)


@kernel("SOFTMAX", quantized=True)
def quantized_softmax(ctx: NodeContext):
    """int8/uint8 SOFTMAX over the last axis in TFLite's arithmetic (see :func:`_softmax8_loop`);
    int16 keeps the reference."""
    p = ctx.attrs.get("softmax8")
    x = ctx.inputs[0]
    if p is None or x.shape[-1] == 0 or np.dtype(x.dtype) not in (np.dtype(np.int8), np.dtype(np.uint8)):
        return None
    n = int(x.shape[-1])
    rows = int(np.prod(x.shape, dtype=np.int64)) // n
    info = np.iinfo(p["dtype"])
    e = np.empty(n, np.float32)
    args = (np.asarray(p["table"], np.float32), np.float32(p["scale"]), np.int32(p["zp"]), np.int32(info.min),
            np.int32(info.max), bool(p["truncate"]))

    def bind(inputs, outputs):
        xs, ys = inputs[0].reshape(rows, n), outputs[0].reshape(rows, n)
        return lambda: _softmax8_loop(xs, ys, e, *args)
    return named(bindable(bind), "int8 softmax (TFLite's float table)")
