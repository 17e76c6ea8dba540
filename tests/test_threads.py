"""One model used from several threads: serialized or refused, never a crash or another
thread's answer (see ``litegpu.guard``).

Each thread feeds inputs that carry its own sentinel value, so an output computed from
another thread's inputs (or from half of each) is caught, not just a crash. Before the
guard, a shared Interpreter of tiny_bert segfaulted in the cpu plan's parallel region,
mobilenet_v2 returned corrupt outputs, and ``run_async`` on a partly delegated model
copied a later run's outputs into an earlier caller's buffers.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

import litegpu
from litegpu.errors import ConcurrentUseError, ExecutionError, LiteGpuError
from litegpu.testing.builder import ModelBuilder, two_layer_mlp

THREADS = 4
ROUNDS = 60


def _split_model() -> bytes:
    """w = cumsum(x + 1, axis 1) * 2 on (4, 64): on a GPU backend the CUMSUM runs on cpu
    between two device partitions (host work after device work)."""
    b = ModelBuilder()
    x = b.input("x", (4, 64))
    y, z, w = (b.tensor(n, (4, 64)) for n in "yzw")
    b.op("ADD", [x, b.const("one", np.ones((4, 64), np.float32))], [y])
    b.op("CUMSUM", [y, b.const("axis", np.array(1, np.int32))], [z])
    b.op("MUL", [z, b.const("two", np.full((4, 64), 2, np.float32))], [w])
    b.output(w)
    return b.build()


def _inputs(details: list[dict], sentinel: int) -> list[np.ndarray]:
    """Inputs that differ per thread: random values seeded by the sentinel."""
    rng = np.random.default_rng(sentinel)
    out = []
    for d in details:
        if np.issubdtype(d["dtype"], np.integer):
            out.append(rng.integers(0, 50, d["shape"]).astype(d["dtype"]))
        else:
            out.append(rng.standard_normal(d["shape"]).astype(d["dtype"]))
    return out


def _delegates(backend: str) -> list:
    return [] if backend == "cpu" else [litegpu.load_delegate(backend)]


def _interpreter(content: bytes, backend: str) -> litegpu.Interpreter:
    it = litegpu.Interpreter(model_content=content, experimental_delegates=_delegates(backend), num_threads=2)
    it.allocate_tensors()
    return it


def _sequence(it: litegpu.Interpreter, inputs: list[np.ndarray]) -> list[np.ndarray]:
    for d, v in zip(it.get_input_details(), inputs):
        it.set_tensor(d["index"], v)
    it.invoke()
    return [it.get_tensor(d["index"]) for d in it.get_output_details()]


def _in_threads(work, n: int = THREADS) -> list:
    """Run ``work(k)`` in ``n`` threads started together; return what each raised (None: nothing)."""
    start = threading.Barrier(n)
    raised: list = [None] * n

    def body(k: int) -> None:
        start.wait()
        try:
            work(k)
        except BaseException as exc:   # reported by the test, with the thread it came from
            raised[k] = exc
    threads = [threading.Thread(target=body, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
        assert not t.is_alive(), "a thread hung"
    return raised


BUILDERS = {"mlp": two_layer_mlp, "split": _split_model}


@pytest.fixture(params=[*BUILDERS, "tiny_bert"])
def models(request, shared_model) -> list[tuple[str, bytes]]:
    """One model per test: the built ones everywhere, the shared tiny_bert (whose cpu plan
    segfaulted under two threads) where the shared models are."""
    name = request.param
    if name in BUILDERS:
        return [(name, BUILDERS[name]())]
    return [(name, shared_model(name).read_bytes())]


def test_shared_interpreter_refuses_overlap_and_never_corrupts(backend, models) -> None:
    """Threads calling invoke and get_tensor on one Interpreter without a lock (its inputs
    set once): every call either works or raises ConcurrentUseError, and every output read
    is the model's answer, bit for bit (overlapping runs used to crash or mix)."""
    for name, content in models:
        it = _interpreter(content, backend)
        answer = [a.copy() for a in _sequence(it, _inputs(it.get_input_details(), 100))]
        outputs = [d["index"] for d in it.get_output_details()]
        counts = {"ok": 0, "refused": 0}
        lock = threading.Lock()

        def work(k: int) -> None:
            for _ in range(ROUNDS * 4):
                try:
                    it.invoke()
                    got = [it.get_tensor(t) for t in outputs]
                except ConcurrentUseError:
                    with lock:
                        counts["refused"] += 1
                    continue
                for g, a in zip(got, answer):
                    np.testing.assert_array_equal(g, a, err_msg=name)
                with lock:
                    counts["ok"] += 1
        raised = _in_threads(work)
        assert raised == [None] * THREADS, (name, raised)
        assert counts["ok"] > 0, (name, counts)


