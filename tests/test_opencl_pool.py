"""The pooling, reduction, softmax-family, normalization, resize and arg max/min kernels
(``litegpu.codegen.kernels.pool``) on the real OpenCL device, for the paths
the conformance cases do not reach: reductions over every pattern of kept / reduced
runs (float8 / float4 / scalar lanes, split accumulator chains, row tails), windows
clipped by SAME padding, rows whose length is no multiple of 4, negative softmax beta,
elementwise followers folded into these kernels, and float accumulation under half
storage. The float tests run on webgpu too, whose WGSL kernels take 4-lane vectors where
OpenCL's take 8 (the int64 and arg max/min tests stay on opencl: WGSL has no 64-bit
integers).

Most tests build one model with several nodes (one program build) and compare every
output with the numpy references, which the conformance suite checks against LiteRT.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from litegpu.model import load_model
from litegpu.ops import TensorSpec
from litegpu.testing.builder import ModelBuilder
from litegpu.testing.conformance import (
    compare,
    litegpu_outputs,
    node_contexts,
    reference_outputs,
    unsupported,
)

F32 = np.float32
FP16_TOL = 1e-2
_names = itertools.count()


def rand(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(F32)


@pytest.fixture(params=["opencl", "webgpu"])
def gpu(request):
    """The opencl backend, then the webgpu one (each skips as its own fixture does)."""
    return request.getfixturevalue(request.param)


def check(backend, model: bytes, inputs, fp16: bool = False, tol: float = 1e-5) -> list[np.ndarray]:
    """Every node runs on ``backend`` and every output matches the references; returns the outputs."""
    refused = unsupported(model, backend)
    assert not refused, f"{backend.name} refused {[(r[2], r[3].reason) for r in refused]}"
    got = litegpu_outputs(model, inputs, backend.name, precision_loss_allowed=fp16)
    compare(got, reference_outputs(model, inputs), FP16_TOL if fp16 else tol)
    return got


def reduction(b: ModelBuilder, op: str, x: int, x_shape, axes, keep: bool = False) -> int:
    """A reduction node of ``x`` over constant ``axes``; returns its output."""
    rank = len(x_shape)
    norm = {a % rank for a in axes}
    shape = tuple(1 if i in norm else d for i, d in enumerate(x_shape)) if keep else \
        tuple(d for i, d in enumerate(x_shape) if i not in norm)
    k = next(_names)
    y = b.tensor(f"{op}{k}", shape, F32)
    b.op(op, [x, b.const(f"axes{k}", np.array(axes, np.int32))], [y], keep_dims=keep)
    return y


@pytest.mark.parametrize("fp16", [False, True], ids=["F32", "F32_F16"])
def test_reductions_over_every_run_pattern(gpu, fp16):
    rng = np.random.default_rng(1)
    b = ModelBuilder()
    x = b.input("x", (2, 3, 5, 8), F32)
    rows = b.input("rows", (2, 203), F32)
    ragged = b.input("ragged", (3, 37), F32)
    tall = b.input("tall", (40, 12), F32)
    near_one = b.input("near_one", (3, 4, 16), F32)
    outs = [
        reduction(b, "MEAN", x, (2, 3, 5, 8), [1, 2], keep=True),   # [N, HW, C]: float8 channel groups
        reduction(b, "SUM", x, (2, 3, 5, 8), [0, 2]),               # reduced, kept, reduced, kept runs
        reduction(b, "REDUCE_MAX", x, (2, 3, 5, 8), [3]),           # rows of 8
        reduction(b, "REDUCE_MIN", x, (2, 3, 5, 8), [-1, -3, 3]),   # kept, reduced, kept, reduced
        reduction(b, "MEAN", x, (2, 3, 5, 8), [0, 1, 2, 3]),        # everything: one work-item
        reduction(b, "MEAN", rows, (2, 203), [1]),                  # four chains, a vector step, a tail
        reduction(b, "SUM", ragged, (3, 37), [-1]),                 # one chain and a tail of 5
        reduction(b, "REDUCE_MAX", tall, (40, 12), [0]),            # float4 lanes, chains down the rows
        reduction(b, "REDUCE_PROD", near_one, (3, 4, 16), [0, 2], keep=True),
    ]
    b.output(*outs)
    inputs = [rand(rng, 2, 3, 5, 8), rand(rng, 2, 203), rand(rng, 3, 37), rand(rng, 40, 12),
              rng.uniform(0.8, 1.2, (3, 4, 16)).astype(F32)]
    check(gpu, b.build(), inputs, fp16)


def test_integer_and_bool_reductions_are_exact(opencl):
    b = ModelBuilder()
    i8 = b.input("i8", (3, 7), np.int8)
    i64 = b.input("i64", (4, 3, 5), np.int64)
    i32 = b.input("i32", (6, 4), np.int32)
    flags = b.input("flags", (3, 4, 2), np.bool_)
    specs = [("REDUCE_PROD", i8, (3,), np.int8, [1]), ("REDUCE_MIN", i64, (3,), np.int64, [0, 2]),
             ("REDUCE_MAX", i64, (4, 5), np.int64, [1]), ("MEAN", i32, (4,), np.int32, [0]),
             ("SUM", i32, (6,), np.int32, [1]), ("REDUCE_ANY", flags, (4,), np.bool_, [0, 2]),
             ("REDUCE_ALL", flags, (3,), np.bool_, [1, -1])]
    outs = []
    for k, (op, src, shape, dtype, axes) in enumerate(specs):
        y = b.tensor(f"y{k}", shape, dtype)
        b.op(op, [src, b.const(f"a{k}", np.array(axes, np.int32))], [y], keep_dims=False)
        outs.append(y)
    b.output(*outs)
    rng = np.random.default_rng(2)
    inputs = [rng.integers(-9, 10, (3, 7)).astype(np.int8),           # products wrap around int8
              rng.integers(-2**62, 2**62, (4, 3, 5)).astype(np.int64),
              rng.integers(-20, 21, (6, 4)).astype(np.int32),         # the mean truncates toward zero
              rng.random((3, 4, 2)) < 0.5]
    got = check(opencl, b.build(), inputs)
    assert got[0].dtype == np.int8 and got[1].dtype == np.int64 and got[5].dtype == np.bool_


def test_spatial_mean_is_one_work_item_per_channel_group():
    """[N, H, W, C] over H and W, XNNPACK's channel sum (rdsum, LiteRT's bits): each
    work-item owns one output channel and walks all H*W pixels in order (no second pass,
    no per-pixel division); neighbouring work-items read neighbouring channels."""
    from litegpu.executor import infer_subgraph
    from litegpu.codegen import Precision
    from litegpu.codegen.kernels import load_all
    from litegpu.codegen.render import generate
    load_all()
    b = ModelBuilder()
    x = b.input("x", (2, 7, 7, 64), F32)
    b.output(reduction(b, "MEAN", x, (2, 7, 7, 64), [1, 2]))
    model = load_model(b.build())
    sg = model.subgraphs[0]
    contexts, specs, _ = infer_subgraph(model, sg, {sg.inputs[0]: TensorSpec((2, 7, 7, 64), F32)})
    (kernel,) = generate(contexts[0], Precision(), specs)
    assert tuple(kernel.global_size) == (2 * 64,)           # one work-item per output element
    assert "< 49;" in kernel.source                         # one loop over the 49 pixels
    assert "/" not in kernel.source.split("for (")[1].split("}")[0]   # no division inside it


def test_reductions_accumulate_in_float_under_half_storage(gpu):
    """Half accumulators stall at 2048 (2048 + 1 rounds back to 2048); float ones do not."""
    b = ModelBuilder()
    ones = b.input("ones", (1, 100, 100, 8), F32)
    row = b.input("row", (1, 4096), F32)
    mean = reduction(b, "MEAN", ones, (1, 100, 100, 8), [1, 2])
    total = reduction(b, "SUM", row, (1, 4096), [1])
    soft = b.tensor("soft", (1, 4096), F32)
    b.op("SOFTMAX", [row], [soft], beta=1.0)
    norm = b.tensor("norm", (1, 4096), F32)
    b.op("L2_NORMALIZATION", [row], [norm])
    b.output(mean, total, soft, norm)
    model = b.build()
    assert not unsupported(model, gpu)
    got = litegpu_outputs(model, [np.ones((1, 100, 100, 8), F32), np.ones((1, 4096), F32)], gpu.name,
                          precision_loss_allowed=True)
    np.testing.assert_allclose(got[0], 1.0, rtol=1e-3)
    np.testing.assert_allclose(got[1], 4096.0, rtol=1e-3)
    np.testing.assert_allclose(got[2], 1 / 4096, rtol=1e-3)
    np.testing.assert_allclose(got[3], 1 / 64, rtol=1e-3)


@pytest.mark.parametrize("fp16", [False, True], ids=["F32", "F32_F16"])
def test_pools_over_clipped_windows_and_channel_widths(gpu, fp16):
    rng = np.random.default_rng(3)
    b = ModelBuilder()
    inputs, outs = [], []
    pools = [
        # (op, input shape, output shape, options): scalar channels, float4 and float8
        # groups, a global window with four groups in flight, windows inside the image.
        ("AVERAGE_POOL_2D", (2, 9, 8, 3), (2, 5, 4, 3), dict(padding="SAME", filter_height=3, filter_width=3,
                                                            stride_h=2, stride_w=2)),
        ("MAX_POOL_2D", (1, 7, 6, 12), (1, 7, 6, 12), dict(padding="SAME", filter_height=3, filter_width=2,
                                                           stride_h=1, stride_w=1,
                                                           fused_activation_function="RELU_N1_TO_1")),
        ("L2_POOL_2D", (1, 6, 6, 16), (1, 3, 3, 16), dict(padding="SAME", filter_height=4, filter_width=4,
                                                          stride_h=2, stride_w=2)),
        ("AVERAGE_POOL_2D", (1, 5, 5, 64), (1, 1, 1, 64), dict(padding="SAME", filter_height=5, filter_width=5,
                                                               stride_h=5, stride_w=5)),
        ("MAX_POOL_2D", (1, 8, 8, 8), (1, 4, 4, 8), dict(padding="VALID", filter_height=2, filter_width=2,
                                                         stride_h=2, stride_w=2)),
        ("AVERAGE_POOL_2D", (1, 9, 9, 32), (1, 2, 2, 32), dict(padding="SAME", filter_height=6, filter_width=6,
                                                               stride_h=5, stride_w=5)),
    ]
    for k, (op, in_shape, out_shape, options) in enumerate(pools):
        x = b.input(f"x{k}", in_shape, F32)
        y = b.tensor(f"y{k}", out_shape, F32)
        b.op(op, [x], [y], **options)
        inputs.append(rand(rng, *in_shape))
        outs.append(y)
    b.output(*outs)
    check(gpu, b.build(), inputs, fp16)


def test_pools_count_only_pixels_inside_the_image(gpu):
    """SAME windows at the border: a mean of ones stays 1, an L2 pool of twos stays 2, and
    padding never wins a max of negative values (as in LiteRT)."""
    b = ModelBuilder()
    x = b.input("x", (1, 5, 6, 8), F32)
    outs = []
    for k, op in enumerate(("AVERAGE_POOL_2D", "L2_POOL_2D", "MAX_POOL_2D")):
        y = b.tensor(f"y{k}", (1, 3, 3, 8), F32)
        b.op(op, [x], [y], padding="SAME", filter_height=3, filter_width=4, stride_h=2, stride_w=2)
        outs.append(y)
    b.output(*outs)
    model = b.build()
    assert not unsupported(model, gpu)
    avg, _, _ = litegpu_outputs(model, [np.ones((1, 5, 6, 8), F32)], gpu.name)
    _, l2, _ = litegpu_outputs(model, [np.full((1, 5, 6, 8), 2.0, F32)], gpu.name)
    _, _, mx = litegpu_outputs(model, [np.full((1, 5, 6, 8), -3.0, F32)], gpu.name)
    np.testing.assert_allclose(avg, 1.0, rtol=1e-6)
    np.testing.assert_allclose(l2, 2.0, rtol=1e-6)
    np.testing.assert_array_equal(mx, -3.0)


@pytest.mark.parametrize("fp16", [False, True], ids=["F32", "F32_F16"])
def test_softmax_family_rows_of_any_length(gpu, fp16):
    rng = np.random.default_rng(4)
    b = ModelBuilder()
    a = b.input("a", (3, 37), F32)
    c = b.input("c", (2, 2, 16), F32)
    d = b.input("d", (4, 6), F32)
    e = b.input("e", (2, 203), F32)
    outs = []
    layers = [("SOFTMAX", a, (3, 37), dict(beta=0.7)),          # float8 steps and a tail of 5
              ("SOFTMAX", c, (2, 2, 16), dict(beta=-1.5)),      # negative beta: exps recomputed
              ("SOFTMAX", d, (4, 6), dict(beta=1.0)),           # float4 step, per-lane stores
              ("LOG_SOFTMAX", e, (2, 203), {}),
              ("L2_NORMALIZATION", a, (3, 37), {}),
              ("L2_NORMALIZATION", d, (4, 6), {})]
    for k, (op, src, shape, options) in enumerate(layers):
        y = b.tensor(f"y{k}", shape, F32)
        b.op(op, [src], [y], **options)
        outs.append(y)
    b.output(*outs)
    check(gpu, b.build(), [rand(rng, 3, 37, scale=3), rand(rng, 2, 2, 16, scale=3), rand(rng, 4, 6, scale=3),
                              rand(rng, 2, 203, scale=3)], fp16)


def test_followers_fold_into_reductions_softmax_and_pools(gpu):
    """MEAN, SOFTMAX (whose exps are parked in the output first) and AVERAGE_POOL_2D with
    elementwise followers: one step each, and the followers see the final values."""
    rng = np.random.default_rng(5)
    b = ModelBuilder()
    x = b.input("x", (1, 6, 6, 16), F32)
    logits = b.input("logits", (3, 24), F32)
    outs = []
    m = reduction(b, "MEAN", x, (1, 6, 6, 16), [1, 2])
    m2 = b.tensor("m2", (1, 16), F32)
    b.op("ADD", [m, b.const("bias", rand(rng, 16))], [m2], fused_activation_function="RELU")
    outs.append(m2)
    s = b.tensor("s", (3, 24), F32)
    b.op("SOFTMAX", [logits], [s], beta=1.0)
    s2 = b.tensor("s2", (3, 24), F32)
    b.op("MUL", [s, b.const("scale", rand(rng, 24))], [s2])
    outs.append(s2)
    p = b.tensor("p", (1, 3, 3, 16), F32)
    b.op("AVERAGE_POOL_2D", [x], [p], padding="SAME", filter_height=3, filter_width=3, stride_h=2, stride_w=2)
    p2 = b.tensor("p2", (1, 3, 3, 16), F32)
    b.op("SUB", [p, b.const("shift", np.float32(0.25))], [p2])
    outs.append(p2)
    b.output(*outs)
    model = b.build()
    sg = load_model(model).subgraphs[0]
    steps = gpu.schedule(node_contexts(load_model(model), sg), list(sg.outputs))
    assert sorted(len(step) for step in steps) == [2, 2, 2]
    check(gpu, model, [rand(rng, 1, 6, 6, 16), rand(rng, 3, 24, scale=3)])


@pytest.mark.parametrize("fp16", [False, True], ids=["F32", "F32_F16"])
def test_resize_flags_and_channel_widths(gpu, fp16):
    rng = np.random.default_rng(6)
    b = ModelBuilder()
    inputs, outs = [], []
    layers = [("RESIZE_BILINEAR", (1, 5, 4, 16), (9, 7), dict(half_pixel_centers=True)),
              ("RESIZE_BILINEAR", (2, 6, 6, 12), (3, 4), dict(align_corners=True)),
              ("RESIZE_BILINEAR", (1, 3, 3, 5), (7, 5), {}),
              ("RESIZE_NEAREST_NEIGHBOR", (1, 5, 4, 16), (11, 3), dict(align_corners=True, half_pixel_centers=True)),
              ("RESIZE_NEAREST_NEIGHBOR", (2, 4, 7, 3), (8, 5), dict(half_pixel_centers=True))]
    for k, (op, in_shape, size, flags) in enumerate(layers):
        x = b.input(f"x{k}", in_shape, F32)
        y = b.tensor(f"y{k}", (in_shape[0], *size, in_shape[3]), F32)
        b.op(op, [x, b.const(f"size{k}", np.array(size, np.int32))], [y], **flags)
        inputs.append(rand(rng, *in_shape))
        outs.append(y)
    b.output(*outs)
    check(gpu, b.build(), inputs, fp16)


def test_lrn_windows_clipped_at_the_channel_ends(gpu):
    rng = np.random.default_rng(7)
    b = ModelBuilder()
    x = b.input("x", (1, 3, 4, 5), F32)
    outs = []
    for k, (radius, bias, alpha, beta) in enumerate([(7, 1.0, 0.5, 0.75), (1, 2.0, 0.1, 1.0)]):
        y = b.tensor(f"y{k}", (1, 3, 4, 5), F32)
        b.op("LOCAL_RESPONSE_NORMALIZATION", [x], [y], radius=radius, bias=bias, alpha=alpha, beta=beta)
        outs.append(y)
    b.output(*outs)
    check(gpu, b.build(), [rand(rng, 1, 3, 4, 5, scale=2)])


def test_arg_max_min_pick_the_first_extreme(opencl):
    b = ModelBuilder()
    f = b.input("f", (3, 4, 5), F32)
    u = b.input("u", (2, 6, 3), np.uint8)
    specs = [("ARG_MAX", f, [1], (3, 5), np.int64), ("ARG_MIN", f, [-1], (3, 4), np.int32),
             ("ARG_MAX", u, [1], (2, 3), np.int32), ("ARG_MIN", u, [0], (6, 3), np.int64)]
    outs = []
    for k, (op, src, axis, shape, dtype) in enumerate(specs):
        y = b.tensor(f"y{k}", shape, dtype)
        b.op(op, [src, b.const(f"axis{k}", np.array(axis, np.int32))], [y], output_type=dtype)
        outs.append(y)
    b.output(*outs)
    rng = np.random.default_rng(8)
    ties = rng.integers(0, 3, (3, 4, 5)).astype(F32)     # few values: ties everywhere
    got = check(opencl, b.build(), [ties, rng.integers(0, 3, (2, 6, 3)).astype(np.uint8)])
    assert got[0].dtype == np.int64 and got[1].dtype == np.int32
    np.testing.assert_array_equal(got[0], np.argmax(ties, axis=1))
