"""The opencl backend's runtime: device-resident partitions, zero-copy buffers, async runs, events.

Runs on PoCL in CI (a real OpenCL implementation on the CPU); skipped with the reason
where no OpenCL platform exists.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import pytest

import litegpu
from litegpu.plugins import manager
from litegpu.testing.builder import ModelBuilder
from litegpu.testing.conformance import litert_outputs


def _chain_model(shape=(1, 32, 32, 16), depth=4) -> bytes:
    """x -> (MUL x, ADD x, RELU6) * depth: elementwise, fully on opencl."""
    b = ModelBuilder()
    x = b.input("x", shape, np.float32)
    cur = x
    for i in range(depth):
        y = b.tensor(f"y{i}", shape, np.float32)
        b.op("MUL", [cur, x], [y])
        z = b.tensor(f"z{i}", shape, np.float32)
        b.op("ADD", [y, x], [z], fused_activation_function="RELU6")
        cur = z
    b.output(cur)
    return b.build()


def _chain_reference(x: np.ndarray, depth: int) -> np.ndarray:
    out = x.copy()
    for _ in range(depth):
        out = np.clip(out * x + x, 0, 6)
    return out


def _split_model(shape=(2, 8, 8, 4)) -> bytes:
    """opencl (ADD) -> cpu (CUMSUM, which opencl lacks) -> opencl (MUL reading both)."""
    b = ModelBuilder()
    x = b.input("x", shape, np.float32)
    a = b.tensor("a", shape, np.float32)
    b.op("ADD", [x, x], [a])
    axis = b.const("axis", np.array(len(shape) - 1, np.int32))
    c = b.tensor("c", shape, np.float32)
    b.op("CUMSUM", [a, axis], [c])
    d = b.tensor("d", shape, np.float32)
    b.op("MUL", [c, a], [d])
    b.output(d)
    return b.build()


def test_fully_delegated_model_moves_only_its_inputs_and_outputs(opencl):
    interp = litegpu.Interpreter(model_content=_chain_model(),
                                 experimental_delegates=[litegpu.load_delegate("opencl")])
    interp.allocate_tensors()
    report = interp._compiled.report
    assert report.fully_delegated
    nbytes = 32 * 32 * 16 * 4
    assert report.bytes_moved == 2 * nbytes          # one input in, one output out
    x = np.random.default_rng(1).random((1, 32, 32, 16), np.float32)
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    got = interp.get_tensor(interp.get_output_details()[0]["index"])
    np.testing.assert_allclose(got, _chain_reference(x, 4), rtol=1e-6, atol=1e-6)


def test_half_storage_halves_the_bytes_moved(opencl):
    full = litegpu.CompiledModel.from_buffer(_chain_model(), backend="opencl")
    half = litegpu.CompiledModel.from_buffer(
        _chain_model(), options=litegpu.Options(backend="opencl", gpu_options=litegpu.GpuOptions(enforce_f32=False)))
    assert half.delegation_reports()[0].bytes_moved * 2 == full.delegation_reports()[0].bytes_moved
    assert "F32_F16 (fp16 storage, fp32 arithmetic)" in str(half.delegation_reports()[0])


def test_tensor_crossing_a_cpu_partition_stays_on_device_for_the_next_opencl_partition(opencl):
    data = _split_model()
    interp = litegpu.Interpreter(model_content=data, experimental_delegates=[litegpu.load_delegate("opencl")])
    interp.allocate_tensors()
    compiled = interp._compiled
    assert [b for b, _ in compiled.report.partitions] == ["opencl", "cpu", "opencl"]
    plan = compiled.runner.plan()
    # x in; a out to the host for CUMSUM (but not back in: the device still holds it);
    # c in; d out. Nothing else.
    moves = sorted((d, compiled.sg.tensors[t].name) for d, t, _ in plan.copies)
    assert moves == [("in", "c"), ("in", "x"), ("out", "a"), ("out", "d")]
    x = np.random.default_rng(2).standard_normal((2, 8, 8, 4)).astype(np.float32)
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    got = interp.get_tensor(interp.get_output_details()[0]["index"])
    np.testing.assert_allclose(got, litert_outputs(data, [x])[0], rtol=1e-5, atol=1e-5)


def test_device_buffers_on_both_ends_make_no_host_copy(opencl, monkeypatch):
    import pyopencl as cl
    model = litegpu.CompiledModel.from_buffer(_chain_model(), backend="opencl")
    ins, outs = model.create_input_buffers(0), model.create_output_buffers(0)
    assert ins[0].is_device and outs[0].is_device
    x = np.random.default_rng(3).random((1, 32, 32, 16), np.float32)
    ins[0].write(x)
    copies = []
    real_copy = cl.enqueue_copy

    def counting_copy(queue, dest, src, **kw):
        copies.append((type(dest).__name__, type(src).__name__))
        return real_copy(queue, dest, src, **kw)

    monkeypatch.setattr(cl, "enqueue_copy", counting_copy)
    model.run_by_index(0, ins, outs)
    assert copies == []                              # the run itself copied nothing
    got = outs[0].read(x.size, np.float32).reshape(x.shape)
    assert len(copies) == 1                          # reading the output is the one copy
    np.testing.assert_allclose(got, _chain_reference(x, 4), rtol=1e-6, atol=1e-6)


def test_user_context_queue_and_buffers_are_used_in_place(opencl):
    import pyopencl as cl
    device = manager().backend("opencl").device_for(litegpu.backend.CompileOptions()).device
    ctx = cl.Context([device])
    queue = cl.CommandQueue(ctx)
    env = litegpu.Environment.create(opencl_context=ctx, opencl_queue=queue)
    model = litegpu.CompiledModel.from_buffer(_chain_model(), environment=env, backend="opencl")
    x = np.random.default_rng(4).random((1, 32, 32, 16), np.float32)
    mf = cl.mem_flags
    x_buf = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=x)
    y_buf = cl.Buffer(ctx, mf.READ_WRITE, x.nbytes)
    ins = [litegpu.TensorBuffer.create_from_opencl_buffer(x_buf, x.shape, np.float32, env)]
    outs = [litegpu.TensorBuffer.create_from_opencl_buffer(y_buf, x.shape, np.float32, env)]
    model.run_by_index(0, ins, outs)
    y = np.empty_like(x)
    cl.enqueue_copy(queue, y, y_buf)                 # the user's own buffer holds the result
    np.testing.assert_allclose(y, _chain_reference(x, 4), rtol=1e-6, atol=1e-6)


def test_wrapping_a_too_small_buffer_is_a_clear_error(opencl):
    import pyopencl as cl
    dev = manager().backend("opencl").device_for(litegpu.backend.CompileOptions())
    small = cl.Buffer(dev.context, cl.mem_flags.READ_WRITE, 16)
    with pytest.raises(litegpu.InvalidArgumentError, match="needs 64"):
        litegpu.TensorBuffer.create_from_opencl_buffer(small, (4, 4), np.float32)


def test_run_async_returns_before_the_model_finishes_and_the_host_works_meanwhile(opencl):
    shape, depth = (1, 256, 256, 64), 40          # ~4M elements x 80 ops: tens of ms on PoCL
    model = litegpu.CompiledModel.from_buffer(_chain_model(shape, depth), backend="opencl")
    ins, outs = model.create_input_buffers(0), model.create_output_buffers(0)
    x = np.random.default_rng(5).random(shape, np.float32)
    ins[0].write(x)
    model.run_by_index(0, ins, outs)              # warm up (first launches compile work-group code)
    start = time.perf_counter()
    event = model.run_async(0, ins, outs)
    returned = time.perf_counter() - start
    running_when_returned = not event.is_complete()
    host_result = float(np.sum(x[:, :8]))         # host work while the device computes
    host_done_before_model = not event.is_complete()
    assert outs[0].event is event
    got = outs[0].read(x.size, np.float32).reshape(shape)   # waits for the event
    assert event.is_complete()
    assert running_when_returned and host_done_before_model, f"run_async returned after {returned:.4f} s"
    assert host_result == pytest.approx(float(np.sum(x[:, :8])))
    np.testing.assert_allclose(got, _chain_reference(x, depth), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("wait_type", ["passive", "active"])
def test_both_wait_types_wait_for_the_run(opencl, wait_type):
    model = litegpu.CompiledModel.from_buffer(_chain_model(), backend="opencl")
    ins, outs = model.create_input_buffers(0), model.create_output_buffers(0)
    x = np.random.default_rng(6).random((1, 32, 32, 16), np.float32)
    ins[0].write(x)
    event = model.run_async(0, ins, outs)
    event.wait(wait_type)
    assert event.is_complete()
    np.testing.assert_allclose(outs[0].read(x.size, np.float32).reshape(x.shape), _chain_reference(x, 4),
                               rtol=1e-6, atol=1e-6)


def test_an_input_event_is_waited_for_and_runs_chain_on_the_device(opencl):
    """The second run takes the first run's output, with its event, as input: no host wait between."""
    model = litegpu.CompiledModel.from_buffer(_chain_model(depth=1), backend="opencl")
    a, b, c = model.create_input_buffers(0), model.create_output_buffers(0), model.create_output_buffers(0)
    x = np.random.default_rng(7).random((1, 32, 32, 16), np.float32) * 0.5
    a[0].write(x)
    first = model.run_async(0, a, b)
    second = model.run_async(0, b, c)             # b[0] carries ``first``
    assert b[0].event is first
    got = c[0].read(x.size, np.float32).reshape(x.shape)
    y = np.clip(x * x + x, 0, 6)
    np.testing.assert_allclose(got, np.clip(y * y + y, 0, 6), rtol=1e-6, atol=1e-6)
    assert second.is_complete()


