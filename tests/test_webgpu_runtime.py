"""The webgpu backend's runtime: adapter and device, memory and copies, programs, events, errors.

The runtime is tested with kernels built by hand with the IR and rendered as WGSL, run
through a real partition's program (arenas, constants, input and output bindings,
precision modes) and through the partition-free ``run_kernels``; end to end, a model
runs through the Interpreter with the webgpu delegate and its generated kernels, and
must match cpu.

Runs on Mesa's lavapipe (Vulkan on the CPU) in CI; skipped, saying why, where wgpu or a
WebGPU adapter is missing, and failing instead where ``LITEGPU_TEST_REQUIRE`` names webgpu.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import litegpu
from litegpu.backend import HALF_ARITHMETIC, CompileOptions, device_is_cpu
from litegpu.codegen import ir
from litegpu.codegen.nodegen import Arg, KernelSpec, Precision
from litegpu.codegen.opencl import OPENCL
from litegpu.codegen.wgsl import WgslRenderer
from litegpu.errors import BackendUnavailableError, ExecutionError, InvalidArgumentError, KernelBuildError
from litegpu.plugins import manager
from litegpu.testing.builder import ModelBuilder

PRECISIONS = {"F32": (False, True), "F32_F16": (True, False), "F16": (True, True)}
TOLERANCE = {"F32": 1e-6, "F32_F16": 2e-3, "F16": 1e-2}
N = 999   # elements: odd, so half tensors are not a multiple of 4 bytes and offsets need aligning


@pytest.fixture
def device(webgpu):
    return webgpu.open_device()


def _options(precision: str = "F32") -> CompileOptions:
    half, arith = PRECISIONS[precision]
    return CompileOptions(precision_loss_allowed=half, extra={HALF_ARITHMETIC: arith})


def _skip_without_f16(device, precision: str) -> None:
    if precision != "F32" and not device.f16:
        pytest.skip(f"{device.name} has no shader-f16: no half storage or arithmetic in WGSL")


# -- kernels built by hand ---------------------------------------------------------------------------------

def _binary(op: str, precision: Precision, tensors: tuple[int, int, int], n: int = N,
            scale: np.ndarray | None = None) -> KernelSpec:
    """out = a <op> b (times a generator-made constant ``scale`` when given), one element per work-item."""
    b = ir.KernelBuilder()
    x, y = b.buffer(np.float32), b.buffer(np.float32)
    s = b.buffer(np.float32) if scale is not None else None
    out = b.buffer(np.float32, writes=True)
    i = b.let("i", b.global_id(0))
    value = {"+": x.load(i) + y.load(i), "*": x.load(i) * y.load(i), "-": x.load(i) - y.load(i)}[op]
    if s is not None:
        value = value * s.load(i)
    b.store(out, i, value)
    args = [Arg(tensor=tensors[0]), Arg(tensor=tensors[1])]
    if scale is not None:
        args.append(Arg(const=scale.astype(precision.storage_dtype(np.float32))))
    args.append(Arg(tensor=tensors[2]))
    return KernelSpec(WgslRenderer(precision).kernel(b.kernel((n,))).source, (n,), None, args)


def _chain_model(n: int = N) -> tuple[bytes, np.ndarray]:
    """t1 = x + c; t2 = x * x; t3 = t1 * t2; y = t3 - t1: an elementwise chain in which t1 and
    t2 live at once (one arena, two offsets) and t3 is written while both are read (another)."""
    mb = ModelBuilder()
    x = mb.input("x", (n,), np.float32)
    c = np.linspace(-1, 1, n).astype(np.float32)
    ct = mb.const("c", c)
    t1, t2, t3, y = (mb.tensor(name, (n,), np.float32) for name in ("t1", "t2", "t3", "y"))
    mb.op("ADD", [x, ct], [t1])
    mb.op("MUL", [x, x], [t2])
    mb.op("MUL", [t1, t2], [t3])
    mb.op("SUB", [t3, t1], [y])
    mb.output(y)
    return mb.build(), c


def _chain_partition():
    """The chain model's one GPU partition (planned as the C dialects plan it: no WGSL
    generator exists yet), one node per step; (partition, c, scale)."""
    from litegpu.codegen.offline import gpu_partitions
    from litegpu.model import load_model
    data, c = _chain_model()
    found, refusals = gpu_partitions(load_model(data), OPENCL)
    assert len(found) == 1, refusals
    partition = found[0][1]
    partition.steps = [[i] for i in range(len(partition.nodes))]
    return partition, c, np.linspace(0.5, 1.5, N).astype(np.float32)


def _chain_kernels(partition, scale: np.ndarray, broken: int | None = None):
    """The partition's kernels built by hand (the step ``broken`` does not compile)."""
    ops = {"ADD": "+", "MUL": "*", "SUB": "-"}

    def make(precision: Precision, dialect) -> list[list[KernelSpec]]:
        steps = []
        for k, ctx in enumerate(partition.nodes):
            a, b = ctx.node.inputs
            spec = _binary(ops[ctx.node.op], precision, (a, b, ctx.node.outputs[0]),
                           scale=scale if k == 2 else None)
            if k == broken:
                spec.source = spec.source.replace("return;", "undefined_name();")
            steps.append([spec])
        return steps
    return make


