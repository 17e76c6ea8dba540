"""Coverage-guided fuzzing of the model reader and the planner, with atheris (libFuzzer).

Where :mod:`litegpu.testing.mutation` applies hand-written, field-aware mutations,
this harness lets libFuzzer mutate ``.tflite`` bytes guided by the lines of litegpu
they reach. Each input is read (:func:`litegpu.model.load_model`) and, when it reads,
planned: ``Interpreter(model_content=...)`` on the cpu backend infers every shape,
folds constants, assigns nodes to backends and compiles, then ``allocate_tensors()``
plans memory. Nothing is invoked, which keeps one input to milliseconds.

A finding is any exception that is not a :class:`litegpu.LiteGpuError`, and any input
that runs longer than the per-input timeout (libFuzzer's ``-timeout``). Both are
saved as files by libFuzzer (``crash-*``, ``timeout-*``); with ``--keep-going`` raw
exceptions are written to ``--findings`` instead, one file per distinct place, and
the run goes on.

The corpus is built at run time, never stored in the repository: the shared models up
to ``--max-seed-bytes``, the real models of :mod:`litegpu.testing.realmodels` that are
already in the local cache (never downloaded for this), a few builder models for what
neither has (weight-only DEQUANTIZE), and the one-op models of every conformance case::

    python -m litegpu.testing.fuzz --build-corpus /tmp/fuzz-corpus
    python -m litegpu.testing.fuzz --corpus /tmp/fuzz-corpus --seconds 600
    python -m litegpu.testing.fuzz --corpus /tmp/fuzz-corpus --runs 500   # a short smoke run

Arguments after ``--`` go to libFuzzer unchanged (e.g. ``-- -jobs=2``).
"""
from __future__ import annotations

import argparse
import gc
import hashlib
import json
import sys
import traceback
import types
from pathlib import Path
from typing import Iterator, Sequence

from .mutation import DEFAULT_MODELS_DIR

# The shared models bigger than this are left out of the corpus: libFuzzer's cost per
# input grows with its size, and their structure (conv stacks) is in the small ones.
MAX_SEED_BYTES = 1_500_000
# The planner's memory limit for one input: far below the fuzzer's RSS limit, so an
# input asking for more is a clean ResourceLimitError rather than an out-of-memory kill.
PLAN_MAX_BYTES = 256 << 20
# Modules whose code is instrumented for coverage (the reader, the planner, the ops'
# shape inference and the cpu backend's compile step).
INSTRUMENTED = ("litegpu", "litegpu_cpu")


# ---------------------------------------------------------------------------------------------
# The corpus.
# ---------------------------------------------------------------------------------------------
def seed_models(models_dir: Path = DEFAULT_MODELS_DIR, max_bytes: int = MAX_SEED_BYTES) -> Iterator[tuple[str, bytes]]:
    """``(name, bytes)`` of every seed: small shared models, cached real models, builder
    models, then each conformance case's model."""
    if models_dir.is_dir():
        for path in sorted(models_dir.glob("*.tflite")):
            if path.stat().st_size <= max_bytes:
                yield path.stem, path.read_bytes()
    yield from _cached_real_models(max_bytes)
    yield from _builder_models()
    from .cases import all_cases

    for case in all_cases():
        data, _ = case.build()
        yield f"case-{case.id}", bytes(data)


def _cached_real_models(max_bytes: int) -> Iterator[tuple[str, bytes]]:
    """The catalog's real models that are already fetched (sparse and fp16 weights among them)."""
    from . import realmodels

    root = realmodels.cache_dir()
    for name, m in realmodels.REAL_MODELS.items():
        if m.size <= max_bytes and realmodels._model_path(m, root).is_file():
            try:
                yield f"real-{name}", realmodels.fetch(name, root=root).read_bytes()
            except realmodels.FetchError:
                continue  # a corrupted cache entry would need the network to repair: skip it


