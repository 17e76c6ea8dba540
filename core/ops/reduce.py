"""Ops along axes: reductions, SOFTMAX / LOG_SOFTMAX, L2_NORMALIZATION, ARG_MAX / ARG_MIN,
CUMSUM and RFFT2D.

Semantics follow LiteRT's builtin CPU kernels, checked against ``ai_edge_litert``:

- Reductions read their axes from input 1 (a scalar or a vector, int32 in LiteRT;
  negative and repeated axes allowed, an empty vector reduces nothing). Integer MEAN
  sums in int64 and truncates toward zero; integer SUM and REDUCE_PROD wrap. Float
  REDUCE_MAX / REDUCE_MIN keep a NaN only where it is the last element folded
  (:func:`x86_extreme`).
- SOFTMAX is ``exp(beta * (x - max)) / sum`` over the last axis; LOG_SOFTMAX has no beta.
- L2_NORMALIZATION divides the last axis by ``max(sqrt(sum(x^2)), 1e-6)``; LiteRT
  refuses any fused activation.
- ARG_MAX / ARG_MIN return the first index of the extreme value.
- RFFT2D crops or zero-pads the two innermost dims to ``fft_length`` (powers of two).
"""
from __future__ import annotations

import numpy as np

from ..errors import ModelFormatError, UnsupportedError
from ..graph import Node
from ..model.schema import TENSOR_TYPES
from .elementwise import BOOL, C64, F32, FLOAT_ONLY, I8, I32, I64, U8, check_dtypes
from .registry import (OpDef, TensorSpec, activation_attr, check_inputs, finite_option, normalize_axis, register,
                       value_of)

AXIS_DTYPES = (I32, I64)


# -- reductions ----------------------------------------------------------------------------

def reduction_axes(axes: np.ndarray, rank: int) -> tuple[int, ...]:
    """Sorted distinct axes in ``[0, rank)`` from an axes tensor (scalar or vector)."""
    flat = np.asarray(axes).reshape(-1)
    if flat.dtype.kind not in "iu":
        raise ModelFormatError(f"axes must be integers, got {flat.dtype.name}")
    if rank == 0:   # LiteRT reduces a scalar to itself (axis 0 or -1)
        for a in flat:
            normalize_axis(int(a), 1, "reduction axis")
        return ()
    return tuple(sorted({normalize_axis(int(a), rank, "reduction axis") for a in flat}))


def one_run(axes: tuple[int, ...] | list[int]) -> bool:
    """Whether sorted distinct ``axes`` (from :func:`reduction_axes`) are one run of adjacent
    axes, as XNNPACK's sums (and the kernels that follow them) take them; False for none."""
    return bool(axes) and tuple(axes) == tuple(range(axes[0], axes[-1] + 1))