def _chain_reference(x: np.ndarray, c: np.ndarray, scale: np.ndarray, precision: str) -> np.ndarray:
    half = (lambda v: v.astype(np.float16).astype(np.float32)) if precision != "F32" else (lambda v: v)
    x, c, scale = half(x), half(c), half(scale)
    t1 = x + c
    return half(t1 * (x * x) * scale) - t1


def _device_tensor(webgpu, array: np.ndarray, options: CompileOptions):
    from litegpu.ops import TensorSpec
    tensor = webgpu.allocate(TensorSpec(array.shape, array.dtype), options)
    webgpu.copy_in(tensor, array)
    return tensor


def _read(webgpu, tensor) -> np.ndarray:
    out = np.empty(tensor.shape, tensor.dtype)
    webgpu.copy_out(tensor, out)
    return out


# -- the device ---------------------------------------------------------------------------------------------

def test_device_info_names_the_device_its_type_backend_features_and_binding_limits(webgpu, device):
    info = webgpu.device_info()
    for key in ("device", "type", "backend", "driver", "f16 (shader-f16)", "timestamps (timestamp-query)",
                "subgroups", "max storage buffer binding", "storage buffers per stage", "max workgroup size",
                "max workgroups per dimension", "storage offset alignment"):
        assert key in info, key
    assert info["type"] == ("CPU" if device.adapter.info["adapter_type"] == "CPU" else "GPU")
    # The device was asked for the adapter's storage-buffer limit, and kernels may bind that many.
    assert device.max_buffers == device.adapter.limits["max-storage-buffers-per-shader-stage"]
    assert webgpu.dialect_object().max_buffers == device.max_buffers == info["storage buffers per stage"]
    if "shader-f16" in device.adapter.features:
        assert device.f16 and info["f16 (shader-f16)"] == "yes"
    # Below opencl for "GPU" until kernels are ported; a CPU adapter (lavapipe) is not a "GPU".
    assert webgpu.gpu_priority < manager().backends["opencl"].gpu_priority
    assert device_is_cpu(webgpu) == (info["type"] == "CPU")


def test_litegpu_backends_shows_the_webgpu_device(webgpu, capsys):
    from litegpu.cli import main
    main(["backends"])
    out = capsys.readouterr().out
    section = out[out.index("webgpu: available"):]
    print(section)
    for line in ("    device: ", "    type: ", "    backend: ", "    storage buffers per stage: ",
                 "    max storage buffer binding: ", "    f16 (shader-f16): "):
        assert line in section, line


def test_an_adapter_or_backend_naming_nothing_here_lists_the_adapters(webgpu):
    import wgpu
    from litegpu_webgpu.device import choose_adapter
    with pytest.raises(InvalidArgumentError, match=r"LITEGPU_WEBGPU_ADAPTER='no such gpu' matches no WebGPU "
                                                   r"adapter; the adapters here: .+\(.+, .+\)"):
        choose_adapter(wgpu, "no such gpu", None)
    with pytest.raises(InvalidArgumentError, match="use one of Vulkan, Metal, D3D12, GL"):
        choose_adapter(wgpu, None, "vulcan")
    backend_type = webgpu.open_device().adapter.info["backend_type"]
    picked = choose_adapter(wgpu, webgpu.open_device().name[:6], "GL" if backend_type == "OpenGL" else backend_type)
    assert picked.info["backend_type"] == backend_type


