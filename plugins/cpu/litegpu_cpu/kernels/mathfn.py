"""Scalar math for numba kernels that must vectorize: functions without a libm call per
element (LLVM does not vectorize those without SVML).

``exp64``, ``tanh64`` and the float32 ones are inlined into their callers, including the
generated kernels of :mod:`litegpu_cpu.fusion`, which name :data:`DIGEST` in their source so a change here
gives them new cache entries (numba's cache only watches the caller's own file).
"""
from __future__ import annotations

import hashlib
import platform
from pathlib import Path

import numpy as np
from llvmlite import binding, ir

from litegpu.codegen.formulas import XNN_GELU_FITS, XNN_TANH_FIT
from litegpu.ops.elementwise import GELU_TANH_CUBIC, SQRT_2_OVER_PI

from ..jit import cgutils, intrinsic, njit, types
from .packed import NR, carried_loop, load_vector, splat_vector

_FEATURES = binding.get_host_cpu_features()
_AVX512F = bool(_FEATURES.get("avx512f", False))

# 2**e for e in [-220, 190]: n = round(x / ln 2) over the clamped argument range below.
_POW2 = np.array([2.0 ** e for e in range(-220, 191)])
_LOG2E, _LN2_HI, _LN2_LO = 1.4426950408889634, 0.6931471803691238, 1.9082149292705877e-10


@njit(cache=True, inline="always")
def exp64(x):
    """exp of a float64 without a libm call: range reduction by ln 2 (split in two parts),
    a degree-8 Taylor polynomial on |r| <= ln2/2 (relative error < 3e-10, far below
    float32's 6e-8), and 2**n from a table. The argument is clamped to [-150, 130], where float32 results
    are already 0 or inf; the table index is clamped too, so a NaN argument (NaN result)
    cannot read outside it. Swish over [1, 112, 112, 96]: 2.6 ms with np.exp in float32,
    0.8 ms with this."""
    x = min(max(x, -150.0), 130.0)
    n = np.floor(x * _LOG2E + 0.5)
    r = (x - n * _LN2_HI) - n * _LN2_LO
    p = 1.0 + r * (1.0 + r * (0.5 + r * (1.0 / 6 + r * (1.0 / 24 + r * (1.0 / 120 + r * (
        1.0 / 720 + r * (1.0 / 5040 + r * (1.0 / 40320))))))))
    return p * _POW2[min(max(np.int64(n) + 220, 0), 410)]


@njit(cache=True, inline="always")
def tanh64(x):
    """tanh of a float64 without a libm call: ``1 - 2 / (exp(2|x|) + 1)`` through
    :func:`exp64`, with the sign of ``x``; below |x| = 1/16, where that difference would
    cancel, its Taylor series to x**9. Relative error < 1e-9; NaN gives NaN, and +-inf
    gives +-1 (:func:`exp64` clamps its argument)."""
    a = abs(x)
    if a < 0.0625:
        a2 = a * a
        t = a * (1.0 + a2 * (-1.0 / 3 + a2 * (2.0 / 15 + a2 * (-17.0 / 315 + a2 * (62.0 / 2835)))))
    else:
        t = 1.0 - 2.0 / (exp64(2.0 * a) + 1.0)
    return np.copysign(t, x)


