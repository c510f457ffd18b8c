"""A third vendor needs its own folder and one entry-point line: ``tests/vendors/third_vendor/`` (the vendor file
set) registered by a test-time dist-info, with no edit to the core. The core selects it and explains why, builds
it, asks its spec for its torch build, variables and shared-memory sweep, chooses its cache ops, and runs a
subset of the conformance suite on it. A device type the core never names (``xpu``) gets its cache-ops choice
from its spec alone.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from hisparse_hal import environment_check, probing, registry, shm_sweep
from hisparse_hal.cache_ops import selection
from hisparse_hal.errors import BackendUnavailableError, InvalidArgumentError
from hisparse_hal.probing import torch_gpu_build
from tests.core.vendor_literals import package_modules
from tests.vendors.test_file_set import VENDOR_FILES, missing_from
from tests.vendors.third_vendor import spec as third_spec

ROOT = Path(__file__).resolve().parents[2]
FOLDER = Path(__file__).resolve().parent / "third_vendor"
#: The one line a third vendor adds outside its folder (in its pyproject:
#: ``[project.entry-points."hisparse_hal.backends"]``).
ENTRY_POINT = "third = tests.vendors.third_vendor.spec:SPEC"


def write_dist_info(root: Path, name: str, lines: list[str]) -> Path:
    """A dist-info under ``root`` whose ``hisparse_hal.backends`` group holds ``lines``; returns its
    ``entry_points.txt``."""
    info = root / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[hisparse_hal.backends]\n" + "\n".join(lines) + "\n")
    return info / "entry_points.txt"


@pytest.fixture
def third(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The third vendor registered for this test (its dist-info on ``sys.path``); returns the dist-info folder."""
    entry_points = write_dist_info(tmp_path, "third-vendor", [ENTRY_POINT])
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("HISPARSE_HAL_BACKEND", third_spec.BUILD_ENV):
        monkeypatch.delenv(name, raising=False)
    registry.reset_backend_cache()
    selection.reset_implementation_choice()
    yield entry_points.parent
    registry.reset_backend_cache()
    selection.reset_implementation_choice()


def test_its_folder_has_the_vendor_file_set_and_it_adds_one_line_elsewhere(third: Path) -> None:
    assert missing_from(FOLDER) == []
    own = sorted(p.name for p in FOLDER.iterdir() if p.is_file())
    assert own == sorted([*VENDOR_FILES, "__init__.py"])  # 6 files: the file set and the package marker
    outside = [line for line in (third / "entry_points.txt").read_text().splitlines() if "=" in line]
    assert outside == [ENTRY_POINT]  # 1 line outside its folder (target: at most 2)


def test_the_package_names_it_nowhere() -> None:
    modules = package_modules()
    assert "hisparse_hal.cli" in modules and "hisparse_hal.vendors.cpu.spec" in modules
    for path in modules.values():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        constants = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        assert not {"third", "tests.vendors.third_vendor"} & constants, path


def test_selection_picks_it_by_priority_and_explains(third: Path) -> None:
    chosen = registry.select_backend()
    assert chosen.chosen is not None and chosen.chosen.name == "third"
    assert chosen.explanation == ("third: highest-priority available backend; the third vendor's runtime 0.3 runs "
                                  "on host memory")


def test_get_backend_builds_it_and_its_cache_ops_choose_an_implementation(third: Path) -> None:
    backend = registry.get_backend("third")
    assert type(backend).__name__ == "ThirdBackend" and backend.name == "third"
    assert backend.capabilities.versions["third_runtime"] == "0.3"
    assert backend.capabilities.cache_ops == "host"
    assert backend.create_cache_ops(None).implementation == "host"
    assert selection.implementation_for(backend.device).implementation == "host"


