"""Shared test fixtures. Tests run on the CPU; GPU vendor logic is driven through simulators."""

from __future__ import annotations

import pytest

from hisparse_hal import registry
from hisparse_hal.cache_ops import selection


@pytest.fixture(autouse=True)
def _fresh_backend_cache(monkeypatch: pytest.MonkeyPatch):
    """Each test selects afresh (its backend and its cache-ops implementation) and never inherits a backend
    override from the environment."""
    monkeypatch.delenv(registry.BACKEND_ENV, raising=False)
    registry.reset_backend_cache()
    selection.reset_implementation_choice()
    yield
    registry.reset_backend_cache()
    selection.reset_implementation_choice()
