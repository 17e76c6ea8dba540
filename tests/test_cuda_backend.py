"""The cuda backend: what holds without a GPU here, and a real run where there is one.

Without the NVIDIA driver the backend is listed as unavailable with the reason and "GPU"
goes to the next GPU backend; the launch geometry and bounds guards of the rendered CUDA
are checked as text and with NVRTC. With a driver, a model runs on cuda against cpu and
its device buffers are shared with other CUDA libraries through ``__cuda_array_interface__``.
"""
from __future__ import annotations

import numpy as np
import pytest

import litegpu
from litegpu.backend import device_is_cpu
from litegpu.codegen import Precision
from litegpu.codegen.cuda import CUDA
from litegpu.codegen.nodegen import KernelSpec
from litegpu.codegen.render import blocks
from litegpu.plugins import manager
from litegpu.session import resolve_backends
from litegpu.testing.builder import ModelBuilder


def _cuda():
    return manager().backend("cuda")


def test_cuda_is_registered_and_says_why_it_is_unavailable():
    backend = _cuda()
    assert backend.is_gpu and backend.dialect == "cuda" and backend.gpu_priority > manager().backend(
        "opencl").gpu_priority
    ok, why = backend.available()
    if ok:
        pytest.skip("a CUDA device is here: the run tests below cover it")
    assert why and ("driver" in why or "cuda-bindings" in why or "CUDA device" in why), why
    with pytest.raises(litegpu.BackendUnavailableError, match="backend 'cuda' is unavailable"):
        litegpu.load_delegate("cuda")


def test_gpu_requests_take_the_best_available_gpu_backend():
    names = [b.name for b in resolve_backends(["GPU"])]
    # (a backend whose device is a CPU, PoCL's or lavapipe's, is no GPU: tests/test_gpu_request.py)
    available = [b for b in manager().backends.values() if b.is_gpu and b.available()[0] and not device_is_cpu(b)]
    best = max(available, key=lambda b: b.gpu_priority, default=None)
    assert names[:1] == ([best.name] if best else []), names
    if not _cuda().available()[0]:
        assert "cuda" not in names


@pytest.mark.parametrize("global_size, local_size, grid, block", [
    ((1000,), None, (8, 1, 1), (128, 1, 1)),          # whole blocks over a short axis 0
    ((5, 3, 2), None, (1, 3, 2), (5, 1, 1)),          # an axis shorter than a block: one block
    ((64, 4), (32, 1), (2, 4, 1), (32, 1, 1)),        # the kernel's own groups (barriers)
])
def test_launch_geometry_covers_the_global_size(global_size, local_size, grid, block):
    spec = KernelSpec("", global_size, local_size, [])
    assert blocks(spec) == (grid, block)
    got_grid, got_block = blocks(spec)
    assert all(g * b >= n for g, b, n in zip(got_grid, got_block, tuple(global_size) + (1, 1)))


def _relu_node():
    b = ModelBuilder()
    x = b.input("x", (3, 5), np.float32)
    y = b.tensor("y", (3, 5), np.float32)
    b.op("RELU", [x], [y])
    b.output(y)
    return b.build()


def test_cuda_kernels_guard_the_surplus_of_whole_blocks():
    """CUDA runs whole blocks: a kernel without its own groups returns for ids past its
    global size; one with groups (all of them exact) needs no guard."""
    from litegpu.codegen.offline import render_model
    from litegpu.model import load_model
    program, = render_model(load_model(_relu_node()), CUDA, Precision())
    (kernel,), = program.step_kernels
    assert kernel.local_size is None
    guard = f"if ({CUDA.id('global', 0)} >= {kernel.global_size[0]}) return;"
    assert guard in kernel.source, kernel.source
    assert 'extern "C" __global__ void' in kernel.source and "__restrict__" in kernel.source


def _run(model: bytes, backend: str, x: np.ndarray) -> np.ndarray:
    interp = litegpu.Interpreter(model_content=model, experimental_delegates=[litegpu.load_delegate(backend)])
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    return interp.get_tensor(interp.get_output_details()[0]["index"])


@pytest.fixture
def cuda_device():
    ok, why = _cuda().available()
    if not ok:
        pytest.skip(f"no CUDA device here ({why}); CI has none, the GPU figures are measured on a lent machine")
    return _cuda()


def test_a_model_runs_on_cuda_as_on_cpu(cuda_device):
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    np.testing.assert_array_equal(_run(_relu_node(), "cuda", x), np.maximum(x, 0))


def test_cuda_buffers_are_cuda_arrays(cuda_device):
    compiled = litegpu.CompiledModel.from_buffer(_relu_node(), backend="cuda")
    ins, outs = compiled.create_input_buffers(0), compiled.create_output_buffers(0)
    x = np.linspace(-1, 1, 15, dtype=np.float32).reshape(3, 5)
    ins[0].write(x)
    compiled.run_by_index(0, ins, outs)
    iface = outs[0].__cuda_array_interface__
    assert iface["shape"] == (3, 5) and iface["typestr"] == "<f4" and iface["data"][0] != 0
    np.testing.assert_array_equal(outs[0].read(15, np.float32).reshape(3, 5), np.maximum(x, 0))


def test_runs_on_pointers_seen_again_replay_a_captured_graph():
    """The policy of CUDA graphs (no driver needed): a run on pointers seen in a recent run
    captures, later ones replay; two alternating sets (a decoder's KV caches) both get one;
    the oldest of too many goes; a capture the stream refuses turns graphs off."""
    from litegpu.errors import ExecutionError
    from litegpu_cuda.program import GraphCache
    captured, destroyed = [], []

    def capture():
        captured.append(f"graph{len(captured)}")
        return captured[-1]

    graphs = GraphCache(destroyed.append, keep=2)
    a, b, c = (1, 2), (3, 4), (5, 6)
    assert [graphs.graph_for(p, capture) for p in (a, b, a, b, a, b)] == [
        None, None, "graph0", "graph1", "graph0", "graph1"]
    assert captured == ["graph0", "graph1"] and destroyed == []
    assert [graphs.graph_for(p, capture) for p in (c, c)] == [None, "graph2"] and destroyed == ["graph0"]
    graphs.close()
    assert sorted(destroyed) == ["graph0", "graph1", "graph2"]

    def refused():
        raise ExecutionError("cuStreamBeginCapture failed: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED")
    off = GraphCache(destroyed.append)
    assert [off.graph_for(a, refused) for _ in range(3)] == [None, None, None] and not off.enabled
    assert GraphCache(destroyed.append, enabled=False).graph_for(a, capture) is None and len(captured) == 3
