"""Generated numba sources: written to a cache directory and imported as modules.

A kernel whose constants are baked into its source (the fused elementwise chains, the
direct first conv) is generated as Python text; importing it from a file, rather than
``exec``, lets numba's own disk cache (``cache=True``) keep its machine code between
processes. A source is named by its hash, so identical sources share one module.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path

from litegpu import env

_LOADED: dict[tuple[str, str], object] = {}


def cache_dir() -> Path:
    """Where generated kernel modules live: ``numba`` under :func:`litegpu.env.cache_root`."""
    return env.cache_root() / "numba"


def load_generated(source: str, name: str):
    """The object called ``name`` in module ``source``, imported from the cache directory
    (``<name>_<digest>.py``, written there first when missing or different)."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    found = _LOADED.get((name, digest))
    if found is not None:
        return found
    directory = cache_dir()
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = directory / f"{name}_{digest}.py"
    if not path.exists() or path.read_text() != source:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(source)
        os.replace(tmp, path)
    module_name = f"litegpu_{name}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    found = _LOADED[(name, digest)] = getattr(module, name)
    return found
