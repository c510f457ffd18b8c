"""Fixtures the conformance tests share: the backend under test (one per process), its recipe, and a
per-test stack that releases pinned pools and device caches when the test ends."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from hisparse_hal.capabilities import Capabilities

from .recipe import BackendRecipe

__all__ = ["backend", "backend_recipe", "capabilities", "memory"]


@pytest.fixture(scope="session")
def backend(request: pytest.FixtureRequest) -> Any:
    """The backend under test, constructed once per process (once per xdist worker) from the recipe."""
    from .plugin import state_of

    return state_of(request.config).backend()


@pytest.fixture(scope="session")
def backend_recipe(request: pytest.FixtureRequest) -> BackendRecipe:
    """The picklable recipe that spawned processes use to construct the same backend."""
    from .plugin import state_of

    return state_of(request.config).recipe


@pytest.fixture(scope="session")
def capabilities(backend: Any) -> Capabilities:
    """``backend.capabilities``, read once."""
    return backend.capabilities


@pytest.fixture
def memory() -> Iterator[contextlib.ExitStack]:
    """An exit stack for pinned pools and device caches; released (and canaries checked) after the test."""
    with contextlib.ExitStack() as stack:
        yield stack
