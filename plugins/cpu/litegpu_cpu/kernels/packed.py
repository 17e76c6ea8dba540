"""GEMMs with a constant right-hand side (FULLY_CONNECTED, 1x1 CONV_2D), packed once.

``out[M, N] = clamp(x[M, K] @ W[K, N] + bias)`` where W is a model constant: at compile
time W is packed into panels of 16 columns, ``[N/16][K][16]``, so that a panel's rows
are contiguous vectors. The kernel is a task function (see :mod:`.tasks`) whose
micro-tile, ``MR`` rows x two panels of 16 columns, is written as LLVM IR
(:func:`_tile2`): ``2 MR`` vector accumulators in registers, each step of K one vector
load of W per panel, ``MR`` broadcasts of x and ``2 MR`` fused multiply-adds. Bias and
clamp are applied as the tile is stored.

Measured on one Zen 4 core with one-panel tiles (GFLOP/s, this kernel against numpy's
OpenBLAS ``np.dot``): 64x128x128 101 / 90, 60x128x512 110 / 90, 3132x24x144 104 / 75,
780x192x32 107 / 87. Two panels a tile: 64x768x2048 on two cores 0.57 -> 0.40 ms
(LiteRT's XNNPACK: 0.44 ms).
Tasks split the rows (or the panels, whichever operand is larger) over numba's
threads, so unlike a BLAS call the product shares the backend's threads.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from llvmlite import binding, ir

from ..jit import carray, cgutils, intrinsic, njit, types
from .common import F32
from .threads import current as current_threads
from .tasks import advanced, bind_task, bound_tasks, in_sequence, task_function

# Rows and columns of the micro-tile: MR vector accumulators of NR float32 lanes.
MR, NR = 6, 16
# Below this many multiply-adds a product runs as one task (no parallel region).
SPLIT_MIN_MACS = 1 << 17
# Tasks a split product is cut into: a few per thread evens out the load.
_TASKS = 8


_LLVM_MAJOR = binding.llvm_version_info[0]

# The vector type of the hand-written tiles: NR float32 lanes (a zmm register on AVX-512,
# two ymm on AVX2, which LLVM splits for us).
VECTOR = ir.VectorType(ir.FloatType(), NR)


def fma_function(builder):
    """LLVM's fused multiply-add on :data:`VECTOR`, declared in ``builder``'s module."""
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(VECTOR, [VECTOR] * 3),
                                          f"llvm.fma.v{NR}f32")


def splat_vector(builder, value, vector=VECTOR):
    """``value`` in every lane of a ``vector`` (default :data:`VECTOR`, of floats)."""
    lane = builder.insert_element(ir.Constant(vector, ir.Undefined), value, ir.Constant(ir.IntType(64), 0))
    return builder.shuffle_vector(lane, ir.Constant(vector, ir.Undefined),
                                  ir.Constant(ir.VectorType(ir.IntType(32), vector.count), [0] * vector.count))


def load_vector(builder, pointer, offset):
    """The :data:`VECTOR` at float ``pointer + offset`` (any alignment)."""
    return builder.load(builder.bitcast(builder.gep(pointer, [offset]), VECTOR.as_pointer()), align=4)


def store_vector(builder, value, pointer, offset):
    """Store ``value`` at float ``pointer + offset`` (any alignment)."""
    builder.store(value, builder.bitcast(builder.gep(pointer, [offset]), VECTOR.as_pointer()), align=4)


def store_panel(builder, value, pointer, offset, whole, left):
    """Store ``value`` at float ``pointer + offset``: every lane when ``whole`` (an i1),
    else only the first ``left`` (the last, partial panel of a row)."""
    with builder.if_else(whole) as (full, partial):
        with full:
            store_vector(builder, value, pointer, offset)
        with partial:
            store_first_lanes(builder, value, pointer, offset, left)


def store_first_lanes(builder, value, pointer, offset, count):
    """Store the first ``count`` lanes of ``value`` (an i64, 1 .. NR) at float ``pointer +
    offset``, touching no memory past them: the last, partial panel of a row."""
    lanes = ir.Constant(ir.VectorType(ir.IntType(64), NR), list(range(NR)))
    counts = builder.insert_element(ir.Constant(lanes.type, ir.Undefined), count, ir.Constant(ir.IntType(64), 0))
    counts = builder.shuffle_vector(counts, ir.Constant(lanes.type, ir.Undefined),
                                    ir.Constant(ir.VectorType(ir.IntType(32), NR), [0] * NR))
    mask = builder.icmp_signed("<", lanes, counts)
    # LLVM names the intrinsic after its pointer type: typed pointers before LLVM 17.
    suffix = "p0" if _LLVM_MAJOR >= 17 else f"p0v{NR}f32"
    store = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VoidType(), [VECTOR, VECTOR.as_pointer(), ir.IntType(32), mask.type]),
        f"llvm.masked.store.v{NR}f32.{suffix}")
    target = builder.bitcast(builder.gep(pointer, [offset]), VECTOR.as_pointer())
    builder.call(store, [value, target, ir.Constant(ir.IntType(32), 4), mask])


def carried_loop(builder, count, initial: list, step, name: str) -> list:
    """Emit ``for k in range(count): values = step(k, values)`` with ``values`` (LLVM values,
    a tile's sums) carried in registers from iteration to iteration; returns them after the
    loop, the builder positioned there. ``step`` may emit loops of its own."""
    i64 = ir.IntType(64)
    entry = builder.block
    head = builder.append_basic_block(f"{name}.head")
    body = builder.append_basic_block(f"{name}.body")
    done = builder.append_basic_block(f"{name}.done")
    builder.branch(head)
    builder.position_at_end(head)
    k = builder.phi(i64)
    k.add_incoming(ir.Constant(i64, 0), entry)
    values = [builder.phi(v.type) for v in initial]
    for phi, v in zip(values, initial):
        phi.add_incoming(v, entry)
    builder.cbranch(builder.icmp_signed("<", k, count), body, done)
    builder.position_at_end(body)
    after = step(k, values)
    end = builder.block
    k.add_incoming(builder.add(k, ir.Constant(i64, 1)), end)
    for phi, v in zip(values, after):
        phi.add_incoming(v, end)
    builder.branch(head)
    builder.position_at_end(done)
    return values


def clamp_vector(builder, value, lo, hi):
    """``min(max(value, lo), hi)`` lane by lane (``lo``, ``hi`` splatted), NaN kept: a NaN
    lane fails both ordered comparisons."""
    low = builder.select(builder.fcmp_ordered("<", value, lo), lo, value)
    return builder.select(builder.fcmp_ordered(">", low, hi), hi, low)


# Parameters before the tap offsets.
_PARAMS = 12


def _tile_codegen(panels: int):
    """The IR of a tile of MR rows x ``panels`` panels, written as LLVM IR with explicit
    vectors: ``out[r + i, jb:jb + NR] = clamp(bias + sum over taps and ``length`` values of
    x * w)`` for each panel's first column ``jb``, row ``r + i`` of A reading, per tap, the
    ``length`` values from x's row ``base + i * step + offset[tap]`` on (rows of C values),
    with the MR x panels accumulators as ``<NR x float>`` values in registers: per step one
    vector load of W per panel, MR broadcasts of x and MR x panels fused multiply-adds.
    (The same tile as numba source, 96 scalar accumulators for SLP to pack, took numba 3 s
    to compile; this is a loop LLVM compiles at once.) NaN propagates through the clamp."""
    def codegen(context, builder, signature, args):
        x_ptr, w_ptr, b_ptr, out_ptr, ip_ptr, r_, base_, step_, c_, len_, taps_, n_, *jbs, lo_, hi_ = args
        i64 = ir.IntType(64)
        fma = fma_function(builder)
        biases = [load_vector(builder, b_ptr, jb) for jb in jbs]
        panel_starts = [builder.mul(jb, builder.mul(taps_, len_)) for jb in jbs]
        row_step = builder.mul(step_, c_)

        def tap(t, sums):
            """One filter tap: its ``length`` values, x's rows from ``base + offset[t]``."""
            offset = builder.load(builder.gep(ip_ptr, [builder.add(ir.Constant(i64, _PARAMS), t)]))
            xb = builder.mul(builder.add(base_, offset), c_)
            tap_at = builder.mul(builder.mul(t, len_), ir.Constant(i64, NR))
            wbs = [builder.add(start, tap_at) for start in panel_starts]

            def value(q, acc):
                """One of the tap's values: a vector of W per panel, each row's x
                broadcast once, MR x panels FMAs."""
                at = builder.mul(q, ir.Constant(i64, NR))
                wvs = [load_vector(builder, w_ptr, builder.add(wb, at)) for wb in wbs]
                out = []
                for i in range(MR):
                    x_at = builder.add(builder.add(xb, builder.mul(ir.Constant(i64, i), row_step)), q)
                    xi = splat_vector(builder, builder.load(builder.gep(x_ptr, [x_at])))
                    out += [builder.call(fma, [xi, wv, acc[i * panels + j]]) for j, wv in enumerate(wvs)]
                return out
            return carried_loop(builder, len_, sums, value, "tile.q")

        t_acc = carried_loop(builder, taps_, biases * MR, tap, "tile.tap")
        lo_v, hi_v = splat_vector(builder, lo_), splat_vector(builder, hi_)
        for j, jb in enumerate(jbs):
            # The last panel of a row with N not a multiple of NR stores only its first lanes.
            left = builder.sub(n_, jb)
            whole = builder.icmp_signed(">=", left, ir.Constant(i64, NR))
            for i in range(MR):
                dst = builder.add(builder.mul(builder.add(r_, ir.Constant(i64, i)), n_), jb)
                store_panel(builder, clamp_vector(builder, t_acc[i * panels + j], lo_v, hi_v), out_ptr, dst, whole,
                            left)
        return context.get_dummy_value()
    return codegen


@intrinsic
def _tile2(typingctx, xp, wp, bp, outp, ip, r, base, step, c, length, taps, n, jb, jb2, lo, hi):
    """The MR x 2 NR tile at row ``r`` of the panels starting at columns ``jb`` and ``jb2``
    (:func:`_tile_codegen`): each x broadcast feeds two FMAs, and 2 x MR independent sums
    keep both FMA pipes busy where MR alone cannot cover their latency (64x768x2048 on 2
    Zen 4 cores: 0.57 -> 0.40 ms, LiteRT's XNNPACK 0.44). ``jb2`` may repeat ``jb`` (an odd
    last panel: the same values stored twice)."""
    sig = types.void(xp, wp, bp, outp, ip, *[types.int64] * 9, types.float32, types.float32)
    return sig, _tile_codegen(2)


@task_function()
def _packed_gemm(t, xp, wp, bp, outp, _a4, _a5, _a6, _a7, ip, fp):
    """Task ``t`` of ``out = clamp(A @ W + bias)``: rows ``r0 .. r1`` of the panels
    ``p0 .. p1``, in MR x NR tiles (:func:`_tile`). The rows come in segments of
    ``seg_len`` (at least MR; an output row of a convolution): row ``x`` of segment ``s``
    reads, for each tap, ``length`` values from x's row ``s * seg_stride + x * step +
    offset[tap]`` on (x's rows holding C values). A plain product is one segment, one tap
    at offset 0, step 1 and C = length = K. Where
    fewer than MR rows of a segment remain, its last tile is moved back to end with it,
    recomputing a few rows (with the same values) rather than running a second, one-row
    tile; task chunks hold whole segments, or whole tiles of one. ``ip``: M, C, length,
    T, N, row_chunk, row_tasks, panel_chunk, panel_tasks, seg_len, seg_stride, step, then
    the T offsets; ``fp``: lo, hi."""
    _gemm_share(t, xp, wp, bp, outp, ip, fp)


@task_function()
def _batched_gemm(t, ap, wp, bp, outp, _a4, _a5, _a6, _a7, ip, fp):
    """Task ``t`` of a batched product: batch ``t // ip[13]`` (``ip``: :func:`_packed_gemm`'s
    13 for one batch and one tap, then its tasks, the batch strides of ``a``, of the packed
    ``w`` and of ``out``), that batch's task ``t % ip[13]``: every batch in one call."""
    i = t // ip[13]
    _gemm_share(t % ip[13], advanced(ap, i * ip[14]), advanced(wp, i * ip[15]), bp, advanced(outp, i * ip[16]),
                ip, fp)


@njit(cache=True, inline="always")
def _gemm_share(t, xp, wp, bp, outp, ip, fp):
    """The body of :func:`_packed_gemm`."""
    m, c, length, taps, n = ip[0], ip[1], ip[2], ip[3], ip[4]
    row_chunk, row_tasks, panel_chunk, panel_tasks = ip[5], ip[6], ip[7], ip[8]
    seg_len, seg_stride, step = ip[9], ip[10], ip[11]
    row_task = t // panel_tasks
    r0 = row_task * row_chunk
    r1 = m if row_task == row_tasks - 1 else r0 + row_chunk
    p0 = (t % panel_tasks) * panel_chunk
    p1 = min((n + NR - 1) // NR, p0 + panel_chunk)
    for p in range(p0, p1, 2):
        p2 = min(p + 1, p1 - 1)
        r = r0
        while r < r1:
            seg = r // seg_len
            end = min(r1, (seg + 1) * seg_len)
            while r < end:
                r = min(r, end - MR)
                _tile2(xp, wp, bp, outp, ip, r, seg * seg_stride + (r - seg * seg_len) * step, step, c, length, taps,
                       n, p * NR, p2 * NR, fp[0], fp[1])
                r += MR


def fits(m: int, n: int) -> bool:
    """True when the packed kernel takes an [M, K] x [K, N] product: at least one tile of
    rows."""
    return m >= MR and n > 0


def pack(w_kn: np.ndarray) -> np.ndarray:
    """W [K, N] as panels [ceil(N / 16), K, 16], zeros past N."""
    k, n = w_kn.shape
    padded = np.zeros((k, _ceil_div(n, NR) * NR), F32)
    padded[:, :n] = w_kn
    return np.ascontiguousarray(padded.reshape(k, -1, NR).transpose(1, 0, 2))


def split(m: int, n: int, k: int, threads: int, seg_len: int) -> tuple[int, int, int, int]:
    """``(row_chunk, row_tasks, panel_chunk, panel_tasks)``: tasks cut along the rows (in
    whole segments of ``seg_len`` rows, or whole tiles when there is one segment; the
    last task taking the rest) or along the panels, whichever operand is the larger to
    share out."""
    panels = _ceil_div(n, NR)
    if threads < 2 or m * n * k < SPLIT_MIN_MACS:
        return m, 1, panels, 1
    if m >= n:
        unit = seg_len if seg_len < m else MR
        chunk, tasks = _balanced(m // unit, threads, rest_in_last=True)
        return chunk * unit, tasks, panels, 1
    chunk, tasks = _balanced(panels, threads, rest_in_last=False)
    return m, 1, chunk, tasks


@lru_cache(maxsize=None)
def _balanced(units: int, threads: int, rest_in_last: bool) -> tuple[int, int]:
    """``(chunk, tasks)``: ``units`` cut into tasks of ``chunk`` units (the last one takes
    the rest with ``rest_in_last``, else it is the remainder), up to twice ``_TASKS`` of
    them, that ``threads`` threads claiming tasks in turn finish soonest; among equals, the
    count nearest ``_TASKS``. (Cutting 28 output rows of a conv into 7 tasks of 4 left one
    of two threads 4 tasks to the other's 3: the row ran at 7/8 of its speed.)"""
    best: tuple = ()
    # (a smaller chunk makes more than 2 * _TASKS tasks: ~20 ms of a warm start went to them)
    for chunk in range(max(1, units // (2 * _TASKS + 1)), units + 1):
        tasks = units // chunk if rest_in_last else _ceil_div(units, chunk)
        if tasks > 2 * _TASKS:
            continue
        loads = [0] * threads
        for size in [chunk] * (tasks - 1) + [units - (tasks - 1) * chunk]:
            loads[loads.index(min(loads))] += size
        key = (max(loads), abs(tasks - _TASKS), chunk, tasks)
        best = min(best, key) if best else key
    return best[2], best[3]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


class PackedMatmul:
    """``bind(x, out [M, N]) -> call`` computing ``out = clamp(A @ W + bias, lo, hi)`` for
    the constant ``w_kn`` [K, N], packed here once (zero columns up to a multiple of 16,
    which the last panel computes but does not store); ``threads``: the threads the
    tasks are cut for.

    With ``offsets`` (T of them) A is implicit, a convolution over a padded image ``x``
    [pixels, C]: row ``r`` of A is, for each tap, the K / T values from x's pixel
    ``r + offset`` on (one filter row of KW taps over C channels, contiguous where the
    dilation along the width is 1); see :meth:`bind`. Without, A is ``x`` [M, K] itself."""

    def __init__(self, w_kn: np.ndarray, bias: np.ndarray, lo: float, hi: float, threads: int,
                 offsets: tuple[int, ...] = (0,), packed: np.ndarray | None = None) -> None:
        k, n = w_kn.shape
        if not fits(MR, n) or k % len(offsets) or np.shape(bias) != (n,):
            raise ValueError(f"packed matmul takes N > 0, K a multiple of the taps and N biases, "
                             f"not K={k} N={n} with {len(offsets)} taps and {np.shape(bias)} biases")
        self.task = _packed_gemm
        self.weights = pack(w_kn) if packed is None else packed   # (made already: :func:`pack` of w_kn)
        self.bias = np.zeros(self.weights.shape[0] * NR, F32)   # whole panels: the tile loads 16
        self.bias[:n] = bias
        self.floats = np.array([lo, hi], F32)
        self.k, self.n, self.threads = k, n, threads
        self.offsets = tuple(int(v) for v in offsets)
        self.length = k // len(self.offsets)

    def bind(self, x: np.ndarray, out: np.ndarray, segments: tuple[int, int, int] | None = None):
        """The call on these arrays (shapes checked: the kernel trusts them). ``segments``
        ``(seg_len, seg_stride, step)``: out's rows in runs of ``seg_len`` (at least MR),
        row ``j`` of run ``s`` reading x's rows ``s * seg_stride + j * step + offset``
        (an output row of a convolution, its stride, the row stride of the padded image);
        None: one run with step 1."""
        m = out.shape[0]
        seg_len, seg_stride, step = segments or (m, m, 1)
        c = x.shape[1] if x.ndim == 2 else 0
        last = (m // max(seg_len, 1) - 1) * seg_stride + (seg_len - 1) * step + max(self.offsets)
        if x.ndim != 2 or (segments is None and c != self.k) or out.shape != (m, self.n) or m < MR \
                or seg_len < MR or m % seg_len or last * c + self.length > x.size:
            raise ValueError(f"packed matmul for [M >= {MR}, {self.k}] -> [M, {self.n}] given "
                             f"{x.shape} -> {out.shape} in runs of {seg_len}")
        row_chunk, row_tasks, panel_chunk, panel_tasks = split(m, self.n, self.k, self.threads, seg_len)
        params = np.array([m, c, self.length, len(self.offsets), self.n, row_chunk, row_tasks, panel_chunk,
                           panel_tasks, seg_len, seg_stride, step, *self.offsets], np.int64)
        return bind_task(self.task, row_tasks * panel_tasks, (x, self.weights, self.bias), (out,), params,
                         self.floats)


def packed_matmul(w_kn: np.ndarray, bias: np.ndarray | None, lo: float, hi: float, m: int,
                  packed: np.ndarray | None = None) -> PackedMatmul | None:
    """A :class:`PackedMatmul` for products of ``m`` rows with ``w_kn`` (bias None: zero),
    cut for numba's current thread count (the backend sets it before it compiles), or
    None when :func:`fits` says no. ``packed``: :func:`pack` of ``w_kn``, made already."""
    n = w_kn.shape[1]
    if not fits(m, n):
        return None
    return PackedMatmul(w_kn, np.zeros(n, F32) if bias is None else bias, lo, hi, current_threads(), packed=packed)


# -- products of two activations (BATCH_MATMUL) -------------------------------------------------
#
# An attention's scores and weighted values: each batch's right-hand side is packed into
# panels when the product runs (a copy a fraction of the product's time), then the tiles
# above take it as they take a weight. Rows below MR keep to :mod:`.gemm`.

_PACK_TASKS = 8


def _transpose_codegen(context, builder, signature, args):
    """Load NR vectors of NR floats from ``src + row * src_stride``, swap their off-diagonal
    blocks at widths 8, 4, 2 and 1 (a shuffle each: the transpose of a 16 x 16 block), store
    vector i at ``dst + i * NR``."""
    src, src_at, src_stride, dst, dst_at = args
    src_ptr = cgutils.create_struct_proxy(signature.args[0])(context, builder, value=src).data
    dst_ptr = cgutils.create_struct_proxy(signature.args[3])(context, builder, value=dst).data
    rows = [load_vector(builder, src_ptr, builder.add(src_at, builder.mul(src_stride, ir.Constant(src_at.type, i))))
            for i in range(NR)]
    i32 = ir.IntType(32)
    h = NR // 2
    while h:
        low = ir.Constant(ir.VectorType(i32, NR), [j if j & h == 0 else j - h + NR for j in range(NR)])
        high = ir.Constant(ir.VectorType(i32, NR), [j + h if j & h == 0 else j + NR for j in range(NR)])
        for r in range(NR):
            if r & h == 0:
                a, b = rows[r], rows[r + h]
                rows[r], rows[r + h] = builder.shuffle_vector(a, b, low), builder.shuffle_vector(a, b, high)
        h //= 2
    for i, row in enumerate(rows):
        store_vector(builder, row, dst_ptr, builder.add(dst_at, ir.Constant(dst_at.type, i * NR)))
    return context.get_dummy_value()


@intrinsic
def _transpose16(typingctx, src, src_at, src_stride, dst, dst_at):
    """``dst[dst_at + i * NR + j] = src[src_at + j * src_stride + i]`` for i, j < NR
    (1-D float32 arrays): a 16 x 16 block transposed in registers."""
    return types.void(src, types.int64, types.int64, dst, types.int64), _transpose_codegen


@task_function()
def _batched_pack_task(t, bp, outp, _a2, _a3, _a4, _a5, _a6, _a7, ip, _fp):
    """Batch ``t // ip[4]`` of ``b``, its task ``t % ip[4]`` (:func:`_pack_share`; ``ip``: K,
    N, transposed, chunk, then the tasks of a batch)."""
    k, n, per = ip[0], ip[1], ip[4]
    i = t // per
    _pack_share(t % per, advanced(bp, i * k * n), advanced(outp, i * k * ((n + NR - 1) // NR) * NR), ip)


@njit(cache=True, inline="always")
def _pack_share(t, bp, outp, ip):
    """Panels ``[t * chunk, (t + 1) * chunk)`` of ``b`` packed as :func:`pack` packs a
    weight: ``b`` [K, N], or [N, K] when transposed (adj_y), into ``out`` [panels, K, 16],
    zeros past N (``ip``: K, N, transposed, chunk)."""
    k, n, transposed, chunk = ip[0], ip[1], ip[2], ip[3]
    panels = (n + NR - 1) // NR
    pack_panels(bp, outp, k, n, k if transposed else n, transposed, t * chunk, min(panels, (t + 1) * chunk))


@njit(cache=True, inline="always")
def pack_panels(srcp, outp, k, n, stride, transposed, p0, p1):
    """Panels ``p0 .. p1`` of B [k, n] as :func:`pack` lays out a weight (panel p at ``p * k *
    NR``, [k][NR], zeros past n): B's rows ``stride`` floats apart, or, ``transposed``, B
    given as its n columns, each a row of k floats ``stride`` apart."""
    for p in range(p0, p1):
        base = p * k * NR
        lanes = min(NR, n - p * NR)
        done = 0
        if transposed:
            # Each column of the panel is a row of the source: whole 16 x 16 blocks
            # transposed in registers (element by element, a 512 x 64 batch took 9.5 us, a
            # quarter of an attention's product), the rest one by one.
            if lanes == NR:
                src = carray(srcp, ((p * NR + NR - 1) * stride + k,))
                out = carray(outp, (base + k * NR,))
                while done + NR <= k:
                    _transpose16(src, p * NR * stride + done, stride, out, base + done * NR)
                    done += NR
            for lane in range(lanes):
                for q in range(done, k):
                    outp[base + q * NR + lane] = srcp[(p * NR + lane) * stride + q]
        else:
            for q in range(k):
                for lane in range(lanes):
                    outp[base + q * NR + lane] = srcp[q * stride + p * NR + lane]
        for lane in range(lanes, NR):
            for q in range(k):
                outp[base + q * NR + lane] = np.float32(0)


def batched_product(a_shape: tuple, b_shape: tuple, adj_y: bool, threads: int):
    """``bind(a, b, out) -> call`` for BATCH_MATMUL of float32 ``a`` [..., M, K] and ``b``
    [..., K, N] ([..., N, K] with ``adj_y``) of one batch shape, M at least MR: per batch,
    ``b`` packed into panels, then the tiles' product; None for other shapes."""
    if len(a_shape) < 2 or len(a_shape) != len(b_shape) or tuple(a_shape[:-2]) != tuple(b_shape[:-2]):
        return None
    m, k = int(a_shape[-2]), int(a_shape[-1])
    n = int(b_shape[-2] if adj_y else b_shape[-1])
    if int(b_shape[-1] if adj_y else b_shape[-2]) != k or not fits(m, n) or k == 0:
        return None
    batches = int(np.prod(a_shape[:-2], dtype=np.int64))
    if batches == 0:
        return None
    panels = _ceil_div(n, NR)
    chunk = _ceil_div(panels, min(_PACK_TASKS, panels))
    pack_tasks = _ceil_div(panels, chunk)
    pack_params = np.array([k, n, int(adj_y), chunk, pack_tasks], np.int64)
    zero_bias = np.zeros(panels * NR, F32)
    bounds = np.array([-np.inf, np.inf], F32)
    rows = split(m, n, k, threads, m)
    gemm_tasks = rows[1] * rows[3]
    gemm_params = np.array([m, k, k, 1, n, *rows, m, m, 1, 0, gemm_tasks, m * k, panels * k * NR, m * n], np.int64)

    def bind(a: np.ndarray, b: np.ndarray, out: np.ndarray):
        if not (a.flags.c_contiguous and b.flags.c_contiguous and out.flags.c_contiguous):
            raise ValueError("batched product of arrays that are not C-contiguous")
        packed = np.empty((batches, panels, k, NR), F32)
        # Two calls whatever the batch count (a call per batch and step cost an attention's
        # 4 batches 8 parallel regions).
        return in_sequence([
            bound_tasks(_batched_pack_task, batches * pack_tasks, (b, packed), pack_params),
            bound_tasks(_batched_gemm, batches * gemm_tasks, (a, packed, zero_bias, out), gemm_params, bounds)])
    return bind
