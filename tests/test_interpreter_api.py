"""One script runs against litegpu.Interpreter and ai_edge_litert's Interpreter; everything returned must agree.

The model is an MLP with a dynamic batch and a signature: one built here
(tests/built_models.py), so the tests run everywhere, and the shared dynamic_batch_mlp as
TensorFlow's converter wrote it, where the shared models are.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import litegpu
from litegpu.cli import random_inputs

import ai_edge_litert.interpreter as litert  # a test dependency: missing is an error, not a skip

import built_models


@pytest.fixture(params=["built", "dynamic_batch_mlp"])
def mlp(request, tmp_path, shared_model) -> Path:
    """float32[-1, 20] -> float32[-1, 3], signature serving_default (keras_tensor -> output_0)."""
    if request.param != "built":
        return shared_model(request.param)
    path = tmp_path / "mlp.tflite"
    path.write_bytes(built_models.mlp())
    return path


def script(Interpreter, path: Path) -> list:
    """A typical user program; returns everything the API handed back."""
    out = []
    interp = Interpreter(model_path=str(path), num_threads=2)
    out.append(("signatures", interp.get_signature_list()))
    interp.allocate_tensors()
    inputs, outputs = interp.get_input_details(), interp.get_output_details()
    out += [("input_details", inputs), ("output_details", outputs)]
    x = random_inputs(inputs, seed=1)[0]
    interp.set_tensor(inputs[0]["index"], x)
    interp.invoke()
    out.append(("output", interp.get_tensor(outputs[0]["index"])))
    out.append(("tensor()", interp.tensor(outputs[0]["index"])().copy()))
    interp.resize_tensor_input(inputs[0]["index"], [3, *inputs[0]["shape"][1:]], strict=True)
    interp.allocate_tensors()
    out.append(("resized_inputs", interp.get_input_details()))
    x3 = random_inputs(interp.get_input_details(), seed=2)[0]
    interp.set_tensor(inputs[0]["index"], x3)
    interp.invoke()
    out.append(("resized_output_details", interp.get_output_details()))
    out.append(("resized_output", interp.get_tensor(outputs[0]["index"])))
    runner = interp.get_signature_runner()
    out.append(("runner_inputs", runner.get_input_details()))
    out.append(("runner_outputs", runner.get_output_details()))
    name = next(iter(runner.get_input_details()))
    out.append(("runner_result", runner(**{name: x})))
    return out


def assert_same(a, b, where: str = "") -> None:
    if isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a) == sorted(b), f"{where}: keys {sorted(a)} vs {sorted(b)}"
        for k in a:
            assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), f"{where}: {a!r} vs {b!r}"
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a!r} vs {b!r}"
        if a.dtype.kind == "f":
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=where)
        else:
            np.testing.assert_array_equal(a, b, err_msg=where)
    else:
        assert type(a) is type(b) and a == b, f"{where}: {a!r} ({type(a)}) vs {b!r} ({type(b)})"


def test_same_script_same_results(mlp) -> None:
    path = mlp
    ours, theirs = script(litegpu.Interpreter, path), script(litert.Interpreter, path)
    assert [k for k, _ in ours] == [k for k, _ in theirs]
    for (key, a), (_, b) in zip(ours, theirs):
        assert_same(a, b, key)


def test_wrong_dtype_and_shape_name_the_tensor(mlp) -> None:
    interp = litegpu.Interpreter(model_path=str(mlp))
    interp.allocate_tensors()
    d = interp.get_input_details()[0]
    with pytest.raises(litegpu.InvalidArgumentError, match="dtype float64"):
        interp.set_tensor(d["index"], np.zeros(d["shape"], np.float64))
    with pytest.raises(litegpu.InvalidArgumentError, match=r"shape \[2, 20\]"):
        interp.set_tensor(d["index"], np.zeros((2, 20), np.float32))
    with pytest.raises(litegpu.InvalidArgumentError, match="not an input"):
        interp.set_tensor(999, np.zeros(d["shape"], np.float32))
    with pytest.raises(ValueError):  # drop-in: LiteRT raises ValueError here too
        interp.set_tensor(d["index"], np.zeros((7,), np.float32))


def test_set_tensor_takes_any_array_like_and_refuses_a_resized_input_until_allocated(mlp) -> None:
    """set_tensor's plain copy into the input's array applies to an array of its shape and
    dtype, a strided view too; a resize without allocate_tensors takes the checked path."""
    interp = litegpu.Interpreter(model_path=str(mlp))
    interp.allocate_tensors()
    d = interp.get_input_details()[0]
    x = np.random.default_rng(2).standard_normal(d["shape"]).astype(np.float32)
    wide = np.zeros((d["shape"][0], d["shape"][1] * 2), np.float32)
    wide[:, ::2] = x
    for value in (x, wide[:, ::2]):
        interp.set_tensor(d["index"], value)
        np.testing.assert_array_equal(interp.get_tensor(d["index"]), x)
    interp.resize_tensor_input(d["index"], [3, d["shape"][1]])
    with pytest.raises(litegpu.ExecutionError, match="allocate_tensors"):
        interp.set_tensor(d["index"], x)
    interp.allocate_tensors()
    with pytest.raises(litegpu.InvalidArgumentError, match="shape"):
        interp.set_tensor(d["index"], x)
    interp.set_tensor(d["index"], np.ones((3, d["shape"][1]), np.float32))
    interp.invoke()


def test_invoke_before_allocate_is_an_error(mlp) -> None:
    interp = litegpu.Interpreter(model_path=str(mlp))
    with pytest.raises(litegpu.ExecutionError, match="allocate_tensors"):
        interp.invoke()


def test_unknown_backend_lists_alternatives() -> None:
    with pytest.raises(litegpu.BackendUnavailableError, match="available"):
        litegpu.load_delegate("no-such-backend")


def test_compiled_model_matches_interpreter(mlp) -> None:
    path = str(mlp)
    model = litegpu.CompiledModel.from_file(path, hardware_accel=litegpu.HardwareAccelerator.CPU)
    assert model.get_signature_list() == {"serving_default": {"inputs": ["keras_tensor"], "outputs": ["output_0"]}}
    assert model.is_fully_accelerated()
    inputs, outputs = model.create_input_buffers(0), model.create_output_buffers(0)
    x = np.random.default_rng(0).standard_normal((1, 20)).astype(np.float32)
    inputs[0].write(x)
    model.run_by_index(0, inputs, outputs)
    got = outputs[0].read(3, np.float32).reshape(1, 3)
    ref = litert.Interpreter(model_path=path)
    ref.allocate_tensors()
    ref.set_tensor(ref.get_input_details()[0]["index"], x)
    ref.invoke()
    np.testing.assert_allclose(got, ref.get_tensor(ref.get_output_details()[0]["index"]), rtol=1e-5, atol=1e-6)
    model.resize_input_tensor(0, [4, 20])
    assert model.get_input_tensor_details("serving_default")["keras_tensor"]["shape"].tolist() == [4, 20]
    big_in = model.create_input_buffers(0)
    big_out = model.create_output_buffers(0)
    big_in[0].write(np.tile(x, (4, 1)))
    model.run_by_name("serving_default", {"keras_tensor": big_in[0]}, {"output_0": big_out[0]})
    np.testing.assert_allclose(big_out[0].read(12, np.float32).reshape(4, 3), np.tile(got, (4, 1)), rtol=1e-5)
    with pytest.raises(litegpu.InvalidArgumentError, match="static dimension"):
        model.resize_input_tensor(0, [4, 21])
