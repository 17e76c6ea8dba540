"""``litegpu inspect MODEL --kernels``: what runs each node, and where a numpy reference does.

A node that a numpy reference runs is a slow path; the report's kernel lines
(``DelegationReport.kernels``, from each program's ``kernels()``), the CLI and the
profile all say so.
"""
from __future__ import annotations

import numpy as np
import pytest

import litegpu
from litegpu.cli import kernel_lines, main
from litegpu.testing.builder import ModelBuilder


def _model(tmp_path) -> str:
    """CONV_2D (a cpu kernel) -> LOCAL_RESPONSE_NORMALIZATION (no cpu kernel: the reference)
    -> TANH -> MUL (fused into one task)."""
    b = ModelBuilder()
    x = b.input("x", (1, 6, 6, 4))
    w = b.const("w", np.random.default_rng(0).standard_normal((8, 3, 3, 4)).astype(np.float32))
    bias = b.const("b", np.zeros(8, np.float32))
    y = b.tensor("y", (1, 6, 6, 8))
    b.op("CONV_2D", [x, w, bias], [y], padding="SAME", stride_w=1, stride_h=1)
    z = b.tensor("z", (1, 6, 6, 8))
    b.op("LOCAL_RESPONSE_NORMALIZATION", [y], [z], radius=2, bias=1.0, alpha=0.5, beta=0.75)
    t = b.tensor("t", (1, 6, 6, 8))
    b.op("TANH", [z], [t])
    out = b.tensor("out", (1, 6, 6, 8))
    b.op("MUL", [t, z], [out])
    b.output(out)
    path = tmp_path / "m.tflite"
    path.write_bytes(b.build())
    return str(path)


def test_inspect_kernels_names_each_nodes_kernel_and_the_references(tmp_path, capsys):
    assert main(["inspect", _model(tmp_path), "--kernels"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[2]: line for line in out.splitlines() if line.strip().startswith("node ") and "cpu" in line}
    assert "reference" not in lines["CONV_2D"] and lines["CONV_2D"].split()[-1] != "none"
    assert lines["LOCAL_RESPONSE_NORMALIZATION"].split()[-1] == "reference"
    assert "fused task (2 elementwise ops)" in lines["TANH"] and "fused task" in lines["MUL"]
    assert "1 of 4 nodes run a numpy reference: LOCAL_RESPONSE_NORMALIZATION x1" in out


def test_gpu_programs_name_their_kernels(tmp_path, opencl):
    interp = litegpu.Interpreter(model_path=_model(tmp_path), experimental_delegates=[litegpu.load_delegate("opencl")])
    interp.allocate_tensors()
    report = interp.get_delegation_report()
    on_gpu = [k for k in report.kernels if k[2] == "opencl"]
    assert on_gpu and all(name.startswith("k_") for *_, name in on_gpu)
    assert {k[0] for k in report.kernels} == {a.node for a in report.assignments}
    assert "0 of 4 nodes run a numpy reference" in kernel_lines(report)


def test_bench_profile_marks_reference_steps(tmp_path, capsys):
    assert main(["bench", _model(tmp_path), "--num-runs", "2", "--warmup-runs", "0", "--profile"]) == 0
    out = capsys.readouterr().out
    marked = [line for line in out.splitlines() if "[reference]" in line]
    assert len(marked) == 1 and "LOCAL_RESPONSE_NORMALIZATION" in marked[0], out


@pytest.mark.parametrize("name", ["mobilenet_v2_int8.tflite", "mobilenet_v3_small_int8.tflite"])
def test_no_shared_int8_model_runs_a_reference(shared_model, name):
    interp = litegpu.Interpreter(model_path=str(shared_model(name)))
    interp.allocate_tensors()
    report = interp.get_delegation_report()
    assert report.kernels and not report.reference_nodes(), kernel_lines(report)
