"""The Metal Shading Language dialect (MSL 2.2 or later, C++14-based).

How MSL differs from OpenCL C, and where each difference is handled:

- Signatures: ``kernel void`` functions whose buffers are ``device`` pointers bound to
  ``[[buffer(n)]]`` slots. The runtime binds each tensor at its byte offset
  (``setBuffer:offset:atIndex:``), so no offset parameters; the thread ids arrive as
  ``uint3`` parameters with position attributes and are read as ``int`` casts.
- Launches: ``dispatchThreads`` runs the exact grid (non-uniform threadgroups), so no
  guard is rendered.
- Vectors: MSL has 2-, 3- and 4-lane vectors only, built by constructor (``float4(x)``)
  and read by ``.x``..``.w``. ``float8``/``float16`` (and the ``half8``/``half16`` that
  half ``vload8``/``vload16`` return) are structs of quads, defined by the library with
  their arithmetic and the math the kernels apply to them.
- Functions: MSL's math has the OpenCL names and rounding (``rint`` to nearest even,
  ``round`` half away from zero) but takes one type ``T`` for every argument; the
  library adds OpenCL's vector-with-scalar forms, ``expm1``, the ``vload``/``vstore``
  family (templates over the pointer type: device and threadgroup pointers are
  different types), ``convert_*`` and the saturating conversions.
- ``select(a, b, signbit(v))`` needs nothing: MSL's ``signbit`` of a vector is a bool
  vector and its ``select`` picks ``b`` where it is true, OpenCL's result exactly.

- Choices: MSL's ``?:`` takes a scalar ``bool`` condition only, so a choice that may be
  lane-wise is spelled ``select(b, a, cond)`` (``a`` where ``cond`` holds, else ``b``;
  a scalar condition works too).

The generated programs assume ``MTLCompileOptions.fastMathEnabled = NO`` (math mode
"safe"): fast math lets the compiler drop NaN checks and reassociate, which
``isnan``, the saturating conversions and ``expm1`` here rely on not happening.
"""
from __future__ import annotations

from .dialect import QUADS, Dialect
from .opencl import portable_preludes

# -- the library: generated from small tables ---------------------------------------------------
_SCALARS = ("float", "half", "int", "uint", "long", "ulong", "short", "ushort", "char", "uchar")
_FLOATS = ("float", "half")
# MSL math that the kernels apply to wide vectors (a lane-wise quad each), by arity.
_UNARY = ("exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tanh", "floor", "ceil",
          "round", "rint", "trunc", "fabs", "sign")
_BINARY = ("fmax", "fmin", "max", "min", "pow", "fmod")
# OpenCL's saturating float -> integer conversions: (type, lowest, highest, highest + 1 as a float
# literal). Powers of two bound int and long, the first floats that no longer fit.
_SATURATING = (("char", "-128", "127", "128.0f"), ("uchar", "0", "255", "256.0f"),
               ("short", "-32768", "32767", "32768.0f"), ("int", "(-2147483647 - 1)", "2147483647", "2147483648.0f"),
               ("long", "(-9223372036854775807L - 1)", "9223372036854775807L", "9223372036854775808.0f"))
# Limits the kernels name, defined where metal_stdlib has no macro of that name.
_LIMITS = (("INFINITY", "__builtin_inff()"), ("NAN", "__builtin_nanf(\"\")"), ("FLT_MAX", "0x1.fffffep127f"),
           ("CHAR_MAX", "127"), ("CHAR_MIN", "(-128)"), ("UCHAR_MAX", "255"), ("SHRT_MAX", "32767"),
           ("SHRT_MIN", "(-32768)"), ("INT_MAX", "2147483647"), ("INT_MIN", "(-2147483647 - 1)"),
           ("LONG_MAX", "9223372036854775807L"), ("LONG_MIN", "(-9223372036854775807L - 1)"))

_HEAD = """\
#include <metal_stdlib>
using namespace metal;
"""

# Type functions the vload/vstore templates are written with. A pointer's element type is
# matched per address space: a device pointer and a threadgroup pointer are different types.
_TRAITS = """\
namespace lg {
template <typename P> struct elem;
template <typename T> struct elem<device T*> { typedef T type; };
template <typename T> struct elem<device const T*> { typedef T type; };
template <typename T> struct elem<threadgroup T*> { typedef T type; };
template <typename T> struct elem<threadgroup const T*> { typedef T type; };
template <typename T> struct elem<thread T*> { typedef T type; };
template <typename T> struct elem<thread const T*> { typedef T type; };
template <typename T, int N> struct vec;   // OpenCL's T<N>: defined for the types below alone
{vec}
template <typename T, typename R> struct if_half;   // R where T is half: half loads read half alone
template <typename R> struct if_half<half, R> { typedef R type; };
}
template <typename P> using lg_elem = typename lg::elem<P>::type;
template <typename P, int N> using lg_vec = typename lg::vec<lg_elem<P>, N>::type;
template <typename P, typename R> using lg_if_half = typename lg::if_half<lg_elem<P>, R>::type;
"""

