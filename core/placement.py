"""Placement by measurement: keep the fastest of a few assignments, never slower than all-cpu.

With ``placement="measure"`` a subgraph compiled with delegation is compiled several ways
and each is timed end to end (transfers included, since the whole subgraph runs) on
seeded inputs of the compiled shapes:

- first-that-supports (today's default placement),
- all-cpu,
- each device partition of the first moved to cpu alone, when there are several (which
  also merges the cpu partitions on both sides of it).

The fastest is kept. All-cpu is always a candidate, so the choice is never slower than
all-cpu as measured. The decision (which nodes move to cpu, and why) is cached on disk
next to the kernel caches, keyed by the model, the subgraph, the input shapes, the
backends' devices and drivers and the litegpu version: a warm start compiles the cached
assignment once and measures nothing.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from . import env
from .errors import InvalidArgumentError, LiteGpuError
from .partition import CPU, MEASURED

if TYPE_CHECKING:
    from .executor import CompiledSubgraph

log = logging.getLogger("litegpu")

FIRST, MEASURE = "first", "measure"
PLACEMENTS = (FIRST, MEASURE)
_FORMAT = 1            # version of the cache files' layout
_RUNS = 5              # timed runs per candidate (after one warm-up run)
_BUDGET_S = 0.5        # stop timing a candidate early once its runs took this long
_MAX_SPLITS = 8        # more device partitions than this: only first-that-supports and all-cpu

# What placement did in this process, for tests and logs: subgraphs measured, decisions
# read from the cache.
stats = {"measured": 0, "from_cache": 0}


def check_placement(value: Any) -> str:
    """``value`` when it names a placement, else an :class:`InvalidArgumentError` listing them."""
    if value not in PLACEMENTS:
        raise InvalidArgumentError(f"placement must be one of {', '.join(map(repr, PLACEMENTS))}, got {value!r}")
    return value


def cache_dir(extra: dict) -> Path:
    """Where decisions are kept: ``placement`` under the kernel cache the user named
    (``serialization_dir``), else under :func:`litegpu.env.cache_root`."""
    base = extra.get("serialization_dir")
    return (Path(os.path.expanduser(base)) if base else env.cache_root()) / "placement"


def decision_key(material: dict) -> str:
    """The cache key: sha256 of ``material`` (model digest, subgraph, shapes, device info, ...)."""
    text = json.dumps(material, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def time_candidate(compiled: "CompiledSubgraph", seed: int = 0) -> float:
    """Median seconds of a whole run of ``compiled`` on seeded inputs, after one warm-up run
    (which JIT-compiles cpu kernels and finalizes device programs)."""
    rng = np.random.default_rng(seed)
    for t in compiled.sg.inputs:
        array = compiled.host.get(t)
        if array is None:
            continue
        # Zeros for integers: they may be indices or sizes, and zero is always valid.
        array[...] = rng.standard_normal(array.shape) if array.dtype.kind in "fc" else 0
    compiled.run()
    times: list[float] = []
    while len(times) < _RUNS and sum(times) < _BUDGET_S:
        start = time.perf_counter()
        compiled.run()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


@dataclass
class _Candidate:
    label: str
    moved: dict[int, str]          # node index -> backend it leaves (first-that-supports's)
    compiled: "CompiledSubgraph"
    seconds: float = float("inf")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"


def place(build: Callable[[dict[int, str]], "CompiledSubgraph"], material: dict, directory: Path
          ) -> "CompiledSubgraph":
    """The subgraph compiled with the fastest measured assignment, or the cached decision.

    ``build(moved)`` compiles the subgraph with the nodes in ``moved`` (index -> reason)
    forced to cpu; ``material`` keys the decision in ``directory``.
    """
    key = decision_key(material)
    path = directory / f"{key}.json"
    cached = _load(path)
    if cached is not None:
        try:
            compiled = build(cached["moved"])
        except LiteGpuError as exc:   # e.g. a node index that no longer fits: measure again
            log.warning("placement cache %s does not fit the model (%s); measuring again", path, exc)
        else:
            stats["from_cache"] += 1
            compiled.report.placement = f"placement from cache (measured {cached['measured']}): {cached['summary']}"
            log.info("subgraph %d: %s", compiled.report.subgraph, compiled.report.placement)
            return compiled
    compiled, summary = _measure(build)
    if summary:
        compiled.report.placement = "placement measured (whole subgraph, transfers included): " + summary
        log.info("subgraph %d: %s", compiled.report.subgraph, compiled.report.placement)
        _store(path, compiled, summary)
    return compiled


def _measure(build: Callable[[dict[int, str]], "CompiledSubgraph"]) -> tuple["CompiledSubgraph", str]:
    """Compile and time the candidates: the fastest, its moved nodes saying why, and a
    summary of the times ("" when nothing was measured)."""
    first = _Candidate("first-that-supports", {}, build({}))
    report = first.compiled.report
    device = [(backend, [report.assignments[pos].node for pos in positions])
              for backend, positions in report.partitions if backend != CPU]
    if not device:
        return first.compiled, ""   # nothing runs on a device: nothing to choose
    stats["measured"] += 1
    candidates = [first, _Candidate("all-cpu", {n: b for b, nodes in device for n in nodes}, None)]
    if 1 < len(device) <= _MAX_SPLITS:
        candidates += [_Candidate(f"partition {report.partitions.index(p)} ({b}) to cpu",
                                  {n: b for n in nodes}, None)
                       for p, (b, nodes) in zip([p for p in report.partitions if p[0] != CPU], device)]
    for c in candidates:
        try:
            if c.compiled is None:
                c.compiled = build({n: "" for n in c.moved})
            c.seconds = time_candidate(c.compiled)
        except LiteGpuError as exc:
            if c is first:   # the default itself cannot run on made-up inputs: keep it unmeasured
                log.warning("placement not measured: the first-that-supports placement failed on seeded "
                            "inputs (%s)", exc)
                return first.compiled, ""
            log.info("placement candidate %s skipped: %s", c.label, exc)
    best = min(candidates, key=lambda c: c.seconds)
    times = ", ".join(f"{c.label} {_ms(c.seconds)}" for c in candidates if c.seconds < float("inf"))
    chosen = best.compiled
    # The reason on each moved node: the whole subgraph's time with it on cpu against
    # with it on the backend first-that-supports gave it.
    why: dict[int, str] = {}
    for b, nodes in device:
        if nodes[0] in best.moved:
            span = f"node {nodes[0]}" if len(nodes) == 1 else f"nodes {nodes[0]}..{nodes[-1]}"
            why.update(dict.fromkeys(nodes, f"{MEASURED} cpu {_ms(best.seconds)} vs {b} {_ms(first.seconds)} "
                                            f"for {span}"))
    chosen.report.assignments = [type(a)(a.node, a.op, a.backend, why[a.node]) if a.node in why else a
                                 for a in chosen.report.assignments]
    return chosen, f"{times}; kept {best.label}"


def _load(path: Path) -> dict | None:
    """The decision stored at ``path``; None when absent, or (with a warning) unreadable."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        log.warning("placement cache %s cannot be read (%s); measuring again", path, exc)
        return None
    try:
        data = json.loads(text)
        if data.get("format") != _FORMAT or not isinstance(data.get("summary"), str) \
                or not isinstance(data.get("measured"), str) or not isinstance(data.get("moved"), dict) \
                or not all(isinstance(v, str) for v in data["moved"].values()):
            raise ValueError("unexpected layout")
        data["moved"] = {int(k): v for k, v in data["moved"].items()}
        return data
    except (ValueError, TypeError, AttributeError) as exc:
        log.warning("placement cache %s is corrupt (%s); measuring again", path, exc)
        return None


def _store(path: Path, compiled: "CompiledSubgraph", summary: str) -> None:
    """Write the decision atomically (a temporary file renamed over it); a failure only warns."""
    report = compiled.report
    moved = {str(a.node): a.reason for a in report.assignments if a.reason.startswith(MEASURED)}
    data = {"format": _FORMAT, "moved": moved,
            "summary": summary,
            "measured": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(data, f, indent=1)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as exc:
        log.warning("placement decision not cached (%s): %s", path, exc)
