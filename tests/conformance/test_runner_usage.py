"""The conformance runner's usage errors: one line, exit 2, before any test runs, and nothing left in $TMPDIR
(no report folder, no scratch folder); a crashing backend's restarts print one pytest header."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hisparse_hal.conformance.preflight import SCRATCH_PREFIX, sweep_stale_scratch

PREFIX = "hisparse-hal conformance: "


def _script() -> str:
    found = shutil.which("hisparse-hal", path=str(Path(sys.executable).parent)) or shutil.which("hisparse-hal")
    assert found, "the hisparse-hal console script is not installed (pip install -e '.[test]')"
    return found


def _conformance(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """Run ``hisparse-hal conformance ARGS`` with ``tmp_path/tmp`` as its private $TMPDIR."""
    private = tmp_path / "tmp"
    private.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HISPARSE_HAL_")}
    env["TMPDIR"] = str(private)
    return subprocess.run([_script(), "conformance", *args], env=env, capture_output=True, text=True, timeout=300,
                          cwd=tmp_path)


def _the_one_line(done: subprocess.CompletedProcess) -> str:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert len(lines) == 1 and done.stdout == "", done.stdout[-2000:] + done.stderr[-2000:]
    return lines[0]


def _left_in_tmpdir(tmp_path: Path) -> list[str]:
    return sorted(os.listdir(tmp_path / "tmp"))


def test_a_keyword_that_selects_nothing_is_one_line_and_writes_no_report(tmp_path):
    done = _conformance(tmp_path, "--backend", "cpu", "-k", "nonexistent_zzz", "--report", str(tmp_path / "r"))
    assert _the_one_line(done) == PREFIX + "-k 'nonexistent_zzz' selected no test"
    assert _left_in_tmpdir(tmp_path) == [] and not (tmp_path / "r").exists()


def test_a_malformed_keyword_is_pytests_own_error_before_the_run(tmp_path):
    done = _conformance(tmp_path, "--backend", "cpu", "-k", "and or")
    assert _the_one_line(done) == (PREFIX + "-k 'and or' is not a valid pytest expression: "
                                   "expected not OR left parenthesis OR identifier; got and (column 1)")
    assert _left_in_tmpdir(tmp_path) == []


@pytest.mark.parametrize(("args", "line"), [
    (["-n", "abc"], "-n must be a number of processes, 'auto' or 'logical', got 'abc'"),
    (["--timeout", "-1"], "--timeout must be a positive number of seconds, got -1.0"),
    (["--timeout", "0"], "--timeout must be a positive number of seconds, got 0.0"),
    (["--timeout", "nan"], "--timeout must be a positive number of seconds, got nan"),
    (["--timeout", "inf"], "--timeout must be a positive number of seconds, got inf"),
    (["--pytest-args", "--collect-only -q"], "--pytest-args '--collect-only -q': --collect-only runs no test, and a "
     "conformance run is its tests; list them with 'python -m pytest -p hisparse_hal.conformance.plugin --pyargs "
     "hisparse_hal.conformance.tests --collect-only -q'"),
    (["--pytest-args", "-q --setup-plan"], "--pytest-args '-q --setup-plan': --setup-plan runs no test, and a "
     "conformance run is its tests; list them with 'python -m pytest -p hisparse_hal.conformance.plugin --pyargs "
     "hisparse_hal.conformance.tests --collect-only -q'"),
])
def test_a_bad_option_value_is_one_line_naming_it(tmp_path, args, line):
    done = _conformance(tmp_path, "--backend", "cpu", *args)
    assert _the_one_line(done) == PREFIX + line
    assert _left_in_tmpdir(tmp_path) == []


def test_an_unknown_pytest_argument_is_one_line_not_pytests_usage(tmp_path):
    done = _conformance(tmp_path, "--backend", "cpu", "--pytest-args", "--nope", "--report", str(tmp_path / "r"))
    assert _the_one_line(done) == PREFIX + "--pytest-args '--nope': unrecognized arguments: --nope"
    assert _left_in_tmpdir(tmp_path) == [] and not (tmp_path / "r").exists()


def test_a_factory_that_returns_no_backend_is_one_line(tmp_path):
    done = _conformance(tmp_path, "--factory", "os:getcwd")
    assert _the_one_line(done) == PREFIX + "factory 'os:getcwd' returned str, not a HiSparseBackend"
    assert _left_in_tmpdir(tmp_path) == []


@pytest.mark.parametrize(("text", "message"), [
    ("[[expectation]\n", "is not valid TOML"),
    ('[[expectations]]\nid = "test_swaps.py"\nstatus = "maybe"\nreason = "r"\n', "'status' must be one of"),
    (None, "cannot read expectations file"),
])
def test_a_bad_expectations_file_is_one_line(tmp_path, text, message):
    path = tmp_path / "e.toml"
    if text is not None:
        path.write_text(text)
    done = _conformance(tmp_path, "--backend", "cpu", "--expectations", str(path))
    line = _the_one_line(done)
    assert line.startswith(PREFIX) and message in line and str(path) in line
    assert _left_in_tmpdir(tmp_path) == []


def test_a_parallel_run_leaves_nothing_in_tmpdir(tmp_path):
    pytest.importorskip("xdist")
    done = _conformance(tmp_path, "--backend", "cpu", "--expectations", "none", "-n", "2",
                        "-k", "test_backend_identity", "--report", str(tmp_path / "r"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert _left_in_tmpdir(tmp_path) == []  # no hisparse-gate-* folder, no scratch folder
    assert (tmp_path / "r" / "results.json").exists()


def test_the_scratch_folder_of_a_killed_runner_is_swept_and_a_live_ones_kept(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = tmp_path / f"{SCRATCH_PREFIX}{dead.stdout.strip()}-abc"
    live = tmp_path / f"{SCRATCH_PREFIX}{os.getpid()}-def"
    for folder in (gone, live):
        folder.mkdir()
        (folder / "run.json").write_text("{}")
    (tmp_path / "hisparse-conformance-run-notapid").mkdir()
    assert sweep_stale_scratch(str(tmp_path)) == [str(gone)]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["hisparse-conformance-run-notapid", live.name])


def test_a_crashing_backend_prints_one_header_and_one_line_per_crash(tmp_path):
    done = _conformance(tmp_path, "--factory", "hisparse_hal.testing.broken_backends:SwapCrashesTheProcess",
                        "--expectations", "none", "-k", "test_swap_batch_of_n_descriptors_copies_every_byte and 819",
                        "--report", str(tmp_path / "r"))
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    assert out.count("test session starts") == 1, out[-3000:]
    crashes = [line for line in done.stderr.splitlines() if "the test process died" in line]
    assert len(crashes) == 3 and all("recorded as failed" in line for line in crashes), crashes
    assert "test_swap_batch_of_n_descriptors_copies_every_byte[8191]" in crashes[0]
    assert _left_in_tmpdir(tmp_path) == []
    # The last resume had nothing left to run; the selection is still the run's three tests, not 0.
    selection = json.loads((tmp_path / "r" / "results.json").read_text(encoding="utf-8"))["selection"]
    assert (selection["selected"], selection["areas"], selection["per_area"]) == (3, ["swaps"], {"swaps": 3})
    assert "3 tests selected; 260 deselected" in (tmp_path / "r" / "summary.md").read_text(encoding="utf-8")


def test_a_run_given_up_after_crashes_prints_its_table_verdict_and_report(tmp_path, monkeypatch, capsys):
    """The last child died, so it printed no table: the runner prints the INCOMPLETE report's, and the area the
    crashes cut short reads FAIL (INCOMPLETE n/N), not a plain count that hides the tests never run."""
    from hisparse_hal.cli import main
    from hisparse_hal.conformance import runner

    monkeypatch.setattr(runner, "MAX_CRASHES", 1)  # give up at the second crash instead of the 21st
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    report = tmp_path / "r"
    code = main(["conformance", "--factory", "hisparse_hal.testing.broken_backends:SwapCrashesTheProcess",
                 "--expectations", "none", "-k", "test_swap_batch_of_n_descriptors_copies_every_byte and 819",
                 "--report", str(report)])
    out = capsys.readouterr()
    assert code == 1, out.out[-3000:] + out.err[-3000:]
    assert "not resuming after 2 crashes" in out.err
    doc = json.loads((report / "results.json").read_text(encoding="utf-8"))
    assert doc["verdict"] == "INCOMPLETE" and doc["summary"]["failed"] == 2
    printed = out.out.splitlines()
    assert printed[-2:] == [f"report: {report / 'results.json'}, {report / 'summary.md'}",
                            f"next: hisparse-hal verify {report} (CONFORMANT or NOT CONFORMANT, with every reason)"]
    assert "| Swaps | FAIL (INCOMPLETE 2/3) | 0 | 2 | 0 | 0 | 0 |" in printed
    assert any(line.startswith("**INCOMPLETE**: the test process died") for line in printed)
    assert "| Swaps | FAIL (INCOMPLETE 2/3) |" in (report / "summary.md").read_text(encoding="utf-8")


_SKIPS_EVERY_RUN = """
import pytest