def test_without_wgpu_or_an_adapter_the_backend_is_unavailable_saying_how_to_get_one(monkeypatch):
    from litegpu_webgpu import device as webgpu_device
    from litegpu_webgpu.backend import WebGpuBackend
    monkeypatch.setitem(sys.modules, "wgpu", None)   # import wgpu now raises ImportError
    with pytest.raises(BackendUnavailableError, match=r"wgpu is not installed .*pip install"):
        webgpu_device.import_wgpu()

    class NoAdapters:
        class gpu:
            @staticmethod
            def request_adapter_sync(**_):
                return None
    with pytest.raises(BackendUnavailableError, match="no WebGPU adapter; install .*mesa-vulkan-drivers"):
        webgpu_device.choose_adapter(NoAdapters, None, None)

    def no_device():
        raise BackendUnavailableError("no WebGPU adapter")
    monkeypatch.setattr(WebGpuBackend, "open_device", lambda self: no_device())
    assert WebGpuBackend().available() == (False, "no WebGPU adapter")


def test_f16_runs_only_where_the_device_has_shader_f16_and_the_summary_says_so():
    from litegpu_webgpu.program import precision_for

    class NoF16:
        f16 = False

    class F16:
        f16 = True
    assert precision_for(F16, _options("F32"))[0].name == "F32"
    assert precision_for(F16, _options("F16"))[0].name == "F16"
    assert precision_for(F16, _options("F32_F16"))[0].name == "F32_F16"
    precision, note = precision_for(NoF16, _options("F16"))
    assert precision.name == "F32" and "no shader-f16" in note


# -- memory and copies --------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype, storage", [(np.uint8, np.uint32), (np.bool_, np.uint32), (np.int8, np.int32),
                                            (np.int16, np.int32), (np.int32, np.int32), (np.float32, np.float32)])
def test_copies_widen_small_integers_and_bool_to_32_bits_and_narrow_them_back(webgpu, device, dtype, storage):
    rng = np.random.default_rng(0)
    info = np.iinfo(dtype) if np.dtype(dtype).kind in "iu" else None
    values = (rng.random(7) > 0.5 if dtype == np.bool_ else
              rng.integers(info.min, info.max, 7, endpoint=True).astype(dtype) if info else
              rng.standard_normal(7).astype(dtype))
    tensor = _device_tensor(webgpu, values, _options())
    assert tensor.storage == np.dtype(storage) and tensor.buffer.size % 4 == 0
    raw = np.frombuffer(device.queue.read_buffer(tensor.buffer), storage)[:7]
    np.testing.assert_array_equal(raw, values.astype(storage))     # widened in device memory
    got = _read(webgpu, tensor)
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, values)


def test_half_storage_pads_an_odd_number_of_halves_to_4_bytes(webgpu, device):
    _skip_without_f16(device, "F16")
    values = np.array([1.5, -2.25, 65504.0], np.float32)
    tensor = _device_tensor(webgpu, values, _options("F16"))
    assert tensor.storage == np.float16 and tensor.buffer.size == 8
    np.testing.assert_array_equal(_read(webgpu, tensor), values)


# -- kernels through the partition-free path ----------------------------------------------------------------

