"""Fused regions on the GPU backends (:func:`litegpu.codegen.fusion.fuse_regions`): nodes
that only move, join and combine float elements (slices, reshapes, transposes,
broadcasts, concatenations, elementwise formulas) whose intermediates nothing else reads
run as one kernel. Against LiteRT on real models: to the bit in F32 on opencl (PoCL, whose
float arithmetic is XNNPACK's) and webgpu (lavapipe, whose unfused ``fma`` litegpu emulates),
webgpu in each precision."""
from __future__ import annotations

import numpy as np
import pytest

from litegpu.codegen.fusion import fuse_regions, is_region
from litegpu.codegen.offline import gpu_partitions
from litegpu.codegen.opencl import OPENCL
from litegpu.model import load_model
from litegpu.session import Session
from litegpu.testing.builder import ModelBuilder
from litegpu.codegen.render import LANES_ENV
from litegpu.testing.cases.fused import (F32, attention_case, cache_write_model, mixed_model, rms_norm_products_model,
                                         rope_model)
from litegpu.testing.cases.fused import binary_node, slice_node
from litegpu.testing.conformance import litegpu_outputs, litert_outputs

RNG = np.random.default_rng(5)


def _run(data: bytes, inputs: list[np.ndarray], backend: str, precision: str = "F32"):
    """The outputs on ``backend`` (through the Interpreter, as a user runs it) and what its
    program launches: each launch's ops."""
    got = litegpu_outputs(data, inputs, backend, precision_loss_allowed=precision != "F32",
                          half_arithmetic=precision == "F16")
    programs = Session(load_model(data), [backend]).compile(0).programs
    return got, [[c.node.op for c in launch.nodes] for program, _, _ in programs
                 for launch in getattr(program, "launches", [])]


def test_rotary_embeddings_run_as_one_launch_each(gpu_name) -> None:
    data, inputs = rope_model()
    want = litert_outputs(data, inputs)
    got, launches = _run(data, inputs, gpu_name)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    # q (its slice, rotation and scale), k (likewise) and v (its slice): three kernels where
    # there were 23 launches (two per concatenation).
    assert len(launches) == 3, launches
    assert sorted(ops.count("CONCATENATION") for ops in launches) == [0, 1, 1]


def test_mixed_walks_joins_and_formulas_agree_with_litert(gpu_name) -> None:
    data, inputs = mixed_model()
    (want,) = litert_outputs(data, inputs)
    (got,), launches = _run(data, inputs, gpu_name)
    np.testing.assert_array_equal(got, want)
    assert len(launches) == 1, launches


@pytest.mark.parametrize("lanes", ["1", "64"])
@pytest.mark.parametrize("rows, width", [(1, 256), (5, 200)])
def test_an_rms_norm_folds_into_the_row_quantization_it_feeds(gpu_name, lanes, rows, width, monkeypatch) -> None:
    """A hybrid decoder's norm feeding its products' row quantization alone: one launch
    normalizes and quantizes each row (a work-item or, with lanes, a work-group per row)
    and the normalized row is never stored; the products read the codes as before.
    LiteRT's numbers to the bit in F32 on both backends."""
    monkeypatch.setenv(LANES_ENV, lanes)
    data, inputs = rms_norm_products_model(rows, width)
    want = litert_outputs(data, inputs)
    got, launches = _run(data, inputs, gpu_name)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert launches == [["odml.rms_norm", "ROW_QUANTIZE"], ["HYBRID_FULLY_CONNECTED"], ["HYBRID_FULLY_CONNECTED"]]


_CHAIN = ["BATCH_MATMUL", "RESHAPE", "ADD", "RESHAPE", "SOFTMAX", "BATCH_MATMUL"]


@pytest.mark.parametrize("lanes", ["1", "64"])
@pytest.mark.parametrize("variant, args, ops", [
    ("decode", (4, 3, 1, 64, 512, 64, True, True, 40), _CHAIN),
    ("prefill-odd-sizes", (2, 2, 7, 24, 200, 40, True, False, 60), _CHAIN),
    ("k-by-dimension", (1, 4, 5, 16, 96, 16, False, True, 10), _CHAIN),
    ("logit-cap", (2, 2, 1, 32, 128, 32, True, True, 30, 50.0), _CHAIN[:1] + ["MUL", "TANH", "MUL"] + _CHAIN[1:]),
])
def test_an_attention_written_as_nodes_runs_as_one_kernel(gpu_name, lanes, variant, args, ops, monkeypatch) -> None:
    """A decoder's attention without its composite (two products around the mask's ADD and
    the SOFTMAX, litegpu.chains) is one launch on a GPU (lanes), a work-group per row of
    scores whose scores and probabilities are never stored; with one lane (a CPU device)
    the nodes keep their kernels, which are faster there. LiteRT's bits, a decode row of
    512 keys of 64 included."""
    monkeypatch.setenv(LANES_ENV, lanes)
    data, inputs = attention_case(variant, *args).build()
    (want,) = litert_outputs(data, inputs)
    (got,), launches = _run(data, inputs, gpu_name)
    np.testing.assert_array_equal(got, want)
    assert [op for launch in launches for op in launch] == ops
    assert len(launches) == 1 if lanes != "1" else len(launches) >= 3


