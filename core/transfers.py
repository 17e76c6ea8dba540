"""Runs of subgraphs with device partitions: where tensors live, copies at boundaries, events.

When some partition's backend keeps its tensors in device memory
(``Backend.host_memory`` False), a run is planned as a flat list of commands:
``copy_in`` / ``copy_out`` where a tensor crosses between the host and a device, and
program runs that hand each other device buffers directly. A tensor produced on a
device and read by the next partition of the same device never touches the host.
The plan is made once per *binding* — which inputs and outputs the caller supplies as
device buffers — and replayed; it knows the bytes it moves per run.

Events: device programs enqueue and return an event; copies towards the host finish
before they return. A run ends with the event of its last command, so a run whose
outputs stay on the device returns before the device is done.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from .backend import COMPLETE, Backend, CompileOptions, Event, Program
from .ops import TensorSpec

HOST = "host"


@dataclass
class TransferPlan:
    """A replayable run: commands in order, the bytes they move, whether a host step follows device work."""

    commands: list[Callable[[Sequence[Event]], Event]]
    bytes_in: int = 0
    bytes_out: int = 0
    # What each command is: ("in" or "out", tensor, backend) for a copy, ("run", partition).
    kinds: list[tuple] = field(default_factory=list)
    host_after_device: bool = False   # True: an async run needs a worker thread

    @property
    def bytes_moved(self) -> int:
        """Bytes copied between host and devices per run."""
        return self.bytes_in + self.bytes_out

    @property
    def copies(self) -> list[tuple[str, int, str]]:
        """The copies, in order, as (direction "in" or "out", tensor, backend)."""
        return [kind for kind in self.kinds if kind[0] != "run"]


class DeviceRunner:
    """Plans and runs a subgraph whose partitions include device backends.

    ``programs`` are (program, backend, input tensors, output tensors) per partition;
    ``host`` the host arrays of subgraph inputs, outputs and tensors crossing
    partitions; ``specs`` every tensor's spec.
    """

    def __init__(self, programs: list[tuple[Program, Backend, list[int], list[int]]], host: dict[int, np.ndarray],
                 specs: dict[int, TensorSpec], outputs: Sequence[int], options: CompileOptions) -> None:
        self.programs = programs
        self.host = host
        self.specs = specs
        self.outputs = list(outputs)
        self.options = options
        self._owned: dict[tuple[str, int], Any] = {}    # device buffers the runner allocated
        self._plans: dict[tuple, TransferPlan] = {}
        self.bound: dict[int, Any] = {}                 # this run's user device buffers, by tensor

    def place(self, backend: Backend) -> str:
        """Where a backend's programs read their tensors: HOST or the backend's name."""
        return HOST if backend.host_memory else backend.name

    def buffer(self, backend: Backend, t: int, bound: dict[int, tuple[Backend, Any]] | None = None) -> Any:
        """The device buffer of tensor ``t`` on ``backend``: the user's when ``bound`` (default:
        this run's binding) supplies one, else one the runner allocated."""
        given = (self.bound if bound is None else bound).get(t)
        if given is not None and given[0] is backend:
            return given[1]
        key = (backend.name, t)
        buf = self._owned.get(key)
        if buf is None:
            buf = self._owned[key] = backend.allocate(self.specs[t], self.options)
        return buf

    def plan(self, bound: dict[int, tuple[Backend, Any]] | None = None) -> TransferPlan:
        """The plan for a binding: ``bound`` maps the subgraph inputs and outputs the caller
        supplies as device buffers to (backend, buffer); every other subgraph output is
        copied to the host."""
        bound = bound or {}
        key = tuple(sorted((t, b.name) for t, (b, _) in bound.items()))
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._make_plan(bound)
        return plan

    def _make_plan(self, bound: dict[int, tuple[Backend, Any]]) -> TransferPlan:
        outputs = set(self.outputs)
        # valid[t]: the places holding tensor t's current value during the run
        valid: dict[int, dict[str, Backend | None]] = {}
        for t, (backend, _) in bound.items():
            if t not in outputs:
                valid[t] = {backend.name: backend}
        plan = TransferPlan([])
        seen_device = False

        def have(t: int, place: str, backend: Backend | None) -> None:
            places = valid.setdefault(t, {HOST: None})
            if place in places:
                return
            if HOST not in places:   # device -> host first (also the way between two devices)
                src_name, src = next(iter(places.items()))
                plan.commands.append(self._copy_out(src, t))
                plan.bytes_out += src.nbytes(self.buffer(src, t, bound))
                plan.kinds.append(("out", t, src_name))
                places[HOST] = None
                plan.host_after_device |= seen_device
            if place != HOST:
                plan.commands.append(self._copy_in(backend, t))
                plan.bytes_in += backend.nbytes(self.buffer(backend, t, bound))
                plan.kinds.append(("in", t, place))
                places[place] = backend

        for index, (program, backend, ins, outs) in enumerate(self.programs):
            place = self.place(backend)
            for t in ins:
                have(t, place, backend)
            plan.commands.append(self._run(program, backend, ins, outs))
            plan.kinds.append(("run", index))
            if place == HOST:
                plan.host_after_device |= seen_device
            else:
                seen_device = True
            for t in outs:
                valid[t] = {place: None if place == HOST else backend}
        for t in self.outputs:
            if t in bound:
                have(t, bound[t][0].name, bound[t][0])
            else:
                have(t, HOST, None)
        return plan

    # -- commands ---------------------------------------------------------------------------
    def _copy_in(self, backend: Backend, t: int):
        host = self.host

        def copy_in(wait_for: Sequence[Event]) -> Event:
            return backend.copy_in(self.buffer(backend, t), host[t], wait_for)
        return copy_in

    def _copy_out(self, backend: Backend, t: int):
        host = self.host

        def copy_out(wait_for: Sequence[Event]) -> Event:
            return backend.copy_out(self.buffer(backend, t), host[t], wait_for)
        return copy_out

    def _run(self, program: Program, backend: Backend, ins: list[int], outs: list[int]):
        host = self.host
        if backend.host_memory:
            def run_host(wait_for: Sequence[Event]) -> Event:
                for e in wait_for:
                    e.wait()
                out_arrays = [host.get(o) for o in outs]
                program.run([host[i] for i in ins], out_arrays)
                for o, arr in zip(outs, out_arrays):
                    host[o] = arr
                return COMPLETE
            return run_host

        def run_device(wait_for: Sequence[Event]) -> Event:
            return program.run([self.buffer(backend, i) for i in ins], [self.buffer(backend, o) for o in outs],
                               wait_for)
        return run_device

    def run(self, plan: TransferPlan, bound: dict[int, tuple[Backend, Any]] | None = None,
            wait_for: Sequence[Event] = ()) -> Event:
        """Replay ``plan`` with the binding it was made for; the first command waits for
        ``wait_for``, later ones for their predecessor."""
        self.bound = bound or {}
        event: Event = COMPLETE
        waits = list(wait_for)
        for command in plan.commands:
            event = command(waits)
            waits = [event] if event is not COMPLETE else []
        return event
