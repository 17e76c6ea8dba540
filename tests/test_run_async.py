"""CompiledModel.run_async on a host-only model: returns at once, runs on a worker thread.

Runs are held back by a gate (a threading.Event) put in front of the compiled
subgraph's ``run``, so no assertion depends on how long a run takes.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

import litegpu
from litegpu.errors import ExecutionError, InvalidArgumentError
from litegpu.testing.builder import ModelBuilder


def _add_model() -> bytes:
    """y = x + 1 on a (2, 3) float tensor."""
    b = ModelBuilder()
    x = b.input("x", (2, 3))
    y = b.tensor("y", (2, 3))
    b.op("ADD", [x, b.const("one", np.ones((2, 3), np.float32))], [y])
    b.output(y)
    return b.build()


def _gate(model: litegpu.CompiledModel) -> tuple[threading.Event, list[np.ndarray]]:
    """Hold every run of signature 0 until the returned event is set; record each run's input."""
    compiled = model._compiled[0]
    gate, seen, run = threading.Event(), [], compiled.run
    x = compiled.sg.inputs[0]

    def gated() -> None:
        assert gate.wait(30), "the test never opened the gate"
        seen.append(compiled.host[x].copy())
        run()
    compiled.run = gated
    return gate, seen


@pytest.fixture
def model() -> litegpu.CompiledModel:
    with litegpu.CompiledModel.from_buffer(_add_model()) as m:
        yield m


def test_run_async_returns_before_the_run_ends(model) -> None:
    ins, outs = model.create_input_buffers(0), model.create_output_buffers(0)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    ins[0].write(x)
    gate, _ = _gate(model)
    event = model.run_async(0, ins, outs)
    assert not event.is_complete() and outs[0].event is event
    gate.set()
    event.wait()
    assert event.is_complete()
    np.testing.assert_array_equal(outs[0].read(6, np.float32).reshape(2, 3), x + 1)


def test_results_equal_the_synchronous_run(model) -> None:
    ins, sync_out, async_out = (model.create_input_buffers(0), model.create_output_buffers(0),
                                model.create_output_buffers(0))
    ins[0].write(np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32))
    model.run_by_index(0, ins, sync_out)
    model.run_async(0, ins, async_out)
    np.testing.assert_array_equal(async_out[0].read(6, np.float32), sync_out[0].read(6, np.float32))


def test_inputs_may_be_written_while_a_run_is_pending(model) -> None:
    ins, outs = model.create_input_buffers(0), model.create_output_buffers(0)
    ins[0].write(np.full((2, 3), 5, np.float32))
    gate, _ = _gate(model)
    event = model.run_async(0, ins, outs)
    ins[0].write(np.zeros((2, 3), np.float32))   # the run took its own copy
    gate.set()
    event.wait()
    np.testing.assert_array_equal(outs[0].read(6, np.float32), np.full(6, 6, np.float32))


def test_consecutive_runs_keep_their_order_and_their_outputs(model) -> None:
    ins = model.create_input_buffers(0)
    outs = [model.create_output_buffers(0) for _ in range(3)]
    gate, seen = _gate(model)
    events = []
    for i, out in enumerate(outs):
        ins[0].write(np.full((2, 3), i, np.float32))
        events.append(model.run_async(0, ins, out))
    assert not any(e.is_complete() for e in events)
    gate.set()
    for i, out in enumerate(outs):
        np.testing.assert_array_equal(out[0].read(6, np.float32), np.full(6, i + 1, np.float32))
    assert [float(s.flat[0]) for s in seen] == [0.0, 1.0, 2.0]
    # A synchronous run after asynchronous ones runs after them.
    ins[0].write(np.full((2, 3), 9, np.float32))
    model.run_by_index(0, ins, outs[0])
    np.testing.assert_array_equal(outs[0][0].read(6, np.float32), np.full(6, 10, np.float32))


def test_a_run_error_surfaces_at_wait_and_read(model) -> None:
    ins, outs = model.create_input_buffers(0), model.create_output_buffers(0)
    compiled = model._compiled[0]
    gate = threading.Event()

    def failing() -> None:
        gate.wait(30)
        raise ExecutionError("node 0 (ADD): boom")
    compiled.run = failing
    event = model.run_async(0, ins, outs)   # does not raise
    gate.set()
    with pytest.raises(ExecutionError, match="boom"):
        event.wait()
    with pytest.raises(ExecutionError, match="boom"):
        outs[0].read(6, np.float32)


def test_bad_input_is_refused_at_the_call(model) -> None:
    outs = model.create_output_buffers(0)
    bad = litegpu.TensorBuffer.create_from_host_memory(np.zeros((3, 2), np.float32))
    with pytest.raises(InvalidArgumentError, match="shape"):
        model.run_async(0, [bad], outs)



def test_a_run_on_another_thread_uses_the_models_thread_count() -> None:
    """The cpu kernels' thread count belongs to the calling thread: a run from a fresh
    thread (as run_async's worker is) still gets the model's num_threads, not the default."""
    import threading

    from litegpu.testing.builder import ModelBuilder
    from litegpu_cpu.kernels import threads
    b = ModelBuilder()
    x = b.input("x", (1, 4))
    y = b.tensor("y", (1, 4))
    b.op("RELU", [x], [y])
    b.output(y)
    interp = litegpu.Interpreter(model_content=b.build(), num_threads=1)
    interp.allocate_tensors()
    seen = []

    def invoke() -> None:
        interp.invoke()
        seen.append(threads.current())

    worker = threading.Thread(target=invoke)
    worker.start()
    worker.join()
    assert seen == [1]