def test_run_kernels_reads_uint8_and_writes_bool_at_a_binding_offset(device):
    from litegpu_webgpu.dispatch import run_kernels
    from litegpu_webgpu.tensor import WgpuTensor, new_tensor, read, write
    b = ir.KernelBuilder()
    x, doubled, flag = b.buffer(np.uint8), b.buffer(np.uint8, writes=True), b.buffer(np.bool_, writes=True)
    i = b.let("i", b.global_id(0))
    v = b.let("v", x.load(i).cast(ir.INT))
    b.store(doubled, i, ((v * 2) % 256).cast(ir.UCHAR))
    b.store(flag, i, ir.select(v > 100, ir.lit(1, ir.UCHAR), ir.lit(0, ir.UCHAR)))
    n = 300
    spec = KernelSpec(WgslRenderer(Precision()).kernel(b.kernel((n,))).source, (n,), None, [])
    values = np.random.default_rng(1).integers(0, 256, n).astype(np.uint8)
    # The input lives at an aligned offset inside a larger buffer.
    offset = device.offset_alignment * 3
    big = new_tensor(device, Precision(), (offset // 4 + n,), np.uint8)
    xs = WgpuTensor(big.buffer, (n,), np.dtype(np.uint8), np.dtype(np.uint32), device, offset)
    write(xs, values)
    ys, flags = new_tensor(device, Precision(), (n,), np.uint8), new_tensor(device, Precision(), (n,), np.bool_)
    event = run_kernels(device, [(spec, [xs, ys, flags])])
    event.wait()
    assert event.is_complete()
    got_y, got_flag = np.empty(n, np.uint8), np.empty(n, np.bool_)
    read(ys, got_y)
    read(flags, got_flag)
    np.testing.assert_array_equal(got_y, (values.astype(np.int32) * 2 % 256).astype(np.uint8))
    np.testing.assert_array_equal(got_flag, values > 100)
    with pytest.raises(InvalidArgumentError, match="not a multiple of"):
        run_kernels(device, [(spec, [WgpuTensor(big.buffer, (n,), np.dtype(np.uint8), np.dtype(np.uint32), device,
                                                4), ys, flags])])


def test_events_complete_in_order_and_fences_are_reused(device):
    from litegpu_webgpu.dispatch import run_kernels
    from litegpu_webgpu.tensor import new_tensor, read, write
    b = ir.KernelBuilder()
    acc = b.buffer(np.float32, writes=True)
    i = b.let("i", b.global_id(0))
    b.store(acc, i, acc.load(i) + 1.0)
    n = 1 << 16
    spec = KernelSpec(WgslRenderer(Precision()).kernel(b.kernel((n,))).source, (n,), None, [])
    tensor = new_tensor(device, Precision(), (n,), np.float32)
    write(tensor, np.zeros(n, np.float32))
    events = [run_kernels(device, [(spec, [tensor])]) for _ in range(40)]   # none waited for
    events[-1].wait()
    assert all(e.is_complete() for e in events)   # the queue ran them in order
    out = np.empty(n, np.float32)
    read(tensor, out)
    assert (out == 40).all()
    # The finished runs' fences went back to the pool: a new run takes one, makes none.
    free_before = len(device.fences._free)
    run_kernels(device, [(spec, [tensor])]).wait()
    assert free_before >= 1 and len(device.fences._free) == free_before



def test_alternating_bindings_reuse_their_bind_groups(device):
    """A decoder's steps alternate two KV caches: each launch keeps the bind groups of its
    last two bindings, and a third binding makes a new one in place of the oldest."""
    from litegpu_webgpu.dispatch import Binding, Launch, groups_of, run_kernels, submit
    from litegpu_webgpu.tensor import new_tensor, read, write
    b = ir.KernelBuilder()
    acc = b.buffer(np.float32, writes=True)
    i = b.let("i", b.global_id(0))
    b.store(acc, i, acc.load(i) + 1.0)
    n = 256
    spec = KernelSpec(WgslRenderer(Precision()).kernel(b.kernel((n,))).source, (n,), None, [])
    tensors = [new_tensor(device, Precision(), (n,), np.float32) for _ in range(3)]
    for t in tensors:
        write(t, np.zeros(n, np.float32))
    run_kernels(device, [(spec, [tensors[0]])]).wait()     # (builds the pipeline)
    launch = Launch(device.pipelines.get(spec.source), groups_of(spec, device), [None], io=[(0, 0)])
    groups = []
    for t in (0, 1, 0, 1, 2, 0):
        launch.bind(0, Binding(tensors[t].buffer, tensors[t].offset, tensors[t].binding_size))
        groups.append(launch.bind_group(device))
        submit(device, [launch]).wait()
    assert groups[0] is groups[2] and groups[1] is groups[3] and groups[0] is not groups[1]
    assert groups[4] not in groups[:4] and groups[5] is not groups[0]     # the oldest went
    for t, runs in zip(tensors, (4, 2, 1)):     # (the first ran once more, building the pipeline)
        out = np.empty(n, np.float32)
        read(t, out)
        assert (out == runs).all()


# -- a real partition's program ---------------------------------------------------------------------------

@pytest.mark.parametrize("precision", ["F32", "F32_F16", "F16"])
def test_a_partition_runs_hand_built_kernels_through_its_arenas_constants_and_bindings(webgpu, device, precision):
    from litegpu_webgpu.program import WebGpuProgram
    _skip_without_f16(device, precision)
    partition, c, scale = _chain_partition()
    options = _options(precision)
    program = WebGpuProgram(device, partition, options, kernels=_chain_kernels(partition, scale))
    assert program.precision.name == precision and precision in program.summary
    # t1 and t2 live at once in one arena at aligned offsets; t3, written while t1 and t2
    # are read, lives in another (a dispatch may not bind one buffer read-only and writable).
    t1, t2, t3 = (ctx.node.outputs[0] for ctx in partition.nodes[:3])
    placement = program.arena.placement
    assert placement[t1][0] == placement[t2][0] != placement[t3][0]
    assert {placement[t1][1], placement[t2][1]} != {0} and all(
        off % device.offset_alignment == 0 for _, off in placement.values())
    assert len(program.launches) == 4 and program.const_bytes > 0
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal(N).astype(np.float32) for _ in range(2)]
    outs = [_device_tensor(webgpu, np.zeros(N, np.float32), options) for _ in range(2)]
    for x, out in zip(xs, outs):    # the second run binds another input and output
        event = program.run([_device_tensor(webgpu, x, options)], [out])
        event.wait()
        got = _read(webgpu, out)
        want = _chain_reference(x, c, scale, precision)
        tol = TOLERANCE[precision]
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())


