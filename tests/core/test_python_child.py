"""Every Python child the package starts imports the package its parent imported, never a same-named folder in
its working directory (issue 20: ``python -m pytest`` from the checkout's root imported the source folder)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import hisparse_hal
from hisparse_hal import python_child
from hisparse_hal.python_child import python_command, python_environment

REAL = str(Path(hisparse_hal.__file__).resolve())
WHERE = "import hisparse_hal, pathlib, sys; print(pathlib.Path(hisparse_hal.__file__).resolve()); print(sys.argv[1:])"


@pytest.fixture
def decoy_dir(tmp_path: Path) -> Path:
    """A working directory holding a ``hisparse_hal`` folder that fails loudly when imported."""
    (tmp_path / "hisparse_hal").mkdir()
    (tmp_path / "hisparse_hal" / "__init__.py").write_text('raise ImportError("the decoy in the cwd was imported")\n')
    return tmp_path


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, env=python_environment(), capture_output=True, text=True, timeout=120)


def test_a_plain_dash_m_child_in_that_directory_imports_the_decoy(decoy_dir):
    # The failure the helper exists for: this is what the conformance runner used to start.
    done = subprocess.run([sys.executable, "-c", WHERE], cwd=decoy_dir, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "the decoy in the cwd was imported" in done.stderr


@pytest.mark.parametrize("bootstrap_310", [False, True], ids=["native", "python3.10-bootstrap"])
def test_code_child_imports_the_parents_package_with_its_arguments(decoy_dir, monkeypatch, bootstrap_310):
    if bootstrap_310:
        monkeypatch.setattr(python_child.sys, "version_info", (3, 10, 14, "final", 0))
    command = python_command(code=WHERE, args=["a b", "--flag"])
    monkeypatch.undo()
    assert ("-P" in command) is not bootstrap_310
    done = _run(command, decoy_dir)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [REAL, "['a b', '--flag']"]


@pytest.mark.parametrize("bootstrap_310", [False, True], ids=["native", "python3.10-bootstrap"])
def test_module_child_runs_as_main_from_the_parents_package(decoy_dir, monkeypatch, bootstrap_310):
    if bootstrap_310:
        monkeypatch.setattr(python_child.sys, "version_info", (3, 10, 14, "final", 0))
    command = python_command(module="hisparse_hal.cli", args=["info", "--json"])
    monkeypatch.undo()
    done = _run(command, decoy_dir)
    assert done.returncode in (0, 1), done.stderr[-2000:]  # 1: no backend chosen; the JSON is printed either way
    assert '"backends"' in done.stdout and "decoy" not in done.stderr


def test_grandchildren_inherit_the_safe_path():
    assert python_environment({"A": "1"}) == {"A": "1", "PYTHONSAFEPATH": "1"}


@pytest.mark.parametrize("kwargs", [{}, {"module": "m", "code": "pass"}])
def test_exactly_one_of_module_and_code(kwargs):
    with pytest.raises(ValueError, match="exactly one of module and code"):
        python_command(**kwargs)
