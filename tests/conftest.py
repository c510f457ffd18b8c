"""Shared test fixtures. Tests run on the CPU; GPU vendor logic is driven through simulators."""

from __future__ import annotations

import pytest

from hisparse_hal import registry


@pytest.fixture(autouse=True)
def _fresh_backend_cache(monkeypatch: pytest.MonkeyPatch):
    """Each test selects afresh and never inherits a backend override from the environment."""
    monkeypatch.delenv(registry.BACKEND_ENV, raising=False)
    registry.reset_backend_cache()
    yield
    registry.reset_backend_cache()
