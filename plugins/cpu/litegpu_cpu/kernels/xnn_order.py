"""The order in which XNNPACK adds and multiplies in float DEPTHWISE_CONV_2D, AVERAGE_POOL_2D
and MEAN / SUM, shared by the cpu kernels that reproduce LiteRT's bits.

LiteRT hands these ops to XNNPACK (constant weights, a clamp activation; a pool whose
stride is not larger than its window); float addition is not associative, so only the
same order gives the same bits. Read from XNNPACK's sources (the build in ai-edge-litert
2.3, whose ``libpywrap_litert_common.so`` names the same microkernels) and checked against
LiteRT, single ops and every node of efficientnet_b0 and nasnet_mobile (tests:
``tests/test_cpu_xnnpack_order.py``):

- DEPTHWISE_CONV_2D, multiplier 1, up to 25 taps: the unipass dwconv microkernel with the
  smallest primary tile (3, 4, 9 or 25) that holds the window
  (``src/configs/dwconv-config.c``, ``find_dwconv_ukernel`` in
  ``src/operators/convolution-nhwc.c``). It starts from the bias and adds one tap after
  another, each as one fused multiply-add on an FMA3 or AVX-512F host, in the order of the
  indirection buffer (``xnn_indirection_init_dwconv2d_compressed`` in
  ``src/indirection.c``): column by column, ``kx`` outer, ``ky`` inner. A tap in the
  padding reads XNNPACK's zero buffer: ``fma(0, w, acc)``. The padding slots of a primary
  tile have zero weights. (A 1x1 window with no padding and stride 1 is XNNPACK's
  vmulcaddc: one fused multiply-add too.)
- Any other depthwise conv (more than 25 taps, e.g. 7x7; a depth multiplier above 1) has
  no dwconv microkernel: it runs as a grouped IGEMM (one input channel per group), whose
  indirection (``xnn_indirection_init_conv2d``) goes row by row, ``ky`` outer: again
  from the bias, one fused multiply-add per tap.
- AVERAGE_POOL_2D: ``xnn_f32_avgpool_minmax_ukernel_9p`` (``src/f32-avgpool/``) over the
  same column-by-column indirection, padding taps reading zeros: the window's taps in passes
  of 9, each pass summed by a fixed tree (:func:`sum9`; a short last pass fills with
  zeros) and added to the running sum, which starts at 0; then times the scale and the
  clamp ``min(max(v, lo), hi)`` with x86's max (a NaN becomes ``lo``). The scale is
  ``1.0f / (float) count``: the real pixels of each window with SAME padding
  (``xnn_indirection_init_pavgpool2d_f32``), the whole window with VALID.
- MEAN and SUM (scale 1) over one run of adjacent axes, as an [outer, rows, inner] view
  (``src/operators/reduce-nd.c``, which merges adjacent axes and drops no size-1 one):
  where the run does not end at the last axis, ``xnn_f32_rdsum_ukernel_7p7x``, a
  float32 sum per output element from 0, rows in order, then ``0 + sum * scale`` (it
  accumulates into the zeroed output); where it does, ``xnn_f32_rsum_ukernel``, on
  AVX-512F ``avx512f_u32_acc2``: :func:`rsum_avx512f`. (Axes that are not one run are
  not covered here.)
- MEAN and SUM of a square (``MUL(x, x)``, as the rms norm's decomposition writes it):
  XNNPACK's subgraph rewrites ``reduce(sqr(x))`` to ``reduce_sum_squared(x)``, on AVX-512F
  ``xnn_f32_rsum2_ukernel__avx512f_u64_acc4``: each square a fused multiply-add into its
  accumulator, :func:`rsum2_avx512f`.
- SOFTMAX (beta 1), ``xnn_compute_floating_point_softmax``: the row's maximum, each
  ``exp(x - max)`` (:func:`.mathfn.xnn_exp_nonpositive32`) stored and summed by
  ``xnn_f32_raddstoreexpminusmax_ukernel``, on AVX-512F ``avx512f_rr2_p5_u64_acc2``
  (:func:`radd_avx512f`), then each times ``1.0f / sum``.
- RSQRT, on AVX-512F ``xnn_f32_vrsqrt_ukernel__avx512f_rsqrt``: the instruction's 14-bit
  estimate and one Newton-Raphson step, :func:`.mathfn.xnn_rsqrt32`.

The multiply-add of a depthwise tap is :func:`madd`: ``fma32`` on hosts with a fused
multiply-add (where XNNPACK picks its FMA3 or AVX-512F kernels), else a product rounded
then a sum, as XNNPACK's SSE and AVX kernels do (those hosts are not checked against
LiteRT here). The tap orders and the pool's tree are the same on every x86 ISA (the
microkernels are one template); the row sum's lanes are not, so :data:`RSUM_MATCHES_LITERT`
says whether :func:`rsum_avx512f` applies.
"""
from __future__ import annotations

