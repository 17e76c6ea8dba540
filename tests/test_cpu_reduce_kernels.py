"""The cpu backend's numba MEAN / SUM (any one run of contiguous axes) against float64
numpy, and the shapes left to numpy's reduce."""
from __future__ import annotations

import numpy as np
import pytest

from litegpu.backend import NodeContext
from litegpu.graph import Node
from litegpu.ops import get_op
from litegpu.ops.registry import TensorSpec
from litegpu_cpu.kernels import KERNELS

F32 = np.dtype(np.float32)


def reduce_with_kernel(op: str, x: np.ndarray, axes: tuple[int, ...]) -> tuple[np.ndarray, object]:
    axis = np.array(axes, np.int32)
    kept = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    node = Node(index=0, op=op, opcode=0, version=1, inputs=(0, 1), outputs=(2,))
    ctx = NodeContext(node=node, opdef=get_op(op), attrs={"keep_dims": True},
                      inputs=[TensorSpec(x.shape, F32), TensorSpec(axis.shape, axis.dtype, axis)],
                      outputs=[TensorSpec(kept, F32)])
    run = KERNELS[op](ctx)
    out = np.full(kept, np.nan, np.float32)
    run([x, axis], [out])
    return out, run


@pytest.mark.parametrize("shape,axes,numba_path", [
    ((1, 56, 56, 16), (1, 2), True),       # squeeze-excite mean
    ((2, 60, 40, 7), (1, 2), True),        # batch of two, odd sizes
    ((4, 64, 128), (2,), True),            # LayerNorm means: rows
    ((1, 64, 128), (2,), True),
    ((5, 3), (1,), True),
    ((1, 32), (1,), True),                 # wake-word head
    ((1, 7, 7, 1280), (1, 2), True),       # few pixels of many channels
    ((6, 5, 4), (0,), True),               # leading axis
    ((2, 3, 4, 5), (1, 2, 3), True),       # trailing axes
    ((3, 0, 4), (2,), True),               # empty outer
    ((3, 4, 5), (0, 2), False),            # not one run of axes: numpy
])
@pytest.mark.parametrize("op", ["MEAN", "SUM"])
def test_reductions_match_float64(shape, axes, numba_path, op):
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    out, run = reduce_with_kernel(op, x, axes)
    assert hasattr(run, "bind") == numba_path
    want = x.astype(np.float64).sum(axis=axes, keepdims=True)
    if op == "MEAN":
        want /= np.prod([shape[a] for a in axes])
    np.testing.assert_allclose(out, want, rtol=2e-6, atol=2e-6)
