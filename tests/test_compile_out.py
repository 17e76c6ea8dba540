"""``litegpu compile MODEL --backend X --out DIR``: a model's GPU kernels written without a device.

cuda's PTX comes from NVRTC (a pip wheel; no GPU and no CUDA toolkit needed); opencl's
sources are built on the OpenCL device where there is one (PoCL in CI).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from litegpu.cli import main
from litegpu.codegen import kernels
from litegpu.testing.builder import ModelBuilder

from test_kernel_build_errors import broken


def _model(tmp_path) -> str:
    """x -> LOGISTIC -> MUL by itself -> CUMSUM (cpu only) -> ADD: two GPU partitions."""
    b = ModelBuilder()
    x = b.input("x", (2, 8), np.float32)
    y = b.tensor("y", (2, 8), np.float32)
    b.op("LOGISTIC", [x], [y])
    z = b.tensor("z", (2, 8), np.float32)
    b.op("MUL", [y, y], [z])
    axis = b.const("axis", np.array(1, np.int32))
    c = b.tensor("c", (2, 8), np.float32)
    b.op("CUMSUM", [z, axis], [c])
    d = b.tensor("d", (2, 8), np.float32)
    b.op("ADD", [c, x], [d])
    b.output(d)
    path = tmp_path / "m.tflite"
    path.write_bytes(b.build())
    return str(path)


def test_opencl_sources_and_manifest(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["compile", _model(tmp_path), "--backend", "opencl", "--out", str(out), "--fp16"]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert [(m["precision"], m["subgraph"]) for m in manifest] == [
        (p, 0) for p in ("F32", "F32", "F32_F16", "F32_F16", "F16", "F16")]
    first = manifest[0]
    source = (out / first["source"]).read_text()
    assert first["source"].endswith(".cl") and "__kernel void" in source
    # (a square reads its operand twice, so it is no follower: the two are one fused region)
    assert [launch["nodes"] for launch in first["launches"]] == [["0 LOGISTIC", "1 MUL"]]
    assert all(launch["kernel"] in source for launch in first["launches"])
    assert [launch["nodes"] for launch in manifest[1]["launches"]] == [["3 ADD"]]
    assert "cl_khr_fp16" in (out / manifest[4]["source"]).read_text()


@pytest.fixture(scope="module")
def nvrtc_available(skip_unless_required):
    try:
        from litegpu_cuda import nvrtc
        nvrtc.version()
    except Exception as exc:   # noqa: BLE001 - whatever is missing is the reason
        skip_unless_required("nvrtc", f"NVRTC is not usable here ({exc}); pip install 'litegpu[cuda]'")


def test_cuda_sources_and_ptx_without_a_gpu(tmp_path, nvrtc_available):
    out = tmp_path / "out"
    assert main(["compile", _model(tmp_path), "--backend", "cuda", "--out", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest) == 2
    for entry in manifest:
        assert entry["source"].endswith(".cu")
        assert sorted(name.rsplit(".", 2)[-2] for name in entry["built"]) == ["compute_80", "compute_90"]
        for name in entry["built"]:
            ptx = (out / name).read_text()
            assert ".version" in ptx and all(f".entry {launch['kernel']}" in ptx for launch in entry["launches"])


def test_a_kernel_that_fails_names_its_node(tmp_path, monkeypatch, capsys, nvrtc_available):
    kernels.load_all()
    monkeypatch.setitem(kernels.GENERATORS, "ADD", broken(kernels.GENERATORS["ADD"]))
    monkeypatch.setenv("LITEGPU_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["compile", _model(tmp_path), "--backend", "cuda", "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "the cuda kernel of node 3 (ADD) failed to build" in err and "no_such_name" in err, err
    saved = list((tmp_path / "cache" / "failed-kernels").glob("*.cu"))
    assert len(saved) == 1 and "no_such_name" in saved[0].read_text()


def test_a_backend_without_kernel_sources_is_refused(tmp_path, capsys):
    assert main(["compile", _model(tmp_path), "--backend", "cpu", "--out", str(tmp_path / "out")]) == 1
    assert "backend 'cpu' renders no kernel sources" in capsys.readouterr().err


def test_no_compiler_here_writes_the_sources_and_says_so(tmp_path, monkeypatch, capsys):
    """Where a backend cannot build (cuda without NVIDIA's cuda-bindings, metal off macOS),
    the sources are still written and the output says why nothing was built, instead of a
    kernel "failed to build" (cuda) or a "building ...: done" that built nothing (metal)."""
    import sys
    monkeypatch.setitem(sys.modules, "cuda.bindings", None)   # as if cuda-bindings were not installed
    for name, reason in (("cuda", "cuda-bindings is not installed"), ("metal", "Metal compiles on a Mac")):
        from litegpu.plugins import manager
        if name == "metal" and manager().backends["metal"].available()[0]:
            continue   # a Mac with Metal builds for real
        out = tmp_path / name
        assert main(["compile", _model(tmp_path), "--backend", name, "--out", str(out)]) == 0
        printed = capsys.readouterr().out
        assert "not built here: " in printed and reason in printed, printed
        assert "building" not in printed and "failed to build" not in printed
        manifest = json.loads((out / "manifest.json").read_text())
        assert manifest and all((out / p["source"]).is_file() and p["built"] == [] for p in manifest)
