"""The float view of quantized models (litegpu.float_view): the rewrite, its ops
(QUANT_SIM, QUANT_LUT, GRID_ADD, GRID_MUL, GRID_REQUANT16), and small int8 / uint8 /
16x8 / hybrid models on opencl against LiteRT's integers.

A GPU backend runs a quantized model as LiteRT's GPU delegate does: constants
dequantized, QUANT_SIM after every op that produced a quantized tensor (folded into the
producing kernel's store), the edges quantized and dequantized. Where LiteRT runs XNNPACK's
8-bit arithmetic (convolutions, FULLY_CONNECTED, ADD/SUB/MUL, MEAN) and lookup tables, the
view computes on integer-valued floats and lands on LiteRT's integers exactly, in F32 and
in F32_F16; for 16x8 models (TFLite's reference kernels) it splits int16 grid values into
bytes for exact sums, tables int16 one-input ops and lands on LiteRT's integers, in
F32_F16 too (int16 values are full-precision tensors, kept float32 in half storage).
The shared models' figures are in tests/test_quantized_models.py.
"""
from __future__ import annotations

import numpy as np
import pytest

import litegpu
from litegpu.float_view import float_view, grid_add, grid_mul, grid_requant16, quant_lut, quant_sim, row_quantize
from litegpu.testing.builder import ModelBuilder

from test_ops_quantized import q8, run_both, weights

RNG_SEED = 5


def on_opencl(model: bytes, inputs: list[np.ndarray], fp16: bool = False) -> tuple[list, object]:
    """Outputs of ``model`` under the opencl delegate, and its delegation report."""
    interp = litegpu.Interpreter(model_content=model, experimental_delegates=[
        litegpu.load_delegate("opencl", {"precision_loss_allowed": fp16})])
    interp.allocate_tensors()
    for d, x in zip(interp.get_input_details(), inputs):
        interp.set_tensor(d["index"], x)
    interp.invoke()
    return [interp.get_tensor(d["index"]) for d in interp.get_output_details()], interp.get_delegation_report()


def assert_opencl_equals_litert(model: bytes, inputs: list[np.ndarray], fp16: bool) -> None:
    """The model all on opencl gives LiteRT's integers exactly (and, for reference, so do
    the cpu integer kernels)."""
    ours, want = run_both(model, inputs)
    for o, w in zip(ours, want):
        np.testing.assert_array_equal(o, w)
    got, report = on_opencl(model, inputs, fp16)
    assert report.nodes_on("cpu") == 0
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, w)


def conv_model(rng) -> bytes:
    b = ModelBuilder()
    x = b.input("x", (1, 9, 9, 8), np.int8, scale=[0.05], zero_point=[-3])
    ws = rng.uniform(0.002, 0.02, 6).astype(np.float32)
    w = b.const("w", weights(rng, (6, 3, 3, 8)), scale=ws, zero_point=[0] * 6)
    bias = b.const("b", rng.integers(-2000, 2000, 6).astype(np.int32), scale=np.float32(0.05) * ws,
                   zero_point=[0] * 6)
    y = b.tensor("y", (1, 9, 9, 6), np.int8, scale=[0.08], zero_point=[5])
    z = b.input("z", (1, 9, 9, 6), np.int8, scale=[0.06], zero_point=[-9])
    s = b.tensor("s", (1, 9, 9, 6), np.int8, scale=[0.1], zero_point=[2])
    m = b.tensor("m", (1, 1, 1, 6), np.int8, scale=[0.05], zero_point=[0])
    b.op("CONV_2D", [x, w, bias], [y], padding="SAME", stride_h=1, stride_w=1, fused_activation_function="RELU6")
    b.op("ADD", [y, z], [s])
    b.op("MEAN", [s, b.const("axes", np.array([1, 2], np.int32))], [m], keep_dims=True)
    b.output(s, m)
    return b.build()


