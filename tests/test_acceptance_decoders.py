"""benchmarks/acceptance_decoders.py and ``gpu_acceptance.py --decoders``: the GPU machine's
second call, which times litegpu's generation against LiteRT-LM's on carried bundles.

Like the models run, it must work the first time there. Here the hollow-and-refill path of
the 100M bundles is checked byte for byte on a tiny bundle (with a lower size threshold), and
a --quick decoders run goes end to end on a tiny bundle: litegpu's cpu and opencl rows against
LiteRT's carried answers, LiteRT-LM's CPU row from the exporter's environment, and LiteRT-LM's
GPU row reported as not run, with why.
"""
from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_acceptance.py"
QUICK_LIMIT_S = 420   # ~1-2 min here (opencl compiles the decoder's kernels); the limit only stops a hang


@pytest.fixture(scope="module")
def carry():
    """benchmarks/acceptance_decoders.py as a module (benchmarks/ stays off sys.path)."""
    spec = importlib.util.spec_from_file_location("acceptance_decoders", REPO / "benchmarks" / "acceptance_decoders.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # its dataclass looks its module up while it loads
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_fill_codes_are_fixed_and_spread_like_weights(carry):
    codes = carry.fill_codes("int8", 1000, 1 << 16).view(np.int8)
    assert np.array_equal(codes, carry.fill_codes("int8", 1000, 1 << 16).view(np.int8))
    # The same bytes whatever the chunking: a byte's code depends on its position only.
    assert np.array_equal(codes[5000:6000].view(np.uint8), carry.fill_codes("int8", 6000, 1000))
    assert codes.min() == -63 and codes.max() == 63
    assert abs(codes.mean()) < 0.5 and 22 < codes.std() < 30
    packed = carry.fill_codes("int4", 0, 1 << 16)
    nibbles = np.concatenate([packed & 0xF, packed >> 4]).astype(np.int8)
    signed = np.where(nibbles > 7, nibbles - 16, nibbles)
    assert signed.min() == -7 and signed.max() == 7 and abs(signed.mean()) < 0.05
    scales = carry.fill_codes("scale16", 4096, 1 << 14).view(np.float16).astype(np.float32)
    assert scales.min() >= 0.006 and scales.max() <= 0.0141 and scales.std() > 0.002


@pytest.mark.parametrize("name, kinds", [("llama_int8_dynamic_comp", {"int8"}),
                                         ("llama_int4_block32_comp", {"int4", "scale16"})])
def test_a_hollow_bundle_refills_to_weights_litegpu_reads(name, kinds, carry, decoder, tmp_path, monkeypatch):
    """Every weight buffer (over a lowered threshold) of a tiny bundle, and the fp16 scales of
    blockwise int4 weights, go out zeroed and come back as the fill; everything else is the
    exported bytes, and litegpu reads the refilled weights."""
    from litegpu.lm.bundle import Bundle
    bundle = decoder(name, ".litertlm")
    monkeypatch.setattr(carry, "HOLLOW_MIN_BYTES", 1024)
    original = bundle.read_bytes()
    gz = tmp_path / "b.litertlm.gz"
    recipe = carry.hollow(bundle, gz)
    assert {r["kind"] for r in recipe["ranges"]} == kinds
    section = Bundle.open(bundle).model_section()
    hollowed = np.frombuffer(gzip.decompress(gz.read_bytes()), np.uint8)
    filled = np.frombuffer(carry.refill(gz, recipe, tmp_path / "b.litertlm").read_bytes(), np.uint8)
    changed = np.zeros(len(original), bool)
    for r in recipe["ranges"]:
        assert section.begin <= r["offset"] and r["offset"] + r["bytes"] <= section.end
        changed[r["offset"]:r["offset"] + r["bytes"]] = True
        assert not hollowed[r["offset"]:r["offset"] + r["bytes"]].any()
        assert np.array_equal(filled[r["offset"]:r["offset"] + r["bytes"]],
                              carry.fill_codes(r["kind"], r["offset"], r["bytes"]))
    before = np.frombuffer(original, np.uint8)
    assert np.array_equal(filled[~changed], before[~changed]) and np.array_equal(hollowed[~changed], before[~changed])
    model = Bundle.open(tmp_path / "b.litertlm").load_model()
    weights = max((t for sg in model.subgraphs for t in sg.tensors if t.data is not None and t.dtype == np.int8),
                  key=lambda t: t.data.size)
    if "int8" in kinds:   # the largest int8 constant holds the codes of its bytes
        start = next(r["offset"] for r in recipe["ranges"] if r["bytes"] == weights.data.size)
        codes = carry.fill_codes("int8", start, weights.data.size)
        assert np.array_equal(weights.data.reshape(-1).view(np.uint8), codes)
    else:                 # the int4 codes unpack within [-7, 7], and their block scales are the filled ones
        assert weights.data.min() == -7 and weights.data.max() == 7
        scales = weights.quantization.scales
        assert scales.min() >= 0.006 and scales.max() <= 0.0141
    # A recipe that does not give the recorded bytes is refused.
    bad = {**recipe, "sha256": hashlib.sha256(b"other").hexdigest()}
    with pytest.raises(ValueError, match="sha256"):
        carry.refill(gz, bad, tmp_path / "c.litertlm")


@pytest.fixture(scope="module")
def decoders_run(tmp_path_factory, carry, decoder, litert_lm_python):
    """``prepare`` on one tiny bundle, then one --quick --decoders run: (report.md, results.json)."""
    tmp = tmp_path_factory.mktemp("decoders")
    carry.prepare(tmp / "wheelhouse", [("tiny_llama", decoder("llama_int4_block32_comp", ".litertlm"), False)])
    cmd = [sys.executable, str(SCRIPT), "--decoders", "--quick", "--budget", "360", "--workdir", str(tmp / "work"),
           "--out", str(tmp / "out"), "--wheelhouse", str(tmp / "wheelhouse"),
           "--litert-lm-python", str(litert_lm_python), "--parts", "decoders cpu,decoders opencl,litert-lm"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=QUICK_LIMIT_S, cwd=tmp)
    assert res.returncode == 0, res.stderr[-3000:]
    report = (tmp / "out" / "report.md").read_text()
    assert report.strip() in res.stdout
    return report, json.loads((tmp / "out" / "results.json").read_text())


def test_decoders_run_gives_litert_s_tokens_and_speeds(decoders_run):
    report, results = decoders_run
    assert "## Decoders against LiteRT-LM" in report and "## Not run" in report
    assert [d["name"] for d in results["decoders"]] == ["tiny_llama"]
    shape = results["decoders"][0]["shape"]
    assert shape["prefill"] == 16 and shape["cache"] == 128 and shape["decode"] == 64 and shape["params"] > 1e5
    cpu = results["decoder_rows"]["cpu"]["tiny_llama"]
    assert "error" not in cpu, cpu
    # The cpu backend computes LiteRT's bits: every greedy step agrees, the logits are equal.
    assert cpu["accuracy"]["agree"] == cpu["accuracy"]["steps"] == 8 and cpu["accuracy"]["max_abs"] == 0
    assert cpu["prefill_tok_s"] > 0 and cpu["decode_tok_s"] > 0
    lm = results["decoder_rows"]["litert-lm-cpu"]["tiny_llama"]
    assert "error" not in lm, lm
    assert lm["prefill_tok_s"] > 0 and lm["decode_tok_s"] > 0
    row = next(line for line in report.splitlines() if line.startswith("| tiny_llama | cpu |"))
    assert f"{cpu['decode_tok_s'] / lm['decode_tok_s']:.2f}" in row


def test_decoders_run_on_a_gpu_backend(decoders_run, opencl):
    """opencl (PoCL here) runs the same worker path cuda runs there, and says it ran on a CPU."""
    report, results = decoders_run
    row = results["decoder_rows"]["opencl"]["tiny_llama"]
    assert "error" not in row, row
    assert row["accuracy"]["agree"] == row["accuracy"]["steps"] and row["accuracy"]["max_rel"] < 5e-3
    assert "| tiny_llama | opencl (CPU device) |" in report
    # What a decode step launched there (the report's diagnostics for a GPU's numbers): a
    # tiny llama's two layers are at least norm and products, attention and cache writes.
    assert row["decode_step"]["launches"] > 10 and f"- tiny_llama, opencl: {row['decode_step']['launches']} launches, " \
        "KV cache in place" in report


def test_decoders_run_says_why_litert_lm_gpu_did_not_run(decoders_run):
    _, results = decoders_run
    outcome = next(o for o in results["outcomes"] if o["part"] == "decoders litert-lm-gpu")
    if results["gpu"]:
        pytest.skip("this machine has an NVIDIA GPU: LiteRT-LM's GPU backend ran")
    assert outcome["status"] == "not run" and "no NVIDIA GPU" in outcome["detail"]
