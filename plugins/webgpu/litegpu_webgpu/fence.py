"""Completion of submitted work: a mapped read behind the run's last command.

Each run's command buffer ends with a 4-byte copy into a small ``MAP_READ`` buffer (a
fence), and the run's event is that buffer's ``map_async``: WebGPU resolves a mapping
once the queue has finished the work that used the buffer, and the queue runs
submissions in order, so the mapping resolves when the whole run is done. wgpu-py's poll
thread waits in the driver meanwhile.

``queue.on_submitted_work_done`` would say the same without the copy, but wgpu 0.32
cannot call it (its callback lacks the message argument of wgpu-native's header:
pygfx/wgpu-py#834, fixed after 0.32), while the mapped read works on every version.

Fences are reused: one whose mapping resolved is unmapped and handed out again, whether
or not anyone waited for its event.
"""
from __future__ import annotations

import collections
import threading
from typing import TYPE_CHECKING, Any

from litegpu.backend import Event

if TYPE_CHECKING:
    from .device import Device

FENCE_BYTES = 4


def settled(promise: Any) -> bool:
    """True when a ``wgpu.GPUPromise`` has its result (the driver's callback ran).

    wgpu-py (0.31, 0.32) has no public query that does not block; its promise leaves the
    "pending" state as soon as the poll thread hands it the result."""
    return getattr(promise, "_state", "pending") != "pending"


class WebGpuEvent(Event):
    """Completion of one submission (see the module docstring)."""

    def __init__(self, device: "Device", fence: Any, promise: Any) -> None:
        self.device = device
        self._fence = fence
        self._promise = promise
        self._done = False
        self._lock = threading.Lock()

    def wait(self, wait_type: str = "passive") -> None:
        """Block until the work is done. Either wait type blocks in the driver: wgpu-py's
        poll thread does the waiting for every promise."""
        promise = self._promise   # None once another thread saw it done
        if self._done or promise is None:
            return
        try:
            # Also where wgpu-py finishes the mapping (its promise resolves in the waiting thread).
            promise.sync_wait()
        except Exception as exc:   # noqa: BLE001 - a rejected mapping: the device failed or was lost
            raise self.device.failure("waiting for a run", exc) from None
        self._recycle()

    @property
    def done(self) -> bool:
        """True once the event was seen complete (its fence is back in the pool)."""
        return self._done

    def is_complete(self) -> bool:
        """True when the work is done (raises, as :meth:`wait`, when it failed)."""
        promise = self._promise
        if self._done or promise is None:
            return True
        if not settled(promise):
            return False
        self.wait()   # at once: the result is there
        return True

    def _recycle(self) -> None:
        """Hand the fence back (once), unmapped, for a later run."""
        with self._lock:
            if self._done:
                return
            self._done = True
            fence, self._fence, self._promise = self._fence, None, None
        self.device.fences.release(fence)


def _finished(event: WebGpuEvent) -> bool:
    """True when ``event`` is complete, or failed (its waiter gets the error; its fence is dropped)."""
    try:
        return event.is_complete()
    except Exception:   # noqa: BLE001 - reported to whoever waits for it
        return True


class FencePool:
    """The fences of one device: a source buffer every run copies from, and the mappable
    targets, reused once their mapping resolved."""

    def __init__(self, device: "Device") -> None:
        self.device = device
        self._free: list[Any] = []
        self._pending: collections.deque[WebGpuEvent] = collections.deque()
        self._lock = threading.Lock()
        self._source: Any = None

    def source(self) -> Any:
        """The 4-byte buffer each fence copies from."""
        if self._source is None:
            usage = self.device.wgpu.BufferUsage
            self._source = self.device.device.create_buffer(size=FENCE_BYTES, usage=usage.COPY_SRC)
        return self._source

    def acquire(self) -> Any:
        """An unmapped fence buffer (a new one when none is free)."""
        with self._lock:
            if self._free:
                return self._free.pop()
            pending, self._pending = self._pending, collections.deque()
        # Events nobody waited for still hold their fences: the finished ones hand them back
        # (outside the lock: handing back takes it).
        unfinished = [event for event in pending if not _finished(event)]
        with self._lock:
            self._pending.extendleft(reversed(unfinished))
            if self._free:
                return self._free.pop()
        usage = self.device.wgpu.BufferUsage
        return self.device.device.create_buffer(size=FENCE_BYTES, usage=usage.MAP_READ | usage.COPY_DST)

    def track(self, fence: Any) -> WebGpuEvent:
        """The event of the submission just made, whose last command copied into ``fence``."""
        event = WebGpuEvent(self.device, fence, fence.map_async("READ"))
        with self._lock:
            # Runs finish in order: the waited-for ones leave from the front, so the queue
            # holds only the events still running or never waited for.
            while self._pending and self._pending[0].done:
                self._pending.popleft()
            self._pending.append(event)
        return event

    def release(self, fence: Any) -> None:
        """``fence``, whose mapping resolved, back into the pool."""
        try:
            fence.unmap()
        except self.device.wgpu.GPUError:   # a lost device: the fence is useless, drop it
            return
        with self._lock:
            self._free.append(fence)
