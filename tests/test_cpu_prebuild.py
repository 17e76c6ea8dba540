"""``litegpu prebuild``: the cpu backend's task functions compiled once, at install, into a
folder every later process links them from (:mod:`litegpu_cpu.prebuild`). A first process
then runs without numba, with the bits a process that compiled them gets; a damaged or
untrusted folder is compiled around, never crashed on; stale entries are removed."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from litegpu.errors import InvalidArgumentError
from litegpu_cpu import prebuild
from litegpu_cpu.kernels import tasks
# A model whose kernels are all module-level task functions (nothing generated for it).
from test_cpu_native import _WARM_CHILD as _CHILD


def _run(args: list[str], cache: Path, prebuilt: Path | str) -> subprocess.CompletedProcess:
    env = dict(os.environ, LITEGPU_CACHE_DIR=str(cache), LITEGPU_PREBUILT_DIR=str(prebuilt))
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=600)


def _child(cache: Path, prebuilt: Path | str) -> dict:
    done = _run(["-c", _CHILD], cache, prebuilt)
    assert done.returncode == 0, done.stderr[-4000:]
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "stderr": done.stderr}


@pytest.fixture(scope="module")
def prebuilt(tmp_path_factory) -> Path:
    """A folder ``litegpu prebuild`` filled (from a process whose caches were empty)."""
    folder = tmp_path_factory.mktemp("prebuilt") / "kernels"
    done = _run(["-m", "litegpu.cli", "prebuild", "--backend", "cpu", "--out", str(folder)],
                tmp_path_factory.mktemp("cache"), "")
    assert done.returncode == 0, done.stderr[-4000:]
    assert "kernels prebuilt in" in done.stdout
    return folder


@pytest.fixture(scope="module")
def bare(tmp_path_factory) -> dict:
    """A process with empty caches and nothing prebuilt: it compiles with numba."""
    return _child(tmp_path_factory.mktemp("bare"), "")


def test_prebuild_keeps_every_task_function_this_cpu_can_run(prebuilt):
    entries = {path.stem for path in prebuilt.glob("*.o")}
    functions = prebuild.task_functions()
    assert {f.entry() for f in functions if not f.requires} <= entries   # the generic ones, all
    assert len(entries) <= len(functions)


def test_a_first_process_links_prebuilt_kernels_without_numba_and_gets_the_same_bits(prebuilt, bare, tmp_path):
    first = _child(tmp_path / "cache", prebuilt)
    assert bare["numba imported"] and not first["numba imported"]
    assert first["out"] == bare["out"]
    assert not list((tmp_path / "cache").glob("numba/*/objects/*.o"))   # nothing compiled, nothing cached


def test_a_damaged_prebuilt_folder_is_compiled_around_and_left_as_it_was(prebuilt, bare, tmp_path):
    damaged = tmp_path / "damaged"
    shutil.copytree(prebuilt, damaged)
    for i, path in enumerate(sorted(damaged.glob("*.o"))):
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2] if i % 2 else b"garbage")
    before = {path.name: path.read_bytes() for path in damaged.glob("*.o")}
    run = _child(tmp_path / "cache", damaged)
    assert run["out"] == bare["out"] and run["numba imported"]
    assert "is damaged" in run["stderr"]
    assert {path.name: path.read_bytes() for path in damaged.glob("*.o")} == before


def test_a_prebuilt_folder_others_can_write_is_not_used(prebuilt, bare, tmp_path):
    shared = tmp_path / "shared"
    shutil.copytree(prebuilt, shared)
    shared.chmod(0o777)
    run = _child(tmp_path / "cache", shared)
    assert run["out"] == bare["out"] and run["numba imported"]
    assert "are not used: the folder is group- or world-writable" in run["stderr"]


def test_prebuild_again_compiles_nothing_and_removes_stale_entries(prebuilt, tmp_path):
    again = tmp_path / "again"
    shutil.copytree(prebuilt, again)
    (again / ("0" * 64 + ".o")).write_bytes(b"an entry no function has")
    report = prebuild.prebuild(again)
    assert report.built == [] and len(report.present) == len(list(prebuilt.glob("*.o")))
    assert report.removed == 1 and not (again / ("0" * 64 + ".o")).exists()


def test_a_function_needing_what_this_cpu_lacks_is_skipped_not_compiled(monkeypatch, tmp_path):
    alien = tasks.TaskFunction(lambda: None, requires=("no-such-cpu-feature",))
    monkeypatch.setattr(prebuild, "task_functions", lambda: [alien])
    report = prebuild.prebuild(tmp_path / "kernels")
    assert report.skipped == [alien.name] and not report.built and not alien._address


def test_prebuild_with_nowhere_to_write_fails_with_a_clear_error(tmp_path):
    cli = ["-m", "litegpu.cli", "prebuild", "--backend", "cpu"]
    done = _run(cli, tmp_path / "cache", "")
    assert done.returncode == 1 and "LITEGPU_PREBUILT_DIR is set empty" in done.stderr
    (tmp_path / "a-file").write_text("")
    done = _run([*cli, "--out", str(tmp_path / "a-file" / "kernels")], tmp_path / "cache", "")
    assert done.returncode == 1 and "cannot create" in done.stderr
    with pytest.raises(InvalidArgumentError, match="set empty"):    # the suite sets it empty (conftest.py)
        prebuild.prebuild()


# A chain (ADD then PRELU with per-channel slopes) that no process has compiled.
_CHAIN_CHILD = r"""
import json, sys
import numpy as np
import litegpu
from litegpu.testing.builder import ModelBuilder
b = ModelBuilder()
x = b.input("x", [1, 24, 24, 16]); y = b.input("y", [1, 24, 24, 16])
slopes = b.const("slopes", np.linspace(0.05, 0.4, 16, dtype=np.float32).reshape(1, 1, 1, 16))
s = b.tensor("s", [1, 24, 24, 16]); b.op("ADD", [x, y], [s])
z = b.tensor("z", [1, 24, 24, 16]); b.op("PRELU", [s, slopes], [z])
b.output(z)
it = litegpu.Interpreter(model_content=b.build(), num_threads=2)
it.allocate_tensors()
rng = np.random.default_rng(3)
for d in it.get_input_details():
    it.set_tensor(d["index"], rng.standard_normal(d["shape"]).astype(np.float32))
