"""Batch inference on Dask: ``litegpu.dask.predict(collection, model, ...)``.

:func:`predict` runs a model over a dask array or a dask dataframe with
:class:`litegpu.batch.BatchPredictor` (same options: ``backend``, ``options``,
``num_threads``, ``signature``, ``columns``) and returns a lazy collection: nothing is
computed until you call ``.compute()`` / ``client.compute``, so dask's progress bars and
diagnostics see the tasks as usual.

- A dask **array** feeds a one-input model, one record per row of axis 0. Its chunks
  must split only axis 0: chunks along the record axes are merged first (a record is run
  whole). A one-output model gives one dask array; several outputs give a dict of output
  name -> dask array (each block is run once whichever outputs you compute).
- A dask **dataframe** holds the model's inputs as columns named like the inputs (or
  mapped with ``columns=``): a column of per-row arrays (or lists), or a numeric column
  for an input whose record is a scalar; ``columns={"x": ["f0", "f1", ...]}`` stacks
  numeric columns into a 1-D record. Each output becomes a new column named like the
  output: a numeric column for a scalar record, else an object column of one numpy
  array per row. The other columns (ids...) are kept as they are.

Each worker process loads a model once and keeps it for later tasks and later calls
(:func:`worker_cache_info` says what it has loaded). A model given as bytes is put in the
graph once, as one key that each worker fetches once; a path is read by each worker
(and by the client, which reads the output shapes and dtypes from the model's details).

A record that does not fit the model fails with :class:`~litegpu.errors.InvalidArgumentError`
naming the block or partition and the row.

This module needs dask (litegpu's ``[dask]`` extra); ``import litegpu`` never imports it.
"""
from __future__ import annotations

import hashlib
import os
import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass
from operator import getitem
from typing import Any, Mapping, Sequence

import numpy as np

from litegpu.env import install_hint

try:
    # Absolute imports are the default, so this is the real dask, not this module.
    import dask
    import dask.array as da
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(f"litegpu.dask needs dask ({exc}): {install_hint('dask')}") from exc

from litegpu.batch import BatchPredictor, RecordError
from litegpu.errors import InvalidArgumentError

__all__ = ["predict", "worker_cache_info"]


# -- the client side -------------------------------------------------------------------
def predict(collection: Any, model: Any, *, backend: str | None = None, options: dict | None = None,
            num_threads: int | None = None, signature: str | None = None,
            columns: Mapping[str, str | Sequence[str]] | None = None) -> Any:
    """The model's outputs over ``collection`` (a dask array or dataframe), lazily.

    ``model`` is a path (readable here and on every worker) or the model's bytes. The
    other options are :class:`~litegpu.batch.BatchPredictor`'s; ``columns`` (dataframes
    only) maps an input to a column, or to a list of numeric columns stacked into a 1-D
    record. See the module docstring for what comes back.
    """
    kwargs = {"backend": backend, "options": dict(options or {}), "num_threads": num_threads,
              "signature": signature}
    model_id, source = _source(model)
    # Shapes and dtypes come from a local load on cpu: the client need not have the
    # workers' accelerator, and nothing is run.
    local = BatchPredictor(source if isinstance(source, str) else bytes(model), num_threads=1,
                           signature=signature)
    if isinstance(collection, da.Array):
        if columns:
            raise InvalidArgumentError("columns= maps inputs to dataframe columns; a dask array has none")
        return _predict_array(collection, local, _Task(model_id, kwargs, {}), source)
    if _is_dask_dataframe(collection):
        return _predict_frame(collection, local, model_id, kwargs, dict(columns or {}), source)
    raise InvalidArgumentError(f"predict takes a dask array or a dask dataframe, not {type(collection).__name__}")


def _source(model: Any) -> tuple[str, Any]:
    """(an id for the model, what tasks get to load it): bytes become one graph key."""
    if isinstance(model, (bytes, bytearray, memoryview)):
        data = bytes(model)
        model_id = "sha256:" + hashlib.sha256(data).hexdigest()
        # One key holding the bytes, which every task depends on: it travels to each
        # worker once, rather than inside every task.
        return model_id, dask.delayed(data, name=f"litegpu-model-{model_id[7:23]}", pure=True)
    path = os.path.abspath(os.fspath(model))
    return path, path


def _is_dask_dataframe(collection: Any) -> bool:
    try:
        import dask.dataframe as dd
    except ImportError:   # dask without its dataframe extra: only arrays can come in
        return False
    return isinstance(collection, dd.DataFrame)


