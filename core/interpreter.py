"""``litegpu.Interpreter``: a drop-in for ``ai_edge_litert.interpreter.Interpreter``."""
from __future__ import annotations

import logging
import os
from typing import Any, Callable, Sequence

import numpy as np

from .errors import ExecutionError, InvalidArgumentError
from .executor import CompiledSubgraph, Limits
from .graph import Subgraph, Tensor
from .model import load_model
from .partition import DelegationReport
from .session import Delegate, Session

log = logging.getLogger("litegpu")


def quantization_details(t: Tensor) -> tuple[tuple[float, int], dict]:
    """LiteRT's ``quantization`` tuple and ``quantization_parameters`` dict for a tensor."""
    q = t.quantization
    scales = np.zeros(0, np.float32) if q is None else q.scales.astype(np.float32)
    zps = np.zeros(0, np.int32) if q is None else q.zero_points.astype(np.int32)
    legacy = (float(scales[0]), int(zps[0]) if zps.size else 0) if scales.size == 1 else (0.0, 0)
    return legacy, {"scales": scales, "zero_points": zps,
                    "quantized_dimension": 0 if q is None else int(q.quantized_dimension), "block_size": 0}


def tensor_details(t: Tensor, shape: Sequence[int] | None = None, name: str | None = None) -> dict:
    """The dict LiteRT returns for one tensor from ``get_input_details`` and friends."""
    legacy, params = quantization_details(t)
    shape = t.shape if shape is None else shape
    return {
        "name": t.name if name is None else name,
        "index": t.index,
        "shape": np.array(shape, np.int32),
        "shape_signature": np.array(t.shape_signature if len(t.shape_signature) == len(shape) else shape, np.int32),
        "dtype": t.dtype.type,
        "quantization": legacy,
        "quantization_parameters": params,
        "sparsity_parameters": {},
    }


def _backend_names(delegates: Sequence[Any] | None) -> tuple[list[str], bool, dict]:
    """Backend names, whether precision loss is allowed, and the other delegate options."""
    names, precision_loss, extra = [], False, {}
    for d in delegates or ():
        if not isinstance(d, Delegate):
            raise InvalidArgumentError(f"experimental_delegates takes litegpu.load_delegate(...) objects, "
                                       f"got {type(d).__name__}")
        names.append(d.backend)
        precision_loss |= bool(d.options.get("precision_loss_allowed", False))
        extra.update((k, v) for k, v in d.options.items() if k != "precision_loss_allowed")
    return names, precision_loss, extra


