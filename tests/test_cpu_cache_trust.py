"""The cpu backend's caches are optional: a read-only, missing, full or damaged cache costs
speed, never the run, and nothing is written into the installed package.

Every run here is a fresh process with its own ``LITEGPU_CACHE_DIR`` (numba's compiled
functions and cache decisions are per process). The child builds one small model (a conv,
then a fused MUL -> LOGISTIC -> ADD chain: a fixed kernel and a generated one), runs it,
and reports a digest of the output, numba's cache hits and misses for litegpu's functions,
the hits and misses of litegpu's own cache of task functions' machine code
(:mod:`litegpu_cpu.objects`), and every file it opened for writing (an audit hook), so a test sees what was written and
what was loaded rather than guessing from timings.

Read-only and full-disk caches are real mounts (a tmpfs, remounted read-only): root ignores
permission bits, so ``chmod`` would prove nothing. Those tests skip, saying why, where this
process cannot mount.
"""
from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

log = logging.getLogger(__name__)

CHILD = r'''
import hashlib, json, logging, os, sys, threading, time
start = time.perf_counter()
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
import litegpu_cpu
from litegpu import env
PACKAGE = os.path.dirname(os.path.abspath(litegpu_cpu.__file__)) + os.sep
CACHE = os.path.abspath(env.cache_root()) + os.sep
writes = {"package": [], "cache": []}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT

def audit(event, args):
    if event == "open":
        path, mode, flags = args
        if not (mode and any(c in mode for c in "wax+")) and not (mode is None and flags & WRITE_FLAGS):
            return
        paths = [path]
    elif event in ("os.rename", "os.mkdir", "os.remove"):
        paths = [p for p in args[:2] if isinstance(p, (str, bytes, os.PathLike))]
    else:
        return
    for p in paths:
        if isinstance(p, int):
            continue
        p = os.path.abspath(os.fsdecode(p))
        for where, root in (("package", PACKAGE), ("cache", CACHE)):
            if p.startswith(root):
                writes[where].append(p)

sys.addaudithook(audit)
import numpy as np
from numba.core import caching
from litegpu.interpreter import Interpreter
from litegpu.testing.builder import ModelBuilder
import litegpu_cpu.kernels   # installs litegpu's cache locator and guards, counted below

loads = {"hit": 0, "miss": 0}
guarded_load = caching.Cache.load_overload

def counting_load(self, sig, target_context):
    result = guarded_load(self, sig, target_context)
    if getattr(self._impl.locator, "litegpu", False):
        loads["hit" if result is not None else "miss"] += 1
    return result

caching.Cache.load_overload = counting_load
import litegpu_cpu.objects as objects
linked = {"hit": 0, "miss": 0}
object_load = objects.load
def counting_object_load(entry):
    address = object_load(entry)
    linked["hit" if address else "miss"] += 1
    return address
objects.load = counting_object_load

def model():
    b = ModelBuilder()
    x = b.input("x", [1, 8, 8, 4])
    w = b.const("w", np.linspace(-1, 1, 8 * 3 * 3 * 4, dtype=np.float32).reshape(8, 3, 3, 4))
    bias = b.const("bias", np.linspace(-0.5, 0.5, 8, dtype=np.float32))
    c = b.tensor("c", [1, 8, 8, 8])
    b.op("CONV_2D", [x, w, bias], [c], padding="SAME", stride_w=1, stride_h=1)
    k = b.const("k", np.linspace(0.25, 0.75, 8, dtype=np.float32))
    m = b.tensor("m", [1, 8, 8, 8]); b.op("MUL", [c, k], [m])
    s = b.tensor("s", [1, 8, 8, 8]); b.op("LOGISTIC", [m], [s])
    y = b.tensor("y", [1, 8, 8, 8]); b.op("ADD", [s, k], [y])
    b.output(y)
    return b.build()

MODEL = model()
X = np.linspace(-2, 2, 256, dtype=np.float32).reshape(1, 8, 8, 4)

def run_once():
    it = Interpreter(model_content=MODEL)
    it.allocate_tensors()
    it.set_tensor(it.get_input_details()[0]["index"], X)
    it.invoke()
    return hashlib.sha256(it.get_tensor(it.get_output_details()[0]["index"]).tobytes()).hexdigest()

threads = int(sys.argv[1])
digests, errors = [None] * threads, []
barrier = threading.Barrier(threads)

def work(i):
    try:
        barrier.wait()
        digests[i] = run_once()
    except BaseException as exc:
        errors.append(f"{type(exc).__name__}: {exc}")

workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
for t in workers:
    t.start()
for t in workers:
    t.join()
print(json.dumps({"digests": digests, "errors": errors, "loads": loads, "linked": linked, "writes": writes,
                  "seconds": time.perf_counter() - start}))
'''


