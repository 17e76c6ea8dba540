"""Generated (fused) cpu kernels for LOGISTIC and EXP: their table-and-polynomial exp
against float64 numpy over the whole float32 range, extremes and NaN included, alone and
inside a fused chain (swish)."""
from __future__ import annotations

import numpy as np
import pytest

from litegpu.backend import NodeContext
from litegpu.graph import Node
from litegpu.ops import get_op
from litegpu.ops.registry import TensorSpec
from litegpu_cpu.fusion import generate_alone, make_fused_kernel, plan_group
from litegpu_cpu.kernels import xnn_order, xnn_sigmoid

F32 = np.dtype(np.float32)
EDGES = np.array([0, -0.0, 1e-30, -1e-30, 1, -1, 20, -20, 88.5, 88.8, -87, -103, -104, -150, 150,
                  np.inf, -np.inf, np.nan], np.float32)


def ctx(index: int, op: str, inputs: tuple[int, ...], output: int, shape: tuple[int, ...]) -> NodeContext:
    node = Node(index=index, op=op, opcode=0, version=1, inputs=inputs, outputs=(output,))
    return NodeContext(node=node, opdef=get_op(op), attrs={"activation": "NONE"} if op == "MUL" else {},
                       inputs=[TensorSpec(shape, F32) for _ in inputs], outputs=[TensorSpec(shape, F32)])


def run_group(nodes: list[NodeContext], x: np.ndarray, out_tensor: int) -> np.ndarray:
    group = plan_group(nodes, {out_tensor})
    assert group is not None and ("_exp32" in group.source or "_sigmoid32" in group.source)
    out = np.full_like(x, 7)
    make_fused_kernel(group)([x], [out])
    return out


def inputs() -> np.ndarray:
    wide = np.linspace(-120, 120, 100_001, dtype=np.float32)
    return np.concatenate([wide, EDGES])


def close_to(got: np.ndarray, want: np.ndarray, ulps: int = 2, flushed: bool = False) -> None:
    """Within ``ulps`` float32 roundings of the float64 value (exact for inf and NaN); with
    ``flushed``, results below the smallest normal float32 are zero."""
    with np.errstate(over="ignore"):
        want32 = want.astype(np.float32)
    if flushed:
        tiny = np.abs(want32) < np.finfo(np.float32).tiny
        np.testing.assert_array_equal(got[tiny], 0)
        got, want, want32 = got[~tiny], want[~tiny], want32[~tiny]
    finite = np.isfinite(want32)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want32))
    np.testing.assert_array_equal(got[~finite & ~np.isnan(want32)], want32[~finite & ~np.isnan(want32)])
    tol = ulps * np.spacing(np.abs(want32[finite])).astype(np.float64)
    assert np.all(np.abs(got[finite].astype(np.float64) - want[finite]) <= tol)


def test_logistic_alone_matches_float64():
    """Within two ulps; where the cpu takes LiteRT's XNNPACK sigmoid to the bit
    (:mod:`litegpu_cpu.kernels.xnn_sigmoid`), within its 3.5 and flushed to zero below
    the normal range, as LiteRT's."""
    x = inputs()
    node = ctx(0, "LOGISTIC", (0,), 1, x.shape)
    assert generate_alone(node)
    got = run_group([node], x, 1)
    with np.errstate(over="ignore"):
        want = 1.0 / (1.0 + np.exp(-x.astype(np.float64)))
    close_to(got, want, *((4, True) if xnn_sigmoid.MATCHES_LITERT else (2, False)))


def test_exp_alone_matches_float64():
    x = inputs()
    got = run_group([ctx(0, "EXP", (0,), 1, x.shape)], x, 1)
    with np.errstate(over="ignore"):
        want = np.exp(x.astype(np.float64))
    close_to(got, want)


def test_swish_chain_matches_the_float32_reference():
    """x * logistic(x) fused, against the op references run one after the other: within
    about four float32 ulps (each side's logistic within two, plus each side's rounding of
    the product)."""
    x = inputs()
    nodes = [ctx(0, "LOGISTIC", (0,), 1, x.shape), ctx(1, "MUL", (0, 1), 2, x.shape)]
    got = run_group(nodes, x, 2)
    s = get_op("LOGISTIC").reference([x], {})[0]
    want = get_op("MUL").reference([x, s], {"activation": "NONE"})[0]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=5e-7, atol=1e-30)


@pytest.mark.parametrize("env", ["0"])
def test_fusion_off_generates_nothing_alone(monkeypatch, env):
    monkeypatch.setenv("LITEGPU_CPU_FUSION", env)
    assert not generate_alone(ctx(0, "LOGISTIC", (0,), 1, (4,)))


@pytest.mark.parametrize("shape,beta", [((1, 4, 64, 64), 1.0), ((3, 7), 0.37), ((2, 1), 2.0), ((5, 1000), 1.0)])
def test_softmax_kernel_matches_float64(shape, beta):
    from litegpu_cpu.kernels import KERNELS
    rng = np.random.default_rng(len(shape))
    x = (rng.standard_normal(shape) * 6).astype(np.float32)
    node = Node(index=0, op="SOFTMAX", opcode=0, version=1, inputs=(0,), outputs=(1,))
    c = NodeContext(node=node, opdef=get_op("SOFTMAX"), attrs={"beta": beta}, inputs=[TensorSpec(shape, F32)],
                    outputs=[TensorSpec(shape, F32)])
    out = np.full(shape, np.nan, np.float32)
    KERNELS["SOFTMAX"](c)([x], [out])
    v = x.astype(np.float64) * np.float64(np.float32(beta))
    e = np.exp(v - v.max(axis=-1, keepdims=True))
    # Beta 1 on an AVX-512F host is XNNPACK's softmax, LiteRT's bits (tests/test_cpu_xnnpack_order.py):
    # its float32 sum and reciprocal put it up to ~33 ulps from float64 on these rows.
    xnn = beta == 1.0 and xnn_order.RSUM_MATCHES_LITERT
    close_to(out, e / e.sum(axis=-1, keepdims=True), ulps=40 if xnn else 2)
    # Rows holding inf or NaN give what the reference gives (NaN), not garbage.
    x[0, ..., 0] = np.inf
    x.reshape(-1, shape[-1])[-1, -1] = np.nan
    KERNELS["SOFTMAX"](c)([x], [out])
    with np.errstate(all="ignore"):
        want = get_op("SOFTMAX").reference([x], {"beta": beta})[0]
    np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
