"""Where the real vLLM 0.34.0 is required: the module, or a skip saying why; and the plugin loaded as vLLM loads it."""

from __future__ import annotations

import os
from typing import Any

import pytest

VLLM_VERSION = "0.34.0"
#: The hisparse-hal backend these tests make vLLM use (the CPU reference device).
BACKEND = "cpu"


def require_vllm() -> Any:
    """The vllm module, or a skip saying why these tests cannot run here."""
    vllm = pytest.importorskip(
        "vllm",
        reason="vLLM is not installed; ci/vllm-tests.sh runs tests/integrations/with_vllm in a venv with vllm==0.34.0",
    )
    if vllm.__version__ != VLLM_VERSION:
        pytest.skip(f"these tests pin vLLM {VLLM_VERSION}'s call sites; installed is {vllm.__version__}")
    return vllm


def loaded_plugin() -> Any:
    """vLLM's own plugin loader run with ``HISPARSE_HAL_VLLM_BACKEND=cpu``, as every vLLM process runs it, and
    vLLM's per-qualname backend cache emptied; returns the plugin's status."""
    require_vllm()
    import vllm.plugins
    from vllm.v1.hisparse import backend as vllm_backend

    from hisparse_hal.integrations import vllm as plugin

    os.environ[plugin.BACKEND_ENV] = BACKEND
    vllm.plugins.plugins_loaded = False
    vllm.plugins.load_general_plugins()
    vllm_backend._get_hisparse_backend.cache_clear()
    return plugin.register()  # idempotent: the status of the call load_general_plugins made
