"""The F16 (half arithmetic) OpenCL C of every conformance case and shared model type-checks.

F16 mode runs only on devices with ``cl_khr_fp16``, which no OpenCL implementation
here has (PoCL, oclgrind and rusticl all lack it), so its sources are never built by
the other tests. clang type-checks OpenCL C fully with the extension enabled: a
``half4``/``float4`` mix, an ambiguous ``fmax(half, float)`` or a builtin without a
half overload is an error exactly as on a device. The target is a device with
``cl_khr_fp16`` and no other extension (no fp64, as on most mobile GPUs), warnings
are errors (a ``0.5`` double literal is only a warning there), and sources are
OpenCL C 1.2, what the backend builds with its empty build options.

Partitions come from the runtime's own planning (:mod:`gpu_sources`); the sources
are what ``ClProgram`` builds (:func:`litegpu.codegen.render.program_source`).
"""
from __future__ import annotations

import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from gpu_sources import MODEL_FILES, planned, report

from litegpu.codegen import Precision
from litegpu.codegen.opencl import OPENCL
from litegpu.codegen.render import program_source
from litegpu.testing.cases import all_cases

F16 = Precision(half_storage=True, half_arith=True)
CLANG = next((p for p in map(shutil.which, ("clang-15", "clang")) if p), None)
CLANG_FLAGS = ["-x", "cl", "-cl-std=CL1.2", "-target", "spir64", "-fsyntax-only", "-Werror",
               "-Xclang", "-finclude-default-header", "-Xclang", "-cl-ext=-all,+cl_khr_fp16"]
_JOBS = 2          # clang processes at once (the machine has 2 cores)
_PER_CALL = 60     # sources per clang process: one start serves many files


@pytest.fixture(scope="session")
def clang(skip_unless_required) -> str:
    """clang's path; skips where it is absent, fails where the run requires it (tests/conftest.py)."""
    if CLANG is None:
        skip_unless_required("clang",
                             "clang-15 (or clang) not found: F16 sources are not checked "
                             "(Debian: apt-get install clang-15)")
    return CLANG


needs_clang = pytest.mark.usefixtures("clang")


def clang_check(sources: dict[str, str], workdir: Path) -> dict[str, str]:
    """Type-check each source with clang; returns {name: failure report} for those that fail.

    Sources are checked many per clang process, two processes at once; a process that
    fails is re-run one source at a time so each report holds only its own source's errors.
    """
    names = list(sources)
    paths = {}
    for n, name in enumerate(names):
        paths[name] = workdir / f"s{n}.cl"
        paths[name].write_text(sources[name])

    def run(batch: list[str]) -> tuple[int, str]:
        done = subprocess.run([CLANG, *CLANG_FLAGS, *(str(paths[name]) for name in batch)],
                              capture_output=True, text=True)
        return done.returncode, done.stdout + done.stderr

    batches = [names[i:i + _PER_CALL] for i in range(0, len(names), _PER_CALL)]
    failed = []
    with ThreadPoolExecutor(_JOBS) as pool:
        for batch, (rc, out) in zip(batches, pool.map(run, batches)):
            if rc != 0 or out.strip():
                failed += batch
    reports = {}
    for name in failed:
        rc, out = run([name])
        if rc != 0 or out.strip():
            reports[name] = report(out, sources[name], str(paths[name]))
    return reports


def _collect(keys) -> dict[str, tuple[dict[str, str], str, str]]:
    """{key: (F16 sources by name, why there are none, error)} for case ids and model files;
    an error while planning or generating is kept as a failure of that key alone."""
    found = {}
    for key in keys:
        partitions, why, error = planned(key)
        try:
            sources = {f"{key} partition {i} ({len(p.nodes)} nodes)": program_source(p, F16)
                       for i, p in enumerate(partitions)}
        except Exception as exc:   # noqa: BLE001 - reported by the key's own test
            sources, error = {}, f"{type(exc).__name__}: {exc}"
        found[key] = (sources, why, error)
    return found


def _selected(request, argname: str) -> list:
    """The parameters of this module's selected tests that take ``argname``, in order."""
    return [item.callspec.params[argname] for item in request.session.items
            if getattr(item, "module", None) is request.module and argname in getattr(
                getattr(item, "callspec", None), "params", {})]


@pytest.fixture(scope="module")
def checked(request, tmp_path_factory):
    """Sources and clang's verdicts for every selected case and model, computed in one pass."""
    found = _collect([case.id for case in _selected(request, "case")] + _selected(request, "model_file"))
    every = {name: src for sources, _, _ in found.values() for name, src in sources.items()}
    reports = clang_check(every, tmp_path_factory.mktemp("f16")) if CLANG else {}
    return found, reports


def _assert_compiles(checked, key: str) -> None:
    found, reports = checked
    sources, why, error = found[key]
    if error:
        pytest.fail(f"{key}: planning or generating its F16 sources failed: {error}")
    if not sources:
        pytest.skip(why)
    failures = [f"{name}: the F16 source does not compile:\n{reports[name]}" for name in sources if name in reports]
    assert not failures, "\n\n".join(failures)


@needs_clang
@pytest.mark.parametrize("case", all_cases(), ids=lambda c: c.id)
def test_case_f16_source_compiles(checked, case):
    _assert_compiles(checked, case.id)


@needs_clang
@pytest.mark.parametrize("model_file", MODEL_FILES)
def test_model_f16_source_compiles(checked, shared_model, model_file):
    shared_model(model_file)
    _assert_compiles(checked, model_file)


# -- the checker itself ------------------------------------------------------------------------
_KERNEL = "__kernel void k(__global FT* t0)\n{{\n  const real4 v = LD4(t0, 0);\n  {body}\n}}\n"
# Each is valid C when real is float (F32), and a mistake once real is half; the
# statement marked "wrong" is where clang must point.
_MISTAKES = {
    "float4 from real4": "const float4 w = v * (real)2;  // wrong\n  ST4(t0, 0, w);",
    "real4 plus float4": "const float4 one = (float4)(1.0f);\n  ST4(t0, 0, v + one);  // wrong",
    "fmax(real, float)": "const float lo = 0.0f;\n  ST(t0, 0, fmax(v.x, lo));  // wrong",
    "native_exp(real4)": "ST4(t0, 0, native_exp(v));  // wrong",
}


@needs_clang
@pytest.mark.parametrize("mistake", list(_MISTAKES))
def test_checker_catches_half_arithmetic_mistakes(tmp_path, mistake):
    """Each mistake compiles in F32 mode yet is reported in F16 mode, pointing at its line,
    and only against its own source when checked in a batch with correct ones."""
    body = _MISTAKES[mistake]
    f32 = OPENCL.prelude(Precision().name) + _KERNEL.format(body=body)
    bad = OPENCL.prelude(F16.name) + _KERNEL.format(body=body)
    good = OPENCL.prelude(F16.name) + _KERNEL.format(body="const float4 w = convert_float4(v) * 2.0f;\n"
                                              "  ST4(t0, 0, TO_REAL4(fmax(w, 0.0f)));\n  ST(t0, 0, exp(v.x));")
    reports = clang_check({"f32": f32, "bad": bad, "good": good}, tmp_path)
    assert set(reports) == {"bad"}, reports
    assert "error:" in reports["bad"]
    line = next(i for i, text in enumerate(bad.splitlines(), start=1) if "// wrong" in text)
    assert f">{line:5d}: {bad.splitlines()[line - 1]}" in reports["bad"], reports["bad"]