def test_the_rewrite_keeps_the_interface_and_computes_on_grid_values() -> None:
    model = litegpu.load_model(conv_model(np.random.default_rng(RNG_SEED)))
    view = float_view(model)
    sg, fv = model.subgraphs[0], view.subgraphs[0]
    assert fv.inputs == sg.inputs and fv.outputs == sg.outputs
    for t in (*sg.inputs, *sg.outputs):   # the caller's integers are unchanged
        assert fv.tensors[t].dtype == np.int8 and fv.tensors[t].quantization is not None
    assert all(t.dtype == np.float32 for t in fv.tensors if t.index not in (*sg.inputs, *sg.outputs)
               and t.data is None)
    ops = [n.op for n in fv.nodes]
    assert ops == ["DEQUANTIZE", "DEQUANTIZE",
                   "QUANT_SIM", "CONV_2D", "ADD", "MUL", "QUANT_SIM",       # x onto its grid; the conv's sums
                   "QUANT_SIM", "GRID_ADD", "QUANT_SIM",                    # z onto its grid; the ADD
                   "QUANT_SIM", "SUM", "ADD", "MUL", "ADD", "QUANT_SIM",    # s (an output: real) onto its grid; MEAN
                   "QUANTIZE", "QUANTIZE"]
    conv = fv.nodes[3]
    # The filter is its integers (zero points 0 here), the bias comes after the sums.
    w, wq = fv.tensors[conv.inputs[1]], sg.tensors[sg.nodes[0].inputs[1]]
    np.testing.assert_array_equal(w.data, wq.data.astype(np.float32))
    assert conv.inputs[2] == -1 and conv.options["fused_activation_function"] == 0
    # y is read by the ADD only, so it stays in grid form (no rounding back to real values).
    y_sim = fv.nodes[6]
    assert y_sim.options["in_scale"] == 1.0 and y_sim.options["out_scale"] == 1.0
    assert fv.nodes[9].options["rounding"] == "half_up"    # XNNPACK's ADD shifts with half up


def test_quant_sim_rounds_to_the_grid_and_saturates() -> None:
    attrs = {"in_scale": 0.5, "out_scale": 0.5, "zero_point": 3, "qmin": -128, "qmax": 127}
    x = np.array([0.0, 0.25, 0.75, 1.1, -100.0, 100.0, -0.25], np.float32)
    np.testing.assert_array_equal(quant_sim(x, attrs), [0.0, 0.0, 1.0, 1.0, -65.5, 62.0, -0.0])
    grid = {**attrs, "in_scale": 1.0, "out_scale": 1.0}
    y = np.array([2.5, 3.5, -2.5, 200.0], np.float32)
    np.testing.assert_array_equal(quant_sim(y, grid), [2.0, 4.0, -2.0, 124.0])       # to even; 127 - zp
    np.testing.assert_array_equal(quant_sim(y, {**grid, "rounding": "half_up"}), [3.0, 4.0, -2.0, 124.0])
    # coded: the value already holds the zero point (XNNPACK's MEAN folds it in).
    np.testing.assert_array_equal(quant_sim(y, {**grid, "coded": True}), [-1.0, 1.0, -5.0, 124.0])
    # half away from zero: TFLite's std::round (its int16 RESIZE_BILINEAR)
    z = np.array([2.5, -2.5, 0.5, -0.5, 0.49999997, -1.25], np.float32)
    np.testing.assert_array_equal(quant_sim(z, {**grid, "zero_point": 0, "rounding": "half_away"}),
                                  [3.0, -3.0, 1.0, -1.0, 0.0, -1.0])


def test_grid_ops_references() -> None:
    a = np.array([[3.0, -7.0], [0.0, 127.0]], np.float32)
    b = np.array([5.0, -128.0], np.float32)
    np.testing.assert_array_equal(grid_add(a, b, {"a_multiplier": 0.5, "b_multiplier": -0.25}),
                                  a * np.float32(0.5) - b * np.float32(0.25))
    np.testing.assert_array_equal(grid_mul(a, b, {"scale": 0.125}), (a * b) * np.float32(0.125))
    table = np.arange(256, dtype=np.float32) * 2
    codes = np.array([-128, -1, 0, 127], np.float32) * np.float32(0.1)   # real values of scale 0.1
    np.testing.assert_array_equal(quant_lut(codes, table, {"in_scale": 0.1, "offset": 128}),
                                  [0.0, 254.0, 256.0, 510.0])
    # NaN and strays stay inside the table.
    np.testing.assert_array_equal(quant_lut(np.array([np.nan, 1e9, -1e9], np.float32), table,
                                            {"in_scale": 1.0, "offset": 128}), [0.0, 510.0, 0.0])


