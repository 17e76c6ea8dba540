"""Throughput of a model over many inputs: a plain loop, Ray Data, Dask.

usage: python benchmarks/scale_out.py [--model mobilenet_v2] [--inputs 2000] [--batch 64]

Per configuration, inputs per second over ``--inputs`` seeded random inputs, each engine
making the inputs where they are used (Ray: a ``range`` dataset mapped to images; Dask:
a random dask array), so the figures are the inference, not the driver shipping
megabytes: a plain single-process loop over batches of ``--batch``
(``litegpu.batch.BatchPredictor``), Ray with 1 and 2 actors, Dask with 1 and 2 worker
processes (one thread each, the model on cpu with 1 thread each). Also: what loading the
model once costs (the time to a predictor's first result, a worker's one-off cost), and
each engine's overhead per batch (its time per batch minus the plain loop's).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import SHARED  # noqa: E402  (where the shared models are)


def _inputs(shape: tuple[int, ...], start: int, n: int) -> np.ndarray:
    """Rows ``start..start+n`` of the benchmark's input: the same wherever they are made."""
    return np.random.default_rng(start).random((n, *shape), np.float32)


def plain(model: bytes, name: str, shape: tuple[int, ...], n: int, batch: int, threads: int) -> float:
    from litegpu.batch import BatchPredictor
    predictor = BatchPredictor(model, num_threads=threads)
    predictor.predict({name: _inputs(shape, 0, batch)})   # compiled and warm, as a worker is after its first batch
    start = time.perf_counter()
    for i in range(0, n, batch):
        predictor.predict({name: _inputs(shape, i, min(batch, n - i))})
    return time.perf_counter() - start


def load_cost(model: bytes, name: str, shape: tuple[int, ...], threads: int) -> float:
    """Seconds from nothing to a fresh predictor's first result (one batch of 1)."""
    from litegpu.batch import BatchPredictor
    start = time.perf_counter()
    BatchPredictor(model, num_threads=threads).predict({name: _inputs(shape, 0, 1)})
    return time.perf_counter() - start


def with_ray(model: bytes, name: str, shape: tuple[int, ...], n: int, batch: int, actors: int) -> float:
    import ray

    import litegpu.ray

    def make(rows: dict) -> dict:
        first = int(rows["id"][0])
        return {"id": rows["id"], name: _inputs(shape, first, len(rows["id"]))}

    ds = ray.data.range(n, override_num_blocks=max(2, n // batch)).map_batches(make, batch_size=batch)
    ds = ds.map_batches(litegpu.ray.Predictor, batch_size=batch, compute=ray.data.ActorPoolStrategy(size=actors),
                        fn_constructor_kwargs={"model": model, "backend": "cpu", "num_threads": 1})
    start = time.perf_counter()
    rows = ds.materialize().count()
    assert rows == n, rows
    return time.perf_counter() - start


def with_dask(model: bytes, name: str, shape: tuple[int, ...], n: int, batch: int, client) -> float:
    import dask.array as da

    import litegpu.dask

    blocks = [da.from_delayed(_delayed_inputs(shape, i, min(batch, n - i)), (min(batch, n - i), *shape), np.float32)
              for i in range(0, n, batch)]
    out = litegpu.dask.predict(da.concatenate(blocks), model, backend="cpu", num_threads=1)
    start = time.perf_counter()
    result = out.compute() if hasattr(out, "compute") else {k: v.compute() for k, v in out.items()}
    assert len(result if not isinstance(result, dict) else next(iter(result.values()))) == n
    return time.perf_counter() - start


def _delayed_inputs(shape, start, n):
    import dask
    return dask.delayed(_inputs)(shape, start, n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="mobilenet_v2")
    ap.add_argument("--inputs", type=int, default=2000)
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    model = (SHARED / f"{args.model}.tflite").read_bytes()
    from litegpu.batch import BatchPredictor
    probe = BatchPredictor(model)
    name = probe.input_names[0]
    shape = tuple(d if d > 0 else 1 for d in probe.input_record(name)[0])
    n, batch = args.inputs, args.batch
    batches = -(-n // batch)
    rows = []

    def say(what: str) -> None:   # progress on stderr: the engines' start-up takes seconds
        print(f"[scale_out] {what}", file=sys.stderr, flush=True)

    say("plain loop")
    load = load_cost(model, name, shape, 1)
    for threads in (1, 2):
        seconds = plain(model, name, shape, n, batch, threads)
        rows.append((f"plain loop, 1 process, {threads} thread{'s' * (threads > 1)}", seconds, 1))
    base = rows[0][1]

    import ray
    # Ray is given more logical CPUs than the machine's 2 cores: two 1-CPU actors would
    # otherwise hold them all and starve Ray Data's own read tasks (the job never ends).
    ray.init(num_cpus=4, include_dashboard=False, logging_level="ERROR")
    try:
        for actors in (1, 2):
            say(f"Ray, {actors} actors")
            rows.append((f"Ray Data, {actors} actor{'s' * (actors > 1)} x 1 thread",
                         with_ray(model, name, shape, n, batch, actors), actors))
    finally:
        ray.shutdown()

    from distributed import Client, LocalCluster
    for workers in (1, 2):
        say(f"Dask, {workers} workers")
        with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
                Client(cluster) as client:
            rows.append((f"Dask, {workers} worker process{'es' * (workers > 1)} x 1 thread",
                         with_dask(model, name, shape, n, batch, client), workers))

    print(f"{args.model}: {n} inputs in batches of {batch}, {os.cpu_count()} CPUs; "
          f"one model load (to its first result): {load:.2f} s\n")
    # Overhead per batch: a worker's time per batch (the job's time times its workers, over
    # the batches) minus the plain loop's; it includes the workers' model loads.
    print("| configuration | seconds | inputs/s | vs plain loop (1 thread) | overhead per batch per worker (ms) |")
    print("|---|---|---|---|---|")
    for label, seconds, workers in rows:
        print(f"| {label} | {seconds:.2f} | {n / seconds:.0f} | {base / seconds:.2f}x | "
              f"{(seconds * workers - base) / batches * 1e3:+.1f} |")


if __name__ == "__main__":
    main()
