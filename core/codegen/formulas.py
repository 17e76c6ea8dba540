"""The elementwise formulas, written once as :mod:`litegpu.codegen.ir` expressions.

Each is a function of the running value ``x`` (and ``y``, the other operand, for binary
ops) and the op's attrs, valid for ``real`` and ``real4`` operands alike. They serve as
the body of a standalone elementwise kernel and as a follower folded into a producer's
store (:mod:`.fusion`), in every dialect.

LiteRT's quirks, as in :mod:`litegpu.ops.elementwise`: MAXIMUM is ``a > b ? a : b`` and
MINIMUM ``a < b ? a : b`` (the second operand wins on NaN; the ``swapped`` attr says which
is first); clamps let NaN through (XNNPACK's ``max(lo, x)`` then ``min(hi, x)``: the
second operand wins when either is NaN); FLOOR_MOD takes the divisor's sign; ROUND is
half to even.

The ops whose results feed a decoder's hybrid products (which quantize their input rows
on the fly, where an ulp can become a quantum) compute LiteRT's bits: SIN, COS, RSQRT,
LOGISTIC, GELU and TANH are XNNPACK's AVX-512F / FMA kernels step by step (in float32 whatever
the arithmetic precision; bit casts and tables lane by lane), as the cpu backend's are.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from litegpu.ops.registry import ACTIVATION_RANGES

from . import ir
from .ir import Expr, call, select
from .rsqrt14 import rsqrt14

# TANH as XNNPACK's ``f32-vtanh`` rational 9/8 kernels compute it with fused multiply-adds
# (the cpu backend's ``mathfn.xnn_tanh32`` reads its constants from here): z the input
# clamped where the fit reaches +-1 exactly, ``z * p(z^2) / q(z^2)``.
XNN_TANH_FIT = (7.9807181358e+00, (1.3412411511e-01, 3.5330520477e-03, 2.1235626264e-05, 1.4248920266e-08),
                (4.6745735407e-01, 2.6018999517e-02, 3.3472978976e-04, 8.1365948290e-07))


def xnn_tanh(x0: Expr) -> Expr:
    """XNNPACK's tanh of a float32 ``x0`` (see above); its min and max keep a NaN."""
    top, (a3, a5, a7, a9), (b2, b4, b6, b8) = XNN_TANH_FIT
    x = select(top < x0, top, x0)
    x = select(-top > x, -top, x)
    x2 = x * x
    fma = lambda a, b, c: call("fma", a, b, c)   # noqa: E731 - Horner in fused steps
    p = x * fma(x2, fma(x2, fma(x2, fma(x2, a9, a7), a5), a3), 1.0)
    q = fma(x2, fma(x2, fma(x2, fma(x2, b8, b6), b4), b2), 1.0)
    return p / q


def hard_swish(x: Expr) -> Expr:
    """HARD_SWISH as XNNPACK computes it, ``x * clamp(fma(x, 1/6, 1/2), 0, 1)`` (one rounding
    in the fma, as its kernels have): 3e38 stays finite, where ``x * relu6(x + 3) / 6``
    overflows to inf."""
    return x * call("clamp", call("fma", x, 1 / 6, 0.5), 0.0, 1.0)


def clamp(activation: str, x: Expr) -> Expr:
    """The clamp of ``activation`` (:data:`litegpu.ops.registry.ACTIVATION_RANGES`; TANH and
    SIGN_BIT clamp nothing, as in LiteRT), letting NaN through as XNNPACK's compares and
    selects do (one x86 max instruction each)."""
    lo, hi = ACTIVATION_RANGES[activation]
    if lo != -np.inf:
        x = select(x < lo, lo, x)
    if hi != np.inf:
        x = select(x > hi, hi, x)
    return x


def floor_mod(x: Expr, y: Expr) -> Expr:
    """FLOOR_MOD on floats: fmod moved to the divisor's sign when they differ."""
    r = call("fmod", x, y)
    return select(ir.logical_and(r.ne(0.0), (r < 0.0).ne(y < 0.0)), r + y, r)


def quant_sim(x: Expr, a: dict) -> Expr:
    """QUANT_SIM (the float view of quantized models, :mod:`litegpu.float_view`): onto the
    tensor's integer grid (``x`` times the reciprocal input step, rounded to nearest even,
    half up, or half away from zero as C's ``round``, plus the zero point, clamped) and
    back in output steps (none: grid form)."""
    inv = float(np.float32(1) / np.float32(a["in_scale"]))
    steps = x if inv == 1.0 else x * inv
    rounding = a.get("rounding", "even")
    rounded = (call("floor", steps + 0.5) if rounding == "half_up"
               else call("round", steps) if rounding == "half_away" else call("rint", steps))
    code = call("clamp", rounded if a.get("coded") else rounded + float(a["zero_point"]),
                float(a["qmin"]), float(a["qmax"]))
    centred = code - float(a["zero_point"])
    return centred if a["out_scale"] == 1.0 else centred * float(a["out_scale"])


