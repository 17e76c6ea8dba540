"""The CUDA C++ dialect (what NVRTC compiles: C++17 with ``cuda_fp16.h``).

CUDA has the scalar math of the kernel language (``exp``, ``fmax``, ``rint``...
overloaded for ``float``) and ``float4``/``int4``-style structs, but no vector
arithmetic, no ``float8``/``float16``/``half4``, no ``vload``/``vstore`` or
``convert_*`` builtins. The :data:`LIBRARY` defines them, generated from the small
tables below so each operator and function is written once, with OpenCL's semantics:

- vector arithmetic is per lane, a scalar operand is broadcast;
- a vector comparison gives a mask (``int4`` for ``float4``, ``short4`` for ``half4``)
  of -1 (true) or 0 lanes, and ``select(a, b, c)`` takes ``b`` where ``c``'s lane
  has its sign bit set (a scalar ``c``: where it is nonzero);
- ``half`` mixed with ``float`` computes in ``float`` and with an ``int`` in ``half``,
  as OpenCL's usual arithmetic conversions do (``cuda_fp16.h`` finds those ambiguous);
- ``convert_<int>_sat`` rounds toward zero, saturates and maps NaN to 0; float to
  half conversions round to nearest even.

Kernels are ``extern "C"`` (their names stay ``k_<digest>``); tensors arrive as
pointers the runtime has already offset. CUDA launches whole blocks (see
:func:`litegpu.codegen.render.blocks`), so kernels guard their global size.
"""
from __future__ import annotations

from .dialect import QUADS, Dialect
from .opencl import portable_preludes

_FN = "__device__ inline"

# -- the vector types ------------------------------------------------------------------------
# name -> (scalar type, fields, field type). ``float4`` and the integer quads are CUDA's own
# structs; the others are defined here. Wide vectors are structs of quads (Dialect.swizzles).
_QUAD_FIELDS = ("x", "y", "z", "w")
_VECTORS = {
    "float4": ("float", _QUAD_FIELDS, "float"),
    "half4": ("half", _QUAD_FIELDS, "half"),
    "float8": ("float", QUADS[8], "float4"),
    "half8": ("half", QUADS[8], "half4"),
    "float16": ("float", QUADS[16], "float4"),
    "half16": ("half", QUADS[16], "half4"),
}
_DEFINED = ("half4", "float8", "half8", "float16", "half16")   # CUDA lacks these
# The mask type a comparison of each quad gives (OpenCL's signed integer of the lane's size).
_MASKS = {"float4": "int4", "half4": "short4"}
# Integer quads the kernels load and store (CONCATENATION's vector copies).
_INT_QUADS = {"int": "int4", "uchar": "uchar4", "char": "char4", "short": "short4", "long": "long4"}

_ARITH = ("+", "-", "*", "/")
_COMPARE = ("<", ">", "<=", ">=", "==", "!=")
# Unary math of the kernel language, per lane for vectors; through float for half.
_UNARY = ("exp", "exp2", "expm1", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tanh",
          "fabs", "floor", "ceil", "rint", "round", "sign")
_BINARY = ("fmax", "fmin", "fmod", "pow")
_SCALAR_BOUND = ("fmax", "fmin")   # OpenCL also takes a scalar second operand for these
# convert_<int>_sat: (type, lowest, highest, float bounds at or beyond which it saturates).
_SAT = {
    "int": ("(-2147483647 - 1)", "2147483647", "-2147483648.0f", "2147483648.0f"),
    "long": ("(-9223372036854775807L - 1)", "9223372036854775807L", "-9223372036854775808.0f",
             "9223372036854775808.0f"),
    "short": ("-32768", "32767", "-32768.0f", "32767.0f"),
    "char": ("-128", "127", "-128.0f", "127.0f"),
    "uchar": ("0", "255", "0.0f", "255.0f"),
}

_HEADER = """\
#include <cuda_fp16.h>
typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
#if __CUDACC_VER_MAJOR__ >= 13
#define long4 long4_32a
#endif
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fc00000)
#endif
#ifndef FLT_MAX
#define FLT_MAX 3.402823466e+38f
#endif
#ifndef INT_MAX
#define INT_MAX 2147483647
#endif
#ifndef LONG_MAX
#define LONG_MAX 9223372036854775807L
#endif
#ifndef UCHAR_MAX
#define UCHAR_MAX 255
#endif
#ifndef CHAR_MAX
#define CHAR_MAX 127
#endif
#ifndef SHRT_MAX
#define SHRT_MAX 32767
#endif
"""


