"""The on-disk kernel cache of a GPU API: built program binaries, keyed by content.

What LiteRT calls "serialization". Each GPU plugin names its API (``"opencl"``,
``"cuda"``) and gets its own directory, key space and switches. One file per program,
named by its key::

    key = sha256(API, source, build options, device identity, litegpu version,
                 model digest, model token)

so a changed kernel, driver, device, litegpu release or model never meets an old
binary. The model token is optional (``model_token`` as in LiteRT); the key works
without it.

Where: ``serialization_dir`` from the options, else ``$LITEGPU_CACHE_DIR/<api>``, else
``$XDG_CACHE_HOME/litegpu/<api>`` (``~/.cache/litegpu/opencl``, ``.../cuda``).
``kernel_cache=False`` turns the cache off.

Why it is private: a driver binary is native code the driver will run (PoCL's binaries
even carry shared objects it loads), so whoever can write the directory can run code
as the user. The directory is created 0700; an existing one that is group- or
world-writable, or owned by someone else, is refused with a warning (never "repaired":
files may have been planted while it was open). Entries are 0600, written to a temp
file in the directory and renamed into place, so a reader sees a whole entry or none.

An entry is a fixed header, then the payload (the binary)::

    magic (8 bytes) | format version (u32) | key (32 bytes) | payload length (u64) | sha256 of payload (32 bytes)

Loading checks all of it against the file before the payload is handed to the driver; a
bad entry (wrong magic, other format version or key, truncated, wrong length, wrong
checksum, not a regular file of ours) is logged, deleted and reported as a miss, so
the caller rebuilds from source. Nothing in an entry is unpickled or evaluated.

Size: every store checks the directory against a cap (``kernel_cache_max_bytes`` in the
options, else ``$LITEGPU_<API>_CACHE_MAX_BYTES``, else 512 MiB; 0 means no cap). Over
it, the least recently used entries go, oldest mtime first, until the directory holds
at most 3/4 of the cap (so the next stores do not each scan and delete again). A hit
touches its entry's mtime, which makes mtime order "least recently used". Several
processes may store and evict at once: an entry that vanishes under a scan is simply
skipped, and a reader holding an entry open keeps its bytes when another process
unlinks it.
"""
from __future__ import annotations

import errno
import hashlib
import logging
import operator
import os
import stat
import struct
import tempfile
import time
from pathlib import Path
from typing import Any

import litegpu
from litegpu import env
from litegpu.errors import InvalidArgumentError

log = logging.getLogger("litegpu.kernel_cache")

MAGIC = b"LGPUCLB\x00"
FORMAT_VERSION = 1
_HEADER = struct.Struct("<8sI32sQ32s")
HEADER_SIZE = _HEADER.size
# No driver binary comes near this; a header claiming more is damage, and we never
# allocate what a header claims before the file's real size agrees with it.
MAX_PAYLOAD = 1 << 30
SUFFIX = ".clbin"

MAX_BYTES_OPTION = "kernel_cache_max_bytes"
DEFAULT_MAX_BYTES = 512 << 20
# A temp file this old is a crashed writer's leftover (a store takes milliseconds):
# eviction counts it and may delete it. Younger ones may be another process mid-write.
STALE_TMP_SECONDS = 3600

_warned: set[str] = set()   # directories already warned about (one warning per process)


def _warn_once(directory: Path, message: str) -> None:
    if str(directory) not in _warned:
        _warned.add(str(directory))
        log.warning(message)


# -- options -------------------------------------------------------------------------------
def forbid_env(api: str) -> str:
    """The variable that forbids building from source: ``LITEGPU_OPENCL_FORBID_COMPILE``, ..."""
    return f"LITEGPU_{api.upper()}_FORBID_COMPILE"


def max_bytes_env(api: str) -> str:
    """The variable that caps the cache's size: ``LITEGPU_OPENCL_CACHE_MAX_BYTES``, ..."""
    return f"LITEGPU_{api.upper()}_CACHE_MAX_BYTES"