def inv_floor_pow2(x: Expr) -> Expr:
    """INV_FLOOR_POW2 (:func:`litegpu.float_view.inv_floor_pow2`): ``2^-floor(log2 x)``,
    one over the largest power of two not above ``x`` in [1, 2^32), by comparing ``x`` with
    each power (a float32 log2 rounds up to the power just above: log2(2^24 - 1) is 24);
    1 below 1 and for NaN."""
    inv = ir.lit(1.0, x.type)
    for k in range(1, 32):
        inv = select(x >= float(2 ** k), 2.0 ** -k, inv)
    return inv


def grid_mul_round(x: Expr, y: Expr) -> Expr:
    """GRID_MUL_ROUND (:func:`litegpu.float_view.grid_mul_round`): ``floor(x * y + 0.5)``
    exactly in float32, for an integer ``|x| < 2^15`` and ``y`` of at most 15 significant
    bits, a multiple of 2^-23 (their product needs 30 bits). ``x`` is split at 2^7 so that
    each part's product with ``y`` is exact (23 and 22 bits); their integer parts add
    exactly, and so do their fractions (multiples of 2^-23 below 2), whose sum plus a half
    is then floored. Every product is exact, so a contracted multiply-add changes nothing."""
    high = call("floor", x * 2.0 ** -7) * 128.0
    a, b = high * y, (x - high) * y
    whole_a, whole_b = call("floor", a), call("floor", b)
    return whole_a + whole_b + call("floor", (a - whole_a) + (b - whole_b) + 0.5)


def first_unless(op: str, x: Expr, y: Expr, a: dict) -> Expr:
    """MAXIMUM (``op`` ``>``) / MINIMUM (``<``) as LiteRT: the first operand where it wins
    the comparison, else the second (NaN too); ``y`` is first when the ``swapped`` attr says
    so (:func:`litegpu.ops.elementwise.max_min_swapped`)."""
    first, second = (y, x) if a.get("swapped") else (x, y)
    return select(first > second if op == ">" else first < second, first, second)


# XNNPACK's float32 sine and cosine (``src/f32-vsin/rational-5-4.c.in`` and its cosine twin,
# the kernels LiteRT runs for SIN and COS on x86 with FMA3 or AVX-512F; the cpu backend's
# ``mathfn.xnn_sin32``): the argument less the nearest multiple of 2 pi (in two parts),
# folded into [-pi/2, pi/2], then a rational 5/4 fit. A decoder's RoPE tables feed hybrid
# products that quantize their input on the fly, where an ulp can become a quantum, so the
# GPU kernels compute LiteRT's bits. In float32 whatever the arithmetic precision: half
# cannot reduce a RoPE angle of thousands of radians.
_INV_2PI, _2PI_HI, _2PI_LO = 0.15915494, 6.28125, 1.9353072e-3
_PI, _PI_HALF_HI, _PI_HALF_LO = 3.1415927, 1.5707963705, -4.3711388e-08
_SIN_A3, _SIN_A5, _SIN_B2, _SIN_B4 = -1.3314664364e-01, 3.2340581529e-03, 3.3519912511e-02, 4.8770775902e-04


def _turns_removed(x: Expr) -> Expr:
    """``x`` less its nearest multiple of 2 pi, as XNNPACK's sine and cosine reduce it."""
    k = call("rint", x * _INV_2PI)
    return call("fma", -k, _2PI_LO, call("fma", -k, _2PI_HI, x))


def _rational_sine(x: Expr) -> Expr:
    """The sine of a reduced ``x``: folded into [-pi/2, pi/2] with XNNPACK's min and max
    (which keep their second operand for NaN), then its 5/4 rational fit."""
    x = select(x < _PI - x, x, _PI - x)
    x = select(x > -_PI - x, x, -_PI - x)
    x = select(x < _PI - x, x, _PI - x)
    x2 = x * x
    p = x * call("fma", x2, call("fma", x2, _SIN_A5, _SIN_A3), 1.0)
    q = call("fma", x2, call("fma", x2, _SIN_B4, _SIN_B2), 1.0)
    return p / q


