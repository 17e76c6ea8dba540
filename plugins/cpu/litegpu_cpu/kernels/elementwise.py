"""Elementwise ops: broadcasting binary ops through numpy ufuncs writing ``out=`` (the
fused activation applied in place), simple activations as ufuncs, and numba kernels for
the ones numpy would take several passes for (HARD_SWISH, GELU).
"""
from __future__ import annotations

import math
from functools import partial

import numpy as np
from numba import njit, prange

from litegpu.backend import NodeContext

from .common import activation_in_place
from .registry import kernel
from .mathfn import erf64

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
kernel("MAXIMUM")(_binary(np.maximum))
kernel("MINIMUM")(_binary(np.minimum))


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
kernel("TANH")(_unary(np.tanh))
kernel("EXP")(_unary(np.exp))
kernel("NEG")(_unary(np.negative))
kernel("ABS")(_unary(np.abs))
kernel("SQRT")(_unary(np.sqrt))
kernel("SQUARE")(_unary(np.square))
kernel("RSQRT")(_unary(_rsqrt))
kernel("LOGISTIC")(_unary(_exp_neg, _add_one, np.reciprocal))


@njit(cache=True, parallel=True)
def hard_swish(x, out):
    """``out = x * relu6(x + 3) / 6`` in one pass over flat arrays."""
    for i in prange(x.size):
        v = x[i]
        out[i] = v * min(max(v + np.float32(3), np.float32(0)), np.float32(6)) / np.float32(6)


@njit(cache=True, parallel=True)
def gelu(x, out, approximate):
    """GELU: ``x/2 * (1 + erf(x/sqrt 2))`` (in float64, rounded once), or the tanh
    approximation when ``approximate``."""
    inv_sqrt2 = 0.7071067811865476
    k = np.float32(0.7978845608028654)   # sqrt(2 / pi)
    if approximate:
        for i in prange(x.size):
            v = x[i]
            t = math.tanh(k * (v + np.float32(0.044715) * v * v * v))
            out[i] = np.float32(0.5) * v * (np.float32(1) + t)
    else:
        for i in prange(x.size):
            v = np.float64(x[i])
            out[i] = np.float32(0.5 * v * (1.0 + erf64(v * inv_sqrt2)))


@kernel("HARD_SWISH")
def hard_swish_kernel(ctx: NodeContext):
    """HARD_SWISH through one numba pass."""
    if _dtypes(ctx, _FLOATS) is None:
        return None

    def run(inputs, outputs):
        hard_swish(inputs[0].reshape(-1), outputs[0].reshape(-1))
    return run


@kernel("GELU")
def gelu_kernel(ctx: NodeContext):
    """GELU (exact erf form or tanh approximation) through one numba pass."""
    if _dtypes(ctx, _FLOATS) is None:
        return None
    approximate = bool(ctx.attrs.get("approximate", False))

    def run(inputs, outputs):
        gelu(inputs[0].reshape(-1), outputs[0].reshape(-1), approximate)
    return run

