"""Elementwise ops: broadcasting binary ops through numpy ufuncs writing ``out=`` (the
fused activation applied in place), simple activations as ufuncs, and numba kernels for
the ones numpy would take several passes for (HARD_SWISH, GELU).
"""
from __future__ import annotations

from functools import partial

import numpy as np

from litegpu.backend import NodeContext

from . import xnn_sigmoid
from .common import activation_in_place
from .mathfn import fma32, gelu32, gelu_tanh32, tanh32
from .registry import bindable, kernel
from .tasks import bind_task, int32_pointer, row_tasks, task_function

_FLOATS = (np.dtype(np.float32),)
_NUMERIC = (np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.int64))


def _dtypes(ctx: NodeContext, allowed: tuple) -> np.dtype | None:
    """The common dtype of every input and output when it is in ``allowed``, else None."""
    dtypes = {np.dtype(s.dtype) for s in ctx.inputs if s is not None}
    dtypes |= {np.dtype(s.dtype) for s in ctx.outputs}
    if len(dtypes) != 1:
        return None
    (dtype,) = dtypes
    return dtype if dtype in allowed else None


def _bind_ufunc(ufunc):
    """``bind`` for a kernel that is one ufunc call: the call with its arrays bound."""
    # The output passed by position: a partial with keywords builds a dict on every call,
    # ~0.15 us of a ~0.35 us ufunc call on the scalars of a loop counter. NumPy deprecates
    # that form for maximum and minimum only.
    by_keyword = ufunc in (np.maximum, np.minimum)

    def bind(inputs, outputs):
        return partial(ufunc, *inputs, out=outputs[0]) if by_keyword else partial(ufunc, *inputs, outputs[0])
    return bind


# -- binary ---------------------------------------------------------------------------------

def _binary(ufunc, allowed: tuple = _NUMERIC):
    """A factory for a broadcasting binary op computed by ``ufunc`` into the output."""
    def factory(ctx: NodeContext):
        dtype = _dtypes(ctx, allowed)
        if dtype is None or len(ctx.inputs) != 2:
            return None
        activation = ctx.attrs.get("activation", "NONE")
        if activation != "NONE" and dtype not in _FLOATS:
            return None
        act = activation_in_place(activation)
        if act is None:
            def run(inputs, outputs):
                ufunc(inputs[0], inputs[1], out=outputs[0])
            run.bind = _bind_ufunc(ufunc)
        else:
            def run(inputs, outputs):
                out = outputs[0]
                ufunc(inputs[0], inputs[1], out=out)
                act(out)
        return run
    factory.__doc__ = f"Broadcasting {ufunc.__name__} into the output, fused activation in place."
    return factory


kernel("ADD")(_binary(np.add))
kernel("SUB")(_binary(np.subtract))
kernel("MUL")(_binary(np.multiply))
kernel("DIV")(_binary(np.divide, _FLOATS))


def _max_min(compare):
    """MAXIMUM / MINIMUM as LiteRT: the first operand where ``compare(first, second)``
    holds, else the second, so a NaN in either gives the second (``np.maximum`` keeps
    any NaN); the ``swapped`` attr says which is first
    (:func:`litegpu.ops.elementwise.max_min_swapped`). Integers take the ufunc."""
    ufunc_factory = _binary(np.maximum if compare is np.greater else np.minimum)

    def factory(ctx: NodeContext):
        dtype = _dtypes(ctx, _NUMERIC)
        if dtype is None or len(ctx.inputs) != 2:
            return None
        if dtype not in _FLOATS:
            return ufunc_factory(ctx)
        swapped = bool(ctx.attrs.get("swapped"))

        def bind(inputs, outputs):
            first, second = (inputs[1], inputs[0]) if swapped else (inputs[0], inputs[1])
            out = outputs[0]
            if any(np.shares_memory(out, x) for x in (first, second)):
                return lambda: np.copyto(out, np.where(compare(first, second), first, second))
            mask = np.empty(out.shape, np.bool_)

            def call() -> None:
                compare(first, second, out=mask)
                np.copyto(out, second)
                np.copyto(out, first, where=mask)
            return call
        return bindable(bind)
    factory.__doc__ = _max_min.__doc__
    return factory


kernel("MAXIMUM")(_max_min(np.greater))
kernel("MINIMUM")(_max_min(np.less))


_BOOL = np.dtype(np.bool_)


def _predicate(ufunc, allowed: tuple):
    """A factory for a comparison or logical op: inputs of one dtype in ``allowed``, bool out."""
    def factory(ctx: NodeContext):
        dtypes = {np.dtype(s.dtype) for s in ctx.inputs if s is not None}
        if len(ctx.inputs) != 2 or len(dtypes) != 1 or dtypes.pop() not in allowed \
                or np.dtype(ctx.outputs[0].dtype) != _BOOL:
            return None

        def run(inputs, outputs):
            ufunc(inputs[0], inputs[1], out=outputs[0])
        run.bind = _bind_ufunc(ufunc)
        return run
    factory.__doc__ = f"Broadcasting {ufunc.__name__} into a bool output."
    return factory


