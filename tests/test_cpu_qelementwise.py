"""The cpu backend's integer kernels for 8-bit elementwise ops, MEAN, SOFTMAX and pools
(litegpu_cpu.kernels.qelementwise, qreduce, qpool): each chosen where it applies and equal
to LiteRT; ADD / SUB / MUL run same shapes and an operand repeating along the leading
axes as a task function over flat operands (cut into tasks when large, so b's period
straddles the tasks' edges), any other broadcast over broadcast views."""
from __future__ import annotations

import numpy as np
import pytest

from litegpu.testing.builder import ModelBuilder
from litegpu.ops.nn import conv_output_size
from litegpu_cpu.kernels import qelementwise, qpool, qreduce, registry

from test_ops_quantized import run_both


@pytest.mark.parametrize("dtype,zps", [(np.int8, (-5, 9, 3)), (np.uint8, (120, 131, 127))])
@pytest.mark.parametrize("op", ["ADD", "SUB"])
@pytest.mark.parametrize("a_shape,b_shape,act,kernel", [
    ((2, 5, 5, 8), (2, 5, 5, 8), "NONE", "_add_task"), ((2, 5, 5, 8), (2, 5, 5, 8), "RELU6", "_add_task"),
    ((2, 5, 5, 8), (1, 1, 1, 8), "NONE", "_add_task"),          # repeats along the leading axes (a bias)
    ((2, 5, 5, 8), (1,), "NONE", "_add_task"),                  # a scalar (a GRU's 1 - z)
    ((1, 61, 83, 9), (1, 1, 1, 9), "RELU", "_add_task"),        # 8 tasks, not on b's period
    ((1, 61, 83, 9), (1, 61, 83, 9), "NONE", "_add_task"),      # 8 tasks, same shapes
    ((2, 5, 5, 8), (2, 1, 1, 8), "NONE", "_add_broadcast"),     # another broadcast
    ((2, 5, 5, 8), (2, 5, 1, 1), "RELU", "_add_broadcast")])
@pytest.mark.parametrize("small_first", [False, True])
def test_integer_add_chosen_and_exact(monkeypatch, dtype, zps, op, a_shape, b_shape, act, kernel,
                                      small_first) -> None:
    calls = _record(monkeypatch, kernel)
    rng = np.random.default_rng(3)
    info = np.iinfo(dtype)
    b = ModelBuilder()
    x = b.input("x", a_shape, dtype, scale=[0.07], zero_point=[zps[0]])
    z = b.input("z", b_shape, dtype, scale=[0.03], zero_point=[zps[1]])
    y = b.tensor("y", a_shape, dtype, scale=[0.06], zero_point=[zps[2]])
    b.op(op, [z, x] if small_first else [x, z], [y], fused_activation_function=act, version=2)
    b.output(y)
    inputs = [rng.integers(info.min, info.max + 1, s).astype(dtype) for s in (a_shape, b_shape)]
    (ours,), (theirs,) = run_both(b.build(), inputs)
    np.testing.assert_array_equal(ours, theirs)
    assert calls, f"{kernel} did not run"


@pytest.mark.parametrize("op", ["ADD", "SUB"])
def test_integer_add_extreme_parameters(op) -> None:
    """uint8 zero points at the ends of the range, multipliers near 2^21 (XNNPACK's
    largest), every pair of input values: the bias and sums at their largest still fit
    the int32 the kernel computes in, as they do in XNNPACK's."""
    b = ModelBuilder()
    x = b.input("x", (256, 256), np.uint8, scale=[1.99], zero_point=[0])
    z = b.input("z", (256, 256), np.uint8, scale=[1.97], zero_point=[255])
    y = b.tensor("y", (256, 256), np.uint8, scale=[1.0], zero_point=[128])
    b.op(op, [x, z], [y], version=2)
    b.output(y)
    every = np.arange(256, dtype=np.uint8)
    inputs = [np.tile(every, (256, 1)), np.repeat(every, 256).reshape(256, 256)]
    (ours,), (theirs,) = run_both(b.build(), inputs)
    np.testing.assert_array_equal(ours, theirs)


