"""Fused ops for litert-torch's composites: ``odml.rms_norm`` and
``odml.scaled_dot_product_attention``.

A STABLEHLO_COMPOSITE whose name is one of these becomes one node of the op at load
(:mod:`litegpu.model.composites`), when the op takes it: its attributes and operands pass
``attrs`` and, for rms_norm, its decomposition is the one litert-torch writes
(:func:`rms_norm_decomposition_check`). Otherwise the reader inlines the decomposition,
which computes the same thing from ordinary ops, and says why in its log.

What each computes is what LiteRT computes for it on the CPU:

- ``odml.rms_norm(x, w)`` (attribute ``epsilon``): LiteRT runs the decomposition,
  ``(x * rsqrt(mean(x * x, last axis) + epsilon)) * w`` in float32, w a vector over x's
  last axis.
- ``odml.scaled_dot_product_attention(q, k, v, mask)`` (attributes ``scale``, optional
  ``logit_cap``), q ``[B, T, H, D]``, k and v ``[B, S, KV, D]`` with H a multiple of KV
  (query head h reads kv head ``h // (H / KV)``, torch's ``repeat_interleave``), a
  float mask broadcast to ``[B, H, T, S]``: LiteRT's XNNPACK delegate does not call the
  decomposition but lowers the composite itself (``VisitDotAttentionNode``):
  ``softmax(mask + cap(q * scale @ k^T)) @ v`` per head, ``cap(s) = tanh(s / logit_cap) *
  logit_cap`` when the attribute is there. The decomposition (torch's math attention)
  scales q and k by ``sqrt(scale)`` each instead: the same values to a rounding, which a
  quantized model's next layer can turn into a different quantum, so the fused op
  follows LiteRT. A composite without a mask is refused: litert-torch's decomposition of
  it is causal, LiteRT's lowering unmasked; the decomposition runs.

litert-torch writes this composite only for its "legacy" KV layout (k and v ``[B, S, KV,
D]``); its LiteRT-LM layout (V transposed) exports plain ops. Operands of another layout
are refused by their shapes.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from ..errors import ModelFormatError, UnsupportedError
from ..graph import Node, Subgraph, Tensor
from .reduce import softmax
from .registry import VIEW_OPS, OpDef, TensorSpec, check_inputs, register

RMS_NORM = "odml.rms_norm"
SDPA = "odml.scaled_dot_product_attention"
_F32 = np.dtype(np.float32)


def _operand(node: Node, tensors: Sequence[Tensor], i: int, what: str) -> Tensor:
    """Input ``i`` (named ``what``), which must be there and be a float32 tensor."""
    t = node.inputs[i]
    if not 0 <= t < len(tensors):
        raise ModelFormatError(f"{what} (input {i}) is missing")
    tensor = tensors[t]
    if tensor.dtype != _F32:
        raise UnsupportedError(f"{what} (input {i}) is {tensor.type_name}; the fused op takes FLOAT32")
    return tensor


def _float_attribute(node: Node, name: str, default: float | None = None) -> float:
    """Composite attribute ``name`` as a float32 value (the arithmetic is float32)."""
    value = node.options.get(name, default)
    if value is None:
        raise ModelFormatError(f"composite attribute {name!r} is missing")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ModelFormatError(f"composite attribute {name!r} is {value!r}, not a number")
    value = float(np.float32(value))
    if not math.isfinite(value):
        raise ModelFormatError(f"composite attribute {name!r} is {value}, not finite")
    return value


def _check_output(node: Node, tensors: Sequence[Tensor], shape: tuple[int, ...]) -> None:
    """The node's one output must have ``shape`` (what :func:`infer` gives)."""
    if len(node.outputs) != 1:
        raise ModelFormatError(f"gives {len(node.outputs)} outputs, the fused op one")
    out = tensors[node.outputs[0]]
    if tuple(out.shape) != tuple(shape) or out.dtype != _F32:
        raise UnsupportedError(f"output is {out.type_name} {list(out.shape)}, the fused op gives FLOAT32 "
                               f"{list(shape)}")


# -- odml.rms_norm ---------------------------------------------------------------------------

def rms_norm_shape(x: Sequence[int], w: Sequence[int]) -> tuple[int, ...]:
    """The output shape of rms_norm of ``x`` with weight ``w`` (x's own), or UnsupportedError."""
    if len(x) < 1 or len(w) != 1 or w[0] != x[-1]:
        raise UnsupportedError(f"weight {list(w)} is not a vector over the last axis of x {list(x)}")
    return tuple(x)


