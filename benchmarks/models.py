"""litegpu (cpu) vs LiteRT (XNNPACK) on every shared and fetched model, in one process.

usage: python benchmarks/models.py [--threads 2] [--runs 30] [--real] [--markdown] [NAME ...]

For each model: the max error of litegpu against LiteRT relative to the output's scale,
whether every node ran, and the median invoke time of both, measured alternately on the
same input so machine noise hits both alike. Prints the geometric mean of the ratios.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

import litegpu
from litegpu.cli import random_inputs

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "models"


def models(real: bool, names: list[str]) -> list[tuple[str, Path, list | None]]:
    out = [(p.stem, p, None) for p in sorted(SHARED.glob("*.tflite"))]
    if real:
        from litegpu.testing.realmodels import REAL_MODELS, fetch
        out += [(name, fetch(name), m.random_inputs(seed=1234)) for name, m in REAL_MODELS.items()]
    return [m for m in out if not names or m[0] in names]


def median_invoke(invoke, runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        invoke()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def prepare(interp, inputs) -> None:
    """Resize ``interp``'s inputs to ``inputs``' shapes where they differ, allocate, set the
    inputs and invoke once."""
    for d, x in zip(interp.get_input_details(), inputs):
        if tuple(d["shape"]) != x.shape:
            interp.resize_tensor_input(d["index"], x.shape)
    interp.allocate_tensors()
    for d, x in zip(interp.get_input_details(), inputs):
        interp.set_tensor(d["index"], x)
    interp.invoke()


def bench(path: Path, inputs, threads: int, runs: int) -> dict:
    from ai_edge_litert.interpreter import Interpreter as LiteRT
    row: dict = {}
    theirs = LiteRT(model_path=str(path), num_threads=threads)
    if inputs is None:
        inputs = random_inputs(theirs.get_input_details(), seed=0)
    start = time.perf_counter()
    try:
        ours = litegpu.Interpreter(model_path=str(path), num_threads=threads)
        ours.allocate_tensors()
    except litegpu.LiteGpuError as exc:
        row["error"] = str(exc).split(":")[-1].strip()[:60]
        return row
    row["init_ms"] = (time.perf_counter() - start) * 1e3
    for interp in (ours, theirs):
        prepare(interp, inputs)
    worst = 0.0
    for a, b in zip(ours.get_output_details(), theirs.get_output_details()):
        x, y = ours.get_tensor(a["index"]).astype(np.float64), theirs.get_tensor(b["index"]).astype(np.float64)
        worst = max(worst, float(np.abs(x - y).max() / max(np.abs(y).max(), 1e-30)) if y.size else 0.0)
    report = ours.get_delegation_report()
    row["max_rel_err"] = worst
    row["all_nodes_ran"] = report.nodes_on("cpu") == len(report.assignments)
    row["nodes"] = len(report.assignments) + len(report.folded)
    warm = max(3, runs // 5)
    median_invoke(ours.invoke, warm)
    median_invoke(theirs.invoke, warm)
    ours_t, theirs_t = [], []
    for _ in range(3):  # alternate so load on the machine hits both
        ours_t.append(median_invoke(ours.invoke, runs))
        theirs_t.append(median_invoke(theirs.invoke, runs))
    row["litegpu_ms"] = min(ours_t) * 1e3
    row["litert_ms"] = min(theirs_t) * 1e3
    row["ratio"] = row["litegpu_ms"] / row["litert_ms"]
    return row


def parse_args(description: str, runs: int) -> argparse.Namespace:
    """The options every model benchmark takes: --threads, --runs, --real and model names."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=runs)
    parser.add_argument("--real", action="store_true", help="include the fetched real models")
    parser.add_argument("names", nargs="*")
    return parser.parse_args()


def main() -> int:
    args = parse_args(__doc__.splitlines()[0], runs=30)
    print("| model | nodes | max rel err vs LiteRT | all nodes ran | litegpu init ms | litegpu median ms "
          "| LiteRT median ms | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    ratios = []
    for name, path, inputs in models(args.real, args.names):
        row = bench(path, inputs, args.threads, args.runs)
        if "error" in row:
            print(f"| {name} | | not run: {row['error']} | | | | | |")
            continue
        ratios.append(row["ratio"])
        print(f"| {name} | {row['nodes']} | {row['max_rel_err']:.2e} | {'yes' if row['all_nodes_ran'] else 'no'} "
              f"| {row['init_ms']:.0f} | {row['litegpu_ms']:.3f} | {row['litert_ms']:.3f} | {row['ratio']:.2f} |")
        sys.stdout.flush()
    if ratios:
        print(f"\ngeometric mean of ratio litegpu/LiteRT over {len(ratios)} models: "
              f"{math.exp(np.mean(np.log(ratios))):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
