"""Run one model three ways and compare: LiteRT (the oracle), the op references, a backend.

- :func:`litert_outputs`: ``ai_edge_litert``'s Interpreter, the behaviour to match.
- :func:`reference_outputs`: a tiny device-free evaluator over the numpy references of
  :mod:`litegpu.ops`, node by node; it checks the references themselves.
- :func:`litegpu_outputs`: litegpu's public Interpreter with one backend as delegate.

:func:`max_rel_error` is the measure every comparison uses:
``max|got - want| / max(max|want|, 1)``.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..backend import HALF_ARITHMETIC, NodeContext, Runtime, Support
from ..errors import InvalidArgumentError, UnsupportedError
from ..graph import Model, Subgraph
from ..model import load_model
from ..executor import infer_subgraph
from ..float_view import float_view, is_quantized_model
from ..ops import TensorSpec, get_op
from ..partition import host_only_reason
from ..quant import variable_initial_value

LITERT_THREADS = 2

# F16 (``precision_loss_allowed``): fp16 keeps 11 significant bits (relative step 2**-11, about
# 4.9e-4) and each stored intermediate rounds once, so a case whose chain stores a few values
# stays well within FP16_TOL of max|LiteRT|. 8-bit grid values survive half storage within a
# couple of quanta (int16 values are kept float32), hence FP16_QUANTA more than the case allows.
FP16_TOL = 1e-2
FP16_QUANTA = 2


def litert_outputs(model_bytes: bytes, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Outputs of ``ai_edge_litert``'s Interpreter, in subgraph output order.

    Inputs are set in subgraph input order; an input whose shape differs from the
    model's is resized first.
    """
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_content=bytes(model_bytes), num_threads=LITERT_THREADS)
    details = interp.get_input_details()
    _check_count(len(details), inputs)
    for d, x in zip(details, inputs):
        x = np.asarray(x)
        if tuple(d["shape"]) != x.shape:
            interp.resize_tensor_input(d["index"], list(x.shape), strict=False)
    interp.allocate_tensors()
    for d, x in zip(details, inputs):
        interp.set_tensor(d["index"], np.asarray(x))
    interp.invoke()
    return [np.array(interp.get_tensor(d["index"])) for d in interp.get_output_details()]


#: The delegate options of each GPU precision mode, by LiteRT's names: F32; F32_F16, half
#: storage with float arithmetic; F16, half arithmetic too where the device has it.
PRECISION_OPTIONS = {"F32": {}, "F32_F16": {"precision_loss_allowed": True, HALF_ARITHMETIC: False},
                     "F16": {"precision_loss_allowed": True}}


def precision_ran(report) -> str:
    """The precision mode the GPU programs of ``report`` (a ``DelegationReport``) ran in, as
    their summaries say ("F32" when no program says otherwise)."""
    programs = " ".join(report.programs)
    return next((m for m in ("F32_F16", "F16") if f": {m} (" in programs), "F32")


def litegpu_outputs(model_bytes: bytes, inputs: Sequence[np.ndarray], backend: str,
                    precision_loss_allowed: bool = False, half_arithmetic: bool = True) -> list[np.ndarray]:
    """Outputs of litegpu's Interpreter with ``backend`` as its delegate.

    Uses the public API exactly as a user of ``ai_edge_litert`` would;
    ``precision_loss_allowed`` is the delegate option that allows fp16 (storage, and
    arithmetic unless ``half_arithmetic`` is False: F32_F16).
    """
    import litegpu

    delegate = litegpu.load_delegate(backend, {"precision_loss_allowed": precision_loss_allowed,
                                               HALF_ARITHMETIC: half_arithmetic})
    interp = litegpu.Interpreter(model_content=bytes(model_bytes), experimental_delegates=[delegate])
    details = interp.get_input_details()
    _check_count(len(details), inputs)
    for d, x in zip(details, inputs):
        x = np.asarray(x)
        if tuple(d["shape"]) != x.shape:
            interp.resize_tensor_input(d["index"], list(x.shape))
    interp.allocate_tensors()
    for d, x in zip(details, inputs):
        interp.set_tensor(d["index"], np.asarray(x))
    interp.invoke()
    return [np.array(interp.get_tensor(d["index"])) for d in interp.get_output_details()]


