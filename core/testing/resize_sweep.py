"""Resize sweep: resize a model's inputs to many shapes and hold litegpu to LiteRT's verdict.

For each model, :func:`resize_variants` derives input shapes from the model's own (each
dim +1, -1, x2 and 0; rank +1 and -1; the batch of every input doubled together). Each
variant runs in LiteRT (``resize_tensor_input`` + ``allocate_tensors`` + ``invoke`` on
seeded inputs) and in litegpu's Interpreter on each backend, and :func:`classify` judges:

- both refuse (litegpu with a :class:`LiteGpuError`), or both run with the same output
  shapes and ``max|diff| / max|LiteRT| <= tol``: agreement;
- litegpu runs where LiteRT refuses, or both run and differ: a *silent wrong answer* —
  except a zero-size input giving empty outputs, which is fine;
- litegpu raises anything but a :class:`LiteGpuError`: a *raw* exception;
- litegpu refuses where LiteRT runs: an *over-refusal*.

LiteRT runs in a long-lived worker subprocess (restarted if a case kills it; a LiteRT
crash counts as a refusal), litegpu in this process.

Command line::

    python -m litegpu.testing.resize_sweep --backend cpu --backend opencl [--models NAME ...]
        [--cases PATTERN ...] [--no-shared] [--no-cases] [-v]

Models are the shared ``.tflite`` files (where :mod:`litegpu.testing.shared_models` finds them)
and the conformance cases of :data:`CONFORMANCE_CASES` (built by ``litegpu.testing.builder``).
"""
from __future__ import annotations

import argparse
import fnmatch
import os
import pickle
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from .shared_models import shared_models_dir

__all__ = ["CONFORMANCE_CASES", "SweepModel", "CaseResult", "Tally", "resize_variants", "classify",
           "shared_models", "conformance_models", "sweep", "format_table", "main"]

# The shared models' folder when this module was imported; shared_models() looks it up
# again when called without one, so a later $LITEGPU_SHARED_MODELS counts.
DEFAULT_MODELS_DIR = shared_models_dir()
TOLERANCE = 1e-4
# A variant whose inputs would exceed this many elements in all is not tried (time, memory).
MAX_ELEMENTS = 1 << 22

# Conformance cases swept by default: every op whose operands can disagree after a resize
# (glob patterns on case ids; see ``litegpu.testing.cases``).
CONFORMANCE_CASES = (
    "CONV_2D-*", "DEPTHWISE_CONV_2D-*", "TRANSPOSE_CONV-*", "Convolution2DTransposeBias-*",
    "FULLY_CONNECTED-*", "BATCH_MATMUL-*", "CONCATENATION-*", "RESHAPE-*", "GATHER-*", "GATHER_ND-*",
    "ADD-*", "MUL-*", "SUB-*", "DIV-*", "SQUARED_DIFFERENCE-*", "MAXIMUM-*", "POW-*", "FLOOR_MOD-*",
    "EQUAL-*", "LESS-*", "LOGICAL_AND-*", "SELECT-*", "SELECT_V2-*", "PRELU-*", "ADD_N-*",
    "AVERAGE_POOL_2D-*", "MAX_POOL_2D-*", "L2_POOL_2D-*", "PAD-*", "PADV2-*", "MIRROR_PAD-*",
    "STRIDED_SLICE-*", "SLICE-*", "MEAN-*", "SUM-*", "REDUCE_MAX-*", "ARG_MAX-*", "SOFTMAX-*",
    "LOG_SOFTMAX-*", "SPLIT-*", "SPLIT_V-*", "PACK-*", "UNPACK-*", "TRANSPOSE-*", "SQUEEZE-*",
    "EXPAND_DIMS-*", "TILE-*", "BROADCAST_TO-*", "SPACE_TO_DEPTH-*", "DEPTH_TO_SPACE-*",
    "SPACE_TO_BATCH_ND-*", "BATCH_TO_SPACE_ND-*", "RESIZE_BILINEAR-*", "RESIZE_NEAREST_NEIGHBOR-*",
    "L2_NORMALIZATION-*", "LOCAL_RESPONSE_NORMALIZATION-*", "EMBEDDING_LOOKUP-*", "LSTM-*",
    "UNIDIRECTIONAL_SEQUENCE_LSTM-*", "ONE_HOT-*", "CUMSUM-*", "REVERSE_V2-*", "FILL-*", "SHAPE-*",
    "ZEROS_LIKE-*", "WHERE-*", "RANGE-*", "RFFT2D-*", "GELU-*", "CAST-*", "TANH-*",
)

