"""Mutation test: many broken copies of real models, through load + allocate + invoke.

Every case must end in success or a clean LiteGpuError: no raw exception, no crash
of the worker process, no hang. The default run is a few hundred cases; the slow
run is several thousand.
"""
from __future__ import annotations

import random
import subprocess
import sys

import pytest

import litegpu
from litegpu.testing import mutation

SMALL_MODELS = ("dynamic_batch_mlp", "elementwise_200", "stateful_counter", "lstm_classifier", "unet_small")


@pytest.fixture(scope="module")
def models():
    try:
        return mutation.resolve_models(SMALL_MODELS)
    except FileNotFoundError as exc:
        pytest.skip(str(exc))


def _assert_clean(report: mutation.Report) -> None:
    print(report.summary())
    assert report.counts["crash"] == 0, report.summary()
    assert report.counts["hang"] == 0, report.summary()
    assert report.counts["raw"] == 0, report.summary()


def test_field_map_finds_the_fields(models) -> None:
    data = models[0].read_bytes()
    fm = mutation.field_map(data)
    model = litegpu.load_model(data)
    sg = model.subgraphs[0]
    # One shape entry per dimension of every tensor (shape and shape_signature vectors).
    dims = sum(len(t.shape) for t in sg.tensors)
    assert dims <= len(fm.shapes) <= 2 * dims
    assert len(fm.indices) >= sum(len(n.inputs) + len(n.outputs) for n in sg.nodes)
    assert len(fm.lengths) >= len(sg.tensors) and fm.offsets and fm.vtable
    for pos in fm.shapes + fm.indices + fm.lengths + fm.offsets:
        assert 0 <= pos <= len(data) - 4


def test_mutations_change_the_bytes(models) -> None:
    data = models[0].read_bytes()
    fm = mutation.field_map(data)
    rng = random.Random(3)
    for kind in mutation.MUTATIONS:
        changed = 0
        for _ in range(20):
            mutated, what = mutation.mutate(data, fm, rng, kind)
            assert what
            changed += mutated != data  # a field may by chance be set to the value it had
        assert changed >= 15, kind


def test_worker_tells_outcomes_apart(models) -> None:
    worker = mutation._Worker(memory_limit=4 << 30, max_while=1000, start_timeout=120)
    try:
        good = models[0].read_bytes()
        assert worker.run(good[:100], 0, 60)["outcome"] == "error"
        assert worker.run(good, 0, 60)["outcome"] in ("ok", "error")  # error: an op not implemented yet
        assert worker.alive
    finally:
        worker.kill()


def test_worker_death_is_a_crash_and_a_slow_case_a_hang(models) -> None:
    worker = mutation._Worker(memory_limit=4 << 30, max_while=1000, start_timeout=120)
    try:
        worker.proc.kill()  # as a segfault would
        worker.proc.wait()
        assert worker.run(models[0].read_bytes(), 0, 30)["outcome"] == "crash"
        assert not worker.alive
    finally:
        worker.kill()
    worker = mutation._Worker(memory_limit=4 << 30, max_while=1000, start_timeout=120)
    try:
        # A header promising more bytes than are sent: the worker waits, like a hung case.
        worker.proc.stdin.write(b"100 0\n")
        answer = worker.run(b"", 0, 0.5)
        assert answer["outcome"] == "hang"
        assert not worker.alive  # a hung worker is killed, to be restarted
    finally:
        worker.kill()


def test_mutation_run_default(models) -> None:
    report = mutation.run_mutations(models, cases=400, seed=20240601, timeout=30, time_budget=50)
    assert report.cases >= 100
    assert report.counts["ok"] + report.counts["error"] == report.cases - report.bad
    _assert_clean(report)


def test_cli_runs_and_reports(models) -> None:
    proc = subprocess.run([sys.executable, "-m", "litegpu.testing.mutation", "--cases", "30", "--seed", "5",
                           "--models", "dynamic_batch_mlp,stateful_counter"],
                          capture_output=True, text=True, timeout=300)
    assert "30 cases" in proc.stdout, proc.stdout + proc.stderr
    assert proc.returncode in (0, 1)
    assert proc.returncode == (0 if " raw 0, crash 0, hang 0" in proc.stdout else 1)


def test_schedule_weights_models_by_size(models) -> None:
    assert mutation._schedule(3, None) == [0, 1, 2]
    # Round r takes every model whose weight exceeds r: weights 2, 1, 3.
    assert mutation._schedule(3, [2, 1, 3]) == [0, 1, 2, 0, 2, 2]
    with pytest.raises(ValueError):
        mutation._schedule(2, [1, 0])
    weights = mutation.size_weights(models, big=models[0].stat().st_size)
    assert weights[0] == 5 and all(w in (1, 5) for w in weights)
    everything = mutation.resolve_models(["all"])
    assert set(models) <= set(everything) and all(p.suffix == ".tflite" for p in everything)


def test_weighted_run_counts_cases_per_model(models) -> None:
    report = mutation.run_mutations(models[:2], cases=9, seed=3, timeout=30, weights=[2, 1])
    assert dict(report.by_model) == {models[0].stem: 6, models[1].stem: 3}
    _assert_clean(report)


@pytest.mark.slow
def test_mutation_run_slow() -> None:
    # Every shared model, the large ones (tens of MB, slow to compile and run whole) with
    # one case for every five of a small one: 10,000 cases in several minutes.
    try:
        every = mutation.resolve_models(["all"])
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    report = mutation.run_mutations(every, cases=10_000, seed=7, timeout=30, weights=mutation.size_weights(every))
    assert report.cases == 10_000
    assert set(report.by_model) == {p.stem for p in every}
    _assert_clean(report)
