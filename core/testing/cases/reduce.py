"""Conformance cases for ops along axes: reductions (axes scalar, vector, negative,
repeated, keep_dims), SOFTMAX / LOG_SOFTMAX, L2_NORMALIZATION, ARG_MAX / ARG_MIN,
CUMSUM and RFFT2D.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from . import Case
from .elementwise import Const, ints, normal, op_case

F32, I8, U8, I32, I64, BOOL = np.float32, np.int8, np.uint8, np.int32, np.int64, np.bool_


def _reduced(shape: Sequence[int], axes: Any, keep_dims: bool) -> tuple[int, ...]:
    """Expected output shape, written independently of the op module's helper."""
    rank = len(shape)
    norm = {int(a) % rank for a in np.asarray(axes).reshape(-1)}
    if keep_dims:
        return tuple(1 if i in norm else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in norm)


def _gen(dtype):
    dt = np.dtype(dtype)
    if dt == np.bool_:
        return lambda rng, s: rng.random(s) < 0.6
    if dt.kind in "iu":
        low = 0 if dt.kind == "u" else -30
        return lambda rng, s: ints(rng, s, low, 30, dtype)
    return lambda rng, s: normal(rng, s)


def reduce_case(op: str, variant: str, shape, axes, keep_dims: bool, dtype=F32, *, gen=None,
                axes_input: bool = False, tol: float = 1e-5) -> Case:
    """A reduction of a random ``shape`` input over constant (or fed) ``axes``."""
    gen = gen or _gen(dtype)
    axes_arr = np.asarray(axes, dtype=np.int32)

    def make(rng):
        x = gen(rng, shape)
        return [x, axes_arr if axes_input else Const(axes_arr)], _reduced(shape, axes_arr, keep_dims), x.dtype
    return op_case(op, variant, make, tol=tol, keep_dims=keep_dims)


def _near_one(rng, shape):
    return rng.uniform(0.6, 1.5, size=shape).astype(F32)


def _reduction_cases() -> list[Case]:
    cases = []
    for op in ("MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD"):
        gen = _near_one if op == "REDUCE_PROD" else None
        for keep in (False, True):
            k = "keep" if keep else "drop"
            cases += [
                reduce_case(op, f"f32-hw-{k}", (2, 4, 5, 3), [1, 2], keep, gen=gen),
                reduce_case(op, f"f32-last-{k}", (3, 4, 6), [2], keep, gen=gen),
                reduce_case(op, f"f32-negative-scalar-{k}", (3, 4, 6), -2, keep, gen=gen),
                reduce_case(op, f"f32-all-{k}", (2, 3, 4), [0, 1, 2], keep, gen=gen),
            ]
        cases += [
            reduce_case(op, "f32-duplicated-axes", (2, 3, 4, 5), [1, -3, 3], False, gen=gen),
            reduce_case(op, "f32-axis0", (5, 4), [0], False, gen=gen),
            reduce_case(op, "f32-rank1", (9,), [0], False, gen=gen),
            reduce_case(op, "f32-rank5", (2, 3, 2, 2, 3), [1, 4], True, gen=gen),
            # Fed, not constant: a zero-size constant has no buffer data to read.
            reduce_case(op, "f32-empty-axes", (2, 3), np.zeros(0, np.int32), False, gen=gen, axes_input=True),
            reduce_case(op, "f32-axes-input", (3, 4, 5), [0, 2], False, gen=gen, axes_input=True),
            reduce_case(op, "int32", (3, 4, 5), [1], False, I32,
                        gen=(lambda r, s: ints(r, s, -3, 3, I32)) if op == "REDUCE_PROD" else None),
            reduce_case(op, "int64-keep", (3, 4, 5), [0, 2], True, I64,
                        gen=(lambda r, s: ints(r, s, -3, 3, I64)) if op == "REDUCE_PROD" else None),
        ]
    for op in ("REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD"):
        small = op == "REDUCE_PROD"
        cases += [
            reduce_case(op, "int8", (3, 4), [1], False, I8,
                        gen=(lambda r, s: ints(r, s, -3, 3, I8)) if small else None),
            reduce_case(op, "uint8", (3, 4), [0], True, U8,
                        gen=(lambda r, s: ints(r, s, 0, 4, U8)) if small else None),
        ]
    cases.append(reduce_case("REDUCE_PROD", "int8-wraps", (2, 6), [1], False, I8,
                             gen=lambda r, s: ints(r, s, -9, 9, I8)))
    cases.append(reduce_case("MEAN", "int32-truncates-negative", (4, 3), [1], False, I32,
                             gen=lambda r, s: ints(r, s, -10, 10, I32)))
    for op in ("REDUCE_ANY", "REDUCE_ALL"):
        for keep in (False, True):
            cases.append(reduce_case(op, f"bool-{'keep' if keep else 'drop'}", (3, 4, 5), [1, -1], keep, BOOL))
        cases.append(reduce_case(op, "bool-all", (2, 3), [0, 1], False, BOOL))
        cases.append(reduce_case(op, "bool-scalar-axis", (4, 3), 0, False, BOOL))
    return cases


