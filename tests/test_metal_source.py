"""The Metal Shading Language of every conformance case and shared model type-checks.

There is no Metal compiler here, so clang++ checks the kernels as C++17 against
``tests/msl/metal_stub.h``, a model of MSL (its comment says what it models and what it
cannot check): the address spaces are clang address spaces, so a threadgroup pointer
where a device pointer is needed is an error; MSL's vectors, its one-type math and its
scalar-only ``?:`` condition are modelled, and what MSL lacks is left out, so the
library of :data:`litegpu.codegen.metal.METAL` (``vload4``, ``float8``, ...) is checked
with the kernels. Every program is rendered in F32, F32_F16 and F16; warnings are errors.

The stub ignores attributes, so this test checks them itself on every kernel: only the
ones the dialect uses, and distinct ``[[buffer(n)]]`` indices below Metal's 31 per kernel.

Partitions come from the runtime's own planning (:mod:`gpu_sources`), for the metal
dialect; their kernels are :func:`litegpu.codegen.render.partition_kernels` with the
METAL dialect, named ``k_<digest>`` as the renderer names them.

To stay fast on two cores each distinct kernel is checked once, as
``tests/test_cuda_source.py`` does: kernels are keyed by precision and content
(``KernelSpec.digest``), so identical kernels of different programs are one, and many of
one precision go into one translation unit behind a single prelude and library (a
program's kernels never call each other, so this checks what every program holds), two
clang++ processes at once. A unit that fails is checked again in parts of a few kernels,
and a failing part one kernel at a time, so each case or model is shown only its own
errors. (A precompiled header of the stub, library and prelude was measured too: with a
few hundred kernels a unit it saves nothing.)
"""
from __future__ import annotations

import logging
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from gpu_sources import MODEL_FILES, planned, report

from litegpu.codegen import Precision
from litegpu.codegen.metal import METAL
from litegpu.codegen.render import partition_kernels
from litegpu.testing.cases import all_cases

log = logging.getLogger(__name__)

PRECISIONS = {"F32": Precision(), "F32_F16": Precision(half_storage=True),
              "F16": Precision(half_storage=True, half_arith=True)}
STUB_DIR = Path(__file__).resolve().parent / "msl"
CLANGXX = next((p for p in map(shutil.which, ("clang++-15", "clang++")) if p), None)
CLANG_FLAGS = ["-x", "c++", "-std=c++17", "-fsyntax-only", "-Werror", "-Wno-unknown-attributes",
               "-ferror-limit=20", "-I", str(STUB_DIR)]
_JOBS = 2           # clang processes at once (the machine has 2 cores)
_PER_UNIT = 250     # kernels per translation unit: one prelude and library serve them all
_SPLIT = 16         # kernels per unit when a failing unit is checked again in parts
_MAX_BUFFERS = 31   # Metal's buffer argument table
_ATTRIBUTES = {"thread_position_in_grid", "thread_position_in_threadgroup", "threadgroup_position_in_grid"}
# clang refuses automatic variables in an address space outside OpenCL; MSL declares threadgroup
# arrays at kernel scope. Made static for clang: same type, same line, so reports point right.
_LOCAL_ARRAY = re.compile(r"^(\s*)(threadgroup \w+ \w+\[\d+\];)", re.M)


@pytest.fixture(scope="session")
def clangxx(skip_unless_required) -> str:
    """clang++'s path; skips where it is absent, fails where the run requires clang (tests/conftest.py)."""
    if CLANGXX is None:
        skip_unless_required("clang",
                             "clang++-15 (or clang++) not found: Metal sources are not checked "
                             "(Debian: apt-get install clang-15)")
    return CLANGXX


needs_clang = pytest.mark.usefixtures("clangxx")


def attribute_errors(source: str, first_line: int = 1) -> list[str]:
    """What the stub cannot check about the attributes of ``source``'s kernels (lines counted
    from ``first_line``)."""
    errors = []
    for line_no, line in enumerate(source.splitlines(), start=first_line):
        if not line.startswith("kernel void"):
            continue
        buffers = [int(n) for n in re.findall(r"\[\[buffer\((\d+)\)\]\]", line)]
        others = set(re.findall(r"\[\[(\w+)(?!\()\]\]", line)) - _ATTRIBUTES
        if others:
            errors.append(f"line {line_no}: attributes Metal's kernels do not take here: {sorted(others)}")
        if buffers != list(range(len(buffers))) or len(buffers) > _MAX_BUFFERS:
            errors.append(f"line {line_no}: buffer indices {buffers} are not 0..n-1 with n <= {_MAX_BUFFERS}")
    return errors


