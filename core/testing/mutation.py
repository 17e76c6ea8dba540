"""Mutation (fuzz) testing of the model reader and runtime with broken real models.

Many mutated copies of real ``.tflite`` files are fed, one after another, to ONE
long-lived worker subprocess that loads, allocates and invokes each through the
public API. The worker is restarted when a case kills it, and each case has a
timeout, so one run of thousands of cases fits in minutes and still tells apart:

- ``ok``: the case loaded and ran (a mutation may leave a model valid);
- ``error``: a clean :class:`litegpu.LiteGpuError`;
- ``raw``: any other exception (IndexError, MemoryError, ...) — a bug to fix;
- ``crash``: the worker died (segfault, abort, killed);
- ``hang``: no answer within the per-case timeout.

Mutations are byte flips, truncations, and field-aware edits of the positions the
reader actually reads: uoffsets, vtable entries, vector lengths, tensor / buffer /
opcode / subgraph indices, shape dimensions, and the quantization of tensors (scale
values, zero points, per-channel axes). The positions are found by reading the
unmutated model through a recording buffer.

Command line::

    python -m litegpu.testing.mutation --cases 2000 --seed 1 --models dynamic_batch_mlp,elementwise_200
    python -m litegpu.testing.mutation --cases 10000 --seed 11 --models all   # every shared model
    python -m litegpu.testing.mutation --cases 500 --models unet_small_int16x8 --kinds scale,zero_point,quant_dim

With ``--models all`` the models are weighted by :func:`size_weights`: a large model
(tens of MB, a second to compile and run) gets one case for every five of a small one,
so a run covers all of them and still fits in minutes.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import select
import struct
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from .shared_models import shared_models_dir

# The shared models' folder when this module was imported (the fuzzer's default too);
# resolve_models looks it up again when called, so a later $LITEGPU_SHARED_MODELS counts.
DEFAULT_MODELS_DIR = shared_models_dir()
DEFAULT_MODELS = ("dynamic_batch_mlp", "elementwise_200", "stateful_counter", "lstm_classifier", "unet_small")
# A model bigger than this costs far more per case (pipe, read, compile, invoke at 224x224):
# size_weights gives it fewer cases per round.
BIG_MODEL_BYTES = 5_000_000
MUTATIONS = ("flip", "truncate", "offset", "length", "index", "shape", "word", "scale", "zero_point", "quant_dim")
# The kinds that edit quantization tables: a model without any falls back to a bit flip.
QUANT_MUTATIONS = ("scale", "zero_point", "quant_dim")
OUTCOMES = ("ok", "error", "raw", "crash", "hang")

_INTERESTING_U32 = (0, 1, 2, 3, 4, 7, 8, 0x7F, 0x80, 0xFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFE, 0xFFFFFFFF)
_INTERESTING_DIMS = (0, 1, 2, -1, -2, 3, 1000, 65536, 1 << 20, 0x7FFFFFFF, -0x80000000)
# Scales the reader refuses (0, negative, NaN, inf) and legal extremes kernels must survive.
_INTERESTING_SCALES = (0.0, -0.0, -1.0, float("nan"), float("inf"), float("-inf"), 1e-45, 1e-30, 1e30, 3.4e38)
# Zero points at and past the bounds of int8, uint8, int16 and int32.
_INTERESTING_ZERO_POINTS = (0, -1, 127, 128, -128, -129, 255, 256, 32767, 32768, -32769, 1 << 31, -(1 << 63))


# ---------------------------------------------------------------------------------------------
# Where the fields are: read the model once through a buffer that records every read.
# ---------------------------------------------------------------------------------------------
@dataclass
class FieldMap:
    """Byte positions of the fields of one model, by kind (each a list of positions of 4-byte words)."""

    offsets: list[int] = field(default_factory=list)   # uoffset_t fields and table -> vtable soffsets
    vtable: list[int] = field(default_factory=list)    # 2-byte vtable entries (field offsets, sizes)
    lengths: list[int] = field(default_factory=list)   # vector / string length prefixes
    indices: list[int] = field(default_factory=list)   # int32 tensor/buffer/opcode/subgraph indices
    shapes: list[int] = field(default_factory=list)    # int32 shape and shape_signature entries
    scales: list[int] = field(default_factory=list)    # float32 quantization scales
    zero_points: list[int] = field(default_factory=list)  # int64 quantization zero points (8-byte words)
    quant_dims: list[int] = field(default_factory=list)   # int32 quantized_dimension fields


_INDEX_NAMES = (".inputs", ".outputs", ".intermediates", ".buffer", ".opcode_index", "subgraph_index",
                ".tensor_index", ".traversal_order", ".block_map", ".values")
_SIZE_NAMES = (".shape", ".shape_signature", ".dense_size")


def field_map(data: bytes) -> FieldMap:
    """Find the positions of offsets, lengths, indices and shape entries that the reader reads."""
    from ..model import reader as reader_mod
    from ..model.flatbuf import Buffer

    fm = FieldMap()

    class Recording(Buffer):
        def scalar(self, pos: int, kind: str, what: str):
            value = super().scalar(pos, kind, what)
            if what.endswith(" length"):
                fm.lengths.append(pos)
                name = what[:-len(" length")]
                if name.endswith(_SIZE_NAMES):
                    fm.shapes.extend(pos + 4 + 4 * i for i in range(value))
                elif name.endswith(_INDEX_NAMES):
                    fm.indices.extend(pos + 4 + 4 * i for i in range(value))
                elif name.endswith(".quantization.scale"):
                    fm.scales.extend(pos + 4 + 4 * i for i in range(value))
                elif name.endswith(".quantization.zero_point"):
                    fm.zero_points.extend(pos + 4 + 8 * i for i in range(value))
            elif what.endswith("vtable offset"):
                fm.offsets.append(pos)
            elif "vtable" in what or what.endswith("table size"):
                fm.vtable.append(pos)
            elif kind in ("uint", "int") and what.endswith(_INDEX_NAMES):
                fm.indices.append(pos)
            elif what.endswith(".quantization.quantized_dimension"):
                fm.quant_dims.append(pos)
            elif kind == "int" and what.endswith(_SIZE_NAMES):
                fm.shapes.append(pos)
            return value

        def uoffset(self, pos: int, what: str) -> int:
            fm.offsets.append(pos)
            return super().uoffset(pos, what)

    r = reader_mod._Reader(data)
    r.buf = Recording(data)
    r.read()
    for name in ("offsets", "vtable", "lengths", "indices", "shapes", "scales", "zero_points", "quant_dims"):
        # Narrow index vectors (uint8/uint16) were stepped as words: keep what lies in the file.
        setattr(fm, name, sorted(p for p in set(getattr(fm, name)) if p <= len(data) - 2))
    return fm


# ---------------------------------------------------------------------------------------------
# Mutations.
# ---------------------------------------------------------------------------------------------
def _put_u32(buf: bytearray, pos: int, value: int) -> None:
    if 0 <= pos and pos + 4 <= len(buf):
        struct.pack_into("<I", buf, pos, value & 0xFFFFFFFF)


def mutate(data: bytes, fm: FieldMap, rng: random.Random, kind: str | None = None) -> tuple[bytes, str]:
    """One mutated copy of ``data`` and a short description of what was changed."""
    kind = kind or rng.choice(MUTATIONS)
    buf = bytearray(data)
    size = len(buf)
    if kind == "truncate":
        cut = rng.choice([rng.randrange(size), rng.randrange(min(size, 64)), size - rng.randrange(1, 9)])
        return bytes(buf[:max(cut, 0)]), f"truncate to {cut}"
    if kind == "flip":
        positions = [rng.randrange(size) for _ in range(rng.choice((1, 1, 2, 4, 8)))]
        for p in positions:
            buf[p] ^= 1 << rng.randrange(8)
        return bytes(buf), f"flip bits at {positions}"
    if kind == "word":
        pos = rng.randrange(size // 4) * 4
        value = rng.choice(_INTERESTING_U32 + (rng.randrange(1 << 32), rng.randrange(size)))
        _put_u32(buf, pos, value)
        return bytes(buf), f"word at {pos} = {value:#x}"
    if kind == "offset" and fm.offsets:
        pos = rng.choice(fm.offsets)
        old = struct.unpack_from("<I", buf, pos)[0]
        value = rng.choice(_INTERESTING_U32 + (old + 4, old - 4, old + 1, size - pos, size - pos - 4,
                                               rng.randrange(size), (-pos) & 0xFFFFFFFF))
        _put_u32(buf, pos, value)
        return bytes(buf), f"offset at {pos}: {old:#x} -> {value & 0xFFFFFFFF:#x}"
    if kind == "length" and (fm.lengths or fm.vtable):
        if fm.vtable and rng.random() < 0.3:
            pos = rng.choice(fm.vtable)
            value = rng.choice((0, 1, 2, 3, 4, 0xFF, 0x7FFF, 0xFFFF, rng.randrange(1 << 16)))
            struct.pack_into("<H", buf, pos, value)
            return bytes(buf), f"vtable entry at {pos} = {value}"
        pos = rng.choice(fm.lengths)
        old = struct.unpack_from("<I", buf, pos)[0]
        value = rng.choice(_INTERESTING_U32 + (old + 1, old - 1, old * 2, 1 << 31, (size - pos) // 4))
        _put_u32(buf, pos, value)
        return bytes(buf), f"length at {pos}: {old} -> {value & 0xFFFFFFFF}"
    if kind == "index" and fm.indices:
        pos = rng.choice(fm.indices)
        old = struct.unpack_from("<i", buf, pos)[0]
        value = rng.choice((-1, -2, 0, 1, old + 1, old - 1, old + 100, 0x7FFFFFFF, -0x80000000, rng.randrange(64)))
        _put_u32(buf, pos, value)
        return bytes(buf), f"index at {pos}: {old} -> {value}"
    if kind == "shape" and fm.shapes:
        pos = rng.choice(fm.shapes)
        old = struct.unpack_from("<i", buf, pos)[0]
        value = rng.choice(_INTERESTING_DIMS + (old + 1, old - 1, old * 2, old * 1000))
        _put_u32(buf, pos, value)
        return bytes(buf), f"shape dim at {pos}: {old} -> {value}"
    if kind == "scale" and fm.scales:
        pos = rng.choice(fm.scales)
        old = struct.unpack_from("<f", buf, pos)[0]
        value = rng.choice(_INTERESTING_SCALES + (old * 2, old / 1000, -old))
        struct.pack_into("<f", buf, pos, value)
        return bytes(buf), f"scale at {pos}: {old:g} -> {value:g}"
    if kind == "zero_point" and fm.zero_points:
        pos = rng.choice(fm.zero_points)
        old = struct.unpack_from("<q", buf, pos)[0]
        value = rng.choice(_INTERESTING_ZERO_POINTS + (old + 1, old - 1, -old))
        struct.pack_into("<q", buf, pos, max(min(value, (1 << 63) - 1), -(1 << 63)))
        return bytes(buf), f"zero point at {pos}: {old} -> {value}"
    if kind == "quant_dim" and fm.quant_dims:
        pos = rng.choice(fm.quant_dims)
        old = struct.unpack_from("<i", buf, pos)[0]
        value = rng.choice((-1, 0, 1, 2, 3, 4, 5, 16, old + 1, 0x7FFFFFFF, -0x80000000))
        _put_u32(buf, pos, value)
        return bytes(buf), f"quantized_dimension at {pos}: {old} -> {value}"
    return mutate(data, fm, rng, "flip")  # a field kind the model lacks


# ---------------------------------------------------------------------------------------------
# The worker: reads cases from stdin, answers one JSON line per case.
# ---------------------------------------------------------------------------------------------
def _random_input(shape, dtype, rng):
    import numpy as np

    dt = np.dtype(dtype)
    shape = [max(int(d), 0) for d in shape]  # the shape the model reports, zero dims included
    if dt == np.bool_:
        return rng.random(shape) < 0.5
    if dt.kind in "iu":
        return rng.integers(0, 4, size=shape).astype(dt)  # small: token ids stay in range
    if dt.kind == "f":
        return rng.standard_normal(shape).astype(dt)
    return np.zeros(shape, dt)


def run_case(data: bytes, max_bytes: int, max_while: int, seed: int) -> None:
    """Load, allocate and invoke ``data`` through the public API (raises on failure)."""
    import numpy as np

    import litegpu

    if not hasattr(litegpu, "Interpreter"):
        litegpu.load_model(data)
        return
    kwargs = {}
    try:
        from litegpu.executor import Limits
        kwargs["limits"] = Limits(max_bytes=max_bytes, max_while_iterations=max_while)
    except ImportError:  # an older core without limits: the rlimit alone bounds memory
        pass
    it = litegpu.Interpreter(model_content=data, **kwargs)
    it.allocate_tensors()
    rng = np.random.default_rng(seed)
    for d in it.get_input_details():
        if np.dtype(d["dtype"]) == np.dtype(object):
            continue
        it.set_tensor(d["index"], _random_input(d["shape"], d["dtype"], rng))
    it.invoke()
    for d in it.get_output_details():
        it.get_tensor(d["index"])


def worker_main(memory_limit: int, max_while: int) -> None:
    """Serve cases: ``<length>\\n<bytes>`` on stdin, one JSON line each on the result channel."""
    import resource
    import traceback

    # Answers go to the original stdout; anything the library prints goes to stderr instead.
    results = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    if memory_limit:
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = memory_limit if hard == resource.RLIM_INFINITY else min(memory_limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    import litegpu  # noqa: F401  (import before the first case so its cost is not a case's)

    stdin = sys.stdin.buffer
    results.write(json.dumps({"ready": True}) + "\n")
    while True:
        header = stdin.readline()
        if not header:
            return
        n, seed = (int(x) for x in header.split())
        data = stdin.read(n)
        answer = {"outcome": "ok"}
        try:
            run_case(data, max(memory_limit // 4, 1 << 26), max_while, seed)
        except litegpu.LiteGpuError as exc:
            answer = {"outcome": "error", "type": type(exc).__name__, "message": str(exc)[:300]}
        except BaseException as exc:  # noqa: BLE001 — everything else is what we are hunting
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            frames = traceback.extract_tb(exc.__traceback__)
            where = [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in frames[-3:]]
            answer = {"outcome": "raw", "type": type(exc).__name__, "message": str(exc)[:300], "where": where}
        results.write(json.dumps(answer) + "\n")


class _Worker:
    """The parent's handle on one worker subprocess."""

    def __init__(self, memory_limit: int, max_while: int, start_timeout: float) -> None:
        cmd = [sys.executable, "-m", "litegpu.testing.mutation", "--worker",
               "--memory-limit", str(memory_limit), "--max-while", str(max_while)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, bufsize=0)
        self._pending = b""
        if self._answer(start_timeout) != {"ready": True}:
            self.kill()
            raise RuntimeError("mutation worker did not start")

    def _answer(self, timeout: float) -> dict | None:
        """The next JSON line, or None when the worker died or timed out."""
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._pending += chunk
        line, self._pending = self._pending.split(b"\n", 1)
        return json.loads(line)

    def run(self, data: bytes, seed: int, timeout: float) -> dict:
        """Send one case; the worker's answer, or a crash / hang record."""
        try:
            self.proc.stdin.write(b"%d %d\n" % (len(data), seed) + data)
        except (BrokenPipeError, OSError):
            pass  # it died; the read below reports it
        answer = self._answer(timeout)
        if answer is not None:
            return answer
        if self.proc.poll() is None:
            try:
                self.proc.wait(timeout=0.2)  # it may be dying right now
            except subprocess.TimeoutExpired:
                self.kill()
                return {"outcome": "hang", "message": f"no answer in {timeout:g} s"}
        return {"outcome": "crash", "message": f"worker exit status {self.proc.returncode}"}

    @property
    def alive(self) -> bool:
        """True while the worker process runs."""
        return self.proc.poll() is None

    def kill(self) -> None:
        """Stop the worker (it is our own child)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass


# ---------------------------------------------------------------------------------------------
# The parent: generate cases, run them, count.
# ---------------------------------------------------------------------------------------------
@dataclass
class Report:
    """Counts per outcome, and samples of every failure that needs fixing."""

    cases: int = 0
    counts: Counter = field(default_factory=Counter)
    by_model: Counter = field(default_factory=Counter)
    by_mutation: dict[str, Counter] = field(default_factory=dict)
    raw_types: Counter = field(default_factory=Counter)
    error_types: Counter = field(default_factory=Counter)
    error_examples: dict[str, str] = field(default_factory=dict)  # the first message of each clean error type
    samples: list[dict] = field(default_factory=list)  # raw / crash / hang cases
    restarts: int = 0
    seconds: float = 0.0

    @property
    def bad(self) -> int:
        """Cases that are bugs: raw exceptions, crashes and hangs."""
        return self.counts["raw"] + self.counts["crash"] + self.counts["hang"]

    def summary(self) -> str:
        """A few human-readable lines."""
        lines = [f"{self.cases} cases in {self.seconds:.1f} s ({self.restarts} worker restarts): "
                 + ", ".join(f"{k} {self.counts[k]}" for k in OUTCOMES)]
        if len(self.by_model) > 1:
            lines.append("  cases per model: " + ", ".join(f"{k} {v}" for k, v in sorted(self.by_model.items())))
        for kind, c in sorted(self.by_mutation.items()):
            lines.append(f"  {kind:9s} " + " ".join(f"{k}={c[k]}" for k in OUTCOMES if c[k]))
        if self.error_types:
            lines.append("  clean errors: " + ", ".join(f"{k} {v}" for k, v in self.error_types.most_common()))
            for k, v in self.error_examples.items():
                lines.append(f"    e.g. {k}: {v[:160]}")
        if self.raw_types:
            lines.append("  RAW exceptions: " + ", ".join(f"{k} {v}" for k, v in self.raw_types.most_common()))
        for s in self.samples[:20]:
            lines.append(f"  {s['outcome']}: {s['model']} [{s['mutation']}] {s.get('type', '')} "
                         f"{s.get('message', '')[:160]} {' <- '.join(reversed(s.get('where', [])))}")
        return "\n".join(lines)

    def to_json(self) -> dict:
        """The report as plain JSON-able data."""
        return {"cases": self.cases, "counts": dict(self.counts), "raw_types": dict(self.raw_types),
                "error_types": dict(self.error_types), "restarts": self.restarts, "seconds": self.seconds,
                "by_model": dict(self.by_model), "error_examples": self.error_examples,
                "by_mutation": {k: dict(v) for k, v in self.by_mutation.items()}, "samples": self.samples}


def resolve_models(names: Sequence[str], models_dir: Path | None = None) -> list[Path]:
    """Model names (``dynamic_batch_mlp``) or paths, as existing files; ``all``: every shared model.
    Names are looked up in ``models_dir`` (default: :func:`~litegpu.testing.shared_models.shared_models_dir`)."""
    models_dir = shared_models_dir() if models_dir is None else Path(models_dir)
    paths = []
    if list(names) == ["all"]:
        paths = sorted(models_dir.glob("*.tflite"))
        if not paths:
            raise FileNotFoundError(f"no .tflite models in {models_dir}")
        return paths
    for name in names:
        p = Path(name)
        if not p.suffix:
            p = models_dir / f"{name}.tflite"
        if not p.is_file():
            raise FileNotFoundError(f"model {name!r} not found (looked at {p})")
        paths.append(p)
    return paths


def size_weights(models: Sequence[Path], big: int = BIG_MODEL_BYTES, ratio: int = 5) -> list[int]:
    """Cases per round for each model: 1 for a model over ``big`` bytes, ``ratio`` for the rest."""
    return [1 if p.stat().st_size > big else ratio for p in models]


def _schedule(n: int, weights: Sequence[int] | None) -> list[int]:
    """One round of model indices: round ``r`` takes every model whose weight exceeds ``r``."""
    if weights is None:
        return list(range(n))
    if len(weights) != n or any(w < 1 for w in weights):
        raise ValueError(f"need one weight >= 1 per model, got {list(weights)} for {n} models")
    return [i for r in range(max(weights)) for i in range(n) if weights[i] > r]


def run_mutations(models: Sequence[Path], cases: int, seed: int = 0, timeout: float = 20.0,
                  memory_limit: int = 4 << 30, max_while: int = 100_000, save_dir: Path | None = None,
                  time_budget: float | None = None, weights: Sequence[int] | None = None,
                  kinds: Sequence[str] = MUTATIONS) -> Report:
    """Run ``cases`` mutated copies of ``models`` (round robin) through one worker; count outcomes.

    :param timeout: seconds one case may take before it counts as a hang.
    :param memory_limit: the worker's address-space limit (RLIMIT_AS), bytes; the
        runtime's own memory limit is set to a quarter of it.
    :param max_while: WHILE iteration limit passed to the runtime, so a mutated loop
        condition ends in a clean error rather than a timeout.
    :param save_dir: where to write the bytes of every raw / crash / hang case.
    :param time_budget: stop early (with fewer cases) after this many seconds.
    :param weights: cases per round for each model (see :func:`size_weights`); default one each.
    :param kinds: the mutation kinds to draw from (default: all of :data:`MUTATIONS`).
    """
    unknown = sorted(set(kinds) - set(MUTATIONS))
    if unknown or not kinds:
        raise ValueError(f"unknown mutation kinds {unknown}; expected some of {list(MUTATIONS)}")
    rng = random.Random(seed)
    sources = []
    for path in models:
        data = path.read_bytes()
        sources.append((path.stem, data, field_map(data)))
    schedule = _schedule(len(sources), weights)
    report = Report()
    start = time.monotonic()
    worker = _Worker(memory_limit, max_while, start_timeout=120)
    try:
        for i in range(cases):
            if time_budget is not None and time.monotonic() - start > time_budget:
                break
            name, data, fm = sources[schedule[i % len(schedule)]]
            kind = rng.choice(tuple(kinds))
            mutated, what = mutate(data, fm, rng, kind)
            if not worker.alive:
                worker.kill()
                worker = _Worker(memory_limit, max_while, start_timeout=120)
                report.restarts += 1
            answer = worker.run(mutated, rng.randrange(1 << 31), timeout)
            outcome = answer["outcome"]
            report.cases += 1
            report.counts[outcome] += 1
            report.by_model[name] += 1
            report.by_mutation.setdefault(kind, Counter())[outcome] += 1
            if outcome == "error":
                report.error_types[answer["type"]] += 1
                report.error_examples.setdefault(answer["type"], f"{name} [{what}]: {answer.get('message', '')}")
            elif outcome != "ok":
                if outcome == "raw":
                    report.raw_types[answer["type"]] += 1
                sample = {"model": name, "mutation": what, "case": i, **answer}
                if save_dir is not None:
                    save_dir.mkdir(parents=True, exist_ok=True)
                    out = save_dir / f"{outcome}-{i:06d}-{name}.tflite"
                    out.write_bytes(mutated)
                    sample["file"] = str(out)
                report.samples.append(sample)
    finally:
        worker.kill()
    report.seconds = time.monotonic() - start
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry point; exit status 1 when any case was a raw exception, crash or hang."""
    ap = argparse.ArgumentParser(prog="python -m litegpu.testing.mutation", description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS),
                    help="comma-separated model names (in --models-dir) or paths; 'all': every shared model, "
                         "weighted by size")
    ap.add_argument("--models-dir", type=Path, default=DEFAULT_MODELS_DIR)
    ap.add_argument("--timeout", type=float, default=20.0, help="seconds per case before it is a hang")
    ap.add_argument("--memory-limit", type=int, default=4 << 30, help="worker RLIMIT_AS in bytes (0: none)")
    ap.add_argument("--max-while", type=int, default=100_000, help="WHILE iteration limit for the runtime")
    ap.add_argument("--save", type=Path, default=None, help="directory for the bytes of failing cases")
    ap.add_argument("--kinds", default=",".join(MUTATIONS),
                    help=f"comma-separated mutation kinds (default: all of {','.join(MUTATIONS)})")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        worker_main(args.memory_limit, args.max_while)
        return 0
    models = resolve_models([m for m in args.models.split(",") if m], args.models_dir)
    weights = size_weights(models) if args.models == "all" else None
    report = run_mutations(models, args.cases, args.seed, args.timeout, args.memory_limit, args.max_while,
                           args.save, weights=weights, kinds=[k for k in args.kinds.split(",") if k])
    print(json.dumps(report.to_json(), indent=1) if args.json else report.summary())
    return 1 if report.bad else 0


if __name__ == "__main__":
    sys.exit(main())
