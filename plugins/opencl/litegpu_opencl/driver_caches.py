"""The caches of PoCL and pyopencl, which litegpu's users meet through litegpu: made harmless.

What they do when left alone (measured with PoCL 3.1 and pyopencl 2026.1):

- PoCL keeps every program it builds in ``$POCL_CACHE_DIR`` (else ``$XDG_CACHE_HOME/pocl/kcache``)
  and prefers that copy to anything it is handed: a truncated or garbage file there aborts
  the process (SIGABRT: an assertion in ``pocl_llvm_build.cc`` / ``pocl_llvm_wg.cc``, or a
  failed dlopen of a kernel's ``.so``; SIGSEGV, SIGBUS), in that run and every later one,
  even when the program comes from litegpu's verified kernel cache (the full list of what
  it trips on: :mod:`.pocl_cache_check`). A directory it cannot create means "no devices";
  an existing read-only one fails every build, reported as the kernel's fault.
- pyopencl keeps its kernel invokers in a pytools sqlite file under
  ``$XDG_CACHE_HOME/pytools``, opened at the first kernel object: an unwritable directory
  raises a raw ``OSError``, a damaged file ``sqlite3.DatabaseError``. (Its binary cache,
  under ``$XDG_CACHE_HOME/pyopencl``, litegpu never uses: see :mod:`.build`.)

What litegpu does instead:

- **PoCL's cache is scratch.** Unless the user set ``POCL_CACHE_DIR``, each process gives
  PoCL a fresh private directory in the system's temp directory (under
  ``cache_root()/pocl`` when that is unusable), removed at exit; one left by a process that died is removed by
  the next. So no damaged PoCL file outlives the process that wrote it. Nothing is lost:
  litegpu's kernel cache already keeps each program's PoCL binary, verified, with its
  compiled kernels inside (see ``store_warmed_binary``), which PoCL unpacks into the
  scratch directory. That costs a warm start PoCL's fdatasync of each file it writes,
  ~1 ms on ext4: mobilenet_v2's program (65 files) loads in ~125 ms instead of ~57 ms
  (nothing measurable on tmpfs). PoCL's cache cannot simply be switched off
  (``POCL_KERNEL_CACHE=0``): PoCL then compiles every kernel again at its first launch in
  every process (mobilenet_v2's first run: 5.8 s instead of 0.02 s) and still lists no
  devices without a writable directory.
  PoCL reads the variable once, when its devices are first listed, so it is set only
  around that and put back afterwards: child processes inherit the user's environment,
  not a directory that goes away with this process. (An application that listed PoCL's
  devices itself before litegpu did keeps the directory PoCL chose then.)
- A ``POCL_CACHE_DIR`` the user set is theirs (a persistent PoCL cache: the ~70 ms back)
  and PoCL keeps using it, once it is checked to be writable and every damaged program in
  it is moved aside, with a warning naming it (:mod:`.pocl_cache_check`: PoCL compiles
  that program again; healthy ones are not touched). That check costs a warm start ~1-3 ms
  per program in the directory (a stat per file: what was verified before is sealed), and
  is made once more at exit, to seal what PoCL wrote meanwhile. When the directory is not
  writable, or damage in it cannot be moved aside, PoCL would fail as above, so this
  process uses a scratch directory instead, with one warning.
- pyopencl's invoker cache is checked before the first kernel object is made; when its
  directory is not writable, or opening or reading it fails, pyopencl runs without it
  (``PYOPENCL_NO_CACHE``'s switch), with one warning naming the file and how to clear it.
  It only saves ~0.1 ms per kernel object.

Where no writable directory exists at all, PoCL lists no devices; the backend's "no
devices" error then says why (see :func:`pocl_cache`).
"""
from __future__ import annotations

import atexit
import glob
import hashlib
import importlib
import logging
import os
import re
import shutil
import socket
import sqlite3
import stat
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from litegpu import env

from . import pocl_cache_check

log = logging.getLogger("litegpu.opencl")

POCL_PLATFORM = "Portable Computing Language"
POCL_CACHE_ENV = "POCL_CACHE_DIR"
# A scratch directory's name: run-<pid>-<host tag>-<random>, "litegpu-pocl-" before it in
# the system's temp directory. The pid and host say when it may be swept (see sweep).
SCRATCH_PREFIX = "run-"
TEMP_PREFIX = "litegpu-pocl-"
_SCRATCH_NAME = re.compile(rf"^(?:{TEMP_PREFIX})?{SCRATCH_PREFIX}(\d+)-([0-9a-f]{{8}})-")

# This process's scratch directory, or why it has none; decided once (PoCL reads it once).
_scratch: tuple[str | None, str] | None = None
# The user's POCL_CACHE_DIRs checked in this process: directory -> why unusable, or None.
_user_checked: dict[str, str | None] = {}
_pyopencl_checked = False


# -- PoCL ----------------------------------------------------------------------------------
def writable(directory: str | os.PathLike) -> str | None:
    """None when ``directory`` exists (or can be made) and a file can be created in it;
    else why not. A file is really made: permission bits say nothing about a read-only
    mount, nor to root."""
    try:
        os.makedirs(directory, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".litegpu-probe-", dir=directory)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def host_tag() -> str:
    """A short tag of this machine: a cache root shared between machines (an NFS home)
    only ever loses this machine's dead processes' directories."""
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:   # EPERM: it runs, as someone else
        return True
    return True


