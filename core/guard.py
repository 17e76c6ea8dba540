"""One model's calls from several threads: serialized, or refused with a clear error.

A loaded model owns host arrays, device buffers, variables and a cpu plan whose rows are
claimed through counters; two runs of it at once would share all of them (a crash in a
parallel region, or one caller's outputs in another's buffers). So every call that
touches that state holds the model's :class:`UseGuard`:

- a self-contained call (``CompiledModel.run_*``, a ``SignatureRunner`` call: inputs in,
  outputs out) waits for the guard, so concurrent callers are served one after another
  and each gets its own answer;
- a call of the stateful Interpreter API (``set_tensor``, ``invoke``, ``get_tensor``, ...)
  is a step of a sequence that only its caller knows, and waiting would silently mix two
  threads' sequences. It takes the guard without waiting and raises
  :class:`~litegpu.errors.ConcurrentUseError` when another thread holds it, as LiteRT
  raises on overlapping calls.

The guard is reentrant: a call made while the same thread holds it (control flow calling
back into its subgraphs) goes through.
"""
from __future__ import annotations

import threading
from threading import get_ident
from typing import Any

from .errors import ConcurrentUseError


class UseGuard:
    """The lock of one loaded model, remembering which call of which thread holds it.

    ``with guard.serialized(call):`` and ``with guard.exclusive(call):`` hold it for a block.
    They acquire when called and return the guard, whose ``__exit__`` releases: ~0.5 us a
    call, where a generator-based context manager costs ~1.5 us, which shows on models that
    run in 2 us. The holding thread is kept as its id and named only in an error.
    """

    __slots__ = ("_lock", "_held")

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._held: list[tuple[str, int]] = []   # (call, thread id), innermost last

    def serialized(self, call: str) -> "UseGuard":
        """Hold the guard for ``call``, waiting for another thread's call to end."""
        self._lock.acquire()
        self._held.append((call, get_ident()))
        return self

    def exclusive(self, call: str) -> "UseGuard":
        """Hold the guard for ``call``; raise :class:`ConcurrentUseError` at once when
        another thread holds it."""
        self.take(call)
        return self

    def take(self, call: str) -> None:
        """:meth:`exclusive` without the ``with``: the caller calls :meth:`leave` in a
        ``finally``. For the calls made once per inference (``set_tensor``, ``invoke``,
        ``get_tensor``), where the ``with`` protocol's own cost (~0.2 us) shows on models
        that run in a few microseconds."""
        if not self._lock.acquire(False):   # positional: faster than blocking=False
            raise ConcurrentUseError(
                f"{call} was called while {self._holder()} is using this interpreter; an Interpreter is "
                "used by one thread at a time: give each thread its own Interpreter, hold a lock around "
                "each thread's set_tensor/invoke/get_tensor sequence, or use CompiledModel or a "
                "SignatureRunner, whose calls are serialized")
        self._held.append((call, get_ident()))

    def leave(self) -> None:
        """Release what :meth:`take` took."""
        self._held.pop()
        self._lock.release()

    def __enter__(self) -> "UseGuard":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.leave()

    def _holder(self) -> str:
        held = list(self._held)   # another thread may change it meanwhile
        if not held:
            return "another call"
        call, ident = held[0]
        names = {t.ident: t.name for t in threading.enumerate()}
        return f"{call} in thread {names.get(ident, ident)!r}"
