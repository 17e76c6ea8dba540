"""One backend on the shared models in two source trees of litegpu: the before and after of a change.

usage: python benchmarks/source_trees.py BEFORE [NAME ...] [--after DIR] [--backend opencl]
       [--fp16] [--runs 20] [--rounds 3]

BEFORE and ``--after`` (default: this checkout) are checkouts of the repository, e.g. a
``git worktree add /tmp/before <commit>``. Two versions of litegpu cannot share a process,
so each measurement is a fresh process that imports one tree (through a folder of links
put first on ``PYTHONPATH``), loads the model on ``--backend``, warms it and reports the
median invoke time of a block of ``--runs``; the trees alternate, block by block, over
``--rounds`` rounds, and each tree's figure is its best block (as benchmarks/timing.py
does within one process). The kernel caches are the user's, so after the first round
each process starts warm. Prints a markdown table: nodes on the backend, ms before and
after, and after / before.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PACKAGES = {"litegpu": "core", **{f"litegpu_{p}": f"plugins/{p}/litegpu_{p}"
                                  for p in ("cpu", "opencl", "cuda", "metal", "webgpu")}}


def link_farm(tree: Path, into: Path) -> Path:
    """A folder whose packages are ``tree``'s (the repository's layout maps ``core`` to ``litegpu``)."""
    into.mkdir(parents=True, exist_ok=True)
    for name, rel in PACKAGES.items():
        if not (tree / rel / "__init__.py").exists():
            raise SystemExit(f"{tree} is not a litegpu checkout: no {rel}/__init__.py")
        (into / name).symlink_to(tree / rel)
    return into


def measure(farm: Path, model: Path, backend: str, fp16: bool, runs: int) -> dict:
    """One block in a fresh process importing ``farm``'s litegpu."""
    env = {**os.environ, "PYTHONPATH": f"{farm}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, __file__, "--worker", str(model), "--backend", backend, "--runs", str(runs)]
    if fp16:
        cmd.append("--fp16")
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1][:100]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def worker(model: str, backend: str, fp16: bool, runs: int) -> None:
    """Load, warm and time one block; print {"ms", "nodes", "file"} as JSON."""
    sys.path.insert(0, str(HERE))
    from timing import block_median

    import litegpu
    from litegpu.cli import random_inputs
    interp = litegpu.Interpreter(model_path=model, experimental_delegates=[
        litegpu.load_delegate(backend, {"precision_loss_allowed": fp16})])
    interp.allocate_tensors()
    for d, x in zip(interp.get_input_details(), random_inputs(interp.get_input_details(), seed=0)):
        interp.set_tensor(d["index"], x)
    for _ in range(max(3, runs // 5)):
        interp.invoke()
    ms = block_median(interp.invoke, runs) * 1e3
    print(json.dumps({"ms": ms, "nodes": interp.get_delegation_report().nodes_on(backend),
                      "file": litegpu.__file__}))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("names", nargs="*", help="shared model stems (default: every float model)")
    parser.add_argument("--after", type=Path, default=HERE.parent)
    parser.add_argument("--backend", default="opencl")
    parser.add_argument("--fp16", action="store_true", help="precision loss allowed (F32_F16 / F16)")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from litegpu.testing.shared_models import shared_models_dir
    folder = shared_models_dir()
    names = args.names or sorted(p.stem for p in folder.glob("*.tflite")
                                 if "int8" not in p.stem and "int16" not in p.stem and p.stem != "stateful_counter")
    with tempfile.TemporaryDirectory() as tmp:
        farms = {"before": link_farm(args.before.resolve(), Path(tmp) / "before"),
                 "after": link_farm(args.after.resolve(), Path(tmp) / "after")}
        print(f"| model | nodes on {args.backend} (before / after) | before ms | after ms | after / before |")
        print("|---|---|---|---|---|")
        for name in names:
            best: dict[str, dict] = {}
            for _ in range(args.rounds):
                for tree, farm in farms.items():
                    got = measure(farm, folder / f"{name}.tflite", args.backend, args.fp16, args.runs)
                    if "error" in got or got["ms"] < best.get(tree, {"ms": float("inf")}).get("ms", float("inf")):
                        best[tree] = got
            if any("error" in b for b in best.values()):
                print(f"| {name} | not run: {'; '.join(b.get('error', '') for b in best.values())} | | | |")
                continue
            b, a = best["before"], best["after"]
            print(f"| {name} | {b['nodes']} / {a['nodes']} | {b['ms']:.2f} | {a['ms']:.2f} | {a['ms'] / b['ms']:.2f} |")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        w = argparse.ArgumentParser()
        w.add_argument("--worker")
        w.add_argument("--backend")
        w.add_argument("--runs", type=int)
        w.add_argument("--fp16", action="store_true")
        a = w.parse_args()
        worker(a.worker, a.backend, a.fp16, a.runs)
        sys.exit(0)
    sys.exit(main())