@pytest.mark.parametrize("style", ["tflite16", "tflite"])
def test_grid_requant16_is_tflites_requantization(style: str) -> None:
    """High and low sums (in steps of 2^-12) put back together equal the int64 sums
    requantized as the integer reference does, beyond float32's 2^24 too."""
    from litegpu.ops.quantized import finish_sums
    from litegpu.quant import quantize_multiplier
    rng = np.random.default_rng(RNG_SEED)
    high = rng.integers(-2 ** 20, 2 ** 20, (3, 5, 4))
    low = rng.integers(-2 ** 20, 2 ** 20, (3, 5, 4))
    bias = rng.integers(-2 ** 30, 2 ** 30, 4)
    m, shift = quantize_multiplier(rng.uniform(1e-6, 1e-4, 4))
    r = {"style": style, "multiplier": m, "shift": shift, "zp": 0, "lo": -32768, "hi": 32767, "dtype": np.int16}
    want = finish_sums(256 * high + low, bias, r)
    step = 2.0 ** -12
    attrs = {"bias": bias, "multiplier": m, "shift": shift, "style": style, "step": step, "lo": -32768, "hi": 32767}
    got = grid_requant16((high * step).astype(np.float32), (low * step).astype(np.float32), attrs)
    assert got.dtype == np.float32 and np.abs(256 * high + low).max() > 2 ** 24
    np.testing.assert_array_equal(got, want)


