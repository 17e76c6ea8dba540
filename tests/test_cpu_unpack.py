"""UNPACK on the cpu backend (litegpu_cpu.kernels.indexing.unpack): pure data movement, one
kernel for every dtype (float and quantized nodes alike), any axis, any number of outputs
(seven to a task function, chained), equal to LiteRT."""
from __future__ import annotations

import numpy as np
import pytest

from litegpu.testing.builder import ModelBuilder

from test_cpu_qmatmul import check

KERNEL = "indexing.unpack"


def unpack_model(shape: tuple, axis: int, dtype) -> bytes:
    quant = {} if dtype == np.float32 else {"scale": [0.05], "zero_point": [3]}
    b = ModelBuilder()
    x = b.input("x", shape, dtype, **quant)
    count = shape[axis]
    piece = tuple(d for i, d in enumerate(shape) if i != axis % len(shape))
    outs = [b.tensor(f"y{i}", piece, dtype, **quant) for i in range(count)]
    b.op("UNPACK", [x], outs, num=count, axis=axis)
    b.output(*outs)
    return b.build()


@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.uint8])
@pytest.mark.parametrize("shape,axis", [
    ((24, 1, 640), 0),          # a CRNN's time steps into its GRU cells: 24 outputs
    ((2, 3, 5), 1),
    ((2, 3, 5), -1),
    ((7, 4), 0),                # exactly one task function's seven
    ((4, 9, 2, 3), 1),          # two task functions
    ((6,), 0),                  # scalars out
], ids=["crnn", "middle", "last", "seven", "nine", "rank1"])
def test_unpack(dtype, shape: tuple, axis: int) -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal(shape).astype(dtype) if dtype == np.float32 else \
        rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max + 1, shape).astype(dtype)
    check(unpack_model(shape, axis, dtype), [x], "UNPACK", KERNEL)
