"""Conformance cases for litert-torch's composites: ``odml.rms_norm`` and
``odml.scaled_dot_product_attention`` (core/ops/composite.py).

Each model holds one STABLEHLO_COMPOSITE whose decomposition subgraph is built op for op
as litert-torch (0.10) exports it, read from its exported decoders (``*_comp_legacy``):
LiteRT calls the decomposition, litegpu runs the fused op, so LiteRT is the oracle for
the fused kernels. The decompositions:

- ``odml.rms_norm(x, w)``: ``MUL(x, x)``, ``MEAN`` over the last axis, ``ADD`` epsilon,
  ``RSQRT``, ``MUL(x, r)``, ``MUL(., w)``; the mean is taken without kept dims and
  reshaped back when x has more than one row, with kept dims (epsilon a constant of the
  same rank) when it has one;
- ``odml.scaled_dot_product_attention(q, k, v, mask)`` with q ``[B, T, H, D]``, k and v
  ``[B, S, KV, D]`` (litert-torch's "legacy" KV layout; the LiteRT-LM layout exports no
  composite) and mask ``[1, 1, T, S]``: k and v transposed to heads first and repeated
  over each group of ``H / KV`` query heads (``repeat_interleave``: RESHAPE,
  BROADCAST_TO, RESHAPE), q and k each multiplied by ``sqrt(scale)`` (torch's math SDPA),
  ``BATCH_MATMUL`` of q and k transposed, ``ADD`` mask, ``SOFTMAX``, ``BATCH_MATMUL`` with
  v, back to ``[B, T, H, D]``; one query row (decode) skips the transposes of q and of
  the result. With a ``logit_cap`` (Gemma 2's softcap; none of the exported decoders has
  one) it is litert-torch's softcap path, read from its source: q times the scale, the
  scores divided by the cap, ``TANH``, times the cap, then the mask and the rest.

LiteRT's XNNPACK delegate does not call the attention's decomposition: it lowers the
composite from its attributes (``VisitDotAttentionNode``), and that is what litegpu's
fused op follows (:mod:`litegpu.ops.composite`). The decomposition built here is what
LiteRT runs where XNNPACK is off, and what litegpu runs where it refuses the composite.
"""
from __future__ import annotations

import math

import numpy as np
from flatbuffers import flexbuffers

from . import Case
from ..builder import ModelBuilder, SubgraphBuilder

F32 = np.float32
RMS_NORM = "odml.rms_norm"
SDPA = "odml.scaled_dot_product_attention"


def _i32(*values: int) -> np.ndarray:
    return np.array(values, np.int32)


def rms_norm_decomposition(d: SubgraphBuilder, shape: tuple[int, ...], epsilon: float) -> None:
    """``d`` as litert-torch's ``odml.rms_norm.impl`` for ``x`` of ``shape`` and ``w`` of its
    last axis."""
    x = d.input("x", shape, F32)
    w = d.input("w", shape[-1:], F32)
    rank = len(shape)
    sq = d.tensor("sq", shape, F32)
    d.op("MUL", [x, x], [sq])
    kept = shape[:-1] + (1,)
    one_row = math.prod(shape[:-1]) == 1
    if one_row:
        mean = d.tensor("mean", kept, F32)
        d.op("MEAN", [sq, d.const("axes", _i32(rank - 1))], [mean], keep_dims=True)
        shifted = d.tensor("shifted", kept, F32)
        d.op("ADD", [mean, d.const("eps", np.full(kept, epsilon, F32))], [shifted])
    else:
        mean = d.tensor("mean", shape[:-1], F32)
        d.op("MEAN", [sq, d.const("axes", _i32(rank - 1))], [mean], keep_dims=False)
        added = d.tensor("added", shape[:-1], F32)
        d.op("ADD", [mean, d.const("eps", np.array(epsilon, F32))], [added])
        shifted = d.tensor("shifted", kept, F32)
        d.op("RESHAPE", [added, d.const("kept", _i32(*kept))], [shifted])
    r = d.tensor("r", kept, F32)
    d.op("RSQRT", [shifted], [r])
    normed = d.tensor("normed", shape, F32)
    d.op("MUL", [x, r], [normed])
    out = d.tensor("out", shape, F32)
    d.op("MUL", [normed, w], [out])
    d.output(out)


