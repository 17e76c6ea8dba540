"""Arena planning: intermediates whose lifetimes do not overlap share memory.

Each tensor gets a usage record (size, first and last node that touches it); records
are placed greedily by decreasing size at the lowest offset that does not collide with
an already-placed record whose lifetime overlaps — the strategy LiteRT's GPU delegate
uses ("greedy by size").
"""
from __future__ import annotations

from dataclasses import dataclass

ALIGNMENT = 64


@dataclass(frozen=True)
class Usage:
    """One tensor's memory need: ``nbytes`` alive from node ``first`` to node ``last`` (inclusive)."""

    tensor: int
    nbytes: int
    first: int
    last: int


@dataclass
class ArenaPlan:
    """Byte offsets of tensors inside one arena of ``size`` bytes."""

    offsets: dict[int, int]
    size: int
    naive_size: int  # what the tensors would take without sharing

    @property
    def saving(self) -> float:
        """The share of memory saved by sharing (0..1)."""
        return 0.0 if self.naive_size == 0 else 1 - self.size / self.naive_size


def _align(n: int, alignment: int = ALIGNMENT) -> int:
    return (n + alignment - 1) // alignment * alignment


def plan_arena(usages: list[Usage], alignment: int = ALIGNMENT) -> ArenaPlan:
    """Greedy-by-size placement of ``usages`` into one arena; offsets are multiples of ``alignment``."""
    placed: list[tuple[int, int, Usage]] = []  # (offset, end, usage)
    offsets: dict[int, int] = {}
    for u in sorted(usages, key=lambda u: (-u.nbytes, u.first, u.tensor)):
        size = _align(max(u.nbytes, 1), alignment)
        live = sorted((off, end) for off, end, other in placed
                      if not (other.last < u.first or u.last < other.first))
        offset = 0
        for off, end in live:
            if offset + size <= off:
                break
            offset = max(offset, end)
        offsets[u.tensor] = offset
        placed.append((offset, offset + size, u))
    size = max((end for _, end, _ in placed), default=0)
    return ArenaPlan(offsets, size, sum(_align(max(u.nbytes, 1), alignment) for u in usages))
