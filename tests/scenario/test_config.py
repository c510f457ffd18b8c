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
