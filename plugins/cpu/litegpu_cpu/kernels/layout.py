"""Data-movement kernels: reshapes as flat copies, TRANSPOSE with a constant permutation."""
from __future__ import annotations

from functools import partial

import numpy as np

from litegpu.backend import NodeContext

from .registry import bindable, kernel


@kernel("RESHAPE", "SQUEEZE", "EXPAND_DIMS")
def reshape(ctx: NodeContext):
    """Same bytes, new shape: one flat copy into the output (no shape logic at run time)."""
    if int(np.prod(ctx.inputs[0].shape)) != int(np.prod(ctx.outputs[0].shape)):
        return None

    # ``out[...] = x`` copies like np.copyto, without its dispatch overhead.
    def bind(inputs, outputs):
        return partial(outputs[0].reshape(-1).__setitem__, Ellipsis, inputs[0].reshape(-1))
    return bindable(bind)


@kernel("TRANSPOSE")
def transpose(ctx: NodeContext):
    """A strided copy with the permutation fixed at compile time."""
    perm_spec = ctx.inputs[1]
    if perm_spec is None or perm_spec.value is None:
        return None
    rank = len(ctx.inputs[0].shape)
    perm = tuple(int(p) % max(rank, 1) for p in np.asarray(perm_spec.value).reshape(-1))

    def run(inputs, outputs):
        np.copyto(outputs[0], inputs[0].transpose(perm))
    return run
