"""NaN, infinities and huge finite inputs come out where LiteRT puts them, on every backend;
and invoking a model again on the same inputs gives the same bits, from the first call.

LiteRT (x86-64, XNNPACK) is the oracle, quirks included: its clamps (fused activations,
RELU ops) let NaN through, while its pools turn NaN into a bound or drop it depending on
the window (see "NaN in pools" in :mod:`litegpu.ops.nn`), MAXIMUM/MINIMUM keep the
NaN of whichever operand XNNPACK puts second (:func:`litegpu.ops.elementwise.max_min_swapped`),
REDUCE_MAX/MIN keep a NaN only as the last element folded (:func:`litegpu.ops.reduce.x86_extreme`),
RESIZE_BILINEAR turns an infinite tap into NaN even at weight 0 (:func:`litegpu.ops.nn.bilinear_lerp`),
and HARD_SWISH and GELU saturate exactly (3e38 stays finite, -inf gives NaN).
A comparison asks for the same NaN positions, the same infinities (with their signs) and
close finite values.

Not compared, because LiteRT's kernels get them wrong and litegpu does not copy that:
XNNPACK's LOGISTIC gives NaN for |x| in about [4.5e26, 2.3e38], its EXP gives 0 for NaN,
its LOG gives inf for 3e38, its SQRT of 3e38 is off by half, and sums of several values
near the float limit overflow or not depending on the order of the additions.
"""
from __future__ import annotations

import numpy as np
import pytest

import litegpu
from litegpu.cli import random_inputs
from litegpu.testing.builder import ModelBuilder

from test_shared_models import LiteRT

F32 = np.float32
HUGE = 3e38     # finite; LiteRT's LOGISTIC is right at this one (1.0)

# numpy warns where the cpu backend's ufunc kernels meet inf - inf or overflow: expected here.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered", "ignore:overflow encountered")


# -- comparing --------------------------------------------------------------------------------

def _interpreter(backend: str, **source):
    delegates = None if backend == "cpu" else [litegpu.load_delegate(backend)]
    return litegpu.Interpreter(**source, experimental_delegates=delegates, num_threads=2)


def _invoke(interp, inputs) -> list[np.ndarray]:
    for d, x in zip(interp.get_input_details(), inputs):
        interp.set_tensor(d["index"], x)
    interp.invoke()
    return [np.array(interp.get_tensor(d["index"])) for d in interp.get_output_details()]


def _assert_same_pattern(got: list[np.ndarray], want: list[np.ndarray], what: str) -> None:
    """Same NaN positions, same infinities, finite values within 1e-4 relative (1e-4 absolute
    near zero), output by output."""
    for k, (g, w) in enumerate(zip(got, want)):
        name = f"{what}, output {k}"
        assert g.shape == w.shape, name
        if w.dtype.kind != "f":
            assert np.array_equal(g, w), name
            continue
        nan_g, nan_w = np.isnan(g), np.isnan(w)
        assert np.array_equal(nan_g, nan_w), (
            f"{name}: NaN at {int(nan_g.sum())} places, LiteRT at {int(nan_w.sum())}; first differing: "
            f"{np.argwhere(nan_g != nan_w)[:3].tolist()}")
        inf_g, inf_w = np.isinf(g), np.isinf(w)
        assert np.array_equal(inf_g, inf_w) and np.array_equal(g[inf_g], w[inf_w]), (
            f"{name}: infinities at {int(inf_g.sum())} places, LiteRT at {int(inf_w.sum())}; first differing: "
            f"{np.argwhere((inf_g != inf_w) | (inf_g & (g != w)))[:3].tolist()}")
        finite = np.isfinite(w)
        np.testing.assert_allclose(g[finite], w[finite], rtol=1e-4, atol=1e-4, err_msg=name)