import platform

import numpy as np
from llvmlite import binding, ir

from ..jit import cgutils, intrinsic, njit, types, when_ready
from .mathfn import fma32

_FEATURES = binding.get_host_cpu_features()

X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686", "x86")
"""An x86 host, where the tap orders, the pool's tree and the channel sums here are the
ones LiteRT's XNNPACK uses whatever the ISA (checked against LiteRT on AVX-512F)."""

HAS_FMA = bool(_FEATURES.get("fma", False)) or platform.machine().lower() in ("aarch64", "arm64")
"""Whether the host has a fused multiply-add instruction (x86 FMA3, every AVX-512F host, and
AArch64): :func:`madd` is one then."""

MATCHES_LITERT = X86 and HAS_FMA
"""Whether LiteRT runs the XNNPACK kernels whose arithmetic :func:`madd` and the orders here
are (x86 with FMA3 or AVX-512F; checked on AVX-512F)."""

RSUM_MATCHES_LITERT = X86 and bool(_FEATURES.get("avx512f", False))
"""Whether XNNPACK's contiguous row sum is the AVX-512F kernel :func:`rsum_avx512f` follows."""

UNIPASS_TAPS = 25
"""The largest window XNNPACK's unipass dwconv microkernels take (primary tile 25)."""

POOL_PASS = 9
"""Taps per pass of XNNPACK's average pool microkernel."""

F32 = np.float32


@njit(cache=True, inline="always")
def _mul_add32(a, b, c):
    """``a * b + c`` with the product rounded first (no fastmath: never contracted)."""
    return a * b + c


madd = fma32 if HAS_FMA else _mul_add32
"""A depthwise tap, ``a * b + c``: rounded once where the host has a fused multiply-add."""


def depthwise_taps(kh: int, kw: int, multiplier: int) -> np.ndarray:
    """The taps ``(ky, kx)`` of a ``kh`` x ``kw`` depthwise window in the order XNNPACK adds
    them: column by column through a dwconv microkernel (multiplier 1, at most
    :data:`UNIPASS_TAPS` taps), else row by row (a grouped IGEMM). An int64 [T, 2] array."""
    if multiplier == 1 and kh * kw <= UNIPASS_TAPS:
        taps = [(ky, kx) for kx in range(kw) for ky in range(kh)]
    else:
        taps = [(ky, kx) for ky in range(kh) for kx in range(kw)]
    return np.array(taps, np.int64).reshape(-1, 2)


def pool_passes(fh: int, fw: int) -> np.ndarray:
    """The taps ``(ky, kx)`` of each pass of XNNPACK's average pool, :data:`POOL_PASS` a pass
    in the order :func:`sum9` takes them, column by column; ``(-1, -1)`` where a short
    last pass adds a zero. An int64 [P, 9, 2] array."""
    taps = [(ky, kx) for kx in range(fw) for ky in range(fh)]
    taps += [(-1, -1)] * (-len(taps) % POOL_PASS)
    return np.array(taps, np.int64).reshape(-1, POOL_PASS, 2)


@njit(cache=True, inline="always")
def sum9(v0, v1, v2, v3, v4, v5, v6, v7, v8):
    """The sum of one pass of XNNPACK's average pool:
    ``((v2 + v3) + (v4 + v5)) + (((v0 + v1) + v8) + (v6 + v7))``."""
    return ((v2 + v3) + (v4 + v5)) + (((v0 + v1) + v8) + (v6 + v7))


@njit(cache=True, inline="always")
def scale32(count):
    """XNNPACK's ``1.0f / (float) count``."""
    return F32(1) / F32(count)


# -- 16-float vectors ---------------------------------------------------------------------
#
# A chain of dependent multiply-adds in a fixed order is latency-bound; the kernels here
# keep several independent chains and their weights in registers. Left to LLVM's loop
# vectorizer, a 16-channel loop holding several chains was versioned behind run-time
# alias checks and reloaded its weights for every block (1.4-1.8x slower than the
# partial sums it replaces), so the depthwise kernels that keep sums in registers
# (:mod:`.depthwise`) and the row sum spell their vectors out: ``Float32x16`` is LLVM's
# ``<16 x float>`` as a numba value (one AVX-512 register; two AVX or four SSE registers
# elsewhere), made and used only through the intrinsics below.

_V16 = ir.VectorType(ir.FloatType(), 16)
_I32 = ir.IntType(32)


