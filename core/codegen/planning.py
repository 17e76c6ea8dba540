"""What a codegen GPU backend runs and how it groups nodes: the same for every dialect.

A GPU plugin's ``supports`` and ``schedule`` (see :class:`litegpu.backend.Backend`)
delegate here, so every GPU API takes exactly the nodes the kernels can render.
"""
from __future__ import annotations

import numpy as np

from litegpu.backend import NodeContext, Support
from litegpu.errors import LiteGpuError
from litegpu.graph import Model

from .dialect import Dialect
from .fusion import chain_steps, fuse_regions
from .opencl import OPENCL
from .kernels import Decline, load_all
from .nodegen import Precision
from .render import generate, kernel_lanes

#: Tensor types the kernels handle (bool is stored as uint8).
DTYPES = frozenset(np.dtype(t) for t in (np.float32, np.int32, np.int64, np.bool_, np.uint8, np.int8, np.int16))


def supports(node: NodeContext, model: Model, dialect: Dialect = OPENCL) -> Support:
    """Whether a kernel renders for ``node`` in ``dialect``, and why not."""
    if node.dynamic:
        # The core names the node an unknown shape comes from; without it the shape
        # depends on this node's own input values.
        return Support(False, node.dynamic_reason or "output shape depends on tensor values (dynamic)")
    for spec in (*node.inputs, *node.outputs):
        if spec is not None and spec.dtype not in DTYPES:
            return Support(False, f"tensor type {spec.dtype} is not supported")
    # Quantized models run on a GPU in their float view (litegpu.float_view), where only
    # the edges' QUANTIZE/DEQUANTIZE touch integers; integer arithmetic stays on cpu.
    if "quant" in node.attrs and node.node.op not in ("QUANTIZE", "DEQUANTIZE"):
        return Support(False, "quantized integer arithmetic runs on cpu (GPUs run the model's float view)")
    if node.node.op not in load_all():
        return Support(False, "operation is not supported")
    specs = {t: s for t, s in zip(node.node.inputs, node.inputs) if t >= 0 and s is not None}
    specs.update(zip(node.node.outputs, node.outputs))
    try:
        generate(node, Precision(), specs, dialect=dialect)
    except Decline as exc:
        return Support(False, str(exc))
    except (KeyError, LiteGpuError) as exc:
        return Support(False, f"no kernel for this variant: {exc}")
    return Support(True)


def schedule(nodes: list[NodeContext], outputs: list[int], dialect: Dialect, lanes: int | None = None
             ) -> list[list[int]]:
    """Each producer with the elementwise nodes folded into its kernel, an attention's nodes
    as one kernel where kernels have ``lanes`` > 1 (:func:`.render.kernel_lanes`, a GPU's by
    default: on a CPU device one work-item a row of scores is slower than the nodes' kernels),
    and the steps that only move, join and combine float elements fused into regions (see
    :mod:`.fusion`), within the dialect's buffer parameters and local memory."""
    load_all()
    lanes = kernel_lanes() if lanes is None else lanes
    steps = chain_steps(nodes, outputs, dialect.max_buffers, dialect.max_local_bytes if lanes > 1 else 0)
    return fuse_regions(nodes, steps, outputs, dialect.max_buffers)
