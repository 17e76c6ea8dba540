"""The litegpu command line: what it prints, and that every failure is one readable line."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from litegpu.cli import main
from litegpu.testing.builder import ModelBuilder



def litegpu(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The command run as a user runs it: a separate process, real stdout and stderr."""
    return subprocess.run([sys.executable, "-m", "litegpu.cli", *args], capture_output=True, text=True,
                          timeout=300, env=None if env is None else {**os.environ, **env})


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    """A folder of small models and input files, good and bad, for the table below."""
    d = tmp_path_factory.mktemp("cli")
    b = ModelBuilder()
    x = b.input("x", (1, 4))
    c = b.const("c", np.arange(4, dtype=np.float32).reshape(1, 4))
    y = b.tensor("y", (1, 4))
    b.op("ADD", [x, c], [y], fused_activation_function="RELU")
    b.output(y)
    (d / "add.tflite").write_bytes(b.build())
    b = ModelBuilder()
    x = b.input("image", (1, 8, 8, 3))
    w, bias = b.const("w", np.ones((4, 3, 3, 3), np.float32)), b.const("b", np.zeros(4, np.float32))
    y = b.tensor("features", (1, 8, 8, 4))
    b.op("CONV_2D", [x, w, bias], [y], padding="SAME", stride_w=1, stride_h=1)
    b.output(y)
    b.signature("serve", {"image": x}, {"features": y})
    conv = b.build()
    (d / "conv.tflite").write_bytes(conv)
    (d / "truncated.tflite").write_bytes(conv[: len(conv) // 2])
    (d / "notes.tflite").write_text("this is not a model\n")
    (d / "text.npy").write_text("1 2 3 4\n")
    (d / "a_file").write_text("not a folder\n")
    np.save(d / "x.npy", np.zeros((1, 4), np.float32))
    np.save(d / "rank3.npy", np.zeros((1, 1, 4), np.float32))
    np.save(d / "f64.npy", np.zeros((1, 4), np.float64))
    np.save(d / "c4.npy", np.zeros((1, 8, 8, 4), np.float32))
    np.save(d / "img16.npy", np.ones((1, 16, 16, 3), np.float32))
    np.savez(d / "pair.npz", a=np.zeros(4))
    b = ModelBuilder()   # a quantized op with no integer version (LiteRT has none either)
    x = b.input("x", (8,), np.int8, scale=[0.05], zero_point=[0])
    y = b.tensor("y", (8,), np.int8, scale=[0.05], zero_point=[0])
    b.op("FLOOR", [x], [y])
    b.output(y)
    (d / "int8_floor.tflite").write_bytes(b.build())
    return d



# (id, argv with {d} for the files folder, exit code, words the one error line must contain)
BAD = [
    ("missing model", ["run", "{d}/missing.tflite"], 1, ["cannot read model file", "missing.tflite"]),
    ("not a tflite", ["run", "{d}/notes.tflite"], 1, ["notes.tflite", "not a .tflite model"]),
    ("truncated model", ["run", "{d}/truncated.tflite"], 1, ["truncated.tflite", "outside the model"]),
    ("model is a folder", ["inspect", "{d}"], 1, ["cannot read model file"]),
    ("rank-3 input", ["run", "{d}/add.tflite", "--input", "{d}/rank3.npy"], 1, ["input 'x'", "rank 3", "rank 2"]),
    ("wrong dtype", ["run", "{d}/add.tflite", "--input", "{d}/f64.npy"], 1, ["input 'x'", "float64", "float32"]),
    ("non-npy input", ["run", "{d}/add.tflite", "--input", "{d}/text.npy"], 1, ["text.npy", "not a valid .npy"]),
    ("npz input", ["run", "{d}/add.tflite", "--input", "{d}/pair.npz"], 1, [".npz archive"]),
    ("missing input", ["run", "{d}/add.tflite", "--input", "{d}/nothere.npy"], 1, ["nothere.npy", "no such file"]),
    ("input count", ["run", "{d}/add.tflite", "--input", "{d}/x.npy", "{d}/x.npy"], 1,
     ["1 input", "2 .npy files"]),
    ("channel mismatch", ["run", "{d}/conv.tflite", "--input", "{d}/c4.npy"], 1, ["CONV_2D", "channels"]),
    ("save into a file", ["run", "{d}/add.tflite", "--save", "{d}/a_file"], 1, ["--save", "not a folder"]),
    ("save below a file", ["run", "{d}/add.tflite", "--save", "{d}/a_file/out"], 1,
     ["--save", "cannot create the folder"]),
    ("unknown backend", ["run", "{d}/add.tflite", "--backend", "nope"], 1, ["no backend named 'nope'"]),
    ("unknown signature", ["run", "{d}/conv.tflite", "--signature", "nope"], 1, ["nope", "serve"]),
    ("signature, none", ["run", "{d}/add.tflite", "--signature", "serve"], 1, ["no signatures"]),
    ("unsupported quantized op", ["run", "{d}/int8_floor.tflite"], 1, ["FLOOR", "quantized INT8"]),
    ("unsupported quantized inspect", ["inspect", "{d}/int8_floor.tflite"], 1, ["not runnable", "INT8"]),
    ("num-runs 0", ["bench", "{d}/add.tflite", "--num-runs", "0"], 2, ["--num-runs", ">= 1", "got 0"]),
    ("num-runs -5", ["bench", "{d}/add.tflite", "--num-runs", "-5"], 2, ["--num-runs", "got -5"]),
    ("warmup -1", ["bench", "{d}/add.tflite", "--warmup-runs", "-1"], 2, ["--warmup-runs", ">= 0"]),
    ("num-threads 0", ["run", "{d}/add.tflite", "--num-threads", "0"], 2, ["--num-threads", "got 0"]),
    ("num-threads text", ["run", "{d}/add.tflite", "--num-threads", "two"], 2, ["--num-threads", "'two'"]),
    ("unknown command", ["frobnicate"], 2, ["invalid choice: 'frobnicate'"]),
    ("no model", ["run"], 2, ["required: model"]),
    ("unknown option", ["run", "{d}/add.tflite", "--frob"], 2, ["unrecognized arguments: --frob"]),
]


def _check_one_error_line(code: int, out: str, err: str, expected: int, words: list[str]) -> None:
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("litegpu: error: "), err
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert code == expected, (code, err)


# Cases that fail before compiling (the model is bad, or what the user typed is checked
# first): "compiling ...: done" must not be printed.
NOT_COMPILED = {"missing model", "not a tflite", "truncated model", "unknown backend", "unsupported quantized op",
                "non-npy input", "npz input", "missing input", "save into a file", "save below a file"}


@pytest.mark.parametrize("case", BAD, ids=[c[0] for c in BAD])
def test_bad_invocation_is_one_error_line(files: Path, capsys, case) -> None:
    name, argv, expected, words = case
    code = main([a.replace("{d}", str(files)) for a in argv])
    out, err = capsys.readouterr()
    _check_one_error_line(code, out, err, expected, words)
    if name in NOT_COMPILED:
        assert "done in" not in out


@pytest.mark.parametrize("argv, expected, words", [
    (["run", "{d}/missing.tflite"], 1, ["cannot read model file"]),
    (["run", "{d}/add.tflite", "--input", "{d}/rank3.npy"], 1, ["rank 3"]),
    (["bench", "{d}/add.tflite", "--num-runs", "0"], 2, ["--num-runs"]),
], ids=["missing model", "rank-3 input", "num-runs 0"])
def test_bad_invocation_in_a_real_process(files: Path, argv, expected, words) -> None:
    res = litegpu(*[a.replace("{d}", str(files)) for a in argv])
    _check_one_error_line(res.returncode, res.stdout, res.stderr, expected, words)


def test_forbid_compile_with_cold_cache(opencl, files: Path, tmp_path: Path) -> None:
    env = {"LITEGPU_OPENCL_FORBID_COMPILE": "1", "LITEGPU_CACHE_DIR": str(tmp_path / "litegpu"),
           "POCL_CACHE_DIR": str(tmp_path / "pocl"), "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    res = litegpu("run", str(files / "add.tflite"), "--backend", "opencl", env=env)
    _check_one_error_line(res.returncode, res.stdout, res.stderr, 1, ["compiling is forbidden"])
    assert "done in" not in res.stdout   # compiling failed: not reported as done


def test_internal_error_is_one_line_and_debug_shows_traceback(capsys, monkeypatch) -> None:
    import litegpu.cli as cli

    def broken(args):
        raise ValueError("not enough values to unpack")
    monkeypatch.setattr(cli, "cmd_backends", broken)   # a bug in litegpu, as seen by the CLI
    assert main(["backends"]) == 1
    out, err = capsys.readouterr()
    assert err.strip().splitlines() == ["litegpu: error: internal error: ValueError: not enough values to unpack "
                                        "(please report it; --debug shows the traceback)"]
    assert main(["backends", "--debug"]) == 1
    assert "Traceback" in capsys.readouterr().err


def test_help_lists_commands() -> None:
    out = litegpu("--help")
    assert out.returncode == 0
    for cmd in ("run", "inspect", "bench", "compile", "backends"):
        assert cmd in out.stdout


def test_backends_lists_cpu_with_versions(capsys) -> None:
    assert main(["backends"]) == 0
    out = capsys.readouterr().out
    assert "cpu: available" in out and "numba:" in out


def test_run_with_npy_input_saves_into_a_new_folder(files: Path, tmp_path: Path, capsys) -> None:
    x = np.array([[-5, 1, -1, 2]], np.float32)
    np.save(tmp_path / "x.npy", x)
    save = tmp_path / "new" / "outputs"   # created, parents too
    assert main(["run", str(files / "add.tflite"), "--input", str(tmp_path / "x.npy"), "--save", str(save)]) == 0
    out = capsys.readouterr().out
    assert "first invoke:" in out and "(second run, warm)" in out
    assert f"input 'x' float32[1, 4]: from {tmp_path / 'x.npy'}" in out
    assert "partition 0: cpu, 1 node (node 0)" in out
    np.testing.assert_array_equal(np.load(save / "output_2.npy"), np.maximum(x + np.arange(4), 0))


def test_run_says_inputs_are_random_and_uses_the_signature(files: Path, capsys) -> None:
    assert main(["run", str(files / "conv.tflite"), "--seed", "7"]) == 0
    out = capsys.readouterr().out
    assert "running signature 'serve' (the model's only signature)" in out
    assert "input 'image' float32[1, 8, 8, 3]: random (standard normal, seed 7" in out
    assert "output 'features' float32[1, 8, 8, 4]" in out     # the signature's name, not the tensor's


def test_run_says_it_resized_a_static_dimension(files: Path, capsys) -> None:
    assert main(["run", str(files / "conv.tflite"), "--input", str(files / "img16.npy")]) == 0
    out = capsys.readouterr().out
    assert "input 'image' float32[1, 16, 16, 3]" in out
    assert "resized the model's input from [1, 8, 8, 3] (dimensions 1, 2 static in the model" in out
    assert "output 'features' float32[1, 16, 16, 4]" in out


def test_inspect_prints_ops_and_report(files: Path, capsys) -> None:
    assert main(["inspect", str(files / "add.tflite"), "--tensors"]) == 0
    out = capsys.readouterr().out
    assert "ADDx1" in out and "partition 0: cpu" in out
    assert "tensor 1 'c' FLOAT32[1, 4] const" in out


def test_inspect_counts_agree_with_litert(shared_model) -> None:
    path = shared_model("resnet18_fp16")
    out = litegpu("inspect", str(path))
    assert out.returncode == 0, out.stderr
    # 74 operators in the file (LiteRT's count): 42 fp16 weight DEQUANTIZE folded at load, 32 run.
    assert "74 nodes in the file (42 folded into constants at load, 32 left)" in out.stdout
    assert ("74 nodes in the file: 42 folded into constants at load (DEQUANTIZEx42 of constant weights), "
            "32 run in 1 partition") in out.stdout
    assert "partition 0: cpu, 32 nodes (nodes 42..73)" in out.stdout
    from ai_edge_litert.interpreter import Interpreter as LiteRT   # a test dependency: never skipped
    ops = LiteRT(model_path=str(path))._get_ops_details()
    assert sum(o["op_name"] != "DELEGATE" for o in ops) == 74


def test_bench_compare_litert(files: Path, capsys) -> None:
    assert main(["bench", str(files / "add.tflite"), "--num-runs", "20", "--warmup-runs", "2",
                 "--compare-litert"]) == 0
    out = capsys.readouterr().out
    assert "median" in out and "ratio litegpu/LiteRT" in out
    assert "max abs error relative to output scale: 0" in out


def test_bench_compare_litert_without_litert_fails_before_benchmarking(files: Path, capsys, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "ai_edge_litert.interpreter", None)   # import fails: not installed
    assert main(["bench", str(files / "add.tflite"), "--num-runs", "20", "--compare-litert"]) == 1
    captured = capsys.readouterr()
    assert "steady state" not in captured.out   # no benchmark ran first
    assert "--compare-litert needs ai-edge-litert: pip install 'ai-edge-litert>=" in captured.err


def test_closed_pipe_is_quiet() -> None:
    """``litegpu backends | head``: the reader is gone before the first line; no message, no traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "litegpu.cli", "backends"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.close()   # before the child's imports are done: its first print meets a closed pipe
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    assert "Broken pipe" not in err and "Traceback" not in err, err


def test_a_shadowed_plugin_is_named_with_the_folder_to_delete(tmp_path) -> None:
    """A folder ``litegpu_cpu`` without __init__.py first on sys.path (what an older
    install's caches left behind) hid the cpu backend: "no backend named 'cpu'" and nothing
    more. Now the failed plugin names the folder to delete."""
    leftover = tmp_path / "litegpu_cpu" / "kernels" / "__pycache__"
    leftover.mkdir(parents=True)
    (leftover / "conv._pad.py311.nbi").write_bytes(b"")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    code = "import litegpu.plugins as p; p.manager().backend('cpu')"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode != 0
    message = proc.stderr.splitlines()[-1]
    assert "no backend named 'cpu'" in message and f"hidden by {tmp_path / 'litegpu_cpu'}" in message
    assert "delete that folder" in message


def test_num_threads_defaults_to_the_cpus_this_process_may_use(monkeypatch) -> None:
    from litegpu.cli import build_parser, default_num_threads
    expected = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert build_parser().parse_args(["run", "m.tflite"]).num_threads == expected == default_num_threads()
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)   # macOS, Windows
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    assert default_num_threads() == 3


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this OS")
def test_num_threads_default_follows_a_narrowed_affinity_and_help_says_so() -> None:
    """``taskset -c 0 litegpu ...``: one CPU allowed, one thread by default."""
    code = (f"import os, sys; os.sched_setaffinity(0, {{{min(os.sched_getaffinity(0))}}}); "
            "from litegpu.cli import main; sys.exit(main(['run', '--help']))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    help_text = " ".join(res.stdout.split())
    assert "cpu threads (default 1: the CPUs this process may use" in help_text


@pytest.mark.parametrize("threads", ["3", "-1"])
def test_bench_compare_litert_gives_litert_the_same_thread_count(files: Path, capsys, monkeypatch, threads) -> None:
    import litegpu.cli as cli
    from litegpu.session import Session
    given: list = []
    real = cli._litert_interpreter()

    def recording(**kwargs):
        given.append(kwargs["num_threads"])
        return real(**kwargs)
    monkeypatch.setattr(cli, "_litert_interpreter", lambda: recording)
    used: list = []
    init = Session.__init__

    def spy(self, *args, **kwargs):
        init(self, *args, **kwargs)
        used.append(self.options.num_threads)
    monkeypatch.setattr(Session, "__init__", spy)
    assert main(["bench", str(files / "add.tflite"), "--num-runs", "3", "--warmup-runs", "0",
                 "--num-threads", threads, "--compare-litert"]) == 0
    out = capsys.readouterr().out
    # LiteRT gets the count litegpu runs with; for -1 (each side's own default: litegpu's
    # several threads, LiteRT's one) that is litegpu's default, not 1.
    assert given == used[-1:]
    if threads == "3":
        assert given == [3]
    header = next(line for line in out.splitlines() if line.startswith("litegpu "))
    suffix = " (the cpu backend's default)" if threads == "-1" else ""
    assert header.endswith(f"threads {given[0]}{suffix}")
    assert f"LiteRT (XNNPACK, threads {given[0]})" in out
