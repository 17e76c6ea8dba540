"""Long work says what it is doing: :mod:`litegpu.progress`, the backends' reports, and the
command's spinner, which shows them on a terminal and stays silent off one."""
from __future__ import annotations

import errno
import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import litegpu
from litegpu import progress
from litegpu.testing.builder import ModelBuilder


def _conv_model() -> bytes:
    """Three different convolutions and a pool: several kernels, all on opencl."""
    b = ModelBuilder()
    cur = b.input("image", (1, 16, 16, 3))
    channels = 3
    for i, (out, stride) in enumerate([(8, 1), (16, 2), (8, 1)]):
        w = b.const(f"w{i}", np.full((out, 3, 3, channels), 0.1, np.float32))
        bias = b.const(f"b{i}", np.zeros(out, np.float32))
        side = 16 // (2 if i >= 1 else 1)
        y = b.tensor(f"conv{i}", (1, side, side, out))
        b.op("CONV_2D", [cur, w, bias], [y], padding="SAME", stride_w=stride, stride_h=stride,
             fused_activation_function="RELU")
        cur, channels = y, out
    pooled = b.tensor("pooled", (1, 4, 4, 8))
    b.op("AVERAGE_POOL_2D", [cur], [pooled], padding="VALID", stride_w=2, stride_h=2, filter_width=2,
         filter_height=2)
    b.output(pooled)
    return b.build()


def _cold(tmp_path: Path) -> dict[str, str]:
    """An environment in which every cache is empty: litegpu's, numba's, pyopencl's and PoCL's."""
    (tmp_path / "pocl").mkdir(parents=True, exist_ok=True)
    return {"LITEGPU_CACHE_DIR": str(tmp_path / "litegpu"), "XDG_CACHE_HOME": str(tmp_path / "xdg"),
            "POCL_CACHE_DIR": str(tmp_path / "pocl")}


# -- the module ----------------------------------------------------------------------------
def test_a_report_with_no_listener_prints_nothing(capfd) -> None:
    assert not progress.listened()
    progress.report("opencl: building a program of 3 kernels (once, then cached)")
    assert capfd.readouterr() == ("", "")


def test_listeners_get_reports_until_they_leave() -> None:
    heard: list[str] = []
    with progress.listening(heard.append):
        assert progress.listened()
        progress.report("one")

        def broken(message: str) -> None:
            raise RuntimeError("a display that fails")
        with progress.listening(broken):   # must not break the work that reports
            progress.report("two")
    progress.report("three")
    assert heard == ["one", "two"]
    assert not progress.listened()


def test_a_cold_opencl_compile_reports_counts_that_move(opencl, tmp_path, monkeypatch) -> None:
    for name, value in _cold(tmp_path).items():
        monkeypatch.setenv(name, value)
    heard: list[str] = []
    with progress.listening(heard.append):
        interp = litegpu.Interpreter(model_content=_conv_model(),
                                     experimental_delegates=[litegpu.load_delegate("opencl")])
        interp.allocate_tensors()
        interp.invoke()
    assert "partition 0 (opencl, 4 nodes): compiling" in heard
    built = [m for m in heard if re.fullmatch(r"opencl: building a program of \d+ kernels \(once, then cached\)", m)]
    assert len(built) == 1, heard
    launches = [re.match(r"opencl: first launch (\d+)/(\d+)", m) for m in heard]
    counts = [(int(m[1]), int(m[2])) for m in launches if m]
    total = counts[0][1]
    assert total >= 4 and counts == [(i, total) for i in range(1, total + 1)], heard
    assert all("(once, then cached)" in m for m in heard if "first launch" in m)
    assert heard[-1] == "opencl: storing the compiled kernels in the kernel cache"
    # A second run compiles nothing, so it says nothing.
    heard.clear()
    with progress.listening(heard.append):
        interp.invoke()
    assert heard == []


