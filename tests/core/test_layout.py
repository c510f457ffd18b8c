"""The designed layout: ``vendors/`` and ``conformance/`` sit at the checkout's top level and are the packages
``hisparse_hal.vendors`` and ``hisparse_hal.conformance`` through pyproject's ``package-dir`` (no link in git).
These tests check the properties: a checkout without symbolic links builds the whole wheel; an editable install
and a plain one import the same modules; tracebacks and coverage name the files as git has them; ruff and mypy
read every module once, under one name; a suite file runs by its path; the commands run from an unpacked wheel in
another directory, with nothing of the checkout on the path. The oracle is ``git ls-files``."""

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

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - 3.10
    import tomli as tomllib

PACKAGE_FOLDERS = {"hisparse_hal": "hisparse_hal", "vendors": "hisparse_hal.vendors",
                   "conformance": "hisparse_hal.conformance"}
PACKAGE_DATA = (".py", ".toml", "py.typed", "mustpass/hisparse-hal-1.txt", "mustpass/vllm-0.34.0.txt")
#: Lists every package module with its name and file (the path of each in a fresh interpreter).
_LIST_MODULES = """
import importlib, json, sys
out = {}
for name in json.loads(sys.argv[1]):
    try:
        out[name] = ["ok", importlib.import_module(name).__file__]
    except Exception as exc:  # an optional dependency missing: the same in both installs
        out[name] = ["error", f"{type(exc).__name__}: {exc}"]
print(json.dumps(out))
"""


