"""Hybrid (dynamic-range) TRANSPOSE_CONV against LiteRT: the reference
(:mod:`litegpu.ops.hybrid`) and the cpu kernel (litegpu_cpu.kernels.qd8transposeconv).

LiteRT 2.3.0 runs a hybrid TRANSPOSE_CONV two ways (measured: each path equals its
reference bit for bit, the other's by a few ulps only):

- XNNPACK's dynamically quantized deconvolution when the output shape, weights and bias
  are constants of the file and the activation is a clamp;
- TFLite's builtin ``HybridTransposeConv`` otherwise: an output shape computed at run time
  (here SHAPE, MUL and ADD; a Keras Conv2DTranspose with a dynamic batch uses SHAPE,
  STRIDED_SLICE and PACK, as unet's decoder), a bias computed at run time, or an
  activation that is no clamp (TANH: LiteRT then applies none).

Each case runs on the kernel and on the reference alone and must equal LiteRT on every
element (:func:`test_ops_hybrid.close` first, for a readable failure).
"""
from __future__ import annotations

import numpy as np
import pytest

import litegpu
from litegpu.errors import UnsupportedError
from litegpu.testing.builder import ModelBuilder

from ai_edge_litert.interpreter import Interpreter as LiteRT  # a test dependency: never skipped

from test_ops_hybrid import close, float_input, scales, weights
from test_ops_quantized import run_both

RNG_SEED = 29
KERNEL = "hybrid transpose conv"


@pytest.fixture(params=["kernel", "reference"])
def runs(request, monkeypatch) -> str:
    """What runs the node: the cpu kernel, or (quantized kernels set aside) the reference."""
    if request.param == "kernel":
        return KERNEL
    from litegpu_cpu.kernels import registry
    monkeypatch.setattr(registry, "QUANTIZED_KERNELS", {})
    return "reference"


def output_hw(x_shape: tuple, k: int, stride: int, padding: str) -> tuple[int, int]:
    h, w = x_shape[1:3]
    if padding == "SAME":
        return h * stride, w * stride
    return (h - 1) * stride + k, (w - 1) * stride + k


def transpose_conv_model(x_shape: tuple, o: int, k: int, stride: int, padding: str, computed_shape: bool,
                         activation: str = "NONE", bias: str = "const", per_channel: bool = True,
                         seed: int = 0) -> bytes:
    """A hybrid TRANSPOSE_CONV of a float input ``x_shape`` into ``o`` channels, ``k`` x
    ``k`` int8 weights; its output shape a constant or ``computed_shape`` from the input's
    SHAPE; ``bias`` "const", "input" (a second model input) or "none"."""
    rng = np.random.default_rng(seed)
    n, _, _, c = x_shape
    oh, ow = output_hw(x_shape, k, stride, padding)
    w_scales = scales(rng, o, per_channel)
    b = ModelBuilder()
    x = b.input("x", x_shape, np.float32)
    w = b.const("w", weights(rng, (o, k, k, c)), scale=w_scales, zero_point=[0] * len(w_scales),
                quantized_dimension=0)
    if computed_shape:
        shape, scaled, out_shape = (b.tensor(name, (4,), np.int32) for name in ("shape", "scaled", "out_shape"))
        b.op("SHAPE", [x], [shape], out_type=np.int32)
        b.op("MUL", [shape, b.const("times", np.array([1, 0, 0, 0], np.int32))], [scaled])
        b.op("ADD", [scaled, b.const("plus", np.array([0, oh, ow, o], np.int32))], [out_shape])
    else:
        out_shape = b.const("out_shape", np.array([n, oh, ow, o], np.int32))
    inputs = [out_shape, w, x]
    if bias == "const":
        inputs.append(b.const("bias", rng.normal(size=o).astype(np.float32)))
    elif bias == "input":
        inputs.append(b.input("bias", (o,), np.float32))
    y = b.tensor("y", (n, oh, ow, o), np.float32)
    b.op("TRANSPOSE_CONV", inputs, [y], padding=padding, stride_h=stride, stride_w=stride,
         fused_activation_function=activation, version=3)
    b.output(y)
    return b.build()


