"""Dynamically quantized products with blockwise weights: float rows times a constant int4
weight scaled per block of K, float results (an LLM's INT4 FULLY_CONNECTED).

XNNPACK's qd8-f32-qb4w arithmetic, as the op's hybrid reference has it
(:func:`litegpu.ops.hybrid.xnn_blockwise_product`), step for step so the results are
LiteRT's to the bit:

1. each input row quantized to int8 as for qc8w weights (:func:`.qd8gemm.bind_quantize_rows`,
   shared with the other products that read the same tensor);
2. per row and output column, a float32 accumulator starting at the column's packed
   ``-sum_b scale_b sum w_b`` times the row's ``128 + zp``;
3. per block of K: the integer sum of ``(q + 128) w`` over the block (the K loop of
   :mod:`.qgemm`'s tiles, ``vpdpbusd`` where the host has it), made float32 and fused
   multiply-added with the block's bf16-rounded scale into the accumulator;
4. times the row's scale, plus the bias, clamped, stored.

The weights are packed as :func:`.qgemm.pack` packs an int8 weight (panels of 16 columns,
64 bytes per four K steps), then two K steps of four share each 64 bytes, a nibble each
(:func:`pack_nibbles`): half the bytes an int8 weight streams, which is what a decode
step's time goes to. The tile takes the low nibbles shifted up and the high ones masked,
each byte then ``16 w`` as a signed byte (XNNPACK's qb4w trick), so ``vpdpbusd`` sums
``16 (q + 128) w`` and an arithmetic shift by 4 gives the exact sum back. A block is a
whole number of such pairs (a multiple of 8 values; exporters write 32 or 128).
"""
from __future__ import annotations

import hashlib

import numpy as np
from llvmlite import ir

from litegpu.backend import NodeContext
from litegpu.graph import Int4Constant
from litegpu.ops.hybrid import blockwise_zero_point_sums

from ..jit import intrinsic, types
from .common import clamp_bounds, optional_input
from .packed import NR, VECTOR, carried_loop, clamp_vector, fma_function, load_vector, splat_vector, store_panel
from .qd8gemm import SharedRowsProduct, tiled_rows
from .qgemm import _ROW_PANELS, _SUMS, _TILE_PANELS, MR, VNNI, _dot4, _task_share, panel_words, split, tile_geometry
from .registry import bindable
from .shared_weights import shared_packing
from .tasks import bind_task, task_function
from .threads import current as current_threads

_I64 = ir.IntType(64)
_I32 = ir.IntType(32)


