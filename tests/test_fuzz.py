"""The coverage-guided fuzz harness (litegpu.testing.fuzz): its corpus, its target, and a
short libFuzzer run over the corpus on every test run.

The long run (``python -m litegpu.testing.fuzz --corpus DIR --seconds 600``) is done by
hand; this smoke run replays the whole seed corpus and a bounded number of mutations, so
a change that makes the reader or the planner raise a raw exception on any seed, or on
an easy mutation of one, fails here.
"""
from __future__ import annotations

import importlib.util
import json
import platform
import subprocess
import sys
from pathlib import Path

import pytest

import litegpu
from litegpu.testing import fuzz
from litegpu.testing.shared_models import NONE, shared_models_dir

# The test extras install atheris where PyPI has wheels for it (see pyproject.toml).
ATHERIS_EXPECTED = sys.platform == "linux" and platform.machine() in ("x86_64", "AMD64")


def _require_atheris() -> None:
    if importlib.util.find_spec("atheris") is not None:
        return
    if ATHERIS_EXPECTED:
        pytest.fail("atheris is not installed, yet `pip install -e .[test]` installs it on Linux x86_64")
    pytest.skip(f"atheris has no wheel for {sys.platform}/{platform.machine()} (the test extras skip it there)")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fuzz-corpus")
    n = fuzz.build_corpus(out)
    assert n == len(list(out.iterdir()))
    return out


def test_corpus_holds_builder_and_conformance_models(corpus) -> None:
    names = [name for name, _ in fuzz.seed_models()]
    assert sum(n.startswith("case-") for n in names) > 100
    assert {"builder-fp16-weights", "builder-int8-weights"} <= set(names)
    assert max(p.stat().st_size for p in corpus.iterdir()) <= fuzz.MAX_SEED_BYTES


def test_corpus_holds_the_small_shared_models(shared_model) -> None:
    shared_model(NONE)
    names = {name for name, _ in fuzz.seed_models(shared_models_dir())}
    small = {p.stem for p in shared_models_dir().glob("*.tflite") if p.stat().st_size <= fuzz.MAX_SEED_BYTES}
    assert small and small <= names


def test_every_seed_plans_or_fails_cleanly(corpus) -> None:
    # The target must return on every seed: a seed that raises would stop the fuzzer at once.
    for path in corpus.iterdir():
        fuzz.check_one(path.read_bytes())
    fuzz.check_one(b"")
    fuzz.check_one(b"TFL3" * 3)


def test_raw_exceptions_are_findings(monkeypatch, tmp_path) -> None:
    def broken(data: bytes) -> None:
        if data == b"bad":
            raise IndexError("list index out of range")
        raise litegpu.ModelFormatError("clean")

    monkeypatch.setattr(fuzz, "plan", broken)
    fuzz.check_one(b"fine")  # a clean error is no finding
    with pytest.raises(IndexError):
        fuzz.check_one(b"bad")
    # --keep-going: one pair of files per distinct raising place, and the run goes on.
    target = fuzz._target(fuzz._Findings(tmp_path))
    target(b"bad")
    target(b"bad")
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 2 and files[0].endswith(".json") and files[1].endswith(".tflite")
    info = json.loads((tmp_path / files[0]).read_text())
    assert info["type"] == "IndexError" and "broken" in info["where"][-1]
    assert (tmp_path / files[1]).read_bytes() == b"bad"


def test_smoke_run(corpus, tmp_path) -> None:
    _require_atheris()
    findings = tmp_path / "findings"
    proc = subprocess.run([sys.executable, "-m", "litegpu.testing.fuzz", "--corpus", str(corpus),
                           "--runs", "1200", "--timeout", "20", "--seed", "7", "--findings", str(findings)],
                          capture_output=True, text=True, timeout=300)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert "DONE" in log and "instrumented" in log, log[-2000:]
    assert list(findings.iterdir()) == [], log[-4000:]
    # libFuzzer saw coverage of the instrumented reader and planner.
    cov = [int(line.split("cov: ")[1].split()[0]) for line in log.splitlines() if "DONE" in line and "cov: " in line]
    assert cov and cov[0] > 500, log[-2000:]
