"""PoCL's and pyopencl's own caches, damaged or read-only, never break a run (see
``litegpu_opencl.driver_caches``).

Each probe is a new process with its own cache directories (``LITEGPU_CACHE_DIR``,
``XDG_CACHE_HOME``, ``POCL_CACHE_DIR``), because PoCL and pyopencl read them once per
process. Before the fix, these probes ended in SIGABRT, SIGSEGV or SIGBUS (a damaged
PoCL cache, the user's own included, in this run and every later one), "no devices" or a
KernelBuildError blaming the kernel (a read-only PoCL cache, or a damaged directory in
it), a raw OSError (read-only ``XDG_CACHE_HOME``) or a raw ``sqlite3.DatabaseError``
(damaged pytools cache).

Read-only directories: permission bits do not bind root, so as root the directory is
made a read-only bind mount (skipped, saying why, where mounting is not allowed).
Unreadable ones: as root, the probe runs under setpriv without the capabilities that
override file modes.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import types
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from litegpu_opencl import driver_caches, pocl_cache_check

CHILD = textwrap.dedent("""
    import json, logging, os, sys
    import numpy as np
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(name)s %(levelname)s %(message)s")
    from litegpu.testing.builder import ModelBuilder
    from litegpu.compiled_model import CompiledModel
    from litegpu_opencl import driver_caches, pocl_cache_check
    b = ModelBuilder()
    x = b.input("x", (1, 4, 4, 8))
    k = b.const("c", np.full((1, 4, 4, 8), 3.0, np.float32))
    y, z = b.tensor("y", (1, 4, 4, 8)), b.tensor("z", (1, 4, 4, 8))
    b.op("ADD", [x, k], [y])
    b.op("MUL", [y, y], [z])
    b.output(z)
    cm = CompiledModel.from_buffer(b.build(), backend="opencl")
    assert cm.is_fully_accelerated()
    ins, outs = cm.create_input_buffers(), cm.create_output_buffers()
    ins[0].write(np.arange(128, dtype=np.float32).reshape(1, 4, 4, 8))
    cm.run_by_index(0, ins, outs)
    print(json.dumps({"out": outs[0].array.ravel().tolist(), "pocl_env": os.environ.get("POCL_CACHE_DIR"),
                      "scratch": driver_caches._scratch and driver_caches._scratch[0]}))
""")

EXPECTED = ((np.arange(128, dtype=np.float32) + 3) ** 2).tolist()
CACHE_VARS = ("LITEGPU_CACHE_DIR", "XDG_CACHE_HOME", "POCL_CACHE_DIR", "PYOPENCL_NO_CACHE", "POCL_KERNEL_CACHE")


def run_child(lg: Path | None, xdg: Path, pocl: Path | None = None, tmp: Path | None = None,
              wrapper: tuple[str, ...] = ()) -> tuple[dict, str]:
    """The model run in a new process (its command line after ``wrapper``) with these cache
    directories (None: variable unset) and temp directory; its JSON result and its stderr.
    Fails unless it exited cleanly."""
    env = {k: v for k, v in os.environ.items() if k not in CACHE_VARS}
    env["XDG_CACHE_HOME"] = str(xdg)
    if tmp is not None:
        env["TMPDIR"] = str(tmp)
    if lg is not None:
        env["LITEGPU_CACHE_DIR"] = str(lg)
    if pocl is not None:
        env["POCL_CACHE_DIR"] = str(pocl)
    proc = subprocess.run([*wrapper, sys.executable, "-c", CHILD], env=env, capture_output=True, text=True,
                          timeout=120)
    if proc.returncode < 0:
        pytest.fail(f"killed by {signal.Signals(-proc.returncode).name}:\n{proc.stderr[-3000:]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
    if result["scratch"]:
        assert not os.path.exists(result["scratch"]), "the PoCL scratch directory outlived its process"
    return result, proc.stderr


def works(result: dict, normal: list) -> None:
    assert result["out"] == normal


@pytest.fixture(scope="module")
def device(opencl):
    from litegpu_opencl.device import default_device
    return default_device()


@pytest.fixture(scope="module")
def pocl(device):
    if device.platform.name != driver_caches.POCL_PLATFORM:
        pytest.skip(f"PoCL is not the OpenCL device here ({device.platform.name.strip()})")


@pytest.fixture(scope="module")
def normal(opencl, tmp_path_factory) -> tuple[list, Path]:
    """A normal run's output, in fresh directories, and the XDG_CACHE_HOME it left (with
    pyopencl's invoker cache in it, and PoCL's own cache at its default place there,
    made by a run that named that place in POCL_CACHE_DIR, as PoCL's default)."""
    root = tmp_path_factory.mktemp("normal")
    result, _ = run_child(root / "lg", root / "xdg", root / "xdg" / "pocl" / "kcache")
    assert result["out"] == EXPECTED
    assert list((root / "xdg" / "pytools").glob("*.sqlite")), "pyopencl made no invoker cache"
    return result["out"], root / "xdg"


