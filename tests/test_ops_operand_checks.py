"""Shape inference checks every operand against the others on the actual (resized) shapes.

A resize the model cannot take fails at ``allocate_tensors()`` with an
``InvalidArgumentError`` naming node, op, operand and both shapes, before any backend
sees it; the model's own shapes disagreeing stays a ``ModelFormatError``.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import litegpu
from litegpu.testing.cases.nn import Const, one_op, rand

import built_models

F32 = np.float32


def _resized(data: bytes | Path, backend: str, shapes: dict[int, list[int]]) -> litegpu.Interpreter:
    kwargs = {"model_path": str(data)} if isinstance(data, Path) else {"model_content": data}
    it = litegpu.Interpreter(**kwargs, experimental_delegates=[litegpu.load_delegate(backend)])
    inputs = it.get_input_details()
    for pos, shape in shapes.items():
        it.resize_tensor_input(inputs[pos]["index"], shape)
    return it


def test_mobilenet_v2_with_four_channels_is_refused_at_allocate(backend_name, shared_model):
    it = _resized(shared_model("mobilenet_v2"), backend_name, {0: [1, 224, 224, 4]})
    with pytest.raises(litegpu.InvalidArgumentError) as info:
        it.allocate_tensors()
    msg = str(info.value)
    for part in ("node 0", "CONV_2D", "input 0", "[1, 224, 224, 4]", "filter", "[32, 3, 3, 3]"):
        assert part in msg, (part, msg)


def test_rank_change_is_a_clean_error(backend_name):
    data, _ = one_op("CONV_2D", [rand(np.random.default_rng(0), 1, 6, 6, 3),
                                 Const(rand(np.random.default_rng(1), 4, 3, 3, 3))], [(1, 6, 6, 4)],
                     padding="SAME", stride_h=1, stride_w=1)
    it = _resized(data, backend_name, {0: [6, 6, 3]})
    with pytest.raises(litegpu.InvalidArgumentError, match=r"node 0 \(CONV_2D\).*input 0.*rank 4.*\[6, 6, 3\]"):
        it.allocate_tensors()


def _fc_model() -> bytes:
    data, _ = one_op("FULLY_CONNECTED", [rand(np.random.default_rng(0), 2, 8),
                                         Const(rand(np.random.default_rng(1), 3, 8))], [(2, 3)])
    return data


def test_fully_connected_k_mismatch_names_both_shapes():
    it = _resized(_fc_model(), "cpu", {0: [2, 7]})
    with pytest.raises(litegpu.InvalidArgumentError) as info:
        it.allocate_tensors()
    msg = str(info.value)
    assert "FULLY_CONNECTED" in msg and "[2, 7]" in msg and "[3, 8]" in msg


def test_fully_connected_new_batch_runs():
    it = _resized(_fc_model(), "cpu", {0: [5, 8]})
    it.allocate_tensors()
    x = np.ones((5, 8), F32)
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    assert it.get_tensor(it.get_output_details()[0]["index"]).shape == (5, 3)


def test_batch_matmul_inner_dims_are_checked():
    rng = np.random.default_rng(0)
    data, _ = one_op("BATCH_MATMUL", [rand(rng, 2, 3, 4), rand(rng, 2, 4, 5)], [(2, 3, 5)])
    it = _resized(data, "cpu", {0: [2, 3, 6]})
    with pytest.raises(litegpu.InvalidArgumentError, match=r"BATCH_MATMUL.*inner dimensions.*\[2, 3, 6\].*\[2, 4, 5\]"):
        it.allocate_tensors()


def test_depthwise_multiplier_is_kept():
    rng = np.random.default_rng(0)
    data, _ = one_op("DEPTHWISE_CONV_2D", [rand(rng, 1, 5, 5, 2), Const(rand(rng, 1, 3, 3, 4))], [(1, 5, 5, 4)],
                     padding="SAME", stride_h=1, stride_w=1, depth_multiplier=2)
    it = _resized(data, "cpu", {0: [1, 5, 5, 4]})
    with pytest.raises(litegpu.InvalidArgumentError, match=r"DEPTHWISE_CONV_2D.*\[1, 5, 5, 4\].*\[1, 3, 3, 4\]"):
        it.allocate_tensors()


def test_transpose_conv_same_input_must_match_output_shape():
    rng = np.random.default_rng(0)
    data, _ = one_op("TRANSPOSE_CONV", [Const(np.array([1, 8, 8, 2], np.int32)), Const(rand(rng, 2, 3, 3, 3)),
                                        rand(rng, 1, 4, 4, 3)], [(1, 8, 8, 2)], padding="SAME", stride_h=2, stride_w=2)
    it = _resized(data, "cpu", {0: [1, 5, 4, 3]})
    with pytest.raises(litegpu.InvalidArgumentError, match=r"TRANSPOSE_CONV.*input 2.*\[1, 5, 4, 3\]"):
        it.allocate_tensors()
    # A new batch runs, as on LiteRT's default path, with the input's batch.
    it = _resized(data, "cpu", {0: [2, 4, 4, 3]})
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], np.ones((2, 4, 4, 3), F32))
    it.invoke()
    assert it.get_tensor(it.get_output_details()[0]["index"]).shape == (2, 8, 8, 2)


def test_broadcast_mismatch_is_refused():
    rng = np.random.default_rng(0)
    data, _ = one_op("ADD", [rand(rng, 2, 3), Const(rand(rng, 2, 3))], [(2, 3)])
    it = _resized(data, "cpu", {0: [2, 4]})
    with pytest.raises(litegpu.InvalidArgumentError, match=r"ADD"):
        it.allocate_tensors()


@pytest.mark.parametrize("which", ["built", "dynamic_batch_mlp"])
def test_dynamic_batch_mlp_wrong_width_is_refused(which, shared_model):
    it = _resized(built_models.mlp() if which == "built" else shared_model(which), "cpu", {0: [1, 21]})
    with pytest.raises(litegpu.InvalidArgumentError, match=r"FULLY_CONNECTED.*\[1, 21\]"):
        it.allocate_tensors()


def test_unet_small_runs_at_batch_2(shared_model):
    path = shared_model("unet_small")
    it = _resized(path, "cpu", {0: [2, 128, 128, 3]})
    it.allocate_tensors()
    x = np.random.default_rng(0).uniform(-1, 1, (2, 128, 128, 3)).astype(F32)
    it.set_tensor(it.get_input_details()[0]["index"], x)
    it.invoke()
    y = it.get_tensor(it.get_output_details()[0]["index"])
    assert y.shape == (2, 128, 128, 1)
    one = _resized(path, "cpu", {0: [1, 128, 128, 3]})
    one.allocate_tensors()
    one.set_tensor(one.get_input_details()[0]["index"], x[1:])
    one.invoke()
    np.testing.assert_allclose(y[1:], one.get_tensor(one.get_output_details()[0]["index"]), rtol=1e-5, atol=1e-6)


def test_the_models_own_mismatch_stays_a_format_error():
    rng = np.random.default_rng(0)
    data, _ = one_op("ADD", [rand(rng, 2, 3), Const(rand(rng, 2, 4))], [(2, 3)])
    with pytest.raises(litegpu.ModelFormatError):
        litegpu.Interpreter(model_content=data).allocate_tensors()


# -- LiteRT's verdicts matched op by op (each compared with LiteRT where it is installed) --


def _agree_with_litert(data: bytes, inputs: list[np.ndarray], backend: str) -> str:
    """Run ``inputs`` (each at its own shape) in LiteRT and in litegpu; the sweep's verdict,
    which must be an agreement."""
    from litegpu.testing import resize_sweep as rs

    verdict, detail = rs.classify(rs.run_litert(data, inputs), rs.run_litegpu(data, inputs, backend), inputs)
    assert verdict in ("agree-ran", "agree-refused"), (verdict, detail)
    return verdict


def test_prelu_broadcasts_the_input_up_to_a_constant_alpha(backend_name):
    rng = np.random.default_rng(0)
    data, _ = one_op("PRELU", [rand(rng, 2, 3, 4), Const(rand(rng, 2, 3, 4))], [(2, 3, 4)])
    # LiteRT (XNNPACK) gives the broadcast shape [2, 3, 4] for a [1, 3, 4] input.
    assert _agree_with_litert(data, [rand(rng, 1, 3, 4)], backend_name) == "agree-ran"


def test_prelu_with_runtime_alpha_keeps_the_input_shape():
    rng = np.random.default_rng(0)
    data, _ = one_op("PRELU", [rand(rng, 1, 4, 4, 3), rand(rng, 1, 1, 3)], [(1, 4, 4, 3)])
    # LiteRT's builtin kernel (runtime alpha) refuses an output larger than the input.
    assert _agree_with_litert(data, [rand(rng, 1, 4, 4, 3, 1), rand(rng, 1, 1, 3)], "cpu") == "agree-refused"


def test_average_pool_valid_window_larger_than_the_input_divides_by_the_window(backend_name):
    rng = np.random.default_rng(0)
    data, _ = one_op("AVERAGE_POOL_2D", [rand(rng, 1, 7, 7, 5)], [(1, 1, 1, 5)], padding="VALID",
                     stride_h=1, stride_w=1, filter_height=7, filter_width=7, fused_activation_function="RELU6")
    x = rng.uniform(0, 1, (1, 6, 7, 5)).astype(F32)
    assert _agree_with_litert(data, [x], backend_name) == "agree-ran"
    y = litegpu_run(data, [x], backend_name)[0]
    np.testing.assert_allclose(y.reshape(-1), np.minimum(x.sum(axis=(1, 2)) / 49, 6).reshape(-1), rtol=1e-5)


@pytest.mark.parametrize("op", ["REDUCE_MAX", "REDUCE_MIN"])
def test_empty_float_reduction_with_constant_axes_gives_infinity(backend_name, op):
    rng = np.random.default_rng(0)
    data, _ = one_op(op, [rand(rng, 2, 3, 4), Const(np.array([1], np.int32))], [(2, 4)])
    x = np.zeros((2, 0, 4), F32)
    assert _agree_with_litert(data, [x], backend_name) == "agree-ran"
    y = litegpu_run(data, [x], backend_name)[0]
    assert np.all(y == (-np.inf if op == "REDUCE_MAX" else np.inf))


def test_empty_float_reduction_with_runtime_axes_gives_the_lowest_float():
    rng = np.random.default_rng(0)
    data, _ = one_op("REDUCE_MAX", [rand(rng, 2, 3, 4), np.array([1], np.int32)], [(2, 4)])
    inputs = [np.zeros((2, 0, 4), F32), np.array([1], np.int32)]
    assert _agree_with_litert(data, inputs, "cpu") == "agree-ran"
    assert np.all(litegpu_run(data, inputs, "cpu")[0] == np.finfo(F32).min)


def test_slice_with_constant_size_keeps_its_declared_output_shape():
    rng = np.random.default_rng(0)
    data, _ = one_op("SLICE", [rand(rng, 4, 3), Const(np.array([1, 0], np.int32)),
                               Const(np.array([2, -1], np.int32))], [(2, 3)])
    # size -1 on a resized dim gives [2, 4], not the declared [2, 3]: LiteRT refuses.
    assert _agree_with_litert(data, [rand(rng, 4, 4)], "cpu") == "agree-refused"
    assert _agree_with_litert(data, [rand(rng, 5, 3)], "cpu") == "agree-ran"


def test_batch_matmul_runs_at_rank_6_and_refuses_rank_7(backend_name):
    rng = np.random.default_rng(0)
    data, _ = one_op("BATCH_MATMUL", [rand(rng, 1, 2, 2, 3, 4), rand(rng, 1, 2, 2, 4, 3)], [(1, 2, 2, 3, 3)])
    b = rand(rng, 1, 2, 2, 4, 3)
    assert _agree_with_litert(data, [rand(rng, 2, 1, 2, 2, 3, 4), b], backend_name) == "agree-ran"
    assert _agree_with_litert(data, [rand(rng, 1, 1, 1, 2, 2, 3, 4), b], backend_name) == "agree-refused"


def test_max_pool_takes_a_rank_5_input_with_a_trailing_1(backend_name):
    rng = np.random.default_rng(0)
    data, _ = one_op("MAX_POOL_2D", [rand(rng, 1, 9, 9, 2)], [(1, 5, 5, 2)], padding="SAME", stride_h=2,
                     stride_w=2, filter_height=3, filter_width=3)
    assert _agree_with_litert(data, [rand(rng, 1, 9, 9, 2, 1)], backend_name) == "agree-ran"
    # LiteRT pools [1, 9, 9, 2, 3] as a prefix of its data: litegpu refuses.
    assert rs_outcome(data, [rand(rng, 1, 9, 9, 2, 3)], backend_name) == "refused"


def _conv_after(op: str, channels: int, *, runtime_filter: bool = False) -> tuple[bytes, list]:
    """``op`` (a one-input activation) then a 3x3 CONV_2D with a [4, 3, 3, channels] filter."""
    from litegpu.testing.builder import ModelBuilder

    b = ModelBuilder()
    x = b.input("x", (1, 8, 8, channels), F32)
    inner = b.tensor("inner", (1, 8, 8, channels), F32)
    b.op(op, [x], [inner])
    w_value = rand(np.random.default_rng(1), 4, 3, 3, channels)
    w = b.input("w", w_value.shape, F32) if runtime_filter else b.const("w", w_value)
    y = b.tensor("y", (1, 8, 8, 4), F32)
    b.op("CONV_2D", [inner, w, b.const("bias", np.zeros(4, F32))], [y], padding="SAME", stride_h=1, stride_w=1)
    b.output(y)
    return b.build(), [w_value] if runtime_filter else []


def test_conv_inside_the_model_refuses_new_channels(backend_name):
    """LiteRT (XNNPACK) fixes the groups from a non-input tensor's declared channels."""
    data, _ = _conv_after("RELU", 3)
    x = np.random.default_rng(0).uniform(-1, 1, (1, 8, 8, 6)).astype(F32)
    assert _agree_with_litert(data, [x], backend_name) == "agree-refused"
    it = _resized(data, backend_name, {0: [1, 8, 8, 6]})
    expected = r"CONV_2D.*input 0.*\[1, 8, 8, 6\].*declares.*\[1, 8, 8, 3\]"
    with pytest.raises(litegpu.InvalidArgumentError, match=expected):
        it.allocate_tensors()
    # Reading the resized subgraph input itself, the conv runs grouped (as in LiteRT),
    # given a bias: without one LiteRT refuses a grouped conv, and so does litegpu.
    args = [rand(np.random.default_rng(0), 1, 8, 8, 3), Const(rand(np.random.default_rng(1), 4, 3, 3, 3))]
    with_bias, _ = one_op("CONV_2D", [*args, Const(np.ones(4, F32))], [(1, 8, 8, 4)], padding="SAME",
                          stride_h=1, stride_w=1)
    assert _agree_with_litert(with_bias, [x], backend_name) == "agree-ran"
    no_bias, _ = one_op("CONV_2D", args, [(1, 8, 8, 4)], padding="SAME", stride_h=1, stride_w=1)
    assert _agree_with_litert(no_bias, [x], backend_name) == "agree-refused"


