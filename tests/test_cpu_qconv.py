"""The cpu backend's integer kernels for int8 CONV_2D, DEPTHWISE_CONV_2D and
FULLY_CONNECTED (litegpu_cpu.kernels.qconv) are the ones chosen for quantized nodes, and
agree exactly with the ops' integer references and with LiteRT."""
from __future__ import annotations

import numpy as np
import pytest

import litegpu
from litegpu.testing.builder import ModelBuilder
from litegpu_cpu.kernels import qdepthwise, qgemm
from litegpu_cpu.kernels.tasks import is_plan

from ai_edge_litert.interpreter import Interpreter as LiteRT  # a test dependency: never skipped

RNG = np.random.default_rng(23)
TASKS = {qgemm._qgemm_vnni.address if qgemm.VNNI else qgemm._qgemm_plain.address: "qgemm"}


def model(op: str, x_shape, w_shape, out_shape, per_channel: bool, **options) -> tuple[bytes, np.ndarray]:
    """One quantized ``op`` node (int8 in and out, int8 weights, int32 bias) and an input."""
    b = ModelBuilder()
    x = b.input("x", x_shape, np.int8, scale=[0.05], zero_point=[-3])
    channels = w_shape[0] if op != "DEPTHWISE_CONV_2D" else w_shape[3]
    axis = 3 if op == "DEPTHWISE_CONV_2D" else 0
    scales = RNG.uniform(0.002, 0.02, channels).astype(np.float32) if per_channel else np.float32([0.01])
    w = b.const("w", RNG.integers(-127, 128, w_shape).astype(np.int8), scale=scales,
                zero_point=[0] * scales.size, quantized_dimension=axis)
    bias = b.const("b", RNG.integers(-2000, 2000, channels).astype(np.int32), scale=np.float32(0.05) * scales,
                   zero_point=[0] * scales.size)
    y = b.tensor("y", out_shape, np.int8, scale=[0.08], zero_point=[5])
    b.op(op, [x, w, bias], [y], **options)
    b.output(y)
    return b.build(), RNG.integers(-128, 128, x_shape).astype(np.int8)


CASES = [
    ("CONV_2D", (1, 8, 8, 16), (24, 1, 1, 16), (1, 8, 8, 24), dict(padding="VALID", stride_w=1, stride_h=1), "qgemm"),
    ("CONV_2D", (1, 9, 9, 3), (16, 3, 3, 3), (1, 5, 5, 16), dict(padding="SAME", stride_w=2, stride_h=2,
                                                               fused_activation_function="RELU6"), "qgemm"),
    ("CONV_2D", (2, 6, 7, 5), (7, 3, 3, 5), (2, 6, 7, 7), dict(padding="SAME", stride_w=1, stride_h=1), "qgemm"),
    ("CONV_2D", (1, 12, 20, 3), (8, 3, 3, 3), (1, 12, 20, 8),                   # im2col's runs and border
     dict(padding="SAME", stride_w=1, stride_h=1), "qgemm"),
    ("CONV_2D", (1, 11, 13, 4), (6, 3, 2, 4), (1, 7, 11, 6),                    # dilated: the general im2col
     dict(padding="VALID", stride_w=1, stride_h=1, dilation_h_factor=2, dilation_w_factor=2), "qgemm"),
    ("DEPTHWISE_CONV_2D", (1, 9, 9, 16), (1, 3, 3, 16), (1, 9, 9, 16),
     dict(padding="SAME", stride_w=1, stride_h=1, depth_multiplier=1, fused_activation_function="RELU"), "depthwise"),
    ("DEPTHWISE_CONV_2D", (1, 8, 8, 4), (1, 3, 3, 8), (1, 4, 4, 8),
     dict(padding="SAME", stride_w=2, stride_h=2, depth_multiplier=2), None),     # multiplier 2: the reference
    ("FULLY_CONNECTED", (1, 37), (10, 37), (1, 10), {}, "qgemm"),                  # K not a multiple of 4
    ("FULLY_CONNECTED", (7, 64), (40, 64), (7, 40), dict(fused_activation_function="RELU"), "qgemm"),
]


@pytest.mark.parametrize("per_channel", [True, False], ids=["per-channel", "per-tensor"])
@pytest.mark.parametrize("op,x_shape,w_shape,out_shape,options,chosen", CASES)
def test_integer_kernel_chosen_and_exact(op, x_shape, w_shape, out_shape, options, chosen, per_channel):
    content, x = model(op, x_shape, w_shape, out_shape, per_channel, **options)
    ours, theirs = litegpu.Interpreter(model_content=content), LiteRT(model_content=content)
    outs = []
    for interp in (ours, theirs):
        interp.allocate_tensors()
        interp.set_tensor(interp.get_input_details()[0]["index"], x)
        interp.invoke()
        outs.append(interp.get_tensor(interp.get_output_details()[0]["index"]))
    program = ours._compiled.programs[0][0]
    ctx = program.steps[0][4]
    call = program.bind([x], [np.empty(out_shape, np.int8)]).steps[0].call
    kinds = {TASKS.get(a, "depthwise" if a == qdepthwise._qdepthwise_task.address else "other")
             for c in getattr(call, "calls", [call]) if is_plan(c) for a in c.rows[:, 0]}
    if chosen is None:
        assert not kinds
    else:
        assert chosen in kinds
    (reference,) = ctx.opdef.reference_for(ctx.attrs)([x, *[s.value for s in ctx.inputs[1:]]], ctx.attrs)
    np.testing.assert_array_equal(outs[0], reference.reshape(outs[0].shape))
    np.testing.assert_array_equal(outs[0], outs[1])
