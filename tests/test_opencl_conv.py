"""The convolution and matmul kernels (:mod:`litegpu.codegen.kernels.conv`) on the real
OpenCL device, for the paths the conformance cases do not reach: grouped convs
whose groups fill whole tiles, float16/float8/float4 tiles with ragged row ends,
output channels that are not a multiple of 4 behind followers, strided reductions,
rhs rows read with one vector load, and the fp16 storage mode.

Each test builds one model with several nodes (one program build) and compares every
output with the numpy references, which the conformance suite checks against LiteRT.
The kernels are written with :mod:`litegpu.codegen.ir`, so the same models run on
webgpu too (lavapipe in CI), where WGSL's widest vector makes every tile a float4.
"""
from __future__ import annotations

import numpy as np
import pytest
from litegpu.model import load_model
from litegpu.testing.builder import ModelBuilder
from litegpu.testing.cases.nn import transpose_conv_bias_options
from litegpu.testing.conformance import (
    compare,
    litegpu_outputs,
    reference_outputs,
    unsupported,
)

F32 = np.float32
FP16_TOL = 1e-2


def rand(rng, *shape):
    return rng.standard_normal(shape).astype(F32)


@pytest.fixture(params=["opencl", "webgpu"])
def gpu(request):
    """A GPU backend the kernels run on (skips, or fails where required, as its fixture does):
    opencl with float16/float8 tiles, webgpu with float4 tiles only."""
    return request.getfixturevalue(request.param)


def check(backend, model: bytes, inputs, fp16: bool = False, tol: float = 1e-5) -> None:
    """Every node runs on ``backend`` and every output matches the references."""
    refused = unsupported(model, backend)
    assert not refused, f"{backend.name} refused {[(r[2], r[3].reason) for r in refused]}"
    got = litegpu_outputs(model, inputs, backend.name, precision_loss_allowed=fp16)
    want = reference_outputs(model, inputs)
    compare(got, want, FP16_TOL if fp16 else tol)


def test_pack_oc_puts_output_channels_side_by_side():
    from litegpu.codegen.kernels.conv import pack_oc
    w = np.arange(6 * 5, dtype=F32).reshape(6, 5) + 1   # [O=6, K=5]
    p = pack_oc(w, 4)
    assert p.shape == (2, 5, 4)
    assert p[1, 3].tolist() == [w[4, 3], w[5, 3], 0, 0]     # lanes past O are zero
    np.testing.assert_array_equal(p[0], w[:4].T)
    assert pack_oc(np.ones((3, 2, 16, 2), F32), 8).shape == (3, 2, 2, 2, 8)   # leading axes kept


def test_pixels_per_item_fits_the_row():
    from litegpu.codegen.kernels.conv import pixels_per_item
    assert pixels_per_item(56, 8) == 8
    assert pixels_per_item(14, 8) == 7           # no wasted pixel
    assert pixels_per_item(17, 8) == 6           # one wasted pixel
    assert pixels_per_item(56) == 4
    assert pixels_per_item(3) == 3
    assert pixels_per_item(1) == 1


def test_channel_vector_is_the_widest_that_divides():
    from litegpu.codegen.kernels.conv import channel_vector
    assert [channel_vector(c) for c in (144, 24, 12, 70, 3)] == [16, 8, 4, 4, 4]
    assert [channel_vector(c, 8) for c in (144, 24, 12)] == [8, 8, 4]
    assert [channel_vector(c, 4) for c in (144, 24, 12)] == [4, 4, 4]   # WGSL's widest vector