def cache_dir(api: str, extra: dict) -> Path:
    """The cache directory the options name (see the module docstring); not created here."""
    given = extra.get("serialization_dir")
    if given:
        return Path(os.path.expanduser(os.fspath(given)))
    return env.cache_root() / api


def compile_forbidden(api: str, extra: dict) -> bool:
    """True when building from source must fail (``forbid_compile`` or :func:`forbid_env` set to 1).

    A test switch: a warm run under it proves every program came from the cache.
    """
    if extra.get("forbid_compile"):
        return True
    return env.flag(forbid_env(api), False)


def max_bytes(api: str, extra: dict) -> int:
    """The cache size cap in bytes the options ask for (see the module docstring); 0: no cap.

    A bad ``kernel_cache_max_bytes`` option is the caller's error (InvalidArgumentError);
    a bad environment value is logged once and the default used.
    """
    given = extra.get(MAX_BYTES_OPTION)
    if given is not None:
        try:
            value = -1 if isinstance(given, bool) else operator.index(given)   # ints, numpy ints
        except TypeError:
            value = -1
        if value < 0:
            raise InvalidArgumentError(f"{MAX_BYTES_OPTION} must be a byte count >= 0 (0: no cap), "
                                       f"not {given!r}")
        return value
    variable = max_bytes_env(api)
    raw = os.environ.get(variable, "").strip()
    if raw:
        try:
            value = int(raw)
        except ValueError:
            value = -1
        if value >= 0:
            return value
        if variable not in _warned:
            _warned.add(variable)
            log.warning("%s=%r is not a byte count >= 0; using %d", variable, raw, DEFAULT_MAX_BYTES)
    return DEFAULT_MAX_BYTES


def cache_key(api: str, source: str, build_options: str, device_identity: str, model_digest: str = "",
              model_token: str = "") -> str:
    """Hex sha256 naming one program's entry (every field length-prefixed, so none can bleed into the next)."""
    h = hashlib.sha256()
    for part in (f"litegpu-{api}-program".encode(), source.encode(), build_options.encode(), device_identity.encode(),
                 litegpu.__version__.encode(), model_digest.encode(), model_token.encode()):
        h.update(struct.pack("<Q", len(part)))
        h.update(part)
    return h.hexdigest()


def options_key(api: str, source: str, build_options: str, device_identity: str, options: Any) -> str:
    """:func:`cache_key` with the model digest and token taken from ``CompileOptions``."""
    model = getattr(options, "model", None)
    token = options.extra.get("model_token")
    return cache_key(api, source, build_options, device_identity, model.digest() if model is not None else "",
                     "" if token is None else str(token))


# -- entries -------------------------------------------------------------------------------
class BadEntry(Exception):
    """An entry that must not be used; the message says why."""


def encode_entry(key: str, payload: bytes) -> bytes:
    """Header plus payload, as stored."""
    header = _HEADER.pack(MAGIC, FORMAT_VERSION, bytes.fromhex(key), len(payload), hashlib.sha256(payload).digest())
    return header + payload


