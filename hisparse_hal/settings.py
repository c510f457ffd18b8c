"""Settings read from ``HISPARSE_HAL_*`` environment variables, parsed and checked in one place.

Each reader returns the default when its variable is unset or empty, and raises a typed error that
quotes the bad value and names the default otherwise. A value that names something (a backend, an
implementation) is read case-insensitively, the same rule for every variable (:func:`name_setting`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping
from typing import TypeVar

from .errors import InvalidArgumentError

__all__ = ["EVENT_TIMEOUT_ENV", "DEFAULT_EVENT_TIMEOUT_S", "positive_setting", "event_timeout_s", "name_setting"]

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
    *,
    default_text: str | None = None,
) -> T | None:
    """A positive, finite number from environment variable ``name``.

    Args:
        name: the variable.
        default: returned when the variable is unset or blank.
        parse: ``int``, ``float`` or another parser of the stripped text.
        what: what the value means, for the error (``"a positive byte count"``).
        environ: the environment to read (``os.environ`` when None).
        default_text: how the error names the default (``"256 GiB"``; the default's value when None).

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
        shown = default_text or default
        raise InvalidArgumentError(f"{name} must be {what}, got {raw!r}; unset it for the default ({shown})")
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


def name_setting(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The value of a variable that names something (``HISPARSE_HAL_BACKEND``, ``HISPARSE_HAL_CACHE_OPS``, ...),
    stripped and lower-cased (names are lower-case, so ``CPU`` means ``cpu``); None when unset or blank."""
    raw = (os.environ if environ is None else environ).get(name, "")
    return raw.strip().lower() or None
