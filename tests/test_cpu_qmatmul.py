"""The cpu backend's int8 kernels for the ops of a converted transformer that LiteRT runs on
its builtin kernels (litegpu_cpu.kernels.qmatmul, qnorm): BATCH_MATMUL of two run-time
operands, SQUARED_DIFFERENCE and RSQRT. Each case checks that the kernel (not the integer
reference) runs the node, by the name the delegation report gives it, and that its
output equals LiteRT's on every element; RSQRT of a negative value fails at run time
with the reference's error, as LiteRT fails."""
from __future__ import annotations

import numpy as np
import pytest

import litegpu
from litegpu.errors import ExecutionError
from litegpu.testing.builder import ModelBuilder

from test_ops_quantized import run_both

I8 = np.int8
BMM = "int8 batch matmul (packed GEMM)"
PAIR_TABLE = "int8 pair table task"
CHECKED_TABLE = "8-bit checked table task"


def kernel_of(model: bytes, op: str) -> str:
    """The kernel the delegation report names for the (one) ``op`` node of ``model``."""
    interp = litegpu.Interpreter(model_content=model)
    interp.allocate_tensors()
    names = {k[3] for k in interp.get_delegation_report().kernels if k[1] == op}
    assert len(names) == 1, names
    return names.pop()


def check(model: bytes, inputs: list[np.ndarray], op: str, kernel: str) -> None:
    """``kernel`` runs ``op`` and every output equals LiteRT's."""
    assert kernel_of(model, op) == kernel
    ours, theirs = run_both(model, inputs)
    for got, want in zip(ours, theirs):
        np.testing.assert_array_equal(got, want)


def full_range(rng, shape) -> np.ndarray:
    return rng.integers(-128, 128, shape).astype(I8)


# -- BATCH_MATMUL --------------------------------------------------------------------------------


def bmm_model(a_shape: tuple, b_shape: tuple, adj_x: bool, adj_y: bool, zps: tuple, out_scale: float | None = None):
    """BATCH_MATMUL of two int8 inputs; the output scale spreads the results over ~40
    quanta unless given."""
    k = a_shape[-2] if adj_x else a_shape[-1]
    m = a_shape[-1] if adj_x else a_shape[-2]
    n = b_shape[-2] if adj_y else b_shape[-1]
    out_shape = (*np.broadcast_shapes(a_shape[:-2], b_shape[:-2]), m, n)
    sa, sb = 0.05, 0.03
    if out_scale is None:
        out_scale = 74.0 * 74.0 * np.sqrt(k) * sa * sb / 40
    b = ModelBuilder()
    x = b.input("x", a_shape, I8, scale=[sa], zero_point=[zps[0]])
    z = b.input("z", b_shape, I8, scale=[sb], zero_point=[zps[1]])
    y = b.tensor("y", out_shape, I8, scale=[out_scale], zero_point=[zps[2]])
    b.op("BATCH_MATMUL", [x, z], [y], adj_x=adj_x, adj_y=adj_y, version=4)
    b.output(y)
    return b.build()


@pytest.mark.parametrize("a_shape,b_shape", [
    ((1, 4, 32, 16), (1, 4, 16, 32)),       # a transformer's Q K^T
    ((1, 4, 32, 32), (1, 4, 32, 16)),       # and softmax(..) V
    ((2, 3, 4, 5), (2, 3, 5, 6)),
    ((2, 3, 4, 5), (5, 6)),                 # b broadcast over every batch
    ((3, 1, 4, 5), (1, 2, 5, 6)),           # both broadcast
    ((7, 9), (9, 5)),                       # no batch
    ((1, 256, 64), (1, 64, 48)),            # one batch, its rows cut into tasks
    ((3, 100, 40), (3, 40, 24)),            # a few batches, rows cut too
], ids=["qk", "sv", "batched", "b-broadcast", "both-broadcast", "2d", "rows-split", "batches-split"])
@pytest.mark.parametrize("adj_x,adj_y", [(False, False), (True, False), (False, True), (True, True)])
def test_batch_matmul(a_shape: tuple, b_shape: tuple, adj_x: bool, adj_y: bool) -> None:
    rng = np.random.default_rng(5)
    if adj_x:
        a_shape = (*a_shape[:-2], a_shape[-1], a_shape[-2])
    if adj_y:
        b_shape = (*b_shape[:-2], b_shape[-1], b_shape[-2])
    model = bmm_model(a_shape, b_shape, adj_x, adj_y, (-5, 9, 3))
    check(model, [full_range(rng, a_shape), full_range(rng, b_shape)], "BATCH_MATMUL", BMM)