def _each(vtype: str, expr) -> str:
    """``make_<vtype>(expr(f) for each field f)``: a per-field result."""
    _, fields, _ = _VECTORS[vtype]
    return f"make_{vtype}({', '.join(expr(f) for f in fields)})"


def _types() -> list[str]:
    """The structs CUDA lacks and their ``make_*`` constructors: from fields, from every
    scalar lane (wide vectors), and one scalar broadcast."""
    out = []
    for v in _DEFINED:
        scalar, fields, ftype = _VECTORS[v]
        align = {"half4": 8, "half8": 16, "half16": 16}.get(v, 16)
        out.append(f"struct __align__({align}) {v} {{ {ftype} {', '.join(fields)}; }};")
        params = ", ".join(f"{ftype} {f}" for f in fields)
        out.append(f"{_FN} {v} make_{v}({params}) {{ {v} r; {' '.join(f'r.{f} = {f};' for f in fields)} return r; }}")
        if ftype != scalar:   # from every lane: quads of four scalars
            lanes = 4 * len(fields)
            params = ", ".join(f"{scalar} a{j}" for j in range(lanes))
            quads = ", ".join(f"make_{ftype}({', '.join(f'a{4 * q + j}' for j in range(4))})"
                              for q in range(len(fields)))
            out.append(f"{_FN} {v} make_{v}({params}) {{ return make_{v}({quads}); }}")
    for v in _VECTORS:   # a broadcast scalar (CUDA's make_float4 takes four)
        scalar, fields, ftype = _VECTORS[v]
        inner = "x" if ftype == scalar else f"make_{ftype}(x)"
        out.append(f"{_FN} {v} make_{v}({scalar} x) {{ return make_{v}({', '.join([inner] * len(fields))}); }}")
    return out


def _half_mixing() -> list[str]:
    """``half`` with ``float`` or ``int``, as OpenCL converts: exact overloads win over both
    ``cuda_fp16.h``'s ``__half`` operators and the built-in ones."""
    out = []
    for op in _ARITH + _COMPARE:
        rtype = "bool" if op in _COMPARE else None
        out += [f"{_FN} {rtype or 'float'} operator{op}(half a, float b) {{ return (float)a {op} b; }}",
                f"{_FN} {rtype or 'float'} operator{op}(float a, half b) {{ return a {op} (float)b; }}",
                f"{_FN} {rtype or 'half'} operator{op}(half a, int b) {{ return a {op} (half)b; }}",
                f"{_FN} {rtype or 'half'} operator{op}(int a, half b) {{ return (half)a {op} b; }}"]
    return out


def _arithmetic() -> list[str]:
    """Per-lane ``+ - * /`` of each vector type with a vector or a scalar, compound
    assignment and unary minus; comparisons of quads give masks."""
    out = []
    for v, (s, fields, _) in _VECTORS.items():
        for op in _ARITH:
            out += [f"{_FN} {v} operator{op}({v} a, {v} b) {{ return {_each(v, lambda f: f'a.{f} {op} b.{f}')}; }}",
                    f"{_FN} {v} operator{op}({v} a, {s} b) {{ return {_each(v, lambda f: f'a.{f} {op} b')}; }}",
                    f"{_FN} {v} operator{op}({s} a, {v} b) {{ return {_each(v, lambda f: f'a {op} b.{f}')}; }}",
                    f"{_FN} {v}& operator{op}=({v}& a, {v} b) {{ return a = a {op} b; }}",
                    f"{_FN} {v}& operator{op}=({v}& a, {s} b) {{ return a = a {op} b; }}"]
        out.append(f"{_FN} {v} operator-({v} a) {{ return {_each(v, lambda f: f'-a.{f}')}; }}")
    for v, m in _MASKS.items():
        s = _VECTORS[v][0]
        for op in _COMPARE:
            out += [f"{_FN} {m} operator{op}({v} a, {v} b) {{ return make_{m}("
                    + ", ".join(f"-(a.{f} {op} b.{f})" for f in _QUAD_FIELDS) + "); }",
                    f"{_FN} {m} operator{op}({v} a, {s} b) {{ return a {op} make_{v}(b); }}",
                    f"{_FN} {m} operator{op}({s} a, {v} b) {{ return make_{v}(a) {op} b; }}"]
    for m in dict.fromkeys(_MASKS.values()):   # masks combine as OpenCL's integer vectors do
        for op in ("&&", "||", "==", "!="):
            out.append(f"{_FN} {m} operator{op}({m} a, {m} b) {{ return make_{m}("
                       + ", ".join(f"-(a.{f} {op} b.{f})" for f in _QUAD_FIELDS) + "); }")
        out.append(f"{_FN} {m} operator!({m} a) {{ return make_{m}(" + ", ".join(f"-!a.{f}" for f in _QUAD_FIELDS) + "); }")
    return out


