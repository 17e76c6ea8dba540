"""A parallel plan's width under load (:class:`litegpu_cpu.kernels.tasks.LoadAdaptiveWidth`),
driven by a clock the test sets: what each run costs on one thread and on all."""
from __future__ import annotations

import itertools

import numpy as np

from litegpu_cpu.kernels import tasks

MS = 1_000_000


def _drive(monkeypatch, cost, runs: int) -> list[int]:
    """The width of each of ``runs`` runs when a run on width ``w`` as run ``i`` costs ``cost(w, i)``."""
    clock = [0]
    monkeypatch.setattr(tasks, "perf_counter_ns", lambda: clock[0])
    block = np.array([0, 0, 0, 0, 2, 0], np.int64)
    control = tasks.LoadAdaptiveWidth(block, 2)
    widths = []
    for i in range(runs):
        def run(i=i):
            widths.append(int(block[4]))
            clock[0] += int(cost(int(block[4]), i))
        control(run)
    return widths


def test_a_quiet_machine_keeps_the_full_width_but_for_one_run_per_slow_stretch(monkeypatch):
    # Two threads 4 ms, one 7.5 ms; every 50th run starts three slow runs (a noisy neighbour).
    widths = _drive(monkeypatch, lambda w, i: 7.5 * MS if w == 1 else (9 if i % 50 < 3 else 4) * MS, 1000)
    assert widths.count(1) <= 1000 // 50


def test_a_loaded_machine_moves_to_one_thread_and_comes_back_when_it_is_quiet(monkeypatch):
    # Loaded for 600 runs: two threads mostly 8-12 ms, now and then 4 ms (the other process
    # off a core); one thread 7.3 ms. Then quiet: two threads 4 ms.
    lucky = itertools.cycle([8, 12, 4, 8, 9, 8, 4, 8])
    widths = _drive(monkeypatch, lambda w, i: (7.3 if w == 1 else next(lucky) if i < 600 else 4) * MS, 900)
    loaded, quiet = widths[100:600], widths[700:]
    assert loaded.count(1) > 0.7 * len(loaded)
    assert quiet.count(2) == len(quiet)


def test_a_steady_slowdown_of_the_full_width_is_a_load_too(monkeypatch):
    # Two threads 4 ms, then from run 200 on a steady 9 ms (no lucky runs); one thread 6 ms.
    widths = _drive(monkeypatch, lambda w, i: (6 if w == 1 else 4 if i < 200 else 9) * MS, 600)
    assert widths[:200].count(1) == 0
    assert widths[-200:].count(1) > 0.7 * 200
