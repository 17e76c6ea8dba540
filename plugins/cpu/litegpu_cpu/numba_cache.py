"""numba's disk cache for litegpu's own kernels: kept under litegpu's cache root, and optional.

Left to itself, numba caches a ``cache=True`` function next to its source (the installed
package's ``__pycache__``: read-only in many installs, shared between versions) and fails
the run when its cache is unusable: a read-only or missing directory is "no locator
available" (a RuntimeError when the kernel module is imported), a full disk an OSError,
a truncated index an UnpicklingError on every later run. Here, for litegpu's functions
only (those of the ``litegpu_cpu`` package and the generated modules of :mod:`.generated`;
a user's own numba functions keep numba's behaviour and places):

- the cache lives in :func:`home`, ``numba/<litegpu version>-numba<version>-py<X><Y>``
  under :func:`litegpu.env.cache_root`, so versions never overwrite each other's entries
  (an entry is keyed by the content of its source and of every source of the package, a
  sha256, where numba keys it by its own file's mtime and size: an edited source is a miss
  for every function, a reinstalled or copied one is not);
- a directory that exists but cannot be written (a read-only warm cache, as a container
  image ships one) is loaded from and never written, logged once at INFO; one that cannot
  be made at all (the root is a file, ...) means no disk cache in this process, logged
  once as a warning; a store that fails (disk full) is logged once and stops stores to
  that directory for the process. Nothing here raises into a run;
- an entry that cannot be read back (truncated or garbage index or data file: unpickling
  raises UnpicklingError, EOFError, ValueError, ...) is a miss: logged, deleted where the
  directory is writable, compiled again.

How: numba finds a function's cache directory by asking each class in
``numba.core.caching.CacheImpl._locator_classes`` in turn; :func:`install` puts
:class:`LiteGpuLocator` first (it answers only for litegpu's functions), and wraps
``Cache.load_overload`` / ``save_overload`` so that, for caches this locator placed,
damage and write failures are handled as above. It must run before any kernel module
defines a ``cache=True`` function (numba asks the locators at decoration time):
``kernels/__init__.py`` and :mod:`.generated` call it first.

Trust: an entry is a pickle, which runs code when loaded, so a directory that is group-
or world-writable, or owned by someone other than this user or root, is not used (as
:mod:`litegpu.kernel_cache` refuses such a directory for driver binaries). Directories
made here are 0700.
"""
from __future__ import annotations

import errno
import glob
import hashlib
import logging
import os
import stat
import sys
import tempfile
import threading
from functools import lru_cache
from pathlib import Path

from litegpu import env

log = logging.getLogger("litegpu.cpu.cache")

#: Set in a generated module's namespace before its code runs: marks its functions as ours.
GENERATED_MARK = "__litegpu_generated__"
#: Set on the code library of a function of ours numba loaded from its cache: the object
#: code, which numba's linker consumes (:mod:`.objects` keeps it where it can).
OBJECT_COPY = "_litegpu_object"

_PACKAGE = "litegpu_cpu"
_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What a cache directory allows in this process.
WRITABLE = "writable"       # load and store
READ_ONLY = "read-only"     # load only (read-only, or stores failed: disk full)
OFF = "off"                 # nothing on disk: compile in memory


class CacheHome:
    """One versioned cache directory and what this process may do with it.

    The mode is decided once, on first use (:func:`home`); a failed store lowers it to
    read-only. Each change is logged once.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.mode, reason = _probe(path)
        if self.mode == READ_ONLY:
            log.info("numba kernel cache %s is read-only (%s): loading from it, writing nothing", path, reason)
        elif self.mode == OFF:
            log.warning("numba kernel cache disabled: %s; kernels compile in memory in this process", reason)

    def stop_writing(self, exc: BaseException) -> None:
        """A store failed: keep loading from here, store nothing more in this process."""
        if self.mode == WRITABLE:
            self.mode = READ_ONLY
            log.warning("numba kernel cache %s: cannot store (%s); not writing to it again in this process",
                        self.path, exc)


_HOMES: dict[Path, CacheHome] = {}
_HOMES_LOCK = threading.Lock()


def home_path() -> Path:
    """The versioned directory litegpu's numba caches live in (see the module docstring)."""
    import litegpu
    tag = f"{litegpu.__version__}-numba{_numba_version()}-py{sys.version_info[0]}{sys.version_info[1]}"
    return env.cache_root() / "numba" / tag


@lru_cache(maxsize=None)
def _numba_version() -> str:
    """numba's version, without importing numba where it is not imported yet (~0.2 s: a warm
    process that links its kernels from :mod:`.objects` never needs it): read from the
    version file numba's package carries, once a process (every cache path holds it)."""
    numba = sys.modules.get("numba")
    if numba is not None:
        return numba.__version__
    import importlib.util
    spec = importlib.util.find_spec("numba")
    try:
        path = os.path.join(spec.submodule_search_locations[0], "_version.py")
        version_spec = importlib.util.spec_from_file_location("_litegpu_numba_version", path)
        module = importlib.util.module_from_spec(version_spec)
        version_spec.loader.exec_module(module)
        return str(module.get_versions()["version"])
    except Exception:       # laid out differently: ask numba itself
        import numba
        return numba.__version__


