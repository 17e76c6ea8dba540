"""litegpu opencl (fp32 and fp16) vs litegpu cpu vs LiteRT (XNNPACK) on every model, in one process.

usage: python benchmarks/opencl_models.py [NAME ...] [--threads 2] [--runs 10] [--rounds 3] [--real]

Per model: nodes on opencl and on cpu, the max absolute error of each opencl mode against
LiteRT's fp32 output (and the error relative to max|LiteRT|), whether fp16 made a NaN or
Inf that fp32 did not, host<->device bytes per run, and the median invoke time of
litegpu opencl, litegpu cpu and LiteRT on the same input, timed in alternating blocks
(timing.py): the best block median of ``--rounds`` rounds.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import models, parse_args, prepare  # noqa: E402  (shared list, options, setup)
from timing import alternate  # noqa: E402  (the shared timer)

import litegpu  # noqa: E402
from litegpu.cli import random_inputs  # noqa: E402


def _interp(path: Path, threads: int, backend: str | None, fp16: bool = False):
    delegates = [litegpu.load_delegate(backend, {"precision_loss_allowed": fp16})] if backend else None
    return litegpu.Interpreter(model_path=str(path), num_threads=threads, experimental_delegates=delegates)


def _outputs(interp) -> list[np.ndarray]:
    return [np.array(interp.get_tensor(d["index"]), np.float64) for d in interp.get_output_details()]


def _errors(got: list[np.ndarray], want: list[np.ndarray]) -> tuple[float, float, bool]:
    """(max abs error, max abs error / max|want|, whether got has a non-finite value that want lacks)."""
    worst_abs, worst_rel, bad = 0.0, 0.0, False
    for g, w in zip(got, want):
        if not w.size:
            continue
        err = float(np.nanmax(np.abs(g - w))) if np.isfinite(g).all() else float("inf")
        worst_abs = max(worst_abs, err)
        worst_rel = max(worst_rel, err / max(float(np.abs(w).max()), 1e-30))
        bad |= bool((~np.isfinite(g)).sum() > (~np.isfinite(w)).sum())
    return worst_abs, worst_rel, bad


def bench(path: Path, inputs, threads: int, runs: int, rounds: int) -> dict:
    from ai_edge_litert.interpreter import Interpreter as LiteRT
    theirs = LiteRT(model_path=str(path), num_threads=threads)
    if inputs is None:
        inputs = random_inputs(theirs.get_input_details(), seed=0)
    row: dict = {}
    try:
        start = time.perf_counter()
        cl32 = _interp(path, threads, "opencl")
        row["init_s"] = time.perf_counter() - start
        cl16 = _interp(path, threads, "opencl", fp16=True)
        cpu = _interp(path, threads, None)
    except litegpu.LiteGpuError as exc:
        return {"error": str(exc)[:80]}
    for interp in (theirs, cl32, cl16, cpu):
        prepare(interp, inputs)
    want = _outputs(theirs)
    row["abs32"], row["rel32"], row["bad32"] = _errors(_outputs(cl32), want)
    row["abs16"], row["rel16"], row["bad16"] = _errors(_outputs(cl16), want)
    report = cl32.get_delegation_report()
    row["on_opencl"] = report.nodes_on("opencl")
    row["on_cpu"] = report.nodes_on("cpu")
    row["partitions"] = len(report.partitions)
    row["bytes"] = report.bytes_moved
    timers = {"opencl": cl32.invoke, "opencl16": cl16.invoke, "cpu": cpu.invoke, "litert": theirs.invoke}
    best = alternate(timers, runs, rounds, warmup=max(2, runs // 5))
    row.update({f"{k}_ms": v * 1e3 for k, v in best.items()})
    return row


def main() -> int:
    args = parse_args(__doc__.splitlines()[0], runs=10, threads=[2])
    if len(args.threads) != 1:
        raise SystemExit("opencl_models.py times at one thread count: give --threads one number")
    print("| model | nodes opencl / cpu | partitions | max abs err fp32 (rel) | max abs err fp16 (rel) "
          "| new NaN/Inf in fp16 | bytes host<->device per run | opencl ms | opencl fp16 ms | litegpu cpu ms "
          "| LiteRT ms | opencl / LiteRT |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, path, inputs in models(args.real, args.names):
        row = bench(path, inputs, args.threads[0], args.runs, args.rounds)
        if "error" in row:
            print(f"| {name} | not run: {row['error']} |" + " |" * 10)
            continue
        print(f"| {name} | {row['on_opencl']} / {row['on_cpu']} | {row['partitions']} "
              f"| {row['abs32']:.2e} ({row['rel32']:.1e}) | {row['abs16']:.2e} ({row['rel16']:.1e}) "
              f"| {'YES' if row['bad16'] else 'no'} | {row['bytes']} | {row['opencl_ms']:.2f} "
              f"| {row['opencl16_ms']:.2f} | {row['cpu_ms']:.2f} | {row['litert_ms']:.2f} "
              f"| {row['opencl_ms'] / row['litert_ms']:.2f} |")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