def _special(x: np.ndarray, kind: str, rng: np.random.Generator) -> np.ndarray:
    """``x`` with special values: NaN sprinkled (one in nine), +-inf sprinkled, or one
    +-HUGE (a single one, so no sum meets two)."""
    x = x.copy()
    flat = x.reshape(-1)
    if kind == "nan":
        flat[rng.random(flat.size) < 1 / 9] = np.nan
    elif kind == "inf":
        flat[rng.random(flat.size) < 1 / 12] = np.inf
        flat[rng.random(flat.size) < 1 / 12] = -np.inf
    else:
        flat[rng.integers(flat.size)] = HUGE
        flat[rng.integers(flat.size)] = -HUGE
    return x


# -- small models covering the ops ---------------------------------------------------------------

def _zoo_image() -> bytes:
    """One input [1, 9, 9, 8] through one op per output: convolutions with each clamp, every
    kind of pool LiteRT runs differently, MEAN and the extremes over the image, the clamp
    ops, binary ops with broadcasts and constants, activations, resizes, CONCATENATION."""
    rng = np.random.default_rng(0)
    b = ModelBuilder()
    x = b.input("x", (1, 9, 9, 8))
    y = b.input("y", (1, 9, 9, 1))
    outs = []

    def op(name, inputs, shape, **options):
        t = b.tensor(f"o{len(outs)}", shape)
        b.op(name, inputs, [t], **options)
        outs.append(t)

    def const(a):
        return b.const(f"c{len(outs)}_{np.asarray(a).size}", np.asarray(a, F32))

    for act in ("NONE", "RELU", "RELU6", "RELU_N1_TO_1"):
        op("CONV_2D", [x, const(rng.standard_normal((4, 3, 3, 8)) * 0.5), const(rng.standard_normal(4))],
           (1, 9, 9, 4), padding="SAME", stride_h=1, stride_w=1, fused_activation_function=act)
    op("CONV_2D", [x, const(rng.standard_normal((4, 1, 1, 8))), const(rng.standard_normal(4))], (1, 9, 9, 4),
       padding="VALID", stride_h=1, stride_w=1, fused_activation_function="RELU6")
    op("DEPTHWISE_CONV_2D", [x, const(rng.standard_normal((1, 3, 3, 8))), const(rng.standard_normal(8))],
       (1, 5, 5, 8), padding="SAME", stride_h=2, stride_w=2, depth_multiplier=1, fused_activation_function="RELU")
    pools = [((2, 2), (2, 2), "VALID", (1, 4, 4, 8), "NONE"),     # XNNPACK: 4 taps, NaN may become -inf
             ((3, 3), (2, 2), "SAME", (1, 5, 5, 8), "RELU"),      # clamped edge taps
             ((4, 3), (1, 1), "VALID", (1, 6, 7, 8), "NONE"),     # 12 taps: two passes
             ((1, 1), (1, 1), "VALID", (1, 9, 9, 8), "RELU6"),    # XNNPACK's clamp
             ((2, 2), (3, 3), "VALID", (1, 3, 3, 8), "NONE")]     # stride > filter: TFLite's kernel
    for op_name in ("MAX_POOL_2D", "AVERAGE_POOL_2D"):
        for (fh, fw), (sh, sw), pad, shape, act in pools:
            op(op_name, [x], shape, padding=pad, filter_height=fh, filter_width=fw, stride_h=sh, stride_w=sw,
               fused_activation_function=act)
    op("MEAN", [x, b.const("axes", np.array([1, 2], np.int32))], (1, 1, 1, 8), keep_dims=True)
    # The channels stay innermost, so LiteRT folds each output in order on any x86 (longer
    # contiguous runs are in test_reduce_extremes_keep_nan_only_last).
    for name in ("REDUCE_MAX", "REDUCE_MIN"):
        op(name, [x, b.const(f"axes_{name}", np.array([1, 2], np.int32))], (1, 1, 1, 8), keep_dims=True)
        op(name, [x, b.const(f"axis_{name}", np.array([1], np.int32))], (1, 9, 8))
    for name in ("RELU", "RELU6", "RELU_N1_TO_1", "LOGISTIC", "TANH", "HARD_SWISH"):
        op(name, [x], (1, 9, 9, 8))
    for approximate in (False, True):
        op("GELU", [x], (1, 9, 9, 8), approximate=approximate)
    for (oh, ow), flags in (((13, 17), {}), ((5, 6), {"half_pixel_centers": True}),
                            ((17, 12), {"align_corners": True}), ((18, 18), {})):
        op("RESIZE_BILINEAR", [x, b.const(f"size{len(outs)}", np.array([oh, ow], np.int32))], (1, oh, ow, 8),
           **flags)
    op("ADD", [x, const(rng.standard_normal(8))], (1, 9, 9, 8), fused_activation_function="RELU6")
    op("MUL", [x, x], (1, 9, 9, 8), fused_activation_function="NONE")
    op("SUB", [x, y], (1, 9, 9, 8), fused_activation_function="RELU")
    for name in ("MAXIMUM", "MINIMUM"):
        op(name, [x, const(rng.standard_normal(8))], (1, 9, 9, 8))       # a row: b second
        op(name, [const([0.5]), x], (1, 9, 9, 8))                          # a constant scalar: a clamp
        op(name, [y, x], (1, 9, 9, 8))                                     # y per row: y second
        op(name, [x, y], (1, 9, 9, 8))
    op("CONCATENATION", [x, y], (1, 9, 9, 9), axis=3)
    b.output(*outs)
    return b.build()


