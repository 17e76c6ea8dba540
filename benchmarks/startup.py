"""Time to the first result of a model, cold and warm, per backend, each in a new process.

usage: python benchmarks/startup.py [MODEL] [--backend NAME]... [--repeat N]

"Cold" means every cache empty: LITEGPU_CACHE_DIR (litegpu's kernel cache and the cpu
backend's generated kernels), NUMBA_CACHE_DIR (numba's), XDG_CACHE_HOME (pyopencl's) and
POCL_CACHE_DIR (PoCL's) point at fresh temp dirs; what ``litegpu prebuild`` built at
install is used (run it first). "Bare" is cold without that either (LITEGPU_PREBUILT_DIR
set empty): a machine where no one ran ``litegpu prebuild``. "Warm" is a second process
with the cold one's dirs, started once the cold one's background compile (of the fused
chains it ran on the chain machine) is done; ``litert`` rows are LiteRT's own Interpreter (XNNPACK), for comparison.
Columns, per process: ``import`` (numpy + litegpu, or LiteRT), ``create`` (Interpreter
creation + allocate_tensors: load, partition, compile), ``1st invoke`` (where numba
compiles kernels not in its disk cache and PoCL finalizes kernels), ``first result``
(their sum: what a user waits for from ``import litegpu`` to the first output),
``process`` (the whole process, Python's own startup included, timed from outside) and
``2nd invoke`` (steady state, for scale). Medians over ``--repeat`` rounds.
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
CACHE_VARS = ("LITEGPU_CACHE_DIR", "NUMBA_CACHE_DIR", "XDG_CACHE_HOME", "POCL_CACHE_DIR")
COLUMNS = ("import", "create", "1st invoke", "first result", "process", "2nd invoke")
LITERT = "litert"   # ai_edge_litert's Interpreter: the bar every row is read against


def child(model: str, backend: str) -> dict:
    """One startup in this process, timed phase by phase (``litert``: LiteRT's own
    Interpreter with XNNPACK, the bar)."""
    t0 = time.perf_counter()
    import numpy as np
    if backend == LITERT:
        from ai_edge_litert.interpreter import Interpreter
        t1 = time.perf_counter()
        interp = Interpreter(model_path=model, num_threads=2)
    else:
        import litegpu
        t1 = time.perf_counter()
        delegates = [] if backend == "cpu" else [litegpu.load_delegate(backend)]
        interp = litegpu.Interpreter(model_path=model, experimental_delegates=delegates, num_threads=2)
    interp.allocate_tensors()
    t2 = time.perf_counter()
    for d in interp.get_input_details():
        interp.set_tensor(d["index"], np.zeros(d["shape"], d["dtype"]))
    interp.invoke()
    interp.get_tensor(interp.get_output_details()[0]["index"])
    t3 = time.perf_counter()
    interp.invoke()
    t4 = time.perf_counter()
    return {"import": t1 - t0, "create": t2 - t1, "1st invoke": t3 - t2, "first result": t3 - t0,
            "2nd invoke": t4 - t3}


def _process(model: str, backend: str, env: dict) -> dict:
    start = time.perf_counter()
    res = subprocess.run([sys.executable, __file__, "--child", model, "--backend", backend],
                         capture_output=True, text=True, env=env, timeout=600)
    wall = time.perf_counter() - start
    if res.returncode:
        raise SystemExit(f"child failed ({backend}):\n{res.stderr}")
    return {**json.loads(res.stdout.strip().splitlines()[-1]), "process": wall}


def _background_compiles() -> bool:
    """True while a cpu background compile (``litegpu_cpu.compile_queue``, which a cold
    process may leave running) is alive: the next process is timed without it."""
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if b"litegpu_cpu.compile_queue" in cmdline.read_bytes():
                return True
        except OSError:
            pass
    return False


def measure(model: str, backend: str, repeat: int) -> dict[str, dict[str, float]]:
    """Median timings of the bare, cold and warm processes for one backend."""
    rows: dict[str, list[dict]] = {"bare": [], "cold": [], "warm": []}
    for _ in range(repeat):
        for kind in ("bare", "cold"):
            with tempfile.TemporaryDirectory(prefix="litegpu-startup-") as tmp:
                env = {**os.environ, **{var: str(Path(tmp) / var.lower()) for var in CACHE_VARS}}
                if kind == "bare":
                    env["LITEGPU_PREBUILT_DIR"] = ""
                rows[kind].append(_process(model, backend, env))
                deadline = time.monotonic() + 120
                while _background_compiles() and time.monotonic() < deadline:
                    time.sleep(0.1)
                if kind == "cold":
                    rows["warm"].append(_process(model, backend, env))
    if backend == LITERT:       # LiteRT has nothing to prebuild
        del rows["bare"]
    return {kind: {c: statistics.median(r[c] for r in runs) for c in COLUMNS} for kind, runs in rows.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=str(DEFAULT_MODEL))
    parser.add_argument("--backend", action="append",
                        help="cpu, opencl, ..., or litert (LiteRT itself) (repeatable; default litert, cpu and opencl)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.model, args.backend[0])))
        return
    print(f"{Path(args.model).name}, num_threads=2, median of {args.repeat}; seconds")
    print(f"| backend | cache | {' | '.join(COLUMNS)} |")
    print("|---|---|" + "---:|" * len(COLUMNS))
    for backend in args.backend or [LITERT, "cpu", "opencl"]:
        for kind, row in measure(args.model, backend, args.repeat).items():
            print(f"| {backend} | {kind} | " + " | ".join(f"{row[c]:.2f}" for c in COLUMNS) + " |")


if __name__ == "__main__":
    main()
