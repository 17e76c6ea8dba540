"""litegpu.ray.Predictor: models over Ray Data's map_batches on a local two-CPU Ray,
checked row by row against a plain loop in this process.

The models stand in for the shared ones by kind (tests/built_models.py: fixed or dynamic
batch, with or without a signature, integer input, a multi-dimensional output), and a
trained network with a dynamic batch is fetched (litegpu.testing.realmodels), so that
every test here runs without the shared models.
"""
from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import litegpu
from litegpu.testing.realmodels import REAL_MODELS

import built_models

try:
    import ray
    import ray.data
except ImportError:
    ray = None

needs_ray = pytest.mark.skipif(ray is None, reason="ray is not installed (pip install 'litegpu[ray]')")
# Long enough for actors to start and compile on a busy two-core machine, short enough
# that a hung job fails the test instead of the suite.
JOB_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def model_file(tmp_path_factory, real_model):
    """``f(name) -> Path``: a model of tests/built_models.py written once, or a fetched real model."""
    folder = tmp_path_factory.mktemp("models")

    def find(name: str) -> Path:
        if name in REAL_MODELS:
            return real_model(name)
        path = folder / f"{name}.tflite"
        if not path.exists():
            path.write_bytes(getattr(built_models, name)())
        return path
    return find


def _rows(path: Path, n: int) -> tuple[str, np.ndarray]:
    """The model's first input's name and ``n`` deterministic records for it."""
    detail = litegpu.Interpreter(model_path=str(path)).get_input_details()[0]
    rng = np.random.default_rng(n)
    shape = (n, *detail["shape"][1:])
    rows = rng.integers(0, 50, shape) if np.dtype(detail["dtype"]).kind in "iu" else rng.random(shape)
    name = detail["name"].removeprefix("serving_default_").split(":")[0]   # the signature's name
    return name, rows.astype(detail["dtype"])


def _loop(path: Path, rows: np.ndarray) -> np.ndarray:
    """The reference: one record at a time through a plain Interpreter, in this process."""
    interp = litegpu.Interpreter(model_path=str(path))
    interp.allocate_tensors()
    inp, out = interp.get_input_details()[0]["index"], interp.get_output_details()[0]["index"]
    results = []
    for row in rows:
        interp.set_tensor(inp, row[None])
        interp.invoke()
        results.append(interp.get_tensor(out)[0].copy())
    return np.stack(results)


def _run(ds) -> dict[str, np.ndarray]:
    """All of ``ds``'s rows as one numpy batch (one run of the job), failing instead of hanging."""
    def run():
        batches = list(ds.iter_batches(batch_size=None, batch_format="numpy"))
        return {key: np.concatenate([b[key] for b in batches]) for key in batches[0]}
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(run).result(JOB_TIMEOUT_S)


@pytest.fixture(scope="module")
def cluster():
    """One local Ray for the module; batches come back in order (preserve_order)."""
    ray.init(num_cpus=2, include_dashboard=False)
    context = ray.data.DataContext.get_current()
    was, context.execution_options.preserve_order = context.execution_options.preserve_order, True
    yield
    context.execution_options.preserve_order = was
    ray.shutdown()


# -- through map_batches ----------------------------------------------------------------------
@needs_ray
@pytest.mark.parametrize("name, n, exact", [
    # Fixed batch 1 and no signature (tensor names): each record runs alone, as in the loop.
    ("elementwise", 300, True),
    # A dynamic batch dimension runs each batch at once: another GEMM blocking than the
    # loop's one row, so the last bits may differ.
    ("mlp", 300, False),
    # A trained convolutional network (20 CONV_2D) with a dynamic batch.
    ("oww_embedding", 48, False),
])
def test_a_model_over_map_batches_matches_a_plain_loop(cluster, model_file, name, n, exact):
    from litegpu.ray import Predictor
    path = model_file(name)
    column, rows = _rows(path, n)
    ds = ray.data.from_items([{"id": i, column: row} for i, row in enumerate(rows)], override_num_blocks=6)
    # The spelling: Ray 2.51+ logs that concurrency= is deprecated for compute=.
    ds = ds.map_batches(Predictor, fn_constructor_kwargs={"model": path.read_bytes(), "backend": "cpu"},
                        concurrency=2, batch_size=64)
    got = _run(ds)
    (output,) = set(got) - {"id", column}
    np.testing.assert_array_equal(got["id"], np.arange(n))
    np.testing.assert_array_equal(got[column], rows)
    want = _loop(path, rows)
    if exact:
        np.testing.assert_array_equal(got[output], want)
    else:
        np.testing.assert_allclose(got[output], want, rtol=1e-5, atol=1e-6)


