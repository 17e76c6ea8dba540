"""Conformance cases, one module per op group; each module defines ``CASES: list[Case]``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass
class Case:
    """One op variant: a one-op (or few-op) model and inputs, compared against LiteRT.

    ``build`` returns ``(model_bytes, inputs)``; ``tol`` bounds
    ``max|litegpu - litert| / max(max|litert|, 1)`` over every output.
    """

    op: str
    variant: str
    build: Callable[[], tuple[bytes, list[np.ndarray]]]
    tol: float = 1e-5

    @property
    def id(self) -> str:
        """Stable test id, e.g. ``CONV_2D-stride2-same-relu6``."""
        return f"{self.op}-{self.variant}"