def sdpa_decomposition(d: SubgraphBuilder, q_shape: tuple[int, ...], kv_shape: tuple[int, ...],
                       scale: float, logit_cap: float | None = None) -> None:
    """``d`` as litert-torch's ``odml.scaled_dot_product_attention.impl`` (see the module
    docstring) for q of ``q_shape`` ``[1, T, H, D]``, k and v of ``kv_shape`` ``[1, S, KV, D]``
    and a ``[1, 1, T, S]`` mask."""
    b, t, h, dim = q_shape
    _, s, kv, _ = kv_shape
    group = h // kv
    q = d.input("q", q_shape, F32)
    k = d.input("k", kv_shape, F32)
    v = d.input("v", kv_shape, F32)
    mask = d.input("mask", (1, 1, t, s), F32)
    heads_first = d.const("heads_first", _i32(0, 2, 1, 3))

    def tensor(name, shape):
        return d.tensor(name, shape, F32)

    def op(name, inputs, shape, **options):
        out = tensor(name.lower(), shape)
        d.op(name, inputs, [out], version=2 if name == "BROADCAST_TO" else 1, **options)
        return out

    def repeated(x):
        """[1, S, KV, D] -> [1, H, S, D], each kv head repeated for its group of query heads."""
        x = op("TRANSPOSE", [x, heads_first], (b, kv, s, dim))
        if group == 1:
            return x
        x = op("RESHAPE", [x, d.const("split", _i32(b, kv, 1, s, dim))], (b, kv, 1, s, dim))
        return op("BROADCAST_TO", [x, d.const("groups", _i32(b, kv, group, s, dim))], (b, kv, group, s, dim))

    # torch's math attention scales q and k by sqrt(scale) each; the softcap path q alone.
    factor = d.const("scale", np.array(scale if logit_cap else math.sqrt(scale), F32))
    keys = repeated(k)
    if group > 1:
        keys = op("RESHAPE", [keys, d.const("heads", _i32(b, h, s, dim))], (b, h, s, dim))
    values = repeated(v)
    qs = op("MUL", [q, factor], q_shape)
    if t > 1:
        qs = op("TRANSPOSE", [qs, heads_first], (b, h, t, dim))
    ks = keys if logit_cap else op("MUL", [keys, factor], (b, h, s, dim))
    ks = op("TRANSPOSE", [ks, d.const("last_two", _i32(0, 1, 3, 2))], (b, h, dim, s))
    qs = op("RESHAPE", [qs, d.const("q3", _i32(b * h, t, dim))], (b * h, t, dim))
    ks = op("RESHAPE", [ks, d.const("k3", _i32(b * h, dim, s))], (b * h, dim, s))
    scores = op("BATCH_MATMUL", [qs, ks], (b * h, t, s))
    if logit_cap:
        cap = d.const("cap", np.array(logit_cap, F32))
        scores = op("DIV", [scores, cap], (b * h, t, s))
        scores = op("TANH", [scores], (b * h, t, s))
        scores = op("MUL", [scores, cap], (b * h, t, s))
    scores = op("ADD", [scores, mask], (1, b * h, t, s))
    probs = op("SOFTMAX", [scores], (1, b * h, t, s), beta=1.0)
    probs = op("RESHAPE", [probs, d.const("p3", _i32(b * h, t, s))], (b * h, t, s))
    vs = op("RESHAPE", [values, d.const("v3", _i32(b * h, s, dim))], (b * h, s, dim))
    out = op("BATCH_MATMUL", [probs, vs], (b * h, t, dim))
    if t > 1:
        out = op("RESHAPE", [out, d.const("o4", _i32(b, h, t, dim))], (b, h, t, dim))
        out = op("TRANSPOSE", [out, heads_first], q_shape)
    else:
        out = op("RESHAPE", [out, d.const("o4", _i32(*q_shape))], q_shape)
    d.output(out)


def composite_model(name: str, attributes: dict, inputs: list[tuple[str, tuple[int, ...], np.ndarray | None]],
                    out_shape: tuple[int, ...], decomposition) -> bytes:
    """A model of one composite ``name``: ``inputs`` are (name, shape, constant or None for a
    model input); ``decomposition(subgraph builder)`` builds subgraph 1."""
    b = ModelBuilder()
    operands = [b.input(n, shape, F32) if value is None else b.const(n, value) for n, shape, value in inputs]
    out = b.tensor("out", out_shape, F32)
    decomposition(b.subgraph(f"{name}.impl"))
    b.op("STABLEHLO_COMPOSITE", operands, [out], name=name, decomposition_subgraph_index=1,
         composite_attributes=flexbuffers.Dumps(attributes))
    b.output(out)
    return b.build()


_RNG = np.random.default_rng(20261128)


