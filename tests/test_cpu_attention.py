"""A decoder's attention chain as one cpu step over the keys its mask leaves visible
(litegpu_cpu.kernels.attention): BATCH_MATMUL, RESHAPE, ADD of a mask, RESHAPE, SOFTMAX,
BATCH_MATMUL on single-chain models, against LiteRT itself to the bit (on hosts where the
cpu SOFTMAX is XNNPACK's), and against the same nodes run one by one everywhere.

The cases cover a decode step (fewer query rows than a tile), prefills whose rows end
inside a tile, both layouts of k and v (adj_y), head sizes that are not whole panels, key
counts that are not whole blocks of 64, masks hiding no key, every key, or all but one,
a mask over batch and heads, and a NaN in the mask (a visible key).
"""
from __future__ import annotations

import numpy as np
import pytest

import litegpu
from litegpu.testing.builder import ModelBuilder
from litegpu.testing.cases.fused import attention_chain_model as chain_model
from litegpu_cpu.kernels import xnn_order

from ai_edge_litert.interpreter import Interpreter as LiteRT  # a test dependency: never skipped

F32 = np.float32
RNG = np.random.default_rng(11)


def causal_mask(shape: tuple, start: int) -> np.ndarray:
    """-inf past each query's position (query t at ``start + t``) on the last two axes,
    the same for every batch and head; ``start`` < 0: nothing hidden."""
    queries, keys = shape[-2], shape[-1]
    mask = np.zeros(shape, F32)
    if start >= 0:
        visible = np.arange(keys)[None, :] <= start + np.arange(queries)[:, None]
        mask[...] = np.where(visible, F32(0), F32(-np.inf))
    return mask


def inputs(groups, heads, queries, d, keys, dv, k_t, v_t, mask):
    m = heads * queries
    q = RNG.standard_normal((1, groups, m, d)).astype(F32)
    k = RNG.standard_normal((1, groups, keys, d) if k_t else (1, groups, d, keys)).astype(F32)
    v = RNG.standard_normal((1, groups, dv, keys) if v_t else (1, groups, keys, dv)).astype(F32)
    return [q, k, mask, v]


def run(content: bytes, xs: list, interpreter) -> np.ndarray:
    interp = interpreter(model_content=content, num_threads=2)
    interp.allocate_tensors()
    for detail, x in zip(interp.get_input_details(), xs):
        interp.set_tensor(detail["index"], x)
    interp.invoke()
    out = interp.get_tensor(interp.get_output_details()[0]["index"]).copy()
    return out, interp


def assert_same_bits(ours: np.ndarray, other: np.ndarray) -> None:
    assert ours.shape == other.shape and ours.dtype == other.dtype == F32
    differ = ours.view(np.uint32) != other.view(np.uint32)
    assert not differ.any(), f"{differ.sum()} of {differ.size} differ: {ours[differ][:4]} vs {other[differ][:4]}"


CASES = [
    # groups, heads, queries, d, keys, dv, k_t, v_t, mask start, logit cap
    pytest.param(2, 3, 1, 32, 128, 32, True, True, 40, 0.0, id="decode-step"),
    pytest.param(2, 3, 1, 32, 128, 32, True, True, 127, 0.0, id="decode-last-position"),
    pytest.param(4, 3, 16, 64, 512, 64, True, True, 0, 0.0, id="prefill-from-0"),
    pytest.param(2, 2, 7, 24, 200, 40, True, False, 60, 0.0, id="rows-past-a-tile-odd-sizes"),
    pytest.param(1, 4, 5, 16, 96, 16, False, True, 10, 0.0, id="k-by-dimension"),
    pytest.param(2, 1, 9, 32, 200, 32, False, False, 185, 0.0, id="span-past-the-last-whole-block"),
    pytest.param(2, 3, 4, 32, 128, 32, True, True, -1, 0.0, id="nothing-hidden"),
    pytest.param(2, 2, 1, 32, 128, 32, True, True, 30, 50.0, id="decode-logit-cap"),
    pytest.param(2, 2, 8, 32, 128, 32, False, False, 3, 30.0, id="prefill-logit-cap"),
]


