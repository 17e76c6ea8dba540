"""The shared dynamic-range model, tiny_bert_dynamic, on litegpu's cpu backend against LiteRT.

Its 12 hybrid FULLY_CONNECTED nodes (int8 weights per channel, asymmetric input
quantization) run litegpu's hybrid references (litegpu.ops.hybrid), its int8 GATHER and
DEQUANTIZE the integer ones, everything else the float ones.

Two checks, because dynamic quantization is not continuous:

- node by node, each hybrid node fed LiteRT's own inputs (its intermediate tensors) gives
  LiteRT's output bit for bit (within the 4 ulps tests/test_ops_hybrid.py allows);
- end to end, the logits agree to float rounding on most inputs (measured over 40
  inputs: median relative difference 1.4e-7) but not all: the float ops between the
  hybrid nodes (SOFTMAX, GELU, MEAN, RSQRT) differ from XNNPACK's by about 1e-7
  relative, and now and then that moves a value across a rounding boundary of the next
  node's on-the-fly int8 quantization, a step of 1/255 of that row's range. The largest
  difference measured was 8.6e-4 of the largest logit (1.2e-3 in another sample), so
  the end-to-end bound is 1e-2 of the largest logit, with a median bound of 1e-5.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import litegpu
from litegpu.ops import get_op

from ai_edge_litert.interpreter import Interpreter as LiteRT  # a test dependency: never skipped

END_TO_END = 1e-2          # of the largest logit, on any input (see the module docstring)
END_TO_END_MEDIAN = 1e-5   # of the largest logit, the median over the inputs


@pytest.fixture
def model_path(shared_model) -> str:
    return str(shared_model("tiny_bert_dynamic"))


def token_ids(rng, padded: bool) -> np.ndarray:
    """A [1, 64] int32 batch of token ids in the vocabulary (1000), padded with zeros."""
    x = rng.integers(0, 1000, (1, 64)).astype(np.int32)
    if padded:
        x[:, rng.integers(1, 64):] = 0
    return x


@pytest.mark.filterwarnings("ignore:Warning. Enabling `experimental_preserve_all_tensors`")
def test_hybrid_nodes_match_litert_bit_for_bit(model_path: str) -> None:
    data = Path(model_path).read_bytes()
    sg = litegpu.load_model(data).subgraphs[0]
    tensors = sg.tensors
    theirs = LiteRT(model_content=data, experimental_preserve_all_tensors=True)
    theirs.allocate_tensors()
    rng = np.random.default_rng(5)
    hybrid_nodes = 0
    for padded in (False, True):
        theirs.set_tensor(theirs.get_input_details()[0]["index"], token_ids(rng, padded))
        theirs.invoke()
        for node in sg.nodes:
            opdef = get_op(node.op)
            attrs = opdef.node_attrs(node, tensors)
            if not attrs.get("hybrid"):
                continue
            hybrid_nodes += 1
            inputs = [None if t < 0 else (tensors[t].data if tensors[t].data is not None else theirs.get_tensor(t))
                      for t in node.inputs]
            got = opdef.reference_for(attrs)(inputs, attrs)[0]
            want = theirs.get_tensor(node.outputs[0])
            assert got.shape == want.shape and got.dtype == want.dtype
            peak = np.float32(np.abs(want).max())
            diff = float(np.abs(got.astype(np.float64) - want).max())
            assert diff <= 4 * float(np.spacing(peak)), f"node {node.index} ({node.op}): max |diff| {diff:g}"
    assert hybrid_nodes == 2 * 12


def test_model_matches_litert(model_path: str) -> None:
    ours = litegpu.Interpreter(model_path=model_path)
    theirs = LiteRT(model_path=model_path)
    for interp in (ours, theirs):
        interp.allocate_tensors()
    report = ours.get_delegation_report()
    assert report.nodes_on("cpu") == len(report.assignments)
    rng = np.random.default_rng(0)
    errors = []
    for trial in range(12):
        x = token_ids(rng, padded=trial % 3 == 1)
        results = []
        for interp in (ours, theirs):
            interp.set_tensor(interp.get_input_details()[0]["index"], x)
            interp.invoke()
            results.append(interp.get_tensor(interp.get_output_details()[0]["index"]).copy())
        got, want = results
        assert got.shape == want.shape == (1, 2) and got.dtype == want.dtype == np.float32
        errors.append(float(np.abs(got - want).max() / np.abs(want).max()))
    assert max(errors) <= END_TO_END, errors
    assert float(np.median(errors)) <= END_TO_END_MEDIAN, errors
