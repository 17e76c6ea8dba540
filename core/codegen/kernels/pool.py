"""Windowed and axis ops: pooling, reductions, the softmax family, normalizations,
resize and arg max/min.

Everything that sums, multiplies or normalizes accumulates in ``float``, whatever the
storage or arithmetic precision (half accumulators lose the small terms of long sums);
only the final value is converted to ``real`` for the store.

Layout choices, measured on PoCL's CPU device: it does not vectorize across the
work-items of a kernel whose body loops (all of these do), so each work-item works on
its own float8 / float4 vectors: channel groups (pools, resize, reductions that keep
the last axis) or steps along a contiguous row (softmax family, reductions of the
last axis). Long accumulations keep up to four independent chains in flight. Pools
and resize run 3-D ranges (channel groups, output column, batch x output row), which
spares the per-work-item divisions of a flat index. Integer reductions and ARG_MAX /
ARG_MIN are scalar.
"""
from __future__ import annotations

import numpy as np
from litegpu.ops.nn import (bilinear_axis, builtin_pool_range, conv_output_size, nearest_axis, pool_divisor_is_window,
                            xnn_max9, xnn_max_pool_passes)
from litegpu.ops.registry import ACTIVATION_RANGES
from litegpu.ops.reduce import L2_EPSILON, reduction_axes

from ..nodegen import NodeGen, c_float, c_type, strides_of
from . import Decline, generator

_F32 = np.dtype(np.float32)
_INT_MAX = 2**31 - 1


# -- shared helpers ---------------------------------------------------------------------------

def _size(shape) -> int:
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


def _lanes(*sizes: int) -> int:
    """How many consecutive elements a work-item handles: 8, 4 or 1, dividing every size.

    PoCL does not vectorize across work-items whose body has loops, so a work-item's
    own vector is what reaches the SIMD units; float8 measured fastest there (and it
    keeps half loads vectorized, which float4 alone did not)."""
    for v in (8, 4):
        if all(s % v == 0 for s in sizes):
            return v
    return 1


def _vt(lanes: int) -> str:
    """The float vector type of ``lanes`` lanes."""
    return "float" if lanes == 1 else f"float{lanes}"


