"""Numpy kernels of the example backend, by op name.

A kernel takes the input arrays and the node's normalized attributes and returns the
output arrays. They are this backend's own code: litegpu's op references are never
called, so the conformance suite really checks them.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

Kernel = Callable[[list, dict], list]

# Fused activations a binary op may carry (attrs["activation"], as litegpu normalizes
# them: LiteRT applies these as a clamp range, and litegpu maps the others to NONE).
ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "NONE": lambda x: x,
    "RELU": lambda x: np.maximum(x, np.float32(0)),
    "RELU6": lambda x: np.minimum(np.maximum(x, np.float32(0)), np.float32(6)),
    "RELU_N1_TO_1": lambda x: np.minimum(np.maximum(x, np.float32(-1)), np.float32(1)),
}


def _logistic(x: np.ndarray) -> np.ndarray:
    # Split by sign so exp never overflows: 1/(1+e^-x) for x >= 0, e^x/(1+e^x) otherwise.
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e)).astype(np.float32)


UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "RELU": lambda x: np.maximum(x, np.float32(0)),
    "RELU6": lambda x: np.clip(x, np.float32(0), np.float32(6)),
    "LOGISTIC": _logistic,
    "TANH": np.tanh,
    "EXP": np.exp,
    "ABS": np.abs,
    "NEG": np.negative,
    "SQUARE": np.square,
}

BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "ADD": np.add,
    "SUB": np.subtract,
    "MUL": np.multiply,
    "DIV": np.divide,
    "MAXIMUM": np.maximum,
    "MINIMUM": np.minimum,
}
FUSED = {"ADD", "SUB", "MUL", "DIV"}  # binary ops that carry a fused activation


def _unary(fn) -> Kernel:
    def run(inputs: list, attrs: dict) -> list:
        return [np.asarray(fn(inputs[0]), dtype=np.float32)]
    return run


def _binary(fn, fused: bool) -> Kernel:
    def run(inputs: list, attrs: dict) -> list:
        y = fn(inputs[0], inputs[1])
        if fused:
            y = ACTIVATIONS[attrs.get("activation", "NONE")](y)
        return [np.asarray(y, dtype=np.float32)]
    return run


KERNELS: dict[str, Kernel] = {
    **{op: _unary(fn) for op, fn in UNARY.items()},
    **{op: _binary(fn, op in FUSED) for op, fn in BINARY.items()},
}