def test_async_run_with_a_cpu_partition_in_the_middle_is_right(opencl):
    model = litegpu.CompiledModel.from_buffer(_split_model(), backend="opencl")
    ins, outs = model.create_input_buffers(0), model.create_output_buffers(0)
    x = np.random.default_rng(8).standard_normal((2, 8, 8, 4)).astype(np.float32)
    ins[0].write(x)
    event = model.run_async(0, ins, outs)
    got = outs[0].read(x.size, np.float32).reshape(x.shape)
    assert event.is_complete()
    np.testing.assert_allclose(got, litert_outputs(_split_model(), [x])[0], rtol=1e-5, atol=1e-5)


def test_without_an_opencl_platform_the_backend_says_why_and_models_run_on_cpu(opencl, tmp_path):
    """An empty ICD vendor folder stands for a machine without an OpenCL driver.

    ``OCL_ICD_VENDORS`` is read by the ocl-icd loader pyopencl links here; the test
    needs a working platform first, so that "unavailable" is known to come from the
    empty folder.
    """
    model = tmp_path / "m.tflite"
    model.write_bytes(_chain_model())
    vendors = tmp_path / "no_vendors"
    vendors.mkdir()
    env = dict(os.environ, OCL_ICD_VENDORS=str(vendors))
    env.pop("LITEGPU_OPENCL_PLATFORM", None)
    env.pop("LITEGPU_OPENCL_DEVICE", None)
    listing = subprocess.run([sys.executable, "-m", "litegpu.cli", "backends"], env=env,
                             capture_output=True, text=True, timeout=120)
    assert listing.returncode == 0, listing.stderr
    assert "opencl: unavailable: no OpenCL platform found" in listing.stdout, listing.stdout
    code = ("import litegpu, numpy as np\n"
            f"m = litegpu.CompiledModel.from_file({str(model)!r}, hardware_accel=litegpu.HardwareAccelerator.GPU)\n"
            "print('fully accelerated:', m.is_fully_accelerated())\n")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "no GPU backend is available; running on cpu" in run.stderr
    assert "fully accelerated: False" in run.stdout


