"""The CPU device's capability plan (``vendors/cpu/capabilities.py``) and what the backend reports from it."""

from __future__ import annotations

import pytest
import torch

import hisparse_hal
from hisparse_hal.vendors.cpu.backend import CpuBackend
from hisparse_hal.vendors.cpu.capabilities import plan_capabilities
from hisparse_hal.vendors.cpu.runtime import probe_page_lock

MLOCK_WORKS = probe_page_lock()[0]


@pytest.fixture
def cpu_build_of_torch(monkeypatch: pytest.MonkeyPatch):
    """Make torch look like a CPU build (as here), so automatic selection is the CPU device on any machine."""
    from hisparse_hal import registry

    monkeypatch.setattr(torch.version, "cuda", None, raising=False)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    monkeypatch.delenv(registry.BACKEND_ENV, raising=False)
    registry.reset_backend_cache()
    yield
    registry.reset_backend_cache()


def test_cpu_backend_is_selected_without_a_gpu_build_and_reports_its_capabilities(cpu_build_of_torch):
    backend = hisparse_hal.get_backend()
    assert isinstance(backend, CpuBackend) and backend.name == "cpu"
    assert backend.device == torch.device("cpu")
    caps = backend.capabilities
    assert caps.batch_copy == "native" and caps.max_batch_descriptors is None
    assert caps.ipc_events and caps.ipc_event_max_cycles is None
    assert caps.shared_host_pool and caps.graph_capture and not caps.host_pointer_alias
    assert caps.kv_formats == {"bf16", "fp8_e4m3fn", "fp8_e4m3fnuz", "fp8_ds_mla"}
    assert caps.stats_dtype == torch.uint64 == backend.stats_dtype
    assert caps.versions["torch"] == torch.__version__
    assert caps.versions["page_lock"] == ("mlock" if MLOCK_WORKS else "unavailable")
    assert backend.supports_shared_host_pool is True
    assert backend.capabilities is backend.capabilities
    backend.check_available()


def test_plan_records_page_locking_and_gives_reasons_by_field():
    caps = plan_capabilities(False, "mlock refused (ENOMEM)", "65536 bytes")
    assert caps.versions["page_lock"] == "unavailable" and caps.versions["memlock_limit"] == "65536 bytes"
    assert set(caps.reasons) == {"batch_copy", "versions"}
    assert "index_select" in caps.reasons["batch_copy"] and "mlock" in caps.reasons["versions"]
    assert plan_capabilities(True, "ok", "unlimited").versions["page_lock"] == "mlock"


def test_backend_adds_the_cache_ops_reason_to_the_plan():
    assert set(CpuBackend().capabilities.reasons) == {"batch_copy", "versions", "cache_ops"}
