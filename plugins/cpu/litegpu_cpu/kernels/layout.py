"""Data-movement kernels: reshapes as flat copies, TRANSPOSE with a constant permutation."""
from __future__ import annotations

from functools import partial

import numpy as np

from litegpu.backend import NodeContext

from .registry import bindable, kernel
from .tasks import bound_tasks, task_function, uint8_pointer


@kernel("RESHAPE", "SQUEEZE", "EXPAND_DIMS")
def reshape(ctx: NodeContext):
    """Same bytes, new shape: one flat copy into the output (no shape logic at run time)."""
    if int(np.prod(ctx.inputs[0].shape)) != int(np.prod(ctx.outputs[0].shape)):
        return None

    return bindable(lambda inputs, outputs: copy_call(inputs[0], outputs[0]))


def copy_call(x: np.ndarray, out: np.ndarray):
    """A call of no arguments copying ``x`` into ``out`` (same size and dtype, any shapes):
    a task function when both are C-contiguous, so it chains with its neighbours."""
    if x.dtype == out.dtype and x.flags.c_contiguous and out.flags.c_contiguous:
        return bound_tasks(_copy_task, 1, (x, out), np.array([x.nbytes], np.int64))
    # ``out[...] = x`` copies like np.copyto, without its dispatch overhead. (Reshaping a
    # non-contiguous ``x`` copies it: only arrays of one shape may be bound for later runs.)
    if x.shape == out.shape:
        return partial(out.__setitem__, Ellipsis, x)
    return partial(out.reshape(-1).__setitem__, Ellipsis, x.reshape(-1))


@task_function()
def _copy_task(t, xp, outp, _a2, _a3, _a4, _a5, _a6, _a7, ip, _fp):
    """Copy ``ip[0]`` bytes."""
    x, out = uint8_pointer(xp), uint8_pointer(outp)
    for i in range(ip[0]):
        out[i] = x[i]


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
