"""The opencl backend's data-movement kernels (kernels/layout.py), on a real OpenCL device.

The conformance suite covers every op on small shapes; these cases reach the paths
those shapes do not: float4 chunks, 4x4 register transposes, row loops with a tail,
integer vectors, fills read at run time, run-time gather indices, and folding of
elementwise followers into the copy's store. LiteRT is the oracle; each model must
run entirely on opencl (a node falling back to cpu would prove nothing).
"""
from __future__ import annotations

import re

import numpy as np
import pytest

import litegpu
from litegpu.testing.builder import ModelBuilder
from litegpu.testing.conformance import litert_outputs, unsupported

F32, I32, I64, B = np.float32, np.int32, np.int64, np.bool_
RNG = np.random.default_rng(7)


def data(dtype, *shape):
    """Random test data of ``dtype``."""
    if dtype == F32:
        return RNG.standard_normal(shape).astype(F32)
    if dtype == B:
        return RNG.random(shape) > 0.5
    return RNG.integers(-1000, 1000, size=shape).astype(dtype)


def model(op, operands, outputs, follow=None, **options):
    """A one-op model; ``operands`` are arrays (model inputs) or ("const", array);
    ``follow`` = (op, other operand or None) appends an elementwise node on output 0."""
    b = ModelBuilder()
    idx, feeds = [], []
    for i, x in enumerate(operands):
        if isinstance(x, tuple):
            idx.append(b.const(f"c{i}", x[1]))
        else:
            idx.append(b.input(f"in{i}", x.shape, x.dtype))
            feeds.append(x)
    outs = [b.tensor(f"out{k}", shape, dtype) for k, (shape, dtype) in enumerate(outputs)]
    b.op(op, idx, outs, **options)
    if follow is None:
        b.output(*outs)
    else:
        f_op, other = follow
        y = b.tensor("y", outputs[0][0], F32)
        ins = [outs[0]] if other is None else [outs[0], b.const("other", other)]
        b.op(f_op, ins, [y])
        b.output(y, *outs[1:])
    return b.build(), feeds


def run_opencl(data_bytes, feeds, fp16=False):
    """Outputs and the delegation report of the model on opencl."""
    delegate = litegpu.load_delegate("opencl", {"precision_loss_allowed": fp16})
    interp = litegpu.Interpreter(model_content=data_bytes, experimental_delegates=[delegate])
    interp.allocate_tensors()
    for d, x in zip(interp.get_input_details(), feeds):
        interp.set_tensor(d["index"], x)
    interp.invoke()
    return [interp.get_tensor(d["index"]) for d in interp.get_output_details()], interp.get_delegation_report()


def check(opencl, built, modes=(False, True), launches=None):
    """Every node on opencl, and outputs equal to LiteRT's (fp16 storage: within a few
    half-precision steps of the largest value; a wrong element is off by O(1))."""
    data_bytes, feeds = built
    assert unsupported(data_bytes, opencl) == []
    want = litert_outputs(data_bytes, feeds)
    for fp16 in modes:
        got, report = run_opencl(data_bytes, feeds, fp16)
        assert report.fully_delegated, str(report)
        for g, w in zip(got, want):
            assert g.shape == w.shape and g.dtype == w.dtype
            if w.dtype == F32 and fp16:
                np.testing.assert_allclose(g, w, rtol=0, atol=4e-3 * max(1.0, float(np.abs(w).max())))
            else:
                np.testing.assert_array_equal(g, w)
        if launches is not None:
            counts = [int(m) for p in report.programs for m in re.findall(r"(\d+) launches", p)]
            assert sum(counts) == launches, str(report)


# -- float4 chunks and register transposes ------------------------------------------------------

def test_concat_on_channels_folds_relu_into_both_copies(opencl):
    x, y = data(F32, 2, 10, 12, 8), data(F32, 2, 10, 12, 12)
    check(opencl, model("CONCATENATION", [x, y], [((2, 10, 12, 20), F32)], follow=("RELU", None), axis=3),
          launches=2)