def _record(monkeypatch, kernel: str, module=qelementwise) -> list:
    """Record each use of ``kernel``: a task function (bound through ``bind_task``) or a
    compiled broadcast loop of ``module``."""
    calls = []
    if kernel.endswith("_task") or kernel == "_LOOKUP":
        bind_task = module.bind_task
        task = getattr(module, kernel)
        monkeypatch.setattr(module, "bind_task", lambda t, *args, **kw: (calls.append(t is task),
                                                                       bind_task(t, *args, **kw))[1])
        return calls
    loop = getattr(module, kernel)
    monkeypatch.setattr(module, kernel, lambda *args: (calls.append(1), loop(*args)))
    return calls


def _unary(op: str, dtype, in_q: tuple, out_dtype, out_q: tuple | None, **options) -> bytes:
    b = ModelBuilder()
    x = b.input("x", (2, 256), dtype, scale=[in_q[0]], zero_point=[in_q[1]])
    y = b.tensor("y", (2, 256), out_dtype, **({"scale": [out_q[0]], "zero_point": [out_q[1]]} if out_q else {}))
    b.op(op, [x], [y], **options)
    b.output(y)
    return b.build()


UNARY = [
    ("HARD_SWISH", np.int8, (0.05, -7), np.int8, (0.03, -100), {}),
    ("HARD_SWISH", np.uint8, (0.05, 120), np.uint8, (0.03, 20), {}),
    ("LOGISTIC", np.int8, (0.08, 3), np.int8, (1 / 256, -128), {}),
    ("TANH", np.int8, (0.04, -2), np.int8, (1 / 128, 0), {}),
    ("LEAKY_RELU", np.int8, (0.05, 4), np.int8, (0.04, -10), {"alpha": 0.2}),
    ("QUANTIZE", np.int8, (0.05, -6), np.int8, (0.07, 10), {}),
    ("DEQUANTIZE", np.int8, (0.05, -6), np.float32, None, {"version": 2}),
    ("DEQUANTIZE", np.uint8, (0.05, 120), np.float32, None, {"version": 2}),
]


@pytest.mark.parametrize("op,dtype,in_q,out_dtype,out_q,options", UNARY, ids=[f"{u[0]}-{np.dtype(u[1]).name}"
                                                                             for u in UNARY])
def test_unary_table_chosen_and_exact(monkeypatch, op, dtype, in_q, out_dtype, out_q, options) -> None:
    calls = _record(monkeypatch, "_LOOKUP")
    every = np.arange(256, dtype=np.uint8).view(dtype)
    x = np.stack([every, every[::-1]])   # every input value, in two orders
    (ours,), (theirs,) = run_both(_unary(op, dtype, in_q, out_dtype, out_q, **options), [x])
    np.testing.assert_array_equal(ours, theirs)
    assert calls and all(calls)


@pytest.mark.parametrize("dtype,zps", [(np.int8, (-3, 5)), (np.uint8, (131, 120))])
@pytest.mark.parametrize("shape,axes,keep", [((1, 7, 7, 64), (1, 2), True), ((2, 5, 3, 20), (1, 2), False),
                                             ((3, 10, 8), (2,), False), ((2, 6, 4, 8), (0, 2), True)])
@pytest.mark.parametrize("op", ["MEAN", "SUM"])
def test_integer_mean_chosen_and_exact(monkeypatch, op, dtype, zps, shape, axes, keep) -> None:
    """MEAN / SUM over adjacent axes run the kernel, others the reference; all equal LiteRT."""
    calls = _record(monkeypatch, "_mean_task", qreduce)
    rng = np.random.default_rng(4)
    info = np.iinfo(dtype)
    b = ModelBuilder()
    x = b.input("x", shape, dtype, scale=[0.05], zero_point=[zps[0]])
    axes_t = b.const("axes", np.array(axes, np.int32))
    out_shape = tuple(1 if i in axes else d for i, d in enumerate(shape) if keep or i not in axes)
    y = b.tensor("y", out_shape, dtype, scale=[0.03 if op == "MEAN" else 0.6], zero_point=[zps[1]])
    b.op(op, [x, axes_t], [y], keep_dims=keep)
    b.output(y)
    (ours,), (theirs,) = run_both(b.build(), [rng.integers(info.min, info.max + 1, shape).astype(dtype)])
    np.testing.assert_array_equal(ours, theirs)
    assert bool(calls) == (axes != (0, 2))


