"""Chains of nodes a backend may run as one step: a decoder's attention.

litert-torch writes a decoder's attention without its composite as a chain of nodes:

    scores = BATCH_MATMUL(q, k)          [..., M, C] over the whole KV cache (C keys)
    (a logit cap: MUL, TANH, MUL)
    (RESHAPE)  scores + mask  (RESHAPE)  the mask -inf past each query's position
    probs = SOFTMAX(scores)
    out = BATCH_MATMUL(probs, v)         [..., M, Dv]

:func:`attention_chain` finds one; each backend runs it its own way (the cpu over the keys
the mask leaves visible, a GPU as one kernel a work-group per row of scores), computing
what the nodes compute.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .backend import NodeContext

F32 = np.dtype(np.float32)
# The ops the scores may pass before the mask (a logit cap), by a float32 constant but TANH.
SCORE_OPS = ("MUL", "DIV", "TANH")


@dataclass
class AttentionChain:
    """The nodes of one attention (:func:`attention_chain`): inputs q, k, mask, v; output
    the second product's."""

    nodes: list[NodeContext]
    inputs: list[int]
    outputs: list[int]
    k_transposed: bool        # k given as [..., C, D] (the first product's adj_y)
    v_transposed: bool        # v given as [..., Dv, C] (the second's adj_y)
    score_ops: tuple = ()     # (op, constant) of each op on the scores before the mask (SCORE_OPS)

    @property
    def sizes(self) -> tuple[int, int, int, int, int]:
        """``(batches, M, D, C, Dv)``: the batch count (q's leading axes), query rows per
        batch, the head dimension, the keys and the value dimension."""
        first, last = self.nodes[0], self.nodes[-1]
        q_shape = tuple(int(n) for n in first.inputs[0].shape)
        return (int(np.prod(q_shape[:-2], dtype=np.int64)), q_shape[-2], q_shape[-1],
                int(first.outputs[0].shape[-1]), int(last.outputs[0].shape[-1]))

    @property
    def mask_shape(self) -> tuple[int, ...]:
        """The mask's shape."""
        add = self.add
        return tuple(int(n) for n in add.inputs[add.node.inputs.index(self.inputs[2])].shape)

    @property
    def add(self) -> NodeContext:
        """The ADD of the mask."""
        return next(ctx for ctx in self.nodes if ctx.node.op == "ADD")

    def mask_rows(self) -> np.ndarray:
        """For each row of scores (their leading axes flattened, in order), the offset of the
        mask's row added to it (the mask broadcast as the ADD broadcasts it)."""
        shape = tuple(int(n) for n in self.add.outputs[0].shape)
        mask_shape = self.mask_shape
        lead = shape[:-1]
        aligned = (1,) * (len(shape) - len(mask_shape)) + mask_shape
        strides = np.zeros(len(lead), np.int64)
        step = shape[-1]
        for axis in range(len(lead) - 1, -1, -1):
            if aligned[axis] != 1:
                strides[axis] = step
            step *= aligned[axis]
        index = np.indices(lead, dtype=np.int64).reshape(len(lead), -1) if lead else np.zeros((0, 1), np.int64)
        return (strides[:, None] * index).sum(axis=0)


def reader_counts(nodes: list[NodeContext], outputs=()) -> dict[int, int]:
    """How many of ``nodes`` read each tensor, plus one for each of ``outputs`` (read after them)."""
    readers: dict[int, int] = dict.fromkeys(outputs, 1)
    for ctx in nodes:
        for t in ctx.node.inputs:
            readers[t] = readers.get(t, 0) + 1
    return readers


