"""litert-torch's composites as fused ops (litegpu.ops.composite): each conformance model
lowers to one fused node, runs the fused kernels, and matches LiteRT (on AVX-512F hosts, the
cpu rms norm to the bit); composites the fused ops do not take run their decomposition,
with the reason in the reader's log; the decoders CI exports fuse every composite.

The conformance suite (``pytest --pyargs litegpu.testing.conformance_suite -k odml``)
compares the values on every backend; here is what it cannot see."""
from __future__ import annotations

import logging
import math
import os
from pathlib import Path

import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter as LiteRT
from flatbuffers import flexbuffers

import litegpu
from litegpu.model import load_model
from litegpu.ops import get_op
from litegpu.testing.builder import ModelBuilder
from litegpu.testing.cases import composite as cases
from litegpu.testing.cases.composite import RMS_NORM, SDPA, causal_mask, composite_model, rms_norm_decomposition

F32 = np.float32
RNG = np.random.default_rng(5)
CASES = {c.id: c for c in cases.CASES}


def _run(make, data: bytes, feeds: list[np.ndarray]):
    it = make(data)
    it.allocate_tensors()
    for d, v in zip(it.get_input_details(), feeds):
        it.set_tensor(d["index"], v)
    it.invoke()
    return it, it.get_tensor(it.get_output_details()[0]["index"])


def _litert(data: bytes, feeds: list[np.ndarray]) -> np.ndarray:
    return _run(lambda d: LiteRT(model_content=d), data, feeds)[1]


def _litegpu(data: bytes, feeds: list[np.ndarray], backend: str = "cpu"):
    delegate = litegpu.load_delegate(backend)
    it, out = _run(lambda d: litegpu.Interpreter(model_content=d, experimental_delegates=[delegate]), data, feeds)
    return out, it.get_delegation_report()


def _fused_ops(data: bytes) -> list[str]:
    return [n.op for n in load_model(data).subgraphs[0].nodes]


@pytest.mark.parametrize("case", cases.CASES, ids=lambda c: c.id)
def test_each_case_is_one_fused_node_run_by_its_cpu_kernel(case):
    data, feeds = case.build()
    assert _fused_ops(data) == [case.op]
    got, report = _litegpu(data, feeds)
    kernel = {RMS_NORM: "composite.rms_norm", SDPA: "composite.attention"}[case.op]
    assert report.kernels == [(0, case.op, "cpu", kernel)]
    want = _litert(data, feeds)
    assert np.abs(got - want).max() <= 1e-6 * max(np.abs(want).max(), 1)


@pytest.mark.parametrize("case", [c for c in cases.CASES if c.op == RMS_NORM], ids=lambda c: c.id)
def test_the_cpu_rms_norm_has_litert_s_bits_on_avx512f(case):
    """Every width: XNNPACK's fused sum of squares, its blocks of 64 and 16 and the tail."""
    from litegpu_cpu.kernels.xnn_order import RSUM_MATCHES_LITERT
    if not RSUM_MATCHES_LITERT:
        pytest.skip("not an AVX-512F host: LiteRT's XNNPACK rms norm is another kernel here")
    data, feeds = case.build()
    np.testing.assert_array_equal(_litegpu(data, feeds)[0], _litert(data, feeds))


@pytest.mark.parametrize("args", [("prefill", 8, 256, 4, 2, 16, 70, None), ("decode-cap", 1, 320, 4, 1, 16, 100, 3.0),
                                  ("decode-first", 1, 128, 4, 2, 32, 0, None)], ids=lambda a: a[0])
def test_the_cpu_attention_skips_hidden_keys_without_changing_a_bit(args):
    """A mask of -inf leaves the keys past the last visible block out of the cpu kernel's
    products and softmax; the same mask with float32's lowest finite value instead hides
    them only through exp(): every key is taken. The two give the same bits."""
    from litegpu.testing.cases.composite import sdpa_case
    variant, t, s, heads, kv_heads, dim, start, cap = args
    data, feeds = sdpa_case(variant, t, s, heads, kv_heads, dim, start=start, logit_cap=cap).build()
    finite = feeds[:3] + [np.where(feeds[3] == -np.inf, np.finfo(F32).min, feeds[3]).astype(F32)]
    assert (feeds[3] == -np.inf).any()
    outs = []
    for mask_feeds in (feeds, finite):
        got, report = _litegpu(data, mask_feeds)
        assert report.kernels == [(0, SDPA, "cpu", "composite.attention")]
        outs.append(got)
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("case_id", [f"{RMS_NORM}-prefill16", f"{SDPA}-decode-gqa4x2", f"{SDPA}-prefill-logit-cap"])
def test_the_fused_node_runs_on_each_backend(backend, case_id):
    """The conformance suite skips a node a backend refuses; here refusing is a failure."""
    data, feeds = CASES[case_id].build()
    got, report = _litegpu(data, feeds, backend)
    assert report.nodes_on(backend) == 1
    want = _litert(data, feeds)
    assert np.abs(got - want).max() <= 1e-5 * max(np.abs(want).max(), 1)


