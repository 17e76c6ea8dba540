"""What the LSTM generator added to :mod:`litegpu.codegen.ir`, and the LSTM on WebGPU.

The IR features: vector loads and stores of consecutive elements of a local array
(``LocalArray.load(index, lanes)``, ``KernelBuilder.local_store`` of a vector: OpenCL's
``vload``/``vstore`` on local memory, a helper function in WGSL) and ``signbit``. A
kernel using them runs on OpenCL (PoCL) and WebGPU (lavapipe) in every precision mode,
compiles to PTX with NVRTC and type-checks as MSL, as the kernels of
:mod:`test_codegen_ir` do.

The LSTM kernel itself (:mod:`litegpu.codegen.kernels.lstm`) is checked on WebGPU with
the shapes and work-group sizes that :mod:`test_opencl_lstm` runs on OpenCL, and for
WebGPU's smaller local memory.
"""
from __future__ import annotations

import numpy as np
import pytest
from test_codegen_ir import (PRECISIONS, _assert_matches, _host_inputs, _output_sizes, _run_opencl, _run_wgsl,
                             cl_device, wgpu_device)  # noqa: F401 - fixtures used below
from test_cuda_source import nvrtc_available, nvrtc_check  # noqa: F401 - a fixture used below
from test_metal_source import clang_check, clangxx  # noqa: F401 - a fixture used below
from test_opencl_lstm import _litert_invokes, _model, _opencl_invokes, _program

from litegpu.codegen import ir
from litegpu.codegen.crender import CRenderer
from litegpu.codegen.dialects import DIALECTS
from litegpu.codegen.wgsl import WGSL, WgslRenderer
from litegpu.testing.conformance import max_rel_error

F32 = np.float32
_QUADS = 4   # float4s per row: one work-item each


def _local_quads(rows: int = 3):
    """Each group stages its row in local memory a float4 per work-item, waits, and reads
    its neighbour's float4 back: the rotated row, and the sign bit of each element."""
    b = ir.KernelBuilder()
    x = b.buffer(np.float32)
    y, signs = b.buffer(np.float32, writes=True), b.buffer(np.float32, writes=True)
    tile = b.local_array("tile", ir.FLOAT, 4 * _QUADS)
    row, lid = b.let("row", b.group_id(0)), b.let("lid", b.local_id(0))
    b.local_store(tile, lid * 4, x.load(row * (4 * _QUADS) + lid * 4, 4, as_float=True))
    b.barrier()
    v = b.let("v", tile.load((lid + 1) % _QUADS * 4, 4), ir.FLOAT4)
    out = row * (4 * _QUADS) + lid * 4
    b.store(y, out, v)
    b.store(signs, out, ir.select(ir.call("signbit", v), ir.lit(1.0, ir.FLOAT4), ir.lit(0.0, ir.FLOAT4)))
    xs = np.random.default_rng(5).standard_normal(rows * 4 * _QUADS).astype(F32)
    xs[1], xs[6], xs[11] = -0.0, 0.0, np.inf
    xs[17] = -np.inf

    def reference(xs):
        rotated = np.roll(xs.reshape(rows, _QUADS, 4), -1, axis=1).reshape(-1)
        return [rotated, np.signbit(rotated).astype(F32)]
    return b.kernel((rows * _QUADS,), (_QUADS,)), [xs], reference


def _expected(precision: str):
    kernel, inputs, reference = _local_quads()
    want = reference(*_host_inputs(inputs, PRECISIONS[precision]))
    _output_sizes(kernel, want)
    return kernel, inputs, want


def test_local_vectors_render_as_vload_and_vstore_in_c():
    kernel = _local_quads()[0]
    source = CRenderer(DIALECTS["opencl"], PRECISIONS["F32"]).kernel(kernel)
    assert "vstore4(vload4(0, (t0) + (" in source and "vload4(0, (tile) + (" in source
    assert "signbit(v)" in source


def test_local_vectors_are_helper_functions_in_wgsl():
    source = WgslRenderer(PRECISIONS["F32"]).kernel(_local_quads()[0]).source
    assert "fn lg_st4_tile(i: i32, v: vec4<f32>)" in source and "fn lg_ld4_tile(i: i32) -> vec4<f32>" in source
    assert "0x80000000u" in source


def test_a_vector_load_needs_an_array_of_scalars():
    b = ir.KernelBuilder()
    quads = b.local_array("quads", ir.FLOAT4, 4)
    with pytest.raises(TypeError, match="vector load"):
        quads.load(0, 4)
    assert quads.load(1).type == ir.FLOAT4


