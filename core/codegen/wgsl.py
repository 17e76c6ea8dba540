"""The WGSL renderer: a :class:`~litegpu.codegen.ir.Kernel` as one WebGPU compute shader.

WGSL is not a spelling of C, so it renders the tree itself (the C-family renderer is
:mod:`.crender`). What differs, and where it is handled:

- Declarations: ``let`` / ``var`` with types after the name; module-scope storage
  bindings (``@group(0) @binding(j)``) instead of pointer parameters — a tensor's
  offset inside an arena is the binding's offset, so no offset parameters; local
  memory is a module-scope ``var<workgroup>`` array; ids are builtins.
- Types: ``f32``, ``f16`` (half storage and F16 arithmetic need the ``shader-f16``
  feature), ``i32``, ``u32``, ``vec2/3/4<T>``; no 8- or 16-lane vectors, no 64-bit
  integers. Storage holds 32-bit integers only: ``uchar`` (and bool) tensors are
  ``u32`` per element, ``char`` and ``short`` tensors ``i32`` per element (the runtime
  widens them when it copies: :data:`STORAGE`).
- Operators: a comparison of a vector with a scalar splats the scalar; ``&&``/``||``
  of vectors are ``&``/``|``; a shift amount is ``u32``; ``select(b, a, cond)``.
- Constants: a NaN or infinite value is an error in a constant expression, so those
  come from a function of their bits (evaluated at run time).
- Math: OpenCL's names map to WGSL's (``fabs`` to ``abs``, ``rint`` to ``round``, which
  rounds half to even, ``rsqrt`` to ``inverseSqrt``); ``isnan``/``isinf`` test the bits
  (implementations may assume no NaN in float comparisons), as does ``signbit``; ``expm1``
  and ``round`` (half away from zero) are helper functions. ``fma`` is the builtin where the
  device fuses it; where it does not (lavapipe computes WGSL's ``fma`` as a product then a
  sum, which SPIR-V allows), a float32 ``fma`` is a helper that rounds once, as the
  kernels' formulas need to reproduce XNNPACK's bits (:attr:`WgslDialect.fused_fma`).
- Local memory: a vector load or store of consecutive elements of a local array (OpenCL's
  ``vload``/``vstore``) is a helper function naming the module-scope array.
- Launches: a kernel without a local size runs in groups of :data:`GROUP` along axis 0,
  each work-item past the global size leaving at once; more groups than one dimension
  allows are folded into a second dispatch dimension.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import ir

GROUP = 64                 # work-items per group when the kernel has no local size
MAX_GROUPS = 65535         # groups per dispatch dimension (WebGPU's default limit)

#: Storage element type of a tensor of each kernel scalar type (float tensors: see :meth:`WgslRenderer.storage`).
STORAGE = {"int": "i32", "uint": "u32", "uchar": "u32", "char": "i32", "short": "i32"}
_VALUES = {"float": "f32", "half": "f16", "int": "i32", "uint": "u32", "uchar": "u32", "char": "i32",
           "short": "i32", "bool": "bool"}
_NARROW = {"uchar": 8, "char": 8, "short": 16}   # bits of the integer types held in 32
#: Tests of a float's bits: (mask, comparison, value) of its float32 bits.
_BIT_TESTS = {"isnan": ("0x7fffffffu", ">", "0x7f800000u"), "isinf": ("0x7fffffffu", "==", "0x7f800000u"),
              "signbit": ("0x80000000u", "!=", "0u")}
_RENAMED = {"fabs": "abs", "rint": "round", "rsqrt": "inverseSqrt", "fmax": "max", "fmin": "min"}


@dataclass(frozen=True)
class WgslDialect:
    """WGSL as a dialect of :mod:`litegpu.codegen`: its name, a source file's suffix and the
    storage buffers a kernel may bind (``maxStorageBuffersPerShaderStage``: 8 is what every
    WebGPU device offers; a runtime that asked its device for more uses its own copy).
    Kernels render through :class:`WgslRenderer`."""

    name: str = "wgsl"
    suffix: str = ".wgsl"
    max_buffers: int = 8
    max_lanes: int = 4      # vec4 is WGSL's widest vector
    max_local_bytes: int = 16384   # maxComputeWorkgroupStorageSize every WebGPU device offers
    int64: bool = False
    flat_launches: bool = True     # 65535 groups per axis, and 2-D groups of a few items run poorly
    # Whether the device's ``fma`` rounds once (a runtime that found it does not uses its own
    # copy: float32 ``fma`` then renders as :data:`EXACT_FMA`).
    fused_fma: bool = True

    def prelude(self, precision_name: str) -> str:
        """Nothing: each WGSL kernel is a whole module (a program's source, as
        :func:`litegpu.codegen.render.assemble` joins them, is its modules one after another)."""
        return ""

    def render(self, kernel: ir.Kernel, precision) -> str:
        """``kernel`` as a WGSL module in ``precision`` (see :class:`WgslRenderer`)."""
        return WgslRenderer(precision, self.fused_fma).kernel(kernel).source

    def storage_dtype(self, dtype: np.dtype) -> np.dtype:
        """The dtype a tensor stored as ``dtype`` (see :meth:`litegpu.codegen.Precision.storage_dtype`)
        has in WGSL storage: 8- and 16-bit integers widen to 32 bits (:data:`STORAGE`)."""
        dtype = np.dtype(dtype)
        if dtype.kind in "iub" and dtype.itemsize < 4:
            return np.dtype(np.uint32 if dtype.kind in "ub" else np.int32)
        return dtype


WGSL = WgslDialect()

#: ``fma`` rounded once, from float32 operations rounded to nearest (for a device whose
#: ``fma`` is a product then a sum): Boldo and Melquiond's emulation ("Emulation of a FMA
#: and correctly rounded sums: proved algorithms using rounding to odd", IEEE TC 2008).
#: ``a * b`` is ``uh + ul`` exactly (Dekker's product of Veltkamp halves), ``c + uh`` is
#: ``th + tl`` exactly (Knuth's two-sum), and ``th`` plus ``tl + ul`` rounded to odd, rounded
#: to nearest, is ``a * b + c`` rounded once. Rounding to odd: the nearest sum, moved one
#: ulp towards the exact one where it was inexact and its last bit is even. Exact while no
#: intermediate overflows or underflows: operands past 2^100 or a product below 2^-100
#: (never met by the kernels' formulas) and non-finite values take the product then the sum.
#: Each step goes through ``{o}`` (:data:`OPAQUE`): WGSL cannot mark an operation exact, and
#: Mesa's compiler (lavapipe's) simplifies ``(x + y) - x`` to ``y``, which would erase the
#: rounding errors these steps capture.
EXACT_FMA = (
    "fn {name}(a: {t}, b: {t}, c: {t}) -> {t} {{ "
    "let ca = {o}(a * 4097.0); let ah = {o}(ca - {o}(ca - a)); let al = {o}(a - ah); "
    "let cb = {o}(b * 4097.0); let bh = {o}(cb - {o}(cb - b)); let bl = {o}(b - bh); "
    "let uh = {o}(a * b); "
    "let ul = {o}({o}({o}({o}(ah * bh) - uh) + {o}(ah * bl) + {o}(al * bh)) + {o}(al * bl)); "
    "let th = {o}(c + uh); let tb = {o}(th - c); let tl = {o}({o}(c - {o}(th - tb)) + {o}(uh - tb)); "
    "let v0 = {o}(tl + ul); let vb = {o}(v0 - tl); let ve = {o}({o}(tl - {o}(v0 - vb)) + {o}(ul - vb)); "
    "let bits = bitcast<{u}>(v0); "
    "let towards = select(bits - {u}(1u), bits + {u}(1u), ((bitcast<{u}>(ve) ^ bits) & {u}(0x80000000u)) == {u}(0u)); "
    "let v = select(v0, bitcast<{t}>(towards), (ve != {t}(0.0)) & ((bits & {u}(1u)) == {u}(0u))); "
    "let big = max(abs(a), abs(b)) > {t}(1.0e30) | abs(uh) < {t}(1.0e-30) "
    "| (bitcast<{u}>(th) & {u}(0x7f800000u)) == {u}(0x7f800000u); "
    "return select(th + v, uh + c, big); }}")
#: ``x`` unchanged, through a value the compiler cannot know (:data:`OPAQUE_ZERO`, set by
#: each kernel that uses it), so no algebraic rewrite reaches across it.
OPAQUE = "fn {name}(x: {t}) -> {t} {{ return bitcast<{t}>(bitcast<{u}>(x) ^ {u}(lg_zero)); }}"
#: A module-scope zero: ``lg_gid.x`` is never 2^32 - 1 (:data:`MAX_GROUPS` groups of at most 256).
OPAQUE_ZERO = ("var<private> lg_zero: u32;", "  lg_zero = u32(lg_gid.x == 0xffffffffu);")


def launch(global_size: tuple[int, ...], local_size: tuple[int, ...] | None
           ) -> tuple[tuple[int, int, int], tuple[int, int, int], int]:
    """(workgroup size, groups to dispatch per axis, fold) of a kernel's launch: its local
    size, else :data:`GROUP` along axis 0; ``fold`` (0: none) is the number of work-items
    per row of groups when axis 0 needs more than :data:`MAX_GROUPS` groups and continues
    along the second dispatch axis. A launch that cannot fit raises TypeError."""
    size = tuple(int(g) for g in global_size) + (1,) * (3 - len(global_size))
    if local_size is not None:
        group = tuple(int(x) for x in local_size) + (1,) * (3 - len(local_size))
    else:
        group = (min(GROUP, max(size[0], 1)), 1, 1)
    dispatch = tuple(-(-g // w) for g, w in zip(size, group))
    fold = 0
    if local_size is None and dispatch[0] > MAX_GROUPS:
        if size[1] != 1 or size[2] != 1:
            raise TypeError(f"{size}: too many groups along axis 0 of a 2-D or 3-D launch")
        fold = MAX_GROUPS * group[0]
        dispatch = (MAX_GROUPS, -(-dispatch[0] // MAX_GROUPS), 1)
    if any(d > MAX_GROUPS for d in dispatch):
        raise TypeError(f"dispatch {dispatch} exceeds {MAX_GROUPS} groups along an axis")
    return group, dispatch, fold


MODULE_MARK = "// kernel "


def modules(source: str) -> list[str]:
    """The shader modules of a program's source (:func:`litegpu.codegen.render.assemble`
    joins them, each starting with its ``// kernel <name>`` line)."""
    parts = source.split("\n" + MODULE_MARK)
    return [part if i == 0 else MODULE_MARK + part for i, part in enumerate(parts) if part.strip()]


