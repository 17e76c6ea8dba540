"""The ``litegpu`` command: ``run``, ``inspect``, ``bench``, ``compile``, ``backends``.

The contract: exit code 0 on success; every failure is exactly one line
``litegpu: error: ...`` on stderr, with exit code 1 for a failure (bad model, bad input,
unsupported op, unavailable backend) and 2 for a bad command line. Anything a user can
type is checked here or by the API with a message naming the problem; an exception that
is not a :class:`LiteGpuError` is a bug in litegpu, reported as one ``internal error``
line (``--debug`` prints its traceback).
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import json
import logging
import os
import shutil
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Iterator, NoReturn, Sequence

import numpy as np

from . import __version__
from .env import install_hint
from .errors import BackendUnavailableError, InvalidArgumentError, LiteGpuError, ModelFormatError
from .partition import DelegationReport
from .placement import PLACEMENTS
from .progress import listening
from .quant import describe, quantization_mode

log = logging.getLogger("litegpu")


def _one_line(text: str) -> str:
    """``text`` on one line: the error contract allows no second line."""
    return "; ".join(part.strip() for part in str(text).splitlines() if part.strip()) or "(no message)"


def fail(message: str) -> None:
    """Print the single error line of the CLI's contract."""
    print(f"litegpu: error: {_one_line(message)}", file=sys.stderr)


@contextlib.contextmanager
def progress(message: str, done_line: bool = True) -> Iterator[None]:
    """Show ``message`` with a spinner on a terminal's stderr while the body runs, then
    print ``message: done in Ns`` on stdout — only when the body succeeded (and
    ``done_line``: a caller that prints its own timing passes False).

    The spinner line also shows the latest :mod:`litegpu.progress` report ("opencl: first
    launch 12/52 (once, then cached)"), so long work says what it is doing.
    """
    start = time.perf_counter()
    # Off a terminal nothing is shown while working: stderr is kept for the one error line,
    # and no one listens to progress reports, so they cost nothing.
    if sys.stderr.isatty():
        with _spinning(message):
            yield
    else:
        yield
    if done_line:
        print(f"{message}: done in {time.perf_counter() - start:.2f}s")


class _Spinner:
    """The line a terminal shows while work runs: what, a turning bar, seconds, and the
    latest progress report. Drawn by a timer thread and by each report, under one lock."""

    FRAMES = "|/-\\"

    def __init__(self, message: str, stream) -> None:
        self.message = message
        self.stream = stream
        self.start = time.perf_counter()
        self.width = _terminal_width(stream)
        self.detail = ""
        self.frame = 0
        self.lock = threading.Lock()

    def tick(self) -> None:
        with self.lock:
            self.frame += 1
            self._draw()

    def update(self, detail: str) -> None:
        """A progress listener: drawn at once, in the reporting thread, because the work
        that follows may hold the GIL and stop the timer thread until it is done."""
        with self.lock:
            self.detail = detail
            self._draw()

    def clear(self) -> None:
        with self.lock:
            self.stream.write("\r\033[K")
            self.stream.flush()

    def _draw(self) -> None:
        line = f"{self.message} {self.FRAMES[self.frame % 4]} {time.perf_counter() - self.start:.1f}s"
        if self.detail:
            line += f"  {self.detail}"
        if len(line) >= self.width:   # a line that wraps cannot be redrawn with \r
            line = line[:self.width - 4] + "..."
        self.stream.write(f"\r{line}\033[K")
        self.stream.flush()


def _terminal_width(stream) -> int:
    """Columns of the terminal ``stream`` writes to; a terminal that does not say (0, as a
    fresh pseudo-terminal does) gets $COLUMNS or 80."""
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError):
        columns = 0
    return max(columns or shutil.get_terminal_size().columns, 20)


@contextlib.contextmanager
def _spinning(message: str) -> Iterator[None]:
    """The spinner on stderr for the body's duration, showing its progress reports."""
    spinner = _Spinner(message, sys.stderr)
    done = threading.Event()

    def spin() -> None:
        while not done.wait(0.1):
            spinner.tick()

    thread = threading.Thread(target=spin, name="litegpu-spinner", daemon=True)
    thread.start()
    try:
        with listening(spinner.update):
            yield
    finally:
        done.set()
        thread.join()
        spinner.clear()


