"""Hybrid (dynamic-range) LSTM and UNIDIRECTIONAL_SEQUENCE_LSTM (litegpu.ops.hybrid_lstm)
against LiteRT.

Each model is built with ModelBuilder as TensorFlow's converter writes a dynamic-range
LSTM: float32 input, output, biases, layer-norm coefficients and state, every weight
(gate matrices, peephole, projection) symmetric int8 with one scale per tensor. Each runs
three invokes (the state carries over) on litegpu's cpu backend and on LiteRT's default
interpreter, which runs hybrid LSTMs on its builtin kernel (XNNPACK takes none: the
default interpreter and the builtin resolver alone agree bit for bit, checked below).

litegpu reproduces the kernel's input quantization, its order of float32 accumulation and
Eigen's tanh and logistic as LiteRT 2.3.0's x86 build evaluates them (SSE packets of 4,
scalar head and tail), so the comparison is exact wherever every gate vector is whole
packets (:func:`aligned`). Elsewhere Eigen computes a few logistics with glibc's expf,
which is not correctly rounded (litegpu uses the correctly rounded exp): a gate value may
be an ulp off, and the output a few ulps; measured: 1 element in 84 off by 1 ulp
(2.98e-8) in one of the 8 unaligned cases here, 0 in the other 7 and in the 38 aligned
ones. Unaligned cases allow 4 ulps of the largest output. A different LiteRT build (AVX
packets, FMA) would show up here first.
"""
from __future__ import annotations

import numpy as np
import pytest

import litegpu
from litegpu.errors import UnsupportedError
from litegpu.ops.hybrid_lstm import eigen_logistic, eigen_tanh
from litegpu.testing.builder import ModelBuilder

F32 = np.float32
GATES = ("input", "forget", "cell", "output")
INVOKES = 3

LiteRT = pytest.importorskip("ai_edge_litert.interpreter").Interpreter


def hybrid_lstm(*, seq: bool = False, batch: int = 2, steps: int = 3, n_input: int = 5, n_cell: int = 4,
                n_output: int | None = None, peephole: bool = False, cifg: bool = False, asymmetric: bool = False,
                time_major: bool = False, layer_norm: bool = False, projection_bias: bool = True,
                activation: str = "TANH", seed: int = 0, float_peephole: bool = False,
                per_channel: bool = False, **options) -> tuple[bytes, tuple[int, ...]]:
    """A one-node hybrid LSTM model and its input shape."""
    rng = np.random.default_rng(seed)
    n_out = n_output or n_cell
    b = ModelBuilder()
    shape = ((steps, batch, n_input) if time_major else (batch, steps, n_input)) if seq else (batch, n_input)
    x = b.input("x", shape, F32)

    def int8(name: str, *dims: int) -> int:
        scale = rng.uniform(0.003, 0.02, dims[0] if per_channel else 1).astype(F32)
        return b.const(name, rng.integers(-127, 128, dims).astype(np.int8), scale=scale,
                       zero_point=[0] * scale.size, quantized_dimension=0)

    def floats(name: str, *dims: int) -> int:
        return b.const(name, (rng.standard_normal(dims) * 0.3).astype(F32))

    args = [x]
    args += [-1 if cifg and g == "input" else int8(f"input_to_{g}", n_cell, n_input) for g in GATES]
    args += [-1 if cifg and g == "input" else int8(f"recurrent_to_{g}", n_cell, n_out) for g in GATES]
    peep = floats if float_peephole else int8
    args += [-1 if not peephole or (cifg and g == "input") else peep(f"cell_to_{g}", n_cell)
             for g in ("input", "forget", "output")]
    args += [-1 if cifg and g == "input" else floats(f"{g}_bias", n_cell) for g in GATES]
    if n_output:
        args += [int8("projection", n_output, n_cell), floats("projection_bias", n_output) if projection_bias else -1]
    else:
        args += [-1, -1]
    args += [b.tensor("h", (batch, n_out), F32, is_variable=True),
             b.tensor("c", (batch, n_cell), F32, is_variable=True)]
    if layer_norm:
        args += [-1 if cifg and g == "input" else floats(f"{g}_norm", n_cell) for g in GATES]
    out = ((steps, batch, n_out) if time_major else (batch, steps, n_out)) if seq else (batch, n_out)
    y = b.tensor("y", out, F32)
    if seq:
        b.op("UNIDIRECTIONAL_SEQUENCE_LSTM", args, [y], fused_activation_function=activation, time_major=time_major,
             asymmetric_quantize_inputs=asymmetric, version=3, **options)
    else:
        b.op("LSTM", args, [y], fused_activation_function=activation, asymmetric_quantize_inputs=asymmetric,
             version=4, **options)
    b.output(y)
    return b.build(), shape


def input_values(shape: tuple[int, ...], seed: int = 1) -> np.ndarray:
    """Normal float32 values with the second row (one time step of one batch row) zero."""
    x = (np.random.default_rng(seed).standard_normal(shape) * 2).astype(F32)
    rows = x.reshape(-1, shape[-1])
    if rows.shape[0] > 1:
        rows[1] = 0
    return x


def invoke(interp, x: np.ndarray) -> list[np.ndarray]:
    """Outputs of ``INVOKES`` invokes on ``x``, ``2x``, ... (the state carries over)."""
    interp.allocate_tensors()
    outs = []
    for k in range(INVOKES):
        interp.set_tensor(interp.get_input_details()[0]["index"], x * (k + 1))
        interp.invoke()
        outs.append(interp.get_tensor(interp.get_output_details()[0]["index"]).copy())
    return outs