@pytest.mark.parametrize("groups,heads,queries,d,keys,dv,k_t,v_t,start,cap", CASES)
def test_chain_gives_litert_bits(groups, heads, queries, d, keys, dv, k_t, v_t, start, cap):
    shape = (1, 1, queries, keys)
    content = chain_model(groups, heads, queries, d, keys, dv, k_t, v_t, shape, cap)
    xs = inputs(groups, heads, queries, d, keys, dv, k_t, v_t, causal_mask(shape, start))
    ours, interp = run(content, xs, litegpu.Interpreter)
    kernels = [k for _, k in interp._compiled.programs[0][0].kernels()]
    assert kernels == ["attention.AttentionChain"]
    unfused, _ = run_unfused(content, xs)
    assert_same_bits(ours, unfused)
    if xnn_order.RSUM_MATCHES_LITERT:
        litert, _ = run(content, xs, LiteRT)
        assert_same_bits(ours, litert)


def run_unfused(content: bytes, xs: list):
    """The same model with the cpu's fusion off: each node its own kernel."""
    import os
    before = os.environ.get("LITEGPU_CPU_FUSION")
    os.environ["LITEGPU_CPU_FUSION"] = "0"
    try:
        return run(content, xs, litegpu.Interpreter)
    finally:
        if before is None:
            del os.environ["LITEGPU_CPU_FUSION"]
        else:
            os.environ["LITEGPU_CPU_FUSION"] = before


@pytest.mark.parametrize("mask_kind", ["every-key-hidden", "one-row-hidden", "nan-in-mask", "per-head-mask"])
def test_unusual_masks(mask_kind):
    groups, heads, queries, d, keys, dv = 2, 2, 3, 16, 192, 16
    shape = (groups, heads, queries, keys) if mask_kind == "per-head-mask" else (1, 1, queries, keys)
    mask = causal_mask(shape, 5)
    if mask_kind == "every-key-hidden":
        mask[...] = -np.inf
    elif mask_kind == "one-row-hidden":
        mask[..., 1, :] = -np.inf
    elif mask_kind == "nan-in-mask":
        mask[..., 0, 150] = np.nan
    else:
        mask[1, 0] = causal_mask((queries, keys), 100)      # one head sees further
    content = chain_model(groups, heads, queries, d, keys, dv, True, True, shape)
    xs = inputs(groups, heads, queries, d, keys, dv, True, True, mask)
    ours, _ = run(content, xs, litegpu.Interpreter)
    unfused, _ = run_unfused(content, xs)
    assert_same_bits(ours, unfused)
    if xnn_order.RSUM_MATCHES_LITERT:
        assert_same_bits(ours, run(content, xs, LiteRT)[0])


def test_run_after_run_follows_the_mask():
    """One interpreter, the mask's visible span growing and shrinking from run to run (a
    decode step after a prefill, then a new session): each run takes its own span."""
    groups, heads, queries, d, keys, dv = 2, 3, 2, 32, 256, 32
    shape = (1, 1, queries, keys)
    content = chain_model(groups, heads, queries, d, keys, dv, True, True, shape)
    interp = litegpu.Interpreter(model_content=content, num_threads=2)
    interp.allocate_tensors()
    for start in (3, 130, 250, 0, 64):
        xs = inputs(groups, heads, queries, d, keys, dv, True, True, causal_mask(shape, start))
        for detail, x in zip(interp.get_input_details(), xs):
            interp.set_tensor(detail["index"], x)
        interp.invoke()
        ours = interp.get_tensor(interp.get_output_details()[0]["index"])
        assert_same_bits(ours, run_unfused(content, xs)[0])


