"""Quantized data movement on the cpu backend: the dtype-generic kernels run it (values are
copied, never computed) and agree with LiteRT, PAD filling with the zero point."""
from __future__ import annotations

import numpy as np
import pytest

import litegpu
from litegpu.testing.builder import ModelBuilder
from litegpu_cpu.kernels import registry

from test_ops_quantized import run_both

Q = {"scale": [0.05], "zero_point": [-7]}
QU = {"scale": [0.05], "zero_point": [131]}


def _model(op: str, dtype, x_shape, out_shape, q: dict, consts=(), **options) -> bytes:
    b = ModelBuilder()
    x = b.input("x", x_shape, dtype, **q)
    ins = [x] + [b.const(f"c{i}", np.asarray(c)) for i, c in enumerate(consts)]
    y = b.tensor("y", out_shape, dtype, **q)
    b.op(op, ins, [y], **options)
    b.output(y)
    return b.build()


CASES = [
    ("PAD", np.int8, (1, 4, 5, 3), (1, 6, 8, 3), Q, [np.array([[0, 0], [1, 1], [2, 1], [0, 0]], np.int32)], {}),
    ("PAD", np.uint8, (2, 3, 6), (2, 5, 6), QU, [np.array([[0, 0], [2, 0], [0, 0]], np.int32)], {}),
    ("TRANSPOSE", np.int8, (2, 3, 4, 5), (2, 4, 3, 5), Q, [np.array([0, 2, 1, 3], np.int32)], {}),
    ("GATHER", np.int8, (10, 6), (4, 6), Q, [np.array([3, 0, 9, 3], np.int32)], {"axis": 0}),
    ("STRIDED_SLICE", np.int8, (1, 8, 8, 4), (1, 4, 3, 4), Q,
     [np.array([0, 0, 1, 0], np.int32), np.array([1, 8, 7, 4], np.int32), np.array([1, 2, 2, 1], np.int32)], {}),
    ("RESHAPE", np.uint8, (2, 3, 4), (6, 4), QU, [np.array([6, 4], np.int32)], {}),
]


@pytest.mark.parametrize("op,dtype,x_shape,out_shape,q,consts,options", CASES,
                         ids=[f"{c[0]}-{np.dtype(c[1]).name}" for c in CASES])
def test_quantized_movement_runs_a_kernel(monkeypatch, op, dtype, x_shape, out_shape, q, consts, options):
    fallbacks = []
    reference = registry.reference_kernel
    monkeypatch.setattr(registry, "reference_kernel", lambda ctx: (fallbacks.append(ctx.node.op), reference(ctx))[1])
    model = _model(op, dtype, x_shape, out_shape, q, consts, **options)
    info = np.iinfo(dtype)
    x = np.random.default_rng(2).integers(info.min, info.max + 1, x_shape).astype(dtype)
    (ours,), (theirs,) = run_both(model, [x])
    np.testing.assert_array_equal(ours, theirs)
    assert op not in fallbacks, f"{op} ran its reference, not a kernel"


def test_quantized_pad_fills_with_the_zero_point():
    model = _model("PAD", np.int8, (1, 2, 2, 1), (1, 4, 4, 1), Q, [np.array([[0, 0], [1, 1], [1, 1], [0, 0]],
                                                                           np.int32)])
    interp = litegpu.Interpreter(model_content=model)
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], np.full((1, 2, 2, 1), 50, np.int8))
    interp.invoke()
    out = interp.get_tensor(interp.get_output_details()[0]["index"])[0, :, :, 0]
    assert out[0, 0] == -7 and out[1, 1] == 50


def test_quantized_fill_copies_the_value_as_litert_does():
    # FILL of a quantized scalar (a GRU's zero initial state in an int8 model): the value is
    # copied, as data movement is; it had no integer reference and the model would not load.
    b = ModelBuilder()
    v = b.input("v", (), np.int8, **Q)
    dims = b.const("dims", np.array([2, 3], np.int32))
    y = b.tensor("y", (2, 3), np.int8, **Q)
    b.op("FILL", [dims, v], [y])
    b.output(y)
    (ours,), (theirs,) = run_both(b.build(), [np.array(-93, np.int8)])
    np.testing.assert_array_equal(ours, theirs)
    assert (ours == -93).all()
