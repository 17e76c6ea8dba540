"""Float LOGISTIC with LiteRT's bits on hosts where XNNPACK runs its AVX-512F kernel.

LiteRT hands float LOGISTIC to XNNPACK, whose microkernel depends on the host's ISA; on an
x86 host with AVX-512F it is ``xnn_f32_vsigmoid_ukernel__avx512f_rr2_lut32_p2_perm2_scalef_div``
(``src/f32-vsigmoid/avx512f-rr2-lut32-p2-perm2-scalef.c.in``; the ``_u64`` build ships in
ai-edge-litert 2.3, whose ``libpywrap_litert_common.so`` holds the same constants and
table). :func:`xnn_sigmoid32` is that kernel for one float32, step by step:

- ``z = -|x|`` (the sign bit set), so exp never overflows;
- ``n = z * log2e + magic`` in one fused multiply-add, the magic bias (1.5 * 2**18)
  leaving ``round(32 z / ln 2)`` in the low bits: the low five index a table of
  ``2**(k/32)``, ``n - magic`` is that rounding over 32;
- ``t = z - n ln2`` as two fused multiply-adds (ln 2 split into its float32 rounding and
  the rest), ``p = s + (t s) (c1 + c2 t)`` with ``s`` the table entry (two more, and
  one multiply);
- ``e = p * 2**floor(n)`` rounded once (``vscalefps``), ``f = e / (e + 1)``, and
  ``1 - f`` where ``x``'s sign bit is clear.

It differs from the portable :func:`.mathfn.sigmoid32` by up to 3 ulps (from float64 by
up to 3.5, where that one keeps within 2), on about a third of the values of a swish:
before a hybrid convolution's on-the-fly int8 quantization an ulp can move a value across
a rounding boundary and become a whole quantum. With MEAN and the float depthwise
convolutions, whose sums XNNPACK orders its own way, that is what kept efficientnet_b0's
dynamic-range model 8.6e-3 (relative) from LiteRT.

Results below the smallest normal float32 (x in about (-103.97, -87.34)) are zero, as
LiteRT gives them: XNNPACK runs with denormals flushed to zero.

One departure, on purpose: ``z`` is clamped at -160, where both give 0 (and 1 for x > 0),
because for |x| in about [4.3e26, 2.4e38] XNNPACK's reduction overflows and it returns
NaN; here those give 0 and 1, as the function does (tests/test_nan_inf.py).

:data:`MATCHES_LITERT` says whether this host is one where XNNPACK picks this kernel (its
AVX2, AVX and SSE kernels use other polynomials); elsewhere :func:`sigmoid32` is
:func:`.mathfn.sigmoid32`, as before. :mod:`..fusion` imports :func:`sigmoid32` from here
and names :data:`DIGEST` in the sources it generates.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
from llvmlite import binding, ir

from litegpu.codegen import formulas

from ..jit import cgutils, intrinsic, njit, types
from . import mathfn
from .mathfn import fma32

# XNNPACK's x86 configuration picks the AVX-512F sigmoid where the CPU and the OS support
# AVX-512F (LLVM's host features check both, as XNNPACK's cpuinfo does).
MATCHES_LITERT = bool(binding.get_host_cpu_features().get("avx512f", False))

_F32 = np.float32
# The kernel's constants, each what its name says (checked against XNNPACK's hex literals
# in tests/test_cpu_xnn_sigmoid.py).
_SIGN = np.int32(-0x80000000)
_MAGIC = _F32(formulas.XNN_SIGMOID_MAGIC)                       # 0x1.8p18
_LOG2E = _F32(formulas.XNN_SIGMOID_LOG2E)                       # 0x1.715476p0
_MINUS_LN2_HI = _F32(formulas.XNN_SIGMOID_MINUS_LN2_HI)         # -0x1.62E430p-1
_MINUS_LN2_LO = _F32(formulas.XNN_SIGMOID_MINUS_LN2_LO)         # 0x1.05C61p-29
_C1 = _F32(formulas.XNN_SIGMOID_C1)     # the minimax fit's coefficients of t and t**2
_C2 = _F32(formulas.XNN_SIGMOID_C2)
_ONE = _F32(1)
TABLE = np.array(formulas.XNN_SIGMOID_TABLE, _F32)   # 2**(k/32) rounded to nearest
# The clamp of z (see the module docstring), and the exponent offset of _scalef: with
# z >= -160, floor(n) >= -231, and 2**(floor(n) + 110) is a normal float32.
_Z_MIN = _F32(formulas.XNN_SIGMOID_Z_MIN)
_N_MIN = _F32(formulas.XNN_SIGMOID_N_MIN)
_SCALE_OFFSET = formulas.XNN_SIGMOID_SCALE_OFFSET
_UNSCALE = _F32(2.0 ** -_SCALE_OFFSET)
_TINY = _F32(2.0 ** -126)     # the smallest normal float32


@intrinsic
def _bits(typingctx, x):
    """The int32 bit pattern of the float32 ``x``."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(32))
    return types.int32(types.float32), codegen