@intrinsic
def _float32_from_bits(typingctx, bits):
    """The float32 whose bit pattern is the int32 ``bits`` (a register move, so it vectorizes)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.int32), codegen


_F0, _F1 = np.float32(0), np.float32(1)


@njit(cache=True, inline="always")
def _exp_reduced32(r, n):
    """exp(r + n ln 2) for a reduced float32 ``r`` (|r| <= ln2 / 2) and an integer-valued
    ``n`` as two float32 factors ``(m, s)``: the degree-7 polynomial of ``r`` times
    2**(n//2), and 2**(n - n//2), both built from their bits. Multiplying ``m`` by ``s``
    last, results round once into the subnormals (or overflow to inf) as float64 exp's
    do; every exp of this module ends here."""
    p = _F1 + r * (_F1 + r * (np.float32(0.5) + r * (np.float32(1.6666666e-1) + r * (
        np.float32(4.1666668e-2) + r * (np.float32(8.333334e-3) + r * (np.float32(1.3888889e-3)
                                                                      + r * np.float32(1.984127e-4)))))))
    whole = np.int32(n)
    half = whole >> np.int32(1)
    return p * _float32_from_bits((half + np.int32(127)) << np.int32(23)), \
        _float32_from_bits((whole - half + np.int32(127)) << np.int32(23))


@njit(cache=True, inline="always")
def exp32(x):
    """exp of a float32 in float32, 16 lanes to a vector where :func:`exp64` has 8 and a
    table gather: Cody-Waite reduction by ln 2, a degree-7 polynomial, and 2**n built from
    its bits as two factors 2**(n//2) * 2**(n - n//2), so results that underflow to
    subnormals or overflow to inf round as the float64 value does. Within 2 float32 ulps of
    float64 exp over the whole range (tests/test_cpu_fused_exp.py); NaN gives NaN. Swish
    over [1, 112, 112, 96] on one thread: 2.46 ms through exp64, 0.80 ms with this."""
    c = min(max(x, np.float32(-104.0)), np.float32(89.0))
    n = np.floor(c * np.float32(1.442695) + np.float32(0.5))
    r = (c - n * np.float32(0.693359375)) - n * np.float32(-2.12194440e-4)
    m, s = _exp_reduced32(r, n)
    y = m * s
    return y if x == x else x


@njit(cache=True, inline="always")
def sigmoid32(x):
    """1 / (1 + exp(-x)) in float32 through :func:`exp32` of -|x| (never overflows): for
    x < 0 as e / (1 + e), so tiny results keep their precision. Within 2 ulps of float64.
    One division, its numerator chosen (a vector division costs more than the rest of
    the function: selecting between two took swish 2x longer); NaN gives NaN."""
    e = exp32(-abs(x))
    return (_F1 if x >= _F0 else e) / (_F1 + e)



# exp_parts32 clamps its float64 argument to [-170, 89]: above, float32 exp overflows
# (exp(89) > FLT_MAX); below, exp(v) < 1e-73, so a product with any factor a caller of
# this module has (|x| <= 14.5 in gelu32, |x| <= 14 where gelu_tanh32's exponent is
# -170) is below half the smallest subnormal. n = round(v / ln 2) then lies in
# [-245, 128], and both 2**(n//2) and 2**(n - n//2) are normal float32 numbers.
_EXP_LO, _EXP_HI = -170.0, 89.0
_LN2 = 0.6931471805599453


@njit(cache=True, inline="always")
def exp_parts32(v):
    """exp of a float64 ``v`` as two float32 factors ``(m, s)``, ``exp(v) ~= m * s``: ``m``
    a normal number, ``s`` a power of two (0 below the range). The reduction
    ``r = v - n ln 2`` is done in float64, so an argument that is itself a float64
    expression (``-x*x/2`` exactly, ``(x - max) * beta``) keeps the bits a float32
    argument would lose: exp magnifies an argument's absolute error into the result's
    relative error, up to 100 float32 ulps at |v| ~ 100. Then the degree-7 polynomial of
    :func:`exp32` in float32. A caller that multiplies ``m`` by its own factors first and
    by ``s`` last rounds once into the subnormal range. ``m * s`` is within ~1.5 ulps of
    float64 exp; NaN gives ``m`` NaN; -inf gives 0 and +inf gives inf."""
    c = v if v > _EXP_LO else _EXP_LO        # written as selects: NaN becomes a bound, so
    c = c if c < _EXP_HI else _EXP_HI        # the integer conversion below never sees it
    n = np.floor(c * _LOG2E + 0.5)
    r = np.float32(c - n * _LN2)
    m, s = _exp_reduced32(r, n)
    return (m if v == v else np.float32(v)), (s if v >= _EXP_LO else _F0)


@intrinsic
def fma32(typingctx, a, b, c):
    """``a * b + c`` of float32s rounded once (llvm.fma: one instruction, and it vectorizes)."""
    def codegen(context, builder, signature, args):
        return builder.fma(*args)
    return types.float32(types.float32, types.float32, types.float32), codegen


def _llvm_binary32(name: str, doc: str):
    """A numba intrinsic calling LLVM's ``name`` on two float32s."""
    def fn(typingctx, a, b):
        def codegen(context, builder, signature, args):
            f32 = ir.FloatType()
            return builder.call(cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32, [f32, f32]),
                                                               name), args)
        return types.float32(types.float32, types.float32), codegen
    fn.__doc__ = doc
    return intrinsic(fn)


