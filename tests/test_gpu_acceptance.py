"""benchmarks/gpu_acceptance.py: the one command a lent GPU machine runs.

The GPU machine is lent for minutes, so the script must work the first time there. Here
(no GPU) its --quick mode runs end to end in a few tens of seconds: every part that needs
no GPU runs, every other is reported "not run" with the backend's own reason, and it
exits 0. The F16 option it gives the conformance suite and its fallback install (from the
tree, when pip cannot install litegpu) are checked on their own.
"""
from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_acceptance.py"
SECTIONS = ("## Machine and install", "## Models", "## Conformance suite", "## Models against LiteRT cpu",
            "## Timing", "## Creation, cold and warm", "## Not run")
QUICK_LIMIT_S = 240   # the run takes ~30 s here; the limit only stops a hang


@pytest.fixture(scope="module")
def acceptance():
    """The script as a module, loaded from its file (benchmarks/ stays off sys.path: its
    models.py and timing.py would shadow other modules of those names)."""
    spec = importlib.util.spec_from_file_location("gpu_acceptance", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """One --quick run: (stdout, report.md, results.json, seconds)."""
    tmp = tmp_path_factory.mktemp("acceptance")
    cmd = [sys.executable, str(SCRIPT), "--quick", "--budget", "150", "--workdir", str(tmp / "work"),
           "--out", str(tmp / "out"), "--wheelhouse", str(tmp / "no-wheels")]
    start = time.monotonic()
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=QUICK_LIMIT_S, cwd=tmp)
    seconds = time.monotonic() - start
    assert res.returncode == 0, res.stderr[-3000:]
    report = (tmp / "out" / "report.md").read_text()
    results = json.loads((tmp / "out" / "results.json").read_text())
    return res.stdout, report, results, seconds


def test_quick_run_prints_one_report_with_every_section(quick_run):
    stdout, report, results, seconds = quick_run
    assert report.strip() in stdout
    positions = [report.index(s) for s in SECTIONS]
    assert positions == sorted(positions), "sections out of order"
    assert seconds < 150 + 30, f"--quick took {seconds:.0f} s against its 150 s budget"
    assert {o["part"] for o in results["outcomes"]} >= {"install", "environment", "models cpu", "creation"}


def test_quick_run_measures_what_needs_no_gpu(quick_run):
    _, _, results, _ = quick_run
    row = results["rows"]["cpu"]["built_convnet"]
    assert "error" not in row, row
    batch1 = row["batches"]["1"]
    assert batch1["err"]["f32"]["rel"] < 1e-4
    assert batch1["ms"]["f32"] > 0 and batch1["ms"]["litert-cpu"] > 0
    assert "8" in row["batches"], "the built model's batch is dynamic: batch 8 must be timed too"
    litert = results["creation"]["litert-cpu"]
    assert litert["cold"]["first result"] > 0 and litert["warm"]["first result"] > 0


def test_quick_run_says_why_each_part_did_not_run(quick_run):
    _, report, results, _ = quick_run
    not_run = report[report.index("## Not run"):]
    outcomes = {o["part"]: o for o in results["outcomes"]}
    for part, outcome in outcomes.items():
        if outcome["status"] == "not run":
            assert outcome["detail"].strip(), f"{part} not run without a reason"
            assert part in not_run and outcome["detail"][:60] in not_run
    backends = results["probe"]["backends"]
    for name in ("cuda", "webgpu"):
        usable = backends.get(name, {}).get("available", False)
        if usable:
            continue
        outcome = outcomes[f"conformance {name} F32"]
        assert outcome["status"] == "not run"
        expected = backends[name]["why"] if name in backends else "no installed litegpu plugin"
        assert expected[:60] in outcome["detail"]
    if not results["gpu"]:
        assert "nvidia-smi" in results["facts"]["GPU"]


def test_quick_run_labels_a_cpu_opencl_device(quick_run, skip_unless_required):
    """Without a GPU, opencl runs on PoCL: the suite passes there and the report says it was a CPU."""
    _, report, results, _ = quick_run
    opencl = results["probe"]["backends"].get("opencl", {})
    if not opencl.get("available"):
        skip_unless_required("opencl", f"no usable OpenCL platform here: {opencl.get('why', 'not installed')}")
    if opencl["device"].get("type") != "CPU":
        pytest.skip(f"the OpenCL device here is a {opencl['device'].get('type')}, not a CPU (PoCL)")
    assert results["conformance"]["opencl f32"]["failures"] == 0
    assert "a CPU device: not a GPU figure" in report


def test_conformance_suite_f16_option(tmp_path):
    """--litegpu-precision f16 is accepted; cpu, which has no F16 mode, skips saying so."""
    cmd = [sys.executable, "-m", "pytest", "--pyargs", "litegpu.testing.conformance_suite", "--litegpu-backend",
           "cpu", "--litegpu-precision", "f16", "-k", "SOFTMAX and rank1", "-rs", "-p", "no:cacheprovider"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-2000:]
    assert "has no half modes" in res.stdout
    assert "precision f16 (from --litegpu-precision)" in res.stdout


def test_install_from_tree_exposes_the_entry_points(acceptance, tmp_path):
    """The fallback install: litegpu imports from this tree and its plugins are discoverable."""
    site = tmp_path / "site"
    acceptance.install_from_tree(site)
    assert (site / "litegpu" / "__init__.py").resolve() == REPO / "core" / "__init__.py"
    # -S: only the written metadata, not this interpreter's installed litegpu, is seen.
    code = ("import sys, importlib.metadata as m; sys.path.insert(0, sys.argv[1]); "
            "print(sorted(e.name for e in m.entry_points(group='litegpu.backends'))); "
            "print(sorted(e.name for e in m.entry_points(group='pytest11')))")
    res = subprocess.run([sys.executable, "-S", "-c", code, str(site)], capture_output=True, text=True, timeout=60)
    backends, pytest_plugins = res.stdout.strip().splitlines()
    assert {"cpu", "opencl", "cuda"} <= set(ast.literal_eval(backends))
    assert "litegpu" in ast.literal_eval(pytest_plugins)


def test_wheel_list_pins_one_version_of_each(acceptance):
    pins = acceptance.wheel_pins()
    names = [p.split("==")[0].lower() for p in pins]
    assert all("==" in p for p in pins) and len(names) == len(set(names))
    assert "ai-edge-litert" in names and "wgpu" in names and "pyopencl" in names


def test_junit_summary_counts_failures_and_groups_skips(acceptance, tmp_path):
    xml = tmp_path / "j.xml"
    xml.write_text(
        '<testsuites><testsuite tests="4" failures="1" errors="0" skipped="2" time="1.5">'
        '<testcase name="test_op[cuda-ADD-a]"/>'
        '<testcase name="test_op[cuda-ADD-b]">'
        '<failure message="output 0 differs: 0.5 &gt; 1e-05">x</failure></testcase>'
        '<testcase name="test_op[cuda-X-1]"><skipped message="cuda does not support node 3 (X)"/></testcase>'
        '<testcase name="test_op[cuda-X-2]"><skipped message="cuda does not support node 7 (X)"/></testcase>'
        '</testsuite></testsuites>')
    s = acceptance.parse_junit(xml)
    assert (s["passed"], s["failures"], s["skipped"]) == (1, 1, 2)
    assert s["failed"] == [("test_op[cuda-ADD-b]", "output 0 differs: 0.5 > 1e-05")]
    assert s["skips"] == {"cuda does not support node N (X)": 2}