@dataclass(frozen=True)
class _Task:
    """What a task needs to find (or load) its predictor: small, so cheap in every task
    (a dataclass, so dask names the tasks by its fields)."""

    model_id: str
    kwargs: dict
    columns: dict

    def key(self, source: Any) -> tuple:
        where = ()
        if isinstance(source, str):   # a path: a file changed since it was loaded is loaded again
            st = os.stat(source)
            where = (st.st_mtime_ns, st.st_size)
        kw = self.kwargs
        return (self.model_id, *where, kw["backend"], repr(sorted(kw["options"].items())), kw["num_threads"],
                kw["signature"], tuple(sorted(self.columns.items())))


def _predict_array(x: Any, p: BatchPredictor, task: _Task, source: Any) -> Any:
    if len(p.input_names) != 1:
        raise InvalidArgumentError(f"the model has {len(p.input_names)} inputs {p.input_names}: a dask array "
                                   f"feeds one; pass a dask dataframe with a column per input")
    name = p.input_names[0]
    if x.ndim == 0:
        raise InvalidArgumentError("a 0-d dask array has no rows")
    try:   # the record shape and dtype, checked here rather than in every task
        p.column({name: np.empty((0, *x.shape[1:]), x.dtype)}, name)
    except InvalidArgumentError as e:
        raise InvalidArgumentError(f"the dask array (records {list(x.shape[1:])}, {x.dtype}) does not fit the "
                                   f"model: {e}") from None
    if any(len(c) > 1 for c in x.chunks[1:]):
        x = x.rechunk({axis: -1 for axis in range(1, x.ndim)})
    outputs = p.output_records({name: tuple(x.shape[1:])})
    chunks0 = x.chunks[0]

    if len(outputs) == 1:
        (out_name, (record, dtype)), = outputs.items()
        out_ndim = 1 + len(record)
        axes = {}
        if out_ndim < x.ndim:
            axes["drop_axis"] = list(range(out_ndim, x.ndim))
        elif out_ndim > x.ndim:
            axes["new_axis"] = list(range(x.ndim, out_ndim))
        return x.map_blocks(_array_block, source, task, outputs, name, out_name, dtype=dtype,
                            chunks=(chunks0, *((d,) for d in record)),
                            meta=np.empty((0,) * out_ndim, dtype), **axes)

    # Several outputs: one task per block runs the model, then each output picks its
    # part, so computing all of them (dask.compute(*d.values())) runs each block once.
    starts = np.concatenate([[0], np.cumsum(chunks0)]).tolist()
    runs = [dask.delayed(_run_block, pure=True)(block, source, task, outputs, name,
                                                (i, len(chunks0), starts[i], starts[i + 1]))
            for i, block in enumerate(x.to_delayed().ravel())]
    return {out: da.concatenate([da.from_delayed(dask.delayed(getitem, pure=True)(run, out), (n, *record), dtype,
                                                 meta=np.empty((0,) * (1 + len(record)), dtype))
                                 for run, n in zip(runs, chunks0)])
            for out, (record, dtype) in outputs.items()}


def _predict_frame(df: Any, p: BatchPredictor, model_id: str, kwargs: dict, columns: dict, source: Any) -> Any:
    import pandas as pd

    unknown = sorted(set(columns) - set(p.input_names))
    if unknown:
        raise InvalidArgumentError(f"columns names inputs {unknown} the model lacks; its inputs are {p.input_names}")
    # A list of columns is stacked under a made-up column name the predictor is told about.
    stacked = {name: list(cols) for name, cols in columns.items() if not isinstance(cols, str)}
    direct = {name: (f"[{', '.join(cols)}]" if name in stacked else cols) for name, cols in columns.items()}
    wanted = [c for name in p.input_names for c in stacked.get(name, [direct.get(name, name)])]
    missing = [c for c in wanted if c not in df.columns]
    if missing:
        raise InvalidArgumentError(f"the dataframe has no column {missing} for the model's inputs "
                                   f"{p.input_names}; its columns are {list(df.columns)} (map them with columns=)")
    for name in p.input_names:
        column = direct.get(name, name)
        if name not in stacked and _holds_strings(df[column].dtype) and p.input_record(name)[1].kind not in "OSU":
            # dask's dataframe.convert-string turns object columns into strings when the
            # dataframe is made, numpy arrays included ("[0. 1. 2.]"): nothing to run.
            raise InvalidArgumentError(
                f"column {column!r} for input {name!r} holds strings ({df[column].dtype}): dask turns object "
                f"columns, arrays included, into strings; give per-row arrays as a pyarrow list column "
                f"(pd.ArrowDtype(pa.list_(pa.float32()))), or make the dataframe under "
                f"dask.config.set({{'dataframe.convert-string': False}})")
    outputs = p.output_records({})
    clash = sorted(set(outputs) & set(df.columns))
    if clash:
        raise InvalidArgumentError(f"the dataframe already has columns {clash} named like the model's outputs")
    meta = df._meta.copy()
    for name, (record, dtype) in outputs.items():
        meta[name] = pd.Series([], dtype=dtype if record == () else object, index=meta.index)
    return df.map_partitions(_frame_partition, source, _Task(model_id, kwargs, direct), outputs, stacked,
                             df.npartitions, meta=meta)