def _softmax_cases() -> list[Case]:
    def one(op, variant, shape, scale=3.0, **options):
        def make(rng):
            return [normal(rng, shape, scale)], shape, F32
        return op_case(op, variant, make, **options)
    return [
        one("SOFTMAX", "rank2-beta1", (4, 10), beta=1.0),
        one("SOFTMAX", "rank4-beta1", (1, 2, 3, 8), beta=1.0),
        one("SOFTMAX", "rank1-beta0.5", (16,), beta=0.5),
        one("SOFTMAX", "rank3-beta2", (2, 3, 5), beta=2.0),
        one("SOFTMAX", "rank5-beta1", (1, 2, 2, 2, 6), beta=1.0),
        one("SOFTMAX", "large-logits", (3, 7), scale=40.0, beta=1.0),
        one("SOFTMAX", "last-dim-1", (4, 1), beta=1.0),
        one("LOG_SOFTMAX", "rank2", (4, 10)),
        one("LOG_SOFTMAX", "rank4", (1, 2, 3, 8)),
        one("LOG_SOFTMAX", "rank1", (16,)),
        one("LOG_SOFTMAX", "large-logits", (3, 7), scale=40.0),
        one("L2_NORMALIZATION", "rank2", (4, 10)),
        one("L2_NORMALIZATION", "rank4", (1, 3, 3, 8)),
        one("L2_NORMALIZATION", "rank1", (12,)),
        one("L2_NORMALIZATION", "tiny-norm-epsilon", (2, 4), scale=1e-8),
    ]


def arg_case(op: str, variant: str, shape, axis, out_dtype, dtype=F32, axis_dtype=I32) -> Case:
    """ARG_MAX / ARG_MIN over a constant ``axis``; the values include ties for int inputs."""
    gen = _gen(dtype)
    if np.dtype(dtype).kind in "iu":
        gen = lambda rng, s: ints(rng, s, 0, 5, dtype)  # noqa: E731  small range: ties occur
    ax = np.asarray(axis, dtype=axis_dtype)

    def make(rng):
        x = gen(rng, shape)
        rank = len(shape)
        a = int(ax.reshape(-1)[0]) % rank
        return [x, Const(ax)], tuple(d for i, d in enumerate(shape) if i != a), out_dtype
    return op_case(op, variant, make, output_type=out_dtype)


def _arg_cases() -> list[Case]:
    cases = []
    for op in ("ARG_MAX", "ARG_MIN"):
        cases += [
            arg_case(op, "f32-last-int32", (3, 4, 5), [2], I32),
            arg_case(op, "f32-axis0-int64", (3, 4, 5), [0], I64),
            arg_case(op, "f32-negative-axis", (2, 3, 4, 5), [-3], I32),
            arg_case(op, "f32-scalar-axis", (6, 7), 1, I64),
            arg_case(op, "f32-rank1", (11,), [0], I32),
            arg_case(op, "f32-int64-axis-tensor", (3, 4), [1], I32, axis_dtype=I64),
            arg_case(op, "int32-ties", (4, 6), [1], I32, I32),
            arg_case(op, "uint8-ties", (4, 6), [0], I64, U8),
            arg_case(op, "int8-ties", (4, 6), [1], I32, I8),
            arg_case(op, "bool", (4, 6), [1], I32, BOOL),
        ]
    return cases


def _cumsum_cases() -> list[Case]:
    def cum(variant, shape, axis, dtype=F32, exclusive=False, reverse=False):
        def make(rng):
            return [_gen(dtype)(rng, shape), Const(np.asarray(axis, I32))], shape, dtype
        return op_case("CUMSUM", variant, make, exclusive=exclusive, reverse=reverse)
    cases = []
    for ex in (False, True):
        for rev in (False, True):
            name = f"f32{'-exclusive' if ex else ''}{'-reverse' if rev else ''}"
            cases.append(cum(name, (3, 5, 4), 1, exclusive=ex, reverse=rev))
    cases += [
        cum("f32-negative-axis", (3, 5, 4), -1),
        cum("f32-axis0-exclusive", (6, 3), 0, exclusive=True),
        cum("f32-rank1-reverse", (10,), 0, reverse=True),
        cum("int32", (4, 6), 1, I32),
        cum("int32-exclusive-reverse", (4, 6), 0, I32, exclusive=True, reverse=True),
        cum("int64", (4, 6), -1, I64),
    ]
    return cases


def _rfft_cases() -> list[Case]:
    def rfft(variant, shape, length):
        out = tuple(shape[:-2]) + (length[0], length[1] // 2 + 1)

        def make(rng):
            return [normal(rng, shape, 1.0), Const(np.asarray(length, I32))], out, np.complex64
        return op_case("RFFT2D", variant, make, tol=1e-5)
    return [
        rfft("exact", (8, 8), (8, 8)),
        rfft("batch-rank3", (2, 4, 16), (4, 16)),
        rfft("crop", (2, 5, 6), (4, 4)),
        rfft("zero-pad", (2, 5, 6), (8, 8)),
        rfft("rank4-mixed", (1, 2, 3, 9), (4, 8)),
        rfft("width-2", (3, 4, 2), (4, 2)),
    ]


CASES: list[Case] = _reduction_cases() + _softmax_cases() + _arg_cases() + _cumsum_cases() + _rfft_cases()