_WIDE_OPS = ("+", "-", "*", "/")


def _wide_struct(base: str, n: int) -> str:
    """``{base}{n}``: a struct of quads with OpenCL's constructors and arithmetic."""
    t, q, quads = f"{base}{n}", f"{base}4", QUADS[n]
    lanes = ", ".join(f"{base} a{i}" for i in range(n))
    by_lanes = ", ".join(f"{name}({', '.join(f'a{4 * k + i}' for i in range(4))})" for k, name in enumerate(quads))
    each = lambda fmt: ", ".join(fmt.format(m=m) for m in quads)   # noqa: E731 - one expression per quad
    out = [f"struct {t} {{",
           f"  {q} {', '.join(quads)};",
           f"  {t}() = default;",
           f"  {t}({', '.join(f'{q} {m}_' for m in quads)}) : {each('{m}({m}_)')} {{}}",
           f"  {t}({base} s) : {each('{m}(s)')} {{}}   // one scalar to every lane",
           f"  {t}({lanes}) : {by_lanes} {{}}"]
    out += [f"  thread {t}& operator{op}=({t} b) {{ {' '.join(f'{m} {op}= b.{m};' for m in quads)} return *this; }}"
            for op in _WIDE_OPS]
    out.append("};")
    for op in _WIDE_OPS:
        out += [f"inline {t} operator{op}({t} a, {t} b) {{ return {t}({each('a.{m} ' + op + ' b.{m}')}); }}",
                f"inline {t} operator{op}({t} a, {base} b) {{ return {t}({each('a.{m} ' + op + ' b')}); }}",
                f"inline {t} operator{op}({base} a, {t} b) {{ return {t}({each('a ' + op + ' b.{m}')}); }}"]
    out.append(f"inline {t} operator-({t} a) {{ return {t}({each('-a.{m}')}); }}")
    for f in _UNARY:
        out.append(f"inline {t} {f}({t} x) {{ return {t}({each('metal::' + f + '(x.{m})')}); }}")
    for f in _BINARY:
        out += [f"inline {t} {f}({t} x, {t} y) {{ return {t}({each('metal::' + f + '(x.{m}, y.{m})')}); }}",
                f"inline {t} {f}({t} x, {base} y) {{ return {t}({each('metal::' + f + '(x.{m}, ' + q + '(y))')}); }}"]
    out.append(f"inline {t} fma({t} a, {t} b, {t} c) {{ return {t}({each('metal::fma(a.{m}, b.{m}, c.{m})')}); }}")
    out += [f"inline {t} clamp({t} x, {t} lo, {t} hi) {{ return {t}({each('metal::clamp(x.{m}, lo.{m}, hi.{m})')}); }}",
            f"inline {t} clamp({t} x, {base} lo, {base} hi) "
            f"{{ return {t}({each('metal::clamp(x.{m}, ' + q + '(lo), ' + q + '(hi))')}); }}"]
    return "\n".join(out) + "\n"


def _scalar_bounds(base: str) -> str:
    """OpenCL's ``f(vector, scalar)`` forms for ``{base}4`` (MSL's take one type throughout)."""
    v = f"{base}4"
    lines = [f"inline {v} {f}({v} x, {base} y) {{ return metal::{f}(x, {v}(y)); }}" for f in _BINARY]
    lines.append(f"inline {v} clamp({v} x, {base} lo, {base} hi) {{ return metal::clamp(x, {v}(lo), {v}(hi)); }}")
    return "\n".join(lines) + "\n"


def _expm1() -> str:
    """OpenCL's ``expm1`` (MSL has none): Kahan's form, exact near 0 where ``exp(x) - 1`` cancels."""
    lines = ["inline float expm1(float x) {",
             "  const float u = metal::exp(x);",
             "  if (u == 1.0f || metal::isinf(u)) return u == 1.0f ? x : u;",
             "  const float um1 = u - 1.0f;",
             "  return um1 == -1.0f ? -1.0f : um1 * x / metal::log(u);",
             "}",
             "inline half expm1(half x) { return half(expm1(float(x))); }"]
    for base in _FLOATS:
        v = f"{base}4"
        lanes = ", ".join(f"expm1(x.{c})" for c in "xyzw")
        lines.append(f"inline {v} expm1({v} x) {{ return {v}({lanes}); }}")
        for n, quads in QUADS.items():
            lines.append(f"inline {base}{n} expm1({base}{n} x) {{ return {base}{n}({', '.join(f'expm1(x.{m})' for m in quads)}); }}")
    return "\n".join(lines) + "\n"