def _zoo_rows() -> bytes:
    """One input [4, 16]: FULLY_CONNECTED with clamps, SOFTMAX, MEAN and SUM of rows, the
    extremes of columns."""
    rng = np.random.default_rng(1)
    b = ModelBuilder()
    x = b.input("x", (4, 16))
    outs = []
    for k, act in enumerate(("NONE", "RELU", "RELU6")):
        t = b.tensor(f"fc{k}", (4, 8))
        b.op("FULLY_CONNECTED", [x, b.const(f"w{k}", (rng.standard_normal((8, 16)) * 0.5).astype(F32)),
                                 b.const(f"b{k}", rng.standard_normal(8).astype(F32))], [t],
             fused_activation_function=act)
        outs.append(t)
    t = b.tensor("softmax", (4, 16))
    b.op("SOFTMAX", [x], [t], beta=1.0)
    outs.append(t)
    for name in ("MEAN", "SUM"):
        t = b.tensor(name.lower(), (4, 1))
        b.op(name, [x, b.const(f"axis_{name}", np.array([1], np.int32))], [t], keep_dims=True)
        outs.append(t)
    for name in ("REDUCE_MAX", "REDUCE_MIN"):
        t = b.tensor(name.lower(), (16,))
        b.op(name, [x, b.const(f"axis_{name}", np.array([0], np.int32))], [t], keep_dims=False)
        outs.append(t)
    b.output(*outs)
    return b.build()


ZOOS = {"image": _zoo_image, "rows": _zoo_rows}


@pytest.fixture(scope="module")
def zoo_models() -> dict[str, bytes]:
    return {name: make() for name, make in ZOOS.items()}


@pytest.mark.parametrize("kind", ["nan", "inf", "huge"])
@pytest.mark.parametrize("zoo", sorted(ZOOS))
def test_special_values_through_ops_match_litert(backend, zoo_models, zoo, kind):
    data = zoo_models[zoo]
    theirs = LiteRT(model_content=data, num_threads=2)
    theirs.allocate_tensors()
    rng = np.random.default_rng(5)
    inputs = [_special((rng.standard_normal(d["shape"]) * 3).astype(F32), kind, rng)
              for d in theirs.get_input_details()]
    ours = _interpreter(backend, model_content=data)
    ours.allocate_tensors()
    _assert_same_pattern(_invoke(ours, inputs), _invoke(theirs, inputs), f"{zoo} zoo, {kind} inputs")


# -- REDUCE_MAX / REDUCE_MIN on contiguous runs --------------------------------------------------

# (shape, axes) whose innermost reduced run is contiguous, most of them longer than a vector:
# XNNPACK folds those in vector lanes (16 on AVX-512), so its finite outputs after a NaN
# depend on the host's vector width. [5, 3] is a run that every backend folds one by one.
CONTIGUOUS_EXTREMES = [((4, 40), [1]), ((3, 5, 24), [0, 2]), ((2, 3, 20), [1, 2]), ((6, 64), [1]),
                       ((3, 70, 20), [1]), ((5, 3), [1])]