class Interpreter:
    """Runs a ``.tflite`` model with LiteRT's Interpreter API.

    :param model_path: path of a ``.tflite`` file (memory-mapped).
    :param model_content: the model's bytes, instead of a path.
    :param experimental_delegates: ``litegpu.load_delegate(name)`` objects, in order of preference;
        nodes no delegate supports run on cpu.
    :param num_threads: threads for the cpu backend (None: all cores).
    :param placement: a litegpu extension: ``"first"`` (default) puts each node on the first
        delegate that supports it; ``"measure"`` times that, all-cpu and each delegated
        partition moved to cpu when the interpreter is built, keeps the fastest (never slower
        than all-cpu) and caches the decision on disk. A delegate option ``{"placement": ...}``
        (``load_delegate("opencl", {"placement": "measure"})``) says the same.
    """

    def __init__(self, model_path: str | os.PathLike | None = None, model_content: bytes | None = None,
                 experimental_delegates: Sequence[Any] | None = None, num_threads: int | None = None,
                 experimental_op_resolver_type: Any = None, experimental_preserve_all_tensors: bool = False,
                 max_delegated_partitions: int = 0, limits: Limits | None = None, placement: str | None = None,
                 **_unused: Any) -> None:
        if (model_path is None) == (model_content is None):
            raise InvalidArgumentError("pass exactly one of model_path or model_content")
        if num_threads is not None and (not isinstance(num_threads, int) or num_threads < -1):
            raise InvalidArgumentError(f"num_threads must be an int >= -1, got {num_threads!r}")
        self._model = load_model(model_path if model_path is not None else model_content)
        names, precision_loss, extra = _backend_names(experimental_delegates)
        # The keyword wins over a delegate option; either is checked by the Session.
        from_delegate = extra.pop("placement", None)
        if placement is None:
            placement = "first" if from_delegate is None else from_delegate
        self._session = Session(self._model, names, num_threads=max(num_threads or 0, 0),
                                precision_loss_allowed=precision_loss,
                                max_delegated_partitions=max_delegated_partitions, limits=limits, extra=extra,
                                placement=placement)
        self._sg: Subgraph = self._model.subgraphs[0]
        self._shapes: dict[int, tuple[int, ...]] = {}
        # Delegates are applied when the interpreter is built, as in LiteRT: unsupported
        # ops and model kinds fail here, naming the op and node.
        self._compiled: CompiledSubgraph = self._session.compile(0, self._shapes)
        self._session.release_pages()
        self._allocated = False
        self._guard = self._session.guard

    # -- details ---------------------------------------------------------------------
    def _shape_of(self, t: int) -> tuple[int, ...]:
        spec = self._compiled.specs.get(t)
        return tuple(spec.shape) if spec is not None else self._sg.tensors[t].shape

    def get_input_details(self) -> list[dict]:
        """Details of the model's inputs (LiteRT's keys, value types and meanings)."""
        return [tensor_details(self._sg.tensors[t], self._shape_of(t)) for t in self._sg.inputs]

    def get_output_details(self) -> list[dict]:
        """Details of the model's outputs."""
        out = []
        for t in self._sg.outputs:
            shape = self._compiled.host[t].shape if self._compiled.host.get(t) is not None else self._shape_of(t)
            out.append(tensor_details(self._sg.tensors[t], shape))
        return out

    def get_tensor_details(self) -> list[dict]:
        """Details of every tensor of the main subgraph."""
        return [tensor_details(t, self._shape_of(t.index)) for t in self._sg.tensors]

    def get_delegation_report(self) -> DelegationReport:
        """Which backend runs each node of the main subgraph, and why not elsewhere; with the
        reports of the subgraphs its control flow calls (``called``)."""
        return self._session.delegation_report(self._compiled)

    # -- allocation and data ---------------------------------------------------------
    def _check_input_index(self, index: int) -> None:
        if index not in self._sg.inputs:
            raise InvalidArgumentError(f"tensor {index} is not an input of the model; inputs are "
                                       f"{list(self._sg.inputs)}")

    def _check_settable(self, index: int) -> None:
        """Inputs, and outputs as in LiteRT (the next invoke overwrites what is set there)."""
        if index in self._sg.outputs and index in self._compiled.host:
            return
        if index not in self._sg.inputs:
            raise InvalidArgumentError(f"tensor {index} is not an input or an output of the model; inputs "
                                       f"are {list(self._sg.inputs)}, outputs {list(self._sg.outputs)}")

    def resize_tensor_input(self, input_index: int, tensor_size: Sequence[int], strict: bool = False) -> None:
        """Change an input's shape; call :meth:`allocate_tensors` before the next invoke."""
        with self._guard.exclusive("resize_tensor_input"):
            self._resize(input_index, tensor_size, strict)

    def _resize(self, input_index: int, tensor_size: Sequence[int], strict: bool) -> None:
        self._check_input_index(input_index)
        shape = tuple(int(d) for d in np.asarray(tensor_size).reshape(-1))
        t = self._sg.tensors[input_index]
        if len(shape) != len(t.shape) and strict:
            raise InvalidArgumentError(f"cannot change the rank of input {input_index} in strict mode")
        if any(d < 0 for d in shape):
            raise InvalidArgumentError(f"input {input_index}: dimensions must be >= 0, got {list(shape)}")
        if strict:
            for d, (new, sig) in enumerate(zip(shape, t.shape_signature)):
                if sig != -1 and new != sig:
                    raise InvalidArgumentError(f"input {input_index}: dimension {d} is not dynamic "
                                               f"(signature {list(t.shape_signature)}), cannot set it to {new}")
        self._shapes[input_index] = shape
        self._allocated = False

    def allocate_tensors(self) -> None:
        """Plan memory and compile for the current input shapes."""
        with self._guard.exclusive("allocate_tensors"):
            self._compiled = self._session.compile(0, self._shapes)
            self._session.release_pages()
            self._allocated = True

    def set_tensor(self, tensor_index: int, value: Any) -> None:
        """Copy ``value`` into input ``tensor_index`` (dtype and shape must match exactly).

        As in LiteRT, an output may be set too; the next :meth:`invoke` overwrites it."""
        guard = self._guard
        guard.take("set_tensor")
        try:
            if not (self._allocated and tensor_index in self._sg.inputs):   # an allocated input needs no more
                self._require_allocated("set_tensor")
                self._check_settable(tensor_index)
            self._compiled.set_input(tensor_index, value if type(value) is np.ndarray else np.asarray(value))
        finally:
            guard.leave()

    def get_tensor(self, tensor_index: int, subgraph_index: int = 0) -> np.ndarray:
        """A copy of a tensor's value (inputs, outputs and constants), after :meth:`allocate_tensors`
        as in LiteRT."""
        if not 0 <= tensor_index < len(self._sg.tensors):
            raise InvalidArgumentError(f"tensor index {tensor_index} out of range ({len(self._sg.tensors)} tensors)")
        guard = self._guard
        guard.take("get_tensor")
        try:
            self._require_allocated("get_tensor")
            return np.array(self._compiled.output(tensor_index))
        finally:
            guard.leave()

    def tensor(self, tensor_index: int) -> Callable[[], np.ndarray]:
        """A function returning a writable view of an input or output (no copy).

        Unlike LiteRT, :meth:`invoke` is allowed while such a view is held: the view stays
        valid and shows the latest run's values (until the shapes change)."""
        if not 0 <= tensor_index < len(self._sg.tensors):
            raise InvalidArgumentError(f"tensor index {tensor_index} out of range")
        return lambda: self._compiled.output(tensor_index)

    def _require_allocated(self, what: str) -> None:
        if not self._allocated:
            raise ExecutionError(f"{what}: call allocate_tensors() first")

    def invoke(self) -> None:
        """Run the model on the current inputs."""
        guard = self._guard
        guard.take("invoke")
        try:
            self._require_allocated("invoke")
            self._compiled.run()
        finally:
            guard.leave()

    def reset_all_variables(self) -> None:
        """Reset resource variables to their initial state."""
        with self._guard.exclusive("reset_all_variables"):
            self._session.reset_variables()

    # -- signatures ------------------------------------------------------------------
    def get_signature_list(self) -> dict[str, dict[str, list[str]]]:
        """``{key: {"inputs": [...], "outputs": [...]}}`` with names sorted, like LiteRT."""
        return {s.key: {"inputs": sorted(s.inputs), "outputs": sorted(s.outputs)} for s in self._model.signatures}

    def get_signature_runner(self, signature_key: str | None = None) -> "SignatureRunner":
        """A callable runner for one signature (the only one when ``signature_key`` is None)."""
        sigs = {s.key: s for s in self._model.signatures}
        if signature_key is None:
            if len(sigs) != 1:
                raise InvalidArgumentError(f"the model has {len(sigs)} signatures; name one of {sorted(sigs)}")
            signature_key = next(iter(sigs))
        if signature_key not in sigs:
            raise InvalidArgumentError(f"no signature {signature_key!r}; the model has {sorted(sigs)}")
        sig = sigs[signature_key]
        # The main subgraph's runner shares the interpreter's input shapes, as in LiteRT.
        return SignatureRunner(self._session, sig, self._shapes if sig.subgraph_index == 0 else {})