# -- composites the fused ops refuse run their decomposition -------------------------------------

SHAPE = (1, 4, 16)


def _scaled_rms_norm_decomposition(d):
    """litert-torch's RMSNorm(with_scale=True): a constant final scale inside the composite."""
    x, w = d.input("x", SHAPE, F32), d.input("w", SHAPE[-1:], F32)
    sq, mean = d.tensor("sq", SHAPE, F32), d.tensor("mean", SHAPE[:-1] + (1,), F32)
    d.op("MUL", [x, x], [sq])
    d.op("MEAN", [sq, d.const("axes", np.array([2], np.int32))], [mean], keep_dims=True)
    shifted, r = d.tensor("shifted", SHAPE[:-1] + (1,), F32), d.tensor("r", SHAPE[:-1] + (1,), F32)
    d.op("ADD", [mean, d.const("eps", np.full((1, 1, 1), 1e-6, F32))], [shifted])
    d.op("RSQRT", [shifted], [r])
    normed, scaled, out = (d.tensor(n, SHAPE, F32) for n in ("normed", "scaled", "out"))
    d.op("MUL", [x, r], [normed])
    d.op("MUL", [normed, d.const("final_scale", RNG.uniform(0.5, 2, SHAPE[-1:]).astype(F32))], [scaled])
    d.op("MUL", [scaled, w], [out])
    d.output(out)


def _rms_norm_model(attributes: dict, decomposition) -> tuple[bytes, list[np.ndarray]]:
    w = RNG.standard_normal(SHAPE[-1]).astype(F32)
    data = composite_model(RMS_NORM, attributes, [("x", SHAPE, None), ("w", SHAPE[-1:], w)], SHAPE, decomposition)
    return data, [RNG.standard_normal(SHAPE).astype(F32)]


def _op_adder(d):
    """``op(name, inputs, shape, **options)``: adds one op to ``d`` with a new float32 output
    of ``shape`` (named after the op and its position), and returns that output."""
    def op(name, inputs, shape, **options):
        out = d.tensor(f"{name.lower()}{len(d._sg.ops)}", shape, F32)
        d.op(name, inputs, [out], **options)
        return out
    return op


def _sdpa_unmasked_decomposition(d, q_shape, kv_shape, scale):
    """Attention of q [1, T, H, D] over k, v [1, S, H, D] without a mask input."""
    _, t, h, dim = q_shape
    s = kv_shape[1]
    q, k, v = (d.input(n, shape, F32) for n, shape in (("q", q_shape), ("k", kv_shape), ("v", kv_shape)))
    perm = d.const("perm", np.array([0, 2, 1, 3], np.int32))
    op = _op_adder(d)
    qs = op("MUL", [q, d.const("scale", np.array(scale, F32))], q_shape)
    qs = op("TRANSPOSE", [qs, perm], (1, h, t, dim))
    kt = op("TRANSPOSE", [k, perm], (1, h, s, dim))
    vt = op("TRANSPOSE", [v, perm], (1, h, s, dim))
    scores = op("BATCH_MATMUL", [qs, kt], (1, h, t, s), adj_y=True)
    probs = op("SOFTMAX", [scores], (1, h, t, s), beta=1.0)
    out = op("BATCH_MATMUL", [probs, vt], (1, h, t, dim))
    d.output(op("TRANSPOSE", [out, perm], q_shape))


