"""Dynamically quantized products with blockwise weights: float rows times a constant int4
weight scaled per block of K, float results (an LLM's INT4 FULLY_CONNECTED).

XNNPACK's qd8-f32-qb4w arithmetic, as the op's hybrid reference has it
(:func:`litegpu.ops.hybrid.xnn_blockwise_sums`): each input row quantized to int8 as for
qc8w weights (:func:`.qd8gemm.bind_quantize_rows`, shared), then per row and output column,
block by block, the exact integer sum of ``(q - zp) w`` over the block made float32 and
multiplied by the block's scale, accumulated in float32; times the row's scale, plus the
bias, clamped. The int4 values are kept as int8 (the reader unpacks them), one row of K per
output column, so a block's 32 or 128 products are one vectorized loop over contiguous bytes.
"""
from __future__ import annotations

import numpy as np

from litegpu.backend import NodeContext

from .common import clamp_bounds, optional_input
from .qd8gemm import bind_quantize_rows
from .registry import bindable
from .tasks import bind_task, in_sequence, int8_pointer, int32_pointer, task_function
from .threads import current as current_threads

# Columns per task: enough work to be worth a task, few enough to share among threads.
_COLUMNS_PER_TASK = 64


@task_function()
def _qb4w_task(t, qp, wp, wsump, scalep, biasp, rowscalep, rowcp, outp, ip, fp):
    """Columns ``[t * chunk, (t + 1) * chunk)`` of every row. ``ip``: M, K4 (q's row stride),
    N, K, block, blocks, chunk; ``fp``: the clamp's low and high. ``wsump``: each column's
    sum of w per block (int32 [N, blocks]), so ``sum (q - zp) w = sum q w - zp * sum w``."""
    m, k4, n, k, block, blocks, chunk = ip[0], ip[1], ip[2], ip[3], ip[4], ip[5], ip[6]
    q, w, wsum, c = int8_pointer(qp), int8_pointer(wp), int32_pointer(wsump), int32_pointer(rowcp)
    lo, hi = fp[0], fp[1]
    for col in range(t * chunk, min((t + 1) * chunk, n)):
        for r in range(m):
            zp = np.int32(c[r] - 128)
            acc = np.float32(0)
            for b in range(blocks):
                s = np.int32(0)
                for i in range(b * block, (b + 1) * block):
                    s += np.int32(q[r * k4 + i]) * np.int32(w[col * k + i])
                acc += np.float32(s - zp * wsum[col * blocks + b]) * scalep[col * blocks + b]
            y = acc * rowscalep[r] + biasp[col]
            outp[r * n + col] = min(max(y, lo), hi)


class BlockwiseQuantizedMatmul:
    """``bind(x [M, K] float32, out [M, N] float32) -> call``: x times the int8-held int4
    ``w_nk`` [N, K] with float32 ``scales`` [N, K / block] (already bf16-rounded, as XNNPACK
    packs them), ``bias`` (or None), clamped to ``[lo, hi]``."""

    def __init__(self, w_nk: np.ndarray, scales: np.ndarray, block: int, bias: np.ndarray | None, lo: float,
                 hi: float, threads: int) -> None:
        n, k = w_nk.shape
        if k % block or scales.shape != (n, k // block):
            raise ValueError(f"blockwise weights {w_nk.shape} with scales {scales.shape} and block {block}")
        self.n, self.k, self.block, self.threads = n, k, block, threads
        self.weights = np.ascontiguousarray(w_nk, np.int8)
        self.wsums = np.ascontiguousarray(self.weights.reshape(n, k // block, block).sum(axis=2, dtype=np.int32))
        self.scales = np.ascontiguousarray(scales, np.float32)
        self.bias = np.zeros(n, np.float32) if bias is None else np.ascontiguousarray(bias, np.float32).reshape(n)
        self.clamp = np.array([lo, hi], np.float32)
        self._rows: dict[int, tuple] = {}

    def bind(self, x: np.ndarray, out: np.ndarray):
        m = out.shape[0]
        if x.shape != (m, self.k) or out.shape != (m, self.n):
            raise ValueError(f"blockwise product [M, {self.k}] -> [M, {self.n}] given {x.shape} -> {out.shape}")
        if m not in self._rows:
            k4 = -(-self.k // 4) * 4
            self._rows[m] = (np.empty((m, k4), np.int8), np.empty(m, np.float32), np.empty(m, np.int32))
        q, row_scale, row_c = self._rows[m]
        chunk = _COLUMNS_PER_TASK
        params = np.array([m, q.shape[1], self.n, self.k, self.block, self.k // self.block, chunk], np.int64)
        product = bind_task(_qb4w_task, -(-self.n // chunk),
                            (q, self.weights, self.wsums, self.scales, self.bias, row_scale, row_c), (out,),
                            params, self.clamp, dtypes=(np.int8, np.int8, np.int32, np.float32, np.float32,
                                                        np.float32, np.int32, np.float32))
        return in_sequence([bind_quantize_rows(x, q, row_scale, row_c, self.threads), product])


def blockwise_fully_connected(ctx: NodeContext):
    """The kernel of a hybrid FULLY_CONNECTED with blockwise (INT4) weights, or None."""
    w_spec, bias_spec = ctx.inputs[1], optional_input(ctx, 2)
    if w_spec.value is None or np.asarray(w_spec.value).ndim != 2 \
            or np.dtype(ctx.inputs[0].dtype) != np.float32 or np.dtype(ctx.outputs[0].dtype) != np.float32:
        return None
    if bias_spec is not None and (bias_spec.value is None or np.dtype(bias_spec.dtype) != np.float32):
        return None
    w = np.asarray(w_spec.value, np.int8)
    n, k = w.shape
    m = int(np.prod(ctx.inputs[0].shape)) // k
    lo, hi = clamp_bounds(ctx.attrs["activation"])
    product = BlockwiseQuantizedMatmul(w, ctx.attrs["block_scale"], ctx.attrs["block_size"],
                                       None if bias_spec is None else bias_spec.value, lo, hi, current_threads())
    return bindable(lambda inputs, outputs: product.bind(inputs[0].reshape(m, k), outputs[0].reshape(m, n)))
