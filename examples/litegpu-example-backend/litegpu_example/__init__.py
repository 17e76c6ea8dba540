"""An example litegpu backend plugin, installed from outside the litegpu tree.

litegpu loads this module through the ``litegpu.backends`` entry point and calls the
hook below once; it must stay cheap.
"""
from __future__ import annotations

from litegpu.hookspecs import hookimpl


@hookimpl
def litegpu_backends():
    """The "example" backend."""
    from .backend import ExampleBackend
    return [ExampleBackend()]