maxnum32 = _llvm_binary32("llvm.maxnum.f32", """The larger of two float32s, the other one when either is NaN
    (llvm.maxnum): a running maximum written with it vectorizes as a reduction, where
    ``a if a > b else b`` stays scalar.""")
minnum32 = _llvm_binary32("llvm.minnum.f32", "The smaller of two float32s, the other one when either is NaN.")


@intrinsic
def _vector_range(typingctx, xp, start, count, lo0, hi0):
    """``(min, max)`` of ``lo0``, ``hi0`` and the first ``count // NR * NR`` float32s from
    ``xp + start`` (:func:`row_range32` takes the rest), NaNs skipped: two vector
    accumulators, one ``vminps`` / ``vmaxps`` a step, folded lane by lane at the end.
    A ``minnum`` reduction written in numba vectorizes too, but it
    carries NaN blends through every step and the fold: four times the cost on a
    128-float row."""
    def codegen(context, builder, signature, args):
        pointer, start_, count_, lo_, hi_ = args
        i64 = ir.IntType(64)

        def lower(a, b):       # b where b < a: a NaN in b never wins
            return builder.select(builder.fcmp_ordered("<", b, a), b, a)

        def higher(a, b):
            return builder.select(builder.fcmp_ordered(">", b, a), b, a)

        def step(k, values):
            v = load_vector(builder, pointer, builder.add(start_, builder.mul(k, ir.Constant(i64, NR))))
            return [lower(values[0], v), higher(values[1], v)]

        vectors = builder.sdiv(count_, ir.Constant(i64, NR))
        lo, hi = carried_loop(builder, vectors, [splat_vector(builder, lo_), splat_vector(builder, hi_)], step,
                              "range")
        lanes = NR
        while lanes > 1:        # fold the upper half of the lanes onto the lower half
            lanes //= 2
            upper = ir.Constant(ir.VectorType(ir.IntType(32), NR), [lanes + i if i < lanes else i
                                                                    for i in range(NR)])
            lo = lower(lo, builder.shuffle_vector(lo, lo, upper))
            hi = higher(hi, builder.shuffle_vector(hi, hi, upper))
        first = ir.Constant(ir.IntType(32), 0)
        return context.make_tuple(builder, signature.return_type,
                                  [builder.extract_element(lo, first), builder.extract_element(hi, first)])
    return types.UniTuple(types.float32, 2)(xp, start, count, types.float32, types.float32), codegen


@njit(cache=True, inline="always")
def row_range32(xp, start, count, lo, hi):
    """``(min, max)`` of ``lo``, ``hi`` and ``count`` float32s from pointer ``xp + start``,
    NaNs skipped: whole vectors by :func:`_vector_range`, the rest one by one."""
    lo, hi = _vector_range(xp, start, count, lo, hi)
    for j in range(start + count - count % NR, start + count):
        lo, hi = minnum32(lo, xp[j]), maxnum32(hi, xp[j])
    return lo, hi


_LN2_HI32, _LN2_LO32 = np.float32(0.693359375), np.float32(-2.12194440e-4)


