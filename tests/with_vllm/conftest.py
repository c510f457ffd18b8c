"""Tests against the real vLLM 0.33.0 package; each module skips where vLLM is absent (ci/vllm-tests.sh has it)."""

from __future__ import annotations

from typing import Any

import pytest
from vllm_env import require_vllm


@pytest.fixture(scope="session")
def plugin_status() -> Any:
    """vLLM's own plugin loader, run once in this process as every vLLM process runs it."""
    require_vllm()
    import vllm.plugins

    from hisparse_hal.integrations import vllm as plugin

    vllm.plugins.plugins_loaded = False
    vllm.plugins.load_general_plugins()
    return plugin.register()  # idempotent: returns the status of the call load_general_plugins made