def home() -> CacheHome:
    """The :class:`CacheHome` of :func:`home_path` (probed once per directory and process)."""
    path = home_path()
    with _HOMES_LOCK:
        found = _HOMES.get(path)
        if found is None:
            found = _HOMES[path] = CacheHome(path)
        return found


def _probe(path: Path) -> tuple[str, str]:
    """(mode, why) for ``path``: made (0700) when missing, then tried with a temporary file."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as exc:
        if not path.is_dir():
            return OFF, f"cannot create {path} ({exc})"
    try:
        st = os.stat(path)
    except OSError as exc:
        return OFF, f"cannot read {path} ({exc})"
    if not stat.S_ISDIR(st.st_mode):
        return OFF, f"{path} is not a directory"
    untrusted = _untrusted(st)
    if untrusted:
        return OFF, f"{path} {untrusted}; numba's cache entries are pickles (code), so it is not used"
    try:
        tempfile.TemporaryFile(dir=path).close()
    except OSError as exc:
        return READ_ONLY, exc.strerror or str(exc)
    return WRITABLE, ""


def _untrusted(st: os.stat_result) -> str:
    """Why a directory with stat ``st`` could hold entries planted by someone else, or ''."""
    if not hasattr(os, "geteuid"):
        return ""
    if st.st_uid not in (os.geteuid(), 0):
        return f"is owned by uid {st.st_uid}, not this user ({os.geteuid()}) or root"
    if st.st_mode & 0o022:
        return f"is group- or world-writable (mode {stat.S_IMODE(st.st_mode):o})"
    return ""


def _subdirectory(py_func, py_file: str) -> str | None:
    """Where under the home a function of ours is cached; None for anyone else's function."""
    if getattr(py_func, "__globals__", {}).get(GENERATED_MARK):
        return "generated"
    module = getattr(py_func, "__module__", None) or ""
    if module != _PACKAGE and not module.startswith(_PACKAGE + "."):
        return None
    # The source's folder relative to the package's parent ("litegpu_cpu/kernels"), so
    # two modules of one name in different folders never share an index.
    relative = os.path.relpath(os.path.dirname(os.path.abspath(py_file)), _PACKAGE_PARENT)
    if relative.startswith(os.pardir) or os.path.isabs(relative):
        relative = _PACKAGE     # a source outside the package's folder (a moved install)
    return relative


_STAMPS: dict[tuple[str, int, int, int], str] = {}


def _content_stamp(path: str) -> str:
    """The sha256 of the file at ``path`` and of the package's sources (read once per path,
    mtime, ctime and size in a process; a write changes the ctime, which no one can set
    back). The package's part because a cached function holds the code of what it calls
    compiled in, from other modules too: numba keys an entry by its own file only, so an
    edited launcher helper was served from a caller's stale entry."""
    st = os.stat(path)
    key = (path, st.st_mtime_ns, st.st_ctime_ns, st.st_size)
    stamp = _STAMPS.get(key)
    if stamp is None:
        digest = hashlib.sha256(_package_digest())
        with open(path, "rb") as f:
            digest.update(f.read())
        stamp = _STAMPS[key] = "sha256:" + digest.hexdigest()
    return stamp


_PACKAGE_DIGEST: list[bytes] = []


def _package_digest() -> bytes:
    """The sha256 of every ``.py`` file of the package, by relative path (once a process)."""
    if not _PACKAGE_DIGEST:
        digest = hashlib.sha256()
        root = os.path.join(_PACKAGE_PARENT, _PACKAGE)
        for path in sorted(glob.glob(os.path.join(root, "**", "*.py"), recursive=True)):
            digest.update(os.path.relpath(path, root).encode() + b"\0")
            with open(path, "rb") as f:
                digest.update(f.read())
        _PACKAGE_DIGEST.append(digest.digest())
    return _PACKAGE_DIGEST[0]


def _make_locator_class():
    """:class:`LiteGpuLocator`, defined once numba is imported (it subclasses numba's classes)."""
    from numba.core import caching

    class LiteGpuLocator(caching._SourceFileBackedLocatorMixin, caching._CacheLocator):
        """numba cache locator for litegpu's functions: places them under :func:`home`."""

        litegpu = True       # how the guarded load and save recognize the caches it places

        def __init__(self, py_func, py_file: str, cache_home: CacheHome, subdirectory: str) -> None:
            self._py_file = py_file
            self._lineno = py_func.__code__.co_firstlineno
            self.home = cache_home
            self._cache_path = str(cache_home.path / subdirectory)
            # A generated module imported from memory has no source file: nothing to key a
            # disk entry on, so it is compiled in memory.
            self.on_disk = cache_home.mode != OFF and os.path.isfile(py_file)

        def get_cache_path(self) -> str:
            return self._cache_path

        def get_source_stamp(self):
            # The source's content, not numba's (mtime, size): a reinstall of the same
            # version, a copied virtual environment or an image built elsewhere writes new
            # mtimes, which would make every entry stale and the next start cold.
            return _content_stamp(self._py_file) if self.on_disk else None

        def ensure_cache_path(self) -> None:
            # numba's version also creates a temporary file to test writability, and its
            # callers treat a failure as "no locator": here writability is the home's mode.
            os.makedirs(self._cache_path, mode=0o700, exist_ok=True)

        @property
        def writable(self) -> bool:
            return self.on_disk and self.home.mode == WRITABLE

        @classmethod
        def from_function(cls, py_func, py_file):
            subdirectory = _subdirectory(py_func, py_file)
            if subdirectory is None:
                return None          # not ours: numba's own locators decide
            return cls(py_func, py_file, home(), subdirectory)

    return LiteGpuLocator


