"""The vLLM plugin where vLLM is not installed: it imports, defines nothing, and ``vllm-check`` says so.

With vLLM installed these skip; tests/with_vllm covers that side against the real package.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
import torch

from hisparse_hal.cli import main
from hisparse_hal.integrations import vllm as plugin

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is not None,
                                reason="vLLM is installed; tests/with_vllm covers the plugin with it")


def test_register_without_vllm_defines_nothing() -> None:
    status = plugin.register()
    assert (status.state, status.active, status.vllm_version) == ("no-vllm", False, None)
    assert set(status.owners.values()) == {"absent"}
    assert not hasattr(torch.ops._C_cache_ops, "hisparse_resolve_residency")


def test_disabled_by_environment_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(plugin.DISABLE_ENV, "off")
    status = plugin.register()
    assert (status.state, status.reason) == ("disabled", "HISPARSE_HAL_VLLM_OPS=off")


def test_vllm_schema_is_vllm_0_34_0s() -> None:
    schema = plugin.vllm_schema("resolve_residency")
    assert schema.startswith("hisparse_resolve_residency(Tensor host_cache, Tensor! hot_cache,")
    assert schema.endswith("Tensor? num_valid_rows=None) -> ()") and "error_flags" not in schema
    assert plugin.vllm_schema("gather_compact") == "hisparse_gather_compact" + \
        "(Tensor host_cache, Tensor! hot_cache, Tensor miss_global_indices, Tensor miss_hot_indices, " \
        "Tensor miss_counts) -> ()"
    with pytest.raises(KeyError, match="gather_everything"):
        plugin.vllm_schema("gather_everything")


def test_importing_hisparse_hal_and_the_plugin_never_imports_vllm() -> None:
    code = ("import sys, hisparse_hal, hisparse_hal.cache_ops, hisparse_hal.cli, hisparse_hal.integrations.vllm; "
            "print(sorted(m for m in sys.modules if m == 'vllm' or m.startswith('vllm.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def test_vllm_check_json_reports_vllm_missing_and_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["vllm-check", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["vllm_installed"] is False and report["hisparse_can_run"] is False
    assert report["plugin"]["state"] == "no-vllm"
