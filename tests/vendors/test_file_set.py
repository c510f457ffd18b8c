"""Every built-in vendor folder has the same file set (``vendors/__init__.py``): ``spec.py``, ``backend.py``,
``runtime.py``, ``capabilities.py`` defining ``plan_capabilities``, and ``expectations.toml``.

The vendors are the built-in entry points of pyproject's ``hisparse_hal.backends`` group, read from the file,
so a vendor added there is checked without touching this test. Files are read, never imported.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
VENDOR_FILES = ("spec.py", "backend.py", "runtime.py", "capabilities.py", "expectations.toml")
PACKAGE_PREFIX = "hisparse_hal.vendors."


def built_in_vendors() -> dict[str, Path]:
    """``{entry-point name: vendor folder}`` for every entry point in ``vendors/``."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    group = project["entry-points"]["hisparse_hal.backends"]
    found = {}
    for name, target in group.items():
        module = target.split(":", 1)[0]
        if module.startswith(PACKAGE_PREFIX):
            found[name] = ROOT / "vendors" / module.removeprefix(PACKAGE_PREFIX).split(".", 1)[0]
    return found


def missing_from(folder: Path) -> list[str]:
    """The files of the vendor file set that ``folder`` lacks (``capabilities.py`` counts as missing when it
    defines no top-level ``plan_capabilities``)."""
    missing = [file for file in VENDOR_FILES if not (folder / file).is_file()]
    capabilities = folder / "capabilities.py"
    if capabilities.is_file():
        tree = ast.parse(capabilities.read_text(), str(capabilities))
        defined = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
        if "plan_capabilities" not in defined:
            missing.append("capabilities.py: def plan_capabilities")
    return missing


def test_the_built_in_vendors_are_read_from_pyproject() -> None:
    assert set(built_in_vendors()) >= {"cpu", "cuda", "rocm"}


@pytest.mark.parametrize("vendor", sorted(built_in_vendors()))
def test_vendor_folder_has_the_vendor_file_set(vendor: str) -> None:
    folder = built_in_vendors()[vendor]
    missing = missing_from(folder)
    assert not missing, f"vendor {vendor!r} ({folder.relative_to(ROOT)}/) lacks {', '.join(missing)}"


def test_a_folder_missing_a_file_or_the_planner_is_reported_by_name(tmp_path: Path) -> None:
    for file in VENDOR_FILES:
        (tmp_path / file).write_text("")
    (tmp_path / "runtime.py").unlink()
    (tmp_path / "capabilities.py").write_text("def plan(): ...\n")
    assert missing_from(tmp_path) == ["runtime.py", "capabilities.py: def plan_capabilities"]