def _rms_norm_attrs(node: Node, tensors: Sequence[Tensor]) -> dict:
    check_inputs(node, 2)
    x = _operand(node, tensors, 0, "x")
    w = _operand(node, tensors, 1, "weight")
    _check_output(node, tensors, rms_norm_shape(x.shape, w.shape))
    epsilon = _float_attribute(node, "epsilon")
    if epsilon < 0:
        raise ModelFormatError(f"composite attribute 'epsilon' is {epsilon}, negative")
    return {"epsilon": epsilon}


def _rms_norm_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    return [TensorSpec(rms_norm_shape(inputs[0].shape, inputs[1].shape), inputs[0].dtype)]


def rms_norm(x: np.ndarray, w: np.ndarray, epsilon: float) -> np.ndarray:
    """``(x * rsqrt(mean(x * x) + epsilon)) * w`` over the last axis, in float32, step by step
    as the decomposition computes it."""
    x = np.asarray(x, np.float32)
    mean = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)
    r = np.float32(1) / np.sqrt(mean + np.float32(epsilon))
    return (x * r) * np.asarray(w, np.float32)


def rms_norm_decomposition_check(node: Node, tensors: Sequence[Tensor], body: Subgraph) -> None:
    """Raise UnsupportedError unless ``body`` computes litert-torch's rms norm of its two
    inputs with this epsilon (:func:`rms_norm`) and nothing else: ``MUL(x, x)``, ``MEAN``
    over the last axis, ``ADD`` epsilon, ``RSQRT``, ``MUL(x, r)``, ``MUL(., w)``, with only
    reshapes between them. (litert-torch's ``RMSNorm(with_scale=True)`` multiplies by a
    constant inside the composite that neither its inputs nor its attributes carry.)"""
    if len(body.inputs) != 2 or len(body.outputs) != 1:
        raise UnsupportedError(f"its decomposition (subgraph {body.index}) takes {len(body.inputs)} inputs and "
                               f"gives {len(body.outputs)} outputs, not rms_norm's 2 and 1")
    root: dict[int, int] = {}

    def of(t: int) -> int:
        return root.get(t, t)

    steps = []
    for n in body.nodes:
        if n.op in VIEW_OPS and n.inputs and n.outputs:
            root[n.outputs[0]] = of(n.inputs[0])
        else:
            steps.append(n)
    x, w = body.inputs
    why = _rms_norm_steps_differ(steps, of, x, w, body, _float_attribute(node, "epsilon"))
    if why:
        ops = ", ".join(n.op for n in steps)
        raise UnsupportedError(f"its decomposition (subgraph {body.index}: {ops}) is not litert-torch's rms norm: "
                               f"{why}")


def _rms_norm_steps_differ(steps: list[Node], of, x: int, w: int, body: Subgraph, epsilon: float) -> str:
    """Why ``steps`` (the decomposition's nodes but reshapes) are not the rms norm, or ''."""
    if [n.op for n in steps] != ["MUL", "MEAN", "ADD", "RSQRT", "MUL", "MUL"]:
        return "other ops"
    if any(not n.outputs or len(n.inputs) < (1 if n.op == "RSQRT" else 2) for n in steps):
        return "an op lacks operands"
    square, mean, shift, rsqrt, normed, weighted = steps
    rank = len(body.tensors[x].shape)

    def reads(n: Node, *want: int) -> bool:
        return sorted(of(t) for t in n.inputs[:2]) == sorted(want)

    def constant(t: int) -> np.ndarray | None:
        return body.tensors[t].data if 0 <= t < len(body.tensors) and body.tensors[t].is_constant else None

    axes = constant(mean.inputs[1]) if len(mean.inputs) > 1 else None
    eps = [constant(t) for t in shift.inputs if of(t) != of(mean.outputs[0])]
    checks = [
        (reads(square, x, x), "the square is not x * x"),
        (of(mean.inputs[0]) == of(square.outputs[0]) and axes is not None and axes.size == 1
         and int(axes.reshape(-1)[0]) % max(rank, 1) == rank - 1, "the mean is not over the last axis"),
        (len(eps) == 1 and eps[0] is not None and eps[0].size == 1
         and np.float32(eps[0].reshape(-1)[0]) == np.float32(epsilon), f"it does not add epsilon {epsilon}"),
        (of(rsqrt.inputs[0]) == of(shift.outputs[0]), "the rsqrt is not of mean + epsilon"),
        (reads(normed, x, of(rsqrt.outputs[0])), "x is not multiplied by the rsqrt"),
        (reads(weighted, of(normed.outputs[0]), w), "the normalized x is not multiplied by the weight"),
        (of(weighted.outputs[0]) == of(body.outputs[0]), "its output is not the weighted product"),
    ]
    return next((why for ok, why in checks if not ok), "")


