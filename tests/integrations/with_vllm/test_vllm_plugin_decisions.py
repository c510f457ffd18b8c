"""Every ``HISPARSE_HAL_VLLM_BACKEND`` setting on every platform kind: what vLLM then resolves, and ``vllm-check``'s
report of it. Platforms: vLLM's real one on this CPU-only machine (``UnspecifiedPlatform``), vLLM's
``CpuPlatform``, stand-in CUDA, stand-in ROCm with vLLM 0.34.0's own ROCm attention, with the operator's override,
and with a vLLM whose ROCm attention routes through HiSparse (a module written here, named in place of
``rocm_aiter_mla_sparse``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.integrations.with_vllm.vllm_env import require_vllm

require_vllm()

from vllm.platforms.cpu import CpuPlatform  # noqa: E402
from vllm.platforms.interface import Platform, UnspecifiedPlatform  # noqa: E402
from vllm.v1.hisparse import backend as vllm_backend  # noqa: E402

from hisparse_hal import registry  # noqa: E402
from hisparse_hal.errors import BackendUnavailableError, InvalidArgumentError, UnsupportedCapabilityError  # noqa: E402
from hisparse_hal.integrations import vllm as plugin  # noqa: E402
from tests.integrations.with_vllm.platform_standins import (  # noqa: E402
    CUDA_DEFAULT,
    StandInCuda,
    StandInRocm,
)

OURS = "hisparse_hal.integrations.vllm_backend."
SETTINGS = (None, "cpu", "cuda", "rocm", "auto", "x")
UNSUPPORTED = "RuntimeError: The current platform does not support HiSparse."
ROCM_REFUSED = "UnsupportedCapabilityError: hisparse-hal refuses HiSparse on ROCm"
Expected = dict[str | None, tuple[str, str | None, str | None]]
# (state, what vLLM resolves, how building it fails: a prefix) on this CPU-only machine, per setting.
CANNOT_BUILD: Expected = {
    name: ("refused", None, "BackendUnavailableError: hisparse-hal cannot build the HiSparse backend vLLM asked for "
           f"({plugin.BACKEND_ENV}={name}): backend {name!r} (requested) is unavailable")
    for name in ("cuda", "rocm")
}
BAD = ("error", None, None)
ROCM_ROUTED: Expected = {
    None: ("refused", None, "BackendUnavailableError: hisparse-hal cannot build the HiSparse backend vLLM asked "
           "for (StandInRocm: "),
    "cpu": ("selected", OURS + "CpuHiSparseBackend", None), **CANNOT_BUILD,
    "auto": ("selected", OURS + "AutoHiSparseBackend", None), "x": BAD,
}
EXPECTED: dict[str, Expected] = {
    "here": {None: ("vllm-refuses", None, UNSUPPORTED), "cpu": ("selected", OURS + "CpuHiSparseBackend", None),
             **CANNOT_BUILD, "auto": ("selected", OURS + "AutoHiSparseBackend", None), "x": BAD},
    "cpu-platform": {None: ("vllm-refuses", None, UNSUPPORTED), "cpu": ("selected", OURS + "CpuHiSparseBackend", None),
                     **CANNOT_BUILD, "auto": ("selected", OURS + "AutoHiSparseBackend", None), "x": BAD},
    "cuda": {None: ("vllm-backend", CUDA_DEFAULT, "RuntimeError: HiSparse requires its compiled _C_cache_ops"),
             "cpu": ("selected", OURS + "CpuHiSparseBackend", None), **CANNOT_BUILD,
             "auto": ("selected", OURS + "AutoHiSparseBackend", None), "x": BAD},
    "rocm": {**{name: ("refused", None, ROCM_REFUSED) for name in SETTINGS[:-1]}, "x": BAD},
    "rocm+override": ROCM_ROUTED,
    "rocm+routing-vllm": ROCM_ROUTED,
}
PLATFORMS = {"here": UnspecifiedPlatform, "cpu-platform": CpuPlatform, "cuda": StandInCuda, "rocm": StandInRocm,
             "rocm+override": StandInRocm, "rocm+routing-vllm": StandInRocm}
# A ROCm sparse-MLA attention that keeps the common forward_mqa, which routes through HiSparse.
ROUTING_MODULE = """
from vllm.model_executor.layers.attention.sparse_mla_attention import SparseMLACommonImpl


