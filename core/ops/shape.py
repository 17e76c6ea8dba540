"""Shape, layout and indexing ops: data movement, generic over dtype.

Every op here moves or selects elements without arithmetic on them, so each reference
is plain numpy that works for float32, int32, int64, bool and int8 alike. When an
output shape depends on the *value* of an input (RESHAPE's shape, TRANSPOSE's perm,
STRIDED_SLICE's begin/end/strides, ...), ``infer`` reads it with :func:`value_of`,
which raises :class:`DynamicShape` when the value is unknown before running.

Semantics follow LiteRT's builtin kernels (which follow TensorFlow), including its
index clamping rules for STRIDED_SLICE. Values that make a model invalid raise
:class:`ModelFormatError`; out-of-range indices met while running (GATHER, GATHER_ND)
raise :class:`ExecutionError` rather than reading outside the input.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..errors import ExecutionError, ModelFormatError, UnsupportedError
from ..graph import Node, Tensor
from .registry import (TensorSpec, activation_attr, apply_activation, check_inputs, need_rank,
                       normalize_axis, register, OpDef, value_of)

_INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))


# -- small helpers -----------------------------------------------------------------------

def _ints(value: np.ndarray) -> list[int]:
    """A (possibly 0-d) integer array as a flat list of Python ints."""
    return [int(v) for v in np.asarray(value).reshape(-1)]


def _scalar_int(value: np.ndarray, what: str) -> int:
    """The single integer held by ``value`` (a scalar or a one-element tensor)."""
    flat = np.asarray(value).reshape(-1)
    if flat.size != 1:
        raise ModelFormatError(f"{what} must hold one value, has {flat.size}")
    return int(flat[0])


def _prod(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _opt(node: Node, name: str, default):
    """A raw option, falling back to ``default`` when the options table or field is absent."""
    value = node.options.get(name, default)
    return default if value is None else value


def _check_outputs(node: Node, n: int) -> None:
    if len(node.outputs) != n:
        raise ModelFormatError(f"expects {n} outputs, has {len(node.outputs)}")


def _present(node: Node, *positions: int) -> None:
    """Raise unless the inputs at ``positions`` are given (not the -1 'omitted' marker)."""
    for i in positions:
        if node.inputs[i] < 0:
            raise ModelFormatError(f"input {i} is required but omitted")


def _index_input(node: Node, tensors: Sequence[Tensor], i: int, what: str) -> None:
    """Raise unless input ``i`` (an index/shape operand) is int32 or int64."""
    dtype = tensors[node.inputs[i]].dtype
    if dtype not in _INDEX_DTYPES:
        raise ModelFormatError(f"{what} (input {i}) must be int32 or int64, is {dtype}")


def _plain_attrs(n_in: int, n_out: int = 1, index_inputs: dict[int, str] | None = None):
    """An attrs function for ops without options: check input/output counts and index dtypes."""
    def attrs(node: Node, tensors: Sequence[Tensor]) -> dict:
        check_inputs(node, n_in)
        _present(node, *range(n_in))
        _check_outputs(node, n_out)
        for i, what in (index_inputs or {}).items():
            _index_input(node, tensors, i, what)
        return {}
    return attrs


def _zero_point(node: Node, tensors: Sequence[Tensor]) -> int:
    """The output's zero point: the value that means 0 in a quantized tensor (PAD fills with it)."""
    q = tensors[node.outputs[0]].quantization
    if q is not None and q.is_set and q.zero_points.size:
        return int(q.zero_points.reshape(-1)[0])
    return 0


def _same_quantization(a: Tensor, b: Tensor) -> bool:
    qa, qb = a.quantization, b.quantization
    set_a = qa is not None and qa.is_set
    set_b = qb is not None and qb.is_set
    if not (set_a or set_b):
        return True
    if set_a != set_b:
        return False
    return (np.array_equal(qa.scales, qb.scales) and np.array_equal(qa.zero_points, qb.zero_points))


def _check_no_requantize(node: Node, tensors: Sequence[Tensor], inputs: Sequence[int]) -> None:
    """Ops that LiteRT implements with a requantization step when scales differ are not ours yet."""
    out = tensors[node.outputs[0]]
    for i in inputs:
        if not _same_quantization(tensors[i], out):
            raise UnsupportedError(f"input tensor {i} and the output have different quantization "
                                   "(requantizing data movement is not supported)")


def _op(name: str, attrs, infer, reference, doc: str) -> OpDef:
    return register(OpDef(name=name, attrs=attrs, infer=infer, reference=reference, doc=doc))


# -- RESHAPE, SQUEEZE, EXPAND_DIMS -------------------------------------------------------

def _reshape_attrs(node: Node, tensors: Sequence[Tensor]) -> dict:
    check_inputs(node, 1, 2)
    _present(node, 0)
    _check_outputs(node, 1)
    # LiteRT takes the shape from input 1 only when it is a 1-D int32 tensor; otherwise it
    # falls back to the options (where a legacy [0] means "scalar").
    use_input = False
    if len(node.inputs) == 2 and node.inputs[1] >= 0:
        shape_t = tensors[node.inputs[1]]
        use_input = len(shape_t.shape) == 1 and shape_t.dtype == np.int32
    new_shape = tuple(int(d) for d in (_opt(node, "new_shape", None) or ()))
    if new_shape == (0,):
        new_shape = ()
    return {"shape_from_input": use_input, "new_shape": new_shape}


def _resolve_reshape(in_shape: Sequence[int], shape: Sequence[int]) -> tuple[int, ...]:
    """The target shape with its one ``-1`` dimension inferred; element counts must match."""
    n_in = _prod(in_shape)
    out = [int(d) for d in shape]
    stretch = None
    known = 1
    for i, d in enumerate(out):
        if d == -1:
            if stretch is not None:
                raise ModelFormatError(f"reshape target {out} has more than one -1")
            stretch = i
        elif d < 0:
            raise ModelFormatError(f"reshape target {out} has negative dimension {d}")
        else:
            known *= d
    if stretch is not None:
        if known == 0:
            if n_in != 0:
                raise ModelFormatError(f"cannot infer -1 in reshape target {out} for {n_in} elements")
            # LiteRT: with no elements, -1 takes what the non-zero dims leave ([0, 3, 4] to [0, -1]: 12).
            nonzero_in = _prod([d for d in in_shape if d])
            nonzero_out = _prod([d for i, d in enumerate(out) if d and i != stretch])
            out[stretch] = nonzero_in // nonzero_out if nonzero_in % nonzero_out == 0 else 0
        else:
            out[stretch] = n_in // known
    if _prod(out) != n_in:
        raise ModelFormatError(f"cannot reshape {list(in_shape)} ({n_in} elements) to {out}")
    return tuple(out)


def _reshape_target(inputs: list, attrs: dict) -> list[int]:
    # As LiteRT, a shape input resized away from 1-D falls back to the options.
    if attrs["shape_from_input"] and len(inputs[1].shape) == 1:
        return _ints(value_of(inputs[1]))
    return list(attrs["new_shape"])


def _reshape_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    x = inputs[0]
    return [TensorSpec(_resolve_reshape(x.shape, _reshape_target(inputs, attrs)), x.dtype)]


def _reshape_ref(inputs: list[np.ndarray], attrs: dict) -> list[np.ndarray]:
    x = inputs[0]
    target = _ints(inputs[1]) if attrs["shape_from_input"] and np.ndim(inputs[1]) == 1 \
        else list(attrs["new_shape"])
    return [np.reshape(x, _resolve_reshape(x.shape, target))]


_op("RESHAPE", _reshape_attrs, _reshape_infer, _reshape_ref,
    "Same elements, new shape (from input 1 when it is a 1-D int32 tensor, else the options).")