# RSQRT as LiteRT runs it on AVX-512F hosts (``xnn_f32_vrsqrt_ukernel__avx512f_rsqrt``): the
# instruction's 14-bit estimate y (:mod:`.rsqrt14`), then ``y - (x * (y * y) - 1) * (0.5 * y)``,
# each operation rounded; outside [2**-126, 2**125], where that kernel is wrong under
# LiteRT's flushed denormals, ``1 / sqrt(x)`` (as the cpu backend's ``mathfn.xnn_rsqrt32``).
# An rms norm's root feeds the row quantization of the next hybrid product.
def _refined_rsqrt(x: Expr) -> tuple[Expr, Expr]:
    """The estimate refined by XNNPACK's Newton step, and whether ``x`` is in the range
    where its kernels are right."""
    y = rsqrt14(x)
    return y - (x * (y * y) - 1.0) * (0.5 * y), ir.logical_and(x >= 2.0 ** -126, x < 2.0 ** 125)


def xnn_rsqrt(x: Expr) -> Expr:
    """XNNPACK's AVX-512F RSQRT of the float32 scalar ``x`` (see above)."""
    newton, valid = _refined_rsqrt(x)
    return select(valid, newton, 1.0 / call("sqrt", x))


# SQRT as LiteRT runs it on AVX-512F hosts (``xnn_f32_vsqrt_ukernel__avx512f_rsqrt``): RSQRT's
# refined estimate times x, each operation rounded; the correctly rounded root outside
# [2**-126, 2**125] (as the cpu backend's ``mathfn.xnn_sqrt32``).
def xnn_sqrt(x: Expr) -> Expr:
    """XNNPACK's AVX-512F SQRT of the float32 scalar ``x`` (see above)."""
    newton, valid = _refined_rsqrt(x)
    return select(valid, x * newton, call("sqrt", x))


# The exponential of XNNPACK's float32 softmax (``src/f32-raddstoreexpminusmax/
# avx512f-rr2-p5.c.in``; the cpu backend's ``mathfn.xnn_exp_nonpositive32``).
_XE_LOG2E, _XE_MAGIC = float.fromhex("0x1.715476p+0"), float.fromhex("0x1.8000FEp23")
_XE_LN2_HI, _XE_LN2_LO = float.fromhex("-0x1.62E400p-1"), float.fromhex("-0x1.7F7D1Cp-20")
_XE_C = tuple(float.fromhex(c) for c in ("0x1.FFFFF6p-1", "0x1.FFFDC6p-2", "0x1.555A80p-3", "0x1.573A1Ap-5",
                                         "0x1.0F9F9Cp-7"))
_XE_CUTOFF = float.fromhex("-0x1.5D589Ep6")    # below it exp(x) is subnormal: 0
_XE_MAGIC_BITS = int(np.float32(_XE_MAGIC).view(np.int32))


def xnn_exp_nonpositive(x: Expr) -> Expr:
    """exp(x) of a float32 scalar ``x <= 0`` (a value less its row's maximum) as XNNPACK's
    softmax computes it: ``n = round(x / ln 2)`` by a magic bias (its low bits, shifted into
    the exponent field, are 2**n), ``t = x - n ln 2`` in two fused multiply-adds, a degree-5
    polynomial, ``s + (t s) p``; 0 below the cutoff (-inf too), NaN stays NaN."""
    n = ir.bitcast(call("fma", x, _XE_LOG2E, _XE_MAGIC), "int")
    s = ir.bitcast(n << 23, "float")
    # XNNPACK's ``n - magic`` (an integer: both have the magic's exponent) from the bits, where
    # a compiler allowed to reassociate (WGSL's) cannot turn ``(x * c + magic) - magic`` into
    # ``x * c`` and lose the rounding.
    k = (n - _XE_MAGIC_BITS).cast(ir.FLOAT)
    t = call("fma", k, _XE_LN2_LO, call("fma", k, _XE_LN2_HI, x))
    c1, c2, c3, c4, c5 = _XE_C
    p = call("fma", call("fma", call("fma", call("fma", ir.lit(c5, x.type), t, c4), t, c3), t, c2), t, c1)
    return select(x < _XE_CUTOFF, 0.0, call("fma", t * s, p, s))


