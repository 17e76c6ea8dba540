"""Progress reports (:mod:`litegpu.progress`) while numba compiles the cpu backend's kernels.

numba compiles a kernel when it is first called with new argument types: for most of a
model's kernels, in its first run (mobilenet_v2 cold: ~10 s on 2 cores, the run plan
alone ~3 s), and nothing else is said meanwhile. How many will compile is not known in
advance (it depends on what numba's disk cache holds), so the report counts up and
names the function. A listener on numba's compile events reports each of ours as it
starts; it is registered once per process and does nothing while no one listens. Task
functions are compiled as ``cfunc`` callbacks, which raise no such event: their compile
reports itself (:func:`report_compile`).
"""
from __future__ import annotations

import itertools
import logging

from litegpu import progress

from . import numba_cache

log = logging.getLogger("litegpu.cpu")

_registered = False
_counter = itertools.count(1)


def report_numba_compiles() -> None:
    """Report numba's compiles of litegpu's cpu kernels from now on, once numba is
    imported (see :mod:`.jit`; idempotent)."""
    global _registered
    if _registered:
        return
    _registered = True
    from .jit import when_ready
    when_ready(_register_listener)


def _register_listener() -> None:
    try:
        from numba.core import event
    except ImportError:   # numba's event API is missing: compiles are silent, nothing breaks
        log.debug("numba has no compile events; cpu kernel compiles will not be reported")
        return
    event.register("numba:compile", _listener_class(event)())


def report_compile(name: str, number: int = 0) -> int:
    """Report that numba starts compiling (or, warm, loading) kernel function ``name``;
    returns its number in this process (``number``: report that one again)."""
    if not progress.listened():
        return number
    number = number or next(_counter)
    # Whether the result will last decides what the user is told.
    once = "once, then cached" if numba_cache.home().mode == numba_cache.WRITABLE \
        else "numba cache not writable: in every process"
    progress.report(f"cpu: numba compiling kernel {number} ({name}; {once})")
    return number


def _listener_class(event):
    """The listener type, made here because numba is imported lazily."""

    class CompileListener(event.Listener):
        """Reports each compile of ours as it starts, and the enclosing one again when a
        function it calls is done (the run plan compiles its callees first, then itself
        for seconds). numba compiles under one lock, so the stack needs none."""

        def __init__(self) -> None:
            self.stack: list[tuple[str, int] | None] = []   # None: a function not ours

        def on_start(self, ev) -> None:
            function = getattr(ev.data.get("dispatcher"), "py_func", None)
            if function is None or not _ours(function):   # numba's helpers, a user's functions
                self.stack.append(None)
                return
            self.stack.append((function.__name__, report_compile(function.__name__)))

        def on_end(self, ev) -> None:
            if self.stack:
                self.stack.pop()
            outer = next((entry for entry in reversed(self.stack) if entry is not None), None)
            if outer is not None and outer[1]:
                report_compile(*outer)

    return CompileListener


def _ours(function) -> bool:
    """A function of this package or of one of its generated modules."""
    if getattr(function, "__globals__", {}).get(numba_cache.GENERATED_MARK):
        return True
    module = getattr(function, "__module__", "") or ""
    return module == "litegpu_cpu" or module.startswith("litegpu_cpu.")