def sweep(base: str | os.PathLike) -> int:
    """Remove the scratch directories in ``base`` left by processes of this machine that no
    longer run (killed before their exit handler ran); returns how many."""
    if os.name != "posix":   # os.kill(pid, 0) is no liveness test elsewhere
        return 0
    removed, host = 0, host_tag()
    try:
        entries = list(os.scandir(base))
    except OSError:
        return 0
    for entry in entries:
        m = _SCRATCH_NAME.match(entry.name)
        if not m or m.group(2) != host:
            continue
        pid = int(m.group(1))
        if pid == os.getpid() or _alive(pid):
            continue
        try:
            if not entry.is_dir(follow_symlinks=False):
                continue
        except OSError:
            continue
        shutil.rmtree(entry.path, ignore_errors=True)
        removed += 1
    if removed:
        log.debug("PoCL cache: removed %d directories of processes that died, in %s", removed, base)
    return removed


def _private_base(base: Path) -> None:
    """Make ``base`` (0700) if needed; OSError unless it is a directory of ours that others
    cannot write (PoCL dlopens the files below it: whoever writes there runs code as us)."""
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.stat(base)
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(f"{base} is not a directory")
    if hasattr(os, "geteuid") and (st.st_uid != os.geteuid() or st.st_mode & 0o022):
        raise PermissionError(f"{base} is not private to this user (owner uid {st.st_uid}, "
                              f"mode {stat.S_IMODE(st.st_mode):o})")


def make_scratch_dir() -> tuple[str | None, str]:
    """A new PoCL directory for this process and ""; or None and why there can be none.

    In the system's temp directory (``$TMPDIR``): scratch needs no lasting place, and there
    it shares nothing with litegpu's cache root, which may be read-only or full (a
    directory that can be made on a full disk still fails PoCL's builds). Where that is
    unusable, under ``cache_root()/pocl``, with one warning. Leftovers of dead processes
    in the chosen place are removed first.
    """
    name = f"{SCRATCH_PREFIX}{os.getpid()}-{host_tag()}-"
    temp = tempfile.gettempdir()
    try:
        sweep(temp)
        # mkdtemp makes a fresh name, 0700: safe in a shared temp directory.
        path = tempfile.mkdtemp(prefix=TEMP_PREFIX + name, dir=temp)
        why = writable(path)
        if why is None:
            return path, ""
        shutil.rmtree(path, ignore_errors=True)
        first = f"{temp}: {why}"
    except OSError as exc:
        first = f"{temp}: {exc.strerror or exc}"
    base = env.cache_root() / "pocl"
    try:
        _private_base(base)
        sweep(base)
        path = tempfile.mkdtemp(prefix=name, dir=base)
    except OSError as exc:
        return None, (f"PoCL needs a writable cache directory and there is none ({first}; {base}: "
                      f"{exc.strerror or exc}); set {POCL_CACHE_ENV} to a writable directory")
    log.warning("PoCL cache: %s; using %s for this process instead", first, path)
    return path, ""


def _remove_at_exit(path: str, owner: int) -> None:
    if os.getpid() == owner:   # never from a forked child: the directory is its parent's
        shutil.rmtree(path, ignore_errors=True)


def scratch_dir() -> tuple[str | None, str]:
    """This process's PoCL directory (made at the first call, removed at exit) and "";
    or None and why there is none."""
    global _scratch
    if _scratch is None:
        _scratch = make_scratch_dir()
        if _scratch[0] is not None:
            atexit.register(_remove_at_exit, _scratch[0], os.getpid())
            log.debug("PoCL cache: %s (this process only)", _scratch[0])
    return _scratch


def is_pocl(platform: Any) -> bool:
    """True for PoCL's platform."""
    try:
        return platform.name.strip() == POCL_PLATFORM
    except Exception:   # a broken driver's name query: not PoCL as far as we can tell
        return False


def user_cache_problem(directory: str) -> str | None:
    """None when the user's ``POCL_CACHE_DIR`` can be handed to PoCL: writable, with every
    damaged program in it moved aside (see :mod:`.pocl_cache_check`); else why not, for a
    warning. Checked once per process and directory (PoCL reads it once)."""
    key = os.path.abspath(directory)
    if key not in _user_checked:
        instead = "so it gets a directory of litegpu's in this process"
        problem = writable(directory)
        if problem is not None:
            why = (f"is not usable ({problem}): PoCL would list no devices or fail every build, {instead}; "
                   f"make that one writable or unset {POCL_CACHE_ENV}")
        else:
            problem = pocl_cache_check.check_cache(directory)
            why = None if problem is None else (
                f"holds damaged programs that cannot be moved aside ({problem}): PoCL would abort on them, "
                f"{instead}; delete them or unset {POCL_CACHE_ENV}")
            if why is None:
                atexit.register(_seal_at_exit, directory, os.getpid())
        _user_checked[key] = why
    return _user_checked[key]