def test_channel_follower_with_channels_not_a_multiple_of_4_stays_exact(opencl):
    # Each input is a 1200-element run (vectorisable), but the output has 6 channels: an
    # ADD of a per-channel vector must not read it four at a time across a row end.
    x, y = data(F32, 2, 200, 6), data(F32, 2, 200, 6)
    bias = data(F32, 6)
    check(opencl, model("CONCATENATION", [x, y], [((2, 400, 6), F32)], follow=("ADD", bias), axis=1),
          launches=2)


@pytest.mark.parametrize("dtype", [F32, I32])
def test_a_small_join_is_one_launch_picking_each_elements_input(opencl, dtype):
    """A decoder's cache index, four scalars joined (constants and the step's position), and
    a small concatenation on a middle axis with a follower: one kernel, a work-item per
    element, where there was one per input."""
    position = data(dtype, 1)
    check(opencl, model("CONCATENATION", [("const", np.zeros(1, dtype)), ("const", np.ones(1, dtype)), position,
                                          ("const", np.full(1, 3, dtype))], [((4,), dtype)], axis=0),
          modes=(False,), launches=1)
    if dtype == F32:
        x, y, z = data(F32, 2, 3, 5), data(F32, 2, 1, 5), data(F32, 2, 4, 5)
        check(opencl, model("CONCATENATION", [x, y, z], [((2, 8, 5), F32)], follow=("RELU", None), axis=1),
              launches=1)


@pytest.mark.parametrize("dtype", [F32, I32, B])
def test_nhwc_to_nchw_transposes_4x4_blocks(opencl, dtype):
    x = data(dtype, 2, 6, 8, 12)
    check(opencl, model("TRANSPOSE", [x, ("const", np.array([0, 3, 1, 2], I32))], [((2, 12, 6, 8), dtype)]),
          modes=(False, True) if dtype == F32 else (False,))


def test_6d_transpose_keeping_a_contiguous_tail(opencl):
    x = data(F32, 2, 3, 1, 2, 4, 8)
    perm = np.array([3, 0, 2, 1, 4, 5], I32)
    check(opencl, model("TRANSPOSE", [x, ("const", perm)], [((2, 2, 1, 3, 4, 8), F32)]))


def test_nchw_to_nhwc_of_3_channels_moves_several_rows_per_work_item(opencl):
    x = data(F32, 2, 3, 8, 10)
    bias = data(F32, 3)
    check(opencl, model("TRANSPOSE", [x, ("const", np.array([0, 2, 3, 1], I32))], [((2, 8, 10, 3), F32)],
                        follow=("ADD", bias)), launches=1)


def test_split_writes_float4_chunks_into_every_output(opencl):
    x = data(F32, 3, 5, 24)
    check(opencl, model("SPLIT", [("const", np.array(-1, I32)), x], [((3, 5, 8), F32)] * 3, num_splits=3))


def test_split_v_of_int64_and_unpack_of_int32(opencl):
    x = data(I64, 4, 16)
    check(opencl, model("SPLIT_V", [x, ("const", np.array([4, -1, 8], I32)), ("const", np.array(1, I32))],
                        [((4, 4), I64), ((4, 4), I64), ((4, 8), I64)], num_splits=3), modes=(False,))
    check(opencl, model("UNPACK", [data(I32, 3, 2, 8)], [((3, 8), I32)] * 2, num=2, axis=1), modes=(False,))


def test_pack_int32_on_inner_axis(opencl):
    xs = [data(I32, 3, 4) for _ in range(3)]
    check(opencl, model("PACK", xs, [((3, 4, 3), I32)], values_count=3, axis=2), modes=(False,))


# -- padding ----------------------------------------------------------------------------------------

def test_pad_keeping_channels_and_fusing_a_follower(opencl):
    x = data(F32, 1, 7, 9, 16)
    pads = np.array([[0, 0], [2, 1], [1, 3], [0, 0]], I32)
    check(opencl, model("PAD", [x, ("const", pads)], [((1, 10, 13, 16), F32)], follow=("RELU6", None)),
          launches=1)


def test_padv2_fill_read_at_run_time(opencl):
    x = data(F32, 3, 5, 4)
    fill = np.array(-2.5, F32)
    pads = np.array([[1, 0], [0, 2], [0, 0]], I32)
    check(opencl, model("PADV2", [x, ("const", pads), fill], [((4, 7, 4), F32)]))