def _extremes_model() -> bytes:
    """One input per case of ``CONTIGUOUS_EXTREMES``, reduced by REDUCE_MAX and by REDUCE_MIN."""
    b = ModelBuilder()
    outs = []
    for k, (shape, axes) in enumerate(CONTIGUOUS_EXTREMES):
        x = b.input(f"x{k}", shape)
        kept = tuple(d for i, d in enumerate(shape) if i not in axes)
        for name in ("REDUCE_MAX", "REDUCE_MIN"):
            t = b.tensor(f"{name.lower()}{k}", kept)
            b.op(name, [x, b.const(f"axes_{name}{k}", np.array(axes, np.int32))], [t], keep_dims=False)
            outs.append(t)
    b.output(*outs)
    return b.build()


def _last_folded(shape, axes) -> np.ndarray:
    """Per output of a reduction of ``shape`` over ``axes``, the flat index of the last
    element folded (row-major over the reduced axes)."""
    kept = [a for a in range(len(shape)) if a not in axes]
    order = np.transpose(np.arange(int(np.prod(shape))).reshape(shape), kept + list(axes))
    return order.reshape(int(np.prod([shape[a] for a in kept])), -1)[:, -1]


def test_reduce_extremes_keep_nan_only_last(backend):
    """NaN comes out exactly where LiteRT's does (where the last element folded is NaN), and
    every backend folds in order (:func:`litegpu.ops.reduce.x86_extreme`); finite values of
    outputs that met a NaN are not compared with LiteRT, whose lanes keep more of them."""
    from litegpu.ops.reduce import x86_extreme
    data = _extremes_model()
    theirs = LiteRT(model_content=data, num_threads=2)
    theirs.allocate_tensors()
    ours = _interpreter(backend, model_content=data)
    ours.allocate_tensors()
    rng = np.random.default_rng(9)
    for trial in range(4):
        inputs = []
        for shape, axes in CONTIGUOUS_EXTREMES:
            x = rng.standard_normal(shape).astype(F32)
            x.reshape(-1)[rng.random(x.size) < 1 / 9] = np.nan
            x.reshape(-1)[rng.random(x.size) < 1 / 20] = np.inf if trial % 2 else -np.inf
            x.reshape(-1)[_last_folded(shape, axes)[::2]] = np.nan    # of every other output
            inputs.append(x)
        got, want = _invoke(ours, inputs), _invoke(theirs, inputs)
        for k, (shape, axes) in enumerate(CONTIGUOUS_EXTREMES):
            for j, largest in enumerate((True, False)):
                g, w = got[2 * k + j], want[2 * k + j]
                what = f"{'REDUCE_MAX' if largest else 'REDUCE_MIN'} {shape} over {axes}, trial {trial}"
                assert np.array_equal(np.isnan(g), np.isnan(w)), what
                initial = -np.inf if largest else np.inf
                assert np.array_equal(g, x86_extreme(inputs[k], tuple(axes), False, initial, largest),
                                      equal_nan=True), what


def test_reduce_extremes_fold_in_order():
    """The reference's rule, on rows small enough to read: a NaN survives only as the last
    element; one before it drops everything folded so far."""
    from litegpu.ops.reduce import x86_extreme
    nan, inf = np.nan, np.inf
    x = np.array([[5, nan, 1, 0], [1, 2, 3, nan], [nan, -inf, -2, -3], [nan, nan, nan, nan]], F32)
    assert np.array_equal(x86_extreme(x, (1,), False, -inf, True), np.array([1, nan, -2, nan], F32), equal_nan=True)
    assert np.array_equal(x86_extreme(x, (1,), False, inf, False), np.array([0, nan, -inf, nan], F32), equal_nan=True)
    # rows in row-major order over several axes; an empty reduction gives the initial value
    assert np.array_equal(x86_extreme(x.reshape(2, 2, 4), (0, 2), True, -inf, True).reshape(-1),
                          np.array([-2, nan], F32), equal_nan=True)
    assert np.array_equal(x86_extreme(np.zeros((2, 0), F32), (1,), False, -3.0, True), np.array([-3, -3], F32))


