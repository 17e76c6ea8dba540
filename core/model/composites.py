"""STABLEHLO_COMPOSITE at load: a fused op where litegpu has one, else its decomposition inlined.

A composite (``odml.rms_norm``, ``odml.scaled_dot_product_attention`` ...) names a
decomposition subgraph that computes it from ordinary ops; LiteRT's interpreter calls that
subgraph, and its delegates recognize some composites by name and run their own kernels
(its GPU path; on the CPU, XNNPACK lowers ``odml.scaled_dot_product_attention`` itself).
litegpu does both at load time:

- a composite whose name is a registered op (see ``litegpu.ops.composite``) becomes one node
  of that op (:func:`as_op_node`: its attributes, a FlexBuffer map, decoded into the node's
  options), so every backend may give it a fused kernel, when the op accepts the node:
  its attributes, operands and decomposition (the reader decides, see
  :func:`lower_composites`);
- any other composite is replaced by the nodes of its decomposition (its own composites
  lowered first), so every backend runs ordinary ops, fused and scheduled with the rest.

Inlined nodes take indices after the file's own operators, so error messages and
profiles never confuse them with a node of the file; their tensors are appended to the
calling subgraph under ``<composite name>/<tensor name>``.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Sequence

from ..errors import ModelFormatError
from ..graph import Node, Subgraph, Tensor
from .flexbuffers import loads
from .schema import BUILTIN_CODES

COMPOSITE = "STABLEHLO_COMPOSITE"
_FLEXBUFFERS = 0     # StableHLOCompositeOptions.composite_attributes_format


def composite_attributes(node: Node) -> dict:
    """A composite node's attributes (its FlexBuffer map) as a dict."""
    raw = node.options.get("composite_attributes")
    if not raw:
        return {}
    if node.options.get("composite_attributes_format", _FLEXBUFFERS) != _FLEXBUFFERS:
        raise ModelFormatError(f"operator {node.index} ({node.options.get('name')}): composite attributes in format "
                               f"{node.options['composite_attributes_format']}, not FlexBuffers")
    value = loads(bytes(raw), f"operator {node.index} ({node.options.get('name')}) composite attributes")
    if not isinstance(value, dict):
        raise ModelFormatError(f"operator {node.index}: composite attributes are a {type(value).__name__}, not a map")
    return value


def as_op_node(node: Node) -> Node:
    """Composite ``node`` as one node of the op of its name: its options are the composite's
    attributes and its ``decomposition_subgraph_index``."""
    options = {**composite_attributes(node),
               "decomposition_subgraph_index": node.options.get("decomposition_subgraph_index", 0)}
    return replace(node, op=node.options["name"], options=options)


#: ``fused(composite, tensors, decomposition)``: the node to run instead of a composite
#: (:func:`as_op_node`), or None to inline its decomposition.
Fused = Callable[[Node, Sequence[Tensor], Subgraph], "Node | None"]


def lower_composites(subgraphs: tuple[Subgraph, ...], fused: Fused) -> tuple[Subgraph, ...]:
    """``subgraphs`` with every composite lowered: to the node ``fused(node, tensors,
    decomposition)`` gives (``tensors``: the calling subgraph's; ``decomposition``: the
    subgraph the composite calls, its own composites lowered), else to its decomposition's
    nodes. Subgraph calls were checked for range and cycles before (the reader's
    ``_check_subgraph_calls``)."""
    if not any(node.op == COMPOSITE for sg in subgraphs for node in sg.nodes):
        return subgraphs
    lowered: dict[int, Subgraph] = {}

    def lower(index: int) -> Subgraph:
        if index not in lowered:
            sg = subgraphs[index]
            lowered[index] = _Inliner(sg, lower, fused).run() if any(n.op == COMPOSITE for n in sg.nodes) else sg
        return lowered[index]

    # Callees first, iteratively: a hostile model may nest thousands of composites.
    for index in _callees_first(subgraphs):
        lower(index)
    return tuple(lowered[i] for i in range(len(subgraphs)))


def _callees_first(subgraphs: tuple[Subgraph, ...]) -> list[int]:
    order, seen = [], set()
    for start in range(len(subgraphs)):
        stack = [(start, False)]
        while stack:
            index, done = stack.pop()
            if done:
                order.append(index)
                continue
            if index in seen:
                continue
            seen.add(index)
            stack.append((index, True))
            stack += [(n.options.get("decomposition_subgraph_index", 0), False)
                      for n in subgraphs[index].nodes if n.op == COMPOSITE]
    return order


class _Inliner:
    """One subgraph with its composites lowered (their decompositions already are)."""

    def __init__(self, sg: Subgraph, lowered: Callable[[int], Subgraph], fused: Fused) -> None:
        self.sg, self.lowered, self.fused = sg, lowered, fused
        self.tensors: list[Tensor] = list(sg.tensors)
        self.nodes: list[Node] = []
        self.next_index = sg.nodes_in_file
        self.inlined: list[tuple[int, str, int]] = []

    def run(self) -> Subgraph:
        for node in self.sg.nodes:
            if node.op != COMPOSITE:
                self.nodes.append(node)
                continue
            one = self.fused(node, self.tensors, self.lowered(node.options.get("decomposition_subgraph_index", 0)))
            if one is not None:
                self.nodes.append(one)
            else:
                self._inline(node)
        return replace(self.sg, tensors=tuple(self.tensors), nodes=tuple(self.nodes),
                       inlined_composites=(*self.sg.inlined_composites, *self.inlined))

    def _inline(self, node: Node) -> None:
        name = node.options.get("name", "") or "composite"
        body = self.lowered(node.options.get("decomposition_subgraph_index", 0))
        where = f"subgraph {self.sg.index} operator {node.index} ({COMPOSITE} {name!r})"
        if len(body.inputs) != len(node.inputs) or len(body.outputs) != len(node.outputs):
            raise ModelFormatError(f"{where}: takes {len(node.inputs)} inputs and gives {len(node.outputs)} outputs, "
                                   f"its decomposition subgraph {body.index} {len(body.inputs)} and "
                                   f"{len(body.outputs)}")
        mapping = dict(zip(body.inputs, node.inputs))
        copies = []
        for inner, outer in zip(body.outputs, node.outputs):
            if inner in mapping or body.tensors[inner].is_constant:
                copies.append((inner, outer))       # an input or constant passed straight out
            else:
                mapping[inner] = outer

        def tensor(inner: int) -> int:
            if inner < 0:
                return inner
            if inner not in mapping:
                t = body.tensors[inner]
                mapping[inner] = len(self.tensors)
                self.tensors.append(replace(t, index=len(self.tensors), name=f"{name}/{t.name}"))
            return mapping[inner]

        first = len(self.nodes)
        for inner_node in body.nodes:
            self._add(replace(inner_node, inputs=tuple(map(tensor, inner_node.inputs)),
                              outputs=tuple(map(tensor, inner_node.outputs)),
                              intermediates=tuple(map(tensor, inner_node.intermediates))))
        for inner, outer in copies:
            shape = list(self.tensors[outer].shape)
            self._add(Node(index=0, op="RESHAPE", opcode=BUILTIN_CODES["RESHAPE"], version=1, inputs=(tensor(inner),),
                           outputs=(outer,), options={"new_shape": shape}))
        self.inlined.append((node.index, name, len(self.nodes) - first))

    def _add(self, node: Node) -> None:
        self.nodes.append(replace(node, index=self.next_index))
        self.next_index += 1