@dataclass(frozen=True)
class WgslKernel:
    """A rendered kernel: the shader module's source, its group size and the groups to
    dispatch along each axis."""

    source: str
    workgroup_size: tuple[int, int, int]
    dispatch: tuple[int, int, int]


class WgslRenderer(ir.Renderer):
    """Renders kernels in one precision mode (``precision``: a :class:`litegpu.codegen.Precision`)."""

    def __init__(self, precision, fused_fma: bool = True) -> None:
        self.precision = precision
        self.fused_fma = fused_fma
        self._helpers: dict[str, str] = {}
        self._fold = 0

    # -- types ------------------------------------------------------------------------------------
    def scalar(self, scalar: str) -> str:
        """The WGSL type of a value of kernel scalar type ``scalar``."""
        if scalar == "real":
            return "f16" if self.precision.half_arith else "f32"
        if scalar not in _VALUES:
            raise TypeError(f"WGSL has no {scalar} values (no 64-bit integers)")
        return _VALUES[scalar]

    def type(self, t: ir.Type) -> str:
        """The WGSL type of ``t``."""
        s = self.scalar(t.scalar)
        if t.lanes == 1:
            return s
        if t.lanes > 4:
            raise TypeError(f"WGSL has no {t.lanes}-lane vectors ({t}); use 4 lanes")
        return f"vec{t.lanes}<{s}>"

    def storage(self, buffer: ir.Buffer) -> str:
        """The element type of ``buffer``'s storage array."""
        if buffer.is_float:
            return "f16" if self.precision.half_storage and not buffer.full_precision else "f32"
        scalar = ir.scalar_of(buffer.dtype)
        if scalar not in STORAGE:
            raise TypeError(f"WGSL storage has no {np.dtype(buffer.dtype)} tensors")
        return STORAGE[scalar]

    def _uses_f16(self, k: ir.Kernel) -> bool:
        return self.precision.half_arith or any(self.storage(b) == "f16" for b in k.params)

    # -- expressions --------------------------------------------------------------------------------
    def _lit(self, e: ir.Lit) -> str:
        t = self.scalar(e.type.scalar)
        if t in ("f32", "f16"):
            v = float(e.value)
            if t == "f16" and np.isfinite(v) and abs(v) >= 65520.0:
                v = float(np.copysign(np.inf, v))   # half rounds it to infinity anyway
            if not np.isfinite(v):
                bits = "0x7fc00000u" if np.isnan(v) else "0x7f800000u" if v > 0 else "0xff800000u"
                value = f"{self._helper('bits_f32')}({bits})"
                return value if t == "f32" else f"f16({value})"
            text = repr(float(np.float16(v) if t == "f16" else np.float32(v))) + ("h" if t == "f16" else "f")
            return text if v >= 0 else f"({text})"
        if t == "bool":
            return "true" if e.value else "false"
        if t == "u32":
            return f"{int(e.value)}u"
        if e.value == -2**31:
            return "(-2147483647i - 1i)"
        return f"{e.value}i" if e.value >= 0 else f"({e.value}i)"

    def _sym(self, e: ir.Sym) -> str:
        return e.name

    def _splat(self, e: ir.Expr, lanes: int) -> str:
        """``e`` widened to ``lanes`` lanes (a scalar is splatted)."""
        text = self.expr(e)
        if e.type.lanes == lanes:
            return text
        return f"{self.type(e.type.with_lanes(lanes))}({text})"

    def _bin(self, e: ir.Bin) -> str:
        lanes = max(e.a.type.lanes, e.b.type.lanes)
        op = e.op
        if op in ("&&", "||") and lanes > 1:
            op = op[0]
        if op in ("<<", ">>"):
            return f"({self.expr(e.a)} {op} {self._as_u32(e.b)})"
        if op in ("+", "-", "*", "/", "%") and not (e.a.type.lanes == 1 and e.b.type.lanes == 1):
            a, b = self.expr(e.a), self.expr(e.b)   # WGSL mixes a vector with a scalar in arithmetic
        else:
            a, b = self._splat(e.a, lanes), self._splat(e.b, lanes)
        return f"({a} {op} {b})"

    def _as_u32(self, e: ir.Expr) -> str:
        text = self.expr(e)
        return text if self.scalar(e.type.scalar) == "u32" else f"{self.type(ir.UINT.with_lanes(e.type.lanes))}({text})"

    def _un(self, e: ir.Un) -> str:
        return f"({e.op}{self.expr(e.a)})"

    def _call(self, e: ir.Call) -> str:
        lanes = e.args[0].type.lanes
        if e.fn in _BIT_TESTS:
            return f"{self._helper(e.fn, e.args[0].type)}({self.expr(e.args[0])})"
        if e.fn in ("expm1", "round"):
            return f"{self._helper(e.fn, e.args[0].type)}({self.expr(e.args[0])})"
        if e.fn == "fmod":
            return f"({self.expr(e.args[0])} % {self._splat(e.args[1], lanes)})"
        if e.fn == "opaque":
            value = self.expr(e.args[0])
            return f"{self._helper('opaque', e.type)}({value})" if self.scalar(e.type.scalar) == "f32" else value
        if e.fn == "fma" and not self.fused_fma and self.scalar(e.type.scalar) == "f32":
            return f"{self._helper('fma', e.type)}({', '.join(self._splat(a, lanes) for a in e.args)})"
        fn = _RENAMED.get(e.fn, e.fn)
        return f"{fn}({', '.join(self._splat(a, lanes) for a in e.args)})"

    def _select(self, e: ir.Select) -> str:
        lanes = e.type.lanes
        cond = self.expr(e.cond)
        return f"select({self._splat(e.b, lanes)}, {self._splat(e.a, lanes)}, {cond})"

    def _tableload(self, e: ir.TableLoad) -> str:
        # A module-scope private array (indexable at run time, unlike a const one).
        t, n = self.type(e.type), len(e.values)
        self._helpers.setdefault(e.name, f"var<private> {e.name}: array<{t}, {n}> = array<{t}, {n}>("
                                 + ", ".join(self.expr(ir.lit(v, e.type)) for v in e.values) + ");")
        return f"{e.name}[{self.expr(e.index)}]"

    def _cast(self, e: ir.Cast) -> str:
        if e.bits:
            return f"bitcast<{self.type(e.type)}>({self.expr(e.a)})"
        # WGSL's float to integer conversion saturates (NaN: 0) as convert_<int>_sat does;
        # 8- and 16-bit values live in 32 bits, so converting to one wraps or clamps to its range.
        text = f"{self.type(e.type)}({self.expr(e.a)})"
        bits = _NARROW.get(e.type.scalar)
        if e.saturate and e.type.scalar in ("int", "uint") and e.a.type.is_float:
            # Vulkan leaves an out-of-range float to integer conversion undefined (naga does
            # not clamp it): the bounds are chosen explicitly, in f32 (a half's infinity too).
            wide = ir.FLOAT.with_lanes(e.a.type.lanes)
            value = self.expr(e.a) if self.scalar(e.a.type.scalar) == "f32" else f"{self.type(wide)}({self.expr(e.a)})"
            return f"{self._helper('sat', wide, e.type)}({value})"
        if bits is None:
            return text
        if e.saturate:
            lo, hi = (0, (1 << bits) - 1) if e.type.scalar == "uchar" else (-(1 << bits - 1), (1 << bits - 1) - 1)
            t = self.type(e.type)
            wide = self.expr(e.a)
            return f"{t}(clamp({wide}, {self._lit(ir.Lit(float(lo), e.a.type.with_lanes(1)))}, " \
                   f"{self._lit(ir.Lit(float(hi), e.a.type.with_lanes(1)))}))"
        if e.type.scalar == "uchar":
            return f"({text} & {self.type(e.type)}(0xffu))"
        shift = f"{self.type(ir.UINT.with_lanes(e.type.lanes))}({32 - bits}u)"
        return f"(({text} << {shift}) >> {shift})"

    def _lane(self, e: ir.Lane) -> str:
        return f"({self.expr(e.a)}).{'xyzw'[e.j]}"

    def _vec(self, e: ir.Vec) -> str:
        return f"{self.type(e.type)}({', '.join(self.expr(p) for p in e.parts)})"

    def _quad(self, e: ir.Quad) -> str:
        raise TypeError(f"WGSL has no {e.a.type.lanes}-lane vectors to take a quad of; use 4 lanes")

    def _id(self, e: ir.Id) -> str:
        var = {"global": "lg_gid", "local": "lg_lid", "group": "lg_wid"}[e.kind]
        if e.kind == "global" and e.axis == 0 and self._fold:
            # Groups beyond one dispatch dimension continue along the second.
            return f"(i32(lg_wid.y) * {self._fold} + i32(lg_gid.x))"
        return f"i32({var}.{'xyz'[e.axis]})"

    def _load(self, e: ir.Load) -> str:
        buf, n = e.buffer, e.type.lanes
        if n == 1:
            return self._convert(f"{buf.name}[{self.expr(e.index)}]", self.storage(buf), e.type)
        return f"{self._access('ld', buf, e.type)}({self.expr(e.index)})"

    def _convert(self, text: str, have: str, want: ir.Type) -> str:
        target = self.type(want)
        return text if target == have else f"{target}({text})"

    def _localload(self, e: ir.LocalLoad) -> str:
        if e.type.lanes != e.array.type.lanes:   # consecutive elements of a scalar array
            return f"{self._local_access('ld', e.array, e.type.lanes)}({self.expr(e.index)})"
        return f"{e.array.name}[{self.expr(e.index)}]"

    # -- helper functions ------------------------------------------------------------------------------
    def _helper(self, name: str, t: ir.Type | None = None, out: ir.Type | None = None) -> str:
        """The name of a helper function, defined once per module (and value type)."""
        if name == "bits_f32":
            self._helpers.setdefault(name, "fn bits_f32(b: u32) -> f32 { return bitcast<f32>(b); }")
            return name
        wt = self.type(t)
        key = f"{name}_{wt.replace('<', '_').replace('>', '')}" + (f"_{self.type(out).replace('<', '_').replace('>', '')}"
                                                                   if out is not None else "")
        if key in self._helpers:
            return key
        scalar = self.scalar(t.scalar)
        if name == "sat":
            ot = self.type(out)
            lo, hi, lo_f, hi_f = (("(-2147483647i - 1i)", "2147483647i", "-2147483648.0f", "2147483648.0f")
                                  if out.scalar == "int" else ("0u", "4294967295u", "0.0f", "4294967296.0f"))
            self._helpers[key] = (f"fn {key}(x: {wt}) -> {ot} {{ return select(select({ot}(x), {ot}({lo}), "
                                  f"x <= {wt}({lo_f})), {ot}({hi}), x >= {wt}({hi_f})); }}")
        elif name in _BIT_TESTS:
            # The bits decide: a comparison might be folded away where an implementation assumes
            # no NaN (and -0.0 and negative NaNs have the sign bit). A half is widened first
            # (exact, NaN and infinity included).
            u = f"vec{t.lanes}<u32>" if t.lanes > 1 else "u32"
            wide = "x" if scalar == "f32" else (f"vec{t.lanes}<f32>(x)" if t.lanes > 1 else "f32(x)")
            mask, test, against = _BIT_TESTS[name]
            out = f"vec{t.lanes}<bool>" if t.lanes > 1 else "bool"
            self._helpers[key] = (f"fn {key}(x: {wt}) -> {out} {{ "
                                  f"return (bitcast<{u}>({wide}) & {u}({mask})) {test} {u}({against}); }}")
        elif name == "expm1":
            # exp(x) - 1 loses every digit near 0; (u - 1) * x / log(u) keeps them (Kahan).
            self._helpers[key] = (f"fn {key}(x: {wt}) -> {wt} {{ let u = exp(x); "
                                  f"let near = (u - 1.0) * x / log(u); "
                                  f"return select(select(near, u - 1.0, abs(x) > {wt}(1.0)), x, u == {wt}(1.0)); }}")
        elif name in ("fma", "opaque"):
            u = f"vec{t.lanes}<u32>" if t.lanes > 1 else "u32"
            if name == "fma":
                self._helpers[key] = EXACT_FMA.format(name=key, t=wt, u=u, o=self._helper("opaque", t))
            else:
                self._helpers[key] = OPAQUE.format(name=key, t=wt, u=u)
        elif name == "round":
            self._helpers[key] = (f"fn {key}(x: {wt}) -> {wt} {{ let t = trunc(x); "
                                  f"return select(t, t + sign(x), abs(x - t) >= {wt}(0.5)); }}")
        else:
            raise KeyError(name)
        return key

    def _access(self, kind: str, buf: ir.Buffer, t: ir.Type) -> str:
        """A function loading (``ld``) or storing (``st``) ``t.lanes`` consecutive elements of ``buf``."""
        # The value type is in the name: one buffer may be read as float and as half (F16).
        name = f"{kind}{t.lanes}{self.scalar(t.scalar)}_{buf.name}"
        if name not in self._helpers:
            lanes, have = t.lanes, self.storage(buf)
            if kind == "ld":
                parts = ", ".join(self._convert(f"{buf.name}[i + {j}]", have, t.with_lanes(1)) for j in range(lanes))
                self._helpers[name] = f"fn {name}(i: i32) -> {self.type(t)} {{ return {self.type(t)}({parts}); }}"
            else:
                sets = " ".join(f"{buf.name}[i + {j}] = {have}(v.{'xyzw'[j]});" for j in range(lanes))
                self._helpers[name] = f"fn {name}(i: i32, v: {self.type(t)}) {{ {sets} }}"
        return name

    # -- statements ---------------------------------------------------------------------------------------
    BARRIER = "workgroupBarrier();"

    def declare(self, sym: ir.Sym, value: ir.Expr, mutable: bool) -> str:
        return f"{'var' if mutable else 'let'} {sym.name}: {self.type(sym.type)} = {self.expr(value)};"

    def store(self, s: ir.Store) -> str:
        buf, n = s.buffer, s.value.type.lanes
        if n > 1:
            return f"{self._access('st', buf, s.value.type)}({self.expr(s.index)}, {self.expr(s.value)});"
        have = self.storage(buf)
        value = self.expr(s.value)
        if self.type(s.value.type) != have:
            value = f"{have}({value})"
        return f"{buf.name}[{self.expr(s.index)}] = {value};"

    def local_store_vector(self, s: ir.LocalStore) -> str:
        return f"{self._local_access('st', s.array, s.value.type.lanes)}({self.expr(s.index)}, {self.expr(s.value)});"

    def _local_access(self, kind: str, array: ir.LocalArray, lanes: int) -> str:
        """A function loading (``ld``) or storing (``st``) ``lanes`` consecutive elements of
        the local array ``array`` as a vector (a module-scope variable: no pointer is passed)."""
        name = f"lg_{kind}{lanes}_{array.name}"
        if name not in self._helpers:
            vt = self.type(array.type.with_lanes(lanes))
            if kind == "ld":
                parts = ", ".join(f"{array.name}[i + {j}]" for j in range(lanes))
                self._helpers[name] = f"fn {name}(i: i32) -> {vt} {{ return {vt}({parts}); }}"
            else:
                sets = " ".join(f"{array.name}[i + {j}] = v.{'xyzw'[j]};" for j in range(lanes))
                self._helpers[name] = f"fn {name}(i: i32, v: {vt}) {{ {sets} }}"
        return name

    def for_head(self, s: ir.For) -> str:
        i = s.sym.name
        return f"for (var {i}: i32 = {self.expr(s.start)}; {i} < {self.expr(s.stop)}; {i} += {s.step}) {{"

    # -- the kernel -------------------------------------------------------------------------------------------
    def kernel(self, k: ir.Kernel) -> WgslKernel:
        """The shader module of ``k`` (entry point ``main``) and how to dispatch it."""
        self._helpers = {}
        size = tuple(k.global_size) + (1,) * (3 - len(k.global_size))
        group, dispatch, self._fold = launch(k.global_size, k.local_size)
        guard: list[str] = []
        if k.local_size is None:
            ids = [self._id(ir.Id("global", a)) for a in range(3)]
            guard = ["  if (" + " || ".join(f"{ids[a]} >= {n}" for a, n in enumerate(size) if n > 1 or a == 0)
                     + ") { return; }"]
        body = self.stmts(k.body)
        bindings = [f"@group(0) @binding({j}) var<storage, {'read_write' if b.writes else 'read'}> "
                    f"{b.name}: array<{self.storage(b)}>;" for j, b in enumerate(k.params)]
        arrays = [f"var<workgroup> {a.name}: array<{self.type(a.type)}, {a.size}>;" for a in k.locals]
        header = ["enable f16;"] if self._uses_f16(k) else []
        opaque = any(name.startswith("opaque_") for name in self._helpers)
        entry = [f"@compute @workgroup_size({group[0]}, {group[1]}, {group[2]})",
                 "fn main(@builtin(global_invocation_id) lg_gid: vec3<u32>, "
                 "@builtin(local_invocation_id) lg_lid: vec3<u32>, @builtin(workgroup_id) lg_wid: vec3<u32>) {",
                 *(OPAQUE_ZERO[1:] if opaque else ()), *guard, *body, "}"]
        if opaque:
            header.append(OPAQUE_ZERO[0])
        # The first line names the kernel (the program builder replaces KERNEL with its name),
        # so a program's modules, joined in one file, can be told apart: see modules().
        source = "\n".join([f"{MODULE_MARK}KERNEL", *header, *bindings, *arrays, *self._helpers.values(), *entry]) + "\n"
        return WgslKernel(source, group, dispatch)