def without_unit_reductions(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(shape, axes)`` less the reduced axes of size 1 but the last (the same elements, in
    the same order). XNNPACK's sum over such an axis is a single pass, ``0 + sum * scale``
    as without it, while a kept axis and a last axis decide which of its kernels sums: so
    a LayerNorm's MEAN over [0, 2] of [1, rows, width] is one run, its row sums."""
    last = len(shape) - 1
    drop = {i for i in axes if shape[i] == 1 and i != last}
    if not drop or len(drop) == len(axes):
        return shape, axes
    keep = [i for i in range(len(shape)) if i not in drop]
    return tuple(shape[i] for i in keep), tuple(keep.index(i) for i in axes if i not in drop)


def reduced_shape(shape: tuple[int, ...], axes: tuple[int, ...], keep_dims: bool) -> tuple[int, ...]:
    """The shape left after reducing ``axes``: kept as 1 with ``keep_dims``, else dropped."""
    if keep_dims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _reduce_attrs_for(dtypes: tuple[np.dtype, ...]):
    def attrs(node: Node, tensors) -> dict:
        check_inputs(node, 2)
        check_dtypes(node, tensors, dtypes, (0,))
        check_dtypes(node, tensors, AXIS_DTYPES, (1,))
        attrs = {"keep_dims": bool(node.options.get("keep_dims", False))}
        if node.op in ("REDUCE_MAX", "REDUCE_MIN"):
            attrs["empty_infinite"] = _empty_is_infinite(node, tensors)
        return attrs
    return attrs


def _empty_is_infinite(node: Node, tensors) -> bool:
    """Whether an empty REDUCE_MAX / REDUCE_MIN gives -inf / +inf rather than the type's
    lowest / highest finite value.

    LiteRT's two kernels disagree: XNNPACK (float32 with constant axes, which LiteRT
    delegates to it) starts from -inf / +inf, the builtin kernel (runtime axes, integer
    types) from ``numeric_limits::lowest()`` / ``max()``. litegpu gives what LiteRT gives.
    """
    x, axes = tensors[node.inputs[0]], tensors[node.inputs[1]]
    return x.dtype == np.float32 and axes.is_constant


def _reduce_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    x = inputs[0]
    axes = reduction_axes(value_of(inputs[1]), len(x.shape))
    return [TensorSpec(reduced_shape(tuple(x.shape), axes, attrs["keep_dims"]), x.dtype)]


def _int_mean(x: np.ndarray, axes: tuple[int, ...], keep_dims: bool) -> np.ndarray:
    total = np.sum(x, axis=axes, keepdims=keep_dims, dtype=np.int64)
    count = int(np.prod([x.shape[a] for a in axes], dtype=np.int64)) if axes else 1
    count = max(count, 1)
    # C++ integer division: truncation toward zero.
    q = np.abs(total) // count * np.sign(total)
    return q.astype(x.dtype)


def _mean(x, axes, keep_dims):
    if x.dtype.kind in "iu":
        return _int_mean(x, axes, keep_dims)
    return np.mean(x, axis=axes, keepdims=keep_dims, dtype=x.dtype)


def x86_extreme(x: np.ndarray, axes: tuple[int, ...], keep_dims: bool, initial: float,
                largest: bool) -> np.ndarray:
    """REDUCE_MAX (``largest``) or REDUCE_MIN of float ``x`` over ``axes`` as LiteRT's CPU
    kernels fold it: ``acc = acc > v ? acc : v`` (``<`` for the minimum) from ``initial``,
    over the reduced elements in row-major order. That is x86's ``maxps(acc, v)``, which
    returns ``v`` when either is NaN, so

    - the output is NaN exactly where the last reduced element is NaN, and
    - otherwise it is the extreme of ``initial`` and the elements after the last NaN.

    Measured on ai_edge_litert 2.3 (x86-64, AVX-512), with 1 and 2 threads: both rules hold
    for every shape and axes tried, in the builtin kernel (run-time axes) and in XNNPACK
    (constant axes). The second holds exactly where XNNPACK folds one element at a time:
    when the innermost axis is kept (its vectors hold neighbouring outputs, as an NHWC
    spatial max does) and when the contiguous reduced run is shorter than a vector (16
    floats on AVX-512). A longer run is folded in vector lanes, each keeping what came
    after its own last NaN before the lanes are combined, so LiteRT may keep a value from
    before the last NaN; which ones depends on the host's vector width. litegpu folds in
    order there too: its NaN land where LiteRT's do, and a finite output of a run holding
    a NaN may miss a value LiteRT's lanes kept.
    """
    kept = [a for a in range(x.ndim) if a not in axes]
    count = int(np.prod([x.shape[a] for a in axes], dtype=np.int64))
    outputs = int(np.prod([x.shape[a] for a in kept], dtype=np.int64))
    rows = np.transpose(x, kept + list(axes)).reshape(outputs, count)
    order = np.arange(count)
    last_nan = np.max(np.where(np.isnan(rows), order, -1), axis=1, initial=-1)
    fill = -np.inf if largest else np.inf
    after = np.where(order > last_nan[:, None], rows, fill)
    y = (np.max if largest else np.min)(after, axis=1, initial=initial)
    y = np.where((last_nan >= 0) & (last_nan == count - 1), np.nan, y).astype(x.dtype)
    return y.reshape(reduced_shape(tuple(x.shape), axes, keep_dims))


def _extreme(largest: bool):
    def reduce(x, axes, keep_dims, empty_infinite=False):
        info = np.finfo(x.dtype) if x.dtype.kind == "f" else np.iinfo(x.dtype)
        # LiteRT starts from the type's lowest / highest value (or from -inf / +inf, see
        # _empty_is_infinite), so an empty reduction yields it.
        if empty_infinite:
            initial = -np.inf if largest else np.inf
        else:
            initial = info.min if largest else info.max
        if x.dtype.kind == "f":
            return x86_extreme(x, axes, keep_dims, initial, largest)
        return (np.max if largest else np.min)(x, axis=axes, keepdims=keep_dims, initial=initial)
    return reduce


_REDUCERS = {
    "MEAN": (_mean, (F32, I32, I64)),
    "SUM": (lambda x, a, k: np.sum(x, axis=a, keepdims=k, dtype=x.dtype), (F32, I32, I64)),
    "REDUCE_PROD": (lambda x, a, k: np.prod(x, axis=a, keepdims=k, dtype=x.dtype), (F32, I32, I64, I8, U8)),
    "REDUCE_MAX": (_extreme(largest=True), (F32, I32, I64, I8, U8)),
    "REDUCE_MIN": (_extreme(largest=False), (F32, I32, I64, I8, U8)),
    "REDUCE_ANY": (lambda x, a, k: np.any(x, axis=a, keepdims=k), (BOOL,)),
    "REDUCE_ALL": (lambda x, a, k: np.all(x, axis=a, keepdims=k), (BOOL,)),
}


def _register_reduction(name: str) -> None:
    fn, dtypes = _REDUCERS[name]

    def reference(inputs, attrs):
        x = inputs[0]
        axes = reduction_axes(inputs[1], x.ndim)
        with np.errstate(over="ignore", invalid="ignore"):
            extra = {"empty_infinite": attrs["empty_infinite"]} if "empty_infinite" in attrs else {}
            y = fn(x, axes, attrs["keep_dims"], **extra)
        return [np.asarray(y).astype(x.dtype, copy=False)]

    register(OpDef(name=name, attrs=_reduce_attrs_for(dtypes), infer=_reduce_infer, reference=reference,
                   doc=f"{name} over the axes in input 1; ``keep_dims`` keeps them as 1."))


for _name in _REDUCERS:
    _register_reduction(_name)


# -- softmax family ------------------------------------------------------------------------

def _last_axis_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    x = inputs[0]
    if len(x.shape) < 1:
        raise ModelFormatError("input must have rank >= 1")
    # A quantized SOFTMAX may change type (int8 in, int16 out): its output's own.
    out = attrs["quant"].output(0) if "quant" in attrs else None
    return [TensorSpec(x.shape, out.dtype if out is not None else x.dtype)]


def _softmax_attrs(node: Node, tensors) -> dict:
    check_inputs(node, 1)
    check_dtypes(node, tensors, FLOAT_ONLY)
    return {"beta": finite_option(node, "beta")}


def softmax(x: np.ndarray, beta: float) -> np.ndarray:
    """Numerically stable softmax over the last axis, in ``x``'s dtype."""
    m = np.max(x, axis=-1, keepdims=True)
    with np.errstate(over="ignore"):
        e = np.exp((x - m) * np.asarray(beta, x.dtype))
    return (e / np.sum(e, axis=-1, keepdims=True)).astype(x.dtype, copy=False)


def log_softmax(x: np.ndarray) -> np.ndarray:
    """``x - max - log(sum(exp(x - max)))`` over the last axis, in ``x``'s dtype."""
    shifted = x - np.max(x, axis=-1, keepdims=True)
    return (shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))).astype(x.dtype, copy=False)


