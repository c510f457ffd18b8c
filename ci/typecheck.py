"""Type check the package, its launcher, ``tests/`` and ``ci/`` in one mypy build, each module once, under the
name it is imported by.

The checkout's top-level ``vendors/`` and ``conformance/`` are the packages ``hisparse_hal.vendors`` and
``hisparse_hal.conformance`` (pyproject's ``[tool.setuptools.package-dir]``). mypy's command line names a file by
its folders (``vendors.cpu.backend``) and cannot resolve ``hisparse_hal.vendors`` in an editable install (its
import finder is invisible to mypy), so this script hands mypy every package file with its import name, read from
pyproject's package list and mapping, and mypy reports each error at the file's path in git.

Usage: python ci/typecheck.py   (from anywhere; needs the [lint] extra's mypy)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
#: The checked files outside the package: mypy names these by their folders, as they are imported.
OTHER_TARGETS = ("hisparse_hal_launcher.py", "tests", "ci")


def package_modules(root: Path = ROOT) -> dict[str, Path]:
    """Module name -> source file, for every module of every package pyproject lists, through its package-dir
    mapping (a package without a mapping of its own sits under its parent's folder)."""
    setuptools = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    mapping: dict[str, str] = setuptools.get("package-dir", {})
    modules: dict[str, Path] = {}
    for package in setuptools["packages"]:
        folder = _package_folder(package, mapping, root)
        for file in sorted(folder.glob("*.py")):
            name = package if file.stem == "__init__" else f"{package}.{file.stem}"
            modules[name] = file
    return modules


def _package_folder(package: str, mapping: dict[str, str], root: Path) -> Path:
    parts = package.split(".")
    for cut in range(len(parts), 0, -1):  # the longest mapped prefix wins, as in setuptools
        prefix = ".".join(parts[:cut])
        if prefix in mapping:
            return root / mapping[prefix] / Path(*parts[cut:])
    return root / mapping.get("", "") / Path(*parts)


def main() -> int:
    """Run the one mypy build; print its errors and a summary line as mypy's command line does."""
    from mypy import build
    from mypy.errors import CompileError
    from mypy.main import process_options
    from mypy.modulefinder import BuildSource

    os.chdir(ROOT)  # pyproject's [tool.mypy] and relative paths in the messages
    others, options = process_options(list(OTHER_TARGETS))
    sources = [BuildSource(str(path.relative_to(ROOT)), name) for name, path in package_modules().items()]
    sources += others
    try:
        result = build.build(sources, options)
        messages = result.errors
    except CompileError as exc:  # a blocking error (a syntax error, a module found twice)
        messages = exc.messages
    for message in messages:
        print(message)
    files = len(sources)
    if messages:
        print(f"Found {len(messages)} error lines (checked {files} source files)", file=sys.stderr)
        return 1
    print(f"Success: no issues found in {files} source files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