def _git(*args: str) -> str:
    if not (REPO / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout: the tracked files are unknown")
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout


def _git_files() -> list[str]:
    return _git("ls-files", *PACKAGE_FOLDERS).splitlines()


def _module_name(path: str) -> str:
    top, _, rest = path.partition("/")
    parts = [PACKAGE_FOLDERS[top], *Path(rest).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _tracked_modules() -> dict[str, str]:
    """Module name -> the tracked file it is, for every tracked Python file of the package."""
    return {_module_name(path): path for path in _git_files() if path.endswith(".py")}


def _typecheck() -> object:
    sys.path.insert(0, str(REPO / "ci"))
    try:
        import typecheck
    finally:
        sys.path.remove(str(REPO / "ci"))
    return typecheck


def test_git_holds_no_symbolic_link():
    # A link checks out as a small text file where core.symlinks is false (Git for Windows, archive exports).
    links = [line.split("\t", 1)[1] for line in _git("ls-files", "-s").splitlines() if line.startswith("120000")]
    assert links == []


def test_pyproject_lists_every_package_folder_in_git():
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    in_git = sorted(_module_name(path) for path in _git_files() if path.endswith("/__init__.py"))
    assert sorted(setuptools["packages"]) == in_git
    assert setuptools["package-dir"] == {"hisparse_hal.vendors": "vendors", "hisparse_hal.conformance": "conformance"}


def test_the_import_graph_sees_every_tracked_module_once():
    assert sorted(import_graph()) == sorted(_tracked_modules())


def test_mypy_checks_every_tracked_module_once_under_its_import_name():
    # ci/typecheck.py hands mypy each package file with its import name (ci/lint.sh runs it).
    modules = _typecheck().package_modules()  # type: ignore[attr-defined]
    assert {name: str(path.relative_to(REPO)) for name, path in modules.items()} == _tracked_modules()


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


def test_a_checkout_imported_without_an_install_says_to_install_first(tmp_path):
    # -S: no site-packages, so no editable finder; the checkout's root on the path, as `python` run there without
    # an install would have it.
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-S", "-c", "import hisparse_hal"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert (f"ImportError: hisparse_hal was imported from {REPO / 'hisparse_hal'}, a source checkout, without its "
            "vendors and conformance subpackages (an install maps them in): run pip install -e . in the checkout, "
            "or run from another directory where a plain install is found first (README)") in done.stderr


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel built from the tracked files as a checkout with ``core.symlinks=false`` has them (a link would be
    a text file holding its target), so the build writes nothing into the checkout."""
    source = tmp_path_factory.mktemp("source")
    for name in _git("ls-files").splitlines():
        target = source / name
        if (REPO / name).is_symlink():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(os.readlink(REPO / name), encoding="utf-8")
        elif (REPO / name).is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, target)
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


def _list_modules(names: list[str], cwd: Path, env: dict[str, str]) -> dict[str, list[str]]:
    done = subprocess.run([sys.executable, "-c", _LIST_MODULES, json.dumps(names)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout))


def test_an_editable_install_and_the_wheel_import_the_same_modules_and_the_editable_one_from_git(wheel, tmp_path):
    import hisparse_hal.vendors

    if not Path(hisparse_hal.vendors.__file__).resolve().is_relative_to(REPO):
        pytest.skip("hisparse_hal is not installed in editable mode from this checkout")
    tracked = _tracked_modules()
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    work = tmp_path / "work"
    work.mkdir()
    plain_env = {**os.environ, "PYTHONPATH": str(site), "PYTHONSAFEPATH": "1"}
    editable_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    plain = _list_modules(sorted(tracked), work, plain_env)
    editable = _list_modules(sorted(tracked), work, editable_env)
    assert {name: outcome[0] for name, outcome in plain.items()} == {name: o[0] for name, o in editable.items()}
    imported = [name for name, outcome in editable.items() if outcome[0] == "ok"]
    assert len(imported) >= len(tracked) - 10, {n: o for n, o in editable.items() if o[0] != "ok"}
    for name in imported:
        # The path a traceback shows: the file as git has it (editable), the packaged copy (wheel).
        assert editable[name][1] == str(REPO / tracked[name]), name
        assert plain[name][1] == str(site / tracked[name] if tracked[name].startswith("hisparse_hal/")
                                     else site / "hisparse_hal" / tracked[name]), name


def test_a_traceback_through_a_vendor_module_names_its_file_in_git(tmp_path):
    code = ("import traceback, hisparse_hal\n"
            "try:\n    hisparse_hal.get_backend('cpu').pin_tensor('not a tensor')\n"
            "except Exception:\n    print('\\n'.join(f.filename for f in traceback.extract_tb(__import__('sys')"
            ".exc_info()[2])))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    files = [Path(line) for line in done.stdout.splitlines() if line.endswith(".py")]
    vendor_frames = [f for f in files if "vendors" in f.parts]
    assert vendor_frames, done.stdout
    for frame in files:
        if frame.is_relative_to(REPO):
            assert _git("ls-files", "--error-unmatch", str(frame.relative_to(REPO))).strip(), frame


def test_coverage_counts_the_vendor_and_suite_modules_at_their_git_paths(tmp_path):
    pytest.importorskip("coverage", reason="coverage is in the [test] extra")
    env = {**os.environ, "COVERAGE_FILE": str(tmp_path / "coverage.data")}
    ran = subprocess.run([sys.executable, "-m", "coverage", "run", "-m", "hisparse_hal", "info"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=300)
    assert ran.returncode == 0, ran.stderr[-3000:]
    report = tmp_path / "coverage.json"
    subprocess.run([sys.executable, "-m", "coverage", "json", "-q", "-o", str(report)], cwd=REPO, env=env,
                   check=True, timeout=300)
    measured = json.loads(report.read_text())["files"]
    assert sorted(measured) == sorted(_tracked_modules().values())
    assert measured["vendors/cpu/spec.py"]["summary"]["covered_lines"] > 0  # probed by `info`: measured
    assert measured["conformance/tests/test_swaps.py"]["summary"]["covered_lines"] == 0  # listed, never run


def test_a_suite_file_runs_by_its_path_from_the_checkout(tmp_path):
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "hisparse_hal.conformance.plugin", "-p", "no:xdist",
                           "-p", "no:cacheprovider", "--hal-backend", "cpu", "-v", "conformance/tests/test_stats.py"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "conformance/tests/test_stats.py::" in done.stdout and " PASSED" in done.stdout
    assert "a PARTIAL run (a selection of the suite)" in done.stdout  # one file is not the whole suite


@pytest.mark.parametrize("how", ["import_name", "path"])
def test_a_suite_file_given_from_another_directory_keeps_the_suites_test_ids(tmp_path, how):
    """pytest names a file it was given outside its rootdir "" (``::test_x``); the suite names it by its file, so
    test ids, areas, expectations and must-pass lists read the same as in a runner's run."""
    target = (["--pyargs", "hisparse_hal.conformance.tests.test_stats"] if how == "import_name"
              else [str(REPO / "conformance" / "tests" / "test_stats.py")])
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "hisparse_hal.conformance.plugin", "-p", "no:xdist",
                           "-p", "no:cacheprovider", "--hal-backend", "cpu", "--hal-report", str(tmp_path / "r"),
                           *target], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    doc = json.loads((tmp_path / "r" / "results.json").read_text())
    assert {t["area"] for t in doc["tests"]} == {"stats"}
    assert all(t["id"].startswith("test_stats.py::test_") for t in doc["tests"]), [t["id"] for t in doc["tests"]]
    assert doc["selection"]["areas"] == ["stats"]


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
