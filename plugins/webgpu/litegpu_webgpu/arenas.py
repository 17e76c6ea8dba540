"""Where a partition's intermediate tensors live: a few arenas, each tensor bound at its offset.

As on the other GPU backends, intermediates whose lifetimes do not overlap share memory
(:func:`litegpu.memory.plan_arena`), at offsets that are multiples of the device's
``minStorageBufferOffsetAlignment`` (binding offsets must be).

One arena is not enough on WebGPU: a dispatch may not bind one buffer both read-only and
writable (wgpu: "conflicting usages ... STORAGE_READ_WRITE is an exclusive usage"), and
a kernel that reads one intermediate and writes another would do exactly that. So the
intermediates are coloured: two tensors that one dispatch reads and writes get different
arenas (greedy colouring in order of first use: a chain of kernels alternates between two
arenas; a tensor read alongside two later ones needs a third), and tensors of one colour
share an arena by lifetime. An arena over the device's ``maxBufferSize`` gives each of
its tensors a buffer of its own.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from litegpu.memory import Usage, plan_arena


@dataclass
class ArenaPlan:
    """Each intermediate's (buffer number, byte offset) and each buffer's size."""

    placement: dict[int, tuple[int, int]] = field(default_factory=dict)
    sizes: list[int] = field(default_factory=list)
    naive_bytes: int = 0   # what the tensors would take without sharing

    @property
    def total(self) -> int:
        """Bytes of all the buffers."""
        return sum(self.sizes)


def colour(dispatches: list[tuple[set[int], set[int]]], order: list[int]) -> dict[int, int]:
    """An arena number per tensor such that no dispatch's (reads, writes) share one.

    ``order`` lists the tensors by first use; each takes the lowest number none of its
    conflicting tensors already has."""
    conflicts: dict[int, set[int]] = {t: set() for t in order}
    for reads, writes in dispatches:
        for r in reads - writes:
            for w in writes:
                conflicts[r].add(w)
                conflicts[w].add(r)
    colours: dict[int, int] = {}
    for t in order:
        taken = {colours[o] for o in conflicts[t] if o in colours}
        colours[t] = next(c for c in range(len(taken) + 1) if c not in taken)
    return colours


def plan(usages: list[Usage], dispatches: list[tuple[set[int], set[int]]], alignment: int,
         max_buffer: int) -> ArenaPlan:
    """The buffers of ``usages`` (tensor, bytes, first and last step), given the tensors each
    dispatch reads and writes (see the module docstring)."""
    order = [u.tensor for u in sorted(usages, key=lambda u: (u.first, u.tensor))]
    colours = colour(dispatches, order)
    result = ArenaPlan()
    for c in sorted(set(colours.values())):
        members = [u for u in usages if colours[u.tensor] == c]
        arena = plan_arena(members, alignment=alignment)
        result.naive_bytes += arena.naive_size
        if arena.size <= max_buffer:
            buffer = len(result.sizes)
            result.sizes.append(arena.size)
            result.placement.update((t, (buffer, offset)) for t, offset in arena.offsets.items())
            continue
        for u in members:   # too big for one buffer: one buffer each
            result.placement[u.tensor] = (len(result.sizes), 0)
            result.sizes.append(max(u.nbytes, 4))
    return result