FAILURES = ("silent", "raw", "over-refusal")
OUTCOMES = ("agree-refused", "agree-ran", "empty-ok", "known", "silent", "raw", "over-refusal")

# Where litegpu deliberately differs from LiteRT: (model glob, variant glob, outcome, why).
# A matching variant counts as "known", not as a failure; every entry says why.
KNOWN_DIVERGENCES = (
    ("SLICE-basic", "*", "over-refusal",
     "LiteRT does not bounds-check SLICE's begin/size against a resized input (reads out of bounds)"),
    ("STRIDED_SLICE-shrink*", "*", "over-refusal",
     "LiteRT does not bounds-check a shrink index against a resized dimension (reads out of bounds)"),
    ("STRIDED_SLICE-ellipsis-shrink", "*", "over-refusal",
     "LiteRT does not bounds-check a shrink index against a resized dimension (reads out of bounds)"),
    ("FULLY_CONNECTED-weights-as-input", "*", "over-refusal",
     "with runtime weights LiteRT's builtin kernel reads a prefix of an input that does not flatten into rows of K"),
    ("SPACE_TO_DEPTH-*", "in0.d0*", "silent", "LiteRT reports a garbage output shape for an empty batch"),
    ("DEPTH_TO_SPACE-*", "in0.d0*", "silent", "LiteRT reports a garbage output shape for an empty batch"),
    ("STRIDED_SLICE-offset", "in0.rank+1*", "*",
     "under offset=True at a new rank LiteRT reports a shape the input cannot give ([3, 2, 0] out of "
     "[1, 6, 4]) or crashes"),
    ("stateful_counter", "in0.rank+1(tail)", "silent", "LiteRT crashes (the sweep counts a crash as a refusal)"),
    ("*POOL_2D-*", "in0.d0*", "silent", "LiteRT reports a garbage output shape for an empty batch"),
    ("L2_POOL_2D-*", "*=0", "silent", "zero-size input: LiteRT's empty output has another (empty) shape"),
    ("MAX_POOL_2D-*", "in0.rank+1(lead)", "over-refusal",
     "LiteRT's XNNPACK pools a rank-5 input as its first four dims, reading a prefix of the data "
     "([1, 1, 9, 9, 2] pooled as [1, 1, 9, 9]); litegpu takes rank 5 only with a trailing 1"),
    ("LSTM-*", "in0.rank+1(tail)", "over-refusal",
     "LiteRT runs LSTM on [B, I, 1] but answers otherwise than for the same data as [B, I] "
     "(and crashes with CIFG): it misreads the input"),
    ("LSTM-cifg", "in0.rank+1(tail)", "silent", "LiteRT crashes (the sweep counts a crash as a refusal)"),
    ("LOG_SOFTMAX-*", "in0.rank-1*", "over-refusal",
     "LiteRT runs LOG_SOFTMAX on a scalar but returns uninitialized memory (-1.2e15, 3.5e-42 where "
     "the answer is 0)"),
    ("STRIDED_SLICE-indices-at-runtime", "*", "*",
     "runtime begin/end/strides of other lengths: LiteRT reads past them or refuses in the Python binding"),
)


# -- models and inputs ------------------------------------------------------------------