@intrinsic
def _from_bits(typingctx, bits):
    """The float32 whose bit pattern is the int32 ``bits``."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())
    return types.float32(types.int32), codegen


@njit(cache=True, inline="always")
def _scalef(p, n):
    """``p * 2**floor(n)`` rounded once, as ``vscalefps`` does, for a normal ``p`` in
    [0.5, 4) and ``n >= -231`` (a NaN ``n`` counts as -232; ``p`` is NaN then): the
    product with ``2**(floor(n) + 110)`` is exact, the one with ``2**-110`` rounds once,
    into the subnormals too."""
    c = n if n >= _N_MIN else _N_MIN
    k = np.int32(np.floor(c)) + np.int32(_SCALE_OFFSET + 127)
    return (p * _from_bits(k << np.int32(23))) * _UNSCALE


@njit(cache=True, inline="always")
def _flushed(v):
    """``v`` with a subnormal result replaced by zero, as under LiteRT's flush-to-zero."""
    return _F32(0) if v < _TINY else v       # written so: NaN stays NaN


@njit(cache=True, inline="always")
def xnn_sigmoid32(x):
    """LOGISTIC of a float32 as XNNPACK's AVX-512F kernel computes it (the module
    docstring), to the bit; NaN gives NaN, -inf 0 and inf 1."""
    sign = _bits(x) & _SIGN
    z = _from_bits(_bits(x) | _SIGN)
    z = _Z_MIN if z < _Z_MIN else z                 # written so: NaN stays NaN
    n = fma32(z, _LOG2E, _MAGIC)
    power = TABLE[_bits(n) & np.int32(31)]          # 2**(k/32), k the low five bits
    n = n - _MAGIC
    t = fma32(n, _MINUS_LN2_HI, z)
    t = fma32(n, _MINUS_LN2_LO, t)
    p = fma32(t, _C2, _C1)
    t = t * power
    p = fma32(t, p, power)
    e = _flushed(_scalef(p, n))
    f = _flushed(e / (e + _ONE))
    return f if sign != np.int32(0) else _ONE - f


sigmoid32 = xnn_sigmoid32 if MATCHES_LITERT else mathfn.sigmoid32
"""The cpu's float32 LOGISTIC: LiteRT's bits where :data:`MATCHES_LITERT`, else
:func:`.mathfn.sigmoid32` (within 2 ulps of float64)."""

DIGEST = hashlib.sha256(Path(__file__).read_bytes() + mathfn.DIGEST.encode()
                        + bytes([MATCHES_LITERT])).hexdigest()[:16]
"""Names this module, the one it falls back on and the host's choice in generated sources."""


# -- sixteen lanes at once -------------------------------------------------------------------
# LLVM vectorizes xnn_sigmoid32 in a loop, but its table lookup becomes a gather (vgatherdps),
# which took two thirds of a swish's time (0.41 of 0.64 ns an element on one Zen 4 core);
# XNNPACK's kernel looks the 32 entries up in two registers with one vpermt2ps.
LANES = 16
_V = ir.VectorType(ir.FloatType(), LANES)
_VI = ir.VectorType(ir.IntType(32), LANES)


def _splat(value, vector=_V):
    return ir.Constant(vector, [value] * LANES)