def _seal_at_exit(directory: str, owner: int) -> None:
    """Check the user's PoCL cache once more as this process ends: what PoCL wrote in it
    meanwhile is sealed while it is fresh (see :mod:`.pocl_cache_check`), so later damage to
    it shows at the next start even where its structure survives."""
    if os.getpid() != owner:   # a forked child: its parent seals
        return
    try:
        pocl_cache_check.check_cache(directory)
    except Exception as exc:   # never a traceback at exit for a cache that only saves time
        log.debug("PoCL cache %s: not sealed at exit (%s: %s)", directory, type(exc).__name__, exc)


@contextmanager
def pocl_cache(platforms: list) -> Iterator[str]:
    """Around the first listing of ``platforms``' devices (when PoCL reads its variables):
    PoCL gets a usable cache directory, as the module docstring says. Yields "", or why
    PoCL can have none (for the "no devices" error)."""
    if not any(is_pocl(p) for p in platforms):
        yield ""
        return
    given = os.environ.get(POCL_CACHE_ENV)
    if given:
        problem = user_cache_problem(given)
        if problem is None:
            yield ""
            return
        log.warning("%s=%s %s", POCL_CACHE_ENV, given, problem)
    path, why = scratch_dir()
    if path is None:
        yield why
        return
    os.environ[POCL_CACHE_ENV] = path
    try:
        yield ""
    finally:
        # PoCL has read it now; child processes get the user's environment, not a
        # directory that goes away with this process.
        if os.environ.get(POCL_CACHE_ENV) == path:
            if given is None:
                del os.environ[POCL_CACHE_ENV]
            else:
                os.environ[POCL_CACHE_ENV] = given


# -- pyopencl ------------------------------------------------------------------------------
def _pytools_dir() -> str:
    """Where pytools keeps pyopencl's invoker cache ("" when unknown): pytools' own rule,
    repeated for the check and the messages (platformdirs' user cache directory, or
    ``$XDG_CACHE_HOME/pytools`` on macOS)."""
    xdg = os.getenv("XDG_CACHE_HOME")
    if sys.platform == "darwin" and xdg is not None:
        return os.path.join(xdg, "pytools")
    try:
        import platformdirs
    except ImportError:   # pytools requires it; without it pytools' own import decides
        return ""
    return platformdirs.user_cache_dir("pytools", "pytools")


def _invoker_cache_file(directory: str) -> str:
    """The invoker cache's file (its name carries pytools', pyopencl's and Python's versions)."""
    opened = getattr(sys.modules.get("pyopencl.invoker"), "invoker_cache", None)
    if opened is not None and getattr(opened, "filename", None):
        return opened.filename
    pattern = os.path.join(directory, "pdict-*-pyopencl-invoker-cache-*.sqlite")
    found = glob.glob(pattern)
    return found[0] if len(found) == 1 else pattern


def _cache_on(cl: Any) -> bool:
    return not getattr(cl, "_PYOPENCL_NO_CACHE", True)


def _cache_off(cl: Any, what: str) -> None:
    """pyopencl without its persistent caches from now on: the module flag that its own
    switch, ``PYOPENCL_NO_CACHE=1``, sets at import (read again at each kernel object)."""
    cl._PYOPENCL_NO_CACHE = True
    log.warning("%s; pyopencl runs without that cache in this process (it saves ~0.1 ms per kernel object)", what)


def check_pyopencl_cache(cl: Any) -> None:
    """Open pyopencl's invoker cache now, before the first kernel object (which would open
    it and raise); switch it off, with one warning, when it is unusable. Once per process."""
    global _pyopencl_checked
    if _pyopencl_checked or not _cache_on(cl):
        return
    _pyopencl_checked = True
    directory = _pytools_dir()
    problem = writable(directory) if directory else None
    if problem is not None:
        # Checked before pytools tries: its failing makedirs leaves a half-made object that
        # prints a traceback when collected.
        _cache_off(cl, f"pyopencl's kernel-invoker cache directory {directory} is not writable ({problem})")
        return
    try:
        importlib.import_module("pyopencl.invoker")   # opens the sqlite file
    except (OSError, sqlite3.Error) as exc:
        _damaged(cl, directory, exc)
        importlib.import_module("pyopencl.invoker")   # again, now without it


def _damaged(cl: Any, directory: str, exc: Exception) -> None:
    where = _invoker_cache_file(directory) if directory else "in pytools' cache directory"
    _cache_off(cl, f"pyopencl's kernel-invoker cache {where} is unusable ({type(exc).__name__}: {exc}); "
                   "delete that file to clear it")


def new_kernel(cl: Any, program: Any, name: str) -> Any:
    """``cl.Kernel(program, name)``; when pyopencl's invoker cache fails it (a row that does
    not read back, a read-only file on store), once more without that cache."""
    try:
        return cl.Kernel(program, name)
    except cl.Error:
        raise
    except Exception as exc:   # pytools unpickles rows: damage can raise nearly anything
        if not _cache_on(cl):
            raise
        _damaged(cl, _pytools_dir(), exc)
        return cl.Kernel(program, name)
