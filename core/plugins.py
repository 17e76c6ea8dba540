"""The plugin manager: loads ``litegpu.backends`` entry points, records failures, never crashes.

Every backend a plugin returns is checked against the contract when the plugin loads
(:func:`litegpu.backend.contract_problems`, plus a name no other backend has), so a
malformed one is refused here, naming the plugin, rather than failing later. A plugin
with a fault is refused whole: nothing it provides is registered. An entry point's fault is
recorded and logged (``litegpu backends`` lists it; asking for its backend by name says
why it is missing); :meth:`PluginManager.register` raises it as a :class:`PluginError`.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from importlib import metadata
from typing import Callable

import pluggy

from . import hookspecs
from .backend import Backend, contract_problems
from .errors import BackendUnavailableError, PluginError
from .ops.registry import register

log = logging.getLogger(__name__)
ENTRY_POINT_GROUP = "litegpu.backends"


@dataclass
class PluginRecord:
    """One entry point: what it provided, or why it failed to load."""

    name: str
    module: str
    distribution: str = ""
    version: str = ""
    error: str = ""
    backends: list[str] = field(default_factory=list)
    dialects: list[str] = field(default_factory=list)


class PluginManager:
    """Loads plugins once, and resolves backend names."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.records: list[PluginRecord] = []
        self.backends: dict[str, Backend] = {}
        #: Kernel dialects by name (``litegpu_dialects``; :data:`litegpu.codegen.DIALECTS` reads them).
        self.dialects: dict[str, object] = {}
        self._loaded = False
        self._lock = threading.Lock()

    def load(self) -> None:
        """Load every entry point of the group; a failing plugin is recorded and skipped."""
        with self._lock:
            if self._loaded:
                return
            for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
                dist = getattr(ep, "dist", None)
                rec = PluginRecord(ep.name, ep.value, dist.name if dist else "", dist.version if dist else "")
                self.records.append(rec)
                try:
                    plugin = ep.load()
                    _check_not_shadowed(plugin, ep.value)
                    self.pm.register(plugin, name=ep.name)
                except Exception as exc:  # a broken plugin must not break litegpu
                    rec.error = f"{type(exc).__name__}: {exc}"
                    log.warning("litegpu plugin %r failed to load: %s", ep.name, rec.error)
                    continue
                if self._collect(rec, plugin) is not None:
                    self.pm.unregister(plugin)   # refused whole: its hooks are not called again
            self._loaded = True

    def register(self, plugin: object, name: str) -> None:
        """Register a plugin object directly (tests, embedding applications).

        Raises :class:`PluginError`, registering nothing, when the plugin breaks the
        contract (a malformed or duplicate backend) or its hooks raise."""
        self.load()
        with self._lock:
            self.pm.register(plugin, name=name)
            rec = PluginRecord(name, repr(plugin))
            self.records.append(rec)
            fault = self._collect(rec, plugin)
            if fault is not None:
                self.records.remove(rec)
                self.pm.unregister(plugin)
                raise fault

    def unregister(self, name: str) -> None:
        """Remove a plugin registered with :meth:`register`, and its backends."""
        with self._lock:
            for rec in [r for r in self.records if r.name == name]:
                for backend in rec.backends:
                    self.backends.pop(backend, None)
                for dialect in rec.dialects:
                    self.dialects.pop(dialect, None)
                self.records.remove(rec)
            plugin = self.pm.get_plugin(name)
            if plugin is not None:
                self.pm.unregister(plugin)

    def _collect(self, rec: PluginRecord, plugin: object) -> PluginError | None:
        """Register the custom ops and backends ``plugin`` provides. Its backends are checked
        before anything is registered, so a malformed one leaves nothing behind.

        A fault is recorded on ``rec`` and logged, and returned (None when there is none)."""
        try:
            call = self._hooks_of(plugin)
            backends = self._checked_backends(rec, call("litegpu_backends"))
            dialects = self._checked_dialects(rec, call("litegpu_dialects"))
            for opdefs in call("litegpu_custom_ops"):
                for opdef in opdefs or ():
                    register(opdef)
        except PluginError as exc:
            fault = exc
        except Exception as exc:  # a broken plugin must not break litegpu
            fault = PluginError(f"{_who(rec)}: a hook raised {type(exc).__name__}: {exc}")
            fault.__cause__ = exc
        else:
            for backend in backends:
                self.backends[backend.name] = backend
                rec.backends.append(backend.name)
            for dialect in dialects:
                self.dialects[dialect.name] = dialect
                rec.dialects.append(dialect.name)
            return None
        rec.error = f"{type(fault).__name__}: {fault}"
        log.warning("litegpu plugin %r failed: %s", rec.name, rec.error)
        return fault

    def _hooks_of(self, plugin: object) -> Callable[[str], list]:
        """A function calling one hook of ``plugin`` alone, returning its results."""
        others = [p for p in self.pm.get_plugins() if p is not plugin]
        return lambda hook: self.pm.subset_hook_caller(hook, others)()

    def _checked_backends(self, rec: PluginRecord, results: list) -> list[Backend]:
        """The backends of ``litegpu_backends`` results, each checked against the contract."""
        return self._checked(rec, results, "backend", contract_problems, _label)

    def _checked_dialects(self, rec: PluginRecord, results: list) -> list:
        """The dialects of ``litegpu_dialects`` results, each checked for the members codegen reads."""
        return self._checked(rec, results, "dialect", dialect_problems, _kind)

    def _checked(self, rec: PluginRecord, results: list, what: str, problems_of: Callable[[object], list[str]],
                 label: Callable[[object], str]) -> list:
        """The objects of a ``litegpu_<what>s`` hook's results, each checked by ``problems_of``
        and for a name no other plugin's and no earlier one of the same plugin has; raises
        :class:`PluginError` naming the plugin and every fault found."""
        items, faults = [], []
        for result in results:
            if not isinstance(result, (list, tuple)):
                faults.append(f"litegpu_{what}s() must return a list of {what}s, got {_kind(result)}")
                continue
            items += result
        names: dict[str, int] = {}
        for i, item in enumerate(items):
            problems = problems_of(item)
            if not problems:
                problems = self._name_clash(what, item.name, names.get(item.name))
                names.setdefault(item.name, i)
            if problems:
                faults.append(f"{what} {i} ({label(item)}): " + "; ".join(problems))
        if faults:
            raise PluginError(f"{_who(rec)}: " + "; ".join(faults))
        return items

    def _name_clash(self, what: str, name: str, earlier: int | None) -> list[str]:
        """Why ``name`` cannot be registered as a ``what`` ("backend", "dialect"): one of
        another plugin has it, or an ``earlier`` one (by position) of the same plugin."""
        if name in getattr(self, f"{what}s"):
            owner = next((r.name for r in self.records if name in getattr(r, f"{what}s")), "?")
            return [f"name {name!r} is already taken by plugin {owner!r}"]
        if earlier is not None:
            return [f"name {name!r} is already taken by {what} {earlier} of the same plugin"]
        return []

    def backend(self, name: str) -> Backend:
        """The backend called ``name``; raises with the alternatives when there is none."""
        self.load()
        backend = self.backends.get(name)
        if backend is None:
            failed = [f"{r.name} ({r.error})" for r in self.records if r.error]
            raise BackendUnavailableError(
                f"no backend named {name!r}; available: {sorted(self.backends)}"
                + (f"; plugins that failed to load: {failed}" if failed else ""))
        return backend

    def available_backend(self, name: str) -> Backend:
        """Like :meth:`backend`, but also raise when the backend reports itself unavailable."""
        backend = self.backend(name)
        ok, why = backend.available()
        if not ok:
            raise BackendUnavailableError(f"backend {name!r} is unavailable: {why}")
        return backend