def _math() -> list[str]:
    """The math CUDA lacks for scalars (``sign``, ``clamp``, ``select``, ``half``
    overloads) and every function per lane for vectors."""
    out = [f"{_FN} float sign(float x) {{ return x > 0.0f ? 1.0f : x < 0.0f ? -1.0f : x == x ? x : 0.0f; }}",
           f"{_FN} float clamp(float x, float lo, float hi) {{ return fminf(fmaxf(x, lo), hi); }}",
           f"{_FN} int clamp(int x, int lo, int hi) {{ return min(max(x, lo), hi); }}",
           f"{_FN} long clamp(long x, long lo, long hi) {{ return min(max(x, lo), hi); }}",
           f"{_FN} int isnan(half x) {{ return __hisnan(x); }}",
           f"{_FN} int isinf(half x) {{ return __hisinf(x) != 0; }}",
           f"{_FN} int signbit(half x) {{ return signbit((float)x); }}"]
    # half computes each function in float: exact for the rounding ones, and within
    # half's precision for the others.
    out += [f"{_FN} half {fn}(half x) {{ return (half){fn}((float)x); }}" for fn in _UNARY]
    out += [f"{_FN} half {fn}(half a, half b) {{ return (half){fn}((float)a, (float)b); }}" for fn in _BINARY]
    out.append(f"{_FN} half clamp(half x, half lo, half hi) {{ return fmin(fmax(x, lo), hi); }}")
    out.append(f"{_FN} half fma(half a, half b, half c) {{ return (half)fmaf((float)a, (float)b, (float)c); }}")
    for s in ("float", "half", "int"):
        out.append(f"{_FN} {s} select({s} a, {s} b, int c) {{ return c ? b : a; }}")
    out += [f"{_FN} int lg_as_int(float x) {{ return __float_as_int(x); }}",
            f"{_FN} uint lg_as_uint(float x) {{ return __float_as_uint(x); }}",
            f"{_FN} float lg_as_float(int x) {{ return __int_as_float(x); }}",
            f"{_FN} float lg_as_float(uint x) {{ return __uint_as_float(x); }}"]
    for v, (s, fields, _) in _VECTORS.items():
        out += [f"{_FN} {v} {fn}({v} a) {{ return {_each(v, lambda f: f'{fn}(a.{f})')}; }}" for fn in _UNARY]
        out += [f"{_FN} {v} {fn}({v} a, {v} b) {{ return {_each(v, lambda f: f'{fn}(a.{f}, b.{f})')}; }}"
                for fn in _BINARY]
        out += [f"{_FN} {v} {fn}({v} a, {s} b) {{ return {_each(v, lambda f: f'{fn}(a.{f}, b)')}; }}"
                for fn in _SCALAR_BOUND]
        out.append(f"{_FN} {v} fma({v} a, {v} b, {v} c) {{ return {_each(v, lambda f: f'fma(a.{f}, b.{f}, c.{f})')}; }}")
        out += [f"{_FN} {v} clamp({v} x, {s} lo, {s} hi) {{ return {_each(v, lambda f: f'clamp(x.{f}, lo, hi)')}; }}",
                f"{_FN} {v} clamp({v} x, {v} lo, {v} hi) {{ return {_each(v, lambda f: f'clamp(x.{f}, lo.{f}, hi.{f})')}; }}"]
    for v, m in _MASKS.items():   # per-lane tests give masks; select reads their sign bits
        out += [f"{_FN} {m} {test}({v} a) {{ return make_{m}(" + ", ".join(f"-{test}(a.{f})" for f in _QUAD_FIELDS)
                + "); }" for test in ("isnan", "isinf")]
        out += [f"{_FN} {m} signbit({v} a) {{ return make_{m}("
                + ", ".join(f"-(signbit(a.{f}) != 0)" for f in _QUAD_FIELDS) + "); }",
                f"{_FN} {v} select({v} a, {v} b, {m} c) {{ return make_{v}("
                + ", ".join(f"c.{f} < 0 ? b.{f} : a.{f}" for f in _QUAD_FIELDS) + "); }"]
    return out