it.invoke()
out = it.get_tensor(it.get_output_details()[0]["index"]).tolist()
kernels = [k for _, k in it._compiled.programs[0][0].kernels()]
imported = "numba" in sys.modules
# Once the background compile is done, the runs switch to the generated kernel.
import time
from litegpu_cpu import compile_queue
deadline = time.monotonic() + 120
while compile_queue._WAITING and time.monotonic() < deadline:
    time.sleep(0.05)
it.invoke()
print(json.dumps({"out": out, "numba imported": imported, "kernels": kernels, "switched": not compile_queue._WAITING,
                  "after": it.get_tensor(it.get_output_details()[0]["index"]).tolist()}))
"""


def test_a_first_process_runs_a_new_chain_on_the_machine_and_the_next_one_its_compiled_kernel(prebuilt, tmp_path):
    def child(cache, folder) -> dict:
        done = _run(["-c", _CHAIN_CHILD], cache, folder)
        assert done.returncode == 0, done.stderr[-4000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    bare = child(tmp_path / "bare", "")
    first = child(tmp_path / "cache", prebuilt)
    # Its generated kernel compiles in a process of its own, which may outlive the first.
    deadline = time.monotonic() + 120
    while not list((tmp_path / "cache").glob("numba/*/objects/*.o")) and time.monotonic() < deadline:
        time.sleep(0.2)
    second = child(tmp_path / "cache", prebuilt)
    assert any("chain machine" in k for k in first["kernels"])
    assert not any("chain machine" in k for k in second["kernels"] + bare["kernels"])
    assert first["out"] == second["out"] == bare["out"]
    assert first["switched"] and first["after"] == first["out"]   # this process's later runs: the same bits
    assert not second["numba imported"]      # its generated kernel was kept by the first
