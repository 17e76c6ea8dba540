"""The op registry: one :class:`OpDef` per operator, the single source of truth.

An OpDef holds, for one op:

- ``attrs(node, tensors)``: normalize the node's raw options (and custom options) into a
  plain dict, validating values; raises :class:`ModelFormatError` or
  :class:`UnsupportedError` naming the node.
- ``infer(inputs, attrs)``: output :class:`TensorSpec` s (shape, dtype) from input specs.
  An input spec carries ``value`` when it is known before running (a constant or a
  folded shape computation). When the output shape depends on a value that is not
  known, ``infer`` raises :class:`DynamicShape`; the planner then re-infers at run
  time with concrete values.
- ``reference(inputs, attrs)``: a readable numpy implementation returning the outputs.
- ``composite_check(node, tensors, decomposition)``: optional, for an op named after a
  STABLEHLO_COMPOSITE (see :mod:`litegpu.model.composites`): raises
  :class:`UnsupportedError` when the composite's decomposition subgraph computes something
  the op does not; the reader then inlines the decomposition instead of fusing it.
- ``quantized(inputs, attrs)``: optional, the integer reference for a node whose operands
  are quantized integers (see :mod:`litegpu.quant`): such a node's attrs carry
  ``attrs["quant"]``, a :class:`~litegpu.quant.NodeQuant` computed once here, and
  :meth:`OpDef.reference_for` picks this reference for it. ``quantized_attrs(node,
  tensors, attrs)`` checks the node's quantization and precomputes (multipliers, clamp
  ranges) into more attrs. A quantized node of an op with no integer reference is refused
  when its attrs are computed, at compile time: a float reference never runs on integers.
  Pure data movement (RESHAPE, TRANSPOSE ...) sets ``quantized`` to its plain reference.

Backends add kernels for these ops; they never carry their own shape logic.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import ModelFormatError, UnsupportedError
from ..graph import LazyConstant, Node, Subgraph, Tensor, stored_value
from ..quant import is_quantized, node_quantization


class DynamicShape(Exception):
    """Raised by ``infer`` when an output shape depends on a value unknown before running."""


class _Value:
    """:attr:`TensorSpec.value`: the array it was given, or that of a constant given as the
    model stores it (:class:`~litegpu.graph.LazyConstant`), made when read. So a spec that
    a program keeps holds no copy of the weights once the model releases it."""

    def __get__(self, spec: "TensorSpec | None", owner: type | None = None) -> np.ndarray | None:
        if spec is None:
            return None   # (the field's default)
        return stored_value(spec.__dict__["_value"])

    def __set__(self, spec: "TensorSpec", value: np.ndarray | LazyConstant | None) -> None:
        spec.__dict__["_value"] = value


@dataclass
class TensorSpec:
    """What shape inference knows about a tensor: shape, dtype and maybe its value.

    ``full_precision`` is the model's :attr:`litegpu.graph.Tensor.full_precision`: a
    backend that narrows float storage (half) must keep this tensor at its dtype.
    ``stored`` is the value as the model holds it (see :class:`_Value`).
    """

    shape: tuple[int, ...]
    dtype: np.dtype
    value: np.ndarray | LazyConstant | None = _Value()
    full_precision: bool = False

    @property
    def stored(self) -> np.ndarray | LazyConstant | None:
        """The value as given: a lazy constant still unmade."""
        return self.__dict__["_value"]

    @classmethod
    def of(cls, array: np.ndarray) -> "TensorSpec":
        """The spec of a concrete array (value included)."""
        return cls(tuple(array.shape), array.dtype, array)


AttrsFn = Callable[[Node, Sequence[Tensor]], dict]
InferFn = Callable[[list, dict], list]
ReferenceFn = Callable[[list, dict], list]


@dataclass
class OpDef:
    """Everything litegpu knows about one op, independent of any device."""

    name: str
    infer: InferFn
    reference: ReferenceFn
    attrs: AttrsFn = field(default=lambda node, tensors: {})
    # Ops that need the runtime's services (subgraph calls, resource variables) rather
    # than a plain kernel: control flow and variables.
    stateful: bool = False
    # For stateful ops: ``execute(inputs, attrs, runtime) -> outputs`` replaces ``reference``.
    execute: Callable[[list, dict, Any], list] | None = None
    # Optionally, ``bind(inputs, outputs, attrs, runtime)``: a call of no arguments doing
    # what ``execute`` does on these arrays every time (results written into
    # ``outputs``), or None. A program whose arrays have settled calls it instead of
    # ``execute``; it raises ``litegpu.errors.Unbound`` when its outputs no longer fit.
    bind: Callable[[list, list, dict, Any], Callable[[], None] | None] | None = None
    doc: str = ""
    # Checks against the shapes LiteRT plans a node with when its inputs are resized: the
    # subgraph's inputs at their new shapes, every other tensor at the shape the model
    # declares (XNNPACK fixes some parameters, e.g. a convolution's groups, from those).
    # ``plan_check(planned_shapes, inputs, attrs)`` raises ModelFormatError to refuse.
    plan_check: Callable[[list, list, dict], None] | None = None
    # The integer reference for nodes on quantized integers (see the module docstring),
    # and the check/precomputation of their quantization into attrs.
    quantized: ReferenceFn | None = None
    quantized_attrs: Callable[[Node, Sequence[Tensor], dict], dict] | None = None
    # The same for hybrid (dynamic-range) nodes: float activations in and out, quantized
    # constant weights (``NodeQuant.hybrid``); such a node carries ``attrs["hybrid"]``.
    hybrid: ReferenceFn | None = None
    hybrid_attrs: Callable[[Node, Sequence[Tensor], dict], dict] | None = None
    # For an op that a STABLEHLO_COMPOSITE of its name becomes (see the module docstring).
    composite_check: Callable[[Node, Sequence[Tensor], Subgraph], None] | None = None

    def node_attrs(self, node: Node, tensors: Sequence[Tensor]) -> dict:
        """Normalized attributes of ``node`` (with ``"quant"`` when its operands are
        quantized integers); errors name the node."""
        try:
            attrs = self.attrs(node, tensors)
            quant = node_quantization(node.inputs, node.outputs, tensors)
            if quant is not None:
                attrs = {**attrs, "quant": quant}
                reference, more = (self.hybrid, self.hybrid_attrs) if quant.hybrid else \
                    (self.quantized, self.quantized_attrs)
                if reference is None:
                    kinds = sorted({tensors[t].type_name for t in (*node.inputs, *node.outputs)
                                    if 0 <= t < len(tensors) and is_quantized(tensors[t])})
                    what = "hybrid (float activations, quantized weights)" if quant.hybrid else "integer"
                    listing = "hybrid.hybrid_ops()" if quant.hybrid else "quantized.quantized_ops()"
                    raise UnsupportedError(f"quantized {'/'.join(kinds)} operands: the op has no {what} "
                                           f"reference yet (litegpu.ops.{listing} lists the ops that have one)")
                if quant.hybrid:
                    attrs["hybrid"] = True
                if more is not None:
                    attrs.update(more(node, tensors, attrs))
            return attrs
        except (ModelFormatError, UnsupportedError) as exc:
            raise type(exc)(f"node {node.index} ({node.op}): {exc}") from None
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise ModelFormatError(f"node {node.index} ({node.op}): invalid options: {exc}") from None

    def reference_for(self, attrs: dict) -> ReferenceFn:
        """The reference that computes a node with these attrs: the integer one for a
        quantized node (``"quant"`` in attrs), the hybrid one for a hybrid node, else the
        float one."""
        if attrs.get("hybrid"):
            return self.hybrid
        if "quant" in attrs and self.quantized is not None:
            return self.quantized
        return self.reference


_REGISTRY: dict[str, OpDef] = {}


def register(opdef: OpDef) -> OpDef:
    """Add ``opdef`` to the registry (a plugin's custom op too); returns it."""
    _REGISTRY[opdef.name] = opdef
    return opdef


def get_op(name: str) -> OpDef | None:
    """The OpDef registered under ``name``, or ``None``."""
    return _REGISTRY.get(name)


def all_ops() -> dict[str, OpDef]:
    """A copy of the registry, by op name."""
    return dict(_REGISTRY)


def defop(name: str, *, attrs: AttrsFn | None = None, infer: InferFn, stateful: bool = False):
    """Decorator form: the decorated function is the reference implementation."""

    def wrap(fn: ReferenceFn) -> ReferenceFn:
        register(OpDef(name=name, infer=infer, reference=fn, attrs=attrs or (lambda n, t: {}),
                       stateful=stateful, doc=(fn.__doc__ or "").strip()))
        return fn

    return wrap


# -- helpers shared by op definitions ---------------------------------------------------

def check_inputs(node: Node, low: int, high: int | None = None) -> None:
    """Raise unless the node has between ``low`` and ``high`` inputs (inclusive)."""
    n = len(node.inputs)
    high = low if high is None else high
    if not low <= n <= high:
        want = str(low) if low == high else f"{low}..{high}"
        raise ModelFormatError(f"expects {want} inputs, has {n}")


def need_rank(shape: Sequence[int], ranks: int | tuple[int, ...], what: str) -> None:
    """Raise unless ``shape`` (of the operand named ``what``) has one of ``ranks``."""
    ranks = (ranks,) if isinstance(ranks, int) else ranks
    if len(shape) not in ranks:
        want = " or ".join(str(r) for r in ranks)
        raise ModelFormatError(f"{what} must have rank {want}, has shape {list(shape)}")


def finite_option(node: Node, name: str, default: float = 0.0) -> float:
    """The float option ``name`` (``default`` when absent); a model error unless finite."""
    value = float(node.options.get(name, default))
    if not np.isfinite(value):
        raise ModelFormatError(f"{name} {value} is not finite")
    return value


def const_input(node: Node, tensors: Sequence[Tensor], i: int) -> np.ndarray | None:
    """The constant value of input ``i``, or ``None`` when absent or not constant."""
    if i >= len(node.inputs) or node.inputs[i] < 0:
        return None
    return tensors[node.inputs[i]].data


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """Numpy broadcasting of shapes, with a litegpu error on mismatch."""
    try:
        return tuple(np.broadcast_shapes(*shapes))
    except ValueError:
        raise ModelFormatError(f"shapes {[list(s) for s in shapes]} do not broadcast") from None


def normalize_axis(axis: int, rank: int, what: str = "axis") -> int:
    """``axis`` in ``[0, rank)``, counting negatives from the end."""
    if not -rank <= axis < max(rank, 1):
        raise ModelFormatError(f"{what} {axis} out of range for rank {rank}")
    return axis % max(rank, 1)


def value_of(spec: TensorSpec | None) -> np.ndarray:
    """The known value of an input spec, or raise :class:`DynamicShape`."""
    if spec is None or spec.value is None:
        raise DynamicShape
    return spec.value


#: The clamp ``(lo, hi)`` of each activation: the one table every backend's activations
#: come from. LiteRT applies a fused activation as an output clamp range
#: (CalculateActivationRange); TANH and SIGN_BIT have none, so as fused activations they
#: leave values unchanged (probed against LiteRT). The clamp ops of the same names
#: (RELU, RELU6, RELU_N1_TO_1, and RELU_0_TO_1, which is no fused activation) clamp alike.
ACTIVATION_RANGES: dict[str, tuple[float, float]] = {
    "NONE": (-np.inf, np.inf),
    "RELU": (0.0, np.inf),
    "RELU_N1_TO_1": (-1.0, 1.0),
    "RELU6": (0.0, 6.0),
    "RELU_0_TO_1": (0.0, 1.0),
    "TANH": (-np.inf, np.inf),
    "SIGN_BIT": (-np.inf, np.inf),
}
#: The fused activations that clamp (the codes of ``fused_activation_function`` but TANH, SIGN_BIT).
#: Ops whose output is their input's elements in the same order under another shape: in
#: row-major storage, the same bytes (a runtime may alias the two).
VIEW_OPS = frozenset({"RESHAPE", "SQUEEZE", "EXPAND_DIMS"})

CLAMP_ACTIVATIONS = ("NONE", "RELU", "RELU_N1_TO_1", "RELU6")


def activation_attr(options: dict) -> str:
    """The fused activation name from raw options; unknown codes are a format error."""
    from ..model.schema import ACTIVATIONS as CODES
    code = options.get("fused_activation_function", 0)
    if code not in CODES:
        raise ModelFormatError(f"unknown fused activation {code}")
    return CODES[code]


def apply_activation(x: np.ndarray, activation: str) -> np.ndarray:
    """Apply a fused activation (or a clamp op) by name: its clamp, bounds in ``x``'s dtype."""
    lo, hi = ACTIVATION_RANGES[activation]
    x = np.asarray(x)
    if lo != -np.inf:
        x = np.maximum(x, x.dtype.type(lo))
    if hi != np.inf:
        x = np.minimum(x, x.dtype.type(hi))
    return x


def as_dtype(x: Any, dtype: np.dtype) -> np.ndarray:
    """``x`` as an array of ``dtype`` (no copy when it already is)."""
    return np.asarray(x).astype(dtype, copy=False)