# LOGISTIC as XNNPACK's AVX-512F kernel computes it (``src/f32-vsigmoid/avx512f-rr2-lut32-
# p2-perm2-scalef.c.in``), whose steps the cpu backend's ``litegpu_cpu.kernels.xnn_sigmoid``
# documents (and reads its constants from here): z = -|x| (clamped at -160); ``n = z *
# log2e + magic`` (the low five bits of its bits index a table of 2**(k/32)); ``t = z - n
# ln 2`` in two parts; ``p = s + (t s)(c1 + c2 t)``; ``e = p * 2**floor(n)`` rounded once;
# ``f = e / (e + 1)``, ``1 - f`` for a positive x; results below the smallest normal are 0
# (LiteRT flushes denormals). A decoder's SiLU feeds its hybrid down projection.
XNN_SIGMOID_MAGIC = float(np.float32(1.5 * 2.0 ** 18))                       # 0x1.8p18
XNN_SIGMOID_LOG2E = float(np.float32(1 / np.log(2)))                         # 0x1.715476p0
XNN_SIGMOID_MINUS_LN2_HI = -float(np.float32(np.log(2)))                     # -0x1.62E430p-1
XNN_SIGMOID_MINUS_LN2_LO = float(np.float32(float(np.float32(np.log(2))) - np.log(2)))   # 0x1.05C61p-29
XNN_SIGMOID_C1, XNN_SIGMOID_C2 = float.fromhex("0x1.0000F6p0"), 0.5          # the fit's t and t**2 terms
XNN_SIGMOID_TABLE = tuple(float(np.float32(2.0 ** (k / 32))) for k in range(32))
XNN_SIGMOID_Z_MIN, XNN_SIGMOID_N_MIN = -160.0, -232.0   # z's clamp; floor(n) >= -231 then
XNN_SIGMOID_SCALE_OFFSET = 110                           # 2**(floor(n) + 110) is a normal float32
_SIGMOID_MAGIC_BITS = int(np.float32(XNN_SIGMOID_MAGIC).view(np.int32))
_TINY = 2.0 ** -126


def xnn_sigmoid(x: Expr) -> Expr:
    """XNNPACK's AVX-512F LOGISTIC of the float32 scalar ``x`` (see above); NaN stays NaN."""
    z = -call("fabs", x)
    z = select(z < XNN_SIGMOID_Z_MIN, XNN_SIGMOID_Z_MIN, z)
    n_bits = ir.bitcast(call("fma", z, XNN_SIGMOID_LOG2E, XNN_SIGMOID_MAGIC), "int")
    power = ir.table_load(XNN_SIGMOID_TABLE, "float", n_bits & 31)
    # n - magic from the bits (a multiple of 1/32), which no reassociation can lose
    n = (n_bits - _SIGMOID_MAGIC_BITS).cast(ir.FLOAT) * 0.03125
    t = call("fma", n, XNN_SIGMOID_MINUS_LN2_LO, call("fma", n, XNN_SIGMOID_MINUS_LN2_HI, z))
    p = call("fma", t, XNN_SIGMOID_C2, XNN_SIGMOID_C1)
    p = call("fma", t * power, p, power)
    # vscalefps: p * 2**floor(n) rounded once (a NaN n counts as the smallest)
    c = select(n >= XNN_SIGMOID_N_MIN, n, XNN_SIGMOID_N_MIN)
    scale = ir.bitcast((call("floor", c).cast(ir.INT) + (XNN_SIGMOID_SCALE_OFFSET + 127)) << 23, "float")
    e = (p * scale) * 2.0 ** -XNN_SIGMOID_SCALE_OFFSET
    e = select(e < _TINY, 0.0, e)
    f = e / (e + 1.0)
    f = select(f < _TINY, 0.0, f)
    return select(call("signbit", x), f, 1.0 - f)


# GELU as XNNPACK's ``f32-vgelu`` (exact) and ``f32-vapproxgelu`` (tanh form) rational 12/10
# kernels compute it with fused multiply-adds (the cpu backend's ``mathfn.xnn_gelu32`` reads
# its constants from here): x clamped to [-top, top], ``x/2 * (1 + p(x) / q(x))``.
XNN_GELU_FITS = {   # approximate: (clamp, numerator alpha_1 .. alpha_11, denominator beta_2 .. beta_10)
    False: (5.1638283730e+00, (7.9788452387e-01, 6.6972173750e-02, 9.3065137044e-03, 3.2973114867e-04,
                               1.2609783880e-05, 4.5835321316e-08),
            (2.5060352683e-01, 2.8431978077e-02, 1.8622842617e-03, 7.2267655923e-05, 1.1988805682e-06)),
    True: (4.84974098e+00, (7.9788458347e-01, 6.0803253204e-02, 7.2898347862e-03, 2.6887017884e-04,
                            1.4302649106e-05, 4.9544411240e-08),
           (2.4369759858e-01, 2.4381054565e-02, 1.3060354395e-03, 7.6477612311e-05, 1.3433452750e-06)),
}