def test_a_kernel_that_does_not_build_names_its_node_and_op_and_keeps_source_and_log(device, tmp_path, monkeypatch):
    from litegpu_webgpu.program import WebGpuProgram
    monkeypatch.setenv("LITEGPU_CACHE_DIR", str(tmp_path))
    partition, _, scale = _chain_partition()
    with pytest.raises(KernelBuildError) as caught:
        WebGpuProgram(device, partition, _options(), kernels=_chain_kernels(partition, scale, broken=2))
    error = caught.value
    ctx = partition.nodes[2]
    assert error.node == ctx.node.index and error.op == ctx.node.op == "MUL"
    assert f"node {ctx.node.index} (MUL)" in str(error)
    source = Path(error.source_path)
    assert source.suffix == ".wgsl" and "undefined_name()" in source.read_text()
    assert "undefined_name" in error.log and source.with_suffix(".log").read_text() == error.log


def test_an_input_of_the_wrong_storage_is_refused_naming_the_tensor(webgpu, device):
    from litegpu_webgpu.program import WebGpuProgram
    partition, _, scale = _chain_partition()
    program = WebGpuProgram(device, partition, _options(), kernels=_chain_kernels(partition, scale))
    wrong = _device_tensor(webgpu, np.zeros(N, np.int32), _options())
    out = _device_tensor(webgpu, np.zeros(N, np.float32), _options())
    with pytest.raises(InvalidArgumentError, match=f"tensor {partition.inputs[0]}: .*int32"):
        program.run([wrong], [out])


# -- zero copy ----------------------------------------------------------------------------------------------

