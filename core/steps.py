"""The one run representation: a run is a list of bound steps, and :func:`run_steps` runs it.

A program bound to arrays (:meth:`litegpu.backend.Program.bind`) is a :class:`Bound`: the
calls that ready the calling thread, then its :class:`Step` s. Everything that runs host
work consumes such lists: the executor (a subgraph is its partitions' steps, concatenated),
control flow (a WHILE's condition and body are two lists; a backend may turn them into one
call, :meth:`~litegpu.backend.Backend.bind_control`), and the profiler, which times the
same steps when a :class:`~litegpu.profile.Profiler` is active (:data:`STATE`).
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence


class _State:
    """The process's active profiler (None: profiling off)."""

    __slots__ = ("active",)

    def __init__(self) -> None:
        self.active: Any = None   # a litegpu.profile.Profiler


#: Profiling's switch: ``STATE.active`` is the active profiler, or None.
STATE = _State()


class Step(NamedTuple):
    """One step of a bound run: ``call()`` runs it on the arrays it was bound to.

    ``nodes`` are the ``NodeContext`` s it computes (several for a fused or chained step,
    none for a copy); ``fail(exc)`` returns the error to raise when ``call`` raised
    ``exc`` (naming the node), or None to let ``exc`` propagate; ``kernel`` names what
    runs it (for the profiler). ``parts`` are steps that together do what this one does,
    finer grained, or empty: the steps a chained step was made of, a bound WHILE's run
    through its op; the profiler runs them instead, timing each.
    """

    call: Callable[[], None]
    nodes: tuple = ()
    fail: Callable[[Exception], Exception | None] | None = None
    kernel: str = ""
    parts: tuple = ()


class Bound(NamedTuple):
    """A program or subgraph bound to its arrays: call each of ``enter`` once before a
    series of runs on a thread (the cpu backend sets the thread's thread count there),
    then a run is :func:`run_steps` of ``steps``."""

    steps: list
    enter: tuple = ()


def run_steps(steps: Sequence[Step]) -> None:
    """Run ``steps`` in order; a step whose call raises ``exc`` raises ``fail(exc)``
    instead (the error naming its node) unless ``fail`` is None or returns None. With a
    profiler active, each step (each part of a chained one) is timed into it."""
    if STATE.active is not None:
        STATE.active.run_steps(steps)
        return
    for step in steps:
        try:
            step.call()
        except Exception as exc:
            raise failure(step, exc) from None


def failure(step: Step, exc: Exception) -> Exception:
    """The error to raise for ``exc`` out of ``step`` (``exc`` itself unless its ``fail``
    names another)."""
    error = None if step.fail is None else step.fail(exc)
    return exc if error is None else error