@dataclass
class InputRange:
    """How to draw one input: its dtype and the value range its sample held."""

    dtype: np.dtype
    low: float
    high: float

    def draw(self, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
        """Seeded values of ``shape`` in this input's range."""
        if self.dtype == np.bool_:
            return rng.random(shape) < 0.5
        if self.dtype.kind in "iu":
            return rng.integers(int(self.low), int(self.high) + 1, size=shape).astype(self.dtype)
        if self.dtype.kind == "c":
            return (rng.uniform(self.low, self.high, shape) + 1j * rng.uniform(self.low, self.high, shape)
                    ).astype(self.dtype)
        return rng.uniform(self.low, self.high, shape).astype(self.dtype)

    @classmethod
    def of(cls, sample: np.ndarray) -> "InputRange":
        """The range of a sample input (finite values; [-1, 1] when it has none)."""
        sample = np.asarray(sample)
        values = sample.real if sample.dtype.kind == "c" else sample
        finite = values[np.isfinite(values)] if values.dtype.kind == "f" else values
        if finite.size == 0 or values.dtype == np.bool_:
            return cls(sample.dtype, -1.0, 1.0)
        return cls(sample.dtype, float(finite.min()), float(finite.max()))


@dataclass
class SweepModel:
    """One model to sweep: its bytes, its inputs' shapes and value ranges, a tolerance."""

    name: str
    data: bytes
    shapes: list[tuple[int, ...]]
    ranges: list[InputRange]
    tol: float = TOLERANCE
    skip: str = ""      # why the model is not swept (unsupported kind), else ""
    samples: list[np.ndarray] | None = None   # the model's own inputs, when it comes with some


def shared_models(names: Sequence[str] = (), models_dir: Path | None = None) -> list[SweepModel]:
    """The shared ``.tflite`` models (all, or those named) in ``models_dir`` (default:
    :func:`~litegpu.testing.shared_models.shared_models_dir`), with a skip reason for the
    ones litegpu refuses as a whole at their own shapes (full-integer, int16x8, hybrid)."""
    import litegpu

    models_dir = shared_models_dir() if models_dir is None else models_dir
    out = []
    for path in sorted(Path(models_dir).glob("*.tflite")):
        if names and path.stem not in names:
            continue
        data = path.read_bytes()
        model = litegpu.load_model(data)
        sg = model.subgraphs[0]
        shapes = [tuple(sg.tensors[t].shape) for t in sg.inputs]
        # Token ids stay small so that every vocabulary holds them.
        ranges = [InputRange(sg.tensors[t].dtype, 0, 9) if sg.tensors[t].dtype.kind in "iu"
                  else InputRange(sg.tensors[t].dtype, -1.0, 1.0) for t in sg.inputs]
        skip = ""
        try:
            litegpu.Interpreter(model_content=data)
        except litegpu.UnsupportedError as exc:
            skip = f"unsupported at its own shapes: {str(exc)[:100]}"
        out.append(SweepModel(path.stem, data, shapes, ranges, skip=skip))
    return out


def conformance_models(patterns: Sequence[str] = CONFORMANCE_CASES) -> list[SweepModel]:
    """Conformance cases whose id matches one of ``patterns``, as sweep models."""
    from .cases import all_cases

    out = []
    for case in all_cases():
        if not any(fnmatch.fnmatchcase(case.id, p) for p in patterns):
            continue
        data, inputs = case.build()
        inputs = [np.asarray(x) for x in inputs]
        out.append(SweepModel(case.id, bytes(data), [x.shape for x in inputs], [InputRange.of(x) for x in inputs],
                              tol=max(case.tol, TOLERANCE), samples=inputs))
    return out


# -- variants ---------------------------------------------------------------------------


def resize_variants(shapes: Sequence[tuple[int, ...]]) -> list[tuple[str, list[tuple[int, ...]]]]:
    """Named input-shape lists derived from ``shapes``: one input changed at a time (each dim
    +1, -1, x2, 0; a leading or trailing 1 added; the first or last dim dropped), and every
    input's dim 0 doubled together. Duplicates and oversized variants are left out."""
    shapes = [tuple(int(d) for d in s) for s in shapes]
    out: list[tuple[str, list[tuple[int, ...]]]] = []
    seen = {tuple(shapes)}

    def add(name: str, new: list[tuple[int, ...]]) -> None:
        key = tuple(new)
        if key in seen or sum(int(np.prod(s, dtype=np.int64)) for s in new) > MAX_ELEMENTS:
            return
        seen.add(key)
        out.append((name, new))

    for i, s in enumerate(shapes):
        def with_shape(shape: tuple[int, ...]) -> list[tuple[int, ...]]:
            return [shape if j == i else other for j, other in enumerate(shapes)]

        for d, size in enumerate(s):
            for label, new in (("+1", size + 1), ("-1", size - 1), ("x2", size * 2), ("=0", 0)):
                if new >= 0:
                    add(f"in{i}.d{d}{label}", with_shape((*s[:d], new, *s[d + 1:])))
        add(f"in{i}.rank+1(lead)", with_shape((1, *s)))
        add(f"in{i}.rank+1(tail)", with_shape((*s, 1)))
        if s:
            add(f"in{i}.rank-1(first)", with_shape(s[1:]))
            add(f"in{i}.rank-1(last)", with_shape(s[:-1]))
    if len(shapes) > 1 and shapes[0]:
        batch = shapes[0][0]
        add("all.d0x2", [(s[0] * 2, *s[1:]) if s and s[0] == batch else s for s in shapes])
    return out


def make_inputs(model: SweepModel, shapes: Sequence[tuple[int, ...]], seed: int) -> list[np.ndarray]:
    """Inputs of ``shapes`` (the same for every runner): an input left at its own shape keeps
    the model's sample value when it has one (a permutation or index input stays valid),
    a resized one is drawn, seeded, in its sample's value range."""
    rng = np.random.default_rng(seed)
    out = []
    for i, (r, s) in enumerate(zip(model.ranges, shapes)):
        drawn = r.draw(tuple(s), rng)
        keep = model.samples is not None and tuple(s) == tuple(model.shapes[i])
        out.append(model.samples[i] if keep else drawn)
    return out


# -- running ----------------------------------------------------------------------------


@dataclass
class Outcome:
    """What one runtime did with one variant: ``ran`` (with outputs), ``refused`` or ``raw``."""

    status: str
    outputs: list[np.ndarray] = field(default_factory=list)
    error: str = ""


def run_litert(data: bytes, inputs: Sequence[np.ndarray]) -> Outcome:
    """LiteRT's verdict on ``data`` with ``inputs`` (each input resized to its shape)."""
    from ai_edge_litert.interpreter import Interpreter

    try:
        interp = Interpreter(model_content=data, num_threads=1)
        details = interp.get_input_details()
        for d, x in zip(details, inputs):
            interp.resize_tensor_input(d["index"], list(x.shape), strict=False)
        interp.allocate_tensors()
        for d, x in zip(details, inputs):
            interp.set_tensor(d["index"], x)
        interp.invoke()
        return Outcome("ran", [np.array(interp.get_tensor(d["index"])) for d in interp.get_output_details()])
    except Exception as exc:  # noqa: BLE001 — any LiteRT error is its refusal
        return Outcome("refused", error=f"{type(exc).__name__}: {str(exc)[:200]}")


def run_litegpu(data: bytes, inputs: Sequence[np.ndarray], backend: str) -> Outcome:
    """litegpu's verdict with ``backend`` as delegate, through the public Interpreter API."""
    import litegpu

    try:
        interp = litegpu.Interpreter(model_content=data, experimental_delegates=[litegpu.load_delegate(backend)])
        details = interp.get_input_details()
        for d, x in zip(details, inputs):
            interp.resize_tensor_input(d["index"], list(x.shape))
        interp.allocate_tensors()
        for d, x in zip(details, inputs):
            interp.set_tensor(d["index"], x)
        interp.invoke()
        return Outcome("ran", [np.array(interp.get_tensor(d["index"])) for d in interp.get_output_details()])
    except litegpu.LiteGpuError as exc:
        return Outcome("refused", error=f"{type(exc).__name__}: {str(exc)[:300]}")
    except Exception as exc:  # noqa: BLE001 — what the sweep hunts for
        import traceback
        where = traceback.extract_tb(exc.__traceback__)[-1]
        return Outcome("raw", error=f"{type(exc).__name__}: {str(exc)[:200]} "
                                    f"({Path(where.filename).name}:{where.lineno})")


def _worker_main() -> None:
    """Serve LiteRT runs: length-prefixed pickles ``(data, inputs)`` in, ``Outcome`` out."""
    results = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)   # whatever LiteRT prints must not corrupt the answers
    stdin = sys.stdin.buffer
    models: dict[int, bytes] = {}
    while True:
        header = stdin.read(8)
        if len(header) < 8:
            return
        request = pickle.loads(stdin.read(struct.unpack("<Q", header)[0]))
        if request[0] == "model":
            models.clear()
            models[request[1]] = request[2]
            continue
        outcome = run_litert(models[request[1]], request[2])
        # Plain values: the worker runs as __main__, whose classes the parent cannot unpickle.
        answer = pickle.dumps((outcome.status, outcome.outputs, outcome.error))
        results.write(struct.pack("<Q", len(answer)) + answer)
        results.flush()


