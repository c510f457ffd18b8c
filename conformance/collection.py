"""pytest collects the suite's files under their import names (``hisparse_hal.conformance.tests.test_swaps``).

The suite's folder is the checkout's top-level ``conformance/``, mapped to ``hisparse_hal.conformance`` by the
build (pyproject's ``package-dir``). pytest names a collected file by its folders (``conformance.tests.test_swaps``),
which in a checkout is a second, refused import name (``conformance/__init__.py``); so the plugin imports every
file of this package by its package name instead, the same in a checkout, an editable install and a wheel.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest

__all__ = ["import_name", "pytest_collect_directory", "pytest_pycollect_makemodule"]

_PACKAGE = __name__.rpartition(".")[0]
_FOLDER = Path(__file__).resolve().parent
_MODULE_SETUP_NAMES = ("setUpModule", "setup_module", "tearDownModule", "teardown_module")


def import_name(path: Path) -> str | None:
    """The module name a file (or a package's ``__init__.py``) of the suite's package is imported by; None for a
    path outside it, which pytest names itself."""
    try:
        relative = Path(path).resolve().relative_to(_FOLDER)
    except ValueError:
        return None
    parts = relative.with_suffix("").parts
    if parts and parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((_PACKAGE, *parts))


def _import(path: Path, name: str) -> Any:
    """Import ``name`` for the collector of ``path``; a failure is a collection error naming both, as pytest's own."""
    try:
        return importlib.import_module(name)
    except pytest.skip.Exception as exc:
        if exc.allow_module_level:
            raise
        raise pytest.Collector.CollectError(
            f"{path}: pytest.skip outside a test; use pytest.skip(..., allow_module_level=True)") from exc
    except Exception as exc:
        info = pytest.ExceptionInfo.from_exception(exc)
        raise pytest.Collector.CollectError(
            f"ImportError while importing test module '{path}' as {name}.\nTraceback:\n"
            f"{info.getrepr(style='short')}") from exc


class SuiteModule(pytest.Module):
    """A test module of the suite, imported by its package name."""

    def _getobj(self) -> Any:
        name = import_name(self.path)
        assert name is not None, self.path
        module = _import(self.path, name)
        self.config.pluginmanager.consider_module(module)
        return module


class SuitePackage(pytest.Package):
    """A package folder of the suite: its ``__init__`` imported by its package name. The suite's packages define
    no module-level setup or teardown (pytest's ``Package.setup`` would call them); one that does is refused."""

    def setup(self) -> None:
        name = import_name(self.path / "__init__.py")
        assert name is not None, self.path
        module = _import(self.path / "__init__.py", name)
        defined = [hook for hook in _MODULE_SETUP_NAMES if hasattr(module, hook)]
        if defined:
            raise pytest.Collector.CollectError(
                f"{self.path / '__init__.py'}: package-level {', '.join(defined)} is not supported in the suite; "
                "use a fixture")


@pytest.hookimpl(tryfirst=True)
def pytest_collect_directory(path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if (path / "__init__.py").is_file() and import_name(path / "__init__.py") is not None:
        return SuitePackage.from_parent(parent, path=path)
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    if import_name(module_path) is None:
        return None
    module = SuiteModule.from_parent(parent, path=module_path)
    if not module.nodeid:
        # pytest names a file it was given (``--pyargs hisparse_hal.conformance.tests.test_swaps``) outside its rootdir
        # by its path relative to itself: "". The suite's test ids (report, expectations, must-pass lists) start with
        # the file's name, so name it so.
        module = SuiteModule.from_parent(parent, path=module_path, nodeid=module_path.name)
    return module
