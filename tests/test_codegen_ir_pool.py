"""The IR features the pooling / reduction kernels (``litegpu.codegen.kernels.pool``) added to
:mod:`litegpu.codegen.ir`: quads of 8- and 16-lane vectors (:meth:`Expr.quad`), loops marked
for unrolling (``for_(..., unroll=True)``), a float vector converted to ``real4`` (the
prelude's ``TO_REAL4``) and the ``ulong`` type (wrapping 64-bit sums).

Each is rendered for every API: run on the OpenCL device (PoCL in CI) against numpy,
compiled as CUDA by NVRTC and type-checked as MSL by clang++; WGSL, which has neither
8-lane vectors nor 64-bit integers, refuses them with a TypeError (which makes a node
decline), while the pool generators pick 4-lane vectors there.
"""
from __future__ import annotations

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
FLOAT8 = ir.FLOAT.with_lanes(8)


def _quads(groups: int = 6) -> ir.Kernel:
    """Per work-item: a float8 from two 4-wide loads, ``sum(k + 1 for k < 3) * v`` in an
    unrolled loop, its quads swapped, stored a quad at a time through ``real4``."""
    b = ir.KernelBuilder()
    x, y = b.buffer(np.float32), b.buffer(np.float32, writes=True)
    base = b.let("base", b.global_id(0) * 8)
    v = b.let("v", ir.vector(FLOAT8, *(x.load(base + 4 * j if j else base, 4).cast(ir.FLOAT4) for j in (0, 1))))
    acc = b.var("acc", ir.lit(0.0, FLOAT8))
    with b.for_("k", 0, 3, unroll=True) as k:
        b.assign(acc, v * (k + 1).cast(ir.FLOAT), "+")
    swapped = b.let("sw", ir.vector(FLOAT8, acc.quad(1), acc.quad(0)))
    for j in (0, 1):
        b.store(y, base + 4 * j if j else base, swapped.quad(j).cast(ir.REAL4))
    return b.kernel((groups,))


def _quads_reference(x: np.ndarray) -> np.ndarray:
    groups = (6 * x).reshape(-1, 2, 4)
    return groups[:, ::-1, :].reshape(-1)


def _ulong_sum(rows: int = 3, n: int = 5) -> ir.Kernel:
    """Per work-item: the sum of a row of int64 in ``ulong`` (wrapping), stored as ``long``."""
    b = ir.KernelBuilder()
    x, y = b.buffer(np.int64), b.buffer(np.int64, writes=True)
    row = b.let("row", b.global_id(0))
    acc = b.var("acc", ir.lit(0, ir.Type("ulong")))
    with b.for_("k", 0, n) as k:
        b.assign(acc, acc + x.load(row * n + k).cast(ir.Type("ulong")))
    b.store(y, row, acc.cast(ir.LONG))
    return b.kernel((rows,))


@pytest.fixture(scope="module")
def cl_device(opencl):
    from litegpu_opencl.device import default_device
    return default_device()


def _run_opencl(device, kernel: ir.Kernel, inputs: list[np.ndarray], out_size: int, precision: Precision
                ) -> np.ndarray:
    """Run ``kernel`` (inputs, then one output of ``out_size`` elements) on the OpenCL device."""
    cl = device.cl
    source = DIALECTS["opencl"].prelude(precision.name) + \
        CRenderer(DIALECTS["opencl"], precision).kernel(kernel).replace("KERNEL", "k", 1)
    program = cl.Program(device.context, source).build()
    feed, args, out = iter(inputs), [], None
    for buf in kernel.params:
        storage = precision.storage_dtype(buf.dtype, buf.full_precision)
        host = np.zeros(out_size, storage) if buf.writes else np.ascontiguousarray(next(feed).astype(storage))
        mem = cl.Buffer(device.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)
        if buf.writes:
            out = (mem, host)
        args += [mem, np.int32(0)]
    program.k(device.queue, kernel.global_size, kernel.local_size, *args)
    cl.enqueue_copy(device.queue, out[1], out[0])
    device.queue.finish()
    return out[1]


@pytest.mark.parametrize("precision", sorted(PRECISIONS))
def test_quads_unrolled_loop_and_real4_on_opencl(cl_device, precision):
    mode = PRECISIONS[precision]
    if mode.half_arith and not cl_device.fp16:
        pytest.skip("the OpenCL device has no cl_khr_fp16")
    x = np.random.default_rng(0).standard_normal(48).astype(np.float32)
    if mode.half_storage:
        x = x.astype(np.float16).astype(np.float32)
    got = _run_opencl(cl_device, _quads(), [x], 48, mode).astype(np.float32)
    np.testing.assert_allclose(got, _quads_reference(x), rtol=2e-3 if mode.half_storage else 1e-6, atol=1e-2)


