"""Float LOGISTIC with LiteRT's bits (litegpu_cpu.kernels.xnn_sigmoid): XNNPACK's AVX-512F
sigmoid, against LiteRT itself where the host runs that kernel.

Checked once over all 2**32 float32 bit patterns (a scratch run, 44 s): every one gives
LiteRT's bits, NaN payloads included, but for the 626,770,728 patterns with |x| in about
[4.29e26, 2.36e38], where XNNPACK's kernel returns NaN and this one 0 or 1. The tests here
take every 4093rd pattern and the edges.
"""
from __future__ import annotations

import numpy as np
import pytest

import litegpu
from litegpu.backend import NodeContext
from litegpu.graph import Node
from litegpu.ops import get_op
from litegpu.ops.registry import TensorSpec
from litegpu.testing.builder import ModelBuilder
from litegpu_cpu.fusion import make_fused_kernel, plan_group
from litegpu_cpu.kernels import mathfn, xnn_sigmoid
from litegpu_cpu.kernels.elementwise import logistic_kernel
from numba import njit

from ai_edge_litert.interpreter import Interpreter as LiteRT  # a test dependency: never skipped

F32 = np.float32
litert_host = pytest.mark.skipif(not xnn_sigmoid.MATCHES_LITERT,
                                 reason="LiteRT runs another sigmoid kernel on a host without AVX-512F")
EDGES = np.array([0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-45, -1e-45, 1.17549435e-38, -1.17549435e-38,
                  3.4028235e38, -3.4028235e38, 4.5e26, -4.5e26, 1e10, -1e10, 160, -160, 159.99, -159.99,
                  104, -104, 103.9, -103.9, 88.7, -88.7, 87.34, -87.34, 17, -17, 0.5, -0.5], F32)
# Where XNNPACK's kernel returns NaN (its argument reduction overflows) and ours 0 or 1.
XNNPACK_NAN = (4e26, 3e38)


def inputs() -> np.ndarray:
    """Every 4093rd float32 bit pattern, the edges, and a dense sweep of [-110, 110]
    (the saturation and flush-to-zero ranges)."""
    patterns = np.arange(0, 2 ** 32, 4093, dtype=np.uint64).astype(np.uint32).view(F32)
    return np.concatenate([patterns, EDGES, np.linspace(-110, 110, 400_001, dtype=F32)])


def logistic_model(n: int, swish: bool = False) -> bytes:
    """LOGISTIC of an [n] input (times the input, with ``swish``)."""
    b = ModelBuilder()
    x = b.input("x", (n,), F32)
    y = b.tensor("y", (n,), F32)
    b.op("LOGISTIC", [x], [y])
    if swish:
        z = b.tensor("z", (n,), F32)
        b.op("MUL", [x, y], [z], fused_activation_function="NONE")
        y = z
    b.output(y)
    return b.build()


def run(interp, x: np.ndarray) -> np.ndarray:
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    return interp.get_tensor(interp.get_output_details()[0]["index"]).copy()


def assert_litert_bits(got: np.ndarray, want: np.ndarray, x: np.ndarray) -> None:
    """``got`` is ``want`` bit for bit (NaN payloads too), but where XNNPACK's kernel gives
    NaN for a finite huge |x|: there ``got`` is what the function is, 0 or 1 (or +-0 and
    +-huge for swish)."""
    huge = (np.abs(x) >= XNNPACK_NAN[0]) & (np.abs(x) <= XNNPACK_NAN[1])
    if huge.any():
        assert np.isnan(want[huge]).any()            # the departure is real...
        assert not np.isnan(got[huge]).any()         # ...and ours is a number
    same = got.view(np.uint32) == want.view(np.uint32)
    bad = ~same & ~huge
    assert not bad.any(), [(float(v).hex(), float(w).hex(), float(g).hex())
                           for v, w, g in zip(x[bad][:5], want[bad][:5], got[bad][:5])]