@pytest.mark.parametrize("dtype,zps", [(np.int8, (-5, 9, 3)), (np.uint8, (120, 131, 127))])
@pytest.mark.parametrize("a_shape,b_shape,chosen", [
    ((2, 5, 5, 8), (2, 5, 5, 8), "_mul_task"),
    ((1, 6, 6, 16), (1, 1, 1, 16), "_mul_task"),        # squeeze-and-excite
    ((1, 1, 1, 16), (1, 6, 6, 16), "_mul_task"),        # the same, operands swapped
    ((1, 61, 83, 9), (1, 1, 1, 9), "_mul_task"),        # 8 tasks, not on b's period
    ((1, 6, 6, 16), (1, 6, 1, 16), "_mul_broadcast"),   # a broadcast in the middle
    ((1, 32, 64), (1, 32, 1), "_mul_broadcast"),        # a layer norm's per-row scale
    ((4, 1, 8), (1, 5, 1), "_mul_broadcast"),           # both broadcast
])
def test_integer_mul_chosen_and_exact(monkeypatch, dtype, zps, a_shape, b_shape, chosen) -> None:
    calls = _record(monkeypatch, chosen)
    rng = np.random.default_rng(8)
    info = np.iinfo(dtype)
    out_shape = np.broadcast_shapes(a_shape, b_shape)
    b = ModelBuilder()
    x = b.input("x", a_shape, dtype, scale=[0.07], zero_point=[zps[0]])
    z = b.input("z", b_shape, dtype, scale=[0.03], zero_point=[zps[1]])
    y = b.tensor("y", out_shape, dtype, scale=[0.01], zero_point=[zps[2]])
    b.op("MUL", [x, z], [y], fused_activation_function="RELU6")
    b.output(y)
    inputs = [rng.integers(info.min, info.max + 1, s).astype(dtype) for s in (a_shape, b_shape)]
    (ours,), (theirs,) = run_both(b.build(), inputs)
    np.testing.assert_array_equal(ours, theirs)
    assert calls, f"{chosen} did not run"


@pytest.mark.parametrize("dtype,zp", [(np.int8, -3), (np.uint8, 128)])
def test_quantize_float_chosen_and_exact(monkeypatch, dtype, zp) -> None:
    calls = _record(monkeypatch, "_quantize_task")
    b = ModelBuilder()
    x = b.input("x", (3, 1000), np.float32)
    y = b.tensor("y", (3, 1000), dtype, scale=[0.02], zero_point=[zp])
    b.op("QUANTIZE", [x], [y])
    b.output(y)
    rng = np.random.default_rng(9)
    values = rng.normal(size=(3, 1000)).astype(np.float32) * 2
    values[0, :4] = [1e30, -1e30, np.inf, -np.inf]
    values[1, :200] = (np.arange(200, dtype=np.float32) - 100) * np.float32(0.01)   # ties at half quanta
    (ours,), (theirs,) = run_both(b.build(), [values])
    np.testing.assert_array_equal(ours, theirs)
    assert calls and all(calls)


@pytest.mark.parametrize("dtype,in_q,out_q", [
    (np.int8, (0.08, 5), (1 / 256, -128)),     # the converter's int8 softmax
    (np.uint8, (0.05, 130), (1 / 256, 0)),     # uint8: TFLite's + 0.5 truncation
    (np.int8, (0.3, -20), (1 / 256, -128))])   # a wide input scale: many rows saturate
@pytest.mark.parametrize("shape,beta", [((3, 10), 1.0), ((2, 4, 12), 1.0), ((1, 1000), 1.0), ((4, 7), 0.5)])
def test_integer_softmax_chosen_and_exact(monkeypatch, dtype, in_q, out_q, shape, beta) -> None:
    calls = []
    loop = qreduce._softmax8_loop
    monkeypatch.setattr(qreduce, "_softmax8_loop", lambda *args: (calls.append(1), loop(*args)))
    b = ModelBuilder()
    x = b.input("x", shape, dtype, scale=[in_q[0]], zero_point=[in_q[1]])
    y = b.tensor("y", shape, dtype, scale=[out_q[0]], zero_point=[out_q[1]])
    b.op("SOFTMAX", [x], [y], beta=beta)
    b.output(y)
    info = np.iinfo(dtype)
    xs = np.random.default_rng(5).integers(info.min, info.max + 1, shape).astype(dtype)
    (ours,), (theirs,) = run_both(b.build(), [xs])
    np.testing.assert_array_equal(ours, theirs)
    assert calls