def test_shared_interpreter_under_the_callers_lock_gives_each_thread_its_answer(backend, models) -> None:
    for name, content in models:
        it = _interpreter(content, backend)
        feeds = [_inputs(it.get_input_details(), 200 + k) for k in range(THREADS)]
        answers = [[a.copy() for a in _sequence(it, f)] for f in feeds]
        lock = threading.Lock()

        def work(k: int) -> None:
            for _ in range(ROUNDS // 2):
                with lock:
                    got = _sequence(it, feeds[k])
                for g, a in zip(got, answers[k]):
                    np.testing.assert_array_equal(g, a, err_msg=name)
        assert _in_threads(work) == [None] * THREADS, name


def test_signature_runner_calls_are_serialized(backend, models) -> None:
    for name, content in models:
        it = _interpreter(content, backend)
        runner = it.get_signature_runner() if it.get_signature_list() else None
        if runner is None:
            continue
        names = sorted(runner.get_input_details())
        details = [runner.get_input_details()[n] for n in names]
        feeds = [dict(zip(names, _inputs(details, 300 + k))) for k in range(THREADS)]
        answers = [runner(**f) for f in feeds]

        def work(k: int) -> None:
            for _ in range(ROUNDS // 2):
                got = runner(**feeds[k])
                for key, value in answers[k].items():
                    np.testing.assert_array_equal(got[key], value, err_msg=f"{name} {key}")
        assert _in_threads(work) == [None] * THREADS, name


@pytest.mark.parametrize("asynchronous", [False, True], ids=["run_by_index", "run_async"])
def test_compiled_model_runs_from_threads_each_get_their_own_outputs(backend, models, asynchronous) -> None:
    """Many threads, one CompiledModel, each with its own buffers and sentinel inputs."""
    for name, content in models:
        model = litegpu.CompiledModel.from_buffer(content, backend=None if backend == "cpu" else backend)
        details = list(model.get_input_tensor_details(model.get_signature_by_index(0)["key"]).values())
        feeds = [_inputs(details, 400 + k) for k in range(THREADS)]

        def run(k: int):
            ins, outs = model.create_input_buffers(0), model.create_output_buffers(0)
            if k % 2:   # host memory (copied out by the run) on odd threads, the model's kind on even
                outs = [litegpu.TensorBuffer.create_from_host_memory(np.zeros_like(o.array)) for o in outs]
            for buf, value in zip(ins, feeds[k]):
                buf.write(value)
            if asynchronous:
                model.run_async(0, ins, outs)
            else:
                model.run_by_index(0, ins, outs)
            return outs

        def read(outs) -> list[np.ndarray]:
            return [o.array.copy() for o in outs]
        answers = [read(run(k)) for k in range(THREADS)]

        def work(k: int) -> None:
            for _ in range(ROUNDS // 2):
                pending = [run(k) for _ in range(3)]   # several in flight before the first read
                for outs in pending:
                    for g, a in zip(read(outs), answers[k]):
                        np.testing.assert_array_equal(g, a, err_msg=name)
        assert _in_threads(work) == [None] * THREADS, name
        model.close()


def test_run_async_outputs_are_the_runs_own_when_read_late(backend) -> None:
    """Two runs into host buffers started before either output is read: each buffer holds
    its own run's outputs (they used to be copied when read, after the next run)."""
    model = litegpu.CompiledModel.from_buffer(_split_model(), backend=None if backend == "cpu" else backend)
    firsts = []
    for value in (1.0, 2.0):
        ins = model.create_input_buffers(0)
        out = litegpu.TensorBuffer.create_from_host_memory(np.zeros((4, 64), np.float32))
        ins[0].write(np.full((4, 64), value, np.float32))
        last = model.run_async(0, ins, [out])
        firsts.append(out)
    last.wait()   # the second run is done before the first output is read
    for value, buf in zip((1.0, 2.0), firsts):
        expected = np.cumsum(np.full((4, 64), value + 1, np.float32), axis=1) * 2
        np.testing.assert_array_equal(buf.array, expected)
    model.close()


def test_separate_interpreters_in_threads(backend, models) -> None:
    for name, content in models:
        its = [_interpreter(content, backend) for _ in range(2)]
        feeds = [_inputs(its[k].get_input_details(), 500 + k) for k in range(2)]
        answers = [[a.copy() for a in _sequence(its[k], feeds[k])] for k in range(2)]

        def work(k: int) -> None:
            for _ in range(ROUNDS // 2):
                for g, a in zip(_sequence(its[k], feeds[k]), answers[k]):
                    np.testing.assert_array_equal(g, a, err_msg=name)
        assert _in_threads(work, 2) == [None, None], name


def test_concurrent_use_error_names_both_calls() -> None:
    it = _interpreter(two_layer_mlp(), "cpu")
    entered, release = threading.Event(), threading.Event()

    def hold() -> None:
        with it._session.guard.exclusive("invoke"):
            entered.set()
            release.wait(30)
    holder = threading.Thread(target=hold, name="holder")
    holder.start()
    try:
        assert entered.wait(30)
        with pytest.raises(ConcurrentUseError) as caught:
            it.get_tensor(it.get_output_details()[0]["index"])
    finally:
        release.set()
        holder.join()
    message = str(caught.value)
    assert "get_tensor" in message and "invoke in thread 'holder'" in message
    assert isinstance(caught.value, RuntimeError) and isinstance(caught.value, LiteGpuError)
    it.invoke()   # usable again once the other call ended


def test_interpreter_api_choices_against_litert() -> None:
    """get_tensor before allocate_tensors raises (as LiteRT); set_tensor on an output is
    allowed (as LiteRT) and the next invoke overwrites it; invoke while a tensor() view is
    held is allowed (LiteRT raises), and the view shows the new values."""
    it = litegpu.Interpreter(model_content=two_layer_mlp())
    x, y = it.get_input_details()[0], it.get_output_details()[0]
    with pytest.raises(ExecutionError, match="allocate_tensors"):
        it.get_tensor(x["index"])
    it.allocate_tensors()
    it.set_tensor(y["index"], np.full(y["shape"], 7, np.float32))
    np.testing.assert_array_equal(it.get_tensor(y["index"]), 7)
    view = it.tensor(y["index"])()
    it.set_tensor(x["index"], np.ones(x["shape"], np.float32))
    it.invoke()
    assert not np.all(it.get_tensor(y["index"]) == 7)
    np.testing.assert_array_equal(view, it.get_tensor(y["index"]))
    with pytest.raises(LiteGpuError, match="not an input or an output"):
        it.set_tensor(3, np.zeros(1, np.float32))


@pytest.mark.slow
def test_shared_interpreter_stress(backend, shared_model) -> None:
    """The long variant: mobilenet_v2 shared by 4 threads, 500 unlocked sequences each."""
    it = _interpreter(shared_model("mobilenet_v2").read_bytes(), backend)
    feeds = [_inputs(it.get_input_details(), 600 + k) for k in range(THREADS)]
    answers = [[a.copy() for a in _sequence(it, f)] for f in feeds]

    def work(k: int) -> None:
        for _ in range(500):
            try:
                got = _sequence(it, feeds[k])
            except ConcurrentUseError:
                continue
            assert any(all(np.array_equal(g, a) for g, a in zip(got, ans)) for ans in answers)
    assert _in_threads(work) == [None] * THREADS