def _vector_sigmoid(builder, x):
    """:func:`xnn_sigmoid32` on each lane of ``x`` (a ``<16 x float>``), the same operations
    in the same order: the same bits."""
    f32 = ir.FloatType()
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V, [_V] * 3), "llvm.fma.v16f32")
    floor = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V, [_V]), "llvm.floor.v16f32")

    def const(value):
        return _splat(ir.Constant(f32, float(np.float32(value))))

    def select_below(v, bound, replacement):
        """``replacement if v < bound else v`` lane by lane (NaN keeps v)."""
        return builder.select(builder.fcmp_ordered("<", v, bound), replacement, v)

    bits = builder.bitcast(x, _VI)
    sign_bit = _splat(ir.Constant(ir.IntType(32), int(_SIGN)), _VI)
    sign = builder.and_(bits, sign_bit)
    z = builder.bitcast(builder.or_(bits, sign_bit), _V)
    z = select_below(z, const(_Z_MIN), const(_Z_MIN))
    n = builder.call(fma, [z, const(_LOG2E), const(_MAGIC)])
    index = builder.and_(builder.bitcast(n, _VI), _splat(ir.Constant(ir.IntType(32), 31), _VI))
    power = _table_lookup(builder, index)
    n = builder.fsub(n, const(_MAGIC))
    t = builder.call(fma, [n, const(_MINUS_LN2_HI), z])
    t = builder.call(fma, [n, const(_MINUS_LN2_LO), t])
    p = builder.call(fma, [t, const(_C2), const(_C1)])
    t = builder.fmul(t, power)
    p = builder.call(fma, [t, p, power])
    # _scalef: c = max(n, -232) with NaN counting as -232 (the scalar `n if n >= _N_MIN`).
    c = builder.select(builder.fcmp_ordered(">=", n, const(_N_MIN)), n, const(_N_MIN))
    k = builder.add(builder.fptosi(builder.call(floor, [c]), _VI),
                    _splat(ir.Constant(ir.IntType(32), _SCALE_OFFSET + 127), _VI))
    scale = builder.bitcast(builder.shl(k, _splat(ir.Constant(ir.IntType(32), 23), _VI)), _V)
    e = builder.fmul(builder.fmul(p, scale), const(_UNSCALE))
    e = select_below(e, const(_TINY), const(0.0))
    f = builder.fdiv(e, builder.fadd(e, const(_ONE)))
    f = select_below(f, const(_TINY), const(0.0))
    negative = builder.icmp_unsigned("!=", sign, _splat(ir.Constant(ir.IntType(32), 0), _VI))
    return builder.select(negative, f, builder.fsub(const(_ONE), f))


def _table_lookup(builder, index):
    """``TABLE[index]`` lane by lane: one ``vpermt2ps`` over the table's two halves where
    the CPU has AVX-512F, the only hosts that run this path. Elsewhere an extract per lane,
    which no run reaches (every caller checks :data:`MATCHES_LITERT`); it only keeps the
    untaken branch of ``_float_unary_task`` compiling on CPUs without the instruction."""
    halves = [ir.Constant(_V, [ir.Constant(ir.FloatType(), float(v)) for v in TABLE[h * LANES:(h + 1) * LANES]])
              for h in (0, 1)]
    if MATCHES_LITERT:
        permute = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_V, [_V, _VI, _V]),
                                                 "llvm.x86.avx512.vpermi2var.ps.512")
        return builder.call(permute, [halves[0], index, halves[1]])
    table = ir.Constant(ir.VectorType(ir.FloatType(), 2 * LANES),
                        [ir.Constant(ir.FloatType(), float(v)) for v in TABLE])
    out = ir.Constant(_V, ir.Undefined)
    for lane in range(LANES):
        at = ir.Constant(ir.IntType(32), lane)
        out = builder.insert_element(out, builder.extract_element(table, builder.extract_element(index, at)), at)
    return out


def _block_intrinsic(swish: bool):
    def block(typingctx, xp, outp, i):
        """LOGISTIC (or, with ``swish``, ``x * LOGISTIC(x)``) of the 16 floats at ``xp + i``
        into ``outp + i``."""
        def codegen(context, builder, signature, args):
            x_ptr, out_ptr, at = args
            src = builder.bitcast(builder.gep(x_ptr, [at]), _V.as_pointer())
            x = builder.load(src, align=4)
            y = _vector_sigmoid(builder, x)
            if swish:
                y = builder.fmul(x, y)
            builder.store(y, builder.bitcast(builder.gep(out_ptr, [at]), _V.as_pointer()), align=4)
            return context.get_dummy_value()
        return types.void(xp, outp, types.int64), codegen
    return intrinsic(block)


_sigmoid16 = _block_intrinsic(False)
_swish16 = _block_intrinsic(True)


@njit(cache=True, inline="always")
def sigmoid_range(xp, outp, start, end, swish):
    """LOGISTIC (``x * LOGISTIC(x)`` with ``swish``) of elements ``start .. end`` of the
    float32 pointer ``xp`` into ``outp``, 16 lanes at a time and the rest one by one: the
    bits of :func:`xnn_sigmoid32`. For hosts where :data:`MATCHES_LITERT`."""
    i = start
    while i + LANES <= end:
        if swish:
            _swish16(xp, outp, i)
        else:
            _sigmoid16(xp, outp, i)
        i += LANES
    while i < end:
        v = xp[i]
        outp[i] = v * xnn_sigmoid32(v) if swish else xnn_sigmoid32(v)
        i += 1
