"""Which elementwise nodes fold into their producer's kernel.

A step is a producer followed by a chain of elementwise nodes, each reading the
previous one's output. A node joins the chain when:

- its op has a formula (:data:`.formulas.UNARY` / :data:`.formulas.BINARY`), or is a reshape
  (the identity on the flat index), and the producer's generator writes through the epilogue;
- the chain's running tensor is read by this node only and is not a partition output
  (nothing else will look at it, so it never needs memory);
- everything is float32 and the output has the running tensor's shape, or its elements in
  the same order ending in the same axis;
- a binary node's other operand is a scalar, a tensor of the same shape, or a vector
  over the last axis (indexable from the output's flat index);
- the kernel keeps within the dialect's buffer parameters (``Dialect.max_buffers``,
  Metal's 31): each follower with a tensor operand adds one.

Some producers are several nodes computed as one (:func:`step_producer`): a square and the
sum of it, an rms norm and the row quantization of its output, an attention's chain of
nodes (:mod:`litegpu.chains`).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np

from litegpu.backend import NodeContext
from litegpu.chains import AttentionChain, attention_chain, reader_counts
from litegpu.ops import VIEW_OPS, TensorSpec
from litegpu.ops.reduce import one_run, reduction_axes

from .formulas import BINARY, UNARY
from .nodegen import Follower
from .kernels import GENERATORS

_F32 = np.dtype(np.float32)


def operand_kind(other: TensorSpec, out_shape: tuple[int, ...]) -> str:
    """How a follower's other operand is indexed from the output's flat index, or ""."""
    shape = tuple(other.shape)
    size = int(np.prod(shape, dtype=np.int64))
    if size == 1:
        return "scalar"
    if shape == tuple(out_shape):
        return "same"
    if out_shape and size == out_shape[-1] and shape[-1:] == tuple(out_shape[-1:]) and len(shape) <= len(out_shape):
        return "channel"
    return ""


def _stores_like(out_shape: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    """Whether a follower's output can be stored where the running tensor (of ``shape``)
    would be: the same shape, or the same elements in the same order ending in the same
    axis (a reshape that keeps the last axis), so a store's flat index and channel are the
    running value's."""
    if out_shape == shape:
        return True
    size = int(np.prod(out_shape, dtype=np.int64))
    return size == int(np.prod(shape, dtype=np.int64)) and out_shape[-1:] == shape[-1:] and bool(shape)


def follower_of(ctx: NodeContext, running: int, shape: tuple[int, ...], chain: Sequence[int] = ()
                ) -> Follower | None:
    """``ctx`` as a follower reading ``running`` (of ``shape``), or None when it cannot be one.
    A reshape that keeps the last axis follows as the identity (its readers index its
    output as the running value's). A binary node's other operand may be a value of the
    ``chain`` so far (the producer's output, an earlier follower's, or ``running`` itself):
    kind ``"chain"``, the kernel's own value (SiLU's ``x * sigmoid(x)`` after a product)."""
    op = ctx.node.op
    if len(ctx.node.outputs) != 1 or ctx.outputs[0].dtype != _F32:
        return None
    out_shape = tuple(ctx.outputs[0].shape)
    if not _stores_like(out_shape, shape):
        return None
    ins = ctx.node.inputs
    if op in VIEW_OPS:
        return Follower(ctx) if ins and ins[0] == running else None
    if op in UNARY and len(ins) >= 1 and ins[0] == running and all(
            s is None or s.value is not None for s in ctx.inputs[1:]):
        return Follower(ctx) if ctx.inputs[0].dtype == _F32 else None
    if op in BINARY and len(ins) == 2 and running in ins:
        swap = ins[1] == running and ins[0] != running
        other = ins[0] if swap else ins[1]
        if other == running or other in chain:
            return Follower(ctx, other, swap, "chain")
        spec = ctx.inputs[0 if swap else 1]
        if spec is None or spec.dtype != _F32:
            return None
        kind = operand_kind(spec, out_shape)
        return Follower(ctx, other, swap, kind) if kind else None
    return None