# -- shared models ------------------------------------------------------------------------------

# (model, special kinds): the image models exercise clamps, pools and means; the MLP a
# gate and tanh; elementwise_200 MAXIMUM with constants. Huge finite inputs only where no
# sum meets two of them before a LOGISTIC (see the module docstring).
SHARED_CASES = [("mobilenet_v2", ("nan", "inf", "huge")), ("unet_small", ("nan", "inf")),
                ("resnet18_fp16", ("nan",)), ("mobilenet_v3_small", ("nan",)),
                ("dynamic_batch_mlp", ("nan", "inf")), ("elementwise_200", ("nan", "inf", "huge"))]
SLOW_SHARED_CASES = [("efficientnet_b0", ("nan", "inf")), ("resnet18_fp16", ("inf",)),
                     ("mobilenet_v3_small", ("inf",))]


def _check_shared(backend: str, path, kinds) -> None:
    theirs = LiteRT(model_path=str(path), num_threads=2)
    theirs.allocate_tensors()
    base = random_inputs(theirs.get_input_details(), seed=7)
    ours = _interpreter(backend, model_path=str(path))
    ours.allocate_tensors()
    for kind in kinds:
        rng = np.random.default_rng(3)
        inputs = []
        for x in base:
            x = x.copy()
            if kind == "huge":
                x.reshape(-1)[x.size // 3] = HUGE
            else:   # one bad pixel: it spreads through the receptive fields
                x.reshape(-1)[x.size // 3] = np.nan if kind == "nan" else np.inf
                x.reshape(-1)[rng.integers(x.size)] = np.nan if kind == "nan" else -np.inf
            inputs.append(x)
        _assert_same_pattern(_invoke(ours, inputs), _invoke(theirs, inputs), f"{path.name}, {kind} inputs")


@pytest.mark.parametrize("name,kinds", SHARED_CASES, ids=[n for n, _ in SHARED_CASES])
def test_special_values_through_shared_models_match_litert(backend, shared_model, name, kinds):
    _check_shared(backend, shared_model(name), kinds)


@pytest.mark.slow
@pytest.mark.parametrize("name,kinds", SLOW_SHARED_CASES, ids=[n for n, _ in SLOW_SHARED_CASES])
def test_special_values_through_more_shared_models_match_litert(backend, shared_model, name, kinds):
    _check_shared(backend, shared_model(name), kinds)


# -- the same bits every invoke ---------------------------------------------------------------------

REPEAT_MODELS = ["lstm_classifier", "mobilenet_v2", "unet_small", "tiny_bert", "dynamic_batch_mlp",
                 "mobilenet_v2_int8", "stateful_counter"]
SLOW_REPEAT_MODELS = ["efficientnet_b0", "mobilenet_v3_small", "resnet18_fp16", "tiny_bert_dynamic",
                      "elementwise_200", "mobilenet_v3_small_int8", "unet_small_int16x8"]


def _check_repeats(backend: str, path) -> None:
    """Five invokes on the same inputs give the first one's bits (a stateful model is reset
    first: its state is part of its input)."""
    ours = _interpreter(backend, model_path=str(path))
    ours.allocate_tensors()
    inputs = random_inputs(ours.get_input_details(), seed=11)
    stateful = path.name == "stateful_counter.tflite"
    runs = []
    for _ in range(5):
        if stateful:
            ours.reset_all_variables()
        runs.append(_invoke(ours, inputs))
    for k, run in enumerate(runs[1:], start=2):
        for j, (a, b) in enumerate(zip(runs[0], run)):
            assert a.tobytes() == b.tobytes(), (
                f"{path.name} on {backend}: invoke {k}, output {j} differs from invoke 1 by up to "
                f"{np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))}")


@pytest.mark.parametrize("name", REPEAT_MODELS)
def test_every_invoke_gives_the_first_ones_bits(backend, shared_model, name):
    _check_repeats(backend, shared_model(name))


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW_REPEAT_MODELS)
def test_every_invoke_of_more_models_gives_the_first_ones_bits(backend, shared_model, name):
    _check_repeats(backend, shared_model(name))
