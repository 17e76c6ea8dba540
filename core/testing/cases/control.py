"""Conformance cases for control flow (WHILE, IF, CALL_ONCE) and resource variables."""
from __future__ import annotations

import numpy as np

from ..builder import ModelBuilder
from . import Case


def _while_sum(limit: float, width: int):
    """(i, acc) -> while i < limit: i += 1; acc += i * x."""
    def build():
        b = ModelBuilder()
        cond = b.subgraph("cond")
        ci = cond.input("i", ())
        cond.input("acc", (width,))  # the loop carries all three values through the condition too
        cond.input("x", (width,))
        less = cond.tensor("less", (), np.bool_)
        cond.op("LESS", [ci, cond.const("limit", np.array(limit, np.float32))], [less])
        cond.output(less)
        body = b.subgraph("body")
        bi, bacc, bx = body.input("i", ()), body.input("acc", (width,)), body.input("x", (width,))
        i2 = body.tensor("i2", ())
        body.op("ADD", [bi, body.const("one", np.array(1, np.float32))], [i2])
        scaled = body.tensor("scaled", (width,))
        body.op("MUL", [bx, i2], [scaled])
        acc2 = body.tensor("acc2", (width,))
        body.op("ADD", [bacc, scaled], [acc2])
        body.output(i2, acc2, bx)
        i, acc, x = b.input("i", ()), b.input("acc", (width,)), b.input("x", (width,))
        outs = [b.tensor("i_out", ()), b.tensor("acc_out", (width,)), b.tensor("x_out", (width,))]
        b.op("WHILE", [i, acc, x], outs, cond_subgraph_index=cond.index, body_subgraph_index=body.index)
        b.output(outs[0], outs[1])
        rng = np.random.default_rng(width)
        return b.build(), [np.array(0, np.float32), np.zeros(width, np.float32),
                           rng.standard_normal(width).astype(np.float32)]
    return build


def _if(flag: bool):
    def build():
        b = ModelBuilder()
        then = b.subgraph("then")
        tx = then.input("x", (3,))
        ty = then.tensor("y", (3,))
        then.op("MUL", [tx, then.const("two", np.full(3, 2, np.float32))], [ty])
        then.output(ty)
        other = b.subgraph("else")
        ex = other.input("x", (3,))
        ey = other.tensor("y", (3,))
        other.op("NEG", [ex], [ey])
        other.output(ey)
        c, x = b.input("c", (), np.bool_), b.input("x", (3,))
        y = b.tensor("y", (3,))
        b.op("IF", [c, x], [y], then_subgraph_index=then.index, else_subgraph_index=other.index)
        b.output(y)
        return b.build(), [np.array(flag), np.array([1.5, -2.0, 3.25], np.float32)]
    return build


def _variable():
    """CALL_ONCE initialises a variable to 10; each invoke adds x to it and returns the sum."""
    def build():
        b = ModelBuilder()
        init = b.subgraph("init")
        h0 = init.tensor("h", (), "RESOURCE")
        init.op("VAR_HANDLE", [], [h0], shared_name="v")
        init.op("ASSIGN_VARIABLE", [h0, init.const("ten", np.full(2, 10, np.float32))], [])
        x = b.input("x", (2,))
        b.op("CALL_ONCE", [], [], init_subgraph_index=init.index)
        h = b.tensor("h", (), "RESOURCE")
        b.op("VAR_HANDLE", [], [h], shared_name="v")
        v = b.tensor("v", (2,))
        b.op("READ_VARIABLE", [h], [v])
        s = b.tensor("s", (2,))
        b.op("ADD", [v, x], [s])
        b.op("ASSIGN_VARIABLE", [h, s], [])
        b.output(s)
        return b.build(), [np.array([1.0, -3.0], np.float32)]
    return build


CASES = [
    Case("WHILE", "counter-acc-w4", _while_sum(5.0, 4)),
    Case("WHILE", "zero-iterations", _while_sum(-1.0, 3)),
    Case("WHILE", "long-w64", _while_sum(200.0, 64), tol=1e-5),
    Case("IF", "then", _if(True)),
    Case("IF", "else", _if(False)),
    Case("CALL_ONCE", "init-variable-read-add-assign", _variable()),
]
