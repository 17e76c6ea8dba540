"""litegpu's environment switches: the usual spellings work, anything else is an error."""
from __future__ import annotations

from pathlib import Path

import pytest

import litegpu
from litegpu import env


@pytest.mark.parametrize("raw, want", [("1", True), ("TRUE", True), (" on ", True), ("yes", True),
                                       ("0", False), ("false", False), ("Off", False), ("no", False),
                                       ("", None), ("  ", None)])
def test_flag_spellings(monkeypatch, raw: str, want) -> None:
    monkeypatch.setenv("LITEGPU_TEST_SWITCH", raw)
    assert env.flag("LITEGPU_TEST_SWITCH", True) is (True if want is None else want)
    assert env.flag("LITEGPU_TEST_SWITCH", False) is (False if want is None else want)


@pytest.mark.parametrize("raw", ["enabled", "2", "y3s", "of"])
def test_a_misspelled_flag_is_an_error_naming_the_variable(monkeypatch, raw: str) -> None:
    monkeypatch.setenv("LITEGPU_OPENCL_FORBID_COMPILE", raw)
    with pytest.raises(litegpu.InvalidArgumentError, match=f"LITEGPU_OPENCL_FORBID_COMPILE='{raw}'"):
        env.flag("LITEGPU_OPENCL_FORBID_COMPILE", False)


def test_cache_root_order(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LITEGPU_CACHE_DIR", str(tmp_path / "lg"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert env.cache_root() == tmp_path / "lg"
    monkeypatch.delenv("LITEGPU_CACHE_DIR")
    assert env.cache_root() == tmp_path / "xdg" / "litegpu"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/path")   # invalid per the XDG spec: ignored
    assert env.cache_root() == Path.home() / ".cache" / "litegpu"


def test_cpu_fusion_switch_is_strict(monkeypatch) -> None:
    """LITEGPU_CPU_FUSION=off turns fusion off (before, only "0" did; "off" meant on)."""
    from litegpu_cpu import fusion
    monkeypatch.setenv("LITEGPU_CPU_FUSION", "off")
    assert fusion.fusion_runs([object(), object()]) == [[0], [1]]
    monkeypatch.setenv("LITEGPU_CPU_FUSION", "of")
    with pytest.raises(litegpu.InvalidArgumentError, match="LITEGPU_CPU_FUSION"):
        fusion.fusion_runs([object()])
