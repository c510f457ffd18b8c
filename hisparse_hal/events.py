"""The shapes of the objects backends return for events and graph captures, and the one check of an event
wait's bound in seconds.

Backends return their own classes; these protocols say what the core and the suite rely on.
"""

from __future__ import annotations

import enum
import math
from typing import Final, Protocol, runtime_checkable

from .errors import InvalidArgumentError

__all__ = ["DEFAULT_TIMEOUT", "CapturedGraph", "HalEvent", "WaitDefault", "check_timeout_s", "wait_bound"]


class WaitDefault(enum.Enum):
    """The type of :data:`DEFAULT_TIMEOUT`."""

    EVENT_TIMEOUT_S = "the event's timeout_s"


#: ``synchronize``'s default ``timeout``: the event's own ``timeout_s`` (``None`` means no bound at all).
DEFAULT_TIMEOUT: Final = WaitDefault.EVENT_TIMEOUT_S


def check_timeout_s(value: object, name: str = "timeout_s", hint: str = "") -> float:
    """``value`` as a bound in seconds: a positive, finite int or float (not a bool, NaN or infinity).

    The one check of every event bound: backend constructors, ``create_event``/``import_event``, an event's
    ``timeout_s`` and each call's ``timeout`` (the environment variable goes through
    :func:`hisparse_hal.settings.positive_setting`, which applies the same rule to its text).

    Raises:
        InvalidArgumentError: naming ``name`` and the value (and ``hint``, what to pass instead).
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            seconds = float(value)
        except OverflowError:  # an int past float's range
            seconds = math.inf
        if 0 < seconds < math.inf:
            return seconds
    raise InvalidArgumentError(f"{name} must be a positive, finite number of seconds, got {value!r:.60}{hint}")


def wait_bound(timeout: float | None | WaitDefault, default_s: float) -> float:
    """The seconds one wait may last: ``default_s`` for :data:`DEFAULT_TIMEOUT`, no bound (``math.inf``) for
    ``None``, the only infinite wait, else ``timeout`` checked by :func:`check_timeout_s`.

    Raises:
        InvalidArgumentError: NaN, infinity, zero or a negative number, a bool or a non-number (named).
    """
    if timeout is DEFAULT_TIMEOUT:
        return default_s
    if timeout is None:
        return math.inf
    return check_timeout_s(timeout, "timeout", "; pass None to wait without a bound")


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
        """Block the host until the event completes (bounded on backends that can time out).

        hisparse-hal's IPC events also take ``timeout``: seconds (a positive, finite number), ``None`` to wait
        without a bound (the only infinite wait), the event's ``timeout_s`` when omitted (:func:`wait_bound`).
        """


@runtime_checkable
class CapturedGraph(Protocol):
    """Work captured by ``HiSparseBackend.capture()``; ``replay()`` runs it again."""

    def replay(self) -> None:
        """Run the captured work on the current stream."""
