"""``hisparse-hal conformance``: run the shared suite against one backend and report.

Invariant: the backend is resolved through the same registry as ``get_backend`` (strict: an unknown or
unavailable name is an error that prints the probe table) or built by an explicit factory; the exit
code is 0 only when no test failed or passed unexpectedly.
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import shlex
import sys
from pathlib import Path

from hisparse_hal.errors import BackendUnavailableError, InvalidArgumentError

from .recipe import BackendRecipe, load_factory, vendor_expectations_path

__all__ = ["add_arguments", "run", "pytest_arguments"]

log = logging.getLogger(__name__)

PLUGIN = "hisparse_hal.conformance.plugin"
TESTS = "hisparse_hal.conformance.tests"
SETTINGS = Path(__file__).with_name("pytest-settings.toml")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``conformance`` options to ``parser``."""
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--backend", metavar="NAME", default=None,
                       help="registry name of the backend to test (strict); default: what get_backend() selects")
    which.add_argument("--factory", metavar="MODULE:CALLABLE", default=None,
                       help="test an unregistered backend returned by this callable")
    parser.add_argument("--expectations", metavar="FILE", default=None,
                        help="expectations TOML (default: the vendor's expectations.toml; 'none' for none)")
    parser.add_argument("--report", metavar="DIR", default=None, help="write results.json and summary.md into DIR")
    parser.add_argument("--strict", action="store_true", help="expectation entries that match no test fail the run")
    parser.add_argument("-k", dest="keyword", metavar="EXPR", default=None, help="only tests matching this pytest -k expression")
    parser.add_argument("-n", dest="numprocesses", metavar="N", default=None, help="run in N processes (pytest-xdist; 'auto' for one per core)")
    parser.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                        help="per-test time limit when pytest-timeout is installed (default 600)")
    parser.add_argument("--pytest-args", default="", metavar="ARGS", help="further pytest arguments, as one quoted string")


def _default_expectations(recipe: BackendRecipe) -> str | None:
    klass = recipe.backend_class()
    if klass is None and recipe.factory is not None:
        target = load_factory(recipe.factory)
        klass = target if isinstance(target, type) else None
    if klass is None:
        return None  # a factory function: the plugin finds the file once it has built the backend
    found = vendor_expectations_path(klass)
    return str(found) if found else "none"


def pytest_arguments(args: argparse.Namespace, recipe: BackendRecipe) -> list[str]:
    """The pytest command line (without the program name) for these runner arguments."""
    argv = ["-p", PLUGIN, "-c", str(SETTINGS), "--rootdir", str(Path(__file__).parent), "-p", "no:cacheprovider",
            "--pyargs", TESTS, "-rfE"]
    argv += ["--hal-factory", recipe.factory] if recipe.factory else ["--hal-backend", str(recipe.registry_name)]
    expectations = args.expectations or _default_expectations(recipe)
    if expectations:
        argv += ["--hal-expectations", expectations]
    if args.report:
        argv += ["--hal-report", str(args.report)]
    if args.strict:
        argv.append("--hal-strict")
    if args.keyword:
        argv += ["-k", args.keyword]
    if args.numprocesses:
        if importlib.util.find_spec("xdist") is None:
            raise InvalidArgumentError("-n needs pytest-xdist: pip install 'hisparse-hal[test]'")
        argv += ["-n", str(args.numprocesses)]
    if args.timeout and importlib.util.find_spec("pytest_timeout") is not None:
        argv += ["--timeout", str(args.timeout)]
    argv += shlex.split(args.pytest_args or "")
    return argv


def run(args: argparse.Namespace) -> int:
    """Run the suite; the exit code is 0 only when nothing failed unexpectedly.

    Returns:
        pytest's exit code (1: a test failed or passed unexpectedly; 4: bad usage; 5: no test
        selected), or 2 when the backend cannot be resolved (the message includes the probe table).
    """
    for module in ("pytest", "hypothesis"):
        if importlib.util.find_spec(module) is None:
            print(f"hisparse-hal conformance needs {module}: pip install 'hisparse-hal[test]'", file=sys.stderr)
            return 2
    try:
        recipe = BackendRecipe.resolve(args.backend, args.factory)
        if recipe.factory:
            load_factory(recipe.factory)  # fail now, clearly, on a typo
        argv = pytest_arguments(args, recipe)
    except BackendUnavailableError as exc:
        print(f"hisparse-hal conformance: {exc}", file=sys.stderr)
        return 2
    except InvalidArgumentError as exc:
        print(f"hisparse-hal conformance: {exc}", file=sys.stderr)
        return 2
    import pytest

    print(f"hisparse-hal conformance: testing {recipe.describe()}", file=sys.stderr)
    print("  python -m pytest " + shlex.join(argv), file=sys.stderr)
    return int(pytest.main(argv))
