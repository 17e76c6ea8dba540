"""A model run over batches of records: the engine-neutral part of :mod:`litegpu.ray` and
:mod:`litegpu.dask`.

A :class:`BatchPredictor` loads a model once (from a path or bytes) and runs it over a
batch given as columns: one array per model input, named like the signature's inputs
(or the input tensors' names when the model has no signature; ``columns`` maps other
column names), each holding one record per row. It returns one array per output, named
like the signature's outputs, one row per input row, in order.

How a batch meets the model's batch dimension:

- dynamic (the input's ``shape_signature`` starts with -1): the model is resized to the
  batch's size and run once (a size seen before is not compiled again);
- fixed at ``B``: the batch is run ``B`` rows at a time; the last run is padded by
  repeating its last row, and the padding's outputs are dropped.

A record of the wrong shape or a value that does not convert to the input's dtype fails
with :class:`RecordError` (an :class:`~litegpu.errors.InvalidArgumentError`) naming the
column and the row.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

import numpy as np

from .errors import InvalidArgumentError


class RecordError(InvalidArgumentError):
    """A batch's record does not fit the model; ``row`` is its position in the batch
    (None when the whole column is wrong) and ``column`` its column."""

    def __init__(self, message: str, column: str, row: int | None = None) -> None:
        super().__init__(message)
        self.column, self.row = column, row

    def __reduce__(self):   # pickled between processes (Ray, Dask); the default calls RecordError(message), a TypeError
        return type(self), (str(self), self.column, self.row)

def _load(model: Any, backend: str | None, options: dict | None, num_threads: int | None):
    from .interpreter import Interpreter
    from .session import load_delegate
    delegates = [load_delegate(backend, dict(options or {}))] if backend else None
    kwargs = {"model_content": bytes(model)} if isinstance(model, (bytes, bytearray, memoryview)) \
        else {"model_path": os.fspath(model)}
    return Interpreter(**kwargs, experimental_delegates=delegates, num_threads=num_threads)


class BatchPredictor:
    """A model loaded once and run over column batches (see the module docstring).

    ``model``: a path readable where the predictor is built, or the model's bytes.
    ``backend``: a backend name (``"cpu"``, ``"opencl"``, ``"cuda"``...) or ``"GPU"``;
    None runs on cpu. ``options``: the delegate's options (``precision_loss_allowed``...).
    ``signature``: which signature to run (the only one by default). ``columns``: input
    name -> column name, for columns not named like the inputs.
    """

    def __init__(self, model: Any, backend: str | None = None, options: dict | None = None,
                 num_threads: int | None = None, signature: str | None = None,
                 columns: Mapping[str, str] | None = None) -> None:
        self.interpreter = _load(model, backend, options, num_threads)
        sigs = self.interpreter.get_signature_list()
        if sigs:
            self._runner = self.interpreter.get_signature_runner(signature)
            details = self._runner.get_input_details()
            self.output_names = sorted(self._runner.get_output_details())
        else:
            if signature is not None:
                raise InvalidArgumentError(f"the model has no signatures, so no signature {signature!r}")
            self._runner = None
            self.interpreter.allocate_tensors()
            details = {d["name"]: d for d in self.interpreter.get_input_details()}
            self.output_names = [d["name"] for d in self.interpreter.get_output_details()]
        self.input_names = list(details)
        self._inputs = {name: (tuple(int(x) for x in d["shape"]), tuple(int(x) for x in d["shape_signature"]),
                               np.dtype(d["dtype"]), int(d["index"])) for name, d in details.items()}
        self.columns = {name: name for name in self.input_names}
        for name, column in (columns or {}).items():
            if name not in self._inputs:
                raise InvalidArgumentError(f"columns names an input {name!r} the model lacks; its inputs are "
                                           f"{self.input_names}")
            self.columns[name] = column
        self._size: int | None = None   # the batch size the interpreter is allocated for (no signature)

    # -- one batch ------------------------------------------------------------------------
    def predict(self, batch: Mapping[str, Any]) -> dict[str, np.ndarray]:
        """The outputs for a batch of columns (a mapping of column name to rows)."""
        arrays = {name: self.column(batch, name) for name in self.input_names}
        rows = {len(a) for a in arrays.values()}
        if len(rows) > 1:
            raise InvalidArgumentError(f"the input columns have different numbers of rows: "
                                       f"{ {self.columns[n]: len(a) for n, a in arrays.items()} }")
        n = rows.pop() if rows else 0
        if n == 0:
            records = self.output_records({name: a.shape[1:] for name, a in arrays.items()})
            return {name: np.zeros((0, *record), dtype) for name, (record, dtype) in records.items()}
        step = self._step(n)
        parts = []
        for start in range(0, n, step):
            chunk = {name: a[start:start + step] for name, a in arrays.items()}
            real = len(next(iter(chunk.values())))
            if real < step:   # pad a fixed batch with its last row; the padding's outputs are dropped
                chunk = {name: np.concatenate([a, np.repeat(a[-1:], step - real, axis=0)]) for name, a in chunk.items()}
            outputs = self._run(chunk, step)
            parts.append({name: out[:real] for name, out in outputs.items()})
        return {name: np.concatenate([p[name] for p in parts]) for name in self.output_names}

    def _step(self, n: int) -> int:
        """Rows per run: all of them when the batch dimension is dynamic, else the model's batch."""
        steps = set()
        for name, (shape, signature, _, _) in self._inputs.items():
            if not shape:
                raise InvalidArgumentError(f"input {name!r} is a scalar: the model has no batch dimension")
            steps.add(n if signature and signature[0] == -1 else shape[0])
        return min(steps)

    def input_record(self, name: str) -> tuple[tuple[int, ...], np.dtype]:
        """The record shape (-1 where a dimension is dynamic) and dtype of input ``name``."""
        shape, signature, dtype, _ = self._inputs[name]
        return tuple(d if s != -1 else -1 for d, s in zip(shape[1:], (signature or shape)[1:])), dtype

    def output_records(self, records: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Each output's (record shape, dtype) when the inputs' records are ``records`` (by
        input name): inputs with dynamic record dimensions are resized first; nothing runs."""
        resize = {name: (shape[0], *records[name]) for name, (shape, sig, _, _) in self._inputs.items()
                  if name in records and -1 in sig[1:]}
        if self._runner is not None:
            for name, shape in resize.items():
                self._runner.resize_input(name, shape)
            if resize:
                self._runner.allocate_tensors()
            details = self._runner.get_output_details()
        else:
            for name, shape in resize.items():
                self.interpreter.resize_tensor_input(self._inputs[name][3], shape)
            if resize:
                self.interpreter.allocate_tensors()
                self._size = None
            details = {d["name"]: d for d in self.interpreter.get_output_details()}
        return {name: (tuple(int(d) for d in details[name]["shape"][1:]), np.dtype(details[name]["dtype"]))
                for name in self.output_names}

    def column(self, batch: Mapping[str, Any], name: str) -> np.ndarray:
        """The rows of input ``name``'s column of ``batch`` as one array of the input's record
        shape and dtype; a row that does not fit raises :class:`RecordError`."""
        column = self.columns[name]
        if column not in batch:
            raise InvalidArgumentError(f"the batch has no column {column!r} for input {name!r}; its columns are "
                                       f"{sorted(batch)}")
        shape = self._inputs[name][0]
        record, dtype = self.input_record(name)
        values = batch[column]
        values = values.to_numpy() if hasattr(values, "to_numpy") else values
        rows = values if isinstance(values, np.ndarray) and values.dtype != object else list(values)
        if isinstance(rows, np.ndarray):
            if not _fits(rows.shape[1:], record):
                raise RecordError(f"column {column!r}: records of shape {list(rows.shape[1:])}, input "
                                  f"{name!r} takes {list(shape[1:])} (row 0 and on)", column)
            return _convert(rows, dtype, column, None)
        out = []
        for i, row in enumerate(rows):
            arr = np.asarray(row)
            if not _fits(arr.shape, record):
                raise RecordError(f"row {i} of column {column!r}: a record of shape {list(arr.shape)}, "
                                  f"input {name!r} takes {list(shape[1:])}", column, i)
            out.append(_convert(arr, dtype, column, i))
        return np.stack(out) if out else np.zeros((0, *[max(d, 0) for d in record]), dtype)

    def _run(self, chunk: dict[str, np.ndarray], size: int) -> dict[str, np.ndarray]:
        if self._runner is not None:
            return self._runner(**chunk)
        interp = self.interpreter
        if self._size != size:
            for name, (shape, _, _, index) in self._inputs.items():
                if shape[0] != size:
                    interp.resize_tensor_input(index, (size, *chunk[name].shape[1:]))
            interp.allocate_tensors()
            self._size = size
        for name, (_, _, _, index) in self._inputs.items():
            interp.set_tensor(index, chunk[name])
        interp.invoke()
        return {d["name"]: interp.get_tensor(d["index"]) for d in interp.get_output_details()}


def _fits(got: tuple[int, ...], want: tuple[int, ...]) -> bool:
    return len(got) == len(want) and all(w in (-1, g) for g, w in zip(got, want))


def _convert(rows: np.ndarray, dtype: np.dtype, column: str, row: int | None) -> np.ndarray:
    """``rows`` as ``dtype`` when that keeps their kind: a narrower or wider float or int
    (pandas gives float64 and int64), an int to a float; never a float to an int, a
    complex to a real or a string to a number."""
    if rows.dtype == dtype:
        return rows
    if np.can_cast(rows.dtype, dtype, "same_kind") and not (rows.dtype.kind == "f" and dtype.kind in "iu"):
        return rows.astype(dtype)
    raise RecordError(f"{'' if row is None else f'row {row} of '}column {column!r}: values of dtype "
                      f"{rows.dtype}, the input takes {dtype}", column, row)