# -- command-line values ---------------------------------------------------------------
def _int_at_least(low: int, also: tuple[int, ...] = ()):
    """An argparse type: an integer >= ``low`` (or one of ``also``), with a readable error."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low and value not in also:
            extra = f" (or {', '.join(map(str, also))})" if also else ""
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}{extra}, got {value}")
        return value
    return parse


def _read_npy(path: str) -> np.ndarray:
    """One ``--input`` array, or an error that says what is wrong with the file."""
    try:
        value = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise InvalidArgumentError(f"--input {path}: no such file") from None
    except IsADirectoryError:
        raise InvalidArgumentError(f"--input {path}: is a folder, not a .npy file") from None
    except OSError as exc:
        raise InvalidArgumentError(f"--input {path}: cannot read it: {exc.strerror or exc}") from None
    except (ValueError, EOFError) as exc:
        # numpy's own words ("pickled data", "EOF") mean nothing to a user who passed a .txt.
        log.debug("np.load(%s) failed: %s", path, exc)
        raise InvalidArgumentError(f"--input {path}: not a valid .npy file (write arrays with numpy.save; "
                                   "object arrays are not accepted)") from None
    if not isinstance(value, np.ndarray):
        value.close()
        raise InvalidArgumentError(f"--input {path}: is an .npz archive; give one .npy file per input")
    return value


def _save_dir(path: str | None) -> Path | None:
    """The ``--save`` folder, created up front so that a bad path fails before the run."""
    if path is None:
        return None
    folder = Path(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise InvalidArgumentError(f"--save {path}: exists and is not a folder") from None
    except OSError as exc:
        raise InvalidArgumentError(f"--save {path}: cannot create the folder: {exc.strerror or exc}") from None
    return folder


def random_inputs(details: list[dict], seed: int = 0) -> list[np.ndarray]:
    """Seeded random inputs matching input details (ints in a small non-negative range)."""
    rng = np.random.default_rng(seed)
    out = []
    for d in details:
        dtype = np.dtype(d["dtype"])
        shape = tuple(int(s) for s in d["shape"])
        if dtype.kind == "f":
            out.append(rng.standard_normal(shape).astype(dtype))
        elif dtype.kind == "b":
            out.append(rng.integers(0, 2, shape).astype(dtype))
        else:
            out.append(rng.integers(0, 10, shape).astype(dtype))
    return out


# -- what runs: the main subgraph's tensors, or a signature ------------------------------
class _Tensors:
    """The main subgraph through the tensor API (models without signatures)."""

    def __init__(self, interp, label: str = "the main subgraph (the model has no signature)") -> None:
        self.interp = interp
        self.label = label

    def input_details(self) -> list[tuple[str, dict]]:
        return [(d["name"], d) for d in self.interp.get_input_details()]

    def prepare(self, values: list[np.ndarray]) -> bool:
        """Set the inputs, resizing first where their shapes differ; True when it resized."""
        details = self.interp.get_input_details()
        resized = False
        for d, x in zip(details, values):
            if tuple(x.shape) != tuple(d["shape"]):
                self.interp.resize_tensor_input(d["index"], x.shape)
                resized = True
        if resized:
            self.interp.allocate_tensors()
        for d, x in zip(details, values):
            self.interp.set_tensor(d["index"], x)
        return resized

    def invoke(self) -> None:
        self.interp.invoke()

    def outputs(self) -> list[tuple[str, int, np.ndarray]]:
        return [(d["name"], d["index"], self.interp.get_tensor(d["index"])) for d in self.interp.get_output_details()]

    def report(self) -> DelegationReport:
        return self.interp.get_delegation_report()


class _Signature:
    """One signature: inputs and outputs under the signature's names."""

    def __init__(self, interp, key: str, label: str) -> None:
        self.runner = interp.get_signature_runner(key)
        self.key = key
        self.label = label
        self._kwargs: dict[str, np.ndarray] = {}
        self._result: dict[str, np.ndarray] = {}

    def input_details(self) -> list[tuple[str, dict]]:
        return list(self.runner.get_input_details().items())

    def prepare(self, values: list[np.ndarray]) -> bool:
        """Keep the inputs for the call, resizing first where their shapes differ; True when it resized."""
        self._kwargs = {name: x for (name, _), x in zip(self.input_details(), values)}
        resized = False
        for name, d in self.input_details():
            if tuple(self._kwargs[name].shape) != tuple(d["shape"]):
                self.runner.resize_input(name, self._kwargs[name].shape)
                resized = True
        # Compile for these shapes now, so a shape error is not reported as a run failure.
        self.runner.allocate_tensors()
        return resized

    def invoke(self) -> None:
        self._result = self.runner(**self._kwargs)

    def outputs(self) -> list[tuple[str, int, np.ndarray]]:
        details = self.runner.get_output_details()
        return [(name, int(details[name]["index"]), y) for name, y in self._result.items()]

    def report(self) -> DelegationReport:
        return self.runner.get_delegation_report()


def _target(interp, key: str | None):
    """What to run: the named signature, else the model's first signature, else its tensors."""
    sigs = list(interp.get_signature_list())
    if key is not None:
        if not sigs:
            raise InvalidArgumentError(f"--signature {key}: the model has no signatures; leave --signature out")
        if key not in sigs:
            raise InvalidArgumentError(f"--signature {key}: no such signature; the model has {', '.join(sigs)}")
        return _Signature(interp, key, f"signature {key!r}")
    if not sigs:
        return _Tensors(interp)
    others = f"the first of {len(sigs)}: {', '.join(sigs)}; pick one with --signature" if len(sigs) > 1 \
        else "the model's only signature"
    return _Signature(interp, sigs[0], f"signature {sigs[0]!r} ({others})")


