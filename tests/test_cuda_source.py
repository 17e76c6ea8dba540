"""The CUDA C++ of every conformance case and shared model compiles with NVRTC.

Every GPU partition (:mod:`gpu_sources`) is rendered with the CUDA dialect
(:mod:`litegpu.codegen.cuda`) in F32, F32_F16 and F16 and compiled by NVRTC (a pip
wheel: no GPU, driver or CUDA toolkit needed) through the cuda backend's own
:func:`litegpu_cuda.nvrtc.compile_source`:

- conformance cases: to PTX for ``compute_80`` and ``compute_90``;
- shared models: NVRTC's full C++ check (``-fdevice-syntax-only``) in the default suite;
  to PTX for both archs in the slow suite (``-m slow``, which CI runs too: the models'
  large unrolled kernels take minutes to generate code for).

To stay fast on two cores each distinct kernel is compiled once: kernels are named by
their content (``KernelSpec.digest``), so identical kernels of different programs are
one, and many go into one NVRTC program behind a single prelude and library (a
program's kernels never call each other, so this compiles what every program holds).
Two processes compile at once, with ``--Ofast-compile=max`` (still PTX, less optimized,
about 3x faster). A batch that fails is compiled again one kernel at a time, so each
case or model is shown only its own errors.
"""
from __future__ import annotations

import logging
from concurrent.futures import ProcessPoolExecutor

import pytest
from gpu_sources import CASE_IDS, MODEL_FILES, planned, report

from litegpu.codegen import Precision
from litegpu.codegen.cuda import CUDA
from litegpu.codegen.render import partition_kernels
from litegpu.testing.cases import all_cases

try:
    from litegpu_cuda import nvrtc
    nvrtc.import_nvrtc()
except Exception:   # noqa: BLE001 - the check skips (or fails where required, see the fixture)
    nvrtc = None

log = logging.getLogger(__name__)

PRECISIONS = {"F32": Precision(), "F32_F16": Precision(half_storage=True),
              "F16": Precision(half_storage=True, half_arith=True)}
ARCHS = ("80", "90")
PTX = ("--Ofast-compile=max",)
SYNTAX = ("-fdevice-syntax-only",)
_JOBS = 2          # NVRTC processes at once (the machine has 2 cores)
_PER_PROGRAM = 250  # kernels per NVRTC program: one prelude and library serve them all
_NAME = "kernels.cu"   # the file name NVRTC's messages give


def nvrtc_compile(source: str, arch: str, mode: tuple[str, ...]) -> tuple[bool, str]:
    """(compiled, NVRTC's log) for one CUDA C++ source; with ``PTX``, the PTX must be non-empty."""
    try:
        out = nvrtc.compile_source(source, arch, _NAME, extra=mode)
    except nvrtc.CompileError as exc:
        return False, exc.log
    return bool(out.strip(b"\0 ")) or mode == SYNTAX, ""


def _compile_batch(job: tuple[str, list[str], str, tuple[str, ...]]) -> tuple[bool, str]:
    precision, kernels, arch, mode = job
    return nvrtc_compile(CUDA.prelude(precision) + "\n".join(kernels), arch, mode)


def nvrtc_check(kernels: dict[tuple[str, str], str], arch: str, mode: tuple[str, ...] = PTX
                ) -> dict[tuple[str, str], str]:
    """Compile kernels, keyed (precision name, digest), for ``arch``; returns
    {key: failure report} for those that fail.

    Kernels of one precision share NVRTC programs of up to ``_PER_PROGRAM``, two
    compiling at once; a failing program's kernels are compiled again alone, so each
    report holds only its own kernel's errors, with the source lines they point at.
    """
    batches = []
    for precision in PRECISIONS:
        keys = [key for key in kernels if key[0] == precision]
        batches += [keys[i:i + _PER_PROGRAM] for i in range(0, len(keys), _PER_PROGRAM)]
    jobs = [(batch[0][0], [kernels[key] for key in batch], arch, mode) for batch in batches]
    with ProcessPoolExecutor(_JOBS) as pool:
        verdicts = list(pool.map(_compile_batch, jobs))
        failed = [key for batch, (ok, _) in zip(batches, verdicts) if not ok for key in batch]
        alone = list(pool.map(_compile_batch, [(key[0], [kernels[key]], arch, mode) for key in failed]))
    reports = {}
    for key, (ok, out) in zip(failed, alone):
        if not ok:
            reports[key] = report(out, CUDA.prelude(key[0]) + kernels[key], _NAME)
    return reports