def zoo_model(rng, dtype=np.int8) -> tuple[bytes, list[tuple[int, ...]]]:
    """One model through every kind of grid node: convolutions (per channel and per
    tensor, depthwise, transpose, fully connected), PAD passing grid form through, lookups
    (HARD_SWISH, LOGISTIC), ADD / SUB / MUL with broadcasting, MEAN; uint8 takes the
    legacy scheme's subset (one filter scale, filter zero point)."""
    b = ModelBuilder()
    u8 = dtype == np.uint8
    lo = 0 if u8 else -128
    x = b.input("x", (1, 8, 8, 12), dtype, scale=[0.04], zero_point=[lo + 123])

    filter_scales = {}

    def filt(name, shape, axis):
        if u8:
            filter_scales[name] = np.float32([0.01])
            return b.const(name, rng.integers(0, 256, shape).astype(np.uint8), scale=[0.01], zero_point=[131])
        n = shape[axis]
        filter_scales[name] = rng.uniform(0.003, 0.02, n).astype(np.float32)
        return b.const(name, weights(rng, shape), scale=filter_scales[name], zero_point=[0] * n,
                       quantized_dimension=axis)

    def bias(name, n, in_scale, filt_name):
        scales = (np.float32(in_scale) * filter_scales[filt_name]).astype(np.float32)
        return b.const(name, rng.integers(-3000, 3000, n).astype(np.int32), scale=scales,
                       zero_point=[0] * scales.size)

    def act(name, shape, scale, zp):
        return b.tensor(name, shape, dtype, scale=[scale], zero_point=[zp + (128 if u8 else 0)])

    w1 = filt("w1", (16, 3, 3, 12), 0)
    c1 = act("c1", (1, 8, 8, 16), 0.03, -128)
    b.op("CONV_2D", [x, w1, bias("b1", 16, 0.04, "w1")], [c1], padding="SAME", stride_h=1, stride_w=1, fused_activation_function="RELU6")
    w2 = filt("w2", (1, 3, 3, 16), 3)
    d1 = act("d1", (1, 4, 4, 16), 0.05, 3)
    b.op("DEPTHWISE_CONV_2D", [c1, w2, bias("b2", 16, 0.03, "w2")], [d1], padding="SAME", stride_h=2, stride_w=2, depth_multiplier=1)
    p1 = act("p1", (1, 6, 6, 16), 0.05, 3)
    b.op("PAD", [d1, b.const("pads", np.array([[0, 0], [1, 1], [1, 1], [0, 0]], np.int32))], [p1])
    w3 = filt("w3", (8, 1, 1, 16), 0)
    c2 = act("c2", (1, 6, 6, 8), 0.07, -2)
    b.op("CONV_2D", [p1, w3, bias("b3", 8, 0.05, "w3")], [c2], padding="VALID", stride_h=1, stride_w=1)
    m = act("m", (1, 6, 6, 8), 0.04, 0)
    if u8:
        b.op("MUL", [c2, c2], [m])
    else:
        h = act("h", (1, 6, 6, 8), 0.05, -10)
        b.op("HARD_SWISH", [c2], [h])
        g = b.tensor("g", (1, 6, 6, 8), dtype, scale=[1 / 256], zero_point=[-128])
        b.op("LOGISTIC", [h], [g])
        b.op("MUL", [h, g], [m])
    a = act("a", (1, 6, 6, 8), 0.08, 1)
    b.op("ADD", [m, c2], [a], fused_activation_function="RELU")
    vec = b.const("vec", rng.integers(lo, lo + 256, 8).astype(dtype), scale=[0.06], zero_point=[lo + 130])
    sb = act("sb", (1, 6, 6, 8), 0.1, -5)
    b.op("SUB", [a, vec], [sb])
    mn = act("mn", (1, 1, 1, 8), 0.03, 7)
    b.op("MEAN", [sb, b.const("axes", np.array([1, 2], np.int32))], [mn], keep_dims=True)
    flat = act("flat", (1, 8), 0.03, 7)
    b.op("RESHAPE", [mn, b.const("shape", np.array([1, 8], np.int32))], [flat])
    w4 = filt("w4", (5, 8), 0)
    fc = act("fc", (1, 5), 0.2, -1)
    b.op("FULLY_CONNECTED", [flat, w4, bias("b4", 5, 0.03, "w4")], [fc])
    w5 = filt("w5", (4, 3, 3, 8), 0)
    tc = act("tc", (1, 12, 12, 4), 0.3, 2)
    b.op("TRANSPOSE_CONV", [b.const("out_shape", np.array([1, 12, 12, 4], np.int32)), w5, c2, bias("b5", 4, 0.07, "w5")], [tc],
         padding="SAME", stride_h=2, stride_w=2)
    b.output(fc, tc, sb)
    return b.build(), [(1, 8, 8, 12)]


@pytest.mark.parametrize("fp16", [False, True], ids=["F32", "F32_F16"])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8], ids=["int8", "uint8"])
def test_grid_arithmetic_on_opencl_equals_litert(opencl, dtype, fp16: bool) -> None:
    """Every grid node of the view on opencl lands on LiteRT's integers exactly, in half
    storage too (8-bit grid values are exact in fp16)."""
    for seed in range(3):
        rng = np.random.default_rng(seed)
        model, shapes = zoo_model(rng, dtype)
        lo = np.iinfo(dtype).min
        inputs = [rng.integers(lo, lo + 256, s).astype(dtype) for s in shapes]
        assert_opencl_equals_litert(model, inputs, fp16)


