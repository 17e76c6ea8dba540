"""Neural-network op definitions: padding arithmetic, references against direct loop
implementations written from the op definitions, attribute validation, shape inference
and the LiteRT behaviours the conformance cases cannot cover (stale options, state).

The conformance cases themselves are compared with LiteRT in tests/test_reference.py.
"""
from __future__ import annotations

import struct
import time

import numpy as np
import pytest

from litegpu.errors import ExecutionError, ModelFormatError, UnsupportedError
from litegpu.model import load_model
from litegpu.ops import get_op
from litegpu.ops.nn import conv_output_size, same_padding
from litegpu.testing.cases.nn import CASES, Const, Var, lstm_args, one_op, rand
from litegpu.testing.conformance import max_rel_error, node_contexts, reference_outputs

RNG = np.random.default_rng(1234)


def ref(op: str, inputs: list, attrs: dict) -> list[np.ndarray]:
    return get_op(op).reference(inputs, attrs)


# -- padding arithmetic -----------------------------------------------------------------

@pytest.mark.parametrize("in_size, k, stride, dilation, expected", [
    (224, 3, 2, 1, (112, 0)),   # total 1: the odd pixel goes after
    (225, 3, 2, 1, (113, 1)),
    (7, 4, 3, 1, (3, 1)),       # total (3-1)*3 + 4 - 7 = 3
    (10, 3, 1, 2, (10, 2)),     # dilated filter spans 5
    (5, 1, 2, 1, (3, 0)),
    (4, 7, 1, 1, (4, 3)),
])
def test_same_padding_known_values(in_size, k, stride, dilation, expected):
    assert same_padding(in_size, k, stride, dilation) == expected