def test_ulong_sums_wrap_on_opencl(cl_device):
    x = np.array([[2**62, 2**62, 2**62, 1, -5], [1, 2, 3, 4, 5], [-2**63, -1, 0, 0, 0]], np.int64)
    with np.errstate(over="ignore"):
        want = x.sum(axis=1)    # numpy's int64 sum wraps as the kernel's does
    np.testing.assert_array_equal(_run_opencl(cl_device, _ulong_sum(), [x], 3, Precision()), want)


def test_the_c_spellings():
    quads = CRenderer(DIALECTS["opencl"], Precision()).kernel(_quads())
    assert "(acc).hi" in quads and "(sw).lo" in quads and "#pragma unroll\n  for (int k" in quads
    assert "TO_REAL4((sw).lo)" in quads and "convert_real4" not in quads
    assert "ulong acc = ((ulong)0);" in CRenderer(DIALECTS["opencl"], Precision()).kernel(_ulong_sum())
    sixteen = ir.Sym("w", ir.FLOAT.with_lanes(16))
    assert CRenderer(DIALECTS["cuda"], Precision()).expr(sixteen.quad(3)) == "(w).scdef"


def test_quads_of_what_has_them():
    four = ir.Sym("q", ir.FLOAT4)
    assert four.quad(0) is four
    with pytest.raises(IndexError):
        four.quad(1)
    with pytest.raises(IndexError):
        ir.Sym("e", FLOAT8).quad(2)


def test_wgsl_refuses_eight_lanes_and_64_bit_integers_and_ignores_the_unroll_hint():
    with pytest.raises(TypeError, match="lane"):
        WgslRenderer(Precision()).kernel(_quads())
    with pytest.raises(TypeError, match="64-bit"):
        WgslRenderer(Precision()).kernel(_ulong_sum())
    b = ir.KernelBuilder()
    y = b.buffer(np.float32, writes=True)
    with b.for_("k", 0, 4, unroll=True) as k:
        b.store(y, k, 1.0)
    source = WgslRenderer(Precision()).kernel(b.kernel((1,))).source
    assert "pragma" not in source and "for (var k: i32 = 0i; k < 4i; k += 1)" in source


def _c_sources(dialect: str) -> dict[tuple[str, str], str]:
    return {(precision, name): CRenderer(DIALECTS[dialect], mode).kernel(build()).replace("KERNEL", f"k_{name}", 1)
            for precision, mode in PRECISIONS.items() for name, build in (("quads", _quads), ("ulong", _ulong_sum))}


def test_the_features_compile_as_cuda(nvrtc_available):
    failures = nvrtc_check(_c_sources("cuda"), "80")
    assert not failures, "\n\n".join(f"{key}:\n{report}" for key, report in failures.items())


def test_the_features_type_check_as_msl(clangxx, tmp_path):
    failures = clang_check(_c_sources("metal"), tmp_path)
    assert not failures, "\n\n".join(f"{key}:\n{report}" for key, report in failures.items())


def test_pool_kernels_use_float8_in_opencl_and_float4_in_wgsl():
    """The generators pick the narrower vector only where the dialect needs it."""
    from litegpu.codegen.offline import render_model
    from litegpu.codegen.opencl import OPENCL
    from litegpu.codegen.wgsl import WGSL
    from litegpu.model import load_model
    from litegpu.testing.builder import ModelBuilder
    mb = ModelBuilder()
    x = mb.input("x", (1, 6, 6, 16))
    pooled, mean = mb.tensor("p", (1, 3, 3, 16)), mb.tensor("m", (1, 16))
    mb.op("AVERAGE_POOL_2D", [x], [pooled], padding="VALID", stride_w=2, stride_h=2, filter_width=2,
          filter_height=2, fused_activation_function="NONE")
    mb.op("MEAN", [x, mb.const("axes", np.array([1, 2], np.int32))], [mean], keep_dims=False)
    mb.output(pooled, mean)
    model = load_model(mb.build())
    opencl = "".join(p.source for p in render_model(model, OPENCL, Precision()))
    wgsl = "".join(p.source for p in render_model(model, WGSL, Precision()))
    assert "float8" in opencl and "AVERAGE" not in wgsl
    assert "vec4<f32>" in wgsl and wgsl.count("// kernel") == 2
