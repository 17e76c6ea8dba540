"""Kernels that put a work-group on one row or output (``NodeGen.lanes``): a GPU's 64
work-items, 1 on a CPU device. PoCL and lavapipe are CPU devices, so these run them with
``LITEGPU_GPU_LANES`` set: the hybrid product of a decode step's few rows (each work-item
an exact integer sum of a segment of K), its row quantization, the rms norm and SOFTMAX
(XNNPACK's accumulator lanes one work-item each) and the attention composite, against LiteRT (on
opencl, whose arithmetic is XNNPACK's, to the bit) and against the same kernels on one
lane."""
from __future__ import annotations

import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter as LiteRT

import litegpu
from litegpu.codegen.render import LANES_ENV, kernel_lanes
from litegpu.errors import InvalidArgumentError
from litegpu.model import load_model
from litegpu.session import Session
from litegpu.testing.builder import ModelBuilder
from litegpu.testing.cases.composite import rms_norm_case, sdpa_case
from test_int4_weights import _run, hybrid_fc

RNG = np.random.default_rng(11)


def per_channel_fc(rows: int, k: int, units: int, act: str) -> bytes:
    """A hybrid FULLY_CONNECTED with int8 weights per channel and a bias, then an ADD the
    product's store takes as its epilogue."""
    b = ModelBuilder()
    x = b.input("x", (rows, k), np.float32)
    scales = RNG.uniform(0.004, 0.02, units).astype(np.float32)
    w = b.const("w", RNG.integers(-127, 128, (units, k)).astype(np.int8), scale=scales, zero_point=[0] * units,
                quantized_dimension=0)
    y = b.tensor("y", (rows, units), np.float32)
    b.op("FULLY_CONNECTED", [x, w, b.const("bias", RNG.normal(size=units).astype(np.float32))], [y],
         fused_activation_function=act, asymmetric_quantize_inputs=True, version=12)
    z = b.tensor("z", (rows, units), np.float32)
    b.op("ADD", [y, b.const("c", RNG.normal(size=units).astype(np.float32))], [z])
    b.output(z)
    return b.build()


