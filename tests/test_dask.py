"""litegpu.dask: batch inference over dask arrays and dataframes on a real two-process
LocalCluster, checked row for row against a plain single-process loop.

Comparisons: models with a fixed batch dimension run the same kernels at the same batch
size either way, so they must match exactly; a dynamic batch dimension runs at each
block's size, whose GEMM blocking differs from batch 1 in the last bits, so those are
compared with rtol=1e-5, atol=1e-6.

The models are built (tests/built_models.py, standing in for the shared dynamic_batch_mlp
and elementwise_200) or fetched (a trained network with a dynamic batch), so every test
here runs without the shared models.
"""
from __future__ import annotations

import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("dask", reason="litegpu.dask needs dask (pip install 'litegpu[dask]')")
pytest.importorskip("distributed", reason="the cluster tests need dask.distributed")
pd = pytest.importorskip("pandas", reason="the dataframe tests need pandas")
pytest.importorskip("dask.dataframe", reason="the dataframe tests need dask[dataframe] (pyarrow)")

import dask  # noqa: E402
import dask.array as da  # noqa: E402
import pyarrow as pa  # noqa: E402
import dask.dataframe as dd  # noqa: E402
from distributed import Client, LocalCluster  # noqa: E402

import litegpu.dask as ldask  # noqa: E402
from litegpu.batch import BatchPredictor  # noqa: E402
from litegpu.errors import InvalidArgumentError  # noqa: E402
from litegpu.testing.builder import ModelBuilder  # noqa: E402

import built_models  # noqa: E402

TIMEOUT = 120   # seconds: a result that does not come fails the test instead of hanging it
DYNAMIC = {"rtol": 1e-5, "atol": 1e-6}


@pytest.fixture(scope="module")
def client():
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
    client = Client(cluster)
    yield client
    client.close()
    cluster.close()


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> tuple[Path, Path]:
    """(mlp, elementwise) as files: float32[-1, 20] -> float32[-1, 3] with a signature
    (input keras_tensor, output output_0), and float32[1, 64] -> float32[1, 64] without one."""
    folder = tmp_path_factory.mktemp("models")
    paths = folder / "mlp.tflite", folder / "elementwise.tflite"
    paths[0].write_bytes(built_models.mlp())
    paths[1].write_bytes(built_models.elementwise())
    return paths


def result(client, collection):
    return client.compute(collection).result(timeout=TIMEOUT)


def one_by_one(model, name: str, rows: np.ndarray) -> np.ndarray:
    """The plain loop: one record at a time in this process."""
    p = BatchPredictor(model)
    (out,) = p.output_names
    return np.concatenate([p.predict({name: rows[i:i + 1]})[out] for i in range(len(rows))])


def two_output_model() -> bytes:
    """x: float32[-1] (a scalar record, dynamic batch) -> twice = x + x, square = x * x; no signature."""
    b = ModelBuilder()
    x = b.input("x", (1,), np.float32, shape_signature=(-1,))
    twice = b.tensor("twice", (1,), np.float32, shape_signature=(-1,))
    square = b.tensor("square", (1,), np.float32, shape_signature=(-1,))
    b.op("ADD", [x, x], [twice])
    b.op("MUL", [x, x], [square])
    b.output(twice, square)
    return b.build()


# -- importing ---------------------------------------------------------------------------
def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60)


def test_import_litegpu_does_not_import_dask_and_litegpu_dask_gets_the_real_one() -> None:
    run = _python("""
        import os, sys, litegpu, litegpu.batch
        assert "dask" not in sys.modules, "import litegpu imported dask"
        import litegpu.dask
        import dask.array
        assert litegpu.dask.da is dask.array and litegpu.dask.dask.__name__ == "dask"
        # the real package, not litegpu's module (whatever folder the checkout is in)
        assert os.path.dirname(litegpu.dask.dask.__file__) != os.path.dirname(litegpu.__file__)
    """)
    assert run.returncode == 0, run.stderr


def test_without_dask_the_import_says_what_to_install() -> None:
    run = _python("""
        import sys
        sys.modules["dask"] = None   # as if dask were not installed
        try:
            import litegpu.dask
        except ImportError as e:
            print(e)
        else:
            raise SystemExit("imported")
    """)
    assert run.returncode == 0, run.stderr
    assert "pip install 'dask[array,dataframe]>=" in run.stdout