def _builder_models() -> Iterator[tuple[str, bytes]]:
    """Small models for reader paths the other seeds may miss: weights behind DEQUANTIZE."""
    import numpy as np

    from .builder import ModelBuilder

    rng = np.random.default_rng(0)
    # fp16 weights, dequantized at load time, into FULLY_CONNECTED.
    b = ModelBuilder()
    x = b.input("x", (2, 8), np.float32)
    w16 = b.const("w16", rng.standard_normal((4, 8)), np.float16)
    w = b.tensor("w", (4, 8), np.float32)
    b.op("DEQUANTIZE", [w16], [w])
    y = b.tensor("y", (2, 4), np.float32)
    b.op("FULLY_CONNECTED", [x, w, -1], [y])
    b.output(y)
    yield "builder-fp16-weights", b.build()
    # Per-channel int8 weights (one scale per output channel) into CONV_2D.
    b = ModelBuilder()
    x = b.input("x", (1, 6, 6, 3), np.float32)
    w8 = b.const("w8", rng.integers(-127, 128, (4, 3, 3, 3)), np.int8, scale=[0.01, 0.02, 0.03, 0.04],
                 zero_point=[0, 0, 0, 0], quantized_dimension=0)
    w = b.tensor("w", (4, 3, 3, 3), np.float32)
    b.op("DEQUANTIZE", [w8], [w])
    y = b.tensor("y", (1, 6, 6, 4), np.float32)
    b.op("CONV_2D", [x, w, b.const("bias", np.zeros(4, np.float32))], [y], padding="SAME", stride_w=1,
         stride_h=1)
    b.output(y)
    yield "builder-int8-weights", b.build()


def build_corpus(out_dir: Path, models_dir: Path = DEFAULT_MODELS_DIR, max_bytes: int = MAX_SEED_BYTES) -> int:
    """Write the seeds into ``out_dir`` (named by content hash, as libFuzzer names its finds).

    Returns how many distinct files were written.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    names = set()
    for _, data in seed_models(models_dir, max_bytes):
        name = hashlib.sha1(data).hexdigest()
        if name not in names:
            (out_dir / name).write_bytes(data)
            names.add(name)
    return len(names)


# ---------------------------------------------------------------------------------------------
# The target.
# ---------------------------------------------------------------------------------------------
def plan(data: bytes) -> None:
    """Read and plan ``data`` on cpu; a :class:`litegpu.LiteGpuError` is a clean refusal."""
    import litegpu
    from litegpu.executor import Limits

    model = litegpu.load_model(data)
    it = litegpu.Interpreter(model_content=data, experimental_delegates=[litegpu.load_delegate("cpu")],
                             num_threads=1, limits=Limits(max_bytes=PLAN_MAX_BYTES))
    it.allocate_tensors()
    # The details the API derives from the plan (shapes of dynamic tensors, names).
    it.get_input_details()
    it.get_output_details()
    assert len(it.get_tensor_details()) == len(model.subgraphs[0].tensors)


def check_one(data: bytes) -> None:
    """The fuzz target: returns on success or a clean error, raises anything else."""
    from litegpu import LiteGpuError

    try:
        plan(data)
    except LiteGpuError:
        pass


class _Findings:
    """Raw exceptions of a ``--keep-going`` run, one file pair per distinct raising place."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.seen: set[str] = set()

    def record(self, data: bytes, exc: BaseException) -> None:
        """Save ``data`` and the exception, unless one was already saved for the same place."""
        frames = traceback.extract_tb(exc.__traceback__)
        where = [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in frames[-4:]]
        key = hashlib.sha1(f"{type(exc).__name__} {where[-1:]}".encode()).hexdigest()[:12]
        if key in self.seen:
            return
        self.seen.add(key)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        (self.out_dir / f"raw-{key}.tflite").write_bytes(data)
        info = {"type": type(exc).__name__, "message": str(exc)[:500], "where": where}
        (self.out_dir / f"raw-{key}.json").write_text(json.dumps(info, indent=1) + "\n")
        print(f"FINDING raw-{key}: {type(exc).__name__}: {str(exc)[:200]} at {' <- '.join(reversed(where))}",
              file=sys.stderr, flush=True)


def _target(findings: _Findings | None):
    """libFuzzer's callback: :func:`check_one`, its raw exceptions recorded when ``findings`` is given."""
    def one_input(data: bytes) -> None:
        if findings is None:
            check_one(data)
            return
        try:
            check_one(data)
        except Exception as exc:  # noqa: BLE001 — every non-litegpu exception is a finding
            findings.record(data, exc)
    return one_input


