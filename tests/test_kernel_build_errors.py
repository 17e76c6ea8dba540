"""A GPU kernel the API's compiler refuses is reported by node, op and saved source.

A real compiler refuses a real (deliberately broken) kernel: the generator of one op is
replaced for the test by one that writes a statement no dialect accepts.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

import litegpu
from litegpu.codegen import kernels
from litegpu.testing.builder import ModelBuilder


def _model() -> bytes:
    """x -> LOGISTIC -> MUL by itself: two nodes, the second one's kernel is broken (the
    first's output is an output too, so the two are not one fused region)."""
    b = ModelBuilder()
    x = b.input("x", (2, 8), np.float32)
    y = b.tensor("y", (2, 8), np.float32)
    b.op("LOGISTIC", [x], [y])
    z = b.tensor("z", (2, 8), np.float32)
    b.op("MUL", [y, y], [z])
    b.output(z)
    b.output(y)
    return b.build()


def broken(real: kernels.Generator) -> kernels.Generator:
    """``real`` with a statement no dialect accepts at the top of each kernel's body."""
    def gen(g):
        return [dataclasses.replace(k, source=k.source.replace("{", "{ no_such_name;", 1)) for k in real.fn(g)]
    return kernels.Generator(gen, real.epilogue)


@pytest.fixture
def broken_mul(monkeypatch):
    """MUL's generator writes kernels whose body uses an undeclared name."""
    kernels.load_all()
    monkeypatch.setitem(kernels.GENERATORS, "MUL", broken(kernels.GENERATORS["MUL"]))


def test_opencl_build_failure_names_node_op_and_source(opencl, broken_mul, tmp_path, monkeypatch):
    monkeypatch.setenv("LITEGPU_CACHE_DIR", str(tmp_path))
    with pytest.raises(litegpu.KernelBuildError) as info:
        interp = litegpu.Interpreter(model_content=_model(), experimental_delegates=[litegpu.load_delegate("opencl")])
        interp.allocate_tensors()
    err = info.value
    assert (err.node, err.op) == (1, "MUL"), str(err)
    assert "node 1 (MUL)" in str(err) and "no_such_name" in err.log
    saved = Path(err.source_path)
    assert saved.parent == tmp_path / "failed-kernels" and saved.suffix == ".cl"
    assert "no_such_name" in saved.read_text()   # the failing kernel alone, with its prelude
    assert "LOGISTIC" not in saved.read_text() and str(saved) in str(err)
