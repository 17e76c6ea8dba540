"""A decoder's attention as one step over the keys its mask leaves visible.

A decoder's attention written as a chain of nodes (:mod:`litegpu.chains`: two products
around a mask's ADD and a SOFTMAX) multiplies by every one of the cache's C keys, so a
prefill of 64 tokens into a cache of 512, or a decode step early in the cache, works
through all of them though the mask gives all but the first few a probability of exactly
0. The cpu backend's schedule makes each chain one step, and :func:`attention_kernel`
runs it as a task function that first reads the mask: the keys whose mask is -inf in
every row (a suffix of the cache) are left out of both products and the softmax. The
result is the chain's, to the bit:

- a score is one fused multiply-add chain over the head dimension in order (the float
  GEMM's tiles, :mod:`.packed`, as the unfused BATCH_MATMUL computes it), for the visible
  keys only; the cap's ops are the cpu's (``x * c``, the cpu TANH), the mask is added,
  and the cpu SOFTMAX's row (:func:`.misc.softmax_row`) runs over them;
- the visible span is rounded up to a multiple of 64, so that the softmax's sum
  (XNNPACK's blocks of 64, :func:`.xnn_order.radd_avx512f`) adds the same values in the
  same lanes; the keys left out would only add exact zeros (``exp(-inf)``); a span that
  does not end at a whole block of 64 takes every key;
- each output is one fused multiply-add chain over the keys in order; a key left out
  would add ``0 * v``, which leaves a sum unchanged.

So the only difference from the nodes run one by one is where a key left out holds an
infinity or NaN (a score ``inf - inf`` is NaN there, and ``0 * inf`` too): LiteRT then
gives NaN, this step the finite value. A session's cache past its position holds zeros
or finite old entries, never those.

The packed tiles need at least MR rows; a batch with fewer (a decode step's few query
heads) is copied into a task's scratch rows and its results copied back.
"""
from __future__ import annotations

import numpy as np

from litegpu.chains import AttentionChain

from ..jit import njit
from .common import F32
from .mathfn import row_range32, tanh32
from .misc import softmax_row
from .packed import MR, NR, _tile2, pack_panels
from .tasks import advanced, bind_task, in_sequence, int64_pointer, task_function
from .threads import current as current_threads
from .workspace import Workspace
from .workspace import current as current_workspace

# Keys come in blocks of this many: the softmax's sum order is XNNPACK's blocks of 64.
KEY_BLOCK = 64
# Tasks of the products, per thread.
_TASKS_PER_THREAD = 4

# ip: the int64 parameters of every task of an attention.
(_BATCHES, _M, _D, _C, _DV, _BLOCK, _BLOCKS, _K_T, _V_T, _MASK_ROWS, _SCRATCH, _PER_TASK, _TAP,
 _SIZE, _K_LD, _V_LD, _Q_SCALED, _OPS) = range(18)
# The scores' own ops before the mask (a logit cap: MUL, TANH, MUL), codes from ip[_OPS + 1]
# on, each's constant in fp: x * c, x / c, tanh(x) (the cpu TANH's, :data:`.mathfn.tanh32`).
# The query's scale (where ip[_Q_SCALED]) follows them in fp.
MUL, DIV, TANH = 1, 2, 3
_SCORE_CODES = {"MUL": MUL, "DIV": DIV, "TANH": TANH}
# _TAP must be the float tiles' tap table (packed._PARAMS): one tap at offset 0.
assert _TAP == 12


@task_function()
def _visible_keys_task(t, maskp, tablep, _a2, _a3, _a4, _a5, _a6, _a7, ip, _fp):
    """The span of keys the products take (:func:`visible_span`), into ``table[0]``."""
    int64_pointer(tablep)[0] = visible_span(maskp, ip[_MASK_ROWS], ip[_C])


@njit(cache=True, inline="always")
def visible_span(maskp, rows, c):
    """The keys an attention takes of the mask [rows, c]: up to the end of the last block of
    :data:`KEY_BLOCK` in which some row is above -inf (or NaN); all ``c`` when that block
    is the last, partial one, or when the mask hides every key."""
    whole = c // KEY_BLOCK
    if whole * KEY_BLOCK != c and _sees(maskp, rows, c, whole * KEY_BLOCK, c):
        return c
    # Whole blocks from the last: hidden in every row (a count over the block that
    # vectorizes), until one that is not.
    span = whole * KEY_BLOCK
    while span > 0 and not _sees(maskp, rows, c, span - KEY_BLOCK, span):
        span -= KEY_BLOCK
    return span if span > 0 else c


@njit(cache=True, inline="always")
def _sees(maskp, rows, c, j0, j1):
    """True when some row of the mask [rows, c] is above -inf (or NaN) in columns ``j0 .. j1``."""
    for r in range(rows):
        hidden = 0
        for j in range(r * c + j0, r * c + j1):
            hidden += maskp[j] == -np.inf
        if hidden < j1 - j0:
            return True
    return False


