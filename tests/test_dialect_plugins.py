"""Kernel dialects register through the ``litegpu_dialects`` hook, as backends do.

A new GPU API is a plugin module with its dialect and a CodegenBackend naming it: the
core renders, plans and writes its kernels with no edit of litegpu itself.
"""
from __future__ import annotations

import dataclasses
import json

import pytest

from litegpu.cli import main
from litegpu.codegen import DIALECTS, Precision
from litegpu.codegen.backend import CodegenBackend
from litegpu.codegen.opencl import OPENCL
from litegpu.errors import BackendUnavailableError, PluginError
from litegpu.hookspecs import hookimpl
from litegpu.plugins import manager

from test_compile_out import _model

# A third party's C-family API: OpenCL C's spellings under another name and file suffix.
TOY = dataclasses.replace(OPENCL, name="toycl", suffix=".toy")


class ToyBackend(CodegenBackend):
    """A codegen backend without a device: enough to plan and write sources offline."""

    name = "toy"
    dialect = "toycl"

    def open_device(self):
        raise BackendUnavailableError("the toy API has no device")


def _plugin(dialects, backends=()) -> object:
    class Plugin:
        @hookimpl
        def litegpu_dialects(self):
            return list(dialects)

        @hookimpl
        def litegpu_backends(self):
            return list(backends)
    return Plugin()


@pytest.fixture
def toy_plugin():
    manager().register(_plugin([TOY], [ToyBackend()]), "toy-plugin")
    yield
    manager().unregister("toy-plugin")


def test_the_shipped_dialects_come_from_the_plugins_that_run_them():
    by_plugin = {r.name: r.dialects for r in manager().records}
    assert by_plugin["opencl"] == ["opencl"] and by_plugin["cuda"] == ["cuda"]
    assert by_plugin["metal"] == ["metal"] and by_plugin["webgpu"] == ["wgsl"]
    assert {"opencl", "cuda", "metal", "wgsl"} <= set(DIALECTS)
    with pytest.raises(KeyError, match="no kernel dialect 'nope'; registered: .*opencl"):
        DIALECTS["nope"]


def test_a_plugin_dialect_renders_plans_and_writes_a_model(toy_plugin, tmp_path, capsys):
    assert DIALECTS["toycl"] is TOY
    out = tmp_path / "out"
    assert main(["compile", _model(tmp_path), "--backend", "toy", "--out", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert [m["source"] for m in manifest] == ["toy.F32.sg0.p0.toy", "toy.F32.sg0.p1.toy"]
    # The same kernels as OpenCL's, since the table spells them the same way.
    ref = tmp_path / "ref"
    assert main(["compile", _model(tmp_path), "--backend", "opencl", "--out", str(ref)]) == 0
    assert (out / "toy.F32.sg0.p0.toy").read_text() == (ref / "opencl.F32.sg0.p0.cl").read_text()


def test_the_dialect_goes_with_its_plugin(toy_plugin):
    manager().unregister("toy-plugin")
    assert "toycl" not in DIALECTS
    manager().register(_plugin([TOY], [ToyBackend()]), "toy-plugin")   # for the fixture's teardown
    assert "toycl" in DIALECTS


@pytest.mark.parametrize("dialect, fault", [
    (OPENCL, "name 'opencl' is already taken by plugin 'opencl'"),
    (dataclasses.replace(OPENCL, name=""), "name must be a non-empty str"),
    (object(), "name must be a non-empty str"),
    (dataclasses.replace(OPENCL, name="odd", max_lanes="16"), "max_lanes must be of type int"),
])
def test_a_malformed_or_duplicate_dialect_refuses_the_plugin_whole(dialect, fault):
    with pytest.raises(PluginError, match=f"plugin 'bad-dialects': dialect 0 .*{fault}"):
        manager().register(_plugin([dialect], [ToyBackend()]), "bad-dialects")
    assert "toy" not in manager().backends and "bad-dialects" not in {r.name for r in manager().records}


def test_a_backend_naming_no_registered_dialect_is_refused_by_compile(tmp_path, capsys):
    manager().register(_plugin([], [ToyBackend()]), "no-dialect")
    try:
        assert main(["compile", _model(tmp_path), "--backend", "toy", "--out", str(tmp_path / "o")]) == 1
        assert "renders no kernel sources" in capsys.readouterr().err
    finally:
        manager().unregister("no-dialect")


def test_precision_modes_render_through_the_dialect_object():
    # render() is the one entry point both families share; F32_F16 half storage included.
    from litegpu.codegen import ir
    b = ir.KernelBuilder()
    x, y = b.buffer("float32"), b.buffer("float32", writes=True)
    i = b.global_id(0)
    b.store(y, i, x.load(i) * 2.0)
    k = b.kernel((8,))
    for name in ("opencl", "wgsl"):
        assert "KERNEL" in DIALECTS[name].render(k, Precision(True, False))