def _read_exact(fd: int, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = os.read(fd, min(left, 1 << 24))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_entry(fd: int, key: str) -> bytes:
    """The verified payload of the open entry ``fd`` for ``key``; raises BadEntry."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise BadEntry("not a regular file")
    if hasattr(os, "geteuid") and (st.st_uid != os.geteuid() or st.st_mode & 0o022):
        raise BadEntry("not a private file of this user")
    if st.st_size < HEADER_SIZE:
        raise BadEntry(f"truncated ({st.st_size} bytes, shorter than the header)")
    magic, version, entry_key, length, digest = _HEADER.unpack(_read_exact(fd, HEADER_SIZE))
    if magic != MAGIC:
        raise BadEntry("wrong magic bytes (not a litegpu kernel cache entry)")
    if version != FORMAT_VERSION:
        raise BadEntry(f"stale (format version {version}, this litegpu writes {FORMAT_VERSION})")
    if entry_key.hex() != key:
        raise BadEntry("stale (the entry was written for another key)")
    if length > MAX_PAYLOAD or st.st_size != HEADER_SIZE + length:
        raise BadEntry(f"truncated or damaged (header says {length} payload bytes, the file holds "
                       f"{st.st_size - HEADER_SIZE})")
    payload = _read_exact(fd, length)
    if len(payload) != length:
        raise BadEntry("truncated while reading")
    if hashlib.sha256(payload).digest() != digest:
        raise BadEntry("corrupt (payload checksum mismatch)")
    return payload


# -- the cache -----------------------------------------------------------------------------
def private_dir(directory: Path) -> bool:
    """Create ``directory`` 0700 if missing; True when it is ours and not group/world-writable.

    Logs a warning (once per directory) and returns False otherwise.
    """
    try:
        if not directory.is_dir():
            directory.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.mkdir(directory, 0o700)
            except FileExistsError:   # another process made it first: checked below like any other
                pass
        st = os.stat(directory)
    except OSError as exc:
        _warn_once(directory, f"kernel cache disabled: cannot create {directory} ({exc})")
        return False
    if not stat.S_ISDIR(st.st_mode):
        _warn_once(directory, f"kernel cache disabled: {directory} is not a directory")
        return False
    if hasattr(os, "geteuid"):
        if st.st_uid != os.geteuid():
            _warn_once(directory, f"kernel cache disabled: {directory} is owned by uid {st.st_uid}, "
                                  f"not this user ({os.geteuid()}); cached binaries there could be anyone's code")
            return False
        if st.st_mode & 0o022:
            _warn_once(directory, f"kernel cache disabled: {directory} is group- or world-writable "
                                  f"(mode {stat.S_IMODE(st.st_mode):o}); others could plant binaries there. "
                                  f"Empty it and 'chmod 700' it, or choose another serialization_dir")
            return False
    return True


class KernelCache:
    """Program binaries in one private directory (see the module docstring)."""

    def __init__(self, directory: Path, max_bytes: int = DEFAULT_MAX_BYTES, api: str = "") -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes    # 0: no cap
        self.label = f"{api} kernel cache" if api else "kernel cache"   # for log messages
        self.log = logging.getLogger(f"litegpu.{api}") if api else log    # the plugin's own logger

    @classmethod
    def for_options(cls, api: str, extra: dict) -> KernelCache | None:
        """The cache the options ask for, or None when it is off or its directory is unusable."""
        if extra.get("kernel_cache") is False:
            return None
        directory = cache_dir(api, extra)
        return cls(directory, max_bytes(api, extra), api) if private_dir(directory) else None

    def path(self, key: str) -> Path:
        """Where the entry for ``key`` lives."""
        return self.directory / f"{key}{SUFFIX}"

    def load(self, key: str) -> bytes | None:
        """The verified binary stored under ``key``, or None (a bad entry is logged and deleted)."""
        path = self.path(key)
        flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
        try:
            fd = os.open(path, flags)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:   # a symlink: never followed
                self._drop(path, None, "a symbolic link")
            else:
                self.log.warning("%s: cannot read %s (%s); building from source", self.label, path, exc)
            return None
        try:
            try:
                payload = read_entry(fd, key)
            except BadEntry as exc:
                self._drop(path, os.fstat(fd), str(exc))
                return None
            except OSError as exc:
                self.log.warning("%s: cannot read %s (%s); building from source", self.label, path, exc)
                return None
            _touch(fd, path)
            return payload
        finally:
            os.close(fd)

    def discard(self, key: str, reason: str) -> None:
        """Delete the entry for ``key`` (e.g. the driver refused its binary), logging why."""
        self._drop(self.path(key), None, reason)

    def _drop(self, path: Path, seen: os.stat_result | None, reason: str) -> None:
        self.log.warning("%s: %s is %s; deleting it and building from source", self.label, path, reason)
        try:
            # Only the file we judged: a writer may have renamed a good entry into place meanwhile.
            if seen is not None:
                now = os.lstat(path)
                if (now.st_ino, now.st_dev) != (seen.st_ino, seen.st_dev):
                    return
            os.unlink(path)
        except OSError:
            pass

    def store(self, key: str, payload: bytes) -> bool:
        """Write the entry for ``key`` atomically (temp file 0600 + rename); False, logged, on failure."""
        fd, tmp = -1, ""
        try:
            # mkstemp creates the file 0600 with O_EXCL: nobody else's file, never a symlink.
            fd, tmp = tempfile.mkstemp(prefix=f".{key[:16]}.", suffix=".tmp", dir=self.directory)
            if hasattr(os, "fchmod"):
                os.fchmod(fd, 0o600)
            data = memoryview(encode_entry(key, payload))
            while data:
                data = data[os.write(fd, data):]
            os.close(fd)
            fd = -1
            # No fsync: a torn entry after a crash fails its checksum and is rebuilt.
            os.replace(tmp, self.path(key))
            tmp = ""
        except OSError as exc:
            self.log.warning("%s: cannot store %s (%s)", self.label, self.path(key), exc)
            return False
        finally:
            if fd >= 0:
                os.close(fd)
            if tmp:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
        if self.max_bytes:
            self.evict(self.max_bytes, keep=self.path(key).name)
        return True

    def scan(self) -> list[tuple[int, int, str, os.stat_result]]:
        """The evictable files, oldest first: (mtime ns, size, name, stat) of each entry and
        each stale temp file (see ``STALE_TMP_SECONDS``). Files that vanish meanwhile are left out."""
        found = []
        stale_before = time.time_ns() - STALE_TMP_SECONDS * 10**9
        try:
            with os.scandir(self.directory) as it:
                for item in it:
                    name = item.name
                    is_tmp = name.startswith(".") and name.endswith(".tmp")
                    if not (name.endswith(SUFFIX) or is_tmp):
                        continue
                    try:
                        st = item.stat(follow_symlinks=False)
                    except FileNotFoundError:   # evicted or replaced by another process: fine
                        continue
                    if not stat.S_ISREG(st.st_mode) or (is_tmp and st.st_mtime_ns > stale_before):
                        continue
                    found.append((st.st_mtime_ns, st.st_size, name, st))
        except OSError as exc:
            self.log.warning("%s: cannot list %s (%s)", self.label, self.directory, exc)
        found.sort()
        return found

    def evict(self, cap: int, keep: str = "", found: list | None = None) -> int:
        """When the files of :meth:`scan` (or ``found``, a scan's result) exceed ``cap`` bytes,
        delete the oldest until at most 3/4 of ``cap`` remain; ``keep`` (a name) is spared.

        Returns the bytes deleted. Safe beside other processes: a file already gone counts
        as deleted, and one rewritten since the scan (another inode or mtime) is spared.
        """
        found = self.scan() if found is None else found
        total = sum(size for _, size, _, _ in found)
        if total <= cap:
            return 0
        target, freed, count = cap * 3 // 4, 0, 0
        for _, size, name, seen in found:
            if total - freed <= target:
                break
            if name == keep:
                continue
            path = self.directory / name
            try:
                now = os.lstat(path)
                # A hit touched it or a writer replaced it after the scan: it is recent now.
                if (now.st_ino, now.st_dev, now.st_mtime_ns) != (seen.st_ino, seen.st_dev, seen.st_mtime_ns):
                    continue
                os.unlink(path)
            except FileNotFoundError:   # another process evicted it first: it is gone all the same
                pass
            except OSError as exc:
                self.log.warning("%s: cannot evict %s (%s)", self.label, path, exc)
                continue
            freed += size
            count += 1
        self.log.debug("%s: evicted %d files (%d bytes) from %s over its cap of %d bytes",
                  self.label, count, freed, self.directory, cap)
        return freed


def _touch(fd: int, path: Path) -> None:
    """Set an entry's mtime to now (it was just used), so eviction takes the least recently used."""
    try:
        os.utime(fd if os.utime in os.supports_fd else path)
    except OSError:   # a read-only cache still serves hits; it just evicts in store order
        pass
