"""The ``platform`` fixture: vLLM's ``current_platform`` replaced by a stand-in (platform_standins.py). vLLM is
imported only when a test asks for it, so this folder still skips cleanly without vLLM."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture
def platform(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[Any]:
    """vLLM's ``current_platform`` replaced by an instance of ``request.param``; the class restored after."""
    import vllm.platforms
    from vllm.v1.hisparse import backend as vllm_backend

    cls = request.param
    saved = dict(cls.__dict__)
    instance = cls()
    monkeypatch.setattr(vllm.platforms, "_current_platform", instance)
    monkeypatch.setattr(vllm_backend, "current_platform", instance)  # bound at its import (backend.py:12)
    vllm_backend._get_hisparse_backend.cache_clear()
    yield instance
    vllm_backend._get_hisparse_backend.cache_clear()
    for name in ("get_hisparse_backend_cls", "_hisparse_hal_original_backend_cls"):
        if name in saved:
            setattr(cls, name, saved[name])
        elif name in cls.__dict__:
            delattr(cls, name)