def _vload_vstore() -> str:
    """OpenCL's ``vloadN(offset, p)`` (``p + N * offset``), ``vstore4`` and the half forms."""
    return """\
template <typename P> inline lg_vec<P, 4> vload4(int o, P p) { p += 4 * o; return lg_vec<P, 4>(p[0], p[1], p[2], p[3]); }
template <typename P> inline lg_vec<P, 8> vload8(int o, P p) { return lg_vec<P, 8>(vload4(2 * o, p), vload4(2 * o + 1, p)); }
template <typename P> inline lg_vec<P, 16> vload16(int o, P p) {
  return lg_vec<P, 16>(vload4(4 * o, p), vload4(4 * o + 1, p), vload4(4 * o + 2, p), vload4(4 * o + 3, p));
}
template <typename P> inline void vstore4(lg_vec<P, 4> v, int o, P p) { p += 4 * o; p[0] = v.x; p[1] = v.y; p[2] = v.z; p[3] = v.w; }
template <typename P> inline lg_if_half<P, float> vload_half(int i, P p) { return float(p[i]); }
template <typename P> inline lg_if_half<P, float4> vload_half4(int o, P p) { return float4(vload4(o, p)); }
template <typename P> inline lg_if_half<P, float8> vload_half8(int o, P p) { return convert_float8(vload8(o, p)); }
template <typename P> inline lg_if_half<P, float16> vload_half16(int o, P p) { return convert_float16(vload16(o, p)); }
template <typename P> inline lg_if_half<P, void> vstore_half(float v, int i, P p) { p[i] = half(v); }
template <typename P> inline lg_if_half<P, void> vstore_half4(float4 v, int o, P p) { vstore4(half4(v), o, p); }
"""


def _conversions() -> str:
    """``convert_<float|half>N`` (vector constructors in MSL, one overload per source type so a
    scalar is refused as in OpenCL), the saturating and the rounding integer conversions."""
    lines = []
    for dst in _FLOATS:
        lines += [f"inline {dst}4 convert_{dst}4({src}4 v) {{ return {dst}4(v); }}" for src in _SCALARS]
    for src in _FLOATS:
        for n, quads in QUADS.items():
            parts = ", ".join(f"float4(v.{m})" for m in quads)
            lines.append(f"inline float{n} convert_float{n}({src}{n} v) {{ return float{n}({parts}); }}")
    for t, lo, hi, above in _SATURATING:
        # Truncates toward zero as OpenCL's default rounding; NaN is 0; out of range saturates.
        lines.append(f"inline {t} convert_{t}_sat(float x) "
                     f"{{ return metal::isnan(x) ? {t}(0) : x >= {above} ? {t}({hi}) : x <= {t}({lo}) ? {t}({lo}) : {t}(x); }}")
    lines.append("inline long convert_long_rte(float x) { return long(metal::rint(x)); }   // rint: nearest even")
    return "\n".join(lines) + "\n"


def _library() -> str:
    limits = "".join(f"#ifndef {name}\n#define {name} {value}\n#endif\n" for name, value in _LIMITS)
    vec = "\n".join(f"template <> struct vec<{t}, 4> {{ typedef {t}4 type; }};" for t in _SCALARS)
    vec += "\n" + "\n".join(f"template <> struct vec<{t}, {n}> {{ typedef {t}{n} type; }};" for n in QUADS for t in _FLOATS)
    wide = "".join(_wide_struct(base, n) for n in QUADS for base in _FLOATS)
    bounds = "".join(_scalar_bounds(base) for base in _FLOATS)
    # convert_float8/16 come before the vloads that use them; the traits before both.
    return (_HEAD + limits + wide + bounds + _expm1() + _TRAITS.replace("{vec}", vec) + _conversions()
            + _vload_vstore())


# -- the table ----------------------------------------------------------------------------------
# The kernel language's half loads and stores are the library's, so the precision preludes
# are OpenCL's, less F16's extension pragma (every Apple GPU computes in half).
_PRELUDES = portable_preludes()

METAL = Dialect(
    name="metal", suffix=".metal",
    kernel_prefix="kernel void",
    buffer_param="{ptr} {name} [[buffer({index})]]",
    offset_param=None,   # setBuffer:offset:atIndex: binds each tensor at its byte offset
    global_space="device ", local_space="threadgroup ", local_array="threadgroup {type} {name}[{size}];",
    restrict="",
    barrier="threadgroup_barrier(mem_flags::mem_threadgroup);",
    global_id="((int)lg_gid.{axis})", local_id="((int)lg_lid.{axis})", group_id="((int)lg_grp.{axis})",
    id_params=("uint3 lg_gid [[thread_position_in_grid]], uint3 lg_lid [[thread_position_in_threadgroup]], "
               "uint3 lg_grp [[threadgroup_position_in_grid]]"),
    vector="{type}({args})",
    choose="select({b}, {a}, {cond})",   # MSL: select(a, b, c) is c ? b : a, lane by lane
    bitcast="as_type<{type}>({x})",
    table="const {type} {name}[{size}] = {{{values}}};",   # (a function-scope constant cannot be in constant memory)
    exact_grid=True,     # dispatchThreads runs exactly the global size
    max_buffers=31,      # the entries of a kernel's buffer argument table
    swizzles=False,
    preludes=_PRELUDES,
    library=_library(),
)
