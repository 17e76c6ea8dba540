"""The opencl backend's on-disk kernel cache, on the real OpenCL device and real files.

Every test uses its own directory (``serialization_dir`` = a tmp_path), so entries never
leak between tests or into the user's cache. Programs are tiny and repeated, so the
driver's own cache keeps the many rebuilds cheap.
"""
from __future__ import annotations

import logging
import os
import stat
import struct
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from litegpu.backend import CompileOptions
from litegpu.errors import ExecutionError
from litegpu.testing.builder import ModelBuilder

SOURCE = "__kernel void bump(__global float* a) { a[get_global_id(0)] += 1.5f; }\n"


@pytest.fixture(scope="module")
def device(opencl):
    from litegpu_opencl.device import default_device
    return default_device()


def build(device, directory, source=SOURCE, **extra):
    """build_program with the cache in ``directory``; (program, cache_hit)."""
    from litegpu_opencl.build import build_program
    return build_program(device, source, CompileOptions(extra={"serialization_dir": str(directory), **extra}))


def bump_works(device, program, name: str = "bump") -> bool:
    """Run the program's kernel ``name`` on [0, 1, 2, 3]; True when it added 1.5 to each."""
    cl = device.cl
    host = np.arange(4, dtype=np.float32)
    buf = cl.Buffer(device.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=host)
    kernel = cl.Kernel(program, name)
    kernel.set_arg(0, buf)
    cl.enqueue_nd_range_kernel(device.queue, kernel, (4,), None)
    out = np.empty_like(host)
    cl.enqueue_copy(device.queue, out, buf, is_blocking=True)
    return np.array_equal(out, host + 1.5)


def entries(directory: Path) -> list[Path]:
    return sorted(directory.iterdir())


def the_entry(directory: Path) -> Path:
    files = entries(directory)
    assert len(files) == 1 and files[0].suffix == ".clbin", files
    return files[0]


def warm(device, directory) -> Path:
    """Build once so ``directory`` holds the entry; its path."""
    _, hit = build(device, directory)
    assert not hit
    return the_entry(directory)


def rebuilt_and_repaired(device, directory, caplog, why: str) -> None:
    """The damaged entry is logged, rebuilt from source (result right) and replaced by a good one."""
    with caplog.at_level(logging.WARNING, logger="litegpu.opencl"):
        program, hit = build(device, directory)
    assert not hit
    assert bump_works(device, program)
    assert any(why in r.getMessage() for r in caplog.records if r.name == "litegpu.opencl"), caplog.text
    program, hit = build(device, directory)
    assert hit and bump_works(device, program)


# -- storage ---------------------------------------------------------------------------------
def test_private_directory_and_files(device, tmp_path):
    directory = tmp_path / "a" / "cache"
    program, hit = build(device, directory)
    assert not hit and bump_works(device, program)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    entry = the_entry(directory)      # no temp file left beside it
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600
    assert entry.read_bytes()[:8] == b"LGPUCLB\x00"
    program, hit = build(device, directory)
    assert hit and bump_works(device, program)


def test_kernel_cache_false_writes_nothing(device, tmp_path):
    program, hit = build(device, tmp_path / "off", kernel_cache=False)
    assert not hit and bump_works(device, program)
    assert not (tmp_path / "off").exists()


def test_key_covers_source_model_and_token(device, tmp_path):
    from litegpu.model import load_model
    from litegpu_opencl.build import build_program

    def opts(**kw):
        model = kw.pop("model", None)
        return CompileOptions(model=model, extra={"serialization_dir": str(tmp_path), **kw})

    m1, m2 = (load_model(add_model(c)) for c in (1.0, 2.0))
    assert m1.digest() != m2.digest()
    for options in (opts(), opts(model=m1), opts(model=m2), opts(model=m1, model_token="v2")):
        assert not build_program(device, SOURCE, options)[1]     # each a new key: a miss
    assert not build(device, tmp_path, SOURCE.replace("1.5f", "2.5f"))[1]
    assert len(entries(tmp_path)) == 5
    assert build_program(device, SOURCE, opts(model=m1, model_token="v2"))[1]   # and each one now a hit