class PatchedRocmSparseImpl(SparseMLACommonImpl):
    def _forward_mqa_kernel(self, *args, **kwargs):
        return None
"""


def _set(monkeypatch: pytest.MonkeyPatch, where: str, setting: str | None, tmp_path: Path) -> None:
    monkeypatch.delenv(plugin.ROCM_ROUTES_ENV, raising=False)
    if setting is None:
        monkeypatch.delenv(plugin.BACKEND_ENV, raising=False)
    else:
        monkeypatch.setenv(plugin.BACKEND_ENV, setting)
    if where == "rocm+override":
        monkeypatch.setenv(plugin.ROCM_ROUTES_ENV, "1")
    if where == "rocm+routing-vllm":
        (tmp_path / "patched_rocm_sparse_attention.py").write_text(ROUTING_MODULE)
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.setattr(plugin, "ROCM_ATTENTION_MODULE", "patched_rocm_sparse_attention")


CASES = [pytest.param(PLATFORMS[where], where, setting, id=f"{where}-{setting or 'unset'}")
         for where in EXPECTED for setting in SETTINGS]


@pytest.mark.parametrize("platform, where, setting", CASES, indirect=["platform"])
def test_vllm_check_reports_what_vllm_resolves(
    platform: Platform, where: str, setting: str | None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _set(monkeypatch, where, setting, tmp_path)
    built_before = dict(registry._cache)
    report = plugin.check()
    state, backend_cls, error = EXPECTED[where][setting]
    assert (report["plugin"]["state"], report["backend_cls"]) == (state, backend_cls)
    assert report["plugin"]["active"] is (state == "selected")
    if state == "error":
        assert report["backend_error"] is None and report["cache_ops"] is None
    elif error is None:
        assert report["backend_error"] is None
        assert report["cache_ops"] == "hisparse-hal cpu backend, host implementation"
    else:
        assert report["backend_error"].startswith(error) and "\n" not in report["backend_error"]
    if state in ("refused", "error", "vllm-refuses"):
        assert registry._cache == built_before and vllm_backend._get_hisparse_backend.cache_info().currsize == 0
    if state == "error":
        assert report["error"].startswith("BackendUnavailableError: HISPARSE_HAL_VLLM_BACKEND='x' names no")
    assert report["hisparse_can_run"] is False  # a CPU-only torch: no platform here can run a model
    json.dumps(report)


@pytest.mark.parametrize("platform", [StandInRocm], indirect=True)
@pytest.mark.parametrize("setting", [None, "rocm", "cpu"])
def test_rocm_refusal_is_what_vllms_config_gate_meets(
    platform: Platform, setting: str | None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _set(monkeypatch, "rocm", setting, tmp_path)
    assert plugin.register().state == "refused"
    with pytest.raises(UnsupportedCapabilityError) as refused:
        platform.get_hisparse_backend_cls()  # vllm/config/vllm.py:1813
    text = str(refused.value)
    assert "vllm/v1/attention/backends/mla/rocm_aiter_mla_sparse.py" in text and f"{plugin.ROCM_ROUTES_ENV}=1" in text
    assert (f"({plugin.BACKEND_ENV}={setting} does not lift it)" in text) is (setting is not None)


@pytest.mark.parametrize("platform", [StandInCuda], indirect=True)
def test_a_backend_that_cannot_be_built_is_refused_at_class_resolution_in_one_line(
    platform: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(plugin.BACKEND_ENV, "cuda")
    assert plugin.register().state == "refused"
    with pytest.raises(BackendUnavailableError) as refused:
        platform.get_hisparse_backend_cls()
    assert "HISPARSE_HAL_VLLM_BACKEND=cuda" in str(refused.value) and "\n" not in str(refused.value)


def test_detection_reads_vllms_own_attention_modules() -> None:
    mla = "vllm.v1.attention.backends.mla."
    assert not plugin.attention_routes_through_hisparse(mla + "rocm_aiter_mla_sparse")
    for routed in ("flashmla_sparse", "flashinfer_mla_sparse", "flashinfer_mla_sparse_sm120"):
        assert plugin.attention_routes_through_hisparse(mla + routed), routed
    assert not plugin.attention_routes_through_hisparse("no_such_module_here")


@pytest.mark.parametrize(
    "source, routes",
    [
        (ROUTING_MODULE, True),
        (ROUTING_MODULE + "    def forward_mqa(self, *a):\n        return super().forward_mqa(*a)\n", True),
        (ROUTING_MODULE + "    def forward_mqa(self, *a):\n        return self._forward_mqa_kernel(*a)\n", False),
        ("from x import HiSparseMLAIndexGroup\ng.convert_logical_to_physical_topk(1)\ng.stage_prefill_rows(2)\n", True),
        ("from x import HiSparseMLAIndexGroup\ng.convert_logical_to_physical_topk(1)\n", False),
        ("# HiSparseMLAIndexGroup convert_logical_to_physical_topk stage_prefill_rows\n", False),
    ],
    ids=["common_forward", "super_forward", "own_forward", "explicit_calls", "no_prefill_staging", "comment_only"],
)
def test_detection_of_a_routing_attention_module(
    source: str, routes: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"attention_probe_{abs(hash(source))}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert plugin.attention_routes_through_hisparse(name) is routes
    assert name not in sys.modules  # read, never imported


@pytest.mark.parametrize("value", ["yes", "2", "true"])
def test_a_bad_override_is_refused_by_name(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(plugin.ROCM_ROUTES_ENV, value)
    with pytest.raises(InvalidArgumentError, match=rf"{plugin.ROCM_ROUTES_ENV} must be 1 .* or 0, got '{value}'"):
        plugin.register()
    assert plugin.check()["error"].startswith(f"InvalidArgumentError: {plugin.ROCM_ROUTES_ENV} must be 1")


def _cli(env: dict[str, str]) -> tuple[int, dict[str, Any]]:
    code = "import sys; from hisparse_hal.cli import main; sys.exit(main(['vllm-check', '--json']))"
    base = {k: v for k, v in os.environ.items() if k not in (plugin.BACKEND_ENV, plugin.ROCM_ROUTES_ENV)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**base, **env})
    return out.returncode, json.loads(out.stdout)


@pytest.mark.parametrize(
    "env, returncode, state",
    [
        ({}, 1, "vllm-refuses"),
        ({plugin.BACKEND_ENV: "cuda"}, 1, "refused"),
        ({plugin.BACKEND_ENV: "x"}, 2, "error"),
        ({plugin.ROCM_ROUTES_ENV: "maybe"}, 2, "error"),
    ],
    ids=["unset", "cuda", "nonsense", "bad_override"],
)
def test_vllm_check_json_prints_json_in_every_case(env: dict[str, str], returncode: int, state: str) -> None:
    code, report = _cli(env)
    assert (code, report["plugin"]["state"], report["plugin"]["active"]) == (returncode, state, False)
    assert (report["error"] is not None) is (state == "error")


@pytest.mark.parametrize(
    "cls, first",
    [(CpuPlatform, "vllm/platforms/cpu.py:154-155"), (UnspecifiedPlatform, "vllm/config/device.py:44-50"),
     (StandInRocm, "vllm/v1/hisparse/runtime.py:662-663")],
)
def test_blockers_name_what_a_user_meets_first(cls: type[Platform], first: str) -> None:
    found = plugin.blockers(cls())
    assert first in found[0]
    if cls is CpuPlatform:
        assert "vllm/platforms/cpu.py:242-243" in found[1]
