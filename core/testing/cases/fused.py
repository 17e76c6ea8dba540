"""Graphs that a GPU backend fuses into regions (:func:`litegpu.codegen.fusion.fuse_regions`):
nodes that only move, join and combine float elements, whose intermediates nothing else
reads, run as one kernel; and an rms norm folded into the row quantization of the hybrid
products it feeds (:func:`litegpu.codegen.fusion.folded_rms_quantize`). Every backend runs
them as the conformance suite runs every case; ``tests/test_gpu_regions.py`` checks that
the GPU backends fused them."""
from __future__ import annotations

import numpy as np
from flatbuffers import flexbuffers

from . import Case
from .composite import RMS_NORM, rms_norm_decomposition
from ..builder import ModelBuilder

F32 = np.float32


def slice_node(b: ModelBuilder, x, begin, size, name: str):
    """``SLICE(x, begin, size)`` as tensor ``name``."""
    y = b.tensor(name, tuple(size), F32)
    b.op("SLICE", [x, b.const(f"{name}_b", np.array(begin, np.int32)), b.const(f"{name}_s", np.array(size, np.int32))],
         [y])
    return y


def binary_node(b: ModelBuilder, op: str, x, y, shape, name: str, **attrs):
    """``op(x, y)`` of ``shape`` as tensor ``name``."""
    z = b.tensor(name, tuple(shape), F32)
    b.op(op, [x, y], [z], **attrs)
    return z


def reshape_node(b: ModelBuilder, x, shape, name: str):
    """``RESHAPE(x)`` to ``shape`` as tensor ``name``."""
    y = b.tensor(name, tuple(shape), F32)
    b.op("RESHAPE", [x, b.const(f"{name}_s", np.array(shape, np.int32))], [y])
    return y