def damage(files: list[Path], kind: str) -> None:
    for f in files:
        if kind == "truncated":
            os.truncate(f, f.stat().st_size // 2)
        else:
            f.write_bytes(os.urandom(max(f.stat().st_size, 64)))


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@contextmanager
def read_only(directory: Path):
    """``directory`` read-only for the block (a read-only bind mount when we are root)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        mode = directory.stat().st_mode
        directory.chmod(0o555)
        try:
            yield
        finally:
            directory.chmod(mode)
        return
    d = str(directory)
    bind = subprocess.run(["mount", "--bind", d, d], capture_output=True, text=True)
    if bind.returncode:
        pytest.skip(f"as root, a read-only directory needs a read-only mount, and mount failed: {bind.stderr.strip()}")
    try:
        ro = subprocess.run(["mount", "-o", "remount,bind,ro", d], capture_output=True, text=True)
        if ro.returncode:
            pytest.skip(f"could not remount {d} read-only: {ro.stderr.strip()}")
        yield
    finally:
        subprocess.run(["umount", d], check=True)


# -- PoCL ----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["truncated", "garbage"])
def test_damaged_pocl_caches_are_never_read(pocl, normal, tmp_path, kind):
    """PoCL's files at its default place, and in the scratch directory of a litegpu process
    that was killed, all damaged: the run works (before: SIGABRT in pocl_llvm_build.cc), and
    so does the next; the dead process's directory is gone."""
    out, xdg_normal = normal
    xdg, lg, tmp = tmp_path / "xdg", tmp_path / "lg", tmp_path / "tmp"
    shutil.copytree(xdg_normal / "pocl", xdg / "pocl")
    leftover = tmp / (f"{driver_caches.TEMP_PREFIX}{driver_caches.SCRATCH_PREFIX}{dead_pid()}-"
                      f"{driver_caches.host_tag()}-x")
    shutil.copytree(xdg / "pocl" / "kcache", leftover)
    files = [f for f in (tmp_path).rglob("*") if f.is_file() and f.suffix in (".bc", ".so")]
    assert len(files) >= 4, files
    damage(files, kind)
    for _ in range(2):   # built from source, then loaded from litegpu's kernel cache
        result, _ = run_child(lg, xdg, tmp=tmp)
        works(result, out)
        assert result["pocl_env"] is None   # the user's environment, as it was
        assert not leftover.exists()


def test_full_cache_disk(opencl, normal, tmp_path):
    """litegpu's cache root on a full 64 KiB tmpfs: the run works (PoCL's scratch used to sit
    there: its directory could be made, its builds then failed as a KernelBuildError)."""
    out, _ = normal
    full = tmp_path / "full"
    full.mkdir()
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(full)], capture_output=True,
                           text=True)
    if mount.returncode:
        pytest.skip(f"a full disk needs a small tmpfs, and mount failed: {mount.stderr.strip()}")
    try:
        result, _ = run_child(full / "lg", tmp_path / "xdg")
        works(result, out)
    finally:
        subprocess.run(["umount", str(full)], check=True)