@dataclass
class Child:
    """What one child process reported: its JSON line, its log (stderr) and its wall time."""
    result: dict
    log: str
    wall: float

    @property
    def digests(self) -> set:
        return set(self.result["digests"])

    @property
    def loads(self) -> dict:
        return self.result["loads"]

    @property
    def linked(self) -> dict:
        return self.result["linked"]

    @property
    def misses(self) -> int:
        """Functions compiled or loaded through numba's cache, or missing from litegpu's."""
        return self.loads["miss"] + self.linked["miss"]


def run_child(cache: Path, threads: int = 1) -> Child:
    """Run the model in a fresh process with ``LITEGPU_CACHE_DIR=cache``; it must succeed and
    write nothing into the installed package."""
    environ = dict(os.environ, LITEGPU_CACHE_DIR=str(cache), PYTHONDONTWRITEBYTECODE="1")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CHILD, str(threads)], env=environ, capture_output=True,
                          text=True, timeout=180)
    wall = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr[-4000:]
    child = Child(json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr, wall)
    assert child.result["errors"] == [], child.result["errors"]
    assert child.result["writes"]["package"] == []      # (f): never into the package's __pycache__
    assert "Traceback" not in child.log, child.log[-4000:]
    return child


@dataclass
class Warm:
    """A cache warmed by one cold run, and that run."""
    cache: Path
    cold: Child

    @property
    def digest(self) -> str:
        (digest,) = self.cold.digests
        return digest


@pytest.fixture(scope="module")
def warm(tmp_path_factory) -> Warm:
    """A cache warmed by one cold run (copy it; never change it)."""
    cache = tmp_path_factory.mktemp("warm") / "cache"
    return Warm(cache, run_child(cache))


def numba_files(root: Path, suffix: str) -> list[Path]:
    return sorted(root.glob(f"numba/*/**/*{suffix}"))


def object_files(root: Path) -> list[Path]:
    """litegpu's entries of task functions' machine code."""
    return sorted(root.glob("numba/*/objects/*.o"))


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root``: (size, mtime in ns)."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in root.rglob("*") if p.is_file()}