def _memory() -> list[str]:
    """``vload``/``vstore`` (unaligned, element by element), the half loads and stores,
    and the conversions."""
    out = []
    quads = {"float": "float4", "half": "half4", **_INT_QUADS}
    for s, q in quads.items():
        out += [f"{_FN} {q} vload4(size_t o, const {s}* p) {{ p += 4 * o; {q} r; "
                + " ".join(f"r.{f} = p[{j}];" for j, f in enumerate(_QUAD_FIELDS)) + " return r; }",
                f"{_FN} void vstore4({q} v, size_t o, {s}* p) {{ p += 4 * o; "
                + " ".join(f"p[{j}] = v.{f};" for j, f in enumerate(_QUAD_FIELDS)) + " }"]
    for s in ("float", "half"):
        for n in (8, 16):
            parts = ", ".join(f"vload4({n // 4} * o + {q}, p)" for q in range(n // 4))
            out.append(f"{_FN} {s}{n} vload{n}(size_t o, const {s}* p) {{ return make_{s}{n}({parts}); }}")
    out += [f"{_FN} float vload_half(size_t i, const half* p) {{ return __half2float(p[i]); }}",
            f"{_FN} void vstore_half(float v, size_t i, half* p) {{ p[i] = __float2half_rn(v); }}",
            f"{_FN} float4 convert_float4(float4 v) {{ return v; }}",
            f"{_FN} float4 convert_float4(half4 v) {{ return {_each('float4', lambda f: f'__half2float(v.{f})')}; }}",
            f"{_FN} half4 convert_half4(half4 v) {{ return v; }}",
            f"{_FN} half4 convert_half4(float4 v) {{ return {_each('half4', lambda f: f'__float2half_rn(v.{f})')}; }}",
            f"{_FN} float4 vload_half4(size_t o, const half* p) {{ return convert_float4(vload4(o, p)); }}",
            f"{_FN} void vstore_half4(float4 v, size_t o, half* p) {{ vstore4(convert_half4(v), o, p); }}"]
    for n in (8, 16):
        out += [f"{_FN} float{n} convert_float{n}(float{n} v) {{ return v; }}",
                f"{_FN} float{n} convert_float{n}(half{n} v) {{ return {_each(f'float{n}', lambda f: f'convert_float4(v.{f})')}; }}",
                f"{_FN} float{n} vload_half{n}(size_t o, const half* p) {{ return convert_float{n}(vload{n}(o, p)); }}"]
    for t, (lo, hi, flo, fhi) in _SAT.items():
        out.append(f"{_FN} {t} convert_{t}_sat(float x) {{ return x != x ? 0 : x <= {flo} ? {lo} : "
                   f"x >= {fhi} ? {hi} : ({t})x; }}")
    out.append(f"{_FN} long convert_long_rte(float x) {{ return (long)rintf(x); }}")
    return out


#: Definitions of every kernel-language function and type CUDA lacks (see the module doc).
LIBRARY = "\n".join([_HEADER.rstrip("\n"), *_types(), *_half_mixing(), *_arithmetic(), *_math(), *_memory()]) + "\n"

# OpenCL's preludes, and ``make_real4`` (the constructor ``Dialect.vector`` spells for real4).
_CUDA_PRELUDES = {name: text + f"#define make_real4 make_{'half' if name == 'F16' else 'float'}4\n"
                  for name, text in portable_preludes().items()}

CUDA = Dialect(
    name="cuda", suffix=".cu",
    kernel_prefix='extern "C" __global__ void',
    buffer_param="{ptr} __restrict__ {name}",
    offset_param=None,
    global_space="", local_space="", local_array="__shared__ {type} {name}[{size}];",
    restrict="__restrict__",
    barrier="__syncthreads();",
    global_id="((int)(blockIdx.{axis} * blockDim.{axis} + threadIdx.{axis}))",
    local_id="((int)threadIdx.{axis})", group_id="((int)blockIdx.{axis})",
    id_params="",
    vector="make_{type}({args})",
    choose="select({b}, {a}, {cond})",
    bitcast="lg_as_{type}({x})",
    table="static const {type} {name}[{size}] = {{{values}}};",
    exact_grid=False, swizzles=False,
    preludes=_CUDA_PRELUDES,
    library=LIBRARY,
)