@njit(cache=True, inline="always")
def exp_sum32(h, lo):
    """exp(h + lo) of a float32 ``h`` and a small correction ``lo`` (the rounding error of
    the expression that gave ``h``: exp magnifies an argument's absolute error into the
    result's relative error, 6 ulps at |h| ~ 20), all in float32: Cody-Waite reduction
    ``r = h - n ln2_hi`` (exact: n has at most 9 bits, ln2_hi 9) plus ``lo - n ln2_lo``,
    then :func:`_exp_reduced32`. h is clamped to [-170, 89] as in :func:`exp_parts32`; NaN gives NaN.
    Within ~1.2 ulps of float64 exp(h + lo)."""
    c = h if h > np.float32(_EXP_LO) else np.float32(_EXP_LO)
    c = c if c < np.float32(_EXP_HI) else np.float32(_EXP_HI)
    n = np.floor(c * np.float32(1.442695) + np.float32(0.5))
    r = fma32(n, -_LN2_HI32, c) + (lo - n * _LN2_LO32)
    m, s = _exp_reduced32(r, n)
    y = m * s
    return y if h == h else h


@njit(cache=True, fastmath={"reassoc"})
def sum64(p, start, count):
    """The float64 sum of ``count`` float32s from pointer ``p + start``. Not inlined by
    numba, so its ``reassoc`` (which lets LLVM vectorize the sum, reordering it) stays on
    this loop and never reaches a caller's error-free transformations."""
    total = 0.0
    for j in range(start, start + count):
        total += np.float64(p[j])
    return total


@njit(cache=True, inline="always")
def _exp_neg_half_square32(a):
    """``exp(-a*a/2)`` for 0 <= a <= 14.5 as ``(m, s)`` like :func:`exp_parts32`, all in
    float32: ``-a*a/2`` is never rounded, the reduction ``r = -a*a/2 - n ln2_hi`` is one
    fused multiply-add of exact terms (n has at most 8 bits, ln2_hi 9), so the argument's
    rounding, which exp magnifies by a*a/2, never happens."""
    h = np.float32(-0.5) * a
    n = np.floor(h * a * np.float32(1.442695) + np.float32(0.5))
    r = fma32(h, a, -n * _LN2_HI32)
    r = fma32(n, -_LN2_LO32, r)
    return _exp_reduced32(r, n)


# R(a) = Phi(-a) * exp(a*a/2) (Phi the normal CDF; R = erfcx(a/sqrt 2) / 2) ~= P(a) / Q(a)
# on 0 <= a <= 14.5, a rational fitted for this module (relative-error weighted least
# squares with Lawson reweighting against scipy's erfcx): relative error 6.2e-9 in
# float64. Every coefficient is positive, so the float32 Horner steps do not cancel; their
# roundings still add up to ~3 ulps of R at worst. P(0) / Q(0) = 1/2 exactly.
_GP0, _GP1, _GP2, _GP3, _GP4 = (np.float32(c) for c in (
    0.5, 0.4375947037850408, 0.18268988439318146, 0.04044171000751735, 0.004085582095715975))
_GQ1, _GQ2, _GQ3, _GQ4, _GQ5 = (np.float32(c) for c in (
    1.6730742524715285, 1.2002959614824409, 0.4680242726045244, 0.10137891216990244,
    0.010240913084640616))
# Past |x| = 14.5, x * Phi(-|x|) < 1e-46 rounds to (signed) zero.
_GELU_TAIL = np.float32(14.5)


@njit(cache=True, inline="always")
def accurate_gelu32(x):
    """GELU ``x * Phi(x)`` of a float32 in float32 arithmetic, vectorizable:
    ``Phi(-|x|) = exp(-x*x/2) * R(|x|)`` (:func:`_exp_neg_half_square32`, the rational
    above), then ``x * Phi(-|x|)`` for x < 0 and ``x * (1 - Phi(-|x|))`` otherwise. Unlike
    ``x/2 * (1 + erf(x/sqrt 2))``, whose sum cancels for x < 0 (at x = -5 an erf good to
    1e-8 leaves ~1% error, and LiteRT's XNNPACK is 27% off there), this keeps a relative
    error of a few float32 ulps everywhere, subnormal results included (measured bound in
    tests/test_cpu_float_act_fast.py). inf gives inf; -inf and NaN give NaN, as the
    float64 formula does."""
    a = abs(x)
    ac = a if a < _GELU_TAIL else _GELU_TAIL     # NaN becomes the bound (x carries the NaN)
    m, s = _exp_neg_half_square32(ac)
    p = _GP0 + ac * (_GP1 + ac * (_GP2 + ac * (_GP3 + ac * _GP4)))
    q = _F1 + ac * (_GQ1 + ac * (_GQ2 + ac * (_GQ3 + ac * (_GQ4 + ac * _GQ5))))
    t = m * (p / q)
    s = s if a <= _GELU_TAIL else _F0           # past the tail: -0.0, and NaN for -inf
    return (x * t) * s if x < _F0 else x * (_F1 - t * s)