def test_padv2_int64_constant_fill_vectorised(opencl):
    x = data(I64, 2, 3, 8)
    pads = np.array([[1, 1], [2, 0], [0, 0]], I32)
    check(opencl, model("PADV2", [x, ("const", pads), ("const", np.array([-(2 ** 40)], I64))],
                        [((4, 5, 8), I64)]), modes=(False,))


def test_pad_of_a_long_last_axis_loops_with_a_tail(opencl):
    # 3 + 62 + 2 = 67 (a prime) elements per row: chunks of 64 with a bounds test in the loop.
    x = data(F32, 3, 62)
    check(opencl, model("PAD", [x, ("const", np.array([[0, 1], [3, 2]], I32))], [((4, 67), F32)]))


@pytest.mark.parametrize("mode", ["REFLECT", "SYMMETRIC"])
def test_mirror_pad_of_hw_with_float4_channels(opencl, mode):
    x = data(F32, 1, 5, 6, 8)
    pads = np.array([[0, 0], [3, 4], [4, 2], [0, 0]], I32)
    check(opencl, model("MIRROR_PAD", [x, ("const", pads)], [((1, 12, 12, 8), F32)], mode=mode))


# -- slices, copies, repeats ------------------------------------------------------------------------

def test_reshape_of_a_prime_length_loops_with_a_tail(opencl):
    x = data(F32, 1, 1009)
    check(opencl, model("RESHAPE", [x, ("const", np.array([1009], I32))], [((1009,), F32)]))


def test_strided_slice_reversing_an_outer_axis_keeps_float4_rows(opencl):
    x = data(F32, 6, 5, 16)
    check(opencl, model("STRIDED_SLICE", [x, ("const", np.array([5, 1, 0], I32)), ("const", np.array([0, 5, 16], I32)),
                                          ("const", np.array([-2, 2, 1], I32))], [((3, 2, 16), F32)]))


def test_strided_slice_reversing_the_last_axis(opencl):
    x = data(I32, 4, 40)
    check(opencl, model("STRIDED_SLICE", [x, ("const", np.array([0, -1], I32)), ("const", np.array([4, 0], I32)),
                                          ("const", np.array([1, -3], I32))], [((4, 13), I32)],
                        end_mask=1), modes=(False,))


def test_reverse_tile_and_broadcast_of_bools(opencl):
    x = data(B, 3, 8)
    check(opencl, model("REVERSE_V2", [x, ("const", np.array([0, 1], I32))], [((3, 8), B)]), modes=(False,))
    check(opencl, model("TILE", [x, ("const", np.array([2, 3], I32))], [((6, 24), B)]), modes=(False,))
    check(opencl, model("BROADCAST_TO", [data(B, 1, 8), ("const", np.array([2, 3, 8], I32))], [((2, 3, 8), B)],
                        version=2), modes=(False,))


# -- depth, space and batch ------------------------------------------------------------------------

def test_depth_to_space_and_back(opencl):
    x = data(F32, 2, 3, 4, 32)
    check(opencl, model("DEPTH_TO_SPACE", [x], [((2, 6, 8, 8), F32)], block_size=2))
    check(opencl, model("SPACE_TO_DEPTH", [data(F32, 1, 6, 8, 4)], [((1, 3, 4, 16), F32)], block_size=2))


def test_space_to_batch_pads_and_batch_to_space_crops(opencl):
    x = data(F32, 2, 5, 7, 8)
    s2b = model("SPACE_TO_BATCH_ND", [x, ("const", np.array([2, 3], I32)),
                                      ("const", np.array([[1, 0], [1, 1]], I32))], [((12, 3, 3, 8), F32)])
    check(opencl, s2b)
    y = data(F32, 12, 3, 3, 8)
    b2s = model("BATCH_TO_SPACE_ND", [y, ("const", np.array([2, 3], I32)),
                                      ("const", np.array([[1, 0], [1, 1]], I32))], [((2, 5, 7, 8), F32)])
    check(opencl, b2s)


# -- gathers ------------------------------------------------------------------------------------------