def _sdpa_transposed_v_decomposition(d, q_shape, v_shape, scale):
    """Attention with v laid out [1, KV, D, S] (V transposed, as LiteRT-LM's cache is)."""
    _, t, h, dim = q_shape
    s = v_shape[3]
    q, k = d.input("q", q_shape, F32), d.input("k", (1, s, h, dim), F32)
    v, mask = d.input("v", v_shape, F32), d.input("mask", (1, 1, t, s), F32)
    perm = d.const("perm", np.array([0, 2, 1, 3], np.int32))
    op = _op_adder(d)
    qs = op("MUL", [q, d.const("scale", np.array(scale, F32))], q_shape)
    qs = op("TRANSPOSE", [qs, perm], (1, h, t, dim))
    kt = op("TRANSPOSE", [k, perm], (1, h, s, dim))
    scores = op("BATCH_MATMUL", [qs, kt], (1, h, t, s), adj_y=True)
    probs = op("SOFTMAX", [op("ADD", [scores, mask], (1, h, t, s))], (1, h, t, s), beta=1.0)
    out = op("BATCH_MATMUL", [probs, v], (1, h, t, dim), adj_y=True)
    d.output(op("TRANSPOSE", [out, perm], q_shape))


def _refused(data: bytes, feeds: list[np.ndarray], caplog, reason: str) -> None:
    """The composite was inlined (the reader logs why), and litegpu still matches LiteRT."""
    with caplog.at_level(logging.INFO, logger="litegpu.model.reader"):
        sg = load_model(data).subgraphs[0]
    assert len(sg.inlined_composites) == 1 and not any(n.op.startswith("odml.") for n in sg.nodes)
    assert reason in caplog.text, caplog.text
    got, want = _litegpu(data, feeds)[0], _litert(data, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_an_rms_norm_with_a_scale_inside_its_decomposition_runs_the_decomposition(caplog):
    data, feeds = _rms_norm_model({"epsilon": 1e-6}, _scaled_rms_norm_decomposition)
    _refused(data, feeds, caplog, "is not litert-torch's rms norm: other ops")


def test_an_rms_norm_whose_epsilon_differs_from_its_attribute_runs_the_decomposition(caplog):
    data, feeds = _rms_norm_model({"epsilon": 1e-3}, lambda d: rms_norm_decomposition(d, SHAPE, 1e-6))
    _refused(data, feeds, caplog, "it does not add epsilon 0.001")


def test_an_rms_norm_without_epsilon_runs_the_decomposition(caplog):
    data, feeds = _rms_norm_model({"eps": 1e-6}, lambda d: rms_norm_decomposition(d, SHAPE, 1e-6))
    _refused(data, feeds, caplog, "node 0 (odml.rms_norm): composite attribute 'epsilon' is missing")


def test_attention_without_a_mask_runs_the_decomposition(caplog):
    q_shape, kv_shape = (1, 3, 2, 8), (1, 5, 2, 8)
    scale = float(F32(1 / math.sqrt(8)))
    b = ModelBuilder()
    ins = [b.input(n, shape, F32) for n, shape in (("q", q_shape), ("k", kv_shape), ("v", kv_shape))]
    out = b.tensor("out", q_shape, F32)
    _sdpa_unmasked_decomposition(b.subgraph("impl"), q_shape, kv_shape, scale)
    b.op("STABLEHLO_COMPOSITE", ins, [out], name=SDPA, decomposition_subgraph_index=1,
         composite_attributes=flexbuffers.Dumps({"scale": scale}))
    b.output(out)
    feeds = [RNG.standard_normal(s).astype(F32) for s in (q_shape, kv_shape, kv_shape)]
    _refused(b.build(), feeds, caplog, "no mask")


def test_attention_with_v_transposed_runs_the_decomposition(caplog):
    q_shape, v_shape = (1, 2, 2, 8), (1, 2, 8, 6)
    scale = float(F32(1 / math.sqrt(8)))
    inputs = [("q", q_shape, None), ("k", (1, 6, 2, 8), None), ("v", v_shape, None), ("mask", (1, 1, 2, 6), None)]
    data = composite_model(SDPA, {"scale": scale}, inputs, q_shape,
                           lambda d: _sdpa_transposed_v_decomposition(d, q_shape, v_shape, scale))
    feeds = [RNG.standard_normal(s).astype(F32) for _, s, _ in inputs[:3]] + [causal_mask(2, 6, 3)]
    _refused(data, feeds, caplog, "not litert-torch's KV layout")


def test_the_ops_check_their_operands_and_attributes():
    sdpa = get_op(SDPA)
    from litegpu.ops.composite import sdpa_shape, rms_norm_shape
    from litegpu.errors import UnsupportedError
    assert sdpa_shape((1, 4, 8, 16), (1, 32, 2, 16), (1, 32, 2, 16), (1, 1, 4, 32)) == (1, 4, 8, 16)
    assert sdpa_shape((2, 4, 8, 16), (2, 32, 2, 16), (2, 32, 2, 16), (4, 32)) == (2, 4, 8, 16)
    for bad in [((1, 4, 8, 16), (1, 32, 3, 16), (1, 32, 3, 16), (1, 1, 4, 32)),      # 8 heads over 3
                ((1, 4, 8, 16), (1, 32, 2, 16), (1, 32, 2, 16), (1, 1, 4, 31)),      # mask not over S
                ((1, 4, 8, 16), (1, 32, 2, 16), (1, 32, 2, 16), (1, 3, 4, 32)),      # mask's 3 heads
                ((1, 4, 8, 16), (1, 32, 2, 16), (1, 2, 16, 32), (1, 1, 4, 32))]:     # v transposed
        with pytest.raises(UnsupportedError):
            sdpa_shape(*bad)
    with pytest.raises(UnsupportedError, match="not a vector over the last axis"):
        rms_norm_shape((1, 4, 16), (4,))
    assert sdpa.composite_check is None and get_op(RMS_NORM).composite_check is not None


# -- the decoders CI exports -----------------------------------------------------------------------

DECODERS = Path(os.environ.get("LITEGPU_DECODERS_DIR", Path.home() / ".cache" / "litegpu" / "decoders"))


@pytest.mark.parametrize("name", ["llama_f32_comp", "llama_int4_block32_comp"])
def test_every_composite_of_an_exported_decoder_is_fused(name):
    path = DECODERS / f"{name}.tflite"
    if not path.exists():
        pytest.skip(f"{path} is missing: make it with benchmarks/export_decoders.py (CI does)")
    model = load_model(path)
    unfused = load_model(path, fuse_composites=False)
    for sg, plain in zip(model.subgraphs, unfused.subgraphs):
        assert not sg.inlined_composites
        fused = sum(n.op == RMS_NORM for n in sg.nodes)
        assert fused == len(plain.inlined_composites) and all(c[1] == RMS_NORM for c in plain.inlined_composites)
    it = litegpu.Interpreter(model_path=str(path))
    report = it.get_signature_runner("decode").get_delegation_report()
    kernels = {(op, kernel) for _, op, _, kernel in report.kernels if op.startswith("odml.")}
    assert kernels == {(RMS_NORM, "composite.rms_norm")}


@pytest.mark.parametrize("b, t, s, heads, kv_heads, mask_shape, cap", [
    (2, 7, 200, 6, 2, (2, 6, 7, 200), None),        # a mask per batch and head, rows past a tile
    (3, 1, 130, 4, 4, (3, 1, 1, 130), 5.0),         # decode rows of three batches, a logit cap
    (1, 13, 64, 8, 1, (13, 64), None)])             # one kv head for all, the mask broadcast
def test_the_cpu_attention_places_every_batch_head_and_mask_row(b, t, s, heads, kv_heads, mask_shape, cap):
    """Shapes litert-torch does not export (it writes batch 1 and a [1, 1, T, S] mask) but
    the op takes: the cpu kernel's rows, k and v bases and mask rows against the op's
    float32 reference."""
    from litegpu.backend import NodeContext
    from litegpu.graph import Node
    from litegpu.ops.registry import TensorSpec
    from litegpu_cpu.kernels import KERNELS
    dim = 16
    q = RNG.standard_normal((b, t, heads, dim)).astype(F32)
    k, v = (RNG.standard_normal((b, s, kv_heads, dim)).astype(F32) for _ in range(2))
    mask = np.where(RNG.random(mask_shape) < 0.3, -np.inf, RNG.standard_normal(mask_shape)).astype(F32)
    mask[..., 0] = 0     # every row sees a key
    attrs = {"scale": 0.25, "logit_cap": cap or 0.0}
    node = Node(index=0, op=SDPA, opcode=206, version=1, inputs=(0, 1, 2, 3), outputs=(4,))
    ctx = NodeContext(node=node, opdef=get_op(SDPA), attrs=attrs,
                      inputs=[TensorSpec(x.shape, np.dtype(F32)) for x in (q, k, v, mask)],
                      outputs=[TensorSpec(q.shape, np.dtype(F32))])
    out = np.full(q.shape, np.nan, F32)       # a row left unwritten fails
    KERNELS[SDPA](ctx)([q, k, v, mask], [out])
    want = get_op(SDPA).reference([q, k, v, mask], attrs)[0]
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())