# gelu_tanh32: 0.5 * (1 + tanh(u)) = 1 / (1 + exp(-2u)), 2u = x * (C1 + C3 * x*x).
_TANH_C1 = 2 * SQRT_2_OVER_PI
_TANH_C3 = 2 * SQRT_2_OVER_PI * GELU_TANH_CUBIC


@njit(cache=True, inline="always")
def accurate_gelu_tanh32(x):
    """The tanh approximation of GELU, ``x/2 * (1 + tanh(sqrt(2/pi) (x + 0.044715 x**3)))``,
    in float32 with the exponent in float64, vectorizable: ``w = exp(-|2u|)`` by
    :func:`exp_parts32` (2u in float64: the result's relative error for x < 0 is 2u's
    absolute error, and |2u| reaches 170), then ``x / (1 + w)`` for x >= 0 and
    ``x * w / (1 + w)`` for x < 0, where ``1 + tanh`` would cancel. Within a few float32
    ulps of the float64 formula; inf gives inf, -inf and NaN give NaN as it does."""
    y = np.float64(x)
    m, s = exp_parts32(-abs(y * (_TANH_C1 + _TANH_C3 * (y * y))))
    d = _F1 + m * s
    return ((x * m) / d) * s if x < _F0 else x / d

# XNNPACK's GELU (``src/f32-vgelu/`` and, for the tanh approximation, ``src/f32-vapproxgelu/``:
# rational 12/10 fits of the erf term, the kernels LiteRT runs on x86 with FMA3 or AVX-512F
# and on AArch64): ``x/2 * (1 + p(z) / q(z))``, z the input clamped where the fit reaches
# +-1, Horner steps as fused multiply-adds. Its relative error grows in the negative tail
# (x = -5: 27%, an absolute 4e-7), where :func:`accurate_gelu32` keeps a few ulps; a gemma
# decoder's GELU feeds the hybrid down projection, which quantizes its input row from its
# range, so the cpu gives LiteRT's bits where it knows LiteRT's kernel.
_XNN_FMA = bool(_FEATURES.get("fma", False)) or _AVX512F or platform.machine().lower() in ("aarch64", "arm64")
_GELU_FITS = XNN_GELU_FITS   # XNNPACK's constants, shared with the GPU formulas
(_GE_MAX, (_GE_A1, _GE_A3, _GE_A5, _GE_A7, _GE_A9, _GE_A11), (_GE_B2, _GE_B4, _GE_B6, _GE_B8, _GE_B10)), \
    (_GT_MAX, (_GT_A1, _GT_A3, _GT_A5, _GT_A7, _GT_A9, _GT_A11), (_GT_B2, _GT_B4, _GT_B6, _GT_B8, _GT_B10)) = (
    (np.float32(m), tuple(np.float32(c) for c in a), tuple(np.float32(c) for c in b))
    for m, a, b in (_GELU_FITS[False], _GELU_FITS[True]))


@njit(cache=True, inline="always")
def _rational_gelu32(x0, top, a1, a3, a5, a7, a9, a11, b2, b4, b6, b8, b10):
    """``x0/2 * (1 + p(z) / q(z))``, z = x0 clamped to [-top, top] with XNNPACK's min and max
    (a NaN stays), as its GELU kernels compute it."""
    x = top if top < x0 else x0
    x = -top if -top > x else x
    x2 = x * x
    p = x * fma32(x2, fma32(x2, fma32(x2, fma32(x2, fma32(x2, a11, a9), a7), a5), a3), a1)
    q = fma32(x2, fma32(x2, fma32(x2, fma32(x2, fma32(x2, b10, b8), b6), b4), b2), _F1_32)
    return (x0 * _HALF32) * (p / q + _F1_32)


