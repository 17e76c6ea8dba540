"""A user's own PoCL cache (``POCL_CACHE_DIR``), checked before PoCL reads it.

What PoCL 3.1 keeps there (read from a model run on opencl with ``POCL_CACHE_DIR`` set)::

    <dir>/tempfile_XXXXXX               one empty file per process; compile temporaries
    <dir>/<AA>/<37 letters>/            one program: its build hash (SHA-1 as 40 letters A-P, the
                                        third overwritten by the "/")
        program.bc                      the program's LLVM bitcode
        last_accessed                   empty, touched at each use
        build.log                       when a build logged something
        <kernel>/<variant>/<kernel>.so  a kernel's compiled work-group function, one per variant:
                                        "0-0-0" (any local size), "64-1-1-goffs0-smallgrid", ...

PoCL writes each file under a temporary name and renames it into place, and afterwards
trusts whatever it finds there: a program.bc or .so that is truncated, zeroed or garbage,
a directory where it keeps a file, a file where it keeps a directory, or a directory it
cannot read ends the process (SIGABRT from an assertion in ``pocl_llvm_build.cc`` /
``pocl_llvm_wg.cc`` or "Final linking of kernel ... failed", SIGSEGV or SIGBUS in
dlopen), or fails the build, in every later run too, even when litegpu hands PoCL a verified
binary (PoCL unpacks a binary's files only where none exist). A missing file PoCL
survives (it compiles or unpacks that file again), and so, measured, an unreadable one.

So before PoCL lists its devices (it opens no program before that), :func:`check_cache`
walks the user's directory and moves every damaged program aside (renamed, then deleted):
PoCL compiles it again, or unpacks it from litegpu's kernel cache, and a warning names it.
Damage is what PoCL would trip on: a program.bc whose bitcode blocks do not add up to the
file, a .so whose ELF headers or sections lie outside the file, the wrong kind of thing
at a place PoCL looks, a directory that cannot be listed; and a file that cannot be read,
since it cannot be checked. Healthy programs are left as they are.

A seal file in each program's directory (``litegpu-seal.json``, which PoCL never reads nor
packs into binaries) keeps, per file that passed, its size, mtime, ctime and sha256. A
file whose three stat fields are unchanged is not read again: a warm start costs a stat
per file and a listing per directory (~1-3 ms for mobilenet_v2's program, 69 files in 99
directories; see :func:`check_cache`'s debug line). A file whose stat changed is read
again, and any change of its content is damage: PoCL never rewrites its files (it only
writes missing ones), so that catches damage that keeps the file's structure, too. The
check runs again as a litegpu process ends (see ``driver_caches``), sealing what PoCL wrote
meanwhile while it is fresh. What neither check catches is damage that keeps the structure
of a file no litegpu process sealed (written by another program using PoCL, or by a
process that was killed) before it was damaged.
"""
from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import stat
import struct
import time

log = logging.getLogger("litegpu.opencl")

SEAL_NAME = "litegpu-seal.json"
SEAL_VERSION = 1
# The suffix of a damaged item renamed aside (in the same directory: renaming an unreadable
# directory elsewhere needs write access to it); deleted at once, or at the next check.
DAMAGED_MARK = ".litegpu-damaged-"
_OURS = ".litegpu-"   # our temporary names (a seal being written): never PoCL's

_PREFIX = re.compile(r"^[A-P]{2}$")
_PROGRAM = re.compile(r"^[A-P]{37}$")
# An OpenCL kernel name is a C identifier: PoCL gives each kernel a directory of that name.
_KERNEL = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_VARIANT = re.compile(r"^\d+-\d+-\d+(?:-[A-Za-z0-9]+)*$")
# Rewritten by PoCL in place and never parsed as code: left out of the seal.
_PROGRAM_MUTABLE = frozenset({"last_accessed", "build.log"})
_MAX_DEPTH = 4   # program/kernel/variant/file; deeper is nothing of PoCL's (and ends symlink loops)


class Damage(Exception):
    """Why a program in PoCL's cache cannot be handed to PoCL."""


# -- what PoCL parses ------------------------------------------------------------------------
_BITCODE_MAGIC = b"BC\xc0\xde"
_BITCODE_WRAPPER = b"\xde\xc0\x17\x0b"
_MODULE_BLOCK = 8
_ENTER_SUBBLOCK = 1