def _inputs(args: argparse.Namespace, target, arrays: list[np.ndarray]) -> tuple[list[np.ndarray], list[str]]:
    """Input arrays for ``target`` (``arrays`` read from ``--input``, checked against the model,
    or random ones) and a line per input saying where it came from."""
    details = target.input_details()
    if not args.input:
        values = random_inputs([d for _, d in details], args.seed)
        return values, [f"input {name!r} {np.dtype(d['dtype'])}{list(map(int, d['shape']))}: random "
                        f"({'standard normal' if np.dtype(d['dtype']).kind == 'f' else 'integers 0..9'}, "
                        f"seed {args.seed}; give .npy files with --input)" for name, d in details]
    if len(args.input) != len(details):
        names = ", ".join(repr(name) for name, _ in details) or "none"
        raise InvalidArgumentError(f"the model has {len(details)} input{'s' if len(details) != 1 else ''} "
                                   f"({names}); {len(args.input)} .npy files were given")
    values, notes = [], []
    for path, (name, d), x in zip(args.input, details, arrays):
        want, shape = np.dtype(d["dtype"]), [int(s) for s in d["shape"]]
        if x.dtype != want:
            raise InvalidArgumentError(f"input {name!r}: {path} holds {x.dtype}, the model takes {want} "
                                       f"(convert with .astype(np.{want.name}))")
        if x.ndim != len(shape):
            raise InvalidArgumentError(f"input {name!r}: {path} has shape {list(x.shape)} (rank {x.ndim}), "
                                       f"the model takes rank {len(shape)}: {shape}")
        note = f"input {name!r} {x.dtype}{list(x.shape)}: from {path}"
        if list(x.shape) != shape:
            sig = [int(s) for s in d.get("shape_signature", shape)]
            static = [i for i, (a, b, s) in enumerate(zip(x.shape, shape, sig)) if a != b and s != -1]
            note += f"; resized the model's input from {shape}"
            if static:
                note += f" (dimension{'s' if len(static) > 1 else ''} {', '.join(map(str, static))} "
                note += "static in the model; shapes were inferred again)"
        values.append(x)
        notes.append(note)
    return values, notes


@contextlib.contextmanager
def _naming_file(model: str) -> Iterator[None]:
    """A malformed model's error names the field; add which file, unless it says already."""
    try:
        yield
    except ModelFormatError as exc:
        if model in str(exc):
            raise
        raise ModelFormatError(f"{model}: {exc}") from exc


def _make_interpreter(args: argparse.Namespace):
    from .interpreter import Interpreter
    from .session import load_delegate
    options = {"precision_loss_allowed": bool(getattr(args, "fp16", False))}
    # cpu is the fallback and needs no delegate, unless --fp16 must reach it (to be reported as ignored).
    delegates = [load_delegate(b, options) for b in (args.backend or [])
                 if b != "cpu" or options["precision_loss_allowed"]]
    with progress(f"compiling {Path(args.model).name}"), _naming_file(args.model):
        interp = Interpreter(model_path=args.model, experimental_delegates=delegates,
                             num_threads=args.num_threads, placement=getattr(args, "placement", "first"))
        interp.allocate_tensors()
    return interp