def zoo16_model(rng) -> bytes:
    """A 16x8 model (int16 activations, int8 filters, int64 biases: TFLite's reference
    kernels in LiteRT) through every 16-bit grid node: CONV_2D with RELU, DEPTHWISE,
    TRANSPOSE_CONV, FULLY_CONNECTED (the double-rounding requantization), a 2x
    RESIZE_BILINEAR, LOGISTIC and requantizing QUANTIZE as tables, MAX_POOL between.
    Scales keep most codes inside the range; full-range inputs make sums beyond 2^24."""
    b = ModelBuilder()
    x = b.input("x", (1, 8, 8, 6), np.int16, scale=[1e-5], zero_point=[0])

    def filt(name, shape, axis):
        n = shape[axis]
        scales = rng.uniform(0.002, 0.02, n).astype(np.float32)
        return b.const(name, weights(rng, shape), scale=scales, zero_point=[0] * n, quantized_dimension=axis), scales

    def bias(name, n, in_scale, scales):
        return b.const(name, rng.integers(-3_000_000, 3_000_000, n).astype(np.int64),
                       scale=np.float32(in_scale) * scales, zero_point=[0] * n)

    def act(name, shape, scale):
        return b.tensor(name, shape, np.int16, scale=[scale], zero_point=[0])

    w1, s1 = filt("w1", (8, 3, 3, 6), 0)
    c1 = act("c1", (1, 8, 8, 8), 2.5e-4)
    b.op("CONV_2D", [x, w1, bias("b1", 8, 1e-5, s1)], [c1], padding="SAME", stride_h=1, stride_w=1,
         fused_activation_function="RELU", version=3)
    w2, s2 = filt("w2", (1, 3, 3, 8), 3)
    d1 = act("d1", (1, 8, 8, 8), 5e-4)
    b.op("DEPTHWISE_CONV_2D", [c1, w2, bias("b2", 8, 2.5e-4, s2)], [d1], padding="SAME", stride_h=1, stride_w=1,
         depth_multiplier=1, version=3)
    p1 = act("p1", (1, 4, 4, 8), 5e-4)
    b.op("MAX_POOL_2D", [d1], [p1], padding="VALID", stride_h=2, stride_w=2, filter_height=2, filter_width=2)
    r1 = act("r1", (1, 8, 8, 8), 5e-4)
    b.op("RESIZE_BILINEAR", [p1, b.const("size", np.array([8, 8], np.int32))], [r1], half_pixel_centers=True)
    w3, s3 = filt("w3", (4, 3, 3, 8), 0)
    t1 = act("t1", (1, 16, 16, 4), 2e-3)
    b.op("TRANSPOSE_CONV", [b.const("out_shape", np.array([1, 16, 16, 4], np.int32)), w3, r1,
                            bias("b3", 4, 5e-4, s3)], [t1], padding="SAME", stride_h=2, stride_w=2, version=4)
    g1 = act("g1", (1, 8, 8, 8), 1 / 32768)
    b.op("LOGISTIC", [d1], [g1])
    q1 = act("q1", (1, 8, 8, 8), 6.5e-4)
    b.op("QUANTIZE", [r1], [q1])
    flat = act("flat", (1, 128), 5e-4)
    b.op("RESHAPE", [p1, b.const("shape", np.array([1, 128], np.int32))], [flat])
    w4, s4 = filt("w4", (10, 128), 0)
    fc = act("fc", (1, 10), 7.5e-3)
    b.op("FULLY_CONNECTED", [flat, w4, bias("b4", 10, 5e-4, s4)], [fc], version=5)
    b.output(t1, g1, q1, fc)
    return b.build()


def test_16x8_rewrite_splits_the_activation_and_tables_int16() -> None:
    model = litegpu.load_model(zoo16_model(np.random.default_rng(0)))
    fv = float_view(model).subgraphs[0]
    ops = [n.op for n in fv.nodes]
    # x onto its grid, split into bytes, summed twice, requantized
    assert ops[:7] == ["DEQUANTIZE", "QUANT_SIM", "QUANT_SIM", "GRID_ADD", "CONV_2D", "CONV_2D", "GRID_REQUANT16"]
    assert ops.count("GRID_REQUANT16") == 4 and ops.count("QUANT_LUT") == 2
    split = fv.nodes[2].options
    assert (split["in_scale"], split["qmin"], split["qmax"]) == (256.0, -128, 128)
    assert fv.nodes[3].options == {"a_multiplier": 1.0, "b_multiplier": -256.0}
    assert fv.tensors[fv.nodes[4].inputs[1]].data is fv.tensors[fv.nodes[5].inputs[1]].data   # one filter
    assert fv.nodes[6].options["style"] == "tflite16"
    assert [n for n in fv.nodes if n.op == "GRID_REQUANT16"][-1].options["style"] == "tflite"   # FULLY_CONNECTED
    assert any(n.op == "QUANT_SIM" and n.options["rounding"] == "half_away" for n in fv.nodes)   # the resize
    assert all(fv.tensors[n.inputs[1]].data.size == 65536 for n in fv.nodes if n.op == "QUANT_LUT")


