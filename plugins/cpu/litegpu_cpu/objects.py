"""Task functions' machine code in litegpu's cache, loaded without numba.

numba's disk cache hands back a compiled function only through numba: the first load in
a process sets up numba's compiler context (its typing and lowering registries), ~0.15 s
of a warm start on the 2-core test machine, though nothing is compiled. A task function
(:class:`.kernels.tasks.TaskFunction`) is a C callback, whose machine code needs none of
that. Its object code, as numba's code generator emitted it, is kept here in a file of
its own and loaded by later processes through :func:`.native.load_object` (llvmlite's JIT
linker), a millisecond or two each.

An entry is ``objects/<key>.o`` in :func:`.numba_cache.home` (so the same modes hold:
read-only caches are loaded from and never written, stores that fail are logged once and
stop, no directory means compiling in memory). The key is the sha256 of everything the
code depends on: the content of the function's source and of every source of the package
(:func:`.numba_cache._content_stamp`), its name, C signature and compile options, numba's
and llvmlite's versions, and the host CPU (name and features: the code uses its
instructions). The file is a header line (JSON: the callback's symbol, the symbols it
needs from the process, the object's sha256) and then the object. An entry whose object
does not match its sha256, or whose header does not parse, is damaged: logged, deleted
where the directory is writable, compiled again, and never handed to the linker. Files
are written under a temporary name and renamed into place, so processes and threads
storing the same entry at once each leave a whole file.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from . import native, numba_cache

log = logging.getLogger("litegpu.cpu.cache")

_MAGIC = b"litegpu-object 1\n"
_LOADED: dict[str, int] = {}      # linked once a process: a second copy would define its symbols again


def key(function, signature, options: dict) -> str | None:
    """The entry name of ``function`` compiled as a C callback of ``signature`` with
    ``options`` (see the module docstring); None for a function with no source file (a
    generated module imported from memory) or when the cache is off."""
    home = numba_cache.home()
    path = getattr(getattr(function, "__code__", None), "co_filename", "")
    if home.mode == numba_cache.OFF or not os.path.isfile(path):
        return None
    digest = hashlib.sha256(_MAGIC)
    for part in (numba_cache._content_stamp(path), function.__module__, function.__qualname__, str(signature),
                 json.dumps(options, sort_keys=True, default=sorted), home.path.name, *native.host_cpu(),
                 *(os.environ.get(v, "") for v in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", "NUMBA_OPT"))):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()


def _path(entry: str) -> Path:
    return numba_cache.home().path / "objects" / f"{entry}.o"


def load(entry: str) -> int:
    """The address of entry ``entry``'s callback, linked into this process; 0 when there is
    no such entry (or it is damaged: then logged and deleted, see the module docstring)."""
    if entry in _LOADED:
        return _LOADED[entry]
    path = _path(entry)
    try:
        data = path.read_bytes()
    except OSError:
        return 0
    try:
        if not data.startswith(_MAGIC):
            raise ValueError("not a litegpu object entry")
        header, _, code = data[len(_MAGIC):].partition(b"\n")
        meta = json.loads(header)
        if hashlib.sha256(code).hexdigest() != meta["sha256"]:
            raise ValueError("the object does not match its sha256")
        symbol, needs = str(meta["symbol"]), [str(n) for n in meta["needs"]]
    except (ValueError, KeyError, TypeError) as exc:     # truncated, garbage, another format
        _drop_damaged(path, exc)
        return 0
    try:
        address = _LOADED[entry] = native.load_object(code, symbol, needs)
    except native.NativeError as exc:
        log.warning("cannot link cached kernel %s (%s); compiling it with numba", path.name, exc)
        return 0
    return address


def store(entry: str, compiled) -> None:
    """Keep numba's C callback ``compiled`` as entry ``entry`` where the cache is writable
    and its code links without numba (it needs nothing from numba's runtime: see
    :func:`.native.resolvable`); never raises into the run."""
    home = numba_cache.home()
    if home.mode != numba_cache.WRITABLE:
        return
    library = compiled._library
    # A fresh compile keeps its object in the library; one numba loaded from its own cache
    # had it consumed by the linker, and :mod:`.numba_cache` kept a copy.
    code = getattr(library, numba_cache.OBJECT_COPY, None)
    try:
        code = code or library._get_compiled_object()
    except Exception as exc:    # a numba that keeps its objects elsewhere: numba still runs it
        log.debug("no object code for %s (%s): not cached", compiled, exc)
        return
    needs = native.undefined_symbols(code)
    if needs is None or not native.resolvable(needs):
        log.debug("%s needs what litegpu cannot link without numba (%s): not cached", compiled, needs)
        return
    header = json.dumps({"symbol": compiled.native_name, "needs": needs,
                         "sha256": hashlib.sha256(code).hexdigest()}).encode()
    path = _path(entry)
    try:
        path.parent.mkdir(mode=0o700, exist_ok=True)
        numba_cache.write_atomically(path, _MAGIC + header + b"\n" + code)
    except OSError as exc:
        home.stop_writing(exc)


def _drop_damaged(path: Path, exc: BaseException) -> None:
    if numba_cache.home().mode != numba_cache.WRITABLE:
        log.warning("cached kernel %s is damaged (%s); compiling again (read-only: left in place)", path, exc)
        return
    log.warning("cached kernel %s is damaged (%s); deleting it and compiling again", path, exc)
    try:
        path.unlink()
    except OSError:
        pass