def _timed(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def _prepare(target, values: list[np.ndarray]) -> bool:
    """``target.prepare(values)`` with the spinner: new input shapes (or a signature's
    first use) mean compiling; True when it resized."""
    with progress(f"preparing {target.label.split(' (')[0]} for its inputs", done_line=False):
        return target.prepare(values)


def _first_invoke(args: argparse.Namespace, invoke) -> float:
    """The seconds of the first ``invoke()``, with the spinner: it is where kernels that no
    disk cache holds are compiled (numba) or finalized (PoCL), once, and the backends say
    which; the caller prints the time."""
    with progress(f"first run of {Path(args.model).name}", done_line=False):
        return _timed(invoke)


def _print_placement(report: DelegationReport) -> None:
    print(f"subgraph {report.subgraph}: {report.counts()}")
    if report.placement:
        print(f"  {report.placement}")
    for line in report.partition_lines():
        print(f"  {line}")


# -- commands --------------------------------------------------------------------------
def cmd_run(args: argparse.Namespace) -> int:
    # What the user typed is checked before the model is compiled.
    arrays = [_read_npy(path) for path in args.input or ()]
    save = _save_dir(args.save)
    interp = _make_interpreter(args)
    target = _target(interp, args.signature)
    values, notes = _inputs(args, target, arrays)
    print(f"running {target.label}")
    for note in notes:
        print(note)
    start = time.perf_counter()
    if _prepare(target, values):   # compiled again for the new shapes: that is compile time too
        print(f"compiling for the new input shapes: done in {time.perf_counter() - start:.2f}s")
    # The first invoke is where kernels not in a disk cache are JIT-compiled (numba) or
    # finalized (PoCL): it is reported apart from the steady-state time of a second one.
    first = _first_invoke(args, target.invoke)
    outputs = [(name, index, np.array(y)) for name, index, y in target.outputs()]
    warm = _timed(target.invoke)
    _print_placement(target.report())
    for name, index, y in outputs:
        stats = (f"min {y.min():.6g} max {y.max():.6g} mean {y.astype(np.float64).mean():.6g}"
                 if y.size and y.dtype.kind in "fiub" else "")
        print(f"output {name!r} {y.dtype}{list(y.shape)} {stats}".rstrip())
        if save is not None:
            path = save / f"output_{index}.npy"
            np.save(path, y)
            print(f"  saved to {path}")
    print(f"first invoke: {first * 1e3:.3f} ms (includes JIT compilation of kernels not in the disk caches)")
    print(f"invoke: {warm * 1e3:.3f} ms (second run, warm)")
    return 0


def cmd_compile(args: argparse.Namespace) -> int:
    if args.out is not None:
        return _compile_offline(args)
    arrays = [_read_npy(path) for path in args.input or ()]
    interp = _make_interpreter(args)
    target = _target(interp, None)
    values, _ = _inputs(args, target, arrays)
    _prepare(target, values)
    first = _first_invoke(args, target.invoke)
    print(f"first invoke (JIT compilation + run): {first:.2f}s; the disk caches now hold this model's kernels")
    _print_placement(target.report())
    return 0


def _compile_offline(args: argparse.Namespace) -> int:
    """``compile --out``: every GPU program of the model as source (and what the backend
    builds offline, e.g. PTX) in DIR, with a manifest of launches; no device needed."""
    from .codegen import DIALECTS, Precision
    from .codegen.backend import CodegenBackend
    from .codegen.offline import render_model
    from .codegen.render import build_failure
    from .model import load_model
    from .plugins import manager
    if not args.backend:
        raise InvalidArgumentError("compile --out needs --backend (opencl, cuda, metal or a codegen plugin)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with _naming_file(args.model):
        model = load_model(args.model)
    precisions = [Precision()] + ([Precision(True, False), Precision(True, True)] if args.fp16 else [])
    manifest = []
    for name in args.backend:
        backend = manager().backend(name)
        if not isinstance(backend, CodegenBackend) or backend.dialect not in DIALECTS:
            codegen = sorted(n for n, b in manager().backends.items() if isinstance(b, CodegenBackend))
            raise InvalidArgumentError(f"backend {name!r} renders no kernel sources (only codegen GPU backends "
                                       f"do: {', '.join(codegen)})")
        dialect = DIALECTS[backend.dialect]
        for precision in precisions:
            with progress(f"rendering {Path(args.model).name} for {name} ({precision.name})"):
                programs = render_model(model, dialect, precision)
            for n, program in enumerate(programs):
                stem = f"{name}.{precision.name}.sg{program.subgraph}.p{n}"
                (out / f"{stem}{dialect.suffix}").write_text(program.source)
                try:
                    with progress(f"building {stem}"):
                        try:
                            built = backend.offline_build(program.source)
                        except BackendUnavailableError:
                            raise
                        except Exception as exc:   # noqa: BLE001 - the compiler's own error is the log
                            raise build_failure(program.partition, program.step_kernels, precision, dialect,
                                                backend.offline_build, getattr(exc, "log", str(exc))) from None
                except BackendUnavailableError as exc:   # no compiler here: the source is the artifact
                    built = {}
                    print(f"{stem}: not built here: {exc}")
                for file, data in built.items():
                    (out / f"{stem}.{file}").write_bytes(data)
                manifest.append({"backend": name, "precision": precision.name, "subgraph": program.subgraph,
                                 "source": f"{stem}{dialect.suffix}",
                                 "built": [f"{stem}.{file}" for file in built], "launches": program.launches})
                print(f"{out / stem}{dialect.suffix}: {len(program.launches)} launches"
                      + (f"; {', '.join(built)}" if built else ""))
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    if not manifest:
        print("no node of this model runs on a GPU backend: nothing to write")
    return 0


def cmd_inspect(args: argparse.Namespace) -> int:
    from .model import load_model
    with _naming_file(args.model):
        model = load_model(args.model)
    print(f"model {args.model}: {model.nbytes / 1e6:.2f} MB, schema version {model.version}, "
          f"{len(model.subgraphs)} subgraphs")
    if model.description:
        print(f"description: {model.description}")
    for s in model.signatures:
        print(f"signature {s.key!r} (subgraph {s.subgraph_index}): inputs {s.inputs} outputs {s.outputs}")
    for sg in model.subgraphs:
        hist = collections.Counter(n.op for n in sg.nodes)
        folded = collections.Counter(n.op for n in sg.folded_at_load)
        print(f"subgraph {sg.index} {sg.name!r}: {len(sg.tensors)} tensors, {sg.nodes_in_file} nodes in the file"
              + (f" ({len(sg.folded_at_load)} folded into constants at load, {len(sg.nodes)} left)"
                 if sg.folded_at_load else ""))
        print("  ops: " + ", ".join(f"{op}x{c}" for op, c in hist.most_common()))
        mode = quantization_mode(sg.tensors)
        if mode:
            print(f"  quantization: {mode}")
        if folded:
            print("  folded at load (weight-only, on constants): "
                  + ", ".join(f"{op}x{c}" for op, c in folded.most_common()))
        for label, idx in (("input", sg.inputs), ("output", sg.outputs)):
            for t in idx:
                tensor = sg.tensors[t]
                quant = describe(tensor)
                print(f"  {label} {t} {tensor.name!r} {tensor.type_name}{list(tensor.shape_signature)}"
                      + (f" quantized {quant}" if quant else ""))
        if args.tensors:
            for t in sg.tensors:
                kind = "const" if t.is_constant else "variable" if t.is_variable else "activation"
                quant = describe(t)
                print(f"  tensor {t.index} {t.name!r} {t.type_name}{list(t.shape_signature)} {kind}"
                      + (f" quantized {quant}" if quant else ""))
    try:
        interp = _make_interpreter(args)
    except LiteGpuError as exc:
        # The file was read and shown; that it cannot run here is the one error line.
        sys.stdout.flush()
        fail(f"not runnable: {exc}")
        return 1
    report = interp.get_delegation_report()
    print(report)
    if args.kernels:
        print(kernel_lines(report))
    return 0


def kernel_lines(report) -> str:
    """``inspect --kernels``: per node of each subgraph a run reaches, its backend and
    kernel, then the nodes a numpy reference runs."""
    lines = []
    for r in report.subgraph_reports():
        ran = {node: (backend, kernel) for node, _, backend, kernel in r.kernels}
        lines.append(f"kernels of subgraph {r.subgraph}:")
        for a in r.assignments:
            backend, kernel = ran.get(a.node, (a.backend, "none: computed when compiled"))
            lines.append(f"  node {a.node:<5} {a.op:<26} {backend:<8} {kernel}")
        slow = r.reference_nodes()
        ops = collections.Counter(op for _, op, _, _ in slow)
        lines.append(f"  {len(slow)} of {len(r.assignments)} nodes run a numpy reference"
                     + (": " + ", ".join(f"{op} x{n}" for op, n in ops.most_common()) if slow else ""))
    return "\n".join(lines)


def _summary(times: np.ndarray) -> str:
    ms = times * 1e3
    return (f"median {np.median(ms):.3f} ms, mean {ms.mean():.3f}, min {ms.min():.3f}, "
            f"p90 {np.percentile(ms, 90):.3f}, p99 {np.percentile(ms, 99):.3f} ({len(ms)} runs)")


def _time_invokes(invoke, runs: int, warmup: int, time_first=_timed) -> tuple[float, float, np.ndarray]:
    first = time_first(invoke)
    warm = [_timed(invoke) for _ in range(warmup)]
    times = np.array([_timed(invoke) for _ in range(runs)])
    return first, float(np.mean(warm)) if warm else first, times


def _peak_rss_mb() -> float:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cmd_bench(args: argparse.Namespace) -> int:
    if args.compare_litert:   # before the benchmark, not after it
        _litert_interpreter()
    arrays = [_read_npy(path) for path in args.input or ()]
    start = time.perf_counter()
    interp = _make_interpreter(args)
    init = time.perf_counter() - start
    # Like benchmark_model, time invoke() alone unless a signature is asked for.
    target = _target(interp, args.signature) if args.signature else _Tensors(interp, "the main subgraph")
    inputs, _ = _inputs(args, target, arrays)
    _prepare(target, inputs)
    first, warm, times = _time_invokes(target.invoke, args.num_runs, args.warmup_runs,
                                       time_first=lambda invoke: _first_invoke(args, invoke))
    report = target.report()
    backend = ",".join(args.backend or ["cpu"])
    threads = _cpu_threads(interp)
    print(f"litegpu {__version__} [{backend}] {Path(args.model).name}, threads {threads}"
          + (" (the cpu backend's default)" if args.num_threads == -1 else ""))
    print(f"  init {init * 1e3:.1f} ms, first inference {first * 1e3:.3f} ms (includes JIT compilation), "
          f"warmup avg {warm * 1e3:.3f} ms")
    print(f"  steady state: {_summary(times)}")
    print("  nodes per backend: " + ", ".join(f"{b}={report.nodes_on(b)}" for b in
                                                 sorted({a.backend for a in report.assignments})))
    print(f"  arena {report.arena_bytes / 1e6:.2f} MB, peak RSS {_peak_rss_mb():.0f} MB, "
          f"host<->device copies {report.bytes_moved} bytes per run")
    for summary in report.programs:
        print(f"  {summary}")
    if args.profile or args.trace:
        _profile_runs(args, target.invoke)
    if args.compare_litert:
        return _compare_litert(args, target, inputs, float(np.median(times)), threads)
    return 0


def _cpu_threads(interp) -> int:
    """The threads litegpu's cpu backend runs with: ``--num-threads``, or for -1 the count
    the session chose (its default), read back so that LiteRT can be given the same."""
    return interp._session.options.num_threads


def _profile_runs(args: argparse.Namespace, invoke) -> None:
    """Profile ``--num-runs`` more runs; print the tables (``--profile``), write the trace (``--trace``)."""
    from .profile import profile
    with profile() as p:
        for _ in range(args.num_runs):
            invoke()
    if args.profile:
        print(p.summary(top=args.profile_top))
    if args.trace:
        p.save_chrome_trace(args.trace)
        print(f"  Chrome trace of {p.runs} runs written to {args.trace} (open in https://ui.perfetto.dev)")


_COMPARE_ROUNDS = 3  # alternating blocks per runtime in bench --compare-litert


def _litert_interpreter():
    """LiteRT's Interpreter class; an error saying how to install it where it is missing."""
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        raise InvalidArgumentError(f"--compare-litert needs ai-edge-litert: {install_hint('litert')}") from None
    return Interpreter


def _compare_litert(args: argparse.Namespace, target, inputs, ours: float, threads: int) -> int:
    """Time LiteRT (XNNPACK, on ``threads``, litegpu's cpu thread count) against litegpu on
    the same inputs and print both medians, their ratio and the output error.

    The same count on both sides, -1 included: LiteRT's own default is one thread
    (``Interpreter(num_threads=None)`` passes 1; benchmark_model's -1 leaves XNNPACK without
    a thread pool), litegpu's is several, and two defaults would compare thread counts.

    The two are timed in alternating blocks of ``--num-runs`` invokes, never invoke by
    invoke: interleaved calls make the two thread pools fight over the cores and slow
    both (LiteRT by up to 10x). ``ours``, the median of the block cmd_bench timed, is
    litegpu's first block; then LiteRT and litegpu take turns until each has had
    ``_COMPARE_ROUNDS`` blocks, and each figure is its best block median, the least
    disturbed by whatever else runs on the machine.
    """
    ref = _litert_interpreter()(model_path=args.model, num_threads=threads)
    ref.allocate_tensors()
    if isinstance(target, _Signature):
        runner = ref.get_signature_runner(target.key)
        kwargs = dict(zip((name for name, _ in target.input_details()), inputs))
        result: dict = {}

        def theirs_invoke() -> None:
            result.update(runner(**kwargs))
        _time_invokes(theirs_invoke, 0, args.warmup_runs)
        theirs_out = [result[name] for name, _, _ in target.outputs()]
    else:
        litert = _Tensors(ref)   # LiteRT's Interpreter has the same tensor API
        litert.prepare(inputs)
        theirs_invoke = litert.invoke
        _time_invokes(theirs_invoke, 0, args.warmup_runs)
        theirs_out = [y for _, _, y in litert.outputs()]
    best_times, theirs = None, float("inf")
    for block in range(_COMPARE_ROUNDS):
        # The first call of a block is left out: it pays for the other runtime's pool.
        _, _, times = _time_invokes(theirs_invoke, args.num_runs, 0)
        if float(np.median(times)) < theirs:
            best_times, theirs = times, float(np.median(times))
        if block < _COMPARE_ROUNDS - 1:
            ours = min(ours, float(np.median(_time_invokes(target.invoke, args.num_runs, 0)[2])))
    print(f"LiteRT (XNNPACK, threads {threads}) steady state: {_summary(best_times)}")
    print(f"  {_COMPARE_ROUNDS} alternating blocks of {args.num_runs} runs each, best block median: "
          f"litegpu {ours * 1e3:.3f} ms, LiteRT {theirs * 1e3:.3f} ms")
    worst = 0.0
    for (name, _, a), b in zip(target.outputs(), theirs_out):
        if a.shape != b.shape:
            print(f"  output {name!r}: shape {list(a.shape)} vs LiteRT {list(b.shape)}")
            worst = float("inf")
            continue
        scale = max(float(np.abs(b.astype(np.float64)).max()) if b.size else 0.0, 1e-30)
        err = float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max()) / scale if b.size else 0.0
        worst = max(worst, err)
    print(f"ratio litegpu/LiteRT median: {ours / theirs:.2f}x; max abs error relative to output scale: {worst:.3g}")
    return 0


def cmd_backends(args: argparse.Namespace) -> int:
    from .plugins import manager
    pm = manager()
    for rec in pm.records:
        if rec.error:
            print(f"{rec.name}: plugin failed to load ({rec.module}): {rec.error}")
    misconfigured = []
    for name, backend in sorted(pm.backends.items()):
        try:
            ok, why = backend.available()
        except LiteGpuError as exc:   # e.g. a device variable naming no device: listed, then exit 1
            ok, why = False, str(exc)
            misconfigured.append(name)
        info = backend.device_info() if ok else {}
        plugin = next((r for r in pm.records if name in r.backends), None)
        where = f"{plugin.distribution} {plugin.version}".strip() if plugin else ""
        state = "available" if ok else f"unavailable: {why}"
        print(f"{name}: {state}" + (f" [{where}]" if where else ""))
        for key, value in info.items():
            print(f"    {key}: {value}")
    if misconfigured:
        fail(f"misconfigured backend{'s' if len(misconfigured) > 1 else ''}: {', '.join(misconfigured)} (see above)")
        return 1
    return 0


def cmd_prebuild(args: argparse.Namespace) -> int:
    from .plugins import manager
    pm = manager()
    names = args.backend or sorted(pm.backends)
    for name in names:
        if args.backend:
            backend = pm.available_backend(name)
        elif (backend := pm.backend(name)).available()[0] is False:
            continue
        with progress(f"prebuilding {name}'s kernels (once, for this machine)"):
            line = backend.prebuild(args.out)
        print(line or f"{name}: nothing to build ahead of time")
    return 0


def _generation_engine(args: argparse.Namespace):
    """The engine and sampler ``generate`` and ``chat`` run with (their shared flags)."""
    from .lm import Engine, SamplerConfig
    sampler = SamplerConfig(top_k=args.top_k, top_p=args.top_p, temperature=args.temperature, seed=args.seed)
    with progress(f"loading {args.model} on {args.backend}", done_line=False):   # stdout: the text alone
        engine = Engine(args.model, backend=args.backend, num_threads=args.num_threads,
                        max_num_tokens=args.max_num_tokens)
    return engine, sampler


def _print_speeds(info) -> None:
    """A session's prefill and decode tokens/s, on stderr."""
    print(f"prefill: {info.prefill_tokens} tokens, {info.prefill_tokens_per_second:.1f} tokens/s; "
          f"decode: {info.decode_tokens} tokens, {info.decode_tokens_per_second:.1f} tokens/s", file=sys.stderr)


def cmd_generate(args: argparse.Namespace) -> int:
    engine, sampler = _generation_engine(args)
    session = engine.create_session(apply_prompt_template=not args.no_template, sampler_config=sampler)
    if args.prompt is None:
        ids = [int(t) for t in args.tokens.split(",") if t.strip()]
        session.prefill_tokens(ids)
        out = []
        for _ in range(args.max_tokens):
            out.append(session.decode_token())
        print(" ".join(map(str, out)))
    else:
        session.run_prefill([args.prompt])
        for chunk in session.run_decode_async(args.max_tokens):
            print(chunk.texts[0], end="", flush=True)
        print(flush=True)
    _print_speeds(session.get_benchmark_info())
    return 0


def cmd_chat(args: argparse.Namespace) -> int:
    template = _read_template(args.template)      # (a bad path fails before the model loads)
    engine, sampler = _generation_engine(args)
    chat = engine.create_conversation(system_message=args.system, sampler_config=sampler,
                                      max_output_tokens=args.max_tokens, chat_template=template)
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line:
            break
        if not line.strip():
            continue
        for chunk in chat.send_message_async(line.rstrip("\n")):
            print(chunk["content"][0]["text"], end="", flush=True)
        print(flush=True)
    _print_speeds(chat.session.get_benchmark_info())
    return 0


def _read_template(path: str | None) -> str | None:
    if path is None:
        return None
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise InvalidArgumentError(f"cannot read the chat template {path}: {exc.strerror or exc}") from None


# -- the parser ------------------------------------------------------------------------
def default_num_threads() -> int:
    """``--num-threads``'s default: the CPUs this process may run on.

    The affinity mask where the OS has one (``taskset``, a container's cpuset or a batch
    scheduler narrow it; ``os.cpu_count()`` would count CPUs the process cannot use and
    oversubscribe them), else every CPU.
    """
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):   # no affinity on macOS and Windows
        return max(os.cpu_count() or 1, 1)


