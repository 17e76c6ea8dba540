"""GEMMs with a constant right-hand side (FULLY_CONNECTED, 1x1 CONV_2D), packed once.

``out[M, N] = clamp(x[M, K] @ W[K, N] + bias)`` where W is a model constant: at compile
time W is packed into panels of 16 columns, ``[N/16][K][16]``, so that a panel's rows
are contiguous vectors. The kernel is a task function (see :mod:`.tasks`) whose
micro-tile, ``MR`` rows x 16 columns, is written as LLVM IR (:func:`_tile`): ``MR``
vector accumulators in registers, each step of K one vector load of W, ``MR``
broadcasts of x and ``MR`` fused multiply-adds. Bias and clamp are applied as the tile
is stored.

Measured on one Zen 4 core (GFLOP/s, this kernel against numpy's OpenBLAS ``np.dot``):
64x128x128 101 / 90, 60x128x512 110 / 90, 3132x24x144 104 / 75, 780x192x32 107 / 87.
Tasks split the rows (or the panels, whichever operand is larger) over numba's
threads, so unlike a BLAS call the product shares the backend's threads.
"""
from __future__ import annotations

import numpy as np

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .common import F32
from .tasks import bind_task, task_function

# Rows and columns of the micro-tile: MR vector accumulators of NR float32 lanes.
MR, NR = 6, 16
# Below this many multiply-adds a product runs as one task (no parallel region).
SPLIT_MIN_MACS = 1 << 17
# Tasks a split product is cut into: a few per thread evens out the load.
_TASKS = 8


# Parameters before the tap offsets.
_PARAMS = 8


@intrinsic
def _tile(typingctx, xp, wp, bp, outp, ip, r, c, taps, n, jb, lo, hi):
    """The MR x NR tile at row ``r`` of the panel starting at column ``jb``, written as LLVM
    IR with explicit vectors: ``out[r + i, jb:jb + NR] = clamp(bias + sum over taps and
    C of x * w)`` with the MR accumulators as ``<NR x float>`` values in registers, one
    vector load of W, MR broadcasts of x and MR fused multiply-adds per step. (The same
    tile as numba source, 96 scalar accumulators for SLP to pack, took numba 3 s to
    compile; this is a loop LLVM compiles at once.) NaN propagates through the clamp."""
    sig = types.void(xp, wp, bp, outp, ip, types.int64, types.int64, types.int64, types.int64, types.int64,
                     types.float32, types.float32)

    def codegen(context, builder, signature, args):
        x_ptr, w_ptr, b_ptr, out_ptr, ip_ptr, r_, c_, taps_, n_, jb_, lo_, hi_ = args
        i64, f32 = ir.IntType(64), ir.FloatType()
        vec = ir.VectorType(f32, NR)
        vptr = vec.as_pointer()
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vec, [vec, vec, vec]),
                                             f"llvm.fma.v{NR}f32")
        zero = ir.Constant(i64, 0)

        def splat(value):
            return builder.shuffle_vector(builder.insert_element(ir.Constant(vec, ir.Undefined), value, zero),
                                          ir.Constant(vec, ir.Undefined), ir.Constant(ir.VectorType(ir.IntType(32), NR), [0] * NR))

        def vload(ptr, offset):
            return builder.load(builder.bitcast(builder.gep(ptr, [offset]), vptr), align=4)

        bias = vload(b_ptr, jb_)
        panel = builder.mul(jb_, builder.mul(taps_, c_))
        entry = builder.block
        # Loop over taps (t) and, inside, over the C values (q) of each.
        t_head = builder.append_basic_block("tile.tap")
        q_head = builder.append_basic_block("tile.q")
        q_body = builder.append_basic_block("tile.qbody")
        t_next = builder.append_basic_block("tile.tapnext")
        done = builder.append_basic_block("tile.done")
        builder.branch(t_head)

        builder.position_at_end(t_head)
        t = builder.phi(i64)
        t.add_incoming(zero, entry)
        t_acc = [builder.phi(vec) for _ in range(MR)]
        for a in t_acc:
            a.add_incoming(bias, entry)
        more_taps = builder.icmp_signed("<", t, taps_)
        offset = builder.load(builder.gep(ip_ptr, [builder.add(ir.Constant(i64, _PARAMS), t)]))
        xb = builder.mul(builder.add(r_, offset), c_)
        wb0 = builder.add(panel, builder.mul(builder.mul(t, c_), ir.Constant(i64, NR)))
        t_block = builder.block
        builder.cbranch(more_taps, q_head, done)

        builder.position_at_end(q_head)
        q = builder.phi(i64)
        q.add_incoming(zero, t_block)
        q_acc = [builder.phi(vec) for _ in range(MR)]
        for a, outer in zip(q_acc, t_acc):
            a.add_incoming(outer, t_block)
        builder.cbranch(builder.icmp_signed("<", q, c_), q_body, t_next)

        builder.position_at_end(q_body)
        wv = vload(w_ptr, builder.add(wb0, builder.mul(q, ir.Constant(i64, NR))))
        new_acc = []
        for i, acc in enumerate(q_acc):
            xi = builder.load(builder.gep(x_ptr, [builder.add(builder.add(xb, builder.mul(ir.Constant(i64, i), c_)), q)]))
            new_acc.append(builder.call(fma, [splat(xi), wv, acc]))
        q_next = builder.add(q, ir.Constant(i64, 1))
        q.add_incoming(q_next, q_body)
        for a, v in zip(q_acc, new_acc):
            a.add_incoming(v, q_body)
        builder.branch(q_head)

        builder.position_at_end(t_next)
        t.add_incoming(builder.add(t, ir.Constant(i64, 1)), t_next)
        for a, v in zip(t_acc, q_acc):
            a.add_incoming(v, t_next)
        builder.branch(t_head)

        builder.position_at_end(done)
        lo_v, hi_v = splat(lo_), splat(hi_)
        for i, acc in enumerate(t_acc):
            low = builder.select(builder.fcmp_ordered("<", acc, lo_v), lo_v, acc)
            high = builder.select(builder.fcmp_ordered(">", low, hi_v), hi_v, low)
            dst = builder.add(builder.mul(builder.add(r_, ir.Constant(i64, i)), n_), jb_)
            builder.store(high, builder.bitcast(builder.gep(out_ptr, [dst]), vptr), align=4)
        return context.get_dummy_value()

    return sig, codegen


