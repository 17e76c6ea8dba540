"""The opencl elementwise kernels beyond the conformance cases: elementwise chains folded
into one kernel (every chain expression, in real and real4 form), the broadcast index
math, and LiteRT's edge semantics (NaN in MAXIMUM/MINIMUM and CAST, ties in ROUND,
integer division signs). LiteRT is the oracle throughout.
"""
from __future__ import annotations

import numpy as np
import pytest

import litegpu
from litegpu.testing.builder import ModelBuilder
from litegpu.testing.conformance import compare, litert_outputs, load_model, node_contexts

F32, I32 = np.float32, np.int32


def run_opencl(data: bytes, inputs, fp16: bool = False):
    """(outputs, programs) of the model on opencl: one build serves both checks."""
    delegate = litegpu.load_delegate("opencl", {"precision_loss_allowed": fp16})
    interp = litegpu.Interpreter(model_content=data, experimental_delegates=[delegate])
    interp.allocate_tensors()
    for d, x in zip(interp.get_input_details(), inputs):
        interp.set_tensor(d["index"], x)
    interp.invoke()
    outs = [np.array(interp.get_tensor(d["index"])) for d in interp.get_output_details()]
    programs = [step[0] for step in interp._session.compile(0).programs]
    return outs, programs


def opencl_program(programs):
    """The single opencl program the whole model was compiled into."""
    assert len(programs) == 1, f"expected one partition, got {[type(p).__name__ for p in programs]}"
    (program,) = programs
    assert type(program).__name__ == "ClProgram"
    return program


# -- a fused chain ---------------------------------------------------------------------

def chain_model(shape, y_shape):
    """ADD(x, y) -> MUL by a channel vector -> HARD_SWISH -> ADD of a same-shape input
    with a fused RELU6."""
    channels = shape[-1]
    rng = np.random.default_rng(channels)
    b = ModelBuilder()
    x = b.input("x", shape, F32)
    y = b.input("y", y_shape, F32)
    z = b.input("z", shape, F32)
    scale = b.const("scale", rng.uniform(0.5, 2.0, channels).astype(F32))
    t0, t1, t2, out = (b.tensor(n, shape, F32) for n in ("t0", "t1", "t2", "out"))
    b.op("ADD", [x, y], [t0])
    b.op("MUL", [t0, scale], [t1])
    b.op("HARD_SWISH", [t1], [t2])
    b.op("ADD", [t2, z], [out], fused_activation_function="RELU6")
    b.output(out)
    feeds = [(rng.standard_normal(s) * 3).astype(F32) for s in (shape, y_shape, shape)]
    return b.build(), feeds


CHAINS = {   # name: (x shape, y shape, whether the producer stores float4s)
    "float4-store": ((1, 6, 5, 8), (1, 6, 1, 8), True),
    # merged innermost axis 12 allows float4, but the MUL's channel vector of 6 would wrap
    "channels-not-multiple-of-4": ((1, 6, 2, 6), (1, 1, 2, 6), False),
    "same-shape": ((1, 6, 5, 8), (1, 6, 5, 8), False),
}


@pytest.mark.parametrize("name", list(CHAINS))
@pytest.mark.parametrize("fp16", [False, True], ids=["F32", "F32_F16"])
def test_chain_runs_as_one_kernel_and_matches_litert(opencl, name, fp16):
    shape, y_shape, float4 = CHAINS[name]
    data, feeds = chain_model(shape, y_shape)
    (source,) = kernel_sources(data)
    assert ("ST4(" in source) == float4
    got, programs = run_opencl(data, feeds, fp16)
    assert opencl_program(programs).kernel_count == 1
    compare(got, litert_outputs(data, feeds), 1e-2 if fp16 else 1e-5, name)


# -- every chain expression as a follower ------------------------------------------------

# Chains of followers covering every chain expression (each op, and each way a binary
# follower's other operand is indexed). Grouped so a few kernels cover them all (each
# kernel costs a PoCL compile), with each op's input kept in its domain.
UNARY_CHAINS = [
    [("ABS", {}), ("SQRT", {}), ("LOG", {})],
    [("EXP", {}), ("RSQRT", {})],
    [("SIN", {}), ("COS", {}), ("NEG", {})],
    [("RELU", {}), ("RELU6", {}), ("SQUARE", {})],
    [("RELU_N1_TO_1", {}), ("RELU_0_TO_1", {}), ("LOGISTIC", {})],
    [("TANH", {})], [("HARD_SWISH", {})], [("GELU", {"approximate": False})], [("GELU", {"approximate": True})],
    [("LEAKY_RELU", {"alpha": 0.3})], [("ELU", {})],
    [("FLOOR", {})], [("CEIL", {})], [("ROUND", {})], [("SIGN", {})],
]
BINARY_CHAINS = [   # (op, how the other operand is given)
    [("ADD", "same"), ("MUL", "channel")],
    [("SUB", "swapped"), ("DIV", "scalar")],
    [("POW", "scalar")],          # the producer's input is positive here
    [("FLOOR_DIV", "same")], [("FLOOR_MOD", "channel")], [("MAXIMUM", "swapped")],
    [("MINIMUM", "scalar")], [("SQUARED_DIFFERENCE", "same")], [("PRELU", "channel")],
]


