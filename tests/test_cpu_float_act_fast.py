"""The cpu backend's float32 GELU (both forms) and SOFTMAX kernels against float64 numpy:
relative error in float32 ulps over dense sweeps, special values, and SOFTMAX's edge rows
(-inf entries, equal logits, beta != 1, odd row lengths, both sides of the threading
threshold)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter as LiteRT  # a test dependency: never skipped
from numba import njit

from litegpu.backend import NodeContext
from litegpu.graph import Node
from litegpu.ops import get_op
from litegpu.ops.registry import TensorSpec
from litegpu_cpu.kernels import KERNELS
from litegpu.testing.builder import ModelBuilder
from litegpu_cpu.kernels import mathfn, xnn_order
from litegpu_cpu.kernels.misc import _SOFTMAX_PARALLEL

F32 = np.dtype(np.float32)
# Measured maxima over the sweeps below: 7.0 ulps (erf form: the float32 rational's
# roundings), 3.1 (tanh form), ~2 (SOFTMAX); the bounds leave a little room.
GELU_ULPS = {False: 8.0, True: 4.0}
SOFTMAX_ULPS = 3.0
# Beta 1 on an AVX-512F host is XNNPACK's softmax, LiteRT's bits (tests/test_cpu_xnnpack_order.py):
# its float32 sum and reciprocal reach ~33 ulps on these rows, and it flushes results below
# ~2**-126 to 0.
XNN_SOFTMAX = xnn_order.RSUM_MATCHES_LITERT


def softmax_ulps(beta: float) -> float:
    return 40.0 if beta == 1.0 and XNN_SOFTMAX else SOFTMAX_ULPS
SPECIAL = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1e-45, -1e-45, 1e-40, -1e-40, 1.1754944e-38,
                    3e38, -3e38, 1e20, -1e20, 14.4, -14.4, -14.5, -14.6, -13.3, 88.0, -88.0], np.float32)


def run(op: str, attrs: dict, x: np.ndarray) -> np.ndarray:
    node = Node(index=0, op=op, opcode=0, version=1, inputs=(0,), outputs=(1,))
    ctx = NodeContext(node=node, opdef=get_op(op), attrs=attrs, inputs=[TensorSpec(x.shape, F32)],
                      outputs=[TensorSpec(x.shape, F32)])
    kernel = KERNELS[op](ctx)
    assert kernel is not None
    out = np.full(x.shape, np.nan, np.float32)      # an element left unwritten fails
    kernel([x], [out])
    return out


def gelu64(x: np.ndarray, approximate: bool) -> np.ndarray:
    """The float64 formulas the op reference uses (exact where ``1 + erf`` or ``1 + tanh``
    would cancel: written with erfc and exp for x < 0)."""
    v = x.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        if approximate:
            w = np.exp(-np.abs(2 * math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))
            return np.where(v < 0, v * w / (1 + w), v / (1 + w))
        erfc = np.vectorize(math.erfc, otypes=[np.float64])
        return np.where(v < 0, 0.5 * v * erfc(-v / math.sqrt(2)), v * (1 - 0.5 * erfc(v / math.sqrt(2))))


def ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """|got - want| in float32 ulps of ``want`` (the subnormal spacing below the normals)."""
    with np.errstate(over="ignore"):
        spacing = np.spacing(np.abs(want.astype(np.float32))).astype(np.float64)
    return np.abs(got.astype(np.float64) - want) / spacing


def sweep() -> np.ndarray:
    dense = np.linspace(-16, 16, 1_000_001, dtype=np.float32)
    tiny = np.logspace(-45, 1.2, 20_001).astype(np.float32)
    return np.concatenate([dense, tiny, -tiny])


@njit
def _accurate_gelu(x, approximate):
    out = np.empty_like(x)
    for i in range(x.size):
        out[i] = mathfn.accurate_gelu_tanh32(x[i]) if approximate else mathfn.accurate_gelu32(x[i])
    return out


def litert_gelu(x: np.ndarray, approximate: bool) -> np.ndarray:
    """LiteRT's GELU of ``x`` (one op, XNNPACK on this host)."""
    b = ModelBuilder()
    i, o = b.input("x", x.shape, np.float32), b.tensor("y", x.shape, np.float32)
    b.op("GELU", [i], [o], approximate=approximate)
    b.output(o)
    it = LiteRT(model_content=b.build(), num_threads=1)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"])


@pytest.mark.parametrize("approximate", [False, True])
def test_accurate_gelu_within_a_few_ulps_of_float64(approximate):
    """mathfn's own GELU (the cpu's where XNNPACK's FMA kernels are not LiteRT's), every host."""
    x = sweep()
    err = ulps(_accurate_gelu(x, approximate), gelu64(x, approximate))
    assert err.max() <= GELU_ULPS[approximate], (err.max(), x[np.argmax(err)])


@pytest.mark.parametrize("approximate", [False, True])
def test_gelu_kernel_is_litert_s_or_the_accurate_one(approximate):
    """On a host where LiteRT runs XNNPACK's FMA kernels the cpu gives their bits
    (mathfn.xnn_gelu32, xnn_gelu_tanh32); elsewhere the accurate GELU. (LiteRT flushes
    subnormal inputs and results to zero, the cpu keeps them: those are left out.)"""
    x = sweep()
    got = run("GELU", {"approximate": approximate}, x)
    want = litert_gelu(x, approximate) if mathfn._XNN_FMA else _accurate_gelu(x, approximate)
    tiny = np.finfo(np.float32).tiny
    normal = (np.abs(x) >= tiny) & ((np.abs(got) >= tiny) | (got == 0))
    assert normal.mean() > 0.95
    np.testing.assert_array_equal(got[normal].view(np.uint32), want[normal].view(np.uint32))


