"""Generated task functions compiled in a background process, then switched to.

A fused elementwise chain that no earlier process compiled runs on the chain machine
(:mod:`.chainvm`) at once, with its generated kernel's bits; the generated kernel, faster,
is compiled meanwhile by ``python -m litegpu_cpu.compile_queue``, one process of its own at
a lower priority (a thread would hold the GIL the model's own first run needs) fed the
generated modules' paths on its stdin, which keeps the machine code in litegpu's cache
(:mod:`.objects`). Once one is done, this process links it and switches its runs to it (the
same bits), and later processes link it at once. The background process finishes what it
was handed even when this one ends first; nothing here is waited for.
"""
from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from typing import Callable

log = logging.getLogger("litegpu.cpu")

_LOCK = threading.Lock()
_PROCESS: list[subprocess.Popen] = []
_WAITING: dict[str, list[tuple[object, Callable[[int], None]]]] = {}


def compile_later(function, ready: Callable[[int], None]) -> None:
    """Have :class:`.kernels.tasks.TaskFunction` ``function`` (of a generated module with a
    source file) compiled by the background process, then linked here and its address given
    to ``ready`` (on this module's thread). The file is handed over at once: the process
    compiles it even if this one ends first."""
    path = getattr(getattr(function.fn, "__code__", None), "co_filename", "")
    if not os.path.isfile(path):
        return
    with _LOCK:
        try:
            if not _PROCESS or _PROCESS[0].poll() is not None:
                process = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                _PROCESS[:] = [process]
                threading.Thread(target=_switch_when_done, args=(process,), name="litegpu-compile",
                                 daemon=True).start()
            _WAITING.setdefault(path, []).append((function, ready))
            _PROCESS[0].stdin.write(path + "\n")
            _PROCESS[0].stdin.flush()
        except OSError as exc:             # cannot start it, or it died: a later process compiles
            log.warning("cannot compile %s in the background (%s)", path, exc)


def _switch_when_done(process: subprocess.Popen) -> None:
    for line in process.stdout:
        with _LOCK:
            waiting = _WAITING.pop(line.strip(), [])
        for function, ready in waiting:
            if function.linked():
                ready(function.address)


def main() -> int:
    """The background process: compile the task function ``fused`` of each generated module
    whose path comes on stdin, one a line, and write the path back when it is in the cache;
    until stdin ends (the process that started it may end first: then nothing is written)."""
    try:
        os.nice(10)
    except OSError:
        pass
    from pathlib import Path
    from .generated import load_generated
    for line in sys.stdin:
        path = line.strip()
        try:
            load_generated(Path(path).read_text(encoding="utf-8"), "fused").address
        except Exception as exc:          # noqa: BLE001 - the others still compile
            log.warning("background compile of %s failed: %s", path, exc)
            continue
        try:
            print(path, flush=True)
        except BrokenPipeError:           # its starter has gone: compile the rest for later processes
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