@pytest.mark.parametrize("precision", ["F32", "F32_F16", "F16"])
def test_local_vectors_and_signbit_on_opencl(cl_device, precision):
    if PRECISIONS[precision].half_arith and not cl_device.fp16:
        pytest.skip(f"{cl_device.device.name.strip()} has no cl_khr_fp16")
    kernel, inputs, want = _expected(precision)
    _assert_matches(_run_opencl(cl_device, kernel, inputs, PRECISIONS[precision]), want, precision, "local_quads")


@pytest.mark.parametrize("precision", ["F32", "F32_F16", "F16"])
def test_local_vectors_and_signbit_on_webgpu(wgpu_device, precision):
    if PRECISIONS[precision].half_storage and "shader-f16" not in wgpu_device[2]:
        pytest.skip("the adapter has no shader-f16")
    kernel, inputs, want = _expected(precision)
    _assert_matches(_run_wgsl(wgpu_device, kernel, inputs, PRECISIONS[precision]), want, precision, "local_quads")


def _c_sources(dialect: str) -> dict[tuple[str, str], str]:
    return {(precision, "local_quads"): CRenderer(DIALECTS[dialect], mode).kernel(_local_quads()[0])
            .replace("KERNEL", "k_local_quads", 1) for precision, mode in PRECISIONS.items()}


def test_local_vectors_compile_as_cuda(nvrtc_available):
    failures = nvrtc_check(_c_sources("cuda"), "80")
    assert not failures, "\n\n".join(f"{key}:\n{report}" for key, report in failures.items())


def test_local_vectors_type_check_as_msl(clangxx, tmp_path):
    failures = clang_check(_c_sources("metal"), tmp_path)
    assert not failures, "\n\n".join(f"{key}:\n{report}" for key, report in failures.items())


# -- the LSTM kernel on WebGPU -------------------------------------------------------------------------------

# Several cell blocks, masked output columns and three work-items per group meeting at
# barriers (WGSL's uniformity rules), as test_opencl_lstm runs them on OpenCL; the second
# shape takes seven buffers (CIFG, peephole, projection), within WebGPU's eight.
@pytest.mark.parametrize("lanes", [1, 3])
@pytest.mark.parametrize("shape", [
    {"steps": 3, "batch": 2, "n_input": 12, "n_cell": 40, "time_major": True, "layer_norm": True,
     "peephole": True},
    {"steps": 4, "batch": 3, "n_input": 7, "n_cell": 24, "n_output": 6, "cifg": True, "peephole": True},
], ids=["ln-peephole-40", "cifg-peephole-projection-24x6"])
def test_blocks_masks_and_lanes_match_litert_on_webgpu(webgpu, monkeypatch, lanes, shape):
    from litegpu.codegen.kernels import lstm
    monkeypatch.setattr(lstm, "LANES", lanes)
    model_bytes, inputs = _model(np.random.default_rng(7), **shape)
    program, buffers = _program(webgpu, model_bytes, inputs, precision_loss=False)
    want = _litert_invokes(model_bytes, inputs[0], 2)
    got, _, _ = _opencl_invokes(webgpu, program, buffers, inputs[0], 2)
    for k, (g, w) in enumerate(zip(got, want)):
        assert max_rel_error(g, w) <= 1e-5, f"invoke {k}: {max_rel_error(g, w):.3g}"


@pytest.mark.parametrize("activation", ["RELU_N1_TO_1", "SIGN_BIT"])
def test_other_activations_match_litert_on_webgpu(webgpu, activation):
    model_bytes, inputs = _model(np.random.default_rng(3), 3, 2, 5, 8, activation=activation)
    program, buffers = _program(webgpu, model_bytes, inputs, precision_loss=False)
    want = _litert_invokes(model_bytes, inputs[0], 2)
    got, _, c = _opencl_invokes(webgpu, program, buffers, inputs[0], 2)
    assert np.abs(c).max() > 0.1
    for g, w in zip(got, want):
        assert max_rel_error(g, w) <= 1e-5


def test_state_beyond_webgpu_local_memory_declines_there_alone():
    """19 KiB of state per row (800 cells, layer norm): within OpenCL's 32 KiB, past
    WebGPU's default 16 KiB, so the node stays on cpu in WGSL saying why."""
    from litegpu.codegen import offline
    from litegpu.model import load_model
    model_bytes, inputs = _model(np.random.default_rng(1), 2, 1, 2, 800, n_output=4, layer_norm=True)
    model = load_model(model_bytes)
    shapes = [np.shape(x) for x in inputs]
    found, _ = offline.gpu_partitions(model, DIALECTS["opencl"], shapes)
    assert found
    found, refusals = offline.gpu_partitions(model, WGSL, shapes)
    assert not found and any("local memory (16384 bytes in wgsl)" in r for r in refusals), refusals