register(OpDef(name=RMS_NORM, attrs=_rms_norm_attrs, infer=_rms_norm_infer,
               reference=lambda inputs, attrs: [rms_norm(inputs[0], inputs[1], attrs["epsilon"])],
               composite_check=rms_norm_decomposition_check,
               doc="litert-torch's RMS norm: (x * rsqrt(mean(x^2) + epsilon)) * w over the last axis."))


# -- odml.scaled_dot_product_attention ---------------------------------------------------------

def sdpa_shape(q: Sequence[int], k: Sequence[int], v: Sequence[int], mask: Sequence[int]) -> tuple[int, ...]:
    """The output shape of attention of q ``[B, T, H, D]`` over k and v ``[B, S, KV, D]`` with
    ``mask`` broadcast to ``[B, H, T, S]`` (q's own), or UnsupportedError saying what does
    not fit."""
    if len(q) != 4 or len(k) != 4 or len(v) != 4:
        raise UnsupportedError(f"q {list(q)}, k {list(k)} and v {list(v)} are not all of rank 4")
    b, t, h, d = q
    if tuple(k) != tuple(v) or k[0] != b or k[3] != d:
        raise UnsupportedError(f"k {list(k)} and v {list(v)} are not both [B, S, KV heads, D] with q's B and D "
                               f"(q {list(q)}): not litert-torch's KV layout of this composite")
    kv = k[2]
    if kv < 1 or h % kv:
        raise UnsupportedError(f"{h} query heads are not a multiple of {kv} kv heads")
    want = (b, h, t, k[1])
    if not 1 <= len(mask) <= 4 or mask[-1] != k[1] or any(m not in (1, n) for m, n in zip(mask[::-1], want[::-1])):
        raise UnsupportedError(f"mask {list(mask)} does not broadcast to [B, H, T, S] = {list(want)} along S")
    return tuple(q)


def _sdpa_attrs(node: Node, tensors: Sequence[Tensor]) -> dict:
    if len(node.inputs) == 3:
        raise UnsupportedError("no mask: litert-torch's decomposition of that is causal, LiteRT's XNNPACK runs it "
                               "unmasked")
    check_inputs(node, 4)
    q, k, v, mask = (_operand(node, tensors, i, what) for i, what in enumerate(("q", "k", "v", "mask")))
    _check_output(node, tensors, sdpa_shape(q.shape, k.shape, v.shape, mask.shape))
    scale = _float_attribute(node, "scale")
    cap = _float_attribute(node, "logit_cap", 0.0)
    if "logit_cap" in node.options and cap <= 0:
        raise ModelFormatError(f"composite attribute 'logit_cap' is {cap}, not positive")
    return {"scale": scale, "logit_cap": cap}


def _sdpa_infer(inputs: list[TensorSpec], attrs: dict) -> list[TensorSpec]:
    return [TensorSpec(sdpa_shape(*(spec.shape for spec in inputs)), inputs[0].dtype)]


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, scale: float,
              logit_cap: float = 0.0) -> np.ndarray:
    """``softmax(mask + cap(q * scale @ k^T)) @ v`` per head, in float32 (see the module
    docstring), q ``[B, T, H, D]``, k and v ``[B, S, KV, D]``."""
    group = q.shape[2] // k.shape[2]
    heads_first = (0, 2, 1, 3)
    qh = np.transpose(q * np.float32(scale), heads_first)               # [B, H, T, D]
    kh = np.repeat(np.transpose(k, heads_first), group, axis=1)          # [B, H, S, D]
    vh = np.repeat(np.transpose(v, heads_first), group, axis=1)
    scores = qh @ np.swapaxes(kh, 2, 3)                                  # [B, H, T, S]
    if logit_cap:
        cap = np.float32(logit_cap)
        scores = np.tanh(scores / cap) * cap
    probs = softmax((mask + scores).astype(np.float32), 1.0)
    return np.transpose(probs @ vh, heads_first).astype(np.float32)      # [B, T, H, D]


register(OpDef(name=SDPA, attrs=_sdpa_attrs, infer=_sdpa_infer,
               reference=lambda inputs, attrs: [attention(*inputs, attrs["scale"], attrs["logit_cap"])],
               doc="litert-torch's attention: softmax(mask + cap(q * scale @ k^T)) @ v with grouped kv heads."))