def test_the_chains_cover_every_formula():
    from litegpu.codegen.formulas import BINARY, UNARY
    # The float view's ops (no LiteRT op) are checked in tests/test_float_view.py and
    # tests/test_float_view_int16.py.
    assert {op for chain in UNARY_CHAINS for op, _ in chain} == set(UNARY) - {"QUANT_SIM", "INV_FLOOR_POW2"}
    assert {op for chain in BINARY_CHAINS for op, _ in chain} == set(BINARY) - {"GRID_ADD", "GRID_MUL",
                                                                                 "GRID_MUL_ROUND"}


def all_chains_model(channels: int):
    """One model, one kernel per chain: ADD(input, bias vector) -> the chain's ops.

    The producer broadcasts, so with ``channels`` a multiple of 4 it stores float4s and
    every follower runs on ``real4`` (standalone same-shape kernels, which the
    conformance suite runs, use the ``real`` forms).
    """
    rng = np.random.default_rng(7)
    shape = (2, 3, channels)
    b = ModelBuilder()
    signed = b.input("signed", shape, F32)
    positive = b.input("positive", shape, F32)
    other = b.input("other", shape, F32)
    feeds = [(rng.uniform(0.5, 3.0, shape) * rng.choice([-1, 1], shape)).astype(F32),
             rng.uniform(0.5, 3.0, shape).astype(F32),
             (rng.uniform(0.5, 2.0, shape) * rng.choice([-1, 1], shape)).astype(F32)]
    bias = b.const("bias", rng.uniform(0.05, 0.2, channels).astype(F32))
    operands = {"same": other, "swapped": other,
                "channel": b.const("vector", rng.uniform(0.5, 1.5, channels).astype(F32)),
                "scalar": b.const("scalar", np.array(1.25, F32))}
    outs = []
    for n, chain in enumerate(UNARY_CHAINS + BINARY_CHAINS):
        first = chain[0][0]
        running = b.tensor(f"p{n}", shape, F32)
        b.op("ADD", [positive if first == "POW" else signed, bias], [running])
        for j, (op, how) in enumerate(chain):
            out = b.tensor(f"c{n}_{j}", shape, F32)
            if isinstance(how, dict):
                b.op(op, [running], [out], **how)
            else:
                b.op(op, [operands[how], running] if how == "swapped" else [running, operands[how]], [out])
            running = out
        outs.append(running)
    b.output(*outs)
    return b.build(), feeds, len(outs)


def test_every_chain_expression_folds_on_real4_and_matches_litert(opencl):
    data, feeds, chains = all_chains_model(8)
    got, programs = run_opencl(data, feeds)
    assert opencl_program(programs).kernel_count == chains    # every follower folded
    sources = kernel_sources(data)
    assert len(sources) == chains and all("ST4(" in src for src in sources)
    compare(got, litert_outputs(data, feeds), 1e-5, "chains")


# -- broadcast index math ------------------------------------------------------------------

@pytest.mark.parametrize("shapes", [
    [(2, 3, 4, 5), (2, 3, 4, 5)], [(1, 4, 4, 8), (8,)], [(2, 1, 4, 1), (1, 3, 1, 5)],
    [(5,), (2, 3, 1, 5)], [(2, 1, 3, 1, 4), (1, 2, 1, 3, 1)], [(2, 1, 2, 3, 1, 4), (1, 3, 1, 1, 2, 1)],
    [(), (3, 4)], [(2, 1, 4), (1, 3, 1), (3, 4)], [(1, 1, 3), (1, 4, 4, 3)],
])
def test_broadcast_indices_match_numpy(shapes):
    from litegpu.codegen import DIALECTS, Precision, ir
    from litegpu.codegen.crender import CRenderer
    from litegpu.codegen.kernels.elementwise import Broadcast
    out = np.broadcast_shapes(*shapes)
    bc = Broadcast(out, shapes)
    # merged axes never outnumber the output's non-1 axes
    assert len(bc.dims) <= sum(d != 1 for d in out) and bc.size == int(np.prod(out))
    # Evaluate the rendered C (non-negative ints: / is floor division) for every output element.
    b, flat = ir.KernelBuilder(), ir.Sym("i", ir.INT)
    found = bc.coords(b, flat)
    c = CRenderer(DIALECTS["opencl"], Precision())
    coords = [(s.sym.name, c.expr(s.value).replace(" / ", " // ")) for s in b.kernel((1,)).body]
    for k, shape in enumerate(shapes):
        want = np.broadcast_to(np.arange(int(np.prod(shape))).reshape(shape), out).reshape(-1)
        expr = c.expr(bc.index(k, flat, found)).replace(" / ", " // ")
        got = []
        for i in range(int(np.prod(out))):
            env = {"i": i}
            for name, value in coords:
                env[name] = eval(value, {}, env)
            got.append(eval(expr, {}, env))
        np.testing.assert_array_equal(got, want, err_msg=f"operand {k} of {shapes}")