float32x16 = None
"""Sixteen float32 lanes in registers (LLVM's ``<16 x float>``): a numba type, made with
its data model once numba is imported (:func:`_define_float32x16`)."""


def _define_float32x16() -> None:
    global float32x16
    from numba.extending import models, register_model

    class Float32x16(types.Type):
        def __init__(self):
            super().__init__(name="float32x16")

    @register_model(Float32x16)
    class _Float32x16Model(models.PrimitiveModel):
        def __init__(self, dmm, fe_type):
            super().__init__(dmm, fe_type, _V16)

    float32x16 = Float32x16()


when_ready(_define_float32x16)


def _vector_at(context, builder, array_type, array, index):
    """A ``<16 x float>*`` to ``array[index]`` (a 1-D float32 array)."""
    data = context.make_array(array_type)(context, builder, array).data
    return builder.bitcast(builder.gep(data, [index]), _V16.as_pointer())


def _splat(builder, value):
    """``value`` (a float) in all 16 lanes."""
    one = builder.insert_element(ir.Constant(_V16, ir.Undefined), value, ir.Constant(_I32, 0))
    return builder.shuffle_vector(one, ir.Constant(_V16, ir.Undefined), ir.Constant(ir.VectorType(_I32, 16), [0] * 16))


@intrinsic
def load16(typingctx, array, index):
    """``array[index:index + 16]`` (1-D float32) as a vector."""
    def codegen(context, builder, signature, args):
        return builder.load(_vector_at(context, builder, signature.args[0], args[0], args[1]), align=4)
    return float32x16(array, index), codegen


@intrinsic
def load16_head(typingctx, array, index, count):
    """``array[index:index + count]`` (``count`` < 16) in the first lanes, zeros in the
    others: a masked load, which reads nothing past ``count``."""
    def codegen(context, builder, signature, args):
        lanes = ir.Constant(ir.VectorType(_I32, 16), list(range(16)))
        count = builder.trunc(args[2], _I32) if args[2].type.width > 32 else args[2]
        count_vector = builder.shuffle_vector(
            builder.insert_element(ir.Constant(ir.VectorType(_I32, 16), ir.Undefined), count, ir.Constant(_I32, 0)),
            ir.Constant(ir.VectorType(_I32, 16), ir.Undefined), ir.Constant(ir.VectorType(_I32, 16), [0] * 16))
        mask = builder.icmp_signed("<", lanes, count_vector)
        masked_load = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_V16, [_V16.as_pointer(), _I32, ir.VectorType(ir.IntType(1), 16), _V16]),
            "llvm.masked.load.v16f32.p0v16f32")
        pointer = _vector_at(context, builder, signature.args[0], args[0], args[1])
        return builder.call(masked_load, [pointer, ir.Constant(_I32, 4), mask, ir.Constant(_V16, None)])
    return float32x16(array, index, count), codegen


@intrinsic
def store16(typingctx, array, index, vector):
    """``array[index:index + 16] = vector``."""
    def codegen(context, builder, signature, args):
        builder.store(args[2], _vector_at(context, builder, signature.args[0], args[0], args[1]), align=4)
        return context.get_dummy_value()
    return types.void(array, index, vector), codegen


@intrinsic
def splat16(typingctx, value):
    """The float32 ``value`` in every lane."""
    def codegen(context, builder, signature, args):
        return _splat(builder, args[0])
    return float32x16(types.float32), codegen


@intrinsic
def add16(typingctx, a, b):
    """``a + b`` lane by lane."""
    def codegen(context, builder, signature, args):
        return builder.fadd(args[0], args[1])
    return float32x16(float32x16, float32x16), codegen


@intrinsic
def fma16(typingctx, a, b, c):
    """``a * b + c`` lane by lane, rounded once (``llvm.fma``)."""
    def codegen(context, builder, signature, args):
        fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V16, [_V16] * 3), "llvm.fma.v16f32")
        return builder.call(fma, args)
    return float32x16(float32x16, float32x16, float32x16), codegen


@intrinsic
def _mul_add16(typingctx, a, b, c):
    """``a * b + c`` lane by lane, the product rounded first."""
    def codegen(context, builder, signature, args):
        return builder.fadd(builder.fmul(args[0], args[1]), args[2])
    return float32x16(float32x16, float32x16, float32x16), codegen


@intrinsic
def clamp16(typingctx, vector, lo, hi):
    """``min(max(v, lo), hi)`` lane by lane as the scalar kernels write it (numba's max and
    min keep their first argument when either is NaN: a NaN lane stays NaN)."""
    def codegen(context, builder, signature, args):
        v, lo, hi = args[0], _splat(builder, args[1]), _splat(builder, args[2])
        v = builder.select(builder.fcmp_ordered(">", lo, v), lo, v)
        return builder.select(builder.fcmp_ordered("<", hi, v), hi, v)
    return float32x16(float32x16, types.float32, types.float32), codegen


