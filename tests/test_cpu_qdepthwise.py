"""The cpu backend's int8 depthwise conv (litegpu_cpu.kernels.qdepthwise): exact against
integer numpy arithmetic with the same requantization."""
from __future__ import annotations

import numpy as np
import pytest

from litegpu_cpu.kernels.qdepthwise import QuantizedDepthwise
from litegpu_cpu.kernels.tasks import is_plan

RNG = np.random.default_rng(5)


def expected(x, w, bias, zx, scales, zo, lo, hi, geometry):
    """The conv over an input padded with its zero point, sums in int64, then the float32
    requantization; returns the output."""
    sh, sw, dh, dw, pt, pl = geometry
    n, h, wd, c = x.shape
    kh, kw, _ = w.shape
    oh, ow = (h + 2 * pt - (kh - 1) * dh - 1) // sh + 1, (wd + 2 * pl - (kw - 1) * dw - 1) // sw + 1
    padded = np.full((n, (oh - 1) * sh + (kh - 1) * dh + 1, (ow - 1) * sw + (kw - 1) * dw + 1, c), zx, np.int64)
    rows, cols = min(h, padded.shape[1] - pt), min(wd, padded.shape[2] - pl)
    padded[:, pt:pt + rows, pl:pl + cols] = x[:, :rows, :cols]
    acc = np.zeros((n, oh, ow, c), np.int64) + bias
    for ky in range(kh):
        for kx in range(kw):
            window = padded[:, ky * dh:ky * dh + (oh - 1) * sh + 1:sh, kx * dw:kx * dw + (ow - 1) * sw + 1:sw]
            acc += (window - zx) * w[ky, kx]
    value = np.clip(acc.astype(np.float32) * scales, np.float32(lo - zo), np.float32(hi - zo))
    return (np.rint(value).astype(np.int32) + zo).astype(np.int8)


@pytest.mark.parametrize("n,h,w,c,k,stride,pad,dilation", [
    (1, 16, 16, 96, 3, 2, 0, 1),     # stride 2, VALID
    (1, 12, 12, 144, 3, 1, 1, 1),    # stride 1, SAME: the border skips taps
    (2, 9, 7, 20, 5, 2, 2, 1),       # 5x5, two images, odd sizes
    (1, 10, 10, 8, 3, 1, 2, 2),      # dilation 2
    (1, 7, 7, 960, 3, 1, 1, 1),
    (1, 6, 30, 37, 3, 1, 1, 1),      # channels past the last 16 (the plain loop), a partial group of pixels
    (1, 5, 3, 16, 3, 1, 0, 1),       # one interior pixel per row
    (1, 4, 4, 32, 5, 1, 1, 1),       # no pixel's window inside the image: the plain loop only
    (1, 9, 40, 48, 3, 3, 1, 2),      # stride 3 with dilation 2
])
def test_quantized_depthwise_is_exact(n, h, w, c, k, stride, pad, dilation):
    x = RNG.integers(-128, 128, (n, h, w, c)).astype(np.int8)
    weights = RNG.integers(-127, 128, (k, k, c)).astype(np.int8)
    bias = RNG.integers(-3000, 3000, c).astype(np.int32)
    scales = (RNG.random(c) * 0.01 + 0.001).astype(np.float32)
    geometry = (stride, stride, dilation, dilation, pad, pad)
    want = expected(x, weights, bias, 7, scales, -4, -120, 100, geometry)
    conv = QuantizedDepthwise(weights, bias, 7, scales, -4, -120, 100, geometry)
    out = np.zeros(want.shape, np.int8)
    call = conv.bind(x, out)
    assert is_plan(call)
    call()
    np.testing.assert_array_equal(out, want)


def test_refuses_what_it_cannot_run():
    conv = QuantizedDepthwise(np.ones((3, 3, 8), np.int8), None, 0, np.ones(1, np.float32), 0, -128, 127,
                              (1, 1, 1, 1, 1, 1))
    with pytest.raises(ValueError, match="quantized depthwise"):
        conv.bind(np.zeros((1, 4, 4, 9), np.int8), np.zeros((1, 4, 4, 9), np.int8))
    with pytest.raises(ValueError, match="int8 weights"):
        QuantizedDepthwise(np.ones((3, 3, 8), np.float32), None, 0, np.ones(1), 0, -128, 127, (1, 1, 1, 1, 1, 1))
