"""litegpu.batch.BatchPredictor: a model over column batches, the core of litegpu.ray and litegpu.dask."""
from __future__ import annotations

import numpy as np
import pytest

import litegpu
from litegpu.batch import BatchPredictor
from litegpu.testing.builder import ModelBuilder


def _affine(batch: int | None, signature: bool) -> bytes:
    """y = relu(x @ w + b) for x of [batch, 3] (batch None: a dynamic batch dimension)."""
    b = ModelBuilder()
    x = b.input("x", (batch or 1, 3), np.float32, shape_signature=None if batch else (-1, 3))
    w = b.const("w", np.arange(6, dtype=np.float32).reshape(2, 3) - 2)
    bias = b.const("bias", np.array([0.5, -1.0], np.float32))
    y = b.tensor("y", (batch or 1, 2), np.float32, shape_signature=None if batch else (-1, 2))
    b.op("FULLY_CONNECTED", [x, w, bias], [y], fused_activation_function="RELU")
    b.output(y)
    if signature:
        b.signature("serving_default", {"features": x}, {"scores": y})
    return b.build()


def _reference(x: np.ndarray) -> np.ndarray:
    w = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    return np.maximum(x @ w.T + np.array([0.5, -1.0], np.float32), 0)


@pytest.mark.parametrize("batch", [None, 1, 4])
@pytest.mark.parametrize("signature", [True, False])
def test_rows_in_rows_out_whatever_the_model_batch(batch, signature):
    """A dynamic batch runs at the batch's size, a fixed one in model-sized chunks (the
    last padded): 10 rows give 10 results, in order, with or without a signature."""
    predictor = BatchPredictor(_affine(batch, signature))
    name = "features" if signature else "x"
    assert predictor.input_names == [name]
    x = np.random.default_rng(batch or 0).standard_normal((10, 3)).astype(np.float32)
    out = predictor.predict({name: x, "id": np.arange(10)})
    (key,) = out
    np.testing.assert_allclose(out[key], _reference(x), rtol=1e-6, atol=1e-6)
    assert predictor.predict({name: x[:0]})[key].shape[0] == 0


def test_a_real_model_matches_the_interpreter_row_by_row(real_model):
    # A trained network (fetched) with a dynamic batch and a signature: 20 CONV_2D, LEAKY_RELU.
    path = real_model("oww_embedding")
    predictor = BatchPredictor(path.read_bytes())
    x = np.random.default_rng(1).random((3, 76, 32, 1), np.float32)
    got = predictor.predict({predictor.input_names[0]: x})[predictor.output_names[0]]
    interp = litegpu.Interpreter(model_path=str(path))
    runner = interp.get_signature_runner()
    for i in range(3):
        want = runner(**{predictor.input_names[0]: x[i:i + 1]})[predictor.output_names[0]]
        np.testing.assert_array_equal(got[i:i + 1], want)


def test_columns_map_other_names_and_rows_of_objects_are_stacked():
    predictor = BatchPredictor(_affine(None, True), columns={"features": "pixels"})
    rows = [np.full(3, i, np.float64) for i in range(4)]   # float64 records convert to float32
    out = predictor.predict({"pixels": rows})
    np.testing.assert_allclose(out["scores"], _reference(np.stack(rows).astype(np.float32)), rtol=1e-6)


def test_a_bad_record_is_named_by_column_and_row():
    predictor = BatchPredictor(_affine(None, True))
    rows = [np.zeros(3, np.float32), np.zeros(3, np.float32), np.zeros(4, np.float32)]
    with pytest.raises(litegpu.InvalidArgumentError, match=r"row 2 of column 'features': a record of shape \[4\]"):
        predictor.predict({"features": rows})
    with pytest.raises(litegpu.InvalidArgumentError, match="no column 'features'"):
        predictor.predict({"pixels": rows})
    with pytest.raises(litegpu.InvalidArgumentError, match="column 'features': values of dtype complex"):
        predictor.predict({"features": np.zeros((2, 3), np.complex64)})
    with pytest.raises(litegpu.InvalidArgumentError, match="input 'nope' the model lacks"):
        BatchPredictor(_affine(None, True), columns={"nope": "x"})


def test_importing_litegpu_imports_no_engine():
    """Ray and Dask are optional: ``import litegpu`` (and litegpu.batch) loads neither."""
    import subprocess
    import sys
    code = ("import sys, litegpu, litegpu.batch; "
            "print(sorted(m for m in ('ray', 'dask', 'distributed', 'pandas', 'pyarrow') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