def test_constants_are_xnnpacks():
    """Derived in the module, equal to the hex literals of XNNPACK's
    src/f32-vsigmoid/avx512f-rr2-lut32-p2-perm2-scalef.c.in."""
    hexes = {"_MAGIC": "0x1.800000p18", "_LOG2E": "0x1.715476p0", "_MINUS_LN2_HI": "-0x1.62E430p-1",
             "_MINUS_LN2_LO": "0x1.05C61p-29", "_C2": "0x1.000000p-1", "_C1": "0x1.0000F6p-0"}
    for name, literal in hexes.items():
        assert getattr(xnn_sigmoid, name) == F32(float.fromhex(literal)), name
    table = xnn_sigmoid.TABLE
    assert table.dtype == F32 and table.shape == (32,)
    for k, literal in ((0, "0x1.000000p+0"), (1, "0x1.059B0Ep+0"), (7, "0x1.29E9E0p+0"), (16, "0x1.6A09E6p+0"),
                       (25, "0x1.B7F770p+0"), (31, "0x1.F50766p+0")):
        assert table[k] == F32(float.fromhex(literal)), k


def test_the_host_decides_which_sigmoid():
    expected = xnn_sigmoid.xnn_sigmoid32 if xnn_sigmoid.MATCHES_LITERT else mathfn.sigmoid32
    assert xnn_sigmoid.sigmoid32 is expected


def _logistic_ctx(shape: tuple[int, ...]) -> NodeContext:
    node = Node(index=0, op="LOGISTIC", opcode=0, version=1, inputs=(0,), outputs=(1,))
    return NodeContext(node=node, opdef=get_op("LOGISTIC"), attrs={}, inputs=[TensorSpec(shape, F32)],
                       outputs=[TensorSpec(shape, F32)])


def test_generated_kernels_take_it_with_its_digest():
    group = plan_group([_logistic_ctx((8,))], {1})
    line = f"from litegpu_cpu.kernels.xnn_sigmoid import sigmoid32 as _sigmoid32  # xnn_sigmoid {xnn_sigmoid.DIGEST}"
    assert line in group.source.splitlines()
    assert "mathfn import" not in group.source      # nothing else of mathfn used


@njit(error_model="numpy")
def _each(x, out):
    for i in range(x.size):
        out[i] = xnn_sigmoid.xnn_sigmoid32(x[i])


def test_values_on_any_host():
    """The replica itself (whatever the host runs): special values, the flush of results
    below the smallest normal to zero (LiteRT runs XNNPACK with denormals flushed), and
    within 4 ulps of float64 elsewhere (XNNPACK's kernel: 3.5 at worst, measured)."""
    x = np.array([np.nan, np.inf, -np.inf, 0, -0.0, 3e38, -3e38, 1e30, -1e30, 200, -200, -100, 1e-45], F32)
    out = np.empty_like(x)
    _each(x, out)
    assert np.isnan(out[0])
    np.testing.assert_array_equal(out[1:], [1, 0, 0.5, 0.5, 1, 0, 1, 0, 1, 0, 0, 0.5])
    x = inputs()
    x = x[np.isfinite(x) & (np.abs(x) < 1e4)]
    out = np.empty_like(x)
    _each(x, out)
    with np.errstate(over="ignore"):
        want = 1 / (1 + np.exp(-x.astype(np.float64)))
    want32 = want.astype(F32)
    normal = want32 >= F32(2.0 ** -126)
    assert np.all(out[~normal] == 0)
    ulps = np.abs(out[normal] - want[normal]) / np.spacing(want32[normal]).astype(np.float64)
    assert ulps.max() <= 4


@litert_host
def test_array_kernel_matches_litert_bit_for_bit():
    x = inputs()
    want = run(LiteRT(model_content=logistic_model(x.size), num_threads=1), x)
    got = np.full_like(x, 7)
    logistic_kernel(_logistic_ctx(x.shape))([x], [got])       # the unfused kernel
    assert_litert_bits(got, want, x)


@litert_host
def test_fused_kernel_matches_litert_bit_for_bit():
    x = inputs()
    want = run(LiteRT(model_content=logistic_model(x.size), num_threads=1), x)
    got = np.full_like(x, 7)
    make_fused_kernel(plan_group([_logistic_ctx(x.shape)], {1}))([x], [got])
    assert_litert_bits(got, want, x)


