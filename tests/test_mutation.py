"""Mutation test: many broken copies of real models, through load + allocate + invoke.

Every case must end in success or a clean LiteGpuError: no raw exception, no crash
of the worker process, no hang. The default run is a few hundred cases; the slow
run is several thousand.
"""
from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import litegpu
from litegpu.testing import mutation
from litegpu.testing.builder import ModelBuilder
from litegpu.testing.shared_models import NONE

import built_models

SMALL_MODELS = ("dynamic_batch_mlp", "elementwise_200", "stateful_counter", "lstm_classifier", "unet_small")


@pytest.fixture(scope="module")
def models(shared_model) -> list[Path]:
    """The small shared models (control flow, variables, a UNet among them), through the
    ``shared_model`` fixture: a skip saying where it looked, or a failure where required."""
    return [shared_model(name) for name in SMALL_MODELS]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> list[Path]:
    """Models of tests/built_models.py as files, for the tests of the machinery itself:
    they run everywhere, the shared models or not."""
    folder = tmp_path_factory.mktemp("built")
    paths = []
    for name in ("mlp", "elementwise", "segmenter"):
        paths.append(folder / f"{name}.tflite")
        paths[-1].write_bytes(getattr(built_models, name)())
    return paths


def _assert_clean(report: mutation.Report) -> None:
    print(report.summary())
    assert report.counts["crash"] == 0, report.summary()
    assert report.counts["hang"] == 0, report.summary()
    assert report.counts["raw"] == 0, report.summary()


def test_field_map_finds_the_fields(built) -> None:
    data = built[0].read_bytes()
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


def test_mutations_change_the_bytes(built) -> None:
    data = built[0].read_bytes()
    fm = mutation.field_map(data)
    rng = random.Random(3)
    for kind in mutation.MUTATIONS:
        changed = 0
        for _ in range(20):
            mutated, what = mutation.mutate(data, fm, rng, kind)
            assert what
            changed += mutated != data  # a field may by chance be set to the value it had
        assert changed >= 15, kind


def test_worker_tells_outcomes_apart(built) -> None:
    worker = mutation._Worker(memory_limit=4 << 30, max_while=1000, start_timeout=120)
    try:
        good = built[0].read_bytes()
        assert worker.run(good[:100], 0, 60)["outcome"] == "error"
        assert worker.run(good, 0, 60)["outcome"] in ("ok", "error")  # error: an op not implemented yet
        assert worker.alive
    finally:
        worker.kill()


def test_worker_death_is_a_crash_and_a_slow_case_a_hang(built) -> None:
    worker = mutation._Worker(memory_limit=4 << 30, max_while=1000, start_timeout=120)
    try:
        worker.proc.kill()  # as a segfault would
        worker.proc.wait()
        assert worker.run(built[0].read_bytes(), 0, 30)["outcome"] == "crash"
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


def test_mutation_run_on_built_and_real_models(built, real_model) -> None:
    """The default run's checks on models any machine has: the built ones and two fetched
    real ones (an IF with its two subgraphs, and a face detector with fp16 weights)."""
    models = [*built, real_model("oww_hey_jarvis"), real_model("blazeface_short_range")]
    report = mutation.run_mutations(models, cases=300, seed=20240602, timeout=30, time_budget=40)
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


def test_schedule_weights_models_by_size(built) -> None:
    assert mutation._schedule(3, None) == [0, 1, 2]
    # Round r takes every model whose weight exceeds r: weights 2, 1, 3.
    assert mutation._schedule(3, [2, 1, 3]) == [0, 1, 2, 0, 2, 2]
    with pytest.raises(ValueError):
        mutation._schedule(2, [1, 0])
    weights = mutation.size_weights(built, big=built[0].stat().st_size)
    assert weights[0] == 5 and all(w in (1, 5) for w in weights)


def test_all_resolves_to_every_shared_model(models) -> None:
    everything = mutation.resolve_models(["all"])
    assert set(models) <= set(everything) and all(p.suffix == ".tflite" for p in everything)


def test_weighted_run_counts_cases_per_model(built) -> None:
    report = mutation.run_mutations(built[:2], cases=9, seed=3, timeout=30, weights=[2, 1])
    assert dict(report.by_model) == {built[0].stem: 6, built[1].stem: 3}
    _assert_clean(report)