def test_a_long_attention_row_is_spread_where_one_work_item_would_loop_too_long(webgpu, monkeypatch) -> None:
    """The composite's kernel with one lane (a CPU device): a row of 512 keys of 64 is more
    work than llvmpipe lets one work-item loop through (it silently stops after 65535
    iterations, leaving the last outputs unwritten), so the row takes several."""
    from litegpu.testing.cases.composite import sdpa_case
    monkeypatch.setenv(LANES_ENV, "1")
    data, inputs = sdpa_case("long-row", 1, 512, 4, 2, 64, start=300).build()
    (want,) = litert_outputs(data, inputs)
    (got,), launches = _run(data, inputs, "webgpu")
    np.testing.assert_array_equal(got, want)
    assert launches == [["odml.scaled_dot_product_attention"]]


@pytest.mark.parametrize("precision", ["F32_F16", "F16"])
def test_regions_in_half_precision(webgpu, precision) -> None:
    for data, inputs in (rope_model(), mixed_model()):
        want = litert_outputs(data, inputs)
        got, _ = _run(data, inputs, "webgpu", precision)
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=4e-3, atol=4e-3 * float(np.abs(w).max()))


def test_an_intermediate_read_elsewhere_stays_in_memory(opencl) -> None:
    """The slice of q is a model output too: it is stored by its own launch, and the rest
    of q's region reads it from memory."""
    b = ModelBuilder()
    x = b.input("x", (1, 4, 8), F32)
    low = slice_node(b, x, [0, 0, 0], [1, 4, 4], "low")
    high = slice_node(b, x, [0, 0, 4], [1, 4, 4], "high")
    both = b.tensor("both", (1, 4, 8), F32)
    b.op("CONCATENATION", [high, low], [both], axis=2)
    b.output(both)
    b.output(low)
    data = b.build()
    inputs = [RNG.standard_normal((1, 4, 8)).astype(F32)]
    got, launches = _run(data, inputs, "opencl")
    for g, w in zip(got, litert_outputs(data, inputs)):
        np.testing.assert_array_equal(g, w)
    assert ["SLICE"] in launches and ["SLICE", "CONCATENATION"] in launches and len(launches) == 2


def test_regions_keep_the_order_of_every_step() -> None:
    """A region runs at its last step's place: every node is in one step, and each step
    reads only what steps before it (or itself) made."""
    data, _ = rope_model()
    (_, partition), = gpu_partitions(load_model(data), OPENCL)[0]
    nodes, steps = partition.nodes, partition.steps
    assert sorted(p for step in steps for p in step) == list(range(len(nodes)))
    assert sum(is_region(nodes, step) for step in steps) == 3     # q, k and v
    made_by_steps = {t for c in nodes for t in c.node.outputs}
    done: set[int] = set()
    for step in steps:
        made = {t for p in step for t in nodes[p].node.outputs}
        assert all(t in done or t in made or t not in made_by_steps for p in step for t in nodes[p].node.inputs)
        done |= made
    # Without regions the same nodes are the producers and their followers.
    assert fuse_regions(nodes, [[p] for p in range(len(nodes))], partition.outputs, max_buffers=2) == \
        [[p] for p in range(len(nodes))]


