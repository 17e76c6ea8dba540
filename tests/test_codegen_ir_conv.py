"""What the convolution generators (:mod:`litegpu.codegen.kernels.conv`) need of the IR
renderers, and how they render per dialect.

- A choice with a scalar condition between vectors (a border tile's masked input: the
  whole vector or zeros) is C's ``?:`` in every C dialect (CUDA's ``select`` takes a
  per-lane mask only), and WGSL's ``select`` with a ``bool``; it runs on OpenCL and WebGPU
  and compiles as CUDA and MSL.
- The same CONV_2D renders float16 tiles in OpenCL C and float4 tiles in WGSL (whose
  widest vector is 4: ``max_lanes``).
"""
from __future__ import annotations

import re

import numpy as np
import pytest
from test_codegen_ir import (  # noqa: F401 - fixtures used below
    PRECISIONS,
    _assert_matches,
    _host_inputs,
    _output_sizes,
    _run_opencl,
    _run_wgsl,
    cl_device,
    wgpu_device,
)
from test_cuda_source import nvrtc_available, nvrtc_check  # noqa: F401 - a fixture used below
from test_metal_source import clang_check, clangxx  # noqa: F401 - a fixture used below

from litegpu.codegen import ir
from litegpu.codegen.crender import CRenderer
from litegpu.codegen.dialects import DIALECTS

F32 = np.float32


def _masked_quads(n: int = 64):
    """y[4i..4i+3] = x[4i..4i+3] * 2 where i % 3 != 0, else 0: a float4 chosen whole by a scalar
    condition (declared, as the conv kernels' masks are), and a scalar choice beside it."""
    b = ir.KernelBuilder()
    x, y = b.buffer(np.float32), b.buffer(np.float32, writes=True)
    i = b.let("i", b.global_id(0))
    m = b.let("m", (i % 3).ne(0), ir.BOOL)
    v = b.let("v", ir.select(m, x.load(i * 4, 4, as_float=True), ir.lit(0.0, ir.FLOAT4)), ir.FLOAT4)
    s = b.let("s", ir.select(m, ir.lit(1.0, ir.FLOAT), 0.5), ir.FLOAT)
    b.store(y, i * 4, (v * 2.0 * s).cast(ir.REAL4))
    xs = np.random.default_rng(7).standard_normal(4 * n).astype(F32)

    def reference(xs):
        keep = np.repeat(np.arange(n) % 3 != 0, 4)
        return np.where(keep, xs * 2, 0).astype(F32)
    return b.kernel((n,)), [xs], reference


def test_a_scalar_condition_picks_a_whole_vector_with_c_choice():
    kernel = _masked_quads()[0]
    for name in ("opencl", "cuda", "metal"):
        source = CRenderer(DIALECTS[name], PRECISIONS["F32"]).kernel(kernel)
        line = next(line for line in source.splitlines() if "float4 v =" in line)
        assert "= (m ? vload4(" in line and "select" not in line, (name, line)


@pytest.mark.parametrize("precision", ["F32", "F32_F16", "F16"])
def test_masked_quads_on_opencl(cl_device, precision):
    mode = PRECISIONS[precision]
    if mode.half_arith and not cl_device.fp16:
        pytest.skip("no cl_khr_fp16: F16 arithmetic cannot run here")
    kernel, inputs, reference = _masked_quads()
    want = reference(*_host_inputs(inputs, mode))
    _output_sizes(kernel, want)
    _assert_matches(_run_opencl(cl_device, kernel, inputs, mode), want, precision, "masked_quads")


@pytest.mark.parametrize("precision", ["F32", "F32_F16", "F16"])
def test_masked_quads_on_webgpu(wgpu_device, precision):
    mode = PRECISIONS[precision]
    if mode.half_storage and "shader-f16" not in wgpu_device[2]:
        pytest.skip("the adapter has no shader-f16")
    kernel, inputs, reference = _masked_quads()
    want = reference(*_host_inputs(inputs, mode))
    _output_sizes(kernel, want)
    _assert_matches(_run_wgsl(wgpu_device, kernel, inputs, mode), want, precision, "masked_quads")


def _sources(dialect: str) -> dict[tuple[str, str], str]:
    kernel = _masked_quads()[0]
    return {(p, "masked_quads"): CRenderer(DIALECTS[dialect], mode).kernel(kernel).replace("KERNEL", "k_masked", 1)
            for p, mode in PRECISIONS.items()}


def test_masked_quads_compile_as_cuda(nvrtc_available):
    failures = nvrtc_check(_sources("cuda"), "80")
    assert not failures, "\n\n".join(f"{key}:\n{report}" for key, report in failures.items())


def test_masked_quads_type_check_as_msl(clangxx, tmp_path):
    failures = clang_check(_sources("metal"), tmp_path)
    assert not failures, "\n\n".join(f"{key}:\n{report}" for key, report in failures.items())


def _padded_conv_model() -> bytes:
    """One 3x3 SAME conv of 32 output channels (float16 tiles where the dialect allows)."""
    from litegpu.testing.builder import ModelBuilder
    rng = np.random.default_rng(0)
    mb = ModelBuilder()
    x = mb.input("x", (1, 6, 7, 8), F32)
    y = mb.tensor("y", (1, 6, 7, 32), F32)
    mb.op("CONV_2D", [x, mb.const("w", rng.standard_normal((32, 3, 3, 8)).astype(F32)),
                      mb.const("b", rng.standard_normal(32).astype(F32))], [y],
          padding="SAME", stride_h=1, stride_w=1, fused_activation_function="RELU6")
    mb.output(y)
    return mb.build()


def test_conv_tiles_are_as_wide_as_the_dialect_allows():
    from litegpu.codegen import offline
    from litegpu.codegen.nodegen import Precision
    from litegpu.model import load_model
    model = load_model(_padded_conv_model())
    c_source = offline.render_model(model, DIALECTS["opencl"], Precision())[0].source
    assert "float16 acc0" in c_source and "continue" not in c_source
    wgsl = offline.render_model(model, DIALECTS["wgsl"], Precision())
    assert len(wgsl) == 1, "CONV_2D renders in WGSL"
    source = wgsl[0].source
    assert "var acc0: vec4<f32>" in source and not re.search(r"vec(8|16)|float(8|16)", source)
