"""The out-of-tree example backend installs with pip and passes the shipped conformance suite.

It is installed into a temporary folder (never into this environment) and used from
subprocesses with that folder on PYTHONPATH, exactly as a third party would use it.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import setuptools

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "litegpu-example-backend"


def _can_build_without_isolation() -> bool:
    # setuptools builds wheels by itself from 70.1; before that it needs the `wheel` package.
    major, minor = (int(p) for p in setuptools.__version__.split(".")[:2])
    return (major, minor) >= (70, 1) or importlib.util.find_spec("wheel") is not None


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The example installed with pip into a temporary target folder."""
    root = tmp_path_factory.mktemp("example_backend")
    source = root / "src"
    # Build from a copy: setuptools writes build/ and *.egg-info next to the sources.
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = root / "site"
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(target), str(source)]
    if _can_build_without_isolation():
        cmd.insert(5, "--no-build-isolation")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"pip install failed:\n{done.stdout}\n{done.stderr}"
    assert (target / "litegpu_example" / "__init__.py").exists()
    return target


def _run(installed: Path, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(installed), os.environ.get("PYTHONPATH", "")]))
    env.pop("LITEGPU_TEST_BACKENDS", None)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=900)


def test_entry_point_registers_the_backend(installed, tmp_path):
    script = textwrap.dedent("""
        from litegpu.plugins import manager
        pm = manager()
        rec = [r for r in pm.records if r.name == "example"][0]
        print(rec.distribution, rec.error or "ok", rec.backends, pm.backend("example").available())
    """)
    done = _run(installed, ["-c", script], tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["litegpu-example-backend", "ok", "['example']", "(True,", "'')"]


def test_interpreter_delegates_supported_nodes_and_falls_back_for_the_rest(installed, tmp_path):
    script = textwrap.dedent("""
        import numpy as np
        import litegpu
        from litegpu.testing.builder import ModelBuilder

        b = ModelBuilder()
        x = b.input("x", (2, 4), np.float32)
        y = b.tensor("y", (2, 4), np.float32)
        b.op("MUL", [x, b.const("k", np.full(4, 3.0, np.float32))], [y], fused_activation_function="RELU6")
        z = b.tensor("z", (2, 4), np.float32)
        b.op("LOG", [y], [z])
        w = b.tensor("w", (2, 4), np.float32)
        b.op("LOGISTIC", [z], [w])
        b.output(w)
        interp = litegpu.Interpreter(model_content=b.build(),
                                     experimental_delegates=[litegpu.load_delegate("example")])
        interp.allocate_tensors()
        xv = np.linspace(0.1, 3, 8, dtype=np.float32).reshape(2, 4)
        interp.set_tensor(interp.get_input_details()[0]["index"], xv)
        interp.invoke()
        got = interp.get_tensor(interp.get_output_details()[0]["index"])
        want = 1 / (1 + np.exp(-np.log(np.clip(3 * xv, 0, 6))))
        assert np.allclose(got, want, rtol=1e-6, atol=1e-6), (got, want)
        report = interp.get_delegation_report()
        print([(a.op, a.backend) for a in report.assignments])
        print([a.reason for a in report.assignments if a.backend == "cpu"])
    """)
    done = _run(installed, ["-c", script], tmp_path)
    assert done.returncode == 0, done.stderr
    placed, reasons = done.stdout.strip().splitlines()[-2:]
    assert placed == "[('MUL', 'example'), ('LOG', 'cpu'), ('LOGISTIC', 'example')]"
    assert "no kernel for LOG" in reasons


def test_conformance_suite_passes_or_skips_with_reason(installed, tmp_path):
    report = tmp_path / "report.xml"
    done = _run(installed, ["-m", "pytest", "-p", "no:cacheprovider", "-q", "--pyargs",
                            "litegpu.testing.conformance_suite", "--litegpu-backend", "example",
                            f"--junitxml={report}"], tmp_path)
    assert report.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    passed, skipped, failed = [], [], []
    for case in ET.parse(report).getroot().iter("testcase"):
        name = case.get("name")
        assert name.startswith("test_op[example-"), name
        if case.find("failure") is not None or case.find("error") is not None:
            failed.append(name)
        elif (skip := case.find("skipped")) is not None:
            skipped.append((name, skip.get("message", "")))
        else:
            passed.append(name)
    assert not failed, f"{len(failed)} cases failed on the example backend: {failed[:20]}\n{done.stdout[-3000:]}"
    assert done.returncode == 0, done.stdout[-3000:]
    for name, message in skipped:
        assert "example does not support" in message and ": " in message, (name, message)
    passed_ops = {n[len("test_op[example-"):].split("-")[0] for n in passed}
    assert {"ADD", "MUL", "SUB", "LOGISTIC", "RELU"} <= passed_ops, sorted(passed_ops)


def test_the_suite_refuses_a_backend_nobody_provides_listing_those_that_exist(installed, tmp_path):
    """A misspelled backend name once skipped all 667 cases and exited 0."""
    done = _run(installed, ["-m", "pytest", "-p", "no:cacheprovider", "-q", "--pyargs",
                            "litegpu.testing.conformance_suite", "--litegpu-backend", "exampel"], tmp_path)
    assert done.returncode == 4, (done.returncode, done.stdout[-2000:], done.stderr[-2000:])
    assert "--litegpu-backend names 'exampel', but no installed plugin provides" in done.stderr, done.stderr
    available = [line for line in done.stderr.splitlines() if line.startswith("available litegpu backends:")]
    assert available and "example" in available[0] and "cpu" in available[0], done.stderr
    assert " passed" not in done.stdout and " skipped" not in done.stdout, done.stdout[-2000:]


def test_the_suite_runs_a_named_backend_and_the_cases_pass(installed, tmp_path):
    done = _run(installed, ["-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", "--pyargs",
                            "litegpu.testing.conformance_suite", "--litegpu-backend", "example",
                            "-k", "test_op and (ADD- or LOGISTIC-)"], tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = done.stdout.strip().splitlines()
    assert "litegpu backends tested: example (from --litegpu-backend)" in summary, summary[-5:]
    counts = summary[-1]
    assert " passed" in counts and " failed" not in counts and " error" not in counts, counts
