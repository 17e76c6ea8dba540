"""Kernels written once with :mod:`litegpu.codegen.ir`, rendered for every API, run on real drivers.

Each kernel here is built with the :class:`KernelBuilder` and compared with numpy:
rendered as OpenCL C and run on the OpenCL device (PoCL in CI), rendered as WGSL and run
through wgpu (lavapipe in CI), in F32, F32_F16 and F16; rendered as CUDA C++ and compiled
to PTX by NVRTC, and as MSL and type-checked by clang++ (no device for those two here).
"""
from __future__ import annotations

import math

import numpy as np
import pytest
from test_cuda_source import nvrtc_available, nvrtc_check  # noqa: F401 - a fixture used below
from test_metal_source import clang_check, clangxx  # noqa: F401 - a fixture used below

from litegpu.codegen import ir
from litegpu.codegen.crender import CRenderer
from litegpu.codegen.dialects import DIALECTS
from litegpu.codegen.nodegen import Precision
from litegpu.codegen.wgsl import WgslRenderer

PRECISIONS = {"F32": Precision(), "F32_F16": Precision(half_storage=True),
              "F16": Precision(half_storage=True, half_arith=True)}
F32 = np.float32


# -- the kernels: (builder function, inputs, numpy reference, tolerance in F32) -----------------------

def _nan_clamp_bias(n: int = 1000, channels: int = 7):
    """y = relu6(a * x + b[i % C]) letting NaN through (XNNPACK's clamp), 1-D, guarded."""
    b = ir.KernelBuilder()
    x, bias, y = b.buffer(np.float32), b.buffer(np.float32), b.buffer(np.float32, writes=True)
    i = b.let("i", b.global_id(0))
    v = b.let("v", x.load(i) * 1.5 + bias.load(i % channels), ir.REAL)
    lo = b.let("lo", ir.select(v < 0.0, 0.0, v), ir.REAL)
    b.store(y, i, ir.select(ir.call("isnan", v), v, ir.select(lo > 6.0, 6.0, lo)))
    rng = np.random.default_rng(0)
    xs = (rng.standard_normal(n) * 4).astype(F32)
    xs[::17] = np.nan
    xs[5], xs[6] = np.inf, -np.inf
    bs = rng.standard_normal(channels).astype(F32)

    def reference(xs, bs):
        v = xs * F32(1.5) + bs[np.arange(n) % channels]
        return np.where(np.isnan(v), v, np.clip(v, 0, 6)).astype(F32)
    return b.kernel((n,)), [xs, bs], reference


