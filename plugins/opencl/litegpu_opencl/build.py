"""Building OpenCL programs, through the kernel cache when there is one.

Placeholder until the cache lands: builds from source every time.
"""
from __future__ import annotations

from typing import Any

from litegpu.backend import CompileOptions
from litegpu.errors import UnsupportedError

from .device import Device

BUILD_OPTIONS = ""   # no fast-math: results must match LiteRT's fp32


def build_program(device: Device, source: str, options: CompileOptions) -> tuple[Any, bool]:
    """The built program and whether it came from the cache."""
    cl = device.cl
    try:
        return cl.Program(device.context, source).build(BUILD_OPTIONS), False
    except cl.Error as exc:
        raise UnsupportedError(f"OpenCL program failed to build: {exc}") from None
