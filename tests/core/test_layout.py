"""The designed layout: ``vendors/`` and ``conformance/`` sit at the checkout's top level and are linked into the
package (``hisparse_hal/vendors``, ``hisparse_hal/conformance``). These tests check the properties, not the links:
every tool sees every module exactly once, the wheel holds every module, and the commands run from an unpacked wheel
in another directory, with nothing of the checkout on the path."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests import REPO
from tests.core.test_import_graph import import_graph

PACKAGE_FOLDERS = {"hisparse_hal": "hisparse_hal", "vendors": "hisparse_hal.vendors",
                   "conformance": "hisparse_hal.conformance"}
PACKAGE_DATA = (".py", ".toml", "py.typed", "mustpass/hisparse-hal-1.txt", "mustpass/vllm-0.34.0.txt")


def _git_files() -> list[str]:
    if not (REPO / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout: the tracked files are unknown")
    done = subprocess.run(["git", "ls-files", "-s", *PACKAGE_FOLDERS], cwd=REPO, capture_output=True, text=True,
                          check=True)
    # Mode 120000 is a link (hisparse_hal/vendors itself): not a file of the package.
    return [line.split("\t", 1)[1] for line in done.stdout.splitlines() if not line.startswith("120000")]


def _module_name(path: str) -> str:
    top, _, rest = path.partition("/")
    parts = [PACKAGE_FOLDERS[top], *Path(rest).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _tracked_modules() -> dict[str, str]:
    """Module name -> the tracked file it is, for every tracked Python file of the package."""
    return {_module_name(path): path for path in _git_files() if path.endswith(".py")}


def test_the_import_graph_sees_every_tracked_module_once():
    assert sorted(import_graph()) == sorted(_tracked_modules())


def test_mypy_checks_every_tracked_module_once():
    mypy_main = pytest.importorskip("mypy.main", reason="mypy is in the [lint] extra")
    old = Path.cwd()
    try:
        os.chdir(REPO)  # as ci/lint.sh runs it
        sources, _ = mypy_main.process_options(["-p", "hisparse_hal"])
        files = [Path(source.path).resolve() for source in sources]
    finally:
        os.chdir(old)
    modules = [source.module for source in sources]
    assert len(modules) == len(set(modules)) and len(files) == len(set(files))
    assert sorted(modules) == sorted(_tracked_modules())
    assert all(file.is_relative_to(REPO) for file in files)


def test_ruff_reads_every_tracked_module_once():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is in the [lint] extra")
    done = subprocess.run([ruff, "check", "--show-files", *PACKAGE_FOLDERS], cwd=REPO, capture_output=True,
                          text=True, check=True)
    seen = [str(Path(line).resolve().relative_to(REPO)) for line in done.stdout.split() if line.endswith(".py")]
    assert len(seen) == len(set(seen))
    assert sorted(seen) == sorted(_tracked_modules().values())


@pytest.mark.parametrize("folder", ["vendors", "conformance"])
def test_the_top_level_folders_refuse_a_second_import_name(folder):
    done = subprocess.run([sys.executable, "-c", f"import {folder}"], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 1
    assert f"ImportError: '{folder}' is hisparse-hal's {folder} folder; import it as 'hisparse_hal.{folder}'" \
        in done.stderr


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built from a copy of the tracked files (so the build writes nothing into the checkout)."""
    source = tmp_path_factory.mktemp("source")
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True)
    for name in tracked.stdout.splitlines():
        if (REPO / name).is_symlink() or (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, source / name, follow_symlinks=False)
    out = tmp_path_factory.mktemp("wheel")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(source)],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0 and "Could not find a version that satisfies the requirement setuptools" in done.stderr:
        pytest.skip("no package index to fetch the build backend from")
    assert done.returncode == 0, done.stderr[-3000:]
    (found,) = out.glob("hisparse_hal-*.whl")
    return found


def test_the_wheel_holds_every_tracked_package_file_and_nothing_else(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {path if path.startswith("hisparse_hal/") else f"hisparse_hal/{path}"
                for path in _git_files() if path.endswith(PACKAGE_DATA)}
    packaged = {name for name in names if name.startswith("hisparse_hal/")}
    assert packaged == expected
    assert not any(name.startswith(("tests/", "ci/", "vendors/", "conformance/")) for name in names)


def test_commands_run_from_the_unpacked_wheel_in_another_directory(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    work = tmp_path / "work"
    work.mkdir()
    # The unpacked wheel first; the checkout's root is not on the path (a checkout's editable install may be).
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONSAFEPATH": "1"}
    env.pop("HISPARSE_HAL_BACKEND", None)

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "hisparse_hal.cli", *args], cwd=work, env=env,
                              capture_output=True, text=True, timeout=600)

    where = subprocess.run([sys.executable, "-c", "import hisparse_hal.vendors.cpu.backend as m; print(m.__file__)"],
                           cwd=work, env=env, capture_output=True, text=True, timeout=120)
    assert where.stdout.strip() == str(site / "hisparse_hal" / "vendors" / "cpu" / "backend.py"), where.stderr
    bench = run("bench", "--submission", "--repeats", "3", "--json", str(tmp_path / "bench.json"))
    assert bench.returncode == 0, bench.stderr[-3000:]
    rows = json.loads((tmp_path / "bench.json").read_text())
    assert "simulated" in json.dumps(rows)
    report = tmp_path / "report"
    suite = run("conformance", "--backend", "cpu", "-k", "test_stats", "--report", str(report))
    assert suite.returncode == 0, suite.stdout[-3000:] + suite.stderr[-3000:]
    doc = json.loads((report / "results.json").read_text())
    assert doc["summary"]["passed"] >= 1 and doc["summary"]["failed"] == 0