def _vec4_math(n: int = 256):
    """Four lanes per work-item: loads, stores, lanes, a vector built from lanes, math calls."""
    b = ir.KernelBuilder()
    x, y = b.buffer(np.float32), b.buffer(np.float32, writes=True)
    base = b.let("base", b.global_id(0) * 4)
    v = b.let("v", x.load(base, lanes=4), ir.REAL4)
    swapped = b.let("sw", ir.vector(ir.REAL4, v.lane(1), v.lane(0), v.lane(3), v.lane(2)), ir.REAL4)
    out = ir.call("fabs", swapped) * 0.5 + ir.call("floor", v) - ir.call("clamp", v, -1.0, 1.0)
    b.store(y, base, out)
    xs = (np.random.default_rng(1).standard_normal(n) * 3).astype(F32)

    def reference(xs):
        s = xs.reshape(-1, 4)[:, [1, 0, 3, 2]].reshape(-1)
        return (np.abs(s) * F32(0.5) + np.floor(xs) - np.clip(xs, -1, 1)).astype(F32)
    return b.kernel((n // 4,)), [xs], reference


def _row_sums(rows: int = 5, length: int = 300, group: int = 64):
    """Each group sums one row: a strided loop into local memory, barriers, a tree reduction."""
    b = ir.KernelBuilder()
    x, y = b.buffer(np.float32), b.buffer(np.float32, writes=True)
    part = b.local_array("part", ir.FLOAT, group)
    row, lid = b.let("row", b.group_id(0)), b.let("lid", b.local_id(0))
    acc = b.var("acc", 0.0, ir.FLOAT)
    with b.for_("k", lid, length, group) as k:
        b.assign(acc, x.load(row * length + k, as_float=True), "+")
    b.local_store(part, lid, acc)
    b.barrier()
    step = group // 2
    while step:
        with b.if_(lid < step):
            b.local_store(part, lid, part.load(lid) + part.load(lid + step))
        b.barrier()
        step //= 2
    with b.if_(lid.eq(0)):
        b.store(y, row, part.load(0).cast(ir.REAL))
    xs = np.random.default_rng(2).random(rows * length).astype(F32)
    return b.kernel((rows * group,), (group,)), [xs], lambda xs: xs.reshape(rows, length).sum(1, dtype=F32)


def _integers(n: int = 300):
    """Integer and bool tensors: i % 3, a comparison stored as a byte, shifts, an if/else."""
    b = ir.KernelBuilder()
    x = b.buffer(np.int32)
    mod, flag = b.buffer(np.int32, writes=True), b.buffer(np.bool_, writes=True)
    i = b.let("i", b.global_id(0))
    v = b.let("v", x.load(i))
    b.store(mod, i, (v % 3) + (v >> 2) - (i << 1))
    with b.if_(v > 10):
        b.store(flag, i, ir.lit(1, ir.UCHAR))
    with b.else_():
        b.store(flag, i, ir.select(v < -10, ir.lit(1, ir.UCHAR), ir.lit(0, ir.UCHAR)))
    xs = np.random.default_rng(3).integers(-100, 100, n).astype(np.int32)

    def reference(xs):
        idx = np.arange(n, dtype=np.int32)
        rem = np.fmod(xs, 3).astype(np.int32)   # C's remainder truncates
        return [rem + (xs >> 2) - (idx << 1), (np.abs(xs) > 10)]
    return b.kernel((n,)), [xs], reference


def _library(n: int = 400):
    """The functions a renderer spells differently: expm1, round (half away), rint (half to
    even), fmod, rsqrt, isinf, and literals of infinity and NaN."""
    b = ir.KernelBuilder()
    x, y = b.buffer(np.float32), b.buffer(np.float32, writes=True, full_precision=True)
    i = b.let("i", b.global_id(0))
    v = b.let("v", x.load(i), ir.REAL)
    which = b.let("w", i % 6)
    out = b.var("o", 0.0, ir.REAL)
    with b.if_(which.eq(0)):
        b.assign(out, ir.call("expm1", v * 0.001))
    with b.if_(which.eq(1)):
        b.assign(out, ir.call("round", v) - ir.call("rint", v))
    with b.if_(which.eq(2)):
        b.assign(out, ir.call("fmod", v, 1.75))
    with b.if_(which.eq(3)):
        b.assign(out, ir.call("rsqrt", ir.call("fabs", v) + 1.0))
    with b.if_(which.eq(4)):
        b.assign(out, ir.select(ir.call("isinf", v), ir.lit(math.inf, ir.REAL), ir.lit(math.nan, ir.REAL)))
    with b.if_(which.eq(5)):
        b.assign(out, ir.call("fmax", v, -0.5) * ir.call("sign", v))
    b.store(y, i, out)
    rng = np.random.default_rng(4)
    xs = (rng.integers(-40, 40, n) * 0.5 + rng.standard_normal(n) * (rng.random(n) < 0.5)).astype(F32)
    xs[4::60], xs[34::60] = np.inf, -np.inf

    def reference(xs):
        w = np.arange(n) % 6
        v = xs.astype(np.float64)
        round_away = np.sign(v) * np.floor(np.abs(v) + 0.5)
        outs = [np.expm1(v * 0.001), round_away - np.rint(v), np.fmod(v, 1.75), 1 / np.sqrt(np.abs(v) + 1),
                np.where(np.isinf(xs), np.inf, np.nan), np.maximum(v, -0.5) * np.sign(v)]
        return np.choose(w, outs).astype(F32)
    return b.kernel((n,)), [xs], reference


def _xnn_totals_shared(rows: int = 6, length: int = 300, group: int = 64):
    """XNNPACK's row sums (rsum2 of squares, radd) by a work-group, each accumulator lane a
    work-item's, minus the same sums by one work-item: exactly 0 (the values span eight
    decades, so another order of additions would show)."""
    from litegpu.codegen.kernels.pool import xnn_row_total, xnn_row_total_shared
    b = ir.KernelBuilder()
    x, y = b.buffer(np.float32), b.buffer(np.float32, writes=True)
    row, lid = b.let("row", b.group_id(0)), b.let("lid", b.local_id(0))
    base = b.let("base", row * length)
    for j, kind in enumerate(("rsum2", "radd")):
        shared = b.let(f"shared_{kind}", xnn_row_total_shared(b, lambda i: x.load(i, as_float=True), base, length,
                                                              kind, lid, group), ir.FLOAT)
        with b.if_(lid.eq(0)):
            single = b.let(f"single_{kind}", xnn_row_total(b, lambda i, n: x.load(i, n, as_float=True), base, length,
                                                           kind), ir.FLOAT)
            b.store(y, row * 2 + j, (shared - single).cast(ir.REAL))
    rng = np.random.default_rng(8)
    # (at most 6e4: half storage holds them)
    xs = (np.clip(np.exp(rng.normal(0, 2.5, rows * length)), 1e-4, 6e4) * rng.choice([-1, 1], rows * length))
    xs = xs.astype(F32)
    return b.kernel((rows * group,), (group,)), [xs], lambda xs: np.zeros(rows * 2, F32)


KERNELS = {"nan_clamp_bias": _nan_clamp_bias, "vec4_math": _vec4_math, "row_sums": _row_sums,
           "integers": _integers, "library": _library, "xnn_totals_shared": _xnn_totals_shared}
# Relative tolerance per precision mode (half storage rounds inputs to 11 bits).
TOLERANCE = {"F32": 2e-6, "F32_F16": 2e-3, "F16": 1e-2}


def _assert_matches(got: list[np.ndarray], want, precision: str, name: str) -> None:
    want = want if isinstance(want, list) else [want]
    for g, w in zip(got, want):
        w = np.asarray(w)
        if w.dtype.kind != "f":
            np.testing.assert_array_equal(g.astype(w.dtype), w, err_msg=name)
            continue
        g = g.astype(np.float32)
        assert np.array_equal(np.isnan(g), np.isnan(w)), f"{name}: NaN at {np.argwhere(np.isnan(g) != np.isnan(w))[:5]}"
        assert np.array_equal(np.isinf(g), np.isinf(w)) and np.array_equal(g[np.isinf(g)], w[np.isinf(w)]), name
        finite = np.isfinite(w)
        tol = TOLERANCE[precision]
        np.testing.assert_allclose(g[finite], w[finite], rtol=tol, atol=tol * max(1.0, np.abs(w[finite]).max()),
                                   err_msg=f"{name} ({precision})")


def _host_inputs(inputs: list[np.ndarray], precision: Precision) -> list[np.ndarray]:
    """Inputs as the kernel sees them: float inputs rounded to half in half storage."""
    return [x.astype(np.float16).astype(F32) if precision.half_storage and x.dtype == F32 else x for x in inputs]


# -- OpenCL ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cl_device(opencl):
    from litegpu_opencl.device import default_device
    return default_device()


def _storage(buffer: ir.Buffer, precision: Precision) -> np.dtype:
    return precision.storage_dtype(buffer.dtype, buffer.full_precision)


def _run_opencl(device, kernel: ir.Kernel, inputs, precision: Precision) -> list[np.ndarray]:
    cl = device.cl
    renderer = CRenderer(DIALECTS["opencl"], precision)
    source = DIALECTS["opencl"].prelude(precision.name) + renderer.kernel(kernel).replace("KERNEL", "k", 1)
    program = cl.Program(device.context, source).build()
    args, outs = [], []
    feed = iter(inputs)
    for buf in kernel.params:
        storage = _storage(buf, precision)
        if buf.writes:
            size = kernel.global_size[0] * 4 if buf.name == "never" else _OUT_SIZES[id(kernel)][buf.name]
            host = np.zeros(size, storage)
            mem = cl.Buffer(device.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)
            outs.append((mem, host))
        else:
            host = np.ascontiguousarray(next(feed).astype(storage))
            mem = cl.Buffer(device.context, cl.mem_flags.READ_ONLY | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)
        args += [mem, np.int32(0)]
    program.k(device.queue, kernel.global_size, kernel.local_size, *args)
    for mem, host in outs:
        cl.enqueue_copy(device.queue, host, mem)
    device.queue.finish()
    return [host for _, host in outs]


_OUT_SIZES: dict[int, dict[str, int]] = {}


def _output_sizes(kernel: ir.Kernel, want) -> None:
    want = want if isinstance(want, list) else [want]
    writes = [b for b in kernel.params if b.writes]
    _OUT_SIZES[id(kernel)] = {b.name: int(np.asarray(w).size) for b, w in zip(writes, want)}


@pytest.mark.parametrize("precision", ["F32", "F32_F16", "F16"])
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_kernel_on_opencl(cl_device, name, precision):
    mode = PRECISIONS[precision]
    if mode.half_arith and not cl_device.fp16:
        pytest.skip(f"{cl_device.device.name.strip()} has no cl_khr_fp16: F16 arithmetic cannot run on it")
    kernel, inputs, reference = KERNELS[name]()
    with np.errstate(invalid="ignore"):   # the references meet NaN and infinities on purpose
        want = reference(*_host_inputs(inputs, mode))
    _output_sizes(kernel, want)
    _assert_matches(_run_opencl(cl_device, kernel, inputs, mode), want, precision, name)


# -- WebGPU ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def wgpu_device(skip_unless_required):
    try:
        import wgpu
    except ImportError as exc:
        skip_unless_required("webgpu", f"wgpu is not installed ({exc})")
    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    if adapter is None:
        skip_unless_required("webgpu", "no WebGPU adapter here (install mesa-vulkan-drivers for lavapipe)")
    features = [f for f in ("shader-f16",) if f in adapter.features]
    return wgpu, adapter.request_device_sync(required_features=features), set(features)


def _run_wgsl(wgpu_device, kernel: ir.Kernel, inputs, precision: Precision) -> list[np.ndarray]:
    wgpu, device, _ = wgpu_device
    rendered = WgslRenderer(precision).kernel(kernel)
    module = device.create_shader_module(code=rendered.source)
    pipeline = device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
    feed, entries, outs = iter(inputs), [], []
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST
    for j, buf in enumerate(kernel.params):
        storage = {"f32": F32, "f16": np.float16, "i32": np.int32, "u32": np.uint32}[WgslRenderer(precision).storage(buf)]
        if buf.writes:
            host = np.zeros(_OUT_SIZES[id(kernel)][buf.name], storage)
            outs.append((device.create_buffer_with_data(data=host, usage=usage), host))
            gpu = outs[-1][0]
        else:
            gpu = device.create_buffer_with_data(data=np.ascontiguousarray(next(feed).astype(storage)), usage=usage)
        entries.append({"binding": j, "resource": {"buffer": gpu}})
    group = device.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=entries)
    encoder = device.create_command_encoder()
    compute = encoder.begin_compute_pass()
    compute.set_pipeline(pipeline)
    compute.set_bind_group(0, group)
    compute.dispatch_workgroups(*rendered.dispatch)
    compute.end()
    device.queue.submit([encoder.finish()])
    # (a buffer's size is rounded up to 4 bytes: an odd number of halves reads one more)
    return [np.frombuffer(device.queue.read_buffer(gpu), host.dtype)[:host.size].copy() for gpu, host in outs]


@pytest.mark.parametrize("precision", ["F32", "F32_F16", "F16"])
@pytest.mark.parametrize("name", sorted(KERNELS))
def test_kernel_on_webgpu(wgpu_device, name, precision):
    mode = PRECISIONS[precision]
    if mode.half_storage and "shader-f16" not in wgpu_device[2]:
        pytest.skip("the adapter has no shader-f16: half storage and arithmetic cannot run on it")
    kernel, inputs, reference = KERNELS[name]()
    with np.errstate(invalid="ignore"):   # the references meet NaN and infinities on purpose
        want = reference(*_host_inputs(inputs, mode))
    _output_sizes(kernel, want)
    _assert_matches(_run_wgsl(wgpu_device, kernel, inputs, mode), want, precision, name)


def test_wgsl_folds_a_long_launch_into_two_dispatch_dimensions():
    b = ir.KernelBuilder()
    y = b.buffer(np.float32, writes=True)
    b.store(y, b.global_id(0), 1.0)
    rendered = WgslRenderer(Precision()).kernel(b.kernel((70000 * 64,)))
    assert rendered.dispatch == (65535, 2, 1) and "wid.y" in rendered.source


def test_types_are_checked_when_the_kernel_is_built():
    b = ir.KernelBuilder()
    x = b.buffer(np.float32)
    with pytest.raises(TypeError, match="different types"):
        x.load(0) + b.global_id(0)
    with pytest.raises(TypeError, match="scalar bool"):
        with b.if_(x.load(0)):
            pass
    with pytest.raises(TypeError, match="read-only"):
        b.store(x, 0, 1.0)


# -- CUDA and MSL: compiled and type-checked without a device ----------------------------------------

def _c_sources(dialect: str) -> dict[tuple[str, str], str]:
    """{(precision, kernel): source} of every kernel above in ``dialect``, named ``k_<kernel>``."""
    return {(precision, name): CRenderer(DIALECTS[dialect], mode).kernel(KERNELS[name]()[0])
            .replace("KERNEL", f"k_{name}", 1)
            for precision, mode in PRECISIONS.items() for name in KERNELS}


def test_kernels_compile_as_cuda(nvrtc_available):
    failures = nvrtc_check(_c_sources("cuda"), "80")
    assert not failures, "\n\n".join(f"{key}:\n{report}" for key, report in failures.items())


def test_kernels_type_check_as_msl(clangxx, tmp_path):
    failures = clang_check(_c_sources("metal"), tmp_path)
    assert not failures, "\n\n".join(f"{key}:\n{report}" for key, report in failures.items())


def _grid_kernel(n: int):
    """y = 3 x + 1 on integers of a 16-bit grid, in full-precision (float32) tensors."""
    b = ir.KernelBuilder()
    x = b.buffer(np.float32, full_precision=True)
    y = b.buffer(np.float32, writes=True, full_precision=True)
    i = b.let("i", b.global_id(0))
    b.store(y, i, b.let("v", x.load(i) * 3.0 + 1.0, ir.REAL))
    return b.kernel((n,))


def test_float_arithmetic_keeps_a_16_bit_grid_in_f16(wgpu_device):
    if "shader-f16" not in wgpu_device[2]:
        pytest.skip("the adapter has no shader-f16: F16 arithmetic cannot run on it")
    xs = np.arange(-10000, 10000, 7, dtype=F32)
    want = xs * 3 + 1
    f16 = PRECISIONS["F16"]
    plain, widened = _grid_kernel(xs.size), ir.float_arithmetic(_grid_kernel(xs.size))
    for k in (plain, widened):
        _output_sizes(k, want)
    assert not np.array_equal(_run_wgsl(wgpu_device, plain, [xs], f16)[0], want)   # half rounds the grid
    np.testing.assert_array_equal(_run_wgsl(wgpu_device, widened, [xs], f16)[0], want)
    c = CRenderer(DIALECTS["opencl"], f16).kernel(widened)
    assert "real" not in c and "const float v =" in c



def test_a_buffer_read_as_float_and_as_half_in_one_wgsl_kernel(wgpu_device):
    # F16: an accumulator loads four elements as float, a follower the same four as half;
    # each needs its own load helper (one name for both did not build).
    if "shader-f16" not in wgpu_device[2]:
        pytest.skip("the adapter has no shader-f16: F16 arithmetic cannot run on it")
    b = ir.KernelBuilder()
    x, y = b.buffer(np.float32), b.buffer(np.float32, writes=True)
    i = b.let("i", b.global_id(0) * 4)
    wide = b.let("wide", x.load(i, 4, as_float=True) * 2.0)
    b.store(y, i, wide.cast(ir.REAL4) + x.load(i, 4))
    kernel = b.kernel((4,))
    xs = np.arange(16, dtype=F32)
    _output_sizes(kernel, xs)
    np.testing.assert_array_equal(_run_wgsl(wgpu_device, kernel, [xs], PRECISIONS["F16"])[0], xs * 3)