def pack_nibbles(w_nk: np.ndarray) -> np.ndarray:
    """int4 values (held as int8) ``w_nk`` [N, K], K a multiple of 8, as :func:`.qgemm.pack`'s
    panels with K steps ``2i`` and ``2i + 1`` in one 64-byte vector: ``[ceil(N/16), K/8, 16,
    4]`` bytes, step ``2i``'s value in each low nibble, step ``2i + 1``'s in the high one."""
    n, k = w_nk.shape
    n16 = -(-n // NR) * NR
    padded = np.zeros((n16, k), np.int8)
    padded[:n] = w_nk
    # Word i of a column holds K steps 4i..4i+3: pairs of words make one word of nibbles.
    words = padded.view(np.uint32).reshape(n16, k // 8, 2)
    nibbles = (words[:, :, 0] & 0x0F0F0F0F) | ((words[:, :, 1] & 0x0F0F0F0F) << 4)
    return panel_words(nibbles).view(np.int8).reshape(n16 // NR, k // 8, NR, 4)


def _nibble_steps(builder, vnni: bool, panels: int, w_ptr, w_panels: list, x_ptr, x_rows: list, w_first, chains: int):
    """The body of a block's loop over pairs of K steps, ``step(i, sums)``: each panel's 64
    bytes at pair ``w_first + i`` unpacked into its two K steps (each byte ``16 w``), times
    each row's eight bytes of x at ``x_rows[r] + 8 i`` plus 128, added to ``sums`` (by chain,
    row, then panel: with two chains the two K steps add into separate sums, so a row's
    few panels are not one chain of dependent ``vpdpbusd``)."""
    byte_ptr = ir.IntType(8).as_pointer()
    x_bytes, w_bytes = builder.bitcast(x_ptr, byte_ptr), builder.bitcast(w_ptr, byte_ptr)
    flip = ir.Constant(_I32, -0x7F7F7F80)      # 0x80808080: x + 128 in every byte
    high = ir.Constant(_SUMS, [-0x0F0F0F10] * NR)    # 0xF0F0F0F0: each byte's high nibble
    four = ir.Constant(_SUMS, [4] * NR)
    rows = len(x_rows)

    def step(i, sums):
        at = builder.mul(builder.add(w_first, i), ir.Constant(_I64, 4 * NR))
        packed = [builder.load(builder.bitcast(builder.gep(w_bytes, [builder.add(wp, at)]), _SUMS.as_pointer()),
                               align=1) for wp in w_panels]
        ws = [(builder.and_(builder.shl(v, four), high), builder.and_(v, high)) for v in packed]
        k_at = builder.mul(i, ir.Constant(_I64, 8))
        out = list(sums)
        for r, x_row in enumerate(x_rows):
            for half in (0, 1):
                at_x = builder.add(x_row, builder.add(k_at, ir.Constant(_I64, 4 * half)))
                four_x = builder.load(builder.bitcast(builder.gep(x_bytes, [at_x]), _I32.as_pointer()), align=1)
                xs = splat_vector(builder, builder.xor(four_x, flip), _SUMS)
                base = (half % chains) * rows * panels + r * panels
                for j in range(panels):
                    out[base + j] = _dot4(builder, out[base + j], xs, ws[j][half], vnni)
        return out
    return step


def _tile_codegen(vnni: bool, rows: int, panels: int):
    """The IR of a tile of ``rows`` rows x ``panels`` panels of 16 columns (the module
    docstring's steps 2-4): float32 accumulators carried over the blocks, each block's
    int32 sums carried over its K steps."""
    def codegen(context, builder, signature, args):
        (x_ptr, w_ptr, ksum_ptr, scale_ptr, bias_ptr, rowscale_ptr, rowc_ptr, out_ptr,
         r_, last_, stride_, groups_, n_, p_, plast_, block_groups_, blocks_, lo_, hi_) = args
        # (groups_: pairs of K steps, 64 bytes each, per panel)
        row_of, jbs, w_panels = tile_geometry(builder, rows, panels, r_, last_, p_, plast_, groups_)
        x_rows = [builder.mul(row, stride_) for row in row_of]
        chains = 2 if rows * panels <= 4 else 1
        row_cs = builder.bitcast(rowc_ptr, _I32.as_pointer())
        fma = fma_function(builder)
        ksums = [load_vector(builder, ksum_ptr, jb) for jb in jbs]
        starts = []
        for r in row_of:
            c = splat_vector(builder, builder.sitofp(builder.load(builder.gep(row_cs, [r])), ir.FloatType()))
            starts += [builder.fmul(ksum, c) for ksum in ksums]
        # A panel's block scales are [blocks][16] floats from its column jb * blocks.
        scale_rows = [builder.mul(jb, blocks_) for jb in jbs]
        zeros = [ir.Constant(_SUMS, [0] * NR)] * (chains * rows * panels)
        four = ir.Constant(_SUMS, [4] * NR)

        def block(b, accs):
            first = builder.mul(b, block_groups_)      # the block's first pair of K steps
            x_block = [builder.add(x, builder.mul(first, ir.Constant(_I64, 8))) for x in x_rows]
            step = _nibble_steps(builder, vnni, panels, w_ptr, w_panels, x_ptr, x_block, first, chains)
            sums = carried_loop(builder, block_groups_, zeros, step, "qb4w.k")
            if chains == 2:
                half = rows * panels
                sums = [builder.add(a, c) for a, c in zip(sums[:half], sums[half:])]
            at = builder.mul(b, ir.Constant(_I64, NR))
            scales = [load_vector(builder, scale_ptr, builder.add(s, at)) for s in scale_rows]
            # Each sum is 16 times (q + 128) w summed: exact, and so is the shift back.
            return [builder.call(fma, [builder.sitofp(builder.ashr(s, four), VECTOR), scales[i % panels], a])
                    for i, (s, a) in enumerate(zip(sums, accs))]

        accs = carried_loop(builder, blocks_, starts, block, "qb4w.block")
        lo, hi = splat_vector(builder, lo_), splat_vector(builder, hi_)
        for j, jb in enumerate(jbs):
            bias = load_vector(builder, bias_ptr, jb)
            left = builder.sub(n_, jb)
            whole = builder.icmp_signed(">=", left, ir.Constant(_I64, NR))
            for i, r in enumerate(row_of):
                scale = splat_vector(builder, builder.load(builder.gep(rowscale_ptr, [r])))
                value = builder.fadd(builder.fmul(accs[i * panels + j], scale), bias)
                store_panel(builder, clamp_vector(builder, value, lo, hi), out_ptr,
                            builder.add(builder.mul(r, n_), jb), whole, left)
        return context.get_dummy_value()
    return codegen


def _make_tile(vnni: bool, rows: int, panels: int):
    @intrinsic
    def tile(typingctx, xp, wp, ksump, scalep, biasp, rowscalep, rowcp, outp, r, last, stride, groups, n, p,
             plast, block_groups, blocks, lo, hi):
        """``rows`` rows from ``r`` (clamped to ``last``) x ``panels`` panels from ``p``
        (clamped to ``plast``) of the blockwise product, ``blocks`` blocks of
        ``block_groups`` pairs of K steps of four (``groups`` pairs in all), clamped to [lo, hi]."""
        sig = types.void(xp, wp, ksump, scalep, biasp, rowscalep, rowcp, outp, *[types.int64] * 9,
                         types.float32, types.float32)
        return sig, _tile_codegen(vnni, rows, panels)
    return tile


_tile_vnni, _row_vnni = _make_tile(True, MR, _TILE_PANELS), _make_tile(True, 1, _ROW_PANELS)
_tile_plain, _row_plain = _make_tile(False, MR, _TILE_PANELS), _make_tile(False, 1, _ROW_PANELS)


# One task function per instruction set, as in .qgemm: the VNNI one is never compiled on
# a host without it. ``ip``: .qgemm._qgemm_vnni's first eight (with pairs of K steps for K
# steps), then pairs per block and blocks; ``fp``: the clamp's lo, hi.
@task_function(requires=("avx512vnni",))
def _qb4w_vnni(t, qp, wp, ksump, scalep, biasp, rowscalep, rowcp, outp, ip, fp):
    """Task ``t`` of the blockwise product with ``vpdpbusd``."""
    r0, r1, p0, p1 = _task_share(t, ip)
    tiled = tiled_rows(r0, r1)
    for p in range(p0, p1, _TILE_PANELS):
        for r in range(r0, tiled, MR):
            _tile_vnni(qp, wp, ksump, scalep, biasp, rowscalep, rowcp, outp, r, r1 - 1, ip[3], ip[1], ip[2],
                       p, p1 - 1, ip[8], ip[9], fp[0], fp[1])
    for r in range(tiled, r1):
        for p in range(p0, p1, _ROW_PANELS):
            _row_vnni(qp, wp, ksump, scalep, biasp, rowscalep, rowcp, outp, r, r, ip[3], ip[1], ip[2],
                      p, p1 - 1, ip[8], ip[9], fp[0], fp[1])


@task_function()
def _qb4w_plain(t, qp, wp, ksump, scalep, biasp, rowscalep, rowcp, outp, ip, fp):
    """:func:`_qb4w_vnni` in plain LLVM vector arithmetic."""
    r0, r1, p0, p1 = _task_share(t, ip)
    tiled = tiled_rows(r0, r1)
    for p in range(p0, p1, _TILE_PANELS):
        for r in range(r0, tiled, MR):
            _tile_plain(qp, wp, ksump, scalep, biasp, rowscalep, rowcp, outp, r, r1 - 1, ip[3], ip[1], ip[2],
                        p, p1 - 1, ip[8], ip[9], fp[0], fp[1])
    for r in range(tiled, r1):
        for p in range(p0, p1, _ROW_PANELS):
            _row_plain(qp, wp, ksump, scalep, biasp, rowscalep, rowcp, outp, r, r, ip[3], ip[1], ip[2],
                       p, p1 - 1, ip[8], ip[9], fp[0], fp[1])


class BlockwiseQuantizedMatmul(SharedRowsProduct):
    """``bind(x [M, K] float32, out [M, N] float32) -> call``: x times the int8-held int4
    ``w_nk`` [N, K] with float32 ``scales`` [N, K / block] (already bf16-rounded, as XNNPACK
    packs them), ``bias`` (or None), clamped to ``[lo, hi]``; packed here once."""

    def __init__(self, w_nk: np.ndarray, scales: np.ndarray, block: int, bias: np.ndarray | None, lo: float,
                 hi: float, threads: int, vnni: bool | None = None,
                 packed: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None) -> None:
        n, k = w_nk.shape
        if block % 8 or k % block or scales.shape != (n, k // block):
            raise ValueError(f"blockwise weights {w_nk.shape} with scales {scales.shape} and block {block}")
        super().__init__(k, threads)
        self.n, self.block = n, block
        # (``packed``: :meth:`pack_weights` of these weights, made once for every node reading them)
        self.weights, self.scales, self.ksums = self.pack_weights(w_nk, scales, block) if packed is None else packed
        panels = self.weights.shape[0]
        self.bias = np.zeros(panels * NR, np.float32)
        if bias is not None:
            self.bias[:n] = np.asarray(bias, np.float32).reshape(-1)
        self.clamp = np.array([lo, hi], np.float32)
        self.task = _qb4w_vnni if (VNNI if vnni is None else vnni) else _qb4w_plain

    @staticmethod
    def pack_weights(w_nk: np.ndarray, scales: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The nibbles packed for the tiles, the scales by panel, and each column's zero-point
        sums (padded columns 0)."""
        n, k = w_nk.shape
        w_nk = np.asarray(w_nk, np.int8)
        weights = pack_nibbles(w_nk)
        panels, blocks = weights.shape[0], k // block
        padded = np.zeros((panels * NR, blocks), np.float32)
        padded[:n] = scales
        ksums = np.zeros(panels * NR, np.float32)
        ksums[:n] = blockwise_zero_point_sums(w_nk, scales, block)
        return weights, np.ascontiguousarray(padded.reshape(panels, NR, blocks).transpose(0, 2, 1)), ksums

    def bind_quantized(self, q: np.ndarray, row_scale: np.ndarray, row_c: np.ndarray, out: np.ndarray):
        """The product alone, on rows quantized elsewhere (see :class:`.qd8gemm.SharedRowsProduct`)."""
        m = out.shape[0]
        if q.shape != (m, self.k) or row_scale.shape != (m,) or row_c.shape != (m,) or out.shape != (m, self.n):
            raise ValueError(f"blockwise product [M, {self.k}] -> [M, {self.n}] given {q.shape} -> {out.shape}")
        rows = split(m, self.n, self.k, self.threads)
        params = np.array([m, self.k // 8, self.n, self.k, *rows, self.block // 8, self.k // self.block], np.int64)
        return bind_task(self.task, rows[1] * rows[3],
                         (q, self.weights, self.ksums, self.scales, self.bias, row_scale, row_c), (out,),
                         params, self.clamp, dtypes=(np.int8, np.int8, np.float32, np.float32, np.float32,
                                                     np.float32, np.int32, np.float32))


def blockwise_fully_connected(ctx: NodeContext):
    """The kernel of a hybrid FULLY_CONNECTED with blockwise (INT4) weights, or None."""
    w_spec, bias_spec = ctx.inputs[1], optional_input(ctx, 2)
    if w_spec.value is None or np.asarray(w_spec.value).ndim != 2 or ctx.attrs["block_size"] % 8 \
            or np.dtype(ctx.inputs[0].dtype) != np.float32 or np.dtype(ctx.outputs[0].dtype) != np.float32:
        return None
    if bias_spec is not None and (bias_spec.value is None or np.dtype(bias_spec.dtype) != np.float32):
        return None
    w = np.asarray(w_spec.value, np.int8)
    n, k = w.shape
    m = int(np.prod(ctx.inputs[0].shape)) // k
    lo, hi = clamp_bounds(ctx.attrs["activation"])
    scales, block = ctx.attrs["block_scale"], ctx.attrs["block_size"]
    digest = hashlib.blake2b(np.ascontiguousarray(scales).tobytes(), digest_size=16).digest()  # (a node's own copy)
    # (an INT4 constant is found by its bytes in the model: its unpacked values are dropped)
    stored = w_spec.stored if isinstance(w_spec.stored, Int4Constant) else None
    source = w if stored is None else stored.packed
    held = shared_packing("qb4w", (source,), (block, digest, w.shape),
                          lambda: BlockwiseQuantizedMatmul.pack_weights(w, scales, block))
    product = BlockwiseQuantizedMatmul(w, scales, block, None if bias_spec is None else bias_spec.value, lo, hi,
                                       current_threads(), packed=held.value)
    product.held = held
    run = bindable(lambda inputs, outputs: product.bind(inputs[0].reshape(m, k), outputs[0].reshape(m, n)))
    run.quantized_rows = product      # for the backend to pair products reading one x
    run.packed_inputs = (1, 2)
    return run
