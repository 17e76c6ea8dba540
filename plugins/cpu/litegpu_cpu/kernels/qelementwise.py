"""Integer kernels for quantized element-wise ops on int8 / uint8.

- ADD and SUB with both operands of the same shape (the residual connections of mobile
  networks), in XNNPACK's arithmetic as the integer reference in
  :mod:`litegpu.ops.quantized` computes it, from the node's ``attrs["add"]``; a
  broadcast operand gets ``None`` here and keeps the reference.
- One-input ops (HARD_SWISH, LOGISTIC, TANH, QUANTIZE, DEQUANTIZE ...): an 8-bit input
  has 256 values, so the op is a table of its own integer reference evaluated on each
  of them at compile time (what XNNPACK does for its lookup-table ops), then one gather.
"""
from __future__ import annotations

import numba
import numpy as np

from litegpu.backend import NodeContext

from .registry import bindable, kernel


@numba.njit(cache=True, nogil=True)
def _add_loop(a, b, out, am, bm, bias, shift, zp, lo, hi):   # pragma: no cover - compiled
    for i in range(a.size):
        acc = bias + np.int64(a[i]) * am + np.int64(b[i]) * bm
        v = (acc >> shift) + zp
        out[i] = min(max(v, lo), hi)


@kernel("ADD", "SUB", quantized=True)
def quantized_add(ctx: NodeContext):
    """``out = clamp(((bias + a * ma + b * mb) >> shift) + zp)`` element by element."""
    params = ctx.attrs.get("add")
    shapes = [tuple(s.shape) for s in (*ctx.inputs[:2], ctx.outputs[0])]
    dtype = np.dtype(ctx.outputs[0].dtype)
    if params is None or len(set(shapes)) != 1 or dtype not in (np.dtype(np.int8), np.dtype(np.uint8)) \
            or any(np.dtype(s.dtype) != dtype for s in ctx.inputs[:2]):
        return None
    args = (np.int64(params.a_multiplier), np.int64(params.b_multiplier), np.int64(params.bias),
            np.int64(params.shift), np.int64(ctx.attrs["zp"]), np.int64(ctx.attrs["lo"]), np.int64(ctx.attrs["hi"]))

    def bind(inputs, outputs):
        a, b, out = inputs[0].reshape(-1), inputs[1].reshape(-1), outputs[0].reshape(-1)
        return lambda: _add_loop(a, b, out, *args)
    return bindable(bind)


# Quantized ops whose 8-bit output depends on nothing but the input byte.
UNARY_8BIT = ("HARD_SWISH", "LOGISTIC", "TANH", "ELU", "GELU", "LEAKY_RELU", "RELU", "RELU6", "RELU_N1_TO_1",
              "RELU_0_TO_1", "QUANTIZE", "DEQUANTIZE")


@kernel(*UNARY_8BIT, quantized=True)
def quantized_unary_table(ctx: NodeContext):
    """A one-input op on int8/uint8 as a 256-entry table of its own integer reference,
    evaluated once at compile time on every input byte: exact by construction, one
    gather per run."""
    x = ctx.inputs[0]
    dtype = np.dtype(x.dtype)
    if len(ctx.inputs) != 1 or dtype not in (np.dtype(np.int8), np.dtype(np.uint8)):
        return None
    params = ctx.attrs.get("in")
    if ctx.node.op == "DEQUANTIZE" and (params is None or not params.per_tensor):
        return None   # per-channel: the value depends on the position too
    every_byte = np.arange(256, dtype=np.uint8).view(dtype)
    table = np.ascontiguousarray(ctx.opdef.reference_for(ctx.attrs)([every_byte], ctx.attrs)[0])
    if table.shape != (256,) or table.dtype != np.dtype(ctx.outputs[0].dtype):
        return None

    def bind(inputs, outputs):
        index, out = inputs[0].reshape(-1).view(np.uint8), outputs[0].reshape(-1)
        return lambda: _gather(table, index, out)
    return bindable(bind)


@numba.njit(cache=True, nogil=True)
def _gather(table, index, out):   # pragma: no cover - compiled
    """``out[i] = table[index[i]]``; the uint8 index never leaves the 256-entry table (a
    loop: ``np.take`` would first widen the index array to intp)."""
    for i in range(index.size):
        out[i] = table[index[i]]
