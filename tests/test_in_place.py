"""Host runs on callers' buffers, nothing copied (``CompiledSubgraph.run_on``): a KV cache
given as both the input and the output of a signature is updated where it lies by its
DYNAMIC_UPDATE_SLICE, as LiteRT-LM runs decoders; any other sharing takes the copying path
and still gives the right answer. Reshapes of arena tensors share their input's bytes."""
from __future__ import annotations

import sys

import numpy as np
import pytest

import litegpu
from litegpu.compiled_model import CompiledModel
from litegpu.executor import CompiledSubgraph
from litegpu.testing.builder import ModelBuilder

CACHE = (1, 2, 8, 4)
UPDATE = (1, 2, 1, 4)


def cache_model(extra_reader: bool) -> bytes:
    """``cache_out = DUS(cache, update, start)``, ``doubled = 2 * cache_out``; with
    ``extra_reader`` also ``mixed = cache + cache_out`` (the old cache read beside the update)."""
    b = ModelBuilder()
    cache = b.input("cache", CACHE, np.float32)
    update = b.input("update", UPDATE, np.float32)
    start = b.input("start", (4,), np.int32)
    out = b.tensor("cache_out", CACHE, np.float32)
    b.op("DYNAMIC_UPDATE_SLICE", [cache, update, start], [out])
    doubled = b.tensor("doubled", CACHE, np.float32)
    b.op("MUL", [out, b.const("two", np.array([2.0], np.float32))], [doubled])
    outputs = {"cache": out, "doubled": doubled}
    b.output(out)
    b.output(doubled)
    if extra_reader:
        mixed = b.tensor("mixed", CACHE, np.float32)
        b.op("ADD", [cache, out], [mixed])
        b.output(mixed)
        outputs["mixed"] = mixed
    b.signature("decode", {"cache": cache, "update": update, "start": start}, outputs)
    return b.build()


@pytest.fixture
def run_on_results(monkeypatch) -> list[bool]:
    """What every ``run_on`` call answered (True: it ran on the caller's arrays)."""
    seen: list[bool] = []
    original = CompiledSubgraph.run_on

    def spy(self, arrays, key=None):
        seen.append(original(self, arrays, key))
        return seen[-1]
    monkeypatch.setattr(CompiledSubgraph, "run_on", spy)
    return seen


def _on_host(data: bytes) -> CompiledModel:
    return litegpu.CompiledModel.from_buffer(data, hardware_accel=litegpu.HardwareAccelerator.CPU)


def _steps(model: CompiledModel, steps: int = 5):
    """Run ``steps`` decode steps with one buffer for the cache in and out; yield each step's
    outputs (as arrays) and what the cache should be."""
    cache = model.create_input_buffer_by_name("decode", "cache")
    ins = {n: model.create_input_buffer_by_name("decode", n) for n in ("update", "start")}
    outs = {n: model.create_output_buffer_by_name("decode", n)
            for n in model.get_signature_list()["decode"]["outputs"] if n != "cache"}
    want = np.zeros(CACHE, np.float32)
    rng = np.random.default_rng(3)
    for step in range(steps):
        u = rng.standard_normal(UPDATE).astype(np.float32)
        old = want.copy()
        want[:, :, step] = u[:, :, 0]
        ins["update"].write(u)
        ins["start"].write(np.array([0, 0, step, 0], np.int32))
        model.run_by_name("decode", {"cache": cache, **ins}, {"cache": cache, **outs})
        yield {"cache": cache.array.copy(), **{n: b.array.copy() for n, b in outs.items()}}, want.copy(), old


def test_a_cache_given_as_input_and_output_is_updated_in_place(run_on_results) -> None:
    for got, want, _ in _steps(_on_host(cache_model(extra_reader=False))):
        np.testing.assert_array_equal(got["cache"], want)
        np.testing.assert_array_equal(got["doubled"], 2 * want)
    # (the first run on a set of buffers copies: binding to them pays off from the second)
    assert run_on_results[0] is False and len(run_on_results) == 5 and all(run_on_results[1:])


def test_a_cache_with_another_reader_is_copied_not_shared(run_on_results) -> None:
    """The old cache is read beside the update: sharing its buffer with the result would
    let the update show through, so the run copies (and the answer is the old plus the new)."""
    for got, want, old in _steps(_on_host(cache_model(extra_reader=True))):
        np.testing.assert_array_equal(got["cache"], want)
        np.testing.assert_array_equal(got["mixed"], old + want)
    assert run_on_results and not any(run_on_results)


