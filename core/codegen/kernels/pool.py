"""Windowed and axis ops: pooling, reductions, the softmax family, normalizations,
resize and arg max/min, written as :mod:`litegpu.codegen.ir` kernels (so every dialect,
WGSL included, renders them).

Everything that sums, multiplies or normalizes accumulates in ``float``, whatever the
storage or arithmetic precision (half accumulators lose the small terms of long sums);
only the final value is converted to ``real`` for the store.

Layout choices, measured on PoCL's CPU device: it does not vectorize across the
work-items of a kernel whose body loops (all of these do), so each work-item works on
its own float8 / float4 vectors: channel groups (pools, resize, reductions that keep
the last axis) or steps along a contiguous row (softmax family, reductions of the
last axis). A float8 is built from two 4-wide loads and stored a quad at a time
(:meth:`litegpu.codegen.ir.Expr.quad`); where the dialect's vectors stop at 4 lanes
(``max_lanes``: WGSL) the same kernels use float4. Long accumulations keep up to four
independent chains in flight. Pools and resize run 3-D ranges (channel groups, output
column, batch x output row), which spares the per-work-item divisions of a flat index.
Integer reductions and ARG_MAX / ARG_MIN are scalar; those that need 64-bit integers
(int64 tensors, the integer MEAN's sum) decline in WGSL, which has none.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import numpy as np
from litegpu.ops.nn import (bilinear_axis, builtin_pool_range, conv_output_size, nearest_axis, pool_divisor_is_window,
                            xnn_max9, xnn_max_pool_passes)
from litegpu.ops.registry import ACTIVATION_RANGES
from litegpu.ops.reduce import L2_EPSILON, one_run, reduction_axes, without_unit_reductions

from .. import formulas, ir
from ..ir import Expr, call, logical_and, select
from ..nodegen import MAX_GROUPS, KernelSpec, NodeGen, strides_of
from . import Decline, generator

_F32 = np.dtype(np.float32)
_INT_MAX = 2**31 - 1
_FLT_MAX = float(np.finfo(np.float32).max)

#: ``comb(acc, value, lanes)``: one step of a fold, on floats or float vectors of ``lanes``.
Comb = Callable[[Expr, Expr, int], Expr]


# -- shared helpers ---------------------------------------------------------------------------

def _size(shape) -> int:
    """Elements of ``shape``."""
    return int(np.prod(tuple(shape), dtype=np.int64))


def _check_indexable(g: NodeGen) -> None:
    """Indices are C ``int``: refuse tensors too large for them."""
    for spec in (*g.ctx.inputs, *g.ctx.outputs):
        if spec is not None and _size(spec.shape) > _INT_MAX:
            raise Decline("tensor has more than 2**31-1 elements")


def _require_float(g: NodeGen) -> None:
    """The float-only ops: input 0 and output 0 float32."""
    if g.ctx.inputs[0].dtype != _F32 or g.ctx.outputs[0].dtype != _F32:
        raise Decline(f"{g.ctx.node.op} on {g.ctx.inputs[0].dtype} tensors")


def _empty(g: NodeGen) -> KernelSpec:
    """A kernel with no work (an empty output)."""
    return g.kernel(g.new_kernel(), (0,))


def _lanes(g: NodeGen, *sizes: int) -> int:
    """How many consecutive elements a work-item handles: 8, 4 or 1, dividing every size
    (8 only where the dialect has 8-lane vectors).

    PoCL does not vectorize across work-items whose body has loops, so a work-item's
    own vector is what reaches the SIMD units; float8 measured fastest there (and it
    keeps half loads vectorized, which float4 alone did not)."""
    for v in (8, 4):
        if v <= g.dialect.max_lanes and all(s % v == 0 for s in sizes):
            return v
    return 1


def _row_step(g: NodeGen, size: int) -> int:
    """Elements per step along a contiguous run of ``size``: the widest vector that fits
    (and that the dialect has)."""
    return min(8 if size >= 8 else 4 if size >= 4 else 1, g.dialect.max_lanes)


def _fvec(lanes: int) -> ir.Type:
    """The float vector type of ``lanes`` lanes (``float`` for 1)."""
    return ir.FLOAT.with_lanes(lanes)


def _ldv(x: ir.Buffer, index: Expr, lanes: int) -> Expr:
    """``lanes`` consecutive float elements of ``x`` from ``index`` as float/float4/float8,
    built from 4-wide loads (the compiler merges them; PoCL 3.1 crashes on an unaligned
    ``vload_half8`` here)."""
    if lanes == 1:
        return x.load(index, as_float=True)
    quads = [x.load(index + 4 * j if j else index, 4).cast(ir.FLOAT4) for j in range(lanes // 4)]
    return quads[0] if lanes == 4 else ir.vector(_fvec(lanes), *quads)


def _stv(g: NodeGen, b: ir.KernelBuilder, index: Expr, value: Expr) -> None:
    """Store the float/float4/float8 ``value`` at ``index`` of the output through the
    epilogue (a quad at a time; the output's last axis is a multiple of 4)."""
    if value.type.lanes == 1:
        g.store_output(b, index, value.cast(ir.REAL))
        return
    for j in range(value.type.lanes // 4):
        g.store_output(b, index + 4 * j if j else index, value.quad(j).cast(ir.REAL4))


def _lane_fold(b: ir.KernelBuilder, name: str, v: Expr, comb: Comb) -> Expr:
    """The lanes of vector ``v`` folded with ``comb`` (a tree: halves, then pairs), each step
    declared (as ``name_4``, ``name_a``..), so a ``comb`` that names its operands twice (a
    choice) does not grow the source."""
    lanes = v.type.lanes
    if lanes == 1:
        return v
    if lanes == 8:
        v = b.let(f"{name}_4", comb(v.quad(0), v.quad(1), 4))
    lo = b.let(f"{name}_a", comb(v.lane(0), v.lane(1), 1))
    hi = b.let(f"{name}_b", comb(v.lane(2), v.lane(3), 1))
    return b.let(f"{name}_1", comb(lo, hi, 1))


def _pick(g: NodeGen, lanes: int, cond: Callable[[Expr, Expr], Expr], a: Expr, v: Expr) -> Expr:
    """``a`` where ``cond(a, v)`` holds, else ``v``, lane by lane. A float8 goes by quads
    where the dialect's wide vectors are structs (CUDA and MSL have no float8 comparisons);
    OpenCL's own float8 choice measured 2-3x faster on PoCL than the quads."""
    if lanes == 8 and not g.dialect.swizzles:
        return ir.vector(_fvec(8), *(_pick(g, 4, cond, a.quad(q), v.quad(q)) for q in (0, 1)))
    return select(cond(a, v), a, v)


def _decompose(flat: Expr, dims: list[tuple[int, int]]) -> Expr:
    """``sum(coord_k * stride_k)`` where ``flat`` is a row-major index over ``dims``
    (``(size, stride)`` pairs, outermost first); terms are simplified where sizes allow."""
    terms = []
    inner = 1
    for k in range(len(dims) - 1, -1, -1):
        size, stride = dims[k]
        coord = flat if inner == 1 else flat / inner
        if k > 0:           # the outermost coordinate needs no modulo
            coord = coord % size
        terms.append(ir.times(coord, stride))
        inner *= size
    return ir.total(terms[::-1])


def _out_last(g: NodeGen) -> int:
    """The output's last axis (1 for a scalar): vector stores need it a multiple of 4."""
    shape = tuple(g.ctx.outputs[0].shape)
    return int(shape[-1]) if shape else 1


def _loops(b: ir.KernelBuilder, stack: contextlib.ExitStack, runs: list[tuple[int, int]], base: Expr) -> Expr:
    """Open nested loops (on ``stack``) over ``runs`` (``(size, stride)``, outermost first)
    from element ``base``; returns the innermost element index (``i0``, ``i1``..)."""
    index = base
    for k, (size, stride) in enumerate(runs):
        r = stack.enter_context(b.for_(f"r{k}", 0, size))
        index = b.let(f"i{k}", index + (r if stride == 1 else r * stride))
    return index


def _identity(v: Expr) -> Expr:
    """The value itself (a fold's default term, a reduction's default finish)."""
    return v


# -- reductions -----------------------------------------------------------------------------------

def _sum(a: Expr, v: Expr, lanes: int = 1) -> Expr:
    """The step of a sum (a :data:`Comb`)."""
    return a + v


# op -> (initial value, combine(acc, v, lanes)) for float accumulators (float or float vectors).
_FLOAT_REDUCE: dict[str, tuple[float, Comb]] = {
    "SUM": (0.0, _sum),
    "MEAN": (0.0, _sum),
    "REDUCE_PROD": (1.0, lambda a, v, n: a * v),
}
# REDUCE_MAX / REDUCE_MIN: (comparison, initial value, initial value where XNNPACK runs).
# LiteRT starts from the type's lowest / highest finite value (numpy's ``initial``), or from
# -inf / +inf where its XNNPACK kernel runs (the ``empty_infinite`` attr). Its fold is
# x86's ``maxps(acc, v)``, ``acc > v ? acc : v``, in row-major order: a NaN survives only
# as the last element, and one elsewhere drops what came before it
# (:func:`litegpu.ops.reduce.x86_extreme` has the rule and what LiteRT measured).
_EXTREME = {"REDUCE_MAX": (">", -_FLT_MAX, -np.inf), "REDUCE_MIN": ("<", _FLT_MAX, np.inf)}


def _compare(sign: str) -> Callable[[Expr, Expr], Expr]:
    """``p > q`` (``sign`` ">") or ``p < q``, lane by lane."""
    return (lambda p, q: p > q) if sign == ">" else (lambda p, q: p < q)


def _x86_comb(g: NodeGen, sign: str) -> Comb:
    """LiteRT's step ``acc = acc > v ? acc : v`` (``<`` for the minimum): ``v`` wins when
    either is NaN. Folded in order it gives :func:`litegpu.ops.reduce.x86_extreme`."""
    return lambda a, v, n: _pick(g, n, _compare(sign), a, v)


def _nan_dropping_comb(g: NodeGen, sign: str) -> Comb:
    """``acc = v > acc ? v : acc``: the extreme, in any order, of the values that are not
    NaN (x86's ``maxps`` alone, where ``fmax`` needs a NaN test and a blend more)."""
    return lambda a, v, n: _pick(g, n, _compare(sign), v, a)


def _int_init(value: int, t: ir.Type) -> Expr:
    """An integer constant of ``t``; the most negative int / long is ``(min + 1) - 1``
    because C has no negative literals (and ``-2147483648`` is a long)."""
    if value in (-2**31, -2**63) and t.scalar in ("int", "long"):
        return ir.lit(value + 1, t) - 1
    return ir.lit(value, t)


#: An integer reduction: (initial value, combine(acc, v), final(acc)).
IntReducer = tuple[Expr, Callable[[Expr, Expr], Expr], Callable[[Expr], Expr] | None]


def _int_reducer(op: str, dtype: np.dtype) -> IntReducer:
    """How an integer or bool input of ``dtype`` reduces (the accumulator's type is the
    initial value's)."""
    t = ir.Type(ir.scalar_of(dtype))
    if op in ("SUM", "REDUCE_PROD"):
        # Unsigned arithmetic wraps (signed overflow is undefined in C); LiteRT's integer
        # SUM / PROD wrap too.
        wide = ir.Type("ulong" if dtype.itemsize == 8 else "uint")
        if op == "SUM":
            return ir.lit(0, wide), (lambda a, v: a + v.cast(wide)), (lambda a: a.cast(t))
        return ir.lit(1, wide), (lambda a, v: a * v.cast(wide)), (lambda a: a.cast(t))
    if op == "MEAN":
        return ir.lit(0, ir.LONG), (lambda a, v: a + v.cast(ir.LONG)), None    # final set by the caller
    if op in ("REDUCE_MAX", "REDUCE_MIN"):
        info = np.iinfo(dtype)
        fn = "max" if op == "REDUCE_MAX" else "min"
        init = _int_init(int(info.min if op == "REDUCE_MAX" else info.max), t)
        return init, (lambda a, v: call(fn, a, v.cast(t))), (lambda a: a)
    if op == "REDUCE_ANY":
        return ir.lit(0, ir.UCHAR), (lambda a, v: a | v.ne(0).cast(ir.UCHAR)), (lambda a: a)
    if op == "REDUCE_ALL":
        return ir.lit(1, ir.UCHAR), (lambda a, v: a & v.ne(0).cast(ir.UCHAR)), (lambda a: a)
    raise Decline(f"{op} on {dtype} tensors")


def _collapse(shape: tuple[int, ...], axes: tuple[int, ...]) -> list[tuple[int, bool]]:
    """``(size, reduced)`` runs of the input: size-1 axes dropped, neighbours of the same
    kind merged (a reduction only cares about which elements meet, not the axes)."""
    runs: list[list] = []
    for i, d in enumerate(shape):
        if d == 1:
            continue
        red = i in axes
        if runs and runs[-1][1] == red:
            runs[-1][0] *= int(d)
        else:
            runs.append([int(d), red])
    return [(s, r) for s, r in runs] or [(1, False)]


#: Independent accumulators of a long innermost loop: one chain of dependent adds is
#: latency-bound (4 cycles each); four chains keep the SIMD units busy.
_ACCS = 4

#: ``load(index, scalar)``: the value(s) a fold reads at an element index.
Loader = Callable[[Expr, bool], Expr]


def _fold(g: NodeGen, b: ir.KernelBuilder, red: list[tuple[int, int]], base: Expr, width: int, step: int,
          load: Loader, comb: Comb, init: float, term=_identity, side=None, chains: int | None = None,
          flag: bool = False) -> tuple[Expr, Expr | None]:
    """Fold ``term(value)`` with ``comb`` over the reduced runs ``red`` (``(size, stride)``,
    outermost first) from element ``base``; returns the result and, with ``flag``, the
    flag (else None).

    ``load(index, scalar)`` reads at an element index: ``width`` lanes, or one when
    ``scalar``. With ``step`` 1 each reduced element is one vector of ``width``
    independent lanes (neighbouring outputs) and the result is that vector. With
    ``step == width`` the innermost run (stride 1) is read ``width`` elements at a time,
    a scalar loop takes its tail, and the result is one float (lanes folded).
    ``side(index, value, scalar)`` optionally adds statements with each folded value.
    ``chains`` fixes the number of interleaved accumulators (1: the elements are folded
    in order, which an order-dependent ``comb`` needs). With ``flag`` (and ``step > 1``)
    every accumulator also sums its values, and the flag is the float total: NaN
    whenever a value is (and where +inf meets -inf), one add per element.
    """
    vt = _fvec(width)
    size, stride = red[-1]
    vec_end = size // step * step
    accs = chains or (_ACCS if vec_end // step >= 2 * _ACCS else 1)
    main_end = vec_end // (step * accs) * (step * accs)
    tail = step > 1 and vec_end < size
    starts = {"acc": init, "flag": 0.0} if flag else {"acc": init}
    chain = {name: [b.var(f"{name}{a}", ir.lit(start, vt)) for a in range(accs)] for name, start in starts.items()}
    if tail:
        for name, start in starts.items():
            chain[name].append(b.var(f"t{name}", ir.lit(start, ir.FLOAT)))

    def one(index: Expr, k: int, scalar: bool = False) -> None:
        """Fold the value at ``index`` into accumulator ``k`` (the tail's: -1) and, with
        ``flag``, into its sum."""
        value = load(index, scalar)
        if term is not _identity:    # (a term may read its operand twice: load it once)
            value = term(b.let("u", value))
        v = b.let("v", value)
        if side:
            side(index, v, scalar)
        b.assign(chain["acc"][k], comb(chain["acc"][k], v, 1 if scalar else width))
        if flag:
            b.assign(chain["flag"][k], v, "+")

    with contextlib.ExitStack() as stack:
        index = _loops(b, stack, red[:-1], base)

        def at(offset: Expr) -> Expr:
            return index + offset if stride == 1 else index + offset * stride
        if main_end:
            with b.for_("r", 0, main_end, step * accs) as r:
                for a in range(accs):
                    one(at(r + a * step if a else r), a)
        if vec_end > main_end:
            with b.for_("r", main_end, vec_end, step) as r:
                one(at(r), 0)
        if tail:
            with b.for_("r", vec_end, size) as r:
                one(at(r), -1, True)
    results = {}
    for name, how in zip(starts, (comb, _sum)):
        joined = _join_chains(b, name, chain[name][:accs], width, how)
        if step > 1:
            lanes = _lane_fold(b, name, joined, how)
            joined = b.let(f"{name}f", how(lanes, chain[name][-1], 1) if tail else lanes)
        results[name] = joined
    return results["acc"], results.get("flag")


def _join_chains(b: ir.KernelBuilder, name: str, accs: list[Expr], width: int, comb: Comb) -> Expr:
    """The fold of accumulators ``accs`` with ``comb``: in pairs, ``(0, 1)`` and ``(2, 3)``,
    then those two."""
    if len(accs) == 1:
        return accs[0]
    a01 = b.let(f"{name}01", comb(accs[0], accs[1], width))
    a23 = b.let(f"{name}23", comb(accs[2], accs[3], width))
    return b.let(name, comb(a01, a23, width))


def _reduce_loops(b: ir.KernelBuilder, red: list[tuple[int, int]], base: Expr, body: Callable[[Expr], None]) -> None:
    """Plain nested loops over the reduced runs ``red``; ``body(index)`` adds the innermost statements."""
    with contextlib.ExitStack() as stack:
        body(_loops(b, stack, red, base))


@generator("MEAN", "SUM", "REDUCE_PROD", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_ANY", "REDUCE_ALL",
           epilogue=True)
def reduce(g: NodeGen) -> list[KernelSpec]:
    """A reduction over constant axes, on the input's shape collapsed into alternating
    kept / reduced runs. Float inputs: when the innermost run is kept (the NHWC spatial
    mean: [N, H*W, C]) a work-item owns a float8/float4 of neighbouring outputs and loops
    over the reduced elements; when it is reduced, a work-item folds its contiguous
    rows 8 or 4 at a time. Integer and bool inputs: one output per work-item."""
    _check_indexable(g)
    axes_spec = g.ctx.inputs[1]
    if axes_spec.value is None:
        raise Decline("axes are not a constant")
    x_spec, out_spec = g.ctx.inputs[0], g.ctx.outputs[0]
    shape = tuple(int(d) for d in x_spec.shape)
    axes = reduction_axes(np.asarray(axes_spec.value), len(shape))
    n_out = _size(out_spec.shape)
    if n_out == 0:
        return [_empty(g)]
    dims = _collapse(shape, axes)
    strides = strides_of(tuple(s for s, _ in dims))
    kept = [(s, st) for (s, r), st in zip(dims, strides) if not r]
    red = [(s, st) for (s, r), st in zip(dims, strides) if r]
    count = int(np.prod([shape[a] for a in axes], dtype=np.int64)) if axes else 1
    op, dtype = g.ctx.node.op, np.dtype(x_spec.dtype)
    if dtype != _F32:
        return [_int_reduce(g, op, dtype, kept, red, count, n_out)]
    if op in ("MEAN", "SUM") and count:
        xnn_shape, xnn_axes = without_unit_reductions(shape, axes)
        if one_run(xnn_axes):
            return [_xnn_sum(g, xnn_shape, xnn_axes, count, op == "MEAN")]
    if g.attrs.get("squared"):
        raise Decline("a sum of squares over axes that are not one run")
    sign = None
    if op in _EXTREME:
        sign, lowest, infinite = _EXTREME[op]
        init, comb = (infinite if g.attrs.get("empty_infinite") else lowest), _x86_comb(g, sign)
    elif op in _FLOAT_REDUCE:
        init, comb = _FLOAT_REDUCE[op]
    else:
        raise Decline(f"{op} on float tensors")
    finish = (lambda a: a / float(count)) if op == "MEAN" else _identity
    if not red:
        red = [(1, 0)]      # nothing reduced: one pass over each output's own element
    if not dims[-1][1]:
        # An extreme folds its elements in LiteRT's order: one chain per output lane (on PoCL
        # as fast as the four fmax chains it replaces with 24 channels, ~1.2x slower with 8).
        chains = 1 if sign else None
        return [_column_reduce(g, red, kept, n_out, init, comb, finish, chains)]
    return [_row_reduce(g, red, kept, n_out, init, comb, finish, sign)]


# -- MEAN and SUM in XNNPACK's order -------------------------------------------------------
#
# LiteRT hands a float MEAN / SUM over one run of adjacent axes to XNNPACK, which views the
# input as [outer, rows, inner] (merging adjacent axes, dropping no size-1 one; a reduced one
# but the last is a single pass, the same sums without it: without_unit_reductions) and sums in
# a fixed order (the cpu backend's ``litegpu_cpu.kernels.xnn_order`` says which, read from
# XNNPACK's sources): where the run does not end at the last axis, ``rdsum``, each output a
# float32 sum from 0 over the rows in order; where it does, the AVX-512F row sum ``rsum``
# u32_acc2 (16-lane accumulators, written here as four float4 each). A square folded from
# ``MUL(x, x)`` (``squared``, see :mod:`..fusion`) is ``rsum2`` / ``rdsum2``: each square a
# fused multiply-add into its accumulator. Then ``0 + sum * scale``, with ``scale`` the
# float32 ``1.0f / count`` of a MEAN (1 for SUM). So an rms norm's mean of squares gives
# LiteRT's bits, which a decoder's hybrid products need (they quantize their input rows).


def _xnn_sum(g: NodeGen, shape: tuple[int, ...], axes: tuple[int, ...], count: int, mean: bool) -> KernelSpec:
    """MEAN / SUM over the adjacent ``axes`` of ``shape`` in XNNPACK's order (see above)."""
    squared = bool(g.attrs.get("squared"))
    scale = float(np.float32(1) / np.float32(count)) if mean else 1.0
    outer = _size(shape[:axes[0]])
    inner = _size(shape[axes[-1] + 1:])
    b = g.new_kernel()
    x = g.input(b, 0)
    o = b.let("o", b.global_id(0))
    if axes[-1] != len(shape) - 1:      # rdsum: one output element per work-item
        first = b.let("first", (o / inner) * (count * inner) + o % inner)
        acc = b.var("acc", 0.0, ir.FLOAT)
        with b.for_("j", 0, count) as j:
            v = b.let("v", x.load(first + j * inner, as_float=True), ir.FLOAT)
            b.assign(acc, call("fma", v, v, acc) if squared else acc + v)
        total: Expr = acc
    else:                               # rsum / rsum2: one row per work-item
        total = xnn_row_total(b, lambda i, lanes: x.load(i, lanes, as_float=True), b.let("base", o * count), count,
                              "rsum2" if squared else "rsum")
    y = b.let("y", 0.0 + b.let("total", total, ir.FLOAT) * scale, ir.FLOAT)
    g.store_output(b, o, y.cast(ir.REAL))
    return g.kernel(b, (outer * inner,))


#: XNNPACK's AVX-512F row sums, by kernel: 16-lane accumulators (how many), and how a
#: block of ``16 * accumulators`` values is spread over them (accumulator of each 16).
XNN_ROW_SUMS = {
    "rsum": (2, (0, 1)),            # xnn_f32_rsum_ukernel__avx512f_u32_acc2
    "rsum2": (4, (0, 1, 2, 3)),     # xnn_f32_rsum2_ukernel__avx512f_u64_acc4 (squares)
    "radd": (2, (0, 1, 0, 1)),      # xnn_f32_raddstoreexpminusmax_ukernel__avx512f_rr2_p5_u64_acc2
}


def xnn_row_total(b: ir.KernelBuilder, load: Callable[[Expr, int], Expr], base: Expr, n: int, kind: str) -> Expr:
    """The float sum of the ``n`` values at ``base`` (``load(index, lanes)`` gives float
    lanes) in the order of XNNPACK's AVX-512F row sum ``kind`` (:data:`XNN_ROW_SUMS`; the
    cpu backend's ``litegpu_cpu.kernels.xnn_order`` has the same steps): the blocks over
    the accumulators; the rest 16 at a time (``rsum`` one block into the first accumulator,
    ``rsum2`` up to three into the first three in turn, ``radd`` any number after merging);
    the accumulators merged (``rsum2``: 0 + 2, 1 + 3, then those); the last ``n % 16``
    values into the first lanes (the others add 0); then the lanes, l + (l + 8), + 4, + 2
    and the last two. ``rsum2`` adds each square as a fused multiply-add. A 16-lane
    accumulator is four float4."""
    count, spread = XNN_ROW_SUMS[kind]
    squared = kind == "rsum2"

    def add(acc: list[ir.Sym], at: Expr, lanes: int = 16) -> None:
        """``acc`` plus the 16 values at ``at`` (squared), the lanes past ``lanes`` adding 0."""
        for q in range(4):
            if lanes >= 4 * q + 4:
                v = load(ir.plus(at, 4 * q), 4)
            else:
                v = ir.vector(ir.FLOAT4, *(load(ir.plus(at, 4 * q + j), 1) if 4 * q + j < lanes
                                           else ir.lit(0.0, ir.FLOAT) for j in range(4)))
            v = b.let("v", v, ir.FLOAT4)
            b.assign(acc[q], call("fma", v, v, acc[q]) if squared else acc[q] + v)

    def merged(a: list[Expr], c: list[Expr], name: str) -> list[ir.Sym]:
        return [b.var(f"{name}_{q}", a[q] + c[q]) for q in range(4)]

    accs = [[b.var(f"acc{k}_{q}", ir.lit(0.0, ir.FLOAT4)) for q in range(4)] for k in range(count)]
    width = 16 * len(spread)
    full = n // width * width
    if full:
        with b.for_("i", 0, full, width) as i:
            for k, acc in enumerate(spread):
                add(accs[acc], ir.plus(base + i, 16 * k))
    i = full
    if kind == "radd":
        acc = merged(accs[0], accs[1], "sum")
        while n - i >= 16:
            add(acc, ir.plus(base, i))
            i += 16
    else:
        for k in range(count - 1):
            if n - i >= 16:
                add(accs[k], ir.plus(base, i))
                i += 16
        acc = (merged(merged(accs[0], accs[2], "s02"), merged(accs[1], accs[3], "s13"), "sum") if squared
               else merged(accs[0], accs[1], "sum"))
    if i < n:
        add(acc, ir.plus(base, i), n - i)
    half = b.let("half4", (acc[0] + acc[2]) + (acc[1] + acc[3]), ir.FLOAT4)
    return (half.lane(0) + half.lane(2)) + (half.lane(1) + half.lane(3))


def _grouped_rows(g: NodeGen) -> bool:
    """Whether a row op over the last axis of input 0 takes a work-group per row: with
    several lanes (:func:`..render.kernel_lanes`), for at most :data:`MAX_GROUPS` rows."""
    shape = tuple(int(d) for d in g.ctx.inputs[0].shape)
    n = shape[-1] if shape else 1
    return g.lanes > 1 and n > 0 and _size(shape) // n <= MAX_GROUPS


def xnn_row_total_shared(b: ir.KernelBuilder, load: Callable[[Expr], Expr], base: Expr, n: int, kind: str,
                         lid: Expr, lanes: int) -> Expr:
    """:func:`xnn_row_total` by a work-group of ``lanes`` work-items (``lid`` this one's;
    ``load(index)`` one float): each of XNNPACK's accumulator lanes (16 per accumulator)
    is one work-item's, which adds its values in the vector lane's order; the first
    work-item then merges them and adds the tail lane by lane as the vector code does, and
    shares the total through local memory. The same bits as one work-item's sum. Ends with
    a barrier: call it where every work-item of the group does."""
    count, spread = XNN_ROW_SUMS[kind]
    squared = kind == "rsum2"
    width = 16 * len(spread)
    full = n // width * width
    # Blocks of 16 after the main loop that go to accumulators before merging (rsum, rsum2).
    extra = [] if kind == "radd" else [full + 16 * j for j in range(count - 1) if n - full - 16 * j >= 16]
    partial = b.local_array("partial", ir.FLOAT, count * 16)
    shared = b.local_array("shared_total", ir.FLOAT, 1)

    def add(acc: Expr, v: Expr) -> Expr:
        return call("fma", v, v, acc) if squared else acc + v

    with b.for_("p", lid, count * 16, lanes) as p:
        a, lane = b.let("a", p / 16), b.let("lane", p % 16)
        acc = b.var("acc", ir.lit(0.0, ir.FLOAT), ir.FLOAT)
        if full:
            with b.for_("i", 0, full, width) as i:
                for k, to in enumerate(spread):
                    with b.if_(a.eq(to)):
                        b.assign(acc, add(acc, load(base + i + 16 * k + lane)))
        for j, at in enumerate(extra):
            with b.if_(a.eq(j)):
                b.assign(acc, add(acc, load(base + at + lane)))
        b.local_store(partial, p, acc)
    b.barrier()
    with b.if_(lid.eq(0)):
        accs = [[partial.load(16 * a + lane) for lane in range(16)] for a in range(count)]
        if squared:
            merged = [b.let(f"m{lane}", (accs[0][lane] + accs[2][lane]) + (accs[1][lane] + accs[3][lane]), ir.FLOAT)
                      for lane in range(16)]
        else:
            merged = [b.let(f"m{lane}", accs[0][lane] + accs[1][lane], ir.FLOAT) for lane in range(16)]
        i = full + 16 * len(extra)
        if kind == "radd":
            while n - i >= 16:
                merged = [b.let(f"m{lane}", add(merged[lane], load(base + i + lane)), ir.FLOAT) for lane in range(16)]
                i += 16
        if i < n:
            merged = [b.let(f"m{lane}", add(merged[lane], load(base + i + lane) if i + lane < n
                                              else ir.lit(0.0, ir.FLOAT)), ir.FLOAT) for lane in range(16)]
        half = [(merged[j] + merged[8 + j]) + (merged[4 + j] + merged[12 + j]) for j in range(4)]
        b.local_store(shared, 0, (half[0] + half[2]) + (half[1] + half[3]))
    b.barrier()
    return shared.load(0)


def _row_reduce(g: NodeGen, red, kept, n_out: int, init: float, comb: Comb, finish, sign: str | None) -> KernelSpec:
    """The innermost run is reduced and contiguous: each work-item folds its rows a vector
    at a time (see :func:`_fold`). An extreme (``sign``: REDUCE_MAX / REDUCE_MIN) folds
    the values that are not NaN, in any order, and sums them: an output whose sum is NaN
    met a NaN, and only that output is folded again, one element at a time, with LiteRT's
    order-dependent step (measured on PoCL as fast as the ``fmax`` fold it replaces)."""
    b = g.new_kernel()
    x = g.input(b, 0)
    step = _row_step(g, red[-1][0])
    o = b.let("o", b.global_id(0))
    base = b.let("base", _decompose(o, kept) if kept else 0)
    if sign and step > 1:
        acc, flag = _fold(g, b, red, base, step, step, lambda i, scalar: _ldv(x, i, 1 if scalar else step),
                          _nan_dropping_comb(g, sign), init, flag=True)
        y = b.var("y", acc)
        with b.if_(call("isnan", flag)):
            last, _ = _fold(g, b, red, base, 1, 1, lambda i, scalar: _ldv(x, i, 1), comb, init, chains=1)
            b.assign(y, last)
    else:   # (rows shorter than 4 are folded one element at a time anyway)
        acc, _ = _fold(g, b, red, base, step, step, lambda i, scalar: _ldv(x, i, 1 if scalar else step), comb, init,
                       chains=1 if sign else None)
        y = b.let("y", finish(acc))
    g.store_output(b, o, y.cast(ir.REAL))
    return g.kernel(b, (n_out,))


def _column_reduce(g: NodeGen, red, kept, n_out: int, init: float, comb: Comb, finish,
                   chains: int | None = None) -> KernelSpec:
    """The innermost run is kept (the NHWC spatial mean: [N, H*W, C]): a work-item owns
    up to 4 float8/float4 groups of neighbouring outputs (dimension 0) and walks down
    the reduced elements; its groups are independent accumulator chains over
    contiguous memory. With one group, the reduced loop itself is split into chains
    (unless ``chains`` is 1)."""
    inner = kept[-1][0]
    lanes = _lanes(g, inner, _out_last(g))
    groups = next(k for k in (4, 2, 1) if inner % (lanes * k) == 0)
    b = g.new_kernel()
    x = g.input(b, 0)
    c = b.let("c", b.global_id(0) * (lanes * groups))
    j = b.let("j", b.global_id(1))
    o = b.let("o", j * inner + c)
    base = b.let("base", _decompose(j, kept[:-1]) + c if len(kept) > 1 else c)
    if groups == 1:
        acc, _ = _fold(g, b, red, base, lanes, 1, lambda i, _: _ldv(x, i, lanes), comb, init, chains=chains)
        _stv(g, b, o, b.let("y", finish(acc)))
    else:
        accs = [b.var(f"acc{k}", ir.lit(init, _fvec(lanes))) for k in range(groups)]

        def step(i: Expr) -> None:
            for k, acc in enumerate(accs):
                v = b.let("v", _ldv(x, i + k * lanes if k else i, lanes))
                b.assign(acc, comb(acc, v, lanes))
        _reduce_loops(b, red, base, step)
        ys = [b.let(f"y{k}", finish(acc)) for k, acc in enumerate(accs)]
        for k, y in enumerate(ys):
            _stv(g, b, o + k * lanes if k else o, y)
    return g.kernel(b, (inner // (lanes * groups), n_out // inner))


def _int_reduce(g: NodeGen, op: str, dtype: np.dtype, kept, red, count: int, n_out: int) -> KernelSpec:
    """An integer or bool reduction: one output per work-item, exact integer arithmetic."""
    init, comb, final = _int_reducer(op, dtype)
    b = g.new_kernel()
    x = g.input(b, 0)
    out = g.output(b)
    if op == "MEAN":
        # C division truncates toward zero, as LiteRT's integer mean does.
        final = (lambda a: a / ir.lit(max(count, 1), ir.LONG))
    o = b.let("o", b.global_id(0))
    base = b.let("base", _decompose(o, kept) if kept else 0)
    acc = b.var("acc", init)
    _reduce_loops(b, red, base, lambda i: b.assign(acc, comb(acc, x.load(i))))
    # Stored directly, converted to the output's type: the epilogue passes values through
    # ``real``, which would round int32/int64 results (integer outputs have no activation
    # or followers).
    b.store(out, o, final(acc).cast(out.element()))
    return g.kernel(b, (n_out,))


# -- softmax family and L2 normalization (rows over the last axis) --------------------------------

class _Rows:
    """A row op over the last axis: one work-item per row, read a float8/float4 at a time
    (a scalar tail takes the rest); every statistic is a float. The kernel's builder is
    ``b``; ``base`` is the row's first element."""

    def __init__(self, g: NodeGen, float_output: bool = True) -> None:
        if float_output:
            _require_float(g)
        elif g.ctx.inputs[0].dtype != _F32:
            raise Decline(f"{g.ctx.node.op} on {g.ctx.inputs[0].dtype} tensors")
        _check_indexable(g)
        shape = tuple(int(d) for d in g.ctx.inputs[0].shape)
        self.g = g
        self.n = shape[-1] if shape else 1
        self.rows = _size(shape) // self.n if self.n else 0
        self.step = _row_step(g, self.n)
        self.b = g.new_kernel()
        self.x = g.input(self.b, 0)
        self.base = self.b.let("base", self.b.let("row", self.b.global_id(0)) * self.n)

    def load(self, buf: ir.Buffer) -> Loader:
        """``load(index, scalar)`` for :func:`_fold` reading ``buf``."""
        return lambda i, scalar: _ldv(buf, i, 1 if scalar else self.step)

    def fold(self, init: float, comb: Comb, term=_identity, side=None) -> Expr:
        """The fold of ``term(v)`` over the row's values ``v`` (a float)."""
        acc, _ = _fold(self.g, self.b, [(self.n, 1)], self.base, self.step, self.step, self.load(self.x), comb, init,
                       term, side)
        return acc

    def max(self) -> Expr:
        """The row's maximum."""
        return self.fold(-np.inf, lambda a, v, n: call("fmax", a, v))

    def store_pass(self, value: Callable[[Expr], Expr], buf: ir.Buffer | None = None) -> None:
        """A final loop storing ``value(v)`` for the row's values ``v`` (of the input or ``buf``)."""
        b, g, base, step = self.b, self.g, self.base, self.step
        vec_end = self.n // step * step
        # Vector stores only where rows start at multiples of 4 (a quad store's contract).
        aligned = self.n % 4 == 0
        load = self.load(buf or self.x)
        if vec_end and step > 1:
            with b.for_("k", 0, vec_end, step) as k:
                y = b.let("y", value(b.let("v", load(base + k, False))))
                if aligned:
                    _stv(g, b, base + k, y)
                else:
                    for j in range(step):
                        g.store_output(b, base + k + j if j else base + k, y.lane(j).cast(ir.REAL))
        first = vec_end if step > 1 else 0
        if first < self.n:
            with b.for_("k", first, self.n) as k:
                y = b.let("y", value(b.let("v", load(base + k, True))))
                g.store_output(b, base + k, y.cast(ir.REAL))

    def kernel(self) -> list[KernelSpec]:
        """The row kernel built."""
        return [self.g.kernel(self.b, (self.rows,))]


def _raw_store(b: ir.KernelBuilder, out: ir.Buffer, index: Expr, v: Expr) -> None:
    """Store float(s) ``v`` without the epilogue (a scratch value overwritten later)."""
    if v.type.lanes == 1:
        b.store(out, index, v)
        return
    for j in range(v.type.lanes // 4):
        b.store(out, index + 4 * j if j else index, v.quad(j).cast(ir.REAL4))


@generator("SOFTMAX", epilogue=True)
def softmax(g: NodeGen) -> list[KernelSpec]:
    """``exp(beta * (x - max)) / sum`` per row. With ``beta >= 0`` every exp is at most 1
    and is computed once: the second pass sums the exps and parks them in the output,
    the third scales them in place. A negative beta could overflow a half output, so
    then the third pass recomputes the exps from the input."""
    r = _Rows(g)
    b = r.b
    beta = float(np.float32(g.attrs["beta"]))
    out = g.output(b)
    if beta == 1.0:
        if _grouped_rows(g) and 4 * (r.n + g.lanes + 3 * 16 + 1) <= g.dialect.max_local_bytes:
            return [_xnn_softmax_shared(g, r.n, r.rows)]
        return _xnn_softmax(g, r, out)
    park = g.attrs["beta"] >= 0
    side = (lambda i, v, scalar: _raw_store(b, out, i, v)) if park else None
    m = r.max()
    s = r.fold(0.0, _sum, lambda v: call("exp", (v - m) * beta), side)
    inv = b.let("inv", 1.0 / s)
    if park:
        r.store_pass(lambda v: v * inv, buf=out)
    else:
        r.store_pass(lambda v: call("exp", (v - m) * beta) * inv)
    return r.kernel()


def _xnn_softmax(g: NodeGen, r: "_Rows", out: ir.Buffer) -> list[KernelSpec]:
    """SOFTMAX with beta 1 as LiteRT's XNNPACK computes it (``xnn_compute_floating_point_
    softmax``): the row's maximum; each ``exp(x - max)`` (:func:`.formulas.xnn_exp_nonpositive`)
    parked in the output and summed in the order of its AVX-512F ``raddstoreexpminusmax``
    (:func:`xnn_row_total`); each times ``1 / sum``. In float32 whatever the precision."""
    b, n, base = r.b, r.n, r.base
    top = b.let("top", r.max().cast(ir.FLOAT), ir.FLOAT)
    with b.for_("k", 0, n) as k:
        d = b.let("d", r.x.load(base + k, as_float=True) - top, ir.FLOAT)
        _raw_store(b, out, base + k, formulas.xnn_exp_nonpositive(d).cast(ir.REAL))
    total = b.let("total", xnn_row_total(b, lambda i, lanes: out.load(i, lanes, as_float=True), base, n, "radd"),
                  ir.FLOAT)
    inv = b.let("inv", 1.0 / total, ir.FLOAT)
    with b.for_("k", 0, n) as k:
        g.store_output(b, base + k, (out.load(base + k, as_float=True) * inv).cast(ir.REAL))
    return r.kernel()


def _xnn_softmax_shared(g: NodeGen, n: int, rows: int) -> KernelSpec:
    """:func:`_xnn_softmax` by a work-group of ``g.lanes`` per row: the maximum (in any
    order: the same value), the exponentials parked in local memory in the output's
    storage type (as the one-work-item kernel parks them in the output), their sum by
    :func:`xnn_row_total_shared` (XNNPACK's order), then each times ``1 / sum``."""
    lanes = g.lanes
    b = g.new_kernel()
    x = g.input(b, 0)
    lid = b.let("lid", b.local_id(0))
    base = b.let("base", b.group_id(1) * n)
    tops = b.local_array("tops", ir.FLOAT, lanes)
    parked = b.local_array("parked", ir.REAL, n)
    top = b.var("top", ir.lit(-np.inf, ir.FLOAT), ir.FLOAT)
    with b.for_("k", lid, n, lanes) as k:
        b.assign(top, call("fmax", top, x.load(base + k, as_float=True)))
    b.local_store(tops, lid, top)
    b.barrier()
    row_top = b.var("row_top", ir.lit(-np.inf, ir.FLOAT), ir.FLOAT)
    with b.for_("i", 0, lanes) as i:
        b.assign(row_top, call("fmax", row_top, tops.load(i)))
    with b.for_("k", lid, n, lanes) as k:
        d = b.let("d", x.load(base + k, as_float=True) - row_top, ir.FLOAT)
        b.local_store(parked, k, formulas.xnn_exp_nonpositive(d).cast(ir.REAL))
    b.barrier()
    total = b.let("total", xnn_row_total_shared(b, lambda i: parked.load(i).cast(ir.FLOAT), ir.lit(0, ir.INT), n,
                                                "radd", lid, lanes), ir.FLOAT)
    inv = b.let("inv", 1.0 / total, ir.FLOAT)
    with b.for_("k", lid, n, lanes) as k:
        g.store_output(b, base + k, (parked.load(k).cast(ir.FLOAT) * inv).cast(ir.REAL))
    return g.kernel(b, (lanes, rows), (lanes, 1))


@generator("LOG_SOFTMAX", epilogue=True)
def log_softmax(g: NodeGen) -> list[KernelSpec]:
    """``x - max - log(sum(exp(x - max)))`` per row."""
    r = _Rows(g)
    m = r.max()
    s = r.fold(0.0, _sum, lambda v: call("exp", v - m))
    shift = r.b.let("shift", m + call("log", s))
    r.store_pass(lambda v: v - shift)
    return r.kernel()


@generator("L2_NORMALIZATION", epilogue=True)
def l2_normalization(g: NodeGen) -> list[KernelSpec]:
    """``x / max(sqrt(sum(x^2)), 1e-6)`` per row."""
    r = _Rows(g)
    s = r.fold(0.0, _sum, lambda v: v * v)
    norm = r.b.let("norm", call("fmax", call("sqrt", s), float(L2_EPSILON)))
    r.store_pass(lambda v: v / norm)
    return r.kernel()


@generator("LOCAL_RESPONSE_NORMALIZATION", epilogue=True)
def local_response_normalization(g: NodeGen) -> list[KernelSpec]:
    """``x * (bias + alpha * sum of x^2 over channels c-r..c+r) ^ -beta``, one work-item
    per element (channel on dimension 0); the window is clipped at the channel ends."""
    _require_float(g)
    _check_indexable(g)
    shape = tuple(int(d) for d in g.ctx.inputs[0].shape)
    depth = shape[-1]
    pixels = _size(shape) // depth if depth else 0
    r = int(g.attrs["radius"])
    bias, alpha, beta = (float(np.float32(g.attrs[k])) for k in ("bias", "alpha", "beta"))
    b = g.new_kernel()
    x = g.input(b, 0)
    c = b.let("c", b.global_id(0))
    row = b.let("row", b.global_id(1) * depth)
    lo = b.let("lo", call("max", c - r, 0))
    hi = b.let("hi", call("min", c + r, depth - 1))
    s = b.var("s", 0.0, ir.FLOAT)
    with b.for_("k", lo, hi + 1) as k:
        v = b.let("v", _ldv(x, row + k, 1))
        b.assign(s, v * v, "+")
    t = b.let("t", bias + alpha * s)
    # pow() is several times slower than exp2/log2 on PoCL; for a positive base they
    # agree to a few ulp (the base is bias + alpha * s, positive for any sane model).
    scale = b.let("scale", select(t > 0.0, call("exp2", -beta * call("log2", t)), call("pow", t, -beta)))
    y = b.let("y", _ldv(x, row + c, 1) * scale)
    g.store_output(b, row + c, y.cast(ir.REAL))
    return [g.kernel(b, (depth, pixels))]


# -- pooling --------------------------------------------------------------------------------------

def _pixel_ids(b: ir.KernelBuilder, lanes: int, oh: int, ow: int, c: int) -> tuple[Expr, Expr, Expr, Expr, Expr]:
    """A 3-D work-item's first channel ``cc`` (dimension 0, ``lanes`` channels each),
    output column ``ox`` (dimension 1), row ``oy`` and batch ``b`` (dimension 2), and
    ``o``, the flat index of its first output element (NHWC), declared in that order."""
    cc = b.let("cc", b.global_id(0) * lanes if lanes > 1 else b.global_id(0))
    ox = b.let("ox", b.global_id(1))
    q = b.let("q", b.global_id(2))
    oy = b.let("oy", q % oh)
    batch = b.let("b", q / oh)
    o = b.let("o", (q * ow + ox) * c + cc)
    return cc, ox, oy, batch, o


@dataclass(frozen=True)
class _Window:
    """A pool's geometry: input ``h`` x ``w`` x ``c`` (``n`` images), output ``oh`` x ``ow``,
    window ``fh`` x ``fw``, strides, and the padding before the first row / column."""

    n: int
    h: int
    w: int
    c: int
    oh: int
    ow: int
    fh: int
    fw: int
    sh: int
    sw: int
    top: int
    left: int

    @property
    def inside(self) -> bool:
        """No window ever leaves the image."""
        return (self.top == 0 and self.left == 0 and (self.oh - 1) * self.sh + self.fh <= self.h
                and (self.ow - 1) * self.sw + self.fw <= self.w)

    def launch(self, lanes: int) -> tuple[int, int, int]:
        """The 3-D range of work-items owning ``lanes`` channels each."""
        return self.c // lanes, self.ow, self.n * self.oh


def _all(*conds: Expr) -> Expr:
    """Every condition (C's ``&&``, left to right)."""
    total = conds[0]
    for cond in conds[1:]:
        total = logical_and(total, cond)
    return total


@generator("AVERAGE_POOL_2D", "MAX_POOL_2D", "L2_POOL_2D", epilogue=True)
def pool2d(g: NodeGen) -> list[KernelSpec]:
    """A 3-D range over (channel groups, output columns, batch x output rows); each
    work-item loops over its window with constant trip counts, skipping taps outside
    the image: padded pixels never win a max and are not counted in an average
    (LiteRT's rule). Windows that can never leave the image skip the checks.

    NaN and infinities come out as from the kernel LiteRT runs (``litert_kernel``, see
    "NaN in pools" in :mod:`litegpu.ops.nn`): XNNPACK's max pool is its own kernel
    (:func:`_xnn_max_pool`), its average turns a NaN into the lower bound, and TFLite's
    own kernels clamp to the finite floats."""
    _require_float(g)
    _check_indexable(g)
    if len(g.ctx.inputs[0].shape) != 4:
        raise Decline(f"{g.ctx.node.op} on a rank-{len(g.ctx.inputs[0].shape)} input")
    n, h, w, c = (int(d) for d in g.ctx.inputs[0].shape)
    _, oh, ow, _ = (int(d) for d in g.ctx.outputs[0].shape)
    if n * oh * ow * c == 0:
        return [_empty(g)]
    fh, fw = g.attrs["filter"]
    sh, sw = g.attrs["stride"]
    _, top = conv_output_size(h, fh, sh, 1, g.attrs["padding"])
    _, left = conv_output_size(w, fw, sw, 1, g.attrs["padding"])
    win = _Window(n, h, w, c, oh, ow, fh, fw, sh, sw, top, left)
    if g.ctx.node.op == "MAX_POOL_2D" and g.attrs.get("litert_kernel", "builtin") == "xnnpack":
        return [_xnn_max_pool(g, win)]
    return [_window_pool(g, win)]


def _tap_step(b: ir.KernelBuilder, op: str, kernel: str) -> tuple[float, Callable[[Expr, Expr], None]]:
    """(initial value, update(acc, tap)) of a pool's accumulators."""
    if op == "MAX_POOL_2D" and kernel == "xnnpack_clamp":    # 1x1, stride 1: a copy, NaN kept
        return 0.0, lambda a, v: b.assign(a, v)
    if op == "MAX_POOL_2D":       # TFLite's own: a NaN never wins, the lowest float to start
        return -_FLT_MAX, lambda a, v: b.assign(a, call("fmax", a, v))
    if op == "AVERAGE_POOL_2D":
        return 0.0, lambda a, v: b.assign(a, v, "+")

    def square(a: Expr, v: Expr) -> None:
        u = b.let("v", v)
        b.assign(a, u * u, "+")
    return 0.0, square


def _window_pool(g: NodeGen, win: _Window) -> KernelSpec:
    """The pools but XNNPACK's max (see :func:`pool2d`): loops over the window, with the
    image's bounds checked only where a window may leave it."""
    op, kernel = g.ctx.node.op, g.attrs.get("litert_kernel", "builtin")
    lanes = _lanes(g, win.c)
    # Big windows (a global pool) are long accumulation chains: then a work-item keeps
    # up to 4 channel groups in flight, as the spatial mean does. Small windows are
    # short chains where more work-items measured as fast or faster.
    groups = next(k for k in (4, 2, 1) if win.c % (lanes * k) == 0) if win.fh * win.fw >= 16 else 1
    b = g.new_kernel()
    x = g.input(b, 0)
    init, update = _tap_step(b, op, kernel)
    cc, ox, oy, batch, o = _pixel_ids(b, lanes * groups, win.oh, win.ow, win.c)
    y0 = b.let("y0", oy * win.sh - win.top)
    x0 = b.let("x0", ox * win.sw - win.left)
    accs = [b.var(f"acc{k}", ir.lit(init, _fvec(lanes))) for k in range(groups)]
    # the count of taps inside the image (LiteRT averages over those only)
    cnt = b.var("cnt", float(win.fh * win.fw), ir.FLOAT) if op != "MAX_POOL_2D" else None
    counts = cnt is not None and not (op == "AVERAGE_POOL_2D" and pool_divisor_is_window(g.attrs))

    def taps(at: Expr) -> None:
        for k, acc in enumerate(accs):
            update(acc, _ldv(x, at + k * lanes if k else at, lanes))
    if win.inside:
        _window_loops(b, win, batch, cc, y0, x0, taps, checked=False)
    else:
        # Most windows lie inside the image: they take the loops without checks.
        with b.if_(_all(y0 >= 0, y0 + win.fh <= win.h, x0 >= 0, x0 + win.fw <= win.w)):
            _window_loops(b, win, batch, cc, y0, x0, taps, checked=False)
        with b.else_():
            _window_loops(b, win, batch, cc, y0, x0, taps, checked=True)
            if counts:
                inside_y = call("min", y0 + win.fh, win.h) - call("max", y0, 0)
                inside_x = call("min", x0 + win.fw, win.w) - call("max", x0, 0)
                b.assign(cnt, call("max", inside_y * inside_x, 1).cast(ir.FLOAT))
    result = {"MAX_POOL_2D": lambda a: a, "AVERAGE_POOL_2D": lambda a: a / cnt,
              "L2_POOL_2D": lambda a: call("sqrt", a / cnt)}[op]
    for k, acc in enumerate(accs):
        pooled = b.let(f"pool{k}", result(acc))
        _stv(g, b, o + k * lanes if k else o, b.let(f"res{k}", _pool_nan(g, op, kernel, pooled)))
    return g.kernel(b, win.launch(lanes * groups))


def _window_loops(b: ir.KernelBuilder, win: _Window, batch: Expr, cc: Expr, y0: Expr, x0: Expr,
                  taps: Callable[[Expr], None], checked: bool) -> None:
    """The loops over a window from row ``y0`` and column ``x0`` (constant trip counts,
    unrolled up to 64 taps); ``taps(at)`` reads the element index ``at``; ``checked``
    skips taps outside the image."""
    unroll = win.fh * win.fw <= 64

    def within(cond: Expr):
        return b.if_(cond) if checked else contextlib.nullcontext()
    with b.for_("ky", 0, win.fh, unroll=unroll) as ky:
        iy = b.let("iy", y0 + ky)
        with within(_all(iy >= 0, iy < win.h)):
            row = b.let("row", (batch * win.h + iy) * win.w)
            with b.for_("kx", 0, win.fw, unroll=unroll) as kx:
                ix = b.let("ix", x0 + kx)
                with within(_all(ix >= 0, ix < win.w)):
                    taps(b.let("at", (row + ix) * win.c + cc))


def _pool_nan(g: NodeGen, op: str, kernel: str, v: Expr) -> Expr:
    """The pooled value ``v`` as the kernel LiteRT runs leaves it, before the fused
    activation (which lets NaN through): XNNPACK's average clamp turns NaN into the
    lower bound, TFLite's own kernels clamp to the finite floats (a max never is NaN)."""
    if op == "L2_POOL_2D" or kernel == "xnnpack_clamp":
        return v
    if v.type.lanes == 8:      # lane-wise choices by quads, which every dialect has
        return ir.vector(v.type, *(_pool_nan(g, op, kernel, v.quad(q)) for q in (0, 1)))
    if kernel == "xnnpack":
        lo = ACTIVATION_RANGES[g.attrs["activation"]][0]
        return select(call("isnan", v), ir.lit(lo, v.type), v)
    lo, hi = builtin_pool_range(g.attrs["activation"])
    clamped = call("clamp", v, float(lo), float(hi))
    return clamped if op == "MAX_POOL_2D" else select(call("isnan", v), v, clamped)


#: Window taps XNNPACK's max pool is unrolled for here (its NaN order is a fixed tree per pass).
_XNN_MAX_TAPS = 256


def _xnn_max_pool(g: NodeGen, win: _Window) -> KernelSpec:
    """MAX_POOL_2D as XNNPACK computes it, NaN and all (see "NaN in pools" in
    :mod:`litegpu.ops.nn`): each work-item loads its window's taps at coordinates clamped
    into the image, folds each pass of 9 by :func:`xnn_max9` with x86's max
    (``a > b ? a : b``), clamps the first pass ``min(max(m, lo), hi)`` and each later one
    ``min(max(acc, m), hi)``. The choices are lane-wise, made by quads (which every
    dialect has) in a float8."""
    fh, fw = win.fh, win.fw
    if fh * fw > _XNN_MAX_TAPS:
        raise Decline(f"a {fh}x{fw} max pool window (XNNPACK's NaN order is unrolled up to {_XNN_MAX_TAPS} taps)")
    lanes = _lanes(g, win.c)
    b = g.new_kernel()
    x = g.input(b, 0)
    cc, ox, oy, batch, o = _pixel_ids(b, lanes, win.oh, win.ow, win.c)
    y0 = b.let("y0", oy * win.sh - win.top)
    x0 = b.let("x0", ox * win.sw - win.left)
    rows = [b.let(f"row{ky}", (batch * win.h + call("clamp", y0 + ky, 0, win.h - 1)) * win.w) for ky in range(fh)]
    cols = [b.let(f"col{kx}", call("clamp", x0 + kx, 0, win.w - 1)) for kx in range(fw)]
    taps = {}
    for kx in range(fw):
        for ky in range(fh):
            taps[ky, kx] = b.let(f"v{ky}_{kx}", _ldv(x, (rows[ky] + cols[kx]) * win.c + cc, lanes))

    def x86_max(a: Expr, v: Expr | float, sign: str = ">") -> Expr:
        """``a sign v ? a : v``, lane by lane (``v`` may be a bound, a float)."""
        def part(p: Expr, q: Expr | float) -> Expr:
            q = ir.lit(q, p.type) if isinstance(q, float) else q
            return select(p > q if sign == ">" else p < q, p, q)
        if lanes == 8:   # by quads, which every dialect can choose between lane by lane
            value = ir.vector(a.type, *(part(a.quad(j), v if isinstance(v, float) else v.quad(j)) for j in (0, 1)))
        else:
            value = part(a, v)
        return b.let("mx", value)
    lo, hi = (float(bound) for bound in ACTIVATION_RANGES[g.attrs["activation"]])
    acc = None
    for chunk in xnn_max_pool_passes(fh, fw):
        m = xnn_max9([taps[ky, kx] for ky, kx in chunk], x86_max)
        acc = x86_max(x86_max(m, lo), hi, "<") if acc is None else x86_max(x86_max(acc, m), hi, "<")
    _stv(g, b, o, acc)
    return g.kernel(b, win.launch(lanes))


# -- resize -------------------------------------------------------------------------------------

def _resize_dims(g: NodeGen) -> tuple[int, int, int, int, int, int]:
    """(n, h, w, c, out h, out w); the size input must be a constant (static shapes)."""
    _require_float(g)
    if g.ctx.inputs[1].value is None:
        raise Decline("the output size is not a constant")
    _check_indexable(g)
    n, h, w, c = (int(d) for d in g.ctx.inputs[0].shape)
    _, oh, ow, _ = (int(d) for d in g.ctx.outputs[0].shape)
    return n, h, w, c, oh, ow


def _bilinear(b: ir.KernelBuilder, xnnpack: bool, tl: Expr, tr: Expr, bl: Expr, br: Expr, wx: Expr,
              wy: Expr) -> Expr:
    """The value from the taps and the weights ``wx``, ``wy``, in the order of the kernel
    LiteRT runs: XNNPACK's (:func:`litegpu.ops.nn.bilinear_lerp`: an infinite tap gives
    NaN even at weight 0) or, for a size that is not a constant of the model, the builtin
    kernel's weighted sum."""
    if xnnpack:
        t = b.let("t", tl + (tr - tl) * wx)
        bt = b.let("bt", bl + (br - bl) * wx)
        return b.let("y", t + (bt - t) * wy)
    vx = b.let("vx", 1.0 - wx)
    vy = b.let("vy", 1.0 - wy)
    return b.let("y", tl * (vy * vx) + tr * (vy * wx) + bl * (wy * vx) + br * (wy * wx))


@generator("RESIZE_BILINEAR", epilogue=True)
def resize_bilinear(g: NodeGen) -> list[KernelSpec]:
    """Bilinear resize; the per-row / per-column source indices and weights come from the
    op module's own float32 coordinate rules (align_corners, half_pixel_centers), uploaded
    as small tables so the device reproduces them exactly."""
    n, h, w, c, oh, ow = _resize_dims(g)
    if n * oh * ow * c == 0:
        return [_empty(g)]
    y_lo, y_hi, fy = bilinear_axis(h, oh, g.attrs)
    x_lo, x_hi, fx = bilinear_axis(w, ow, g.attrs)
    lanes = _lanes(g, c)
    b = g.new_kernel()
    x = g.input(b, 0)
    # Row and column offsets in elements: the kernel only adds them.
    ty0, ty1 = (g.const(b, (t * w * c).astype(np.int32)) for t in (y_lo, y_hi))
    tx0, tx1 = (g.const(b, (t * c).astype(np.int32)) for t in (x_lo, x_hi))
    tfy = g.const(b, fy.astype(np.float32), storage=False)
    tfx = g.const(b, fx.astype(np.float32), storage=False)
    cc, ox, oy, batch, o = _pixel_ids(b, lanes, oh, ow, c)
    img = b.let("img", batch * (h * w * c) + cc)
    r0 = b.let("r0", img + ty0.load(oy))
    r1 = b.let("r1", img + ty1.load(oy))
    c0 = b.let("c0", tx0.load(ox))
    c1 = b.let("c1", tx1.load(ox))
    wy = b.let("wy", tfy.load(oy, as_float=True))
    wx = b.let("wx", tfx.load(ox, as_float=True))
    tl, tr, bl, br = (b.let(name, _ldv(x, r + col, lanes))
                      for name, r, col in (("tl", r0, c0), ("tr", r0, c1), ("bl", r1, c0), ("br", r1, c1)))
    _stv(g, b, o, _bilinear(b, g.attrs.get("xnnpack", True), tl, tr, bl, br, wx, wy))
    return [g.kernel(b, (c // lanes, ow, n * oh))]


@generator("RESIZE_NEAREST_NEIGHBOR", epilogue=True)
def resize_nearest(g: NodeGen) -> list[KernelSpec]:
    """Nearest-neighbour resize: a gather through row / column tables computed with the
    op module's rounding rules (LiteRT's, per flag combination)."""
    n, h, w, c, oh, ow = _resize_dims(g)
    if n * oh * ow * c == 0:
        return [_empty(g)]
    rows = nearest_axis(h, oh, g.attrs)
    cols = nearest_axis(w, ow, g.attrs)
    lanes = _lanes(g, c)
    b = g.new_kernel()
    x = g.input(b, 0)
    trow = g.const(b, (rows * w * c).astype(np.int32))
    tcol = g.const(b, (cols * c).astype(np.int32))
    cc, ox, oy, batch, o = _pixel_ids(b, lanes, oh, ow, c)
    y = b.let("y", _ldv(x, batch * (h * w * c) + trow.load(oy) + tcol.load(ox) + cc, lanes))
    _stv(g, b, o, y)
    return [g.kernel(b, (c // lanes, ow, n * oh))]


# -- ARG_MAX / ARG_MIN --------------------------------------------------------------------------

@generator("ARG_MAX", "ARG_MIN")
def arg_extreme(g: NodeGen) -> list[KernelSpec]:
    """First index of the largest (smallest) value along a constant axis: one work-item
    per output, the axis' inner neighbours on consecutive work-items."""
    _check_indexable(g)
    axis_spec = g.ctx.inputs[1]
    if axis_spec.value is None:
        raise Decline("axis is not a constant")
    x_spec = g.ctx.inputs[0]
    shape = tuple(int(d) for d in x_spec.shape)
    flat = np.asarray(axis_spec.value).reshape(-1)
    axis = int(flat[0]) % len(shape)
    outer, size, inner = _size(shape[:axis]), shape[axis], _size(shape[axis + 1:])
    if outer * inner == 0:
        return [_empty(g)]
    if size == 0:
        raise Decline("arg max/min over an empty axis")
    dtype = np.dtype(x_spec.dtype)
    b = g.new_kernel()
    x, out = g.input(b, 0), g.output(b, 0)
    load = (lambda i: _ldv(x, i, 1)) if dtype == _F32 else x.load
    wins = _compare(">" if g.ctx.node.op == "ARG_MAX" else "<")
    step = _row_step(g, size) if dtype == _F32 and inner == 1 else 1
    i = b.let("i", b.global_id(0))
    j = b.let("j", b.global_id(1))
    base = b.let("base", j * (size * inner) + i)
    best = b.var("best", load(base))
    at = b.var("at", 0)

    def visit(v: Expr, k: Expr) -> None:
        with b.if_(wins(v, best)):
            b.assign(best, v)
            b.assign(at, k)
    if step > 1:
        # A contiguous axis is read a float8/float4 at a time (scalar half loads are slow
        # on PoCL); lanes are compared in index order, so the first extreme still wins.
        vec_end = size // step * step
        with b.for_("k", 0, vec_end, step) as k:
            v = b.let("v", _ldv(x, base + k, step))
            for lane in range(step):
                visit(v.lane(lane), k + lane if lane else k)
        with b.for_("k", vec_end, size) as k:
            visit(b.let("v", load(base + k)), k)
    else:
        with b.for_("k", 1, size) as k:
            visit(b.let("v", load(base + k * inner if inner > 1 else base + k)), k)
    b.store(out, j * inner + i, at.cast(out.element()))
    return [g.kernel(b, (inner, outer))]