def _guarded_load(original):
    """``Cache.load_overload`` that treats any failure to read one of our entries as a miss."""
    def load_overload(self, sig, target_context):
        locator = self._impl.locator
        if not getattr(locator, "litegpu", False):
            return original(self, sig, target_context)
        if not locator.on_disk:
            return None
        try:
            return original(self, sig, target_context)
        except Exception as exc:    # a damaged entry raises whatever unpickling it raises: a miss
            _drop_damaged(self, locator, exc)
            return None
    return load_overload


def _guarded_save(original):
    """``Cache.save_overload`` that stores our entries only where allowed and never raises."""
    def save_overload(self, sig, data):
        locator = self._impl.locator
        if not getattr(locator, "litegpu", False):
            return original(self, sig, data)
        if not locator.writable:
            return None
        try:
            original(self, sig, data)
        except OSError as exc:      # disk full, directory gone or made read-only meanwhile
            locator.home.stop_writing(exc)
        except Exception as exc:    # e.g. an index another process damaged: never fail the run
            log.warning("numba kernel cache: cannot store %s in %s (%s: %s); it stays compiled in memory",
                        self._name, locator.get_cache_path(), type(exc).__name__, exc)
        return None
    return save_overload


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file unique to this call, renamed into
    place: threads and processes writing the same entry at once each leave a whole file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem[:24]}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _keeping_objects(original):
    """``CompileResultCacheImpl.rebuild`` that, for our entries, keeps a copy of the object
    code on the rebuilt library (:data:`OBJECT_COPY`)."""
    def rebuild(self, target_context, payload):
        result = original(self, target_context, payload)
        if getattr(self.locator, "litegpu", False):
            try:
                _, kind, data = payload[0]       # the library's (name, kind, (object, bitcode))
                if kind == "object" and isinstance(data[0], bytes):
                    setattr(result.library, OBJECT_COPY, data[0])
            except (TypeError, ValueError, IndexError, AttributeError):
                pass                             # laid out otherwise: nothing kept, nothing lost
        return result
    return rebuild


def _drop_damaged(cache, locator, exc: BaseException) -> None:
    """Log a damaged index/data entry of ``cache``, and delete it where the directory allows."""
    directory = locator.get_cache_path()
    base = cache._impl.filename_base
    files = [cache._cache_file._index_path]
    files += glob.glob(os.path.join(glob.escape(directory), glob.escape(base) + ".*.nbc"))
    if not locator.writable:
        log.warning("numba kernel cache entry %s in %s is damaged (%s: %s); compiling again (read-only: left "
                    "in place)", base, directory, type(exc).__name__, exc)
        return
    log.warning("numba kernel cache entry %s in %s is damaged (%s: %s); deleting it and compiling again",
                base, directory, type(exc).__name__, exc)
    for path in files:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as err:
            if err.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                log.warning("numba kernel cache: cannot delete %s (%s)", path, err)


_INSTALLED = False
_INSTALL_LOCK = threading.Lock()


def install() -> None:
    """Put :class:`LiteGpuLocator` first among numba's cache locators and guard our entries'
    loads and stores (idempotent). Call before defining any ``cache=True`` function of ours."""
    global _INSTALLED
    with _INSTALL_LOCK:
        if _INSTALLED:
            return
        _INSTALLED = True
        from .numba_startup import defer_blas_probe, defer_cffi_parser
        defer_blas_probe()      # before numba loads its registries (see numba_startup)
        defer_cffi_parser()
        from numba.core import caching
        try:
            # Older numba spelled CacheImpl _CacheImpl.
            impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl
            locators, cache = impl._locator_classes, caching.Cache
            locator_class = _make_locator_class()
        except AttributeError as exc:    # a numba whose cache is built differently
            log.warning("numba %s has no cache locator list (%s): litegpu's kernels use numba's own cache "
                        "places and errors", getattr(sys.modules.get("numba"), "__version__", "?"), exc)
            return
        # One list object shared by every CacheImpl subclass: insert, don't rebind.
        locators.insert(0, locator_class)
        cache.load_overload = _guarded_load(cache.load_overload)
        cache.save_overload = _guarded_save(cache.save_overload)
        results = getattr(caching, "CompileResultCacheImpl", None)
        if results is not None:
            results.rebuild = _keeping_objects(results.rebuild)