@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    return True  # claims each test handled and runs nothing: no report reaches the suite's plugin
"""


def test_a_direct_pytest_run_that_runs_nothing_exits_nonzero_with_its_incomplete_report(tmp_path):
    """The exit status agrees with the verdict: a run whose selected tests never report (here a plugin that swallows
    each test; in life an internal error) exits 0 on its own, so the report reads INCOMPLETE and the run exits 1.
    --setup-plan, after which pytest reports every test passed without running it, is refused; --collect-only only
    lists the tests and writes no report."""
    (tmp_path / "swallow_every_test.py").write_text(_SKIPS_EVERY_RUN, encoding="utf-8")
    base = [sys.executable, "-m", "pytest", "-p", "hisparse_hal.conformance.plugin", "--pyargs",
            "hisparse_hal.conformance.tests", "-p", "no:cacheprovider", "-k", "test_stats", "--hal-backend", "cpu"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("HISPARSE_HAL_")}
    env["PYTHONPATH"] = str(tmp_path)
    swallowed = subprocess.run([*base, "-p", "swallow_every_test", "--hal-report", str(tmp_path / "r")],
                               cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert swallowed.returncode == 1, swallowed.stdout[-3000:] + swallowed.stderr[-2000:]
    doc = json.loads((tmp_path / "r" / "results.json").read_text(encoding="utf-8"))
    assert doc["verdict"] == "INCOMPLETE" and doc["summary"]["passed"] == 0
    assert doc["incomplete"]["reason"].startswith("the run stopped with 5 of 5 selected tests not run")
    planned = subprocess.run([*base, "--setup-plan"], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=300)
    assert planned.returncode == 4, planned.stdout[-3000:] + planned.stderr[-2000:]
    assert ("ERROR: hisparse-hal conformance: --setup-plan runs no test, and pytest would report each as passed; a "
            "conformance run is its tests") in planned.stderr
    listed = subprocess.run([*base, "--collect-only", "-q", "--hal-report", str(tmp_path / "listed")], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=300)
    assert listed.returncode == 0, listed.stdout[-3000:]
    assert "test_stats.py::test_stats_deltas_are_taken_modulo_two_to_the_64" in listed.stdout
    assert "hisparse-hal conformance" not in listed.stdout and not (tmp_path / "listed" / "results.json").exists()