@pytest.fixture(scope="session")
def nvrtc_available(skip_unless_required) -> None:
    """Skips where NVRTC is not installed, fails where the run requires it (tests/conftest.py)."""
    if nvrtc is None:
        skip_unless_required("nvrtc", "NVRTC is not installed: CUDA sources are not compiled "
                                      "(pip install 'litegpu[cuda]')")


needs_nvrtc = pytest.mark.usefixtures("nvrtc_available")


def _collect(keys):
    """({key: (its kernels' (precision, digest) keys, why there are none, error)},
    {(precision, digest): kernel source}, number of programs)."""
    found, kernels, programs = {}, {}, 0
    for key in keys:
        partitions, why, error = planned(key, "cuda")
        mine = set()
        try:
            for partition in partitions:
                for name, precision in PRECISIONS.items():
                    programs += 1
                    for step in partition_kernels(partition, precision, CUDA):
                        for k in step:   # named as the renderer names them
                            kernels.setdefault((name, k.digest), k.source.replace("KERNEL", f"k_{k.digest}", 1))
                            mine.add((name, k.digest))
        except Exception as exc:   # noqa: BLE001 - reported by the key's own test
            mine, error = set(), f"{type(exc).__name__}: {exc}"
        found[key] = (mine, why, error)
    return found, kernels, programs


def _selected(request, test: str, argname: str) -> list:
    """The parameters ``argname`` of the selected runs of ``test`` in this module, in order."""
    return [item.callspec.params[argname] for item in request.session.items
            if getattr(item, "module", None) is request.module and item.originalname == test]


def _verdicts(keys: list[str], mode: tuple[str, ...], archs=ARCHS):
    """Kernels and NVRTC's verdicts, per arch, for these cases or models, in one pass."""
    found, kernels, programs = _collect(keys)
    reports = {}
    if nvrtc is not None and kernels:
        for arch in archs:
            reports[arch] = nvrtc_check(kernels, arch, mode)
            log.info("NVRTC %s for compute_%s: %d programs (%d distinct kernels) compiled, %d kernels failed",
                     "PTX" if mode == PTX else "C++ check", arch, programs, len(kernels), len(reports[arch]))
    return found, reports


@pytest.fixture(scope="module")
def cases_ptx(request):
    return _verdicts([c.id for c in _selected(request, "test_case_cuda_ptx", "case")], PTX)


@pytest.fixture(scope="module")
def models_checked(request):
    return _verdicts(_selected(request, "test_model_cuda_source_compiles", "model_file"), SYNTAX, ARCHS[-1:])


@pytest.fixture(scope="module")
def models_ptx(request):
    return _verdicts(_selected(request, "test_model_cuda_ptx", "model_file"), PTX)


def _assert_compiles(verdicts, key: str) -> None:
    found, reports = verdicts
    mine, why, error = found[key]
    if error:
        pytest.fail(f"{key}: planning or generating its CUDA sources failed: {error}")
    if not mine:
        pytest.skip(why or "its GPU partitions launch no kernel (each node is a copy the runtime makes)")
    failures = [f"{key}: a {k[0]} kernel does not compile for compute_{arch}:\n{by_key[k]}"
                for arch, by_key in reports.items() for k in sorted(mine) if k in by_key]
    assert not failures, "\n\n".join(failures)


@needs_nvrtc
@pytest.mark.parametrize("case", all_cases(), ids=lambda c: c.id)
def test_case_cuda_ptx(cases_ptx, case):
    _assert_compiles(cases_ptx, case.id)