@task_function()
def _packed_gemm(t, xp, wp, bp, outp, _a4, _a5, _a6, _a7, ip, fp):
    """Task ``t`` of ``out = clamp(A @ W + bias)``: rows ``r0 .. r1`` (at least MR of them)
    of the panels ``p0 .. p1``, in MR x NR tiles (:func:`_tile`); where fewer than MR rows
    remain, the last tile is moved back to end at ``r1``, recomputing a few rows (with
    the same values) rather than running a second, one-row tile. Row ``r`` of A is the
    concatenation over taps of the C values at row ``r + offset[tap]`` of x: a plain
    product is one tap at offset 0 with C = K. ``ip``: M, C, T, N, row_chunk, row_tasks,
    panel_chunk, panel_tasks, then the T offsets; ``fp``: lo, hi."""
    m, c, taps, n = ip[0], ip[1], ip[2], ip[3]
    row_chunk, row_tasks, panel_chunk, panel_tasks = ip[4], ip[5], ip[6], ip[7]
    row_task = t // panel_tasks
    r0 = row_task * row_chunk
    r1 = m if row_task == row_tasks - 1 else r0 + row_chunk
    p0 = (t % panel_tasks) * panel_chunk
    for p in range(p0, min(n // NR, p0 + panel_chunk)):
        r = r0
        while r < r1:
            r = min(r, r1 - MR)
            _tile(xp, wp, bp, outp, ip, r, c, taps, n, p * NR, fp[0], fp[1])
            r += MR


def fits(m: int, n: int) -> bool:
    """True when the packed kernel takes an [M, K] x [K, N] product: whole panels of
    output columns (N a multiple of 16) and at least one tile of rows."""
    return m >= MR and n % NR == 0 and n > 0


def pack(w_kn: np.ndarray) -> np.ndarray:
    """W [K, N] (N a multiple of 16) as panels [N/16, K, 16]."""
    k, n = w_kn.shape
    return np.ascontiguousarray(np.asarray(w_kn, F32).reshape(k, n // NR, NR).transpose(1, 0, 2))


def split(m: int, n: int, k: int, threads: int) -> tuple[int, int, int, int]:
    """``(row_chunk, row_tasks, panel_chunk, panel_tasks)``: tasks cut along the rows (in
    whole tiles, the last task taking the rest) or along the panels, whichever operand
    is the larger to share out."""
    panels = n // NR
    if threads < 2 or m * n * k < SPLIT_MIN_MACS:
        return m, 1, panels, 1
    if m >= n:
        row_chunk = _ceil_div(_ceil_div(m, _TASKS), MR) * MR
        return row_chunk, m // row_chunk, panels, 1
    panel_chunk = _ceil_div(panels, _TASKS)
    return m, 1, panel_chunk, _ceil_div(panels, panel_chunk)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class PackedMatmul:
    """``bind(x, out [M, N]) -> call`` computing ``out = clamp(A @ W + bias, lo, hi)`` for
    the constant ``w_kn`` [K, N] (N a multiple of 16), packed here once; ``threads``: the
    numba threads the tasks are cut for.

    With ``offsets`` (T of them, K = T * C) A is implicit: its row ``r`` is, for each
    tap, the C values of row ``r + offsets[tap]`` of ``x`` [rows, C] (a convolution over
    a padded image, one tap per filter position); ``x`` must then have enough rows past
    M for the largest offset. Without, A is ``x`` [M, K] itself."""

    def __init__(self, w_kn: np.ndarray, bias: np.ndarray, lo: float, hi: float, threads: int,
                 offsets: tuple[int, ...] = (0,)) -> None:
        k, n = w_kn.shape
        if not fits(MR, n) or k % len(offsets):
            raise ValueError(f"packed matmul takes N a multiple of {NR} and K a multiple of the taps, "
                             f"not K={k} N={n} with {len(offsets)} taps")
        self.task = _packed_gemm
        self.weights = pack(w_kn)
        self.bias = np.ascontiguousarray(bias, dtype=F32)
        self.floats = np.array([lo, hi], F32)
        self.k, self.n, self.threads = k, n, threads
        self.offsets = tuple(int(v) for v in offsets)
        self.c = k // len(self.offsets)

    def bind(self, x: np.ndarray, out: np.ndarray):
        """The call on these arrays (shapes checked: the kernel trusts them)."""
        m = out.shape[0]
        need = m + max(self.offsets)
        if x.ndim != 2 or x.shape[1] != self.c or x.shape[0] < need or out.shape != (m, self.n) or m < MR:
            raise ValueError(f"packed matmul for [M >= {MR}, {self.k}] -> [M, {self.n}] given "
                             f"{x.shape} -> {out.shape}")
        row_chunk, row_tasks, panel_chunk, panel_tasks = split(m, self.n, self.k, self.threads)
        params = np.array([m, self.c, len(self.offsets), self.n, row_chunk, row_tasks, panel_chunk, panel_tasks,
                           *self.offsets], np.int64)
        return bind_task(self.task, row_tasks * panel_tasks, (x, self.weights, self.bias), (out,), params,
                         self.floats)


def packed_matmul(w_kn: np.ndarray, bias: np.ndarray | None, lo: float, hi: float, m: int) -> PackedMatmul | None:
    """A :class:`PackedMatmul` for products of ``m`` rows with ``w_kn`` (bias None: zero),
    cut for numba's current thread count (the backend sets it before it compiles), or
    None when :func:`fits` says no."""
    import numba
    n = w_kn.shape[1]
    if not fits(m, n):
        return None
    return PackedMatmul(w_kn, np.zeros(n, F32) if bias is None else bias, lo, hi, numba.get_num_threads())
