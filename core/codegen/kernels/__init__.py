"""The GPU kernel generators, by op name.

A generator takes a :class:`~litegpu.codegen.NodeGen` for one node and returns its
kernels (usually one), built as :mod:`litegpu.codegen.ir` trees and rendered in the
node's dialect. It raises :class:`Decline` with a reason for a variant it cannot run; the
node then falls back to cpu and the reason is reported. Generators registered with
``epilogue=True`` write their output through ``NodeGen.store_output``, so elementwise
nodes that follow can be folded into their store (see :mod:`litegpu.codegen.fusion`).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

from ..nodegen import KernelSpec, NodeGen


class Decline(Exception):
    """A generator cannot run this variant of its op; the message says why."""


@dataclass(frozen=True)
class Generator:
    """A registered generator, and whether it honours followers (see module docstring)."""

    fn: Callable[[NodeGen], list[KernelSpec]]
    epilogue: bool = False


GENERATORS: dict[str, Generator] = {}


def generator(*ops: str, epilogue: bool = False):
    """Register the decorated function as the generator of ``ops``."""
    def wrap(fn: Callable[[NodeGen], list[KernelSpec]]):
        for op in ops:
            GENERATORS[op] = Generator(fn, epilogue)
        return fn
    return wrap


_MODULES = ("elementwise", "conv", "pool", "layout", "lstm", "composite", "hybrid")


def load_all() -> dict[str, Generator]:
    """Import every generator module (once) and return the registry."""
    for name in _MODULES:
        try:
            importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
    return GENERATORS