# -- damaged entries: logged, deleted, rebuilt ------------------------------------------------
def test_corrupt_payload_byte(device, tmp_path, caplog):
    entry = warm(device, tmp_path)
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 0x40
    entry.write_bytes(bytes(data))
    rebuilt_and_repaired(device, tmp_path, caplog, "checksum")


@pytest.mark.parametrize("keep", [0.5, 20], ids=["half", "inside-header"])
def test_truncated_entry(device, tmp_path, caplog, keep):
    entry = warm(device, tmp_path)
    data = entry.read_bytes()
    entry.write_bytes(data[:int(len(data) * keep) if keep < 1 else keep])
    rebuilt_and_repaired(device, tmp_path, caplog, "truncated")


def test_wrong_magic(device, tmp_path, caplog):
    entry = warm(device, tmp_path)
    entry.write_bytes(b"\x7fELF\x02\x01\x01\x00" + entry.read_bytes()[8:])
    rebuilt_and_repaired(device, tmp_path, caplog, "magic")


def test_header_claims_huge_length(device, tmp_path, caplog):
    from litegpu.kernel_cache import _HEADER
    entry = warm(device, tmp_path)
    data = entry.read_bytes()
    magic, version, key, _, digest = _HEADER.unpack_from(data)
    entry.write_bytes(_HEADER.pack(magic, version, key, 2**63 - 1, digest) + data[_HEADER.size:])
    rebuilt_and_repaired(device, tmp_path, caplog, "header says")


def test_stale_format_version(device, tmp_path, caplog):
    entry = warm(device, tmp_path)
    data = bytearray(entry.read_bytes())
    struct.pack_into("<I", data, 8, 999)
    entry.write_bytes(bytes(data))
    rebuilt_and_repaired(device, tmp_path, caplog, "stale")


def test_entry_under_another_key(device, tmp_path, caplog):
    entry = warm(device, tmp_path)
    other = SOURCE.replace("1.5f", "7.0f")
    build(device, tmp_path, other)
    (other_entry,) = [p for p in entries(tmp_path) if p != entry]
    os.replace(other_entry, entry)     # a well-formed entry, but for another program
    rebuilt_and_repaired(device, tmp_path, caplog, "another key")


def test_symlinked_entry_is_not_followed(device, tmp_path, caplog):
    entry = warm(device, tmp_path / "c")
    target = tmp_path / "elsewhere.clbin"
    os.replace(entry, target)
    entry.symlink_to(target)
    rebuilt_and_repaired(device, tmp_path / "c", caplog, "symbolic link")
    assert target.exists()            # the link was removed, never what it points at


def test_verified_entry_the_driver_refuses(device, tmp_path, caplog):
    """A well-formed entry whose payload is no binary this driver takes (e.g. after a driver change)."""
    from litegpu.kernel_cache import encode_entry
    entry = warm(device, tmp_path)
    entry.write_bytes(encode_entry(entry.stem, b"definitely not a device binary" * 10))
    rebuilt_and_repaired(device, tmp_path, caplog, "refused by the driver")


# -- directories that must not be used --------------------------------------------------------
@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o770], ids=["world", "sticky-world", "group"])
def test_writable_directory_is_not_used(device, tmp_path, caplog, mode):
    directory = tmp_path / "shared"
    directory.mkdir()
    directory.chmod(mode)
    with caplog.at_level(logging.WARNING, logger="litegpu.opencl"):
        for _ in range(2):
            program, hit = build(device, directory)
            assert not hit and bump_works(device, program)
    assert entries(directory) == []
    assert stat.S_IMODE(directory.stat().st_mode) == mode    # refused, not silently changed
    assert "writable" in caplog.text


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to chown")
def test_directory_of_another_user_is_not_used(device, tmp_path, caplog):
    directory = tmp_path / "theirs"
    directory.mkdir(mode=0o700)
    os.chown(directory, 65534, 65534)
    with caplog.at_level(logging.WARNING, logger="litegpu.opencl"):
        program, hit = build(device, directory)
    assert not hit and bump_works(device, program)
    assert entries(directory) == [] and "owned by uid 65534" in caplog.text


