"""Compile the cpu backend's task functions ahead of time, once, at install.

A process on a machine whose caches are empty compiled every kernel it ran with numba
(mobilenet_v2: ~7 s of a first result on 2 cores, ~6 s of it the package's generic task
functions: the launcher, convolutions, depthwise, pooling). Those do not depend on any
model, so ``litegpu prebuild`` (:func:`prebuild`) compiles all of them for this machine's
CPU into :func:`.objects.prebuilt_dir`, where every later process links them in a
millisecond each, as a warm one does; only code made for a model (fused elementwise
chains) is left to compile in its first run. Entries carry the cache's keys, so a source,
numba or CPU that differs is simply a miss; entries no current function has are removed.
"""
from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

from litegpu import progress
from litegpu.errors import InvalidArgumentError

from . import native, objects

log = logging.getLogger("litegpu.cpu")


@dataclass
class PrebuildReport:
    """What :func:`prebuild` did: function names per outcome, and where."""

    directory: Path
    built: list[str] = field(default_factory=list)      # compiled now
    present: list[str] = field(default_factory=list)    # there already
    runtime: list[str] = field(default_factory=list)    # need numba's runtime: compiled in their first run
    skipped: list[str] = field(default_factory=list)    # this CPU lacks the features they need
    removed: int = 0                                     # stale entries deleted

    def summary(self) -> str:
        """One line for a person."""
        return (f"cpu: {len(self.built) + len(self.present)} kernels prebuilt in {self.directory} "
                f"({len(self.built)} compiled now, {len(self.present)} already there); "
                f"{len(self.runtime)} compile on first use (they need numba's runtime), "
                f"{len(self.skipped)} not for this CPU; {self.removed} stale entries removed")


def task_functions() -> list:
    """Every :class:`.kernels.tasks.TaskFunction` of the package, in a stable order, and
    the chain machine (:mod:`.chainvm`: generated, the same for every model)."""
    from . import kernels  # noqa: F401  (imports every kernel module)
    from .chainvm import chain_machine
    from .kernels.tasks import TaskFunction
    found = {}
    for name, module in sorted(sys.modules.items()):
        if name == __package__ or name.startswith(__package__ + "."):
            for value in vars(module).values():
                if isinstance(value, TaskFunction):
                    found.setdefault(id(value), value)
    return [*found.values(), chain_machine()]


def prebuild(directory: Path | None = None) -> PrebuildReport:
    """Compile every task function this CPU can run into ``directory`` (default
    :func:`.objects.prebuilt_dir`), skipping those already there, and delete the entries
    there that no current function has. Raises InvalidArgumentError when there is no such
    folder or it cannot be written (an OSError's message names it)."""
    directory = directory if directory is not None else objects.prebuilt_dir()
    if directory is None:
        raise InvalidArgumentError(f"${objects.PREBUILT_DIR} is set empty: there is no folder to prebuild into")
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidArgumentError(f"cannot create {directory} ({exc.strerror or exc}); "
                                   f"set ${objects.PREBUILT_DIR} to a writable folder") from exc
    features = {f[1:] for f in native.host_cpu()[1].split(",") if f.startswith("+")}
    functions = task_functions()
    report = PrebuildReport(directory)
    for number, function in enumerate(functions, 1):
        if not features.issuperset(function.requires):
            report.skipped.append(function.name)
            continue
        progress.report(f"cpu: prebuilding kernel {number}/{len(functions)} ({function.name})")
        try:
            outcome = function.prebuild(directory)
        except OSError as exc:
            raise InvalidArgumentError(f"cannot write to {directory} ({exc.strerror or exc}); "
                                       f"set ${objects.PREBUILT_DIR} to a writable folder") from exc
        getattr(report, outcome).append(function.name)
    current = {f"{function.entry()}.o" for function in functions}
    for path in directory.glob("*.o"):
        if path.name not in current:
            path.unlink(missing_ok=True)
            report.removed += 1
    log.info("%s", report.summary())
    return report