def test_resnet18_fp16_with_six_channels_is_refused_as_in_litert(shared_model):
    it = _resized(shared_model("resnet18_fp16"), "cpu", {0: [1, 224, 224, 6]})
    with pytest.raises(litegpu.InvalidArgumentError, match=r"CONV_2D.*6 channels.*declares"):
        it.allocate_tensors()


def litegpu_run(data: bytes, inputs: list[np.ndarray], backend: str) -> list[np.ndarray]:
    """litegpu's outputs for ``inputs`` (each input resized to its array's shape)."""
    from litegpu.testing import resize_sweep as rs

    outcome = rs.run_litegpu(data, inputs, backend)
    assert outcome.status == "ran", outcome.error
    return outcome.outputs


def rs_outcome(data: bytes, inputs: list[np.ndarray], backend: str) -> str:
    """litegpu's status for ``inputs``: ran, refused (a LiteGpuError) or raw."""
    from litegpu.testing import resize_sweep as rs

    return rs.run_litegpu(data, inputs, backend).status


def test_resize_of_an_empty_image_is_refused():
    rng = np.random.default_rng(0)
    data, _ = one_op("RESIZE_BILINEAR", [rand(rng, 1, 4, 4, 2), Const(np.array([8, 8], np.int32))], [(1, 8, 8, 2)])
    it = _resized(data, "cpu", {0: [1, 0, 4, 2]})
    with pytest.raises(litegpu.InvalidArgumentError, match=r"RESIZE_BILINEAR.*\[1, 0, 4, 2\].*empty image"):
        it.allocate_tensors()


