"""Fixtures shared by the project's tests."""
from __future__ import annotations

import pytest

from litegpu.plugins import manager


@pytest.fixture(scope="session")
def opencl():
    """The opencl backend; skips, saying why, where it is not installed or has no usable platform."""
    backend = manager().backends.get("opencl")
    if backend is None:
        pytest.skip("the opencl backend is not installed")
    ok, why = backend.available()
    if not ok:
        pytest.skip(f"no usable OpenCL platform here: {why}")
    return backend
