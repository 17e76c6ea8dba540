"""Elementwise ops: unary math and activations, broadcasting binary ops, comparisons,
logical ops, SELECT, CAST and complex parts.

Semantics follow LiteRT's builtin CPU kernels, checked against ``ai_edge_litert``:

- Fused activations of ADD/SUB/MUL/DIV are a clamp range in LiteRT; TANH and SIGN_BIT
  have no range there, so they do nothing. ``attrs`` normalizes them to ``"NONE"`` so a
  kernel that applies ``attrs["activation"]`` matches LiteRT.
- Integer DIV truncates toward zero; FLOOR_DIV floors; FLOOR_MOD takes the divisor's
  sign. A zero divisor is an error where LiteRT reports one (integer DIV, FLOOR_DIV of
  any dtype, integer FLOOR_MOD).
- MAXIMUM is ``a > b ? a : b`` and MINIMUM ``a < b ? a : b``: with a NaN, the second
  operand wins, as in LiteRT (x86's max/min). Which operand is second is XNNPACK's
  choice: see :func:`max_min_swapped` (the ``swapped`` attr).
- CAST from float to an integer truncates and saturates (NaN becomes the maximum);
  integer to integer wraps; anything to bool is ``!= 0``; complex to real keeps the
  real part.

Each op accepts the dtypes LiteRT's kernel runs without quantization parameters;
others raise :class:`UnsupportedError` from ``attrs``.
"""
from __future__ import annotations

import math
from typing import Callable, Iterable

import numpy as np

from ..errors import ExecutionError, ModelFormatError, UnsupportedError
from ..graph import Node
from ..quant import is_quantized
from .registry import (CLAMP_ACTIVATIONS, OpDef, TensorSpec, activation_attr, apply_activation,
                       broadcast_shapes, check_inputs, finite_option, register)

F32 = np.dtype(np.float32)
F64 = np.dtype(np.float64)
I8 = np.dtype(np.int8)
U8 = np.dtype(np.uint8)
I32 = np.dtype(np.int32)
I64 = np.dtype(np.int64)
BOOL = np.dtype(np.bool_)
C64 = np.dtype(np.complex64)
C128 = np.dtype(np.complex128)

FLOAT_ONLY = (F32,)


def check_dtypes(node: Node, tensors, allowed: Iterable[np.dtype] | None, inputs: Iterable[int] = (0,)) -> None:
    """Raise :class:`UnsupportedError` unless each listed input's dtype is in ``allowed``."""
    if allowed is None:
        return
    allowed = tuple(np.dtype(d) for d in allowed)
    for i in inputs:
        if i >= len(node.inputs) or node.inputs[i] < 0:
            continue
        dt = np.dtype(tensors[node.inputs[i]].dtype)
        # Quantized integers are checked by the op's integer reference (litegpu.ops.quantized).
        if dt not in allowed and not is_quantized(tensors[node.inputs[i]]):
            names = ", ".join(d.name for d in allowed)
            raise UnsupportedError(f"input {i} has dtype {dt.name}; {node.op} supports {names}")


def _same_dtypes(node: Node, tensors, inputs: Iterable[int]) -> None:
    """Raise :class:`ModelFormatError` unless the listed inputs share one dtype."""
    idx = [node.inputs[i] for i in inputs if i < len(node.inputs) and node.inputs[i] >= 0]
    dts = {np.dtype(tensors[t].dtype) for t in idx}
    if len(dts) > 1:
        raise ModelFormatError(f"inputs {list(inputs)} have different dtypes {sorted(d.name for d in dts)}")


def _quiet(fn: Callable) -> Callable:
    """Wrap ``fn`` so float overflow/invalid warnings stay silent (LiteRT yields inf/NaN too)."""
    def wrapped(*args):
        with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
            return fn(*args)
    return wrapped


# -- unary ---------------------------------------------------------------------------------

def _unary_attrs_for(dtypes: Iterable[np.dtype] | None):
    def attrs(node: Node, tensors) -> dict:
        check_inputs(node, 1)
        check_dtypes(node, tensors, dtypes)
        return {}
    return attrs


_unary_attrs = _unary_attrs_for(None)