def test_a_users_gpu_buffers_are_wrapped_and_used_in_place(webgpu, device):
    import wgpu
    from litegpu_webgpu.program import WebGpuProgram
    partition, c, scale = _chain_partition()
    program = WebGpuProgram(device, partition, _options(), kernels=_chain_kernels(partition, scale))
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
    x = np.random.default_rng(3).standard_normal(N).astype(np.float32)
    x_buf = device.device.create_buffer_with_data(data=x, usage=usage)
    y_buf = device.device.create_buffer(size=x.nbytes, usage=usage)
    ins = litegpu.TensorBuffer.create_from_device_buffer(x_buf, x.shape, np.float32, "webgpu")
    outs = litegpu.TensorBuffer.create_from_device_buffer(y_buf, x.shape, np.float32, "webgpu")
    assert ins.device[1].buffer is x_buf
    program.run([ins.device[1]], [outs.device[1]]).wait()
    y = np.frombuffer(device.queue.read_buffer(y_buf), np.float32)   # the user's own buffer holds the result
    np.testing.assert_allclose(y, _chain_reference(x, c, scale, "F32"), rtol=1e-6, atol=1e-6)
    small = device.device.create_buffer(size=16, usage=usage)
    with pytest.raises(InvalidArgumentError, match="needs 64"):
        litegpu.TensorBuffer.create_from_device_buffer(small, (4, 4), np.float32, "webgpu")
    readonly = device.device.create_buffer(size=64, usage=wgpu.BufferUsage.STORAGE)
    with pytest.raises(InvalidArgumentError, match="lacks STORAGE, COPY_SRC or COPY_DST"):
        litegpu.TensorBuffer.create_from_device_buffer(readonly, (4, 4), np.float32, "webgpu")
    with pytest.raises(InvalidArgumentError, match="is not a wgpu.GPUBuffer"):
        litegpu.TensorBuffer.create_from_device_buffer(np.zeros(16, np.float32), (4, 4), np.float32, "webgpu")


def test_a_users_own_device_runs_the_program_and_refuses_buffers_of_another(webgpu, device):
    import wgpu
    from litegpu_webgpu.program import WebGpuProgram
    mine = device.adapter.request_device_sync()
    env = litegpu.Environment.create(webgpu_device=mine)
    options = CompileOptions(extra=dict(env.options))
    assert webgpu.device_for(options).device is mine and webgpu.device_for(options) is webgpu.device_for(options)
    partition, c, scale = _chain_partition()
    program = WebGpuProgram(webgpu.device_for(options), partition, options, kernels=_chain_kernels(partition, scale))
    x = np.random.default_rng(6).standard_normal(N).astype(np.float32)
    ins, outs = _device_tensor(webgpu, x, options), _device_tensor(webgpu, np.zeros(N, np.float32), options)
    assert ins.device.device is mine
    program.run([ins], [outs]).wait()
    np.testing.assert_allclose(_read(webgpu, outs), _chain_reference(x, c, scale, "F32"), rtol=1e-6, atol=1e-6)
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
    foreign = device.device.create_buffer(size=64, usage=usage)
    with pytest.raises(InvalidArgumentError, match="another WebGPU device"):
        litegpu.TensorBuffer.create_from_device_buffer(foreign, (16,), np.float32, "webgpu", env)
    with pytest.raises(InvalidArgumentError, match="must be a wgpu.GPUDevice"):
        webgpu.device_for(CompileOptions(extra={"webgpu_device": "gpu0"}))


# -- end to end ----------------------------------------------------------------------------------------------

def _interpreter_outputs(data: bytes, x: np.ndarray, delegate: str | None) -> tuple[np.ndarray, object]:
    delegates = [litegpu.load_delegate(delegate)] if delegate else None
    interp = litegpu.Interpreter(model_content=data, experimental_delegates=delegates)
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    return interp.get_tensor(interp.get_output_details()[0]["index"]), interp.get_delegation_report()


def test_a_model_through_the_webgpu_delegate_matches_cpu_and_the_report_says_where_each_node_ran(webgpu):
    data, c = _chain_model()
    x = np.random.default_rng(4).standard_normal(N).astype(np.float32)
    want, _ = _interpreter_outputs(data, x, None)
    got, report = _interpreter_outputs(data, x, "webgpu")
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert report.nodes_on("webgpu") == len(report.assignments), report


