"""The litegpu command line, run as a user runs it (a subprocess of the installed entry point)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from litegpu.testing.builder import ModelBuilder

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "models"


def litegpu(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "litegpu.cli", *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def small_model(tmp_path_factory) -> Path:
    b = ModelBuilder()
    x = b.input("x", (1, 4))
    c = b.const("c", np.arange(4, dtype=np.float32).reshape(1, 4))
    y = b.tensor("y", (1, 4))
    b.op("ADD", [x, c], [y], fused_activation_function="RELU")
    b.output(y)
    path = tmp_path_factory.mktemp("cli") / "add_relu.tflite"
    path.write_bytes(b.build())
    return path


def test_help_lists_commands() -> None:
    out = litegpu("--help")
    assert out.returncode == 0
    for cmd in ("run", "inspect", "bench", "backends"):
        assert cmd in out.stdout


def test_backends_lists_cpu_with_versions() -> None:
    out = litegpu("backends")
    assert out.returncode == 0
    assert "cpu: available" in out.stdout and "numba:" in out.stdout


def test_run_with_npy_input(small_model: Path, tmp_path: Path) -> None:
    x = np.array([[-5, 1, -1, 2]], np.float32)
    np.save(tmp_path / "x.npy", x)
    out = litegpu("run", str(small_model), "--input", str(tmp_path / "x.npy"), "--save", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "invoke:" in out.stdout
    np.testing.assert_array_equal(np.load(tmp_path / "output_2.npy"), np.maximum(x + np.arange(4), 0))


def test_inspect_prints_ops_and_report(small_model: Path) -> None:
    out = litegpu("inspect", str(small_model), "--tensors")
    assert out.returncode == 0, out.stderr
    assert "ADDx1" in out.stdout and "partition 0: cpu" in out.stdout
    assert "tensor 1 'c' FLOAT32[1, 4] const" in out.stdout


def test_bench_compare_litert(small_model: Path) -> None:
    pytest.importorskip("ai_edge_litert")
    out = litegpu("bench", str(small_model), "--num-runs", "20", "--warmup-runs", "2", "--compare-litert")
    assert out.returncode == 0, out.stderr
    assert "median" in out.stdout and "ratio litegpu/LiteRT" in out.stdout
    assert "max abs error relative to output scale: 0" in out.stdout


def test_bad_model_exit_code_and_message(tmp_path: Path) -> None:
    bad = tmp_path / "bad.tflite"
    bad.write_bytes(b"\x00" * 64)
    out = litegpu("run", str(bad))
    assert out.returncode == 1
    assert "litegpu: error:" in out.stderr and "identifier" in out.stderr
    missing = litegpu("run", str(tmp_path / "missing.tflite"))
    assert missing.returncode == 1 and "cannot read model file" in missing.stderr
    assert litegpu("frobnicate").returncode == 2