class _Parser(argparse.ArgumentParser):
    """argparse with the CLI's one-line errors (exit code 2) instead of usage + error."""

    def error(self, message: str) -> NoReturn:
        fail(f"{message} (see '{self.prog} --help')")
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``litegpu`` command."""
    parser = _Parser(prog="litegpu", description="Run .tflite models on litegpu backends.",
                     epilog="Exit codes: 0 success, 1 error (one 'litegpu: error: ...' line on stderr), "
                            "2 bad command line.")
    parser.add_argument("--version", action="version", version=f"litegpu {__version__}")

    def logging_flags(p: argparse.ArgumentParser, default) -> None:
        # Accepted before or after the command; SUPPRESS keeps a command's default from
        # overwriting a flag given before it.
        p.add_argument("-v", "--verbose", action="store_true", default=default, help="log at INFO level")
        p.add_argument("--debug", action="store_true", default=default,
                       help="log at DEBUG level and print the traceback of internal errors")

    logging_flags(parser, False)
    threads = default_num_threads()
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def model_command(name: str, help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_)
        logging_flags(p, argparse.SUPPRESS)
        p.add_argument("model", help="path of a .tflite model")
        p.add_argument("--backend", action="append", help="backend in order of preference (repeatable); "
                       "nodes it cannot run fall back to cpu")
        p.add_argument("--num-threads", type=_int_at_least(1, also=(-1,)), default=threads,
                       help=f"cpu threads (default {threads}: the CPUs this process may use, its affinity "
                       "mask where the OS has one, else every CPU; -1: the cpu backend's own default; "
                       "bench --compare-litert gives LiteRT the same count)")
        p.add_argument("--input", nargs="*", metavar="NPY", help=".npy files, one per input, in the order of "
                       "the signature's (or the model's) inputs (default: seeded random)")
        p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
        p.add_argument("--fp16", action="store_true", help="allow precision loss: fp16 storage on GPU "
                       "backends (LiteRT's precision_loss_allowed)")
        p.add_argument("--placement", choices=PLACEMENTS, default="first",
                       help="first: each node on the first backend that supports it (default); measure: time "
                       "the alternatives at compile time and keep the fastest, never slower than all-cpu "
                       "(the decision is cached)")
        return p

    p = model_command("run", "run a model and summarize its outputs, placement and timings")
    p.add_argument("--signature", help="signature to run (default: the main subgraph's)")
    p.add_argument("--save", metavar="DIR", help="folder to save outputs as .npy (created if missing)")
    p.set_defaults(func=cmd_run)
    p = model_command("inspect", "show signatures, tensors, op histogram, partitions and the delegation report")
    p.add_argument("--tensors", action="store_true", help="list every tensor of every subgraph")
    p.add_argument("--kernels", action="store_true", help="one line per node: its backend and the kernel that "
                   "runs it ('reference': the op's numpy reference, a slow path)")
    p.set_defaults(func=cmd_inspect)
    p = model_command("bench", "time a model like LiteRT's benchmark_model")
    p.add_argument("--signature", help="signature to time (default: the main subgraph's)")
    p.add_argument("--num-runs", type=_int_at_least(1), default=50, help="timed runs (default 50)")
    p.add_argument("--warmup-runs", type=_int_at_least(0), default=5, help="untimed runs first (default 5)")
    p.add_argument("--compare-litert", action="store_true", help="also time ai-edge-litert on the same input "
                   "and print the ratio and the max difference")
    p.add_argument("--profile", action="store_true", help="then profile --num-runs more runs and print the "
                   "time per op type and the slowest nodes (like benchmark_model --enable_op_profiling)")
    p.add_argument("--profile-top", type=_int_at_least(1), default=10, help="slowest nodes shown (default 10)")
    p.add_argument("--trace", metavar="FILE.json", help="then profile --num-runs more runs and write a Chrome "
                   "trace-event file (Perfetto, chrome://tracing)")
    p.set_defaults(func=cmd_bench)
    p = model_command("compile", "compile a model and run it once, filling the disk caches so later "
                      "processes start warm; with --out, write its GPU kernels instead (no device needed)")
    p.add_argument("--out", metavar="DIR", help="write the generated kernel sources of --backend (opencl, cuda, "
                   "metal), what it builds without a device (cuda: PTX), and manifest.json (launch sizes) "
                   "to DIR; with --fp16 also the F32_F16 and F16 programs")
    p.set_defaults(func=cmd_compile)
    p = sub.add_parser("prebuild", help="compile the kernels that depend on no model, once, for this machine "
                       "(run it after installing: a first process then starts like a warm one)")
    logging_flags(p, argparse.SUPPRESS)
    p.add_argument("--backend", action="append", help="backend to prebuild (repeatable; default every available one)")
    p.add_argument("--out", metavar="DIR", help="keep them in DIR instead of the backend's own place (the cpu "
                   "backend reads $LITEGPU_PREBUILT_DIR; default: its package's prebuilt folder)")
    p.set_defaults(func=cmd_prebuild)
    def generation_flags(p: argparse.ArgumentParser, max_tokens_help: str) -> None:
        p.add_argument("--backend", default="cpu", help="cpu (default), GPU, or a backend's name")
        p.add_argument("--num-threads", type=_int_at_least(1, also=(-1,)), default=threads, help="cpu threads")
        p.add_argument("--max-tokens", type=_int_at_least(1), default=64, help=max_tokens_help)
        p.add_argument("--max-num-tokens", type=_int_at_least(1), help="cap on prompt plus output (default: the KV "
                       "cache's length)")
        p.add_argument("--top-k", type=_int_at_least(1), default=1,
                       help="sample among the k likeliest (default 1: greedy)")
        p.add_argument("--top-p", type=float, help="nucleus sampling threshold")
        p.add_argument("--temperature", type=float, help="sampling temperature")
        p.add_argument("--seed", type=int, help="sampling seed")

    p = sub.add_parser("generate", help="generate text with a decoder LLM (.litertlm bundle, or a .tflite "
                       "decoder with token ids), printing it as it comes and the prefill and decode tokens/s")
    logging_flags(p, argparse.SUPPRESS)
    p.add_argument("model", help="a .litertlm bundle, or a .tflite decoder with prefill/decode signatures")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--prompt", help="the prompt text (a bundle: its tokenizer and prompt template apply)")
    what.add_argument("--tokens", help="comma-separated prompt token ids (a .tflite without a tokenizer)")
    generation_flags(p, "tokens to generate at most (default 64)")
    p.add_argument("--no-template", action="store_true", help="feed the prompt without the bundle's template")
    p.set_defaults(func=cmd_generate)
    p = sub.add_parser("chat", help="chat with a decoder LLM (.litertlm bundle): each line read from stdin is "
                       "a message, each reply printed as it comes (the bundle's chat template; one KV cache)")
    logging_flags(p, argparse.SUPPRESS)
    p.add_argument("model", help="a .litertlm bundle")
    p.add_argument("--system", help="a system message put first")
    p.add_argument("--template", help="a Jinja chat template file to use instead of the bundle's")
    generation_flags(p, "longest reply in tokens (default 64)")
    p.set_defaults(func=cmd_chat)
    p = sub.add_parser("backends", help="list backend plugins, availability, devices and versions")
    logging_flags(p, argparse.SUPPRESS)
    p.set_defaults(func=cmd_backends)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``litegpu`` command; returns the exit code."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:   # --help, --version, or a usage error already printed
        return exc.code if isinstance(exc.code, int) else 2
    level = logging.DEBUG if args.debug else logging.INFO if args.verbose else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except LiteGpuError as exc:
        log.debug("litegpu error", exc_info=True)
        fail(str(exc))
    except BrokenPipeError:
        # The reader went away (``litegpu backends | head``): stop quietly, as Python's docs
        # advise, pointing stdout at devnull so the flush at exit cannot fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as exc:   # the file system, not litegpu: say which file and why
        log.debug("OS error", exc_info=True)
        fail(f"{exc.filename}: {exc.strerror}" if exc.filename and exc.strerror else str(exc))
    except MemoryError:
        fail("out of memory")
    except KeyboardInterrupt:
        fail("interrupted")
        return 130
    except Exception as exc:   # noqa: BLE001 — anything else is a bug in litegpu; still one line
        if args.debug:
            traceback.print_exc()
        fail(f"internal error: {type(exc).__name__}: {exc} (please report it; --debug shows the traceback)")
    return 1


if __name__ == "__main__":
    sys.exit(main())