def test_reverse_v2_needs_as_many_dims_as_axes():
    data, _ = one_op("REVERSE_V2", [np.arange(5, dtype=np.int32), Const(np.array([0], np.int32))], [(5,)],
                     out_dtype=np.int32)
    it = _resized(data, "cpu", {0: []})
    with pytest.raises(litegpu.InvalidArgumentError, match=r"REVERSE_V2.*fewer dims than the 1 axes"):
        it.allocate_tensors()


def test_gather_of_a_scalar_is_refused_at_allocate():
    data, _ = one_op("GATHER", [rand(np.random.default_rng(0), 5), Const(np.array([1, 2], np.int32))], [(2,)])
    it = _resized(data, "cpu", {0: []})
    with pytest.raises(litegpu.InvalidArgumentError, match=r"GATHER.*rank >= 1"):
        it.allocate_tensors()


def test_fully_connected_runtime_weights_must_match_the_bias():
    rng = np.random.default_rng(0)
    data, _ = one_op("FULLY_CONNECTED", [rand(rng, 2, 7), rand(rng, 3, 7), Const(rand(rng, 3))], [(2, 3)])
    it = _resized(data, "cpu", {1: [4, 7]})
    with pytest.raises(litegpu.InvalidArgumentError, match=r"FULLY_CONNECTED.*bias.*\[3\].*\[4, 7\]"):
        it.allocate_tensors()


