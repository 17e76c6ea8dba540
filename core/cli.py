"""The ``litegpu`` command: ``run``, ``inspect``, ``bench``, ``backends``.

Exit codes: 0 success, 1 a litegpu error (bad model, unsupported op, unavailable
backend), 2 bad command line.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import logging
import sys
import threading
import time
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from . import __version__
from .errors import LiteGpuError

log = logging.getLogger("litegpu")


@contextlib.contextmanager
def progress(message: str) -> Iterator[None]:
    """Show ``message`` with a spinner and elapsed time on stderr while the body runs."""
    done = threading.Event()
    start = time.perf_counter()
    tty = sys.stderr.isatty()

    def spin() -> None:
        frames = "|/-\\"
        i = 0
        while not done.wait(0.1):
            if tty:
                sys.stderr.write(f"\r{message} {frames[i % 4]} {time.perf_counter() - start:.1f}s")
                sys.stderr.flush()
            i += 1

    thread = threading.Thread(target=spin, daemon=True)
    if not tty:
        sys.stderr.write(f"{message} ...\n")
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        sys.stderr.write(f"{chr(13) if tty else ''}{message}: done in {time.perf_counter() - start:.2f}s\n")


def _make_interpreter(args: argparse.Namespace):
    from .interpreter import Interpreter
    from .session import load_delegate
    options = {"precision_loss_allowed": bool(getattr(args, "fp16", False))}
    delegates = [load_delegate(b, options) for b in (args.backend or []) if b != "cpu"]
    with progress(f"compiling {Path(args.model).name}"):
        interp = Interpreter(model_path=args.model, experimental_delegates=delegates,
                             num_threads=args.num_threads)
        interp.allocate_tensors()
    return interp


def random_inputs(details: list[dict], seed: int = 0) -> list[np.ndarray]:
    """Seeded random inputs matching input details (ints in a small non-negative range)."""
    rng = np.random.default_rng(seed)
    out = []
    for d in details:
        dtype = np.dtype(d["dtype"])
        shape = tuple(int(s) for s in d["shape"])
        if dtype.kind == "f":
            out.append(rng.standard_normal(shape).astype(dtype))
        elif dtype.kind == "b":
            out.append(rng.integers(0, 2, shape).astype(dtype))
        else:
            out.append(rng.integers(0, 10, shape).astype(dtype))
    return out


def _load_inputs(paths: Sequence[str] | None, details: list[dict], seed: int) -> list[np.ndarray]:
    if not paths:
        return random_inputs(details, seed)
    if len(paths) != len(details):
        raise LiteGpuError(f"the model has {len(details)} inputs, {len(paths)} .npy files were given")
    return [np.load(p, allow_pickle=False) for p in paths]


def cmd_run(args: argparse.Namespace) -> int:
    interp = _make_interpreter(args)
    details = interp.get_input_details()
    for d, x in zip(details, _load_inputs(args.input, details, args.seed)):
        if tuple(x.shape) != tuple(d["shape"]):
            interp.resize_tensor_input(d["index"], x.shape)
            interp.allocate_tensors()
        interp.set_tensor(d["index"], x)
    start = time.perf_counter()
    interp.invoke()
    elapsed = time.perf_counter() - start
    for d in interp.get_output_details():
        y = interp.get_tensor(d["index"])
        stats = (f"min {y.min():.6g} max {y.max():.6g} mean {y.astype(np.float64).mean():.6g}"
                 if y.size and y.dtype.kind in "fiu" else "")
        print(f"output {d['name']!r} {y.dtype}{list(y.shape)} {stats}")
        if args.save:
            path = Path(args.save) / f"output_{d['index']}.npy"
            np.save(path, y)
            print(f"  saved to {path}")
    print(f"invoke: {elapsed * 1e3:.3f} ms")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from .model import load_model
    model = load_model(args.model)
    print(f"model {args.model}: {model.nbytes / 1e6:.2f} MB, schema version {model.version}, "
          f"{len(model.subgraphs)} subgraphs")
    if model.description:
        print(f"description: {model.description}")
    for s in model.signatures:
        print(f"signature {s.key!r} (subgraph {s.subgraph_index}): inputs {s.inputs} outputs {s.outputs}")
    for sg in model.subgraphs:
        hist = collections.Counter(n.op for n in sg.nodes)
        print(f"subgraph {sg.index} {sg.name!r}: {len(sg.tensors)} tensors, {len(sg.nodes)} nodes")
        print("  ops: " + ", ".join(f"{op}x{c}" for op, c in hist.most_common()))
        for label, idx in (("input", sg.inputs), ("output", sg.outputs)):
            for t in idx:
                tensor = sg.tensors[t]
                print(f"  {label} {t} {tensor.name!r} {tensor.type_name}{list(tensor.shape_signature)}")
        if args.tensors:
            for t in sg.tensors:
                kind = "const" if t.is_constant else "variable" if t.is_variable else "activation"
                quant = f" scale={t.quantization.scales[:4].tolist()}" if t.quantization and t.quantization.is_set else ""
                print(f"  tensor {t.index} {t.name!r} {t.type_name}{list(t.shape_signature)} {kind}{quant}")
    try:
        interp = _make_interpreter(args)
    except LiteGpuError as exc:
        print(f"not runnable: {exc}")
        return 1
    print(interp.get_delegation_report())
    return 0


def _summary(times: np.ndarray) -> str:
    ms = times * 1e3
    return (f"median {np.median(ms):.3f} ms, mean {ms.mean():.3f}, min {ms.min():.3f}, "
            f"p90 {np.percentile(ms, 90):.3f}, p99 {np.percentile(ms, 99):.3f} ({len(ms)} runs)")


def _time_invokes(invoke, runs: int, warmup: int) -> tuple[float, float, np.ndarray]:
    start = time.perf_counter()
    invoke()
    first = time.perf_counter() - start
    warm = []
    for _ in range(warmup):
        t = time.perf_counter()
        invoke()
        warm.append(time.perf_counter() - t)
    times = np.empty(runs)
    for i in range(runs):
        t = time.perf_counter()
        invoke()
        times[i] = time.perf_counter() - t
    return first, float(np.mean(warm)) if warm else first, times


def _peak_rss_mb() -> float:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cmd_bench(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    interp = _make_interpreter(args)
    init = time.perf_counter() - start
    details = interp.get_input_details()
    inputs = _load_inputs(args.input, details, args.seed)
    for d, x in zip(details, inputs):
        interp.set_tensor(d["index"], x)
    first, warm, times = _time_invokes(interp.invoke, args.num_runs, args.warmup_runs)
    report = interp.get_delegation_report()
    backend = ",".join(args.backend or ["cpu"])
    print(f"litegpu {__version__} [{backend}] {Path(args.model).name}, threads {args.num_threads}")
    print(f"  init {init * 1e3:.1f} ms, first inference {first * 1e3:.3f} ms, warmup avg {warm * 1e3:.3f} ms")
    print(f"  steady state: {_summary(times)}")
    print("  nodes per backend: " + ", ".join(f"{b}={report.nodes_on(b)}" for b in
                                                 sorted({a.backend for a in report.assignments})))
    print(f"  arena {report.arena_bytes / 1e6:.2f} MB, peak RSS {_peak_rss_mb():.0f} MB, "
          f"host<->device copies {report.bytes_moved} bytes per run")
    for summary in report.programs:
        print(f"  {summary}")
    if args.compare_litert:
        return _compare_litert(args, interp, inputs, float(np.median(times)))
    return 0


def _compare_litert(args: argparse.Namespace, interp, inputs, ours: float) -> int:
    try:
        from ai_edge_litert.interpreter import Interpreter as LiteRT
    except ImportError:
        print("--compare-litert needs ai-edge-litert (pip install litegpu[litert])", file=sys.stderr)
        return 1
    ref = LiteRT(model_path=args.model, num_threads=args.num_threads)
    ref.allocate_tensors()
    for d, x in zip(ref.get_input_details(), inputs):
        if tuple(d["shape"]) != x.shape:
            ref.resize_tensor_input(d["index"], x.shape)
            ref.allocate_tensors()
    for d, x in zip(ref.get_input_details(), inputs):
        ref.set_tensor(d["index"], x)
    _, _, times = _time_invokes(ref.invoke, args.num_runs, args.warmup_runs)
    theirs = float(np.median(times))
    print(f"LiteRT (XNNPACK) steady state: {_summary(times)}")
    worst = 0.0
    for ours_d, ref_d in zip(interp.get_output_details(), ref.get_output_details()):
        a, b = interp.get_tensor(ours_d["index"]), ref.get_tensor(ref_d["index"])
        if a.shape != b.shape:
            print(f"  output {ref_d['name']!r}: shape {list(a.shape)} vs LiteRT {list(b.shape)}")
            worst = float("inf")
            continue
        scale = max(float(np.abs(b.astype(np.float64)).max()) if b.size else 0.0, 1e-30)
        err = float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max()) / scale if b.size else 0.0
        worst = max(worst, err)
    print(f"ratio litegpu/LiteRT median: {ours / theirs:.2f}x; max abs error relative to output scale: {worst:.3g}")
    return 0


def cmd_backends(args: argparse.Namespace) -> int:
    from .plugins import manager
    pm = manager()
    for rec in pm.records:
        if rec.error:
            print(f"{rec.name}: plugin failed to load ({rec.module}): {rec.error}")
    for name, backend in sorted(pm.backends.items()):
        ok, why = backend.available()
        info = backend.device_info() if ok else {}
        plugin = next((r for r in pm.records if name in r.backends), None)
        where = f"{plugin.distribution} {plugin.version}".strip() if plugin else ""
        state = "available" if ok else f"unavailable: {why}"
        print(f"{name}: {state}" + (f" [{where}]" if where else ""))
        for key, value in info.items():
            print(f"    {key}: {value}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``litegpu`` command."""
    parser = argparse.ArgumentParser(prog="litegpu", description="Run .tflite models on litegpu backends.")
    parser.add_argument("--version", action="version", version=f"litegpu {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", required=True)

    def model_command(name: str, help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_)
        p.add_argument("model", help="path of a .tflite model")
        p.add_argument("--backend", action="append", help="backend in order of preference (repeatable); "
                       "nodes it cannot run fall back to cpu")
        p.add_argument("--num-threads", type=int, default=2, help="cpu threads (default 2)")
        p.add_argument("--input", nargs="*", help=".npy files, one per input (default: seeded random)")
        p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
        p.add_argument("--fp16", action="store_true", help="allow precision loss: fp16 storage on GPU "
                       "backends (LiteRT's precision_loss_allowed)")
        return p

    p = model_command("run", "run a model once and summarize its outputs")
    p.add_argument("--save", help="folder to save outputs as .npy")
    p.set_defaults(func=cmd_run)
    p = model_command("inspect", "show signatures, tensors, op histogram, partitions and the delegation report")
    p.add_argument("--tensors", action="store_true", help="list every tensor of every subgraph")
    p.set_defaults(func=cmd_inspect)
    p = model_command("bench", "time a model like LiteRT's benchmark_model")
    p.add_argument("--num-runs", type=int, default=50)
    p.add_argument("--warmup-runs", type=int, default=5)
    p.add_argument("--compare-litert", action="store_true", help="also time ai-edge-litert on the same input "
                   "and print the ratio and the max difference")
    p.set_defaults(func=cmd_bench)
    p = sub.add_parser("backends", help="list backend plugins, availability, devices and versions")
    p.set_defaults(func=cmd_backends)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``litegpu`` command."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except LiteGpuError as exc:
        print(f"litegpu: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"litegpu: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
