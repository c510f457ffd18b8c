"""The shared conformance suite run against RocmBackend on the SIMULATED HIP runtime, in a subprocess:
the per-copy loop (ROCm 7.0, gfx942) and the batch call with attributes (ROCm 7.14, gfx950). Capture
and IPC go through torch's device module, which the simulation does not simulate, so those tiers skip by capability."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent


@pytest.mark.timeout(900)
@pytest.mark.parametrize("release,arch", [("7.0", "gfx942:sramecc+:xnack-"), ("7.14", "gfx950")])
def test_conformance_suite_passes_on_the_simulated_hip_runtime(tmp_path, release, arch):
    env = {**os.environ, "SIM_HIP_RELEASE": release, "SIM_HIP_ARCH": arch,
           "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}
    report = tmp_path / "report"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "hisparse_hal.conformance.plugin",
            "--pyargs",
            "hisparse_hal.conformance.tests",
            "--hal-factory",
            "hisparse_hal.testing.sim_hip_runtime:conformance_backend",
            "--hal-report",
            str(report),
            "-q",
            "-p",
            "no:cacheprovider",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    results = json.loads((report / "results.json").read_text())
    assert results["summary"]["failed"] == 0
    by_area: dict[str, set[str]] = {}
    for test in results["tests"]:
        by_area.setdefault(test["area"], set()).add(test["outcome"])
    for area in ("swaps", "gathers"):
        assert by_area.get(area) == {"passed"}, (area, by_area.get(area))
    assert by_area["pinning"] == {"passed", "skipped"}  # one test needs a device that is not host memory
    capabilities = results["facts"]["capabilities"]
    assert capabilities["batch_copy"] == ("loop" if release == "7.0" else "native")
    assert capabilities["reasons"]["graph_capture"].startswith("SIMULATED HIP runtime")  # the report says what ran
    assert "graph_capture: SIMULATED HIP runtime" in " ".join(capabilities["notes"])
