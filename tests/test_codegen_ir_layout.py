"""The data-movement kernels (kernels/layout.py) as IR: what they render per dialect, and
the paths the conformance suite's small shapes do not reach, run on WebGPU.

- OpenCL C keeps its four-lane forms: float4 chunks, 4x4 blocks transposed in registers
  (four ``vload4`` and four ``vstore4``), padding's ``?:`` that leaves a padded index
  unread; a row whose length no chunk divides stops at its end (``min``), not by a test
  per element.
- WGSL renders the same kernels with ``vec4`` (its widest vector). It has no 64-bit
  integers: int64 tensors decline with that reason, while constant int64 gather indices
  (checked in range) are uploaded as int32 and the node runs. A row of several chunks
  and the rows share one launch axis in WGSL (OpenCL keeps its 2-D grid).
- On a WebGPU adapter (lavapipe here), the models of ``test_opencl_layout`` that reach
  float4 chunks, register transposes, row loops with a tail, run-time fills and
  several rows per work-item match LiteRT, in F32 and F16 (an adapter without
  ``shader-f16`` runs the F16 request in F32).
"""
from __future__ import annotations

import re

import numpy as np
import pytest
from test_opencl_layout import B, F32, I32, I64, data, model

import litegpu
from litegpu.codegen import DIALECTS, Precision
from litegpu.codegen.offline import render_model
from litegpu.model import load_model
from litegpu.testing.conformance import litert_outputs, unsupported


def kernels(built, dialect: str, precision: Precision = Precision()) -> list:
    """Every kernel (a KernelSpec) of the model's GPU programs in ``dialect``."""
    programs = render_model(load_model(built[0]), DIALECTS[dialect], precision)
    return [k for p in programs for step in p.step_kernels for k in step]


def sources(built, dialect: str, precision: Precision = Precision()) -> list[str]:
    """Every kernel source of the model's GPU programs in ``dialect``."""
    return [k.source for k in kernels(built, dialect, precision)]


def nhwc_to_nchw(dtype):
    """A TRANSPOSE whose innermost output axis is strided in the input: 4x4 blocks."""
    return model("TRANSPOSE", [data(dtype, 2, 6, 8, 12), ("const", np.array([0, 3, 1, 2], I32))],
                 [((2, 12, 6, 8), dtype)])


def prime_reshape():
    """1009 elements: chunks of 64 with a shorter last one."""
    return model("RESHAPE", [data(F32, 1, 1009), ("const", np.array([1009], I32))], [((1009,), F32)])


def int64_gather():
    return model("GATHER", [data(F32, 5, 8), ("const", np.array([4, 0, 2], I64))], [((3, 8), F32)], axis=0)


# -- rendering (no device) ---------------------------------------------------------------------------

def test_opencl_transposes_4x4_blocks_with_four_vector_loads_and_stores():
    for dtype, vec in ((F32, "LD4"), (I32, "vload4")):
        [src] = sources(nhwc_to_nchw(dtype), "opencl")
        assert src.count(vec) == 4, src
        assert src.count("ST4" if dtype == F32 else "vstore4") == 4, src


def test_wgsl_renders_the_same_blocks_with_vec4():
    [src] = sources(nhwc_to_nchw(F32), "wgsl")
    assert len(re.findall(r"let a\d: vec4<f32> = ", src)) == 4, src


def test_a_row_tail_stops_the_loop_at_the_row_end():
    [src] = sources(prime_reshape(), "opencl")
    assert "min(64, (1009 - (ch * 64)))" in src and "break" not in src and " if (" not in src, src


def test_wgsl_launches_chunks_and_rows_on_one_axis():
    """70000 rows of two chunks: OpenCL's 2-D grid; WGSL's one axis, in groups of 64 (its
    second axis could not take 70000 groups, and groups of two would be tiny)."""
    built = model("PAD", [data(F32, 70000, 98), ("const", np.array([[0, 0], [1, 1]], I32))], [((70000, 100), F32)])
    [cl] = kernels(built, "opencl")
    [wg] = kernels(built, "wgsl")
    assert cl.global_size == (2, 70000) and wg.global_size == (140000,)
    assert "@workgroup_size(64, 1, 1)" in wg.source


def test_padding_reads_only_inside_the_input_in_every_c_dialect():
    x = data(F32, 1, 7, 9, 16)
    built = model("PAD", [x, ("const", np.array([[0, 0], [2, 1], [1, 3], [0, 0]], I32))], [((1, 10, 13, 16), F32)])
    for name, load in (("opencl", "LD4("), ("cuda", "LD4("), ("metal", "LD4(")):
        [src] = sources(built, name)
        assert re.search(r"\(inb \? " + re.escape(load), src), (name, src)