_CRASHED = "LiteRT crashed"


class LiteRTWorker:
    """LiteRT in a subprocess, so that a case that crashes it costs one answer, not the sweep."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        # The model the worker holds, kept alive: an id() alone could be reused by the next
        # model's bytes once these are freed, and the worker would run the old model.
        self._model: bytes | None = None

    def _start(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "litegpu.testing.resize_sweep", "--worker"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self._model = None

    def _send(self, obj) -> None:
        payload = pickle.dumps(obj)
        self.proc.stdin.write(struct.pack("<Q", len(payload)) + payload)
        self.proc.stdin.flush()

    def run(self, data: bytes, inputs: Sequence[np.ndarray]) -> Outcome:
        """LiteRT's outcome; a crash of the worker, twice in a row, is a refusal (LiteRT gives
        no answer). Once is not enough: LiteRT crashed on a case it ran every other time
        (stateful_counter with a rank-0 input, under load), failing a suite at random."""
        outcome = self._run_once(data, inputs)
        if outcome.error == _CRASHED:
            outcome = self._run_once(data, inputs)
        return outcome

    def _run_once(self, data: bytes, inputs: Sequence[np.ndarray]) -> Outcome:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        try:
            if self._model is not data:
                self._send(("model", id(data), data))
                self._model = data
            self._send(("run", id(data), list(inputs)))
            header = self.proc.stdout.read(8)
            if len(header) == 8:
                return Outcome(*pickle.loads(self.proc.stdout.read(struct.unpack("<Q", header)[0])))
        except (BrokenPipeError, OSError):
            pass
        self.close()
        return Outcome("refused", error=_CRASHED)

    def close(self) -> None:
        """Stop the worker."""
        if self.proc is not None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
            self.proc = None


# -- judging ----------------------------------------------------------------------------


def rel_error(got: np.ndarray, want: np.ndarray) -> float:
    """``max|got - want| / max|want|`` (exact for bool/int outputs; NaN matches NaN, inf inf);
    ``inf`` on a shape or dtype-kind mismatch."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return float("inf")
    if want.size == 0:
        return 0.0
    if want.dtype.kind not in "fc" or got.dtype.kind not in "fc":
        return 0.0 if np.array_equal(got, want) else float("inf")
    wide = np.complex128 if "c" in (got.dtype.kind, want.dtype.kind) else np.float64
    got, want = got.astype(wide), want.astype(wide)
    special = ~np.isfinite(want)
    if not np.array_equal(~np.isfinite(got), special):
        return float("inf")
    if np.any(special) and not np.array_equal(got[special], want[special], equal_nan=True):
        return float("inf")
    finite = ~special
    if not np.any(finite):
        return 0.0
    diff = float(np.max(np.abs(got[finite] - want[finite])))
    scale = float(np.max(np.abs(want[finite])))
    return diff / scale if scale > 0 else (0.0 if diff == 0 else float("inf"))