def _bits(data: bytes, pos: int, width: int) -> int:
    """``width`` (<= 32) bits of ``data`` from bit ``pos``, LLVM's order (least significant first)."""
    chunk = int.from_bytes(data[pos // 8:pos // 8 + 8], "little")
    return (chunk >> (pos % 8)) & ((1 << width) - 1)


def _vbr(data: bytes, pos: int, width: int) -> tuple[int, int]:
    """A variable-width integer at bit ``pos``: (value, position after it)."""
    value, shift = 0, 0
    for _ in range(64 // (width - 1) + 1):
        piece = _bits(data, pos, width)
        pos += width
        value |= (piece & ((1 << (width - 1)) - 1)) << shift
        shift += width - 1
        if not piece >> (width - 1):
            return value, pos
    raise Damage("an endless number")


def bitcode_problem(data: bytes) -> str | None:
    """None when ``data`` is LLVM bitcode whose top-level blocks fill it exactly; else why not.

    Each top-level block states its length, so a truncated file, or one whose tail is
    garbage, does not add up; LLVM's reader (inside PoCL) asserts on such a file."""
    if data[:4] == _BITCODE_WRAPPER:
        if len(data) < 20:
            return "a bitcode wrapper cut short"
        offset, size = struct.unpack_from("<II", data, 8)
        if offset + size > len(data):
            return f"its bitcode wrapper promises {offset + size} bytes, the file has {len(data)}"
        data = data[offset:offset + size]
    if data[:4] != _BITCODE_MAGIC:
        return "not LLVM bitcode"
    if len(data) % 4:
        return f"{len(data)} bytes, not whole 32-bit words"
    end, pos, blocks = len(data) * 8, 32, []
    try:
        while pos < end:
            if _bits(data, pos, 2) != _ENTER_SUBBLOCK:
                return f"no block where one starts, at byte {pos // 8}"
            block, pos = _vbr(data, pos + 2, 8)
            _, pos = _vbr(data, pos, 4)   # the block's abbreviation width
            pos = -(-pos // 32) * 32
            if pos + 32 > end:
                return f"cut short in a block header, at byte {pos // 8}"
            pos += 32 + 32 * _bits(data, pos, 32)
            blocks.append(block)
    except Damage as exc:
        return str(exc)
    if pos != end:
        return f"its last block ends at byte {pos // 8}, the file at byte {end // 8} (cut short)"
    if _MODULE_BLOCK not in blocks:
        return "no module in it"
    return None


# ELF: (header, program header, section header) layouts for 32- and 64-bit files.
_ELF_LAYOUTS = {
    1: ("HHIIIIIHHHHHH", "IIIIIIII", "IIIIIIIIII"),
    2: ("HHIQQQIHHHHHH", "IIQQQQQQ", "IIQQQQIIQQ"),
}
_ET_EXEC, _ET_DYN, _SHT_NULL, _SHT_NOBITS = 2, 3, 0, 8


def _elf_tables(data: bytes, endian: str, elf_class: int) -> str | None:
    header, program, section = (struct.Struct(endian + f) for f in _ELF_LAYOUTS[elf_class])
    (e_type, _, _, _, phoff, shoff, _, ehsize, phentsize, phnum, shentsize, shnum,
     shstrndx) = header.unpack_from(data, 16)
    if e_type not in (_ET_EXEC, _ET_DYN):
        return f"an ELF file of type {e_type}, not a shared object"
    if ehsize != 16 + header.size or phentsize != program.size or (shnum and shentsize != section.size):
        return "ELF header sizes that fit no ELF file"
    if not phnum or phoff + phnum * phentsize > len(data) or shoff + shnum * shentsize > len(data):
        return f"ELF tables beyond its end ({len(data)} bytes: cut short)"
    for i in range(phnum):
        fields = program.unpack_from(data, phoff + i * phentsize)
        offset, filesz = (fields[2], fields[5]) if elf_class == 2 else (fields[1], fields[4])
        if offset + filesz > len(data):
            return f"ELF segment {i} beyond its end ({len(data)} bytes: cut short)"
    if shnum and shstrndx >= shnum:
        return "an ELF section-name table that does not exist"
    for i in range(shnum):
        fields = section.unpack_from(data, shoff + i * shentsize)
        if fields[1] not in (_SHT_NULL, _SHT_NOBITS) and fields[4] + fields[5] > len(data):
            return f"ELF section {i} beyond its end ({len(data)} bytes: cut short or garbage)"
    return None


def elf_problem(data: bytes) -> str | None:
    """None when ``data`` is a shared object whose headers, segments and sections all lie
    inside it; else why not (dlopen inside PoCL would crash or fail on it). A linker writes
    the section table last, so a truncated file always fails this."""
    if len(data) < 16 or data[:4] != b"\x7fELF":
        return "not an ELF file"
    layout, endian = _ELF_LAYOUTS.get(data[4]), {1: "<", 2: ">"}.get(data[5])
    if layout is None or endian is None or data[6] != 1:
        return "an ELF identification that fits no ELF file"
    if len(data) < 16 + struct.calcsize(endian + layout[0]):
        return "an ELF header cut short"
    return _elf_tables(data, endian, data[4])


def content_problem(name: str, data: bytes) -> str | None:
    """Why PoCL could not parse the file ``name`` holding ``data``; None when it can, or
    when PoCL does not parse such a file."""
    if name.endswith(".so"):
        return elf_problem(data)
    if name.endswith(".bc"):
        return bitcode_problem(data)
    return None


# -- one program's directory -----------------------------------------------------------------
def _stat(entry: os.DirEntry, rel: str) -> os.stat_result:
    try:
        return entry.stat()
    except OSError as exc:   # a dangling link, or a directory above it that cannot be searched
        raise Damage(f"{rel}: {exc.strerror}") from None


def _misplaced(name: str, depth: int, is_dir: bool) -> str | None:
    """Why ``name`` at ``depth`` below a program's directory is the wrong kind of thing for
    PoCL, or None. PoCL's directories are kernels (depth 0: C identifiers) and their
    variants (depth 1: "64-1-1-goffs0-smallgrid"), never dotted; its files are dotted
    (program.bc, <kernel>.so), or last_accessed."""
    if is_dir:
        return "a directory where PoCL keeps a file" if "." in name else None
    if (depth == 0 and _KERNEL.match(name)) or (depth == 1 and _VARIANT.match(name)):
        return "a file where PoCL keeps a directory"
    return None


def _walk(path: str, rel: str, depth: int, files: dict[str, os.stat_result]) -> None:
    """Collect the files PoCL may parse below ``path`` into ``files`` (relative path -> stat);
    Damage for what PoCL would trip on in the tree itself. Directories are told by the
    directory listing alone: only files cost a stat."""
    try:
        with os.scandir(path) as it:
            entries = list(it)
    except OSError as exc:
        raise Damage(f"{rel or 'its directory'} cannot be listed ({exc.strerror})") from None
    for entry in entries:
        if entry.name.startswith(_OURS) or (depth == 0 and entry.name in (SEAL_NAME, *_PROGRAM_MUTABLE)):
            continue
        sub = f"{rel}/{entry.name}" if rel else entry.name
        try:
            is_dir = entry.is_dir()
        except OSError as exc:
            raise Damage(f"{sub}: {exc.strerror}") from None
        why = _misplaced(entry.name, depth, is_dir)
        if why is not None:
            raise Damage(f"{sub} is {why}")
        if is_dir:
            if depth < _MAX_DEPTH:
                _walk(entry.path, sub, depth + 1, files)
            continue
        st = _stat(entry, sub)
        if not stat.S_ISREG(st.st_mode):   # a FIFO would block PoCL's read
            raise Damage(f"{sub} is neither a file nor a directory")
        files[sub] = st


def _read_seal(program: str) -> dict[str, list]:
    try:
        with open(os.path.join(program, SEAL_NAME), "rb") as f:
            seal = json.load(f)
        if seal.get("version") == SEAL_VERSION and isinstance(seal.get("files"), dict):
            return seal["files"]
    except (OSError, ValueError, AttributeError):   # none yet, or damaged: every file is read again
        pass
    return {}


def _write_seal(program: str, files: dict[str, list]) -> None:
    """The seal, written under a temporary name and renamed (other processes may read it)."""
    try:
        fd, tmp = _temp_in(program)
    except OSError as exc:   # a program directory of someone else's: checked in full each time
        log.debug("PoCL cache: no seal in %s (%s)", program, exc.strerror)
        return
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"version": SEAL_VERSION, "files": files}, f, separators=(",", ":"))
        os.replace(tmp, os.path.join(program, SEAL_NAME))
    except OSError as exc:
        log.debug("PoCL cache: no seal in %s (%s)", program, exc.strerror)
        _unlink(tmp)


def _temp_in(directory: str) -> tuple[int, str]:
    path = os.path.join(directory, f"{_OURS}seal-{secrets.token_hex(6)}")
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644), path


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _signature(st: os.stat_result) -> list[int]:
    # ctime too: nobody can set it, so a file rewritten and given its old mtime back still shows.
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _record(value: object) -> list | None:
    """A seal's record of one file, [size, mtime_ns, ctime_ns, sha256]; None for anything else."""
    return value if isinstance(value, list) and len(value) == 4 else None


def _verified(path: str, rel: str, st: os.stat_result, sealed: list | None) -> list:
    """The seal record of one file whose stat changed, or was never sealed; Damage when
    PoCL cannot parse it or its content differs from what was sealed."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise Damage(f"{rel} cannot be read ({exc.strerror})") from None
    digest = hashlib.sha256(data).hexdigest()
    if sealed is not None and sealed[3] != digest:
        raise Damage(f"{rel} changed since litegpu last checked it")
    why = content_problem(rel, data)
    if why is not None:
        raise Damage(f"{rel}: {why}")
    # The stat from before the read: were the file replaced since, the next check reads it again.
    return _signature(st) + [digest]


def check_program(program: str) -> None:
    """Damage when PoCL would trip on anything in the program directory ``program``; else
    seals what was read (so a later check of unchanged files costs a stat each)."""
    files: dict[str, os.stat_result] = {}
    _walk(program, "", 0, files)
    seal = _read_seal(program)
    fresh = {}
    for rel, st in files.items():
        sealed = _record(seal.get(rel))
        if sealed is not None and sealed[:3] == _signature(st):
            fresh[rel] = sealed   # unchanged since it passed: not read again
        else:
            fresh[rel] = _verified(os.path.join(program, rel), rel, st, sealed)
    if fresh != seal:
        _write_seal(program, fresh)


# -- the whole directory ---------------------------------------------------------------------
def _unlock(path: str) -> None:
    """Make a directory tree of ours listable and writable again, so it can be deleted
    (a directory of mode 000 is still its owner's to chmod)."""
    try:
        os.chmod(path, 0o700)
        with os.scandir(path) as it:
            subdirs = [e.path for e in it if e.is_dir(follow_symlinks=False)]
    except OSError:
        return
    for sub in subdirs:
        _unlock(sub)


def _delete(path: str) -> None:
    """Delete a file or directory tree; what cannot be deleted stays for the next check."""
    if os.path.islink(path) or not os.path.isdir(path):
        _unlink(path)
        return
    shutil.rmtree(path, ignore_errors=True)
    if os.path.lexists(path):
        _unlock(path)
        shutil.rmtree(path, ignore_errors=True)
    if os.path.lexists(path):
        log.debug("PoCL cache: could not delete %s yet", path)


def move_aside(path: str, why: str) -> str | None:
    """Rename the damaged ``path`` to a name PoCL never looks up, then delete it; None, or
    why it cannot be moved (then PoCL would still find it)."""
    aside = f"{path}{DAMAGED_MARK}{os.getpid()}-{secrets.token_hex(4)}"
    try:
        os.rename(path, aside)
    except FileNotFoundError:   # another process moved it first
        return None
    except OSError as exc:
        return f"{path}: {why}; it cannot be moved aside ({exc.strerror})"
    log.warning("PoCL cache: %s is damaged (%s); moved aside, so PoCL compiles what was there again", path, why)
    _delete(aside)
    return None


def _list(path: str) -> list[os.DirEntry]:
    with os.scandir(path) as it:
        return list(it)


def _check_prefix(prefix: str) -> tuple[int, list[str]]:
    """Check the programs in one of PoCL's two-letter directories: (how many, what could
    not be moved aside)."""
    try:
        # PoCL fails to make or read its programs' directories below a file or an unreadable one.
        entries = _list(prefix)
    except OSError as exc:
        why = "a file where PoCL keeps a directory" if exc.errno == errno.ENOTDIR else \
            f"cannot be listed ({exc.strerror})"
        stuck = move_aside(prefix, why)
        return 0, [stuck] if stuck else []
    checked, stuck = 0, []
    for entry in entries:
        if DAMAGED_MARK in entry.name:
            _delete(entry.path)
            continue
        if not _PROGRAM.match(entry.name):
            continue
        checked += 1
        try:
            if not entry.is_dir():
                raise Damage("a file where PoCL keeps a program's directory")
            check_program(entry.path)
        except (Damage, OSError) as exc:   # OSError: from is_dir, when not even stat works
            why = move_aside(entry.path, str(exc))
            if why is not None:
                stuck.append(why)
    return checked, stuck


def check_cache(directory: str) -> str | None:
    """Move every damaged program in the PoCL cache ``directory`` aside (see the module
    docstring); None, or why PoCL cannot be given the directory (damage that could not be
    moved aside, or a directory that cannot be listed)."""
    started = time.perf_counter()
    try:
        entries = _list(directory)
    except OSError as exc:
        return f"{directory} cannot be listed ({exc.strerror})"
    checked, stuck = 0, []
    for entry in entries:
        if DAMAGED_MARK in entry.name:
            _delete(entry.path)
        elif _PREFIX.match(entry.name):
            n, why = _check_prefix(entry.path)
            checked, stuck = checked + n, stuck + why
    log.debug("PoCL cache %s: %d programs checked in %.1f ms", directory, checked,
              (time.perf_counter() - started) * 1e3)
    return "; ".join(stuck) or None
