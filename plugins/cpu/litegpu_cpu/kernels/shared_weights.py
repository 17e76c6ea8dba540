"""Weights packed once for every node that reads them.

A decoder's ``prefill_N`` and ``decode`` signatures are separate subgraphs whose products
name the same constant buffers; packing each node's weights for itself kept two copies of
every layer (a 100M int8 decoder: 162 MB of packed weights where 81 MB hold them), and the
prefill's copy went cold in the cache while decode steps ran. XNNPACK's weights cache shares
them the same way.

A packing is found by what it was made from: the source arrays' memory (address, shape,
strides, dtype), a name for the kind of packing, and the parameters that change it. The
holder keeps the source arrays alive, so their memory cannot be freed and reused by another
model's constants while the packing is still found there; it lives as long as a node holds
it (a weak-valued table), and goes with the last model using it.
"""
from __future__ import annotations

import threading
import weakref
from typing import Any, Callable

import numpy as np


class SharedPacking:
    """A packing (``value``) and the arrays it was made from (``sources``, kept alive)."""

    __slots__ = ("value", "sources", "__weakref__")

    def __init__(self, value: Any, sources: tuple[np.ndarray, ...]) -> None:
        self.value = value
        self.sources = sources


_TABLE: "weakref.WeakValueDictionary[tuple, SharedPacking]" = weakref.WeakValueDictionary()
_LOCK = threading.Lock()


def _memory(a: np.ndarray) -> tuple:
    return a.__array_interface__["data"][0], a.shape, a.strides, a.dtype.str


def shared_packing(kind: str, sources: tuple[np.ndarray, ...], params: tuple,
                   pack: Callable[[], Any]) -> SharedPacking:
    """The packing ``pack()`` makes of ``sources`` (with ``params``), made by the first node
    that asks and found by the others; keep the returned holder as long as its value is used."""
    key = (kind, params, *(_memory(a) for a in sources))
    with _LOCK:    # (models compile on several threads: one packing each)
        held = _TABLE.get(key)
        if held is None:
            held = _TABLE[key] = SharedPacking(pack(), sources)
    return held
