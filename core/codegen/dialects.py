"""Every dialect by name (one module per GPU API holds its table)."""
from __future__ import annotations

from .cuda import CUDA
from .dialect import Dialect
from .metal import METAL
from .opencl import OPENCL
from .wgsl import WGSL, WgslDialect

#: Every dialect by name: the C family's tables, and WGSL.
DIALECTS: dict[str, Dialect | WgslDialect] = {d.name: d for d in (OPENCL, CUDA, METAL, WGSL)}