kernel("LESS")(_predicate(np.less, _NUMERIC))
kernel("LESS_EQUAL")(_predicate(np.less_equal, _NUMERIC))
kernel("GREATER")(_predicate(np.greater, _NUMERIC))
kernel("GREATER_EQUAL")(_predicate(np.greater_equal, _NUMERIC))
kernel("EQUAL")(_predicate(np.equal, _NUMERIC + (_BOOL,)))
kernel("NOT_EQUAL")(_predicate(np.not_equal, _NUMERIC + (_BOOL,)))
kernel("LOGICAL_AND")(_predicate(np.logical_and, (_BOOL,)))
kernel("LOGICAL_OR")(_predicate(np.logical_or, (_BOOL,)))


@kernel("LOGICAL_NOT")
def logical_not(ctx: NodeContext):
    """np.logical_not into the bool output."""
    if _dtypes(ctx, (_BOOL,)) is None:
        return None

    def run(inputs, outputs):
        np.logical_not(inputs[0], out=outputs[0])
    return run


@kernel("SQUARED_DIFFERENCE")
def squared_difference(ctx: NodeContext):
    """(a - b)^2 with broadcasting, two in-place passes."""
    if _dtypes(ctx, _FLOATS) is None:
        return None

    def run(inputs, outputs):
        out = outputs[0]
        np.subtract(inputs[0], inputs[1], out=out)
        np.square(out, out=out)
    return run


# -- unary ----------------------------------------------------------------------------------

def _unary(*steps):
    """A factory for a float32 unary op: ``steps[0](x, out=out)`` then each later step in place."""
    first, rest = steps[0], steps[1:]

    def factory(ctx: NodeContext):
        if _dtypes(ctx, _FLOATS) is None:
            return None
        if not rest:
            def run(inputs, outputs):
                first(inputs[0], out=outputs[0])
            if isinstance(first, np.ufunc):
                run.bind = _bind_ufunc(first)
        else:
            def run(inputs, outputs):
                out = outputs[0]
                first(inputs[0], out=out)
                for step in rest:
                    step(out, out=out)
        return run
    return factory


def _relu(x, out):
    np.maximum(x, np.float32(0), out=out)


def _relu6(x, out):
    np.clip(x, np.float32(0), np.float32(6), out=out)


def _relu_n1_to_1(x, out):
    np.clip(x, np.float32(-1), np.float32(1), out=out)


def _exp_neg(x, out):
    # exp(-x) overflows to inf for x < -88; 1 / (1 + inf) = 0 is the right logistic value.
    with np.errstate(over="ignore"):
        np.exp(np.negative(x, out=out), out=out)


def _add_one(x, out):
    np.add(x, np.float32(1), out=out)


def _rsqrt(x, out):
    np.sqrt(x, out=out)
    np.reciprocal(out, out=out)


kernel("RELU")(_unary(_relu))
kernel("RELU6")(_unary(_relu6))
kernel("RELU_N1_TO_1")(_unary(_relu_n1_to_1))
kernel("EXP")(_unary(np.exp))
kernel("NEG")(_unary(np.negative))
kernel("ABS")(_unary(np.abs))
kernel("SQRT")(_unary(np.sqrt))
kernel("SQUARE")(_unary(np.square))
kernel("RSQRT")(_unary(_rsqrt))
# LOGISTIC in three numpy passes where LiteRT's sigmoid is not known (see logistic_kernel).
_numpy_logistic = _unary(_exp_neg, _add_one, np.reciprocal)


# What :func:`_float_unary_task` computes (``ip[2]``).
_GELU, _GELU_TANH, _HARD_SWISH, SIGMOID, SWISH, _TANH = range(6)


@task_function(fastmath={"contract"})
def _float_unary_task(t, xp, outp, _a2, _a3, _a4, _a5, _a6, _a7, ip, _fp):
    """Elements ``t * chunk ..`` of a float32 one-input op (``ip``: size, chunk, which):
    GELU by :func:`.mathfn.gelu32` or :func:`.mathfn.gelu_tanh32` and TANH by
    :func:`.mathfn.tanh32`: float32 code that vectorizes (a float64 erf form, behind
    numba's zero-division check, ran at ~1.2 ns an element and lost all relative accuracy
    for x < -3); HARD_SWISH as ``x * clamp(x / 6
    + 1/2, 0, 1)``, the multiply-add fused as XNNPACK's; LOGISTIC by
    :func:`.xnn_sigmoid.sigmoid32`, and SWISH (``x * LOGISTIC(x)``, fused by :mod:`..fusion`)
    with it, 16 lanes at a time where it is XNNPACK's AVX-512F kernel
    (:func:`.xnn_sigmoid.sigmoid_range`). The generated kernels of :mod:`..fusion` use the
    same forms; this one runs where they do not (fusion off, or shapes settled at run time).
    ``contract`` lets LLVM fuse the polynomials' multiply-adds, which only removes
    roundings (the sigmoid's are explicit fused multiply-adds already)."""
    n, chunk, which = ip[0], ip[1], ip[2]
    start = t * chunk
    end = min(n, start + chunk)
    if which == _GELU_TANH:
        for i in range(start, end):
            outp[i] = gelu_tanh32(xp[i])
    elif which == _TANH:
        for i in range(start, end):
            outp[i] = tanh32(xp[i])
    elif which == _GELU:
        for i in range(start, end):
            outp[i] = gelu32(xp[i])
    elif which == _HARD_SWISH:
        for i in range(start, end):
            v = xp[i]
            outp[i] = v * min(max(fma32(v, np.float32(1 / 6), np.float32(0.5)), np.float32(0)), np.float32(1))
    elif xnn_sigmoid.MATCHES_LITERT:
        xnn_sigmoid.sigmoid_range(xp, outp, start, end, which == SWISH)
    else:
        for i in range(start, end):
            v = xp[i]
            outp[i] = v * xnn_sigmoid.sigmoid32(v) if which == SWISH else xnn_sigmoid.sigmoid32(v)