@intrinsic
def halves_sum16(typingctx, vector):
    """The sum of the lanes as XNNPACK's AVX-512F ``xnn_reduce_add_f32`` adds them: lane
    ``l`` plus lane ``l + 8``, then ``+ 4``, ``+ 2``, and the last two."""
    def codegen(context, builder, signature, args):
        v = args[0]
        for width in (8, 4, 2, 1):
            lo = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, width), list(range(width))))
            hi = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, width), list(range(width, 2 * width))))
            v = builder.fadd(lo, hi)
        return builder.extract_element(v, ir.Constant(_I32, 0))
    return types.float32(float32x16), codegen


madd16 = fma16 if HAS_FMA else _mul_add16
""":func:`madd` lane by lane."""


@njit(cache=True, inline="always")
def rsum_avx512f(x, start, n):
    """``sum(x[start:start + n])`` (n >= 1) as ``xnn_f32_rsum_ukernel__avx512f_u32_acc2``
    adds it: two 16-lane accumulators over blocks of 32, one more block of 16 into the
    first, their sum, the last ``n % 16`` values into its first lanes (the others add 0),
    then :func:`halves_sum16`."""
    zero = F32(0)
    acc0 = splat16(zero)
    acc1 = splat16(zero)
    i = start
    end = start + n
    while end - i >= 32:
        acc0 = add16(acc0, load16(x, i))
        acc1 = add16(acc1, load16(x, i + 16))
        i += 32
    if end - i >= 16:
        acc0 = add16(acc0, load16(x, i))
        i += 16
    acc0 = add16(acc0, acc1)
    if i < end:
        acc0 = add16(acc0, load16_head(x, i, end - i))
    return halves_sum16(acc0)


@njit(cache=True, inline="always")
def radd_avx512f(x, start, n):
    """``sum(x[start:start + n])`` (n >= 1) as ``xnn_f32_raddstoreexpminusmax_ukernel__
    avx512f_rr2_p5_u64_acc2`` adds its exponentials: blocks of 64 as four vectors, the
    first and third into one accumulator, the others into a second; their sum; then blocks
    of 16; then the last ``n % 16`` values into its first lanes; :func:`halves_sum16`."""
    acc0 = splat16(F32(0))
    acc1 = splat16(F32(0))
    i = start
    end = start + n
    while end - i >= 64:
        acc0 = add16(add16(acc0, load16(x, i)), load16(x, i + 32))
        acc1 = add16(add16(acc1, load16(x, i + 16)), load16(x, i + 48))
        i += 64
    acc0 = add16(acc0, acc1)
    while end - i >= 16:
        acc0 = add16(acc0, load16(x, i))
        i += 16
    if i < end:
        acc0 = add16(acc0, load16_head(x, i, end - i))
    return halves_sum16(acc0)


@njit(cache=True, inline="always")
def rsum2_avx512f(x, start, n):
    """``sum(x[start:start + n] ** 2)`` (n >= 1) as ``xnn_f32_rsum2_ukernel__avx512f_u64_acc4``
    adds it: each square fused-multiply-added into one of four 16-lane accumulators over
    blocks of 64, up to three more blocks of 16 into the first three in turn, the
    accumulators summed (0 + 2, 1 + 3, then those), the last ``n % 16`` values' squares into
    its first lanes, then :func:`halves_sum16`. Only on hosts with FMA."""
    zero = F32(0)
    acc0 = splat16(zero)
    acc1 = splat16(zero)
    acc2 = splat16(zero)
    acc3 = splat16(zero)
    i = start
    end = start + n
    while end - i >= 64:
        acc0 = _add_squares16(acc0, load16(x, i))
        acc1 = _add_squares16(acc1, load16(x, i + 16))
        acc2 = _add_squares16(acc2, load16(x, i + 32))
        acc3 = _add_squares16(acc3, load16(x, i + 48))
        i += 64
    if end - i >= 16:
        acc0 = _add_squares16(acc0, load16(x, i))
        i += 16
    if end - i >= 16:
        acc1 = _add_squares16(acc1, load16(x, i))
        i += 16
    if end - i >= 16:
        acc2 = _add_squares16(acc2, load16(x, i))
        i += 16
    acc0 = add16(add16(acc0, acc2), add16(acc1, acc3))
    if i < end:
        acc0 = _add_squares16(acc0, load16_head(x, i, end - i))
    return halves_sum16(acc0)


@njit(cache=True, inline="always")
def _add_squares16(acc, v):
    """``acc + v * v`` lane by lane, rounded once."""
    return fma16(v, v, acc)
