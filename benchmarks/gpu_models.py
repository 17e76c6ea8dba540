"""litegpu's GPU backends vs litegpu cpu vs LiteRT (XNNPACK) on every model, in one process.

usage: python benchmarks/gpu_models.py [NAME ...] [--backends opencl webgpu] [--threads 2] [--runs 10]
       [--rounds 3] [--real]

Per model and GPU backend: the nodes it ran (of all), and in each precision mode the
device gives (F32; F32_F16, half storage; F16, half arithmetic, where the device has it)
the max absolute error against LiteRT's output and that error relative to max|LiteRT|
(integer outputs of quantized models: the absolute error is in quanta), flagged when the
mode made a NaN or Inf LiteRT did not. Then the median invoke time in F32 of every GPU
backend, litegpu cpu and LiteRT on the same input, timed in alternating blocks
(timing.py): the best block median of ``--rounds`` rounds.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import models, parse_args, prepare  # noqa: E402  (shared list, options, setup)
from timing import alternate  # noqa: E402  (the shared timer)

import litegpu  # noqa: E402
from litegpu.cli import random_inputs  # noqa: E402
from litegpu.testing.conformance import PRECISION_OPTIONS, precision_ran  # noqa: E402



def _interp(path: Path, threads: int, backend: str | None, options: dict | None = None):
    delegates = [litegpu.load_delegate(backend, options or {})] if backend else None
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


def bench(path: Path, inputs, backends: list[str], threads: int, runs: int, rounds: int) -> dict:
    from ai_edge_litert.interpreter import Interpreter as LiteRT
    theirs = LiteRT(model_path=str(path), num_threads=threads)
    if inputs is None:
        inputs = random_inputs(theirs.get_input_details(), seed=0)
    prepare(theirs, inputs)
    want = _outputs(theirs)
    row: dict = {"errors": {}, "nodes": {}}
    timers = {}
    for backend in backends:
        for mode, options in PRECISION_OPTIONS.items():
            try:
                interp = _interp(path, threads, backend, options)
                prepare(interp, inputs)
            except litegpu.LiteGpuError as exc:
                row["errors"][backend, mode] = str(exc)[:60]
                continue
            ran = precision_ran(interp.get_delegation_report())
            report = interp.get_delegation_report()
            if mode == "F32":
                row["nodes"][backend] = (report.nodes_on(backend), len(report.assignments))
                timers[backend] = interp.invoke
            row["errors"][backend, mode] = _errors(_outputs(interp), want) if ran == mode or not \
                report.nodes_on(backend) else f"n/a ({ran} ran)"
    cpu = _interp(path, threads, None)
    prepare(cpu, inputs)
    timers.update({"cpu": cpu.invoke, "litert": theirs.invoke})
    best = alternate(timers, runs, rounds, warmup=max(2, runs // 5))
    row.update({f"{k}_ms": v * 1e3 for k, v in best.items()})
    return row


def _cell(err) -> str:
    if isinstance(err, str):
        return err
    abs_err, rel, bad = err
    return f"{abs_err:.2g} ({rel:.1e}){' NEW NaN/Inf' if bad else ''}"


def main() -> int:
    import argparse
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--backends", nargs="+", default=["opencl", "webgpu"])
    known, rest = extra.parse_known_args()
    sys.argv = [sys.argv[0], *rest]
    args = parse_args(__doc__.splitlines()[0], runs=10, threads=[2])
    if len(args.threads) != 1:
        raise SystemExit("gpu_models.py times at one thread count: give --threads one number")
    backends = known.backends
    head = ["model"] + [f"{b} nodes" for b in backends]
    head += [f"{b} {m} max err (rel)" for b in backends for m in PRECISION_OPTIONS]
    head += [f"{b} ms" for b in backends] + ["litegpu cpu ms", "LiteRT ms"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for name, path, inputs in models(args.real, args.names):
        if name == "stateful_counter":
            continue
        row = bench(path, inputs, backends, args.threads[0], args.runs, args.rounds)
        cells = [name] + [("%d / %d" % row["nodes"][b]) if b in row["nodes"] else "-" for b in backends]
        cells += [_cell(row["errors"].get((b, m), "-")) for b in backends for m in PRECISION_OPTIONS]
        cells += [f"{row[f'{b}_ms']:.2f}" if f"{b}_ms" in row else "-" for b in backends]
        cells += [f"{row['cpu_ms']:.2f}", f"{row['litert_ms']:.2f}"]
        print("| " + " | ".join(cells) + " |")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