def test_wgsl_uploads_int64_gather_indices_as_int32():
    [src] = sources(int64_gather(), "wgsl")
    assert "array<i32>" in src and "i64" not in src, src
    [cl] = sources(int64_gather(), "opencl")
    assert "const long*" in cl, cl   # OpenCL reads the model's own int64 tensor


def test_int64_tensors_decline_in_wgsl_saying_why(webgpu):
    built = model("SPLIT_V", [data(I64, 4, 16), ("const", np.array([4, -1, 8], I32)), ("const", np.array(1, I32))],
                  [((4, 4), I64), ((4, 4), I64), ((4, 8), I64)], num_splits=3)
    refused = unsupported(built[0], webgpu)
    assert len(refused) == 1 and "64-bit" in refused[0][3].reason, refused


# -- on a WebGPU adapter ----------------------------------------------------------------------------------

def _cases():
    x = data(F32, 2, 3, 8, 10)
    return {
        "concat-relu": model("CONCATENATION", [data(F32, 2, 5, 5, 8), data(F32, 2, 5, 5, 12)], [((2, 5, 5, 20), F32)],
                             follow=("RELU", None), axis=3),
        "blocks-f32": nhwc_to_nchw(F32),
        "blocks-i32": nhwc_to_nchw(I32),
        "blocks-bool": nhwc_to_nchw(B),
        "rows-per-item": model("TRANSPOSE", [x, ("const", np.array([0, 2, 3, 1], I32))], [((2, 8, 10, 3), F32)],
                               follow=("ADD", data(F32, 3))),
        "reshape-tail": prime_reshape(),
        "pad-tail": model("PAD", [data(F32, 3, 62), ("const", np.array([[0, 1], [3, 2]], I32))], [((4, 67), F32)]),
        "padv2-run-time-fill": model("PADV2", [data(F32, 3, 5, 4), ("const", np.array([[1, 0], [0, 2], [0, 0]], I32)),
                                               np.array(-2.5, F32)], [((4, 7, 4), F32)]),
        "mirror-pad": model("MIRROR_PAD", [data(F32, 1, 5, 6, 8), ("const", np.array([[0, 0], [3, 4], [4, 2], [0, 0]],
                                                                                      I32))],
                            [((1, 12, 12, 8), F32)], mode="SYMMETRIC"),
        "split-float4": model("SPLIT", [("const", np.array(-1, I32)), data(F32, 3, 5, 24)], [((3, 5, 8), F32)] * 3,
                              num_splits=3),
        "space-to-batch": model("SPACE_TO_BATCH_ND", [data(F32, 2, 5, 7, 8), ("const", np.array([2, 3], I32)),
                                                      ("const", np.array([[1, 0], [1, 1]], I32))],
                                [((12, 3, 3, 8), F32)]),
        "batch-to-space": model("BATCH_TO_SPACE_ND", [data(F32, 12, 3, 3, 8), ("const", np.array([2, 3], I32)),
                                                      ("const", np.array([[1, 0], [1, 1]], I32))],
                                [((2, 5, 7, 8), F32)]),
        "gather-int64-indices": int64_gather(),
        "gather-batch-dims": model("GATHER", [data(I32, 2, 5, 12), ("const", np.array([[4, 0, 1], [3, 3, 2]], I32))],
                                   [((2, 3, 12), I32)], axis=1, batch_dims=1),
    }


CASES = _cases()


@pytest.mark.parametrize("fp16", [False, True], ids=["F32", "F16"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_layout_kernels_on_webgpu_match_litert(webgpu, name, fp16):
    data_bytes, feeds = CASES[name]
    assert unsupported(data_bytes, webgpu) == []
    want = litert_outputs(data_bytes, feeds)
    delegate = litegpu.load_delegate("webgpu", {"precision_loss_allowed": fp16})
    interp = litegpu.Interpreter(model_content=data_bytes, experimental_delegates=[delegate])
    interp.allocate_tensors()
    for d, x in zip(interp.get_input_details(), feeds):
        interp.set_tensor(d["index"], x)
    interp.invoke()
    assert interp.get_delegation_report().fully_delegated
    for d, w in zip(interp.get_output_details(), want):
        g = interp.get_tensor(d["index"])
        assert g.shape == w.shape and g.dtype == w.dtype
        if w.dtype == F32 and fp16:   # a copy: within one half-precision rounding of the largest value
            np.testing.assert_allclose(g, w, rtol=0, atol=4e-3 * max(1.0, float(np.abs(w).max())))
        else:
            np.testing.assert_array_equal(g, w)