# Producers whose chain takes no follower reading an earlier value of the chain: a
# convolution's SiLU (``x * sigmoid(x)``) in its store made efficientnet_b0 2.4x slower on
# PoCL (13 -> 32 ms; the vectorized tile loses to the separate elementwise kernel).
_CONVOLUTIONS = frozenset({"CONV_2D", "DEPTHWISE_CONV_2D", "TRANSPOSE_CONV", "CONV_3D"})

# Buffers a producer's kernel may take beyond its tensors (packed weights, tables it uploads).
_GENERATOR_CONSTANTS = 6


def _buffer_cost(f: Follower) -> int:
    """Buffer parameters follower ``f`` adds: one for a tensor operand (a constant scalar is
    inlined, a value of the chain is the kernel's own)."""
    if f.other is None or f.kind == "chain":
        return 0
    return 0 if f.kind == "scalar" and f.ctx.inputs[0 if f.swap else 1].value is not None else 1


def folded_square_sum(square: NodeContext, reduce: NodeContext) -> NodeContext | None:
    """``reduce`` (a float32 MEAN or SUM) of ``x`` with ``squared`` set, when it reads
    ``square``'s output, ``MUL(x, x)``: an rms norm's decomposition. XNNPACK rewrites that
    pair into one sum of squares, each a fused multiply-add (``reduce_sum_squared``), and
    the backends' MEAN and SUM then sum as it does; else None. (The caller checks that
    nothing else reads the square.)"""
    node = square.node
    if node.op != "MUL" or len(node.inputs) != 2 or node.inputs[0] != node.inputs[1] \
            or square.attrs.get("activation", "NONE") != "NONE" or square.dynamic or reduce.dynamic \
            or reduce.node.op not in ("MEAN", "SUM") or not reduce.node.inputs \
            or reduce.node.inputs[0] != node.outputs[0]:
        return None
    if any(s is None or np.dtype(s.dtype) != _F32 for s in (*square.inputs, *square.outputs, *reduce.outputs)):
        return None
    return replace(reduce, node=replace(reduce.node, inputs=(node.inputs[0], *reduce.node.inputs[1:])),
                   attrs={**reduce.attrs, "squared": True}, inputs=[square.inputs[0], *reduce.inputs[1:]])


def folded_rms_quantize(norm: NodeContext, quantize: NodeContext) -> NodeContext | None:
    """``quantize`` (the float view's ROW_QUANTIZE) of ``norm``'s output, an ``odml.rms_norm``:
    one producer, the ROW_QUANTIZE of the norm's inputs with its epsilon
    (``attrs["rms_epsilon"]``), whose kernel normalizes each row as the norm's does and
    quantizes it where it stands (a hybrid decoder's norms feed its products' row
    quantization alone: two launches a layer). None otherwise. (The caller checks that
    nothing else reads the norm's output.)"""
    if norm.node.op != "odml.rms_norm" or quantize.node.op != "ROW_QUANTIZE" or norm.dynamic \
            or quantize.dynamic or len(norm.node.outputs) != 1 or quantize.node.inputs[:1] != norm.node.outputs:
        return None
    if any(s is None or np.dtype(s.dtype) != _F32 for s in (*norm.inputs[:2], *norm.outputs)):
        return None
    return replace(quantize, node=replace(quantize.node, inputs=tuple(norm.node.inputs[:2])),
                   attrs={**quantize.attrs, "rms_epsilon": norm.attrs["epsilon"]}, inputs=list(norm.inputs[:2]))


def folded_pair(first: NodeContext, second: NodeContext) -> NodeContext | None:
    """The one producer that two nodes in a row make (:func:`folded_square_sum` over one
    run of axes, :func:`folded_rms_quantize`), or None."""
    folded = folded_square_sum(first, second)
    if folded is not None:
        return folded if _one_run(folded) else None
    return folded_rms_quantize(first, second)


