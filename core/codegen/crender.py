"""The C-family renderer: a :class:`~litegpu.codegen.ir.Kernel` as OpenCL C, CUDA C++ or MSL.

The three APIs differ only in spellings, which their :class:`~litegpu.codegen.dialect.Dialect`
tables hold: the kernel is written in the kernel language (OpenCL C's statements, types and
builtins), the dialect spells its signature, ids, local memory, barriers, vectors and
choices, and the dialect's prelude defines what its API lacks (CUDA's vector arithmetic,
MSL's ``vload``...) and the precision macros (``real``, ``LD``/``ST``...).
"""
from __future__ import annotations

import numpy as np

from . import ir
from .dialect import QUADS, Dialect


def c_float(x: float) -> str:
    """A float literal that reads back as the same float32."""
    x = float(np.float32(x))
    if np.isnan(x):
        return "NAN"
    if np.isinf(x):
        return "INFINITY" if x > 0 else "(-INFINITY)"
    return f"{x!r}f"


def ctype(t: ir.Type) -> str:
    """A value type's C name (a scalar condition is an ``int``, as C's comparisons give)."""
    if t.is_bool:
        if t.lanes != 1:
            raise TypeError("a vector condition has no declared type in C (OpenCL's mask type depends "
                            "on the operands); use it inline")
        return "int"
    return str(t)


def pointee(buffer: ir.Buffer) -> str:
    """The element type of ``buffer``'s pointer: ``FT`` (float or half storage, by the
    precision prelude), ``float`` for a full-precision float tensor, else the integer type."""
    if buffer.is_float:
        return "float" if buffer.full_precision else "FT"
    return ir.scalar_of(buffer.dtype)