def known_divergence(model: str, variant: str, outcome: str) -> str:
    """The reason litegpu deliberately differs here (:data:`KNOWN_DIVERGENCES`), or ""."""
    for m, v, o, why in KNOWN_DIVERGENCES:
        if fnmatch.fnmatchcase(model, m) and fnmatch.fnmatchcase(variant, v) and fnmatch.fnmatchcase(outcome, o):
            return why
    return ""


def classify(litert: Outcome, ours: Outcome, inputs: Sequence[np.ndarray], tol: float = TOLERANCE) -> tuple[str, str]:
    """The verdict on one variant (one of :data:`OUTCOMES` but "known") and a detail line."""
    if ours.status == "raw":
        return "raw", ours.error
    if litert.status == "refused":
        if ours.status == "refused":
            return "agree-refused", ours.error
        if any(x.size == 0 for x in inputs) and all(o.size == 0 for o in ours.outputs):
            return "empty-ok", "zero-size input, empty outputs"
        return "silent", f"litegpu ran where LiteRT refused ({litert.error})"
    if ours.status == "refused":
        return "over-refusal", ours.error
    if len(ours.outputs) != len(litert.outputs):
        return "silent", f"{len(ours.outputs)} outputs, LiteRT {len(litert.outputs)}"
    for k, (g, w) in enumerate(zip(ours.outputs, litert.outputs)):
        err = rel_error(g, w)
        if not err <= tol:
            return "silent", (f"output {k}: shape {list(g.shape)} vs LiteRT {list(w.shape)}, "
                              f"rel error {err:.3g}")
    return "agree-ran", ""


@dataclass
class CaseResult:
    """One variant of one model on one backend."""

    model: str
    backend: str
    variant: str
    shapes: list[tuple[int, ...]]
    outcome: str
    detail: str


@dataclass
class Tally:
    """Counts per (model, backend)."""

    model: str
    backend: str
    tried: int = 0
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    skip: str = ""

    @property
    def agreements(self) -> int:
        """Variants where litegpu did what LiteRT did."""
        return self.counts["agree-refused"] + self.counts["agree-ran"] + self.counts["empty-ok"]

    @property
    def failures(self) -> int:
        """Silent wrong answers, raw exceptions and over-refusals."""
        return sum(self.counts[k] for k in FAILURES)