def attention_chain(nodes: list[NodeContext], i: int, readers: dict[int, int]) -> AttentionChain | None:
    """The attention starting at ``nodes[i]`` (see the module docstring), when ``nodes[i:]``
    begin with one: a float32 BATCH_MATMUL, RESHAPEs, an ADD of a mask (no activation;
    the mask's last axis the keys', broadcast over the rest), RESHAPEs, a SOFTMAX (beta
    1), RESHAPEs, and a BATCH_MATMUL of the probabilities (shaped as the scores) and v,
    each value read by the next node alone (``readers``: how many nodes or outputs read
    each tensor). None otherwise."""
    first = nodes[i]
    if first.node.op != "BATCH_MATMUL" or not _plain_product(first):
        return None
    q, k = first.inputs[0], first.inputs[1]
    q_shape, k_shape, scores_shape = tuple(q.shape), tuple(k.shape), tuple(first.outputs[0].shape)
    if len(q_shape) < 3 or q_shape[:-2] != k_shape[:-2] or len(scores_shape) != len(q_shape):
        return None
    c = scores_shape[-1]
    chain = [first]
    value = first.node.outputs[0]
    stage = "add"
    v_view = None       # a RESHAPE of v among the chain's nodes: (its input, its output)
    score_ops = []
    for ctx in nodes[i + 1:]:
        op = ctx.node.op
        if op == "RESHAPE" and v_view is None and value not in ctx.node.inputs and readers.get(
                ctx.node.outputs[0], 0) == 1:
            v_view = (ctx.node.inputs[0], ctx.node.outputs[0])
            chain.append(ctx)
            continue
        if readers.get(value, 0) != 1 or value not in ctx.node.inputs:
            return None
        if op == "RESHAPE" and ctx.node.inputs[0] == value and tuple(ctx.outputs[0].shape)[-1:] == (c,):
            pass
        elif stage == "add" and (score_op := _score_op(ctx, value)) is not None:
            score_ops.append(score_op)
        elif op == "ADD" and stage == "add" and _mask_add(ctx, value, c):
            stage = "softmax"
        elif op == "SOFTMAX" and stage == "softmax" and float(ctx.attrs.get("beta", 1.0)) == 1.0 \
                and ctx.inputs[0].dtype == F32:
            stage = "product"
        elif op == "BATCH_MATMUL" and stage == "product" and ctx.node.inputs[0] == value and _plain_product(ctx) \
                and tuple(ctx.inputs[0].shape) == scores_shape:
            v_shape = tuple(ctx.inputs[1].shape)
            v_transposed = bool(ctx.attrs.get("adj_y"))
            if v_shape[:-2] != q_shape[:-2] or (v_shape[-1] if v_transposed else v_shape[-2]) != c:
                return None
            v = ctx.node.inputs[1]
            if v_view is not None:      # the reshape is a view: its input holds v's values in order
                if v != v_view[1]:
                    return None
                v = v_view[0]
            chain.append(ctx)
            return AttentionChain(chain, [first.node.inputs[0], first.node.inputs[1], _other(chain, "ADD"), v],
                                  [ctx.node.outputs[0]], bool(first.attrs.get("adj_y")), v_transposed,
                                  tuple(score_ops))
        else:
            return None
        chain.append(ctx)
        value = ctx.node.outputs[0]
    return None


def _score_op(ctx: NodeContext, value: int) -> tuple[str, float] | None:
    """``(op, constant)`` of a node the scores may pass before the mask (a logit cap):
    a TANH, or a MUL or DIV of them by a float32 constant scalar, no activation; None for
    any other node."""
    if ctx.node.inputs.count(value) != 1 or ctx.outputs[0].dtype != F32 \
            or tuple(ctx.outputs[0].shape) != tuple(ctx.inputs[ctx.node.inputs.index(value)].shape):
        return None
    if ctx.node.op == "TANH":
        return "TANH", 0.0
    if ctx.node.op not in ("MUL", "DIV") or ctx.attrs.get("activation", "NONE") != "NONE":
        return None
    other = ctx.inputs[1 - ctx.node.inputs.index(value)]
    if other.value is None or other.dtype != F32 or np.size(other.value) != 1 \
            or (ctx.node.op == "DIV" and ctx.node.inputs[0] != value):
        return None
    return ctx.node.op, float(np.asarray(other.value).reshape(()))


def _plain_product(ctx: NodeContext) -> bool:
    """A float32 BATCH_MATMUL without adj_x, of non-empty operands with one batch shape."""
    a, b, out = ctx.inputs[0], ctx.inputs[1], ctx.outputs[0]
    return (not ctx.attrs.get("adj_x") and all(s.dtype == F32 for s in (a, b, out))
            and all(n > 0 for s in (a, b, out) for n in s.shape) and len(a.shape) == len(b.shape))


def _mask_add(ctx: NodeContext, value: int, c: int) -> bool:
    """An ADD of the chain's ``value`` and a float32 mask over its last axis of ``c`` keys."""
    if ctx.attrs.get("activation", "NONE") != "NONE" or ctx.node.inputs.count(value) != 1:
        return False
    other = ctx.inputs[1 - ctx.node.inputs.index(value)]
    out, scores = tuple(ctx.outputs[0].shape), tuple(ctx.inputs[ctx.node.inputs.index(value)].shape)
    mask = tuple(other.shape)
    try:
        broadcast = np.broadcast_shapes(scores, mask)
    except ValueError:
        return False
    # The scores are not repeated (the output holds them in their order, perhaps with
    # leading axes of 1 more), the mask is, along every axis but the keys'.
    return (other.dtype == F32 and broadcast == out and np.prod(out) == np.prod(scores) and mask[-1:] == (c,))


def _other(chain: list[NodeContext], op: str) -> int:
    """The operand of the chain's ``op`` node that no node of the chain produced."""
    produced = {ctx.node.outputs[0] for ctx in chain}
    node = next(ctx for ctx in chain if ctx.node.op == op)
    return next(t for t in node.node.inputs if t not in produced)
