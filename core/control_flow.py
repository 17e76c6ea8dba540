"""Control flow's subgraph calls: how WHILE, IF and CALL_ONCE run the subgraphs they name.

A session's :class:`ControlFlow` offers the control-flow ops their services (see
:class:`~litegpu.backend.Runtime`): :meth:`ControlFlow.call_subgraph` runs a subgraph on
new values (compiled once per set of input shapes, reached again through a cache);
:meth:`~ControlFlow.while_loop` runs a WHILE, moving to a loop over fixed arrays once the
body keeps its values' shapes; :meth:`~ControlFlow.bind_while` and
:meth:`~ControlFlow.bind_if` give ``OpDef.bind`` a WHILE or IF over fixed arrays as one
call.

Every loop over fixed arrays, and every bound IF, is one structure of bound steps
(:class:`~litegpu.backend.Loop`, :class:`~litegpu.backend.Branch`), run one way: as one
call when the cpu backend can write it into a table (:meth:`Backend.bind_control`), else
the same structure from Python (:func:`python_control`).
"""
from __future__ import annotations

from operator import attrgetter
from typing import TYPE_CHECKING, Callable

import numpy as np

from .backend import Branch, Copy, Loop, Step, run_steps
from .errors import InvalidArgumentError, LiteGpuError, ModelFormatError, ResourceLimitError
from .executor import CompiledSubgraph
from .steps import STATE as _PROFILING

if TYPE_CHECKING:
    from .session import Session

_MAX_CALL_DEPTH = 64
_SHAPE = attrgetter("shape")   # (a list comprehension is a function call of its own in Python 3.11)