@pytest.mark.parametrize("zps", [(0, 0, 0), (-128, 127, -128), (100, -100, 50)])
def test_batch_matmul_ties_and_zero_points(zps: tuple) -> None:
    """An output scale of exactly ``sa * sb * 2^7``: the multiplier is a power of two, so
    many sums land on a tie (TFLite rounds them away from zero), and the results saturate
    both ways."""
    rng = np.random.default_rng(6)
    model = bmm_model((2, 8, 24), (2, 24, 16), False, False, zps,
                      out_scale=float(np.float32(0.05) * np.float32(0.03) * 128))
    check(model, [full_range(rng, (2, 8, 24)), full_range(rng, (2, 24, 16))], "BATCH_MATMUL", BMM)


@pytest.mark.parametrize("a_shape,b_shape,adj_y", [((2, 3, 4, 5), (5, 6), False), ((1, 40, 33), (1, 17, 33), True)])
def test_batch_matmul_without_vnni(monkeypatch, a_shape: tuple, b_shape: tuple, adj_y: bool) -> None:
    """The tiles' plain LLVM arithmetic, what a host without AVX-512 VNNI runs."""
    from litegpu_cpu.kernels import qmatmul
    monkeypatch.setattr(qmatmul, "VNNI", False)
    rng = np.random.default_rng(8)
    model = bmm_model(a_shape, b_shape, False, adj_y, (7, -3, -1))
    check(model, [full_range(rng, a_shape), full_range(rng, b_shape)], "BATCH_MATMUL", BMM)


def test_batch_matmul_int16_keeps_the_reference() -> None:
    b = ModelBuilder()
    x = b.input("x", (2, 3, 4), np.int16, scale=[0.001], zero_point=[0])
    z = b.input("z", (2, 4, 5), np.int16, scale=[0.001], zero_point=[0])
    y = b.tensor("y", (2, 3, 5), np.int16, scale=[0.002], zero_point=[0])
    b.op("BATCH_MATMUL", [x, z], [y], version=4)
    b.output(y)
    assert kernel_of(b.build(), "BATCH_MATMUL") == "reference"


# -- SQUARED_DIFFERENCE --------------------------------------------------------------------------


def binary_model(op: str, a_shape: tuple, b_shape: tuple, qs: list) -> bytes:
    b = ModelBuilder()
    x = b.input("x", a_shape, I8, scale=[qs[0][0]], zero_point=[qs[0][1]])
    z = b.input("z", b_shape, I8, scale=[qs[1][0]], zero_point=[qs[1][1]])
    y = b.tensor("y", tuple(np.broadcast_shapes(a_shape, b_shape)), I8, scale=[qs[2][0]], zero_point=[qs[2][1]])
    b.op(op, [x, z], [y])
    b.output(y)
    return b.build()