_DIALECT_MEMBERS = {"suffix": str, "max_buffers": int, "max_lanes": int, "max_local_bytes": int, "int64": bool,
                    "flat_launches": bool}
_DIALECT_METHODS = ("prelude", "storage_dtype", "render")


def dialect_problems(dialect: object) -> list[str]:
    """What is wrong with a dialect a plugin returns (see ``hookspecs.litegpu_dialects``);
    empty when nothing is."""
    name = getattr(dialect, "name", None)
    if not isinstance(name, str) or not name:
        return [f"name must be a non-empty str, got {name!r}"]
    problems = [f"{member} must be of type {kind.__name__}, got {getattr(dialect, member, None)!r}"
                for member, kind in _DIALECT_MEMBERS.items() if not isinstance(getattr(dialect, member, None), kind)]
    return problems + [f"{method} must be a method" for method in _DIALECT_METHODS
                       if not callable(getattr(dialect, method, None))]


def _check_not_shadowed(plugin: object, value: str) -> None:
    """Raise PluginError when the entry point loaded a namespace package: a folder of the
    plugin's name without ``__init__.py`` found first on ``sys.path`` (files an older
    install left behind, such as a numba cache in the package's ``__pycache__``), which
    hides the real package and would load as a plugin that provides nothing."""
    if getattr(plugin, "__file__", None) is None and hasattr(plugin, "__path__"):
        folders = ", ".join(str(p) for p in plugin.__path__)
        raise PluginError(f"{value} is hidden by {folders}: a folder of that name without __init__.py (left "
                          f"behind by an earlier install?) comes first on sys.path; delete that folder")


def _who(rec: PluginRecord) -> str:
    """The plugin of ``rec`` as an error names it: its name, and where it came from."""
    if not rec.distribution:   # registered directly: its name is all there is
        return f"plugin {rec.name!r}"
    return f"plugin {rec.name!r} (entry point {rec.module}, distribution {rec.distribution} {rec.version})"


def _kind(value: object) -> str:
    return f"a {type(value).__module__}.{type(value).__qualname__}"


def _label(backend: object) -> str:
    """A backend as an error names it: its name when it has a usable one, and its class."""
    name = getattr(backend, "name", None) if isinstance(backend, Backend) else None
    return f"{name!r}, {_kind(backend)}" if isinstance(name, str) and name else _kind(backend)


_MANAGER = PluginManager()


def manager() -> PluginManager:
    """The process-wide plugin manager (plugins load on first use)."""
    _MANAGER.load()
    return _MANAGER