def _one_run(reduce: NodeContext) -> bool:
    """A reduction over constant axes that are one run of adjacent axes (XNNPACK's sums)."""
    axes = reduce.inputs[1] if len(reduce.inputs) > 1 else None
    if axes is None or axes.value is None:
        return False
    return one_run(reduction_axes(np.asarray(axes.value), len(reduce.inputs[0].shape)))


def folded_attention(chain: AttentionChain) -> NodeContext:
    """An attention's chain of nodes (:func:`litegpu.chains.attention_chain`) as one
    producer: its first BATCH_MATMUL with inputs q, k, mask and v, the last's output, and
    the chain in ``attrs["attention"]`` (:func:`.kernels.composite.attention_chain_kernel`)."""
    first, last = chain.nodes[0], chain.nodes[-1]
    specs = {t: spec for ctx in chain.nodes for t, spec in zip(ctx.node.inputs, ctx.inputs)}
    return replace(first, node=replace(first.node, inputs=tuple(chain.inputs), outputs=last.node.outputs),
                   attrs={**first.attrs, "attention": chain}, inputs=[specs[t] for t in chain.inputs],
                   outputs=list(last.outputs))


def _attention_at(nodes: list[NodeContext], p: int, readers: dict[int, int], max_local_bytes: int
                  ) -> AttentionChain | None:
    """The attention chain starting at position ``p`` whose kernel's rows fit ``max_local_bytes``
    of local memory, if any."""
    from .kernels.composite import MAX_ATTENTION_LANES, attention_local_bytes
    chain = attention_chain(nodes, p, readers) if nodes[p].node.op == "BATCH_MATMUL" else None
    if chain is None:
        return None
    _, _, d, keys, _ = chain.sizes
    return chain if attention_local_bytes(d, keys, MAX_ATTENTION_LANES) <= max_local_bytes else None


def step_producer(nodes: list[NodeContext], step: list[int]) -> tuple[NodeContext, list[int]]:
    """The node a step's kernel is generated for, and the positions of its followers: two
    nodes that fold into one (:func:`folded_pair`) make one producer, as do an attention's
    (:func:`folded_attention`)."""
    if len(step) > 2 and nodes[step[0]].node.op == "BATCH_MATMUL":
        run = [nodes[p] for p in step]
        chain = attention_chain(run, 0, reader_counts(run))   # (the schedule checked the readers outside)
        if chain is not None and len(chain.nodes) == len(run):
            return folded_attention(chain), []
    if len(step) > 1:
        folded = folded_pair(nodes[step[0]], nodes[step[1]])
        if folded is not None:
            return folded, step[2:]
    return nodes[step[0]], step[1:]


def chain_steps(nodes: list[NodeContext], outputs: list[int], max_buffers: int = 0,
                max_local_bytes: int = 0) -> list[list[int]]:
    """Positions grouped into steps: each producer with the followers folded into it
    (within ``max_buffers`` buffer parameters per kernel, when not 0); a node whose output
    only the next reads, folding into it (:func:`folded_pair`: a square and its sum, an rms
    norm and its row quantization), starts that node's step; an attention's chain of nodes
    whose rows fit ``max_local_bytes`` is one step (:func:`folded_attention`). A chain's
    values other than its last are read only inside it (:func:`_closed`)."""
    read_at: dict[int, set[int]] = {}
    for p, c in enumerate(nodes):
        for i in c.node.inputs:
            if i >= 0:
                read_at.setdefault(i, set()).add(p)
    keep = set(outputs)
    readers = reader_counts(nodes, outputs) if max_local_bytes else {}   # (for attention chains)
    steps: list[list[int]] = []
    pos = 0

    def paired(p: int) -> NodeContext | None:
        """The producer that position ``p`` makes with the next node, if they fold into one."""
        value = nodes[p].node.outputs[0] if nodes[p].node.outputs else -1
        if p + 1 < len(nodes) and len(read_at.get(value, ())) == 1 and value not in keep:
            return folded_pair(nodes[p], nodes[p + 1])
        return None

    while pos < len(nodes):
        attention = _attention_at(nodes, pos, readers, max_local_bytes) if max_local_bytes else None
        if attention is not None:
            steps.append(list(range(pos, pos + len(attention.nodes))))
            pos += len(attention.nodes)
            continue
        ctx = nodes[pos]
        step = [pos]
        folded = paired(pos)
        if folded is not None:
            pos += 1
            step.append(pos)
            ctx = folded
        gen = GENERATORS.get(ctx.node.op)
        if gen is not None and gen.epilogue and len(ctx.node.outputs) == 1 and not ctx.dynamic \
                and ctx.outputs[0].dtype == _F32:
            running, shape = ctx.node.outputs[0], tuple(ctx.outputs[0].shape)
            budget = (max_buffers - len(ctx.node.inputs) - 1 - _GENERATOR_CONSTANTS) if max_buffers else None
            chain, start = [running], len(step)
            while pos + 1 < len(nodes) and running not in keep and paired(pos + 1) is None:
                nxt = nodes[pos + 1]
                f = None if nxt.dynamic else follower_of(nxt, running, shape, chain)
                if f is None or (f.kind == "chain" and ctx.node.op in _CONVOLUTIONS):
                    break
                if budget is not None:
                    budget -= _buffer_cost(f)
                    if budget < 0:
                        break
                pos += 1
                step.append(pos)
                running = nxt.node.outputs[0]
                chain.append(running)
            step = _closed(nodes, step, start, read_at, keep)
            pos = step[-1]
        steps.append(step)
        pos += 1
    return steps


