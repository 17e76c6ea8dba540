"""INT4 weights with blockwise quantization, as LLM exporters write them (ai-edge-quantizer's
``dynamic_wi4_afp32`` and weight-only int4): read at load, run as LiteRT runs them. Models
come from the test builder; LiteRT is the oracle."""
from __future__ import annotations

import numpy as np
import pytest
from ai_edge_litert.interpreter import Interpreter as LiteRT

import litegpu
from litegpu.errors import ModelFormatError
from litegpu.model import load_model
from litegpu.testing.builder import ModelBuilder

RNG = np.random.default_rng(4)
UNITS, DEPTH = 24, 128


def _blockwise_weights(b: ModelBuilder, shape: tuple[int, int], block: int, name: str = "w",
                       drawn: list | None = None) -> int:
    """INT4 values with one fp16 scale per block (not all bf16-exact: XNNPACK rounds them to
    bf16, which the hybrid path must too); ``drawn`` gets the dequantized weights."""
    values = RNG.integers(-8, 8, size=shape).astype(np.int8)
    scales = (RNG.uniform(0.01, 0.05, size=(shape[0], shape[1] // block))).astype(np.float16)
    if drawn is not None:
        drawn.append(values.astype(np.float32) * np.repeat(scales.astype(np.float32), block, axis=1))
    s = b.const(f"{name}_scales", scales)
    return b.const(name, values, "INT4", quantized_dimension=0,
                   details=("BlockwiseQuantization", {"scales": s, "zero_points": -1, "block_size": block}))


def hybrid_fc(rows: int, block: int, bias: bool = True, units: int = UNITS, depth: int = DEPTH) -> bytes:
    b = ModelBuilder()
    x = b.input("x", (rows, depth), np.float32)
    w = _blockwise_weights(b, (units, depth), block)
    bias_t = b.const("bias", RNG.standard_normal(units).astype(np.float32)) if bias else -1
    y = b.tensor("y", (rows, units), np.float32)
    b.op("FULLY_CONNECTED", [x, w, bias_t], [y], version=5, keep_num_dims=True)
    b.output(y)
    return b.build()


def weight_only_fc(block: int, drawn: list) -> bytes:
    b = ModelBuilder()
    x = b.input("x", (3, DEPTH), np.float32)
    w = _blockwise_weights(b, (UNITS, DEPTH), block, drawn=drawn)
    wf = b.tensor("w_float", (UNITS, DEPTH), np.float32)
    b.op("DEQUANTIZE", [w], [wf])
    y = b.tensor("y", (3, UNITS), np.float32)
    b.op("FULLY_CONNECTED", [x, wf, -1], [y])
    b.output(y)
    return b.build()


def embedding(block: int) -> bytes:
    b = ModelBuilder()
    ids = b.input("ids", (5,), np.int32)
    table = _blockwise_weights(b, (40, 64), block, "table")
    y = b.tensor("y", (5, 64), np.float32)
    b.op("EMBEDDING_LOOKUP", [ids, table], [y])
    b.output(y)
    return b.build()


def _run(make, data: bytes, feeds: list[np.ndarray]) -> np.ndarray:
    it = make(data)
    it.allocate_tensors()
    for d, v in zip(it.get_input_details(), feeds):
        it.set_tensor(d["index"], v)
    it.invoke()
    return it.get_tensor(it.get_output_details()[0]["index"])


def _compare(data: bytes, feeds: list[np.ndarray], atol: float) -> None:
    want = _run(lambda d: LiteRT(model_content=d), data, feeds)
    got = _run(lambda d: litegpu.Interpreter(model_content=d), data, feeds)
    np.testing.assert_allclose(got, want, rtol=0, atol=atol)


@pytest.mark.parametrize("rows", [1, 5, 70])
@pytest.mark.parametrize("block", [32, 128])
def test_hybrid_fully_connected_with_blockwise_int4_weights(rows, block):
    """Each input row quantized on the fly (XNNPACK's qd8), sums per block fused
    multiply-added with the block's scale in XNNPACK's order: LiteRT's numbers to the bit,
    for one row (a decode step), a few, and whole tiles with rows and columns left over."""
    x = (3 * RNG.standard_normal((rows, 256))).astype(np.float32)
    _compare(hybrid_fc(rows, block, units=37, depth=256), [x], atol=0)


@pytest.mark.parametrize("block", [32, 128])
def test_blockwise_reference_and_both_cpu_kernels_are_litert_to_the_bit(block):
    """The op's hybrid reference and the cpu kernel with and without VNNI give LiteRT's
    numbers; a host without VNNI runs the plain kernel only (there is nothing else to run)."""
    from litegpu.ops.hybrid import _fc_hybrid
    from litegpu.ops.registry import get_op
    from litegpu_cpu.kernels.qb4w import BlockwiseQuantizedMatmul
    from litegpu_cpu.kernels.qgemm import VNNI
    rows, units, depth = 9, 40, 384
    data = hybrid_fc(rows, block, units=units, depth=depth)
    x = (2 * RNG.standard_normal((rows, depth))).astype(np.float32)
    want = _run(lambda d: LiteRT(model_content=d), data, [x])
    sg = load_model(data).subgraphs[0]
    (fc,) = sg.nodes
    attrs = get_op(fc.op).node_attrs(fc, sg.tensors)
    w, bias = (sg.tensors[i].data for i in fc.inputs[1:3])
    np.testing.assert_array_equal(_fc_hybrid([x, w, bias], attrs)[0], want)
    for vnni in [False] + [True] * VNNI:
        product = BlockwiseQuantizedMatmul(w, attrs["block_scale"], block, bias, -np.inf, np.inf, 2, vnni=vnni)
        got = np.full((rows, units), 7.5, np.float32)
        product.bind(x, got)()
        np.testing.assert_array_equal(got, want, err_msg=f"vnni={vnni}")


def test_weight_only_int4_is_dequantized_at_load():
    """LiteRT 2.3's DEQUANTIZE gives zeros for blockwise INT4 (it has no such kernel), so
    the oracle here is the float product with the weights dequantized by hand."""
    drawn: list = []
    data = weight_only_fc(32, drawn)
    sg = load_model(data).subgraphs[0]
    assert [n.op for n in sg.nodes] == ["FULLY_CONNECTED"] and sg.nodes_in_file == 2
    x = RNG.standard_normal((3, DEPTH)).astype(np.float32)
    got = _run(lambda d: litegpu.Interpreter(model_content=d), data, [x])
    np.testing.assert_allclose(got, x.astype(np.float64) @ drawn[0].T.astype(np.float64), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("block", [32, 64])
def test_embedding_lookup_of_a_blockwise_int4_table(block):
    """LiteRT's numbers from the cpu's lookup task (not the numpy reference); an id past
    the table is refused, naming it."""
    data = embedding(block)
    _compare(data, [np.array([0, 39, 7, 7, 12], np.int32)], atol=0)
    it = litegpu.Interpreter(model_content=data)
    it.allocate_tensors()
    assert [k[3] for k in it.get_delegation_report().kernels] == ["indexing.hybrid_embedding_lookup"]
    it.set_tensor(it.get_input_details()[0]["index"], np.array([0, 40, 7, 7, 12], np.int32))
    with pytest.raises(litegpu.errors.ExecutionError, match="id 40 out of range"):
        it.invoke()


def test_int4_values_and_scales_as_read():
    sg = load_model(hybrid_fc(1, 32)).subgraphs[0]
    w = next(t for t in sg.tensors if t.name == "w")
    assert w.type_name == "INT4" and w.data.dtype == np.int8 and w.data.shape == (UNITS, DEPTH)
    assert w.data.min() >= -8 and w.data.max() <= 7
    assert w.quantization.block_size == 32 and w.quantization.scales.shape == (UNITS, DEPTH // 32)


def lookup_and_product(rows: int, units: int, depth: int) -> bytes:
    """A decoder's two INT4 kinds: a token embedding table and a product's weights."""
    b = ModelBuilder()
    ids = b.input("ids", (1,), np.int32)
    table = _blockwise_weights(b, (rows, depth), 32, "table")
    x = b.tensor("x", (1, depth), np.float32)
    b.op("EMBEDDING_LOOKUP", [ids, table], [x])
    w = _blockwise_weights(b, (units, depth), 32)
    y = b.tensor("y", (1, units), np.float32)
    b.op("FULLY_CONNECTED", [x, w, -1], [y], version=5)
    b.output(y)
    return b.build()


ROWS, BIG_UNITS, BIG_DEPTH = 2048, 1024, 1024
UNPACKED = (ROWS + BIG_UNITS) * BIG_DEPTH        # bytes of the two INT4 constants' int8 values
IDS = np.array([1234], np.int32)


def _compiled_output(held: litegpu.CompiledModel) -> np.ndarray:
    """``held`` run on :data:`IDS` through its buffers."""
    inputs, outputs = held.create_input_buffers(0), held.create_output_buffers(0)
    inputs[0].write(IDS)
    held.run_by_index(0, inputs, outputs)
    return outputs[0].read(BIG_UNITS, np.float32).reshape(1, BIG_UNITS)


def _held_after(compile_and_run) -> tuple:
    """``compile_and_run()``'s ``(model, output)``, and the bytes still allocated when it
    returned (the model alive, garbage collected): what compiling keeps."""
    import gc
    import tracemalloc
    tracemalloc.start()
    try:
        held, got = compile_and_run()
        gc.collect()
        return held, got, tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("api", ["Interpreter", "CompiledModel"])
def test_compiled_int4_weights_keep_no_unpacked_copy(api):
    """The cpu kernels hold their own packing of INT4 weights (the lookup reads the table's
    nibbles as stored): once compiled, nothing keeps the int8 values unpacked at load, which
    took twice the model's bytes beside the packing. A second run unpacks nothing."""
    data = lookup_and_product(ROWS, BIG_UNITS, BIG_DEPTH)
    want = _run(lambda d: LiteRT(model_content=d), data, [IDS])
    _run(lambda d: litegpu.Interpreter(model_content=d, num_threads=1), data, [IDS])   # (the kernels' JIT)

    def compile_and_run():
        if api == "Interpreter":
            held = litegpu.Interpreter(model_content=data, num_threads=1)
            return held, _run(lambda d: held, data, [IDS])
        held = litegpu.CompiledModel.from_buffer(data, options=litegpu.Options(
            hardware_accelerators=litegpu.HardwareAccelerator.CPU))
        return held, _compiled_output(held)
    _, got, retained = _held_after(compile_and_run)
    np.testing.assert_array_equal(got, want)
    # (the packed weights, their scales and sums: about half the unpacked bytes)
    assert retained < 0.8 * UNPACKED, f"{retained} bytes held after compiling, {UNPACKED} unpacked"


def test_a_gpu_session_keeps_no_host_copy_of_int4_weights(gpu_name):
    """On a GPU backend (the model's float view) the product runs on the device from the
    INT4 codes and the lookup on cpu from the table as stored: no float32 copy of either is
    made (the view dequantized every weight, four times the unpacked bytes, and held it), and
    the unpacked codes go once the device holds them. LiteRT's numbers all the same."""
    data = lookup_and_product(ROWS, BIG_UNITS, BIG_DEPTH)
    want = _run(lambda d: LiteRT(model_content=d), data, [IDS])
    options = litegpu.Options(hardware_accelerators=litegpu.HardwareAccelerator.GPU | litegpu.HardwareAccelerator.CPU)
    litegpu.CompiledModel.from_buffer(data, options=options, backend=gpu_name)       # (the kernels' JIT)

    def compile_and_run():
        held = litegpu.CompiledModel.from_buffer(data, options=options, backend=gpu_name)
        return held, _compiled_output(held)
    held, got, retained = _held_after(compile_and_run)
    assert [backend for backend, _ in held.delegation_reports()[0].partitions] == ["cpu", gpu_name]
    np.testing.assert_array_equal(got, want)
    assert retained < 0.5 * UNPACKED, f"{retained} bytes held after compiling, {UNPACKED} unpacked"


def _bad_blockwise(block: int = 32, scales_shape=(UNITS, DEPTH // 32), scales_index: int | None = None,
                   zero_points: int = -1) -> bytes:
    b = ModelBuilder()
    x = b.input("x", (1, DEPTH), np.float32)
    s = b.const("s", np.full(scales_shape, 0.02, np.float16))
    w = b.const("w", np.zeros((UNITS, DEPTH), np.int8), "INT4", quantized_dimension=0,
                details=("BlockwiseQuantization", {"scales": s if scales_index is None else scales_index,
                                                   "zero_points": zero_points, "block_size": block}))
    y = b.tensor("y", (1, UNITS), np.float32)
    b.op("FULLY_CONNECTED", [x, w, -1], [y])
    b.output(y)
    return b.build()


@pytest.mark.parametrize("kwargs, why", [
    ({"block": 48}, "block size 48"),
    ({"block": 0}, "block size 0"),
    ({"scales_shape": (UNITS, 3)}, "does not hold one float per block"),
    ({"scales_index": 99}, "scales tensor 99"),
    ({"scales_index": 0}, "scales tensor 0"),          # the input: not a constant
    ({"zero_points": 3}, "blockwise zero points"),
])
def test_damaged_blockwise_quantization_is_refused_naming_the_tensor(kwargs, why):
    with pytest.raises(ModelFormatError, match=why):
        load_model(_bad_blockwise(**kwargs))