# -- arrays --------------------------------------------------------------------------------
def test_dynamic_batch_array_matches_a_plain_loop(client, models) -> None:
    mlp, _ = models
    rows = np.random.default_rng(0).standard_normal((300, 20)).astype(np.float32)
    x = da.from_array(rows, chunks=((70, 70, 70, 90), (12, 8)))   # a record split in two is merged
    y = ldask.predict(x, str(mlp))
    assert (y.shape, y.dtype, y.chunks) == ((300, 3), np.float32, ((70, 70, 70, 90), (3,)))
    got = result(client, y)
    assert got.shape == (300, 3) and got.dtype == np.float32
    np.testing.assert_allclose(got, one_by_one(mlp, "keras_tensor", rows), **DYNAMIC)


def test_fixed_batch_model_as_bytes_is_exact_and_in_the_graph_once(client, models) -> None:
    _, elementwise = models
    data = elementwise.read_bytes()
    rows = np.random.default_rng(1).standard_normal((120, 64)).astype(np.float32)
    y = ldask.predict(da.from_array(rows, chunks=25), data)
    assert (y.dtype, y.chunks) == (np.float32, ((25, 25, 25, 25, 20), (64,)))
    # The scheduler ships each task on its own: the model's bytes are one of them only.
    sizes = [len(pickle.dumps(task)) for task in dict(y.__dask_graph__()).values()]
    assert sum(size >= len(data) for size in sizes) == 1, sorted(sizes)[-3:]
    np.testing.assert_array_equal(result(client, y), one_by_one(data, "x", rows))


def test_a_trained_network_over_50_records(client, real_model) -> None:
    # openWakeWord's embedding model: 20 CONV_2D, float32[-1, 76, 32, 1] -> float32[-1, 1, 1, 96].
    network = real_model("oww_embedding")
    # Made on the workers (not worth shipping in the graph), and here for the loop.
    x = da.random.default_rng(2).uniform(-1, 1, (50, 76, 32, 1), chunks=(13, 76, 32, 1)).astype(np.float32)
    records = x.compute(scheduler="sync")
    y = ldask.predict(x, str(network))
    assert (y.shape, y.dtype, y.chunks) == ((50, 1, 1, 96), np.float32, ((13, 13, 13, 11), (1,), (1,), (96,)))
    np.testing.assert_allclose(result(client, y), one_by_one(network, "input_1", records), **DYNAMIC)


def test_several_outputs_give_a_dict_of_arrays(client) -> None:
    model = two_output_model()
    values = np.arange(-20, 20, dtype=np.float32) / 4
    out = ldask.predict(da.from_array(values, chunks=15), model)
    assert sorted(out) == ["square", "twice"]
    assert all(a.chunks == ((15, 15, 10),) and a.dtype == np.float32 for a in out.values())
    twice, square = client.compute([out["twice"], out["square"]], sync=True)
    np.testing.assert_array_equal(twice, values + values)
    np.testing.assert_array_equal(square, values * values)


def test_a_bad_array_fails_before_any_task(models) -> None:
    mlp, _ = models
    with pytest.raises(InvalidArgumentError, match=r"records \[5\].*takes \[20\]"):
        ldask.predict(da.zeros((10, 5), dtype=np.float32), str(mlp))
    with pytest.raises(InvalidArgumentError, match="complex64, the input takes float32"):
        ldask.predict(da.zeros((10, 20), dtype=np.complex64), str(mlp))


# -- dataframes ------------------------------------------------------------------------------
def arrow_lists(rows) -> pd.Series:
    """Per-row arrays as a pyarrow list column (dask leaves these alone)."""
    return pd.Series([list(map(float, r)) for r in rows], dtype=pd.ArrowDtype(pa.list_(pa.float32())))


def test_dataframe_keeps_ids_and_adds_output_columns(client, models) -> None:
    mlp, _ = models
    rows = np.random.default_rng(3).standard_normal((200, 20)).astype(np.float32)
    ids = [f"id{i:03d}" for i in range(200)]
    frame = pd.DataFrame({"id": ids, "features": arrow_lists(rows)}).set_axis(pd.RangeIndex(1000, 1200))
    df = dd.from_pandas(frame, npartitions=4)
    out = ldask.predict(df, str(mlp), columns={"keras_tensor": "features"})
    assert list(out.columns) == ["id", "features", "output_0"] and out["output_0"].dtype == object
    got = result(client, out)
    assert list(got["id"]) == ids and list(got.index) == list(frame.index)
    np.testing.assert_allclose(np.stack(got["output_0"]), one_by_one(mlp, "keras_tensor", rows), **DYNAMIC)

    # Object columns of arrays, kept as objects by dask when told so.
    with dask.config.set({"dataframe.convert-string": False}):
        df = dd.from_pandas(frame.assign(features=list(rows)), npartitions=3)
        got = result(client, ldask.predict(df, str(mlp), columns={"keras_tensor": "features"}))
    np.testing.assert_allclose(np.stack(got["output_0"]), one_by_one(mlp, "keras_tensor", rows), **DYNAMIC)