@needs_nvrtc
@pytest.mark.parametrize("model_file", MODEL_FILES)
def test_model_cuda_source_compiles(models_checked, shared_model, model_file):
    shared_model(model_file)
    _assert_compiles(models_checked, model_file)


@pytest.mark.slow
@needs_nvrtc
@pytest.mark.parametrize("model_file", MODEL_FILES)
def test_model_cuda_ptx(models_ptx, shared_model, model_file):
    shared_model(model_file)
    _assert_compiles(models_ptx, model_file)


# -- the checker itself ------------------------------------------------------------------------
_KERNEL = 'extern "C" __global__ void {name}(const FT* __restrict__ t0, FT* __restrict__ t1)\n{{\n  {body}\n}}\n'
_GOOD = "const float4 v = vload4(0, t0);\n  vstore4(fmax(v * 2.0f, 0.0f), 0, t1);"
_MISTAKES = {
    "float8 into a float4": "const float4 w = make_float8(1.0f);  // wrong\n  vstore4(w, 0, t1);",
    "an undeclared function": "t1[0] = native_exp(t0[0]);  // wrong",
}


@needs_nvrtc
@pytest.mark.parametrize("mistake", list(_MISTAKES))
def test_checker_catches_mistakes(mistake):
    """A wrong kernel fails and its report points at its line, while a correct kernel
    compiled in the same batch passes."""
    kernels = {("F32", "good"): _KERNEL.format(name="k_good", body=_GOOD),
               ("F32", "bad"): _KERNEL.format(name="k_bad", body=_MISTAKES[mistake])}
    reports = nvrtc_check(kernels, ARCHS[0])
    assert set(reports) == {("F32", "bad")}, reports
    text = reports[("F32", "bad")]
    assert "error" in text
    source = CUDA.prelude("F32") + kernels[("F32", "bad")]
    line = next(i for i, s in enumerate(source.splitlines(), start=1) if "// wrong" in s)
    assert f">{line:5d}: {source.splitlines()[line - 1]}" in text, text


@needs_nvrtc
def test_a_partition_builds_as_parts_side_by_side(tmp_path, monkeypatch):
    """CudaProgram builds a partition as NVRTC programs of a few kernels each, compiled in
    threads at once (no GPU needed for the cubins): every kernel lands in exactly one
    part, in the one-program order, each part's cubin is built, and a second build comes
    whole from the kernel cache."""
    from types import SimpleNamespace

    from litegpu.backend import CompileOptions
    from litegpu.codegen.render import assemble, assemble_parts
    from litegpu_cuda.program import FUNCTIONS_PER_PART, build_cubins

    monkeypatch.setenv("LITEGPU_CACHE_DIR", str(tmp_path))
    partitions = [p for c in [c for c in CASE_IDS if c.startswith(("CONV_2D", "ADD"))][:6]
                  for p in planned(c, "cuda")[0]]
    steps = [s for p in partitions for s in partition_kernels(p, PRECISIONS["F32"], CUDA)]
    whole, count = assemble(steps, PRECISIONS["F32"], CUDA)
    parts = assemble_parts(steps, PRECISIONS["F32"], CUDA, per_part=2)
    names = [n for _, ns in parts for n in ns]
    assert count >= 3 and len(names) == len(set(names)) == count and len(parts) == -(-count // 2)
    assert all(f" {n}(" in whole and f" {n}(" in source for source, ns in parts for n in ns)
    assert FUNCTIONS_PER_PART > 1
    device = SimpleNamespace(arch="90", identity="test sm_90")
    cubins, hit = build_cubins(device, [source for source, _ in parts], CompileOptions())
    assert len(cubins) == len(parts) and not hit
    assert all(c[:4] == b"\x7fELF" for c in cubins)
    again, hit = build_cubins(device, [source for source, _ in parts], CompileOptions())
    assert hit and again == cubins