@pytest.mark.parametrize("approximate", [False, True])
def test_gelu_special_values_as_the_float64_formula(approximate):
    got = run("GELU", {"approximate": approximate}, SPECIAL)
    with np.errstate(invalid="ignore", over="ignore"):
        want = get_op("GELU").reference([SPECIAL], {"approximate": approximate})[0]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))      # -inf and NaN give NaN
    ok = ~np.isnan(want)
    finite = ok & np.isfinite(want)
    np.testing.assert_array_equal(got[ok & ~finite], want[ok & ~finite])
    assert got[0] == np.inf and got[3] == 0 and np.signbit(got[4])
    accurate = _accurate_gelu(SPECIAL, approximate)
    np.testing.assert_array_equal(np.signbit(accurate[ok]), np.signbit(want[ok]))
    assert np.all(ulps(accurate[finite], gelu64(SPECIAL[finite], approximate)) <= GELU_ULPS[approximate])


@pytest.mark.parametrize("shape", [(1,), (7,), (3, 33), (1, 64, 512), (2, 300, 129)])
def test_gelu_any_size_matches_elementwise(shape):
    """Every element written, at sizes below and above the threading threshold."""
    x = (np.random.default_rng(1).standard_normal(shape) * 4).astype(np.float32)
    for approximate in (False, True):
        got = run("GELU", {"approximate": approximate}, x)
        one_by_one = run("GELU", {"approximate": approximate}, x.reshape(-1)[:1])
        assert got.reshape(-1)[0] == one_by_one[0]
        np.testing.assert_allclose(got, gelu64(x, approximate), rtol=2e-6, atol=1e-6)


def softmax64(x: np.ndarray, beta: float) -> np.ndarray:
    """True softmax in float64 with the model's beta (a float32 in the flatbuffer)."""
    z = x.astype(np.float64) * float(np.float32(beta))
    with np.errstate(invalid="ignore"):
        e = np.exp(z - np.max(z, axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("shape", [(1, 4, 64, 64), (5, 1), (3, 7), (9, 17), (4, 1000), (2, 63),
                                   (1, 8, 128, 130)])
@pytest.mark.parametrize("beta", [1.0, 0.5, 2.0, -0.7])
def test_softmax_within_a_few_ulps_of_float64(shape, beta):
    x = (np.random.default_rng(2).standard_normal(shape) * 6).astype(np.float32)
    got = run("SOFTMAX", {"beta": beta}, x)
    want = softmax64(x, beta)
    err = ulps(got, want)
    assert err.max() <= softmax_ulps(beta), (err.max(), shape, beta)


def test_softmax_sizes_cross_the_threading_threshold():
    assert 8 * 1000 < _SOFTMAX_PARALLEL <= 80 * 1000
    for rows in (8, 80):
        x = (np.random.default_rng(rows).standard_normal((rows, 1000)) * 3).astype(np.float32)
        assert ulps(run("SOFTMAX", {"beta": 1.0}, x), softmax64(x, 1.0)).max() <= softmax_ulps(1.0)


def test_softmax_edge_rows():
    x = np.array([
        [1.0, -np.inf, 2.0, -np.inf, 0.5],        # masked entries give exact zeros
        [3.0, 3.0, 3.0, 3.0, 3.0],                # equal logits: uniform
        [-1e30, 0.0, 1e30, 5.0, -5.0],            # one entry takes everything
        [-np.inf] * 5,                            # -inf - -inf: NaN, as in the reference
        [1.0, np.nan, 2.0, 3.0, 4.0],             # a NaN poisons its row
        [0.0, -200.0, -90.0, -104.0, -1e-3],      # tiny and underflowing outputs
    ], np.float32)
    got = run("SOFTMAX", {"beta": 1.0}, x)
    with np.errstate(invalid="ignore", over="ignore"):
        want = get_op("SOFTMAX").reference([x], {"beta": 1.0})[0]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert got[0, 1] == 0 and got[0, 3] == 0
    np.testing.assert_array_equal(got[1], np.float32(0.2))
    np.testing.assert_array_equal(got[2], [0, 0, 1, 0, 0])
    ok = ~np.isnan(want[:3]).any(axis=1)
    assert ok.all()
    want = softmax64(x[5:6], 1.0)[0]
    if XNN_SOFTMAX:         # exp(-90) and exp(-104) are subnormal: XNNPACK gives 0
        np.testing.assert_array_equal(got[5, [1, 2, 3]], 0)
        assert ulps(got[5, [0, 4]], want[[0, 4]]).max() <= softmax_ulps(1.0)
    else:
        assert ulps(got[5], want).max() <= SOFTMAX_ULPS


def test_softmax_negative_beta_does_not_overflow():
    """beta < 0 shifts by the row's minimum: exp never sees a positive argument."""
    x = np.array([[-100.0, 0.0, 50.0, 100.0]], np.float32)
    got = run("SOFTMAX", {"beta": -1.0}, x)
    assert np.all(np.isfinite(got))
    assert ulps(got, softmax64(x, -1.0)).max() <= SOFTMAX_ULPS
