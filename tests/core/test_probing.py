"""Probing (``probing.py``): every registered backend is probed cheaply and reported with a reason; a probe that
raises or an entry point that fails to load is recorded, never skipped; ``check_available`` re-probes."""

from __future__ import annotations

import pytest
import torch

import hisparse_hal
from hisparse_hal import probing, registry
from hisparse_hal.errors import BackendUnavailableError
from tests.core.fake_plugin import install_plugin


def _chosen_name() -> str | None:
    """The name of the backend ``select_backend`` chooses, or None when it chooses none."""
    chosen = registry.select_backend().chosen
    return None if chosen is None else chosen.name


def test_probe_backends_lists_builtin_backends_with_reasons():
    results = {r.name: r for r in hisparse_hal.probe_backends()}
    assert {"cpu", "cuda", "rocm"} <= set(results)
    for result in results.values():
        assert len(result.reason) > 10, result
    assert results["cpu"].available
    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        assert not results["cuda"].available and "CPU build" in results["cuda"].reason
        assert not results["rocm"].available and "CPU build" in results["rocm"].reason


def test_probe_that_raises_is_recorded_with_traceback(plugin, monkeypatch):
    monkeypatch.setenv("FAKE_HAL_MODE", "raise")
    result = next(r for r in hisparse_hal.probe_backends() if r.name == "fake")
    assert not result.available
    assert result.reason == "probe raised OSError: libfake.so: cannot open shared object file"
    assert result.error is not None and "Traceback" in result.error and "fake_hal_plugin.py" in result.error
    assert _chosen_name() == "cpu"


def test_entry_point_that_fails_to_load_is_reported_not_skipped(tmp_path, monkeypatch):
    install_plugin(tmp_path, {"broken": "no_such_module_xyz:SPEC"})
    monkeypatch.syspath_prepend(str(tmp_path))
    result = next(r for r in hisparse_hal.probe_backends() if r.name == "broken")
    assert not result.available
    assert "failed to load" in result.reason and "no_such_module_xyz" in result.reason
    assert result.error is not None and "ModuleNotFoundError" in result.error


def test_check_available_raises_for_unavailable_registered_backend(plugin, monkeypatch):
    backend = hisparse_hal.get_backend("fake")
    backend.check_available()
    monkeypatch.setenv("FAKE_HAL_MODE", "gone")
    with pytest.raises(BackendUnavailableError, match="backend 'fake' is unavailable: fake accelerator mode gone"):
        backend.check_available()


@pytest.mark.parametrize(("cuda", "hip", "build"), [
    ("12.8", None, "cuda 12.8"), (None, "7.2.1", "hip 7.2.1"), (None, None, None),
])
def test_torch_gpu_build_is_what_the_owning_spec_says(monkeypatch, cuda, hip, build):
    monkeypatch.setattr(torch.version, "cuda", cuda)
    monkeypatch.setattr(torch.version, "hip", hip, raising=False)
    assert registry.torch_gpu_build() == build


def test_the_specs_answer_what_the_core_asks():
    specs = {spec.name: spec for spec in probing.registered_specs()}
    assert {name: spec.device_type for name, spec in specs.items() if name in ("cpu", "cuda", "rocm")} == {
        "cpu": "cpu", "cuda": "cuda", "rocm": "cuda"}  # torch's ROCm build keeps the "cuda" device type
    assert {"cuda"} <= probing.device_types(compiles_triton=True) and "cpu" not in probing.device_types(
        compiles_triton=True)
    assert dict(specs["cuda"].environment) == {"HISPARSE_HAL_CUDA_MAX_BATCH": "descriptors per CUDA batch call"}
    assert specs["cpu"].sweep_shared_files is not None and specs["cuda"].sweep_shared_files is None
