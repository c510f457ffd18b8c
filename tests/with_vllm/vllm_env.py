"""Where the real vLLM 0.33.0 is required: the module, or a skip saying why these tests cannot run."""

from __future__ import annotations

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