@pytest.mark.parametrize("op", ["MAX_POOL_2D", "AVERAGE_POOL_2D"])
@pytest.mark.parametrize("dtype,zp", [(np.int8, -3), (np.uint8, 131)])
@pytest.mark.parametrize("shape,filt,stride,padding,act", [
    ((1, 9, 7, 5), (3, 3), (2, 2), "SAME", "NONE"),
    ((2, 8, 8, 16), (2, 2), (2, 2), "VALID", "RELU6"),
    ((1, 49, 20, 8), (49, 20), (1, 1), "VALID", "NONE"),    # a global average (a keyword spotter's)
    ((1, 24, 10, 4), (2, 1), (2, 1), "SAME", "RELU"),        # a CRNN's time pooling
    ((1, 96, 96, 16), (3, 3), (2, 2), "SAME", "NONE")])      # 8 tasks
def test_integer_pool_chosen_and_exact(monkeypatch, op, dtype, zp, shape, filt, stride, padding, act) -> None:
    calls = _record(monkeypatch, "_qpool_task", qpool)
    out_hw = [conv_output_size(d, k, s, 1, padding)[0] for d, k, s in zip(shape[1:3], filt, stride)]
    b = ModelBuilder()
    x = b.input("x", shape, dtype, scale=[0.05], zero_point=[zp])
    y = b.tensor("y", (shape[0], *out_hw, shape[3]), dtype, scale=[0.05], zero_point=[zp])
    b.op(op, [x], [y], padding=padding, stride_h=stride[0], stride_w=stride[1], filter_height=filt[0],
         filter_width=filt[1], fused_activation_function=act)
    b.output(y)
    info = np.iinfo(dtype)
    xs = np.random.default_rng(6).integers(info.min, info.max + 1, shape).astype(dtype)
    (ours,), (theirs,) = run_both(b.build(), [xs])
    np.testing.assert_array_equal(ours, theirs)
    assert calls


@pytest.mark.parametrize("dtype,zps", [(np.int8, (-5, 9, 3, -20)), (np.uint8, (120, 131, 127, 100)),
                                       (np.int16, (0, 0, 0, 0))])
@pytest.mark.parametrize("axis,shapes", [(3, [(1, 4, 4, 8), (1, 4, 4, 5), (1, 4, 4, 3)]),
                                         (1, [(2, 3, 6), (2, 1, 6), (2, 4, 6)])])
def test_integer_concatenation_across_scales_chosen_and_exact(monkeypatch, dtype, zps, axis, shapes) -> None:
    monkeypatch.setattr(registry, "reference_kernel", lambda ctx: pytest.fail(f"{ctx.node.op} ran its reference"))
    rng = np.random.default_rng(9)
    info = np.iinfo(dtype)
    out_shape = list(shapes[0])
    out_shape[axis] = sum(s[axis] for s in shapes)
    b = ModelBuilder()
    # uint8: the second input shares the output's quantization (copied), the others are
    # rescaled. int8 and int16 concatenations share one quantization (what the converter
    # makes; LiteRT's XNNPACK refuses to prepare int8 ones across scales, and its int16
    # kernel copies the values whatever their scales, where litegpu rescales them:
    # test_ops_quantized_kinds.py checks that on this kernel).
    same = [dtype != np.uint8 or k == 1 for k in range(3)]
    scales = [0.07, 0.05, 0.031]
    xs = [b.input(f"x{k}", s, dtype, scale=[0.05 if same[k] else scales[k]], zero_point=[zps[3] if same[k] else zps[k]])
          for k, s in enumerate(shapes)]
    y = b.tensor("y", tuple(out_shape), dtype, scale=[0.05], zero_point=[zps[3]])
    b.op("CONCATENATION", xs, [y], axis=axis)
    b.output(y)
    inputs = [rng.integers(info.min, info.max + 1, s).astype(dtype) for s in shapes]
    (ours,), (theirs,) = run_both(b.build(), inputs)
    np.testing.assert_array_equal(ours, theirs)