# -- mounts -----------------------------------------------------------------------------
def _mount(*args: str) -> None:
    proc = subprocess.run(["mount", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount here (mount {' '.join(args)}: {proc.stderr.strip()}); "
                    "read-only and full caches need a real mount, since root ignores permission bits")


@contextlib.contextmanager
def tmpfs(path: Path, size: str):
    """A tmpfs of ``size`` mounted at ``path`` (made), unmounted on the way out."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root and mount(8); read-only and full caches need a real "
                    "mount, since root ignores permission bits")
    path.mkdir()
    _mount("-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path))
    try:
        yield path
    finally:
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], capture_output=True)


def fill(path: Path) -> None:
    """Write into ``path`` until its file system is full."""
    fd = os.open(path / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)


# -- tests ------------------------------------------------------------------------------
def test_cold_run_caches_under_the_cache_root_only(warm):
    """(f) numba's entries and litegpu's machine code of the fixed and the generated kernels
    land under the cache root, and the audit hook (which every child asserts saw no write
    into the package) sees them."""
    assert warm.cold.loads["hit"] == 0 and warm.cold.loads["miss"] > 0
    assert warm.cold.linked["hit"] == 0 and warm.cold.linked["miss"] > 0
    assert warm.cold.result["writes"]["cache"], "the audit hook saw no write at all"
    assert len(object_files(warm.cache)) >= 2, object_files(warm.cache)
    fixed = [p for p in numba_files(warm.cache, ".nbi") if "litegpu_cpu" in p.parts]
    generated = [p for p in numba_files(warm.cache, ".nbi") if "generated" in p.parts]
    assert fixed and generated, numba_files(warm.cache, ".nbi")
    assert list(warm.cache.glob("numba/*/generated/fused_*.py"))


def test_read_only_warm_cache_loads_and_writes_nothing(warm, tmp_path):
    """(a) A warm cache on a read-only mount (how an image ships one) is loaded from, nothing is
    written, and the process says once that the cache is read-only. Start-up is compared with
    the same cache writable (best of two each)."""
    writable = tmp_path / "writable"
    shutil.copytree(warm.cache, writable)
    writable_runs = [run_child(writable) for _ in range(2)]
    with tmpfs(tmp_path / "ro", "32m") as root:
        shutil.copytree(warm.cache, root, dirs_exist_ok=True)
        _mount("-o", "remount,ro", str(root))
        before = snapshot(root)
        ro_runs = [run_child(root) for _ in range(2)]
        assert snapshot(root) == before
    for child in ro_runs:
        assert child.digests == {warm.digest}
        assert child.misses == 0 and child.linked["hit"] > 0, (child.loads, child.linked)
        assert child.log.count("is read-only") == 1, child.log
        assert "cannot store" not in child.log and " is damaged (" not in child.log, child.log
    for child in writable_runs:
        assert child.digests == {warm.digest} and child.misses == 0
    line = next(s for s in ro_runs[0].log.splitlines() if "is read-only" in s)
    log.info("warm start, process wall time (best of 2): writable %.2f s, read-only %.2f s; "
             "first result in-process: writable %.2f s, read-only %.2f s; log: %s",
             min(c.wall for c in writable_runs), min(c.wall for c in ro_runs),
             min(c.result["seconds"] for c in writable_runs), min(c.result["seconds"] for c in ro_runs), line)


def test_cache_root_that_is_a_file(warm, tmp_path):
    """(b) A cache root that is a file: no disk cache (said once), the file untouched, same outputs."""
    root = tmp_path / "cache"
    root.write_bytes(b"not a directory")
    child = run_child(root)
    assert child.digests == {warm.digest}
    assert child.log.count("numba kernel cache disabled") == 1, child.log
    assert root.read_bytes() == b"not a directory"


@pytest.mark.parametrize("filled", [False, True], ids=["tiny", "filled"])
def test_full_disk(warm, tmp_path, filled):
    """(c) A 64 KiB tmpfs: stores fail part way (``tiny``) or at once (``filled``); the run goes
    on, says so once, and a later run on the same disk works too."""
    with tmpfs(tmp_path / "full", "64k") as disk:
        if filled:
            fill(disk)
        first = run_child(disk / "cache")
        assert first.digests == {warm.digest}
        assert first.log.count("cannot store") == 1, first.log
        if not filled:
            again = run_child(disk / "cache")
            assert again.digests == {warm.digest}


def _damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[:len(data) // 3])
    else:
        path.write_bytes(bytes((b * 131 + 17) & 0xFF for b in data[:2000]))


@pytest.mark.parametrize("how", ["truncated", "garbage"])
def test_damaged_entries_are_misses(warm, tmp_path, how):
    """(d) Damaged numba index (.nbi) and data (.nbc) files and a damaged generated .py: the run
    logs, deletes and compiles again; a later run loads everything from the repaired cache.
    (litegpu's machine code is removed first, so that every function goes through numba's
    entries; the run keeps it again.)"""
    cache = tmp_path / "cache"
    shutil.copytree(warm.cache, cache)
    for path in object_files(cache):
        path.unlink()
    indexes = numba_files(cache, ".nbi")
    assert len(indexes) >= 4
    for i, index in enumerate(indexes):   # every other function: its index, else its data files
        if i % 2 == 0:
            _damage(index, how)
        else:
            for data in index.parent.glob(index.name[:-len(".nbi")] + ".*.nbc"):
                _damage(data, how)
    (source,) = cache.glob("numba/*/generated/fused_*.py")
    intact = source.read_text()
    _damage(source, how)

    first = run_child(cache)
    assert first.digests == {warm.digest}
    assert first.log.count(" is damaged (") == len(indexes), first.log
    assert "deleting it" in first.log
    assert source.read_text() == intact
    again = run_child(cache)
    assert again.digests == {warm.digest}
    assert " is damaged (" not in again.log, again.log
    assert again.misses == 0, (again.loads, again.linked)


@pytest.mark.parametrize("how", ["truncated", "garbage"])
def test_damaged_machine_code_is_a_miss(warm, tmp_path, how):
    """(d) Damaged entries of litegpu's machine code (a truncated object would crash LLVM's
    linker, so each is checked against its sha256 first): the run logs and deletes each one
    and takes the function from numba's cache, whose object it keeps again; a later run
    links everything."""
    cache = tmp_path / "cache"
    shutil.copytree(warm.cache, cache)
    entries = object_files(cache)
    for path in entries:
        _damage(path, how)
    first = run_child(cache)
    assert first.digests == {warm.digest}
    assert first.log.count(" is damaged (") == len(entries), first.log
    assert len(object_files(cache)) == len(entries)      # kept again, whole
    again = run_child(cache)
    assert again.digests == {warm.digest}
    assert " is damaged (" not in again.log, again.log
    assert again.misses == 0 and again.linked["hit"] > 0, (again.loads, again.linked)


def test_threads_building_interpreters_on_a_cold_cache(warm, tmp_path):
    """(e) 16 threads of one process each build an Interpreter of the same model on a cold
    cache at once: all succeed, with the same outputs."""
    child = run_child(tmp_path / "cache", threads=16)
    assert child.result["digests"] == [warm.digest] * 16
    assert not list((tmp_path / "cache").glob("numba/*/generated/*.tmp"))


def test_processes_building_on_a_cold_cache(warm, tmp_path):
    """Three processes start on one cold cache at once: all succeed with the same outputs,
    and the cache they leave serves a fourth with no miss."""
    from concurrent.futures import ThreadPoolExecutor
    cache = tmp_path / "cache"
    with ThreadPoolExecutor(3) as pool:
        children = list(pool.map(lambda _: run_child(cache), range(3)))
    assert all(c.digests == {warm.digest} for c in children)
    after = run_child(cache)
    assert after.digests == {warm.digest} and after.misses == 0, (after.loads, after.linked)
    assert " is damaged (" not in after.log, after.log


def test_entries_are_keyed_by_the_sources_content_not_its_mtime(tmp_path):
    """A reinstall or a copied environment writes new mtimes: the stamp numba checks an
    entry against stays the same while the content does, and changes with it."""
    from litegpu_cpu import numba_cache
    numba_cache.install()
    locator_class = numba_cache._make_locator_class()
    source = tmp_path / "kernel.py"
    source.write_text("def f():\n    return 1\n")

    def stamp() -> object:
        return locator_class(lambda: None, str(source), numba_cache.home(), "t").get_source_stamp()

    first = stamp()
    os.utime(source, ns=(1, 1))
    assert stamp() == first
    source.write_text("def f():\n    return 2\n")
    os.utime(source, ns=(1, 1))
    assert stamp() != first


def test_entries_are_keyed_by_every_source_of_the_package(tmp_path, monkeypatch):
    """A cached function holds what it calls compiled in, from other modules too: an entry
    is stale when any source of the package changed, not only its own file."""
    from litegpu_cpu import numba_cache
    source = tmp_path / "kernel.py"
    source.write_text("def f():\n    return 1\n")
    first = numba_cache._content_stamp(str(source))
    assert numba_cache._package_digest() == hashlib.sha256(b"".join(
        os.path.relpath(p, numba_cache._PACKAGE_PARENT + "/litegpu_cpu").encode() + b"\0" + Path(p).read_bytes()
        for p in sorted(glob.glob(numba_cache._PACKAGE_PARENT + "/litegpu_cpu/**/*.py", recursive=True)))).digest()
    # Another module of the package edited (its digest changes): this file's stamp changes.
    monkeypatch.setattr(numba_cache, "_PACKAGE_DIGEST", [b"another launcher"])
    monkeypatch.setattr(numba_cache, "_STAMPS", {})
    assert numba_cache._content_stamp(str(source)) != first