def _squeeze_attrs(node: Node, tensors: Sequence[Tensor]) -> dict:
    check_inputs(node, 1)
    _present(node, 0)
    _check_outputs(node, 1)
    return {"squeeze_dims": tuple(int(d) for d in (_opt(node, "squeeze_dims", None) or ()))}


def _squeeze_shape(shape: tuple[int, ...], dims: Sequence[int]) -> tuple[int, ...]:
    rank = len(shape)
    if not dims:
        return tuple(d for d in shape if d != 1)
    drop = set()
    for d in dims:
        axis = normalize_axis(d, rank, "squeeze dim")
        if shape[axis] != 1:
            raise ModelFormatError(f"cannot squeeze dimension {d} of size {shape[axis]} in {list(shape)}")
        drop.add(axis)
    return tuple(s for i, s in enumerate(shape) if i not in drop)


def _squeeze_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    x = inputs[0]
    return [TensorSpec(_squeeze_shape(x.shape, attrs["squeeze_dims"]), x.dtype)]


def _squeeze_ref(inputs: list[np.ndarray], attrs: dict) -> list[np.ndarray]:
    x = inputs[0]
    return [np.reshape(x, _squeeze_shape(x.shape, attrs["squeeze_dims"]))]


_op("SQUEEZE", _squeeze_attrs, _squeeze_infer, _squeeze_ref,
    "Drop the listed size-1 dimensions (all of them when the list is empty).")


def _expand_axis(rank: int, axis_value: np.ndarray) -> int:
    axis = _scalar_int(axis_value, "EXPAND_DIMS axis")
    if not -rank - 1 <= axis <= rank:
        raise ModelFormatError(f"EXPAND_DIMS axis {axis} out of range for rank {rank}")
    return axis + rank + 1 if axis < 0 else axis


def _expand_dims_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    x = inputs[0]
    axis = _expand_axis(len(x.shape), value_of(inputs[1]))
    return [TensorSpec(x.shape[:axis] + (1,) + x.shape[axis:], x.dtype)]


def _expand_dims_ref(inputs: list[np.ndarray], attrs: dict) -> list[np.ndarray]:
    x = inputs[0]
    return [np.expand_dims(x, _expand_axis(x.ndim, inputs[1]))]


_op("EXPAND_DIMS", _plain_attrs(2, index_inputs={1: "axis"}), _expand_dims_infer, _expand_dims_ref,
    "Insert a size-1 dimension at the axis given by input 1 (negative counts from the end).")


# -- CONCATENATION, PACK, UNPACK, SPLIT, SPLIT_V -----------------------------------------

def _concat_attrs(node: Node, tensors: Sequence[Tensor]) -> dict:
    if len(node.inputs) < 1:
        raise ModelFormatError("expects at least 1 input, has 0")
    _present(node, *range(len(node.inputs)))
    _check_outputs(node, 1)
    # (Inputs on other scales than the output are rescaled by the integer reference.)
    # LiteRT's builtin CONCATENATION kernel refuses a fused activation; its default
    # (XNNPACK) path takes float32 nodes and ignores it (checked against ai_edge_litert:
    # RELU leaves negatives in place). So the normalized activation is always NONE; the
    # declared one is kept for reports, and non-float nodes with one are refused as LiteRT does.
    declared = activation_attr(node.options)
    dtype = tensors[node.outputs[0]].dtype
    if declared != "NONE" and dtype != np.float32:
        raise UnsupportedError(f"fused activation {declared} on a {dtype} CONCATENATION")
    return {"axis": int(_opt(node, "axis", 0)), "activation": "NONE", "declared_activation": declared}


def _concat_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    first = inputs[0]
    rank = len(first.shape)
    axis = normalize_axis(attrs["axis"], rank, "CONCATENATION axis")
    total = 0
    for spec in inputs:
        if spec.dtype != first.dtype:
            raise ModelFormatError(f"CONCATENATION inputs mix {first.dtype} and {spec.dtype}")
        same = len(spec.shape) == rank and all(
            a == b for i, (a, b) in enumerate(zip(spec.shape, first.shape)) if i != axis)
        if not same:
            raise ModelFormatError(f"CONCATENATION inputs {list(first.shape)} and {list(spec.shape)} "
                                   f"differ outside axis {axis}")
        total += spec.shape[axis]
    return [TensorSpec(first.shape[:axis] + (total,) + first.shape[axis + 1:], first.dtype)]


def _concat_ref(inputs: list[np.ndarray], attrs: dict) -> list[np.ndarray]:
    axis = normalize_axis(attrs["axis"], inputs[0].ndim, "CONCATENATION axis")
    y = np.concatenate(inputs, axis=axis)
    return [apply_activation(y, attrs["activation"]).astype(inputs[0].dtype, copy=False)]


_op("CONCATENATION", _concat_attrs, _concat_infer, _concat_ref,
    "Join inputs along an axis (negative counts from the end), then the fused activation.")


def _pack_attrs(node: Node, tensors: Sequence[Tensor]) -> dict:
    count = int(_opt(node, "values_count", 0))
    if count < 1 or len(node.inputs) != count:
        raise ModelFormatError(f"values_count {count} does not match {len(node.inputs)} inputs")
    _present(node, *range(count))
    _check_outputs(node, 1)
    _check_no_requantize(node, tensors, node.inputs)
    return {"axis": int(_opt(node, "axis", 0)), "count": count}


def _pack_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    first = inputs[0]
    for spec in inputs:
        if spec.shape != first.shape or spec.dtype != first.dtype:
            raise ModelFormatError(f"PACK inputs differ: {list(first.shape)} {first.dtype} vs "
                                   f"{list(spec.shape)} {spec.dtype}")
    axis = normalize_axis(attrs["axis"], len(first.shape) + 1, "PACK axis")
    return [TensorSpec(first.shape[:axis] + (len(inputs),) + first.shape[axis:], first.dtype)]


def _pack_ref(inputs: list[np.ndarray], attrs: dict) -> list[np.ndarray]:
    axis = normalize_axis(attrs["axis"], inputs[0].ndim + 1, "PACK axis")
    return [np.stack(inputs, axis=axis)]


_op("PACK", _pack_attrs, _pack_infer, _pack_ref, "Stack equally shaped inputs along a new axis.")


def _unpack_attrs(node: Node, tensors: Sequence[Tensor]) -> dict:
    check_inputs(node, 1)
    _present(node, 0)
    count = int(_opt(node, "num", 0))
    if count < 1:
        raise ModelFormatError(f"UNPACK num must be positive, is {count}")
    _check_outputs(node, count)
    return {"axis": int(_opt(node, "axis", 0)), "count": count}


def _unpack_axis(shape: tuple[int, ...], attrs: dict) -> int:
    axis = normalize_axis(attrs["axis"], len(shape), "UNPACK axis")
    if shape[axis] != attrs["count"]:
        raise ModelFormatError(f"UNPACK num {attrs['count']} != dimension {axis} of {list(shape)}")
    return axis


def _unpack_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    x = inputs[0]
    axis = _unpack_axis(x.shape, attrs)
    out = x.shape[:axis] + x.shape[axis + 1:]
    return [TensorSpec(out, x.dtype) for _ in range(attrs["count"])]


def _unpack_ref(inputs: list[np.ndarray], attrs: dict) -> list[np.ndarray]:
    x = inputs[0]
    axis = _unpack_axis(x.shape, attrs)
    return [np.take(x, i, axis=axis) for i in range(attrs["count"])]


_op("UNPACK", _unpack_attrs, _unpack_infer, _unpack_ref, "Split along an axis into its slices, dropping it.")


