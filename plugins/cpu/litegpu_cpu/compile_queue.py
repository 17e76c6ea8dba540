"""Generated task functions compiled in a background process, then switched to.

A fused elementwise chain that no earlier process compiled runs on the chain machine
(:mod:`.chainvm`) at once, with its generated kernel's bits; the generated kernel, faster,
is compiled meanwhile by ``python -m litegpu_cpu.compile_queue``, one process of its own at
a lower priority (a thread would hold the GIL the model's own first run needs) fed the
generated modules' paths on its stdin, which keeps the machine code in litegpu's cache
(:mod:`.objects`). Once one is done, this process links it and switches its runs to it (the
same bits), and later processes link it at once. The background process finishes what it
was handed even when this one ends first, and ends when nothing more comes for a few
seconds; nothing here is waited for.
"""
from __future__ import annotations

import logging
import os
import select
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
        _WAITING.setdefault(path, []).append((function, ready))
        for attempt in range(2):          # the process may have just ended, idle: start another
            try:
                if not _PROCESS or _PROCESS[0].poll() is not None:
                    process = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
                    _PROCESS[:] = [process]
                    threading.Thread(target=_switch_when_done, args=(process,), name="litegpu-compile",
                                     daemon=True).start()
                _PROCESS[0].stdin.write(path + "\n")
                _PROCESS[0].stdin.flush()
                return
            except OSError as exc:         # cannot start it, or it ended: a later process compiles
                if attempt:
                    log.warning("cannot compile %s in the background (%s)", path, exc)
                else:
                    _PROCESS[0].wait()


def _switch_when_done(process: subprocess.Popen) -> None:
    for line in process.stdout:
        with _LOCK:
            waiting = _WAITING.pop(line.strip(), [])
        for function, ready in waiting:
            if function.linked():
                ready(function.address)
    process.wait()


#: Seconds the background process waits for more work before it ends.
IDLE = 5.0


def _paths():
    """The paths written to stdin, one a line, until it ends or stays silent :data:`IDLE` s."""
    buffer = b""
    while True:
        while b"\n" not in buffer:
            if os.name != "nt" and not select.select([0], [], [], IDLE)[0]:
                return
            chunk = os.read(0, 1 << 16)
            if not chunk:
                return
            buffer += chunk
        line, buffer = buffer.split(b"\n", 1)
        yield line.decode()


def main() -> int:
    """The background process: compile the task function ``fused`` of each generated module
    whose path comes on stdin, one a line, and write the path back when it is in the cache;
    until stdin ends or stays silent :data:`IDLE` s (the process that started it may end
    first: then nothing is written back)."""
    try:
        os.nice(10)
    except OSError:
        pass
    from pathlib import Path
    from .generated import load_generated
    for path in _paths():
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