@pytest.mark.parametrize("exists", [True, False], ids=["existing", "missing"])
def test_read_only_pocl_cache_dir(pocl, normal, tmp_path, exists):
    """A POCL_CACHE_DIR that cannot be written (before: a KernelBuildError blaming the
    kernel, or no devices) is named in one warning and the run works."""
    ro = tmp_path / "ro"
    ro.mkdir()
    given = ro if exists else ro / "pocl"
    with read_only(ro):
        result, stderr = run_child(tmp_path / "lg", tmp_path / "xdg", given)
    works(result, normal[0])
    assert f"POCL_CACHE_DIR={given} is not usable" in stderr
    assert result["pocl_env"] == str(given)   # left as the user set it


def test_read_only_xdg_cache_home(opencl, normal, tmp_path):
    """Every default cache under a read-only XDG_CACHE_HOME (litegpu's, PoCL's, pytools'):
    before, no devices (PoCL) or a raw OSError (pytools); now it works, saying so."""
    xdg = tmp_path / "xdg"
    xdg.mkdir()
    with read_only(xdg):
        result, stderr = run_child(None, xdg)
    works(result, normal[0])
    assert f"kernel-invoker cache directory {xdg / 'pytools'} is not writable" in stderr


# -- a user's own POCL_CACHE_DIR -------------------------------------------------------------
# What PoCL 3.1 keeps for the model's one program: <dir>/<AA>/<37 letters>/ holding program.bc,
# last_accessed and <kernel>/<variant>/<kernel>.so (see litegpu_opencl.pocl_cache_check).
# Each damage below made the next run on that directory end in SIGABRT, SIGSEGV or SIGBUS, or
# fail its build, before litegpu checked the directory; now it costs that program a recompile
# (or an unpack from litegpu's kernel cache) and a warning.
@pytest.fixture(scope="module")
def user_cache(pocl, tmp_path_factory) -> tuple[Path, Path]:
    """A user's POCL_CACHE_DIR and the litegpu kernel cache beside it, after a cold run and a
    warm one (each sealed what PoCL had written as it ended)."""
    root = tmp_path_factory.mktemp("user")
    for _ in range(2):
        result, stderr = run_child(root / "lg", root / "xdg", root / "pocl")
        assert result["out"] == EXPECTED and result["pocl_env"] == str(root / "pocl") and not result["scratch"]
        assert "PoCL cache" not in stderr
    return root / "pocl", root / "lg"


def the_program(pocl_dir: Path) -> Path:
    """The directory of the model's one program in a PoCL cache."""
    (program,) = [p for p in pocl_dir.glob("*/*") if p.is_dir() and len(p.name) == 37]
    return program


def used_kernel(program: Path) -> Path:
    """A kernel binary the run loads (PoCL's "0-0-0" variant is built for binaries only)."""
    return sorted(p for p in program.glob("*/*/*.so") if p.parent.name != "0-0-0")[0]


TARGETS = {
    "program.bc": lambda program: program / "program.bc",
    "kernel.so": used_kernel,
    "variant-dir": lambda program: used_kernel(program).parent,
    "kernel-dir": lambda program: used_kernel(program).parent.parent,
    "program-dir": lambda program: program,
    "prefix-dir": lambda program: program.parent,
}