def _normal(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (_RNG.standard_normal(shape) * scale).astype(F32)


def rms_norm_case(variant: str, shape: tuple[int, ...], epsilon: float, *, const_weight: bool = True,
                  scale: float = 1.0) -> Case:
    """``odml.rms_norm`` of a random ``x`` of ``shape`` (values times ``scale``) and a weight."""
    def build():
        x = _normal(*shape, scale=scale)
        w = _normal(shape[-1]) + F32(1)
        data = composite_model(RMS_NORM, {"epsilon": epsilon},
                               [("x", shape, None), ("w", shape[-1:], w if const_weight else None)], shape,
                               lambda d: rms_norm_decomposition(d, shape, float(np.float32(epsilon))))
        return data, [x] if const_weight else [x, w]
    return Case(RMS_NORM, variant, build, tol=1e-5)


def causal_mask(t: int, s: int, start: int, low: float = -np.inf) -> np.ndarray:
    """litert-torch's mask for ``t`` query rows at positions ``start ..`` over ``s`` cache
    entries: 0 where a row may look, ``low`` after its own position."""
    rows = np.arange(start, start + t)[:, None]
    return np.where(np.arange(s)[None, :] <= rows, F32(0), F32(low)).astype(F32).reshape(1, 1, t, s)


def sdpa_case(variant: str, t: int, s: int, heads: int, kv_heads: int, dim: int, *, start: int = 0,
              low: float = -np.inf, scale: float | None = None, logit_cap: float | None = None) -> Case:
    """``odml.scaled_dot_product_attention`` of ``t`` query rows at positions ``start ..`` over
    a cache of ``s`` entries, ``heads`` query heads over ``kv_heads`` kv heads of ``dim``."""
    # Attributes as litert-torch's converter writes them: float32 values (LiteRT's XNNPACK
    # reads the scale's first four bytes as a float, whatever the width written).
    scale = float(np.float32(1 / math.sqrt(dim) if scale is None else scale))
    q_shape, kv_shape = (1, t, heads, dim), (1, s, kv_heads, dim)

    attributes = {"scale": scale}
    if logit_cap is not None:
        logit_cap = attributes["logit_cap"] = float(np.float32(logit_cap))

    def build():
        q, k, v = _normal(*q_shape, scale=2.0), _normal(*kv_shape, scale=2.0), _normal(*kv_shape)
        mask = causal_mask(t, s, start, low)
        data = composite_model(SDPA, attributes,
                               [("q", q_shape, None), ("k", kv_shape, None), ("v", kv_shape, None),
                                ("mask", mask.shape, None)], q_shape,
                               lambda d: sdpa_decomposition(d, q_shape, kv_shape, scale, logit_cap))
        return data, [q, k, v, mask]
    return Case(SDPA, variant, build, tol=1e-5)


CASES = [
    rms_norm_case("prefill16", (1, 16, 128), 1e-5),
    rms_norm_case("decode-row", (1, 1, 128), 1e-5),
    rms_norm_case("heads-eps1e-6", (1, 16, 4, 32), 1e-6),
    rms_norm_case("decode-heads", (1, 1, 2, 32), 1e-6),
    rms_norm_case("weight-input", (1, 3, 40), 1e-5, const_weight=False),
    rms_norm_case("small-values-eps1e-2", (1, 4, 24), 1e-2, scale=0.05),
    rms_norm_case("odd-width", (2, 5, 13), 1e-6),
    rms_norm_case("wide-rows", (1, 12, 819), 1e-6),   # every block of XNNPACK's sum of squares
    sdpa_case("prefill16-gqa4x2", 16, 128, 4, 2, 32),
    sdpa_case("decode-gqa4x2", 1, 128, 4, 2, 32, start=20),
    sdpa_case("decode-first-position", 1, 128, 4, 2, 32, start=0),
    sdpa_case("prefill16-mha", 16, 64, 4, 4, 16, start=5),
    sdpa_case("prefill-gqa8x2-finite-mask", 6, 40, 8, 2, 8, start=3, low=float(np.finfo(F32).min)),
    sdpa_case("decode-mqa-odd", 1, 33, 3, 1, 12, start=32, scale=0.3),
    sdpa_case("prefill-logit-cap", 8, 32, 4, 2, 16, start=10, logit_cap=2.5),
    sdpa_case("decode-logit-cap-mqa", 1, 48, 4, 1, 16, start=30, logit_cap=1.0),
    sdpa_case("prefill-into-long-cache", 8, 256, 4, 2, 16, start=70),
    sdpa_case("decode-long-cache-cap", 1, 320, 4, 1, 16, start=100, logit_cap=3.0),
    # a row's loops past llvmpipe's 65535 iterations for one work-item: spread over several
    sdpa_case("decode-512-keys-of-64", 1, 512, 4, 2, 64, start=300),
]
