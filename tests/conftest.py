"""Shared test fixtures. Tests run on the CPU; GPU vendor logic is driven through simulators. Each xdist worker
runs one torch thread, so ``pytest -n N`` on N cores does not oversubscribe them."""

from __future__ import annotations

import os
from collections.abc import Mapping

import pytest
import torch

from hisparse_hal import registry
from hisparse_hal.cache_ops import selection

#: Set by pytest-xdist in each worker process (``gw0``, ``gw1``, ...).
XDIST_WORKER_ENV = "PYTEST_XDIST_WORKER"


def torch_threads_for(environ: Mapping[str, str]) -> int | None:
    """Torch's intra-op threads for a test process: 1 in an xdist worker (the workers already fill the cores; no test
    measures torch's threading), None (torch's default) in a single-process run."""
    return 1 if environ.get(XDIST_WORKER_ENV) else None


def pytest_configure(config: pytest.Config) -> None:
    """One torch thread per xdist worker. Child processes the tests start keep their own settings."""
    threads = torch_threads_for(os.environ)
    if threads is not None:
        torch.set_num_threads(threads)


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
