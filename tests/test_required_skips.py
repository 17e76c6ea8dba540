"""What a run declares it needs fails when absent, instead of skipping into a green exit code.

The rule lives in tests/conftest.py; these tests run our own test files in a
subprocess with the need taken away (an empty OpenCL vendor folder, a PATH without
clang) and check the skip turns into a failure exactly when the need is required.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
OPENCL_TEST = "test_opencl_runtime.py::test_fully_delegated_model_moves_only_its_inputs_and_outputs"
CLANG_TEST = "test_opencl_f16_source.py::test_checker_catches_half_arithmetic_mistakes"


def _pytest(node: str, env: dict) -> subprocess.CompletedProcess:
    # The caller's settings on top of ours, never the ones this run was started with.
    ours = {k: v for k, v in os.environ.items() if k not in (
        "LITEGPU_TEST_BACKENDS", "LITEGPU_TEST_REQUIRE", "LITEGPU_OPENCL_DEVICE", "LITEGPU_OPENCL_PLATFORM")}
    env = {**ours, **env}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", node],
                          cwd=TESTS, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture
def no_opencl(tmp_path) -> dict:
    """Environment of a machine without an OpenCL driver (the ocl-icd loader finds no vendor)."""
    vendors = tmp_path / "no_vendors"
    vendors.mkdir()
    return {"OCL_ICD_VENDORS": str(vendors)}


def test_missing_opencl_skips_saying_why_when_not_required(opencl, no_opencl):
    done = _pytest(OPENCL_TEST, no_opencl)
    assert done.returncode == 0, done.stdout[-2000:]
    assert "1 skipped" in done.stdout and "no usable OpenCL platform here" in done.stdout, done.stdout[-2000:]


@pytest.mark.parametrize("how", [{"LITEGPU_TEST_REQUIRE": "opencl"}, {"LITEGPU_TEST_REQUIRE": "clang, opencl"}])
def test_missing_opencl_fails_when_required(opencl, no_opencl, how):
    done = _pytest(OPENCL_TEST, {**no_opencl, **how})
    assert done.returncode == 1, done.stdout[-2000:]
    assert "1 error" in done.stdout and "this run requires opencl" in done.stdout, done.stdout[-2000:]


def test_missing_opencl_is_a_usage_error_when_named_as_a_backend(opencl, no_opencl):
    done = _pytest(OPENCL_TEST, {**no_opencl, "LITEGPU_TEST_BACKENDS": "cpu,opencl"})
    assert done.returncode == 4, done.stdout[-2000:] + done.stderr[-2000:]
    assert "$LITEGPU_TEST_BACKENDS names 'opencl', which cannot be used here: no OpenCL platform found" \
        in done.stderr, done.stderr[-2000:]


def test_missing_clang_fails_when_required():
    # Only the interpreter's folder on PATH: no clang-15, no clang.
    env = {"PATH": str(Path(sys.executable).parent)}
    done = _pytest(CLANG_TEST, {**env, "LITEGPU_TEST_REQUIRE": "clang"})
    assert done.returncode == 1, done.stdout[-2000:]
    assert "4 errors" in done.stdout and "this run requires clang" in done.stdout, done.stdout[-2000:]
    done = _pytest(CLANG_TEST, env)
    assert done.returncode == 0 and "skipped" in done.stdout and "clang-15 (or clang) not found" in done.stdout, \
        done.stdout[-2000:]


def test_a_misspelled_need_is_a_usage_error():
    done = _pytest(CLANG_TEST, {"LITEGPU_TEST_REQUIRE": "clagn"})
    assert done.returncode == 4, done.stdout[-2000:] + done.stderr[-2000:]
    assert "$LITEGPU_TEST_REQUIRE names ['clagn']; known needs: ['opencl', 'clang', 'models', 'nvrtc']" in done.stderr


def test_missing_shared_models_fail_when_required(tmp_path):
    node = "test_shared_models.py::test_the_shared_models_are_here"
    env = {"LITEGPU_SHARED_MODELS": str(tmp_path / "nothing_here")}
    done = _pytest(node, {**env, "LITEGPU_TEST_REQUIRE": "models"})
    assert done.returncode == 1 and "this run requires models" in done.stdout, done.stdout[-2000:]
    done = _pytest(node, env)
    assert done.returncode == 0 and "1 skipped" in done.stdout and "no shared models at" in done.stdout, \
        done.stdout[-2000:]
