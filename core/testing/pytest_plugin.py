"""The litegpu pytest plugin: a ``backend`` fixture that runs a test on every backend.

Registered under the ``pytest11`` entry-point group, so it is active wherever litegpu
is installed. Choosing backends, first match wins:

- ``--litegpu-backend NAME`` (repeatable, or comma-separated);
- the environment variable ``LITEGPU_TEST_BACKENDS=cpu,opencl``;
- otherwise every backend the plugin manager lists whose ``available()`` is true.

A backend asked for by name that is missing or unavailable makes its tests skip, and
the skip states why. The fixture's value is the backend's name; test ids carry it first
(``test_op[cpu-CONV_2D-stride2-same]``), and nothing else that varies between runs.
"""
from __future__ import annotations

import os

import pytest

ENV_VAR = "LITEGPU_TEST_BACKENDS"


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add ``--litegpu-backend``."""
    group = parser.getgroup("litegpu")
    group.addoption("--litegpu-backend", action="append", dest="litegpu_backends", default=None,
                    metavar="NAME",
                    help=f"run litegpu backend tests on NAME (repeatable; default: ${ENV_VAR} "
                         "or every available backend)")


def _split(values) -> list[str]:
    names: list[str] = []
    for v in values:
        for name in str(v).split(","):
            name = name.strip()
            if name and name not in names:
                names.append(name)
    return names


def selected_backends(config: pytest.Config) -> list[str]:
    """The backend names tests are parametrized over, in the order asked for."""
    asked = config.getoption("litegpu_backends", default=None)
    if asked:
        return _split(asked)
    env = os.environ.get(ENV_VAR, "")
    if env.strip():
        return _split([env])
    from litegpu.plugins import manager
    mgr = manager()
    names = []
    for name, backend in sorted(mgr.backends.items()):
        try:
            ok, _ = backend.available()
        except Exception:  # a probing failure means "not available", never a crash of the session
            ok = False
        if ok:
            names.append(name)
    return names


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize every test that uses the ``backend`` fixture, backend first in the id."""
    if "backend" in metafunc.fixturenames:
        names = selected_backends(metafunc.config)
        metafunc.parametrize("backend", names, ids=names, indirect=True)


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """The name of the backend under test; skips, saying why, when it cannot be used here."""
    from litegpu.errors import BackendUnavailableError
    from litegpu.plugins import manager
    name = getattr(request, "param", None)
    if name is None:
        pytest.skip("no litegpu backend selected")
    try:
        manager().available_backend(name)
    except BackendUnavailableError as exc:
        pytest.skip(f"litegpu backend {name!r} unavailable: {exc}")
    except Exception as exc:  # available() itself failed: report it as the reason
        pytest.skip(f"litegpu backend {name!r} unavailable: {type(exc).__name__}: {exc}")
    return name
