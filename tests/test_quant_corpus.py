"""A small part of the quantized corpus (benchmarks/quant_corpus.py) in the default suite.

Three small architectures the shared models do not have — a DS-CNN keyword spotter, a
CRNN (GRU) audio model and a transformer encoder — in four of the kinds TensorFlow's
converter makes (full-integer int8 with float I/O, uint8 I/O, 16x8, dynamic-range), each
run on the cpu backend against LiteRT on the same seeded input: integer outputs within a
quantum, float outputs within 5e-3 of the output's quantum (dynamic-range: 5e-3
relative), and no node running a numpy reference.

The files are made with TensorFlow (never a dependency of litegpu) and cached outside the
repository; where they are not made, the tests skip saying how to make them, or fail
where the run requires ``corpus`` (CI makes them first: see .ci/run).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import litegpu
from ai_edge_litert.interpreter import Interpreter as LiteRT  # a test dependency: never skipped

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from quant_corpus import _inputs, _quantum, corpus_dir, outputs  # noqa: E402

MODELS = ("ds_cnn", "crnn", "transformer")
KINDS = ("int8", "uint8io", "16x8", "dynamic")
MAKE = f"python benchmarks/quant_corpus.py make --models {' '.join(MODELS)} --kinds {' '.join(KINDS)}"
# The converter makes no 16x8 transformer (it refuses the int16 BATCH_MATMUL).
CASES = [(m, k) for m in MODELS for k in KINDS if (m, k) != ("transformer", "16x8")]


@pytest.fixture
def corpus_file(skip_unless_required):
    def find(model: str, kind: str) -> Path:
        path = corpus_dir() / f"{model}.{kind}.tflite"
        if not path.exists():
            skip_unless_required("corpus", f"no corpus file {path.name} in {corpus_dir()} (make it with "
                                           f"`{MAKE}`, which needs tensorflow-cpu)")
        return path
    return find


@pytest.mark.parametrize("model,kind", CASES, ids=[f"{m}.{k}" for m, k in CASES])
def test_corpus_model_matches_litert_without_references(corpus_file, model: str, kind: str) -> None:
    path = corpus_file(model, kind)
    theirs = LiteRT(model_path=str(path), num_threads=2)
    ours = litegpu.Interpreter(model_path=str(path), num_threads=2)
    for interp in (ours, theirs):
        interp.allocate_tensors()
    x = _inputs(theirs.get_input_details(), 7)
    quantum = _quantum(path)
    for got, want in zip(outputs(ours, x), outputs(theirs, x)):
        got, want = got.astype(np.float64), want.astype(np.float64)
        assert got.shape == want.shape
        if quantum:
            assert np.abs(got - want).max() <= (1 if quantum == 1 else 5e-3 * quantum)
        else:
            assert np.abs(got - want).max() <= 5e-3 * np.abs(want).max()
    report = ours.get_delegation_report()
    assert not report.reference_nodes(), report.reference_nodes()
