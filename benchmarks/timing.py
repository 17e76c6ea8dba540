"""The one way the benchmarks time runtimes against each other: alternating blocks.

Two runtimes timed invoke by invoke in one process slow each other down: each call wakes
one thread pool while the other's workers are still spinning for work, so both fight for
the same cores (LiteRT lost up to 10x that way on 2 cores). Here each runtime runs a whole
block of invokes before the next one starts, blocks alternate over several rounds so a
burst of load from elsewhere hits every runtime alike, and each runtime's figure is the
best of its block medians: the least disturbed block is the closest to what it can do.
"""
from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from typing import Callable, Iterator

import numpy as np


def block_median(invoke: Callable[[], object], runs: int) -> float:
    """Median seconds of ``runs`` back-to-back calls of ``invoke``."""
    times = np.empty(runs)
    for i in range(runs):
        start = time.perf_counter()
        invoke()
        times[i] = time.perf_counter() - start
    return float(np.median(times))


def alternate(timers: dict[str, Callable[[], object]], runs: int, rounds: int = 3,
              warmup: int | None = None) -> dict[str, float]:
    """Best block median, in seconds, of each of ``timers``.

    Each timer is warmed by ``warmup`` calls (default ``max(3, runs // 5)``), then each
    round runs one block of ``runs`` calls per timer, in turn, never mixing calls of two
    timers inside a block.
    """
    warmup = max(3, runs // 5) if warmup is None else warmup
    for invoke in timers.values():
        for _ in range(warmup):
            invoke()
    best = {name: float("inf") for name in timers}
    for _ in range(rounds):
        for name, invoke in timers.items():
            best[name] = min(best[name], block_median(invoke, runs))
    return best


def geometric_mean(values: list[float]) -> float:
    """Geometric mean of positive ``values`` (nan when empty): the fair average of ratios."""
    return float(np.exp(np.mean(np.log(values)))) if values else float("nan")


@contextlib.contextmanager
def background_load(processes: int) -> Iterator[None]:
    """``processes`` CPU-bound processes (a Python loop each, never sleeping: a compile, a
    browser tab, another worker) running beside the block, stopped on leaving."""
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]
    try:
        time.sleep(0.2 if busy else 0)        # let them start spinning
        yield
    finally:
        for p in busy:
            p.kill()
            p.wait()
