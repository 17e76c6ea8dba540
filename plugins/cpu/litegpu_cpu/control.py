"""IF and WHILE as plans: the branches and iterations of control flow written into one
table of :func:`.kernels.tasks.run_program`, with its control rows (jumps, copies, a count).

A subgraph whose steps are all task functions is a table of rows; an IF over two such
branches is then ``JUMP_IF_FALSE flag -> else; then; JUMP -> end; else``, and a WHILE
alternating between two sets of values is::

    SET counter = limit; enter copies
    top:  cond0; JUMP_IF_FALSE -> exit0; COUNT_DOWN; body0
          cond1; JUMP_IF_FALSE -> exit1; COUNT_DOWN; body1; JUMP -> top
    exit0: copies out; JUMP -> end
    exit1: copies out
    end:

so a model's control flow runs in the same single call as the kernels around it. Checks
(a task's bad-input word, the iteration limit) stop the table at once (``STOP_IF_SET``)
and raise after it, as every plan's checks do.
"""
from __future__ import annotations

from functools import partial

import numpy as np

from litegpu.backend import Branch, Copy, Loop

from .kernels.tasks import (COPY, COUNT_DOWN, JUMP, JUMP_IF_FALSE, SET, STOP_IF_SET, Check, control_row, is_plan,
                            plan_call)


class _Table:
    """Rows being assembled, the arrays they hold and their checks; jumps are patched to
    labels (row positions) once the labels are known."""

    def __init__(self) -> None:
        self.rows: list[np.ndarray] = []
        self.held: list = []
        self.checks: list[Check] = []
        self._jumps: list[tuple[int, str]] = []
        self.labels: dict[str, int] = {}

    @property
    def here(self) -> int:
        return len(self.rows)

    def label(self, name: str) -> None:
        self.labels[name] = self.here

    def control(self, op: int, *operands: int, to: str | None = None) -> None:
        if to is not None:
            self._jumps.append((self.here, to))
        self.rows.append(control_row(op, *operands)[0])

    def steps(self, steps: list) -> bool:
        """Append :class:`~litegpu.backend.Step` s: plans and copies; False when one is neither."""
        for call, _, fail, *_ in steps:
            if isinstance(call, Copy):
                if not self.copy(call.src, call.dst):
                    return False
            elif is_plan(call):
                self.rows.extend(call.rows)
                self.held.append(call.held)
                # A check's error named as the step's failure is (its node), once.
                self.checks.extend(check if fail is None else Check((check[0], check[1],
                                                                     partial(_failed, fail, check[2])))
                                   for check in call.checks)
            else:
                return False
        return True

    def copy(self, src: np.ndarray, dst: np.ndarray) -> bool:
        if src is dst:
            return True
        if src.shape != dst.shape or src.dtype != dst.dtype or not (src.flags.c_contiguous
                                                                    and dst.flags.c_contiguous):
            return False
        self.control(COPY, src.ctypes.data, dst.ctypes.data, dst.nbytes)
        self.held.append((src, dst))
        return True

    def stop_if_checked(self, start: int) -> None:
        """Stop the table when a check added since check ``start`` is set."""
        for params, at, _ in self.checks[start:]:
            self.control(STOP_IF_SET, params.ctypes.data + 8 * at)

    def call(self):
        for at, name in self._jumps:
            self.rows[at][3] = self.labels[name] - at
        return plan_call(np.stack(self.rows), tuple(self.held), tuple(self.checks))


def _failed(fail, error, params: np.ndarray) -> Exception:
    """``error(params)`` as the failing step reports it."""
    exc = error(params)
    return fail(exc) or exc


def bind_control(control: Branch | Loop):
    """``control`` as one plan (see the module's docstring), or None when one of its steps
    is not a plan or a plain copy, or a flag is not a one-element bool."""
    flags = [control.flag] if isinstance(control, Branch) else [flag for _, flag, _, _ in control.phases]
    if any(f.dtype != np.bool_ or f.size != 1 for f in flags):
        return None
    table = _Table()
    table.held.append(flags)
    if isinstance(control, Branch):
        table.control(JUMP_IF_FALSE, control.flag.ctypes.data, to="else")
        ok = table.steps(control.then)
        table.control(JUMP, 0, to="end")
        table.label("else")
        ok = ok and table.steps(control.orelse)
        table.label("end")
        return table.call() if ok else None
    # Loop: words[0] counts the iterations left, words[1] is the limit's check word.
    words = np.zeros(2, np.int64)
    limit_error = control.limit_error
    table.checks.append(Check((words, 1, lambda params: limit_error())))
    table.held.append((words, control.limit))
    table.control(SET, words.ctypes.data, control.limit.ctypes.data)
    ok = table.steps(control.enter)
    table.label("top")
    for n, (cond, flag, body, _) in enumerate(control.phases):
        start = len(table.checks)
        ok = ok and table.steps(cond)
        table.stop_if_checked(start)
        table.control(JUMP_IF_FALSE, flag.ctypes.data, to=f"exit{n}")
        table.control(COUNT_DOWN, words.ctypes.data, words.ctypes.data + 8)
        start = len(table.checks)
        ok = ok and table.steps(body)
        table.stop_if_checked(start)
    table.control(JUMP, 0, to="top")
    for n, (_, _, _, exit) in enumerate(control.phases):
        table.label(f"exit{n}")
        ok = ok and table.steps(exit)
        table.control(JUMP, 0, to="end")
    table.label("end")
    return table.call() if ok else None
