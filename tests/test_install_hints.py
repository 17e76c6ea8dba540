"""Error hints name packages pip can install: litegpu may come from a clone, where
``pip install 'litegpu[cuda]'`` finds nothing on the index."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from litegpu.env import install_hint

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python >= 3.11")
PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


@pytest.mark.parametrize("extra", ["opencl", "cuda", "ray", "dask", "litert"])
def test_the_hint_names_every_package_of_the_extra(extra):
    wanted = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"][extra]
    hint = install_hint(extra)
    assert hint.startswith("pip install ") and f"[{extra}]" in hint
    for requirement in wanted:
        assert f"'{requirement.split(';')[0].strip()}'" in hint, (requirement, hint)
    assert "litegpu[" not in hint


def test_a_missing_pyopencl_is_reported_with_a_command_that_installs_it():
    code = ("import sys; sys.modules['pyopencl'] = None\n"
            "from litegpu.plugins import manager\n"
            "print(manager().backends['opencl'].available())\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "(False, " in run.stdout and "pip install 'pyopencl>=" in run.stdout, run.stdout