def softmax(shape: tuple[int, ...]) -> tuple[bytes, list[np.ndarray]]:
    """SOFTMAX (beta 1) of random rows, a third of each row -inf (an attention's mask)."""
    b = ModelBuilder()
    x = b.input("x", shape, np.float32)
    y = b.tensor("y", shape, np.float32)
    b.op("SOFTMAX", [x], [y], beta=1.0)
    b.output(y)
    values = (4 * RNG.standard_normal(shape)).astype(np.float32)
    values[..., 2 * shape[-1] // 3:] = -np.inf
    return b.build(), [values]


def _local_sizes(data: bytes, backend: str, op: str) -> set:
    programs = Session(load_model(data), [backend]).compile(0).programs
    return {launch.local_size if hasattr(launch, "local_size") else launch.groups for program, _, _ in programs
            for launch in getattr(program, "launches", []) if launch.nodes[0].node.op == op}


def _rows(rows: int, k: int, scale: float = 1.0) -> np.ndarray:
    return (scale * RNG.standard_normal((rows, k))).astype(np.float32)


CASES = {
    "int8-decode": lambda: (per_channel_fc(1, 300, 40, "RELU"), [_rows(1, 300, 3.0)]),
    "int8-rows": lambda: (per_channel_fc(5, 64, 17, "NONE"), [_rows(5, 64)]),
    # A row of zeros (an empty range), one of negative zeros and negatives, one positive.
    "int8-ranges": lambda: (per_channel_fc(3, 70, 9, "NONE"), [np.stack([
        np.zeros(70), np.where(np.arange(70) % 3, -0.0, -RNG.random(70)), RNG.random(70)]).astype(np.float32)]),
    "int4-block32": lambda: (hybrid_fc(1, 32, units=37, depth=256), [_rows(1, 256, 3.0)]),
    "int4-block128-rows": lambda: (hybrid_fc(3, 128, units=20, depth=384), [_rows(3, 384)]),
    "attention-decode": lambda: sdpa_case("d", 1, 200, 6, 2, 32, start=120).build(),
    # Rows the sum's blocks of 64, its extra blocks of 16 and its tail each cover.
    "rms-768": lambda: rms_norm_case("r", (1, 1, 768), 1e-6).build(),
    "rms-odd": lambda: rms_norm_case("o", (3, 2, 100), 1e-5, scale=3.0).build(),
    "rms-short": lambda: rms_norm_case("s", (1, 40), 1e-5).build(),
    "softmax-512": lambda: softmax((1, 4, 3, 512)),
    "softmax-odd": lambda: softmax((5, 100)),
    "attention-prefill": lambda: sdpa_case("p", 9, 64, 4, 1, 16, start=3, logit_cap=4.0).build(),
}
OPS = {"int8": "HYBRID_FULLY_CONNECTED", "int4": "HYBRID_FULLY_CONNECTED", "rms": "odml.rms_norm",
       "softmax": "SOFTMAX", "attention": "odml.scaled_dot_product_attention"}


@pytest.mark.parametrize("case", CASES)
def test_work_groups_per_output_give_the_one_lane_results(opencl, monkeypatch, case):
    data, feeds = CASES[case]()
    op = OPS[case.split("-")[0]]
    results = {}
    for lanes in ("1", "64"):
        monkeypatch.setenv(LANES_ENV, lanes)
        assert _local_sizes(data, "opencl", op) == ({None} if lanes == "1" and op != OPS["attention"] else
                                                      {(int(lanes), 1)}), lanes
        delegate = litegpu.load_delegate("opencl")
        results[lanes] = _run(lambda d: litegpu.Interpreter(model_content=d, experimental_delegates=[delegate]),
                              data, feeds)
    np.testing.assert_array_equal(results["64"], results["1"])
    want = _run(lambda d: LiteRT(model_content=d), data, feeds)
    if op != OPS["attention"]:   # XNNPACK's arithmetic, step for step
        np.testing.assert_array_equal(results["64"], want)
    else:
        np.testing.assert_allclose(results["64"], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("case", ["int8-decode", "int4-block32", "attention-decode", "rms-odd", "softmax-odd"])
def test_work_groups_per_output_on_webgpu(webgpu, monkeypatch, case):
    data, feeds = CASES[case]()
    monkeypatch.setenv(LANES_ENV, "64")
    got = _run(lambda d: litegpu.Interpreter(model_content=d, experimental_delegates=[litegpu.load_delegate("webgpu")]),
               data, feeds)
    want = _run(lambda d: LiteRT(model_content=d), data, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_lanes_are_a_gpus_and_one_on_a_cpu_device(monkeypatch):
    monkeypatch.delenv(LANES_ENV, raising=False)
    assert kernel_lanes() == 64 and kernel_lanes(on_cpu=True) == 1
    monkeypatch.setenv(LANES_ENV, "8")
    assert kernel_lanes(on_cpu=True) == 8
    monkeypatch.setenv(LANES_ENV, "many")
    with pytest.raises(InvalidArgumentError, match="LITEGPU_GPU_LANES"):
        kernel_lanes()


def test_more_rows_than_one_launch_axis_holds_take_a_work_item_each(opencl, monkeypatch):
    """CUDA and WebGPU launch at most 65535 work-groups along an axis: a row op with more
    rows than that keeps its one-work-item kernel, whatever the lanes."""
    monkeypatch.setenv(LANES_ENV, "64")
    data, feeds = softmax((70000, 3))
    assert _local_sizes(data, "opencl", "SOFTMAX") == {None}
    delegate = litegpu.load_delegate("opencl")
    got = _run(lambda d: litegpu.Interpreter(model_content=d, experimental_delegates=[delegate]), data, feeds)
    np.testing.assert_array_equal(got, _run(lambda d: LiteRT(model_content=d), data, feeds))


@pytest.mark.parametrize("gpu", ["opencl", "webgpu"])
def test_more_outputs_than_one_launch_axis_holds_take_turns_in_each_work_group(request, monkeypatch, gpu):
    """A product with more outputs than one launch axis holds work-groups (a 262144-token
    vocabulary's logits) keeps a work-group per output: each group takes every
    ``MAX_GROUPS``-th output in turn. The limit is lowered here so a small product takes
    several turns, the last one partial."""
    from litegpu.codegen import nodegen
    request.getfixturevalue(gpu)
    monkeypatch.setenv(LANES_ENV, "64")
    monkeypatch.setattr(nodegen, "MAX_GROUPS", 16)
    for data, feeds in (CASES["int8-decode"](), CASES["int4-block32"](), CASES["int8-rows"]()):
        assert _local_sizes(data, gpu, "HYBRID_FULLY_CONNECTED") == ({(64, 1)} if gpu == "opencl" else {(1, 16, 1)})
        got = _run(lambda d: litegpu.Interpreter(model_content=d, experimental_delegates=[litegpu.load_delegate(gpu)]),
                   data, feeds)
        want = _run(lambda d: LiteRT(model_content=d), data, feeds)
        np.testing.assert_array_equal(got, want)


def float_fc(rows: int, k: int, units: int, bias: bool, act: str) -> bytes:
    """A float FULLY_CONNECTED with constant weights (and bias), then an ADD its store takes."""
    b = ModelBuilder()
    x = b.input("x", (rows, k), np.float32)
    y = b.tensor("y", (rows, units), np.float32)
    extra = [b.const("bias", RNG.normal(size=units).astype(np.float32))] if bias else [-1]
    b.op("FULLY_CONNECTED", [x, b.const("w", RNG.normal(size=(units, k)).astype(np.float32)), *extra], [y],
         fused_activation_function=act)
    z = b.tensor("z", (rows, units), np.float32)
    b.op("ADD", [y, b.const("c", RNG.normal(size=units).astype(np.float32))], [z])
    b.output(z)
    return b.build()


@pytest.mark.parametrize("gpu", ["opencl", "webgpu"])
@pytest.mark.parametrize("rows, k, units, bias, act", [(1, 768, 70, True, "NONE"), (3, 300, 9, False, "RELU"),
                                                       (8, 1024, 5, True, "RELU6")])
def test_float_products_of_a_few_rows_split_k_on_a_gpu(request, monkeypatch, gpu, rows, k, units, bias, act):
    """A float product of a few rows puts a work-group on each output on a GPU, its
    work-items summing interleaved steps of K: within float32 rounding of LiteRT's sums
    (another order than XNNPACK's one chain), where one lane keeps LiteRT's bits. With
    fewer work-groups than outputs, each takes several in turn."""
    from litegpu.codegen import nodegen
    request.getfixturevalue(gpu)
    data = float_fc(rows, k, units, bias, act)
    feeds = [_rows(rows, k, 2.0)]
    want = _run(lambda d: LiteRT(model_content=d), data, feeds)
    monkeypatch.setenv(LANES_ENV, "64")
    for limit in (nodegen.MAX_GROUPS, 7):
        monkeypatch.setattr(nodegen, "MAX_GROUPS", limit)
        groups = min(rows * units, limit)
        assert _local_sizes(data, gpu, "FULLY_CONNECTED") == ({(64, 1)} if gpu == "opencl" else {(1, groups, 1)})
        got = _run(lambda d: litegpu.Interpreter(model_content=d, experimental_delegates=[litegpu.load_delegate(gpu)]),
                   data, feeds)
        np.testing.assert_allclose(got, want, rtol=0, atol=4e-6 * np.abs(want).max())
    if gpu == "opencl":
        monkeypatch.setenv(LANES_ENV, "1")
        one = _run(lambda d: litegpu.Interpreter(model_content=d, experimental_delegates=[litegpu.load_delegate(gpu)]),
                   data, feeds)
        np.testing.assert_array_equal(one, want)


def batch_matmul(a_shape, b_shape, adj_x: bool, adj_y: bool, out_shape) -> bytes:
    b = ModelBuilder()
    x = b.input("a", a_shape, np.float32)
    y = b.input("b", b_shape, np.float32)
    z = b.tensor("z", out_shape, np.float32)
    b.op("BATCH_MATMUL", [x, y], [z], adj_x=adj_x, adj_y=adj_y)
    b.output(z)
    return b.build()


@pytest.mark.parametrize("gpu", ["opencl", "webgpu"])
@pytest.mark.parametrize("a_shape, b_shape, adj_x, adj_y, out_shape", [
    ((1, 4, 3, 512), (1, 4, 64, 512), False, True, (1, 4, 3, 64)),     # a decode step's values over its cache
    ((2, 1, 300, 2), (3, 300, 5), True, False, (2, 3, 2, 5)),          # broadcast batches, both transposed ways
])
def test_batch_products_of_a_few_rows_split_k_on_a_gpu(request, monkeypatch, gpu, a_shape, b_shape, adj_x, adj_y,
                                                        out_shape):
    """BATCH_MATMUL of a few rows per matrix over a long K (attention's values over the
    cache) splits K across a work-group per output on a GPU, as the float product does."""
    request.getfixturevalue(gpu)
    data = batch_matmul(a_shape, b_shape, adj_x, adj_y, out_shape)
    feeds = [RNG.standard_normal(a_shape).astype(np.float32), RNG.standard_normal(b_shape).astype(np.float32)]
    want = _run(lambda d: LiteRT(model_content=d), data, feeds)
    monkeypatch.setenv(LANES_ENV, "64")
    groups = int(np.prod(out_shape))
    assert _local_sizes(data, gpu, "BATCH_MATMUL") == ({(64, 1)} if gpu == "opencl" else {(1, groups, 1)})
    got = _run(lambda d: litegpu.Interpreter(model_content=d, experimental_delegates=[litegpu.load_delegate(gpu)]),
               data, feeds)
    np.testing.assert_allclose(got, want, rtol=0, atol=4e-6 * np.abs(want).max())
