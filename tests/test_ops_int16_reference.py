"""int16 integer references (litegpu.ops.quantized) where LiteRT's builtin kernels have
quirks, against LiteRT, exactly: the vector loop of an ADD that broadcasts nothing, which
rounds once where the scalar code after it (and SUB's, and a broadcasting ADD's) rounds
twice, and QUANTIZE of floats past int32's range, infinities and NaN (-32768).

As in tests/test_ops_quantized.py, the cpu backend's integer kernels are set aside so the
references themselves run."""
from __future__ import annotations

import numpy as np
import pytest

from litegpu.ops.quantized import add16_operand
from litegpu.quant import multiply_by_quantized_multiplier, quantize_multiplier
from litegpu.testing.builder import ModelBuilder

from test_ops_quantized import references_only, run_both  # noqa: F401  (the fixture is autouse)

I16 = np.int16
QS = [float(np.float32(q)) for q in (0.0007, 0.0003, 0.0006)]     # a's scale, b's, the output's
# TFLite's general int16 ADD: each input's share of twice the larger scale, the output's
# multiplier of that over 2^15 output steps.
M_A, M_B = (tuple(int(v) for v in quantize_multiplier(q / (2 * max(QS[:2])))) for q in QS[:2])
M_OUT = tuple(int(v) for v in quantize_multiplier(2 * max(QS[:2]) / ((1 << 15) * QS[2])))


def assert_exact(model: bytes, inputs: list[np.ndarray]) -> np.ndarray:
    """The reference equals LiteRT on every element; LiteRT's output."""
    (got,), (want,) = run_both(model, inputs)
    differ = np.flatnonzero(got != want)
    assert differ.size == 0, (f"{differ.size} of {got.size} differ, first at {differ[:5].tolist()}: ours "
                              f"{got.reshape(-1)[differ[:5]].tolist()}, LiteRT {want.reshape(-1)[differ[:5]].tolist()}")
    return want


def add_model(op: str, a_shape, b_shape) -> bytes:
    """TFLite's general int16 ADD/SUB (``pot_scale_int16`` false, as the converter writes)."""
    b = ModelBuilder()
    x = b.input("x", a_shape, I16, scale=[QS[0]], zero_point=[0])
    z = b.input("z", b_shape, I16, scale=[QS[1]], zero_point=[0])
    y = b.tensor("y", a_shape, I16, scale=[QS[2]], zero_point=[0])
    b.op(op, [x, z], [y], version=3, pot_scale_int16=False)
    b.output(y)
    return b.build()


def rounded(a: np.ndarray, b: np.ndarray, vector: bool, sign: int = 1) -> np.ndarray:
    """``a + sign * b`` with one of LiteRT's two roundings throughout (the reference's
    :func:`add16_operand`), saturated."""
    total = add16_operand(a, 0, *M_A, vector) + sign * add16_operand(b, 0, *M_B, vector)
    return np.clip(multiply_by_quantized_multiplier(total, *M_OUT), -32768, 32767)