def _quantized_model(tmp_path: Path) -> Path:
    """A small int8 conv model written with every quantization field (per-channel weights, axis)."""
    b = ModelBuilder()
    x = b.input("x", (1, 3, 3, 2), np.int8, scale=0.5, zero_point=-3)
    w = b.const("w", np.ones((4, 1, 1, 2), np.int8), scale=[0.1, 0.2, 0.3, 0.4], zero_point=[0] * 4,
                quantized_dimension=0)
    bias = b.const("bias", np.zeros(4, np.int32), scale=[0.05, 0.1, 0.15, 0.2], zero_point=[0] * 4)
    y = b.tensor("y", (1, 3, 3, 4), np.int8, scale=0.25, zero_point=5)
    b.op("CONV_2D", [x, w, bias], [y], padding="SAME", stride_w=1, stride_h=1)
    b.output(y)
    path = tmp_path / "conv_int8.tflite"
    path.write_bytes(b.build())
    return path


@pytest.mark.parametrize("source", ["built", "unet_small_int16x8"])
def test_field_map_finds_the_quantization_fields(tmp_path, shared_model, source) -> None:
    built = _quantized_model(tmp_path)
    paths = [built] if source == "built" else [shared_model(source)]
    for path in paths:
        data = path.read_bytes()
        fm = mutation.field_map(data)
        quants = [t.quantization for sg in litegpu.load_model(data).subgraphs for t in sg.tensors if t.quantization]
        scales = np.concatenate([q.scales for q in quants])
        zero_points = np.concatenate([q.zero_points for q in quants])
        assert sorted(np.frombuffer(data, "<f4", 1, p)[0] for p in fm.scales) == sorted(scales)
        assert sorted(np.frombuffer(data, "<i8", 1, p)[0] for p in fm.zero_points) == sorted(zero_points)
    # The built model writes quantized_dimension on each of its four tensors (converters elide a 0).
    assert len(mutation.field_map(built.read_bytes()).quant_dims) == 4


def test_quantization_mutations_edit_their_fields(tmp_path) -> None:
    data = _quantized_model(tmp_path).read_bytes()
    fm = mutation.field_map(data)
    rng = random.Random(5)
    fields = {"scale": fm.scales, "zero_point": fm.zero_points, "quant_dim": fm.quant_dims}
    described = {"scale": "scale at", "zero_point": "zero point at", "quant_dim": "quantized_dimension at"}
    for kind in mutation.QUANT_MUTATIONS:
        changed = 0
        for _ in range(20):
            mutated, what = mutation.mutate(data, fm, rng, kind)
            diff = [i for i in range(len(data)) if mutated[i] != data[i]]
            assert what.startswith(described[kind]), what
            assert all(any(p <= i < p + 8 for p in fields[kind]) for i in diff), (kind, what)
            changed += bool(diff)
        assert changed >= 15, kind


def test_quantization_mutation_run(tmp_path, shared_model) -> None:
    models = [_quantized_model(tmp_path), shared_model("unet_small_int16x8")]
    report = mutation.run_mutations(models, cases=120, seed=11, timeout=30, kinds=mutation.QUANT_MUTATIONS)
    _assert_clean(report)
    assert set(report.by_mutation) == set(mutation.QUANT_MUTATIONS)
    # The reader refused some edits by naming a quantization field.
    assert "quantization." in report.error_examples.get("ModelFormatError", ""), report.summary()
    with pytest.raises(ValueError, match="unknown mutation kinds"):
        mutation.run_mutations(models, cases=1, kinds=["scale", "nonsense"])


@pytest.mark.slow
def test_mutation_run_slow(shared_model) -> None:
    # Every shared model, the large ones (tens of MB, slow to compile and run whole) with
    # one case for every five of a small one: 10,000 cases in several minutes.
    shared_model(NONE)
    every = mutation.resolve_models(["all"])
    report = mutation.run_mutations(every, cases=10_000, seed=7, timeout=30, weights=mutation.size_weights(every))
    assert report.cases == 10_000
    assert set(report.by_model) == {p.stem for p in every}
    _assert_clean(report)
