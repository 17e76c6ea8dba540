"""The framed 5x5 DEPTHWISE_CONV_2D kernel of the cpu backend (``depthwise._k5_task``:
multiplier 1, no dilation, stride 1 or 2, C >= 16): padding, channel counts with a
partial last 16-channel block, bands of rows, tiny images, threads, and writes past
the output, against the direct loop of :mod:`test_cpu_kernels` and the op's numpy
reference. (NaN and inf: with the 3x3 kernel's, in :mod:`test_cpu_kernels`.)"""
from __future__ import annotations

import numpy as np
import pytest

from test_cpu_kernels import build, close, direct_depthwise, rand, run_kernel, vs_reference

K5_CASES = [
    # (N, H, W, C, stride, padding, activation, bias)
    (1, 14, 14, 16, 1, "SAME", "RELU6", True),
    (1, 14, 14, 120, 1, "SAME", "NONE", True),        # 7.5 blocks: the last overlaps
    (2, 9, 11, 17, 1, "SAME", "RELU", True),
    (1, 7, 7, 40, 1, "VALID", "NONE", False),
    (1, 5, 5, 24, 1, "SAME", "RELU_N1_TO_1", True),
    (1, 3, 2, 16, 1, "SAME", "NONE", True),            # smaller than the window
    (1, 1, 1, 32, 1, "SAME", "RELU6", True),
    (1, 40, 9, 16, 1, "SAME", "NONE", True),           # several bands of rows
    (1, 28, 28, 96, 2, "SAME", "RELU6", True),
    (1, 14, 14, 288, 2, "SAME", "NONE", True),
    (2, 13, 12, 20, 2, "SAME", "RELU", True),          # odd sizes: padding before 1 or 2
    (1, 11, 10, 16, 2, "VALID", "NONE", True),
    (1, 2, 3, 48, 2, "SAME", "NONE", False),
    (1, 37, 8, 33, 2, "SAME", "RELU6", True),
]


@pytest.mark.parametrize("case", K5_CASES, ids=lambda c: f"n{c[0]}-{c[1]}x{c[2]}x{c[3]}-s{c[4]}-{c[5]}-{c[6]}")
def test_depthwise5x5_framed(case):
    n, h, w, c, s, padding, activation, has_bias = case
    x, f = rand(n, h, w, c), rand(1, 5, 5, c)
    b = rand(c) if has_bias else None
    want = direct_depthwise(x, f, b, (s, s), (1, 1), padding, activation, 1)
    attrs = {"padding": padding, "stride": (s, s), "dilation": (1, 1), "activation": activation,
             "depth_multiplier": 1}
    (got,) = run_kernel("DEPTHWISE_CONV_2D", attrs, [x, f, b], [want.shape], consts=(1, 2))
    close(got, want)
    vs_reference("DEPTHWISE_CONV_2D", [x, f, b], attrs, [got])


@pytest.mark.parametrize("stride", [1, 2])
def test_depthwise5x5_writes_nothing_past_its_output_and_takes_strided_arrays(stride):
    """The output is a strided view inside a larger buffer (written through scratch): the
    bytes around it keep their NaNs; the input is strided too (copied)."""
    x_big, f, b = rand(1, 9, 10, 48), rand(1, 5, 5, 24), rand(24)
    x = x_big[..., ::2]
    attrs = {"padding": "SAME", "stride": (stride, stride), "dilation": (1, 1), "activation": "NONE",
             "depth_multiplier": 1}
    want = direct_depthwise(x, f, b, (stride, stride), (1, 1), "SAME", "NONE", 1)
    run, _ = build("DEPTHWISE_CONV_2D", attrs, [x, f, b], [want.shape], consts=(1, 2))
    buffer = np.full((1, want.shape[1] + 4, want.shape[2], 48), np.nan, np.float32)
    run([x, f, b], [buffer[:, :want.shape[1], :, 1::2]])
    close(buffer[:, :want.shape[1], :, 1::2], want)
    assert np.isnan(buffer[:, want.shape[1]:]).all() and np.isnan(buffer[..., ::2]).all()

    contiguous = np.full((1, want.shape[1] + 4, *want.shape[2:]), np.nan, np.float32)
    run([x, f, b], [contiguous[:, :want.shape[1]]])
    close(contiguous[:, :want.shape[1]], want)
    assert np.isnan(contiguous[:, want.shape[1]:]).all()