def test_16x8_resize_off_tflites_taps_stays_simulated() -> None:
    """4 -> 6 rows: the float taps are not TFLite's 1/1024ths, so no exact resize."""
    b = ModelBuilder()
    x = b.input("x", (1, 4, 4, 2), np.int16, scale=[0.01], zero_point=[0])
    y = b.tensor("y", (1, 6, 6, 2), np.int16, scale=[0.01], zero_point=[0])
    b.op("RESIZE_BILINEAR", [x, b.const("size", np.array([6, 6], np.int32))], [y], half_pixel_centers=True)
    b.output(y)
    fv = float_view(litegpu.load_model(b.build())).subgraphs[0]
    assert [n.op for n in fv.nodes] == ["DEQUANTIZE", "RESIZE_BILINEAR", "QUANT_SIM", "QUANTIZE"]
    assert fv.nodes[2].options["rounding"] == "even"


@pytest.mark.parametrize("fp16", [False, True], ids=["F32", "F32_F16"])
def test_16x8_grid_arithmetic_on_opencl_equals_litert(opencl, fp16: bool) -> None:
    """Every 16x8 grid node lands on LiteRT's integers (the split sums are exact below
    2^24, the requantization is integer), in F32_F16 too: the int16 codes and the sums
    are full-precision tensors, kept float32 in half storage."""
    for seed in range(3):
        rng = np.random.default_rng(seed)
        model = zoo16_model(rng)
        inputs = [rng.integers(-32768, 32768, (1, 8, 8, 6)).astype(np.int16)]
        assert_opencl_equals_litert(model, inputs, fp16)


def test_grid_form_only_where_every_reader_takes_it() -> None:
    """c2 feeds a convolution-free mix (lookup, ADD, MUL, TRANSPOSE_CONV): all grid
    readers, so it is never rounded back to real values; sb is an output (real)."""
    model = litegpu.load_model(zoo_model(np.random.default_rng(0))[0])
    sg, fv = model.subgraphs[0], float_view(model).subgraphs[0]
    names = {t.index: t.name for t in sg.tensors}
    sims = {names.get(n.outputs[0], fv.tensors[n.outputs[0]].name): n.options for n in fv.nodes
            if n.op == "QUANT_SIM"}
    assert sims["c2"]["out_scale"] == 1.0 and sims["c1"]["out_scale"] == 1.0
    assert [n.op for n in fv.nodes].count("QUANT_LUT") == 2
    pad = next(n for n in fv.nodes if n.op == "PAD")
    assert pad.outputs == tuple(t.index for t in sg.tensors if t.name == "p1")   # no QUANT_SIM after it
    assert not any(n.op == "QUANT_SIM" and n.inputs[0] in pad.outputs and n.options["out_scale"] != 1.0
                   for n in fv.nodes)


@pytest.mark.parametrize("fp16", [False, True], ids=["F32", "F32_F16"])
def test_int8_ops_on_opencl_land_on_litert_integers(opencl, fp16: bool) -> None:
    rng = np.random.default_rng(RNG_SEED)
    model = conv_model(rng)
    inputs = [q8(rng, (1, 9, 9, 8)), q8(rng, (1, 9, 9, 6))]
    got, report = on_opencl(model, inputs, fp16)
    assert report.nodes_on("cpu") == 0
    _, want = run_both(model, inputs)
    for g, w in zip(got, want):
        diff = np.abs(g.astype(np.int64) - w)
        assert g.dtype == np.int8 and diff.max() <= 1
        # F32: the float sums round like the integers but for a rare tie.
        assert np.count_nonzero(diff) <= (0.01 if not fp16 else 0.05) * g.size


