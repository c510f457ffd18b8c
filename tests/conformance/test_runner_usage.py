"""The conformance runner's usage errors: one line, exit 2, before any test runs, and nothing left in $TMPDIR
(no report folder, no scratch folder); a crashing backend's restarts print one pytest header."""

from __future__ import annotations

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
