"""The installed ``hisparse-hal`` console script, run as a user runs it: from the repository's root, and from a
directory holding a decoy ``hisparse_hal`` folder that fails when imported (so any child process that imports
from its working directory fails the test). Issue 20: ``conformance`` from the checkout's root exited 4."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SELECTION = "test_probe or test_config"  # two small areas: a quick run with real tests in it


def _script() -> str:
    found = shutil.which("hisparse-hal", path=str(Path(sys.executable).parent)) or shutil.which("hisparse-hal")
    assert found, "the hisparse-hal console script is not installed (pip install -e '.[test]')"
    return found


def _run(cwd: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env.pop("HISPARSE_HAL_BACKEND", None)
    return subprocess.run([_script(), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _tail(done: subprocess.CompletedProcess) -> str:
    return (done.stdout[-3000:] + "\n" + done.stderr[-3000:]).strip()


@pytest.fixture
def decoy_dir(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    (work / "hisparse_hal").mkdir(parents=True)
    (work / "hisparse_hal" / "__init__.py").write_text('raise ImportError("the decoy in the cwd was imported")\n')
    return work


def test_info_from_the_repository_root():
    done = _run(REPO, "info", "--json")
    assert done.returncode == 0, _tail(done)
    info = json.loads(done.stdout)
    assert "cpu" in {backend["name"] for backend in info["backends"]} and info["chosen"]
    assert "Failed to initialize NumPy" not in done.stderr


@pytest.mark.parametrize("where", ["repository-root", "decoy-directory"])
def test_conformance_selection_with_junit(where, decoy_dir, tmp_path):
    cwd = REPO if where == "repository-root" else decoy_dir
    report = tmp_path / "report"
    done = _run(cwd, "conformance", "--backend", "cpu", "-k", SELECTION, "--report", str(report),
                "--junit", str(report / "junit.xml"))
    assert done.returncode == 0, _tail(done)
    doc = json.loads((report / "results.json").read_text())
    assert {t["area"] for t in doc["tests"]} == {"probe", "config"} and doc["summary"]["passed"] > 10
    cases = list(ET.parse(report / "junit.xml").getroot().iter("testcase"))
    assert len(cases) == len(doc["tests"])
    assert "decoy" not in done.stderr and "Failed to initialize NumPy" not in done.stderr


def test_bench_quick_from_the_repository_root():
    done = _run(REPO, "bench", "--backend", "cpu", "--swap-mib", "1", "--repeats", "1")
    assert done.returncode == 0, _tail(done)
    assert "gather_resident_rows" in done.stdout and "swap" in done.stdout


@pytest.mark.parametrize("where", ["repository-root", "decoy-directory"])
def test_scenario_few_steps(where, decoy_dir):
    cwd = REPO if where == "repository-root" else decoy_dir
    done = _run(cwd, "scenario", "--ranks", "2", "--steps", "20", "--backend", "cpu")
    assert done.returncode == 0, _tail(done)
    assert done.stdout.rstrip().endswith("PASS") and "backend: cpu" in done.stdout
