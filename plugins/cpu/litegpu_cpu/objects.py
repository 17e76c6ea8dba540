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

Entries built ahead of time: ``litegpu prebuild`` (:mod:`.prebuild`) compiles every task
function of the package once, at install, into :func:`prebuilt_dir` (the package's
``prebuilt`` folder, or ``$LITEGPU_PREBUILT_DIR``; set it empty to use none). Entries are
the same files under the same keys, so an entry there is exactly what this process would
compile: the first process on a machine links them as a warm one does, and its answers are
the bits of every later one. That folder is only read at run time; a damaged entry in it
is logged and compiled around, never deleted; one that is group- or world-writable, or
owned by someone else, is not used (its files are code).
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
    generated module imported from memory) or when the cache is off and nothing is prebuilt."""
    path = getattr(getattr(function, "__code__", None), "co_filename", "")
    if not os.path.isfile(path) or (numba_cache.home().mode == numba_cache.OFF and prebuilt_dir() is None):
        return None
    digest = hashlib.sha256(_MAGIC)
    for part in (numba_cache._content_stamp(path), function.__module__, function.__qualname__, str(signature),
                 json.dumps(options, sort_keys=True, default=sorted), numba_cache.home_path().name,
                 *native.host_cpu(),
                 *(os.environ.get(v, "") for v in ("NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES", "NUMBA_OPT"))):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()


PREBUILT_DIR = "LITEGPU_PREBUILT_DIR"


def prebuilt_dir() -> Path | None:
    """Where entries built ahead of time are (``$LITEGPU_PREBUILT_DIR``, else the package's
    ``prebuilt`` folder); None when that variable is set empty."""
    chosen = os.environ.get(PREBUILT_DIR)
    if chosen is None:
        return Path(__file__).resolve().parent / "prebuilt"
    return Path(os.path.expanduser(chosen)) if chosen.strip() else None


def _places(entry: str) -> list[Path]:
    """Where entry ``entry`` may be, in the order it is looked for."""
    places = []
    if numba_cache.home().mode != numba_cache.OFF:
        places.append(numba_cache.home().path / "objects" / f"{entry}.o")
    prebuilt = _trusted_prebuilt()
    if prebuilt is not None:
        places.append(prebuilt / f"{entry}.o")
    return places


_TRUST: dict[Path, bool] = {}


def _trusted_prebuilt() -> Path | None:
    """:func:`prebuilt_dir` when it exists and only this user or root can write it (asked
    once per folder and process); None otherwise."""
    directory = prebuilt_dir()
    if directory is None:
        return None
    trusted = _TRUST.get(directory)
    if trusted is None:
        try:
            why = numba_cache._untrusted(os.stat(directory))
        except OSError:             # no such folder: nothing prebuilt
            trusted = False
        else:
            if why:
                log.warning("prebuilt kernels in %s are not used: the folder %s", directory, why)
            trusted = not why
        _TRUST[directory] = trusted
    return directory if trusted else None


def load(entry: str) -> int:
    """The address of entry ``entry``'s callback, linked into this process from the cache
    or the prebuilt entries; 0 when there is no such entry (or it is damaged: then logged,
    and deleted from a writable cache, see the module docstring)."""
    if entry in _LOADED:
        return _LOADED[entry]
    for path in _places(entry):
        try:
            data = path.read_bytes()
        except OSError:
            continue
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
            continue
        try:
            address = _LOADED[entry] = native.load_object(code, symbol, needs)
        except native.NativeError as exc:
            log.warning("cannot link cached kernel %s (%s); compiling it with numba", path.name, exc)
            return 0
        return address
    return 0


def store(entry: str, compiled, directory: Path | None = None) -> bool:
    """Keep numba's C callback ``compiled`` as entry ``entry`` where the cache is writable
    (or in ``directory``: :mod:`.prebuild`) and its code links without numba (it needs
    nothing from numba's runtime: see :func:`.native.resolvable`); whether it was kept.
    Never raises into the run; with ``directory``, an OSError is the caller's."""
    home = numba_cache.home()
    if directory is None and home.mode != numba_cache.WRITABLE:
        return False
    library = compiled._library
    # A fresh compile keeps its object in the library; one numba loaded from its own cache
    # had it consumed by the linker, and :mod:`.numba_cache` kept a copy.
    code = getattr(library, numba_cache.OBJECT_COPY, None)
    try:
        code = code or library._get_compiled_object()
    except Exception as exc:    # a numba that keeps its objects elsewhere: numba still runs it
        log.debug("no object code for %s (%s): not cached", compiled, exc)
        return False
    needs = native.undefined_symbols(code)
    if needs is None or not native.resolvable(needs):
        log.debug("%s needs what litegpu cannot link without numba (%s): not cached", compiled, needs)
        return False
    header = json.dumps({"symbol": compiled.native_name, "needs": needs,
                         "sha256": hashlib.sha256(code).hexdigest()}).encode()
    data = _MAGIC + header + b"\n" + code
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
        numba_cache.write_atomically(directory / f"{entry}.o", data)
        return True
    path = home.path / "objects" / f"{entry}.o"
    try:
        path.parent.mkdir(mode=0o700, exist_ok=True)
        numba_cache.write_atomically(path, data)
    except OSError as exc:
        home.stop_writing(exc)
        return False
    return True


def _drop_damaged(path: Path, exc: BaseException) -> None:
    home = numba_cache.home()
    if home.mode != numba_cache.WRITABLE or path.parent != home.path / "objects":
        log.warning("cached kernel %s is damaged (%s); compiling again (read-only: left in place)", path, exc)
        return
    log.warning("cached kernel %s is damaged (%s); deleting it and compiling again", path, exc)
    try:
        path.unlink()
    except OSError:
        pass
