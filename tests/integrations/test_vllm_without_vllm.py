"""The vLLM plugin where vLLM is not installed: it imports, selects nothing, and ``vllm-check`` says so.

With vLLM installed these skip; tests/integrations/with_vllm covers that side against the real package.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from hisparse_hal.cli import main
from hisparse_hal.errors import BackendUnavailableError
from hisparse_hal.integrations import vllm as plugin

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is not None,
                                reason="vLLM is installed; tests/integrations/with_vllm covers the plugin with it")


def test_register_without_vllm_selects_nothing() -> None:
    status = plugin.register()
    assert (status.state, status.active, status.vllm_version, status.backend_cls) == ("no-vllm", False, None, None)


def test_unknown_backend_name_is_rejected_by_name() -> None:
    with pytest.raises(BackendUnavailableError, match=r"HISPARSE_HAL_VLLM_BACKEND='tpu' names no hisparse-hal backend"):
        plugin.adapter_qualname("tpu")
    assert plugin.adapter_qualname("rocm") == "hisparse_hal.integrations.vllm_backend.RocmHiSparseBackend"


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
    assert report["blockers"] == [  # hisparse_can_run is false for a reason the report names
        "vLLM is not installed in this Python: hisparse-hal implements vLLM 0.34.0's HiSparse contract (pip install "
        "--no-deps vllm==0.34.0; ci/vllm-tests.sh shows the rest on a CPU machine)"]


@pytest.mark.parametrize("name, value", [(plugin.BACKEND_ENV, "tpu"), (plugin.ROCM_ROUTES_ENV, "yes")])
def test_vllm_check_json_reports_a_bad_setting_as_json_and_exits_2(
    name: str, value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(name, value)
    assert main(["vllm-check", "--json"]) == 2
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert (report["plugin"]["state"], report["plugin"]["active"], report["vllm_installed"]) == ("error", False, False)
    assert f"{name}" in report["error"] and repr(value) in report["error"] and repr(value) in captured.err
