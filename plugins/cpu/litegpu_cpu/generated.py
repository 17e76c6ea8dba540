"""Generated numba sources: written to a cache directory and imported as modules.

A kernel whose constants are baked into its source (the fused elementwise chains, the
direct first conv) is generated as Python text; importing it from a file, rather than
``exec``, lets numba's own disk cache (``cache=True``) keep its machine code between
processes. A source is named by its hash, so identical sources share one module.

The file is a cache like any other: where it cannot be written (a read-only cache
without it, a full disk, a cache root that is a file) the source is compiled from memory
instead and its kernels are compiled without a disk cache (:mod:`.numba_cache`). Files
are written under unique temporary names and renamed into place, so threads and
processes that generate the same source at once each see a whole file.
"""
from __future__ import annotations

import hashlib
import importlib.util
import sys
import threading
import types
from pathlib import Path

from . import numba_cache

_LOADED: dict[tuple[str, str], object] = {}
# Held while a module is imported, so two threads asking for the same source get one
# module (and numba one dispatcher) rather than racing on sys.modules and the file.
_LOCK = threading.Lock()


def cache_dir() -> Path:
    """Where generated kernel modules live: ``generated`` in :func:`.numba_cache.home_path`
    (under :func:`litegpu.env.cache_root`, per litegpu and numba version)."""
    return numba_cache.home_path() / "generated"


def load_generated(source: str, name: str):
    """The object called ``name`` in module ``source``, imported from the cache directory
    (``<name>_<digest>.py``, written there first when missing or different), or from memory
    where that file cannot be written."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    found = _LOADED.get((name, digest))
    if found is not None:
        return found
    with _LOCK:
        found = _LOADED.get((name, digest))
        if found is None:
            module = _import(source, name, digest)
            found = _LOADED[(name, digest)] = getattr(module, name)
    return found


def _import(source: str, name: str, digest: str) -> types.ModuleType:
    module_name = f"litegpu_{name}_{digest}"
    path = cache_dir() / f"{name}_{digest}.py"
    if _source_file(path, source):
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
    else:
        spec = None
        module = types.ModuleType(module_name)
    # Before its code runs: numba asks the cache locators when the decorators run.
    setattr(module, numba_cache.GENERATED_MARK, True)
    sys.modules[module_name] = module
    try:
        if spec is not None:
            spec.loader.exec_module(module)
        else:
            # A name that is no file: nothing for numba to stamp or cache it by.
            exec(compile(source, f"<litegpu generated {path.name}>", "exec"), module.__dict__)
    except BaseException:
        sys.modules.pop(module_name, None)
        raise
    return module


def _source_file(path: Path, source: str) -> bool:
    """True when ``path`` holds ``source`` (written now if missing or different and the
    cache is writable); False when it cannot be made to."""
    try:
        if path.read_text(encoding="utf-8") == source:
            return True
    except (OSError, UnicodeDecodeError):
        pass      # missing, unreadable, truncated mid-character: (re)write it
    home = numba_cache.home()
    if home.mode != numba_cache.WRITABLE:
        return False
    try:
        path.parent.mkdir(mode=0o700, exist_ok=True)
        numba_cache.write_atomically(path, source.encode())
    except OSError as exc:
        home.stop_writing(exc)
        return False
    return True
