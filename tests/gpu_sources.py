"""The GPU partitions of every conformance case and shared model, planned once per run.

Source checks of each dialect (OpenCL F16, CUDA PTX, MSL) render these partitions. They
come from the runtime's own planning (a Session compiling each subgraph) with the GPU
backends' shared ``supports``/``schedule`` (:mod:`litegpu.codegen.planning`); only
``compile`` is replaced by one that keeps the partition, so no device is needed.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path

import numpy as np

from litegpu.backend import Backend, Program
from litegpu.codegen import planning
from litegpu.float_view import float_view, is_quantized_model
from litegpu.model import load_model
from litegpu.session import Session
from litegpu.testing.cases import all_cases

MODELS = Path(__file__).resolve().parents[1].parent / "shared" / "models"
MODEL_FILES = sorted(p.name for p in MODELS.glob("*.tflite")) if MODELS.is_dir() else ["(no shared models)"]


class _Capture(Backend):
    """A GPU backend planning as every codegen backend does, keeping each partition
    instead of building it."""

    name = "capture"
    is_gpu = True
    host_memory = True   # its "device tensors" are never made: the transfer plan needs none

    def __init__(self) -> None:
        self.partitions = []

    def available(self):
        return True, ""

    def supports(self, node, model):
        return planning.supports(node, model)

    def schedule(self, nodes, outputs):
        return planning.schedule(nodes, outputs)

    def compile(self, partition, options) -> Program:
        """Keep the partition; the program is never run."""
        self.partitions.append(partition)
        return Program()


def gpu_partitions(model_bytes: bytes, input_shapes: list[tuple[int, ...]] | None = None):
    """(GPU partitions, why nodes stayed off the GPU) for every subgraph of a model.

    Subgraph 0 is compiled at ``input_shapes`` (default: the model's), the others at
    their model shapes, each with the GPU backend first as a delegate would; control
    flow bodies, which the runtime keeps on cpu, are included so their sources are checked too.
    """
    model = load_model(model_bytes)
    if is_quantized_model(model):   # a GPU backend runs its float view, as the session does
        model = float_view(model)
    session = Session(model, [], precision_loss_allowed=True)
    capture = _Capture()
    session.backends = [capture]
    refusals = []
    for k, sg in enumerate(model.subgraphs):
        shapes = dict(zip(sg.inputs, input_shapes)) if k == 0 and input_shapes is not None else None
        compiled = session.compile(k, shapes)
        refusals += [f"{a.op}: {a.reason}" for a in compiled.report.assignments if a.reason]
    return capture.partitions, refusals


@functools.cache
def planned(key: str):
    """(partitions, why there are none, error) of one case id or shared model file name;
    an error while planning is kept as a failure of that key alone."""
    try:
        if key.endswith(".tflite"):
            path = MODELS / key
            if not path.exists():
                return [], f"{path} does not exist", ""
            partitions, refusals = gpu_partitions(path.read_bytes())
        else:
            case = _CASES[key]
            model_bytes, inputs = case.build()
            partitions, refusals = gpu_partitions(model_bytes, [np.shape(x) for x in inputs])
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