def _rope(b: ModelBuilder, x, shape, cos, sin, name: str):
    """litert-torch's rotary embedding of ``x`` over its last axis: both halves, four
    products, a difference, a sum and a concatenation."""
    half = (*shape[:-1], shape[-1] // 2)
    x1 = slice_node(b, x, [0] * len(shape), half, f"{name}_x1")
    x2 = slice_node(b, x, [0] * (len(shape) - 1) + [shape[-1] // 2], half, f"{name}_x2")
    low = binary_node(b, "SUB", binary_node(b, "MUL", x1, cos, half, f"{name}_a"), binary_node(b, "MUL", x2, sin, half, f"{name}_b"),
                  half, f"{name}_low")
    high = binary_node(b, "ADD", binary_node(b, "MUL", x2, cos, half, f"{name}_c"), binary_node(b, "MUL", x1, sin, half, f"{name}_d"),
                   half, f"{name}_high")
    out = b.tensor(f"{name}_rot", tuple(shape), F32)
    b.op("CONCATENATION", [low, high], [out], axis=len(shape) - 1)
    return out


def rope_model() -> tuple[bytes, list[np.ndarray]]:
    """A decode step's QKV split and rotary embeddings, as litert-torch writes them: the
    fused product's output reshaped per KV group, q, k and v sliced out, q and k rotated,
    q scaled; k and v go on to the cache, q to the scores (here, all three are outputs)."""
    rng = np.random.default_rng(5)
    b = ModelBuilder()
    qkv = b.input("qkv", (1, 1, 1280), F32)
    cos = b.input("cos", (1, 32), F32)
    sin = b.input("sin", (1, 32), F32)
    groups = reshape_node(b, qkv, (1, 1, 4, 320), "groups")
    q = reshape_node(b, slice_node(b, groups, [0, 0, 0, 0], [1, 1, 4, 192], "q"), (1, 12, 1, 64), "q_heads")
    k = reshape_node(b, slice_node(b, groups, [0, 0, 0, 192], [1, 1, 4, 64], "k"), (1, 4, 1, 64), "k_heads")
    v = reshape_node(b, slice_node(b, groups, [0, 0, 0, 256], [1, 1, 4, 64], "v"), (1, 4, 64, 1), "v_heads")
    q_rot = _rope(b, q, (1, 12, 1, 64), cos, sin, "q")
    q_scaled = binary_node(b, "MUL", q_rot, b.const("scale", np.array(0.125, F32)), (1, 12, 1, 64), "q_scaled")
    k_rot = _rope(b, k, (1, 4, 1, 64), cos, sin, "k")
    for out in (q_scaled, k_rot, v):
        b.output(out)
    inputs = [rng.standard_normal((1, 1, 1280)).astype(F32), np.cos(rng.uniform(0, 6, (1, 32))).astype(F32),
              np.sin(rng.uniform(0, 6, (1, 32))).astype(F32)]
    return b.build(), inputs


def mixed_model() -> tuple[bytes, list[np.ndarray]]:
    """A transpose, a broadcast product with a fused RELU6, a three-way concatenation on a
    middle axis (one input a strided slice, one a negation of a reshape), and an
    intermediate read twice at different elements."""
    rng = np.random.default_rng(6)
    b = ModelBuilder()
    x = b.input("x", (2, 3, 8), F32)
    y = b.input("y", (2, 8, 5), F32)
    w = b.input("w", (8,), F32)
    xt = b.tensor("xt", (2, 8, 3), F32)
    b.op("TRANSPOSE", [x, b.const("perm", np.array([0, 2, 1], np.int32))], [xt])
    yw = binary_node(b, "MUL", y, reshape_node(b, w, (1, 8, 1), "w_col"), (2, 8, 5), "yw", fused_activation_function="RELU6")
    ys = b.tensor("ys", (2, 8, 2), F32)
    b.op("STRIDED_SLICE", [yw, b.const("sb", np.array([0, 0, 1], np.int32)), b.const("se", np.array([2, 8, 5], np.int32)),
                           b.const("ss", np.array([1, 1, 2], np.int32))], [ys])
    neg = b.tensor("neg", (2, 8, 3), F32)
    b.op("NEG", [reshape_node(b, binary_node(b, "ADD", x, x, (2, 3, 8), "x2"), (2, 8, 3), "x2r")], [neg])
    joined = b.tensor("joined", (2, 8, 8), F32)
    b.op("CONCATENATION", [xt, ys, neg], [joined], axis=2)
    shifted = binary_node(b, "SUB", joined, slice_node(b, joined, [0, 0, 0], [2, 8, 1], "first"), (2, 8, 8), "shifted")
    b.output(shifted)
    inputs = [rng.standard_normal((2, 3, 8)).astype(F32), (4 * rng.standard_normal((2, 8, 5))).astype(F32),
              rng.standard_normal(8).astype(F32)]
    return b.build(), inputs


def cache_write_model() -> tuple[bytes, list[np.ndarray]]:
    """A decode step's KV-cache writes: k rotated, v sliced and reshaped, each written into
    its cache by DYNAMIC_UPDATE_SLICE at the step's position (k ``[1, 4, 16, 64]``, v
    ``[1, 4, 64, 16]``, as litert-torch lays them out)."""
    rng = np.random.default_rng(7)
    b = ModelBuilder()
    qkv = b.input("qkv", (1, 1, 1280), F32)
    cos = b.input("cos", (1, 32), F32)
    sin = b.input("sin", (1, 32), F32)
    cache_k = b.input("cache_k", (1, 4, 16, 64), F32)
    cache_v = b.input("cache_v", (1, 4, 64, 16), F32)
    k_at = b.input("k_at", (4,), np.int32)
    v_at = b.input("v_at", (4,), np.int32)
    groups = reshape_node(b, qkv, (1, 1, 4, 320), "groups")
    k = reshape_node(b, slice_node(b, groups, [0, 0, 0, 192], [1, 1, 4, 64], "k"), (1, 4, 1, 64), "k_heads")
    v = reshape_node(b, slice_node(b, groups, [0, 0, 0, 256], [1, 1, 4, 64], "v"), (1, 4, 64, 1), "v_heads")
    k_rot = _rope(b, k, (1, 4, 1, 64), cos, sin, "k")
    for cache, shape, update, at, name in ((cache_k, (1, 4, 16, 64), k_rot, k_at, "k_out"),
                                           (cache_v, (1, 4, 64, 16), v, v_at, "v_out")):
        out = b.tensor(name, shape, F32)
        b.op("DYNAMIC_UPDATE_SLICE", [cache, update, at], [out])
        b.output(out)
    inputs = [rng.standard_normal((1, 1, 1280)).astype(F32), np.cos(rng.uniform(0, 6, (1, 32))).astype(F32),
              np.sin(rng.uniform(0, 6, (1, 32))).astype(F32), rng.standard_normal((1, 4, 16, 64)).astype(F32),
              rng.standard_normal((1, 4, 64, 16)).astype(F32), np.array([0, 0, 5, 0], np.int32),
              np.array([0, 0, 0, 11], np.int32)]
    return b.build(), inputs


def rms_norm_products_model(rows: int, width: int, units: tuple[int, ...] = (48, 40)) -> tuple[bytes, list[np.ndarray]]:
    """A decoder's norm and the hybrid products reading it (q and k, say): ``odml.rms_norm``
    of ``x`` [1, rows, width], then a dynamic-range FULLY_CONNECTED (int8 weights, a scale
    per output channel, inputs quantized asymmetrically row by row) per entry of ``units``."""
    rng = np.random.default_rng(8)
    shape = (1, rows, width)
    b = ModelBuilder()
    x = b.input("x", shape, F32)
    w = b.const("w", (rng.standard_normal(width) + 1).astype(F32))
    normed = b.tensor("normed", shape, F32)
    rms_norm_decomposition(b.subgraph(f"{RMS_NORM}.impl"), shape, float(np.float32(1e-6)))
    b.op("STABLEHLO_COMPOSITE", [x, w], [normed], name=RMS_NORM, decomposition_subgraph_index=1,
         composite_attributes=flexbuffers.Dumps({"epsilon": 1e-6}))
    for i, n in enumerate(units):
        scales = rng.uniform(0.005, 0.02, n).astype(F32)
        weights = b.const(f"w{i}", rng.integers(-127, 128, (n, width)).astype(np.int8), scale=scales,
                          zero_point=[0] * n, quantized_dimension=0)
        y = b.tensor(f"y{i}", (1, rows, n), F32)
        b.op("FULLY_CONNECTED", [normed, weights, -1], [y], keep_num_dims=True, asymmetric_quantize_inputs=True,
             version=9)
        b.output(y)
    return b.build(), [(3 * rng.standard_normal(shape)).astype(F32)]


def attention_chain_model(groups: int, heads: int, queries: int, d: int, keys: int, dv: int, k_transposed: bool,
                          v_transposed: bool, mask_shape: tuple, cap: float = 0.0) -> bytes:
    """q [1, G, H*T, D] against k ([1, G, C, D] or [1, G, D, C]), the scores capped
    (``cap``: ``tanh(s * (1 / cap)) * cap``, Gemma 2's) and reshaped to [G, H, T, C] for
    the mask, softmax, times v ([1, G, Dv, C] or [1, G, C, Dv])."""
    m = heads * queries
    b = ModelBuilder()
    q = b.input("q", (1, groups, m, d), F32)
    k = b.input("k", (1, groups, keys, d) if k_transposed else (1, groups, d, keys), F32)
    mask = b.input("mask", mask_shape, F32)
    v = b.input("v", (1, groups, dv, keys) if v_transposed else (1, groups, keys, dv), F32)
    scores = b.tensor("scores", (1, groups, m, keys))
    b.op("BATCH_MATMUL", [q, k], [scores], adj_x=False, adj_y=k_transposed)
    if cap:
        for i, op in enumerate(("MUL", "TANH", "MUL")):
            capped = b.tensor(f"capped{i}", (1, groups, m, keys))
            operands = [scores] if op == "TANH" else \
                [scores, b.const(f"c{i}", np.array(1 / cap if i == 0 else cap, F32))]
            b.op(op, operands, [capped])
            scores = capped
    split = b.tensor("split", (groups, heads, queries, keys))
    b.op("RESHAPE", [scores, b.const("to_split", np.array([groups, heads, queries, keys], np.int32))], [split])
    masked = b.tensor("masked", (groups, heads, queries, keys))
    b.op("ADD", [split, mask], [masked])
    joined = b.tensor("joined", (1, groups, m, keys))
    b.op("RESHAPE", [masked, b.const("to_join", np.array([1, groups, m, keys], np.int32))], [joined])
    probs = b.tensor("probs", (1, groups, m, keys))
    b.op("SOFTMAX", [joined], [probs], beta=1.0)
    out = b.tensor("out", (1, groups, m, dv))
    b.op("BATCH_MATMUL", [probs, v], [out], adj_x=False, adj_y=v_transposed)
    b.output(out)
    return b.build()



def attention_case(variant: str, groups: int, heads: int, queries: int, d: int, keys: int, dv: int,
                   k_transposed: bool, v_transposed: bool, start: int, cap: float = 0.0) -> Case:
    """:func:`attention_chain_model` with a causal mask over ``keys``, the first query at
    position ``start``, and random q, k and v."""
    def build():
        rng = np.random.default_rng(keys + queries)
        mask_shape = (1, 1, queries, keys)
        visible = np.arange(keys)[None, :] <= start + np.arange(queries)[:, None]
        mask = np.where(visible, F32(0), F32(-np.inf)).astype(F32).reshape(mask_shape)
        m = heads * queries
        return attention_chain_model(groups, heads, queries, d, keys, dv, k_transposed, v_transposed, mask_shape,
                                     cap), [
            rng.standard_normal((1, groups, m, d)).astype(F32),
            rng.standard_normal((1, groups, keys, d) if k_transposed else (1, groups, d, keys)).astype(F32),
            mask,
            rng.standard_normal((1, groups, dv, keys) if v_transposed else (1, groups, keys, dv)).astype(F32)]
    return Case("FUSED", f"attention-{variant}", build)


CASES = [
    Case("FUSED", "rotary-qkv-split", rope_model),
    Case("FUSED", "walks-joins-formulas", mixed_model),
    Case("FUSED", "kv-cache-write", cache_write_model),
    Case("FUSED", "rms-norm-row-quantize-decode", lambda: rms_norm_products_model(1, 256), tol=0.03),
    Case("FUSED", "rms-norm-row-quantize-rows", lambda: rms_norm_products_model(5, 200), tol=0.03),
    attention_case("decode", 4, 3, 1, 64, 512, 64, True, True, 40),
    attention_case("prefill-odd-sizes", 2, 2, 7, 24, 200, 40, True, False, 60),
    attention_case("k-by-dimension", 1, 4, 5, 16, 96, 16, False, True, 10),
    attention_case("decode-logit-cap", 2, 2, 1, 32, 128, 32, True, True, 30, 50.0),
]