def test_separate_buffers_run_in_place_too(run_on_results) -> None:
    """Distinct input and output buffers: the run reads and writes them where they are."""
    data = cache_model(extra_reader=False)
    model = litegpu.CompiledModel.from_buffer(data, hardware_accel=litegpu.HardwareAccelerator.CPU)
    names = model.get_signature_list()["decode"]
    ins = {n: model.create_input_buffer_by_name("decode", n) for n in names["inputs"]}
    outs = {n: model.create_output_buffer_by_name("decode", n) for n in names["outputs"]}
    start = np.ones(CACHE, np.float32)
    for row in (7, 2):
        ins["cache"].write(start)
        ins["update"].write(np.full(UPDATE, 5.0, np.float32))
        ins["start"].write(np.array([0, 0, row, 0], np.int32))
        model.run_by_name("decode", ins, outs)
        want = start.copy()
        want[:, :, row] = 5.0
        np.testing.assert_array_equal(outs["cache"].array, want)
        np.testing.assert_array_equal(ins["cache"].array, start)     # the input is left as it was
    assert run_on_results == [False, True]


def _program(model: CompiledModel):
    """The one device program of a model's first signature."""
    (program, _, _, _), = model._compiled[0].runner.programs
    return program


def test_a_device_cache_given_as_input_and_output_is_updated_where_it_lies(gpu_name) -> None:
    """One device buffer for the cache in and out: the DYNAMIC_UPDATE_SLICE writes its row
    into it and its copy of the whole cache is not launched."""
    model = litegpu.CompiledModel.from_buffer(cache_model(extra_reader=False), backend=gpu_name)
    assert model._updates_in_place("decode", ["cache"])
    for got, want, _ in _steps(model):
        np.testing.assert_array_equal(got["cache"], want)
        np.testing.assert_array_equal(got["doubled"], 2 * want)
    program = _program(model)
    assert len(program._io.running) == len(program.launches) - 1


def test_device_caches_in_separate_buffers_are_copied_then_updated(gpu_name) -> None:
    model = litegpu.CompiledModel.from_buffer(cache_model(extra_reader=False), backend=gpu_name)
    names = model.get_signature_list()["decode"]
    ins = {n: model.create_input_buffer_by_name("decode", n) for n in names["inputs"]}
    outs = {n: model.create_output_buffer_by_name("decode", n) for n in names["outputs"]}
    assert ins["cache"].is_device and outs["cache"].is_device
    start = np.arange(np.prod(CACHE), dtype=np.float32).reshape(CACHE)
    ins["cache"].write(start)
    ins["update"].write(np.full(UPDATE, 5.0, np.float32))
    ins["start"].write(np.array([0, 0, 6, 0], np.int32))
    model.run_by_name("decode", ins, outs)
    want = start.copy()
    want[:, :, 6] = 5.0
    np.testing.assert_array_equal(outs["cache"].array, want)
    np.testing.assert_array_equal(ins["cache"].array, start)
    program = _program(model)
    assert program._io.running is program.launches


def test_a_device_buffer_shared_where_no_update_is_in_place_is_refused(gpu_name) -> None:
    """The old cache is read beside the update: one device buffer for both would let the
    update show through (the run reads and writes device buffers where they lie)."""
    model = litegpu.CompiledModel.from_buffer(cache_model(extra_reader=True), backend=gpu_name)
    names = model.get_signature_list()["decode"]
    ins = {n: model.create_input_buffer_by_name("decode", n) for n in names["inputs"]}
    outs = {n: model.create_output_buffer_by_name("decode", n) for n in names["outputs"]}
    assert not model._updates_in_place("decode", ["cache"])
    with pytest.raises(litegpu.InvalidArgumentError, match="'cache', 'cache'.*DYNAMIC_UPDATE_SLICE"):
        model.run_by_name("decode", ins, {**outs, "cache": ins["cache"]})
    with pytest.raises(litegpu.InvalidArgumentError, match="'doubled', 'mixed'"):
        model.run_by_name("decode", ins, {**outs, "mixed": outs["doubled"]})


def test_a_reshape_of_an_arena_tensor_shares_its_bytes() -> None:
    b = ModelBuilder()
    x = b.input("x", (2, 6), np.float32)
    a = b.tensor("a", (2, 6), np.float32)
    b.op("ADD", [x, b.const("one", np.array([1.0], np.float32))], [a])
    r = b.tensor("r", (3, 4), np.float32)
    b.op("RESHAPE", [a, b.const("shape", np.array([3, 4], np.int32))], [r])
    y = b.tensor("y", (3, 4), np.float32)
    b.op("MUL", [r, r], [y])
    b.output(y)
    interp = litegpu.Interpreter(model_content=b.build())
    interp.allocate_tensors()
    v = np.arange(12, dtype=np.float32).reshape(2, 6)
    interp.set_tensor(interp.get_input_details()[0]["index"], v)
    interp.invoke()
    np.testing.assert_array_equal(interp.get_tensor(interp.get_output_details()[0]["index"]),
                                  ((v + 1) ** 2).reshape(3, 4))
    (program, _, _), = interp._compiled.programs      # one cpu partition
    offsets = program.partition.arena.offsets
    assert offsets[a] == offsets[r] and offsets[a] != offsets.get(y)