def _holds_strings(dtype: Any) -> bool:
    import pandas as pd

    arrow = getattr(dtype, "pyarrow_dtype", None)
    return isinstance(dtype, pd.StringDtype) or (arrow is not None and "string" in str(arrow))


# -- the worker side -------------------------------------------------------------------
_CACHE: OrderedDict[tuple, tuple[BatchPredictor, threading.Lock]] = OrderedDict()
_CACHE_LOCK = threading.Lock()
_CACHE_SIZE = 4          # models kept per process; the least recently used goes first
_LOADS: Counter = Counter()   # model id -> loads in this process
_RUNS: Counter = Counter()    # model id -> blocks or partitions run in this process


def worker_cache_info() -> dict[str, dict[str, int]]:
    """What this process has loaded: model id (a path, or ``sha256:...`` for bytes) ->
    ``{"loads": n, "runs": m, "cached": k}``. On a cluster: ``client.run(worker_cache_info)``."""
    with _CACHE_LOCK:
        cached = Counter(key[0] for key in _CACHE)
        return {m: {"loads": _LOADS[m], "runs": _RUNS[m], "cached": cached[m]} for m in _LOADS}


def _predictor(task: _Task, source: Any) -> tuple[BatchPredictor, threading.Lock]:
    """This process's predictor for ``task``, loaded on first use."""
    key = task.key(source)
    # Loading under the lock: two threads asking for a new model at once load it once.
    with _CACHE_LOCK:
        hit = _CACHE.get(key)
        if hit is None:
            hit = _CACHE[key] = (BatchPredictor(source, columns=task.columns, **task.kwargs), threading.Lock())
            _LOADS[task.model_id] += 1
            while len(_CACHE) > _CACHE_SIZE:
                _CACHE.popitem(last=False)
        _CACHE.move_to_end(key)
        _RUNS[task.model_id] += 1
    return hit


def _run(task: _Task, source: Any, batch: Mapping[str, Any], rows: int, outputs: dict,
         where: str, row_name) -> dict[str, np.ndarray]:
    if rows == 0:   # an empty block or partition: the model's shapes, without a load
        return {name: np.empty((0, *record), dtype) for name, (record, dtype) in outputs.items()}
    predictor, lock = _predictor(task, source)
    try:
        # One interpreter per model and process: threads of one worker take turns on it.
        with lock:
            return predictor.predict(batch)
    except RecordError as e:   # its row is a position in the batch: say which row that is overall
        raise InvalidArgumentError(f"{where}: {e}" + (f" ({row_name(e.row)})" if e.row is not None else "")) from None


def _run_block(block: np.ndarray, source: Any, task: _Task, outputs: dict, column: str,
               loc: tuple[int, int, int, int]) -> dict[str, np.ndarray]:
    """The outputs for one block of a dask array; ``loc``: (block, blocks, first row, end row)."""
    i, n, start, stop = loc
    return _run(task, source, {column: block}, len(block), outputs,
                f"block {i} of {n} (rows {start} to {stop - 1} of the array)", lambda r: f"row {start + r} of the array")


def _array_block(block: np.ndarray, source: Any, task: _Task, outputs: dict, column: str, out: str,
                 block_info: dict | None = None) -> np.ndarray:
    info = block_info[0]   # dask passes where the block lies in the input array
    (start, stop) = info["array-location"][0]
    loc = (info["chunk-location"][0], info["num-chunks"][0], start, stop)
    return _run_block(block, source, task, outputs, column, loc)[out]


def _frame_partition(df: Any, source: Any, task: _Task, outputs: dict, stacked: dict, npartitions: int,
                     partition_info: dict | None = None) -> Any:
    import pandas as pd

    batch = {c: df[c] for c in df.columns}
    for name, cols in stacked.items():
        batch[task.columns[name]] = np.stack([df[c].to_numpy() for c in cols], axis=1)
    number = (partition_info or {}).get("number", "?")
    results = _run(task, source, batch, len(df), outputs, f"partition {number} of {npartitions}",
                   lambda r: f"index {df.index[r]!r}")
    out = df.copy()
    for name, (record, dtype) in outputs.items():
        values = results[name]
        out[name] = pd.Series(values if record == () else list(values), index=df.index,
                              dtype=dtype if record == () else object)
    return out
