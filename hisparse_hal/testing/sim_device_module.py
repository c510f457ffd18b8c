"""SIMULATED torch device module for the GPU backends on a CPU-only machine: what
:class:`~hisparse_hal.vendors.gpu.device_module.GpuDeviceModule` asks of torch (current stream, capture state,
synchronisation, IPC events), answered by attributes a test sets and counted, so no ``torch.cuda`` is needed."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from hisparse_hal.errors import UnsupportedCapabilityError

__all__ = ["SimulatedDeviceModule"]


class SimulatedDeviceModule:
    """Stands in for torch's device module under a simulated vendor runtime.

    Args:
        stream: the raw current-stream handle swaps are enqueued on (0 is the legacy default stream).
        capturing: what ``is_current_stream_capturing`` answers (tests flip it).
        on_synchronize: what a device synchronisation does (the simulator's: every queued copy lands).
        event_class: a class with ``torch.cuda.Event``'s constructor and ``from_ipc_handle`` (e.g.
            ``SimulatedIpcRing.event_class()``); None: IPC events are not simulated.

    ``synchronizations`` counts :meth:`synchronize` calls; ``scopes`` lists the device indices made current.
    """

    def __init__(
        self,
        stream: int = 0x5A00,
        *,
        capturing: bool = False,
        on_synchronize: Callable[[], object] | None = None,
        event_class: type | None = None,
    ) -> None:
        self.stream = stream
        self.capturing = capturing
        self.on_synchronize = on_synchronize
        self.event_class = event_class
        self.synchronizations = 0
        self.scopes: list[int | None] = []

    def scope(self, index: int | None = None) -> contextlib.AbstractContextManager[object]:
        """Record ``index`` and change nothing."""
        self.scopes.append(index)
        return contextlib.nullcontext()

    def current_stream_handle(self) -> int:
        """The ``stream`` attribute."""
        return self.stream

    def synchronize(self) -> None:
        """Count the call and run ``on_synchronize``."""
        self.synchronizations += 1
        if self.on_synchronize is not None:
            self.on_synchronize()

    def is_current_stream_capturing(self) -> bool:
        """The ``capturing`` attribute."""
        return self.capturing

    def new_graph(self) -> Any:
        """Raises: UnsupportedCapabilityError: graph capture is not simulated."""
        raise UnsupportedCapabilityError("SIMULATED device module: graph capture is not simulated")

    def graph_capture(self, graph: Any) -> contextlib.AbstractContextManager[object]:
        """Raises: UnsupportedCapabilityError: graph capture is not simulated."""
        raise UnsupportedCapabilityError("SIMULATED device module: graph capture is not simulated")

    def ipc_event(self) -> Any:
        """An ``event_class`` instance made as the GPU layer makes one (timing off, interprocess).

        Raises:
            UnsupportedCapabilityError: no ``event_class`` was given.
        """
        return self._events()(enable_timing=False, blocking=False, interprocess=True)

    def open_ipc_event(self, index: int, handle: bytes) -> Any:
        """``event_class.from_ipc_handle(index, handle)``.

        Raises:
            UnsupportedCapabilityError: no ``event_class`` was given.
        """
        return self._events().from_ipc_handle(index, handle)  # type: ignore[attr-defined]

    def _events(self) -> type:
        if self.event_class is None:
            raise UnsupportedCapabilityError("SIMULATED device module: IPC events are not simulated here")
        return self.event_class
