"""Startup of models on the opencl backend, cold and warm, each in a fresh process.

usage: python benchmarks/opencl_startup.py [--model PATH]... [--repeat N]

Scenarios (every one a new Python process, started here with subprocess):

- cold: every cache empty: fresh temp dirs for LITEGPU_CACHE_DIR (litegpu's kernel
  cache and the cpu backend's generated kernels), NUMBA_CACHE_DIR (numba's),
  XDG_CACHE_HOME (pyopencl's and pytools', e.g. pyopencl's kernel invokers) and
  POCL_CACHE_DIR (PoCL's); the line under each table says what the cold process left
  in each, which shows every one was in play;
- warm: a second process with the same directories, under
  LITEGPU_OPENCL_FORBID_COMPILE=1, so it fails unless every OpenCL program came from
  litegpu's kernel cache;
- warm, litegpu cache only: litegpu's and numba's directories kept, the driver's
  caches (POCL_CACHE_DIR, XDG_CACHE_HOME where pyopencl keeps its own) fresh, also
  under forbid-compile: what our cache gives by itself;
- warm, kernel cache off: every directory kept but ``kernel_cache=False``: what the
  driver's own caches give without ours.

Columns: ``create`` is ``CompiledModel.from_file`` (model load, plugin load,
partitioning, cpu and opencl compilation); ``cl build`` is the part spent in
``build_program`` (cache load or compile); ``cl rest`` the rest of the opencl programs'
construction (kernel generation, kernel objects, arena, constant uploads); ``kernel
objs`` re-times creating the kernel objects alone; ``cl 1st run`` / ``cl 2nd run`` the
opencl partitions' first and second runs (the first carries the driver's lazy work:
PoCL compiles each kernel's work-group function at its first enqueue; and, for a
program built from source, ``ClProgram`` re-storing its cache entry with those functions
inside, timed on its own in the line under the table); ``1st run`` the whole first run
(the cpu partitions' numba kernels compile lazily too). The ``cl`` columns sum every
opencl program of the process, subgraphs compiled at the first run (WHILE bodies)
included; ``hits`` counts the main subgraph's programs. ``saved`` columns: the share of
the cold row's ``create`` and of its ``create`` + ``1st run`` that a warm row saves.
Medians over ``--repeat`` rounds. Timings are wall-clock and noisy on a shared machine:
compare rows, not runs.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEFAULT_MODEL = Path(__file__).resolve().parents[2] / "shared" / "models" / "mobilenet_v2.tflite"
FORBID = "LITEGPU_OPENCL_FORBID_COMPILE"
_DIRS = ("LITEGPU_CACHE_DIR", "XDG_CACHE_HOME", "POCL_CACHE_DIR", "NUMBA_CACHE_DIR")


def child(model: str, kernel_cache: bool) -> dict:
    """Measure one startup in this process; the result as a dict."""
    t0 = time.perf_counter()
    import numpy as np
    from litegpu.compiled_model import CompiledModel, Environment
    from litegpu_opencl import program as clprogram
    t_import = time.perf_counter() - t0

    # Timing wrappers around the opencl backend's own functions (looked up at call time).
    acc = {"build": 0.0, "init": 0.0, "first": 0.0, "later": 0.0, "refresh": 0.0}
    build, init, run = clprogram.build_program, clprogram.ClProgram.__init__, clprogram.ClProgram.run
    refresh = clprogram.store_warmed_binary
    seen: set[int] = set()

    def timed_build(*a, **k):
        t = time.perf_counter()
        try:
            return build(*a, **k)
        finally:
            acc["build"] += time.perf_counter() - t

    def timed_refresh(*a, **k):   # called by ClProgram.run after a from-source program's first run
        t = time.perf_counter()
        try:
            return refresh(*a, **k)
        finally:
            acc["refresh"] += time.perf_counter() - t

    def timed_init(self, *a, **k):
        t = time.perf_counter()
        try:
            return init(self, *a, **k)
        finally:
            acc["init"] += time.perf_counter() - t

    def timed_run(self, *a, **k):
        t = time.perf_counter()
        try:   # run() only enqueues: wait, so the time includes the driver's lazy work
            event = run(self, *a, **k)
            event.wait()
            return event
        finally:
            acc["later" if id(self) in seen else "first"] += time.perf_counter() - t
            seen.add(id(self))

    clprogram.build_program = timed_build
    clprogram.ClProgram.__init__ = timed_init
    clprogram.ClProgram.run = timed_run
    clprogram.store_warmed_binary = timed_refresh

    env = Environment.create(kernel_cache=False) if not kernel_cache else None
    t = time.perf_counter()
    cm = CompiledModel.from_file(model, backend="opencl", environment=env)
    t_create = time.perf_counter() - t
    ins, outs = cm.create_input_buffers(), cm.create_output_buffers()
    for buf in ins:
        buf.write(np.zeros_like(buf.array))
    t = time.perf_counter()
    cm.run_by_index(0, ins, outs)
    t_first = time.perf_counter() - t
    t = time.perf_counter()
    cm.run_by_index(0, ins, outs)
    t_second = time.perf_counter() - t

    programs = [p for compiled in cm._compiled for p, _, _ in compiled.programs if isinstance(p, clprogram.ClProgram)]
    # Kernel-object creation alone, re-timed on the built programs.
    t = time.perf_counter()
    for p in programs:
        for launch in p.launches:
            p.cl.Kernel(p.program, launch.kernel.function_name)
    t_kernels = time.perf_counter() - t
    return {"import": t_import, "create": t_create, "cl build": acc["build"], "cl rest": acc["init"] - acc["build"],
            "kernel objs": t_kernels, "cl 1st run": acc["first"], "cl 2nd run": acc["later"],
            "1st run": t_first, "2nd run": t_second, "refresh": acc["refresh"],
            "programs": len(programs), "hits": sum(bool(p.cache_hit) for p in programs),
            "kernels": sum(p.kernel_count for p in programs)}


def spawn(model: str, env: dict, kernel_cache: bool = True) -> dict:
    """Run :func:`child` in a new process with ``env``; its result, or {'error': ...}."""
    cmd = [sys.executable, __file__, "--child", "--model", model] + ([] if kernel_cache else ["--no-kernel-cache"])
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1]}


def fresh_dirs(root: Path, name: str) -> dict:
    """Four new empty cache directories under ``root``, as environment variables."""
    return {var: str(Path(tempfile.mkdtemp(prefix=f"{name}-{var.lower()}-", dir=root))) for var in _DIRS}


def tree_size(directory: str) -> tuple[int, int]:
    """(files, bytes) under ``directory``; files vanishing meanwhile are skipped."""
    files = size = 0
    for base, _, names in os.walk(directory):
        for name in names:
            try:
                size += os.lstat(os.path.join(base, name)).st_size
                files += 1
            except OSError:
                pass
    return files, size


def one_round(model: str, root: Path) -> dict[str, dict]:
    """Every scenario once, over a new set of directories."""
    # Nothing of the caller's may leak in: a forbid switch or a cache cap of its own.
    base = {k: v for k, v in os.environ.items() if k not in (FORBID, "LITEGPU_OPENCL_CACHE_MAX_BYTES")}
    dirs = fresh_dirs(root, "cold")
    assert all(tree_size(d) == (0, 0) for d in dirs.values())     # cold: every cache empty
    out = {"cold": spawn(model, {**base, **dirs})}
    out["cold"]["left"] = {var: tree_size(d) for var, d in dirs.items()}
    out["warm"] = spawn(model, {**base, **dirs, FORBID: "1"})
    driver_fresh = fresh_dirs(root, "ours")
    out["warm, litegpu cache only"] = spawn(model, {**base, **dirs, FORBID: "1",
                                                    "POCL_CACHE_DIR": driver_fresh["POCL_CACHE_DIR"],
                                                    "XDG_CACHE_HOME": driver_fresh["XDG_CACHE_HOME"]})
    out["warm, kernel cache off"] = spawn(model, {**base, **dirs}, kernel_cache=False)
    return out


COLS = ["create", "cl build", "cl rest", "kernel objs", "cl 1st run", "cl 2nd run", "1st run", "2nd run", "import"]


def table(rounds: list[dict[str, dict]]) -> str:
    """Medians of every column, one row per scenario, with the shares warm rows save."""
    def med(results: list[dict], col: str) -> float:
        return statistics.median(r[col] for r in results)

    lines = [f"{'scenario':<26}" + "".join(f"{c:>12}" for c in COLS) + f"{'hits':>10}"
             + f"{'saved create':>14}{'saved c+1st':>13}"]
    cold = [r["cold"] for r in rounds]
    cold_ok = not any("error" in r for r in cold)
    for name in rounds[0]:
        results = [r[name] for r in rounds]
        errors = [r["error"] for r in results if "error" in r]
        if errors:
            lines.append(f"{name:<26}  FAILED: {errors[0]}")
            continue
        cells = "".join(f"{med(results, c):>11.3f}s" for c in COLS)
        last = results[-1]
        saved = ""
        if name != "cold" and cold_ok:
            # Medians of the per-round shares: each warm process is compared with its own round's cold one.
            create = statistics.median(1 - w["create"] / c["create"] for w, c in zip(results, cold))
            both = statistics.median(1 - (w["create"] + w["1st run"]) / (c["create"] + c["1st run"])
                                     for w, c in zip(results, cold))
            saved = f"{create:>13.0%}{both:>13.0%}"
        lines.append(f"{name:<26}{cells}{last['hits']:>5}/{last['programs']:<4}{saved}")
    if cold_ok:
        left = ", ".join(f"{var} {n} files {b / 1e6:.1f} MB" for var, (n, b) in cold[-1]["left"].items())
        lines.append(f"cold process left: {left}")
        lines.append(f"cold 1st run includes {med(cold, 'refresh'):.3f}s re-storing PoCL binaries with their "
                     f"work-group functions (ClProgram, after a from-source program's first run)")
    return "\n".join(lines)


def main() -> None:
    """Parse the arguments, run the rounds for each model, print a table per model."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", action="append", default=None,
                    help=f"a .tflite file; repeat for several (default: {DEFAULT_MODEL})")
    ap.add_argument("--repeat", type=int, default=3, help="rounds; the table shows medians (default 3)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--no-kernel-cache", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    models = args.model or [str(DEFAULT_MODEL)]
    if args.child:
        print(json.dumps(child(models[0], kernel_cache=not args.no_kernel_cache)))
        return
    for n, model in enumerate(models):
        with tempfile.TemporaryDirectory(prefix="litegpu-startup-") as root:
            rounds = [one_round(model, Path(root)) for _ in range(args.repeat)]
        first = rounds[0]["cold"]
        if n:
            print()
        print(f"model {model}: {first.get('programs', '?')} opencl programs, {first.get('kernels', '?')} kernels "
              f"(medians of {args.repeat} rounds)")
        print(table(rounds), flush=True)


if __name__ == "__main__":
    main()
