"""Batch inference on Ray Data: a litegpu model as the callable class of ``map_batches``.

::

    import ray, litegpu.ray

    ds = ray.data.read_parquet("s3://bucket/images/")          # columns: id, keras_tensor
    ds = ds.map_batches(litegpu.ray.Predictor, batch_size=64,
                        compute=ray.data.ActorPoolStrategy(size=2),   # or concurrency=2 (deprecated since Ray 2.51)
                        fn_constructor_kwargs={"model": model_bytes, "backend": "cpu"})
    ds.write_parquet("s3://bucket/scores/")                      # columns: id, keras_tensor, output_0

Each actor of the pool builds one :class:`Predictor`, which loads the model
once (:class:`litegpu.batch.BatchPredictor`) and then runs it over every batch it is
given. A batch comes as a dict of numpy arrays (``batch_format="numpy"``, Ray's
default), a pandas DataFrame (``"pandas"``) or a pyarrow Table (``"pyarrow"``) and goes
back as the same kind: every column it had, as it was, plus one column per model output
named like the signature's outputs, one row per input row, in order. A multi-dimensional
output per row is an ndarray column (numpy), a column of per-row arrays (pandas) or
Ray's tensor extension type (pyarrow), which Ray reads back as ndarrays.

- The model: ``model`` is the model's bytes or a path. Bytes travel with the actor's
  constructor arguments, so they work on any cluster; a path must be readable on every
  node that runs an actor (a shared file system).
- Threads: with no ``num_threads``, the cpu backend runs on as many threads as the CPUs
  Ray gave the actor (``num_cpus``, 1 by default), so that actors sharing a machine do not
  each start one thread per core.
- A GPU: ``map_batches(..., num_gpus=1)`` with ``backend="GPU"`` reserves a GPU for each
  actor (Ray sets ``CUDA_VISIBLE_DEVICES`` to it) and picks the best GPU backend
  available on the actor's node (cuda, else opencl; metal on macOS:
  :func:`litegpu.load_delegate`). Where none is available, litegpu logs a warning and
  runs on cpu. (Untested here: no GPU in the test suite.)
- Order: rows keep their order within a batch. Ray Data may hand back *batches* out of
  order unless ``DataContext.get_current().execution_options.preserve_order = True``;
  keep an id column to join on when that is off.
- Failures: a record of the wrong shape or dtype fails with
  :class:`~litegpu.errors.InvalidArgumentError` naming the column, the row (counted in its
  batch) and that row's ids (its values in the batch's other scalar columns), and is not
  retried (Ray Data retries no UDF error unless
  ``DataContext.retried_map_errors`` says so). The driver gets Ray's
  ``RayTaskError(UserCodeException)``, whose message holds litegpu's error and its
  traceback (it is not an ``InvalidArgumentError`` there). An actor that dies (a killed
  process, a lost node) is restarted and its batch retried: Ray Data's actor pools
  default to ``max_restarts=-1`` and ``max_task_retries=-1``. Model bytes above Ray's
  inline size live in the object store with the constructor's arguments, which Ray warns
  a restart needs to still be there (ray-project/ray#53727).

``import litegpu`` never imports Ray; this module is imported explicitly and needs
litegpu's ``[ray]`` extra (Ray Data, pandas, pyarrow).
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from litegpu.env import install_hint

try:
    # An absolute import is the real Ray, not this module (litegpu.ray), whatever the file name.
    import pandas as pd
    import pyarrow as pa
    import ray
    from ray.data.block import BlockAccessor
except ImportError as err:
    raise ImportError(f"litegpu.ray needs Ray Data ({err}): {install_hint('ray')}") from err

from litegpu.batch import BatchPredictor, RecordError
from litegpu.errors import InvalidArgumentError

__all__ = ["Predictor"]


class Predictor(BatchPredictor):
    """A model run over Ray Data batches: pass the class to ``Dataset.map_batches`` with
    the constructor's arguments in ``fn_constructor_kwargs`` (see the module docstring).

    The arguments are :class:`~litegpu.batch.BatchPredictor`'s: ``model`` (bytes, or a
    path every worker can read), ``backend`` (``"cpu"``, ``"GPU"``, a backend's name; None
    runs on cpu), ``options`` (the delegate's), ``num_threads`` (None: the actor's CPUs),
    ``signature`` and ``columns`` (input name -> column name).
    """

    def __init__(self, model: Any, backend: str | None = None, options: dict | None = None,
                 num_threads: int | None = None, signature: str | None = None,
                 columns: Mapping[str, str] | None = None) -> None:
        super().__init__(model, backend=backend, options=options,
                         num_threads=num_threads if num_threads is not None else _actor_cpus(),
                         signature=signature, columns=columns)

    def __call__(self, batch: Any) -> Any:
        """``batch`` (a dict of arrays, a DataFrame or a pyarrow Table) with the model's
        outputs added as columns, in the same kind."""
        if isinstance(batch, pa.Table):
            outputs = self._outputs(_ArrowColumns(batch), batch.num_rows, batch.column_names)
            # Ray's own conversion, so a tensor output gets the tensor type Ray is configured for.
            table = BlockAccessor.batch_to_arrow_block(outputs)
            for name in outputs:
                batch = batch.append_column(name, table.column(name))
            return batch
        if isinstance(batch, pd.DataFrame):
            outputs = self._outputs(batch, len(batch), list(batch.columns))
            batch = batch.copy(deep=False)   # the caller's frame stays as it was
            for name, values in outputs.items():
                batch[name] = values if values.ndim == 1 else _per_row(values)
            return batch
        if isinstance(batch, Mapping):
            rows = {len(v) for v in batch.values()}
            outputs = self._outputs(batch, rows.pop() if len(rows) == 1 else None, list(batch))
            return {**batch, **outputs}
        raise InvalidArgumentError(f"a batch is a dict of numpy arrays, a pandas DataFrame or a pyarrow Table, "
                                   f"not {type(batch).__name__}")

    def _outputs(self, batch: Mapping[str, Any], rows: int | None, columns: list[str]) -> dict[str, np.ndarray]:
        clash = [name for name in self.output_names if name in columns]
        if clash:
            # Overwriting would silently replace a column the caller keeps (an id, a label).
            raise InvalidArgumentError(f"the batch already has columns named like the model's outputs {clash}; "
                                       f"rename them before map_batches")
        try:
            return self.predict(batch)
        except RecordError as err:
            # Ray shows the message far from the data, and a batch's row number means little
            # there: name the batch's size and the bad row's ids (its other scalar columns).
            where = f"in a batch of {rows} rows"
            if err.row is not None:
                ids = _scalars(batch, err.row, skip=set(self.columns.values()))
                where += f"; that row has {ids}" if ids else ""
            raise InvalidArgumentError(f"{err} ({where})") from None


class _ArrowColumns(Mapping):
    """A pyarrow Table's columns as numpy arrays, converted by Ray (tensor columns become
    ndarrays) only when read, so the id columns are left alone."""

    def __init__(self, table: pa.Table) -> None:
        self._table = table

    def __getitem__(self, column: str) -> np.ndarray:
        if column not in self._table.column_names:
            raise KeyError(column)
        return BlockAccessor.for_block(self._table.select([column])).to_numpy(column)

    def __iter__(self) -> Iterator[str]:
        return iter(self._table.column_names)

    def __len__(self) -> int:
        return self._table.num_columns


def _per_row(values: np.ndarray) -> np.ndarray:
    """A 1-D object array of ``values``' rows: pandas' column of per-row arrays."""
    column = np.empty(len(values), dtype=object)
    for i, row in enumerate(values):   # not column[:] = list(values): numpy would broadcast it
        column[i] = row
    return column


def _scalars(batch: Mapping[str, Any], row: int, skip: set[str], most: int = 4) -> str:
    """Row ``row``'s values in the batch's scalar columns but ``skip``: ``id=150, name='a'``."""
    found = []
    for column in (c for c in batch if c not in skip):
        if len(found) == most:
            break
        values = batch[column]
        value = values.iloc[row] if hasattr(values, "iloc") else values[row]
        if np.ndim(value) == 0:
            found.append(f"{column}={getattr(value, 'item', lambda: value)()!r:.40}")
    return ", ".join(found)


def _actor_cpus() -> int | None:
    """The CPUs Ray gave this actor, or None outside an actor (the driver: all cores)."""
    if not ray.is_initialized():
        return None
    context = ray.get_runtime_context()
    if context.get_actor_id() is None:
        return None
    cpus = context.get_assigned_resources().get("CPU")
    return max(1, int(cpus)) if cpus else None