class CRenderer(ir.Renderer):
    """Renders kernels and expressions in one dialect."""

    def __init__(self, dialect: Dialect, precision) -> None:
        self.d = dialect
        self.precision = precision   # a litegpu.codegen.Precision
        # Full-precision tensors are plain float pointers only when others are half.
        self.half_storage = precision.half_storage
        self.BARRIER = dialect.barrier

    # -- expressions -----------------------------------------------------------------------------
    def _lit(self, e: ir.Lit) -> str:
        s = e.type.scalar
        if s == "float":
            return c_float(e.value)
        if s in ("real", "half"):
            return f"(({s}){c_float(e.value)})"
        if s == "bool":
            return "1" if e.value else "0"
        if s == "long":
            return f"{e.value}L" if e.value >= 0 else f"({e.value}L)"
        if s == "uint":
            return f"{e.value}u"
        if s == "int":
            return str(e.value) if e.value >= 0 else f"({e.value})"
        return f"(({s}){e.value})"

    def _sym(self, e: ir.Sym) -> str:
        return e.name

    def _bin(self, e: ir.Bin) -> str:
        return f"({self.expr(e.a)} {e.op} {self.expr(e.b)})"

    def _un(self, e: ir.Un) -> str:
        return f"({e.op}{self.expr(e.a)})"

    def _call(self, e: ir.Call) -> str:
        if e.fn == "opaque":   # (the C languages' compilers, run without fast math, keep it as written)
            return f"({self.expr(e.args[0])})"
        if e.fn == "fma":   # the kernel language's fma takes no scalar with vectors: splat them
            return f"fma({', '.join(self._splat(a, e.type.lanes) for a in e.args)})"
        return f"{e.fn}({', '.join(self.expr(a) for a in e.args)})"

    def _select(self, e: ir.Select) -> str:
        n = e.type.lanes
        if n == 1 and e.cond.type.lanes == 1:   # C's own choice, in every dialect and type
            return f"({self.expr(e.cond)} ? {self.expr(e.a)} : {self.expr(e.b)})"
        if e.cond.type.lanes == 1:   # a scalar condition picks a whole vector: C's ?: too (CUDA's select
            # takes a mask of the vector's lanes, MSL's and OpenCL's ?: take a scalar condition)
            return f"({self.expr(e.cond)} ? {self._splat(e.a, n)} : {self._splat(e.b, n)})"
        # A lane-wise choice is the dialect's (CUDA's and MSL's select take vectors only: a
        # scalar branch is splatted).
        return self.d.choose.format(cond=self.expr(e.cond), a=self._splat(e.a, n), b=self._splat(e.b, n))

    def _splat(self, e: ir.Expr, lanes: int) -> str:
        """``e`` widened to ``lanes`` lanes (a scalar is broadcast)."""
        text = self.expr(e)
        return text if e.type.lanes == lanes else self.d.make_vector(str(e.type.with_lanes(lanes)), text)

    def _cast(self, e: ir.Cast) -> str:
        if e.bits:
            return self.d.bitcast.format(type=ctype(e.type), x=self.expr(e.a))
        if e.saturate:
            return f"convert_{e.type}_sat({self.expr(e.a)})"
        if e.type.lanes == 1:
            return f"(({ctype(e.type)})({self.expr(e.a)}))"
        if e.type == ir.REAL4:   # the precision prelude's conversion (there is no convert_real4)
            return f"TO_REAL4({self.expr(e.a)})"
        return f"convert_{e.type}({self.expr(e.a)})"

    def _tableload(self, e: ir.TableLoad) -> str:
        return f"{e.name}[{self.expr(e.index)}]"

    def _lane(self, e: ir.Lane) -> str:
        return self.d.vector_lane(f"({self.expr(e.a)})", e.j, e.a.type.lanes)

    def _vec(self, e: ir.Vec) -> str:
        return self.d.make_vector(str(e.type), *(self.expr(p) for p in e.parts))

    def _quad(self, e: ir.Quad) -> str:
        return f"({self.expr(e.a)}).{QUADS[e.a.type.lanes][e.j]}"

    def _id(self, e: ir.Id) -> str:
        return f"((int){self.d.id(e.kind, e.axis)})"

    def _load(self, e: ir.Load) -> str:
        p, i, n = e.buffer.name, self.expr(e.index), e.type.lanes
        if not e.buffer.is_float:
            return f"{p}[{i}]" if n == 1 else f"vload{n}(0, ({p}) + ({i}))"
        full = e.buffer.full_precision and self.half_storage
        if e.as_float:
            if n == 1:
                return f"((float)({p}[{i}]))" if full else f"((float)(LD({p}, {i})))"
            if full or not self.half_storage:
                return f"vload{n}(0, ({p}) + ({i}))"
            if self.precision.half_arith:
                return f"convert_float{n}(vload{n}(0, ({p}) + ({i})))"
            return f"vload_half{n}(0, ({p}) + ({i}))"
        if n == 1:
            return f"((real)({p})[{i}])" if full else f"LD({p}, {i})"
        if n != 4:
            raise TypeError(f"a float load of {n} lanes in the arithmetic type; load 4, or as_float")
        return f"TO_REAL4(vload4(0, ({p}) + ({i})))" if full else f"LD4({p}, {i})"

    def _localload(self, e: ir.LocalLoad) -> str:
        if e.type.lanes != e.array.type.lanes:   # consecutive elements of a scalar array
            return f"vload{e.type.lanes}(0, ({e.array.name}) + ({self.expr(e.index)}))"
        return f"{e.array.name}[{self.expr(e.index)}]"

    # -- statements -------------------------------------------------------------------------------
    def declare(self, sym: ir.Sym, value: ir.Expr, mutable: bool) -> str:
        return f"{'' if mutable else 'const '}{ctype(sym.type)} {sym.name} = {self.expr(value)};"

    def local_store_vector(self, s: ir.LocalStore) -> str:
        return f"vstore{s.value.type.lanes}({self.expr(s.value)}, 0, ({s.array.name}) + ({self.expr(s.index)}));"

    def stmt(self, s: ir.Stmt, indent: str) -> list[str]:
        lines = super().stmt(s, indent)
        # A loop marked for unrolling gets the pragma OpenCL C, CUDA and MSL all take.
        return ["#pragma unroll", *lines] if isinstance(s, ir.For) and s.unroll else lines

    def for_head(self, s: ir.For) -> str:
        i = s.sym.name
        return f"for (int {i} = {self.expr(s.start)}; {i} < {self.expr(s.stop)}; {i} += {s.step}) {{"

    def store(self, s: ir.Store) -> str:
        p, i, v, n = s.buffer.name, self.expr(s.index), self.expr(s.value), s.value.type.lanes
        if not s.buffer.is_float:
            return f"{p}[{i}] = {v};" if n == 1 else f"vstore{n}({v}, 0, ({p}) + ({i}));"
        if s.buffer.full_precision and self.half_storage:
            return f"({p})[{i}] = (float)({v});" if n == 1 else f"vstore{n}(convert_float{n}({v}), 0, ({p}) + ({i}));"
        if n == 1:
            return f"ST({p}, {i}, {v});"
        if n != 4:
            raise TypeError(f"a float store of {n} lanes; store 4 at a time")
        return f"ST4({p}, {i}, {v});"

    # -- the kernel ---------------------------------------------------------------------------------
    def kernel(self, k: ir.Kernel) -> str:
        """One kernel definition named ``KERNEL`` (the program builder renames it)."""
        d = self.d
        typed = [(f"{d.global_space}{'' if b.writes else 'const '}{pointee(b)}*", b.name) for b in k.params]
        if d.max_buffers and len(typed) > d.max_buffers:
            raise TypeError(f"a {d.name} kernel takes at most {d.max_buffers} buffers, this one {len(typed)}")
        if d.offset_param is not None:
            # (buffer, element offset) pairs: intermediates live at offsets of one arena buffer.
            params = [p for j, (ptr, name) in enumerate(typed) for p in (
                d.buffer_param.format(ptr=ptr, name=f"{name}_b", index=2 * j),
                d.offset_param.format(name=f"{name}_o", index=2 * j + 1))]
            views = [f"  {ptr} {d.restrict} {name} = {name}_b + {name}_o;" for ptr, name in typed]
        else:
            params = [d.buffer_param.format(ptr=ptr, name=name, index=j) for j, (ptr, name) in enumerate(typed)]
            views = []
        if d.id_params:
            params.append(d.id_params)
        guard = []
        if k.local_size is None and not d.exact_grid:
            # This API runs whole groups: work-items past the global size leave at once.
            guard = ["  if (" + " || ".join(f"{d.id('global', a)} >= {n}" for a, n in enumerate(k.global_size))
                     + ") return;"]
        arrays = ["  " + d.local_array.format(type=ctype(a.type), name=a.name, size=a.size) for a in k.locals]
        tables = ["  " + d.table.format(type=ctype(t.type), name=name, size=len(t.values),
                                        values=", ".join(self.expr(ir.lit(v, t.type)) for v in t.values))
                  for name, t in ir.tables_of(k.body).items()]
        body = [*tables, *guard, *views, *arrays, *self.stmts(k.body)]
        return f"{d.kernel_prefix} KERNEL({', '.join(params)})\n{{\n" + "\n".join(body) + "\n}\n"