def _float_attrs(node: Node, tensors) -> dict:
    check_inputs(node, 1)
    check_dtypes(node, tensors, FLOAT_ONLY)
    return {}


register(OpDef(name="SOFTMAX", attrs=_softmax_attrs, infer=_last_axis_infer,
               reference=lambda inputs, attrs: [softmax(inputs[0], attrs["beta"])],
               doc="SOFTMAX over the last axis with ``beta``."))
register(OpDef(name="LOG_SOFTMAX", attrs=_float_attrs, infer=_last_axis_infer,
               reference=lambda inputs, attrs: [log_softmax(inputs[0])],
               doc="LOG_SOFTMAX over the last axis."))


L2_EPSILON = 1e-6


def _l2_attrs(node: Node, tensors) -> dict:
    check_inputs(node, 1)
    check_dtypes(node, tensors, FLOAT_ONLY)
    act = activation_attr(node.options)
    if act != "NONE":
        raise UnsupportedError(f"fused activation {act} (LiteRT supports only NONE)")
    # "activation" is always NONE; kept so code written against nn.py's definition works.
    return {"epsilon": L2_EPSILON, "activation": "NONE"}


def l2_normalize(x: np.ndarray, epsilon: float) -> np.ndarray:
    """``x / max(sqrt(sum(x^2)), epsilon)`` over the last axis, in ``x``'s dtype."""
    norm = np.sqrt(np.sum(x * x, axis=-1, keepdims=True))
    return (x / np.maximum(norm, np.asarray(epsilon, x.dtype))).astype(x.dtype, copy=False)


register(OpDef(name="L2_NORMALIZATION", attrs=_l2_attrs, infer=_last_axis_infer,
               reference=lambda inputs, attrs: [l2_normalize(inputs[0], attrs["epsilon"])],
               doc="L2_NORMALIZATION over the last axis (epsilon 1e-6 on the norm)."))


# -- ARG_MAX / ARG_MIN ---------------------------------------------------------------------

def _arg_attrs(node: Node, tensors) -> dict:
    check_inputs(node, 2)
    check_dtypes(node, tensors, (F32, I32, I8, U8, BOOL), (0,))
    check_dtypes(node, tensors, AXIS_DTYPES, (1,))
    if "output_type" in node.options:
        code = node.options["output_type"]
        out = TENSOR_TYPES.get(code, (f"type {code}", None))[1]
    else:  # no options table at all: trust the output tensor
        out = tensors[node.outputs[0]].dtype
    if out is None or np.dtype(out) not in (I32, I64):
        raise ModelFormatError(f"output_type must be INT32 or INT64, got {getattr(out, 'name', out)}")
    return {"out_dtype": np.dtype(out)}


