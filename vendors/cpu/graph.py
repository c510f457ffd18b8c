"""Graph capture and replay on the CPU reference device.

Invariant: while a thread captures (its "current stream" is capturing), swaps and gathers are recorded
into the graph and not run; ``replay()`` runs them in order once the capture block ended normally.
Capture state is per thread, like a current stream, and is cleared however the block exits.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

from hisparse_hal.errors import CaptureMisuseError

__all__ = ["CapturedOp", "CpuGraph", "capture_graph", "current_graph", "refuse_while_capturing"]

_current = threading.local()


class CapturedOp:
    """One recorded operation: ``check()`` validates it against the present state, ``run()`` runs it."""

    def __init__(self, name: str, run: Callable[[], None], check: Callable[[], None] | None = None) -> None:
        self.name = name
        self.run = run
        self.check = check or (lambda: None)

    def __repr__(self) -> str:
        return f"CapturedOp({self.name!r})"


class CpuGraph:
    """Work captured by :func:`capture_graph`; ``replay()`` runs it again, as often as wanted."""

    def __init__(self) -> None:
        self._ops: list[CapturedOp] = []
        self._status = "capturing"  # then "complete" or "failed"

    @property
    def status(self) -> str:
        """``"capturing"``, ``"complete"`` (replayable) or ``"failed"`` (the capture block raised)."""
        return self._status

    @property
    def operations(self) -> tuple[str, ...]:
        """Names of the captured operations, in order."""
        return tuple(op.name for op in self._ops)

    def record(self, op: CapturedOp) -> None:
        """Append ``op`` (called by the backend while this graph is capturing)."""
        if self._status != "capturing":
            raise CaptureMisuseError(f"cannot record {op.name} into a graph whose capture has ended")
        self._ops.append(op)

    def replay(self) -> None:
        """Run the captured operations in order on the calling thread.

        Every operation is checked before any runs, so a replay that fails on a check changes nothing.

        Raises:
            CaptureMisuseError: the capture has not ended, it failed, or this thread is capturing.
            InvalidArgumentError: a captured operation no longer fits the present state (for example a
                swap whose pinned region was released), naming it.
        """
        if self._status == "capturing":
            raise CaptureMisuseError("replay() called before the capture ended; leave the capture() block first")
        if self._status == "failed":
            raise CaptureMisuseError(
                "replay() of a capture whose block raised; the graph is incomplete, capture again"
            )
        refuse_while_capturing("CpuGraph.replay")
        for op in self._ops:
            op.check()
        for op in self._ops:
            op.run()


def current_graph() -> CpuGraph | None:
    """The graph this thread is capturing into, or None."""
    return getattr(_current, "graph", None)


def refuse_while_capturing(operation: str) -> None:
    """Raise if this thread is capturing; the capture stays usable.

    Raises:
        CaptureMisuseError: naming ``operation``.
    """
    if current_graph() is not None:
        raise CaptureMisuseError(
            f"{operation} cannot run while the current stream is capturing: it changes host state or "
            "crosses a process boundary, which a graph cannot record. Call it before or after the "
            "capture; the capture is still valid"
        )


@contextlib.contextmanager
def capture_graph() -> Iterator[CpuGraph]:
    """Capture this thread's swaps and gathers into a :class:`CpuGraph`.

    Raises:
        CaptureMisuseError: this thread is already capturing (nested captures are not supported).
    """
    if current_graph() is not None:
        raise CaptureMisuseError(
            "capture() called while the current stream is already capturing; nested captures are not "
            "supported, end the outer capture first (it is still valid)"
        )
    graph = CpuGraph()
    _current.graph = graph
    try:
        yield graph
    except BaseException:
        graph._status = "failed"
        raise
    else:
        graph._status = "complete"
    finally:
        _current.graph = None
