"""The shapes of the objects backends return for events and graph captures.

Backends return their own classes; these protocols say what the core and the suite rely on.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["HalEvent", "CapturedGraph"]


@runtime_checkable
class HalEvent(Protocol):
    """An event shaped like ``torch.Event``; IPC events are exported as bytes and imported elsewhere."""

    def record(self, stream: object | None = None) -> None:
        """Record on ``stream`` (the current stream when None)."""

    def wait(self, stream: object | None = None) -> None:
        """Make ``stream`` (the current stream when None) wait until the event completes."""

    def query(self) -> bool:
        """True when the work recorded before the event has completed."""

    def synchronize(self) -> None:
        """Block the host until the event completes (bounded on backends that can time out)."""


@runtime_checkable
class CapturedGraph(Protocol):
    """Work captured by ``HiSparseBackend.capture()``; ``replay()`` runs it again."""

    def replay(self) -> None:
        """Run the captured work on the current stream."""
