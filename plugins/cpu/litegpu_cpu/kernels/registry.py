"""Kernel factories of the cpu backend, by op name.

A factory takes the node's :class:`~litegpu.backend.NodeContext` at compile time,
precomputes what it can (weight layouts, index tables) and returns
``run(inputs, outputs)``: ``inputs`` are arrays (``None`` for an omitted optional
input), ``outputs`` are preallocated C-contiguous arrays of the inferred shapes,
written in place. A factory may return ``None`` to decline a node (e.g. a dtype it
has no kernel for); the reference kernel is then used.

A kernel may also carry ``bind(inputs, outputs) -> call``: the backend, which hands a
static partition the same arrays on every run, binds each step once and then calls
``call()`` with no arguments, so reshaped views, slices and argument lists are made
once rather than per run. :func:`bindable` builds such a kernel from ``bind`` alone.
"""
from __future__ import annotations

from typing import Callable

from litegpu.backend import NodeContext

Kernel = Callable[[list, list], None]
Factory = Callable[[NodeContext], "Kernel | None"]

KERNELS: dict[str, Factory] = {}


def kernel(*ops: str):
    """Register the decorated factory for ``ops``."""
    def wrap(factory: Factory) -> Factory:
        for op in ops:
            KERNELS[op] = factory
        return factory
    return wrap


def bindable(bind: Callable[[list, list], Callable[[], None]]) -> Kernel:
    """A kernel from ``bind(inputs, outputs) -> call``: run once it binds and calls; the
    backend binds once per set of arrays (see the module docstring)."""
    def run(inputs: list, outputs: list) -> None:
        bind(inputs, outputs)()
    run.bind = bind
    return run


def in_order(calls: list[Callable[[], None]]) -> Callable[[], None]:
    """One call of no arguments making ``calls`` in order: a bound kernel of several steps."""
    if len(calls) == 1:
        return calls[0]

    def run() -> None:
        for call in calls:
            call()
    run.calls = calls   # what it runs, for a caller (or a test) that looks inside
    return run


def reference_kernel(ctx: NodeContext) -> Kernel:
    """Run the op's numpy reference and copy its results into the outputs."""
    reference, attrs = ctx.opdef.reference, ctx.attrs

    def run(inputs: list, outputs: list) -> None:
        results = reference(inputs, attrs)
        for out, res in zip(outputs, results):
            out[...] = res

    return run


def make_kernel(ctx: NodeContext) -> Kernel:
    """The best kernel for a node: a specialized one when registered, else the reference."""
    factory = KERNELS.get(ctx.node.op)
    if factory is not None and not ctx.dynamic:
        k = factory(ctx)
        if k is not None:
            return k
    return reference_kernel(ctx)