@pytest.mark.parametrize("in_size", range(1, 12))
@pytest.mark.parametrize("k, stride, dilation", [(1, 1, 1), (3, 1, 1), (3, 2, 1), (4, 3, 1), (3, 1, 2), (5, 2, 3)])
def test_same_padding_is_the_smallest_padding_that_fits(in_size, k, stride, dilation):
    out, before = same_padding(in_size, k, stride, dilation)
    span = (k - 1) * dilation + 1
    assert out == -(-in_size // stride)
    total = max((out - 1) * stride + span - in_size, 0)
    assert before == total // 2
    # the last window ends inside the padded input, and one pixel less padding would not do
    assert (out - 1) * stride + span <= in_size + total
    assert total == 0 or (out - 1) * stride + span > in_size + total - 1


@pytest.mark.parametrize("in_size, k, stride, dilation, expected", [
    (9, 3, 2, 1, 4), (10, 3, 2, 1, 4), (11, 3, 1, 2, 7), (7, 7, 1, 1, 1), (4, 5, 1, 1, 0), (5, 3, 1, 2, 1),
])
def test_valid_output_size(in_size, k, stride, dilation, expected):
    assert conv_output_size(in_size, k, stride, dilation, "VALID") == (expected, 0)


def test_unknown_padding_name_is_a_format_error():
    with pytest.raises(ModelFormatError, match="padding"):
        conv_output_size(4, 3, 1, 1, "FULL")


# -- direct-loop references, written from the definitions ---------------------------------

def _pad_amounts(size, k, stride, dilation, padding):
    """(output size, padding before), written out again so the loops check the helpers too."""
    span = (k - 1) * dilation + 1
    if padding == "VALID":
        return (size - span) // stride + 1, 0
    out = -(-size // stride)
    return out, max((out - 1) * stride + span - size, 0) // 2


def naive_conv(x, w, b, stride, dilation, padding, groups=1):
    n, h, wd, cin = x.shape
    cout, kh, kw, cper = w.shape
    oh, top = _pad_amounts(h, kh, stride[0], dilation[0], padding)
    ow, left = _pad_amounts(wd, kw, stride[1], dilation[1], padding)
    per_group = cout // groups
    y = np.zeros((n, oh, ow, cout), np.float64)
    for bi in range(n):
        for oy in range(oh):
            for ox in range(ow):
                for o in range(cout):
                    g = o // per_group
                    acc = 0.0 if b is None else float(b[o])
                    for i in range(kh):
                        for j in range(kw):
                            iy = oy * stride[0] - top + i * dilation[0]
                            ix = ox * stride[1] - left + j * dilation[1]
                            if 0 <= iy < h and 0 <= ix < wd:
                                acc += float(np.dot(x[bi, iy, ix, g * cper:(g + 1) * cper], w[o, i, j]))
                    y[bi, oy, ox, o] = acc
    return y


@pytest.mark.parametrize("x_shape, w_shape, stride, dilation, padding, bias", [
    ((1, 6, 7, 3), (4, 3, 3, 3), (1, 1), (1, 1), "SAME", True),
    ((2, 7, 6, 2), (3, 3, 2, 2), (2, 1), (1, 1), "SAME", False),
    ((1, 9, 9, 2), (2, 3, 3, 2), (2, 2), (2, 2), "VALID", True),
    ((1, 8, 8, 4), (6, 3, 3, 2), (1, 2), (1, 1), "SAME", True),   # 2 groups
    ((1, 5, 5, 6), (3, 2, 2, 2), (1, 1), (2, 1), "SAME", False),  # 3 groups of 1 output
])
def test_conv_matches_direct_loops(x_shape, w_shape, stride, dilation, padding, bias):
    x, w = rand(RNG, *x_shape), rand(RNG, *w_shape)
    b = rand(RNG, w_shape[0]) if bias else None
    got = ref("CONV_2D", [x, w, b], {"padding": padding, "stride": stride, "dilation": dilation,
                                     "activation": "NONE"})[0]
    want = naive_conv(x, w, b, stride, dilation, padding, groups=x_shape[3] // w_shape[3])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("activation, lo, hi", [("RELU", 0, np.inf), ("RELU6", 0, 6), ("RELU_N1_TO_1", -1, 1)])
def test_conv_fused_activation_clamps(activation, lo, hi):
    x, w = rand(RNG, 1, 5, 5, 3, scale=4), rand(RNG, 4, 3, 3, 3)
    attrs = {"padding": "SAME", "stride": (1, 1), "dilation": (1, 1)}
    plain = ref("CONV_2D", [x, w, None], {**attrs, "activation": "NONE"})[0]
    fused = ref("CONV_2D", [x, w, None], {**attrs, "activation": activation})[0]
    np.testing.assert_array_equal(fused, np.clip(plain, lo, hi))
    assert plain.min() < lo or plain.max() > hi  # the data really exercises the clamp


def naive_depthwise(x, w, b, stride, dilation, padding):
    n, h, wd, cin = x.shape
    _, kh, kw, cout = w.shape
    m = cout // cin
    oh, top = _pad_amounts(h, kh, stride[0], dilation[0], padding)
    ow, left = _pad_amounts(wd, kw, stride[1], dilation[1], padding)
    y = np.zeros((n, oh, ow, cout))
    for bi, oy, ox, o in np.ndindex(n, oh, ow, cout):
        acc = 0.0 if b is None else float(b[o])
        for i in range(kh):
            for j in range(kw):
                iy, ix = oy * stride[0] - top + i * dilation[0], ox * stride[1] - left + j * dilation[1]
                if 0 <= iy < h and 0 <= ix < wd:
                    acc += float(x[bi, iy, ix, o // m]) * float(w[0, i, j, o])
        y[bi, oy, ox, o] = acc
    return y


@pytest.mark.parametrize("x_shape, w_shape, stride, dilation, padding", [
    ((1, 6, 6, 3), (1, 3, 3, 3), (1, 1), (1, 1), "SAME"),
    ((2, 7, 5, 2), (1, 3, 3, 6), (2, 2), (1, 1), "SAME"),    # multiplier 3
    ((1, 9, 8, 2), (1, 3, 2, 4), (1, 1), (2, 2), "VALID"),   # multiplier 2, dilated
])
def test_depthwise_matches_direct_loops(x_shape, w_shape, stride, dilation, padding):
    x, w, b = rand(RNG, *x_shape), rand(RNG, *w_shape), rand(RNG, w_shape[3])
    got = ref("DEPTHWISE_CONV_2D", [x, w, b], {"padding": padding, "stride": stride, "dilation": dilation,
                                              "activation": "NONE",
                                              "depth_multiplier": w_shape[3] // x_shape[3]})[0]
    np.testing.assert_allclose(got, naive_depthwise(x, w, b, stride, dilation, padding), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("x_shape, k, stride, padding", [
    ((1, 8, 8, 3), (3, 3), (2, 2), "SAME"),
    ((2, 7, 9, 2), (3, 3), (2, 2), "SAME"),
    ((1, 9, 9, 2), (3, 3), (2, 2), "VALID"),
    ((1, 6, 5, 2), (4, 2), (2, 1), "SAME"),
    ((1, 5, 5, 1), (3, 3), (1, 1), "SAME"),
])
def test_transpose_conv_is_the_adjoint_of_conv(x_shape, k, stride, padding):
    """<conv(x, W), y> == <x, transpose_conv(y, W^T)>: the definition of a transpose conv."""
    cin, cout = x_shape[3], 4
    w = rand(RNG, cout, *k, cin)
    x = rand(RNG, *x_shape)
    conv_attrs = {"padding": padding, "stride": stride, "dilation": (1, 1), "activation": "NONE"}
    cx = ref("CONV_2D", [x, w, None], conv_attrs)[0]
    y = rand(RNG, *cx.shape)
    ty = ref("TRANSPOSE_CONV", [np.array(x_shape, np.int32), w.transpose(3, 1, 2, 0), y, None],
             {"padding": padding, "stride": stride, "activation": "NONE"})[0]
    assert ty.shape == x.shape
    lhs, rhs = float(np.vdot(cx.astype(np.float64), y)), float(np.vdot(x.astype(np.float64), ty))
    assert lhs == pytest.approx(rhs, rel=1e-4, abs=1e-3)


@pytest.mark.parametrize("padding, in_hw, k, stride, out_hw", [
    ("SAME", (4, 5), (4, 4), (2, 2), (8, 10)),
    ("SAME", (3, 3), (3, 3), (1, 1), (3, 3)),
    ("VALID", (4, 5), (3, 2), (2, 3), (9, 14)),
])
def test_mediapipe_transpose_conv_bias_is_transpose_conv_plus_bias(padding, in_hw, k, stride, out_hw):
    x, w, b = rand(RNG, 1, *in_hw, 2), rand(RNG, 3, *k, 2), rand(RNG, 3)
    attrs = {"padding": padding, "stride": stride, "activation": "NONE"}
    got = ref("Convolution2DTransposeBias", [x, w, b], attrs)[0]
    assert got.shape == (1, *out_hw, 3)
    plain = ref("TRANSPOSE_CONV", [np.array([1, *out_hw, 3], np.int32), w, x, None], attrs)[0]
    np.testing.assert_allclose(got, plain + b, rtol=1e-5, atol=1e-5)


def naive_pool(x, f, stride, padding, kind):
    n, h, w, c = x.shape
    oh, top = _pad_amounts(h, f[0], stride[0], 1, padding)
    ow, left = _pad_amounts(w, f[1], stride[1], 1, padding)
    y = np.zeros((n, oh, ow, c))
    for bi, oy, ox, ch in np.ndindex(n, oh, ow, c):
        vals = [x[bi, iy, ix, ch] for iy in range(oy * stride[0] - top, oy * stride[0] - top + f[0])
                for ix in range(ox * stride[1] - left, ox * stride[1] - left + f[1]) if 0 <= iy < h and 0 <= ix < w]
        vals = np.array(vals, np.float64)
        y[bi, oy, ox, ch] = {"AVERAGE_POOL_2D": vals.mean(), "MAX_POOL_2D": vals.max(),
                             "L2_POOL_2D": np.sqrt((vals ** 2).mean())}[kind]
    return y


@pytest.mark.parametrize("op", ["AVERAGE_POOL_2D", "MAX_POOL_2D", "L2_POOL_2D"])
@pytest.mark.parametrize("x_shape, f, stride, padding", [
    ((1, 7, 7, 2), (3, 3), (2, 2), "SAME"),
    ((2, 6, 5, 3), (2, 3), (1, 2), "SAME"),
    ((1, 8, 9, 2), (2, 2), (2, 2), "VALID"),
    ((1, 5, 5, 1), (4, 4), (3, 3), "SAME"),
])
def test_pools_match_direct_loops(op, x_shape, f, stride, padding):
    x = rand(RNG, *x_shape) - 3  # all-negative-ish data: a padded zero would win a max
    got = ref(op, [x], {"padding": padding, "stride": stride, "filter": f, "activation": "NONE"})[0]
    np.testing.assert_allclose(got, naive_pool(x, f, stride, padding, op), rtol=1e-5, atol=1e-5)


def test_fully_connected_and_batch_matmul_match_einsum():
    x, w, b = rand(RNG, 2, 3, 8), rand(RNG, 5, 8), rand(RNG, 5)
    y = ref("FULLY_CONNECTED", [x, w, b], {"activation": "NONE", "keep_num_dims": True})[0]
    np.testing.assert_allclose(y, np.einsum("abk,ok->abo", x, w) + b, rtol=1e-5, atol=1e-5)
    flat = ref("FULLY_CONNECTED", [x, w, None], {"activation": "RELU", "keep_num_dims": False})[0]
    np.testing.assert_allclose(flat, np.maximum(x.reshape(6, 8) @ w.T, 0), rtol=1e-5, atol=1e-5)
    a, c = rand(RNG, 2, 1, 4, 3), rand(RNG, 1, 3, 5, 4)
    got = ref("BATCH_MATMUL", [a, c], {"adj_x": True, "adj_y": True})[0]
    want = np.empty((2, 3, 3, 5), np.float32)
    for i in range(2):
        for j in range(3):
            want[i, j] = a[i, 0].T @ c[0, j].T  # batch axes broadcast: a's 1 against c's 3, c's 1 against a's 2
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# -- resize index rules -----------------------------------------------------------------

def _nearest_rows(in_size, out_size, align, half):
    x = np.arange(in_size, dtype=np.float32).reshape(1, in_size, 1, 1)
    y = ref("RESIZE_NEAREST_NEIGHBOR", [x, np.array([out_size, 1], np.int32)],
            {"align_corners": align, "half_pixel_centers": half})[0]
    return y.reshape(-1).astype(int).tolist()


@pytest.mark.parametrize("in_size, out_size, align, half, expected", [
    (4, 8, False, False, [0, 0, 1, 1, 2, 2, 3, 3]),      # floor(i * 0.5)
    (3, 5, True, False, [0, 1, 1, 2, 2]),                # round(i * 0.5), halves away from zero
    (5, 2, False, True, [1, 3]),                         # floor((i + .5) * 2.5)
    (2, 5, False, False, [0, 0, 0, 1, 1]),               # floor(i * 0.4)
    (3, 4, True, True, [0, 1, 2, 2]),                    # round((i + .5) * 2/3), clamped to 2
])
def test_nearest_neighbor_index_rules(in_size, out_size, align, half, expected):
    assert _nearest_rows(in_size, out_size, align, half) == expected


def test_bilinear_align_corners_keeps_corners_and_linear_ramps():
    x = np.add.outer(np.arange(4, dtype=np.float32), 10 * np.arange(5, dtype=np.float32)).reshape(1, 4, 5, 1)
    y = ref("RESIZE_BILINEAR", [x, np.array([7, 9], np.int32)], {"align_corners": True,
                                                                 "half_pixel_centers": False})[0][0, :, :, 0]
    want = np.add.outer(np.linspace(0, 3, 7), 10 * np.linspace(0, 4, 9))
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)
    half = ref("RESIZE_BILINEAR", [x, np.array([8, 10], np.int32)], {"align_corners": False,
                                                                     "half_pixel_centers": True})[0][0, :, :, 0]
    # half-pixel centers: output row r samples input row (r + .5) / 2 - .5, clamped to the edges
    rows = np.clip((np.arange(8) + 0.5) / 2 - 0.5, 0, 3)
    cols = np.clip((np.arange(10) + 0.5) / 2 - 0.5, 0, 4)
    np.testing.assert_allclose(half, np.add.outer(rows, 10 * cols), rtol=1e-5, atol=1e-5)


# -- attributes: validation and normalization -------------------------------------------

def node_attrs(model_bytes: bytes):
    model = load_model(model_bytes)
    sg = model.subgraphs[0]
    node = sg.nodes[0]
    return get_op(node.op).node_attrs(node, sg.tensors)


def test_conv_attrs_are_normalized():
    m, _ = one_op("CONV_2D", [rand(RNG, 1, 9, 9, 4), Const(rand(RNG, 2, 3, 3, 4)), Const(rand(RNG, 2))],
                  [(1, 3, 5, 2)], padding="VALID", stride_h=3, stride_w=2, dilation_h_factor=1,
                  dilation_w_factor=1, fused_activation_function="RELU6")
    assert node_attrs(m) == {"padding": "VALID", "stride": (3, 2), "dilation": (1, 1), "activation": "RELU6",
                             "filter_constant": True}


def test_depthwise_multiplier_comes_from_shapes_not_the_option():
    m, _ = one_op("DEPTHWISE_CONV_2D", [rand(RNG, 1, 5, 5, 3), Const(rand(RNG, 1, 3, 3, 6)), Const(rand(RNG, 6))],
                  [(1, 5, 5, 6)], padding="SAME", stride_h=1, stride_w=1, depth_multiplier=1)
    attrs = node_attrs(m)
    assert attrs["depth_multiplier"] == 2 and attrs["dilation"] == (1, 1)


def test_depthwise_stale_multiplier_matches_litert_builtin_kernel():
    """LiteRT's builtin kernel ignores a stale depth_multiplier (its XNNPACK path refuses the model)."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType
    m, inputs = one_op("DEPTHWISE_CONV_2D", [rand(RNG, 1, 5, 5, 3), Const(rand(RNG, 1, 3, 3, 6)),
                                             Const(rand(RNG, 6))],
                       [(1, 5, 5, 6)], version=2, padding="SAME", stride_h=1, stride_w=1, depth_multiplier=1)
    interp = Interpreter(model_content=m,
                         experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], inputs[0])
    interp.invoke()
    want = interp.get_tensor(interp.get_output_details()[0]["index"])
    assert max_rel_error(reference_outputs(m, inputs)[0], want) < 1e-5


def test_tanh_is_ignored_by_clamping_ops_and_refused_by_fully_connected():
    m, _ = one_op("CONV_2D", [rand(RNG, 1, 4, 4, 2), Const(rand(RNG, 2, 1, 1, 2)), Const(rand(RNG, 2))],
                  [(1, 4, 4, 2)], padding="SAME", stride_h=1, stride_w=1, fused_activation_function="TANH")
    assert node_attrs(m)["activation"] == "NONE"
    m, _ = one_op("FULLY_CONNECTED", [rand(RNG, 2, 4), Const(rand(RNG, 3, 4)), None], [(2, 3)],
                  fused_activation_function="TANH")
    with pytest.raises(UnsupportedError, match="TANH"):
        node_attrs(m)


def test_conv_without_bias_is_conv_with_zero_bias():
    x, w = rand(RNG, 1, 5, 5, 2), rand(RNG, 3, 3, 3, 2)
    attrs = {"padding": "SAME", "stride": (1, 1), "dilation": (1, 1), "activation": "NONE"}
    np.testing.assert_array_equal(ref("CONV_2D", [x, w, None], attrs)[0],
                                  ref("CONV_2D", [x, w, np.zeros(3, np.float32)], attrs)[0])
    assert len(ref("CONV_2D", [x, w], attrs)) == 1  # absent trailing input too


@pytest.mark.parametrize("make, error, match", [
    (lambda: one_op("CONV_2D", [rand(RNG, 1, 5, 5, 3), Const(rand(RNG, 2, 3, 3, 2)), None], [(1, 5, 5, 2)],
                    padding="SAME", stride_h=1, stride_w=1), ModelFormatError, "not a multiple"),
    (lambda: one_op("CONV_2D", [rand(RNG, 1, 5, 5, 2), Const(rand(RNG, 2, 3, 3, 2)), Const(rand(RNG, 3))],
                    [(1, 5, 5, 2)], padding="SAME", stride_h=1, stride_w=1), ModelFormatError, "bias"),
    (lambda: one_op("CONV_2D", [rand(RNG, 1, 5, 5, 2), Const(rand(RNG, 2, 3, 3, 2)), None], [(1, 5, 5, 2)],
                    padding="SAME", stride_h=0, stride_w=1), ModelFormatError, "stride"),
    (lambda: one_op("CONV_2D", [rand(RNG, 1, 5, 5, 2), Const(rand(RNG, 2, 3, 3, 2)), None], [(1, 5, 5, 2)],
                    padding="SAME", stride_h=1, stride_w=1, dilation_w_factor=0), ModelFormatError, "dilation"),
    (lambda: one_op("CONV_2D", [rand(RNG, 1, 5, 5, 2), Const(rand(RNG, 2, 3, 3, 2)), None], [(1, 5, 5, 2)],
                    padding=7, stride_h=1, stride_w=1), ModelFormatError, "padding"),
    (lambda: one_op("CONV_2D", [rand(RNG, 5, 5, 2), Const(rand(RNG, 2, 3, 3, 2))], [(5, 5, 2)],
                    padding="SAME", stride_h=1, stride_w=1), ModelFormatError, "rank 4"),
    (lambda: one_op("DEPTHWISE_CONV_2D", [rand(RNG, 1, 5, 5, 2), Const(rand(RNG, 2, 3, 3, 2)), None],
                    [(1, 5, 5, 2)], padding="SAME", stride_h=1, stride_w=1), ModelFormatError, r"\[1, KH"),
    (lambda: one_op("DEPTHWISE_CONV_2D", [rand(RNG, 1, 5, 5, 4), Const(rand(RNG, 1, 3, 3, 6)), None],
                    [(1, 5, 5, 6)], padding="SAME", stride_h=1, stride_w=1), ModelFormatError, "multiple"),
    (lambda: one_op("TRANSPOSE_CONV", [Const(np.array([1, 8, 8, 3], np.int32)), Const(rand(RNG, 3, 3, 3, 2)),
                                       rand(RNG, 1, 4, 4, 5)], [(1, 8, 8, 3)], padding="SAME", stride_h=2,
                    stride_w=2), ModelFormatError, "channels"),
    (lambda: one_op("TRANSPOSE_CONV", [Const(np.array([1, 8, 8], np.int32)), Const(rand(RNG, 3, 3, 3, 2)),
                                       rand(RNG, 1, 4, 4, 2)], [(1, 8, 8, 3)], padding="SAME", stride_h=2,
                    stride_w=2), ModelFormatError, "output_shape"),
    (lambda: one_op("MAX_POOL_2D", [rand(RNG, 1, 4, 4, 2)], [(1, 2, 2, 2)], padding="VALID", filter_height=0,
                    filter_width=2, stride_h=2, stride_w=2), ModelFormatError, "filter size"),
    (lambda: one_op("FULLY_CONNECTED", [rand(RNG, 2, 7), Const(rand(RNG, 3, 4)), None], [(2, 3)]),
     ModelFormatError, "rows of 4"),
    (lambda: one_op("FULLY_CONNECTED", [rand(RNG, 2, 8), Const(rand(RNG, 3, 4)), None], [(2, 3)],
                    keep_num_dims=True), ModelFormatError, "keep_num_dims"),
    (lambda: one_op("BATCH_MATMUL", [rand(RNG, 2, 3, 4), rand(RNG, 2, 5, 6)], [(2, 3, 6)]),
     ModelFormatError, "inner dimensions"),
    (lambda: one_op("BATCH_MATMUL", [rand(RNG, 3, 3, 4), rand(RNG, 2, 4, 6)], [(2, 3, 6)]),
     ModelFormatError, "broadcast"),
    (lambda: one_op("RESIZE_BILINEAR", [rand(RNG, 1, 4, 4, 2), Const(np.array([4, 4, 4], np.int32))],
                    [(1, 4, 4, 2)]), ModelFormatError, "int32"),
    (lambda: one_op("EMBEDDING_LOOKUP", [np.array([1], np.int32), Const(rand(RNG, 4))], [(1,)]),
     ModelFormatError, "rank >= 2"),
    (lambda: one_op("L2_NORMALIZATION", [rand(RNG, 2, 4)], [(2, 4)], fused_activation_function="RELU"),
     UnsupportedError, "RELU"),
    (lambda: one_op("FULLY_CONNECTED", [rand(RNG, 2, 4), Const(np.ones((3, 4), np.int8)), None], [(2, 3)]),
     UnsupportedError, "weights has type INT8"),
    (lambda: one_op("CONV_2D", [rand(RNG, 1, 4, 4, 2), Const(np.ones((2, 1, 1, 2), np.int8)), None],
                    [(1, 4, 4, 2)], padding="SAME", stride_h=1, stride_w=1), UnsupportedError, "filter has type"),
])
def test_invalid_nodes_raise_errors_naming_the_problem(make, error, match):
    m, _ = make()
    with pytest.raises(error, match=match) as info:
        node_attrs(m)
    assert "node 0" in str(info.value)


@pytest.mark.parametrize("custom, match", [
    (b"\x01\x00\x00\x00\x02\x00\x00\x00", "12 bytes"),
    (struct.pack("<iii", 0, 2, 2), "padding 0"),
    (struct.pack("<iii", 3, 2, 2), "padding 3"),
    (struct.pack("<iii", 1, 0, 2), "stride"),
])
def test_mediapipe_custom_options_are_validated(custom, match):
    m, _ = one_op("Convolution2DTransposeBias", [rand(RNG, 1, 4, 4, 2), Const(rand(RNG, 3, 3, 3, 2)),
                                                 Const(rand(RNG, 3))], [(1, 8, 8, 3)], custom_options=custom)
    with pytest.raises(ModelFormatError, match=match):
        node_attrs(m)


def test_mediapipe_custom_options_field_order():
    m, _ = one_op("Convolution2DTransposeBias", [rand(RNG, 1, 4, 4, 2), Const(rand(RNG, 3, 3, 3, 2)),
                                                 Const(rand(RNG, 3))], [(1, 9, 5, 3)],
                  custom_options=struct.pack("<iii", 2, 1, 2) + b"\x00" * 4)  # VALID, stride_w 1, stride_h 2
    attrs = {k: v for k, v in node_attrs(m).items() if k != "declared_out_hw"}   # the resize check's
    assert attrs == {"padding": "VALID", "stride": (2, 1), "activation": "NONE"}


def test_embedding_lookup_out_of_range_id_is_an_execution_error():
    with pytest.raises(ExecutionError, match="out of range"):
        ref("EMBEDDING_LOOKUP", [np.array([0, 4], np.int32), rand(RNG, 4, 3)], {})


# -- shape inference --------------------------------------------------------------------

@pytest.mark.parametrize("case", [c for c in CASES if c.op not in ("LSTM", "UNIDIRECTIONAL_SEQUENCE_LSTM")],
                         ids=lambda c: c.id)
def test_inferred_shapes_match_the_declared_ones(case):
    """Every case declares its output shapes by hand; inference must agree (or be dynamic)."""
    model_bytes, _ = case.build()
    model = load_model(model_bytes)
    sg = model.subgraphs[0]
    contexts = node_contexts(model, sg)
    assert len(contexts) == 1
    ctx = contexts[0]
    if ctx.dynamic:
        # only an output shape read from a model input may be unknown before running
        assert case.variant in ("output-shape-from-input", "size-from-input")
        return
    assert [tuple(s.shape) for s in ctx.outputs] == [sg.tensors[o].shape for o in ctx.node.outputs]


def test_transpose_conv_output_shape_is_dynamic_without_a_value():
    from litegpu.ops import DynamicShape, TensorSpec
    opdef = get_op("TRANSPOSE_CONV")
    specs = [TensorSpec((4,), np.dtype(np.int32)), TensorSpec((3, 3, 3, 2), np.dtype(np.float32)),
             TensorSpec((1, 4, 4, 2), np.dtype(np.float32)), None]
    attrs = {"padding": "SAME", "stride": (2, 2), "activation": "NONE"}
    with pytest.raises(DynamicShape):
        opdef.infer(specs, attrs)
    specs[0] = TensorSpec.of(np.array([1, 7, 8, 3], np.int32))
    assert opdef.infer(specs, attrs)[0].shape == (1, 7, 8, 3)


# -- LSTM state -------------------------------------------------------------------------

def _lstm_model(flags: dict, steps: int | None = None, n_output: int | None = None):
    rng = np.random.default_rng(7)
    batch, n_input, n_cell = 2, 3, 4
    if steps is None:
        x = rand(rng, batch, n_input)
        args = lstm_args(rng, x, n_cell, n_output=n_output, **flags)
        return one_op("LSTM", args, [(batch, n_output or n_cell)], fused_activation_function="TANH",
                      cell_clip=2.0), args
    x = rand(rng, batch, steps, n_input)
    args = lstm_args(rng, x, n_cell, n_output=n_output, batch=batch, **flags)
    return one_op("UNIDIRECTIONAL_SEQUENCE_LSTM", args, [(batch, steps, n_output or n_cell)],
                  fused_activation_function="TANH", cell_clip=2.0), args


@pytest.mark.parametrize("flags, n_output", [({}, None), ({"cifg": True, "peephole": True}, 3),
                                             ({"layer_norm": True}, None)])
def test_lstm_state_persists_across_invokes_like_litert(flags, n_output):
    from ai_edge_litert.interpreter import Interpreter
    (m, _), args = _lstm_model(flags, n_output=n_output)
    interp = Interpreter(model_content=m)
    interp.allocate_tensors()
    in_index = interp.get_input_details()[0]["index"]
    out_index = interp.get_output_details()[0]["index"]

    model = load_model(m)
    sg = model.subgraphs[0]
    node = sg.nodes[0]
    opdef = get_op("LSTM")
    attrs = opdef.node_attrs(node, sg.tensors)
    assert opdef.stateful and attrs["state_writeback"] == ((1, 18), (2, 19))
    values = [None if i < 0 else (sg.tensors[i].data if sg.tensors[i].data is not None
                                  else np.zeros(sg.tensors[i].shape, np.float32)) for i in node.inputs]
    rng = np.random.default_rng(3)
    for step in range(3):
        x = rand(rng, 2, 3)
        interp.set_tensor(in_index, x)
        interp.invoke()
        want = interp.get_tensor(out_index)
        values[0] = x
        got = opdef.execute(values, attrs, None)
        assert len(got) == 1
        assert max_rel_error(got[0], want) < 1e-5, f"step {step}"
    assert np.any(values[19] != 0)  # the cell state was written in place


def test_sequence_lstm_equals_repeated_lstm_steps():
    (m_seq, _), seq_args = _lstm_model({"peephole": True}, steps=3, n_output=3)
    x = seq_args[0]
    full = reference_outputs(m_seq, [x])[0]
    opdef = get_op("LSTM")
    weights = [a.array if isinstance(a, Const) else a for a in seq_args]
    h, c = np.zeros((2, 3), np.float32), np.zeros((2, 4), np.float32)
    attrs = {"activation": "TANH", "cell_clip": 2.0, "proj_clip": 0.0, "state_writeback": ((1, 18), (2, 19))}
    for t in range(3):
        inputs = list(weights)
        inputs[0], inputs[18], inputs[19] = x[:, t], h, c
        out, h, c = opdef.reference(inputs, attrs)
        np.testing.assert_allclose(full[:, t], out, rtol=1e-6, atol=1e-6)
    assert isinstance(seq_args[18], Var)


def test_lstm_rejects_inconsistent_weights_and_basic_kernel():
    rng = np.random.default_rng(0)
    x = rand(rng, 2, 3)
    args = lstm_args(rng, x, 4)
    args[6] = Const(rand(rng, 4, 5))  # recurrent_to_forget: wrong n_output
    m, _ = one_op("LSTM", args, [(2, 4)], fused_activation_function="TANH")
    with pytest.raises(ModelFormatError, match="n_output|recurrent"):
        node_attrs(m)
    m, _ = one_op("LSTM", lstm_args(rng, x, 4), [(2, 4)], fused_activation_function="TANH", kernel_type="BASIC")
    with pytest.raises(UnsupportedError, match="BASIC"):
        node_attrs(m)


# -- speed ------------------------------------------------------------------------------

def test_reference_conv_is_fast_enough_for_real_images():
    x = rand(RNG, 1, 224, 224, 16)
    w = rand(RNG, 32, 3, 3, 16)
    attrs = {"padding": "SAME", "stride": (1, 1), "dilation": (1, 1), "activation": "RELU6"}
    start = time.perf_counter()
    y = ref("CONV_2D", [x, w, None], attrs)[0]
    assert y.shape == (1, 224, 224, 32)
    assert time.perf_counter() - start < 1.0