def _same_as_input(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    x = inputs[0]
    return [TensorSpec(x.shape, x.dtype)]


def unary(name: str, fn: Callable[[np.ndarray], np.ndarray], doc: str = "", *,
          dtypes: Iterable[np.dtype] | None = None) -> OpDef:
    """Register an elementwise op of one input whose output has the input's shape and dtype.

    ``dtypes`` (when given) are the input dtypes the op accepts.
    """
    quiet = _quiet(fn)

    def reference(inputs, attrs):
        x = inputs[0]
        return [np.asarray(quiet(x)).astype(x.dtype, copy=False)]

    return register(OpDef(name=name, attrs=_unary_attrs_for(dtypes), infer=_same_as_input,
                          reference=reference, doc=doc or f"{name} elementwise."))


# -- binary --------------------------------------------------------------------------------

def _binary_attrs_for(fused: bool, dtypes: Iterable[np.dtype] | None):
    def attrs(node: Node, tensors) -> dict:
        check_inputs(node, 2)
        check_dtypes(node, tensors, dtypes, (0, 1))
        _same_dtypes(node, tensors, (0, 1))
        if not fused:
            return {}
        act = activation_attr(node.options)
        if act not in CLAMP_ACTIVATIONS:
            act = "NONE"  # LiteRT has no clamp range for TANH / SIGN_BIT here: a no-op.
        if act != "NONE" and np.dtype(tensors[node.inputs[0]].dtype).kind == "c":
            raise UnsupportedError(f"fused activation {act} on complex inputs")
        return {"activation": act}
    return attrs


# Kept for callers of the original helper.
_binary_attrs = _binary_attrs_for(True, None)


def _binary_infer(out_dtype: np.dtype | None):
    def infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
        a, b = inputs
        dtype = a.dtype if out_dtype is None else np.dtype(out_dtype)
        return [TensorSpec(broadcast_shapes(a.shape, b.shape), dtype)]
    return infer


def binary(name: str, fn: Callable[[np.ndarray, np.ndarray], np.ndarray], *, fused: bool = False,
           out_dtype: np.dtype | None = None, doc: str = "",
           dtypes: Iterable[np.dtype] | None = None) -> OpDef:
    """Register a numpy-broadcasting binary op, optionally with a fused activation.

    ``dtypes`` (when given) are the input dtypes the op accepts; both inputs must
    share one dtype. ``out_dtype`` fixes the output dtype (comparisons: bool).
    """
    quiet = _quiet(fn)

    def reference(inputs, attrs):
        a, b = inputs
        y = np.asarray(quiet(a, b))
        if fused:
            y = apply_activation(y, attrs["activation"])
        return [y.astype(a.dtype if out_dtype is None else out_dtype, copy=False)]

    return register(OpDef(name=name, attrs=_binary_attrs_for(fused, dtypes), infer=_binary_infer(out_dtype),
                          reference=reference, doc=doc or f"{name} with numpy broadcasting."))


def _is_int(x: np.ndarray) -> bool:
    return x.dtype.kind in "iu"


def _no_zero(b: np.ndarray, op: str) -> None:
    if np.any(b == 0):
        raise ExecutionError(f"{op}: division by zero")


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """DIV: float division; integers truncate toward zero like C."""
    if not _is_int(a):
        return a / b
    _no_zero(b, "DIV")
    q = np.floor_divide(a, b)
    # floor and truncation differ by one where the signs differ and there is a remainder.
    fix = (np.remainder(a, b) != 0) & ((a < 0) != (b < 0))
    return q + fix.astype(q.dtype)


def _floor_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """FLOOR_DIV: ``floor(a / b)``; LiteRT rejects a zero divisor for every dtype."""
    _no_zero(b, "FLOOR_DIV")
    if _is_int(a):
        return np.floor_divide(a, b)
    # floor of the rounded quotient, as LiteRT (numpy's floor_divide is divmod-based).
    return np.floor(a / b)


def _floor_mod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """FLOOR_MOD: remainder with the divisor's sign."""
    if _is_int(a):
        _no_zero(b, "FLOOR_MOD")
        return np.remainder(a, b)
    r = np.fmod(a, b)
    return np.where((r != 0) & ((b < 0) != (r < 0)), r + b, r)


def _pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """POW; LiteRT rejects negative integer exponents."""
    if _is_int(b) and np.any(b < 0):
        raise ExecutionError("POW: negative exponent for an integer input")
    return np.power(a, b)


def _maximum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.where(a > b, a, b)


def _minimum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.where(a < b, a, b)


def max_min_swapped(a_shape, b_shape, a_const: bool, b_const: bool) -> bool:
    """Whether LiteRT computes MAXIMUM / MINIMUM of ``(a, b)`` with ``b`` as the first
    operand, ``b > a ? b : a``, which decides which NaN survives (probed against
    ai_edge_litert 2.3 on x86-64). XNNPACK puts an operand it broadcasts along the
    innermost axis second (its kernels with one operand per row), except a constant of
    one element, which the delegate turns into a clamp of the other operand: first.
    Otherwise ``a`` is first."""
    a_size, b_size = int(np.prod(a_shape, dtype=np.int64)), int(np.prod(b_shape, dtype=np.int64))
    if a_const and a_size == 1 and b_size != 1:
        return False
    if b_const and b_size == 1 and a_size != 1:
        return True
    out = broadcast_shapes(tuple(a_shape), tuple(b_shape))
    inner = max((i for i, d in enumerate(out) if d != 1), default=None)
    if inner is None:
        return False

    def dim(shape) -> int:
        k = inner - (len(out) - len(shape))
        return int(shape[k]) if k >= 0 else 1
    return dim(a_shape) == 1 and dim(b_shape) != 1


def _max_min_attrs(node: Node, tensors) -> dict:
    """MAXIMUM / MINIMUM: the dtypes, and ``swapped`` (:func:`max_min_swapped`)."""
    _binary_attrs_for(False, (F32, I32, I64, I8, U8))(node, tensors)
    a, b = (tensors[i] for i in node.inputs[:2])
    return {"swapped": max_min_swapped(a.shape, b.shape, a.data is not None, b.data is not None)}


def _squared_difference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    d = a - b
    return d * d


NUMERIC = (F32, I32, I64)
binary("ADD", np.add, fused=True, dtypes=NUMERIC)
binary("SUB", np.subtract, fused=True, dtypes=NUMERIC)
binary("MUL", np.multiply, fused=True, dtypes=(F32, I32, I64, C64))
binary("DIV", _div, fused=True, dtypes=(F32, I32), doc="DIV; integers truncate toward zero.")
for _name, _fn in (("MAXIMUM", _maximum), ("MINIMUM", _minimum)):
    register(OpDef(name=_name, attrs=_max_min_attrs, infer=_binary_infer(None),
                   reference=lambda inputs, attrs, fn=_fn: [fn(*(inputs[::-1] if attrs.get("swapped") else inputs))],
                   doc=f"{_name}: the first operand where it wins the comparison, else the second "
                       "(which wins on NaN; see max_min_swapped)."))
binary("POW", _pow, dtypes=(F32, I32))
binary("SQUARED_DIFFERENCE", _squared_difference, dtypes=(F32, I32))
binary("FLOOR_DIV", _floor_div, dtypes=(F32, I32, I8), doc="FLOOR_DIV: floor(a / b), toward -inf.")
binary("FLOOR_MOD", _floor_mod, dtypes=(F32, I32, I64, I8), doc="FLOOR_MOD: remainder with the divisor's sign.")

binary("EQUAL", np.equal, out_dtype=BOOL, dtypes=(F32, I32, I64, BOOL))
binary("NOT_EQUAL", np.not_equal, out_dtype=BOOL, dtypes=(F32, I32, I64, BOOL))
for _name, _fn in [("LESS", np.less), ("LESS_EQUAL", np.less_equal), ("GREATER", np.greater),
                   ("GREATER_EQUAL", np.greater_equal)]:
    binary(_name, _fn, out_dtype=BOOL, dtypes=NUMERIC)
binary("LOGICAL_AND", np.logical_and, out_dtype=BOOL, dtypes=(BOOL,))
binary("LOGICAL_OR", np.logical_or, out_dtype=BOOL, dtypes=(BOOL,))


# -- unary math and activations --------------------------------------------------------------

def _logistic(x: np.ndarray) -> np.ndarray:
    return np.asarray(1, x.dtype) / (np.asarray(1, x.dtype) + np.exp(-x))


def _elu(x: np.ndarray) -> np.ndarray:
    return np.where(x < 0, np.expm1(x), x)


def _hard_swish(x: np.ndarray) -> np.ndarray:
    """``x * relu6(x + 3) / 6`` as XNNPACK computes it, ``x * clamp(fma(x, 1/6, 1/2), 0, 1)``:
    3e38 stays finite where the textbook order overflows. The product is exact in float64
    and the sum is rounded twice, to float64 and then float32, which gave the fused result
    on all of 500,000 values compared with LiteRT."""
    sixth = np.float64(np.float32(1 / 6))
    with np.errstate(invalid="ignore", over="ignore"):
        scaled = (x.astype(np.float64) * sixth + 0.5).astype(x.dtype)
        return x * np.clip(scaled, 0, 1)


_erf = np.vectorize(math.erf, otypes=[np.float64])


#: GELU's tanh form: ``x/2 * (1 + tanh(SQRT_2_OVER_PI * (x + GELU_TANH_CUBIC * x**3)))``.
SQRT_2_OVER_PI = math.sqrt(2 / math.pi)
GELU_TANH_CUBIC = 0.044715


def gelu(x: np.ndarray, approximate: bool) -> np.ndarray:
    """GELU: ``x * Phi(x)``; ``approximate`` uses the tanh form. Computed in float64."""
    v = x.astype(np.float64)
    if approximate:
        inner = SQRT_2_OVER_PI * (v + GELU_TANH_CUBIC * v ** 3)
        y = 0.5 * v * (1 + np.tanh(inner))
    else:
        y = 0.5 * v * (1 + _erf(v / math.sqrt(2)))
    return y.astype(x.dtype)


unary("ABS", np.abs, dtypes=(F32, I32))
unary("NEG", np.negative, dtypes=(F32, I32, I64, I8))
unary("SIGN", np.sign, dtypes=(F32, F64, I32))
unary("EXP", np.exp, dtypes=FLOAT_ONLY)
unary("LOG", np.log, dtypes=FLOAT_ONLY)
unary("SIN", np.sin, dtypes=FLOAT_ONLY)
unary("COS", np.cos, dtypes=FLOAT_ONLY)
unary("SQRT", np.sqrt, dtypes=FLOAT_ONLY)
unary("RSQRT", lambda x: np.asarray(1, x.dtype) / np.sqrt(x), dtypes=FLOAT_ONLY)
unary("SQUARE", lambda x: x * x, dtypes=FLOAT_ONLY)
unary("TANH", np.tanh, dtypes=FLOAT_ONLY)
unary("LOGISTIC", _logistic, dtypes=FLOAT_ONLY)
for _clamp in ("RELU", "RELU6", "RELU_N1_TO_1", "RELU_0_TO_1"):   # the activations' clamps, as ops
    unary(_clamp, lambda x, name=_clamp: apply_activation(x, name), dtypes=FLOAT_ONLY)
unary("ELU", _elu, dtypes=FLOAT_ONLY)
unary("HARD_SWISH", _hard_swish, dtypes=FLOAT_ONLY, doc="HARD_SWISH: x * relu6(x + 3) / 6, in XNNPACK's order.")
unary("FLOOR", np.floor, dtypes=FLOAT_ONLY)
unary("CEIL", np.ceil, dtypes=FLOAT_ONLY)
unary("ROUND", np.round, dtypes=FLOAT_ONLY, doc="ROUND: half to even, like TF.")
unary("ZEROS_LIKE", np.zeros_like, dtypes=(F32, I32, I64))
unary("LOGICAL_NOT", np.logical_not, dtypes=(BOOL,))


def _gelu_attrs(node: Node, tensors) -> dict:
    check_inputs(node, 1)
    check_dtypes(node, tensors, FLOAT_ONLY)
    return {"approximate": bool(node.options.get("approximate", False))}


register(OpDef(name="GELU", attrs=_gelu_attrs, infer=_same_as_input,
               reference=lambda inputs, attrs: [gelu(inputs[0], attrs["approximate"])],
               doc="GELU: exact (erf) or, with ``approximate``, the tanh approximation."))


def _leaky_relu_attrs(node: Node, tensors) -> dict:
    check_inputs(node, 1)
    check_dtypes(node, tensors, FLOAT_ONLY)
    return {"alpha": finite_option(node, "alpha")}


def _leaky_relu(inputs, attrs):
    x = inputs[0]
    return [np.where(x > 0, x, x * np.asarray(attrs["alpha"], x.dtype)).astype(x.dtype, copy=False)]


register(OpDef(name="LEAKY_RELU", attrs=_leaky_relu_attrs, infer=_same_as_input, reference=_leaky_relu,
               doc="LEAKY_RELU: x if x > 0 else alpha * x."))


# -- PRELU ---------------------------------------------------------------------------------

def _prelu_attrs(node: Node, tensors) -> dict:
    check_inputs(node, 2)
    check_dtypes(node, tensors, FLOAT_ONLY, (0, 1))
    # LiteRT's two kernels differ: XNNPACK (float32, constant alpha) broadcasts the input
    # up to alpha's shape too; the builtin kernel (runtime alpha) requires the output to
    # keep the input's shape (activations.cc: HaveSameShapes(input, output)).
    x, alpha = tensors[node.inputs[0]], tensors[node.inputs[1]]
    return {"broadcast_input": x.dtype == np.float32 and alpha.is_constant}


def _prelu_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    x, alpha = inputs
    shape = broadcast_shapes(x.shape, alpha.shape)
    if shape != tuple(x.shape) and not attrs.get("broadcast_input"):
        raise ModelFormatError(f"PRELU alpha (input 1) {list(alpha.shape)} must broadcast into input 0 "
                               f"{list(x.shape)} when alpha is not a constant")
    return [TensorSpec(shape, x.dtype)]


def _prelu(inputs, attrs):
    x, alpha = inputs
    return [np.where(x >= 0, x, x * alpha).astype(x.dtype, copy=False)]


register(OpDef(name="PRELU", attrs=_prelu_attrs, infer=_prelu_infer, reference=_prelu,
               doc="PRELU: x if x >= 0 else alpha * x, x and alpha broadcast together."))


# -- SELECT / SELECT_V2 --------------------------------------------------------------------

SELECT_DTYPES = (F32, I32, I64, I8, U8, BOOL)


def _select_attrs(node: Node, tensors) -> dict:
    check_inputs(node, 3)
    check_dtypes(node, tensors, (BOOL,), (0,))
    check_dtypes(node, tensors, SELECT_DTYPES, (1, 2))
    _same_dtypes(node, tensors, (1, 2))
    return {}


def _select_v1_shape(cond: tuple, x: tuple, y: tuple) -> tuple[int, ...]:
    """SELECT's TF1 rule: all equal, or a scalar / rank-1 (length of dim 0) condition."""
    if tuple(x) != tuple(y):
        raise ModelFormatError(f"SELECT inputs {list(x)} and {list(y)} must have the same shape")
    if tuple(cond) == tuple(x) or len(cond) == 0:
        return tuple(x)
    if len(cond) == 1 and len(x) >= 1 and cond[0] == x[0]:
        return tuple(x)
    raise ModelFormatError(f"SELECT condition {list(cond)} must equal {list(x)}, be a scalar, or be "
                           f"rank 1 of length {x[0] if x else 1}")


def _select_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    c, x, y = inputs
    return [TensorSpec(_select_v1_shape(c.shape, x.shape, y.shape), x.dtype)]


def _select(inputs, attrs):
    c, x, y = inputs
    _select_v1_shape(c.shape, x.shape, y.shape)
    if c.ndim == 1 and x.ndim > 1:
        c = c.reshape(c.shape + (1,) * (x.ndim - 1))  # selects whole slices along dim 0
    return [np.where(c, x, y).astype(x.dtype, copy=False)]


def _select_v2_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    c, x, y = inputs
    return [TensorSpec(broadcast_shapes(c.shape, x.shape, y.shape), x.dtype)]


register(OpDef(name="SELECT", attrs=_select_attrs, infer=_select_infer, reference=_select,
               doc="SELECT (TF1 where): condition equal-shaped, scalar, or rank 1 over dim 0."))
register(OpDef(name="SELECT_V2", attrs=_select_attrs, infer=_select_v2_infer,
               reference=lambda inputs, attrs: [np.where(*inputs).astype(inputs[1].dtype, copy=False)],
               doc="SELECT_V2: condition, x and y broadcast together."))


# -- ADD_N ---------------------------------------------------------------------------------

def _add_n_attrs(node: Node, tensors) -> dict:
    if len(node.inputs) < 1:
        raise ModelFormatError("expects at least 1 input, has 0")
    check_dtypes(node, tensors, (F32, I32), range(len(node.inputs)))
    _same_dtypes(node, tensors, range(len(node.inputs)))
    return {}


def _add_n_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    first = inputs[0]
    for i, spec in enumerate(inputs[1:], 1):
        if tuple(spec.shape) != tuple(first.shape):
            raise ModelFormatError(f"ADD_N input {i} has shape {list(spec.shape)}, input 0 {list(first.shape)}")
    return [TensorSpec(first.shape, first.dtype)]


def _add_n(inputs, attrs):
    acc = inputs[0].copy()
    for x in inputs[1:]:
        acc += x  # summed in order, in the input dtype, as LiteRT
    return [acc]


register(OpDef(name="ADD_N", attrs=_add_n_attrs, infer=_add_n_infer, reference=_add_n,
               doc="ADD_N: the sum of equal-shaped inputs (no broadcasting)."))


# -- CAST ----------------------------------------------------------------------------------

CAST_DTYPES = tuple(np.dtype(d) for d in (np.float32, np.float16, np.float64, np.int8, np.uint8, np.int16,
                                          np.uint16, np.int32, np.uint32, np.int64, np.bool_, np.complex64))


def _cast_attrs(node: Node, tensors) -> dict:
    check_inputs(node, 1)
    if len(node.outputs) != 1:
        raise ModelFormatError(f"expects 1 output, has {len(node.outputs)}")
    check_dtypes(node, tensors, CAST_DTYPES)
    out = tensors[node.outputs[0]].dtype
    if out is None or np.dtype(out) not in CAST_DTYPES:
        raise UnsupportedError(f"cast to {getattr(out, 'name', out)} is not supported")
    # LiteRT takes the types from the tensors, not from CastOptions.
    return {"out_dtype": np.dtype(out)}


def cast_like_litert(x: np.ndarray, out_dtype: np.dtype) -> np.ndarray:
    """Convert ``x`` to ``out_dtype`` the way LiteRT's CAST does (see the module docstring)."""
    out_dtype = np.dtype(out_dtype)
    x = np.asarray(x)
    if x.dtype.kind == "c" and out_dtype.kind != "c":
        x = x.real
    if out_dtype == BOOL:
        return x != 0
    if x.dtype.kind == "f" and out_dtype.kind in "iu":
        info = np.iinfo(out_dtype)
        v = x.astype(np.float64)
        with np.errstate(invalid="ignore"):
            high = ~(v < float(info.max))  # NaN saturates to the maximum too
            low = v <= float(info.min)
        safe = np.where(high | low, 0.0, v)
        y = np.trunc(safe).astype(out_dtype)
        y[high] = info.max
        y[low] = info.min
        return y
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(out_dtype)


register(OpDef(name="CAST", attrs=_cast_attrs,
               infer=lambda inputs, attrs: [TensorSpec(inputs[0].shape, attrs["out_dtype"])],
               reference=lambda inputs, attrs: [cast_like_litert(inputs[0], attrs["out_dtype"])],
               doc="CAST between the input and output tensors' dtypes, as LiteRT converts."))


# -- complex parts -------------------------------------------------------------------------

def _complex_attrs(node: Node, tensors) -> dict:
    check_inputs(node, 1)
    check_dtypes(node, tensors, (C64, C128))
    return {}


def _real_dtype(dtype: np.dtype) -> np.dtype:
    return F64 if np.dtype(dtype) == C128 else F32


def _complex_part(name: str, fn: Callable[[np.ndarray], np.ndarray], doc: str) -> None:
    register(OpDef(name=name, attrs=_complex_attrs,
                   infer=lambda inputs, attrs: [TensorSpec(inputs[0].shape, _real_dtype(inputs[0].dtype))],
                   reference=lambda inputs, attrs: [np.asarray(fn(inputs[0])).astype(_real_dtype(inputs[0].dtype))],
                   doc=doc))


_complex_part("COMPLEX_ABS", np.abs, "COMPLEX_ABS: magnitude of a complex tensor.")
_complex_part("REAL", np.real, "REAL: real part of a complex tensor.")
_complex_part("IMAG", np.imag, "IMAG: imaginary part of a complex tensor.")