def _split_attrs(value_input: int, n_inputs: int, index_inputs: dict[int, str]):
    def attrs(node: Node, tensors: Sequence[Tensor]) -> dict:
        check_inputs(node, n_inputs)
        _present(node, *range(n_inputs))
        n = int(_opt(node, "num_splits", 0))
        if n < 1:
            raise ModelFormatError(f"num_splits must be positive, is {n}")
        _check_outputs(node, n)
        for i, what in index_inputs.items():
            _index_input(node, tensors, i, what)
        return {"num_splits": n}
    return attrs


def split_sizes(shape: tuple[int, ...], axis_value: np.ndarray, n: int) -> tuple[int, list[int]]:
    """SPLIT's normalized axis and the size of each of its ``n`` outputs along it.

    ``axis_value`` is the axis tensor (input 0). Raises ModelFormatError when the axis is
    out of range or its dimension is not divisible by ``n``.
    """
    axis = normalize_axis(_scalar_int(axis_value, "SPLIT axis"), len(shape), "SPLIT axis")
    if shape[axis] % n:
        raise ModelFormatError(f"SPLIT: dimension {axis} of {list(shape)} is not divisible by {n}")
    return axis, [shape[axis] // n] * n


def split_v_sizes(shape: tuple[int, ...], sizes_value: np.ndarray, axis_value: np.ndarray,
                  n: int) -> tuple[int, list[int]]:
    """SPLIT_V's normalized axis and the size of each of its ``n`` outputs along it.

    ``sizes_value`` is size_splits (input 1; one entry may be -1, meaning the rest) and
    ``axis_value`` the axis tensor (input 2). The returned sizes sum to the dimension.
    """
    axis = normalize_axis(_scalar_int(axis_value, "SPLIT_V axis"), len(shape), "SPLIT_V axis")
    sizes = _ints(sizes_value)
    if len(sizes) != n:
        raise ModelFormatError(f"SPLIT_V: {len(sizes)} size_splits for num_splits {n}")
    unknown = [i for i, s in enumerate(sizes) if s == -1]
    if len(unknown) > 1 or any(s < -1 for s in sizes):
        raise ModelFormatError(f"SPLIT_V: invalid size_splits {sizes}")
    known = sum(s for s in sizes if s != -1)
    if unknown:
        if known > shape[axis]:
            raise ModelFormatError(f"SPLIT_V: size_splits {sizes} exceed dimension {shape[axis]}")
        sizes[unknown[0]] = shape[axis] - known
    elif known != shape[axis]:
        raise ModelFormatError(f"SPLIT_V: size_splits {sizes} do not sum to dimension {shape[axis]}")
    return axis, sizes


def _split_outputs(x: TensorSpec, axis: int, sizes: list[int]) -> list[TensorSpec]:
    return [TensorSpec(x.shape[:axis] + (s,) + x.shape[axis + 1:], x.dtype) for s in sizes]


def _split_pieces(x: np.ndarray, axis: int, sizes: list[int]) -> list[np.ndarray]:
    bounds = np.cumsum(sizes)[:-1]
    return list(np.split(x, bounds, axis=axis))


_op("SPLIT", _split_attrs(1, 2, {0: "axis"}),
    lambda ins, a: _split_outputs(ins[1], *split_sizes(ins[1].shape, value_of(ins[0]), a["num_splits"])),
    lambda ins, a: _split_pieces(ins[1], *split_sizes(ins[1].shape, ins[0], a["num_splits"])),
    "Split input 1 into num_splits equal parts along the axis given by input 0.")

_op("SPLIT_V", _split_attrs(0, 3, {1: "size_splits", 2: "axis"}),
    lambda ins, a: _split_outputs(ins[0], *split_v_sizes(ins[0].shape, value_of(ins[1]), value_of(ins[2]),
                                                         a["num_splits"])),
    lambda ins, a: _split_pieces(ins[0], *split_v_sizes(ins[0].shape, ins[1], ins[2], a["num_splits"])),
    "Split input 0 into parts of the sizes in input 1 (one may be -1) along the axis in input 2.")


# -- TRANSPOSE, REVERSE_V2, TILE, BROADCAST_TO -------------------------------------------

def transpose_perm(rank: int, value: np.ndarray) -> list[int]:
    """TRANSPOSE's permutation (input 1) as non-negative axes: output axis i is input axis perm[i]."""
    # LiteRT accepts negative entries, counting from the end.
    perm = [p + rank if p < 0 else p for p in _ints(value)]
    if len(perm) != rank or sorted(perm) != list(range(rank)):
        raise ModelFormatError(f"TRANSPOSE perm {perm} is not a permutation of {rank} axes")
    return perm


def _transpose_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    x = inputs[0]
    need_rank(inputs[1].shape, 1, "perm (input 1)")
    perm = transpose_perm(len(x.shape), value_of(inputs[1]))
    return [TensorSpec(tuple(x.shape[p] for p in perm), x.dtype)]


_op("TRANSPOSE", _plain_attrs(2, index_inputs={1: "perm"}), _transpose_infer,
    lambda ins, a: [np.transpose(ins[0], transpose_perm(ins[0].ndim, ins[1]))],
    "Permute dimensions by the perm in input 1.")


def reverse_axes(rank: int, value: np.ndarray) -> tuple[int, ...]:
    """REVERSE_V2's axes (input 1), normalized to non-negative and checked to be distinct."""
    axes = tuple(normalize_axis(a, rank, "REVERSE_V2 axis") for a in _ints(value))
    if len(set(axes)) != len(axes):
        raise ModelFormatError(f"REVERSE_V2 axes {list(axes)} repeat")
    return axes


def _reverse_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    x = inputs[0]
    n_axes = int(np.prod(inputs[1].shape))
    if len(x.shape) < n_axes:   # LiteRT: NumDimensions(input) >= NumElements(axis)
        raise ModelFormatError(f"input 0 has shape {list(x.shape)}, fewer dims than the {n_axes} axes "
                               f"of input 1")
    if inputs[1].value is not None:  # the axes do not change the shape; check them when known
        reverse_axes(len(x.shape), inputs[1].value)
    return [TensorSpec(x.shape, x.dtype)]


_op("REVERSE_V2", _plain_attrs(2, index_inputs={1: "axis"}), _reverse_infer,
    lambda ins, a: [np.flip(ins[0], reverse_axes(ins[0].ndim, ins[1])) if ins[1].size else ins[0].copy()],
    "Reverse the order of elements along the axes in input 1.")


def _multiples(rank: int, value: np.ndarray) -> list[int]:
    reps = _ints(value)
    if len(reps) != rank or any(r < 0 for r in reps):
        raise ModelFormatError(f"TILE multiples {reps} invalid for rank {rank}")
    return reps


def _tile_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    x = inputs[0]
    reps = _multiples(len(x.shape), value_of(inputs[1]))
    return [TensorSpec(tuple(d * r for d, r in zip(x.shape, reps)), x.dtype)]


_op("TILE", _plain_attrs(2, index_inputs={1: "multiples"}), _tile_infer,
    lambda ins, a: [np.tile(ins[0], _multiples(ins[0].ndim, ins[1]))],
    "Repeat the input along each dimension by input 1's multiples.")


def _broadcast_target(in_shape: tuple[int, ...], value: np.ndarray) -> tuple[int, ...]:
    target = tuple(_ints(value))
    if len(target) < len(in_shape) or any(d < 0 for d in target):
        raise ModelFormatError(f"BROADCAST_TO: cannot broadcast {list(in_shape)} to {list(target)}")
    for a, b in zip(in_shape[::-1], target[::-1]):
        if a != b and a != 1:
            raise ModelFormatError(f"BROADCAST_TO: cannot broadcast {list(in_shape)} to {list(target)}")
    return target


def _broadcast_to_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    x = inputs[0]
    return [TensorSpec(_broadcast_target(x.shape, value_of(inputs[1])), x.dtype)]


_op("BROADCAST_TO", _plain_attrs(2, index_inputs={1: "shape"}), _broadcast_to_infer,
    lambda ins, a: [np.broadcast_to(ins[0], _broadcast_target(ins[0].shape, ins[1])).copy()],
    "Broadcast the input to the shape in input 1 (numpy rules).")


# -- STRIDED_SLICE, SLICE ----------------------------------------------------------------

_SS_MASKS = ("begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask", "shrink_axis_mask")


def _strided_slice_attrs(node: Node, tensors: Sequence[Tensor]) -> dict:
    check_inputs(node, 4)
    _present(node, 0, 1, 2, 3)
    _check_outputs(node, 1)
    for i, what in ((1, "begin"), (2, "end"), (3, "strides")):
        _index_input(node, tensors, i, what)
        if len(tensors[node.inputs[i]].shape) != 1:
            raise ModelFormatError(f"STRIDED_SLICE {what} must be 1-D")
    out = {m: int(_opt(node, m, 0)) for m in _SS_MASKS}
    out["offset"] = bool(_opt(node, "offset", False))
    return out


def _bit(mask: int, i: int) -> bool:
    return i >= 0 and bool((mask >> i) & 1)


def strided_slice_plan(shape: tuple[int, ...], begin_value: np.ndarray, end_value: np.ndarray,
                       strides_value: np.ndarray,
                       a: dict) -> tuple[tuple[int, ...], list[range], tuple[int, ...]]:
    """LiteRT's strided-slice index logic, for the begin/end/strides tensors (inputs 1-3).

    ``a`` is the STRIDED_SLICE node's attrs (the masks and ``offset``). Returns the input
    shape with new axes inserted, the list of source indices along each of its dimensions,
    and the output shape (shrunk axes removed): element (i0, i1, ...) of the output before
    shrinking is element (indices[0][i0], indices[1][i1], ...) of the input viewed with the
    first shape. The indices are ``range`` objects: a hostile shape may have a dimension
    of billions, whose index list would exhaust memory before any size check runs.
    """
    begin, end, strides = _ints(begin_value), _ints(end_value), _ints(strides_value)
    n = len(begin)
    if len(end) != n or len(strides) != n:
        raise ModelFormatError(f"STRIDED_SLICE begin/end/strides lengths differ: {n}, {len(end)}, "
                               f"{len(strides)}")
    rank = len(shape)
    ellipsis, new_axis = a["ellipsis_mask"], a["new_axis_mask"]
    # Masks are indexed by position in begin/end/strides; first map them onto the
    # dimensions of the input with new axes inserted ("effective" dimensions).
    num_new = sum(1 for i in range(n) if not _bit(ellipsis, i) and _bit(new_axis, i))
    eff = rank + num_new
    eff_ellipsis, eff_new = set(), set()
    ellipsis_start, expanded = eff, 0
    i = 0
    while i < eff:
        if _bit(ellipsis, i):
            ellipsis_start = i
            ellipsis_end = max(i + 1, min(i + 1 + num_new + rank - n, eff))
            expanded = ellipsis_end - ellipsis_start - 1
            eff_ellipsis.update(range(i, ellipsis_end))
            i = ellipsis_end
            continue
        if _bit(new_axis, i - expanded):
            eff_new.add(i)
        i += 1

    eff_shape, indices, out_shape = [], [], []
    added_ellipsis = added_axes = 0
    for i in range(eff):
        shrink = False
        if i in eff_new:
            eff_shape.append(1)
            indices.append(range(1))
            out_shape.append(1)
            added_axes += 1
            continue
        src = i - added_axes
        if not 0 <= src < rank:
            raise ModelFormatError(f"STRIDED_SLICE indexes {n} dimensions of a rank-{rank} input")
        size = shape[src]
        if i in eff_ellipsis or i >= n + expanded:
            if i in eff_ellipsis:
                added_ellipsis = max(0, i - ellipsis_start)
            start, stop, stride = 0, size, 1
        else:
            o = i - added_ellipsis
            stride = strides[o]
            if stride == 0:
                raise ModelFormatError("STRIDED_SLICE stride must be non-zero")
            start = _slice_start(begin[o], size, stride, _bit(a["begin_mask"], o))
            shrink = _bit(a["shrink_axis_mask"], o)
            if shrink:
                if not 0 <= start < size:
                    raise ModelFormatError(f"STRIDED_SLICE shrink index {begin[o]} out of range for "
                                           f"dimension of size {size}")
                stop = start + 1
                stride = 1
            else:
                # offset: end is a size relative to begin. LiteRT adds it to the raw
                # begin; outside 0 <= begin < begin + end <= size its kernel reads
                # out of bounds, so only that range is well defined.
                raw_end = end[o] + begin[o] if a["offset"] else end[o]
                stop = _slice_stop(raw_end, size, stride, _bit(a["end_mask"], o))
        eff_shape.append(size)
        indices.append(range(start, stop, stride) if size else range(0))
        if not shrink:
            out_shape.append(len(indices[-1]))
    return tuple(eff_shape), indices, tuple(out_shape)


def _slice_start(begin: int, size: int, stride: int, masked: bool) -> int:
    """First index along an axis: negatives count from the end, then clamp by direction."""
    if size == 0:
        return 0
    if masked:
        return 0 if stride > 0 else size - 1
    if begin < 0:
        begin += size
    return min(max(begin, 0), size) if stride > 0 else min(max(begin, -1), size - 1)


def _slice_stop(end: int, size: int, stride: int, masked: bool) -> int:
    """One past the last index (in the direction of the stride), clamped the same way."""
    if size == 0:
        return 0
    if masked:
        return size if stride > 0 else -1
    if end < 0:
        end += size
    return min(max(end, 0), size) if stride > 0 else min(max(end, -1), size - 1)


def _strided_slice_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    x = inputs[0]
    for i, what in ((1, "begin"), (2, "end"), (3, "strides")):
        need_rank(inputs[i].shape, 1, f"{what} (input {i})")
    _, _, out_shape = strided_slice_plan(x.shape, value_of(inputs[1]), value_of(inputs[2]),
                                         value_of(inputs[3]), attrs)
    return [TensorSpec(out_shape, x.dtype)]


def _strided_slice_ref(inputs: list[np.ndarray], attrs: dict) -> list[np.ndarray]:
    x = inputs[0]
    eff_shape, indices, out_shape = strided_slice_plan(x.shape, inputs[1], inputs[2], inputs[3], attrs)
    grids = np.ix_(*[np.asarray(ix, dtype=np.intp) for ix in indices])
    return [x.reshape(eff_shape)[grids].reshape(out_shape)]


_op("STRIDED_SLICE", _strided_slice_attrs, _strided_slice_infer, _strided_slice_ref,
    "TensorFlow strided slice with begin/end/ellipsis/new-axis/shrink masks and LiteRT's clamping.")


def slice_bounds(shape: tuple[int, ...], begin_value: np.ndarray, size_value: np.ndarray) -> list[tuple[int, int]]:
    """SLICE's (start, stop) per dimension from its begin and size tensors (size -1: to the end)."""
    begin, size = _ints(begin_value), _ints(size_value)
    if len(begin) != len(shape) or len(size) != len(shape):
        raise ModelFormatError(f"SLICE begin {begin} / size {size} do not match rank {len(shape)}")
    bounds = []
    for b, s, d in zip(begin, size, shape):
        if s == -1:
            s = d - b
        if b < 0 or s < 0 or b + s > d:
            raise ModelFormatError(f"SLICE begin {begin} and size {size} invalid for shape {list(shape)}")
        bounds.append((b, b + s))
    return bounds


def _slice_attrs(node: Node, tensors: Sequence[Tensor]) -> dict:
    """SLICE's attrs: with constant begin and size, the output shape the model declares.

    LiteRT sizes such a SLICE's output once, from the model, and refuses to run when the
    slice of a resized input comes out another shape (slice.cc: ``output_shape_vector[idx]
    != SizeOfDimension(output, idx)``); with a runtime begin or size it resizes the output.
    """
    _plain_attrs(3, index_inputs={1: "begin", 2: "size"})(node, tensors)
    fixed = all(tensors[node.inputs[i]].is_constant for i in (1, 2))
    return {"declared_shape": tuple(tensors[node.outputs[0]].shape) if fixed else None}


def _slice_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    x = inputs[0]
    bounds = slice_bounds(x.shape, value_of(inputs[1]), value_of(inputs[2]))
    shape = tuple(e - b for b, e in bounds)
    declared = attrs.get("declared_shape")
    if declared is not None and shape != declared:
        raise ModelFormatError(f"the slice of input 0, shape {list(x.shape)}, has shape {list(shape)}; with "
                               f"constant begin and size the output keeps its declared shape {list(declared)}")
    return [TensorSpec(shape, x.dtype)]


def _slice_ref(inputs: list[np.ndarray], attrs: dict) -> list[np.ndarray]:
    x = inputs[0]
    bounds = slice_bounds(x.shape, inputs[1], inputs[2])
    return [x[tuple(slice(b, e) for b, e in bounds)].copy()]


_op("SLICE", _slice_attrs, _slice_infer, _slice_ref,
    "Contiguous slice from begin with the given size per dimension (-1: to the end).")


# -- DYNAMIC_UPDATE_SLICE ----------------------------------------------------------------

def update_slice_start(shape: Sequence[int], update_shape: Sequence[int], start_value: np.ndarray) -> list[int]:
    """DYNAMIC_UPDATE_SLICE's start per dimension: the start indices clamped, as LiteRT
    and XLA clamp them, so the update lies wholly inside the operand."""
    start = _ints(start_value)
    if len(start) != len(shape):
        raise ExecutionError(f"DYNAMIC_UPDATE_SLICE start indices {start} do not match rank {len(shape)}")
    return [min(max(b, 0), d - u) for b, d, u in zip(start, shape, update_shape)]


def _dynamic_update_slice_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    operand, update, start = inputs
    if np.dtype(operand.dtype) != np.dtype(update.dtype):
        raise ModelFormatError(f"DYNAMIC_UPDATE_SLICE update is {update.dtype}, the operand {operand.dtype}")
    if len(update.shape) != len(operand.shape) or any(u > d for u, d in zip(update.shape, operand.shape)):
        raise ModelFormatError(f"DYNAMIC_UPDATE_SLICE update of shape {list(update.shape)} does not fit in the "
                               f"operand of shape {list(operand.shape)}")
    if len(start.shape) != 1 or start.shape[0] != len(operand.shape):
        raise ModelFormatError(f"DYNAMIC_UPDATE_SLICE start indices of shape {list(start.shape)} for a rank-"
                               f"{len(operand.shape)} operand (expected [{len(operand.shape)}])")
    return [TensorSpec(tuple(operand.shape), operand.dtype)]


def _dynamic_update_slice_ref(inputs: list[np.ndarray], attrs: dict) -> list[np.ndarray]:
    operand, update, start = inputs
    out = np.array(operand, copy=True)
    begin = update_slice_start(operand.shape, update.shape, start)
    out[tuple(slice(b, b + u) for b, u in zip(begin, update.shape))] = update
    return [out]


_op("DYNAMIC_UPDATE_SLICE", _plain_attrs(3, index_inputs={2: "start indices"}), _dynamic_update_slice_infer,
    _dynamic_update_slice_ref, "The operand with ``update`` written at the start indices (clamped to fit): "
    "a KV cache's write.")


# -- PAD, PADV2, MIRROR_PAD --------------------------------------------------------------

def pad_widths(shape: tuple[int, ...], value: np.ndarray, what: str) -> list[tuple[int, int]]:
    """(before, after) element counts per dimension from a [rank, 2] paddings tensor.

    ``what`` names the op in error messages (e.g. "PAD"). Raises ModelFormatError for a
    wrong shape or a negative padding.
    """
    arr = np.asarray(value)
    if arr.shape != (len(shape), 2):
        raise ModelFormatError(f"{what} paddings of shape {list(arr.shape)} for rank {len(shape)} "
                               f"(expected [{len(shape)}, 2])")
    pads = [(int(b), int(e)) for b, e in arr]
    if any(b < 0 or e < 0 for b, e in pads):
        raise ModelFormatError(f"{what} paddings {pads} must not be negative")
    return pads


def _padded(shape: tuple[int, ...], pads: list[tuple[int, int]]) -> tuple[int, ...]:
    return tuple(d + b + e for d, (b, e) in zip(shape, pads))


def _pad_attrs(n_inputs: int):
    def attrs(node: Node, tensors: Sequence[Tensor]) -> dict:
        check_inputs(node, n_inputs)
        _present(node, *range(n_inputs))
        _check_outputs(node, 1)
        _index_input(node, tensors, 1, "paddings")
        _check_no_requantize(node, tensors, node.inputs[:1])
        # Quantized tensors pad with the zero point: the value that stands for 0.
        return {"pad_value": _zero_point(node, tensors)}
    return attrs


def _pad_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    x = inputs[0]
    if len(inputs) > 2 and inputs[2].dtype != x.dtype:
        raise ModelFormatError(f"PADV2 constant is {inputs[2].dtype}, input is {x.dtype}")
    return [TensorSpec(_padded(x.shape, pad_widths(x.shape, value_of(inputs[1]), "PAD")), x.dtype)]


def _pad_ref(inputs: list[np.ndarray], attrs: dict) -> list[np.ndarray]:
    x = inputs[0]
    pads = pad_widths(x.shape, inputs[1], "PAD")
    if len(inputs) > 2:
        fill = np.asarray(inputs[2]).reshape(-1)
        if fill.size != 1:
            raise ModelFormatError(f"PADV2 constant must hold one value, has {fill.size}")
        fill = fill[0]
    else:
        fill = attrs.get("pad_value", 0)
    return [np.pad(x, pads, mode="constant", constant_values=np.asarray(fill).astype(x.dtype))]


_op("PAD", _pad_attrs(2), _pad_infer, _pad_ref, "Pad with zeros (the zero point when quantized).")
_op("PADV2", _pad_attrs(3), _pad_infer, _pad_ref, "Pad with the constant value in input 2.")

_MIRROR_MODES = {0: "REFLECT", 1: "SYMMETRIC"}


def _mirror_pad_attrs(node: Node, tensors: Sequence[Tensor]) -> dict:
    check_inputs(node, 2)
    _present(node, 0, 1)
    _check_outputs(node, 1)
    _index_input(node, tensors, 1, "paddings")
    mode = int(_opt(node, "mode", 0))
    if mode not in _MIRROR_MODES:
        raise ModelFormatError(f"unknown MIRROR_PAD mode {mode}")
    return {"mode": _MIRROR_MODES[mode]}


def mirror_pad_widths(shape: tuple[int, ...], value: np.ndarray, mode: str) -> list[tuple[int, int]]:
    """MIRROR_PAD's (before, after) per dimension, checked against ``mode`` ("REFLECT" or "SYMMETRIC")."""
    pads = pad_widths(shape, value, "MIRROR_PAD")
    # REFLECT does not repeat the edge, so it can mirror at most size-1 elements.
    limit_offset = 1 if mode == "REFLECT" else 0
    for d, (b, e) in zip(shape, pads):
        if max(b, e) > d - limit_offset:
            raise ModelFormatError(f"MIRROR_PAD {mode} paddings {pads} too large for shape {list(shape)}")
    return pads


def _mirror_pad_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    x = inputs[0]
    pads = mirror_pad_widths(x.shape, value_of(inputs[1]), attrs["mode"])
    return [TensorSpec(_padded(x.shape, pads), x.dtype)]


def _mirror_pad_ref(inputs: list[np.ndarray], attrs: dict) -> list[np.ndarray]:
    x = inputs[0]
    pads = mirror_pad_widths(x.shape, inputs[1], attrs["mode"])
    return [np.pad(x, pads, mode=attrs["mode"].lower())]


_op("MIRROR_PAD", _mirror_pad_attrs, _mirror_pad_infer, _mirror_pad_ref,
    "Pad by mirroring the input: REFLECT excludes the edge element, SYMMETRIC repeats it.")


# -- GATHER, GATHER_ND -------------------------------------------------------------------

def _check_gather_indices(node: Node, tensors: Sequence[Tensor]) -> None:
    """GATHER and GATHER_ND take int16, int32 or int64 indices (input 1)."""
    dtype = tensors[node.inputs[1]].dtype
    if dtype not in _INDEX_DTYPES + (np.dtype(np.int16),):
        raise ModelFormatError(f"{node.op} indices must be int16, int32 or int64, are {dtype}")


def _gather_attrs(node: Node, tensors: Sequence[Tensor]) -> dict:
    check_inputs(node, 2)
    _present(node, 0, 1)
    _check_outputs(node, 1)
    _check_gather_indices(node, tensors)
    return {"axis": int(_opt(node, "axis", 0)), "batch_dims": int(_opt(node, "batch_dims", 0))}


def gather_dims(params: tuple[int, ...], indices: tuple[int, ...], attrs: dict) -> tuple[int, int]:
    """GATHER's normalized (axis, batch_dims) for params and indices of these shapes.

    The output shape is params[:axis] + indices[batch_dims:] + params[axis + 1:].
    """
    if not params:
        raise ModelFormatError("GATHER params (input 0) must have rank >= 1, is a scalar")
    axis = normalize_axis(attrs["axis"], len(params), "GATHER axis")
    batch_dims = attrs["batch_dims"]
    if batch_dims < 0:
        batch_dims += len(indices)
    if not 0 <= batch_dims <= min(axis, len(indices)):
        raise ModelFormatError(f"GATHER batch_dims {attrs['batch_dims']} invalid for axis {axis} and "
                               f"indices of rank {len(indices)}")
    if params[:batch_dims] != indices[:batch_dims]:
        raise ModelFormatError(f"GATHER batch dimensions differ: params {list(params)}, "
                               f"indices {list(indices)}")
    return axis, batch_dims


def _gather_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    p, ix = inputs
    axis, bd = gather_dims(p.shape, ix.shape, attrs)
    return [TensorSpec(p.shape[:axis] + ix.shape[bd:] + p.shape[axis + 1:], p.dtype)]


def _check_indices(indices: np.ndarray, limit: int, what: str) -> None:
    if indices.size and (indices.min() < 0 or indices.max() >= limit):
        bad = indices[(indices < 0) | (indices >= limit)].reshape(-1)[0]
        raise ExecutionError(f"{what} index {int(bad)} out of range [0, {limit})")


def _gather_ref(inputs: list[np.ndarray], attrs: dict) -> list[np.ndarray]:
    params, indices = inputs
    axis, bd = gather_dims(params.shape, indices.shape, attrs)
    _check_indices(indices, params.shape[axis], "GATHER")
    batch = params.shape[:bd]
    nb = _prod(batch)
    p = params.reshape((nb,) + params.shape[bd:])
    ix = indices.reshape((nb,) + indices.shape[bd:]).astype(np.intp)
    # Each batch entry gathers from its own slice of params with its own indices.
    parts = [np.take(p[b], ix[b], axis=axis - bd) for b in range(nb)]
    out_shape = params.shape[:axis] + indices.shape[bd:] + params.shape[axis + 1:]
    if not parts:
        return [np.zeros(out_shape, params.dtype)]
    return [np.stack(parts).reshape(out_shape)]


_op("GATHER", _gather_attrs, _gather_infer, _gather_ref,
    "Select slices of params along an axis by indices, with optional leading batch dimensions.")


def _gather_nd_attrs(node: Node, tensors: Sequence[Tensor]) -> dict:
    check_inputs(node, 2)
    _present(node, 0, 1)
    _check_outputs(node, 1)
    _check_gather_indices(node, tensors)
    return {}


def _gather_nd_shape(params: tuple[int, ...], indices: tuple[int, ...]) -> tuple[int, ...]:
    if len(indices) < 1 or indices[-1] > len(params):
        raise ModelFormatError(f"GATHER_ND indices {list(indices)} invalid for params {list(params)}")
    return indices[:-1] + params[indices[-1]:]


def _gather_nd_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    p, ix = inputs
    return [TensorSpec(_gather_nd_shape(p.shape, ix.shape), p.dtype)]


def _gather_nd_ref(inputs: list[np.ndarray], attrs: dict) -> list[np.ndarray]:
    params, indices = inputs
    out_shape = _gather_nd_shape(params.shape, indices.shape)
    depth = indices.shape[-1]
    flat = indices.reshape(-1, depth).astype(np.intp)
    for k in range(depth):
        _check_indices(flat[:, k], params.shape[k], "GATHER_ND")
    picked = params[tuple(flat[:, k] for k in range(depth))]
    return [picked.reshape(out_shape)]


_op("GATHER_ND", _gather_nd_attrs, _gather_nd_infer, _gather_nd_ref,
    "Select slices of params addressed by the index tuples in the last dimension of indices.")


# -- SHAPE, FILL, RANGE ------------------------------------------------------------------

def _shape_attrs(node: Node, tensors: Sequence[Tensor]) -> dict:
    check_inputs(node, 1)
    _present(node, 0)
    _check_outputs(node, 1)
    dtype = tensors[node.outputs[0]].dtype
    if dtype not in _INDEX_DTYPES:
        raise UnsupportedError(f"SHAPE output must be int32 or int64, is {dtype}")
    return {"out_dtype": np.dtype(dtype)}


def _shape_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    x = inputs[0]
    # The shape is known before running: give it as a value so that shape arithmetic
    # downstream (STRIDED_SLICE, PACK, RESHAPE, ...) folds away.
    value = np.array(x.shape, dtype=attrs["out_dtype"]).reshape(len(x.shape))
    return [TensorSpec((len(x.shape),), attrs["out_dtype"], value)]


_op("SHAPE", _shape_attrs, _shape_infer,
    lambda ins, a: [np.array(ins[0].shape, dtype=a["out_dtype"]).reshape(ins[0].ndim)],
    "The input's shape as a 1-D int32 or int64 tensor.")


def _fill_dims(value: np.ndarray) -> tuple[int, ...]:
    if np.asarray(value).ndim != 1:
        raise ModelFormatError(f"FILL dims must be 1-D, has shape {list(np.shape(value))}")
    dims = tuple(_ints(value))
    if any(d < 0 for d in dims):
        raise ModelFormatError(f"FILL dims {list(dims)} must not be negative")
    return dims


def _fill_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    if len(inputs[1].shape) != 0:
        raise ModelFormatError(f"FILL value (input 1) must be a scalar, has shape {list(inputs[1].shape)}")
    return [TensorSpec(_fill_dims(value_of(inputs[0])), inputs[1].dtype)]


_op("FILL", _plain_attrs(2, index_inputs={0: "dims"}), _fill_infer,
    lambda ins, a: [np.full(_fill_dims(ins[0]), np.asarray(ins[1]).reshape(-1)[0], dtype=ins[1].dtype)],
    "A tensor of shape input 0 filled with the scalar input 1.")


def _range_attrs(node: Node, tensors: Sequence[Tensor]) -> dict:
    check_inputs(node, 3)
    _present(node, 0, 1, 2)
    _check_outputs(node, 1)
    dtypes = {tensors[i].dtype for i in node.inputs}
    if len(dtypes) != 1:
        raise ModelFormatError(f"RANGE inputs mix dtypes {sorted(str(d) for d in dtypes)}")
    dtype = dtypes.pop()
    if dtype not in (np.dtype(np.int32), np.dtype(np.int64), np.dtype(np.float32)):
        raise UnsupportedError(f"RANGE of {dtype}")
    return {}


def _range_size(start_v: np.ndarray, limit_v: np.ndarray, delta_v: np.ndarray) -> int:
    vals = [np.asarray(v).reshape(-1) for v in (start_v, limit_v, delta_v)]
    if any(v.size != 1 for v in vals):
        raise ModelFormatError("RANGE start, limit and delta must be scalars")
    start, limit, delta = (v[0] for v in vals)
    if delta == 0:
        raise ModelFormatError("RANGE delta must not be 0")
    if (start > limit and delta > 0) or (start < limit and delta < 0):
        raise ModelFormatError(f"RANGE from {start} to {limit} never ends with delta {delta}")
    if np.issubdtype(vals[0].dtype, np.integer):
        start, limit, delta = int(start), int(limit), int(delta)
        return (abs(limit - start) + abs(delta) - 1) // abs(delta)
    # Float size the way LiteRT computes it: in the tensor's own precision.
    dtype = vals[0].dtype.type
    return int(np.ceil(np.abs((dtype(limit) - dtype(start)) / dtype(delta))))


def _range_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    for i, what in enumerate(("start", "limit", "delta")):
        need_rank(inputs[i].shape, 0, f"{what} (input {i})")
    n = _range_size(value_of(inputs[0]), value_of(inputs[1]), value_of(inputs[2]))
    return [TensorSpec((n,), inputs[0].dtype)]


def _range_ref(inputs: list[np.ndarray], attrs: dict) -> list[np.ndarray]:
    start, limit, delta = inputs
    n = _range_size(start, limit, delta)
    dtype = start.dtype
    if n == 0:
        return [np.zeros((0,), dtype)]
    # LiteRT accumulates (value += delta); for floats that rounds differently from
    # start + i * delta, so accumulate in the tensor's dtype too.
    steps = np.full(n, np.asarray(delta).reshape(-1)[0], dtype=dtype)
    steps[0] = np.asarray(start).reshape(-1)[0]
    return [np.add.accumulate(steps, dtype=dtype)]


_op("RANGE", _range_attrs, _range_infer, _range_ref,
    "The sequence start, start+delta, ... up to (excluding) limit; int32, int64 or float32.")


# -- DEPTH_TO_SPACE, SPACE_TO_DEPTH, SPACE_TO_BATCH_ND, BATCH_TO_SPACE_ND -----------------

def _block_attrs(node: Node, tensors: Sequence[Tensor]) -> dict:
    check_inputs(node, 1)
    _present(node, 0)
    _check_outputs(node, 1)
    if len(tensors[node.inputs[0]].shape) != 4:
        raise UnsupportedError(f"{node.op} needs a 4-D NHWC input")
    block = int(_opt(node, "block_size", 0))
    if block < 1:
        raise ModelFormatError(f"block_size must be positive, is {block}")
    return {"block_size": block}


def _depth_to_space_shape(shape: tuple[int, ...], bs: int) -> tuple[int, ...]:
    n, h, w, c = shape
    if c % (bs * bs):
        raise ModelFormatError(f"DEPTH_TO_SPACE: depth {c} not divisible by block_size^2 = {bs * bs}")
    return (n, h * bs, w * bs, c // (bs * bs))


def _depth_to_space_ref(inputs: list[np.ndarray], attrs: dict) -> list[np.ndarray]:
    x, bs = inputs[0], attrs["block_size"]
    n, h, w, c = x.shape
    out = _depth_to_space_shape(x.shape, bs)
    # Depth is laid out as (block row, block column, output channel).
    y = x.reshape(n, h, w, bs, bs, out[3]).transpose(0, 1, 3, 2, 4, 5)
    return [y.reshape(out)]


_op("DEPTH_TO_SPACE", _block_attrs,
    lambda ins, a: [TensorSpec(_depth_to_space_shape(ins[0].shape, a["block_size"]), ins[0].dtype)],
    _depth_to_space_ref, "Move depth blocks into block_size x block_size spatial tiles (NHWC).")


def _space_to_depth_shape(shape: tuple[int, ...], bs: int) -> tuple[int, ...]:
    n, h, w, c = shape
    if h % bs or w % bs:
        raise ModelFormatError(f"SPACE_TO_DEPTH: spatial size {h}x{w} not divisible by block_size {bs}")
    return (n, h // bs, w // bs, c * bs * bs)


def _space_to_depth_ref(inputs: list[np.ndarray], attrs: dict) -> list[np.ndarray]:
    x, bs = inputs[0], attrs["block_size"]
    n, h, w, c = x.shape
    out = _space_to_depth_shape(x.shape, bs)
    y = x.reshape(n, h // bs, bs, w // bs, bs, c).transpose(0, 1, 3, 2, 4, 5)
    return [y.reshape(out)]


_op("SPACE_TO_DEPTH", _block_attrs,
    lambda ins, a: [TensorSpec(_space_to_depth_shape(ins[0].shape, a["block_size"]), ins[0].dtype)],
    _space_to_depth_ref, "Move block_size x block_size spatial tiles into depth (NHWC).")


def _batch_space_attrs(node: Node, tensors: Sequence[Tensor]) -> dict:
    check_inputs(node, 3)
    _present(node, 0, 1, 2)
    _check_outputs(node, 1)
    _index_input(node, tensors, 1, "block_shape")
    _index_input(node, tensors, 2, "paddings/crops")
    _check_no_requantize(node, tensors, node.inputs[:1])
    return {"pad_value": _zero_point(node, tensors)}


def block_and_pairs(shape: tuple[int, ...], block_v: np.ndarray, pairs_v: np.ndarray,
                    what: str) -> tuple[list[int], list[tuple[int, int]]]:
    """The block shape and the (before, after) paddings or crops per spatial dimension.

    For SPACE_TO_BATCH_ND (paddings) and BATCH_TO_SPACE_ND (crops); ``what`` is the op
    name, for error messages. The spatial dimensions are 1..len(block) of ``shape``.
    """
    block = _ints(block_v)
    m = len(block)
    pairs = np.asarray(pairs_v)
    if not 3 <= len(shape) <= 4 or m != len(shape) - 2:
        # LiteRT's kernels take 3-D and 4-D inputs with one block entry per spatial dim.
        raise ModelFormatError(f"{what}: input 0 has shape {list(shape)}; block_shape {block} needs rank "
                               f"{m + 2} (LiteRT takes rank 3 or 4)")
    if m < 1 or len(shape) < m + 1 or pairs.shape != (m, 2):
        raise ModelFormatError(f"{what}: block_shape {block} and {list(pairs.shape)} paddings/crops "
                               f"invalid for input {list(shape)}")
    if any(b < 1 for b in block):
        raise ModelFormatError(f"{what}: block_shape {block} must be positive")
    pads = [(int(b), int(e)) for b, e in pairs]
    if any(b < 0 or e < 0 for b, e in pads):
        raise ModelFormatError(f"{what}: paddings/crops {pads} must not be negative")
    return block, pads


def _space_to_batch_shape(shape, block, pads) -> tuple[int, ...]:
    spatial = []
    for d, b, (lo, hi) in zip(shape[1:], block, pads):
        if (d + lo + hi) % b:
            raise ModelFormatError(f"SPACE_TO_BATCH_ND: padded size {d + lo + hi} not divisible by {b}")
        spatial.append((d + lo + hi) // b)
    return (shape[0] * _prod(block),) + tuple(spatial) + shape[1 + len(block):]


def _space_to_batch_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    x = inputs[0]
    block, pads = block_and_pairs(x.shape, value_of(inputs[1]), value_of(inputs[2]), "SPACE_TO_BATCH_ND")
    return [TensorSpec(_space_to_batch_shape(x.shape, block, pads), x.dtype)]


def _space_to_batch_ref(inputs: list[np.ndarray], attrs: dict) -> list[np.ndarray]:
    x = inputs[0]
    block, pads = block_and_pairs(x.shape, inputs[1], inputs[2], "SPACE_TO_BATCH_ND")
    out_shape = _space_to_batch_shape(x.shape, block, pads)
    m = len(block)
    fill = np.asarray(attrs.get("pad_value", 0)).astype(x.dtype)
    padded = np.pad(x, [(0, 0)] + pads + [(0, 0)] * (x.ndim - 1 - m), constant_values=fill)
    # [N, P1/b1, b1, ..., PM/bM, bM, rest] -> [b1..bM, N, P1/b1..PM/bM, rest]
    split = [padded.shape[0]]
    for d, b in zip(padded.shape[1:1 + m], block):
        split += [d // b, b]
    rest = list(padded.shape[1 + m:])
    y = padded.reshape(split + rest)
    perm = [2 + 2 * i for i in range(m)] + [0] + [1 + 2 * i for i in range(m)]
    perm += list(range(1 + 2 * m, 1 + 2 * m + len(rest)))
    return [y.transpose(perm).reshape(out_shape)]


_op("SPACE_TO_BATCH_ND", _batch_space_attrs, _space_to_batch_infer, _space_to_batch_ref,
    "Pad the spatial dimensions, then move block_shape tiles of them into the batch.")


def _batch_to_space_shape(shape, block, crops) -> tuple[int, ...]:
    nb = _prod(block)
    if shape[0] % nb:
        raise ModelFormatError(f"BATCH_TO_SPACE_ND: batch {shape[0]} not divisible by {nb}")
    spatial = []
    for d, b, (lo, hi) in zip(shape[1:], block, crops):
        if lo + hi > d * b:
            raise ModelFormatError(f"BATCH_TO_SPACE_ND: crops {crops} exceed size {d * b}")
        spatial.append(d * b - lo - hi)
    return (shape[0] // nb,) + tuple(spatial) + shape[1 + len(block):]


def _batch_to_space_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    x = inputs[0]
    block, crops = block_and_pairs(x.shape, value_of(inputs[1]), value_of(inputs[2]), "BATCH_TO_SPACE_ND")
    return [TensorSpec(_batch_to_space_shape(x.shape, block, crops), x.dtype)]


def _batch_to_space_ref(inputs: list[np.ndarray], attrs: dict) -> list[np.ndarray]:
    x = inputs[0]
    block, crops = block_and_pairs(x.shape, inputs[1], inputs[2], "BATCH_TO_SPACE_ND")
    _batch_to_space_shape(x.shape, block, crops)
    m = len(block)
    batch = x.shape[0] // _prod(block)
    rest = list(x.shape[1 + m:])
    # [b1..bM, N, d1..dM, rest] -> [N, d1, b1, ..., dM, bM, rest]
    y = x.reshape(block + [batch] + list(x.shape[1:]))
    perm = [m]
    for i in range(m):
        perm += [m + 1 + i, i]
    perm += list(range(2 * m + 1, 2 * m + 1 + len(rest)))
    full = [batch] + [d * b for d, b in zip(x.shape[1:1 + m], block)] + rest
    y = y.transpose(perm).reshape(full)
    crop = tuple(slice(lo, full[1 + i] - hi) for i, (lo, hi) in enumerate(crops))
    return [y[(slice(None),) + crop].copy()]


_op("BATCH_TO_SPACE_ND", _batch_space_attrs, _batch_to_space_infer, _batch_to_space_ref,
    "Move batch tiles back into block_shape spatial blocks, then crop.")


# -- ONE_HOT, WHERE ----------------------------------------------------------------------

def _one_hot_attrs(node: Node, tensors: Sequence[Tensor]) -> dict:
    check_inputs(node, 4)
    _present(node, 0, 1, 2, 3)
    _check_outputs(node, 1)
    _index_input(node, tensors, 0, "indices")
    on, off = tensors[node.inputs[2]].dtype, tensors[node.inputs[3]].dtype
    if on != off:
        raise ModelFormatError(f"ONE_HOT on_value ({on}) and off_value ({off}) dtypes differ")
    return {"axis": int(_opt(node, "axis", -1))}


def _one_hot_axis(rank: int, axis: int) -> int:
    if axis == -1:
        return rank
    if not 0 <= axis <= rank:
        raise ModelFormatError(f"ONE_HOT axis {axis} out of range for indices of rank {rank}")
    return axis


def _one_hot_depth(value: np.ndarray) -> int:
    depth = _scalar_int(value, "ONE_HOT depth")
    if depth < 0:
        raise ModelFormatError(f"ONE_HOT depth {depth} must not be negative")
    return depth


def _one_hot_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    ix = inputs[0]
    axis = _one_hot_axis(len(ix.shape), attrs["axis"])
    depth = _one_hot_depth(value_of(inputs[1]))
    return [TensorSpec(ix.shape[:axis] + (depth,) + ix.shape[axis:], inputs[2].dtype)]


def _one_hot_ref(inputs: list[np.ndarray], attrs: dict) -> list[np.ndarray]:
    indices, depth_v, on, off = inputs
    axis = _one_hot_axis(indices.ndim, attrs["axis"])
    depth = _one_hot_depth(depth_v)
    # Indices outside [0, depth) match no position and give an all-off row.
    hot = indices[..., None] == np.arange(depth)
    y = np.where(hot, np.asarray(on).reshape(-1)[0], np.asarray(off).reshape(-1)[0]).astype(on.dtype)
    return [np.moveaxis(y, -1, axis)]


_op("ONE_HOT", _one_hot_attrs, _one_hot_infer, _one_hot_ref,
    "on_value where the position along the new axis equals the index, else off_value.")


def _where_attrs(node: Node, tensors: Sequence[Tensor]) -> dict:
    check_inputs(node, 1)
    _present(node, 0)
    _check_outputs(node, 1)
    return {}


def _where_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    x = inputs[0]
    # The number of true elements is only known from the value.
    count = int(np.count_nonzero(value_of(x)))
    return [TensorSpec((count, len(x.shape)), np.dtype(np.int64))]


_op("WHERE", _where_attrs, _where_infer,
    lambda ins, a: [np.argwhere(ins[0]).astype(np.int64).reshape(-1, ins[0].ndim)],
    "Coordinates (int64, row-major order) of the true / non-zero elements of the input.")