def check(model: bytes, inputs: list[np.ndarray], runs: str) -> None:
    """The node runs on ``runs`` and equals LiteRT on every element."""
    interp = litegpu.Interpreter(model_content=model)
    interp.allocate_tensors()
    (name,) = {k[3] for k in interp.get_delegation_report().kernels if k[1] == "TRANSPOSE_CONV"}
    assert name.startswith(runs), name
    ours, theirs = run_both(model, inputs)
    for got, want in zip(ours, theirs):
        close(got, want)
        differ = int(np.count_nonzero(got != want))
        assert differ == 0, f"{differ} of {got.size} elements differ"


GEOMETRIES = pytest.mark.parametrize("x_shape,o,k,stride,padding", [
    ((1, 12, 12, 32), 16, 2, 2, "SAME"),       # unet's decoder
    ((2, 5, 6, 7), 12, 3, 2, "SAME"),          # a batch (its second image zeros), odd channels
    ((2, 4, 5, 8), 20, 3, 2, "VALID"),
    ((1, 6, 6, 16), 8, 3, 1, "SAME"),          # stride 1
    ((2, 4, 4, 5), 3, 2, 1, "VALID"),
    ((1, 3, 4, 4), 3, 4, 3, "VALID"),          # taps that never overlap
], ids=["unet", "batch-same", "batch-valid", "stride1", "k2-stride1-valid", "k4-stride3"])


@GEOMETRIES
@pytest.mark.parametrize("computed_shape", [False, True], ids=["xnnpack", "builtin"])
def test_transpose_conv(runs: str, x_shape: tuple, o: int, k: int, stride: int, padding: str,
                        computed_shape: bool) -> None:
    model = transpose_conv_model(x_shape, o, k, stride, padding, computed_shape, seed=3)
    check(model, [float_input(np.random.default_rng(RNG_SEED), x_shape, offset=0.5)], runs)


@pytest.mark.parametrize("computed_shape", [False, True], ids=["xnnpack", "builtin"])
@pytest.mark.parametrize("activation,bias,per_channel", [
    ("RELU", "const", False),
    ("RELU6", "none", True),
    ("RELU_N1_TO_1", "none", False),
    ("TANH", "const", True),                  # no clamp: the builtin kernel, which applies none
], ids=["relu-per-tensor", "relu6-no-bias", "relu-n1-per-tensor-no-bias", "tanh"])
def test_transpose_conv_options(runs: str, computed_shape: bool, activation: str, bias: str,
                                per_channel: bool) -> None:
    x_shape = (2, 5, 4, 6)
    model = transpose_conv_model(x_shape, 9, 3, 2, "SAME", computed_shape, activation, bias, per_channel, seed=5)
    check(model, [float_input(np.random.default_rng(RNG_SEED + 1), x_shape)], runs)


def test_transpose_conv_runtime_bias(runs: str) -> None:
    """A bias computed at run time: XNNPACK refuses the node, the builtin kernel runs it
    though its output shape is a constant."""
    x_shape, o = (1, 4, 5, 6), 7
    model = transpose_conv_model(x_shape, o, 3, 2, "SAME", False, bias="input", seed=7)
    rng = np.random.default_rng(RNG_SEED + 2)
    check(model, [float_input(rng, x_shape), rng.normal(size=o).astype(np.float32)], runs)


def test_transpose_conv_positive_image(runs: str) -> None:
    """Inputs all positive (after a ReLU, as in unet): the zero point at the range's end."""
    x_shape = (2, 6, 6, 8)
    x = np.abs(float_input(np.random.default_rng(RNG_SEED + 3), x_shape, zero_rows=0)) + 0.25
    for computed in (False, True):
        check(transpose_conv_model(x_shape, 8, 2, 2, "SAME", computed, seed=9), [x], runs)


@pytest.mark.parametrize("padding,new_shape", [("SAME", (2, 4, 5, 6)), ("VALID", (1, 6, 7, 6))],
                         ids=["same-batch2", "valid-larger"])
