"""IPC events that refuse to pass a known record/wait cycle limit instead of breaking silently.

ROCm 7.2.x emulates IPC events with a 32-slot shared-memory ring whose wait indexes the ring without the
modulo, so from the 33rd record on, waits read past it and stop ordering anything (vLLM #57602;
rocm-systems #11511). Invariant: a limited event never issues a record or wait beyond the limit; the
caller gets ``UnsupportedCapabilityError`` and must fall back to a local event plus a host barrier.
"""

from __future__ import annotations

import threading

from hisparse_hal.errors import UnsupportedCapabilityError
from hisparse_hal.vendors.gpu.events import GpuIpcEvent

__all__ = ["CycleLimitedIpcEvent"]


class CycleLimitedIpcEvent(GpuIpcEvent):
    """A :class:`GpuIpcEvent` that counts its records and waits and refuses the cycle past ``max_cycles``.

    Args:
        event: the event to guard (created or imported by the shared GPU layer).
        max_cycles: the last allowed record (and, separately, the last allowed wait).
        runtime: the runtime version that imposes the limit, for the message.
    """

    def __init__(self, event: GpuIpcEvent, max_cycles: int, runtime: str) -> None:
        super().__init__(event.torch_event, event.device_index, event.timeout_s, event.imported)
        self.max_cycles = max_cycles
        self.runtime = runtime
        self.records = 0
        self.waits = 0
        self._lock = threading.Lock()

    def _take(self, kind: str) -> None:
        with self._lock:
            done = self.records if kind == "record" else self.waits
            if done >= self.max_cycles:
                raise UnsupportedCapabilityError(
                    f"IPC event {kind} {done + 1} refused: HIP {self.runtime} IPC events break after "
                    f"{self.max_cycles} record/wait cycles (vLLM #57602; rocm-systems #11511). Nothing was "
                    "enqueued. Synchronize ranks with a local event plus a host barrier instead, and keep "
                    "one host pool per rank (capabilities.shared_host_pool is False here)"
                )
            if kind == "record":
                self.records += 1
            else:
                self.waits += 1

    def record(self, stream: object | None = None) -> None:
        """Record, unless this would be record ``max_cycles + 1``.

        Raises:
            UnsupportedCapabilityError: the limit is reached; nothing was recorded.
        """
        self._take("record")
        super().record(stream)

    def wait(self, stream: object | None = None) -> None:
        """Wait, unless this would be wait ``max_cycles + 1``.

        Raises:
            UnsupportedCapabilityError: the limit is reached; nothing was enqueued.
        """
        self._take("wait")
        super().wait(stream)