def test_directory_choice(tmp_path, monkeypatch):
    from litegpu.kernel_cache import cache_dir
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("LITEGPU_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert cache_dir("opencl", {}) == tmp_path / "home" / ".cache" / "litegpu" / "opencl"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir("opencl", {}) == tmp_path / "xdg" / "litegpu" / "opencl"
    monkeypatch.setenv("LITEGPU_CACHE_DIR", str(tmp_path / "lg"))
    assert cache_dir("opencl", {}) == tmp_path / "lg" / "opencl"
    assert cache_dir("opencl", {"serialization_dir": str(tmp_path / "s")}) == tmp_path / "s"


# -- forbid_compile: proof that a warm run compiles nothing -----------------------------------
def add_model(c: float = 1.0) -> bytes:
    """y = x + c over (1, 4, 4, 8): one ADD, all on opencl."""
    b = ModelBuilder()
    x = b.input("x", (1, 4, 4, 8))
    k = b.const("c", np.full((1, 4, 4, 8), c, np.float32))
    y = b.tensor("y", (1, 4, 4, 8))
    b.op("ADD", [x, k], [y])
    b.output(y)
    return b.build()


def run_add(data: bytes, **env_options) -> tuple[np.ndarray, list[bool]]:
    """The ADD model's output on opencl for x = arange, and each opencl program's cache_hit."""
    from litegpu.compiled_model import CompiledModel, Environment
    cm = CompiledModel.from_buffer(data, backend="opencl", environment=Environment.create(**env_options))
    assert cm.is_fully_accelerated()
    ins, outs = cm.create_input_buffers(), cm.create_output_buffers()
    ins[0].write(np.arange(128, dtype=np.float32).reshape(1, 4, 4, 8))
    cm.run_by_index(0, ins, outs)
    hits = [p.cache_hit for compiled in cm._compiled for p, _, _ in compiled.programs]
    return outs[0].array.copy(), hits


def test_forbid_compile(device, tmp_path, monkeypatch):
    data, want = add_model(3.0), np.arange(128, dtype=np.float32).reshape(1, 4, 4, 8) + 3
    with pytest.raises(ExecutionError, match="kernel cache had no entry"):
        run_add(data, serialization_dir=str(tmp_path), forbid_compile=True)
    assert entries(tmp_path) == []
    got, hits = run_add(data, serialization_dir=str(tmp_path))           # fills the cache
    assert hits == [False] and np.array_equal(got, want)
    got, hits = run_add(data, serialization_dir=str(tmp_path), forbid_compile=True)
    assert hits == [True] and np.array_equal(got, want)
    monkeypatch.setenv("LITEGPU_OPENCL_FORBID_COMPILE", "1")
    got, hits = run_add(data, serialization_dir=str(tmp_path))
    assert hits == [True] and np.array_equal(got, want)
    with pytest.raises(ExecutionError, match="kernel cache had no entry"):
        run_add(add_model(4.0), serialization_dir=str(tmp_path))   # another model: another key


_PROCESS = textwrap.dedent("""
    import sys, numpy as np
    sys.path.insert(0, sys.argv[1])
    from test_opencl_cache import add_model, run_add
    got, hits = run_add(add_model(3.0))
    assert np.array_equal(got, np.arange(128, dtype=np.float32).reshape(1, 4, 4, 8) + 3), got
    print("hits", hits)
""")


def test_warm_process_needs_no_driver_cache(device, tmp_path):
    """A new process with fresh pyopencl/PoCL cache directories still compiles nothing."""
    _, hits = run_add(add_model(3.0), serialization_dir=str(tmp_path / "litegpu" / "opencl"))
    assert hits == [False]
    env = {**os.environ, "LITEGPU_CACHE_DIR": str(tmp_path / "litegpu"), "XDG_CACHE_HOME": str(tmp_path / "xdg"),
           "POCL_CACHE_DIR": str(tmp_path / "pocl"), "LITEGPU_OPENCL_FORBID_COMPILE": "1"}
    proc = subprocess.run([sys.executable, "-c", _PROCESS, str(Path(__file__).parent)], check=False, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "hits [True]" in proc.stdout
    assert len(entries(tmp_path / "litegpu" / "opencl")) == 1


# -- concurrency ------------------------------------------------------------------------------
_WRITER = textwrap.dedent("""
    import sys
    from litegpu.kernel_cache import KernelCache
    cache = KernelCache(sys.argv[1])
    payload = bytes([int(sys.argv[3])]) * (1 << 20)
    for _ in range(int(sys.argv[4])):
        assert cache.store(sys.argv[2], payload)
""")


def test_concurrent_writers_leave_a_valid_entry(tmp_path, caplog):
    from litegpu.kernel_cache import KernelCache, cache_key, private_dir
    assert private_dir(tmp_path / "c")
    cache, key = KernelCache(tmp_path / "c"), cache_key("opencl", "src", "", "dev")
    payloads = {bytes([n]) * (1 << 20) for n in (1, 2)}
    writers = [subprocess.Popen([sys.executable, "-c", _WRITER, str(cache.directory), key, str(n), "10"])
               for n in (1, 2)]
    seen = set()
    with caplog.at_level(logging.WARNING, logger="litegpu.opencl"):
        while any(w.poll() is None for w in writers):
            payload = cache.load(key)         # a reader racing the writers sees a whole entry or none
            if payload is not None:
                assert payload in payloads
                seen.add(payload[0])
    assert all(w.returncode == 0 for w in writers)
    assert [r for r in caplog.records if r.name == "litegpu.opencl"] == []   # no reader met a damaged entry
    assert cache.load(key) in payloads
    assert [p.name for p in entries(cache.directory)] == [f"{key}.clbin"]   # no temp files left
    assert seen


# -- PoCL: binaries re-stored after the first run ---------------------------------------------
def test_warmed_pocl_binary(device, tmp_path):
    """After a run, the re-stored PoCL entry carries the work-group function compiled for it, and loads."""
    from litegpu_opencl.build import POCL_PLATFORM, store_warmed_binary
    if device.platform.name != POCL_PLATFORM:
        pytest.skip("only PoCL compiles work-group functions at the first enqueue")
    # A kernel PoCL has never seen (its cache would otherwise hold the work-group function already).
    name = f"bump_{uuid.uuid4().hex}"
    source = SOURCE.replace("bump", name)
    directory = tmp_path / "c"
    options = CompileOptions(extra={"serialization_dir": str(directory)})
    program, hit = build(device, directory, source)
    assert not hit
    before = the_entry(directory).read_bytes()
    cl = device.cl
    buf = cl.Buffer(device.context, cl.mem_flags.READ_WRITE, 4096 * 4)
    kernel = cl.Kernel(program, name)
    kernel.set_arg(0, buf)
    cl.enqueue_nd_range_kernel(device.queue, kernel, (4096,), None).wait()
    assert store_warmed_binary(device, source, options)
    after = the_entry(directory).read_bytes()
    # PoCL names a work-group function specialized for a launch "<local size>-goffs0..."
    assert b"goffs0" not in before and b"goffs0" in after
    program, hit = build(device, directory, source, forbid_compile=True)
    assert hit and bump_works(device, program, name)
    assert not store_warmed_binary(device, source, CompileOptions(extra={"serialization_dir": str(directory),
                                                                          "kernel_cache": False}))


# -- size cap: least recently used entries evicted on store -----------------------------------
def small_cache(directory: Path, cap: int):
    """A KernelCache in ``directory`` (created private) with a cap of ``cap`` bytes."""
    from litegpu.kernel_cache import KernelCache, private_dir
    assert private_dir(directory)
    return KernelCache(directory, max_bytes=cap)


def key_of(n: int) -> str:
    from litegpu.kernel_cache import cache_key
    return cache_key("opencl", f"source {n}", "", "dev")


ENTRY = 1000    # payload bytes of the test entries


def entry_bytes() -> int:
    from litegpu.kernel_cache import HEADER_SIZE
    return HEADER_SIZE + ENTRY


def store_aged(cache, n: int, age_s: int) -> Path:
    """Store entry ``n`` (payload byte n) and date its mtime ``age_s`` seconds back; its path."""
    assert cache.store(key_of(n), bytes([n]) * ENTRY)
    path = cache.path(key_of(n))
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


def present(cache, count: int) -> list[int]:
    return [n for n in range(count) if cache.path(key_of(n)).exists()]


def test_store_evicts_oldest_down_to_three_quarters(tmp_path):
    cache = small_cache(tmp_path / "c", 10 * entry_bytes())
    for n in range(10):                      # exactly at the cap: nothing goes
        store_aged(cache, n, 1000 - n)       # entry 0 the oldest
    assert present(cache, 10) == list(range(10))
    assert cache.store(key_of(10), bytes([10]) * ENTRY)   # 11 entries > cap: down to <= 7.5
    assert present(cache, 11) == [4, 5, 6, 7, 8, 9, 10]
    assert sum(p.stat().st_size for p in entries(cache.directory)) <= 10 * entry_bytes() * 3 // 4
    for n in present(cache, 11):             # what is left is intact
        assert cache.load(key_of(n)) == bytes([n]) * ENTRY


def test_hit_makes_an_entry_recent(tmp_path):
    cache = small_cache(tmp_path / "c", 4 * entry_bytes())
    paths = [store_aged(cache, n, 1000 - n) for n in range(4)]
    old = paths[0].stat().st_mtime
    assert cache.load(key_of(0)) == bytes([0]) * ENTRY     # a hit: entry 0 is now the newest
    assert paths[0].stat().st_mtime > old + 500
    assert cache.store(key_of(4), bytes([4]) * ENTRY)      # 5 > 4: down to <= 3
    assert present(cache, 5) == [0, 3, 4]


def test_no_cap_keeps_everything(tmp_path):
    cache = small_cache(tmp_path / "c", 0)
    for n in range(5):
        store_aged(cache, n, 1000 - n)
    assert present(cache, 5) == list(range(5))
    assert cache.evict(entry_bytes()) > 0    # the same entries over a real cap would go


def test_eviction_tolerates_files_vanishing_or_changing(tmp_path, caplog):
    """Another process evicts or rewrites entries between our scan and our deletes."""
    cache = small_cache(tmp_path / "c", 0)     # no cap while filling: 8 entries, twice the cap below
    for n in range(8):
        store_aged(cache, n, 1000 - n)
    cache.max_bytes = 4 * entry_bytes()
    found = cache.scan()
    assert [name for _, _, name, _ in found] == [cache.path(key_of(n)).name for n in range(8)]
    os.unlink(cache.path(key_of(0)))              # gone before we got to it
    os.unlink(cache.path(key_of(2)))
    store_aged(cache, 1, 10)                      # rewritten (another inode, newer): must be spared
    with caplog.at_level(logging.WARNING, logger="litegpu.opencl"):
        cache.evict(cache.max_bytes, found=found)
    assert caplog.records == []
    # Down to <= 3 entries: 0 and 2 count as freed (gone anyway), 1 is spared, 3, 4, 5 go.
    assert present(cache, 8) == [1, 6, 7]


def test_stale_temp_files_are_evicted_fresh_ones_kept(tmp_path):
    cache = small_cache(tmp_path / "c", 3 * entry_bytes())
    stale, fresh = cache.directory / ".crashed.tmp", cache.directory / ".writing.tmp"
    for path in (stale, fresh):
        path.write_bytes(b"x" * entry_bytes())
    day_ago, half_hour_ago = time.time() - 86400, time.time() - 1800
    os.utime(stale, (day_ago, day_ago))
    os.utime(fresh, (half_hour_ago, half_hour_ago))    # older than the entries, younger than an hour
    for n in range(3):
        store_aged(cache, n, 1000 - n)
    assert not stale.exists()                 # the oldest file: first to go
    assert fresh.exists()                     # maybe a writer's: never counted nor deleted
    assert present(cache, 3) == [1, 2]       # storing 2 went over: the stale file, then entry 0


def test_cap_from_option_environment_default(monkeypatch, caplog):
    from litegpu.errors import InvalidArgumentError
    from litegpu.kernel_cache import DEFAULT_MAX_BYTES, max_bytes, max_bytes_env
    MAX_BYTES_ENV = max_bytes_env("opencl")
    monkeypatch.delenv(MAX_BYTES_ENV, raising=False)
    assert max_bytes("opencl", {}) == DEFAULT_MAX_BYTES == 512 << 20
    monkeypatch.setenv(MAX_BYTES_ENV, "12345")
    assert max_bytes("opencl", {}) == 12345
    assert max_bytes("opencl", {"kernel_cache_max_bytes": 777}) == 777        # the option wins
    assert max_bytes("opencl", {"kernel_cache_max_bytes": np.int64(0)}) == 0   # 0: no cap
    for bad in (-1, "big", 1.5, True):
        with pytest.raises(InvalidArgumentError, match="kernel_cache_max_bytes"):
            max_bytes("opencl", {"kernel_cache_max_bytes": bad})
    monkeypatch.setenv(MAX_BYTES_ENV, "lots")
    with caplog.at_level(logging.WARNING, logger="litegpu.opencl"):
        assert max_bytes("opencl", {}) == DEFAULT_MAX_BYTES
    assert MAX_BYTES_ENV in caplog.text


def test_build_program_honours_the_cap(device, tmp_path):
    """Real programs: with room for about one entry, building a second evicts the first."""
    first, second = (SOURCE.replace("1.5f", f"{v}f") for v in ("11.5", "12.5"))
    _, hit = build(device, tmp_path, first)
    assert not hit
    cap = the_entry(tmp_path).stat().st_size * 3 // 2
    _, hit = build(device, tmp_path, second, kernel_cache_max_bytes=cap)
    assert not hit
    kept = the_entry(tmp_path)                    # only the newest is left
    _, hit = build(device, tmp_path, second, kernel_cache_max_bytes=cap)
    assert hit
    _, hit = build(device, tmp_path, first, kernel_cache_max_bytes=cap)
    assert not hit                                # evicted: built again (and now the second went)
    assert the_entry(tmp_path) != kept


_EVICTING_WRITER = textwrap.dedent("""
    import sys
    from litegpu.kernel_cache import KernelCache, cache_key
    cache = KernelCache(sys.argv[1], max_bytes=int(sys.argv[2]))
    writer = int(sys.argv[3])
    for i in range(40):
        n = writer * 1000 + i
        assert cache.store(cache_key("opencl", f"source {n}", "", "dev"), bytes([n % 256]) * 1000)
        cache.load(cache_key("opencl", f"source {writer * 1000 + i // 2}", "", "dev"))   # hits too (touches)
""")


def test_concurrent_writers_evicting(tmp_path):
    """Processes storing into one capped directory at once: none fails or logs, and the
    directory ends near the cap holding only valid entries."""
    cache = small_cache(tmp_path / "c", 8 * entry_bytes())
    writers = [subprocess.Popen([sys.executable, "-c", _EVICTING_WRITER, str(cache.directory),
                                 str(cache.max_bytes), str(w)], stderr=subprocess.PIPE, text=True)
               for w in range(3)]
    errors = [w.communicate(timeout=120)[1] for w in writers]
    assert [w.returncode for w in writers] == [0, 0, 0], errors
    assert errors == ["", "", ""]             # no warning: vanished files were taken in stride
    files = entries(cache.directory)
    assert all(p.suffix == ".clbin" for p in files)
    # Each store leaves <= the cap after its own eviction; stores racing the last one may add theirs.
    assert sum(p.stat().st_size for p in files) <= cache.max_bytes + 2 * entry_bytes()
    by_name = {cache.path(key_of(n)).name: n for w in range(3) for n in range(w * 1000, w * 1000 + 40)}
    for p in files:
        n = by_name[p.name]
        assert cache.load(key_of(n)) == bytes([n % 256]) * ENTRY
