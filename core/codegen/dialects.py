"""Every kernel dialect by name, as plugins register them (``litegpu_dialects``).

The C family's tables (:mod:`.opencl`, :mod:`.cuda`, :mod:`.metal`) and WGSL
(:mod:`.wgsl`) live beside their renderers; the plugin that runs each API registers it,
and a third party's GPU API brings its own dialect the same way, so adding one is a new
module, not an edit here.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping

from .dialect import Dialect
from .wgsl import WgslDialect


class _Registered(Mapping):
    """A read-only view of the plugin manager's dialects (plugins load on first use)."""

    def _all(self) -> dict[str, Dialect | WgslDialect]:
        from litegpu.plugins import manager
        return manager().dialects

    def __getitem__(self, name: str) -> Dialect | WgslDialect:
        dialects = self._all()
        if name not in dialects:
            raise KeyError(f"no kernel dialect {name!r}; registered: {', '.join(sorted(dialects))}")
        return dialects[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


#: Every registered dialect by name: the C family's tables, WGSL, and any plugin's.
DIALECTS: Mapping[str, Dialect | WgslDialect] = _Registered()
