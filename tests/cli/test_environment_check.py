"""hisparse_hal.environment_check: every HISPARSE_HAL_* value is refused by name before a command starts."""

from __future__ import annotations

import pytest

from hisparse_hal.environment_check import KNOWN_VARIABLES, check_environment, unknown_variables
from hisparse_hal.errors import BackendUnavailableError, InvalidArgumentError


def test_check_environment_accepts_known_good_values() -> None:
    check_environment({"HISPARSE_HAL_CACHE_OPS": "torch", "HISPARSE_HAL_VLLM_BACKEND": "rocm",
                       "HISPARSE_HAL_DEBUG": "1"})


def test_check_environment_rejects_unknown_cache_ops_by_name() -> None:
    with pytest.raises(InvalidArgumentError, match=r"HISPARSE_HAL_CACHE_OPS must be one of .*'bogus'"):
        check_environment({"HISPARSE_HAL_CACHE_OPS": "bogus"})


def test_check_environment_rejects_unknown_vllm_backend_by_name() -> None:
    with pytest.raises(BackendUnavailableError, match=r"HISPARSE_HAL_VLLM_BACKEND='nvidia' names no hisparse-hal"):
        check_environment({"HISPARSE_HAL_VLLM_BACKEND": "nvidia"})


def test_unknown_variables_lists_only_names_nothing_reads() -> None:
    assert "HISPARSE_HAL_VLLM_BACKEND" in KNOWN_VARIABLES
    assert "HISPARSE_HAL_VLLM_OPS" not in KNOWN_VARIABLES  # the vLLM 0.33.0 plugin's switch is gone
    assert unknown_variables({"HISPARSE_HAL_VLLM_OPS": "off", "HISPARSE_HAL_BACKEND": "cpu"}) == [
        "HISPARSE_HAL_VLLM_OPS"
    ]
