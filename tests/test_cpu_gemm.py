"""The cpu backend's two-thread GEMM (OpenBLAS halves as tasks of the plan launcher) and its
batched products (BATCH_MATMUL: one OpenBLAS call per batch, batches over the threads).

Products are checked against float64 numpy with every split the planner can choose (rows,
columns, transposed B, odd sizes); the conv and FC kernels that use them against the
same kernels on one thread; GELU against math.erf over the whole useful float32 range.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from litegpu.backend import NodeContext
from litegpu.graph import Node
from litegpu.ops import get_op
from litegpu.ops.registry import TensorSpec
from litegpu_cpu.kernels import KERNELS, gemm
from litegpu_cpu.kernels import threads as kthreads

pytestmark = pytest.mark.skipif(not gemm.sgemm_address(), reason="numpy's OpenBLAS cblas_sgemm not found")


@pytest.fixture
def threads():
    """The cpu kernels on two threads for the test, restored after."""
    before = kthreads.current()
    kthreads.configure_threads(min(2, kthreads.default_count()))
    yield kthreads.current()
    kthreads.configure_threads(before)


def exact(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a.astype(np.float64) @ b.astype(np.float64)


@pytest.mark.parametrize("m,n,k", [(301, 17, 40), (7, 999, 33), (1, 1000, 257), (64, 128, 128), (2, 2, 5)])
@pytest.mark.parametrize("transb", [False, True])
@pytest.mark.parametrize("split_n", [False, True])
def test_halves_match_float64(threads, m, n, k, transb, split_n):
    rng = np.random.default_rng(m * n + k)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if transb else (k, n)).astype(np.float32)
    out = np.full((m, n), np.nan, np.float32)
    at = (n if split_n else m) // 2
    gemm.bind_matmul(a, b, out, (split_n, at), transb=transb)()
    want = exact(a, b.T if transb else b)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4 * math.sqrt(k))


def test_plan_keeps_small_products_and_one_thread_on_the_caller():
    assert gemm.plan(8, 8, 8, threads=2) is None
    assert gemm.plan(1024, 1024, 1024, threads=1) is None
    assert gemm.plan(4096, 64, 576, threads=2) == (False, 2048)      # tall: split rows
    assert gemm.plan(16, 16384, 144, threads=2) == (True, 8192)      # wide: split columns
    assert gemm.plan(1, 1000, 1280, threads=2) is None               # one row: numpy's gemv
    assert gemm.plan(4, 1000, 1024, threads=2) == (True, 500)        # few rows: columns


def test_mismatched_operands_are_refused_before_blas(threads):
    a = np.zeros((64, 32), np.float32)
    b = np.zeros((16, 64), np.float32)      # K mismatch
    with pytest.raises(ValueError, match="do not fit"):
        gemm.bind_matmul(a, b, np.zeros((64, 64), np.float32), (False, 32))
    with pytest.raises(ValueError, match="do not fit"):
        gemm.bind_matmul(a, np.zeros((32, 64), np.float64), np.zeros((64, 64), np.float32), (False, 32))


def _node(op: str, inputs: list, consts: tuple, attrs: dict, out_shape: tuple):
    specs = [TensorSpec(x.shape, x.dtype, x if i in consts else None) for i, x in enumerate(inputs)]
    node = Node(index=0, op=op, opcode=0, version=1, inputs=tuple(range(len(inputs))), outputs=(len(inputs),))
    ctx = NodeContext(node=node, opdef=get_op(op), attrs=attrs, inputs=specs,
                      outputs=[TensorSpec(out_shape, np.dtype(np.float32))])
    run = KERNELS[op](ctx)
    out = np.full(out_shape, np.nan, np.float32)
    run(inputs, [out])
    return out


@pytest.mark.parametrize("h,c,o,kernel", [(64, 16, 16, 3), (40, 64, 64, 1), (24, 32, 64, 3), (64, 32, 8, 1)])
def test_convs_on_two_threads_match_one(threads, h, c, o, kernel):
    """Narrow (transposed) and wide, im2col and pointwise convs, split vs not split."""
    rng = np.random.default_rng(h + c + o)
    x = rng.standard_normal((1, h, h, c)).astype(np.float32)
    w = rng.standard_normal((o, kernel, kernel, c)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    attrs = {"stride": (1, 1), "dilation": (1, 1), "padding": "SAME", "activation": "RELU6"}
    assert gemm.plan(h * h, o, kernel * kernel * c) is not None
    two = _node("CONV_2D", [x, w, b], (1, 2), attrs, (1, h, h, o))
    kthreads.configure_threads(1)
    one = _node("CONV_2D", [x, w, b], (1, 2), attrs, (1, h, h, o))
    assert not np.isnan(two).any()
    np.testing.assert_allclose(two, one, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("m", [3, 64])
def test_fully_connected_on_two_threads_matches_float64(threads, m):
    rng = np.random.default_rng(m)
    x = rng.standard_normal((m, 512)).astype(np.float32)
    w = rng.standard_normal((1000, 512)).astype(np.float32)
    b = rng.standard_normal(1000).astype(np.float32)
    assert gemm.plan(m, 1000, 512) is not None
    got = _node("FULLY_CONNECTED", [x, w, b], (1, 2), {"activation": "RELU", "keep_num_dims": False}, (m, 1000))
    want = np.maximum(exact(x, w.T) + b, 0)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def direct_conv(x, w, b, pad_t, pad_l, oh, ow, dh, dw, lo, hi):
    """float64 conv by taps: stride 1, explicit padding before (after is implied by OH/OW)."""
    n, h, wd, c = x.shape
    o, kh, kw, _ = w.shape
    hp, wp = oh + (kh - 1) * dh, ow + (kw - 1) * dw
    xp = np.zeros((n, hp, wp, c))
    xp[:, pad_t:pad_t + h, pad_l:pad_l + wd] = x
    out = np.zeros((n, oh, ow, o)) + b
    for a in range(kh):
        for q in range(kw):
            out += xp[:, a * dh:a * dh + oh, q * dw:q * dw + ow] @ w[:, a, q, :].T.astype(np.float64)
    return np.clip(out, lo, hi)


@pytest.mark.parametrize("n,h,wd,c,o,kh,kw,padding,dil", [
    (1, 20, 33, 5, 16, 3, 3, "SAME", 1),     # narrow (transposed) accumulator
    (2, 17, 40, 8, 8, 5, 5, "SAME", 1),      # batch of two, 5x5
    (1, 18, 40, 5, 12, 3, 3, "VALID", 1),
    (1, 21, 34, 4, 8, 3, 3, "SAME", 2),      # dilation
    (1, 9, 24, 6, 16, 1, 3, "SAME", 1),      # 1x3
    (1, 30, 30, 16, 48, 3, 3, "SAME", 1),    # wide accumulator
    (2, 12, 31, 7, 40, 3, 3, "VALID", 1),
])
@pytest.mark.parametrize("nthreads", [1, 2])
def test_implicit_gemm_convs_match_float64(threads, n, h, wd, c, o, kh, kw, padding, dil, nthreads):
    from litegpu_cpu.kernels.common import pad_before
    from litegpu.ops.nn import conv_output_size
    kthreads.configure_threads(min(nthreads, threads))
    rng = np.random.default_rng(h * wd + c)
    x = rng.standard_normal((n, h, wd, c)).astype(np.float32)
    w = rng.standard_normal((o, kh, kw, c)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    oh = conv_output_size(h, kh, 1, dil, padding)[0]
    ow = conv_output_size(wd, kw, 1, dil, padding)[0]
    attrs = {"stride": (1, 1), "dilation": (dil, dil), "padding": padding, "activation": "RELU6"}
    specs = [TensorSpec(x.shape, x.dtype), TensorSpec(w.shape, w.dtype, w), TensorSpec(b.shape, b.dtype, b)]
    node = Node(index=0, op="CONV_2D", opcode=0, version=1, inputs=(0, 1, 2), outputs=(3,))
    c_ctx = NodeContext(node=node, opdef=get_op("CONV_2D"), attrs=attrs, inputs=specs,
                        outputs=[TensorSpec((n, oh, ow, o), np.dtype(np.float32))])
    run = KERNELS["CONV_2D"](c_ctx)
    assert run.bind.__name__ == "bind_implicit"
    out = np.full((n, oh, ow, o), np.nan, np.float32)
    for _ in range(2):   # the padded scratch is reused: a second run must not see the first
        run([x, w, b], [out])
    want = direct_conv(x, w, b, pad_before(padding, h, kh, 1, dil), pad_before(padding, wd, kw, 1, dil),
                       oh, ow, dil, dil, 0, 6)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("a_shape,b_shape,adj_x,adj_y", [
    ((1, 4, 64, 32), (1, 4, 32, 64), False, False),      # tiny_bert's attention scores, split in two
    ((3, 1, 40, 24), (1, 4, 24, 56), False, False),      # batch dims broadcast both ways
    ((2, 3, 24, 40), (2, 3, 56, 24), True, True),        # both transposed
    ((5, 40, 33), (33, 48), False, False),               # a rank-2 right-hand side shared by every batch
    ((2, 33, 40), (2, 48, 33), True, True),
])
@pytest.mark.parametrize("nthreads", [1, 2])
def test_batched_products_match_float64(threads, a_shape, b_shape, adj_x, adj_y, nthreads):
    rng = np.random.default_rng(7)
    a = rng.standard_normal(a_shape).astype(np.float32)
    b = rng.standard_normal(b_shape).astype(np.float32)
    bind = gemm.batched_matmul(a_shape, b_shape, adj_x, adj_y, threads=nthreads)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = np.matmul(np.swapaxes(a64, -1, -2) if adj_x else a64, np.swapaxes(b64, -1, -2) if adj_y else b64)
    out = np.full(want.shape, np.nan, np.float32)
    call = bind(a, b, out)
    tasks = call.rows[0, 1]
    assert tasks == 1 if nthreads == 1 else (tasks == 2 or a_shape != (1, 4, 64, 32))   # big enough to split
    call()
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match="batched product"):
        bind(a, b, np.empty((1,) + want.shape, np.float32))
