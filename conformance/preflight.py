"""The conformance runner's checks before any work, and its private scratch folder.

Invariant: a usage error (a bad ``--timeout``, ``-n``, ``-k``, expectations file, pytest argument or factory, or a
``-k`` that selects no test) is one :class:`InvalidArgumentError` raised before a report folder exists; the runner's
scratch folder carries its pid, so a later run removes the folder of a runner that was killed.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from hisparse_hal.errors import InvalidArgumentError
from hisparse_hal.python_child import process_alive, python_command, python_environment

from .subsets import subset_named

__all__ = ["check_arguments", "check_selection", "needs_selection_check", "scratch_directory", "sweep_stale_scratch"]

SCRATCH_PREFIX = "hisparse-conformance-run-"
#: pytest's own error lines: argparse's ``prog: error: ...`` and the ``ERROR: ...`` of a UsageError.
_ERROR_LINE = re.compile(r"^(?:ERROR: |.*?pytest: error: )(?P<message>.+)$")


def check_arguments(args: argparse.Namespace) -> None:
    """Check the options the runner can check without pytest.

    Raises:
        InvalidArgumentError: ``--timeout`` not a positive, finite number; ``-n`` neither ``auto``, ``logical``
            nor a non-negative int; ``--subset`` not a named subset; ``--pytest-args`` with an option after which
            no test runs (``--collect-only``...); ``-k`` not a valid pytest match expression (pytest's own parser
            says why).
    """
    timeout = args.timeout
    if timeout is None or not (math.isfinite(timeout) and timeout > 0):
        raise InvalidArgumentError(f"--timeout must be a positive number of seconds, got {timeout!r}")
    if args.numprocesses is not None:
        value = str(args.numprocesses)
        if value not in ("auto", "logical") and not value.isdigit():
            raise InvalidArgumentError(f"-n must be a number of processes, 'auto' or 'logical', got {value!r}")
    if getattr(args, "subset", None) is not None:
        subset_named(args.subset)
    _refuse_options_that_run_nothing(args.pytest_args or "")
    if args.keyword:
        from _pytest.mark.expression import Expression

        try:
            Expression.compile(args.keyword)
        except SyntaxError as exc:
            raise InvalidArgumentError(
                f"-k {args.keyword!r} is not a valid pytest expression: {exc.msg} (column {exc.offset})"
            ) from None


#: pytest options after which no test runs: a report of such a run would read INCOMPLETE with every test missing.
RUNS_NOTHING = ("--collect-only", "--co", "--setup-only", "--setup-plan", "--fixtures", "--fixtures-per-test",
                "--markers", "--help", "-h", "--version", "-V")


def _refuse_options_that_run_nothing(pytest_args: str) -> None:
    """Raises: InvalidArgumentError: ``--pytest-args`` holds an option after which pytest runs no test."""
    try:
        words = shlex.split(pytest_args)
    except ValueError:
        return  # the runner names the quoting error itself
    found = [w for w in words if w.split("=", 1)[0] in RUNS_NOTHING]
    if found:
        raise InvalidArgumentError(
            f"--pytest-args {pytest_args!r}: {found[0]} runs no test, and a conformance run is its tests; list them "
            "with 'python -m pytest -p hisparse_hal.conformance.plugin --pyargs hisparse_hal.conformance.tests "
            "--collect-only -q'"
        )


def needs_selection_check(args: argparse.Namespace, factory_is_class: bool) -> bool:
    """Whether the run needs :func:`check_selection`: a ``-k``, further pytest arguments, or a factory function
    (what it returns is known only once it is called)."""
    return bool(args.keyword or args.pytest_args or (args.factory and not factory_is_class))


def check_selection(argv: Sequence[str], args: argparse.Namespace) -> bool:
    """Collect the run's tests in a quiet pytest child (nothing runs, nothing is written) and check its arguments.

    Args:
        argv: the run's pytest arguments (with ``--hal-run``; without ``--hal-report`` and ``-n``).
        args: the runner's arguments, to name the option at fault.

    Returns:
        True when checked; False when the child died (the run itself then shows why).

    Raises:
        InvalidArgumentError: pytest refused an argument, the backend could not be built, or no test was selected.
    """
    command = python_command(module="pytest", args=[*argv, "--collect-only", "-q"])
    done = subprocess.run(command, env=python_environment(), capture_output=True, text=True, check=False)
    if done.returncode < 0:
        return False
    output = (done.stdout or "") + "\n" + (done.stderr or "")
    if done.returncode == 5:  # pytest's "no tests collected": none left after -k and the other deselections
        what = f"-k {args.keyword!r}" if args.keyword else f"--pytest-args {args.pytest_args!r}"
        raise InvalidArgumentError(f"{what} selected no test")
    if done.returncode != 0:
        raise InvalidArgumentError(_error_message(output, args, done.returncode))
    return True


def _error_message(output: str, args: argparse.Namespace, code: int) -> str:
    """pytest's one error line, without its prefixes, named with the option that caused it."""
    for line in output.splitlines():
        found = _ERROR_LINE.match(line.strip())
        if found:
            message = found.group("message").removeprefix("hisparse-hal conformance: ").strip()
            if message.startswith("usage:"):
                continue  # argparse's usage line; its error line follows
            if "unrecognized arguments" in message or "argument" in message.split(":", 1)[0]:
                return f"--pytest-args {args.pytest_args!r}: {message}" if args.pytest_args else message
            return message
    last = next((ln.strip() for ln in reversed(output.splitlines()) if ln.strip()), "no output")
    return f"pytest refused the run (exit status {code}): {last}"


def scratch_directory() -> str:
    """A new scratch folder for this runner, named with its pid so that :func:`sweep_stale_scratch` can tell
    whether its runner is gone."""
    return tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-")


def sweep_stale_scratch(directory: str | None = None) -> list[str]:
    """Remove the scratch folders of runners that no longer run (killed before they could remove them).

    Returns:
        The folders removed.
    """
    root = Path(directory or tempfile.gettempdir())
    removed = []
    for path in root.glob(f"{SCRATCH_PREFIX}*"):
        pid = path.name[len(SCRATCH_PREFIX):].split("-", 1)[0]
        if path.is_dir() and pid.isdigit() and not process_alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(str(path))
    return removed