@litert_host
@pytest.mark.parametrize("fusion", ["1", "0"])
@pytest.mark.filterwarnings("ignore:invalid value encountered")    # -inf * 0 in the MUL: NaN, as LiteRT
def test_swish_model_matches_litert_bit_for_bit(monkeypatch, fusion):
    """x * LOGISTIC(x) through the Interpreter: fused into one generated kernel, or (fusion
    off) the array kernel and a MUL. Not where x or the product is subnormal (|x| < 2**-124):
    LiteRT runs XNNPACK's MUL with denormals flushed to zero, litegpu's MUL keeps them."""
    monkeypatch.setenv("LITEGPU_CPU_FUSION", fusion)
    x = inputs()
    x = x[~((np.abs(x) >= XNNPACK_NAN[0]) & (np.abs(x) <= XNNPACK_NAN[1]))
          & ~((x != 0) & (np.abs(x) < F32(2.0 ** -124)))]
    data = logistic_model(x.size, swish=True)
    want = run(LiteRT(model_content=data, num_threads=1), x)
    got = run(litegpu.Interpreter(model_content=data, num_threads=1), x)
    assert_litert_bits(got, want, x)


@litert_host
@pytest.mark.parametrize("swish", [False, True])
def test_sixteen_lanes_give_the_scalar_replicas_bits(swish):
    """The 16-lane kernel (one vpermt2ps for the table, as XNNPACK's) against the scalar
    replica it vectorizes, on every input kind, with a tail of 13 that runs one by one."""
    from litegpu_cpu.kernels.elementwise import SIGMOID, SWISH, _float_unary_task
    from litegpu_cpu.kernels.tasks import bind_task
    x = inputs()
    x = np.concatenate([x, np.random.default_rng(5).integers(0, 2 ** 32, 1 << 18, dtype=np.uint64)
                        .astype(np.uint32).view(F32), x[:13]])
    want = np.empty_like(x)
    _each(x, want)
    if swish:
        with np.errstate(invalid="ignore"):   # inf * 0: NaN, on both sides
            want = x * want
    got = np.full_like(x, 7)
    params = np.array([x.size, x.size, SWISH if swish else SIGMOID], np.int64)
    bind_task(_float_unary_task, 1, (x,), (got,), params)()
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), x[~same][:5]


def _swish_group(n: int, order=(0, 1), activation: str = "NONE", other_shape=None):
    """The fused group of LOGISTIC(x) then MUL of (x, the sigmoid) in ``order``."""
    s_node = Node(index=0, op="LOGISTIC", opcode=14, version=1, inputs=(0,), outputs=(1,))
    logistic = NodeContext(node=s_node, opdef=get_op("LOGISTIC"), attrs={}, inputs=[TensorSpec((n,), F32)],
                           outputs=[TensorSpec((n,), F32)])
    operands = [(0, (n,)), (1, (n,))] if other_shape is None else [(2, other_shape), (1, (n,))]
    operands = [operands[i] for i in order]
    m_node = Node(index=1, op="MUL", opcode=18, version=1, inputs=tuple(t for t, _ in operands), outputs=(3,))
    mul = NodeContext(node=m_node, opdef=get_op("MUL"), attrs={"activation": activation},
                      inputs=[TensorSpec(s, F32) for _, s in operands], outputs=[TensorSpec((n,), F32)])
    return plan_group([logistic, mul], {3})


@litert_host
def test_a_swish_group_takes_the_sixteen_lane_kernel_and_nothing_else_does():
    from litegpu_cpu.fusion import _sigmoid_kind
    from litegpu_cpu.kernels.elementwise import SIGMOID, SWISH
    assert _sigmoid_kind(_swish_group(40)) == SWISH
    assert _sigmoid_kind(_swish_group(40, order=(1, 0))) == SWISH
    assert _sigmoid_kind(plan_group([_logistic_ctx((40,))], {1})) == SIGMOID
    assert _sigmoid_kind(_swish_group(40, activation="RELU")) is None            # a clamp after the MUL
    assert _sigmoid_kind(_swish_group(40, other_shape=(1,))) is None            # MUL by another tensor
    x = np.random.default_rng(3).standard_normal(40).astype(F32)
    kernel = make_fused_kernel(_swish_group(40))
    assert "16-lane" in kernel.kernel_name
    got = np.empty_like(x)
    kernel([x], [got])
    want = np.empty_like(x)
    _each(x, want)
    np.testing.assert_array_equal(got, x * want)
