"""A campaign of robustness probes: races, hostile caches, NaN/inf inputs, repeatability.

usage: python benchmarks/trust_campaign.py [--probes NAME ...] [--backends NAME ...]
                                           [--runs N] [--markdown] [--timeout S]

Every probe runs in fresh Python processes (this file, ``--worker NAME``), each with its
own environment: ``LITEGPU_CACHE_DIR`` and ``XDG_CACHE_HOME`` in a new temp dir,
``POCL_CACHE_DIR`` and ``NUMBA_CACHE_DIR`` unset unless the probe sets them. So a crash or
a hang is counted, not fatal. The worker prints one JSON line of counts; this process
classifies how it ended: killed by a signal = crash, past ``--timeout`` = hang (its
process group is killed), an exit without a result line = a raw exception.

Columns: ``runs`` counts worker processes that ran the experiment (warm-up and reference
processes are setup and are not counted; a setup that fails makes the run "not run");
``crashes`` and ``hangs`` count processes; ``wrong``, ``raw exc``, ``clean err`` and
``ok`` count events inside the processes that finished, in the unit the notes name
(a set->invoke->get sequence, a thread, an invoke ...). ``clean err`` is an exception
that is a ``litegpu.errors.LiteGpuError``; ``raw exc`` is any other exception (named by
class in the notes). "wrong" compares with a tolerance (rtol 1e-4, atol 1e-4 x the
reference's largest magnitude, same NaN positions); answers that are close but not
bit-identical are noted, not counted as wrong (``repeat-bitwise`` is the bitwise probe).

The script imports nothing from litegpu but ``litegpu.errors.LiteGpuError`` and the
public API (Interpreter, load_delegate, CompiledModel, TensorBuffer), so it runs the
same against older versions (e.g. ``PYTHONPATH=<old tree> python benchmarks/trust_campaign.py``).
The cache probes use mounts (a read-only bind mount, a 64 KiB tmpfs), which need root;
where a mount is refused the probe is reported as "not run: <reason>". ``--help`` lists
the probes.
"""
from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

log = logging.getLogger("trust_campaign")

DEFAULT_MODELS = Path(__file__).resolve().parents[2] / "shared" / "models"
RESULT_KEY = "trust_campaign_result"
VOCAB = 1000          # int32 inputs of the models here are token ids (tiny_bert, lstm_classifier)


# ======================================================================================
# worker side (runs in the child process)
# ======================================================================================

class Tally:
    """Thread-safe event counts of one worker process."""

    def __init__(self, unit: str) -> None:
        self.unit = unit
        self.counts = {"ok": 0, "wrong": 0, "raw": 0, "clean": 0}
        self.errors: collections.Counter = collections.Counter()
        self.notes: collections.Counter = collections.Counter()
        self.info: dict = {}
        self._lock = threading.Lock()

    def add(self, what: str, note: str | None = None) -> None:
        with self._lock:
            self.counts[what] += 1
            if note:
                self.notes[note] += 1

    def error(self, exc: BaseException) -> None:
        from litegpu.errors import LiteGpuError
        kind = "clean" if isinstance(exc, LiteGpuError) else "raw"
        msg = (str(exc).strip().splitlines() or [""])[0][:140]
        with self._lock:
            self.counts[kind] += 1
            self.errors[f"{kind}: {type(exc).__name__}: {msg}"] += 1

    def result(self) -> dict:
        return {**self.counts, "unit": self.unit, "errors": dict(self.errors), "notes": dict(self.notes),
                "info": self.info}


def _model(params: dict) -> str:
    return str(Path(params["models_dir"]) / f"{params['model']}.tflite")


def _interpreter(params: dict, path: str | None = None):
    import litegpu
    delegates = [litegpu.load_delegate("opencl")] if params["backend"] == "opencl" else []
    return litegpu.Interpreter(model_path=path or _model(params), experimental_delegates=delegates, num_threads=2)


