"""Fixtures shared by the project's tests, and the rule for skipping: only what was not asked for.

A test may skip because something it needs is missing here (an OpenCL driver, clang),
and the skip says what. But a skip is a pass in the exit code, so whatever the run
declares it needs must fail instead of skipping when absent:

- ``opencl`` is required when it is one of the backends named for the run
  (``--litegpu-backend`` or ``LITEGPU_TEST_BACKENDS``), as CI names it;
- any need listed in ``LITEGPU_TEST_REQUIRE`` (comma-separated: ``opencl``, ``clang``,
  ``models`` for the shared .tflite models) is required.
"""
from __future__ import annotations

import os

import pytest

from litegpu.plugins import manager
from litegpu.testing.pytest_plugin import requested_backends

REQUIRE_ENV = "LITEGPU_TEST_REQUIRE"
KNOWN_NEEDS = ("opencl", "clang", "models", "nvrtc", "webgpu")


def required(config: pytest.Config) -> set[str]:
    """The needs this run must not skip for."""
    needs = {n.strip() for n in os.environ.get(REQUIRE_ENV, "").split(",") if n.strip()}
    unknown = needs - set(KNOWN_NEEDS)
    if unknown:
        # A misspelled need would otherwise be ignored, and its tests skip into a pass.
        raise pytest.UsageError(f"${REQUIRE_ENV} names {sorted(unknown)}; known needs: {list(KNOWN_NEEDS)}")
    names, _ = requested_backends(config)
    return needs | ({"opencl"} & set(names))


def pytest_configure(config: pytest.Config) -> None:
    """Check ``LITEGPU_TEST_REQUIRE`` before any test runs."""
    required(config)


def _skip_unless_required(config: pytest.Config, need: str, why: str) -> None:
    if need not in KNOWN_NEEDS:
        raise ValueError(f"unknown need {need!r}; add it to KNOWN_NEEDS")
    if need in required(config):
        pytest.fail(f"{why} (this run requires {need}: see tests/conftest.py)", pytrace=False)
    pytest.skip(why)


@pytest.fixture(scope="session")
def skip_unless_required(request: pytest.FixtureRequest):
    """``f(need, why)``: skip saying ``why``, or fail when this run requires ``need``."""
    return lambda need, why: _skip_unless_required(request.config, need, why)


@pytest.fixture(scope="session")
def opencl(skip_unless_required):
    """The opencl backend; skips, saying why, where it is not installed or has no usable platform."""
    backend = manager().backends.get("opencl")
    if backend is None:
        skip_unless_required("opencl", "the opencl backend is not installed")
    ok, why = backend.available()
    if not ok:
        skip_unless_required("opencl", f"no usable OpenCL platform here: {why}")
    return backend


@pytest.fixture(params=["cpu", "opencl"])
def backend_name(request: pytest.FixtureRequest) -> str:
    """A test on cpu and on opencl; the opencl one skips (or fails, where required) as the
    ``opencl`` fixture does, never by a check of its own."""
    if request.param == "opencl":
        request.getfixturevalue("opencl")
    return request.param