def hybrid_fc_pair(rng, block: int | None) -> bytes:
    """Two hybrid FULLY_CONNECTED reading one input (int8 per-channel weights, or INT4
    with a scale per ``block`` of K, fp16 scales not all bf16-exact), one output each."""
    b = ModelBuilder()
    x = b.input("x", (3, 64), np.float32)
    outs = []
    for k in range(2):
        if block is None:
            w = b.const(f"w{k}", weights(rng, (5, 64)), scale=rng.uniform(0.01, 0.02, 5).astype(np.float32),
                        zero_point=[0] * 5, quantized_dimension=0)
        else:
            s = b.const(f"s{k}", rng.uniform(0.01, 0.05, (5, 64 // block)).astype(np.float16))
            w = b.const(f"w{k}", rng.integers(-8, 8, (5, 64)).astype(np.int8), "INT4", quantized_dimension=0,
                        details=("BlockwiseQuantization", {"scales": s, "zero_points": -1, "block_size": block}))
        y = b.tensor(f"y{k}", (3, 5), np.float32)
        b.op("FULLY_CONNECTED", [x, w, b.const(f"b{k}", rng.standard_normal(5).astype(np.float32))], [y],
             asymmetric_quantize_inputs=True)
        outs.append(y)
    for y in outs:
        b.output(y)
    return b.build()


@pytest.mark.parametrize("block", [None, 32])
def test_hybrid_model_quantizes_its_input_rows_on_opencl(opencl, block) -> None:
    """The input rows quantized as XNNPACK does (one ROW_QUANTIZE for both products), then
    XNNPACK's integer product and scaling of those codes with the weights' codes: LiteRT's
    bits. (Without the row quantization the outputs were 2 % off; a float product of the
    quantized rows was an ulp off.)"""
    rng = np.random.default_rng(RNG_SEED)
    model = hybrid_fc_pair(rng, block)
    view = float_view(litegpu.model.load_model(model)).subgraphs[0]
    assert [n.op for n in view.nodes] == ["ROW_QUANTIZE", "HYBRID_FULLY_CONNECTED", "HYBRID_FULLY_CONNECTED"]
    inputs = [(3 * rng.standard_normal((3, 64))).astype(np.float32)]
    got, report = on_opencl(model, inputs)
    assert report.nodes_on("cpu") == 0
    _, want = run_both(model, inputs)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_row_quantize_is_xnnpacks_dynamic_quantization() -> None:
    """Each row on its own int8 grid: a row's extremes land on codes -128 and 127 (0 is in
    range), a row of zeros gets codes of its zero point, a NaN becomes the zero point."""
    x = np.array([[-1.0, 0.25, 3.0, 0.1], [0.0, 0.0, 0.0, 0.0], [2.0, np.nan, 1.0, 0.5]], np.float32)
    codes, params = row_quantize(x)
    assert codes.dtype == np.int8 and params.shape == (3, 2)
    scale, zp = params[:, 0], params[:, 1]
    assert scale[0] == np.float32(1) / (np.float32(255) / np.float32(4.0))
    assert codes[0].min() == -128 and codes[0].max() == 127
    np.testing.assert_allclose((codes[0] - zp[0]) * scale[0], x[0], atol=scale[0] / 2)
    np.testing.assert_array_equal(codes[1], zp[1])
    assert codes[2, 1] == zp[2] and codes[2, 0] == 127


def test_full_precision_marks_what_half_storage_would_change() -> None:
    """int16 activations (and their grid forms), the view's sums and unrounded values, and
    a float tensor QUANTIZE rounds are full precision; 8-bit grid values, filters and the
    split bytes of a 16x8 sum, which half holds exactly, are not."""
    model16 = litegpu.load_model(zoo16_model(np.random.default_rng(0)))
    sg16, fv16 = model16.subgraphs[0], float_view(model16).subgraphs[0]
    for t in sg16.tensors:
        if t.dtype == np.int16 and t.data is None and t.index not in (*sg16.inputs, *sg16.outputs):
            assert fv16.tensors[t.index].full_precision, t.name
    split = fv16.nodes[2].outputs[0], fv16.nodes[3].outputs[0]
    assert not any(fv16.tensors[t].full_precision for t in split)
    assert all(fv16.tensors[t].full_precision for n in fv16.nodes if n.op == "GRID_REQUANT16" for t in n.inputs)
    assert not any(fv16.tensors[n.inputs[1]].full_precision for n in fv16.nodes if n.op == "CONV_2D")

    model8 = litegpu.load_model(conv_model(np.random.default_rng(RNG_SEED)))
    sg8, fv8 = model8.subgraphs[0], float_view(model8).subgraphs[0]
    y = next(t.index for t in sg8.tensors if t.name == "y")
    assert not fv8.tensors[y].full_precision                 # an 8-bit activation
    conv = next(n for n in fv8.nodes if n.op == "CONV_2D")
    assert fv8.tensors[conv.outputs[0]].full_precision      # its integer sums
    assert not fv8.tensors[conv.inputs[1]].full_precision   # the grid filter

    b = ModelBuilder()
    x = b.input("x", (4,), np.float32)
    q = b.tensor("q", (4,), np.int8, scale=[0.01], zero_point=[0])
    b.op("QUANTIZE", [x], [q])
    b.output(q)
    fv = float_view(litegpu.load_model(b.build())).subgraphs[0]
    assert fv.tensors[fv.inputs[0]].full_precision


def test_a_float_input_is_quantized_exactly_in_half_storage(opencl) -> None:
    """A float input QUANTIZE rounds stays float32 on the device in F32_F16: stored in
    half, inputs near the rounding's ties (here every one) would move a quantum."""
    b = ModelBuilder()
    x = b.input("x", (1, 256), np.float32)
    q = b.tensor("q", (1, 256), np.int8, scale=[1 / 100], zero_point=[3])
    y = b.tensor("y", (1, 256), np.float32)
    b.op("QUANTIZE", [x], [q])
    b.op("DEQUANTIZE", [q], [y])
    b.output(q, y)
    model = b.build()
    rng = np.random.default_rng(RNG_SEED)
    # Just off the ties k + 1/2 on either side: half keeps ~3 bits below the point here.
    k = rng.integers(-120, 120, (1, 256))
    side = rng.choice([-1.0, 1.0], (1, 256))
    inputs = [((k + 0.5 + side * 2e-3) / 100).astype(np.float32)]
    assert np.any(np.rint(inputs[0].astype(np.float16).astype(np.float32) * 100) != np.rint(inputs[0] * 100))
    got, report = on_opencl(model, inputs, fp16=True)
    _, want = run_both(model, inputs)
    assert report.nodes_on("cpu") == 0
    np.testing.assert_array_equal(got[0], want[0])
    assert "kept fp32" in str(report)


@pytest.mark.parametrize("op,dtype", [("SQRT", np.int8), ("RSQRT", np.int8), ("SQRT", np.int16), ("RSQRT", np.int16)])
def test_a_lookup_over_part_of_the_codes_clamps_to_the_ops_domain(op: str, dtype) -> None:
    """SQRT and RSQRT refuse negative values (LiteRT fails at invoke), so their table holds
    the reference where it is defined and, below it, the value at the domain's edge: a GPU
    gets LiteRT's integers on every valid code and no NaN (NVIDIA's Vulkan turned the float
    fallback's NaN at zero into -128)."""
    from litegpu.float_view import _lookup_plan
    from litegpu.ops import get_op
    b = ModelBuilder()
    zp = -5 if dtype == np.int8 else 0
    x = b.input("x", (16,), dtype, scale=[0.05], zero_point=[zp])
    y = b.tensor("y", (16,), dtype, scale=[0.02], zero_point=[zp])
    b.op(op, [x], [y])
    b.output(y)
    model = litegpu.load_model(b.build())
    sg = model.subgraphs[0]
    node, opdef = sg.nodes[0], get_op(op)
    plan = _lookup_plan(node, sg.tensors, opdef.node_attrs(node, sg.tensors), opdef)
    assert plan is not None
    info = np.iinfo(dtype)
    codes = np.arange(info.min, info.max + 1)
    valid = codes >= zp       # RSQRT of zero is defined: the largest value
    want = opdef.reference_for(opdef.node_attrs(node, sg.tensors))(
        [codes[valid].astype(dtype)], opdef.node_attrs(node, sg.tensors))[0]
    np.testing.assert_array_equal(plan.table[valid], want)
    assert (plan.table[~valid] == want[0]).all()
    assert "QUANT_LUT" in [n.op for n in float_view(model).subgraphs[0].nodes]