@pytest.mark.parametrize("fp16", [False, True], ids=["F32", "F32_F16"])
def test_conv2d_tiles_groups_and_channel_tails(gpu, fp16):
    rng = np.random.default_rng(1)
    b = ModelBuilder()
    x = b.input("x", (2, 13, 11, 8), F32)
    convs = [
        # (filter [O, KH, KW, I], bias, options): grouped with 4 and 16 channels per
        # group (one group per tile), grouped pointwise (8 per group), 70 channels
        # (float4 tiles, scalar stores), float8 tiles with mixed stride/dilation,
        # float16 tiles: pointwise without bias, strided.
        ((8, 3, 3, 4), True, dict(padding="SAME", stride_h=1, stride_w=1)),
        ((32, 3, 3, 4), True, dict(padding="SAME", stride_h=1, stride_w=1)),
        ((16, 1, 1, 4), True, dict(padding="VALID", stride_h=1, stride_w=1, fused_activation_function="RELU")),
        ((70, 3, 3, 8), True, dict(padding="SAME", stride_h=1, stride_w=1, fused_activation_function="RELU6")),
        ((24, 5, 3, 8), True, dict(padding="SAME", stride_h=1, stride_w=2, dilation_h_factor=2)),
        ((64, 1, 1, 8), False, dict(padding="VALID", stride_h=1, stride_w=1)),
        ((64, 3, 3, 8), True, dict(padding="VALID", stride_h=2, stride_w=2)),
    ]
    outs = []
    for k, (w_shape, with_bias, options) in enumerate(convs):
        w = b.const(f"w{k}", rand(rng, *w_shape))
        bias = b.const(f"b{k}", rand(rng, w_shape[0])) if with_bias else -1
        sh, sw = options["stride_h"], options["stride_w"]
        dh = options.get("dilation_h_factor", 1)
        if options["padding"] == "SAME":
            oh, ow = -(-13 // sh), -(-11 // sw)
        else:
            oh, ow = (13 - (w_shape[1] - 1) * dh - 1) // sh + 1, (11 - w_shape[2]) // sw + 1
        y = b.tensor(f"y{k}", (2, oh, ow, w_shape[0]), F32)
        b.op("CONV_2D", [x, w, bias], [y], **options)
        outs.append(y)
    b.output(*outs)
    check(gpu, b.build(), [rand(rng, 2, 13, 11, 8)], fp16)


@pytest.mark.parametrize("fp16", [False, True], ids=["F32", "F32_F16"])
def test_depthwise_tiles_and_multipliers(gpu, fp16):
    rng = np.random.default_rng(2)
    b = ModelBuilder()
    x = b.input("x", (1, 15, 17, 64), F32)
    small = b.input("small", (2, 9, 10, 8), F32)
    layers = [
        # (input, its shape, filter, output, options): float16 tiles of 6 pixels over
        # ragged rows of 17; a 5x5 stride 2; multiplier 2 over 8 channels (lanes
        # gathered); float8 tiles with dilation 3 and stride 2.
        (x, (1, 15, 17, 64), (1, 3, 3, 64), (1, 15, 17, 64), dict(padding="SAME", stride_h=1, stride_w=1)),
        (x, (1, 15, 17, 64), (1, 5, 5, 64), (1, 8, 9, 64),
         dict(padding="SAME", stride_h=2, stride_w=2, fused_activation_function="RELU6")),
        (small, (2, 9, 10, 8), (1, 3, 3, 16), (2, 9, 10, 16), dict(padding="SAME", stride_h=1, stride_w=1)),
        (small, (2, 9, 10, 8), (1, 3, 3, 8), (2, 2, 2, 8),
         dict(padding="VALID", stride_h=2, stride_w=2, dilation_h_factor=3, dilation_w_factor=3)),
    ]
    outs = []
    for k, (src, _, w_shape, out_shape, options) in enumerate(layers):
        w = b.const(f"w{k}", rand(rng, *w_shape))
        bias = b.const(f"b{k}", rand(rng, w_shape[3]))
        y = b.tensor(f"y{k}", out_shape, F32)
        b.op("DEPTHWISE_CONV_2D", [src, w, bias], [y], version=2,
             depth_multiplier=w_shape[3] // layers[k][1][3], **options)
        outs.append(y)
    b.output(*outs)
    check(gpu, b.build(), [rand(rng, 1, 15, 17, 64), rand(rng, 2, 9, 10, 8)], fp16)


def test_transpose_convs_with_many_phases_and_tiles(gpu):
    rng = np.random.default_rng(3)
    b = ModelBuilder()
    x = b.input("x", (1, 9, 7, 8), F32)
    outs = []
    for k, (w_shape, out_shape, padding, stride) in enumerate([
            ((12, 3, 3, 8), (1, 18, 14, 12), "SAME", 2),
            ((64, 4, 4, 8), (1, 28, 22, 64), "VALID", 3),
            ((5, 2, 2, 8), (1, 9, 7, 5), "SAME", 1)]):
        shape = b.const(f"s{k}", np.array(out_shape, np.int32))
        w = b.const(f"w{k}", rand(rng, *w_shape))
        y = b.tensor(f"y{k}", out_shape, F32)
        b.op("TRANSPOSE_CONV", [shape, w, x, b.const(f"b{k}", rand(rng, w_shape[0]))], [y], version=3,
             padding=padding, stride_h=stride, stride_w=stride)
        outs.append(y)
    w = b.const("wm", rand(rng, 8, 3, 3, 8))
    y = b.tensor("ym", (1, 18, 14, 8), F32)
    b.custom_op("Convolution2DTransposeBias", [x, w, b.const("bm", rand(rng, 8))], [y],
                custom_options=transpose_conv_bias_options("SAME", 2, 2))
    b.output(*outs, y)
    check(gpu, b.build(), [rand(rng, 1, 9, 7, 8)])


def test_fully_connected_and_batch_matmul_operand_layouts(gpu):
    rng = np.random.default_rng(4)
    b = ModelBuilder()
    x = b.input("x", (2, 3, 10), F32)
    w = b.input("w", (6, 10), F32)
    lhs = b.input("lhs", (2, 1, 7, 5), F32)        # adj_x: K = 7 read with a stride of 5
    rhs = b.input("rhs", (3, 7, 8), F32)           # N = 8: one LD4 per step
    a = b.input("a", (2, 5, 3), F32)
    y0, y1, y2, y3, y4 = (b.tensor(f"y{k}", s, F32) for k, s in enumerate(
        [(2, 3, 6), (6, 40), (2, 3, 5, 8), (2, 5, 4), (2, 5, 16)]))
    # Weights computed at run time, 6 outputs (scalar tail), keep_num_dims.
    b.op("FULLY_CONNECTED", [x, w, b.const("fb", rand(rng, 6))], [y0], keep_num_dims=True,
         fused_activation_function="RELU")
    # Constant weights, 40 outputs, a rank-3 input flattened to rows of 10, no bias.
    b.op("FULLY_CONNECTED", [x, b.const("fw", rand(rng, 40, 10)), -1], [y1])
    b.op("BATCH_MATMUL", [lhs, rhs], [y2], adj_x=True)
    # Constant rhs per batch, transposed ([batch, N, K]), repacked at compile time.
    b.op("BATCH_MATMUL", [a, b.const("c", rand(rng, 2, 4, 3))], [y3], adj_y=True)
    # One constant rhs shared by the batch (float16 tiles).
    b.op("BATCH_MATMUL", [a, b.const("d", rand(rng, 3, 16))], [y4])
    b.output(y0, y1, y2, y3, y4)
    check(gpu, b.build(), [rand(rng, 2, 3, 10), rand(rng, 6, 10), rand(rng, 2, 1, 7, 5),
                              rand(rng, 3, 7, 8), rand(rng, 2, 5, 3)])


@pytest.mark.parametrize("channels", [16, 8, 6])
def test_followers_fold_into_the_conv_store(gpu, channels):
    """conv -> ADD (same shape) -> MUL (per channel) -> RELU is one launch, for float16
    and float8 tiles (stored a float4 at a time) and for 6 channels (scalar stores)."""
    from litegpu.session import Session
    rng = np.random.default_rng(5)
    b = ModelBuilder()
    x = b.input("x", (1, 6, 9, 3), F32)
    skip = b.input("skip", (1, 6, 9, channels), F32)
    c = b.tensor("c", (1, 6, 9, channels), F32)
    b.op("CONV_2D", [x, b.const("w", rand(rng, channels, 3, 3, 3)), b.const("b", rand(rng, channels))], [c],
         padding="SAME", stride_h=1, stride_w=1)
    s = b.tensor("s", (1, 6, 9, channels), F32)
    b.op("ADD", [c, skip], [s])
    m = b.tensor("m", (1, 6, 9, channels), F32)
    b.op("MUL", [b.const("scale", rand(rng, channels)), s], [m])
    y = b.tensor("y", (1, 6, 9, channels), F32)
    b.op("RELU", [m], [y])
    b.output(y)
    model = b.build()
    program = Session(load_model(model), [gpu.name]).compile(0).programs[0][0]
    assert len(program.launches) == 1
    check(gpu, model, [rand(rng, 1, 6, 9, 3), rand(rng, 1, 6, 9, channels)])


def test_empty_outputs_launch_nothing(gpu):
    """A VALID window larger than the input gives an empty output, not a failed build."""
    b = ModelBuilder()
    x = b.input("x", (1, 3, 3, 4), F32)
    y = b.tensor("y", (1, 0, 0, 8), F32)
    b.op("CONV_2D", [x, b.const("w", np.ones((8, 5, 5, 4), F32)), b.const("b", np.ones(8, F32))], [y],
         padding="VALID", stride_h=1, stride_w=1)
    z = b.tensor("z", (1, 0, 0, 8), F32)
    b.op("DEPTHWISE_CONV_2D", [x, b.const("dw", np.ones((1, 5, 5, 8), F32)), -1], [z], padding="VALID",
         stride_h=1, stride_w=1, depth_multiplier=2)
    b.output(y, z)
    model = b.build()
    assert not unsupported(model, gpu)
    got = litegpu_outputs(model, [np.ones((1, 3, 3, 4), F32)], gpu.name)
    assert [g.shape for g in got] == [(1, 0, 0, 8), (1, 0, 0, 8)]
