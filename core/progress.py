"""What long, one-off work is doing now, for whoever shows it.

Compiling a model's kernels and a driver's first launch of them can take seconds
(mobilenet_v2 cold on PoCL: ~9 s of program build, ~8 s of first-launch compiles). Library
code says what it is doing with :func:`report`; a front end listens with
:func:`listening` and shows the latest line (the ``litegpu`` command updates its spinner).
With no listener a report is one check of an empty list: nothing is printed and next to
nothing is paid, so library users see nothing. Every report is also logged at DEBUG on
``litegpu.progress``.

What a backend author calls (``from litegpu import progress``):

- ``progress.report(message)`` just before each unit of work that can take long — one
  program build, one first launch, one JIT compile. Say what runs, how many of how many
  where that is known ("opencl: first launch 12/52"), and that it happens once when a
  cache keeps the result ("once, then cached"): a user waits patiently for work that is
  not paid again. Report *before* the unit, not only after it: a C call that holds the
  GIL freezes every other Python thread (the spinner too), so the line must already name
  what is being waited for.
- ``progress.listened()`` to skip building a costly message that no one would read.

Reports come from whichever thread does the work; a listener must be quick and
thread-safe (the command's stores the line and redraws it under a lock).
"""
from __future__ import annotations

import contextlib
import logging
from typing import Callable, Iterator

log = logging.getLogger("litegpu.progress")

Listener = Callable[[str], None]

# Replaced, never mutated, so a report may iterate it while another thread (un)subscribes.
_listeners: tuple[Listener, ...] = ()


def report(message: str) -> None:
    """Say what long work starts now: ``message`` goes to every listener and to the DEBUG log.

    :param message: one line, e.g. ``"opencl: building a program of 41 kernels (once, then cached)"``.
    """
    for listener in _listeners:
        try:
            listener(message)
        except Exception:   # noqa: BLE001 - a broken display must not break a compile
            log.debug("progress listener %r failed", listener, exc_info=True)
    log.debug("%s", message)


def listened() -> bool:
    """True while someone listens: worth building a detailed message."""
    return bool(_listeners)


@contextlib.contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """Call ``listener(message)`` for every report made while the body runs (in any thread).

    :param listener: called with each message, from the reporting thread; keep it quick.
    """
    global _listeners
    _listeners = (*_listeners, listener)
    try:
        yield
    finally:
        remaining = list(_listeners)
        remaining.remove(listener)
        _listeners = tuple(remaining)
