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

from conftest import KNOWN_NEEDS

TESTS = Path(__file__).resolve().parent
OPENCL_TEST = "test_opencl_runtime.py::test_fully_delegated_model_moves_only_its_inputs_and_outputs"
CLANG_TEST = "test_opencl_f16_source.py::test_checker_catches_half_arithmetic_mistakes"


def _pytest(node: str | list[str], env: dict) -> subprocess.CompletedProcess:
    # The caller's settings on top of ours, never the ones this run was started with.
    ours = {k: v for k, v in os.environ.items() if k not in (
        "LITEGPU_TEST_BACKENDS", "LITEGPU_TEST_REQUIRE", "LITEGPU_OPENCL_DEVICE", "LITEGPU_OPENCL_PLATFORM")}
    env = {**ours, **env}
    nodes = [node] if isinstance(node, str) else node
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", *nodes],
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
    assert f"$LITEGPU_TEST_REQUIRE names ['clagn']; known needs: {list(KNOWN_NEEDS)}" in done.stderr


def test_missing_shared_models_fail_when_required(tmp_path):
    node = "test_shared_models.py::test_the_shared_models_are_here"
    env = {"LITEGPU_SHARED_MODELS": str(tmp_path / "nothing_here")}
    done = _pytest(node, {**env, "LITEGPU_TEST_REQUIRE": "models"})
    assert done.returncode == 1 and "this run requires models" in done.stdout, done.stdout[-2000:]
    done = _pytest(node, env)
    assert done.returncode == 0 and "1 skipped" in done.stdout and "no shared models at" in done.stdout, \
        done.stdout[-2000:]


# A test that reads one shared model through the ``shared_model`` fixture, and one over
# every shared model (parametrized by litegpu.testing.shared_models.NONE where there are none).
ONE_SHARED_MODEL = "test_shared_models.py::test_int8_model_is_read_whole"
EVERY_SHARED_MODEL = "test_shared_models.py::test_model_matches_litert"


@pytest.mark.parametrize("folder", ["absent", "empty"])
def test_a_missing_shared_model_skips_naming_it_and_where_it_looked(tmp_path, folder):
    where = tmp_path / "models"
    if folder == "empty":
        where.mkdir()
    done = _pytest([ONE_SHARED_MODEL, EVERY_SHARED_MODEL], {"LITEGPU_SHARED_MODELS": str(where)})
    assert done.returncode == 0 and "2 skipped" in done.stdout, done.stdout[-2000:]
    assert f"no shared model mobilenet_v2_int8.tflite at {where} (set LITEGPU_SHARED_MODELS)" in done.stdout, \
        done.stdout[-2000:]
    assert f"no shared models at {where} (set LITEGPU_SHARED_MODELS)" in done.stdout, done.stdout[-2000:]


def test_a_missing_shared_model_fails_when_models_are_required(tmp_path):
    done = _pytest([ONE_SHARED_MODEL, EVERY_SHARED_MODEL],
                   {"LITEGPU_SHARED_MODELS": str(tmp_path / "nothing_here"), "LITEGPU_TEST_REQUIRE": "models"})
    # The fixture is called in the tests' bodies: failures, not setup errors.
    assert done.returncode == 1 and "2 failed" in done.stdout, done.stdout[-2000:]
    assert done.stdout.count("(set LITEGPU_SHARED_MODELS) (this run requires models") == 2, done.stdout[-2000:]


def test_the_shared_model_fixture_finds_models_where_the_variable_says(tmp_path, shared_model):
    # A folder holding just the one model: found there, so the test runs (and passes).
    where = tmp_path / "models"
    where.mkdir()
    (where / "mobilenet_v2_int8.tflite").write_bytes(shared_model("mobilenet_v2_int8").read_bytes())
    done = _pytest(ONE_SHARED_MODEL, {"LITEGPU_SHARED_MODELS": str(where), "LITEGPU_TEST_REQUIRE": "models"})
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-2000:]


# Files that still find the shared models by themselves, or skip for a missing one with a
# plain pytest.skip: others own them; each is to go through the ``shared_model`` fixture.
def test_only_litegpu_testing_shared_models_says_where_the_shared_models_are():
    """One place computes the folder (``$LITEGPU_SHARED_MODELS`` or ``../shared/models``),
    and no test skips for a missing shared model except through the fixture."""
    sources = [*TESTS.glob("*.py"), *(TESTS.parent / "core" / "testing").glob("*.py")]
    offenders = []
    for path in sources:
        if path.name in {"shared_models.py", Path(__file__).name}:
            continue
        text = path.read_text()
        for pattern in ('"shared" / "models"', 'environ.get("LITEGPU_SHARED_MODELS"', 'environ["LITEGPU_SHARED_MODELS"',
                        'pytest.skip(f"no shared model', 'pytest.skip(f"shared model', 'reason="shared model'):
            if pattern in text:
                offenders.append(f"{path.name}: {pattern}")
    assert not offenders, offenders