@task_function()
def _pack_task(t, kp, vp, packedp, tablep, _a4, _a5, _a6, _a7, ip, _fp):
    """Task ``t``: batch ``t // 2``'s keys (even t: the scores' B, ``[D, span]``, panels
    of keys) or values (odd t: the output's B, ``[span, Dv]``, panels of Dv packed for
    ``span`` keys), into ``packed`` (a batch's keys, then its values, :data:`_SIZE` floats
    a batch in all); a batch's k and v start where the table says, their rows (or
    columns, transposed) ``ip[_K_LD]`` and ``ip[_V_LD]`` floats apart."""
    b = t // 2
    d, c, dv = ip[_D], ip[_C], ip[_DV]
    table = int64_pointer(tablep)
    span = table[0]
    bases = 1 + 3 * ip[_BATCHES] * ip[_M]
    out = advanced(packedp, b * ip[_SIZE])
    if t % 2 == 0:      # keys: B[j, s] = k[s, j] ([C, D] rows, transposed) or k[j, s] ([D, C])
        pack_panels(advanced(kp, table[bases + b]), out, d, span, ip[_K_LD], ip[_K_T], 0, (span + NR - 1) // NR)
    else:               # values: B[s, j] = v[s, j] ([C, Dv]) or v[j, s] ([Dv, C], transposed)
        pack_panels(advanced(vp, table[bases + ip[_BATCHES] + b]), advanced(out, ((c + NR - 1) // NR) * NR * d),
                    span, dv, ip[_V_LD], ip[_V_T], 0, (dv + NR - 1) // NR)


@njit(cache=True, inline="always")
def _tiles(xp, wp, zerosp, outp, ip, rows, c, length, n):
    """``out[rows, n] = x[rows, :length] @ W`` (x's rows ``c`` floats apart, W packed
    for ``length`` K steps): the float GEMM's tiles, each a chain of fused multiply-adds
    over K in order; the last tile moved back to end with the rows (rows >= MR)."""
    panels = (n + NR - 1) // NR
    for p in range(0, panels, 2):
        p2 = min(p + 1, panels - 1)
        r = 0
        while r < rows:
            r = min(r, rows - MR)
            _tile2(xp, wp, zerosp, outp, ip, r, r, 1, c, length, 1, n, p * NR, p2 * NR,
                   np.float32(-np.inf), np.float32(np.inf))
            r += MR


@task_function()
def _chain_task(t, qp, packedp, maskp, outp, scratchp, tablep, _a6, _a7, ip, fp):
    """Task ``t``: rows ``block * (t % blocks) ..`` of batch ``t // blocks``: their q rows
    (where the table says, times the scale where asked) copied into its scratch, their
    scores over the visible keys, the scores' own ops (``fp``: their constants), the mask
    added, the softmax, then their outputs, copied to where the table says."""
    m, d, c, dv, block = ip[_M], ip[_D], ip[_C], ip[_DV], ip[_BLOCK]
    b, first = t // ip[_BLOCKS], block * (t % ip[_BLOCKS])
    rows = min(block, m - first)
    every = ip[_BATCHES] * m
    table = int64_pointer(tablep)
    span = table[0]
    row0 = b * m + first                   # the flat row of the attention's scores
    # Scratch: zeros (the tiles' bias), then each task's scores, q rows and out rows.
    zeros = scratchp
    tiled = max(rows, MR)
    scores = advanced(scratchp, ip[_SCRATCH] + t * ip[_PER_TASK])
    x = advanced(scores, tiled * c)
    out = advanced(x, tiled * d)
    scale = fp[ip[_OPS]]
    for r in range(tiled):      # (fewer rows than a tile: the last repeated)
        src = table[1 + every + row0 + min(r, rows - 1)]
        if ip[_Q_SCALED]:
            for j in range(d):
                x[r * d + j] = qp[src + j] * scale
        else:
            for j in range(d):
                x[r * d + j] = qp[src + j]
    keys = advanced(packedp, b * ip[_SIZE])
    _tiles(x, keys, zeros, scores, ip, tiled, d, d, span)
    for r in range(rows):
        at = r * span
        for o in range(ip[_OPS]):
            code, constant = ip[_OPS + 1 + o], fp[o]
            for j in range(span):
                value = scores[at + j]
                if code == MUL:
                    value = value * constant
                elif code == DIV:
                    value = value / constant
                else:
                    value = tanh32(value)
                scores[at + j] = value
        mask = table[1 + row0 + r]
        for j in range(span):
            scores[at + j] = scores[at + j] + maskp[mask + j]
        lo, hi = row_range32(scores, at, span, np.float32(np.inf), np.float32(-np.inf))
        softmax_row(scores, scores, at, span, hi)
    values = advanced(keys, ((c + NR - 1) // NR) * NR * d)
    _tiles(scores, values, zeros, out, ip, tiled, span, span, dv)
    for r in range(rows):
        dst = table[1 + 2 * every + row0 + r]
        for j in range(dv):
            outp[dst + j] = out[r * dv + j]


def attention_step(batches: int, m: int, d: int, c: int, dv: int, mask_rows: np.ndarray, mask_size: int,
                   q_rows: np.ndarray, out_rows: np.ndarray, k_bases: np.ndarray, v_bases: np.ndarray,
                   k_layout: tuple[int, bool], v_layout: tuple[int, bool], score_ops: tuple = (),
                   q_scale: float | None = None, workspace: Workspace | None = None):
    """``bind(q, k, mask, v, out)`` for an attention of ``batches`` batches of ``m`` query
    rows of ``d`` over ``c`` keys, values of ``dv`` (see the module docstring): per flat
    row (``batch * m + row``) the offsets of its mask row, q row and output row; per batch
    where its k and v start; ``k_layout``: (the floats between its rows, whether k is
    given as [C, D] rows: keys, transposed) and ``v_layout``: (the same, whether v is
    [Dv, C]); ``score_ops``: (code, constant) of the ops on the scores before the mask;
    ``q_scale``: a scale q is multiplied by first. With a ``workspace`` the packed keys and
    values and the tasks' scratch are the program's, shared by its attention steps: the
    scratch's leading zeros (read, never written) as long as the longest any step needs,
    the tasks' rows after them."""
    threads = max(current_threads(), 1)
    blocks = max(1, min(-(-m // MR), -(-_TASKS_PER_THREAD * threads // batches)))
    block = -(-m // blocks) if m < MR else -(-(-(-m // blocks)) // MR) * MR
    blocks = -(-m // block)
    tiled = max(block, MR)
    per_task = tiled * (c + d + dv)
    zeros = -(-max(c, dv) // NR) * NR
    size = -(-c // NR) * NR * d + -(-dv // NR) * NR * c
    params = np.zeros(_OPS + 1 + len(score_ops), np.int64)
    params[[_BATCHES, _M, _D, _C, _DV, _BLOCK, _BLOCKS, _K_T, _V_T, _MASK_ROWS, _SCRATCH, _PER_TASK, _SIZE,
            _K_LD, _V_LD, _Q_SCALED, _OPS]] = [
        batches, m, d, c, dv, block, blocks, k_layout[1], v_layout[1], mask_size // c, zeros, per_task, size,
        k_layout[0], v_layout[0], q_scale is not None, len(score_ops)]
    params[_OPS + 1:] = [code for code, _ in score_ops]
    constants = np.array([constant for _, constant in score_ops] + [1.0 if q_scale is None else q_scale], F32)
    offsets = np.concatenate([mask_rows, q_rows, out_rows, k_bases, v_bases]).astype(np.int64)

    if workspace is not None:
        workspace.reserve("attention.zeros", zeros)
        workspace.reserve("attention.tasks", batches * blocks * per_task)
        workspace.reserve("attention.packed", batches * size)

    def bind(q, k, mask, v, out):
        table = np.concatenate([[c], offsets]).astype(np.int64)
        ip = params
        if workspace is None:
            packed = np.empty(batches * size, F32)
            scratch = np.zeros(zeros + batches * blocks * per_task, F32)
        else:
            lead = workspace.size("attention.zeros")
            packed = workspace.array("attention.packed")
            scratch = workspace.array("attention.scratch", lead + workspace.size("attention.tasks"))
            ip = params.copy()
            ip[_SCRATCH] = lead
        return in_sequence([
            bind_task(_visible_keys_task, 1, (mask,), (table,), ip, dtypes=(F32, np.int64)),
            bind_task(_pack_task, 2 * batches, (k, v), (packed, table), ip, dtypes=(F32, F32, F32, np.int64)),
            bind_task(_chain_task, batches * blocks, (q, packed, mask), (out, scratch, table), ip,
                      constants, dtypes=(F32, F32, F32, F32, F32, np.int64))])
    return bind


def attention_kernel(chain: AttentionChain):
    """The chain's kernel (:mod:`litegpu.chains`): ``run(inputs, outputs)`` with ``run.bind``
    (see :func:`.registry.bindable`); its scratch the program's (:func:`.workspace.current`)."""
    from .registry import bindable
    batches, m, d, c, dv = chain.sizes
    rows = np.arange(batches * m, dtype=np.int64)
    every = np.arange(batches, dtype=np.int64)
    bind = attention_step(batches, m, d, c, dv, chain.mask_rows(), int(np.prod(chain.mask_shape, dtype=np.int64)),
                          rows * d, rows * dv, every * c * d, every * c * dv,
                          (d if chain.k_transposed else c, chain.k_transposed),
                          (c if chain.v_transposed else dv, chain.v_transposed),
                          tuple((_SCORE_CODES[op], constant) for op, constant in chain.score_ops),
                          workspace=current_workspace())
    run = bindable(lambda inputs, outputs: bind(*inputs, outputs[0]))
    run.kernel_name = "attention.AttentionChain"
    return run
