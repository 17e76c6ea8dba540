"""The litegpu pytest plugin: a ``backend`` fixture that runs a test on every backend.

Registered under the ``pytest11`` entry-point group, so it is active wherever litegpu
is installed. Choosing backends, first match wins:

- ``--litegpu-backend NAME`` (repeatable, or comma-separated);
- the environment variable ``LITEGPU_TEST_BACKENDS=cpu,opencl``;
- otherwise every backend the plugin manager lists whose ``available()`` is true.

A backend named by either of the first two must be usable: a name no plugin provides,
or a backend that says it is unavailable here, ends the run with a usage error (exit
code 4) naming the backend, why it cannot be used, and the backends that can. A
misspelled name must never turn a run of skips into a pass. By default, backends that
are unavailable are left out, and the terminal summary says which and why; a backend
whose ``available()`` raises is an error in either mode.

``--litegpu-precision f16`` asks GPU backends for F16 (LiteRT's ``precision_loss_allowed``:
half storage, half arithmetic where the device has it), ``f32_f16`` for half storage with
float arithmetic; the ``litegpu_precision`` fixture gives ``"f32"`` (the default),
``"f32_f16"`` or ``"f16"``.

The check runs when collection finishes, so a backend registered by a ``-p`` plugin, a
conftest or a test module during collection counts. The fixture's value is the
backend's name; test ids carry it first (``test_op[cpu-CONV_2D-stride2-same]``), and
nothing else that varies between runs. Importing the plugin loads no litegpu plugin:
that happens only when a test asks for ``backend`` or a backend is named.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import pytest

ENV_VAR = "LITEGPU_TEST_BACKENDS"
OPTION = "--litegpu-backend"
PRECISION_OPTION = "--litegpu-precision"
PRECISIONS = ("f32", "f32_f16", "f16")


@dataclass
class Selection:
    """The backends tests run on, and what could not be chosen."""

    names: list[str]
    source: str                        # OPTION, "$" + ENV_VAR, or "" for the default
    problems: list[str] = field(default_factory=list)     # each makes the run a usage error
    left_out: dict[str, str] = field(default_factory=dict)  # default mode: name -> why unavailable


_SELECTION = pytest.StashKey[Selection]()


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add ``--litegpu-backend``."""
    group = parser.getgroup("litegpu")
    group.addoption(OPTION, action="append", dest="litegpu_backends", default=None,
                    metavar="NAME",
                    help=f"run litegpu backend tests on NAME (repeatable; default: ${ENV_VAR} "
                         "or every available backend); an unknown or unavailable NAME is an error")
    group.addoption(PRECISION_OPTION, dest="litegpu_precision", default=PRECISIONS[0], choices=PRECISIONS,
                    help="the precision GPU backends run in: f32 (default), f32_f16 (half storage, float "
                         "arithmetic) or f16 (LiteRT's precision_loss_allowed: half storage, half arithmetic "
                         "where the device has it)")


def _split(values) -> list[str]:
    names: list[str] = []
    for v in values:
        for name in str(v).split(","):
            name = name.strip()
            if name and name not in names:
                names.append(name)
    return names


def requested_backends(config: pytest.Config) -> tuple[list[str], str]:
    """The backend names asked for explicitly and where (option or variable); ``([], "")`` if none."""
    asked = config.getoption("litegpu_backends", default=None)
    if asked:
        return _split(asked), OPTION
    env = os.environ.get(ENV_VAR, "")
    if env.strip():   # blank counts as unset; "," names nothing and is reported
        return _split([env]), f"${ENV_VAR}"
    return [], ""


def _probe(backend) -> tuple[bool | None, str]:
    """``(ok, why)``; ``ok`` is None when ``available()`` raised, which is a defect to report."""
    try:
        ok, why = backend.available()
    except Exception as exc:
        return None, f"available() raised {type(exc).__name__}: {exc}"
    return bool(ok), str(why or "")