def test_arrays_that_dask_turned_into_strings_are_refused(models) -> None:
    mlp, _ = models
    frame = pd.DataFrame({"keras_tensor": list(np.zeros((4, 20), np.float32))})
    df = dd.from_pandas(frame, npartitions=2)   # convert-string on: "[0. 0. ...]"
    if df["keras_tensor"].dtype == object:
        pytest.skip("this dask keeps object columns")
    with pytest.raises(InvalidArgumentError, match="holds strings.*pyarrow list column"):
        ldask.predict(df, str(mlp))


def test_dataframe_numeric_columns_stacked_or_scalar(client, models) -> None:
    mlp, _ = models
    rows = np.random.default_rng(4).standard_normal((90, 20)).astype(np.float32)
    frame = pd.DataFrame(rows, columns=[f"f{i}" for i in range(20)]).assign(key=np.arange(90))
    out = ldask.predict(dd.from_pandas(frame, npartitions=3), str(mlp),
                        columns={"keras_tensor": [f"f{i}" for i in range(20)]})
    got = result(client, out)
    np.testing.assert_array_equal(got["key"], np.arange(90))
    np.testing.assert_allclose(np.stack(got["output_0"]), one_by_one(mlp, "keras_tensor", rows), **DYNAMIC)

    # A scalar record: numeric columns in, numeric columns out.
    scalars = pd.DataFrame({"x": np.linspace(-3, 3, 31, dtype=np.float32), "key": range(31)})
    got = result(client, ldask.predict(dd.from_pandas(scalars, npartitions=3), two_output_model()))
    assert got["twice"].dtype == np.float32 and got["square"].dtype == np.float32
    np.testing.assert_array_equal(got["twice"], scalars["x"] * 2)
    np.testing.assert_array_equal(got["key"], range(31))


def test_a_bad_row_fails_naming_partition_and_row(client, models) -> None:
    mlp, _ = models
    rows = [np.zeros(20, np.float32) for _ in range(30)]
    rows[17] = np.zeros(19, np.float32)
    frame = pd.DataFrame({"keras_tensor": arrow_lists(rows)}).set_axis([f"r{i}" for i in range(30)])
    out = ldask.predict(dd.from_pandas(frame, npartitions=3, sort=False), str(mlp))
    with pytest.raises(InvalidArgumentError, match=r"partition 1 of 3: row 7 of column 'keras_tensor'.*"
                                                   r"shape \[19\].*\(index 'r17'\)"):
        result(client, out)


# -- the cluster -------------------------------------------------------------------------------
def test_the_model_is_loaded_once_per_worker(client, models) -> None:
    mlp, _ = models
    data = mlp.read_bytes()   # as bytes: a model id no other test uses
    rows = np.random.default_rng(5).standard_normal((240, 20)).astype(np.float32)
    y = ldask.predict(da.from_array(rows, chunks=10), data)
    model_id = next(iter(ldask._source(data)))
    # predict itself runs nothing: the collection is lazy (so dask's progress bars see it all).
    assert all(model_id not in info for info in client.run(ldask.worker_cache_info).values())
    result(client, y)
    counts = [info.get(model_id, {"loads": 0, "runs": 0}) for info in client.run(ldask.worker_cache_info).values()]
    assert all(c["loads"] <= 1 for c in counts), counts
    assert sum(c["runs"] for c in counts) == 24 and sum(c["loads"] for c in counts) >= 1, counts


def _die_once(block: np.ndarray, marker: str) -> np.ndarray:
    """Kill this worker process the first time any task gets here (O_EXCL: only one does).
    Given ``meta``, dask never calls it in the test's own process to guess the output."""
    try:
        os.close(os.open(marker, os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        return block
    os._exit(1)


def test_a_worker_killed_mid_job_still_gives_every_row(client, models, tmp_path) -> None:
    _, elementwise = models
    rows = np.random.default_rng(6).standard_normal((160, 64)).astype(np.float32)
    marker = str(tmp_path / "killed")
    x = da.from_array(rows, chunks=20).map_blocks(_die_once, marker, meta=np.empty((0, 0), np.float32))
    y = ldask.predict(x, str(elementwise))
    got = client.compute(y, retries=2).result(timeout=TIMEOUT)
    assert os.path.exists(marker), "no worker was killed"
    np.testing.assert_array_equal(got, one_by_one(elementwise, "x", rows))
    client.wait_for_workers(2, timeout=60)