@pytest.mark.parametrize("precision", ["F32", "F16"])
def test_generated_wgsl_kernels_run_a_model_end_to_end_on_device_buffers(webgpu, device, precision):
    _skip_without_f16(device, precision)
    data, c = _chain_model()
    x = np.random.default_rng(7).standard_normal(N).astype(np.float32)
    want, _ = _interpreter_outputs(data, x, None)
    interp = litegpu.Interpreter(model_content=data, experimental_delegates=[
        litegpu.load_delegate("webgpu", {"precision_loss_allowed": precision != "F32"})])
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    got = interp.get_tensor(interp.get_output_details()[0]["index"])
    report = interp.get_delegation_report()
    assert report.nodes_on("webgpu") == 4, report
    assert any(precision in line for line in report.programs), report.programs
    tol = TOLERANCE[precision] * 10
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())
    # Device tensor buffers on both ends, run asynchronously.
    model = litegpu.CompiledModel.from_buffer(data, backend="webgpu")
    ins, outs = model.create_input_buffers(0), model.create_output_buffers(0)
    assert ins[0].is_device and outs[0].is_device
    ins[0].write(x)
    event = model.run_async(0, ins, outs)
    event.wait()
    np.testing.assert_allclose(outs[0].read(N, np.float32), want, rtol=1e-6, atol=1e-6)


def test_a_tensor_over_the_binding_limit_is_declined_with_its_reason_and_runs_on_cpu(webgpu, device, monkeypatch):
    monkeypatch.setitem(device.limits, "max-storage-buffer-binding-size", 1024)
    data, _ = _chain_model()
    x = np.random.default_rng(5).standard_normal(N).astype(np.float32)
    want, _ = _interpreter_outputs(data, x, None)
    got, report = _interpreter_outputs(data, x, "webgpu")
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert report.nodes_on("webgpu") == 0
    assert all("maxStorageBufferBindingSize" in a.reason for a in report.assignments), report


# -- litegpu compile --out --------------------------------------------------------------------------------------

def test_compile_out_writes_each_programs_modules_checked_on_the_device(webgpu, tmp_path):
    """``litegpu compile --backend webgpu --out``: one .wgsl per program, its modules each
    under a ``// kernel k_<digest>`` line, every one built on the device; a module naga
    refuses makes offline_build raise with naga's message."""
    from litegpu.cli import main
    from litegpu.codegen.wgsl import MODULE_MARK, modules
    model = tmp_path / "chain.tflite"
    model.write_bytes(_chain_model()[0])
    assert main(["compile", str(model), "--backend", "webgpu", "--out", str(tmp_path / "out")]) == 0
    (source,) = sorted((tmp_path / "out").glob("webgpu.F32.*.wgsl"))
    found = modules(source.read_text())
    assert found and all(m.startswith(MODULE_MARK + "k_") and "fn main(" in m for m in found)
    assert webgpu.offline_build(source.read_text()) == {}
    broken = found[0].replace("fn main(", "fn main(oops: u32, ")
    with pytest.raises(Exception, match="(?i)entry|argument|binding|invalid|error"):
        webgpu.offline_build("\n".join([found[0], broken]))


# -- a lost device (last: it destroys the module's device) ------------------------------------------------------

def test_a_lost_device_is_a_clear_error_and_the_next_model_gets_a_new_device(webgpu, device):
    from litegpu_webgpu.program import WebGpuProgram
    partition, c, scale = _chain_partition()
    program = WebGpuProgram(device, partition, _options(), kernels=_chain_kernels(partition, scale))
    x = _device_tensor(webgpu, np.ones(N, np.float32), _options())
    y = _device_tensor(webgpu, np.zeros(N, np.float32), _options())
    device.device.destroy()
    with pytest.raises(ExecutionError, match="was lost .*create the model again"):
        program.run([x], [y]).wait()
    assert device.lost
    fresh = webgpu.open_device()
    assert fresh is not device and not fresh.lost
    program = WebGpuProgram(fresh, partition, _options(), kernels=_chain_kernels(partition, scale))
    x = _device_tensor(webgpu, np.ones(N, np.float32), _options())
    y = _device_tensor(webgpu, np.zeros(N, np.float32), _options())
    program.run([x], [y]).wait()
    np.testing.assert_allclose(_read(webgpu, y), _chain_reference(np.ones(N, np.float32), c, scale, "F32"),
                               rtol=1e-6, atol=1e-6)


