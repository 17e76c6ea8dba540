"""Every error litegpu raises derives from :class:`LiteGpuError`."""
from __future__ import annotations


class LiteGpuError(Exception):
    """Base class of every error raised by litegpu."""


class ModelFormatError(LiteGpuError, ValueError):
    """The model file is malformed, truncated or hostile; the message names the field."""


class UnsupportedError(LiteGpuError):
    """The model uses something no available backend can run (op, dtype, model kind)."""


class KernelBuildError(UnsupportedError):
    """A GPU API's compiler refused a generated kernel. The message names the node and
    op whose kernel failed, where its source was saved, and the compiler's log."""

    def __init__(self, message: str, node: int | None = None, op: str = "", source_path: str = "",
                 log: str = "") -> None:
        super().__init__(message)
        self.node, self.op, self.source_path, self.log = node, op, source_path, log


class BackendUnavailableError(LiteGpuError):
    """A backend was asked for by name but cannot be used here; the message says why."""


class PluginError(LiteGpuError):
    """A plugin broke the plugin contract (``litegpu.hookspecs``, ``litegpu.backend``): a
    hook returned a malformed backend, or a backend's ``compile`` a malformed program.
    The message names the plugin (and its distribution) or the backend, and the fault."""


class InvalidArgumentError(LiteGpuError, ValueError):
    """A caller passed a wrong tensor index, shape, dtype or option."""


class ExecutionError(LiteGpuError, RuntimeError):
    """A kernel or control-flow op failed while the model ran."""


class ConcurrentUseError(ExecutionError):
    """A call on an Interpreter overlapped a call on the same interpreter from another
    thread; the message names both calls and threads. An Interpreter is used by one
    thread at a time (a ``RuntimeError`` too, as LiteRT raises for overlapping calls)."""


class ResourceLimitError(LiteGpuError):
    """A configured limit (memory, loop iterations, rank) would be exceeded."""


class Unbound(Exception):
    """Raised by a stateful op's bound call (``OpDef.bind``) whose outputs no longer fit
    the arrays it was bound to (a variable assigned a new shape): the program runs the
    node the unbound way, from its ``execute``."""
