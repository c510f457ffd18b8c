"""``hisparse-hal conformance``: run the shared suite against one backend and report.

Invariant: the backend is resolved through the same registry as ``get_backend`` (strict: an unknown or
unavailable name is an error that prints the probe table) or built by an explicit factory; the exit
code is 0 only when no test failed or passed unexpectedly. Output paths are checked before the run; an
interrupted run gives pytest and everything it started a grace period, leaves no process and no scenario
pool behind, and leaves a report marked INCOMPLETE (exit 130). A usage error is one line before any report folder
exists: a ``-k``, ``--pytest-args`` or factory function is first checked by a quiet collection child
(:mod:`.preflight`), which builds the backend once more.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import shlex
import shutil
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from hisparse_hal.child_group import run_in_group
from hisparse_hal.errors import BackendUnavailableError, InvalidArgumentError
from hisparse_hal.output_checks import writable_directory, writable_file
from hisparse_hal.python_child import python_command, python_environment

from .expectations import load_expectations
from .junit import write_junit
from .preflight import check_arguments, check_selection, needs_selection_check, scratch_directory, sweep_stale_scratch
from .report import OUTCOMES, area_of, mark_incomplete, report_lines, terminal_lines, write_report
from .subsets import SUBSETS, subset_named

if TYPE_CHECKING:  # imported where used: they import torch, which the command's --help does not need
    from .resolved_run import ResolvedRun

__all__ = ["add_arguments", "run", "pytest_arguments", "complete_crashed_report"]

log = logging.getLogger(__name__)

PLUGIN = "hisparse_hal.conformance.plugin"
TESTS = "hisparse_hal.conformance.tests"
SETTINGS = Path(__file__).with_name("pytest-settings.toml")
#: Crashed tests after which the runner stops resuming.
MAX_CRASHES = 20
#: The command's exit status (0 ok, 1 tests failed, 2 usage or environment, 130 interrupted) for pytest's.
EXIT_OF_PYTEST = {0: 0, 1: 1, 2: 130, 3: 2, 4: 2, 5: 2}
INTERRUPTED = 130


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``conformance`` options to ``parser``."""
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--backend", metavar="NAME", default=None,
                       help="registry name of the backend to test (strict); default: what get_backend() selects")
    which.add_argument("--factory", metavar="MODULE:CALLABLE", default=None,
                       help="test an unregistered backend returned by this callable")
    which.add_argument("--vllm-backend", metavar="MODULE:CLASS", default=None,
                       help="test any class implementing vLLM 0.34.0's HiSparseBackend, built as vLLM builds it "
                       "(contract vllm-0.34.0: the suite less its hal_extension tests)")
    parser.add_argument("--expectations", metavar="FILE", default=None,
                        help="expectations TOML (default: the vendor's expectations.toml; 'none' for none)")
    parser.add_argument("--report", metavar="DIR", default=None, help="write results.json and summary.md into DIR")
    parser.add_argument("--junit", metavar="FILE", default=None,
                        help="also write JUnit XML, one test case per conformance test (for CI test reports)")
    parser.add_argument("--strict", action="store_true", help="expectation entries that match no test fail the run")
    parser.add_argument(
        "-k", dest="keyword", metavar="EXPR", default=None, help="only tests matching this pytest -k expression"
    )
    parser.add_argument("--subset", metavar="NAME", default=None,
                        help="run a named subset of the suite (never conformant): "
                        + "; ".join(f"{s.name}: {s.purpose}" for s in SUBSETS.values()))
    parser.add_argument(
        "-n",
        dest="numprocesses",
        metavar="N",
        default=None,
        help="run in N processes (pytest-xdist; 'auto' for one per core)",
    )
    parser.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                        help="per-test time limit when pytest-timeout is installed: a positive number of seconds "
                             "(default 600; 0, negative and non-finite values are refused)")
    parser.add_argument(
        "--pytest-args", default="", metavar="ARGS", help="further pytest arguments, as one quoted string"
    )