@njit(cache=True, inline="always")
def xnn_gelu32(x):
    """GELU of a float32 as XNNPACK's ``f32-vgelu`` rational 12/10 kernels compute it."""
    return _rational_gelu32(x, _GE_MAX, _GE_A1, _GE_A3, _GE_A5, _GE_A7, _GE_A9, _GE_A11,
                            _GE_B2, _GE_B4, _GE_B6, _GE_B8, _GE_B10)


@njit(cache=True, inline="always")
def xnn_gelu_tanh32(x):
    """The tanh approximation of GELU as XNNPACK's ``f32-vapproxgelu`` kernels compute it."""
    return _rational_gelu32(x, _GT_MAX, _GT_A1, _GT_A3, _GT_A5, _GT_A7, _GT_A9, _GT_A11,
                            _GT_B2, _GT_B4, _GT_B6, _GT_B8, _GT_B10)


# XNNPACK's TANH (``src/f32-vtanh/``, ``rational_9_8_div``: the kernels LiteRT runs on x86
# with FMA3 or AVX-512F; constants shared with the GPU formulas): ``z * p(z^2) / q(z^2)``, z
# the input clamped where the fit reaches +-1 with its min and max (a NaN stays), the
# Horner steps fused multiply-adds.
(_TH_MAX, (_TH_A3, _TH_A5, _TH_A7, _TH_A9), (_TH_B2, _TH_B4, _TH_B6, _TH_B8)) = (
    np.float32(XNN_TANH_FIT[0]), tuple(np.float32(c) for c in XNN_TANH_FIT[1]),
    tuple(np.float32(c) for c in XNN_TANH_FIT[2]))


@njit(cache=True, inline="always")
def xnn_tanh32(x0):
    """tanh of a float32 as XNNPACK's ``f32-vtanh`` rational 9/8 kernels compute it."""
    x = _TH_MAX if _TH_MAX < x0 else x0
    x = -_TH_MAX if -_TH_MAX > x else x
    x2 = x * x
    p = x * fma32(x2, fma32(x2, fma32(x2, fma32(x2, _TH_A9, _TH_A7), _TH_A5), _TH_A3), _F1_32)
    q = fma32(x2, fma32(x2, fma32(x2, fma32(x2, _TH_B8, _TH_B6), _TH_B4), _TH_B2), _F1_32)
    return p / q


@njit(cache=True, inline="always")
def accurate_tanh32(x):
    """tanh of a float32 through :func:`tanh64`, rounded once."""
    return np.float32(tanh64(np.float64(x)))


gelu32 = xnn_gelu32 if _XNN_FMA else accurate_gelu32
"""The cpu's GELU: LiteRT's bits where XNNPACK runs its FMA kernels, else :func:`accurate_gelu32`."""
gelu_tanh32 = xnn_gelu_tanh32 if _XNN_FMA else accurate_gelu_tanh32
"""The cpu's tanh-approximated GELU, chosen as :data:`gelu32` is."""
tanh32 = xnn_tanh32 if _XNN_FMA else accurate_tanh32
"""The cpu's TANH, chosen as :data:`gelu32` is."""


@intrinsic
def _rint32(typingctx, x):
    """``x`` rounded to the nearest integer, ties to even (llvm.rint: one instruction)."""
    def codegen(context, builder, signature, args):
        f32 = ir.FloatType()
        return builder.call(cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32, [f32]),
                                                           "llvm.rint.f32"), args)
    return types.float32(types.float32), codegen