@pytest.mark.parametrize("op", ["DIV", "FLOOR_MOD"])
def test_opencl_leaves_integer_division_by_a_runtime_divisor_to_cpu(opencl, op):
    """Integer division by zero is LiteRT's run-time error: opencl declines the node, cpu raises."""
    data, _ = one_op(op, [np.ones((2, 3), np.int32), np.ones((2, 3), np.int32)], [(2, 3)], out_dtype=np.int32)
    it = litegpu.Interpreter(model_content=data, experimental_delegates=[litegpu.load_delegate("opencl")])
    it.allocate_tensors()
    a, b = it.get_input_details()
    it.set_tensor(a["index"], np.ones((2, 3), np.int32))
    it.set_tensor(b["index"], np.zeros((2, 3), np.int32))
    with pytest.raises(litegpu.LiteGpuError):
        it.invoke()


def test_opencl_leaves_runtime_gather_indices_to_cpu(opencl):
    """Out-of-range run-time indices are LiteRT's run-time error: opencl declines, cpu raises."""
    data, _ = one_op("GATHER", [Const(rand(np.random.default_rng(0), 4, 2)), np.array([0, 1, 2], np.int32)], [(3, 2)])
    it = litegpu.Interpreter(model_content=data, experimental_delegates=[litegpu.load_delegate("opencl")])
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], np.array([0, 1, 7], np.int32))
    with pytest.raises(litegpu.LiteGpuError):
        it.invoke()