def _swish(dtype, zps: tuple, follower: str, swapped: bool, shared: bool) -> bytes:
    """x -> LOGISTIC -> ``follower``(x, sigmoid) (operands ``swapped`` or not); with
    ``shared`` the sigmoid is a model output too."""
    b = ModelBuilder()
    x = b.input("x", (4, 256), dtype, scale=[0.06], zero_point=[zps[0]])
    s = b.tensor("s", (4, 256), dtype, scale=[1 / 256], zero_point=[np.iinfo(dtype).min])
    y = b.tensor("y", (4, 256), dtype, scale=[0.05], zero_point=[zps[1]])
    b.op("LOGISTIC", [x], [s])
    b.op(follower, [s, x] if swapped else [x, s], [y], **({"version": 2} if follower != "MUL" else {}))
    b.output(y)
    if shared:
        b.output(s)
    return b.build()


@pytest.mark.parametrize("dtype,zps", [(np.int8, (-7, 4)), (np.uint8, (121, 130))])
@pytest.mark.parametrize("follower,swapped", [("MUL", False), ("MUL", True), ("ADD", False), ("SUB", True)])
@pytest.mark.parametrize("shared", [False, True])
def test_table_op_and_its_follower_are_one_table(dtype, zps, follower, swapped, shared) -> None:
    """int8 swish (x * LOGISTIC(x)) and its kin: one table, unless the sigmoid is read
    elsewhere; every input byte equal to LiteRT either way."""
    import litegpu
    model = _swish(dtype, zps, follower, swapped, shared)
    every = np.arange(256, dtype=np.uint8).view(dtype)
    x = np.stack([every, every[::-1], np.roll(every, 77), every])
    ours, theirs = run_both(model, [x])
    for got, want in zip(ours, theirs):
        np.testing.assert_array_equal(got, want)
    interp = litegpu.Interpreter(model_content=model)
    interp.allocate_tensors()
    kernels = {op: name for _, op, _, name in interp.get_delegation_report().kernels}
    assert ("8-bit lookup table" in kernels["LOGISTIC"]) and (kernels[follower] == kernels["LOGISTIC"]) != shared


@pytest.mark.parametrize("task", ["_lookup_task", "_lookup_vbmi_task"])
@pytest.mark.parametrize("size", [1, 63, 64, 200, 70001])
def test_byte_lookup_tasks_agree_with_the_table(task: str, size: int) -> None:
    """Both byte lookups (the 64-at-a-time VBMI one where the host has it) on every byte
    value, with sizes that leave remainders past the 64-byte blocks and the tasks' edges."""
    from litegpu_cpu.kernels.tasks import bind_task
    if task == "_lookup_vbmi_task" and not qelementwise.VBMI:
        pytest.skip("this CPU has no AVX-512 VBMI: the VBMI lookup is never compiled here")
    rng = np.random.default_rng(size)
    table = rng.integers(0, 256, 256).astype(np.uint8)
    x = rng.integers(0, 256, size).astype(np.uint8)
    out = np.zeros(size, np.uint8)
    chunk = max(1, -(-size // 3))
    bind_task(getattr(qelementwise, task), -(-size // chunk), (table, x), (out,),
              np.array([size, chunk, 0], np.int64), dtypes=(np.uint8,) * 3)()
    np.testing.assert_array_equal(out, table[x])


@pytest.mark.parametrize("dtype,zps", [(np.int8, (-7, 4)), (np.uint8, (121, 130))])
def test_folded_pair_on_the_references_alone(monkeypatch, dtype, zps) -> None:
    """With no integer kernels, the folded swish pair still runs both references in turn
    (registry.one_input_reference), never the first one's alone into the second's output."""
    monkeypatch.setattr(registry, "QUANTIZED_KERNELS", {})
    every = np.arange(256, dtype=np.uint8).view(dtype)
    ours, theirs = run_both(_swish(dtype, zps, "MUL", False, False), [np.stack([every] * 4)])
    np.testing.assert_array_equal(ours[0], theirs[0])