def test_a_reshape_keeping_the_last_axis_continues_a_producers_chain(gpu_name) -> None:
    """A decoder's attention scores: BATCH_MATMUL, a reshape, the mask's ADD and a reshape
    back are one launch; so are a product and the residual ADD that broadcasts it to rank 3."""
    b = ModelBuilder()
    q = b.input("q", (1, 4, 3, 16), F32)
    k = b.input("k", (1, 4, 32, 16), F32)
    mask = b.input("mask", (1, 1, 1, 32), F32)
    scores = b.tensor("scores", (1, 4, 3, 32), F32)
    b.op("BATCH_MATMUL", [q, k], [scores], adj_x=False, adj_y=True)
    flat = b.tensor("flat", (4, 3, 1, 32), F32)
    b.op("RESHAPE", [scores, b.const("fs", np.array([4, 3, 1, 32], np.int32))], [flat])
    masked = b.tensor("masked", (4, 3, 1, 32), F32)
    b.op("ADD", [flat, mask], [masked])
    back = b.tensor("back", (1, 4, 3, 32), F32)
    b.op("RESHAPE", [masked, b.const("bs", np.array([1, 4, 3, 32], np.int32))], [back])
    probs = b.tensor("probs", (1, 4, 3, 32), F32)
    b.op("SOFTMAX", [back], [probs], beta=1.0)
    b.output(probs)
    x = b.input("x", (1, 16), F32)
    residual = b.input("residual", (1, 1, 8), F32)
    y = b.tensor("y", (1, 8), F32)
    b.op("FULLY_CONNECTED", [x, b.const("w", RNG.standard_normal((8, 16)).astype(F32)), -1], [y])
    out = b.tensor("out", (1, 1, 8), F32)
    b.op("ADD", [residual, y], [out])
    b.output(out)
    data = b.build()
    inputs = [RNG.standard_normal(s).astype(F32) for s in ((1, 4, 3, 16), (1, 4, 32, 16), (1, 1, 1, 32), (1, 16),
                                                           (1, 1, 8))]
    inputs[2][..., 20:] = -np.inf
    got, launches = _run(data, inputs, gpu_name)
    for g, w in zip(got, litert_outputs(data, inputs)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    assert ["BATCH_MATMUL", "RESHAPE", "ADD", "RESHAPE"] in launches and ["FULLY_CONNECTED", "ADD"] in launches
    assert len(launches) == 3, launches


def test_a_follower_may_read_the_chains_own_values(gpu_name) -> None:
    """SiLU after a product (``y * sigmoid(y)``: y has two readers, both in the chain) and a
    square of the running value fold into the product's kernel. Where a value is read
    outside (the TANH, an output too) the chain ends where every value it made is still
    read inside: here after the product, whose output the later MUL reads."""
    b = ModelBuilder()
    x = b.input("x", (2, 16), F32)
    y = b.tensor("y", (2, 8), F32)
    b.op("FULLY_CONNECTED", [x, b.const("w", RNG.standard_normal((8, 16)).astype(F32)), -1], [y])
    s = b.tensor("s", (2, 8), F32)
    b.op("LOGISTIC", [y], [s])
    silu = binary_node(b, "MUL", y, s, (2, 8), "silu")
    square = binary_node(b, "MUL", silu, silu, (2, 8), "square")
    b.output(square)
    z = b.tensor("z", (2, 8), F32)
    b.op("FULLY_CONNECTED", [x, b.const("w2", RNG.standard_normal((8, 16)).astype(F32)), -1], [z])
    t = b.tensor("t", (2, 8), F32)
    b.op("TANH", [z], [t])
    b.output(binary_node(b, "MUL", t, z, (2, 8), "zt"))
    b.output(t)
    data = b.build()
    inputs = [RNG.standard_normal((2, 16)).astype(F32)]
    got, launches = _run(data, inputs, gpu_name)
    for g, w in zip(got, litert_outputs(data, inputs)):
        np.testing.assert_array_equal(g, w)
    assert ["FULLY_CONNECTED", "LOGISTIC", "MUL", "MUL"] in launches
    assert ["FULLY_CONNECTED"] in launches and ["TANH"] in launches and ["MUL"] in launches, launches
    assert len(launches) == 4, launches


def test_a_cache_write_computes_its_update(gpu_name) -> None:
    """The KV-cache writes' updates (k rotated; v sliced and reshaped) are computed by the
    DYNAMIC_UPDATE_SLICE's own update kernel: each write is its whole-cache copy (skipped
    when the cache is updated in place) and one kernel."""
    data, inputs = cache_write_model()
    want = litert_outputs(data, inputs)
    got, launches = _run(data, inputs, gpu_name)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert len(launches) == 4, launches
    updates = [ops for ops in launches if "CONCATENATION" in ops or "SLICE" in ops]
    assert len(updates) == 4 and all(ops[-1] == "DYNAMIC_UPDATE_SLICE" for ops in updates)


def test_a_convolution_keeps_its_silu_in_its_own_kernel(opencl) -> None:
    """A convolution takes no follower that reads an earlier value of its chain: its SiLU
    (``x * sigmoid(x)``) folded into its store made efficientnet_b0 2.4x slower on PoCL."""
    b = ModelBuilder()
    x = b.input("x", (1, 8, 8, 4), F32)
    y = b.tensor("y", (1, 8, 8, 8), F32)
    b.op("CONV_2D", [x, b.const("f", RNG.standard_normal((8, 1, 1, 4)).astype(F32)),
                     b.const("bias", RNG.standard_normal(8).astype(F32))], [y], padding="SAME", stride_w=1, stride_h=1)
    s = b.tensor("s", (1, 8, 8, 8), F32)
    b.op("LOGISTIC", [y], [s])
    b.output(binary_node(b, "MUL", y, s, (1, 8, 8, 8), "silu"))
    data = b.build()
    inputs = [RNG.standard_normal((1, 8, 8, 4)).astype(F32)]
    (got,), launches = _run(data, inputs, "opencl")
    np.testing.assert_array_equal(got, litert_outputs(data, inputs)[0])
    assert launches == [["CONV_2D"], ["LOGISTIC", "MUL"]], launches
