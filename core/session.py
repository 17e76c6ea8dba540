"""A loaded model with its backends, options and state: what both public APIs share.

The Interpreter and CompiledModel are thin façades over a :class:`Session`. It
resolves the backend preference list, compiles subgraphs for given input shapes
(caching them, so control flow re-uses compiled bodies), keeps resource variables
across invokes, and offers ``call_subgraph`` to control-flow kernels.
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import numpy as np

from .backend import Backend, CompileOptions
from .errors import BackendUnavailableError, InvalidArgumentError, ResourceLimitError
from .executor import CompiledSubgraph, Limits, make_runtime
from .graph import Model
from .model import load_model
from .ops import TensorSpec
from .partition import CPU
from .plugins import manager

log = logging.getLogger("litegpu")
_MAX_CALL_DEPTH = 64


@dataclass
class Delegate:
    """A request to run on a named backend, as returned by :func:`litegpu.load_delegate`."""

    backend: str
    options: dict = field(default_factory=dict)


def load_delegate(library: str, options: dict | None = None) -> Delegate:
    """Name a backend to delegate to, the way ``tflite.load_delegate`` names a delegate library.

    ``library`` is a backend name (``"cpu"``, ``"opencl"``, a plugin's name) or ``"GPU"``.
    Raises :class:`BackendUnavailableError` naming why, when the backend cannot be used.
    """
    options = dict(options or {})
    if library.upper() == "GPU":
        return Delegate("GPU", options)
    manager().available_backend(library)
    return Delegate(library, options)


def resolve_backends(names: list[str]) -> list[Backend]:
    """Backends for a preference list; "GPU" means any available non-cpu backend, with a warning if none."""
    pm = manager()
    out: list[Backend] = []
    for name in names:
        if name.upper() == "GPU":
            gpus = [b for b in pm.backends.values() if b.name != CPU and getattr(b, "is_gpu", False)
                    and b.available()[0]]
            if not gpus:
                log.warning("GPU acceleration was requested but no GPU backend is available; running on cpu")
            out.extend(b for b in gpus if b not in out)
            continue
        backend = pm.available_backend(name)
        if backend not in out:
            out.append(backend)
    return out


class Session:
    """A model plus everything needed to run it repeatedly."""

    def __init__(self, model: Model, backend_names: list[str], num_threads: int = 0,
                 precision_loss_allowed: bool = False, max_delegated_partitions: int = 0,
                 limits: Limits | None = None) -> None:
        self.model = model
        self.backends = resolve_backends(backend_names)
        self.cpu = manager().backend(CPU)
        self.limits = limits or Limits()
        self.max_delegated_partitions = max_delegated_partitions
        self.resources: dict = {}
        self._depth = 0
        self.options = CompileOptions(num_threads=num_threads or min(os.cpu_count() or 1, 4),
                                      precision_loss_allowed=precision_loss_allowed,
                                      runtime=make_runtime(self.call_subgraph, self.resources, self.limits))
        self._cache: dict[tuple, CompiledSubgraph] = {}
        self._calls: dict[tuple, CompiledSubgraph] = {}   # control flow's fast path, keyed by input shapes

    def compile(self, sg_index: int, input_shapes: dict[int, tuple[int, ...]] | None = None) -> CompiledSubgraph:
        """The subgraph compiled for ``input_shapes`` (default: the model's shapes); cached."""
        sg = self.model.subgraphs[sg_index]
        shapes = {t: tuple(sg.tensors[t].shape) for t in sg.inputs}
        shapes.update(input_shapes or {})
        key = (sg_index, tuple(sorted(shapes.items())))
        compiled = self._cache.get(key)
        if compiled is None:
            specs = {t: TensorSpec(shape, sg.tensors[t].dtype) for t, shape in shapes.items()}
            compiled = CompiledSubgraph(self.model, sg_index, specs, self.backends, self.cpu, self.options,
                                        self.max_delegated_partitions, self.limits)
            self._cache[key] = compiled
        return compiled

    def call_subgraph(self, sg_index: int, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """Run subgraph ``sg_index`` on ``inputs`` (control flow); returns copies of its outputs."""
        try:
            key = (sg_index, *[a.shape for a in inputs])
        except AttributeError:   # not arrays: the general path converts them
            key = None
        call = self._calls.get(key)
        if call is None:
            call = self._subgraph_call(sg_index, inputs)
        if self._depth >= _MAX_CALL_DEPTH:
            raise ResourceLimitError(f"subgraph calls nested deeper than {_MAX_CALL_DEPTH}")
        self._depth += 1
        try:
            return call(inputs)
        finally:
            self._depth -= 1

    def _subgraph_call(self, sg_index: int, inputs: list) -> "_SubgraphCall":
        """The cached call of subgraph ``sg_index`` compiled for the shapes of ``inputs``."""
        if not 0 <= sg_index < len(self.model.subgraphs):
            raise InvalidArgumentError(f"subgraph {sg_index} does not exist; the model has "
                                       f"{len(self.model.subgraphs)}")
        sg = self.model.subgraphs[sg_index]
        if len(inputs) != len(sg.inputs):
            raise InvalidArgumentError(f"subgraph {sg_index} takes {len(sg.inputs)} inputs, got {len(inputs)}")
        shapes = [np.shape(v) for v in inputs]
        key = (sg_index, *shapes)
        call = self._calls.get(key)
        if call is None:
            compiled = self.compile(sg_index, dict(zip(sg.inputs, shapes)))
            call = self._calls[key] = _SubgraphCall(compiled)
        return call

    def reset_variables(self) -> None:
        """Forget resource variables and CALL_ONCE state (a fresh interpreter's state)."""
        self.resources.clear()


class _SubgraphCall:
    """Calls one compiled subgraph with inputs of the shapes it was compiled for.

    Work that does not depend on the values is done once: which input tensors any node
    reads (an input nothing reads, such as a loop-carried value a condition ignores, is
    not copied in), their host arrays and dtypes.
    """

    def __init__(self, compiled: CompiledSubgraph) -> None:
        sg = compiled.sg
        read = {t for node in sg.nodes for t in node.inputs} | set(sg.outputs)
        self.compiled = compiled
        self.inputs = [(pos, compiled.host[t], compiled.host[t].dtype) for pos, t in enumerate(sg.inputs)
                       if t in read]
        self.outputs = list(sg.outputs)
        self.run = compiled.run
        self.fixed: list[np.ndarray] | None = None   # output arrays, once known not to change

    def __call__(self, inputs: list) -> list[np.ndarray]:
        # Shapes match: the call is chosen by them. ``dst[...] = v`` is np.copyto without
        # its dispatch cost; the dtype test by identity falls back to a (no-op) astype.
        for pos, dst, dtype in self.inputs:
            value = inputs[pos]
            if type(value) is not np.ndarray or value.dtype is not dtype:
                value = np.asarray(value).astype(dtype, copy=False)
            dst[...] = value
        self.run()
        fixed = self.fixed
        if fixed is not None:
            return [a.copy() for a in fixed]
        compiled = self.compiled
        out = [np.array(compiled.output(t)) for t in self.outputs]
        if compiled.fixed:
            self.fixed = [compiled.output(t) for t in self.outputs]
        return out


def open_model(source) -> Model:
    """Load a model from a path or bytes."""
    return load_model(source)


def check_backend_names(names: list[str]) -> None:
    """Raise :class:`BackendUnavailableError` for a named backend that doesn't exist."""
    pm = manager()
    for n in names:
        if n.upper() != "GPU" and n not in pm.backends:
            raise BackendUnavailableError(f"no backend named {n!r}; available: {sorted(pm.backends)}")
