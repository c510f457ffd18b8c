"""vLLM 0.34.0's plugin loader runs our entry point, and ``get_hisparse_backend()`` then builds our backend.

Platform selection is checked on vLLM's real platform here (``UnspecifiedPlatform``: no accelerator) and on
stand-in CUDA and ROCm platform classes (vLLM's own cannot be imported without their drivers), which carry only
what the plugin reads: the platform enum and vLLM's ``get_hisparse_backend_cls`` (``platforms/cuda.py:273-275``,
``platforms/interface.py:199-202``).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from typing import Any

import pytest

from tests.integrations.with_vllm.vllm_env import BACKEND, loaded_plugin, require_vllm

require_vllm()

import vllm.platforms  # noqa: E402
import vllm.plugins  # noqa: E402
from vllm.platforms.interface import Platform  # noqa: E402
from vllm.v1.hisparse import backend as vllm_backend  # noqa: E402
from vllm.v1.hisparse import runtime as vllm_runtime  # noqa: E402

from hisparse_hal.errors import BackendUnavailableError, UnsupportedCapabilityError  # noqa: E402
from hisparse_hal.integrations import vllm as plugin  # noqa: E402
from hisparse_hal.integrations import vllm_backend as adapters  # noqa: E402
from tests.integrations.with_vllm.platform_standins import (  # noqa: E402
    CUDA_DEFAULT,
    StandInCuda,
    StandInRocm,
)


def test_load_general_plugins_makes_vllm_resolve_and_build_our_cpu_backend() -> None:
    status = loaded_plugin()
    assert status.state == "selected"
    assert status.reason.startswith(f"{plugin.BACKEND_ENV}={BACKEND}; a model cannot run")
    qualname = vllm.platforms.current_platform.get_hisparse_backend_cls()
    assert qualname == "hisparse_hal.integrations.vllm_backend.CpuHiSparseBackend" == status.backend_cls
    backend = vllm_backend.get_hisparse_backend()
    assert isinstance(backend, vllm_backend.HiSparseBackend) and isinstance(backend, adapters.CpuHiSparseBackend)
    assert backend.hal.name == "cpu" and backend is vllm_backend.get_hisparse_backend()
    assert vllm_runtime._has_hisparse_ops(), "vLLM's own availability probe (runtime.py:557-562)"


def test_loading_again_changes_nothing(caplog: pytest.LogCaptureFixture) -> None:
    status = loaded_plugin()
    method = type(vllm.platforms.current_platform).__dict__["get_hisparse_backend_cls"]
    vllm.plugins.plugins_loaded = False  # as a second vLLM component in this process would find it
    with caplog.at_level(logging.DEBUG, logger="vllm.hisparse_hal"):
        vllm.plugins.load_general_plugins()
        again = plugin.register()
    assert again is status
    assert type(vllm.platforms.current_platform).__dict__["get_hisparse_backend_cls"] is method
    assert not [r for r in caplog.records if r.levelno >= logging.INFO], "a repeated load must not redo anything"


def test_unknown_backend_name_stops_vllm_startup_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    loaded_plugin()
    before = vllm.platforms.current_platform.get_hisparse_backend_cls()
    monkeypatch.setenv(plugin.BACKEND_ENV, "tpu")
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    with pytest.raises(BackendUnavailableError, match=r"HISPARSE_HAL_VLLM_BACKEND='tpu' names no hisparse-hal backend"):
        vllm.plugins.load_general_plugins()
    assert vllm.platforms.current_platform.get_hisparse_backend_cls() == before


@pytest.mark.parametrize("platform", [StandInCuda], indirect=True)
def test_cuda_keeps_vllms_backend_unless_ours_is_named(platform: Platform, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(plugin.BACKEND_ENV, raising=False)
    status = plugin.register()
    assert (status.state, status.backend_cls, status.blockers) == ("vllm-backend", CUDA_DEFAULT, ())
    assert platform.get_hisparse_backend_cls() == CUDA_DEFAULT
    monkeypatch.setenv(plugin.BACKEND_ENV, "cpu")
    status = plugin.register()
    assert status.state == "selected"
    assert platform.get_hisparse_backend_cls() == "hisparse_hal.integrations.vllm_backend.CpuHiSparseBackend"
    monkeypatch.delenv(plugin.BACKEND_ENV)
    assert plugin.register().state == "vllm-backend"  # vLLM's own method is back
    assert platform.get_hisparse_backend_cls() == CUDA_DEFAULT


@pytest.mark.parametrize("platform", [StandInRocm], indirect=True)
def test_rocm_is_refused_when_vllm_resolves_the_class_naming_the_attention_file(
    platform: Platform, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(plugin.BACKEND_ENV, raising=False)
    monkeypatch.delenv(plugin.ROCM_ROUTES_ENV, raising=False)
    assert platform.get_hisparse_backend_cls() is None  # vLLM 0.34.0 has none for ROCm
    with caplog.at_level(logging.WARNING, logger="vllm.hisparse_hal"):
        status = plugin.register()
    assert (status.state, status.active, status.backend_cls) == ("refused", False, None)
    with pytest.raises(UnsupportedCapabilityError) as refused:
        platform.get_hisparse_backend_cls()  # what vLLM's config gate calls (config/vllm.py:1813)
    text = str(refused.value)
    assert "vllm/v1/attention/backends/mla/rocm_aiter_mla_sparse.py" in text and ":1156-1229" in text
    assert f"{plugin.ROCM_ROUTES_ENV}=1" in text and "routes through HiSparse (detected from its code)" in text
    with pytest.raises(UnsupportedCapabilityError, match="rocm_aiter_mla_sparse.py"):
        vllm_backend.get_hisparse_backend()
    assert any("runtime.py:662-663" in b for b in status.blockers)
    assert [r.levelno for r in caplog.records] == [logging.WARNING] and "wrong output" in caplog.records[0].getMessage()


def _vllm_check(env: dict[str, str]) -> tuple[int, dict[str, Any]]:
    code = "import sys; from hisparse_hal.cli import main; sys.exit(main(['vllm-check', '--json']))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**os.environ, **env})
    return out.returncode, json.loads(out.stdout)


def test_vllm_check_reports_the_resolved_backend_its_cache_ops_and_the_blockers() -> None:
    returncode, report = _vllm_check({plugin.BACKEND_ENV: "cpu"})
    assert report["vllm_version"] == "0.34.0" and report["entry_point_registered"] is True
    assert report["backend_cls"] == "hisparse_hal.integrations.vllm_backend.CpuHiSparseBackend"
    assert report["backend_error"] is None
    assert report["cache_ops"] == "hisparse-hal cpu backend, host implementation"
    assert any("pin_memory=True" in b and "runtime.py:625-627" in b for b in report["blockers"])
    assert (returncode, report["hisparse_can_run"]) == (1, False)


def test_without_a_name_a_platform_without_sparse_attention_keeps_vllms_refusal() -> None:
    env = {k: v for k, v in os.environ.items() if k != plugin.BACKEND_ENV}
    code = ("import json; from vllm.plugins import load_general_plugins; load_general_plugins(); "
            "from vllm.platforms import current_platform as p; from vllm.v1.hisparse.backend import "
            "get_hisparse_backend as g\ntry: g()\nexcept RuntimeError as e: "
            "print(json.dumps([p.get_hisparse_backend_cls(), str(e), 'get_hisparse_backend_cls' in type(p).__dict__]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env,
                         check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [
        None, "The current platform does not support HiSparse.", False]
