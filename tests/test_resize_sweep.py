"""The resize sweep: litegpu refuses where LiteRT refuses and agrees where LiteRT runs.

The default run sweeps a subset (small shared models and a spread of conformance cases)
on cpu and opencl; ``-m slow`` runs every shared model and the default case set. The cases
are built, so they run everywhere; the shared models' sweep skips, saying so, where they
are not here (or fails where the run requires them).
"""
from __future__ import annotations

import numpy as np
import pytest

from litegpu.testing import resize_sweep as rs
from litegpu.testing.shared_models import NONE


FAST_SHARED = ("dynamic_batch_mlp", "elementwise_200", "tiny_bert", "lstm_classifier", "stateful_counter")
FAST_CASES = ("CONV_2D-stride2-same-relu6", "CONV_2D-grouped2", "DEPTHWISE_CONV_2D-multiplier2",
              "DEPTHWISE_CONV_2D-tanh-ignored-k2x3", "TRANSPOSE_CONV-stride2-same", "TRANSPOSE_CONV-stride2-valid",
              "FULLY_CONNECTED-keep-num-dims", "BATCH_MATMUL-*", "CONCATENATION-*", "RESHAPE-*", "GATHER-*",
              "ADD-f32-bcast-*", "MUL-*", "MAX_POOL_2D-global-valid", "AVERAGE_POOL_2D-f3s2-same", "PAD-*",
              "STRIDED_SLICE-shrink", "MEAN-*", "SOFTMAX-*", "RESIZE_BILINEAR-size-from-input", "LSTM-basic",
              "BATCH_TO_SPACE_ND-*", "FILL-*", "ARG_MAX-f32-rank1")


def _failures(results) -> list[str]:
    return [f"{r.outcome}: {r.model} [{r.backend}] {r.variant} {r.shapes}: {r.detail}"
            for r in results if r.outcome in rs.FAILURES]


def test_variants_change_each_dim_and_the_rank():
    names = [n for n, _ in rs.resize_variants([(1, 4)])]
    assert {"in0.d0+1", "in0.d1-1", "in0.d1x2", "in0.d1=0", "in0.rank+1(lead)", "in0.rank-1(first)"} <= set(names)
    assert all(shapes != [(1, 4)] for _, shapes in rs.resize_variants([(1, 4)]))


def test_classify_counts_silent_runs_raw_errors_and_over_refusals():
    ran = rs.Outcome("ran", [np.ones(3, np.float32)])
    refused = rs.Outcome("refused", error="no")
    x = [np.ones(3, np.float32)]
    assert rs.classify(refused, refused, x)[0] == "agree-refused"
    assert rs.classify(ran, ran, x)[0] == "agree-ran"
    assert rs.classify(refused, ran, x)[0] == "silent"
    assert rs.classify(ran, refused, x)[0] == "over-refusal"
    assert rs.classify(ran, rs.Outcome("raw", error="ValueError"), x)[0] == "raw"
    assert rs.classify(ran, rs.Outcome("ran", [np.ones(3, np.float32) * 2]), x)[0] == "silent"
    empty = [np.ones((0, 3), np.float32)]
    assert rs.classify(refused, rs.Outcome("ran", [np.ones((0, 2), np.float32)]), empty)[0] == "empty-ok"


# The default run: a subset on each backend, under a minute on two cores. opencl takes a
# smaller one, since PoCL compiles a kernel for each resized shape; it still covers the
# convolutions, a matmul, the pools (and their divisor), a reduction over an empty axis,
# broadcasts, a constant-size SLICE, integer division and run-time gather indices (both
# left to cpu), an empty image to resize and an LSTM.
FAST_CASES_OPENCL = ("CONV_2D-grouped2", "DEPTHWISE_CONV_2D-multiplier2", "TRANSPOSE_CONV-stride2-same",
                     "FULLY_CONNECTED-keep-num-dims", "BATCH_MATMUL-rank5", "AVERAGE_POOL_2D-global-valid",
                     "MAX_POOL_2D-f3s2-same", "REDUCE_MAX-f32-hw-keep", "PRELU-full-shape", "SLICE-size-minus1",
                     "ADD-f32-bcast-both", "DIV-int32-truncates", "GATHER-indices-at-runtime",
                     "RESIZE_BILINEAR-up2x", "CONCATENATION-*", "LSTM-basic")
SUBSETS = {"cpu": (FAST_SHARED, FAST_CASES), "opencl": (("dynamic_batch_mlp",), FAST_CASES_OPENCL)}


def test_resize_sweep_subset(backend_name):
    _, cases = SUBSETS[backend_name]
    models = rs.conformance_models(cases)
    assert models
    tallies, results = rs.sweep(models, [backend_name])
    assert sum(t.tried for t in tallies) > (100 if backend_name == "cpu" else 40)
    assert not _failures(results), "\n".join(_failures(results)[:30])


def test_resize_sweep_shared_subset(backend_name, shared_model):
    shared, _ = SUBSETS[backend_name]
    for name in shared:
        shared_model(name)
    models = rs.shared_models(shared)
    assert sorted(m.name for m in models) == sorted(shared)
    tallies, results = rs.sweep(models, [backend_name])
    assert all(t.tried for t in tallies if not t.skip), [(t.model, t.skip) for t in tallies]
    assert not _failures(results), "\n".join(_failures(results)[:30])


@pytest.mark.slow
@pytest.mark.parametrize("models", ["cases", "shared"])
def test_resize_sweep_full(backend_name, shared_model, models):
    if models == "shared":
        shared_model(NONE)
    tallies, results = rs.sweep(rs.shared_models() if models == "shared" else rs.conformance_models(),
                                [backend_name])
    print(rs.format_table(tallies))
    assert not _failures(results), "\n".join(_failures(results)[:50])
