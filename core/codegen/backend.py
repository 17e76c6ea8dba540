"""The part of a GPU backend that is the same for every API whose kernels codegen renders."""
from __future__ import annotations

import functools
import threading
from typing import Any, Callable, TypeVar

from litegpu.backend import Backend, NodeContext, Support
from litegpu.errors import BackendUnavailableError
from litegpu.graph import Model

from . import planning
from .dialect import Dialect
from .dialects import DIALECTS
from .render import kernel_lanes
from .wgsl import WgslDialect

T = TypeVar("T")


def once(open_device: Callable[[], T]) -> Callable[[], T]:
    """``open_device`` called at most once per process, under a lock (two threads never
    open two devices); a call that raises is not remembered, so the next one tries again."""
    lock, opened = threading.Lock(), []

    @functools.wraps(open_device)
    def default() -> T:
        with lock:
            if not opened:
                opened.append(open_device())
            return opened[0]
    return default


class CodegenBackend(Backend):
    """A GPU backend whose kernels :mod:`litegpu.codegen` renders in its :attr:`dialect`.

    It takes the nodes the kernels render and groups them as the kernels fuse
    (:mod:`.planning`), both in :meth:`dialect_object`; it is available when
    :meth:`open_device` opens the device. A subclass sets ``name``, ``dialect`` and
    ``gpu_priority`` and adds the runtime: ``open_device``, ``compile``, device memory and
    copies.
    """

    is_gpu = True
    host_memory = False
    #: The name of the dialect (in :data:`litegpu.codegen.DIALECTS`) this backend's kernels
    #: render in: "opencl", "cuda", "metal", "wgsl", or a plugin's own. Read by
    #: ``litegpu compile --out``, which renders a model's programs without a device.
    dialect: str = ""

    def open_device(self) -> Any:
        """The default device (opened once, lazily; it has an ``info()`` dict), or
        BackendUnavailableError saying why there is none."""
        raise BackendUnavailableError(f"backend {self.name!r} does not say how to open its device")

    def available(self) -> tuple[bool, str]:
        try:
            self.open_device()
        except BackendUnavailableError as exc:
            return False, str(exc)
        return True, ""

    def device_info(self) -> dict:
        try:
            return self.open_device().info()
        except BackendUnavailableError as exc:
            return {"error": str(exc)}

    def offline_build(self, source: str) -> dict[str, bytes]:
        """What building ``source`` (a program in :attr:`dialect`) yields without a
        device, as {file name: contents} (cuda: PTX per GPU arch); raises, with the
        compiler's log, when it does not build. Called by ``litegpu compile --out``.
        Default: nothing (the source alone is the artifact)."""
        return {}

    def dialect_object(self) -> Dialect | WgslDialect:
        """The dialect this backend's kernels render in: ``DIALECTS[self.dialect]``.

        A backend whose device sets one of the dialect's limits returns its own copy (WebGPU
        asks its device for more storage buffers per stage than WGSL's 8, so its kernels may
        bind as many: ``dataclasses.replace(WGSL, max_buffers=...)``); planning
        (:meth:`supports`, :meth:`schedule`) and rendering then use that copy."""
        return DIALECTS[self.dialect]

    def supports(self, node: NodeContext, model: Model) -> Support:
        return planning.supports(node, model, self.dialect_object())

    def schedule(self, nodes: list[NodeContext], outputs: list[int]) -> list[list[int]]:
        """Each producer with the elementwise nodes folded into its kernel (see :mod:`.fusion`)."""
        return planning.schedule(nodes, outputs, self.dialect_object(), self.kernel_lanes())

    def kernel_lanes(self) -> int:
        """Work-items a kernel puts on one row or output on the default device
        (:func:`.render.kernel_lanes`): a GPU's, unless a subclass says its device is a CPU."""
        return kernel_lanes()