def _exact_fma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 ``a * b + c`` rounded once: the product is exact in float64, the float64
    sum's rounding error comes from a two-sum, and where that sum is exactly halfway
    between two float32 values its error breaks the tie."""
    a, b, c = (v.astype(np.float64) for v in (a, b, c))
    product = a * b
    total = product + c
    back = total - product
    error = (product - (total - back)) + (c - back)
    nearest = total.astype(np.float32)
    for direction, sign in ((-np.inf, -1), (np.inf, 1)):
        neighbour = np.nextafter(nearest, np.float32(direction))
        halfway = (nearest.astype(np.float64) + neighbour) / 2
        nearest = np.where((total == halfway) & (np.sign(error) == sign), neighbour, nearest)
    return nearest


def _fma_cases(count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random triples, half with ``c`` cancelling the product to a millionth (where an
    unfused product and sum loses every digit), a quarter whose products are a float32 tie
    away from ``c``; the last 240 are sums just past a tie only rounding to odd gets right
    (``c`` plus a product a hair above half of ``c``'s ulp, at scales 2^-20 .. 2^19)."""
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((2, count)).astype(np.float32)
    c = rng.standard_normal(count).astype(np.float32)
    half = count // 2
    c[:half] = (-(a[:half].astype(np.float64) * b[:half]) * (1 + 1e-6 * rng.standard_normal(half))).astype(np.float32)
    ties = slice(half, half + count // 4)
    a[ties] = b[ties] = 1 + rng.integers(0, 2 ** 11, count // 4) * 2.0 ** -12
    c[ties] = rng.integers(-4, 4, count // 4) * 2.0 ** -23
    scale, step, sign = (v.ravel() for v in np.meshgrid(np.arange(-20, 20), np.arange(1, 4), [1.0, -1.0],
                                                       indexing="ij"))
    past = slice(count - scale.size, count)
    a[past] = sign * 2.0 ** (scale - 12) * (1 + 2.0 ** -12 + step * 2.0 ** -23)
    b[past] = 2.0 ** -12 * (1 - 2.0 ** -12)
    c[past] = sign * 2.0 ** scale
    return a, b, c


@pytest.mark.parametrize("fused", [True, False])
def test_fma_rounds_once_whether_the_device_fuses_it_or_not(device, fused):
    """Kernels' ``fma`` is a * b + c rounded once, as XNNPACK's kernels compute it: the
    device's own where it fuses, else the emulation (:data:`litegpu.codegen.wgsl.EXACT_FMA`).
    lavapipe's is a product then a sum, which the probe finds; forced onto its builtin
    fma, it rounds twice and this fails."""
    from litegpu_webgpu.dispatch import run_kernels
    from litegpu_webgpu.tensor import new_tensor, read, write
    if fused and not device.fma_is_fused:
        pytest.skip(f"{device.name} computes fma as a product then a sum: its builtin is not tested as exact")
    b = ir.KernelBuilder()
    x, y, z, out = b.buffer(np.float32), b.buffer(np.float32), b.buffer(np.float32), b.buffer(np.float32, writes=True)
    i = b.let("i", b.global_id(0))
    b.store(out, i, ir.call("fma", x.load(i), y.load(i), z.load(i)))
    n = 1 << 14
    source = WgslRenderer(Precision(), fused_fma=fused).kernel(b.kernel((n,))).source
    assert ("fn fma_f32(" in source) != fused
    operands = _fma_cases(n)
    tensors = [new_tensor(device, Precision(), (n,), np.float32) for _ in range(4)]
    for tensor, values in zip(tensors, operands):
        write(tensor, values)
    run_kernels(device, [(KernelSpec(source, (n,), None, []), tensors)]).wait()
    got = np.empty(n, np.float32)
    read(tensors[3], got)
    np.testing.assert_array_equal(got.view(np.int32), _exact_fma(*operands).view(np.int32))


def test_the_device_says_whether_its_fma_is_fused(device):
    assert device.dialect.fused_fma == device.fma_is_fused
    assert device.info()["fma"].startswith("fused" if device.fma_is_fused else "a product then a sum")
    if device.is_cpu and "llvmpipe" in device.name:
        assert not device.fma_is_fused      # Mesa's lavapipe: what CI runs on