class SignatureRunner:
    """Runs one signature: ``runner(name=array, ...) -> {output name: array}``."""

    def __init__(self, session: Session, signature, shapes: dict[int, tuple[int, ...]]) -> None:
        self._session = session
        self._sig = signature
        self._sg = session.model.subgraphs[signature.subgraph_index]
        self._shapes = shapes
        with session.guard.serialized("get_signature_runner"):
            self._compiled = session.compile(signature.subgraph_index, shapes)

    def get_input_details(self) -> dict[str, dict]:
        """Input details keyed by signature name."""
        return {name: tensor_details(self._sg.tensors[t], self._compiled.specs[t].shape)
                for name, t in sorted(self._sig.inputs.items())}

    def get_output_details(self) -> dict[str, dict]:
        """Output details keyed by signature name."""
        out = {}
        for name, t in sorted(self._sig.outputs.items()):
            arr = self._compiled.host.get(t)
            spec = self._compiled.specs.get(t)
            shape = arr.shape if arr is not None else (spec.shape if spec else self._sg.tensors[t].shape)
            out[name] = tensor_details(self._sg.tensors[t], shape)
        return out

    def resize_input(self, name: str, new_shape: Sequence[int]) -> None:
        """Change the shape of a named input."""
        self._shapes[self._tensor(name)] = tuple(int(d) for d in new_shape)

    def allocate_tensors(self) -> None:
        """Compile for the current input shapes."""
        with self._session.guard.serialized("SignatureRunner.allocate_tensors"):
            self._compiled = self._session.compile(self._sig.subgraph_index, self._shapes)

    def get_delegation_report(self) -> DelegationReport:
        """Which backend runs each node of the signature's subgraph (as compiled for the last
        call), with the reports of the subgraphs its control flow calls (``called``)."""
        return self._session.delegation_report(self._compiled)

    def _tensor(self, name: str) -> int:
        if name not in self._sig.inputs:
            raise InvalidArgumentError(f"signature {self._sig.key!r} has no input {name!r}; inputs are "
                                       f"{sorted(self._sig.inputs)}")
        return self._sig.inputs[name]

    def __call__(self, **kwargs: Any) -> dict[str, np.ndarray]:
        missing = set(self._sig.inputs) - set(kwargs)
        if missing:
            raise InvalidArgumentError(f"signature {self._sig.key!r}: missing inputs {sorted(missing)}")
        values = {self._tensor(name): np.asarray(v) for name, v in kwargs.items()}
        shapes = dict(self._shapes)
        shapes.update({t: v.shape for t, v in values.items()})
        # Self-contained (inputs in, outputs out): callers from several threads wait their turn.
        with self._session.guard.serialized(f"signature {self._sig.key!r}"):
            compiled = self._compiled = self._session.compile(self._sig.subgraph_index, shapes)
            for t, v in values.items():
                compiled.set_input(t, v)
            compiled.run()
            return {name: np.array(compiled.output(t)) for name, t in self._sig.outputs.items()}