def test_a_chain_read_in_the_middle_is_not_fused():
    """The scores are also a model output: the nodes run one by one."""
    b = ModelBuilder()
    q, k = b.input("q", (1, 2, 6, 16)), b.input("k", (1, 2, 64, 16))
    mask, v = b.input("mask", (1, 1, 6, 64)), b.input("v", (1, 2, 16, 64))
    scores = b.tensor("scores", (1, 2, 6, 64))
    b.op("BATCH_MATMUL", [q, k], [scores], adj_x=False, adj_y=True)
    masked = b.tensor("masked", (1, 2, 6, 64))
    b.op("ADD", [scores, mask], [masked])
    probs = b.tensor("probs", (1, 2, 6, 64))
    b.op("SOFTMAX", [masked], [probs], beta=1.0)
    out = b.tensor("out", (1, 2, 6, 16))
    b.op("BATCH_MATMUL", [probs, v], [out], adj_x=False, adj_y=True)
    b.output(out, scores)
    xs = [RNG.standard_normal(s).astype(F32) for s in ((1, 2, 6, 16), (1, 2, 64, 16))]
    xs += [causal_mask((1, 1, 6, 64), 3), RNG.standard_normal((1, 2, 16, 64)).astype(F32)]
    _, interp = run(b.build(), xs, litegpu.Interpreter)
    assert "attention.AttentionChain" not in [k for _, k in interp._compiled.programs[0][0].kernels()]


@pytest.mark.parametrize("queries", [1, 16], ids=["decode", "prefill"])
def test_legacy_layout(queries):
    """litert-torch's other layout: rank-3 products over (batch x heads), the ADD's mask
    broadcast lifting the scores to rank 4, and v reshaped among the chain's nodes."""
    heads, d, keys = 4, 32, 128
    b = ModelBuilder()
    q = b.input("q", (heads, queries, d))
    k = b.input("k", (heads, d, keys))
    mask = b.input("mask", (1, 1, queries, keys))
    v5 = b.input("v", (1, 2, 2, keys, d))
    scores = b.tensor("scores", (heads, queries, keys))
    b.op("BATCH_MATMUL", [q, k], [scores], adj_x=False, adj_y=False)
    masked = b.tensor("masked", (1, heads, queries, keys))
    b.op("ADD", [scores, mask], [masked])
    probs = b.tensor("probs", (1, heads, queries, keys))
    b.op("SOFTMAX", [masked], [probs], beta=1.0)
    flat = b.tensor("flat", (heads, queries, keys))
    b.op("RESHAPE", [probs, b.const("s3", np.array([heads, queries, keys], np.int32))], [flat])
    v = b.tensor("v3", (heads, keys, d))
    b.op("RESHAPE", [v5, b.const("v3s", np.array([heads, keys, d], np.int32))], [v])
    out = b.tensor("out", (heads, queries, d))
    b.op("BATCH_MATMUL", [flat, v], [out], adj_x=False, adj_y=False)
    b.output(out)
    content = b.build()
    xs = [RNG.standard_normal((heads, queries, d)).astype(F32), RNG.standard_normal((heads, d, keys)).astype(F32),
          causal_mask((1, 1, queries, keys), 9), RNG.standard_normal((1, 2, 2, keys, d)).astype(F32)]
    ours, interp = run(content, xs, litegpu.Interpreter)
    assert "attention.AttentionChain" in [k for _, k in interp._compiled.programs[0][0].kernels()]
    assert_same_bits(ours, run_unfused(content, xs)[0])
    if xnn_order.RSUM_MATCHES_LITERT:
        assert_same_bits(ours, run(content, xs, LiteRT)[0])