@pytest.mark.parametrize("variable, value", [
    ("LITEGPU_OPENCL_DEVICE", "no-such-device"),
    ("LITEGPU_OPENCL_DEVICE", "99"),
    ("LITEGPU_OPENCL_PLATFORM", "no-such-platform"),
])
def test_a_device_variable_that_names_nothing_is_an_error_listing_what_exists(opencl, variable, value):
    """A misspelled device must stop the program, never move the work to the cpu quietly."""
    from litegpu_opencl.device import Device
    what = "device" if variable.endswith("DEVICE") else "platform"
    with pytest.raises(litegpu.InvalidArgumentError, match=f"{variable}.*{value}") as caught:
        Device.choose(**{what: value})
    listed = opencl.device_info()["device" if what == "device" else "platform"].split(" (")[0]
    assert f"0: {listed}" in str(caught.value)


def test_a_misspelled_device_variable_fails_every_way_of_asking_for_the_gpu(opencl, tmp_path):
    model = tmp_path / "m.tflite"
    model.write_bytes(_chain_model())
    env = dict(os.environ, LITEGPU_OPENCL_DEVICE="no-such-device")
    env.pop("LITEGPU_OPENCL_PLATFORM", None)
    attempts = {
        "delegate": "litegpu.load_delegate('opencl')",
        "backend": f"litegpu.CompiledModel.from_file({str(model)!r}, backend='opencl')",
        "GPU": f"litegpu.CompiledModel.from_file({str(model)!r}, hardware_accel=litegpu.HardwareAccelerator.GPU)",
    }
    for what, call in attempts.items():
        run = subprocess.run([sys.executable, "-c", f"import litegpu\n{call}\nprint('ran')"], env=env,
                             capture_output=True, text=True, timeout=120)
        assert run.returncode != 0 and "ran" not in run.stdout, (what, run.stdout, run.stderr[-2000:])
        assert "InvalidArgumentError: LITEGPU_OPENCL_DEVICE='no-such-device' matches no OpenCL device" \
            in run.stderr, (what, run.stderr[-2000:])