def _random(shape, dtype, rng: np.random.Generator) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        return rng.integers(0, VOCAB, size=shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _inputs(details: list[dict], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [_random(tuple(d["shape"]), d["dtype"], rng) for d in details]


def _run(interp, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """set_tensor every input, invoke, get_tensor every output (copies)."""
    for d, x in zip(interp.get_input_details(), inputs):
        interp.set_tensor(d["index"], x)
    interp.invoke()
    return [np.array(interp.get_tensor(d["index"]), copy=True) for d in interp.get_output_details()]


def close(a: np.ndarray, b: np.ndarray) -> bool:
    """``a`` matches reference ``b``: same shape and dtype, same NaN positions, the rest
    within rtol 1e-4 and atol 1e-4 x max(1, largest finite |b|); integers exactly."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.kind != "f":
        return bool(np.array_equal(a, b))
    na, nb = np.isnan(a), np.isnan(b)
    if not np.array_equal(na, nb):
        return False
    a, b = a[~na].astype(np.float64), b[~nb].astype(np.float64)
    finite = b[np.isfinite(b)]
    scale = max(1.0, float(np.max(np.abs(finite)))) if finite.size else 1.0
    return bool(np.allclose(a, b, rtol=1e-4, atol=1e-4 * scale))


def all_close(outs, refs) -> bool:
    return len(outs) == len(refs) and all(close(a, b) for a, b in zip(outs, refs))


def bit_equal(outs, refs) -> bool:
    return len(outs) == len(refs) and all(
        a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes() for a, b in zip(outs, refs))


def _judge(tally: Tally, outs, ref) -> None:
    if not all_close(outs, ref):
        tally.add("wrong")
    elif not bit_equal(outs, ref):
        tally.add("ok", "close but not bit-identical")
    else:
        tally.add("ok")


def w_preflight(params: dict, tally: Tally) -> None:
    import litegpu
    tally.info["litegpu"] = os.path.dirname(litegpu.__file__)
    tally.info["version"] = getattr(litegpu, "__version__", "?")
    if params.get("backend") == "opencl":
        try:
            litegpu.load_delegate("opencl")
        except Exception as exc:    # noqa: BLE001 - reported as the reason
            tally.info["unavailable"] = f"{type(exc).__name__}: {exc}"


def w_shared_interpreter(params: dict, tally: Tally) -> None:
    """Threads share one Interpreter without a lock; each loops set->invoke->get on its own input."""
    interp = _interpreter(params)
    interp.allocate_tensors()
    n_threads, iters = params["threads"], params["iters"]
    inputs = [_inputs(interp.get_input_details(), params["seed"] * 100 + i) for i in range(n_threads)]
    answers = [_run(interp, x) for x in inputs]     # serially, before any thread starts
    barrier = threading.Barrier(n_threads)

    def loop(i: int) -> None:
        barrier.wait()
        for _ in range(iters):
            try:
                outs = _run(interp, inputs[i])
            except Exception as exc:    # noqa: BLE001 - counted
                tally.error(exc)
                continue
            if all_close(outs, answers[i]):
                tally.add("ok")
            elif any(all_close(outs, answers[j]) for j in range(n_threads) if j != i):
                tally.add("ok", "another thread's whole answer (the callers' own race)")
            else:
                tally.add("wrong")

    _threads(loop, n_threads)


def _threads(fn, n: int) -> None:
    threads = [threading.Thread(target=fn, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def w_run_async_threads(params: dict, tally: Tally) -> None:
    """Threads share one CompiledModel; each runs run_async twice, then reads both outputs."""
    import litegpu
    cm = litegpu.CompiledModel.from_file(_model(params), backend=params["backend"])
    n_threads, iters = params["threads"], params["iters"]

    def sentinel(i: int, bufs) -> list[np.ndarray]:
        rng = np.random.default_rng(params["seed"] * 100 + i)
        return [_random(tuple(b.get_tensor_details()["shape"]), b.get_tensor_details()["dtype"], rng) for b in bufs]

    answers = []
    for i in range(n_threads):      # serially, before any thread starts
        ins, outs = cm.create_input_buffers(0), cm.create_output_buffers(0)
        for b, x in zip(ins, sentinel(i, ins)):
            b.write(x)
        cm.run_by_index(0, ins, outs)
        answers.append([np.array(b.array, copy=True) for b in outs])
    barrier = threading.Barrier(n_threads)

    def outputs(host: bool):
        if not host:
            return cm.create_output_buffers(0)
        return [litegpu.TensorBuffer.create_from_host_memory(np.zeros(a.shape, a.dtype)) for a in answers[0]]

    def loop(i: int) -> None:
        try:
            ins = cm.create_input_buffers(0)
            xs = sentinel(i, ins)
        except Exception as exc:    # noqa: BLE001
            tally.error(exc)
            return
        finally:
            barrier.wait()
        for k in range(iters):
            try:
                for b, x in zip(ins, xs):
                    b.write(x)
                host = k % 2 == 0
                outs_a, outs_b = outputs(host), outputs(host)
                cm.run_async(0, ins, outs_a)
                cm.run_async(0, ins, outs_b)
                got = [[np.array(b.array, copy=True) for b in outs] for outs in (outs_a, outs_b)]
            except Exception as exc:    # noqa: BLE001
                tally.error(exc)
                continue
            if all(all_close(g, answers[i]) for g in got):
                tally.add("ok")
            else:
                tally.add("wrong", "host output buffers" if host else "create_output_buffers")

    _threads(loop, n_threads)


def w_cold_cache_threads(params: dict, tally: Tally) -> None:
    """Threads each construct an Interpreter, allocate and invoke at once, on an empty cache."""
    n = params["threads"]
    barrier = threading.Barrier(n)
    results: list = [None] * n

    def one(i: int) -> None:
        barrier.wait()
        try:
            interp = _interpreter(params)
            interp.allocate_tensors()
            results[i] = _run(interp, _inputs(interp.get_input_details(), params["seed"]))
        except Exception as exc:    # noqa: BLE001
            tally.error(exc)

    _threads(one, n)
    done = [r for r in results if r is not None]
    if not done:
        return
    ref = results[0]
    if ref is None:
        ref = done[0]
        tally.notes["thread 0 failed: compared with the first thread that finished"] += 1
    for r in done:
        _judge(tally, r, ref)


def w_single(params: dict, tally: Tally) -> None:
    """One Interpreter: allocate, invoke on a seeded input; compared with ``params['ref']`` if
    given, saved to ``params['save']`` if given. Time to first result from this function's start."""
    start = params["_t0"]
    interp = _interpreter(params)
    interp.allocate_tensors()
    outs = _run(interp, _inputs(interp.get_input_details(), params["seed"]))
    tally.info["first_result_s"] = time.perf_counter() - start
    if params.get("save"):
        np.savez(params["save"], *outs)
    if params.get("ref"):
        with np.load(params["ref"]) as f:
            ref = [f[k] for k in f.files]
        _judge(tally, outs, ref)
    else:
        tally.add("ok")


def w_nan_input(params: dict, tally: Tally) -> None:
    """One NaN (and separately +inf) at element size//3 of a random input: NaN positions vs LiteRT."""
    try:
        from ai_edge_litert.interpreter import Interpreter as LiteRT
        oracle = LiteRT(model_path=_model(params), num_threads=2)
        oracle.allocate_tensors()
    except Exception as exc:    # noqa: BLE001 - the oracle is not the subject
        tally.info["not_run"] = f"LiteRT oracle unavailable: {type(exc).__name__}: {exc}"
        return
    cases = {}
    for kind, value in (("nan", np.nan), ("inf", np.inf)):
        x = _inputs(oracle.get_input_details(), params["seed"])
        flat = x[0].reshape(-1)
        flat[flat.size // 3] = value
        cases[kind] = (x, _run(oracle, x))
    interp = _interpreter(params)
    interp.allocate_tensors()
    for kind, (x, ref) in cases.items():
        try:
            outs = _run(interp, x)
        except Exception as exc:    # noqa: BLE001
            tally.error(exc)
            continue
        same = len(outs) == len(ref) and all(
            a.shape == b.shape and np.array_equal(np.isnan(a), np.isnan(b)) for a, b in zip(outs, ref))
        if same:
            tally.add("ok")
        else:
            lg = sum(int(np.isnan(a).sum()) for a in outs)
            lr = sum(int(np.isnan(b).sum()) for b in ref)
            size = sum(b.size for b in ref)
            tally.add("wrong", f"{kind}: {lg} NaN vs LiteRT's {lr} (of {size})")


def w_repeat_bitwise(params: dict, tally: Tally) -> None:
    """Five invokes on one input; each later invoke's output bits vs the first's."""
    interp = _interpreter(params)
    interp.allocate_tensors()
    x = _inputs(interp.get_input_details(), params["seed"])
    for d, a in zip(interp.get_input_details(), x):
        interp.set_tensor(d["index"], a)
    first = None
    for _ in range(params["invokes"]):
        try:
            interp.invoke()
            outs = [np.array(interp.get_tensor(d["index"]), copy=True) for d in interp.get_output_details()]
        except Exception as exc:    # noqa: BLE001
            tally.error(exc)
            continue
        if first is None:
            first = outs
        elif bit_equal(outs, first):
            tally.add("ok")
        else:
            tally.add("wrong", "bits differ" + ("" if all_close(outs, first) else " beyond tolerance"))


WORKERS = {
    "preflight": (w_preflight, "process"),
    "shared-interpreter": (w_shared_interpreter, "sequence"),
    "run-async-threads": (w_run_async_threads, "iteration (2 runs)"),
    "cold-cache-threads": (w_cold_cache_threads, "thread"),
    "single": (w_single, "process"),
    "nan-input": (w_nan_input, "input (nan, inf)"),
    "repeat-bitwise": (w_repeat_bitwise, "invoke after the 1st"),
}


def worker_main(name: str, params: dict) -> int:
    params["_t0"] = time.perf_counter()
    fn, unit = WORKERS[name]
    tally = Tally(unit)
    try:
        fn(params, tally)
    except Exception as exc:    # noqa: BLE001 - a setup step failed: one event
        tally.error(exc)
    sys.stdout.flush()
    print(json.dumps({RESULT_KEY: tally.result()}), flush=True)
    return 0


# ======================================================================================
# campaign side (the parent process)
# ======================================================================================

@dataclass
class Proc:
    status: str             # done | crash | hang | noresult
    result: dict | None
    returncode: int | None
    wall: float
    stderr_tail: str


@dataclass
class Row:
    probe: str
    backend: str
    model: str
    runs: int = 0
    crashes: int = 0
    hangs: int = 0
    wrong: int = 0
    raw: int = 0
    clean: int = 0
    ok: int = 0
    unit: str = ""
    notes: collections.Counter = field(default_factory=collections.Counter)
    info: list[str] = field(default_factory=list)

    def note(self, text: str, n: int = 1) -> None:
        self.notes[text] += n


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:160] if lines else "(no stderr)"


class Campaign:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rows: dict[tuple[str, str, str], Row] = {}
        self.refs: dict[tuple[str, str, int], Path] = {}
        self.scratch = Path(tempfile.mkdtemp(prefix="trust-campaign-"))
        self.unavailable: dict[str, str] = {}
        self.litegpu_where = "?"

    # -- plumbing ------------------------------------------------------------------------
    def row(self, probe: str, backend: str, model: str) -> Row:
        key = (probe, backend, model)
        if key not in self.rows:
            self.rows[key] = Row(probe, backend, model)
        return self.rows[key]

    def tempdir(self, tag: str) -> Path:
        return Path(tempfile.mkdtemp(prefix=f"{tag}-", dir=self.scratch))

    def env(self, root: Path, litegpu_cache: str | None = None, pocl: str | None = None) -> dict:
        env = dict(os.environ)
        env["LITEGPU_CACHE_DIR"] = litegpu_cache or str(root / "cache" / "litegpu")
        env["XDG_CACHE_HOME"] = str(root / "cache" / "xdg")
        (root / "cache" / "xdg").mkdir(parents=True, exist_ok=True)
        env.pop("POCL_CACHE_DIR", None)
        env.pop("NUMBA_CACHE_DIR", None)
        if pocl:
            env["POCL_CACHE_DIR"] = pocl
        return env

    def params(self, backend: str, model: str = "", **extra) -> dict:
        return {"backend": backend, "model": model, "models_dir": str(self.args.models_dir),
                "iters": self.args.iters, **extra}

    def spawn(self, worker: str, params: dict, env: dict, what: str) -> Proc:
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", worker, "--params", json.dumps(params)]
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=self.args.timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            out, err = proc.communicate()
            wall = time.perf_counter() - start
            log.info("  %s: HANG (killed after %.0f s)", what, wall)
            return Proc("hang", None, proc.returncode, wall, err)
        wall = time.perf_counter() - start
        result = None
        for line in reversed(out.splitlines()):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict) and RESULT_KEY in obj:
                result = obj[RESULT_KEY]
                break
        if proc.returncode < 0:
            status = "crash"
        elif result is None:
            status = "noresult"
        else:
            status = "done"
        if status == "done":
            log.info("  %s: %.1f s, %s", what, wall,
                     {k: result[k] for k in ("ok", "wrong", "raw", "clean") if result[k]} or "no events")
        else:
            log.info("  %s: %s (rc %s, %.1f s): %s", what, status.upper(), proc.returncode, wall, _last_line(err))
        return Proc(status, result, proc.returncode, wall, err)

    def count(self, row: Row, p: Proc) -> dict | None:
        """Add a counted process to ``row``; the worker's result when it finished."""
        row.runs += 1
        if p.status == "crash":
            row.crashes += 1
            try:
                sig = signal.Signals(-p.returncode).name
            except ValueError:
                sig = f"signal {-p.returncode}"
            row.note(f"crash {sig}: {_last_line(p.stderr_tail)}")
            return None
        if p.status == "hang":
            row.hangs += 1
            row.note(f"hang: killed after {self.args.timeout:.0f} s")
            return None
        if p.status == "noresult":
            row.raw += 1
            row.note(f"exit {p.returncode} without a result: {_last_line(p.stderr_tail)}")
            return None
        r = p.result
        if r["info"].get("not_run"):
            row.runs -= 1
            row.note(f"not run: {r['info']['not_run']}")
            return r
        row.unit = r["unit"]
        for k in ("ok", "wrong", "raw", "clean"):
            setattr(row, k, getattr(row, k) + r[k])
        for text, n in {**r["errors"], **r["notes"]}.items():
            row.note(text, n)
        return r

    def setup_failed(self, row: Row, what: str, p: Proc) -> bool:
        """True (and a "not run" note) when a setup process did not finish cleanly."""
        if p.status == "done" and not (p.result["raw"] or p.result["clean"] or p.result["wrong"]):
            return False
        detail = p.status if p.status != "done" else "; ".join(p.result["errors"]) or "wrong"
        if p.status == "crash":
            detail = f"crash (rc {p.returncode}): {_last_line(p.stderr_tail)}"
        elif p.status in ("hang", "noresult"):
            detail = f"{p.status}: {_last_line(p.stderr_tail)}"
        row.note(f"not run: {what} failed: {detail}")
        return True

    def available(self, row: Row) -> bool:
        if row.backend in self.unavailable:
            row.note(f"not run: {row.backend} unavailable: {self.unavailable[row.backend]}")
            return False
        return True

    def preflight(self, backends: set[str]) -> None:
        for backend in sorted(backends):
            root = self.tempdir("preflight")
            p = self.spawn("preflight", self.params(backend), self.env(root), f"preflight {backend}")
            if p.status != "done":
                self.unavailable[backend] = f"preflight {p.status}: {_last_line(p.stderr_tail)}"
                continue
            info = p.result["info"]
            if p.result["raw"] or p.result["clean"]:
                self.unavailable[backend] = "; ".join(p.result["errors"])
            elif info.get("unavailable"):
                self.unavailable[backend] = info["unavailable"]
            self.litegpu_where = f"{info.get('litegpu')} (version {info.get('version')})"

    def reference(self, backend: str, model: str, seed: int, row: Row) -> Path | None:
        """A normal run's outputs (fresh writable cache) for ``w_single``'s seeded input."""
        key = (backend, model, seed)
        if key not in self.refs:
            root = self.tempdir("ref")
            save = root / "ref.npz"
            p = self.spawn("single", self.params(backend, model, seed=seed, save=str(save)), self.env(root),
                           f"reference {backend} {model}")
            if self.setup_failed(row, "reference run", p):
                return None
            self.refs[key] = save
        return self.refs[key]

    # -- probes ----------------------------------------------------------------------------
    def p_shared_interpreter(self, backend: str, model: str, rep: int) -> None:
        row = self.row("shared-interpreter", backend, model)
        root = self.tempdir("shared")
        p = self.spawn("shared-interpreter", self.params(backend, model, seed=rep, threads=2), self.env(root),
                       f"shared-interpreter {backend} {model}")
        self.count(row, p)

    def p_run_async_threads(self, backend: str, model: str, rep: int) -> None:
        row = self.row("run-async-threads", backend, model)
        root = self.tempdir("async")
        p = self.spawn("run-async-threads", self.params(backend, model, seed=rep, threads=4), self.env(root),
                       f"run-async-threads {backend} {model}")
        self.count(row, p)

    def p_cold_cache_threads(self, backend: str, model: str, rep: int) -> None:
        row = self.row("cold-cache-threads", backend, model)
        root = self.tempdir("cold")
        p = self.spawn("cold-cache-threads", self.params(backend, model, seed=rep, threads=16), self.env(root),
                       f"cold-cache-threads {backend} {model}")
        self.count(row, p)

    def p_readonly_warm_cache(self, backend: str, model: str, rep: int) -> None:
        row = self.row("readonly-warm-cache", backend, model)
        root = self.tempdir("readonly")
        env = self.env(root)
        cache = root / "cache"
        warm = root / "warm.npz"
        p = self.spawn("single", self.params(backend, model, seed=rep, save=str(warm)), env,
                       f"readonly-warm-cache {backend} {model}: warm-up (cold)")
        if self.setup_failed(row, "warm-up", p):
            return
        self.refs.setdefault((backend, model, rep), warm)
        base = self.spawn("single", self.params(backend, model, seed=rep, ref=str(warm)), env,
                          f"readonly-warm-cache {backend} {model}: warm, writable (timing baseline)")
        base_s = base.result["info"].get("first_result_s") if base.status == "done" else None
        mounted = False
        try:
            err = _mount(["mount", "--bind", str(cache), str(cache)])
            if err:
                row.note(f"not run: bind mount refused: {err}")
                return
            mounted = True
            err = _mount(["mount", "-o", "remount,bind,ro", str(cache)])
            if err:
                row.note(f"not run: read-only remount refused: {err}")
                return
            if _writable(cache):
                row.note("not run: the read-only mount is still writable")
                return
            p = self.spawn("single", self.params(backend, model, seed=rep, ref=str(warm)), env,
                           f"readonly-warm-cache {backend} {model}: read-only")
            r = self.count(row, p)
            if r is not None and "first_result_s" in r["info"]:
                row.info.append(f"read-only: first result {r['info']['first_result_s']:.2f} s "
                                f"(process {p.wall:.2f} s)"
                                + (f"; writable warm: {base_s:.2f} s (process {base.wall:.2f} s)"
                                   if base_s is not None else "; writable warm baseline failed"))
        finally:
            if mounted:
                err = _mount(["umount", str(cache)])
                if err:
                    log.error("could not unmount %s: %s", cache, err)

    def p_cache_root_is_a_file(self, backend: str, model: str, rep: int) -> None:
        row = self.row("cache-root-is-a-file", backend, model)
        ref = self.reference(backend, model, rep, row)
        if ref is None:
            return
        root = self.tempdir("cachefile")
        path = root / "not-a-dir"
        path.write_text("this is a file, not a directory\n")
        p = self.spawn("single", self.params(backend, model, seed=rep, ref=str(ref)),
                       self.env(root, litegpu_cache=str(path)), f"cache-root-is-a-file {backend} {model}")
        self.count(row, p)

    def p_full_disk(self, backend: str, model: str, rep: int) -> None:
        row = self.row("full-disk", backend, model)
        ref = self.reference(backend, model, rep, row)
        if ref is None:
            return
        root = self.tempdir("fulldisk")
        disk = root / "tmpfs"
        disk.mkdir()
        err = _mount(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)])
        if err:
            row.note(f"not run: tmpfs mount refused: {err}")
            return
        try:
            p = self.spawn("single", self.params(backend, model, seed=rep, ref=str(ref)),
                           self.env(root, litegpu_cache=str(disk)), f"full-disk {backend} {model}")
            self.count(row, p)
            used = shutil.disk_usage(disk)
            row.info.append(f"tmpfs {used.used // 1024}/{used.total // 1024} KiB used after")
        finally:
            err = _mount(["umount", str(disk)])
            if err:
                log.error("could not unmount %s: %s", disk, err)

    def p_damaged_cache(self, backend: str, model: str, rep: int) -> None:
        self._damaged("damaged-cache", backend, model, rep, user_pocl=False)

    def p_damaged_user_pocl_cache(self, backend: str, model: str, rep: int) -> None:
        self._damaged("damaged-user-pocl-cache", backend, model, rep, user_pocl=True)

    def _damaged(self, probe: str, backend: str, model: str, rep: int, user_pocl: bool) -> None:
        row = self.row(probe, backend, model)
        root = self.tempdir("damaged")
        pocl = str(root / "pocl") if backend == "opencl" and user_pocl else None
        env = self.env(root, pocl=pocl)
        warm = root / "warm.npz"
        p = self.spawn("single", self.params(backend, model, seed=rep, save=str(warm)), env,
                       f"damaged-cache {backend} {model}: warm-up")
        if self.setup_failed(row, "warm-up", p):
            return
        lg_cache = Path(env["LITEGPU_CACHE_DIR"])
        if backend == "cpu":
            files = [f for pat in ("*.nbi", "*.nbc") for f in lg_cache.rglob(pat) if f.is_file()]
            what = {"numba *.nbi/*.nbc": len(files)}
        else:
            ours = [f for f in (lg_cache / "opencl").rglob("*") if f.is_file()]
            # PoCL's files wherever this run left them: the user's POCL_CACHE_DIR, else its
            # default place under XDG_CACHE_HOME (or litegpu's per-process scratch, gone at exit).
            places = [Path(pocl)] if pocl else [Path(env["XDG_CACHE_HOME"]), lg_cache / "pocl"]
            theirs = [f for place in places for f in place.rglob("*") if f.is_file()]
            files = ours + theirs
            what = {"litegpu opencl/": len(ours), "PoCL": len(theirs)}
        for f in files:
            os.truncate(f, f.stat().st_size // 2)
        row.info.append("truncated to half: " + ", ".join(f"{n} {k}" for k, n in what.items()))
        if not files:
            row.note("nothing to truncate: the damage is vacuous")
        for i in (1, 2):
            p = self.spawn("single", self.params(backend, model, seed=rep, ref=str(warm)), env,
                           f"damaged-cache {backend} {model}: damaged run {i}")
            self.count(row, p)

    def p_nan_input(self, backend: str, model: str, rep: int) -> None:
        row = self.row("nan-input", backend, model)
        root = self.tempdir("nan")
        p = self.spawn("nan-input", self.params(backend, model, seed=rep), self.env(root),
                       f"nan-input {backend} {model}")
        self.count(row, p)

    def p_repeat_bitwise(self, backend: str, model: str, rep: int) -> None:
        row = self.row("repeat-bitwise", backend, model)
        root = self.tempdir("repeat")
        p = self.spawn("repeat-bitwise", self.params(backend, model, seed=rep, invokes=5), self.env(root),
                       f"repeat-bitwise {backend} {model}")
        self.count(row, p)

    # -- driver ----------------------------------------------------------------------------
    def run(self, probes: list[str], backends: list[str]) -> None:
        plan = [(name, b, m) for name in probes for b in PROBES[name][1] if b in backends
                for m in PROBES[name][2]]
        self.preflight({b for _, b, _ in plan})
        for rep in range(self.args.runs):
            for name, backend, model in plan:
                row = self.row(name, backend, model)
                if not self.available(row):
                    continue
                log.info("[%d/%d] %s %s %s", rep + 1, self.args.runs, name, backend, model)
                getattr(self, "p_" + name.replace("-", "_"))(backend, model, rep)

    def close(self) -> None:
        if self.args.keep_temp:
            log.info("temp files kept in %s", self.scratch)
        else:
            shutil.rmtree(self.scratch, ignore_errors=True)


def _mount(cmd: list[str]) -> str | None:
    """Run a mount/umount command; None on success, else why not."""
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{' '.join(cmd[:2])}: {exc}"
    if res.returncode:
        return f"{' '.join(cmd[:2])} exit {res.returncode}: {_last_line(res.stderr)}"
    return None


def _writable(path: Path) -> bool:
    try:
        fd, name = tempfile.mkstemp(dir=path)
    except OSError:
        return False
    os.close(fd)
    os.unlink(name)
    return True


# name: (description, backends, models)
PROBES = {
    "shared-interpreter": ("2 threads share one Interpreter, no lock, 100x set->invoke->get each; ok = own "
                           "answer or another thread's whole answer", ("cpu", "opencl"), ("tiny_bert", "mobilenet_v2")),
    "run-async-threads": ("4 threads share one CompiledModel, 100x: write own input, run_async twice (host "
                          "output buffers every other time), read both", ("opencl", "cpu"), ("lstm_classifier",)),
    "cold-cache-threads": ("empty cache, 16 threads construct/allocate/invoke at once; vs thread 0",
                           ("cpu",), ("mobilenet_v3_small",)),
    "readonly-warm-cache": ("warm cache, then a read-only bind mount of it; vs the warm run; time to first result",
                            ("cpu", "opencl"), ("mobilenet_v3_small",)),
    "cache-root-is-a-file": ("LITEGPU_CACHE_DIR is a regular file; vs a normal run", ("cpu", "opencl"),
                             ("mobilenet_v3_small",)),
    "full-disk": ("LITEGPU_CACHE_DIR on a fresh 64 KiB tmpfs; vs a normal run", ("cpu", "opencl"),
                  ("mobilenet_v3_small",)),
    "damaged-cache": ("warm, truncate cache files to half (cpu: numba *.nbi/*.nbc; opencl: litegpu's kernel cache "
                      "and PoCL's files where PoCL keeps them by default), run twice; vs the warm run",
                      ("cpu", "opencl"), ("mobilenet_v3_small",)),
    "damaged-user-pocl-cache": ("as damaged-cache, with POCL_CACHE_DIR set by the user (litegpu uses it as it is)",
                                ("opencl",), ("mobilenet_v3_small",)),
    "nan-input": ("one NaN (and separately +inf) at element size//3; NaN positions vs LiteRT", ("cpu", "opencl"),
                  ("mobilenet_v2", "unet_small")),
    "repeat-bitwise": ("5 invokes on one input; output bits of invokes 2-5 vs the 1st", ("cpu", "opencl"),
                       ("lstm_classifier", "tiny_bert")),
}

COLUMNS = ("probe", "backend", "model", "runs", "crashes", "hangs", "wrong", "raw exc", "clean err", "ok", "notes")


def _notes(row: Row) -> str:
    parts = [f"unit: {row.unit}"] if row.unit else []
    parts += [f"{text} (x{n})" if n > 1 else text for text, n in row.notes.most_common()]
    parts += row.info
    return "; ".join(parts)


def table(rows: list[Row], markdown: bool) -> str:
    cells = [[r.probe, r.backend, r.model, str(r.runs), str(r.crashes), str(r.hangs), str(r.wrong), str(r.raw),
              str(r.clean), str(r.ok), _notes(r)] for r in rows]
    if markdown:
        esc = [[c.replace("|", "\\|") for c in row] for row in cells]
        lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "|".join("---" for _ in COLUMNS) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in esc]
        return "\n".join(lines)
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(COLUMNS[:-1])]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths) + "  {}"
    return "\n".join(fmt.format(*row) for row in [list(COLUMNS)] + cells)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="probes:\n" + "\n".join(f"  {n}: {d[0]} [{'/'.join(d[1])}; {', '.join(d[2])}]"
                                       for n, d in PROBES.items()),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--probes", nargs="+", choices=list(PROBES), default=list(PROBES), metavar="PROBE",
                    help="probes to run (default: all)")
    ap.add_argument("--backends", nargs="+", choices=("cpu", "opencl"), default=["cpu", "opencl"])
    ap.add_argument("--runs", type=int, default=1, help="repetitions of each probe (default 1)")
    ap.add_argument("--iters", type=int, default=100, help="loop iterations per thread in the thread probes")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds before a worker counts as a hang")
    ap.add_argument("--models-dir", type=Path, default=DEFAULT_MODELS)
    ap.add_argument("--markdown", action="store_true", help="print the table as markdown")
    ap.add_argument("--keep-temp", action="store_true", help="keep the temp dirs (caches, outputs)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--params", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker_main(args.worker, json.loads(args.params))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    campaign = Campaign(args)
    start = time.perf_counter()
    try:
        campaign.run(args.probes, args.backends)
    finally:
        campaign.close()
    log.info("campaign: %.0f s", time.perf_counter() - start)
    rows = list(campaign.rows.values())
    header = (f"litegpu: {campaign.litegpu_where}; python {sys.version.split()[0]}; runs per probe: {args.runs}; "
              f"timeout {args.timeout:.0f} s")
    print(header + "\n\n" + table(rows, args.markdown))
    return 0


if __name__ == "__main__":
    sys.exit(main())