def operands_rounding_apart(n: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """``n`` pairs (a, b) that LiteRT's two roundings of an ADD take to different outputs."""
    a_parts, b_parts = [], []
    while sum(p.size for p in a_parts) < n:
        a, b = (rng.integers(-32768, 32768, 1 << 16) for _ in "ab")
        keep = rounded(a, b, True) != rounded(a, b, False)
        a_parts.append(a[keep])
        b_parts.append(b[keep])
    return np.concatenate(a_parts)[:n].astype(I16), np.concatenate(b_parts)[:n].astype(I16)


def test_same_shape_add_rounds_as_litert_vector_loop_then_its_scalar_code() -> None:
    """Pairs on which the roundings differ fill two whole blocks of 16 outputs (the vector
    loop) and the 15 outputs after them (the scalar code): the reference gives LiteRT's
    integers in both, which either rounding alone misses."""
    a, b = operands_rounding_apart(47, np.random.default_rng(1))
    want = assert_exact(add_model("ADD", (1, 47), (1, 47)), [a[None], b[None]])[0]
    vector, scalar = rounded(a, b, True), rounded(a, b, False)
    assert (want[:32] == vector[:32]).all() and (want[:32] != scalar[:32]).all()
    assert (want[32:] == scalar[32:]).all() and (want[32:] != vector[32:]).all()


@pytest.mark.parametrize("op,a_shape,b_shape,vector", [
    ("ADD", (1, 48), (48,), True),          # nothing to broadcast: LiteRT's elementwise loop
    ("ADD", (3, 48), (1, 48), False),       # broadcasts: its scalar code
    ("ADD", (48, 3), (3,), False),
    ("SUB", (1, 48), (1, 48), False),       # SUB: the scalar code
], ids=["add-same-size", "add-broadcast-rows", "add-broadcast-channels", "sub"])
def test_add_rounds_as_litert_vector_loop_only_without_broadcasting(op, a_shape, b_shape, vector) -> None:
    """LiteRT's vector loop runs for an ADD whose operands both have the output's size
    (of one shape or not); an ADD that broadcasts and SUB take the scalar code throughout.
    Each output here is one of a pair the two roundings take apart."""
    sign = -1 if op == "SUB" else 1
    rng = np.random.default_rng(2)
    codes = np.arange(-32768, 32768)
    apart = codes[add16_operand(codes, 0, *M_B, True) != add16_operand(codes, 0, *M_B, False)]
    b = rng.choice(apart, b_shape).astype(I16)
    b_full = np.broadcast_to(b, a_shape).reshape(-1)
    a = np.empty(b_full.size, I16)
    for i, value in enumerate(b_full):    # an a for each b that the roundings take apart
        candidates = rng.integers(-32768, 32768, 4096)
        same_b = np.full(candidates.size, value)
        a[i] = candidates[rounded(candidates, same_b, True, sign) != rounded(candidates, same_b, False, sign)][0]
    want = assert_exact(add_model(op, a_shape, b_shape), [a.reshape(a_shape), b]).reshape(-1)
    kept, lost = rounded(a, b_full, vector, sign), rounded(a, b_full, not vector, sign)
    assert (want == kept).all() and (want != lost).all()


def test_large_same_shape_add_is_exact() -> None:
    """Random full-range operands over many blocks and a tail (16 * 6250 + 9 outputs)."""
    rng = np.random.default_rng(3)
    shape = (1, 16 * 6250 + 9)
    assert_exact(add_model("ADD", shape, shape), [rng.integers(-32768, 32768, shape).astype(I16) for _ in "ab"])


@pytest.mark.parametrize("zero_point", [0, 7])
def test_quantize_floats_past_int32_to_int16_as_litert(zero_point: int) -> None:
    """Ties, saturation, values past int32's range, infinities and NaN: LiteRT's int16
    QUANTIZE converts the rounded value to int32 (x86: INT32_MIN when it does not fit, NaN
    too), then saturates; finite values in range round to nearest even."""
    b = ModelBuilder()
    x = b.input("x", (3, 1000), np.float32)
    y = b.tensor("y", (3, 1000), I16, scale=[0.001], zero_point=[zero_point])
    b.op("QUANTIZE", [x], [y])
    b.output(y)
    rng = np.random.default_rng(4)
    values = (rng.normal(size=(3, 1000)) * 20).astype(np.float32)      # many saturate
    values[0, :10] = [1e30, -1e30, np.inf, -np.inf, np.nan, 2.1e6, 2.2e6, -2.2e6, 3e38, -3e38]
    values[0, 10:14] = [2.0 ** 31 * 0.001, -(2.0 ** 31) * 0.001, 2.1474835e6, -2.1474836e6]   # int32's edges
    values[1, :200] = (np.arange(200, dtype=np.float32) - 100) * np.float32(0.0005)   # ties at half quanta
    want = assert_exact(b.build(), [values])
    assert (want[0, [0, 1, 2, 3, 4]] == -32768).all()
