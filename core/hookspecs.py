"""The plugin contract: pluggy hook specifications for litegpu plugins.

A plugin is a module or object registered under the ``litegpu.backends`` entry-point
group. Hooks are few and coarse: they are called once when the plugin manager loads,
and per-node or per-run work goes through the objects they return (hook dispatch is
too slow for a hot path).
"""
from __future__ import annotations

import pluggy

from .backend import Backend
from .ops.registry import OpDef

PROJECT = "litegpu"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def litegpu_backends() -> list[Backend]:
    """Return the backends this plugin provides.

    Called once, when the plugin manager loads the plugins. Must be cheap: no driver
    may be opened here; a backend probes its device lazily in ``available()``.

    Dispatch: every plugin's result is collected; the lists are concatenated.

    :returns: backend instances, each with a unique ``name``.
    """


@hookspec
def litegpu_custom_ops() -> list[OpDef]:
    """Return op definitions this plugin adds (e.g. MediaPipe's custom ops).

    Called once, when the plugin manager loads the plugins, before any model is
    planned. Each OpDef is registered under its ``name`` (the custom op's name as it
    appears in ``OperatorCode.custom_code``).

    Dispatch: every plugin's result is collected.

    :returns: op definitions with attributes, shape inference and a numpy reference.
    """


@hookspec
def litegpu_dialects() -> list:
    """Return the kernel dialects this plugin provides: how :mod:`litegpu.codegen` spells
    kernels for a GPU API (a new GPU API is a plugin module with its dialect and its
    backend, whose ``dialect`` names it).

    A C-family API returns a :class:`litegpu.codegen.Dialect` table (OpenCL C, CUDA C++
    and MSL are three); another family brings a dialect object with the same members
    (``name``, ``suffix``, ``max_buffers``, ``max_lanes``, ``max_local_bytes``, ``int64``,
    ``flat_launches``, ``prelude``, ``storage_dtype`` and ``render``, as
    :class:`litegpu.codegen.wgsl.WgslDialect` does). Called once, when
    the plugin manager loads the plugins; every dialect is then in
    :data:`litegpu.codegen.DIALECTS` by name.

    Dispatch: every plugin's result is collected; names must be unique.

    :returns: dialect objects, each with a unique ``name``.
    """