# Ops of at least this many elements run as several tasks over the threads: at ~0.6 ns an
# element (GELU), smaller ones take less time than waking a sleeping worker (see .threads).
_UNARY_PARALLEL = 1 << 16


def float_unary(ctx: NodeContext, which: int):
    """The node (or a fused SWISH whose input ``ctx`` reads) through
    :func:`_float_unary_task`, or None unless it is float32."""
    if _dtypes(ctx, _FLOATS) is None:
        return None
    size = int(np.prod(ctx.inputs[0].shape, dtype=np.int64))
    tasks, chunk = row_tasks(size, size, _UNARY_PARALLEL)
    params = np.array([size, chunk, which], np.int64)

    def bind(inputs, outputs):
        return bind_task(_float_unary_task, tasks, (inputs[0],), (outputs[0],), params)
    return bindable(bind)


_INT_TO_FLOAT, _FLOAT_TO_INT = 0, 1
_I32 = np.dtype(np.int32)
_INT32_LIMIT = np.float32(2147483648.0)     # 2^31: the first float32 above int32's range


@task_function()
def _cast_task(t, xp, outp, _a2, _a3, _a4, _a5, _a6, _a7, ip, _fp):
    """Elements ``t * chunk ..`` of a CAST between int32 and float32 (``ip``: size, chunk,
    which), as LiteRT converts: int32 to the nearest float32; float32 truncated toward
    zero, saturated, NaN to the maximum (:func:`litegpu.ops.elementwise.cast_like_litert`)."""
    n, chunk, which = ip[0], ip[1], ip[2]
    start = t * chunk
    end = min(n, start + chunk)
    if which == _INT_TO_FLOAT:
        ints = int32_pointer(xp)
        for i in range(start, end):
            outp[i] = np.float32(ints[i])
    else:
        ints = int32_pointer(outp)
        for i in range(start, end):
            v = xp[i]
            if not v < _INT32_LIMIT:          # NaN too
                ints[i] = np.int32(2147483647)
            elif v <= -_INT32_LIMIT:
                ints[i] = np.int32(-2147483648)
            else:
                ints[i] = np.int32(np.trunc(v))


@kernel("CAST")
def cast_kernel(ctx: NodeContext):
    """CAST between int32 and float32 (a decoder casts its positions for the rotary
    embedding, and back) through one task function; other pairs take the reference."""
    src, dst = np.dtype(ctx.inputs[0].dtype), np.dtype(ctx.outputs[0].dtype)
    if (src, dst) == (_I32, _FLOATS[0]):
        which = _INT_TO_FLOAT
    elif (src, dst) == (_FLOATS[0], _I32):
        which = _FLOAT_TO_INT
    else:
        return None
    size = int(np.prod(ctx.inputs[0].shape, dtype=np.int64))
    tasks, chunk = row_tasks(size, size, _UNARY_PARALLEL)
    params = np.array([size, chunk, which], np.int64)

    def bind(inputs, outputs):
        return bind_task(_cast_task, tasks, (inputs[0],), (outputs[0],), params, dtypes=(src, dst))
    return bindable(bind)


@kernel("GELU")
def gelu_kernel(ctx: NodeContext):
    """GELU (exact erf form or tanh approximation) through one task function."""
    return float_unary(ctx, _GELU_TANH if ctx.attrs.get("approximate", False) else _GELU)


@kernel("TANH")
def tanh_kernel(ctx: NodeContext):
    """TANH through one task function (XNNPACK's rational fit where LiteRT runs it)."""
    return float_unary(ctx, _TANH)


@kernel("HARD_SWISH")
def hard_swish_kernel(ctx: NodeContext):
    """HARD_SWISH through one task function."""
    return float_unary(ctx, _HARD_SWISH)


@kernel("LOGISTIC")
def logistic_kernel(ctx: NodeContext):
    """LOGISTIC with LiteRT's bits where :mod:`.xnn_sigmoid` knows XNNPACK's kernel
    (through one task function), elsewhere in three numpy passes."""
    return float_unary(ctx, SIGMOID) if xnn_sigmoid.MATCHES_LITERT else _numpy_logistic(ctx)