def pytest_arguments(args: argparse.Namespace, run: ResolvedRun, collecting: bool = False) -> list[str]:
    """The pytest command line (without the program name) for these runner arguments and the resolved run.

    It names the backend and the expectations file, so it reproduces the run by hand; the runner adds
    ``--hal-run run.json`` so that its child reads them (and the probe results) instead of resolving again.
    ``collecting``: the arguments of the selection check (no report, no ``--hal-strict``, no ``-n``).
    """
    recipe = run.recipe
    argv = ["-p", PLUGIN, "-c", str(SETTINGS), "--rootdir", str(Path(__file__).parent), "-p", "no:cacheprovider",
            "--pyargs", TESTS, "-rfE"]
    if recipe.vllm_class:
        argv += ["--hal-vllm-backend", recipe.vllm_class]
    else:
        argv += ["--hal-factory", recipe.factory] if recipe.factory else ["--hal-backend", str(recipe.registry_name)]
    if not run.expectations_pending:
        argv += ["--hal-expectations", run.expectations or "none"]
    if args.report and not collecting:
        argv += ["--hal-report", str(args.report)]
    if args.strict and not collecting:
        argv.append("--hal-strict")
    if args.keyword:
        argv += ["-k", args.keyword]
    if getattr(args, "subset", None):
        argv += ["-m", subset_named(args.subset).marker, "--hal-subset", args.subset]
    if args.numprocesses and not collecting:
        if importlib.util.find_spec("xdist") is None:
            raise InvalidArgumentError("-n needs pytest-xdist: pip install -e '.[test]' from the checkout")
        argv += ["-n", str(args.numprocesses)]
    if args.timeout and importlib.util.find_spec("pytest_timeout") is not None:
        argv += ["--timeout", str(args.timeout)]
    if args.pytest_args:
        argv.append(f"--hal-pytest-args={args.pytest_args}")  # "=": the value may start with "-"
    try:
        argv += shlex.split(args.pytest_args or "")
    except ValueError as exc:
        raise InvalidArgumentError(f"--pytest-args {args.pytest_args!r} cannot be split: {exc}") from None
    return argv


def check_outputs(args: argparse.Namespace) -> None:
    """Check ``--report`` and ``--junit`` before the run (the report folder is created).

    Raises:
        InvalidArgumentError: a path that cannot be written, named with its option.
    """
    if args.report:
        writable_directory(args.report, "--report")
    if args.junit:
        writable_file(args.junit, "--junit")


def run(args: argparse.Namespace) -> int:
    """Run the suite; the exit code is 0 only when nothing failed unexpectedly.

    Returns:
        0 when nothing failed, 1 when a test failed or passed unexpectedly, 2 for a usage or environment
        error (a bad ``-k`` or pytest argument, no test selected, an unresolvable backend: the message
        includes the probe table), 130 when the run was interrupted.
    """
    from hisparse_hal.output_checks import require_module

    for module in ("pytest", "hypothesis"):
        require_module(module, "test", "the conformance suite")
    if args.numprocesses:
        require_module("xdist", "test", "conformance -n")
    check_arguments(args)
    new_report = bool(args.report) and not Path(args.report).exists()
    check_outputs(args)
    try:
        return _resolve_and_run(args)
    except BaseException:
        if new_report and not any(Path(args.report).iterdir()):
            Path(args.report).rmdir()  # a usage error or an early interrupt leaves no empty report folder
        raise


def _resolve_and_run(args: argparse.Namespace) -> int:
    """Resolve the run, check its expectations, then run it in a scratch folder; see :func:`run`."""
    from .resolved_run import ResolvedRun

    try:
        resolved = ResolvedRun.resolve(args.backend, args.factory, args.expectations,  # probes, once per run
                                       getattr(args, "vllm_backend", None))
        argv = pytest_arguments(args, resolved)
    except BackendUnavailableError as exc:
        print(f"hisparse-hal conformance: {exc}", file=sys.stderr)
        return 2
    if resolved.expectations:
        load_expectations(resolved.expectations)  # a bad file is one line now, not a failed pytest start
    for path in sweep_stale_scratch():
        log.info("removed %s, the scratch folder of a runner that was killed", path)
    scratch = scratch_directory()
    try:
        return _run_in(scratch, args, resolved, argv)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _run_in(scratch: str, args: argparse.Namespace, resolved: ResolvedRun, argv: list[str]) -> int:
    """Check the selection, then run the suite with ``scratch`` as the children's temp folder; see :func:`run`."""
    from hisparse_hal.shm_sweep import SWEPT, sweep_shared_files

    run_file = resolved.write(Path(scratch) / "run.json")
    if needs_selection_check(args, factory_is_class=resolved.recipe.factory is None or _factory_is_class(resolved)):
        check_selection([*pytest_arguments(args, resolved, collecting=True), "--hal-run", str(run_file)], args)
    for path in sweep_shared_files():
        print(f"hisparse-hal conformance: removed {path}, {SWEPT}", file=sys.stderr)
    print(f"hisparse-hal conformance: testing {resolved.recipe.describe()}", file=sys.stderr)
    print("  python -P -m pytest " + shlex.join(argv), file=sys.stderr)
    directory = Path(args.report) if args.report else Path(tempfile.mkdtemp(prefix="hisparse-conformance-"))
    if not args.report:
        argv = [*argv, "--hal-report", str(directory)]
    # The children's temp files (xdist's gate folder among them) go into the scratch folder, removed with it.
    env = {**python_environment(), "TMPDIR": scratch}
    code, interrupted_by = _run_until_done([*argv, "--hal-run", str(run_file)], directory, env)
    for path in sweep_shared_files():  # what a test process ended by force left behind
        print(f"hisparse-hal conformance: removed {path}, {SWEPT}", file=sys.stderr)
    marked = None
    finished = interrupted_by is not None and _report_is_final(directory)
    if interrupted_by and not finished:
        why = f"the run was interrupted ({interrupted_by}) before every selected test ran"
        marked = mark_incomplete(directory, why)
    if interrupted_by:
        code = INTERRUPTED
    if args.junit and (marked or finished or not interrupted_by):
        code = _write_junit(args.junit, directory, code)
    if interrupted_by:
        if finished:
            where = f"every selected test had run; the report is complete: {directory / 'summary.md'}"
        elif marked:
            where = f"partial report, marked INCOMPLETE: {directory / 'summary.md'}"
        else:
            where = "no test had started, so no report was written"
        print(f"hisparse-hal conformance: interrupted ({interrupted_by}); {where}", file=sys.stderr)
    return code