def half_stored(inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """``inputs`` with float32 arrays rounded through float16: what a device in F16 stores.

    LiteRT gets these, so an op that is exact on its inputs (a CAST to int, a comparison)
    must still be exact in F16.
    """
    return [np.asarray(x).astype(np.float16).astype(np.float32) if np.asarray(x).dtype == np.float32
            else np.asarray(x) for x in inputs]


def check_f16(model_bytes: bytes, inputs: Sequence[np.ndarray], backend: str, tol: float,
              quanta: int | None, what: str, half_arithmetic: bool = True) -> str:
    """Compare ``backend`` in F16 (``precision_loss_allowed``; F32_F16 without
    ``half_arithmetic``) with LiteRT on half-rounded inputs.

    Returns a reason to skip (LiteRT's outputs reach beyond fp16's range, which half
    storage cannot hold) or ``""``; raises AssertionError when the outputs differ by more
    than ``max(FP16_TOL, tol)`` (integer outputs of quantized cases: ``quanta`` plus
    FP16_QUANTA), or when F16 made a NaN or infinity that LiteRT did not.
    """
    want = litert_outputs(model_bytes, half_stored(inputs))
    finite = [float(np.abs(w).max()) for w in want if w.dtype.kind == "f" and w.size and np.isfinite(w).all()]
    big = max(finite, default=0.0)
    if big > float(np.finfo(np.float16).max):
        return f"outputs reach {big:g}, beyond the fp16 range (65504): half storage cannot hold them"
    got = litegpu_outputs(model_bytes, inputs, backend, precision_loss_allowed=True, half_arithmetic=half_arithmetic)
    if any(g.dtype.kind == "f" and not np.isfinite(g).all() for g in got) and \
            all(np.isfinite(w).all() for w in want if w.dtype.kind == "f"):
        raise AssertionError(f"{what}: F16 made a NaN or infinity that LiteRT did not")
    compare(got, want, max(FP16_TOL, tol), what, None if quanta is None else quanta + FP16_QUANTA)
    return ""


def reference_outputs(model_bytes: bytes, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Outputs of subgraph 0 evaluated with each op's numpy reference, in output order."""
    model = load_model(model_bytes)
    return _Evaluator(model).run(0, [np.asarray(x) for x in inputs])


class _Evaluator:
    """Evaluates subgraphs node by node; stateful ops run through ``execute`` with a Runtime."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.resources: dict = {}
        self.runtime = Runtime(call_subgraph=self.run, resources=self.resources)

    def run(self, index: int, inputs: list[np.ndarray]) -> list[np.ndarray]:
        sg = self.model.subgraphs[index]
        _check_count(len(sg.inputs), inputs)
        values: dict[int, np.ndarray] = {}
        for t in sg.tensors:
            if t.data is not None:
                values[t.index] = t.data
            elif t.is_variable:
                values[t.index] = np.full(t.shape, variable_initial_value(t), t.dtype)
        for i, x in zip(sg.inputs, inputs):
            values[i] = x
        for node in sg.nodes:
            opdef = get_op(node.op)
            if opdef is None:
                raise UnsupportedError(f"node {node.index} ({node.op}): no reference registered for {node.op}")
            attrs = opdef.node_attrs(node, sg.tensors)
            args = [None if i < 0 else values[i] for i in node.inputs]
            if opdef.stateful:
                outs = opdef.execute(args, attrs, self.runtime)
            else:
                outs = opdef.reference_for(attrs)(args, attrs)
            if len(outs) != len(node.outputs):
                raise AssertionError(f"node {node.index} ({node.op}): reference returned {len(outs)} outputs, "
                                     f"the node has {len(node.outputs)}")
            for o, v in zip(node.outputs, outs):
                values[o] = np.asarray(v)
        return [values[o] for o in sg.outputs]


def node_contexts(model: Model, sg: Subgraph) -> list[NodeContext]:
    """The :class:`NodeContext` s the runtime hands backends for ``sg`` at its model shapes.

    Nodes folded at compile time (all inputs known) are left out, as the runtime
    never asks a backend about them.
    """
    specs = {i: TensorSpec(sg.tensors[i].shape, sg.tensors[i].dtype) for i in sg.inputs}
    contexts, _, _ = infer_subgraph(model, sg, specs)
    return contexts


def unsupported(model_bytes: bytes, backend) -> list[tuple[int, int, str, Support]]:
    """``(subgraph, node, op, answer)`` for every node ``backend`` says it cannot run
    (a GPU backend is asked about a quantized model's float view, which it runs). Nodes
    the core keeps on cpu without asking (control flow, resource variables:
    :func:`litegpu.partition.host_only_reason`) are not asked about here either."""
    model = load_model(model_bytes)
    if backend.is_gpu and is_quantized_model(model):
        model = float_view(model)
    refused = []
    for sg in model.subgraphs:
        for ctx in node_contexts(model, sg):
            if host_only_reason(ctx.node.op):
                continue
            answer = backend.supports(ctx, model)
            if not answer:
                refused.append((sg.index, ctx.node.index, ctx.node.op, answer))
    return refused


def max_rel_error(got: np.ndarray, want: np.ndarray) -> float:
    """``max|got - want| / max(max|want|, 1)``; bool and integer outputs compare exactly.

    A shape mismatch, or any difference in an exact compare, is ``inf``; NaN where
    the other has NaN counts as equal.
    """
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return float("inf")
    if want.size == 0:
        return 0.0
    if want.dtype.kind in "biuSUO" or got.dtype.kind in "biuSUO":
        return 0.0 if np.array_equal(got, want) else float("inf")
    g = got.astype(np.complex128 if got.dtype.kind == "c" else np.float64)
    w = want.astype(np.complex128 if want.dtype.kind == "c" else np.float64)
    same = (g == w) | (np.isnan(g) & np.isnan(w))  # equal infinities and NaN-for-NaN match
    with np.errstate(invalid="ignore"):
        diff = np.where(same, 0.0, np.abs(g - w))
    if np.isnan(diff).any():
        return float("inf")
    finite = np.abs(w[np.isfinite(w)])
    scale = max(float(finite.max()) if finite.size else 0.0, 1.0)
    return float(diff.max()) / scale


def compare(got: Sequence[np.ndarray], want: Sequence[np.ndarray], tol: float, what: str = "",
            quanta: int | None = None) -> None:
    """Raise AssertionError naming the output unless every output matches within ``tol``
    (integer outputs: exactly, or within ``quanta`` when given)."""
    if len(got) != len(want):
        raise AssertionError(f"{what}: {len(got)} outputs, expected {len(want)}")
    for i, (g, w) in enumerate(zip(got, want)):
        g, w = np.asarray(g), np.asarray(w)
        if g.shape != w.shape:
            raise AssertionError(f"{what}: output {i} has shape {list(g.shape)}, expected {list(w.shape)}")
        if g.dtype != w.dtype:
            raise AssertionError(f"{what}: output {i} has dtype {g.dtype}, expected {w.dtype}")
        if quanta is not None and w.dtype.kind in "iu" and w.size:
            off = int(np.abs(g.astype(np.int64) - w.astype(np.int64)).max())
            if off > quanta:
                raise AssertionError(f"{what}: output {i} differs by {off} quanta > {quanta}")
            continue
        err = max_rel_error(g, w)
        if not err <= tol:
            raise AssertionError(f"{what}: output {i} differs: max relative error {err:.3g} > tolerance {tol:g}")


def _check_count(expected: int, inputs: Sequence) -> None:
    if len(inputs) != expected:
        raise InvalidArgumentError(f"the model has {expected} inputs, got {len(inputs)}")
