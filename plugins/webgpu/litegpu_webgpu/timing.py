"""Device times of each dispatch from timestamp queries, for the profiler.

Where the device has ``timestamp-query``, a profiled run (``litegpu.profile()``) records
each launch in a compute pass of its own, stamped at its beginning and end; the stamps
are resolved into a buffer in the same submission and read back once the run's event has
completed, in nanoseconds (wgpu-native's ticks times the queue's timestamp period). The
profiler places them on its host clock by taking the first dispatch's start as the time
the run was submitted (WebGPU has no "queued" stamp), so the slices' lengths are the
device's own and their positions are relative to the run.

A pass per dispatch gives the driver a point between dispatches it may otherwise not have
waited at, so a profiled run can be slower than an unprofiled one; the opencl backend's
profiling queue has the same effect.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .device import Device
    from .fence import WebGpuEvent

#: WebGPU allows 4096 queries per set: two per dispatch.
MAX_TIMED_DISPATCHES = 2048


def timestamp_period(device: "Device") -> float:
    """Nanoseconds per timestamp tick (``wgpuQueueGetTimestampPeriod``; 1.0 where wgpu-py's
    native library does not expose it)."""
    try:
        from wgpu.backends.wgpu_native._api import lib
        return float(lib.wgpuQueueGetTimestampPeriod(device.queue._internal)) or 1.0
    except Exception:   # noqa: BLE001 - another wgpu build: the spec's unit, nanoseconds
        return 1.0


class Timestamps:
    """The stamps of one submission's ``count`` dispatches: where each pass writes its two,
    the resolve that ends the command buffer, and, once the run is done, the times."""

    def __init__(self, device: "Device", count: int) -> None:
        if not 0 < count <= MAX_TIMED_DISPATCHES:
            raise ValueError(f"{count} dispatches: timestamps take 1 to {MAX_TIMED_DISPATCHES}")
        usage = device.wgpu.BufferUsage
        self.device, self.count = device, count
        self.query_set = device.device.create_query_set(type="timestamp", count=2 * count)
        self.buffer = device.device.create_buffer(size=16 * count, usage=usage.QUERY_RESOLVE | usage.COPY_SRC)
        self.event: "WebGpuEvent | None" = None
        self._ns: np.ndarray | None = None

    def writes(self, j: int) -> dict[str, Any]:
        """Pass ``j``'s timestamp writes (its beginning and end)."""
        return {"query_set": self.query_set, "beginning_of_pass_write_index": 2 * j,
                "end_of_pass_write_index": 2 * j + 1}

    def resolve(self, encoder: Any) -> None:
        """Copy the stamps into the readable buffer (recorded after the last pass)."""
        encoder.resolve_query_set(self.query_set, 0, 2 * self.count, self.buffer, 0)

    def nanoseconds(self) -> np.ndarray:
        """[beginning, end] of each dispatch in ns; waits for the run the first time."""
        if self._ns is None:
            self.event.wait()
            with self.device.calls("reading the timestamps"):
                raw = np.frombuffer(self.device.queue.read_buffer(self.buffer), np.uint64)
            self._ns = raw.astype(np.float64).reshape(self.count, 2) * timestamp_period(self.device)
        return self._ns

    def dispatch(self, j: int) -> "DispatchTimes":
        """Dispatch ``j``'s times, as :meth:`litegpu.profile.Profiler.add_device` reads an event."""
        return DispatchTimes(self, j)


class DispatchTimes:
    """One dispatch's times in the shape of a profiling event: ``wait()`` and ``profile``
    (``queued``, ``start``, ``end`` in ns; queued is the run's first start)."""

    def __init__(self, stamps: Timestamps, j: int) -> None:
        self.stamps, self.j = stamps, j

    def wait(self) -> None:
        self.stamps.nanoseconds()

    @property
    def profile(self) -> SimpleNamespace:
        ns = self.stamps.nanoseconds()
        return SimpleNamespace(queued=ns[0, 0], start=ns[self.j, 0], end=ns[self.j, 1])
