"""Settings read from ``HISPARSE_HAL_*`` environment variables, parsed and checked in one place.

Each reader returns the default when its variable is unset or empty, and raises a typed error that
quotes the bad value otherwise.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from typing import TypeVar

from .errors import InvalidArgumentError

__all__ = ["EVENT_TIMEOUT_ENV", "DEFAULT_EVENT_TIMEOUT_S", "positive_setting", "event_timeout_s"]

EVENT_TIMEOUT_ENV = "HISPARSE_HAL_EVENT_TIMEOUT_S"
#: Default bound of an IPC event wait: long enough for a slow peer step, short enough to end a hang.
DEFAULT_EVENT_TIMEOUT_S = 30.0

T = TypeVar("T", int, float)


def positive_setting(
    name: str,
    default: T | None,
    parse: Callable[[str], T],
    what: str,
    environ: Mapping[str, str] | None = None,
) -> T | None:
    """A positive, finite number from environment variable ``name``.

    Args:
        name: the variable.
        default: returned when the variable is unset or blank.
        parse: ``int``, ``float`` or another parser of the stripped text.
        what: what the value means, for the error (``"a positive byte count"``).
        environ: the environment to read (``os.environ`` when None).

    Raises:
        InvalidArgumentError: the value does not parse or is not positive and finite (quoted).
    """
    raw = (os.environ if environ is None else environ).get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = parse(raw.strip())
    except ValueError:
        value = None
    if value is None or not (value > 0 and math.isfinite(value)):
        raise InvalidArgumentError(f"{name} must be {what}, got {raw!r}; unset it for the default ({default})")
    return value


def event_timeout_s(environ: Mapping[str, str] | None = None) -> float:
    """The bound of IPC event waits: ``HISPARSE_HAL_EVENT_TIMEOUT_S`` if set, else 30 s.

    Raises:
        InvalidArgumentError: the variable is not a positive, finite number of seconds.
    """
    value = positive_setting(
        EVENT_TIMEOUT_ENV, DEFAULT_EVENT_TIMEOUT_S, float, "a positive, finite number of seconds", environ
    )
    assert value is not None
    return value
