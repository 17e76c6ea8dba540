"""Elementwise ops: unary math and activations, broadcasting binary ops, comparisons."""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..graph import Node
from .registry import (OpDef, TensorSpec, activation_attr, apply_activation, broadcast_shapes,
                       check_inputs, register)


def _unary_attrs(node: Node, tensors) -> dict:
    check_inputs(node, 1)
    return {}


def _same_as_input(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    x = inputs[0]
    return [TensorSpec(x.shape, x.dtype)]


def unary(name: str, fn: Callable[[np.ndarray], np.ndarray], doc: str = "") -> OpDef:
    """Register an elementwise op of one input whose output has the input's shape and dtype."""
    def reference(inputs, attrs):
        x = inputs[0]
        return [np.asarray(fn(x)).astype(x.dtype, copy=False)]

    return register(OpDef(name=name, attrs=_unary_attrs, infer=_same_as_input, reference=reference,
                          doc=doc or f"{name} elementwise."))


def _binary_attrs(node: Node, tensors) -> dict:
    check_inputs(node, 2)
    return {"activation": activation_attr(node.options)}


def _binary_infer(out_dtype: np.dtype | None):
    def infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
        a, b = inputs
        dtype = a.dtype if out_dtype is None else out_dtype
        return [TensorSpec(broadcast_shapes(a.shape, b.shape), dtype)]
    return infer


def binary(name: str, fn: Callable[[np.ndarray, np.ndarray], np.ndarray], *, fused: bool = False,
           out_dtype: np.dtype | None = None, doc: str = "") -> OpDef:
    """Register a numpy-broadcasting binary op, optionally with a fused activation."""
    def reference(inputs, attrs):
        a, b = inputs
        y = np.asarray(fn(a, b))
        if fused:
            y = apply_activation(y, attrs["activation"])
        return [y.astype(a.dtype if out_dtype is None else out_dtype, copy=False)]

    attrs = _binary_attrs if fused else (lambda node, tensors: (check_inputs(node, 2), {})[1])
    return register(OpDef(name=name, attrs=attrs, infer=_binary_infer(out_dtype), reference=reference,
                          doc=doc or f"{name} with numpy broadcasting."))


binary("ADD", np.add, fused=True)
binary("SUB", np.subtract, fused=True)
binary("MUL", np.multiply, fused=True)
binary("MAXIMUM", np.maximum)
binary("MINIMUM", np.minimum)

unary("RELU", lambda x: np.maximum(x, 0))
unary("RELU6", lambda x: np.clip(x, 0, 6))
unary("LOGISTIC", lambda x: 1 / (1 + np.exp(-x)))
unary("EXP", np.exp)
unary("TANH", np.tanh)
