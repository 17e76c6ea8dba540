"""litegpu: run TensorFlow Lite / LiteRT models on pluggable, JIT-compiled backends."""
from __future__ import annotations

__version__ = "0.1.0"

from .errors import (BackendUnavailableError, ConcurrentUseError, ExecutionError, InvalidArgumentError,
                     KernelBuildError, LiteGpuError, ModelFormatError, ResourceLimitError, UnsupportedError)
from .model import load_model
from .executor import Limits
from .interpreter import Interpreter, SignatureRunner
from .session import Delegate, load_delegate
from .compiled_model import (CompiledModel, CpuOptions, Environment, GpuOptions, HardwareAccelerator, Options,
                             TensorBuffer)
from .profile import Profiler, profile   # note: ``litegpu.profile`` is then this function

__all__ = [
    "__version__", "LiteGpuError", "ModelFormatError", "UnsupportedError", "KernelBuildError", "BackendUnavailableError",
    "InvalidArgumentError", "ExecutionError", "ConcurrentUseError", "ResourceLimitError", "load_model", "Interpreter", "Limits",
    "SignatureRunner", "Delegate", "load_delegate", "CompiledModel", "CpuOptions", "Environment", "GpuOptions",
    "HardwareAccelerator", "Options", "TensorBuffer", "profile", "Profiler",
]
