"""litegpu's Metal backend: kernels rendered as Metal Shading Language by
:mod:`litegpu.codegen`, compiled at run time through PyObjC's Metal bindings
(litegpu's ``[metal]`` extra, on macOS).

Registered under the ``litegpu.backends`` entry-point group like any third-party
backend. Anywhere but macOS with a Metal device it is listed as unavailable, saying why.
"""
from __future__ import annotations

from litegpu.hookspecs import hookimpl


@hookimpl
def litegpu_backends():
    """The metal backend (it opens its device lazily, in ``available()``)."""
    from .backend import MetalBackend
    return [MetalBackend()]


@hookimpl
def litegpu_dialects():
    """The MSL dialect its kernels render in."""
    from litegpu.codegen.metal import METAL
    return [METAL]