def _arg_axis(axis: np.ndarray, rank: int) -> int:
    flat = np.asarray(axis).reshape(-1)
    if flat.size != 1:
        raise ModelFormatError(f"axis must hold one value, has {flat.size}")
    return normalize_axis(int(flat[0]), rank)


def _arg_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    x = inputs[0]
    if len(x.shape) < 1:
        raise ModelFormatError(f"input 0 must have rank >= 1, has shape {list(x.shape)}")
    axis = _arg_axis(value_of(inputs[1]), len(x.shape))
    return [TensorSpec(reduced_shape(tuple(x.shape), (axis,), False), attrs["out_dtype"])]


def _arg_op(name: str, fn) -> None:
    def reference(inputs, attrs):
        x = inputs[0]
        axis = _arg_axis(inputs[1], x.ndim)
        return [np.asarray(fn(x, axis=axis)).astype(attrs["out_dtype"])]

    register(OpDef(name=name, attrs=_arg_attrs, infer=_arg_infer, reference=reference,
                   doc=f"{name}: first index of the extreme value along the axis in input 1."))


_arg_op("ARG_MAX", np.argmax)
_arg_op("ARG_MIN", np.argmin)


# -- CUMSUM --------------------------------------------------------------------------------

def _cumsum_attrs(node: Node, tensors) -> dict:
    check_inputs(node, 2)
    check_dtypes(node, tensors, (F32, I32, I64), (0,))
    check_dtypes(node, tensors, (I32,), (1,))
    return {"exclusive": bool(node.options.get("exclusive", False)),
            "reverse": bool(node.options.get("reverse", False))}


def cumsum(x: np.ndarray, axis: int, exclusive: bool, reverse: bool) -> np.ndarray:
    """Cumulative sum along ``axis``; ``exclusive`` leaves out the element itself."""
    v = np.flip(x, axis) if reverse else x
    y = np.cumsum(v, axis=axis, dtype=x.dtype)
    if exclusive:
        # shift by one along the axis: each sum of the elements strictly before
        shifted = np.zeros_like(y)
        dst = [slice(None)] * y.ndim
        src = [slice(None)] * y.ndim
        dst[axis], src[axis] = slice(1, None), slice(None, -1)
        shifted[tuple(dst)] = y[tuple(src)]
        y = shifted
    return np.flip(y, axis) if reverse else y


def _cumsum(inputs, attrs):
    x, axis = inputs
    ax = _arg_axis(axis, x.ndim)
    return [cumsum(x, ax, attrs["exclusive"], attrs["reverse"]).astype(x.dtype, copy=False)]


register(OpDef(name="CUMSUM", attrs=_cumsum_attrs,
               infer=lambda inputs, attrs: [TensorSpec(inputs[0].shape, inputs[0].dtype)],
               reference=_cumsum, doc="CUMSUM along the axis in input 1 (exclusive, reverse)."))


# -- RFFT2D --------------------------------------------------------------------------------

def _rfft_attrs(node: Node, tensors) -> dict:
    check_inputs(node, 2)
    check_dtypes(node, tensors, FLOAT_ONLY, (0,))
    check_dtypes(node, tensors, (I32,), (1,))
    return {}


def _fft_length(value: np.ndarray) -> tuple[int, int]:
    flat = np.asarray(value).reshape(-1)
    if flat.size != 2:
        raise ModelFormatError(f"fft_length must have 2 values, has {flat.size}")
    h, w = int(flat[0]), int(flat[1])
    for n in (h, w):
        if n <= 0 or n & (n - 1):
            raise UnsupportedError(f"fft_length {[h, w]}: LiteRT supports powers of two only")
    return h, w


def _rfft_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    x = inputs[0]
    if len(x.shape) < 2:
        raise ModelFormatError(f"RFFT2D input must have rank >= 2, has {len(x.shape)}")
    h, w = _fft_length(value_of(inputs[1]))
    return [TensorSpec(tuple(x.shape[:-2]) + (h, w // 2 + 1), C64)]


def _rfft2d(inputs, attrs):
    x, length = inputs
    h, w = _fft_length(length)
    return [np.fft.rfft2(x.astype(np.float64), s=(h, w), axes=(-2, -1)).astype(C64)]


register(OpDef(name="RFFT2D", attrs=_rfft_attrs, infer=_rfft_infer, reference=_rfft2d,
               doc="RFFT2D of the two innermost dims, cropped or zero-padded to fft_length."))