def test_a_finite_mask_gives_the_same_bits():
    """The causal mask with float32's lowest value for -inf hides keys only through exp():
    the step takes every key. Its results are those of the -inf mask, whose hidden keys
    the step leaves out."""
    groups, heads, queries, d, keys, dv = 2, 3, 16, 32, 384, 32
    shape = (1, 1, queries, keys)
    content = chain_model(groups, heads, queries, d, keys, dv, True, True, shape)
    xs = inputs(groups, heads, queries, d, keys, dv, True, True, causal_mask(shape, 20))
    finite = xs[:2] + [np.maximum(xs[2], np.finfo(F32).min)] + xs[3:]
    assert_same_bits(run(content, xs, litegpu.Interpreter)[0], run(content, finite, litegpu.Interpreter)[0])


def stacked_model(layers: int, heads: int, d: int, keys: int) -> bytes:
    """``layers`` attentions in a row, each's output the next one's queries (a decoder's
    layers, reduced to their attentions), over one k, v and mask."""
    b = ModelBuilder()
    q = b.input("q", (1, 1, heads, d), F32)
    k = b.input("k", (1, 1, keys, d), F32)
    mask = b.input("mask", (1, 1, heads, keys), F32)
    v = b.input("v", (1, 1, keys, d), F32)
    for layer in range(layers):
        scores = b.tensor(f"scores{layer}", (1, 1, heads, keys))
        b.op("BATCH_MATMUL", [q, k], [scores], adj_x=False, adj_y=True)
        masked = b.tensor(f"masked{layer}", (1, 1, heads, keys))
        b.op("ADD", [scores, mask], [masked])
        probs = b.tensor(f"probs{layer}", (1, 1, heads, keys))
        b.op("SOFTMAX", [masked], [probs], beta=1.0)
        out = b.tensor(f"out{layer}", (1, 1, heads, d))
        b.op("BATCH_MATMUL", [probs, v], [out], adj_x=False, adj_y=False)
        q = out
    b.output(q)
    return b.build()


def test_a_programs_attention_steps_share_their_scratch():
    """A decoder's attentions (one a layer) each took their own packed keys and values and
    scores scratch, bound for the program's life; a program's steps run one after another,
    so they share one set (litegpu_cpu.kernels.workspace). Eight layers take the memory of
    one, and give LiteRT's bits."""
    import gc
    import tracemalloc
    heads, d, keys = 4, 64, 2048
    xs = [RNG.standard_normal((1, 1, heads, d)).astype(F32), RNG.standard_normal((1, 1, keys, d)).astype(F32),
          causal_mask((1, 1, heads, keys), -1), RNG.standard_normal((1, 1, keys, d)).astype(F32)]
    held = {}
    for layers in (1, 8):
        content = stacked_model(layers, heads, d, keys)
        run(content, xs, litegpu.Interpreter)          # (the kernels' JIT)
        tracemalloc.start()
        try:
            ours, interp = run(content, xs, litegpu.Interpreter)
            gc.collect()
            held[layers] = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        kernels = [k for _, k in interp._compiled.programs[0][0].kernels()]
        assert kernels.count("attention.AttentionChain") == layers
        if xnn_order.RSUM_MATCHES_LITERT:
            assert_same_bits(ours, run(content, xs, LiteRT)[0])
        else:
            np.testing.assert_allclose(ours, run(content, xs, LiteRT)[0], rtol=1e-5, atol=1e-6)
    packed = 2 * keys * d * 4     # one step's packed keys and values
    assert held[8] - held[1] < packed, held


def test_the_composites_attention_takes_the_programs_scratch_too():
    """``odml.scaled_dot_product_attention`` runs as the same step (its kernel made by the
    generic factory): its scratch is the program's workspace as well, and its results LiteRT's."""
    from litegpu.testing.cases.composite import sdpa_case
    from litegpu.testing.conformance import litert_outputs
    data, xs = sdpa_case("decode", 1, 128, 4, 2, 32, start=20).build()
    ours, interp = run(data, xs, litegpu.Interpreter)
    program = interp._compiled.programs[0][0]
    assert program.workspace.size("attention.packed") > 0
    np.testing.assert_allclose(ours, litert_outputs(data, xs)[0], rtol=1e-5, atol=1e-6)
