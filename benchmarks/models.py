"""litegpu (cpu) vs LiteRT (XNNPACK) on every shared and fetched model, at each thread count.

usage: python benchmarks/models.py [NAME ...] [--threads 1 2] [--runs 30] [--rounds 3] [--real] [--markdown]
(model names go before --threads, which takes a list)

For each model: the max error of litegpu against LiteRT relative to the output's scale
(worst over the thread counts), whether every node ran on the cpu backend, litegpu's
creation time, and at each thread count the invoke time of both runtimes (LiteRT with
``num_threads`` set the same) and the ratio litegpu/LiteRT. The two are timed in
alternating blocks of ``--runs`` invokes over ``--rounds`` rounds, never invoke by invoke
(see timing.py); each figure is the best block median. Ends with the geometric mean of
the ratios per thread count. ``--busy N`` times with N CPU-bound processes running beside
both runtimes (the busy-machine benchmark; the table says how many).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import alternate, background_load, geometric_mean  # noqa: E402  (the shared timer)

import litegpu  # noqa: E402
from litegpu.cli import random_inputs  # noqa: E402

SHARED = Path(__file__).resolve().parents[1] / ".." / "shared" / "models"


def models(real: bool, names: list[str]) -> list[tuple[str, Path, list | None]]:
    """(name, path, inputs or None for random ones) of the shared models, and the fetched
    real ones with ``real``; only those in ``names`` when it is not empty."""
    out = [(p.stem, p, None) for p in sorted(SHARED.glob("*.tflite"))]
    if real:
        from litegpu.testing.realmodels import REAL_MODELS, fetch
        out += [(name, fetch(name), m.random_inputs(seed=1234)) for name, m in REAL_MODELS.items()]
    return [m for m in out if not names or m[0] in names]


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


def max_rel_error(ours, theirs) -> float:
    """Worst output difference of two prepared interpreters, relative to max|LiteRT's output|."""
    worst = 0.0
    for a, b in zip(ours.get_output_details(), theirs.get_output_details()):
        x = ours.get_tensor(a["index"]).astype(np.float64)
        y = theirs.get_tensor(b["index"]).astype(np.float64)
        if y.size:
            worst = max(worst, float(np.abs(x - y).max() / max(np.abs(y).max(), 1e-30)))
    return worst


def bench(path: Path, inputs, threads: list[int], runs: int, rounds: int, busy: int = 0) -> dict:
    """One model's row: error, placement, init time and, per thread count, both medians
    (timed beside ``busy`` CPU-bound processes)."""
    from ai_edge_litert.interpreter import Interpreter as LiteRT
    row: dict = {"max_rel_err": 0.0}
    for t in threads:
        theirs = LiteRT(model_path=str(path), num_threads=t)
        if inputs is None:
            inputs = random_inputs(theirs.get_input_details(), seed=0)
        start = time.perf_counter()
        try:
            ours = litegpu.Interpreter(model_path=str(path), num_threads=t)
            ours.allocate_tensors()
        except litegpu.LiteGpuError as exc:
            return {"error": str(exc).split(":")[-1].strip()[:60]}
        row.setdefault("init_ms", (time.perf_counter() - start) * 1e3)  # the first, colder, creation
        for interp in (ours, theirs):
            prepare(interp, inputs)
        row["max_rel_err"] = max(row["max_rel_err"], max_rel_error(ours, theirs))
        report = ours.get_delegation_report()
        row["all_nodes_ran"] = report.nodes_on("cpu") == len(report.assignments)
        row["nodes"] = len(report.assignments) + len(report.folded)
        with background_load(busy):
            best = alternate({"litegpu": ours.invoke, "litert": theirs.invoke}, runs, rounds)
        row[t] = (best["litegpu"] * 1e3, best["litert"] * 1e3)
        del ours, theirs  # one pair of thread pools alive at a time
    return row


def parse_args(description: str, runs: int, threads: list[int], busy: bool = False) -> argparse.Namespace:
    """The options every model benchmark takes (and ``--busy`` for one that honours it)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--threads", type=int, nargs="+", default=threads, help="thread counts to time at")
    parser.add_argument("--runs", type=int, default=runs, help="invokes per timed block")
    parser.add_argument("--rounds", type=int, default=3, help="alternating blocks per runtime")
    parser.add_argument("--real", action="store_true", help="include the fetched real models")
    parser.add_argument("--markdown", action="store_true", help="print a markdown table")
    if busy:
        parser.add_argument("--busy", type=int, default=0, metavar="N",
                            help="CPU-bound background processes running while both runtimes are timed")
    parser.add_argument("names", nargs="*")
    return parser.parse_args()


def printer(markdown: bool, widths: list[int]):
    """A function printing one row of cells as markdown or as aligned columns."""
    def emit(cells: list[str]) -> None:
        if markdown:
            print("| " + " | ".join(cells) + " |")
        else:
            print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))))
        sys.stdout.flush()
    return emit


def main() -> int:
    args = parse_args(__doc__.splitlines()[0], runs=30, threads=[1, 2], busy=True)
    header = ["model", "nodes", "max rel err vs LiteRT", "all nodes ran", "litegpu init ms"]
    for t in args.threads:
        header += [f"litegpu ms ({t}t)", f"LiteRT ms ({t}t)", f"ratio ({t}t)"]
    emit = printer(args.markdown, [28] + [max(len(h), 9) for h in header[1:]])
    emit(header)
    if args.markdown:
        emit(["---"] * len(header))
    ratios: dict[int, list[float]] = {t: [] for t in args.threads}
    start = time.perf_counter()
    for name, path, inputs in models(args.real, args.names):
        row = bench(path, inputs, args.threads, args.runs, args.rounds, args.busy)
        if "error" in row:
            emit([name, "", f"not run: {row['error']}"] + [""] * (len(header) - 3))
            continue
        cells = [name, str(row["nodes"]), f"{row['max_rel_err']:.2e}", "yes" if row["all_nodes_ran"] else "no",
                 f"{row['init_ms']:.0f}"]
        for t in args.threads:
            ours, theirs = row[t]
            ratios[t].append(ours / theirs)
            cells += [f"{ours:.3f}", f"{theirs:.3f}", f"{ours / theirs:.2f}"]
        emit(cells)
    print()
    for t in args.threads:
        print(f"geometric mean of ratio litegpu/LiteRT at {t} thread(s) over {len(ratios[t])} models: "
              f"{geometric_mean(ratios[t]):.2f}")
    print(f"wall time {time.perf_counter() - start:.0f} s; {args.runs} invokes per block, "
          f"{args.rounds} rounds, best block median; {args.busy} CPU-bound background process(es)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
