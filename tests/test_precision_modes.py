"""The three precision modes every codegen GPU backend offers, and how a user asks for each.

F32 by default; ``precision_loss_allowed`` gives half storage with half arithmetic where
the device computes in half (F16); the ``half_arithmetic`` delegate option set to False
keeps float arithmetic over the half storage (F32_F16, TFLite GPU's middle mode).
"""
from __future__ import annotations

import numpy as np
import pytest

import litegpu
from litegpu.backend import CompileOptions
from litegpu.codegen import HALF_ARITHMETIC, requested_precision
from litegpu.testing.builder import ModelBuilder


@pytest.mark.parametrize("loss, half, device_half, mode", [
    (False, True, True, "F32"),
    (False, False, True, "F32"),
    (True, True, True, "F16"),
    (True, False, True, "F32_F16"),
    (True, True, False, "F32_F16"),     # a device without half arithmetic stores half only
])
def test_requested_precision(loss, half, device_half, mode):
    options = CompileOptions(precision_loss_allowed=loss, extra={HALF_ARITHMETIC: half})
    assert requested_precision(options, device_half).name == mode


@pytest.mark.parametrize("gpu", ["opencl", "webgpu"])
def test_the_delegate_option_reaches_the_program(gpu, request):
    request.getfixturevalue(gpu)   # skips, saying why, where the backend cannot run
    b = ModelBuilder()
    x_in, y, z = b.input("x", (4, 64), np.float32), b.tensor("y", (4, 64), np.float32), b.tensor("z", (4, 64), np.float32)
    b.op("TANH", [x_in], [y])
    b.op("MUL", [y, x_in], [z])
    b.output(z)
    model = b.build()
    x = np.random.default_rng(0).standard_normal((4, 64)).astype(np.float32)
    for options, modes in (({"precision_loss_allowed": True, HALF_ARITHMETIC: False}, {"F32_F16"}),
                           ({"precision_loss_allowed": True}, {"F16", "F32_F16"})):   # F16 where the device has it
        interp = litegpu.Interpreter(model_content=model,
                                     experimental_delegates=[litegpu.load_delegate(gpu, options)])
        interp.allocate_tensors()
        interp.set_tensor(interp.get_input_details()[0]["index"], x)
        interp.invoke()
        programs = " ".join(interp.get_delegation_report().programs)
        assert any(f" {m}" in programs for m in modes), programs