@needs_ray
def test_pandas_batches_keep_their_columns_and_map_an_input(cluster, model_file):
    """A DataFrame dataset (id, label, tokens) with ``columns=`` mapping the model's input
    to ``tokens``; the token classifier has a fixed batch of 1, so the results are exact."""
    import pandas as pd
    from litegpu.ray import Predictor
    path = model_file("token_classifier")
    column, rows = _rows(path, 96)
    df = pd.DataFrame({"id": np.arange(96), "label": [f"r{i}" for i in range(96)], "tokens": list(rows)})
    ds = ray.data.from_pandas([df[:40], df[40:]]).map_batches(
        Predictor, fn_constructor_kwargs={"model": str(path), "columns": {column: "tokens"}},
        batch_format="pandas", compute=ray.data.ActorPoolStrategy(size=2), batch_size=32)
    got = _run(ds)
    assert list(got) == ["id", "label", "tokens", "output_0"]
    np.testing.assert_array_equal(got["id"], np.arange(96))
    assert list(got["label"]) == list(df["label"])
    np.testing.assert_array_equal(got["output_0"], _loop(path, rows))


@needs_ray
def test_pyarrow_batches_round_trip_a_multi_dimensional_output(cluster, model_file):
    """The segmenter's [32, 32, 1] mask per row comes back as Ray's tensor column."""
    from litegpu.ray import Predictor
    path = model_file("segmenter")
    column, rows = _rows(path, 12)
    ds = ray.data.from_items([{"id": i, column: row} for i, row in enumerate(rows)], override_num_blocks=3)
    ds = ds.map_batches(Predictor, fn_constructor_kwargs={"model": path.read_bytes()},
                        batch_format="pyarrow", compute=ray.data.ActorPoolStrategy(size=2), batch_size=5)
    got = _run(ds)
    assert got["output_0"].shape == (12, 32, 32, 1)
    np.testing.assert_array_equal(got["id"], np.arange(12))
    np.testing.assert_array_equal(got["output_0"], _loop(path, rows))


@needs_ray
def test_an_actor_killed_mid_job_is_replaced_and_the_result_is_complete(cluster, model_file, tmp_path):
    """An actor's process exits, once, on the batch holding row 150: Ray Data's actor pools
    restart actors and retry their batches by default (max_restarts=-1,
    max_task_retries=-1; Ray 2.60 deprecates passing them to map_batches), so every row
    still comes back, exact (the elementwise model has a fixed batch of 1)."""
    from litegpu.ray import Predictor

    class DiesOnce(Predictor):
        # Defined here, so that Ray pickles it by value: workers cannot import this test module.
        def __call__(self, batch):
            if 150 in batch["id"]:
                try:   # the marker, made atomically, is what outlives the killed process
                    os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
                except FileExistsError:
                    pass
                else:
                    os._exit(1)
            return super().__call__(batch)

    path = model_file("elementwise")
    column, rows = _rows(path, 256)
    marker = str(tmp_path / "died")
    ds = ray.data.from_items([{"id": i, column: row} for i, row in enumerate(rows)], override_num_blocks=8)
    ds = ds.map_batches(DiesOnce, fn_constructor_kwargs={"model": path.read_bytes(), "backend": "cpu"},
                        compute=ray.data.ActorPoolStrategy(size=2), batch_size=32)
    got = _run(ds)
    assert os.path.exists(marker), "no actor died: the test tested nothing"
    np.testing.assert_array_equal(got["id"], np.arange(256))
    np.testing.assert_array_equal(got["Identity"], _loop(path, rows))


@needs_ray
def test_a_bad_row_fails_the_job_naming_it(cluster, model_file):
    """A record of the wrong shape fails with litegpu's message (column, row, shapes),
    which reaches the driver through Ray's task error, and is not retried into a hang."""
    from litegpu.ray import Predictor
    path = model_file("mlp")
    column, rows = _rows(path, 200)
    records = [{"id": i, column: row} for i, row in enumerate(rows)]
    records[150][column] = np.zeros(21, np.float32)
    ds = ray.data.from_items(records, override_num_blocks=4).map_batches(
        Predictor,
        fn_constructor_kwargs={"model": path.read_bytes()}, compute=ray.data.ActorPoolStrategy(size=2),
        batch_size=64)
    with pytest.raises(Exception) as caught:
        _run(ds)
    # The driver gets Ray's RayTaskError(UserCodeException), litegpu's error in its text.
    message = str(caught.value)
    assert "InvalidArgumentError: row " in message, message
    assert f"of column '{column}': a record of shape [21], input '{column}' takes [20] (in a batch of " in message
    assert "rows; that row has id=150)" in message, message