# XNNPACK's float32 sine and cosine (``src/f32-vsin/rational-5-4.c.in`` and its cosine twin,
# the kernels LiteRT runs for SIN and COS on x86 with FMA3 or AVX-512F): the argument less
# the nearest multiple of 2 pi (in two parts, ~33 bits), folded into [-pi/2, pi/2], then a
# rational 5/4 fit. It is up to ~3e-7 from the true value (libm's is within an ulp), and a
# decoder's RoPE tables feed hybrid products that quantize their input on the fly, where an
# ulp can become a quantum: the cpu gives LiteRT's bits.
_INV_2PI = np.float32(0.15915494)
_2PI_HI, _2PI_LO = np.float32(6.28125), np.float32(1.9353072e-3)
_PI = np.float32(3.1415927)
_PI_HALF_HI, _PI_HALF_LO = np.float32(1.5707963705), np.float32(-4.3711388e-08)
_SIN_A3, _SIN_A5 = np.float32(-1.3314664364e-01), np.float32(3.2340581529e-03)
_SIN_B2, _SIN_B4 = np.float32(3.3519912511e-02), np.float32(4.8770775902e-04)
_F0_32, _F1_32 = np.float32(0), np.float32(1)


@njit(cache=True, inline="always")
def _turns_removed32(x):
    """``x`` less its nearest multiple of 2 pi, as XNNPACK's sine and cosine reduce it."""
    k = _rint32(x * _INV_2PI)
    return fma32(-k, _2PI_LO, fma32(-k, _2PI_HI, x))


@njit(cache=True, inline="always")
def _rational_sine32(x):
    """The sine of a reduced ``x``: folded into [-pi/2, pi/2] with XNNPACK's min and max
    (which keep their second operand for NaN), then its 5/4 rational fit."""
    f = _PI - x
    x = x if x < f else f
    f = -_PI - x
    x = x if x > f else f
    f = _PI - x
    x = x if x < f else f
    x2 = x * x
    p = x * fma32(x2, fma32(x2, _SIN_A5, _SIN_A3), _F1_32)
    q = fma32(x2, fma32(x2, _SIN_B4, _SIN_B2), _F1_32)
    return p / q


@njit(cache=True, inline="always")
def xnn_sin32(x):
    """SIN of a float32 as XNNPACK's ``f32-vsin`` rational 5/4 kernels compute it."""
    return _rational_sine32(_turns_removed32(x))


@njit(cache=True, inline="always")
def xnn_cos32(x):
    """COS of a float32 as XNNPACK's ``f32-vcos`` kernels compute it: the sine of pi/2 less
    the reduced argument (pi/2 in two parts)."""
    return _rational_sine32((_PI_HALF_HI - _turns_removed32(x)) + _PI_HALF_LO)


# RSQRT as LiteRT runs it on AVX-512F hosts (``xnn_f32_vrsqrt_ukernel__avx512f_rsqrt``):
# the instruction's 14-bit estimate y, then ``y - (x * (y * y) - 1) * (0.5 * y)``, each
# operation rounded. An rms norm's root feeds the row quantization of the next hybrid
# product, so the cpu gives its bits. Outside [2**-126, 2**125] that kernel is wrong under
# LiteRT's flushed denormals (0 and subnormals give NaN, 3e38 gives 1.5 times the root):
# there, and on other hosts, ``1 / sqrt(x)``.
_NR_LO, _NR_HI = np.float32(2.0 ** -126), np.float32(2.0 ** 125)
_HALF32 = np.float32(0.5)


@intrinsic
def _rsqrt14(typingctx, x):
    """AVX-512F's ``vrsqrt14ss``: ``1 / sqrt(x)`` to 14 bits, from the instruction's own table
    (only on an AVX-512F host: LLVM cannot select it elsewhere)."""
    def codegen(context, builder, signature, args):
        v4 = ir.VectorType(ir.FloatType(), 4)
        i32 = ir.IntType(32)
        rsqrt14 = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(v4, [v4, v4, v4, ir.IntType(8)]), "llvm.x86.avx512.rsqrt14.ss")
        vector = builder.insert_element(ir.Constant(v4, None), args[0], ir.Constant(i32, 0))
        estimate = builder.call(rsqrt14, [vector, vector, vector, ir.Constant(ir.IntType(8), -1)])
        return builder.extract_element(estimate, ir.Constant(i32, 0))
    return types.float32(types.float32), codegen


@njit(cache=True, inline="always")
def _refined_rsqrt14(x):
    """The 14-bit estimate refined by XNNPACK's Newton step."""
    y = _rsqrt14(x)
    return y - (x * (y * y) - _F1_32) * (_HALF32 * y)


