"""Where the real vLLM 0.33.0 is required: the module, or a skip saying why these tests cannot run."""

from __future__ import annotations

import functools
from typing import Any

import pytest

VLLM_VERSION = "0.33.0"


def require_vllm() -> Any:
    """The vllm module, or a skip saying why these tests cannot run here."""
    vllm = pytest.importorskip(
        "vllm", reason="vLLM is not installed; ci/vllm-tests.sh runs tests/with_vllm in a venv with vllm==0.33.0"
    )
    if vllm.__version__ != VLLM_VERSION:
        pytest.skip(f"these tests pin vLLM {VLLM_VERSION}'s call sites; installed is {vllm.__version__}")
    return vllm


@functools.cache
def loaded_plugin() -> Any:
    """vLLM's own plugin loader, run once in this process as every vLLM process runs it; the plugin's status."""
    require_vllm()
    import vllm.plugins

    from hisparse_hal.integrations import vllm as plugin

    vllm.plugins.plugins_loaded = False
    vllm.plugins.load_general_plugins()
    return plugin.register()  # idempotent: returns the status of the call load_general_plugins made