# -- one actor's work, without a cluster ---------------------------------------------------------
@needs_ray
def test_every_batch_format_gives_the_same_outputs_as_its_own_kind(model_file):
    import pandas as pd
    from ray.data.block import BlockAccessor
    from litegpu.ray import Predictor
    path = model_file("segmenter")
    column, rows = _rows(path, 3)
    predictor = Predictor(path.read_bytes())
    numpy = predictor({"id": np.arange(3), column: rows})
    assert list(numpy) == ["id", column, "output_0"] and numpy["output_0"].shape == (3, 32, 32, 1)
    frame = pd.DataFrame({"id": np.arange(3), "name": list("abc"), column: list(rows)})
    got = predictor(frame)
    assert list(frame) == ["id", "name", column], "the caller's frame changed"
    assert list(got) == ["id", "name", column, "output_0"] and list(got["name"]) == list("abc")
    np.testing.assert_array_equal(np.stack(got["output_0"]), numpy["output_0"])
    table = BlockAccessor.batch_to_arrow_block({"id": np.arange(3), "name": np.array(list("abc")), column: rows})
    got = predictor(table)
    assert got.column_names == ["id", "name", column, "output_0"]
    assert got.column("name").to_pylist() == list("abc")
    np.testing.assert_array_equal(BlockAccessor.for_block(got).to_numpy("output_0"), numpy["output_0"])


@needs_ray
@pytest.mark.parametrize("kind", ["numpy", "pandas", "pyarrow"])
def test_a_bad_record_is_named_with_its_row_ids_in_every_format(model_file, kind):
    """The row counts within the batch, which means little in a Ray job: the message
    names the row's values in the other scalar columns too."""
    import pandas as pd
    from ray.data.block import BlockAccessor
    from litegpu.ray import Predictor
    path = model_file("mlp")
    column, rows = _rows(path, 3)
    records = [rows[0], rows[1], rows[2][:7]]
    batch = {"id": np.array([10, 11, 12]), "name": np.array(["a", "b", "c"]), column: records}
    if kind == "pandas":
        batch = pd.DataFrame(batch)
    elif kind == "pyarrow":
        batch = BlockAccessor.batch_to_arrow_block({**batch, column: np.array(records, dtype=object)})
    with pytest.raises(litegpu.InvalidArgumentError) as caught:
        Predictor(str(path))(batch)
    assert str(caught.value) == (f"row 2 of column '{column}': a record of shape [7], input '{column}' takes [20] "
                                 f"(in a batch of 3 rows; that row has id=12, name='c')")


def test_a_record_error_survives_pickling():
    """Ray and Dask ship a worker's exception to the driver pickled."""
    import pickle
    from litegpu.batch import RecordError
    error = pickle.loads(pickle.dumps(RecordError("row 2 of column 'x': ...", "x", 2)))
    assert (type(error), str(error), error.column, error.row) == (RecordError, "row 2 of column 'x': ...", "x", 2)


@needs_ray
def test_a_batch_with_a_column_named_like_an_output_is_refused(model_file):
    from litegpu.ray import Predictor
    path = model_file("mlp")
    column, rows = _rows(path, 2)
    with pytest.raises(litegpu.InvalidArgumentError, match=r"named like the model's outputs \['output_0'\]"):
        Predictor(str(path))({column: rows, "output_0": np.zeros(2)})


# -- importing ---------------------------------------------------------------------------------
def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_import_litegpu_does_not_import_ray():
    done = _python("import sys, litegpu; print('ray' in sys.modules)")
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stdout + done.stderr


def test_without_ray_importing_litegpu_ray_says_what_to_install():
    done = _python("import sys; sys.modules['ray'] = None\n"   # None in sys.modules: import ray fails
                   "try:\n    import litegpu.ray\nexcept ImportError as err:\n    print(err)")
    assert done.returncode == 0 and "pip install 'ray[data]>=" in done.stdout, done.stdout + done.stderr


@needs_ray
def test_litegpu_ray_imports_the_real_ray_not_itself():
    done = _python("import litegpu.ray, ray, ray.data; "
                   "print(litegpu.ray.ray is ray, hasattr(ray, 'init'), litegpu.ray.__name__)")
    assert done.returncode == 0 and done.stdout.split() == ["True", "True", "litegpu.ray"], done.stdout + done.stderr
