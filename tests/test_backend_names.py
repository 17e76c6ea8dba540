"""A backend asked for by name is used or refused, loudly: never a quiet fallback.

Every public way of naming a backend (``load_delegate``, ``CompiledModel(backend=)``,
``Options(backend=)``, ``Interpreter`` delegates) must raise, naming the backend, why it
cannot be used and what can, for a name nobody provides and for a backend that is
installed but unavailable here.
"""
from __future__ import annotations

import numpy as np
import pytest

import litegpu
from litegpu.backend import Backend
from litegpu.hookspecs import hookimpl
from litegpu.plugins import manager
from litegpu.testing.builder import ModelBuilder


def _model() -> bytes:
    b = ModelBuilder()
    x = b.input("x", (2, 2), np.float32)
    y = b.tensor("y", (2, 2), np.float32)
    b.op("ADD", [x, x], [y])
    b.output(y)
    return b.build()


class _Absent(Backend):
    name = "absent"
    is_gpu = True

    def available(self):
        return False, "its device is unplugged"


class _AbsentPlugin:
    @hookimpl
    def litegpu_backends(self):
        return [_Absent()]


@pytest.fixture
def absent():
    """An installed backend that says it cannot run here."""
    manager().register(_AbsentPlugin(), "absent-plugin")
    yield "absent"
    manager().unregister("absent-plugin")


_WAYS = {
    "load_delegate": lambda name: litegpu.load_delegate(name),
    "CompiledModel(backend=)": lambda name: litegpu.CompiledModel.from_buffer(_model(), backend=name),
    "Options(backend=)": lambda name: litegpu.CompiledModel.from_buffer(
        _model(), options=litegpu.Options(backend=name)),
}


@pytest.mark.parametrize("way", sorted(_WAYS))
def test_a_name_nobody_provides_raises_listing_the_backends_there_are(way):
    with pytest.raises(litegpu.BackendUnavailableError, match="no backend named 'nosuch'") as caught:
        _WAYS[way]("nosuch")
    assert "available: [" in str(caught.value) and "'cpu'" in str(caught.value), str(caught.value)


@pytest.mark.parametrize("way", sorted(_WAYS))
def test_an_installed_but_unavailable_backend_raises_saying_why(absent, way):
    with pytest.raises(litegpu.BackendUnavailableError, match="'absent' is unavailable: its device is unplugged"):
        _WAYS[way](absent)


def test_the_absent_backend_is_really_installed(absent):
    """Guards the test above: it must fail for unavailability, not for an unknown name."""
    assert manager().backend(absent).available() == (False, "its device is unplugged")

