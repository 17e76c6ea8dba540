"""litegpu.codegen.cse: a statement's shared subexpressions become constants before it, where
the statement always evaluates them.

That the hoisted kernels compute the same bits is what the GPU suites check
(tests/test_gpu_xnnpack_order.py against LiteRT, bit for bit, the conformance suite, the
decoders); here, what is hoisted and what is not, and the source it saves.
"""
from __future__ import annotations

import numpy as np

from litegpu.codegen import formulas, ir
from litegpu.codegen.crender import CRenderer
from litegpu.codegen.dialects import DIALECTS
from litegpu.codegen.nodegen import Precision


def _source(b: ir.KernelBuilder) -> str:
    return CRenderer(DIALECTS["opencl"], Precision()).kernel(b.kernel((64,)))


def _lets(b: ir.KernelBuilder) -> list[ir.Let]:
    return [s for s in b.kernel((64,)).body if isinstance(s, ir.Let) and s.sym.name.startswith("cs")]


def test_a_shared_node_is_computed_once():
    b = ir.KernelBuilder()
    x, y = b.buffer(np.float32), b.buffer(np.float32, writes=True)
    i = b.global_id(0)
    square = x.load(i) * x.load(i)
    b.store(y, i, square + square * 2.0)
    (let,) = _lets(b)
    assert let.value is square
    source = _source(b)
    assert source.count("LD(t0,") == 2 and "(cs + (cs * " in source     # the square once, then its uses


def test_a_node_one_branch_of_a_select_shares_stays_in_that_branch():
    """The other branch may be the one that runs: a division (or a guarded load) there
    must not run unconditionally."""
    b = ir.KernelBuilder()
    x, y = b.buffer(np.int32), b.buffer(np.int32, writes=True)
    i = b.global_id(0)
    d = b.let("d", x.load(i))
    quotient = 100 / d
    b.store(y, i, ir.select(d.ne(0), quotient + quotient, 0))
    assert not _lets(b)


def test_a_node_both_branches_or_the_condition_use_is_hoisted():
    b = ir.KernelBuilder()
    x, y = b.buffer(np.float32), b.buffer(np.float32, writes=True)
    i = b.global_id(0)
    v = b.let("v", x.load(i), ir.REAL)
    e = ir.call("exp", v)
    b.store(y, i, ir.select(v > 0.0, e + 1.0, e - 1.0))
    assert [let.value.fn for let in _lets(b)] == ["exp"]


def test_xnnpack_s_sigmoid_renders_each_step_once():
    """A chain into XNNPACK's sigmoid printed its inner steps at every use (lines of 120 KB
    in efficientnet_b0); now each lane's steps are constants."""
    b = ir.KernelBuilder()
    x, y = b.buffer(np.float32), b.buffer(np.float32, writes=True)
    i = b.global_id(0)
    v = x.load(i * 4, lanes=4) * 1.5 + 0.25
    b.store(y, i * 4, v * formulas.UNARY["LOGISTIC"](v, {}))
    source = _source(b)
    assert max(len(line) for line in source.splitlines() if "lg_tab_" not in line) < 400
    assert len(source) < 12_000, len(source)
