"""The chain machine (:mod:`litegpu_cpu.chainvm`): every instruction gives the bits of the
generated kernel of the same chain, on every value kind and operand mode; and a first
process runs a chain on it while the generated kernel compiles for the next process."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from litegpu.backend import NodeContext
from litegpu.graph import Node
from litegpu.ops import get_op
from litegpu.ops.registry import TensorSpec
from litegpu_cpu import chainvm, fusion

F32, I32, BOOL = np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.bool_)
SHAPE = (3, 5, 40)
_SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -1e-40, 3e38, -3e38, 0.5, -0.5, 1.0, -1.0, 6.0,
                      -6.0, 20.0, -20.0, 100.0], np.float32)


def _values(kind: np.dtype, shape: tuple, rng) -> np.ndarray:
    if kind == F32:
        v = (rng.standard_normal(shape) * 4).astype(np.float32)
        flat = v.reshape(-1)
        flat[: min(flat.size, _SPECIALS.size)] = _SPECIALS[: flat.size]
        return v
    if kind == I32:
        return rng.integers(-2**31, 2**31 - 1, shape, dtype=np.int64).astype(np.int32)
    return rng.random(shape) < 0.5


def _node(op: str, kinds: list, out_kind, attrs: dict, modes: list[str]) -> tuple[NodeContext, list]:
    """One node over inputs of ``kinds`` read in ``modes`` (full, lastdim, scalar, row; const:
    a constant of that shape)."""
    shapes = {"full": SHAPE, "lastdim": SHAPE[-1:], "scalar": (), "row": SHAPE[:-1] + (1,)}
    rng = np.random.default_rng(abs(hash((op, tuple(modes)))) % 2**32)
    specs, arrays = [], []
    for kind, mode in zip(kinds, modes):
        const = mode.startswith("const-")
        shape = shapes[mode.removeprefix("const-")]
        value = _values(kind, shape, rng)
        specs.append(TensorSpec(shape, kind, value=value if const else None))
        if not const:
            arrays.append(value)
    n = Node(index=0, op=op, opcode=0, version=1, inputs=tuple(range(len(kinds))), outputs=(len(kinds),))
    ctx = NodeContext(node=n, opdef=get_op(op), attrs=attrs, inputs=specs, outputs=[TensorSpec(SHAPE, out_kind)])
    return ctx, arrays


def _cases():
    f = fusion
    act = {"activation": "NONE"}
    for op in sorted(f._UNARY_OPS - {"LEAKY_RELU"}):
        yield op, [F32], F32, dict(act), ["full"]
    for op in f._FLOAT_BINARY:
        for swapped in (False, True) if op in ("MAXIMUM", "MINIMUM") else (False,):
            yield op, [F32, F32], F32, {**act, "swapped": swapped}, ["full", "lastdim"]
            yield op, [F32, F32], F32, {**act, "swapped": swapped}, ["row", "const-scalar"]
    for name in sorted({a for a in f._ACTIVATION.values() if a}):
        yield "ADD", [F32, F32], F32, {"activation": name}, ["full", "const-full"]
    yield "GELU", [F32], F32, {"approximate": False}, ["full"]
    yield "GELU", [F32], F32, {"approximate": True}, ["full"]
    for op in sorted(f._INT_OPS):
        unary = op in f._UNARY_OPS
        for swapped in (False, True) if op in ("MAXIMUM", "MINIMUM") else (False,):
            yield op, [I32] * (1 if unary else 2), I32, {**act, "swapped": swapped}, \
                ["full"] if unary else ["full", "const-lastdim"]
    for op in sorted(f._COMPARE):
        yield op, [F32, F32], BOOL, {}, ["full", "scalar"]
        yield op, [I32, I32], BOOL, {}, ["lastdim", "full"]
        if op in ("EQUAL", "NOT_EQUAL"):
            yield op, [BOOL, BOOL], BOOL, {}, ["full", "row"]
    for op in sorted(f._LOGICAL):
        yield op, [BOOL] * (1 if op == "LOGICAL_NOT" else 2), BOOL, {}, ["full", "const-lastdim"][: 1 if op == "LOGICAL_NOT" else 2]
    for kind in (F32, I32, BOOL):
        yield "SELECT_V2", [BOOL, kind, kind], kind, {}, ["full", "full", "lastdim"]


CASES = list(_cases())


@pytest.mark.parametrize("op,kinds,out,attrs,modes", CASES,
                         ids=[f"{c[0]}-{''.join(k.char for k in c[1])}-{'-'.join(c[4])}-{c[3].get('activation', '')}"
                              f"{'-swapped' if c[3].get('swapped') else ''}{'-approx' if c[3].get('approximate') else ''}"
                              for c in CASES])
def test_every_instruction_gives_the_generated_kernels_bits(op, kinds, out, attrs, modes):
    ctx, arrays = _node(op, kinds, out, attrs, modes)
    assert fusion.fusable(ctx) and chainvm.covers(ctx)
    group = fusion.plan_group([ctx], {len(kinds)})
    machine = chainvm.machine_kernel(group)
    assert machine is not None
    got, want = np.zeros(SHAPE, out), np.zeros(SHAPE, out)
    machine(arrays, [got])
    fusion.generated_kernel(group)(arrays, [want])
    assert got.tobytes() == want.tobytes()


def test_the_cases_cover_every_instruction():
    used = set()
    for op, kinds, out, attrs, modes in CASES:
        ctx, _ = _node(op, kinds, out, attrs, modes)
        params, _ = chainvm.program(fusion.plan_group([ctx], {len(kinds)}))
        used |= {int(params[w]) for w in range(chainvm._HEADER, len(params), chainvm._WORDS)}
    assert set(chainvm._instructions().values()) <= used


def test_a_long_chain_with_many_live_values_and_outputs():
    """Registers reused across 40 nodes, several outputs (one bool), operands of every mode."""
    rng = np.random.default_rng(7)
    full = TensorSpec(SHAPE, F32)
    nodes, t = [], 0
    x = [_values(F32, SHAPE, rng) for _ in range(3)]
    inputs = {0: full, 1: full, 2: full}
    last = [0, 1, 2]
    t = 3
    for i in range(40):
        op = ("ADD", "MUL", "SUB", "MAXIMUM", "SQUARED_DIFFERENCE")[i % 5]
        a, b = last[-1], last[-3]
        n = Node(index=i, op=op, opcode=0, version=1, inputs=(a, b), outputs=(t,))
        nodes.append(NodeContext(node=n, opdef=get_op(op), attrs={"activation": "RELU6" if i % 7 == 3 else "NONE"},
                                 inputs=[full, full], outputs=[full]))
        last.append(t)
        t += 1
    n = Node(index=40, op="LESS", opcode=0, version=1, inputs=(last[-1], 1), outputs=(t,))
    nodes.append(NodeContext(node=n, opdef=get_op("LESS"), attrs={}, inputs=[full, full],
                             outputs=[TensorSpec(SHAPE, BOOL)]))
    escaping = {last[10], last[-1], t}
    group = fusion.plan_group(nodes, escaping)
    outs = [[np.zeros(SHAPE, BOOL if o == t else F32) for o in group.outputs] for _ in range(2)]
    chainvm.machine_kernel(group)(x, outs[0])
    fusion.generated_kernel(group)(x, outs[1])
    assert all(a.tobytes() == b.tobytes() for a, b in zip(*outs))
    assert int(chainvm.program(group)[0][5]) < 10      # registers reused, not one per value


def test_a_program_switched_to_its_generated_kernel_runs_that_kernel():
    """After ``switch``, every run of the bound machine calls the generated task function
    (the program is not read: emptied here, it would compute nothing)."""
    ctx, arrays = _node("ADD", [F32, F32], F32, {"activation": "RELU6"}, ["full", "lastdim"])
    group = fusion.plan_group([ctx], {2})
    machine = chainvm.machine_kernel(group)
    out = [np.zeros(SHAPE, F32)]
    run = machine.bind(arrays, out)
    want = np.zeros(SHAPE, F32)
    fusion.generated_kernel(group)(arrays, [want])
    fused = fusion.load_generated(group.source, "fused")
    params = run.held[-2]
    params[3] = 0                       # no instructions: the machine would leave zeros
    run()
    assert not out[0].any()
    machine.switch(fused.address)
    run()
    assert out[0].tobytes() == want.tobytes()