def test_transpose_conv_xnnpack_resized(runs: str, padding: str, new_shape: tuple) -> None:
    """XNNPACK's path with the input resized: it takes the batch (and, for VALID, the
    size) from the input, not from the constant output shape."""
    model = transpose_conv_model((1, 4, 5, 6), 7, 3, 2, padding, False, seed=11)
    x = float_input(np.random.default_rng(RNG_SEED + 4), new_shape)
    results = []
    for interp in (litegpu.Interpreter(model_content=model), LiteRT(model_content=model)):
        index = interp.get_input_details()[0]["index"]
        interp.resize_tensor_input(index, list(new_shape))
        interp.allocate_tensors()
        interp.set_tensor(index, x)
        interp.invoke()
        results.append(interp.get_tensor(interp.get_output_details()[0]["index"]).copy())
    close(*results)
    assert np.array_equal(*results)


def _exact_input(target: float, inv: np.float32) -> np.float32:
    """A float32 x near ``target / inv`` with ``x * inv == target`` in float32."""
    x = np.float32(target / np.float64(inv))
    for _ in range(64):
        if np.float32(x * inv) == np.float32(target):
            return x
        x = np.nextafter(x, np.float32(np.inf) if x * inv < target else np.float32(-np.inf))
    raise AssertionError(f"no float32 x gives {target} (inv {inv})")


def rounding_ties() -> np.ndarray:
    """An image row of 27 float32 values (24 in TFLite's vector loop, 3 in its tail) whose
    range gives scale 3/255 and zero point -43, with values whose ``x / scale`` is a tie
    (or 0.49999997) in both parts: a 1x1, one-channel op then shows each quantized value."""
    lo, hi = np.float32(-1.0), np.float32(2.0)
    inv = np.float32(1) / np.float32(np.float64(hi - lo) / 255.0)
    x = np.full(27, 0.3, np.float32)
    x[:2] = lo, hi
    for at, v in [(3, 0.49999997), (25, 0.49999997), (4, 10.5), (5, -10.5), (26, 2.5), (6, 42.5),
                  (7, -0.49999997)]:
        x[at] = _exact_input(v, inv)
    return x


def test_transpose_conv_builtin_rounding(runs: str) -> None:
    """TFLite's input quantization rounds ``x / scale`` and then adds the zero point, its
    vector loop rounding ``trunc(v + copysign(0.5, v))`` in float32 (0.49999997 -> 1), its
    scalar tail (the last ``K mod 8`` values of an image) exactly (0.49999997 -> 0).
    Values chosen to hit those ties: a 1x1 kernel, one channel in and out, shows each
    quantized value in the output."""
    x = rounding_ties()
    width = x.size
    b = ModelBuilder()
    xt = b.input("x", (1, 1, width, 1), np.float32)
    w = b.const("w", np.ones((1, 1, 1, 1), np.int8), scale=[0.5], zero_point=[0], quantized_dimension=0)
    shape, scaled, out_shape = (b.tensor(name, (4,), np.int32) for name in ("shape", "scaled", "out_shape"))
    b.op("SHAPE", [xt], [shape], out_type=np.int32)
    b.op("MUL", [shape, b.const("times", np.array([1, 1, 1, 0], np.int32))], [scaled])
    b.op("ADD", [scaled, b.const("plus", np.array([0, 0, 0, 1], np.int32))], [out_shape])
    y = b.tensor("y", (1, 1, width, 1), np.float32)
    b.op("TRANSPOSE_CONV", [out_shape, w, xt], [y], padding="VALID", stride_h=1, stride_w=1, version=3)
    b.output(y)
    check(b.build(), [x.reshape(1, 1, width, 1)], runs)


def test_transpose_conv_refuses_runtime_weights() -> None:
    """int8 weights computed at run time: refused (LiteRT's XNNPACK path needs them
    constant; its builtin kernel's run-time weights are not reproduced)."""
    b = ModelBuilder()
    x = b.input("x", (1, 3, 3, 4), np.float32)
    w = b.input("w", (2, 2, 2, 4), np.int8, scale=[0.1], zero_point=[0])
    y = b.tensor("y", (1, 6, 6, 2), np.float32)
    b.op("TRANSPOSE_CONV", [b.const("shape", np.array([1, 6, 6, 2], np.int32)), w, x], [y], padding="SAME",
         stride_h=2, stride_w=2, version=3)
    b.output(y)
    with pytest.raises(UnsupportedError, match="not constant"):
        litegpu.Interpreter(model_content=b.build()).allocate_tensors()