def xnn_gelu(x0: Expr, approximate: bool) -> Expr:
    """XNNPACK's GELU of a float32 ``x0`` (see above); its min and max keep a NaN."""
    top, (a1, a3, a5, a7, a9, a11), (b2, b4, b6, b8, b10) = XNN_GELU_FITS[approximate]
    x = select(top < x0, top, x0)
    x = select(-top > x, -top, x)
    x2 = x * x
    fma = lambda a, b, c: call("fma", a, b, c)   # noqa: E731 - Horner in fused steps
    p = x * fma(x2, fma(x2, fma(x2, fma(x2, fma(x2, a11, a9), a7), a5), a3), a1)
    q = fma(x2, fma(x2, fma(x2, fma(x2, fma(x2, b10, b8), b6), b4), b2), 1.0)
    return (x0 * 0.5) * (p / q + 1.0)


def _per_lane(f: Callable[[Expr], Expr]) -> Callable[[Expr], Expr]:
    """The scalar formula ``f`` applied to each lane of a vector (a bit cast is scalar)."""
    return lambda x: f(x) if x.type.lanes == 1 else ir.vector(x.type, *(f(x.lane(j)) for j in range(x.type.lanes)))


def _in_float(f: Callable[[Expr], Expr]) -> Callable[[Expr, dict], Expr]:
    """The unary formula ``f`` computed in float32 (a ``real`` operand converted and back)."""
    return lambda x, a: f(x.cast(ir.FLOAT.with_lanes(x.type.lanes))).cast(x.type)


#: One-input float ops: op name -> f(x, attrs).
UNARY: dict[str, Callable[[Expr, dict], Expr]] = {
    "ABS": lambda x, a: call("fabs", x),
    "NEG": lambda x, a: -x,
    "EXP": lambda x, a: call("exp", x),
    "LOG": lambda x, a: call("log", x),
    "SQRT": _in_float(_per_lane(xnn_sqrt)),
    "RSQRT": _in_float(_per_lane(xnn_rsqrt)),
    "SQUARE": lambda x, a: x * x,
    "SIN": _in_float(lambda x: _rational_sine(_turns_removed(x))),
    "COS": _in_float(lambda x: _rational_sine(call("opaque", _PI_HALF_HI - _turns_removed(x)) + _PI_HALF_LO)),
    "TANH": _in_float(xnn_tanh),
    "LOGISTIC": _in_float(_per_lane(xnn_sigmoid)),
    "HARD_SWISH": lambda x, a: hard_swish(x),
    "GELU": lambda x, a: _in_float(lambda v: xnn_gelu(v, bool(a.get("approximate", False))))(x, a),
    "LEAKY_RELU": lambda x, a: select(x > 0.0, x, x * float(a["alpha"])),
    "ELU": lambda x, a: select(x < 0.0, call("expm1", x), x),
    "FLOOR": lambda x, a: call("floor", x),
    "CEIL": lambda x, a: call("ceil", x),
    "ROUND": lambda x, a: call("rint", x),     # half to even
    "SIGN": lambda x, a: call("sign", x),
    "QUANT_SIM": quant_sim,
    "INV_FLOOR_POW2": lambda x, a: inv_floor_pow2(x),
    # the clamp ops are the fused activations' clamps
    **{op: (lambda x, a, op=op: clamp(op, x)) for op in ("RELU", "RELU6", "RELU_N1_TO_1", "RELU_0_TO_1")},
}

#: Two-input float ops: op name -> f(x, y, attrs).
BINARY: dict[str, Callable[[Expr, Expr, dict], Expr]] = {
    "ADD": lambda x, y, a: x + y,
    "GRID_ADD": lambda x, y, a: x * float(a["a_multiplier"]) + y * float(a["b_multiplier"]),
    "GRID_MUL": lambda x, y, a: (x * y) * float(a["scale"]),
    "GRID_MUL_ROUND": lambda x, y, a: grid_mul_round(x, y),
    "SUB": lambda x, y, a: x - y,
    "MUL": lambda x, y, a: x * y,
    "DIV": lambda x, y, a: x / y,
    "MAXIMUM": lambda x, y, a: first_unless(">", x, y, a),
    "MINIMUM": lambda x, y, a: first_unless("<", x, y, a),
    "POW": lambda x, y, a: call("pow", x, y),
    "SQUARED_DIFFERENCE": lambda x, y, a: (x - y) * (x - y),
    "FLOOR_DIV": lambda x, y, a: call("floor", x / y),
    "FLOOR_MOD": lambda x, y, a: floor_mod(x, y),
    "PRELU": lambda x, y, a: select(x >= 0.0, x, x * y),   # y is alpha
}
