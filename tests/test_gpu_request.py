"""What a request for "GPU" gets: a GPU backend whose device is a GPU, never OpenCL on a CPU.

PoCL (OpenCL on the CPU, what CI has) runs models slower than the cpu backend; a user who
asked for "GPU" and read "fully accelerated" would be misled. "GPU" therefore passes over a
backend whose ``device_info()["type"]`` is ``"CPU"``, warning how to ask for it by name, and
the delegation report names every partition's device.
"""
from __future__ import annotations

import logging

import numpy as np
import pytest

import litegpu
from litegpu.backend import Backend, device_is_cpu, device_label
from litegpu.hookspecs import hookimpl
from litegpu.plugins import manager
from litegpu.session import resolve_backends
from litegpu.testing.builder import ModelBuilder


def _relu_model() -> bytes:
    b = ModelBuilder()
    x = b.input("x", (1, 8, 8, 4))
    y = b.tensor("y", (1, 8, 8, 4))
    b.op("RELU", [x], [y])
    b.output(y)
    return b.build()


class _Gpu(Backend):
    """A GPU backend whose device type is set per instance (it never compiles anything)."""

    is_gpu = True

    def __init__(self, name: str, device_type: str, priority: int) -> None:
        self.name, self.device_type, self.gpu_priority = name, device_type, priority

    def device_info(self) -> dict:
        return {"device": f"{self.name} device", "type": self.device_type}


@pytest.fixture
def gpus():
    """Registers a GPU whose device is a CPU (ranked first) and one whose device is a GPU."""
    on_cpu, on_gpu = _Gpu("cpu-device-gpu", "CPU", 5000), _Gpu("real-gpu", "GPU", 4000)

    class Plugin:
        @hookimpl
        def litegpu_backends(self):
            return [on_cpu, on_gpu]
    manager().register(Plugin(), "gpu-request-test")
    yield on_cpu, on_gpu
    manager().unregister("gpu-request-test")


def test_gpu_passes_over_a_backend_whose_device_is_a_cpu(gpus):
    on_cpu, on_gpu = gpus
    names = [b.name for b in resolve_backends(["GPU"])]
    assert on_gpu.name in names and on_cpu.name not in names, names
    # By name it is still used.
    assert [b.name for b in resolve_backends([on_cpu.name])] == [on_cpu.name]


def test_device_labels_say_when_the_device_is_a_cpu(gpus):
    on_cpu, on_gpu = gpus
    assert device_is_cpu(on_cpu) and not device_is_cpu(on_gpu)
    assert device_label(on_cpu) == "cpu-device-gpu (cpu-device-gpu device, a CPU)"
    assert device_label(on_gpu) == "real-gpu (real-gpu device)"
    assert device_label(manager().backends["cpu"]) == "cpu"


def test_gpu_on_pocl_runs_on_cpu_saying_why(opencl, caplog):
    if not device_is_cpu(opencl):
        pytest.skip(f"the OpenCL device here is a {opencl.device_info().get('type')}, not a CPU")
    with caplog.at_level(logging.WARNING, logger="litegpu"):
        model = litegpu.CompiledModel.from_buffer(_relu_model(), hardware_accel=litegpu.HardwareAccelerator.GPU)
    assert not model.is_fully_accelerated()
    warning = " ".join(r.getMessage() for r in caplog.records)
    assert "no GPU backend is available; running on cpu" in warning
    assert opencl.device_info()["device"] in warning and "ask for 'opencl' by name" in warning


def test_opencl_by_name_on_pocl_runs_there_and_the_report_names_the_device(opencl):
    interp = litegpu.Interpreter(model_content=_relu_model(), experimental_delegates=[litegpu.load_delegate("opencl")])
    interp.allocate_tensors()
    x = np.linspace(-1, 1, 256, dtype=np.float32).reshape(1, 8, 8, 4)
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    np.testing.assert_array_equal(interp.get_tensor(interp.get_output_details()[0]["index"]), np.maximum(x, 0))
    report = str(interp.get_delegation_report())
    assert f"partition 0: {device_label(opencl)}, 1 node (node 0)" in report, report
    if device_is_cpu(opencl):
        assert ", a CPU)" in report