def test_its_torch_build_is_asked_and_refuses_a_silent_cpu_fallback(third: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    assert torch_gpu_build() is None
    monkeypatch.setenv(third_spec.BUILD_ENV, "1")
    assert torch_gpu_build() == "third 0.3"
    cpu_only = [r for r in registry.probe_backends() if r.name == "cpu"]
    with pytest.raises(BackendUnavailableError, match=r"torch is a GPU build \(third 0\.3\) but no GPU backend"):
        registry.select_backend(results=cpu_only)


def test_its_variables_are_known_and_checked(third: Path) -> None:
    assert environment_check.unknown_variables({third_spec.BUILD_ENV: "1", "HISPARSE_HAL_THRID": "1"}) == [
        "HISPARSE_HAL_THRID"]
    environment_check.check_environment({third_spec.BUILD_ENV: "1"})
    with pytest.raises(InvalidArgumentError, match=r"HISPARSE_HAL_THIRD_BUILD must be 0 or 1, got '2'"):
        environment_check.check_environment({third_spec.BUILD_ENV: "2"})


def _broken() -> Any:
    raise ValueError("no version file")


def test_a_torch_build_hook_that_raises_refuses_the_silent_cpu_fallback_naming_it(
        third: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    specs = [dataclasses.replace(s, torch_build=_broken) if s.name == "third" else s
             for s in probing.registered_specs()]
    monkeypatch.setattr(probing, "registered_specs", lambda: specs)
    monkeypatch.setattr(torch.version, "cuda", None)
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    build = "unknown ('third' spec's torch_build raised ValueError: no version file)"
    assert torch_gpu_build() == build
    cpu_only = [r for r in registry.probe_backends() if r.name == "cpu"]
    with pytest.raises(BackendUnavailableError, match=r"torch is a GPU build \(unknown \('third' spec's torch_build"):
        registry.select_backend(results=cpu_only)


def test_a_sweep_hook_that_raises_is_logged_and_the_other_sweeps_still_run(
        third: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(third_spec, "SWEPT", ["/dev/shm/third-dead-owner"])
    third_entry = next(s for s in probing.registered_specs() if s.name == "third")
    broken = dataclasses.replace(third_entry, name="a_broken", sweep_shared_files=_broken)
    monkeypatch.setattr(probing, "registered_specs", lambda: [broken, third_entry])
    with caplog.at_level("WARNING", logger="hisparse_hal.shm_sweep"):
        removed = shm_sweep.sweep_shared_files()
    assert "/dev/shm/third-dead-owner" in removed
    assert "the 'a_broken' backend's shared-memory sweep failed: ValueError: no version file" in caplog.text


def test_its_shared_memory_sweep_runs(third: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(third_spec, "SWEPT", ["/dev/shm/third-dead-owner"])
    assert "/dev/shm/third-dead-owner" in shm_sweep.sweep_shared_files()


def test_a_device_type_the_core_never_names_gets_its_cache_ops_from_its_spec(
        third: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A spec on torch's "xpu" device type: Triton compiles for it only because its spec says so. Its dist-info sits
    # in a folder of its own (importlib.metadata caches a folder's listing by its modification time).
    facts = selection.TritonFacts("3.9.0", None, False)
    assert selection.choose_cache_ops(torch.device("xpu"), facts, environ={}) == (
        "torch", "device xpu is not a GPU; the Triton kernels compile for GPUs only")
    gpu = dataclasses.replace(third_spec.SPEC, name="third_xpu", device_type="xpu", compiles_triton=True)
    monkeypatch.setattr(third_spec, "XPU_SPEC", gpu, raising=False)
    (tmp_path / "xpu").mkdir()
    write_dist_info(tmp_path / "xpu", "third-xpu", ["third_xpu = tests.vendors.third_vendor.spec:XPU_SPEC"])
    monkeypatch.syspath_prepend(str(tmp_path / "xpu"))
    selection.reset_implementation_choice()
    assert selection.choose_cache_ops(torch.device("xpu"), facts, environ={}) == (
        "triton", "triton 3.9.0 imports and device xpu is a GPU")


def test_a_conformance_subset_passes_on_it(third: Path, tmp_path: Path) -> None:
    report = tmp_path / "report"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(third.parent), str(ROOT)])}
    env.pop("HISPARSE_HAL_BACKEND", None)
    done = subprocess.run(
        [sys.executable, "-m", "hisparse_hal", "conformance", "--backend", "third", "--report", str(report),
         "-k", "test_probe or (test_swap_batch_of_n_descriptors_copies_every_byte and 8192)"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((report / "results.json").read_text())
    assert results["backend_under_test"]["qualname"] == "tests.vendors.third_vendor.backend:ThirdBackend"
    assert results["expectations"]["file"] == str(FOLDER / "expectations.toml")
    assert results["summary"]["failed"] == 0 and results["summary"]["passed"] >= 15
