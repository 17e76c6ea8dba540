"""The plugin manager: loads ``litegpu.backends`` entry points, records failures, never crashes."""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from importlib import metadata

import pluggy

from . import hookspecs
from .backend import Backend
from .errors import BackendUnavailableError
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


class PluginManager:
    """Loads plugins once, and resolves backend names."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.records: list[PluginRecord] = []
        self.backends: dict[str, Backend] = {}
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
                    self.pm.register(plugin, name=ep.name)
                except Exception as exc:  # a broken plugin must not break litegpu
                    rec.error = f"{type(exc).__name__}: {exc}"
                    log.warning("litegpu plugin %r failed to load: %s", ep.name, rec.error)
                    continue
                self._collect(rec, plugin)
            self._loaded = True

    def register(self, plugin: object, name: str) -> None:
        """Register a plugin object directly (tests, embedding applications)."""
        self.load()
        with self._lock:
            rec = PluginRecord(name, repr(plugin))
            self.records.append(rec)
            self.pm.register(plugin, name=name)
            self._collect(rec, plugin)

    def unregister(self, name: str) -> None:
        """Remove a plugin registered with :meth:`register`, and its backends."""
        with self._lock:
            for rec in [r for r in self.records if r.name == name]:
                for backend in rec.backends:
                    self.backends.pop(backend, None)
                self.records.remove(rec)
            plugin = self.pm.get_plugin(name)
            if plugin is not None:
                self.pm.unregister(plugin)

    def _collect(self, rec: PluginRecord, plugin: object) -> None:
        caller = self.pm.subset_hook_caller
        try:
            others = [p for p in self.pm.get_plugins() if p is not plugin]
            for opdefs in caller("litegpu_custom_ops", others)():
                for opdef in opdefs or ():
                    register(opdef)
            for backends in caller("litegpu_backends", others)():
                for backend in backends or ():
                    if backend.name in self.backends:
                        log.warning("backend %r from plugin %r ignored: name already taken",
                                    backend.name, rec.name)
                        continue
                    self.backends[backend.name] = backend
                    rec.backends.append(backend.name)
        except Exception as exc:
            rec.error = f"{type(exc).__name__}: {exc}"
            log.warning("litegpu plugin %r failed: %s", rec.name, rec.error)

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


_MANAGER = PluginManager()


def manager() -> PluginManager:
    """The process-wide plugin manager (plugins load on first use)."""
    _MANAGER.load()
    return _MANAGER
