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

Quantized nodes (``"quant"`` in their attrs: operands that are quantized integers) never
get a float kernel, whatever dtypes a factory would accept: they get a factory registered
for them with ``kernel(..., quantized=True)`` (the integer kernels), else the op's
integer reference. The guard is here, in :func:`make_kernel`, and in :mod:`..fusion`.
The one exception is pure data movement (:data:`litegpu.ops.quantized.DATA_MOVEMENT`:
values are copied, never computed), whose kernels take any dtype.
"""
from __future__ import annotations

from typing import Callable

from litegpu.backend import REFERENCE, NodeContext
from litegpu.ops.quantized import DATA_MOVEMENT

Kernel = Callable[[list, list], None]
Factory = Callable[[NodeContext], "Kernel | None"]

KERNELS: dict[str, Factory] = {}
# Factories for quantized nodes (integer kernels), by op name.
QUANTIZED_KERNELS: dict[str, Factory] = {}


def kernel(*ops: str, quantized: bool = False):
    """Register the decorated factory for ``ops`` (for their quantized nodes with
    ``quantized``: an integer kernel; a float factory never sees such a node). Several
    modules may register one op (the int8 and the int16 kernels of CONV_2D): the op's
    factory then asks each in the order they registered, and the first kernel wins."""
    table = QUANTIZED_KERNELS if quantized else KERNELS

    def wrap(factory: Factory) -> Factory:
        for op in ops:
            table[op] = factory if op not in table else _first_of(table[op], factory)
        return factory
    return wrap


def _first_of(*factories: Factory) -> Factory:
    """A factory asking ``factories`` in turn; the kernel it returns is named after the one
    that made it."""
    def factory(ctx: NodeContext):
        for each in factories:
            k = each(ctx)
            if k is not None:
                if not getattr(k, "kernel_name", None):
                    k.kernel_name = f"{each.__module__.rsplit('.', 1)[-1]}.{each.__name__}"
                return k
        return None
    factory.__module__, factory.__name__ = factories[0].__module__, factories[0].__name__
    return factory


def is_quantized_node(ctx: NodeContext) -> bool:
    """True for a node whose operands are quantized integers (it carries ``attrs["quant"]``)."""
    return "quant" in ctx.attrs


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


def one_input_reference(ctx: NodeContext) -> Callable:
    """``f(values) -> result``: the one-input node's reference on ``values``, followed by
    that of the node it computes too (``attrs["then"]``, see
    :func:`.qelementwise.folded_table`: ADD, SUB or MUL of its input and its result)."""
    reference = ctx.opdef.reference_for(ctx.attrs)
    then = ctx.attrs.get("then")

    def apply(values):
        result = reference([values], ctx.attrs)[0]
        if then is not None:
            operands = [values if t == ctx.node.inputs[0] else result for t in then.node.inputs]
            result = then.opdef.reference_for(then.attrs)(operands, then.attrs)[0]
        return result
    return apply


def reference_kernel(ctx: NodeContext) -> Kernel:
    """Run the op's numpy reference (the integer one for a quantized node) and copy its
    results into the outputs (a folded follower's, :func:`one_input_reference`, too)."""
    attrs = ctx.attrs
    reference = ctx.opdef.reference_for(attrs)
    if "then" in attrs:
        apply = one_input_reference(ctx)
        reference = lambda inputs, attrs: [apply(inputs[0])]   # noqa: E731

    def run(inputs: list, outputs: list) -> None:
        results = reference(inputs, attrs)
        for out, res in zip(outputs, results):
            out[...] = res

    run.kernel_name = REFERENCE
    return run


def make_kernel(ctx: NodeContext) -> Kernel:
    """The best kernel for a node: a specialized one when registered, else the reference.
    A quantized node only ever gets an integer kernel or its integer reference, but for
    data movement, which takes the dtype-generic kernel (see the module docstring)."""
    op = ctx.node.op
    table = QUANTIZED_KERNELS if is_quantized_node(ctx) and op not in DATA_MOVEMENT else KERNELS
    factory = table.get(op)
    if factory is not None and not ctx.dynamic:
        k = factory(ctx)
        if k is not None:
            if not getattr(k, "kernel_name", None):
                k.kernel_name = f"{factory.__module__.rsplit('.', 1)[-1]}.{factory.__name__}"
            return k
    return reference_kernel(ctx)


def named(k: Kernel, name: str) -> Kernel:
    """``k``, saying which path it is (``inspect --kernels`` shows the name)."""
    k.kernel_name = name
    return k


def kernel_name(k: object) -> str:
    """What a kernel is, for ``inspect --kernels``: the factory that made it (``module.name``,
    or a name the factory gave it), or ``reference``."""
    return getattr(k, "kernel_name", None) or getattr(k, "__name__", type(k).__name__)