def _select(config: pytest.Config) -> Selection:
    from litegpu.plugins import manager
    mgr = manager()
    names, source = requested_backends(config)
    if not source:
        sel = Selection([], "")
        for name, backend in sorted(mgr.backends.items()):
            ok, why = _probe(backend)
            if ok:
                sel.names.append(name)
            elif ok is None:
                sel.problems.append(f"litegpu backend {name!r}: {why}")
            else:
                sel.left_out[name] = why
        if not sel.names and not sel.problems:
            sel.problems.append("no litegpu backend is available here, not even cpu")
        return sel
    sel = Selection(names, source)
    if not names:
        sel.problems.append(f"{source} is set but names no backend")
    for name in names:
        backend = mgr.backends.get(name)
        if backend is None:
            sel.problems.append(f"{source} names {name!r}, but no installed plugin provides a backend "
                                "of that name")
            continue
        ok, why = _probe(backend)
        if not ok:
            sel.problems.append(f"{source} names {name!r}, which cannot be used here: "
                                f"{why or 'available() gave no reason'}")
    return sel


def selection(config: pytest.Config) -> Selection:
    """The run's :class:`Selection`, worked out once per session."""
    if _SELECTION not in config.stash:
        config.stash[_SELECTION] = _select(config)
    return config.stash[_SELECTION]


def selected_backends(config: pytest.Config) -> list[str]:
    """The backend names tests are parametrized over, in the order asked for."""
    return selection(config).names


def _usable_summary() -> str:
    """The backends that can be used here, and those that cannot with why: for error messages."""
    from litegpu.plugins import manager
    mgr = manager()
    usable, not_usable = [], []
    for name, backend in sorted(mgr.backends.items()):
        ok, why = _probe(backend)
        (usable if ok else not_usable).append(name if ok else f"{name} ({why})")
    lines = [f"available litegpu backends: {', '.join(usable) or 'none'}"]
    if not_usable:
        lines.append(f"installed but unavailable: {'; '.join(not_usable)}")
    failed = [f"{r.name} ({r.error})" for r in mgr.records if r.error]
    if failed:
        lines.append(f"plugins that failed to load: {'; '.join(failed)}")
    return "\n".join(lines)


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize every test that uses the ``backend`` fixture, backend first in the id."""
    if "backend" in metafunc.fixturenames:
        names = selected_backends(metafunc.config)
        metafunc.parametrize("backend", names, ids=names, indirect=True)


def pytest_collection_finish(session: pytest.Session) -> None:
    """End the run with a usage error when the backends asked for cannot all be used."""
    config = session.config
    if _SELECTION not in config.stash and not requested_backends(config)[1]:
        return   # no test asked for a backend and none was named: litegpu stays unloaded
    sel = selection(config)
    if sel.problems:
        raise pytest.UsageError("\n".join(sel.problems) + "\n" + _usable_summary())


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    """Say which backends ran, and which were left out by default and why."""
    if _SELECTION not in config.stash:
        return
    sel = config.stash[_SELECTION]
    if sel.problems:
        return   # the usage error says it all
    line = f"litegpu backends tested: {', '.join(sel.names) or 'none'}"
    if sel.source:
        line += f" (from {sel.source})"
    if config.getoption("litegpu_precision", default=PRECISIONS[0]) != PRECISIONS[0]:
        line += f"; precision {config.getoption('litegpu_precision')} (from {PRECISION_OPTION})"
    terminalreporter.write_line(line)
    for name, why in sel.left_out.items():
        terminalreporter.write_line(f"litegpu backend {name!r} left out, unavailable here: {why}")


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """The name of the backend under test.

    Every name reaching here was checked when collection finished, so a backend that
    cannot be used now fails the test rather than skipping it.
    """
    from litegpu.errors import BackendUnavailableError
    from litegpu.plugins import manager
    name = getattr(request, "param", None)
    if name is None:
        pytest.fail("the backend fixture was not parametrized by the litegpu plugin", pytrace=False)
    try:
        manager().available_backend(name)
    except BackendUnavailableError as exc:
        pytest.fail(f"litegpu backend {name!r} became unavailable during the run: {exc}", pytrace=False)
    return name


@pytest.fixture
def litegpu_precision(request: pytest.FixtureRequest) -> str:
    """``"f32"`` or ``"f16"``: the precision ``--litegpu-precision`` asks GPU backends for."""
    return request.config.getoption("litegpu_precision", default=PRECISIONS[0])
