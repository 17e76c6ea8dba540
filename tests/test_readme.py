"""The README's code runs as written: every Python block, each in a fresh process, and the
quick start's command lines (all but the installs, which the suite already stands on).

A block names the real models it uses with ``fetch("name")``; they are fetched first through
the ``real_model`` fixture, so an offline machine without them skips, saying so, instead of
failing inside the block.
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def _blocks(language: str) -> list[tuple[str, str]]:
    """(heading above it, code) of each fenced block in ``language``."""
    text = README.read_text()
    out = []
    for match in FENCE.finditer(text):
        if match.group(1) == language:
            heading = re.findall(r"^#+ (.+)$", text[:match.start()], re.M)[-1]
            out.append((heading, match.group(2)))
    return out


PYTHON = _blocks("python")
# The engines a block needs beyond the test extras' core, as module names.
ENGINES = {"ray": "ray", "dask": "dask", "distributed": "distributed"}


def _ids() -> list[str]:
    seen: dict[str, int] = {}
    ids = []
    for heading, _ in PYTHON:
        slug = re.sub(r"\W+", "-", heading.lower()).strip("-")
        seen[slug] = seen.get(slug, 0) + 1
        ids.append(f"{slug}-{seen[slug]}")
    return ids


def test_the_readme_has_python_blocks():
    assert len(PYTHON) >= 5, [h for h, _ in PYTHON]


@pytest.mark.parametrize("index", range(len(PYTHON)), ids=_ids())
def test_python_block_runs_as_written(index, real_model, tmp_path, skip_unless_required):
    heading, code = PYTHON[index]
    for module in re.findall(r"^\s*(?:import|from)\s+(\w+)", code, re.M):
        if module in ENGINES and importlib.util.find_spec(ENGINES[module]) is None:
            pytest.skip(f"the README's block under '{heading}' needs {module}, which is not installed")
    for name in re.findall(r'fetch\("(\w+)"\)', code):
        real_model(name)
    for name in re.findall(r'"([\w.-]+\.litertlm)"', code):
        _decoder_bundle(tmp_path / name, skip_unless_required)
    script = tmp_path / "block.py"
    script.write_text(code)
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"the block under '{heading}' failed:\n{code}\n{run.stderr[-3000:]}"
    assert run.stdout.strip(), f"the block under '{heading}' printed nothing"


def _decoder_bundle(path: Path, skip_unless_required) -> None:
    """A block's ``.litertlm`` in its folder: the tiny llama benchmarks/export_decoders.py
    makes (CI does), bundled with its tokenizer; without them the block skips, saying so
    (fails where the run requires ``decoders``)."""
    from conftest import DECODERS_DIR as DIR   # where the exported decoders are
    model, tokenizer = DIR / "llama_f32_comp.tflite", DIR / "tokenizer.model"
    if not (model.exists() and tokenizer.exists()):
        skip_unless_required("decoders", f"{model} or {tokenizer} is missing: make them with "
                             "benchmarks/export_decoders.py (CI does)")
    from litegpu.lm import LlmMetadata, TokenUnion
    from litegpu.testing.lm_bundle import BundleWriter
    writer = BundleWriter().model(model.read_bytes()).sentencepiece(tokenizer.read_bytes())
    writer.llm_metadata(LlmMetadata(start_token=TokenUnion(ids=(2,)), stop_tokens=(TokenUnion(ids=(1,)),)))   # its bos, eos
    writer.write(path)


def test_the_quick_start_commands_run_as_written(real_model, tmp_path):
    (heading, first), *rest = [(h, c) for h, c in _blocks("bash") if h == "Quick start"]
    lines = [line for _, code in ((heading, first), *rest) for line in code.splitlines()
             if line.startswith(("litegpu ", "MODEL="))]
    assert any(line.startswith("MODEL=") for line in lines) and len(lines) >= 4, lines
    model = re.search(r"fetch (\w+)", next(line for line in lines if line.startswith("MODEL="))).group(1)
    real_model(model)
    script = "set -euo pipefail\n" + "\n".join(lines) + "\n"
    # As a user's shell has it, but `litegpu prebuild` fills a folder of the test's, not the
    # package's (the suite runs without one: conftest.py).
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
           "LITEGPU_PREBUILT_DIR": str(tmp_path / "prebuilt")}
    run = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=900, env=env)
    assert run.returncode == 0, f"{script}\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}"
    assert "litegpu: error" not in run.stderr
    assert list((tmp_path / "prebuilt").glob("*.o"))