def _clang(path: Path) -> tuple[bool, str]:
    """(type-checks without a diagnostic, clang++'s output) for one translation unit."""
    done = subprocess.run([CLANGXX, *CLANG_FLAGS, str(path)], capture_output=True, text=True)
    out = done.stdout + done.stderr
    return done.returncode == 0 and not out.strip(), out


def _parts(keys: list) -> list[list]:
    """A failing unit's parts, to check again: ``_SPLIT`` kernels each, or one each once that few."""
    size = _SPLIT if len(keys) > _SPLIT else 1
    return [keys[i:i + size] for i in range(0, len(keys), size)]


def clang_check(kernels: dict[tuple[str, str], str], workdir: Path) -> dict[tuple[str, str], str]:
    """Type-check kernels, keyed (precision name, digest), against the stub; returns
    {key: failure report} for those that fail.

    Kernels of one precision share translation units of up to ``_PER_UNIT`` behind one
    prelude (:meth:`METAL.prelude`), two clang++ processes at once; a failing unit's
    kernels are checked again in units of ``_SPLIT``, and those of a failing one of these one
    kernel at a time, so each report holds only its own kernel's errors, with the source lines (prelude
    and kernel) they point at. Every kernel's attributes are checked too
    (:func:`attribute_errors`).
    """
    def unit(name: str, keys: list[tuple[str, str]]) -> Path:
        path = workdir / f"{name}.metal"
        path.write_text(METAL.prelude(keys[0][0])
                        + "\n".join(_LOCAL_ARRAY.sub(r"\1static \2", kernels[key]) for key in keys))
        return path

    units = []
    for precision in PRECISIONS:
        keys = [key for key in kernels if key[0] == precision]
        count = -(-len(keys) // _PER_UNIT)   # as few as hold them, evenly filled
        units += [keys[n * len(keys) // count:(n + 1) * len(keys) // count] for n in range(count)]
    failed, made = [], 0   # failing units of every round: (keys, path, clang++'s output)
    with ThreadPoolExecutor(_JOBS) as pool:
        while units:
            paths = [unit(f"unit{made + n}", keys) for n, keys in enumerate(units)]
            made += len(units)
            now = [(keys, path, out) for keys, path, (ok, out) in zip(units, paths, pool.map(_clang, paths))
                   if not ok]
            failed += now
            units = [part for keys, _, _ in now if len(keys) > 1 for part in _parts(keys)]
    reports = {}
    for keys, path, out in failed:
        if len(keys) == 1:
            reports[keys[0]] = report(out, METAL.prelude(keys[0][0]) + kernels[keys[0]], str(path))
    for keys, _, out in failed:   # never expected: kernels meet only in these units
        if not any(key in reports for key in keys):
            reports.update((key, f"its unit of {len(keys)} kernels fails, though no part of it does:\n{out}")
                           for key in keys)
    for key, source in kernels.items():
        errors = attribute_errors(source, METAL.prelude(key[0]).count("\n") + 1)
        if errors:
            reports[key] = "\n".join(errors) + ("\n" + reports[key] if key in reports else "")
    return reports


def _collect(keys):
    """({key: (its kernels' (precision, digest) keys, why there are none, error)},
    {(precision, digest): kernel source}, number of programs, number of their kernel functions)
    for case ids and model files (digest "" stands for a program that holds no kernel); an
    error while planning or generating is kept as a failure of that key alone."""
    found, kernels, programs, functions = {}, {}, 0, 0
    for key in keys:
        partitions, why, error = planned(key, "metal")
        mine = set()
        try:
            for partition in partitions:
                for name, precision in PRECISIONS.items():
                    program = set()
                    for step in partition_kernels(partition, precision, METAL):
                        for k in step:   # named as the renderer names them
                            kernels.setdefault((name, k.digest), k.source.replace("KERNEL", f"k_{k.digest}", 1))
                            program.add((name, k.digest))
                    programs, functions = programs + 1, functions + len(program)
                    if not program:   # a program of no kernel is its prelude alone: checked as such
                        kernels.setdefault((name, ""), "")
                        program.add((name, ""))
                    mine |= program
        except Exception as exc:   # noqa: BLE001 - reported by the key's own test
            mine, error = set(), f"{type(exc).__name__}: {exc}"
        found[key] = (mine, why, error)
    return found, kernels, programs, functions


def _selected(request, argname: str) -> list:
    """The parameters of this module's selected tests that take ``argname``, in order."""
    return [item.callspec.params[argname] for item in request.session.items
            if getattr(item, "module", None) is request.module and argname in getattr(
                getattr(item, "callspec", None), "params", {})]


@pytest.fixture(scope="module")
def checked(request, tmp_path_factory):
    """Kernels and clang++'s verdicts for every selected case and model, computed in one pass."""
    found, kernels, programs, functions = _collect(
        [case.id for case in _selected(request, "case")] + _selected(request, "model_file"))
    reports = clang_check(kernels, tmp_path_factory.mktemp("msl")) if CLANGXX and kernels else {}
    log.info("Metal sources checked: %d programs (%d keys; F32, F32_F16, F16) of %d kernel functions, "
             "%d distinct kernels type-checked, %d kernels failing (%d keys)", programs,
             sum(1 for mine, _, _ in found.values() if mine), functions, sum(1 for k in kernels if k[1]),
             len(reports), sum(1 for mine, _, _ in found.values() if mine & reports.keys()))
    return found, reports


def _assert_compiles(checked, key: str) -> None:
    found, reports = checked
    mine, why, error = found[key]
    if error:
        pytest.fail(f"{key}: planning or generating its Metal sources failed: {error}")
    if not mine:
        pytest.skip(why)
    failures = [f"{key}: {f'a {k[0]} kernel (k_{k[1]})' if k[1] else f'its {k[0]} prelude'} does not "
                f"type-check as Metal:\n{reports[k]}" for k in sorted(mine) if k in reports]
    assert not failures, "\n\n".join(failures)


@needs_clang
@pytest.mark.parametrize("case", all_cases(), ids=lambda c: c.id)
def test_case_metal_source_compiles(checked, case):
    _assert_compiles(checked, case.id)


@needs_clang
@pytest.mark.parametrize("model_file", MODEL_FILES)
def test_model_metal_source_compiles(checked, shared_model, model_file):
    shared_model(model_file)
    _assert_compiles(checked, model_file)


# -- the checker itself ------------------------------------------------------------------------
_KERNEL = ("kernel void {name}(device FT* t0 [[buffer(0)]], device float* t1 [[buffer(1)]], "
           "uint3 lg_gid [[thread_position_in_grid]])\n{{\n"
           "  threadgroup float tile[16];\n  const real4 v = LD4(t0, 0);\n  {body}\n}}\n")
_CORRECT = ("tile[0] = (float)v.x;\n  threadgroup_barrier(mem_flags::mem_threadgroup);\n"
            "  const float8 w = vload8(0, t1);\n  vstore4(w.lo + vload4(0, tile), 0, t1);\n"
            "  ST4(t0, 0, clamp(v, (real)0, (real)6));")
# Each is a mistake Metal reports; the statement marked "wrong" is where clang must point.
_MISTAKES = {
    "threadgroup pointer for a device one": "device float* out = tile + 4;  // wrong\n  vstore4(vload4(0, t1), 0, out);",
    "float8 into a float4": "const float4 w = vload8(0, t1);  // wrong",
    "vector condition of ?:": "ST4(t0, 0, v > (real)0 ? v : -v);  // wrong",
    "half load through a float pointer": "ST(t0, 0, vload_half(0, t1));  // wrong",
}


@needs_clang
@pytest.mark.parametrize("mistake", list(_MISTAKES))
def test_checker_catches_mistakes(tmp_path, mistake):
    """Each mistake is reported pointing at its line, and only against its own kernel when
    checked in a unit with correct ones (which pass, in every precision)."""
    kernels = {(p, "good"): _KERNEL.format(name="k_good", body=_CORRECT) for p in PRECISIONS}
    kernels[("F32", "bad")] = _KERNEL.format(name="k_bad", body=_MISTAKES[mistake])
    reports = clang_check(kernels, tmp_path)
    assert set(reports) == {("F32", "bad")}, reports
    text = reports[("F32", "bad")]
    assert "error:" in text
    source = METAL.prelude("F32") + kernels[("F32", "bad")]
    line = next(i for i, s in enumerate(source.splitlines(), start=1) if "// wrong" in s)
    assert f">{line:5d}: {source.splitlines()[line - 1]}" in text, text


def test_attribute_check_catches_a_bad_buffer_index():
    source = "kernel void k(device float* t0 [[buffer(0)]], device float* t1 [[buffer(2)]])\n{\n}\n"
    assert attribute_errors(source) and not attribute_errors(source.replace("buffer(2)", "buffer(1)"))