def _closed(nodes: list[NodeContext], step: list[int], start: int, read_at: dict[int, set[int]],
            keep: set[int]) -> list[int]:
    """The longest prefix of ``step`` (at least its ``start`` producer positions) whose values
    other than the last are read only inside it and are not partition outputs: they never
    need memory."""
    for end in range(len(step), start, -1):
        inside = set(step[:end])
        if all(t not in keep and read_at.get(t, set()) <= inside
               for p in step[start - 1:end - 1] for t in nodes[p].node.outputs):
            return step[:end]
    return step[:start]


# -- regions ---------------------------------------------------------------------------------

_INDEX_LIMIT = 2 ** 31   # a region's indices are C ints


def _region_op(ctx: NodeContext) -> bool:
    """Whether a region's kernel (:mod:`.kernels.region`) computes ``ctx``: a walk of a float
    tensor by constant arguments, a float CONCATENATION, or a float formula (not the float
    view's exact grid arithmetic, which keeps its own kernels)."""
    from .kernels.layout import WALKS
    op, node = ctx.node.op, ctx.node
    if ctx.dynamic or len(node.outputs) != 1 or ctx.outputs[0] is None or ctx.outputs[0].full_precision:
        return False
    specs = [s for s in ctx.inputs if s is not None]
    # (a walk's or a unary formula's further inputs are its constant arguments)
    operands = specs[:1] if op in WALKS or op in UNARY else specs
    if any(np.dtype(s.dtype) != _F32 or int(np.prod(s.shape, dtype=np.int64)) >= _INDEX_LIMIT
           for s in (ctx.outputs[0], *operands)):
        return False
    if op in WALKS or op in UNARY:
        return op != "QUANT_SIM" and bool(specs) and len(specs) == len(node.inputs) and \
            all(s.value is not None for s in specs[1:])
    if op == "CONCATENATION":
        return bool(specs) and len(specs) == len(node.inputs)
    return op in BINARY and not op.startswith("GRID_") and len(node.inputs) == 2 and len(specs) == 2