def test_run_time_indices_are_left_to_cpu(opencl):
    """Run-time indices may be out of range, which is LiteRT's run-time error and which a
    kernel cannot report: opencl declines GATHER, GATHER_ND and EMBEDDING_LOOKUP on them,
    cpu checks them; the results still match LiteRT."""
    built = [model("GATHER", [data(F32, 3, 10, 8), np.array([[9, 0], [4, 4], [2, 7]], I64)],
                   [((3, 3, 2, 8), F32)], axis=1),
             model("GATHER_ND", [data(F32, 4, 3, 8), np.array([[3, 2], [0, 0], [1, 2]], I32)], [((3, 8), F32)]),
             model("EMBEDDING_LOOKUP", [np.array([2, 0, 5, 5], I32), ("const", data(F32, 6, 2, 4))],
                   [((4, 2, 4), F32)])]
    for data_bytes, feeds in built:
        refused = unsupported(data_bytes, opencl)
        assert len(refused) == 1 and "run time" in refused[0][3].reason, refused
        got, _ = run_opencl(data_bytes, feeds)
        for g, w in zip(got, litert_outputs(data_bytes, feeds)):
            np.testing.assert_array_equal(g, w)


def test_gather_batch_dims_of_int32(opencl):
    params = data(I32, 2, 5, 12)
    ix = np.array([[4, 0, 1], [3, 3, 2]], I32)
    check(opencl, model("GATHER", [params, ("const", ix)], [((2, 3, 12), I32)], axis=1, batch_dims=1),
          modes=(False,))


def test_gather_out_of_range_run_time_index_is_an_error(opencl):
    """As in LiteRT ("gather index out of bounds"), not a zero read from nowhere."""
    params = data(F32, 5, 4) + 10
    ix = np.array([1, 7, -1, 4], I32)
    with pytest.raises(litegpu.LiteGpuError):
        run_opencl(*model("GATHER", [params, ix], [((4, 4), F32)], axis=0))


def test_constant_out_of_range_indices_are_declined_with_a_reason(opencl):
    data_bytes, _ = model("GATHER", [data(F32, 5, 4), ("const", np.array([1, 5], I32))], [((2, 4), F32)], axis=0)
    refused = unsupported(data_bytes, opencl)
    assert len(refused) == 1 and "out of range" in refused[0][3].reason




# -- views ------------------------------------------------------------------------------------------

def _views_model():
    """Reshapes of an intermediate (a chain of them), of an input, and one handed out."""
    b = ModelBuilder()
    x = b.input("x", (2, 3, 4), F32)
    s = b.tensor("s", (2, 3, 4), F32)
    b.op("SOFTMAX", [x], [s], beta=1.0)
    r = b.tensor("r", (6, 4), F32)
    b.op("RESHAPE", [s, b.const("shape_r", np.array([6, 4], I32))], [r])
    e = b.tensor("e", (1, 6, 4), F32)
    b.op("EXPAND_DIMS", [r, b.const("axis", np.array(0, I32))], [e])
    y = b.tensor("y", (1, 6, 4), F32)
    b.op("MUL", [e, b.const("c", data(F32, 1, 6, 4))], [y])
    z = b.tensor("z", (24,), F32)
    b.op("RESHAPE", [x, b.const("shape_z", np.array([24], I32))], [z])
    w = b.tensor("w", (24,), F32)
    b.op("LOGISTIC", [z], [w])
    o = b.tensor("o", (4, 6), F32)
    b.op("RESHAPE", [s, b.const("shape_o", np.array([4, 6], I32))], [o])
    b.output(y, w, o)
    return b.build(), [data(F32, 2, 3, 4)]


def test_a_lone_reshape_launches_nothing_and_its_readers_read_its_input(opencl):
    from litegpu.model import load_model
    from litegpu.session import Session
    built = _views_model()
    program = Session(load_model(built[0]), ["opencl"]).compile(0).programs[0][0]
    copied = [launch.nodes[0].node.op for launch in program.launches if len(launch.nodes) == 1
              and launch.nodes[0].node.op in ("RESHAPE", "EXPAND_DIMS")]
    assert copied == ["RESHAPE"], copied        # only the reshape handed out copies
    check(opencl, built, launches=len(program.launches))