@njit(cache=True, inline="always")
def _rsqrt_avx512f(x):
    """XNNPACK's AVX-512F RSQRT of ``x`` in [2**-126, 2**125]; ``1 / sqrt(x)`` elsewhere."""
    if _NR_LO <= x < _NR_HI:
        return _refined_rsqrt14(x)
    return _F1_32 / np.sqrt(x)


@njit(cache=True, inline="always")
def _rsqrt_plain(x):
    return _F1_32 / np.sqrt(x)


xnn_rsqrt32 = _rsqrt_avx512f if _AVX512F else _rsqrt_plain
"""RSQRT of a float32: LiteRT's bits on an AVX-512F host (in XNNPACK's valid range), else
``1 / sqrt(x)``."""


# SQRT as LiteRT runs it on AVX-512F hosts (``xnn_f32_vsqrt_ukernel__avx512f_rsqrt``): RSQRT's
# refined estimate times x, ``x * (y - (x * (y * y) - 1) * (0.5 * y))``, each operation
# rounded (within 1 ulp of the root, not always the nearest float). Outside [2**-126, 2**125],
# and on other hosts, the correctly rounded root.
@njit(cache=True, inline="always")
def _sqrt_avx512f(x):
    """XNNPACK's AVX-512F SQRT of ``x`` in [2**-126, 2**125]; ``sqrt(x)`` elsewhere."""
    if _NR_LO <= x < _NR_HI:
        return x * _refined_rsqrt14(x)
    return np.sqrt(x)


@njit(cache=True, inline="always")
def _sqrt_plain(x):
    return np.sqrt(x)


xnn_sqrt32 = _sqrt_avx512f if _AVX512F else _sqrt_plain
"""SQRT of a float32: LiteRT's bits on an AVX-512F host (in XNNPACK's valid range), else the
correctly rounded root."""


@intrinsic
def _bits32(typingctx, x):
    """The int32 bit pattern of the float32 ``x`` (a register move, so it vectorizes)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.int32(types.float32), codegen


# The exponential of XNNPACK's float32 softmax (``src/f32-raddstoreexpminusmax/
# avx512f-rr2-p5.c.in``, the same constants in its AVX2 and SSE2 kernels).
_XE_LOG2E = np.float32(float.fromhex("0x1.715476p+0"))
_XE_MAGIC = np.float32(float.fromhex("0x1.8000FEp23"))
_XE_LN2_HI = np.float32(float.fromhex("-0x1.62E400p-1"))
_XE_LN2_LO = np.float32(float.fromhex("-0x1.7F7D1Cp-20"))
_XE_C5, _XE_C4, _XE_C3, _XE_C2, _XE_C1 = (np.float32(float.fromhex(c)) for c in (
    "0x1.0F9F9Cp-7", "0x1.573A1Ap-5", "0x1.555A80p-3", "0x1.FFFDC6p-2", "0x1.FFFFF6p-1"))
_XE_CUTOFF = np.float32(float.fromhex("-0x1.5D589Ep6"))    # below it exp(x) is subnormal: 0


@njit(cache=True, inline="always")
def xnn_exp_nonpositive32(x):
    """exp(x) of a float32 ``x <= 0`` (an input less its row's maximum) as XNNPACK's softmax
    computes it: ``n = round(x / ln 2)`` by a magic bias (its low bits, shifted into the
    exponent field, are 2**n), ``t = x - n ln 2`` in two fused multiply-adds, a degree-5
    polynomial, ``s + (t s) p``; 0 below the cutoff (-inf too), NaN stays NaN."""
    n = fma32(x, _XE_LOG2E, _XE_MAGIC)
    s = _float32_from_bits(_bits32(n) << np.int32(23))
    n = n - _XE_MAGIC
    t = fma32(n, _XE_LN2_LO, fma32(n, _XE_LN2_HI, x))
    p = fma32(fma32(fma32(fma32(_XE_C5, t, _XE_C4), t, _XE_C3), t, _XE_C2), t, _XE_C1)
    f = fma32(t * s, p, s)
    return _F0_32 if x < _XE_CUTOFF else f


DIGEST = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