@pytest.mark.parametrize("qs", [[(0.05, -3), (0.03, 7), (0.04, 2)], [(0.02, 0), (0.06, -20), (0.5, -100)]])
@pytest.mark.parametrize("a_shape,b_shape", [
    ((3, 4, 5), (3, 4, 5)),
    ((1, 32, 64), (1, 32, 1)),              # a layer norm's x - mean
    ((1, 32, 1), (1, 32, 64)),              # the same, the other way round
    ((3, 4, 5), (1, 4, 1)),
    ((5,), (3, 4, 5)),
    ((2, 3, 4, 5, 6), (2, 3, 4, 5, 6)),     # rank 5: one loop once merged
    ((2, 1, 3, 4, 6), (1, 5, 3, 4, 1)),     # rank 5: four loops once merged
    ((64, 1024), (64, 1)),                  # rows cut into tasks
], ids=["same", "layernorm", "swapped", "broadcast", "rank", "rank5", "rank5-broadcast", "split"])
def test_squared_difference(qs: list, a_shape: tuple, b_shape: tuple) -> None:
    rng = np.random.default_rng(7)
    inputs = [full_range(rng, a_shape), full_range(rng, b_shape)]
    check(binary_model("SQUARED_DIFFERENCE", a_shape, b_shape, qs), inputs, "SQUARED_DIFFERENCE", PAIR_TABLE)


def test_squared_difference_every_pair_of_bytes() -> None:
    """All 65536 pairs: the whole table against LiteRT."""
    every = np.arange(-128, 128, dtype=I8)
    model = binary_model("SQUARED_DIFFERENCE", (256, 256), (256, 256), [(0.05, -3), (0.08, 7), (0.3, -120)])
    check(model, [np.repeat(every, 256).reshape(256, 256), np.tile(every, 256).reshape(256, 256)],
          "SQUARED_DIFFERENCE", PAIR_TABLE)


# -- RSQRT ---------------------------------------------------------------------------------------


def rsqrt_model(size: int, in_q: tuple, out_q: tuple) -> bytes:
    b = ModelBuilder()
    x = b.input("x", (size,), I8, scale=[in_q[0]], zero_point=[in_q[1]])
    y = b.tensor("y", (size,), I8, scale=[out_q[0]], zero_point=[out_q[1]])
    b.op("RSQRT", [x], [y])
    b.output(y)
    return b.build()


@pytest.mark.parametrize("in_q,out_q", [((0.05, -3), (0.02, -128)), ((0.1, -128), (0.01, -128)),
                                        ((0.01, 20), (0.1, 0)), ((1.5, -100), (0.003, -128))])
@pytest.mark.parametrize("repeat", [1, 400], ids=["one-task", "tasks"])
def test_rsqrt_every_value(in_q: tuple, out_q: tuple, repeat: int) -> None:
    """Every value from the zero point up (zero and the positive reals), repeated enough
    to be cut into tasks."""
    x = np.tile(np.arange(in_q[1], 128, dtype=np.int64).astype(I8), repeat)
    check(rsqrt_model(x.size, in_q, out_q), [x], "RSQRT", CHECKED_TABLE)


def test_rsqrt_of_a_negative_value_fails_when_run() -> None:
    """A byte below the zero point fails as the reference (and LiteRT) fail, in whichever
    task it lands; the next run with valid input is fine."""
    in_q, out_q = (0.05, -3), (0.02, -128)
    x = np.tile(np.arange(-3, 128, dtype=np.int64).astype(I8), 300)
    model = rsqrt_model(x.size, in_q, out_q)
    assert kernel_of(model, "RSQRT") == CHECKED_TABLE
    interp = litegpu.Interpreter(model_content=model)
    interp.allocate_tensors()
    index = interp.get_input_details()[0]["index"]
    for at in (0, x.size // 2, x.size - 1):
        bad = x.copy()
        bad[at] = -4
        interp.set_tensor(index, bad)
        with pytest.raises(ExecutionError, match="RSQRT"):
            interp.invoke()
    interp.set_tensor(index, x)
    interp.invoke()
    _, (want,) = run_both(model, [x])
    np.testing.assert_array_equal(interp.get_tensor(interp.get_output_details()[0]["index"]), want)