def _warm_up(seeds: int = 40) -> None:
    """Import every module the target may reach and plan a few conformance models.

    Only functions loaded when :func:`_instrument_loaded` runs get coverage hooks; a
    corpus of libFuzzer's finds may start with inputs too broken to reach the planner,
    so the modules are imported explicitly. Planning real models first also keeps
    one-time costs (plugin discovery, kernel caches) out of the first inputs' times.
    """
    import importlib
    import pkgutil

    import litegpu
    import litegpu_cpu

    for package in (litegpu, litegpu_cpu):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if info.name.split(".")[-1] in ("ray", "dask", "pytest_plugin", "conformance_suite"):
                continue  # optional extras and test-only modules
            try:
                importlib.import_module(info.name)
            except ImportError:
                pass  # an optional dependency is missing: that module is never reached
    from .cases import all_cases

    for case in all_cases()[:: max(1, len(all_cases()) // seeds)]:
        check_one(case.build()[0])


def _instrument_loaded(prefixes: Sequence[str] = INSTRUMENTED) -> int:
    """Add atheris's coverage hooks to every loaded function of the ``prefixes`` packages.

    ``python -m litegpu.testing.fuzz`` has imported litegpu before any code of ours
    runs, so ``atheris.instrument_imports`` would come too late; the functions are
    patched in place instead, after :func:`_warm_up` has imported every module.
    """
    import atheris

    count = 0
    for obj in gc.get_objects():
        if not isinstance(obj, types.FunctionType):
            continue
        module = getattr(obj, "__module__", None) or ""
        if module.split(".")[0] not in prefixes or module == __name__:
            continue
        try:
            atheris.instrument_func(obj)
            count += 1
        except Exception:  # noqa: BLE001 — a function atheris cannot patch is left uninstrumented
            pass
    return count


# ---------------------------------------------------------------------------------------------
# Command line.
# ---------------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    """Build a corpus, or fuzz over one; returns the exit status (libFuzzer's, on a finding)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    ap = argparse.ArgumentParser(prog="python -m litegpu.testing.fuzz", description=__doc__.split("\n")[0])
    ap.add_argument("--build-corpus", type=Path, metavar="DIR", help="write the seed corpus to DIR and exit")
    ap.add_argument("--corpus", type=Path, metavar="DIR",
                    help="corpus directory (built first when empty or missing); libFuzzer adds its finds")
    ap.add_argument("--models-dir", type=Path, default=DEFAULT_MODELS_DIR)
    ap.add_argument("--max-seed-bytes", type=int, default=MAX_SEED_BYTES)
    ap.add_argument("--seconds", type=int, default=0, help="stop after this many seconds (0: no limit)")
    ap.add_argument("--runs", type=int, default=-1, help="stop after this many inputs (-1: no limit)")
    ap.add_argument("--timeout", type=int, default=20, help="seconds one input may take before it is a hang")
    ap.add_argument("--rss-limit-mb", type=int, default=3072)
    ap.add_argument("--keep-going", action="store_true",
                    help="record raw exceptions under --findings and go on, instead of stopping at the first")
    ap.add_argument("--findings", type=Path, default=Path("fuzz-findings"),
                    help="where raw exceptions and libFuzzer's crash/timeout files go")
    ap.add_argument("--seed", type=int, default=0, help="libFuzzer's random seed (0: from the clock)")
    args = ap.parse_args(argv)

    if args.build_corpus is not None:
        n = build_corpus(args.build_corpus, args.models_dir, args.max_seed_bytes)
        print(f"{n} seed files in {args.build_corpus}")
        return 0
    if args.corpus is None:
        ap.error("pass --corpus DIR (or --build-corpus DIR)")
    if not args.corpus.is_dir() or not any(args.corpus.iterdir()):
        n = build_corpus(args.corpus, args.models_dir, args.max_seed_bytes)
        print(f"built the corpus: {n} seed files in {args.corpus}", file=sys.stderr)

    import atheris

    largest = max(p.stat().st_size for p in args.corpus.iterdir() if p.is_file())
    _warm_up()
    count = _instrument_loaded()
    print(f"instrumented {count} functions of {', '.join(INSTRUMENTED)}", file=sys.stderr)

    args.findings.mkdir(parents=True, exist_ok=True)
    libfuzzer = [f"-timeout={args.timeout}", f"-rss_limit_mb={args.rss_limit_mb}", f"-max_len={largest}",
                 f"-artifact_prefix={args.findings}/", f"-runs={args.runs}", "-print_final_stats=1"]
    if args.seconds:
        libfuzzer.append(f"-max_total_time={args.seconds}")
    if args.seed:
        libfuzzer.append(f"-seed={args.seed}")
    findings = _Findings(args.findings) if args.keep_going else None
    atheris.Setup([sys.argv[0], *libfuzzer, *extra, str(args.corpus)], _target(findings))
    atheris.Fuzz()  # exits the process when done
    return 0


if __name__ == "__main__":
    sys.exit(main())