def sweep(models: Iterable[SweepModel], backends: Sequence[str], seed: int = 0,
          progress: Callable[[CaseResult], None] | None = None) -> tuple[list[Tally], list[CaseResult]]:
    """Run every variant of every model on LiteRT and each backend; tallies and results."""
    worker = LiteRTWorker()
    tallies: list[Tally] = []
    results: list[CaseResult] = []
    try:
        for model in models:
            if model.skip:
                tallies.extend(Tally(model.name, b, skip=model.skip) for b in backends)
                continue
            by_backend = {b: Tally(model.name, b) for b in backends}
            for v, (name, shapes) in enumerate(resize_variants(model.shapes)):
                inputs = make_inputs(model, shapes, seed + v)
                litert = worker.run(model.data, inputs)
                for b in backends:
                    outcome, detail = classify(litert, run_litegpu(model.data, inputs, b), inputs, model.tol)
                    why = known_divergence(model.name, name, outcome) if outcome in FAILURES else ""
                    if why:
                        outcome, detail = "known", f"{why} ({detail})"
                    result = CaseResult(model.name, b, name, shapes, outcome, detail)
                    results.append(result)
                    tally = by_backend[b]
                    tally.tried += 1
                    tally.counts[outcome] += 1
                    if progress is not None:
                        progress(result)
            tallies.extend(by_backend.values())
    finally:
        worker.close()
    return tallies, results


def format_table(tallies: Sequence[Tally]) -> str:
    """A fixed-width table: one row per model and backend, and a total per backend."""
    head = f"{'model':44} {'backend':8} {'tried':>5} {'agree':>5} {'ref-both':>8} {'ran-both':>8} " \
           f"{'empty':>5} {'known':>5} {'silent':>6} {'raw':>4} {'over-ref':>8}"
    lines = [head, "-" * len(head)]
    totals: dict[str, Tally] = {}
    for t in tallies:
        if t.skip:
            lines.append(f"{t.model:44} {t.backend:8} skipped: {t.skip}")
            continue
        c = t.counts
        lines.append(f"{t.model[:44]:44} {t.backend:8} {t.tried:5} {t.agreements:5} {c['agree-refused']:8} "
                     f"{c['agree-ran']:8} {c['empty-ok']:5} {c['known']:5} {c['silent']:6} {c['raw']:4} {c['over-refusal']:8}")
        total = totals.setdefault(t.backend, Tally("TOTAL", t.backend))
        total.tried += t.tried
        for k, n in c.items():
            total.counts[k] += n
    lines.append("-" * len(head))
    for t in totals.values():
        c = t.counts
        lines.append(f"{'TOTAL':44} {t.backend:8} {t.tried:5} {t.agreements:5} {c['agree-refused']:8} "
                     f"{c['agree-ran']:8} {c['empty-ok']:5} {c['known']:5} {c['silent']:6} {c['raw']:4} {c['over-refusal']:8}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line; exit status 1 when any variant fails."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv == ["--worker"]:
        _worker_main()
        return 0
    p = argparse.ArgumentParser(prog="python -m litegpu.testing.resize_sweep", description=__doc__.split("\n")[0])
    p.add_argument("--backend", action="append", help="backend to check (repeatable; default cpu)")
    p.add_argument("--models", nargs="*", default=(), help="shared model names (default: all)")
    p.add_argument("--cases", nargs="*", default=None, help="conformance case id patterns (default: a set)")
    p.add_argument("--no-shared", action="store_true", help="skip the shared models")
    p.add_argument("--no-cases", action="store_true", help="skip the conformance cases")
    p.add_argument("--models-dir", type=Path, default=DEFAULT_MODELS_DIR)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("-v", "--verbose", action="store_true", help="print every failing variant as it happens")
    args = p.parse_args(argv)
    backends = args.backend or ["cpu"]
    models: list[SweepModel] = []
    if not args.no_shared:
        models += shared_models(args.models, args.models_dir)
    if not args.no_cases:
        models += conformance_models(tuple(args.cases) if args.cases is not None else CONFORMANCE_CASES)

    def show(r: CaseResult) -> None:
        if args.verbose and r.outcome in FAILURES:
            print(f"{r.outcome:12} {r.model} [{r.backend}] {r.variant} {r.shapes}: {r.detail}", flush=True)

    start = time.perf_counter()
    tallies, _ = sweep(models, backends, args.seed, show)
    print(format_table(tallies))
    print(f"wall time {time.perf_counter() - start:.1f} s")
    return 1 if any(t.failures for t in tallies) else 0


if __name__ == "__main__":
    sys.exit(main())