def damage_file(f: Path, how: str) -> None:
    size = f.stat().st_size
    if how == "truncated":
        os.truncate(f, size // 2)
    elif how == "empty":
        os.truncate(f, 0)
    elif how == "zeroed":
        f.write_bytes(bytes(size))
    elif how == "garbage":
        f.write_bytes(os.urandom(size))
    elif how == "garbage-tail":   # its size kept
        f.write_bytes(f.read_bytes()[:size // 2] + os.urandom(size - size // 2))
    elif how == "a-directory":
        f.unlink()
        f.mkdir()
    else:
        raise ValueError(how)


def damage_dir(d: Path, how: str) -> None:
    if how == "a-file":
        shutil.rmtree(d)
        d.write_bytes(os.urandom(256))
    elif how == "unreadable":
        d.chmod(0)
    else:
        raise ValueError(how)


def without_root_powers() -> tuple[str, ...]:
    """A command prefix under which file modes bind this process: nothing for a user; for
    root, setpriv dropping the capabilities that override them (skips where it cannot)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return ()
    if shutil.which("setpriv") is None:
        pytest.skip("as root, an unreadable file needs setpriv (util-linux) to drop CAP_DAC_OVERRIDE")
    caps = "-dac_override,-dac_read_search"
    return ("setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}")


def user_copy(user_cache: tuple[Path, Path], tmp_path: Path, warm: bool, sealed: bool = False) -> tuple[Path, Path]:
    """A copy of the user's PoCL cache (its seals removed unless ``sealed``: as a process
    left it that was killed, or another program using PoCL) and a litegpu cache (a copy of
    the warm one, or an empty one: PoCL then builds from source)."""
    pocl_dir, lg = user_cache
    shutil.copytree(pocl_dir, tmp_path / "pocl", copy_function=shutil.copy2)
    if not sealed:
        for seal in (tmp_path / "pocl").rglob(pocl_cache_check.SEAL_NAME):
            seal.unlink()
    if warm:
        shutil.copytree(lg, tmp_path / "lg")
    return tmp_path / "pocl", tmp_path / "lg"


def identities(program: Path) -> dict[str, tuple[int, int]]:
    """(inode, mtime) of each file PoCL wrote for the program: a recompile or an unpack changes them."""
    skip = {"last_accessed", pocl_cache_check.SEAL_NAME}
    return {str(f.relative_to(program)): (f.stat().st_ino, f.stat().st_mtime_ns)
            for f in program.rglob("*") if f.is_file() and f.name not in skip}


FILE_DAMAGES = ["truncated", "empty", "zeroed", "garbage", "garbage-tail", "a-directory"]
DAMAGES = ([("program.bc", how, "warm") for how in FILE_DAMAGES if how != "a-directory"]
           + [("program.bc", "a-directory", "cold")]   # warm, PoCL never reads it
           + [("kernel.so", how, "warm") for how in FILE_DAMAGES]
           + [(d, how, "warm") for d in ("variant-dir", "kernel-dir", "program-dir", "prefix-dir")
              for how in ("a-file", "unreadable")]
           + [("program.bc", "garbage", "cold"), ("kernel.so", "truncated", "cold"),
              ("kernel-dir", "a-file", "cold")])


# One damage of each part of a program runs by default (a subprocess each, ~3 s); the
# in-process structure checks below see every damage of every file; -m slow runs them all.
DEFAULT_DAMAGES = {("program.bc", "truncated", "warm"), ("kernel.so", "garbage-tail", "warm"),
                   ("program-dir", "unreadable", "warm"), ("kernel-dir", "a-file", "cold")}


@pytest.mark.parametrize("target,how,litegpu_cache", [
    pytest.param(*d, id="-".join(d), marks=() if d in DEFAULT_DAMAGES else pytest.mark.slow) for d in DAMAGES])
def test_damaged_user_pocl_cache(user_cache, tmp_path, target, how, litegpu_cache):
    """The user's PoCL cache damaged one way; the model runs, correctly, with litegpu's
    kernel cache warm (PoCL unpacks the program again) or cold (PoCL compiles it again), and a
    warning names what was moved aside. Before, SIGABRT, SIGSEGV, SIGBUS or a failed build."""
    pocl_dir, lg = user_copy(user_cache, tmp_path, warm=litegpu_cache == "warm")
    program = the_program(pocl_dir)
    victim = TARGETS[target](program)
    moved = program.parent if target == "prefix-dir" else program
    if target.endswith("-dir"):
        damage_dir(victim, how)
    else:
        damage_file(victim, how)
    wrapper = without_root_powers() if how == "unreadable" else ()
    result, stderr = run_child(lg, tmp_path / "xdg", pocl_dir, wrapper=wrapper)
    works(result, EXPECTED)
    assert f"PoCL cache: {moved} is damaged (" in stderr, stderr
    assert result["pocl_env"] == str(pocl_dir) and not result["scratch"]   # the user's directory, still
    pocl_cache_check.check_program(str(the_program(pocl_dir)))   # written again, whole
    assert not [p for p in pocl_dir.rglob("*") if pocl_cache_check.DAMAGED_MARK in p.name]


def test_after_a_damaged_program_the_next_run_is_warm(user_cache, tmp_path):
    """Once the damaged program is moved aside and written again, the next run finds it
    healthy: nothing moved, nothing compiled or unpacked again."""
    pocl_dir, lg = user_copy(user_cache, tmp_path, warm=True)
    damage_file(used_kernel(the_program(pocl_dir)), "garbage")
    _, stderr = run_child(lg, tmp_path / "xdg", pocl_dir)
    assert "is damaged" in stderr
    before = identities(the_program(pocl_dir))
    result, stderr = run_child(lg, tmp_path / "xdg", pocl_dir)
    works(result, EXPECTED)
    assert "PoCL cache" not in stderr and identities(the_program(pocl_dir)) == before


@pytest.mark.parametrize("sealed", [True, False], ids=["sealed", "unsealed"])
def test_healthy_user_pocl_cache_is_used_as_it_is(user_cache, tmp_path, sealed):
    """A healthy POCL_CACHE_DIR (sealed by litegpu, or not: written by another program) is
    PoCL's on a warm start: no warning, no file of PoCL's written again; the check seals it."""
    pocl_dir, lg = user_copy(user_cache, tmp_path, warm=True, sealed=sealed)
    program = the_program(pocl_dir)
    before = identities(program)
    result, stderr = run_child(lg, tmp_path / "xdg", pocl_dir)
    works(result, EXPECTED)
    assert result["pocl_env"] == str(pocl_dir) and "PoCL cache" not in stderr
    assert identities(program) == before
    assert (program / pocl_cache_check.SEAL_NAME).is_file()


def test_sealed_program_damaged_in_its_middle(user_cache, tmp_path):
    """Garbage inside a sealed kernel binary, its ELF headers intact (before: SIGSEGV): the
    seal's checksum finds what no look at the structure could."""
    pocl_dir, lg = user_copy(user_cache, tmp_path, warm=True, sealed=True)
    kernel = used_kernel(the_program(pocl_dir))
    data = bytearray(kernel.read_bytes())
    data[len(data) // 4:len(data) // 4 + 2000] = os.urandom(2000)
    kernel.write_bytes(bytes(data))
    assert pocl_cache_check.elf_problem(bytes(data)) is None   # its structure tells nothing
    result, stderr = run_child(lg, tmp_path / "xdg", pocl_dir)
    works(result, EXPECTED)
    assert "changed since litegpu last checked it" in stderr


@pytest.mark.parametrize("target", ["program.bc", "kernel.so"])
@pytest.mark.parametrize("how", ["removed", "unreadable"])
def test_missing_or_unreadable_user_pocl_files(user_cache, tmp_path, target, how):
    """A file of PoCL's missing or unreadable: PoCL itself survives these (it writes the file
    again); an unreadable one litegpu cannot check, so it moves the program aside too."""
    pocl_dir, lg = user_copy(user_cache, tmp_path, warm=True)
    victim = TARGETS[target](the_program(pocl_dir))
    if how == "removed":
        victim.unlink()
    else:
        victim.chmod(0)
    wrapper = without_root_powers() if how == "unreadable" else ()
    result, stderr = run_child(lg, tmp_path / "xdg", pocl_dir, wrapper=wrapper)
    works(result, EXPECTED)
    assert ("is damaged" in stderr) == (how == "unreadable"), stderr
    assert TARGETS[target](the_program(pocl_dir)).is_file()


def test_damage_that_cannot_be_moved_aside(user_cache, tmp_path):
    """A damaged program in a directory litegpu cannot change (a read-only two-letter
    directory): PoCL would abort, so this process gets a scratch directory, with a warning."""
    pocl_dir, lg = user_copy(user_cache, tmp_path, warm=True)
    program = the_program(pocl_dir)
    damage_file(program / "program.bc", "truncated")
    with read_only(program.parent):
        result, stderr = run_child(lg, tmp_path / "xdg", pocl_dir)
    works(result, EXPECTED)
    assert f"POCL_CACHE_DIR={pocl_dir} holds damaged programs that cannot be moved aside" in stderr
    assert result["scratch"] and result["pocl_env"] == str(pocl_dir)


# -- the checks, in this process -------------------------------------------------------------
def test_a_users_own_context_gets_its_pocl_cache_checked(user_cache, tmp_path, monkeypatch, opencl):
    """A pyopencl context of the user's (Environment.create(opencl_context=...)): PoCL took its
    directory already, but a damaged program in it is moved aside before litegpu builds."""
    from litegpu_opencl.device import Device, default_device
    pocl_dir, _ = user_copy(user_cache, tmp_path, warm=False)
    program = the_program(pocl_dir)
    damage_file(TARGETS["program.bc"](program), "truncated")
    monkeypatch.setenv("POCL_CACHE_DIR", str(pocl_dir))
    Device.from_user(default_device().context)
    assert not program.exists()
    assert pocl_cache_check.check_cache(str(pocl_dir)) is None



@pytest.mark.parametrize("target", ["program.bc", "kernel.so"])
@pytest.mark.parametrize("how", [h for h in FILE_DAMAGES if h != "a-directory"])
def test_structure_checks_find_each_damage(user_cache, tmp_path, target, how):
    """Each damage to an unsealed file is found by its structure (bitcode blocks that do not
    fill the file, ELF tables outside it), and a healthy file passes."""
    original = TARGETS[target](the_program(user_cache[0]))
    assert pocl_cache_check.content_problem(original.name, original.read_bytes()) is None
    copy = tmp_path / original.name
    shutil.copyfile(original, copy)
    damage_file(copy, how)
    assert pocl_cache_check.content_problem(copy.name, copy.read_bytes()) is not None


def test_check_seals_and_then_only_stats(user_cache, tmp_path, monkeypatch):
    """A first check reads every file and seals them; the next reads no file of PoCL's."""
    pocl_dir, _ = user_copy(user_cache, tmp_path, warm=False)
    program = the_program(pocl_dir)
    assert pocl_cache_check.check_cache(str(pocl_dir)) is None
    seal = json.loads((program / pocl_cache_check.SEAL_NAME).read_text())["files"]
    assert "program.bc" in seal and any(name.endswith(".so") for name in seal)

    def no_reading(*args, **kwargs):
        raise AssertionError("a sealed, unchanged file was read again")
    monkeypatch.setattr(pocl_cache_check, "_verified", no_reading)
    assert pocl_cache_check.check_cache(str(pocl_dir)) is None


# -- pyopencl ------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["truncated", "garbage"])
def test_damaged_pyopencl_caches(opencl, normal, tmp_path, kind):
    """pyopencl's invoker cache (pytools' sqlite file) damaged, garbage in its binary cache:
    before, a raw sqlite3.DatabaseError; now one warning naming the file, and the run works."""
    out, xdg_normal = normal
    xdg = tmp_path / "xdg"
    shutil.copytree(xdg_normal / "pytools", xdg / "pytools")
    (db,) = (xdg / "pytools").glob("*pyopencl-invoker*.sqlite")
    if kind == "truncated":
        os.truncate(db, 1000)
    else:
        db.write_bytes(os.urandom(4096))
    binaries = xdg / "pyopencl" / "pyopencl-compiler-cache-v2-py" / "0123"
    binaries.mkdir(parents=True)
    for name in ("info", "binary", "source.cl"):
        (binaries / name).write_bytes(os.urandom(256))
    for _ in range(2):
        result, stderr = run_child(tmp_path / "lg", xdg)
        works(result, out)
        assert f"kernel-invoker cache {db} is unusable (DatabaseError" in stderr


# -- the pieces, in this process -----------------------------------------------------------
class _Platform:
    def __init__(self, name: str) -> None:
        self.name = name


def test_pocl_gets_a_scratch_directory_only_while_its_devices_are_listed(tmp_path, monkeypatch):
    monkeypatch.setattr(driver_caches, "_scratch", None)
    monkeypatch.setenv("LITEGPU_CACHE_DIR", str(tmp_path / "lg"))
    monkeypatch.delenv("POCL_CACHE_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    with driver_caches.pocl_cache([_Platform("Other")]) as problem:
        assert problem == "" and "POCL_CACHE_DIR" not in os.environ
    assert driver_caches._scratch is None   # nothing made where there is no PoCL
    with driver_caches.pocl_cache([_Platform("Other"), _Platform(driver_caches.POCL_PLATFORM)]) as problem:
        scratch = Path(os.environ["POCL_CACHE_DIR"])
        assert problem == "" and scratch.parent == tmp_path / "tmp" and scratch.is_dir()
        assert scratch.stat().st_mode & 0o077 == 0
    assert "POCL_CACHE_DIR" not in os.environ
    monkeypatch.setenv("POCL_CACHE_DIR", str(tmp_path / "mine"))   # the user's, writable: untouched
    with driver_caches.pocl_cache([_Platform(driver_caches.POCL_PLATFORM)]):
        assert os.environ["POCL_CACHE_DIR"] == str(tmp_path / "mine")
    shutil.rmtree(scratch)


def test_no_writable_directory_is_said_in_the_error(tmp_path, monkeypatch, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setattr(driver_caches, "_scratch", None)
    monkeypatch.delenv("POCL_CACHE_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(blocker / "tmp"))
    # Only the temp directory unusable: one under litegpu's root, with one warning.
    monkeypatch.setenv("LITEGPU_CACHE_DIR", str(tmp_path / "lg"))
    with caplog.at_level(logging.WARNING, logger="litegpu.opencl"):
        path, why = driver_caches.make_scratch_dir()
    assert why == "" and Path(path).parent == tmp_path / "lg" / "pocl" and "using" in caplog.text
    shutil.rmtree(path)
    # Both unusable: no directory, and the reason for the "no devices" error.
    monkeypatch.setenv("LITEGPU_CACHE_DIR", str(blocker / "lg"))
    with driver_caches.pocl_cache([_Platform(driver_caches.POCL_PLATFORM)]) as problem:
        assert "POCL_CACHE_DIR" not in os.environ
    assert str(blocker / "lg" / "pocl") in problem and "set POCL_CACHE_DIR to a writable directory" in problem


def test_sweep_removes_only_dead_processes_directories_of_this_machine(tmp_path):
    host, dead = driver_caches.host_tag(), dead_pid()
    names = {f"run-{dead}-{host}-a": False, f"run-{os.getpid()}-{host}-b": True,
             f"run-{dead}-00000000-c": True, "other": True, f"litegpu-pocl-run-{dead}-{host}-d": False}
    for name in names:
        (tmp_path / name / "k").mkdir(parents=True)
    (tmp_path / f"run-{dead}-{host}-file").write_text("")   # not a directory: left alone
    assert driver_caches.sweep(tmp_path) == 2
    assert {n: (tmp_path / n).exists() for n in names} == names
    assert (tmp_path / f"run-{dead}-{host}-file").exists()


def _fake_cl(fails: list[BaseException]):
    """A pyopencl stand-in whose Kernel raises the exceptions in ``fails``, one per call."""
    cl = types.SimpleNamespace(_PYOPENCL_NO_CACHE=False, Error=type("Error", (Exception,), {}))

    def kernel(program, name):
        if fails:
            raise fails.pop(0)
        return (program, name, cl._PYOPENCL_NO_CACHE)
    cl.Kernel = kernel
    return cl


def test_kernel_made_again_without_a_failing_invoker_cache(caplog):
    cl = _fake_cl([sqlite3.DatabaseError("database disk image is malformed")])
    with caplog.at_level(logging.WARNING, logger="litegpu.opencl"):
        assert driver_caches.new_kernel(cl, "prg", "k") == ("prg", "k", True)
    assert "kernel-invoker cache" in caplog.text and "malformed" in caplog.text
    cl = _fake_cl([])
    cl.Kernel = lambda program, name: (_ for _ in ()).throw(cl.Error("INVALID_KERNEL_NAME"))
    with pytest.raises(cl.Error):   # the driver's own errors are not the cache's
        driver_caches.new_kernel(cl, "prg", "k")
    assert cl._PYOPENCL_NO_CACHE is False