class ControlFlow:
    """One session's subgraph calls, with the caches their fast paths keep."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self._depth = 0
        self._calls: dict[tuple, _SubgraphCall] = {}   # compiled subgraph calls, keyed by input shapes
        self._constants: dict[int, np.ndarray] | None = None   # the model's constant arrays by id
        self._loops: dict[tuple, Callable | None] = {}   # WHILE loops over fixed arrays, by subgraphs and shapes

    def call_subgraph(self, sg_index: int, inputs: list[np.ndarray], constants: bool = False) -> list[np.ndarray]:
        """Run subgraph ``sg_index`` on ``inputs`` (control flow); returns copies of its outputs.

        With ``constants``, inputs that are the model's own constant arrays are compiled
        into the subgraph as constants (IF hands its branch the branch's weights as
        inputs: as constants they are packed once and never copied in). WHILE does not ask
        for it: a loop value that starts as a constant changes on the next iteration."""
        try:
            key = (sg_index, *map(_SHAPE, inputs))
        except AttributeError:   # not arrays: the general path converts them
            key, constants = None, False
        fixed = self._constant_inputs(inputs) if constants else ()
        if fixed:
            key = (*key, fixed)
        call = self._calls.get(key)
        if call is None:
            call = self._subgraph_call(sg_index, inputs, fixed)
        self._descend()
        try:
            return call(inputs)
        finally:
            self._depth -= 1

    def while_loop(self, cond: int, body: int, values: list[np.ndarray], limit: int,
                   truth: Callable[[np.ndarray, str], bool]) -> list[np.ndarray] | None:
        """WHILE's loop: the final values (new arrays; ``values`` are left as they are), or
        None when ``limit`` iterations did not end it.

        The first iteration goes through :meth:`call_subgraph`; when both subgraphs then
        have fixed arrays and the body keeps every value's shape and dtype, the rest (and
        every iteration of later loops starting from values of those shapes) run in a loop
        over fixed arrays (see :meth:`_fixed_loop`). ``truth`` reads the condition (WHILE's
        own rule, passed in so there is one). While a profiler is active every iteration
        goes through :meth:`call_subgraph`, so that it records each subgraph's nodes.
        """
        profiling = _PROFILING.active is not None
        try:
            key = (cond, body, *map(_SHAPE, values))
        except AttributeError:   # not arrays: the general path converts them
            key = None
        fast = None if profiling else self._loops.get(key)
        if fast:
            # A loop over fixed arrays for values of these shapes exists: it maps them to
            # values of the same shapes, so it can take them from the first iteration.
            return fast(values, limit, truth)
        call = self.call_subgraph
        for done in range(limit):
            if not truth(call(cond, values)[0], "WHILE condition"):
                # Later iterations' values are the body's new arrays; the first are the caller's.
                return values if done else [np.array(v) for v in values]
            values = call(body, values)
            if done == 0 and not profiling:
                key = (cond, body, *map(_SHAPE, values))   # the body's new arrays
                fast = self._loops.get(key, False)
                if fast is False:
                    fast = self._loops[key] = self._fixed_loop(cond, body, values)
                if fast is not None:
                    return fast(values, limit - 1, truth)
        return None

    def bind_while(self, cond: int, body: int, inputs: list[np.ndarray], outputs: list[np.ndarray],
                   limit: int, limit_error: Callable[[], Exception]) -> Callable[[], None] | None:
        """A WHILE node over fixed arrays as one call of no arguments (``OpDef.bind``): its
        ``inputs`` copied into the loop's values, the iterations (see
        :func:`_loop_phases`), the final values copied into ``outputs``; over ``limit``
        iterations it raises ``limit_error()``. None when the node's first run did not
        leave both subgraphs compiled for these shapes, or the loop needs another path."""
        shapes = tuple(np.shape(v) for v in inputs)
        c, b = self._calls.get((cond, *shapes)), self._calls.get((body, *shapes))
        parts = None if c is None or b is None else _loop_phases(c.compiled, b.compiled, inputs)
        if parts is None:
            return None
        _, even, phases = parts
        if len(outputs) != len(even) or any(a.shape != e.shape or a.dtype != e.dtype
                                            for e, v, o in zip(even, inputs, outputs) for a in (v, o)):
            return None
        structure = Loop([Step(Copy(v, e)) for v, e in zip(inputs, even)],
                         [(c, flag, b, [Step(Copy(v, o)) for v, o in zip(current, outputs)])
                          for c, flag, b, current in phases],
                         np.array([limit], np.int64), limit_error)
        return self.session.cpu.bind_control(structure) or python_control(structure)

    def bind_if(self, then: int, orelse: int, inputs: list[np.ndarray],
                outputs: list[np.ndarray]) -> Callable[[], None] | None:
        """An IF node over fixed arrays as one call of no arguments (``OpDef.bind``): the
        branch ``inputs[0]`` (a one-element bool) picks, each compiled (with its constant
        inputs compiled in, as :meth:`call_subgraph` does for IF) and bound to read the
        node's other ``inputs`` and write its ``outputs``. None when a branch cannot be
        bound to them (other shapes, run-time shapes, a condition of another dtype)."""
        flag, args = inputs[0], list(inputs[1:])
        if flag.dtype != np.bool_ or flag.size != 1:
            return None
        fixed = self._constant_inputs(args)
        constant = {pos for pos, _ in fixed}
        branches = []
        for index in (then, orelse):
            try:
                compiled = self._subgraph_call(index, args, fixed).compiled
            except LiteGpuError:
                return None   # (running the branch reports it)
            sg = compiled.sg
            if len(sg.outputs) != len(outputs):
                return None
            arrays = {t: a for pos, (t, a) in enumerate(zip(sg.inputs, args)) if pos not in constant}
            produced = {o for _, _, outs in compiled.programs for o in outs}
            copies = []
            for t, out in zip(sg.outputs, outputs):
                spec = compiled.specs.get(t)
                if spec is None or tuple(spec.shape) != out.shape or np.dtype(spec.dtype) != out.dtype:
                    return None
                if t in produced and t not in arrays:
                    arrays[t] = out
                else:   # an input passed through, a constant, or an output listed twice
                    copies.append(Step(Copy(arrays[t] if t in arrays else compiled.output(t), out)))
            bound = compiled.bind(arrays)
            if bound is None:
                return None
            branches.append(bound.steps + copies)
        structure = Branch(flag, *branches)
        return self.session.cpu.bind_control(structure) or python_control(structure)

    def _fixed_loop(self, cond: int, body: int, values: list[np.ndarray]):
        """The loop over fixed arrays for :meth:`while_loop`, or None when it does not
        apply: a :class:`Loop` over the two subgraphs' steps, bound to two sets of value
        arrays by turns (:func:`_loop_phases`) or, when they cannot be bound to arrays of
        our choosing, running them on their own arrays (:func:`_copying_phases`); the
        cpu backend makes it one call when every step is a plan
        (:meth:`Backend.bind_control`), else it runs from Python (:func:`python_control`).
        The values are copied in, the final values out. ``loop.kind`` says which phases,
        ``loop.compiled`` whether it is one call."""
        shapes = tuple(np.shape(v) for v in values)
        c, b = self._calls.get((cond, *shapes)), self._calls.get((body, *shapes))
        if c is None or b is None:
            return None
        kind, parts = "alternating", _loop_phases(c.compiled, b.compiled, values)
        if parts is None:
            kind, parts = "copying", _copying_phases(c, b, values)
        if parts is None:
            return None
        enters, even, phases = parts
        finals = [np.empty_like(e) for e in even]
        limit = np.zeros(1, np.int64)
        structure = Loop([], [(cond_steps, flag, body_steps, [Step(Copy(v, f)) for v, f in zip(current, finals)])
                              for cond_steps, flag, body_steps, current in phases], limit, _LoopLimit)
        compiled = self.session.cpu.bind_control(structure)
        run = compiled or python_control(structure)

        def loop(values: list[np.ndarray], remaining: int, truth) -> list[np.ndarray] | None:
            self._descend()
            try:
                for enter in enters:
                    enter()
                for dst, value in zip(even, values):
                    dst[...] = value
                limit[0] = remaining
                run()
                return [np.array(v) for v in finals]
            except _LoopLimit:
                return None
            finally:
                self._depth -= 1
        loop.kind, loop.compiled = kind, compiled is not None
        return loop

    def _descend(self) -> None:
        """Count one more level of subgraph calls, refused past ``_MAX_CALL_DEPTH``; the
        caller counts it back (``self._depth -= 1``) in a ``finally``. (Not a context
        manager: a generator-based one costs ~1 us, as much as a small subgraph's run.)"""
        if self._depth >= _MAX_CALL_DEPTH:
            raise ResourceLimitError(f"subgraph calls nested deeper than {_MAX_CALL_DEPTH}")
        self._depth += 1

    def _constant_inputs(self, inputs: list) -> tuple[tuple[int, int], ...]:
        """``(position, id)`` of each of ``inputs`` that is one of the model's constant arrays."""
        if self._constants is None:
            self._constants = {id(t.data): t.data for sg in self.session.model.subgraphs for t in sg.tensors
                               if isinstance(t.data, np.ndarray)}
        return tuple((pos, id(v)) for pos, v in enumerate(inputs) if self._constants.get(id(v)) is v)

    def _subgraph_call(self, sg_index: int, inputs: list, fixed: tuple = ()) -> "_SubgraphCall":
        """The cached call of subgraph ``sg_index`` compiled for the shapes of ``inputs``,
        those at the positions in ``fixed`` (:meth:`_constant_inputs`) as constants."""
        if not 0 <= sg_index < len(self.session.model.subgraphs):
            raise InvalidArgumentError(f"subgraph {sg_index} does not exist; the model has "
                                       f"{len(self.session.model.subgraphs)}")
        sg = self.session.model.subgraphs[sg_index]
        if len(inputs) != len(sg.inputs):
            # Only the model's own WHILE / IF / CALL_ONCE call subgraphs: the model is at fault.
            raise ModelFormatError(f"subgraph {sg_index} takes {len(sg.inputs)} inputs, its caller passes "
                                   f"{len(inputs)}")
        shapes = [np.shape(v) for v in inputs]
        key = (sg_index, *shapes, fixed) if fixed else (sg_index, *shapes)
        call = self._calls.get(key)
        if call is None:
            values = {sg.inputs[pos]: inputs[pos] for pos, _ in fixed}
            compiled = self.session.compile(sg_index, dict(zip(sg.inputs, shapes)), delegate=False, values=values)
            call = self._calls[key] = _SubgraphCall(compiled)
        return call


class _SubgraphCall:
    """Calls one compiled subgraph with inputs of the shapes it was compiled for.

    Work that does not depend on the values is done once: which input tensors any node
    reads (an input nothing reads, such as a loop-carried value a condition ignores, is
    not copied in), their host arrays and dtypes.
    """

    def __init__(self, compiled: CompiledSubgraph) -> None:
        sg = compiled.sg
        read = {t for node in sg.nodes for t in node.inputs} | set(sg.outputs)
        self.compiled = compiled
        self.inputs = [(pos, compiled.host[t], compiled.host[t].dtype) for pos, t in enumerate(sg.inputs)
                       if t in read]
        self.outputs = list(sg.outputs)
        self.run = compiled.run
        self.fixed: list[np.ndarray] | None = None   # output arrays, once known not to change

    def set_inputs(self, inputs: list) -> None:
        """Copy ``inputs`` (of the compiled shapes) into the subgraph's input arrays."""
        # Shapes match: the call is chosen by them. ``dst[...] = v`` is np.copyto without
        # its dispatch cost; the dtype test by identity falls back to a (no-op) astype.
        for pos, dst, dtype in self.inputs:
            value = inputs[pos]
            if value is dst:
                continue
            if type(value) is not np.ndarray or value.dtype is not dtype:
                value = np.asarray(value).astype(dtype, copy=False)
            dst[...] = value

    def __call__(self, inputs: list) -> list[np.ndarray]:
        self.set_inputs(inputs)
        self.run()
        fixed = self.fixed
        if fixed is not None:
            return list(map(np.ndarray.copy, fixed))
        compiled = self.compiled
        out = [np.array(compiled.output(t)) for t in self.outputs]
        if compiled.fixed:
            self.fixed = [compiled.output(t) for t in self.outputs]
        return out


def _loop_phases(cond: CompiledSubgraph, body: CompiledSubgraph, values: list):
    """WHILE's condition and body bound to two sets of value arrays, or None when that
    does not apply: ``(enters, even, phases)``: the steps that ready the calling thread, the
    set of arrays the loop's values start in, and the two phases ``(cond steps, flag, body
    steps, values)``, each reading ``values`` (one set) and writing the other.

    The body runs from one set into the other and back, so nothing is copied between
    iterations; the condition reads the set the body last wrote. Both subgraphs are bound
    once to each set (see :meth:`CompiledSubgraph.bind`). A value the body passes
    through unchanged (output j is its input j) has one array in both sets. It applies
    when every body output is either that or computed by the body with the value's shape
    and dtype, each in an array of its own: an output that is a constant or another
    value's input (values changing places) keeps to :func:`_copying_phases`.
    """
    b_in, b_out, c_in = body.sg.inputs, body.sg.outputs, cond.sg.inputs
    n = len(values)
    if not (len(b_in) == len(b_out) == len(c_in) == n) or len({*b_in}) < n or len({*b_out}) < n \
            or len({*c_in}) < n or not cond.sg.outputs:
        return None
    produced = {o for _, _, outs in body.programs for o in outs}
    even = []
    for i, o, v in zip(b_in, b_out, values):
        mine, spec = body.host.get(i), body.specs.get(o)
        if mine is None or spec is None or mine.shape != np.shape(v) or (o != i and (
                o not in produced or tuple(spec.shape) != mine.shape or np.dtype(spec.dtype) != mine.dtype)):
            return None
        even.append(np.empty_like(mine))
    odd = [e if o == i else np.empty_like(e) for e, i, o in zip(even, b_in, b_out)]

    def bound(src: list, dst: list):
        """The condition and then the body bound to read ``src`` (the body writing ``dst``)."""
        c_arrays = dict(zip(c_in, src))
        c_steps = cond.bind(c_arrays)
        b_steps = body.bind({**dict(zip(b_in, src)),
                                   **{o: d for i, o, d in zip(b_in, b_out, dst) if o != i}})
        flag = c_arrays.get(cond.sg.outputs[0])
        if flag is None and c_steps is not None:
            flag = cond.output(cond.sg.outputs[0])
        return c_steps, b_steps, flag

    c_even, b_even, flag_even = bound(even, odd)
    c_odd, b_odd, flag_odd = bound(odd, even)
    if None in (c_even, b_even, c_odd, b_odd) or flag_even.size != 1:
        return None   # (an ill-shaped condition: the general path reports it)
    enters = list({id(e): e for e in (*c_even.enter, *b_even.enter)}.values())
    phases = [(c_even.steps, flag_even, b_even.steps, even), (c_odd.steps, flag_odd, b_odd.steps, odd)]
    return enters, even, phases


def _copying_phases(c: _SubgraphCall, b: _SubgraphCall, values: list):
    """WHILE's condition and body on their own arrays, as :func:`_loop_phases` gives them
    (both phases alike), or None when that does not apply either: for subgraphs that cannot
    be bound to arrays of our choosing (a body with run-time shapes that have settled, an
    output that is a constant or another value's input). Each iteration copies the values
    into the condition's and the body's input arrays and runs them, and copies the body's
    outputs back into the values' arrays."""
    if c.fixed is None or b.fixed is None or not c.fixed or c.fixed[0].size != 1:
        return None
    outs = b.fixed
    if len(outs) != len(values) or any(o.shape != np.shape(v) or o.dtype != getattr(v, "dtype", None)
                                       for o, v in zip(outs, values)):
        return None
    even = [np.empty_like(o) for o in outs]
    cond = [*(Step(Copy(even[pos], dst)) for pos, dst, _ in c.inputs), Step(c.run)]
    body = [*(Step(Copy(even[pos], dst)) for pos, dst, _ in b.inputs), Step(b.run),
            *(Step(Copy(o, e)) for o, e in zip(outs, even))]
    phase = (cond, c.fixed[0], body, even)
    return [], even, [phase, phase]


class _LoopLimit(Exception):
    """The session's loop ran its iterations without ending (``while_loop`` returns None)."""


def python_control(control: Branch | Loop) -> Callable[[], None]:
    """``control`` run from Python, step by step: what :meth:`Backend.bind_control`
    returns when the backend cannot make it one call."""
    if isinstance(control, Branch):
        flag, then, orelse = control.flag.reshape(()), control.then, control.orelse

        def branch() -> None:
            run_steps(then if flag else orelse)
        return branch
    phases = [(c, flag.reshape(()), b, exit) for c, flag, b, exit in control.phases]

    def loop() -> None:
        run_steps(control.enter)
        limit = int(control.limit[0])
        n = 0
        while True:
            cond, flag, body, exit = phases[n & 1]
            run_steps(cond)
            if not flag:
                run_steps(exit)
                return
            if n >= limit:
                raise control.limit_error()
            run_steps(body)
            n += 1
    return loop

