"""The one check of an event wait's bound (``hisparse_hal.events``): positive, finite seconds; ``None`` the only
infinite wait; NaN, infinities, zero, negatives, bools and non-numbers refused naming the value (issue 30 item 4)."""

from __future__ import annotations

import math
import re

import pytest

from hisparse_hal.errors import InvalidArgumentError
from hisparse_hal.events import DEFAULT_TIMEOUT, check_timeout_s, wait_bound

BAD = [math.nan, -math.nan, math.inf, -math.inf, 0, 0.0, -1, -1e-9, True, False, "1", b"1", [1], 10**400]
BAD_IDS = ["nan", "-nan", "inf", "-inf", "0", "0.0", "-1", "-1e-9", "True", "False", "str", "bytes", "list", "10**400"]


@pytest.mark.parametrize("value", BAD, ids=BAD_IDS)
def test_a_bad_bound_is_refused_naming_the_value(value: object) -> None:
    named = re.escape(f"event_timeout_s must be a positive, finite number of seconds, got {value!r:.60}")
    with pytest.raises(InvalidArgumentError, match=f"^{named}$"):
        check_timeout_s(value, "event_timeout_s")
    with pytest.raises(InvalidArgumentError, match=r"^timeout must be .* pass None to wait without a bound$"):
        wait_bound(value, 5.0)  # type: ignore[arg-type]


@pytest.mark.parametrize(("value", "seconds"), [(1, 1.0), (0.25, 0.25), (1e-9, 1e-9), (10**300, 1e300)])
def test_a_positive_finite_bound_is_accepted_as_float_seconds(value: float, seconds: float) -> None:
    assert check_timeout_s(value) == seconds and isinstance(check_timeout_s(value), float)
    assert wait_bound(value, 5.0) == seconds


def test_none_is_the_only_infinite_wait_and_the_default_is_the_events_own_bound() -> None:
    assert wait_bound(None, 5.0) == math.inf
    assert wait_bound(DEFAULT_TIMEOUT, 5.0) == 5.0
