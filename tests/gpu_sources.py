"""The GPU partitions of every conformance case and shared model, planned once per run.

Source checks of each dialect (OpenCL F16, CUDA PTX, MSL) render these partitions,
planned as every codegen backend plans them, with no device
(:func:`litegpu.codegen.offline.gpu_partitions`).
"""
from __future__ import annotations

import functools
import re

import numpy as np

from litegpu.codegen import DIALECTS, offline
from litegpu.model import load_model
from litegpu.testing.cases import all_cases
from litegpu.testing.shared_models import NONE, shared_model_names, shared_model_path

# Every shared model; where there are none, NONE, on which a test's ``shared_model`` skips.
MODEL_FILES = shared_model_names() or [NONE]


def gpu_partitions(model_bytes: bytes, input_shapes: list[tuple[int, ...]] | None = None, dialect: str = "opencl"):
    """(GPU partitions, why nodes stayed off the GPU) for every subgraph of a model, as
    ``dialect``'s backends plan them (:func:`litegpu.codegen.offline.gpu_partitions`)."""
    found, refusals = offline.gpu_partitions(load_model(model_bytes), DIALECTS[dialect], input_shapes)
    return [p for _, p in found], refusals


@functools.cache
def planned(key: str, dialect: str = "opencl"):
    """(partitions, why there are none, error) of one case id or shared model file name,
    planned for ``dialect``; an error while planning is kept as a failure of that key alone."""
    try:
        if key.endswith(".tflite"):
            path = shared_model_path(key)
            if not path.exists():
                return [], f"{path} does not exist", ""
            partitions, refusals = gpu_partitions(path.read_bytes(), dialect=dialect)
        else:
            case = _CASES[key]
            model_bytes, inputs = case.build()
            partitions, refusals = gpu_partitions(model_bytes, [np.shape(x) for x in inputs], dialect)
    except Exception as exc:   # noqa: BLE001 - reported by the key's own test
        return [], "", f"{type(exc).__name__}: {exc}"
    why = "" if partitions else ("no node runs on a GPU backend: " + "; ".join(dict.fromkeys(refusals)) if refusals
                                 else "no node is left to run: every one was folded at compile time")
    return partitions, why, ""


_CASES = {case.id: case for case in all_cases()}
CASE_IDS = list(_CASES)


def report(out: str, source: str, path: str, max_lines: int = 60) -> str:
    """A compiler's output (trimmed) and the source lines each diagnostic points at, with context."""
    lines = source.splitlines()
    compiler_lines = out.splitlines()
    text = "\n".join(compiler_lines[:max_lines])
    if len(compiler_lines) > max_lines:
        text += f"\n... ({len(compiler_lines) - max_lines} more lines of compiler output)"
    shown = []
    for m in re.finditer(rf"^{re.escape(path)}[:(](\d+)[:)]", out, re.M):
        line = int(m.group(1))
        if line in shown or len(shown) >= 5 or not 0 < line <= len(lines):
            continue
        shown.append(line)
        context = range(max(1, line - 2), min(len(lines), line + 2) + 1)
        text += f"\n--- source around line {line}:\n" + "\n".join(
            f"{'>' if i == line else ' '}{i:5d}: {lines[i - 1]}" for i in context)
    return text