def aligned(seq: bool = False, batch: int = 2, n_cell: int = 4, time_major: bool = False, **_) -> bool:
    """True when LiteRT computes every gate's logistic in whole SSE packets: each gate
    vector (``[batch, n_cell]``, one row at a time for a batch-major sequence) starts
    and ends on a multiple of 4 floats."""
    return (n_cell if seq and not time_major else n_cell * batch) % 4 == 0


def check(model: bytes, shape: tuple[int, ...], exact: bool) -> None:
    """litegpu against LiteRT over ``INVOKES`` invokes: equal, or (not ``exact``) within
    4 ulps of the largest output (see the module docstring)."""
    x = input_values(shape)
    ours = invoke(litegpu.Interpreter(model_content=model), x)
    theirs = invoke(LiteRT(model_content=model), x)
    for k, (got, want) in enumerate(zip(ours, theirs)):
        assert got.dtype == want.dtype == F32 and got.shape == want.shape
        differ = int(np.count_nonzero(got != want))
        diff = float(np.abs(got.astype(np.float64) - want).max())
        bound = 0.0 if exact else 4 * float(np.spacing(np.abs(want).max()))
        assert diff <= bound, f"invoke {k}: {differ} of {got.size} differ, max |diff| {diff:g} > {bound:g}"


VARIANTS = {
    "basic": {},
    "batch1": dict(batch=1),
    "projection": dict(n_output=3),
    "projection-no-bias": dict(n_output=2, projection_bias=False),
    "peephole": dict(peephole=True),
    "cifg-peephole": dict(cifg=True, peephole=True),
    "clips": dict(n_output=3, cell_clip=0.5, proj_clip=0.2),
    "wide": dict(n_input=40, n_cell=32, batch=3),
    # n_cell * batch not a multiple of 4: Eigen's logistic runs some gates' values in
    # its scalar head and tail.
    "unaligned-cifg": dict(n_cell=5, cifg=True, batch=3),
    "layer-norm": dict(layer_norm=True),
    "relu": dict(activation="RELU"),
}


@pytest.mark.parametrize("asymmetric", [False, True], ids=["sym", "asym"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_lstm(variant: str, asymmetric: bool) -> None:
    check(*hybrid_lstm(asymmetric=asymmetric, **VARIANTS[variant]), exact=aligned(**VARIANTS[variant]))


SEQ_VARIANTS = {
    "basic": {},
    "batch1": dict(batch=1),
    "projection-peephole": dict(n_output=3, peephole=True),
    "long": dict(n_input=20, n_cell=16, steps=6),
    "unaligned": dict(n_cell=7, batch=3, steps=4),
    "layer-norm-cifg": dict(layer_norm=True, cifg=True, n_cell=6),
}


@pytest.mark.parametrize("time_major", [False, True], ids=["batch-major", "time-major"])
@pytest.mark.parametrize("asymmetric", [False, True], ids=["sym", "asym"])
@pytest.mark.parametrize("variant", list(SEQ_VARIANTS))
def test_sequence_lstm(variant: str, asymmetric: bool, time_major: bool) -> None:
    options = dict(seq=True, time_major=time_major, **SEQ_VARIANTS[variant])
    check(*hybrid_lstm(asymmetric=asymmetric, **options), exact=aligned(**options))


def test_litert_default_interpreter_runs_the_builtin_kernel() -> None:
    """The default interpreter (XNNPACK delegate on) and the builtin resolver alone agree:
    the references follow the builtin kernel."""
    from ai_edge_litert.interpreter import OpResolverType
    model, shape = hybrid_lstm(seq=True, n_output=3, asymmetric=True)
    x = input_values(shape)
    default = invoke(LiteRT(model_content=model), x)
    builtin = invoke(LiteRT(model_content=model,
                            experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES), x)
    assert all(np.array_equal(a, b) for a, b in zip(default, builtin))


def _single_op(op: str, x: np.ndarray) -> np.ndarray:
    b = ModelBuilder()
    i = b.input("x", x.shape, F32)
    y = b.tensor("y", x.shape, F32)
    b.op(op, [i], [y])
    b.output(y)
    from ai_edge_litert.interpreter import OpResolverType
    interp = LiteRT(model_content=b.build(),
                    experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    interp.allocate_tensors()
    interp.set_tensor(interp.get_input_details()[0]["index"], x)
    interp.invoke()
    return interp.get_tensor(interp.get_output_details()[0]["index"])


@pytest.mark.parametrize("size", [1, 3, 6, 4097])
def test_eigen_activations_match_litert(size: int) -> None:
    """LiteRT's float TANH and LOGISTIC use the same Eigen functions as its LSTM kernel
    (on a 64-byte-aligned output: no scalar head, a scalar tail of ``size % 4``)."""
    rng = np.random.default_rng(size)
    x = np.concatenate([rng.uniform(-120, 30, size), rng.normal(0, 0.01, size)]).astype(F32)[:size]
    assert np.array_equal(eigen_tanh(x), _single_op("TANH", x))
    assert np.array_equal(eigen_logistic(x), _single_op("LOGISTIC", x))


def test_float_peephole_refused_like_litert() -> None:
    model, _ = hybrid_lstm(peephole=True, float_peephole=True)
    with pytest.raises(RuntimeError, match="failed to prepare"):
        LiteRT(model_content=model).allocate_tensors()
    with pytest.raises(UnsupportedError, match="cell_to_input .*int8 weights"):
        litegpu.Interpreter(model_content=model).allocate_tensors()


def test_per_channel_weights_refused() -> None:
    model, _ = hybrid_lstm(per_channel=True)
    with pytest.raises(UnsupportedError, match="one scale per weight tensor"):
        litegpu.Interpreter(model_content=model).allocate_tensors()