def _ldv(g: NodeGen, ptr: str, index: str, lanes: int) -> str:
    """``lanes`` consecutive float elements from ``index`` as float/float4/float8, built
    from 4-wide loads (the compiler merges them; PoCL 3.1 crashes on an unaligned
    ``vload_half8`` here)."""
    if lanes == 1:
        return g.loadv(ptr, index, 1)
    quads = [f"convert_float4({g.load4(ptr, f'{index} + {4 * j}' if j else index)})" for j in range(lanes // 4)]
    return quads[0] if lanes == 4 else g.vector(f"float{lanes}", *quads)


def _stv(g: NodeGen, index: str, var: str, lanes: int) -> str:
    """Store the float/float4/float8 variable ``var`` at ``index`` of the output through
    the epilogue (``store_output4`` per quad; the output's last axis is a multiple of 4)."""
    if lanes == 1:
        return g.store_output(index, f"(real)({var})")
    if lanes == 4:
        return g.store_output4(index, f"TO_REAL4({var})")
    return " ".join(g.store_output4(f"{index} + {4 * j}" if j else index, f"TO_REAL4({var}.{half})")
                    for j, half in enumerate(("lo", "hi")))


def _lane_fold(var: str, lanes: int, comb) -> tuple[str, str]:
    """Statements folding the lanes of vector ``var`` with ``comb(a, b, lanes)`` (a tree:
    halves, then pairs), and the float that holds the result. Each step is a variable, so
    a ``comb`` that names its operands twice (a choice) does not grow the source."""
    if lanes == 1:
        return "", var
    code = ""
    if lanes == 8:
        code += f"  const float4 {var}_4 = {comb(f'{var}.lo', f'{var}.hi', 4)};\n"
        var = f"{var}_4"
    code += (f"  const float {var}_a = {comb(f'{var}.x', f'{var}.y', 1)};\n"
             f"  const float {var}_b = {comb(f'{var}.z', f'{var}.w', 1)};\n"
             f"  const float {var}_1 = {comb(f'{var}_a', f'{var}_b', 1)};\n")
    return code, f"{var}_1"


def _pick(g: NodeGen, lanes: int, cond, a: str, b: str) -> str:
    """``a`` where ``cond(a, b)`` holds, else ``b``, lane by lane. A float8 goes by quads
    where the dialect's wide vectors are structs (CUDA and MSL have no float8 comparisons);
    OpenCL's own float8 choice measured 2-3x faster on PoCL than the quads."""
    if lanes == 8 and not g.dialect.swizzles:
        return g.vector("float8", *(_pick(g, 4, cond, f"{a}.{q}", f"{b}.{q}") for q in ("lo", "hi")))
    return g.choose(cond(a, b), a, b)


def _decompose(flat: str, dims: list[tuple[int, int]]) -> str:
    """``sum(coord_k * stride_k)`` where ``flat`` is a row-major index over ``dims``
    (``(size, stride)`` pairs, outermost first); terms are simplified where sizes allow."""
    terms = []
    inner = 1
    for k in range(len(dims) - 1, -1, -1):
        size, stride = dims[k]
        coord = f"({flat})" if inner == 1 else f"(({flat}) / {inner})"
        if k > 0:           # the outermost coordinate needs no modulo
            coord = f"({coord} % {size})"
        terms.append(coord if stride == 1 else f"{coord} * {stride}")
        inner *= size
    return " + ".join(reversed(terms)) or "0"


def _out_last(g: NodeGen) -> int:
    """The output's last axis (1 for a scalar): vector stores need it a multiple of 4."""
    shape = tuple(g.ctx.outputs[0].shape)
    return int(shape[-1]) if shape else 1


# -- reductions -----------------------------------------------------------------------------------

# op -> (initial value, combine(acc, v, lanes)) for float accumulators (float or float vectors).
_FLOAT_REDUCE = {
    "SUM": ("0.0f", lambda a, v, n: f"({a} + {v})"),
    "MEAN": ("0.0f", lambda a, v, n: f"({a} + {v})"),
    "REDUCE_PROD": ("1.0f", lambda a, v, n: f"({a} * {v})"),
}
# REDUCE_MAX / REDUCE_MIN: (comparison, initial value, initial value where XNNPACK runs).
# LiteRT starts from the type's lowest / highest finite value (numpy's ``initial``), or from
# -inf / +inf where its XNNPACK kernel runs (the ``empty_infinite`` attr). Its fold is
# x86's ``maxps(acc, v)``, ``acc > v ? acc : v``, in row-major order: a NaN survives only
# as the last element, and one elsewhere drops what came before it
# (:func:`litegpu.ops.reduce.x86_extreme` has the rule and what LiteRT measured).
_EXTREME = {"REDUCE_MAX": (">", "(-FLT_MAX)", "(-INFINITY)"), "REDUCE_MIN": ("<", "FLT_MAX", "INFINITY")}


def _x86_comb(g: NodeGen, sign: str):
    """LiteRT's step ``acc = acc > v ? acc : v`` (``<`` for the minimum): ``v`` wins when
    either is NaN. Folded in order it gives :func:`litegpu.ops.reduce.x86_extreme`."""
    return lambda a, v, n: _pick(g, n, lambda p, q: f"({p} {sign} {q})", a, v)


def _nan_dropping_comb(g: NodeGen, sign: str):
    """``acc = v > acc ? v : acc``: the extreme, in any order, of the values that are not
    NaN (x86's ``maxps`` alone, where ``fmax`` needs a NaN test and a blend more)."""
    return lambda a, v, n: _pick(g, n, lambda p, q: f"({p} {sign} {q})", v, a)


def _int_literal(value: int, ctype: str) -> str:
    """An integer literal of ``ctype``; the most negative int / long is written as
    ``(min + 1) - 1`` because C has no negative literals."""
    suffix = "L" if ctype == "long" else ""
    text = f"({value + 1}{suffix} - 1)" if value in (-2**31, -2**63) else f"{value}{suffix}"
    return text if ctype in ("int", "long") else f"(({ctype}){text})"


def _int_reducer(op: str, dtype: np.dtype) -> tuple[str, str, callable, callable]:
    """(accumulator type, initial value, combine(acc, v), final(acc)) for an integer or bool input."""
    ctype = c_type(dtype)
    wide = "ulong" if dtype.itemsize == 8 else "uint"
    if op in ("SUM", "REDUCE_PROD"):
        # Unsigned arithmetic wraps (signed overflow is undefined in C); LiteRT's integer
        # SUM / PROD wrap too.
        sym = "+" if op == "SUM" else "*"
        init = "0" if op == "SUM" else "1"
        return wide, init, (lambda a, v: f"{a} {sym} ({wide})({v})"), (lambda a: f"({ctype})({a})")
    if op == "MEAN":
        return "long", "0L", (lambda a, v: f"{a} + (long)({v})"), None    # final set by the caller
    if op in ("REDUCE_MAX", "REDUCE_MIN"):
        info = np.iinfo(dtype)
        init = _int_literal(int(info.min if op == "REDUCE_MAX" else info.max), ctype)
        fn = "max" if op == "REDUCE_MAX" else "min"
        return ctype, init, (lambda a, v: f"{fn}({a}, ({ctype})({v}))"), (lambda a: a)
    if op == "REDUCE_ANY":
        return "uchar", "0", (lambda a, v: f"{a} | ({v} != 0)"), (lambda a: a)
    if op == "REDUCE_ALL":
        return "uchar", "1", (lambda a, v: f"{a} & ({v} != 0)"), (lambda a: a)
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


def _fold(g: NodeGen, red: list[tuple[int, int]], base: str, width: int, step: int, load, comb, init: str,
          term=lambda v: v, side=None, chains: int | None = None, flag: bool = False) -> tuple[str, str]:
    """Statements folding ``term(value)`` with ``comb`` over the reduced runs ``red``
    (``(size, stride)``, outermost first) from element ``base``; returns the code and
    the name of the result.

    ``load(index, scalar)`` reads at an element index: ``width`` lanes, or one when
    ``scalar``. With ``step`` 1 each reduced element is one vector of ``width``
    independent lanes (neighbouring outputs) and the result is that vector. With
    ``step == width`` the innermost run (stride 1) is read ``width`` elements at a time,
    a scalar loop takes its tail, and the result is one float (lanes folded).
    ``side(index, var, scalar)`` is an optional statement run with each folded value.
    ``chains`` fixes the number of interleaved accumulators (1: the elements are folded
    in order, which an order-dependent ``comb`` needs). With ``flag`` (and ``step > 1``)
    every accumulator also sums its values, and the code leaves the total in float
    ``flagf``: NaN whenever a value is (and where +inf meets -inf), one add per element.
    """
    vt = _vt(width)
    size, stride = red[-1]
    vec_end = size // step * step
    accs = chains or (_ACCS if vec_end // step >= 2 * _ACCS else 1)
    main_end = vec_end // (step * accs) * (step * accs)
    tail = step > 1 and vec_end < size
    names = ("acc", "flag") if flag else ("acc",)

    def one(index: str, chain: str, scalar: bool = False) -> str:
        """Fold the value at ``index`` into accumulator ``chain`` (``acc0``.., ``tacc``)
        and, with ``flag``, into its sum (``flag0``.., ``tflag``)."""
        t, n = ("float", 1) if scalar else (vt, width)
        extra = f" {side(index, 'v', scalar)}" if side else ""
        flagging = f" {chain.replace('acc', 'flag')} += v;" if flag else ""
        return f"{{ const {t} v = {term(load(index, scalar))};{extra} {chain} = {comb(chain, 'v', n)};{flagging} }}"

    code = "".join(f"  {vt} {name}{a} = {g.vector(vt, init if name == 'acc' else '0.0f')};\n"
                   for name in names for a in range(accs))
    code += "".join(f"  float t{name} = {init if name == 'acc' else '0.0f'};\n" for name in names) if tail else ""
    index, indent = base, "  "
    for k, (sz, st) in enumerate(red[:-1]):
        code += f"{indent}for (int r{k} = 0; r{k} < {sz}; ++r{k}) {{\n"
        code += f"{indent}  const int i{k} = {index} + r{k} * {st};\n"
        index, indent = f"i{k}", indent + "  "

    def at(offset: str) -> str:
        return f"{index} + {offset}" if stride == 1 else f"{index} + ({offset}) * {stride}"
    if main_end:
        unrolled = " ".join(one(at(f"r + {a * step}") if a else at("r"), f"acc{a}") for a in range(accs))
        code += f"{indent}for (int r = 0; r < {main_end}; r += {step * accs}) {{ {unrolled} }}\n"
    if vec_end > main_end:
        code += f"{indent}for (int r = {main_end}; r < {vec_end}; r += {step}) {one(at('r'), 'acc0')}\n"
    if tail:
        code += f"{indent}for (int r = {vec_end}; r < {size}; ++r) {one(at('r'), 'tacc', True)}\n"
    for _ in red[:-1]:
        indent = indent[:-2]
        code += f"{indent}}}\n"
    for name, how in zip(names, (comb, _sum)):
        code += _join_chains(name, accs, vt, width, how)
        if step > 1:
            folding, lanes = _lane_fold(name, width, how)
            code += folding + f"  const float {name}f = {how(lanes, f't{name}', 1) if tail else lanes};\n"
    return code, ("acc" if step == 1 else "accf")


def _join_chains(name: str, chains: int, vt: str, width: int, comb) -> str:
    """Statements leaving ``name`` (a ``vt``), the fold of accumulators ``name0`` .. with
    ``comb``: in pairs, ``(0, 1)`` and ``(2, 3)``, then those two."""
    if chains == 1:
        return f"  const {vt} {name} = {name}0;\n"
    return (f"  const {vt} {name}01 = {comb(f'{name}0', f'{name}1', width)};\n"
            f"  const {vt} {name}23 = {comb(f'{name}2', f'{name}3', width)};\n"
            f"  const {vt} {name} = {comb(f'{name}01', f'{name}23', width)};\n")


def _row_step(size: int) -> int:
    """Elements per step along a contiguous run of ``size``: the widest vector that fits."""
    return 8 if size >= 8 else 4 if size >= 4 else 1


def _reduce_loops(red: list[tuple[int, int]], base: str, body) -> str:
    """Plain nested loops over the reduced runs ``red``; ``body(index)`` is the innermost statement."""
    code, index, indent = "", base, "  "
    for k, (size, stride) in enumerate(red):
        code += f"{indent}for (int r{k} = 0; r{k} < {size}; ++r{k}) {{\n"
        code += f"{indent}  const int i{k} = {index} + r{k} * {stride};\n"
        index, indent = f"i{k}", indent + "  "
    code += f"{indent}{body(index)}\n"
    for _ in red:
        indent = indent[:-2]
        code += f"{indent}}}\n"
    return code


@generator("MEAN", "SUM", "REDUCE_PROD", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_ANY", "REDUCE_ALL",
           epilogue=True)
def reduce(g: NodeGen):
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
        return [g.kernel("", (0,))]
    dims = _collapse(shape, axes)
    strides = strides_of(tuple(s for s, _ in dims))
    kept = [(s, st) for (s, r), st in zip(dims, strides) if not r]
    red = [(s, st) for (s, r), st in zip(dims, strides) if r]
    count = int(np.prod([shape[a] for a in axes], dtype=np.int64)) if axes else 1
    op, dtype = g.ctx.node.op, np.dtype(x_spec.dtype)
    x = g.input(0)
    if dtype != _F32:
        return [_int_reduce(g, x, op, dtype, kept, red, count, n_out)]
    sign = None
    if op in _EXTREME:
        sign, lowest, infinite = _EXTREME[op]
        init, comb = (infinite if g.attrs.get("empty_infinite") else lowest), _x86_comb(g, sign)
    elif op in _FLOAT_REDUCE:
        init, comb = _FLOAT_REDUCE[op]
    else:
        raise Decline(f"{op} on float tensors")
    finish = (lambda a: f"({a}) / {c_float(count)}") if op == "MEAN" else (lambda a: a)
    if not red:
        red = [(1, 0)]      # nothing reduced: one pass over each output's own element
    if not dims[-1][1]:
        # An extreme folds its elements in LiteRT's order: one chain per output lane (on PoCL
        # as fast as the four fmax chains it replaces with 24 channels, ~1.2x slower with 8).
        chains = 1 if sign else None
        return [_column_reduce(g, x, red, kept, n_out, init, comb, finish, chains)]
    return [_row_reduce(g, x, red, kept, n_out, init, comb, finish, sign)]


def _row_reduce(g: NodeGen, x: str, red, kept, n_out: int, init: str, comb, finish, sign: str | None):
    """The innermost run is reduced and contiguous: each work-item folds its rows a vector
    at a time (see :func:`_fold`). An extreme (``sign``: REDUCE_MAX / REDUCE_MIN) folds
    the values that are not NaN, in any order, and sums them: an output whose sum is NaN
    met a NaN, and only that output is folded again, one element at a time, with LiteRT's
    order-dependent step (measured on PoCL as fast as the ``fmax`` fold it replaces)."""
    step = _row_step(red[-1][0])
    load = (lambda i, scalar: _ldv(g, x, i, 1 if scalar else step))
    if sign and step > 1:
        code, acc = _fold(g, red, "base", step, step, load, _nan_dropping_comb(g, sign), init, flag=True)
        again, last = _fold(g, red, "base", 1, 1, lambda i, _: _ldv(g, x, i, 1), comb, init, chains=1)
        inner = "".join(f"  {line}\n" for line in again.splitlines())
        code += f"  float y = {acc};\n  if (isnan(flagf)) {{\n{inner}    y = {last};\n  }}\n"
    else:   # (rows shorter than 4 are folded one element at a time anyway)
        code, acc = _fold(g, red, "base", step, step, load, comb, init, chains=1 if sign else None)
        code += f"  const float y = {finish(acc)};\n"
    body = (f"  const int o = {g.global_id(0)};\n  if (o >= {n_out}) return;\n"
            f"  const int base = {_decompose('o', kept) if kept else '0'};\n" + code
            + f"  {g.store_output('o', '(real)(y)')}")
    return g.kernel(body, (n_out,))


def _column_reduce(g: NodeGen, x: str, red, kept, n_out: int, init: str, comb, finish, chains: int | None = None):
    """The innermost run is kept (the NHWC spatial mean: [N, H*W, C]): a work-item owns
    up to 4 float8/float4 groups of neighbouring outputs (dimension 0) and walks down
    the reduced elements; its groups are independent accumulator chains over
    contiguous memory. With one group, the reduced loop itself is split into chains
    (unless ``chains`` is 1)."""
    inner = kept[-1][0]
    lanes = _lanes(inner, _out_last(g))
    groups = next(k for k in (4, 2, 1) if inner % (lanes * k) == 0)
    vt = _vt(lanes)
    base = _decompose("j", kept[:-1]) if len(kept) > 1 else "0"
    head = (f"  const int c = {g.global_id(0)} * {lanes * groups};\n  const int j = {g.global_id(1)};\n"
            f"  const int o = j * {inner} + c;\n  const int base = {base} + c;\n")
    if groups == 1:
        code, acc = _fold(g, red, "base", lanes, 1, lambda i, _: _ldv(g, x, i, lanes), comb, init, chains=chains)
        body = head + code + f"  const {vt} y = {finish(acc)};\n  {_stv(g, 'o', 'y', lanes)}"
    else:
        def step(i: str) -> str:
            return " ".join(f"{{ const {vt} v = {_ldv(g, x, f'{i} + {k * lanes}' if k else i, lanes)}; "
                            f"acc{k} = {comb(f'acc{k}', 'v', lanes)}; }}" for k in range(groups))
        body = (head + "".join(f"  {vt} acc{k} = {g.vector(vt, init)};\n" for k in range(groups))
                + _reduce_loops(red, "base", step)
                + "".join(f"  const {vt} y{k} = {finish(f'acc{k}')};\n" for k in range(groups))
                + "  " + " ".join(_stv(g, f"o + {k * lanes}" if k else "o", f"y{k}", lanes) for k in range(groups)))
    return g.kernel(body, (inner // (lanes * groups), n_out // inner))


def _int_reduce(g: NodeGen, x: str, op: str, dtype: np.dtype, kept, red, count: int, n_out: int):
    """An integer or bool reduction: one output per work-item, exact integer arithmetic."""
    acc_t, init, comb, final = _int_reducer(op, dtype)
    if op == "MEAN":
        # C division truncates toward zero, as LiteRT's integer mean does.
        octype = c_type(g.ctx.outputs[0].dtype)
        final = (lambda a: f"({octype})({a} / {max(count, 1)}L)")
    body = (f"  const int o = {g.global_id(0)};\n  if (o >= {n_out}) return;\n"
            f"  const int base = {_decompose('o', kept) if kept else '0'};\n  {acc_t} acc = {init};\n"
            + _reduce_loops(red, "base", lambda i: f"acc = {comb('acc', f'{x}[{i}]')};")
            # Stored directly: store_output passes values through ``real``, which would
            # round int32/int64 results (integer outputs have no activation or followers).
            + f"  {g.output(0)}[o] = {final('acc')};")
    return g.kernel(body, (n_out,))


# -- softmax family and L2 normalization (rows over the last axis) --------------------------------

class _Rows:
    """A row op over the last axis: one work-item per row, read a float8/float4 at a time
    (a scalar tail takes the rest); every statistic is a float."""

    def __init__(self, g: NodeGen) -> None:
        _require_float(g)
        _check_indexable(g)
        shape = tuple(int(d) for d in g.ctx.inputs[0].shape)
        self.g = g
        self.n = shape[-1] if shape else 1
        self.rows = _size(shape) // self.n if self.n else 0
        self.step = _row_step(self.n)
        self.x = g.input(0)

    def load(self, ptr: str):
        """``load(index, scalar)`` for :func:`_fold` reading ``ptr``."""
        return lambda i, scalar: _ldv(self.g, ptr, i, 1 if scalar else self.step)

    def fold(self, name: str, init: str, comb, term=lambda v: v, side=None) -> str:
        """Statements leaving float ``name`` = fold of ``term(v)`` over the row's values ``v``."""
        code, acc = _fold(self.g, [(self.n, 1)], "base", self.step, self.step, self.load(self.x), comb, init,
                          term, side)
        inner = "".join(f"  {line}\n" for line in code.splitlines())
        return f"  {{\n{inner}    {name} = {acc};\n  }}\n"

    def max(self) -> str:
        """Statements leaving the row's maximum in ``m``."""
        return "  float m;\n" + self.fold("m", "-INFINITY", lambda a, b, n: f"fmax({a}, {b})")

    def store_pass(self, value, ptr: str | None = None) -> str:
        """A final loop storing ``value(v)`` for the row's values ``v`` (of the input or ``ptr``)."""
        vec_end = self.n // self.step * self.step
        # Vector stores only where rows start at multiples of 4 (store_output4's contract).
        aligned = self.n % 4 == 0
        load = self.load(ptr or self.x)
        code = ""
        if vec_end and self.step > 1:
            vt = _vt(self.step)
            store = (_stv(self.g, "base + k", "y", self.step) if aligned else
                     " ".join(self.g.store_output(f"base + k + {j}", f"(real)({self.g.lane('y', j, self.step)})") for j in range(self.step)))
            code += (f"  for (int k = 0; k < {vec_end}; k += {self.step}) {{\n"
                     f"    const {vt} v = {load('base + k', False)};\n    const {vt} y = {value('v')};\n"
                     f"    {store}\n  }}\n")
        first = vec_end if self.step > 1 else 0
        if first < self.n:
            code += (f"  for (int k = {first}; k < {self.n}; ++k) {{\n"
                     f"    const float v = {load('base + k', True)};\n    const float y = {value('v')};\n"
                     f"    {self.g.store_output('base + k', '(real)(y)')}\n  }}\n")
        return code

    def kernel(self, statements: str):
        """The row kernel around ``statements`` (which see ``base``, the row's first element)."""
        body = (f"  const int row = {self.g.global_id(0)};\n  if (row >= {self.rows}) return;\n"
                f"  const int base = row * {self.n};\n" + statements)
        return [self.g.kernel(body, (self.rows,))]


def _sum(a: str, b: str, lanes: int = 1) -> str:
    return f"({a} + {b})"


def _raw_store(g: NodeGen, ptr: str, index: str, var: str, lanes: int) -> str:
    """Store float(s) ``var`` without the epilogue (a scratch value overwritten later)."""
    if lanes == 1:
        return g.store(ptr, index, var)
    if lanes == 4:
        return g.store4(ptr, index, f"TO_REAL4({var})")
    return g.store4(ptr, index, f"TO_REAL4({var}.lo)") + " " + g.store4(ptr, f"{index} + 4", f"TO_REAL4({var}.hi)")


@generator("SOFTMAX", epilogue=True)
def softmax(g: NodeGen):
    """``exp(beta * (x - max)) / sum`` per row. With ``beta >= 0`` every exp is at most 1
    and is computed once: the second pass sums the exps and parks them in the output,
    the third scales them in place. A negative beta could overflow a half output, so
    then the third pass recomputes the exps from the input."""
    r = _Rows(g)
    beta = c_float(g.attrs["beta"])
    out = g.output(0)
    park = g.attrs["beta"] >= 0
    side = (lambda i, v, scalar: _raw_store(g, out, i, v, 1 if scalar else r.step)) if park else None
    sums = "  float s;\n" + r.fold("s", "0.0f", _sum, lambda v: f"exp(({v} - m) * {beta})", side)
    final = r.store_pass(lambda v: f"{v} * inv", ptr=out) if park else \
        r.store_pass(lambda v: f"exp(({v} - m) * {beta}) * inv")
    return r.kernel(r.max() + sums + "  const float inv = 1.0f / s;\n" + final)


@generator("LOG_SOFTMAX", epilogue=True)
def log_softmax(g: NodeGen):
    """``x - max - log(sum(exp(x - max)))`` per row."""
    r = _Rows(g)
    return r.kernel(r.max() + "  float s;\n" + r.fold("s", "0.0f", _sum, lambda v: f"exp({v} - m)")
                    + "  const float shift = m + log(s);\n" + r.store_pass(lambda v: f"{v} - shift"))


@generator("L2_NORMALIZATION", epilogue=True)
def l2_normalization(g: NodeGen):
    """``x / max(sqrt(sum(x^2)), 1e-6)`` per row."""
    r = _Rows(g)
    return r.kernel("  float s;\n" + r.fold("s", "0.0f", _sum, lambda v: f"{v} * {v}")
                    + f"  const float norm = fmax(sqrt(s), {c_float(L2_EPSILON)});\n"
                    + r.store_pass(lambda v: f"{v} / norm"))


@generator("LOCAL_RESPONSE_NORMALIZATION", epilogue=True)
def local_response_normalization(g: NodeGen):
    """``x * (bias + alpha * sum of x^2 over channels c-r..c+r) ^ -beta``, one work-item
    per element (channel on dimension 0); the window is clipped at the channel ends."""
    _require_float(g)
    _check_indexable(g)
    shape = tuple(int(d) for d in g.ctx.inputs[0].shape)
    depth = shape[-1]
    pixels = _size(shape) // depth if depth else 0
    r = int(g.attrs["radius"])
    x = g.input(0)
    bias, alpha, beta = (c_float(g.attrs[k]) for k in ("bias", "alpha", "beta"))
    # pow() is several times slower than exp2/log2 on PoCL; for a positive base they
    # agree to a few ulp (the base is bias + alpha * s, positive for any sane model).
    body = (f"  const int c = {g.global_id(0)};\n  const int row = {g.global_id(1)} * {depth};\n"
            f"  const int lo = max(c - {r}, 0), hi = min(c + {r}, {depth - 1});\n"
            f"  float s = 0.0f;\n"
            f"  for (int k = lo; k <= hi; ++k) {{ const float v = {_ldv(g, x, 'row + k', 1)}; s += v * v; }}\n"
            f"  const float t = {bias} + {alpha} * s;\n"
            f"  const float scale = t > 0.0f ? exp2(-{beta} * log2(t)) : pow(t, -{beta});\n"
            f"  const float y = {_ldv(g, x, 'row + c', 1)} * scale;\n"
            f"  {g.store_output('row + c', '(real)(y)')}")
    return [g.kernel(body, (depth, pixels))]


# -- pooling --------------------------------------------------------------------------------------

def _pixel_ids(g: NodeGen, lanes: int, oh: int, ow: int, c: int) -> str:
    """Statements naming a 3-D work-item's first channel ``cc`` (dimension 0, ``lanes``
    channels each), output column ``ox`` (dimension 1), row ``oy`` and batch ``b``
    (dimension 2), and ``o``, the flat index of its first output element (NHWC)."""
    return (f"  const int cc = {g.global_id(0)} * {lanes};\n  const int ox = {g.global_id(1)};\n"
            f"  const int q = {g.global_id(2)};\n  const int oy = q % {oh}, b = q / {oh};\n"
            f"  const int o = (q * {ow} + ox) * {c} + cc;\n")


@generator("AVERAGE_POOL_2D", "MAX_POOL_2D", "L2_POOL_2D", epilogue=True)
def pool2d(g: NodeGen):
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
        return [g.kernel("", (0,))]
    fh, fw = g.attrs["filter"]
    sh, sw = g.attrs["stride"]
    _, top = conv_output_size(h, fh, sh, 1, g.attrs["padding"])
    _, left = conv_output_size(w, fw, sw, 1, g.attrs["padding"])
    inside = top == 0 and left == 0 and (oh - 1) * sh + fh <= h and (ow - 1) * sw + fw <= w
    op = g.ctx.node.op
    kernel = g.attrs.get("litert_kernel", "builtin")
    if op == "MAX_POOL_2D" and kernel == "xnnpack":
        return [_xnn_max_pool(g, (h, w, c), (oh, ow), (top, left))]
    lanes = _lanes(c)
    # Big windows (a global pool) are long accumulation chains: then a work-item keeps
    # up to 4 channel groups in flight, as the spatial mean does. Small windows are
    # short chains where more work-items measured as fast or faster.
    groups = next(k for k in (4, 2, 1) if c % (lanes * k) == 0) if fh * fw >= 16 else 1
    vt = _vt(lanes)
    x = g.input(0)
    if op == "MAX_POOL_2D" and kernel == "xnnpack_clamp":    # 1x1, stride 1: a copy, NaN kept
        init, update = "0.0f", lambda a, v: f"{a} = {v};"
    elif op == "MAX_POOL_2D":       # TFLite's own: a NaN never wins, the lowest float to start
        init, update = "-FLT_MAX", lambda a, v: f"{a} = fmax({a}, {v});"
    elif op == "AVERAGE_POOL_2D":
        init, update = "0.0f", lambda a, v: f"{a} += {v};"
    else:
        init, update = "0.0f", lambda a, v: f"{{ const {vt} v = {v}; {a} += v * v; }}"
    taps = " ".join(update(f"acc{k}", _ldv(g, x, f"at + {k * lanes}" if k else "at", lanes)) for k in range(groups))
    unroll = "#pragma unroll\n" if fh * fw <= 64 else ""
    whole_window = op == "AVERAGE_POOL_2D" and pool_divisor_is_window(g.attrs)

    def window(checked: bool, indent: str) -> str:
        """The loops over the window; ``checked`` skips taps outside the image."""
        check_y = f"if (iy < 0 || iy >= {h}) continue; " if checked else ""
        check_x = f"if (ix < 0 || ix >= {w}) continue; " if checked else ""
        code = (f"{unroll}{indent}for (int ky = 0; ky < {fh}; ++ky) {{\n"
                f"{indent}  const int iy = y0 + ky; {check_y}const int row = (b * {h} + iy) * {w};\n"
                f"{unroll}{indent}  for (int kx = 0; kx < {fw}; ++kx) {{\n"
                f"{indent}    const int ix = x0 + kx; {check_x}const int at = (row + ix) * {c} + cc;\n"
                f"{indent}    {taps}\n{indent}  }}\n{indent}}}\n")
        # the count of taps inside the image (LiteRT averages over those only)
        count = (f"(float)max((min(y0 + {fh}, {h}) - max(y0, 0)) * (min(x0 + {fw}, {w}) - max(x0, 0)), 1)"
                 if checked and not whole_window else c_float(fh * fw))
        return code + f"{indent}cnt = {count};\n"
    if inside:
        loops = window(False, "  ")
    else:
        # Most windows lie inside the image: they take the loops without checks.
        loops = (f"  if (y0 >= 0 && y0 + {fh} <= {h} && x0 >= 0 && x0 + {fw} <= {w}) {{\n"
                 + window(False, "    ") + "  } else {\n" + window(True, "    ") + "  }\n")
    result = {"MAX_POOL_2D": "{a}", "AVERAGE_POOL_2D": "{a} / cnt", "L2_POOL_2D": "sqrt({a} / cnt)"}[op]
    body = (_pixel_ids(g, lanes * groups, oh, ow, c)
            + f"  const int y0 = oy * {sh} - {top}, x0 = ox * {sw} - {left};\n"
            + "".join(f"  {vt} acc{k} = {g.vector(vt, init)};\n" for k in range(groups))
            + "  float cnt;\n" + loops
            + "".join(f"  const {vt} pool{k} = {result.format(a=f'acc{k}')};\n"
                      f"  const {vt} res{k} = {_pool_nan(g, op, kernel, f'pool{k}', vt)};\n" for k in range(groups))
            + "  " + " ".join(_stv(g, f"o + {k * lanes}" if k else "o", f"res{k}", lanes) for k in range(groups)))
    return [g.kernel(body, (c // (lanes * groups), ow, n * oh))]


def _pool_nan(g: NodeGen, op: str, kernel: str, v: str, vt: str) -> str:
    """The pooled variable ``v`` as the kernel LiteRT runs leaves it, before the fused
    activation (which lets NaN through): XNNPACK's average clamp turns NaN into the
    lower bound, TFLite's own kernels clamp to the finite floats (a max never is NaN)."""
    if op == "L2_POOL_2D" or kernel == "xnnpack_clamp":
        return v
    if vt == "float8":      # lane-wise choices by quads, which every dialect has
        return g.vector(vt, *(_pool_nan(g, op, kernel, f"{v}.{q}", "float4") for q in ("lo", "hi")))
    if kernel == "xnnpack":
        lo = ACTIVATION_RANGES[g.attrs["activation"]][0]
        return g.choose(f"isnan({v})", g.vector(vt, c_float(lo)), v)
    lo, hi = builtin_pool_range(g.attrs["activation"])
    clamped = f"clamp({v}, {c_float(lo)}, {c_float(hi)})"
    return clamped if op == "MAX_POOL_2D" else g.choose(f"isnan({v})", v, clamped)


#: Window taps XNNPACK's max pool is unrolled for here (its NaN order is a fixed tree per pass).
_XNN_MAX_TAPS = 256


def _xnn_max_pool(g: NodeGen, hwc: tuple[int, int, int], ohw: tuple[int, int], pad: tuple[int, int]):
    """MAX_POOL_2D as XNNPACK computes it, NaN and all (see "NaN in pools" in
    :mod:`litegpu.ops.nn`): each work-item loads its window's taps at coordinates clamped
    into the image, folds each pass of 9 by :func:`xnn_max9` with x86's max
    (``a > b ? a : b``), clamps the first pass ``min(max(m, lo), hi)`` and each later one
    ``min(max(acc, m), hi)``. The choices are lane-wise ``?:``, made by quads (which
    every dialect has) in a float8."""
    (h, w, c), (oh, ow), (top, left) = hwc, ohw, pad
    fh, fw = g.attrs["filter"]
    sh, sw = g.attrs["stride"]
    if fh * fw > _XNN_MAX_TAPS:
        raise Decline(f"a {fh}x{fw} max pool window (XNNPACK's NaN order is unrolled up to {_XNN_MAX_TAPS} taps)")
    n = int(g.ctx.inputs[0].shape[0])
    lanes = _lanes(c)
    vt = _vt(lanes)
    x = g.input(0)
    lines = [_pixel_ids(g, lanes, oh, ow, c) + f"  const int y0 = oy * {sh} - {top}, x0 = ox * {sw} - {left};"]
    lines += [f"  const int row{ky} = (b * {h} + clamp(y0 + {ky}, 0, {h - 1})) * {w};" for ky in range(fh)]
    lines += [f"  const int col{kx} = clamp(x0 + {kx}, 0, {w - 1});" for kx in range(fw)]
    lines += [f"  const {vt} v{ky}_{kx} = {_ldv(g, x, f'(row{ky} + col{kx}) * {c} + cc', lanes)};"
              for kx in range(fw) for ky in range(fh)]
    temps = iter(range(1 << 30))

    def x86_max(a: str, b: str, op: str = ">") -> str:
        t = f"mx{next(temps)}"
        if vt == "float8":   # by quads, which every dialect can choose between lane by lane
            value = g.vector(vt, *(g.choose(f"({a}.{q} {op} {b}.{q})", f"{a}.{q}", f"{b}.{q}") for q in ("lo", "hi")))
        else:
            value = g.choose(f"({a} {op} {b})", a, b)
        lines.append(f"  const {vt} {t} = {value};")
        return t
    lo, hi = (g.vector(vt, c_float(b)) for b in ACTIVATION_RANGES[g.attrs["activation"]])
    acc = None
    for taps in xnn_max_pool_passes(fh, fw):
        m = xnn_max9([f"v{ky}_{kx}" for ky, kx in taps], x86_max)
        acc = x86_max(x86_max(m, lo), hi, "<") if acc is None else x86_max(x86_max(acc, m), hi, "<")
    lines.append(f"  {_stv(g, 'o', acc, lanes)}")
    return g.kernel("\n".join(lines), (c // lanes, ow, n * oh))


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


def _bilinear(xnnpack: bool, vt: str) -> str:
    """Statements leaving ``y`` (a ``vt``) from the taps ``tl``, ``tr``, ``bl``, ``br`` and
    the weights ``wx``, ``wy``, in the order of the kernel LiteRT runs: XNNPACK's
    (:func:`litegpu.ops.nn.bilinear_lerp`: an infinite tap gives NaN even at weight 0)
    or, for a size that is not a constant of the model, the builtin kernel's weighted sum."""
    if xnnpack:
        return (f"  const {vt} t = tl + (tr - tl) * wx;\n  const {vt} bt = bl + (br - bl) * wx;\n"
                f"  const {vt} y = t + (bt - t) * wy;\n")
    return ("  const float vx = 1.0f - wx, vy = 1.0f - wy;\n"
            f"  const {vt} y = tl * (vy * vx) + tr * (vy * wx) + bl * (wy * vx) + br * (wy * wx);\n")


@generator("RESIZE_BILINEAR", epilogue=True)
def resize_bilinear(g: NodeGen):
    """Bilinear resize; the per-row / per-column source indices and weights come from the
    op module's own float32 coordinate rules (align_corners, half_pixel_centers), uploaded
    as small tables so the device reproduces them exactly."""
    n, h, w, c, oh, ow = _resize_dims(g)
    if n * oh * ow * c == 0:
        return [g.kernel("", (0,))]
    y_lo, y_hi, fy = bilinear_axis(h, oh, g.attrs)
    x_lo, x_hi, fx = bilinear_axis(w, ow, g.attrs)
    lanes = _lanes(c)
    vt = _vt(lanes)
    x = g.input(0)
    # Row and column offsets in elements: the kernel only adds them.
    ty0, ty1 = (g.const((t * w * c).astype(np.int32)) for t in (y_lo, y_hi))
    tx0, tx1 = (g.const((t * c).astype(np.int32)) for t in (x_lo, x_hi))
    tfy = g.const(fy.astype(np.float32), storage=False)
    tfx = g.const(fx.astype(np.float32), storage=False)
    body = (_pixel_ids(g, lanes, oh, ow, c)
            + f"  const int img = b * {h * w * c} + cc;\n"
            f"  const int r0 = img + {ty0}[oy], r1 = img + {ty1}[oy];\n"
            f"  const int c0 = {tx0}[ox], c1 = {tx1}[ox];\n"
            f"  const float wy = {tfy}[oy], wx = {tfx}[ox];\n"
            f"  const {vt} tl = {_ldv(g, x, 'r0 + c0', lanes)}, tr = {_ldv(g, x, 'r0 + c1', lanes)};\n"
            f"  const {vt} bl = {_ldv(g, x, 'r1 + c0', lanes)}, br = {_ldv(g, x, 'r1 + c1', lanes)};\n"
            + _bilinear(g.attrs.get("xnnpack", True), vt)
            + f"  {_stv(g, 'o', 'y', lanes)}")
    return [g.kernel(body, (c // lanes, ow, n * oh))]


@generator("RESIZE_NEAREST_NEIGHBOR", epilogue=True)
def resize_nearest(g: NodeGen):
    """Nearest-neighbour resize: a gather through row / column tables computed with the
    op module's rounding rules (LiteRT's, per flag combination)."""
    n, h, w, c, oh, ow = _resize_dims(g)
    if n * oh * ow * c == 0:
        return [g.kernel("", (0,))]
    rows = nearest_axis(h, oh, g.attrs)
    cols = nearest_axis(w, ow, g.attrs)
    lanes = _lanes(c)
    vt = _vt(lanes)
    x = g.input(0)
    trow = g.const((rows * w * c).astype(np.int32))
    tcol = g.const((cols * c).astype(np.int32))
    body = (_pixel_ids(g, lanes, oh, ow, c)
            + f"  const {vt} y = {_ldv(g, x, f'b * {h * w * c} + {trow}[oy] + {tcol}[ox] + cc', lanes)};\n"
            f"  {_stv(g, 'o', 'y', lanes)}")
    return [g.kernel(body, (c // lanes, ow, n * oh))]


# -- ARG_MAX / ARG_MIN --------------------------------------------------------------------------

@generator("ARG_MAX", "ARG_MIN")
def arg_extreme(g: NodeGen):
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
        return [g.kernel("", (0,))]
    if size == 0:
        raise Decline("arg max/min over an empty axis")
    dtype = np.dtype(x_spec.dtype)
    x, out = g.input(0), g.output(0)
    vt = "float" if dtype == _F32 else c_type(dtype)
    load = (lambda i: _ldv(g, x, i, 1)) if dtype == _F32 else (lambda i: f"{x}[{i}]")
    cmp = ">" if g.ctx.node.op == "ARG_MAX" else "<"
    step = _row_step(size) if dtype == _F32 and inner == 1 else 1
    if step > 1:
        # A contiguous axis is read a float8/float4 at a time (scalar half loads are slow
        # on PoCL); lanes are compared in index order, so the first extreme still wins.
        vec_end = size // step * step
        lanes = " ".join(f"if ({g.lane('v', j, step)} {cmp} best) {{ best = {g.lane('v', j, step)}; at = k + {j}; }}"
                         for j in range(step))
        scan = (f"  for (int k = 0; k < {vec_end}; k += {step}) {{\n"
                f"    const {_vt(step)} v = {_ldv(g, x, 'base + k', step)};\n    {lanes}\n  }}\n"
                f"  for (int k = {vec_end}; k < {size}; ++k) {{\n"
                f"    const float v = {load('base + k')};\n    if (v {cmp} best) {{ best = v; at = k; }}\n  }}\n")
    else:
        scan = (f"  for (int k = 1; k < {size}; ++k) {{\n"
                f"    const {vt} v = {load(f'base + k * {inner}')};\n"
                f"    if (v {cmp} best) {{ best = v; at = k; }}\n  }}\n")
    body = (f"  const int i = {g.global_id(0)};\n  const int j = {g.global_id(1)};\n"
            f"  const int base = j * {size * inner} + i;\n"
            f"  {vt} best = {load('base')};\n  int at = 0;\n" + scan
            + f"  {out}[j * {inner} + i] = at;")
    return [g.kernel(body, (inner, outer))]