def kernel_sources(data: bytes) -> list[str]:
    """The generated sources of the model's steps (F32), followers folded as on opencl."""
    from litegpu.codegen import Precision
    from litegpu.codegen.fusion import chain_steps, followers
    from litegpu.codegen.kernels import load_all
    from litegpu.codegen.render import generate
    load_all()
    model = load_model(data)
    sg = model.subgraphs[0]
    nodes = node_contexts(model, sg)
    specs = {}
    for ctx in nodes:
        specs.update((t, s) for t, s in zip(ctx.node.inputs, ctx.inputs) if t >= 0)
        specs.update(zip(ctx.node.outputs, ctx.outputs))
    sources = []
    for step in chain_steps(nodes, list(sg.outputs)):
        kernels = generate(nodes[step[0]], Precision(), specs, followers(nodes, step),
                           nodes[step[-1]].node.outputs[0])
        sources += [k.source for k in kernels]
    return sources


def binary_model(op, a_shape, b_shape, dtype=F32):
    b = ModelBuilder()
    x, y = b.input("a", a_shape, dtype), b.input("b", b_shape, dtype)
    out = b.tensor("out", np.broadcast_shapes(a_shape, b_shape), dtype)
    b.op(op, [x, y], [out])
    b.output(out)
    return b.build()


def test_float4_where_broadcast_indexing_needs_it_else_one_element_per_work_item():
    (bcast,) = kernel_sources(binary_model("ADD", (1, 56, 56, 24), (1, 56, 56, 1)))
    assert "ST4(" in bcast and "LD4(" in bcast and "(real4)(LD(" in bcast   # b is loaded once, splatted
    (same,) = kernel_sources(binary_model("ADD", (2, 8, 8), (2, 8, 8)))
    assert "ST4(" not in same and " / " not in same and " % " not in same  # flat, no index math
    (odd,) = kernel_sources(binary_model("MUL", (3, 6), (6,)))
    assert "ST4(" not in odd and "% 6" in odd


# -- LiteRT's edge semantics ------------------------------------------------------------------

def edge_model():
    """NaN in MAXIMUM/MINIMUM (the second operand wins) and in CAST (saturates to the
    maximum), ROUND ties to even, integer DIV / FLOOR_DIV / FLOOR_MOD signs (by a constant
    divisor: a run-time one is left to cpu, which raises LiteRT's error on a zero), a
    ZEROS_LIKE feeding an ADD; last, TANH of NaN and infinities (its rational form must keep them)."""
    nan, inf = np.nan, np.inf
    a = np.array([nan, 1.0, nan, -2.0, 0.5, 1.5, 2.5, -0.5, -2.5, 3e9, -3e9, inf], F32)
    c = np.array([1.0, nan, nan, -3.0, 7.0, -1.0, 0.0, 2.0, 3.0, -4.0, 5.0, 6.0], F32)
    ia = np.array([7, -7, 7, -7, 6, -6, 0, 1, -1, 13, -13, 5], I32)
    ib = np.array([2, 2, -2, -2, 3, 3, 5, -5, 5, 4, 4, -1], I32)
    th = np.array([nan, inf, -inf, 0.0, -0.3, 0.7, 2.0, -5.0, 8.9, 9.5, -20.0, 1e-4], F32)
    b = ModelBuilder()
    x, y = b.input("a", a.shape, F32), b.input("c", c.shape, F32)
    p, q = b.input("ia", ia.shape, I32), b.const("ib", ib)
    w = b.input("th", th.shape, F32)
    outs = []
    for op, ins, dtype in [("MAXIMUM", [x, y], F32), ("MINIMUM", [x, y], F32), ("CAST", [x], I32),
                           ("ROUND", [x], F32), ("DIV", [p, q], I32), ("FLOOR_DIV", [p, q], I32),
                           ("FLOOR_MOD", [p, q], I32), ("ZEROS_LIKE", [y], F32), ("TANH", [w], F32)]:
        out = b.tensor(f"{op.lower()}", a.shape, dtype)
        b.op(op, ins, [out])
        outs.append(out)
    total = b.tensor("zeros_plus_c", a.shape, F32)
    tanh = outs.pop()
    b.op("ADD", [outs.pop(), y], [total])
    b.output(*outs, total, tanh)
    return b.build(), [a, c, ia, th]


def test_edge_semantics_match_litert(opencl):
    data, feeds = edge_model()
    got, programs = run_opencl(data, feeds)
    opencl_program(programs)   # everything ran on opencl
    want = litert_outputs(data, feeds)
    compare(got[:-1], want[:-1], 0.0, "edge cases")
    compare(got[-1:], want[-1:], 1e-6, "TANH")
