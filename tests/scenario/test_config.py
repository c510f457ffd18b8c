"""The scenario's configuration (``scenario/config.py``) refuses bad values, naming them."""

from __future__ import annotations

import pytest

from hisparse_hal.errors import InvalidArgumentError
from hisparse_hal.scenario import FaultPlan, ScenarioConfig


@pytest.mark.parametrize("changes, message", [
    ({"ranks": 1}, r"ranks must be an int >= 2, got 1"),
    ({"slots": 1}, r"slots must be an int >= 2, got 1"),
    ({"rows_per_block": 17}, r"rows_per_block \(17\) cannot exceed block_size \(16\)"),
    ({"sync": "fast"}, r"sync must be 'auto', 'events' or 'barrier', got 'fast'"),
    ({"kill": FaultPlan(2, 0)}, r"names a rank outside \[0, 2\)"),
])
def test_config_rejects_bad_values_naming_them(changes, message):
    with pytest.raises(InvalidArgumentError, match=message):
        ScenarioConfig(**changes)


@pytest.mark.parametrize("bad", [True, float("nan"), float("inf"), -1.0, 0, "5", 1e6])
def test_scenario_timeout_is_checked_as_every_event_bound(bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match="scenario timeout_s must be") as refused:
        ScenarioConfig(timeout_s=bad)  # type: ignore[arg-type]
    assert repr(bad)[:20] in str(refused.value)