def test_numba_compiles_of_cpu_kernels_are_reported_with_the_enclosing_one_again() -> None:
    from numba import njit

    from litegpu_cpu.compile_progress import report_numba_compiles
    report_numba_compiles()
    # Two functions that look like the cpu backend's own (its module), new to numba.
    space = {"__name__": "litegpu_cpu.kernels.fake"}
    exec("def inner_kernel(x):\n    return x * 2.0\n"
         "def outer_kernel(x):\n    return inner(x) + 1.0\n", space)
    space["inner"] = njit(space["inner_kernel"])
    outer = njit(space["outer_kernel"])
    heard: list[str] = []
    with progress.listening(heard.append):
        assert outer(1.5) == 4.0
    names = [re.match(r"cpu: numba compiling kernel (\d+) \((\w+); ", m).groups() for m in heard]
    assert [name for _, name in names] == ["outer_kernel", "inner_kernel", "outer_kernel"], heard
    assert names[0][0] == names[2][0] != names[1][0]   # the same number when it comes back
    assert "once, then cached" in heard[0] or "in every process" in heard[0]


# -- the command -------------------------------------------------------------------------------
def _on_a_terminal(argv: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """Run ``litegpu argv`` with stderr on a pseudo-terminal (200 columns) and stdout on a
    pipe; returns the exit code, stdout and what the terminal received."""
    pty = pytest.importorskip("pty", reason="no pseudo-terminals on this OS")
    import fcntl
    import termios
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 200, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "litegpu.cli", *argv], stdout=subprocess.PIPE,
                            stderr=slave, stdin=subprocess.DEVNULL, env={**os.environ, **env})
    os.close(slave)
    received = bytearray()
    while True:
        try:
            data = os.read(master, 65536)
        except OSError as exc:   # EIO: the child closed the terminal
            if exc.errno != errno.EIO:
                raise
            break
        if not data:
            break
        received += data
    os.close(master)
    out = proc.stdout.read().decode()
    return proc.wait(timeout=300), out, received.decode(errors="replace")


def _states(terminal: str) -> list[str]:
    """The successive contents of the spinner line."""
    return [part.replace("\033[K", "") for part in terminal.split("\r") if part.replace("\033[K", "").strip()]


def test_a_cold_opencl_run_shows_moving_progress_on_a_terminal(opencl, tmp_path) -> None:
    model = tmp_path / "convs.tflite"
    model.write_bytes(_conv_model())
    code, out, terminal = _on_a_terminal(["run", str(model), "--backend", "opencl"], _cold(tmp_path))
    assert code == 0, terminal
    states = _states(terminal)
    spinner = re.compile(r"(compiling convs\.tflite|first run of convs\.tflite) [|/\\-] (\d+\.\d)s(?:  (.*))?$")
    matched = [spinner.match(s) for s in states]
    assert all(matched), [s for s, m in zip(states, matched) if not m]
    details = [m[3] for m in matched if m[3]]
    assert any(re.fullmatch(r"opencl: building a program of \d+ kernels \(once, then cached\)", d) for d in details)
    launches = [tuple(map(int, m.groups())) for d in details if (m := re.match(r"opencl: first launch (\d+)/(\d+)", d))]
    total = launches[-1][1]
    assert total >= 4 and sorted(set(launches)) == [(i, total) for i in range(1, total + 1)], details
    assert all(m[1].startswith("first run") for m in matched if m[3] and "first launch" in m[3])
    assert terminal.endswith("\r\033[K")   # the line is cleared before the results are printed
    assert "litegpu: error" not in terminal
    assert "compiling convs.tflite: done in" in out and "first invoke:" in out
    assert "\r" not in out   # the spinner never reaches stdout


def test_off_a_terminal_nothing_reaches_stderr(opencl, tmp_path) -> None:
    model = tmp_path / "convs.tflite"
    model.write_bytes(_conv_model())
    env = {**os.environ, **_cold(tmp_path)}
    for command in (["run"], ["bench", "--num-runs", "2", "--warmup-runs", "0"]):   # cold, then warm
        res = subprocess.run([sys.executable, "-m", "litegpu.cli", *command[:1], str(model), *command[1:],
                              "--backend", "opencl"], capture_output=True, text=True, timeout=300, env=env)
        assert res.returncode == 0, res.stderr
        assert res.stderr == ""
        assert "compiling convs.tflite: done in" in res.stdout