def fuse_regions(nodes: list[NodeContext], steps: list[list[int]], outputs: list[int],
                 max_buffers: int = 0) -> list[list[int]]:
    """``steps`` with the steps that only move, join and combine float elements merged into
    regions, each one kernel (:mod:`.kernels.region`). A region grows from its last step
    backwards: a step joins when it is all region ops and every reader of its output is in
    the region (so nothing else needs the output in memory). A region runs at its last
    step's place, and its steps' positions make one step there. Regions of one step, or
    whose kernel would pass ``max_buffers`` parameters, stay as they were."""
    keep = set(outputs)
    produced_by = {nodes[step[-1]].node.outputs[0]: k for k, step in enumerate(steps) if nodes[step[-1]].node.outputs}
    readers: dict[int, set[int]] = {}
    for k, step in enumerate(steps):
        for pos in step:
            for t in nodes[pos].node.inputs:
                readers.setdefault(t, set()).add(k)
    able = [all(_region_op(nodes[pos]) for pos in step) for step in steps]
    claimed: set[int] = set()
    regions: dict[int, set[int]] = {}
    for root in reversed(range(len(steps))):
        # (a lone view launches nothing unless its output is handed out: not worth a region)
        lone_view = len(steps[root]) == 1 and nodes[steps[root][0]].node.op in VIEW_OPS \
            and nodes[steps[root][0]].node.outputs[0] not in keep
        update = _float_update(nodes, steps[root])
        if root in claimed or not (able[root] or update) or lone_view:
            continue
        members, grew = {root}, True

        def reads(k: int) -> list[int]:   # (a KV-cache write's region makes its update only)
            return [nodes[steps[k][0]].node.inputs[1]] if k == root and update else \
                [t for pos in steps[k] for t in nodes[pos].node.inputs]
        while grew:
            grew = False
            for t in {t for k in members for t in reads(k)}:
                k = produced_by.get(t)
                if k is not None and k not in members and k not in claimed and able[k] and t not in keep \
                        and readers[t] <= members:
                    members.add(k)
                    grew = True
        if len(members) > 1 and (not max_buffers or _region_buffers(nodes, steps, members) <= max_buffers):
            claimed |= members
            regions[root] = members
    return [sorted(pos for k in regions[j] for pos in steps[k]) if j in regions else step
            for j, step in enumerate(steps) if j not in claimed or j in regions]


def _float_update(nodes: list[NodeContext], step: list[int]) -> bool:
    """Whether ``step`` is a lone DYNAMIC_UPDATE_SLICE of float tensors: a region may end in
    its update (:func:`.kernels.region.region_kernels`)."""
    ctx = nodes[step[0]]
    return len(step) == 1 and ctx.node.op == "DYNAMIC_UPDATE_SLICE" and not ctx.dynamic \
        and all(s is not None and np.dtype(s.dtype) == _F32 for s in (*ctx.inputs[:2], ctx.outputs[0]))


def _region_buffers(nodes: list[NodeContext], steps: list[list[int]], members: set[int]) -> int:
    """A region's kernel parameters: the tensors it reads (a constant scalar is inlined) and its output."""
    inside = {nodes[pos].node.outputs[0] for k in members for pos in steps[k]}
    read = {(t, spec.value is not None and int(np.prod(spec.shape, dtype=np.int64)) == 1)
            for k in members for pos in steps[k] for t, spec in zip(nodes[pos].node.inputs, nodes[pos].inputs)
            if t not in inside}
    return sum(1 for _, scalar in read if not scalar) + 1


def is_region(nodes: list[NodeContext], step: list[int]) -> bool:
    """Whether ``step`` is a region (:func:`fuse_regions`), not a producer and its followers."""
    if len(step) < 2:
        return False
    if step != list(range(step[0], step[0] + len(step))):
        return True
    return _chain(nodes, step) is None


def _chain(nodes: list[NodeContext], step: list[int]) -> list[Follower] | None:
    """The followers of a producer-and-followers step, or None when ``step`` is not one."""
    out: list[Follower] = []
    producer, positions = step_producer(nodes, step)
    running = producer.node.outputs[0]
    shape = tuple(producer.outputs[0].shape)
    chain = [running]
    for pos in positions:
        f = follower_of(nodes[pos], running, shape, chain)
        if f is None:
            return None
        out.append(f)
        running = nodes[pos].node.outputs[0]
        chain.append(running)
    return out


def followers(nodes: list[NodeContext], step: list[int]) -> list[Follower]:
    """The followers of a step, each with its operand's indexing."""
    out = _chain(nodes, step)
    assert out is not None, "a scheduled follower must still qualify"
    return out
