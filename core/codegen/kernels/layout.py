"""Data-movement kernels: reshapes, concatenation, padding, slicing, transposes, gathers;
written with :mod:`litegpu.codegen.ir`, so every dialect (WGSL included) renders them.

Every op here is one or a few *walks*: a loop nest over the elements written, where
each loop axis moves the source and the destination by a fixed stride. A transpose is
a walk with permuted source strides, a slice one with a base offset, a broadcast one
with stride 0, a reversal one with a negative stride; DEPTH_TO_SPACE walks a 6-D view
of its output. Source axes that a
stride cannot describe are *bounds*: padding (outside the input gives the fill value),
mirroring, a coordinate split into quotient and remainder (BATCH_TO_SPACE_ND's crops),
or a coordinate read from an index tensor (GATHER, GATHER_ND, EMBEDDING_LOOKUP).

Before a kernel is built a walk is simplified: size-1 axes go, and neighbouring axes that
step the same way merge, so a reshape becomes one flat loop and a concatenation on the
channel axis two. Each work-item then moves a chunk of the innermost axis (see
:func:`_cut`): four-lane loads and stores (``real4``, or the integer type's 4-lane
vector) when that axis is contiguous on both sides and a multiple of 4 long, 4x4 blocks
transposed in registers for transposes, else a short scalar loop. Four lanes are what
every dialect has, WGSL's ``vec4`` included.

Several outputs (SPLIT, SPLIT_V, UNPACK) or inputs (CONCATENATION, PACK) are one kernel
per output or input: each is a branch-free copy of its own columns.

The op's attributes and index arithmetic come from :mod:`litegpu.ops.shape` (its
normalized strided-slice plan, paddings, split sizes, gather dimensions, block shapes):
nothing here re-derives LiteRT's rules. WGSL has no 64-bit integers: int64 tensors
decline there, except constant int64 gather indices, which are uploaded as int32 (they
are checked in range, so they fit).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from litegpu.ops import normalize_axis, value_of
from litegpu.ops.registry import DynamicShape
from litegpu.ops.shape import (  # the single source of LiteRT's index rules
    block_and_pairs, gather_dims, mirror_pad_widths, pad_widths, reverse_axes, slice_bounds, split_sizes,
    split_v_sizes, strided_slice_plan, transpose_perm)

from .. import ir
from ..ir import Expr, call, logical_and, select
from ..nodegen import KernelSpec, NodeGen, strides_of
from . import Decline, generator

_F32 = np.dtype(np.float32)
_INT_LIMIT = 2 ** 31 - 1   # indices are C ints
# Elements of the innermost axis one work-item moves at most: on PoCL, 64 beat 16 by up
# to 2x on 800 KB copies (pad, depth-to-space, gather); fewer, longer work-items amortize
# the per-item index decoding.
_MAX_PER_ITEM = 64


def _prod(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


@dataclass
class Bound:
    """A source axis that strides cannot describe.

    Its coordinate starts as ``offset + sum(coord[j] * m for j, m in parts)`` over loop
    axes; with ``index`` set (the index tensor's
    :class:`~litegpu.codegen.ir.Buffer`) that expression is instead a position in the
    index tensor, whose value is the coordinate. ``mode`` then says what happens:

    - ``pad``: outside ``[0, size)`` the element is the fill value;
    - ``index``: likewise (an out-of-range index reads nothing and gives 0);
    - ``reflect`` / ``symmetric``: mirrored once at each end (MIRROR_PAD);
    - ``divmod``: ``x / block`` steps by ``stride`` and ``x % block`` by ``mod_stride``.
    """

    parts: list[tuple[int, int]]
    offset: int
    size: int
    stride: int
    mode: str
    index: ir.Buffer | None = None
    block: int = 1
    mod_stride: int = 0


@dataclass
class Walk:
    """A copy as a loop nest of ``shape``: per axis the source and destination strides.

    ``dst`` None means row-major over ``shape`` (the walk is the output's own order).
    """

    shape: list[int]
    src: list[int]
    dst: list[int] | None = None
    src_base: int = 0
    dst_base: int = 0
    bounds: list[Bound] = field(default_factory=list)


def _simplify(w: Walk) -> Walk:
    """The same walk with size-1 axes dropped and mergeable neighbours merged."""
    dst = list(w.dst) if w.dst is not None else strides_of(tuple(w.shape))
    keep = [j for j, d in enumerate(w.shape) if d != 1]
    renum = {j: k for k, j in enumerate(keep)}
    shape = [w.shape[j] for j in keep]
    src = [w.src[j] for j in keep]
    dst = [dst[j] for j in keep]
    bounds = [replace(b, parts=[(renum[j], m) for j, m in b.parts if j in renum]) for b in w.bounds]
    used = {j for b in bounds for j, _ in b.parts}
    # Merge from the inside out: axis a (outer) absorbs axis a+1 when both step contiguously.
    j = len(shape) - 2
    while j >= 0:
        inner = j + 1
        if j not in used and inner not in used and src[j] == src[inner] * shape[inner] \
                and dst[j] == dst[inner] * shape[inner]:
            shape[j] *= shape[inner]
            src[j], dst[j] = src[inner], dst[inner]
            del shape[inner], src[inner], dst[inner]
            # Axes after the merged one move down by one in the bounds' references.
            bounds = [replace(b, parts=[(a - 1 if a > inner else a, m) for a, m in b.parts]) for b in bounds]
            used = {a for b in bounds for a, _ in b.parts}
        j -= 1
    if not shape:
        shape, src, dst = [1], [0], [0]
    return Walk(shape, src, dst, w.src_base, w.dst_base, bounds)


def _literal(value, dtype: np.dtype) -> Expr:
    """``value`` as a literal of a ``dtype`` tensor's element (a ``real`` for float tensors)."""
    dtype = np.dtype(dtype)
    if dtype == _F32:
        return ir.lit(float(value), ir.REAL)
    v = int(np.asarray(value).astype(dtype))
    type_ = ir.Type(ir.scalar_of(dtype))
    if v == -2 ** 63:   # C has no literal of the smallest long: its negation overflows
        return ir.lit(v + 1, type_) - 1
    return ir.lit(v, type_)






def _affine(base: Expr | int, terms: list[tuple[Expr, int]]) -> Expr:
    """``base + sum(x * k)`` over (x, k) terms as an ``int``, zero terms dropped (``base``
    is a number or an ``int`` value)."""
    total = None if isinstance(base, int) and base == 0 else ir.as_expr(base, ir.INT)
    for x, k in terms:
        if k:
            total = ir.times(x, k) if total is None else total + ir.times(x, k)
    return ir.lit(0, ir.INT) if total is None else total


def _vector_store_ok(g: NodeGen, w: Walk, epilogue: bool) -> bool:
    """Whether four-element stores keep the epilogue right: a follower indexed per
    channel reads four consecutive channels, so each chunk must start a channel group."""
    if not epilogue:
        return True
    rows_aligned = w.dst_base % 4 == 0 and all(d % 4 == 0 for d in w.dst[:-1])
    out_shape = g.specs[g.out_tensor].shape
    channels = int(out_shape[-1]) if out_shape else 1
    channel_followers = any(f.kind == "channel" for f in g.followers)
    return rows_aligned and (channels % 4 == 0 or not channel_followers)


def _vector_run(inner: int) -> int:
    """Elements per work-item along an innermost axis of ``inner`` (a multiple of 4): the
    whole row when short, else the longest multiple of 4 dividing it."""
    if inner <= _MAX_PER_ITEM:
        return inner
    return next(k for k in range(_MAX_PER_ITEM, 0, -4) if inner % k == 0)


@dataclass
class _Shape:
    """How a simplified walk is cut into work-items (see :func:`walk_kernel`)."""

    mode: str           # "vector", "block" or "scalar"
    per_item: int       # elements of the innermost axis per work-item
    block_axis: int | None = None   # "block": the axis read contiguously, four at a time
    rows_per_item: int = 1          # "scalar": consecutive rows (of the next axis) per work-item

    def factor(self, axis: int, last: int) -> int:
        """How many consecutive coordinates of ``axis`` (not the innermost) one work-item covers."""
        if axis == self.block_axis:
            return 4
        return self.rows_per_item if axis == last - 1 else 1


def _cut(g: NodeGen, w: Walk, epilogue: bool) -> _Shape:
    """Pick the work-item shape of a walk.

    PoCL runs a work-group as loops over its work-items and only pays off with several
    elements per work-item: measured on a 800 KB tensor, one float per work-item is 4-10x
    slower than float4 chunks or short row loops. So each work-item takes a chunk of the
    innermost axis: up to 64 elements as float4s when it is contiguous on both sides;
    4x4 blocks transposed in registers when only another axis is contiguous in the source
    (NHWC <-> NCHW: 2x faster than strided scalar loads); else a loop of up to 64 scalars.
    """
    last = len(w.shape) - 1
    inner = w.shape[last]
    bounded = {j for b in w.bounds for j, _ in b.parts}
    if last not in bounded and w.dst[last] == 1 and inner % 4 == 0 and _vector_store_ok(g, w, epilogue):
        if w.src[last] == 1:
            return _Shape("vector", _vector_run(inner))
        for j in range(last):
            if j not in bounded and w.src[j] == 1 and w.shape[j] % 4 == 0:
                return _Shape("block", _vector_run(inner), j)
    if inner <= _MAX_PER_ITEM:
        # Short rows: several consecutive rows per work-item (NCHW -> NHWC of 3 channels:
        # 2x faster than one row each), when the next axis moves plainly.
        rows = 1
        if last >= 1 and last - 1 not in bounded:
            rows = max(r for r in range(1, _MAX_PER_ITEM // inner + 1) if w.shape[last - 1] % r == 0)
        return _Shape("scalar", inner, rows_per_item=rows)
    # A divisor of the row keeps every chunk whole (else the last one's loop stops short).
    return _Shape("scalar", next((k for k in range(_MAX_PER_ITEM, _MAX_PER_ITEM // 2 - 1, -1) if inner % k == 0),
                                 _MAX_PER_ITEM))


def walk_kernel(g: NodeGen, b: ir.KernelBuilder, w: Walk, src: ir.Buffer, pos: int = 0,
                fill: Expr | None = None) -> KernelSpec | None:
    """The kernel (built in ``b``) copying from ``src`` into output ``pos`` along ``w``.

    ``fill`` is the value of padded or out-of-range elements (of ``src``'s element type:
    ``real`` for float tensors; zero when omitted). Float stores of a single-output node
    go through the epilogue (fused activation, followers). Returns None when nothing is
    written.

    Work-items: dimension 0 is the chunk of the innermost walk axis (omitted when a row
    is one chunk), dimension 1 the row, i.e. the flat index over the other axes, decoded
    once per work-item (WGSL: both on one axis, see :func:`_row`); bounds that do not
    involve the innermost axis are hoisted too.
    """
    w = _simplify(w)
    total = _prod(w.shape)
    if total == 0:
        return None
    extent = sum(abs(s) * (d - 1) for s, d in zip(w.src, w.shape)) + abs(w.src_base) + total
    if max(extent, w.dst_base + total) > _INT_LIMIT:
        raise Decline("tensor too large for 32-bit indexing")
    epilogue = src.is_float and pos == 0 and len(g.ctx.node.outputs) == 1
    cut = _cut(g, w, epilogue)
    row = _row(b, w, cut, g.dialect.flat_launches)
    io = _Access(g, b, src, pos, fill, 1 if cut.mode == "scalar" else 4, epilogue)
    if cut.rows_per_item > 1:
        nxt = len(w.shape) - 2
        with b.for_("r", 0, cut.rows_per_item) as r:
            s1 = b.let("s1", _affine(row.s0, [(r, w.src[nxt])]))
            d1 = b.let("d1", _affine(row.d0, [(r, w.dst[nxt])]))
            _step_loop(b, w, cut, io, row, s1, d1)
    else:
        _step_loop(b, w, cut, io, row, row.s0, row.d0)
    return g.kernel(b, row.global_size)


@dataclass
class _Row:
    """What a work-item declares once for its row (see :func:`_row`)."""

    global_size: tuple[int, ...]
    ch: Expr | None          # the chunk of the innermost axis (None: a row is one chunk)
    coords: dict[int, Expr]  # the row's coordinates the offsets and bounds need, by axis
    s0: Expr                 # the row's source offset (bounds add to it)
    d0: Expr                 # the row's destination offset
    inb: Expr | None         # whether the row's fixed bounds hold (None: the walk checks nothing)


def _row(b: ir.KernelBuilder, w: Walk, cut: _Shape, flat: bool) -> _Row:
    """Declare the work-item's ids, its row's coordinates, the row's source and destination
    offsets and the bounds that stay fixed along the row; with the global size. ``flat``:
    the (chunk, row) grid is one axis."""
    last, inner = len(w.shape) - 1, w.shape[-1]
    chunks = -(-inner // cut.per_item)
    # Rows: the other axes, those a work-item covers several of counted in groups.
    row_shape = [d // cut.factor(j, last) for j, d in enumerate(w.shape[:last])]
    if chunks > 1 and flat:
        # WGSL groups work-items along axis 0 only: a 2-D launch of few chunks would run
        # tiny groups, and more than 65535 rows could not be dispatched.
        item = b.let("item", b.global_id(0))
        ch, row = b.let("ch", item % chunks), b.let("row", item / chunks)
        global_size = (chunks * _prod(row_shape),)
    elif chunks > 1:
        ch, row = b.let("ch", b.global_id(0)), b.let("row", b.global_id(1))
        global_size = (chunks, _prod(row_shape))
    else:
        ch, row = None, b.let("row", b.global_id(0))
        global_size = (_prod(row_shape),)
    # A side that walks in the output's own order needs no coordinates: its offset is row * inner.
    its, rs = strides_of(tuple(w.shape)), strides_of(tuple(row_shape))
    identity_src = cut.mode != "block" and w.src_base == 0 and list(w.src) == its
    identity_dst = cut.mode != "block" and w.dst_base == 0 and list(w.dst) == its
    row_size = inner * cut.rows_per_item
    needed = {j for bd in w.bounds for j, _ in bd.parts}
    if not identity_src:
        needed |= {j for j in range(last) if w.src[j]}
    if not identity_dst:
        needed |= {j for j in range(last) if w.dst[j]}
    coords: dict[int, Expr] = {}
    for j in sorted(needed - {last}):
        if len(row_shape) == 1:
            expr = row
        elif j == 0:
            expr = row / rs[0]
        elif rs[j] == 1:
            expr = row % row_shape[j]
        else:
            expr = row / rs[j] % row_shape[j]
        coords[j] = b.let(f"c{j}", ir.times(expr, cut.factor(j, last)))

    def offset(base: int, strides: list[int], identity: bool) -> Expr:
        if identity:
            return ir.times(row, row_size)
        return _affine(base, [(coords[j], strides[j]) for j in range(last) if strides[j]])

    s0 = b.var("s0", offset(w.src_base, w.src, identity_src))
    d0 = b.let("d0", offset(w.dst_base, w.dst, identity_dst))
    inb = b.var("inb", True, ir.BOOL) if _checked(w) else None
    _bounds(b, [bd for bd in w.bounds if all(j != last for j, _ in bd.parts)], coords, s0, inb, "o")
    return _Row(global_size, ch, coords, s0, d0, inb)


def _checked(w: Walk) -> bool:
    """Whether some element of the walk may lie outside the source (padding, indices)."""
    return any(bd.mode in ("pad", "index") for bd in w.bounds)


class _Access:
    """Loads and stores of one walk: one element or four consecutive ones, float or integer."""

    def __init__(self, g: NodeGen, b: ir.KernelBuilder, src: ir.Buffer, pos: int, fill: Expr | None,
                 lanes: int, epilogue: bool) -> None:
        self.g, self.b, self.src, self.pos, self.lanes, self.epilogue = g, b, src, pos, lanes, epilogue
        self.type = src.element().with_lanes(lanes)
        fill = fill if fill is not None else ir.lit(0, src.element())
        self.fill = fill if lanes == 1 else ir.vector(self.type, fill)

    def load(self, index: Expr, ok: Expr | None) -> Expr:
        """The element(s) at ``index``, or the fill value where ``ok`` is false (a scalar
        condition: C's ``?:``, which leaves an index outside the tensor unread; WGSL's
        ``select`` reads it, within the binding's bounds, as WebGPU's robust access does)."""
        value = self.src.load(index, self.lanes)
        return value if ok is None else select(ok, value, self.fill)

    def store(self, index: Expr, value: Expr) -> None:
        """Store ``value`` at ``index`` of the output (through the epilogue)."""
        if self.epilogue:
            self.g.store_output(self.b, index, value)
        else:
            self.b.store(self.g.output(self.b, self.pos), index, value)


def _step_loop(b: ir.KernelBuilder, w: Walk, cut: _Shape, io: _Access, row: _Row, s0: Expr, d0: Expr) -> None:
    """The work-item's steps along one row from source offset ``s0`` and destination
    offset ``d0``: one step, or a loop over its chunk of the innermost axis."""
    if cut.per_item == io.lanes:
        _step(b, w, cut, io, row, s0, d0, None)
        return
    inner = w.shape[-1]
    stop: Expr | int = cut.per_item
    if inner % cut.per_item:
        # The last chunk of the row is shorter: the loop stops at the row's end.
        stop = b.let("n", call("min", ir.lit(cut.per_item, ir.INT), inner - row.ch * cut.per_item))
    with b.for_("k", 0, stop, io.lanes) as k:
        _step(b, w, cut, io, row, s0, d0, k)


def _step(b: ir.KernelBuilder, w: Walk, cut: _Shape, io: _Access, row: _Row, s0: Expr, d0: Expr,
          k: Expr | None) -> None:
    """One step along the row (4 elements, a 4x4 block or 1 element): ``k`` is the loop
    counter over the work-item's chunk (None: the chunk is one step)."""
    last, inner = len(w.shape) - 1, w.shape[-1]
    start = row.ch * cut.per_item if inner > cut.per_item else None
    if k is None:
        pos = ir.lit(0, ir.INT) if start is None else start
    else:
        pos = k if start is None else start + k
    c_last = b.let(f"c{last}", pos)
    along = [bd for bd in w.bounds if any(j == last for j, _ in bd.parts)]
    s_value = _affine(s0, [(c_last, w.src[last])])
    s = b.var("s", s_value) if along else b.let("s", s_value)
    d = b.let("d", _affine(d0, [(c_last, w.dst[last])]))
    ok = row.inb
    if along:
        if ok is not None:
            ok = b.var("ok", ok)
        _bounds(b, along, {**row.coords, last: c_last}, s, ok, "i")
    if cut.mode == "block":
        # Four contiguous loads along the block axis, stored transposed along the row.
        step_t = w.dst[cut.block_axis]
        a = [b.let(f"a{r}", io.load(ir.plus(s, r * w.src[last]), ok)) for r in range(4)]
        for r in range(4):
            io.store(ir.plus(d, r * step_t), ir.vector(io.type, *(v.lane(r) for v in a)))
    else:
        v = b.let("v", io.load(s, ok))
        io.store(d, v)


def _bounds(b: ir.KernelBuilder, bounds: list[Bound], coords: dict[int, Expr], s: Expr, ok: Expr | None,
            tag: str) -> None:
    """Apply ``bounds`` at the coordinates ``coords``: each adds its step to the variable
    ``s`` and, for padding and indices, ands its range test into the variable ``ok``.
    ``tag`` keeps names unique."""
    for k, bd in enumerate(bounds):
        pos = _affine(bd.offset, [(coords[j], m) for j, m in bd.parts])
        if bd.index is not None:
            r = b.let(f"r{tag}{k}", bd.index.load(pos))
            b.assign(ok, logical_and(logical_and(ok, r >= 0), r < bd.size))
            x = b.let(f"x{tag}{k}", select(ok, r.cast(ir.INT), 0))
        elif bd.mode in ("reflect", "symmetric"):
            x = b.var(f"x{tag}{k}", pos)
        else:
            x = b.let(f"x{tag}{k}", pos)
        if bd.mode == "pad":
            b.assign(ok, logical_and(logical_and(ok, x >= 0), x < bd.size))
        elif bd.mode == "reflect":
            b.assign(x, select(x < 0, -x, x))
            b.assign(x, select(x >= bd.size, (2 * bd.size - 2) - x, x))
        elif bd.mode == "symmetric":
            b.assign(x, select(x < 0, -x - 1, x))
            b.assign(x, select(x >= bd.size, (2 * bd.size - 1) - x, x))
        if bd.mode == "divmod":
            b.assign(s, ir.times(x / bd.block, bd.stride) + ir.times(x % bd.block, bd.mod_stride), "+")
        else:
            b.assign(s, ir.times(x, bd.stride), "+")


def _kernels(*specs: KernelSpec | None) -> list[KernelSpec]:
    return [k for k in specs if k is not None]


def _const(g: NodeGen, pos: int, what: str) -> np.ndarray:
    """Input ``pos``'s constant value; a value known only at run time is declined."""
    try:
        return value_of(g.ctx.inputs[pos])
    except DynamicShape:
        raise Decline(f"{what} known only at run time") from None


def _in_shape(g: NodeGen, pos: int = 0) -> tuple[int, ...]:
    return tuple(int(d) for d in g.ctx.inputs[pos].shape)


def _out_shape(g: NodeGen, pos: int = 0) -> tuple[int, ...]:
    return tuple(int(d) for d in g.ctx.outputs[pos].shape)


def _dtype(g: NodeGen) -> np.dtype:
    return np.dtype(g.ctx.inputs[0].dtype)


def _one(g: NodeGen, w: Walk, fill: Expr | None = None) -> list[KernelSpec]:
    """The kernels of a node copying its input 0 into its one output along ``w``."""
    b = g.new_kernel()
    return _kernels(walk_kernel(g, b, w, g.input(b, 0), fill=fill))


#: The ops that are one plain walk of their input 0 in the output's order (no bounds, no
#: destination strides), by op: the walk of a node. Each is the op's generator, and a fused
#: region (:mod:`.region`) reads such a node's input through it.
WALKS: dict[str, Callable[[NodeGen], Walk]] = {}


def walk_source(w: Walk, index: Expr) -> Expr:
    """The source element that element ``index`` of a walk's output (a plain walk: no
    bounds, the output's own order) copies."""
    w = _simplify(w)
    terms: list[Expr] = []
    for j, (size, src, dst) in enumerate(zip(w.shape, w.src, w.dst)):
        if not src:
            continue
        coord = index if dst == 1 else index / dst
        if j:    # the outermost coordinate needs no wrap-around
            coord = coord % size
        terms.append(ir.times(coord, src))
    offset = ir.total(terms) if terms else ir.lit(0, ir.INT)
    return offset + w.src_base if w.src_base else offset


def walk(*ops: str):
    """Register the decorated function as the walk of ``ops`` and their generator."""
    def wrap(fn: Callable[[NodeGen], Walk]):
        for op in ops:
            WALKS[op] = fn
        generator(*ops, epilogue=True)(lambda g: _one(g, fn(g)))
        return fn
    return wrap


# -- copies ---------------------------------------------------------------------------------

@walk("RESHAPE", "SQUEEZE", "EXPAND_DIMS")
def reshape(g: NodeGen) -> Walk:
    """Same elements in the same order: one flat (vectorised) copy."""
    return Walk([_prod(_out_shape(g))], [1])


@walk("TRANSPOSE")
def transpose(g: NodeGen) -> Walk:
    """Output axis i walks input axis perm[i]; axes that stay together merge."""
    shape = _in_shape(g)
    perm = transpose_perm(len(shape), _const(g, 1, "the permutation"))
    strides = strides_of(shape)
    return Walk([shape[p] for p in perm], [strides[p] for p in perm])


@walk("REVERSE_V2")
def reverse(g: NodeGen) -> Walk:
    """Reversed axes walk backwards from their last element (negative stride)."""
    shape = _in_shape(g)
    value = _const(g, 1, "the axes")
    axes = reverse_axes(len(shape), value) if value.size else ()   # no axes: a plain copy
    strides = strides_of(shape)
    src = [-s if a in axes else s for a, s in enumerate(strides)]
    base = sum((shape[a] - 1) * strides[a] for a in axes)
    return Walk(list(shape), src, src_base=base)


@walk("BROADCAST_TO")
def broadcast_to(g: NodeGen) -> Walk:
    """Broadcast axes have source stride 0 (numpy rules: shapes aligned at the right)."""
    shape, out = _in_shape(g), _out_shape(g)
    full = (1,) * (len(out) - len(shape)) + shape
    strides = strides_of(full)
    return Walk(list(out), [0 if d == 1 else s for d, s in zip(full, strides)])


@walk("TILE")
def tile(g: NodeGen) -> Walk:
    """Each axis of the output splits into (repeat, original) with strides (0, stride)."""
    shape, out = _in_shape(g), _out_shape(g)
    strides = strides_of(shape)
    view, src = [], []
    for d, o, s in zip(shape, out, strides):
        view += [o // d if d else 0, d]
        src += [0, s]
    return Walk(view, src)


# -- slices ---------------------------------------------------------------------------------

@walk("SLICE")
def slice_(g: NodeGen) -> Walk:
    """A walk of the output's shape from the first selected element."""
    shape = _in_shape(g)
    bounds = slice_bounds(shape, _const(g, 1, "begin"), _const(g, 2, "size"))
    strides = strides_of(shape)
    return Walk([e - b for b, e in bounds], list(strides), src_base=sum(b * s for (b, _), s in zip(bounds, strides)))


@walk("STRIDED_SLICE")
def strided_slice(g: NodeGen) -> Walk:
    """LiteRT's plan (new axes inserted, per-axis index ranges) as start and step per axis;
    shrunk and new axes are size-1 axes of the walk, which simplification drops."""
    shape = _in_shape(g)
    eff_shape, indices, _ = strided_slice_plan(shape, _const(g, 1, "begin"), _const(g, 2, "end"),
                                               _const(g, 3, "strides"), g.attrs)
    strides = strides_of(tuple(eff_shape))
    view, src, base = [], [], 0
    for ix, s in zip(indices, strides):
        view.append(len(ix))
        if ix:
            base += ix[0] * s
            src.append((ix[1] - ix[0]) * s if len(ix) > 1 else 0)
        else:
            src.append(0)
    return Walk(view, src, src_base=base)


# -- DYNAMIC_UPDATE_SLICE -------------------------------------------------------------------

@generator("DYNAMIC_UPDATE_SLICE")
def dynamic_update_slice(g: NodeGen) -> list[KernelSpec]:
    """Two kernels: the operand copied whole, then one work-item per update element writing
    it at the start indices read when it runs, each clamped as
    :func:`litegpu.ops.shape.update_slice_start` clamps them (a decoder's KV-cache write: its
    position is an input of each step). A run that binds the operand and the result to one
    buffer (a KV cache updated where it lies) skips the copy (``copy_of``)."""
    return update_slice(g, lambda b, i: g.input(b, 1).load(i))


def update_slice(g: NodeGen, update_at: Callable[[ir.KernelBuilder, Expr], Expr]) -> list[KernelSpec]:
    """DYNAMIC_UPDATE_SLICE's kernels (see :func:`dynamic_update_slice`) with the update's
    element ``i`` given by ``update_at(b, i)``: loaded, or computed by a fused region
    (:mod:`.region`) whose nodes made the update."""
    shape, update = _in_shape(g, 0), _in_shape(g, 1)
    if np.dtype(g.ctx.inputs[2].dtype) == np.int64 and not g.dialect.int64:
        if g.ctx.inputs[2].value is None:
            raise Decline(f"int64 start indices known only at run time: {g.dialect.name} has no 64-bit integers")
    copy = g.new_kernel()
    whole = walk_kernel(g, copy, Walk(list(shape), list(strides_of(shape))), g.input(copy, 0))
    kernels = [whole and replace(whole, copy_of=(g.ctx.node.inputs[0], g.out_tensor))]
    total = _prod(update)
    if total:
        b = g.new_kernel()
        starts = _indices(g, b, 2)
        i = b.let("i", b.global_id(0))
        offset: Expr = ir.lit(0, ir.INT)
        rest = i
        for d in range(len(shape) - 1, -1, -1):
            start = b.let(f"s{d}", starts.load(d).cast(ir.INT))
            clamped = select(start < 0, 0, select(start > shape[d] - update[d], shape[d] - update[d], start))
            coord = rest % update[d] if d else rest
            offset = offset + (clamped + coord) * strides_of(shape)[d]
            if d:
                rest = rest / update[d]
        b.store(g.output(b), b.let("o", offset), update_at(b, i))
        kernels.append(g.kernel(b, (total,)))
    return _kernels(*kernels)


# -- joins and splits -----------------------------------------------------------------------

# Output elements up to which a join is one kernel picking each element's input (a
# decoder's cache indices joined from scalars: one launch where there were four).
_SMALL_JOIN = 4096


def _join(g: NodeGen, outer: int, widths: list[int]) -> list[KernelSpec]:
    """Inputs of ``outer`` rows of ``widths[k]`` elements side by side in the output:
    one kernel per input, each a copy into its columns; a small output
    (:data:`_SMALL_JOIN`) of several inputs is one kernel, a work-item per element."""
    total = sum(widths)
    if sum(1 for w in widths if w) > 1 and outer * total <= _SMALL_JOIN:
        return [_picked_join(g, outer, widths)]
    kernels, offset = [], 0
    for k, width in enumerate(widths):
        b = g.new_kernel()
        w = Walk([outer, width], [width, 1], [total, 1], dst_base=offset)
        kernels.append(walk_kernel(g, b, w, g.input(b, k)))
        offset += width
    return _kernels(*kernels)


def _picked_join(g: NodeGen, outer: int, widths: list[int]) -> KernelSpec:
    """:func:`_join` as one kernel: each work-item copies its element from the input its
    column falls in (:func:`picked`)."""
    total = sum(widths)
    b = g.new_kernel()
    i = b.let("i", b.global_id(0))
    row, col = b.let("row", i / total), b.let("col", i % total)
    value = picked(col, widths, lambda k, at: b.let("v", g.input(b, k).load(row * widths[k] + at)))
    out = g.output(b)
    if out.is_float and len(g.ctx.node.outputs) == 1:
        g.store_output(b, i, value)
    else:
        b.store(out, i, value)
    return g.kernel(b, (outer * total,))


def picked(along: Expr, widths: list[int], value_at: Callable[[int, Expr], Expr]) -> Expr:
    """The element of a join at position ``along`` of the joined axis (inputs ``widths``
    wide along it): ``value_at(k, at)`` of input ``k``, at ``at`` along its own axis, for
    the input ``along`` falls in. Every non-empty input is read, at a position clamped into
    it (a branch not chosen reads in bounds), and the one wanted selected."""
    picks, start = [], 0
    for k, width in enumerate(widths):
        if width:
            at = along - start
            clamped = select(at < 0, ir.lit(0, ir.INT), select(at > width - 1, ir.lit(width - 1, ir.INT), at))
            picks.append((start, value_at(k, clamped)))
        start += width
    value = picks[-1][1]
    for (begin, _), (_, before) in zip(reversed(picks[1:]), reversed(picks[:-1])):
        value = select(along < begin, before, value)
    return value


def _split_from(g: NodeGen, outer: int, total: int, widths: list[int], x: int) -> list[KernelSpec]:
    """The reverse of :func:`_join`: output k is ``widths[k]`` columns of each of the
    ``outer`` rows (``total`` wide) of input ``x``; one kernel per output."""
    kernels, offset = [], 0
    for k, width in enumerate(widths):
        b = g.new_kernel()
        w = Walk([outer, width], [total, 1], src_base=offset)
        kernels.append(walk_kernel(g, b, w, g.input(b, x), pos=k))
        offset += width
    return _kernels(*kernels)


@generator("CONCATENATION", epilogue=True)
def concatenation(g: NodeGen) -> list[KernelSpec]:
    """Rows of the axis and everything inside it, side by side (the fused activation is
    already NONE in the attrs: LiteRT ignores it)."""
    shape = _out_shape(g)
    axis = normalize_axis(g.attrs["axis"], len(shape), "CONCATENATION axis")
    inner = _prod(shape[axis + 1:])
    return _join(g, _prod(shape[:axis]), [int(s.shape[axis]) * inner for s in g.ctx.inputs])


@generator("PACK", epilogue=True)
def pack(g: NodeGen) -> list[KernelSpec]:
    """A concatenation of the inputs along a new axis."""
    shape = _in_shape(g)
    axis = normalize_axis(g.attrs["axis"], len(shape) + 1, "PACK axis")
    inner = _prod(shape[axis:])
    return _join(g, _prod(shape[:axis]), [inner] * len(g.ctx.inputs))


@generator("UNPACK")
def unpack(g: NodeGen) -> list[KernelSpec]:
    """Output k is slice k of the axis: one kernel per output."""
    shape = _in_shape(g)
    axis = normalize_axis(g.attrs["axis"], len(shape), "UNPACK axis")
    inner = _prod(shape[axis + 1:])
    return _split_from(g, _prod(shape[:axis]), shape[axis] * inner, [inner] * shape[axis], 0)


@generator("SPLIT")
def split(g: NodeGen) -> list[KernelSpec]:
    """Equal parts along the axis in input 0: one kernel per output."""
    shape = _in_shape(g, 1)
    axis, sizes = split_sizes(shape, _const(g, 0, "the axis"), g.attrs["num_splits"])
    inner = _prod(shape[axis + 1:])
    return _split_from(g, _prod(shape[:axis]), shape[axis] * inner, [s * inner for s in sizes], 1)


@generator("SPLIT_V")
def split_v(g: NodeGen) -> list[KernelSpec]:
    """Parts of the sizes in input 1 along the axis in input 2: one kernel per output."""
    shape = _in_shape(g)
    axis, sizes = split_v_sizes(shape, _const(g, 1, "the sizes"), _const(g, 2, "the axis"),
                                g.attrs["num_splits"])
    inner = _prod(shape[axis + 1:])
    return _split_from(g, _prod(shape[:axis]), shape[axis] * inner, [s * inner for s in sizes], 0)


# -- padding --------------------------------------------------------------------------------

def _padded_walk(shape: tuple[int, ...], out: tuple[int, ...], pads: list[tuple[int, int]], mode: str) -> Walk:
    """The output's walk: unpadded axes are strides, padded ones bounds of ``mode``."""
    strides = strides_of(shape)
    src, bounds = [], []
    for a, ((lo, hi), d, s) in enumerate(zip(pads, shape, strides)):
        if lo == 0 and hi == 0:
            src.append(s)
        else:
            src.append(0)
            bounds.append(Bound([(a, 1)], -lo, d, s, mode))
    return Walk(list(out), src, bounds=bounds)


@generator("PAD", "PADV2", epilogue=True)
def pad(g: NodeGen) -> list[KernelSpec]:
    """Outside the input: the constant (PADV2's input 2, else the zero point)."""
    shape, dtype = _in_shape(g), _dtype(g)
    pads = pad_widths(shape, _const(g, 1, "the paddings"), "PAD")
    b = g.new_kernel()
    src = g.input(b, 0)
    if g.ctx.node.op == "PADV2":
        spec = g.ctx.inputs[2]
        if spec.value is not None:
            fill = _literal(np.asarray(spec.value).reshape(-1)[0], dtype)
        else:   # read at run time, by every padded element
            fill = g.input(b, 2).load(0)
    else:
        fill = _literal(g.attrs.get("pad_value", 0), dtype)
    return _kernels(walk_kernel(g, b, _padded_walk(shape, _out_shape(g), pads, "pad"), src, fill=fill))


@generator("MIRROR_PAD", epilogue=True)
def mirror_pad(g: NodeGen) -> list[KernelSpec]:
    """Padded coordinates mirror back into the input (REFLECT skips the edge)."""
    shape, mode = _in_shape(g), g.attrs["mode"]
    pads = mirror_pad_widths(shape, _const(g, 1, "the paddings"), mode)
    return _one(g, _padded_walk(shape, _out_shape(g), pads, mode.lower()))


# -- depth, space and batch -----------------------------------------------------------------

@generator("DEPTH_TO_SPACE", epilogue=True)
def depth_to_space(g: NodeGen) -> list[KernelSpec]:
    """The output as (n, h, by, w, bx, c) reads input (n, h, w, by, bx, c)."""
    n, h, w, c = _in_shape(g)
    bs = g.attrs["block_size"]
    co = c // (bs * bs)
    return _one(g, Walk([n, h, bs, w, bs, co], [h * w * c, w * c, bs * co, c, co, 1]))


@generator("SPACE_TO_DEPTH", epilogue=True)
def space_to_depth(g: NodeGen) -> list[KernelSpec]:
    """The output as (n, h/bs, w/bs, by, bx, c) reads input (n, h/bs, by, w/bs, bx, c)."""
    n, h, w, c = _in_shape(g)
    bs = g.attrs["block_size"]
    return _one(g, Walk([n, h // bs, w // bs, bs, bs, c], [h * w * c, bs * w * c, bs * c, w * c, c, 1]))


def _block_input(g: NodeGen, what: str):
    shape = _in_shape(g)
    block, pairs = block_and_pairs(shape, _const(g, 1, "block_shape"), _const(g, 2, "paddings/crops"), what)
    return shape, block, pairs


@generator("SPACE_TO_BATCH_ND", epilogue=True)
def space_to_batch(g: NodeGen) -> list[KernelSpec]:
    """The output as (b1..bM, n, q1..qM, rest): spatial input coordinate i is
    ``q_i * B_i + b_i - pad_i``, padded with the zero point outside the input."""
    shape, block, pads = _block_input(g, "SPACE_TO_BATCH_ND")
    m = len(block)
    strides = strides_of(shape)
    out = _out_shape(g)
    rest = _prod(shape[1 + m:])
    view = list(block) + [shape[0]] + list(out[1:1 + m]) + [rest]
    src = [0] * m + [strides[0]] + [0] * m + [1]
    bounds = []
    for i, (b, (lo, hi)) in enumerate(zip(block, pads)):
        s = strides[1 + i]
        if lo == 0 and hi == 0:
            src[i], src[m + 1 + i] = s, b * s
        else:
            bounds.append(Bound([(m + 1 + i, b), (i, 1)], -lo, shape[1 + i], s, "pad"))
    fill = _literal(g.attrs.get("pad_value", 0), _dtype(g))
    return _one(g, Walk(view, src, bounds=bounds), fill)


@generator("BATCH_TO_SPACE_ND", epilogue=True)
def batch_to_space(g: NodeGen) -> list[KernelSpec]:
    """Output spatial coordinate y_i is ``y_i + crop_i`` of the uncropped space, whose
    quotient by B_i is the input's coordinate and remainder its place in the batch."""
    shape, block, crops = _block_input(g, "BATCH_TO_SPACE_ND")
    m = len(block)
    strides = strides_of(shape)
    out = _out_shape(g)
    batch = out[0]
    view = [batch] + list(out[1:1 + m]) + [_prod(shape[1 + m:])]
    src = [strides[0]] + [0] * m + [1]
    bounds = []
    base = 0
    for i, (b, (lo, _)) in enumerate(zip(block, crops)):
        s = strides[1 + i]
        if b == 1:
            src[1 + i] = s
            base += lo * s
        else:
            # Batch entry (b1, ..., bM, n) sits at ((b1 * B2 + b2) ...) * N + n.
            batch_step = _prod(block[i + 1:]) * batch * strides[0]
            bounds.append(Bound([(1 + i, 1)], lo, shape[1 + i], s, "divmod", block=b, mod_stride=batch_step))
    return _one(g, Walk(view, src, src_base=base, bounds=bounds))


# -- gathers --------------------------------------------------------------------------------

def _check_const_indices(g: NodeGen, pos: int, limits: list[int] | int, what: str) -> None:
    """Indices out of range are declined: on cpu they raise LiteRT's error. Run-time
    indices could be, so they are declined too (the kernel has no way to report one)."""
    spec = g.ctx.inputs[pos]
    if spec.value is None:
        raise Decline(f"{what} indices known only at run time: cpu checks them against LiteRT's bounds")
    ix = np.asarray(spec.value).astype(np.int64)
    if isinstance(limits, int):
        bad = ix.size and (ix.min() < 0 or ix.max() >= limits)
    else:
        rows = ix.reshape(-1, len(limits)) if limits else ix.reshape(-1, 0)
        bad = rows.size and bool(((rows < 0) | (rows >= np.array(limits))).any())
    if bad:
        raise Decline(f"{what} has an index out of range")


def _indices(g: NodeGen, b: ir.KernelBuilder, pos: int) -> ir.Buffer:
    """The index tensor, input ``pos``, as a parameter of ``b``'s kernel. WGSL has no
    64-bit integers: there int64 indices (constant and in range, see
    :func:`_check_const_indices`) are uploaded as int32."""
    spec = g.ctx.inputs[pos]
    if np.dtype(spec.dtype) == np.int64 and not g.dialect.int64:
        return g.const(b, np.asarray(spec.value).astype(np.int32))
    return g.input(b, pos)


@generator("GATHER", epilogue=True)
def gather(g: NodeGen) -> list[KernelSpec]:
    """The output as (batch, outer, index, inner): the axis coordinate is read from the
    indices at (batch, index). Only constant, in-range indices come here (see
    _check_const_indices)."""
    p, ix = _in_shape(g, 0), _in_shape(g, 1)
    axis, bd = gather_dims(p, ix, g.attrs)
    _check_const_indices(g, 1, p[axis], "GATHER")
    nb, outer, count = _prod(p[:bd]), _prod(p[bd:axis]), _prod(ix[bd:])
    limit, inner = p[axis], _prod(p[axis + 1:])
    b = g.new_kernel()
    idx = _indices(g, b, 1)
    w = Walk([nb, outer, count, inner], [outer * limit * inner, limit * inner, 0, 1],
             bounds=[Bound([(0, count), (2, 1)], 0, limit, inner, "index", idx)])
    return _kernels(walk_kernel(g, b, w, g.input(b, 0)))


@generator("EMBEDDING_LOOKUP", epilogue=True)
def embedding_lookup(g: NodeGen) -> list[KernelSpec]:
    """Row ids[i] of the table for each id (GATHER along axis 0)."""
    ids, table = _in_shape(g, 0), _in_shape(g, 1)
    _check_const_indices(g, 0, table[0], "EMBEDDING_LOOKUP")
    inner = _prod(table[1:])
    b = g.new_kernel()
    idx = _indices(g, b, 0)
    w = Walk([ids[0], inner], [0, 1], bounds=[Bound([(0, 1)], 0, table[0], inner, "index", idx)])
    return _kernels(walk_kernel(g, b, w, g.input(b, 1)))


@generator("GATHER_ND", epilogue=True)
def gather_nd(g: NodeGen) -> list[KernelSpec]:
    """The output as (index row, inner): each of the row's ``depth`` indices steps its
    params axis; the slice after them is copied whole."""
    p, ix = _in_shape(g, 0), _in_shape(g, 1)
    depth = ix[-1]
    _check_const_indices(g, 1, list(p[:depth]), "GATHER_ND")
    strides = strides_of(p)
    rows, inner = _prod(ix[:-1]), _prod(p[depth:])
    b = g.new_kernel()
    idx = _indices(g, b, 1)
    bounds = [Bound([(0, depth)], j, p[j], strides[j], "index", idx) for j in range(depth)]
    return _kernels(walk_kernel(g, b, Walk([rows, inner], [0, 1], bounds=bounds), g.input(b, 0)))