def _report_is_final(directory: Path) -> bool:
    """Whether the folder holds the report of a finished run (written at the session's end, not a checkpoint)."""
    try:
        doc = json.loads((directory / "results.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return "incomplete" not in doc


def _write_junit(path: str, directory: Path, code: int) -> int:
    """Write the JUnit file from the run's final report; a run that left no report fails (exit 1 if it was 0)."""
    try:
        doc = json.loads((directory / "results.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        print(f"hisparse-hal conformance: no JUnit file written, the run left no report ({exc})", file=sys.stderr)
        return code or 1
    if code == EXIT_OF_PYTEST[4] and not doc.get("tests"):
        return code  # a usage error: the report is empty, a JUnit file of it would read as a run
    print(f"hisparse-hal conformance: wrote {write_junit(path, doc)}", file=sys.stderr)
    return code


def _factory_is_class(resolved: ResolvedRun) -> bool:
    """Whether the run's factory is a class (its instances' type is known without calling it)."""
    from .qualnames import load_factory

    return isinstance(load_factory(str(resolved.recipe.factory)), type)


def _run_until_done(argv: list[str], directory: Path, env: dict[str, str]) -> tuple[int, str | None]:
    """Run pytest in a child interpreter; when a test kills it (a fault in a vendor library), record
    that test as failed and resume with the tests not yet run, so one crash hides no other result.

    Returns:
        The command's exit status (see :data:`EXIT_OF_PYTEST`) and the signal that interrupted the run, if any.
    """
    crashed: list[str] = []
    resume: list[str] = []
    while True:
        # The child imports the package this process imported, never a source folder in the working directory.
        command = python_command(module="pytest", args=[*argv, *resume, "--hal-deferred-interrupts"])
        ended = run_in_group(command, env=env, start_with_sigint_blocked=True)
        code = ended.returncode
        if ended.interrupted_by:
            return INTERRUPTED, ended.interrupted_by
        if code >= 0:
            break
        test = complete_crashed_report(directory, code)
        if test is None or test in crashed or len(crashed) >= MAX_CRASHES:
            why = f"after {len(crashed) + 1} crashes" if test is not None else "(no partial report to resume from)"
            print(f"hisparse-hal conformance: the test process died (exit status {code}); not resuming {why}; "
                  "the tests not yet run are missing from the report", file=sys.stderr)
            if mark_incomplete(directory, f"the test process died (exit status {code}) and the run was not resumed"):
                _print_final_table(directory)  # the dead child printed none
            return 1, None
        crashed.append(test)
        print(f"hisparse-hal conformance: the test process died (exit status {code}) while running {test}; "
              "recorded as failed, resuming with the tests not yet run", file=sys.stderr)
        # Quiet (-q): a resumed run prints no second session header, only its progress and its summary.
        resume = ["--hal-resume", str(directory / "results.json"), "-q"]
    if crashed:
        print(
            f"hisparse-hal conformance: {len(crashed)} test(s) crashed the process: {', '.join(crashed)}",
            file=sys.stderr,
        )
        return EXIT_OF_PYTEST.get(code, 1) if code not in (0, 5) else 1, None
    return EXIT_OF_PYTEST.get(code, 1), None


def _print_final_table(directory: Path) -> None:
    """Print the end-of-run table of the report in ``directory`` and where it is, as a finished pytest run does."""
    doc = json.loads((directory / "results.json").read_text(encoding="utf-8"))
    print("\n".join(terminal_lines(doc)))
    print("\n".join(report_lines(directory)))


def complete_crashed_report(directory: str | Path, code: int) -> str | None:
    """Turn the partial report of a run whose process died into a final one.

    The test that was running is recorded as failed (with the exit status); the summary is recounted.

    Returns:
        The id of the test that was running, or None when there is no partial report.
    """
    path = Path(directory) / "results.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    running = doc.pop("incomplete", {}).get("running")
    if running is None:
        return None
    reason = f"the test process died (exit status {code}) while running this test"
    tests = [t for t in doc["tests"] if t["id"] != running]
    tests.append({"id": running, "area": area_of(running), "outcome": "failed", "duration": 0.0, "reason": reason})
    doc["tests"] = tests
    doc["summary"] = {o: sum(1 for t in tests if t["outcome"] == o) for o in OUTCOMES}
    write_report(directory, doc)
    return running