def test_buffers_that_overlap_without_being_one_array_are_copied(run_on_results) -> None:
    """An input and an output as two views of one array, offset: reading one while writing
    the other would mix them, so every run takes the copying path."""
    data = cache_model(extra_reader=False)
    model = litegpu.CompiledModel.from_buffer(data, hardware_accel=litegpu.HardwareAccelerator.CPU)
    size = int(np.prod(CACHE))
    memory = np.zeros(size + size // 2, np.float32)
    cache_in = litegpu.TensorBuffer.create_from_host_memory(memory[:size].reshape(CACHE))
    doubled = litegpu.TensorBuffer.create_from_host_memory(memory[size // 2:].reshape(CACHE))
    update = model.create_input_buffer_by_name("decode", "update")
    start = model.create_input_buffer_by_name("decode", "start")
    cache_out = model.create_output_buffer_by_name("decode", "cache")
    values = np.arange(size, dtype=np.float32).reshape(CACHE)
    for _ in range(3):
        memory[:size] = values.reshape(-1)
        update.write(np.full(UPDATE, -1.0, np.float32))
        start.write(np.array([0, 0, 3, 0], np.int32))
        model.run_by_name("decode", {"cache": cache_in, "update": update, "start": start},
                          {"cache": cache_out, "doubled": doubled})
        want = values.copy()
        want[:, :, 3] = -1.0
        np.testing.assert_array_equal(cache_out.array, want)
        np.testing.assert_array_equal(doubled.array, 2 * want)
    assert run_on_results == [False, False, False]


def test_buffers_used_once_are_not_kept() -> None:
    """A run's buffers are remembered for the next run on them only once the subgraph is
    bound to them (their second run, or a first whose arrays took a freed set's ids): a
    caller making new buffers for every run keeps at most the bound sets alive, and a
    caller reusing hers finds them."""
    import gc
    import weakref

    from litegpu.executor import BOUND_SETS
    model = litegpu.CompiledModel.from_buffer(cache_model(extra_reader=False),
                                              hardware_accel=litegpu.HardwareAccelerator.CPU)
    names = model.get_signature_list()["decode"]

    def fresh():
        ins = {n: model.create_input_buffer_by_name("decode", n) for n in names["inputs"]}
        outs = {n: model.create_output_buffer_by_name("decode", n) for n in names["outputs"]}
        ins["start"].write(np.zeros(4, np.int32))
        return ins, outs

    gone = []
    for _ in range(12):
        ins, outs = fresh()
        model.run_by_name("decode", ins, outs)
        gone.append(weakref.ref(ins["cache"]))
        del ins, outs
    gc.collect()
    assert sum(ref() is not None for ref in gone) <= BOUND_SETS and len(model._host_runs) <= BOUND_SETS
    ins, outs = fresh()
    for _ in range(3):
        model.run_by_name("decode", ins, outs)
    assert any(ins["cache"] in known[2] for known in model._host_runs.values())


def _resident_kb(path) -> int:
    """This process's resident KB of its mappings of ``path`` (Linux's smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5:     # a mapping's first line
                inside = line.rstrip().endswith(str(path))
            elif inside and line.startswith("Rss:"):
                total += int(head[1])
    return total


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc/self/smaps")
def test_a_compiled_model_lets_its_file_pages_go(shared_model):
    """After compiling, the model file's pages leave the process's memory (the kernels hold
    their own packings); the runs read what they need again and give LiteRT's results."""
    path = shared_model("mobilenet_v2").resolve()
    model = litegpu.load_model(path)
    model.digest()                                    # every page of the file read once
    assert _resident_kb(path) > 4096
    model.release_pages()
    assert _resident_kb(path) < 1024
    compiled = CompiledModel.from_file(path)
    assert _resident_kb(path) < 4096
    x = np.random.default_rng(3).standard_normal((1, 224, 224, 3)).astype(np.float32)
    ins = compiled.create_input_buffers(0)
    ins[0].write(x)
    outs = compiled.create_output_buffers(0)
    compiled.run_by_index(0, ins, outs)
    from ai_edge_litert.interpreter import Interpreter as LiteRT
    litert = LiteRT(model_path=str(path))
    litert.allocate_tensors()
    litert.set_tensor(litert.get_input_details()[0]["index"], x)
    litert.invoke()
    want = litert.get_tensor(litert.get_output_details()[0]["index"])
    np.testing.assert_allclose(outs[0].array, want, rtol=0, atol=1e-4 * np.abs(want).max())
