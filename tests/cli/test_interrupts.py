"""Ctrl-C and SIGTERM during the console script's long commands (issue 24): one line saying what was interrupted
and where the partial report is, exit 130, a report marked INCOMPLETE, and no process or /dev/shm file left.

The 50-interrupt soak at random moments runs with ``HISPARSE_SOAK_INTERRUPTS=50 python -m pytest -p no:xdist
tests/test_cli_interrupts.py -k soak`` (about 20 minutes on 2 cores); it is skipped otherwise.
"""

from __future__ import annotations

import json
import os
import random
import signal
from pathlib import Path

import pytest

from tests.cli.interrupt_watch import MOMENTS, Interrupted, interrupt, ranks_started, ranks_stepping

SOAK = int(os.environ.get("HISPARSE_SOAK_INTERRUPTS", "0") or 0)


def _clean(run: Interrupted) -> None:
    detail = run.stderr[-3000:]
    assert run.leftovers == [], f"left in /dev/shm: {run.leftovers}\n{detail}"
    assert run.survivors == [], f"processes survived: {run.survivors}\n{detail}"
    assert "Traceback" not in run.stderr, detail
    assert "INTERNALERROR" not in run.stdout + run.stderr, run.stdout[-3000:]


def _check_interrupted(run: Interrupted, report: Path | None) -> None:
    _clean(run)
    if not run.signalled or run.returncode != 130:
        assert run.returncode in (0, 1) and not run.signalled or run.returncode == 130, (run.returncode, run.stderr)
        return
    last = run.stderr.strip().splitlines()[-1]
    assert "interrupted (SIG" in last, run.stderr[-2000:]
    if "every selected test had run; the report is complete" in last:  # the signal came as the run ended
        assert report is not None and "INCOMPLETE" not in (report / "summary.md").read_text()
        return
    if report is not None and (report / "results.json").exists():
        assert "INCOMPLETE" in (report / "summary.md").read_text().splitlines()[0]
        doc = json.loads((report / "results.json").read_text())
        assert doc["incomplete"]["reason"]
        cut = set(filter(None, (doc["incomplete"].get("running") or "").split(", ")))
        assert not cut & {t["id"] for t in doc["tests"]}, "a test the interrupt cut short has an outcome"
        assert str(report / "summary.md") in last


@pytest.mark.timeout(900)
def test_ctrl_c_during_the_scenario_tier_leaves_an_incomplete_report_and_nothing_else(tmp_path):
    # Signalled while a scenario test's ranks run their steps (issue 30 item 9: pytest then formats the
    # interrupt's traceback, whose frames hold tensors viewing the shared pool: it must still be mapped).
    report = tmp_path / "report"
    run = interrupt(["conformance", "--backend", "cpu", "-k", "scenario", "--report", str(report),
                     "--junit", str(tmp_path / "junit.xml")], to_group=True, when=ranks_stepping)
    assert "Fatal Python error" not in run.stderr, run.stderr[-3000:]
    assert run.signalled and run.returncode == 130, run.stderr[-3000:]
    _check_interrupted(run, report)
    assert "INCOMPLETE" in (report / "summary.md").read_text().splitlines()[0]
    assert '<error type="incomplete"' in (tmp_path / "junit.xml").read_text()


@pytest.mark.timeout(900)
def test_sigterm_under_two_workers_leaves_nothing_and_no_warnings_after_exit(tmp_path):
    report = tmp_path / "report"
    run = interrupt(["conformance", "--backend", "cpu", "-k", "scenario or ipc", "-n", "2", "--report", str(report)],
                    signum=signal.SIGTERM, when=ranks_started)
    assert run.signalled and run.returncode == 130, run.stderr[-3000:]
    _check_interrupted(run, report)
    assert run.stderr.strip().splitlines()[-1].startswith("hisparse-hal conformance: interrupted (SIGTERM)")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("moment,signum", [("ranks started", signal.SIGINT), ("pool created", signal.SIGTERM),
                                           ("ranks stepping", signal.SIGINT)])
def test_scenario_interrupted_at_several_moments(moment, signum):
    # Each moment is observed (process table, /dev/shm), so it is the same moment however loaded the machine is.
    run = interrupt(["scenario", "--backend", "cpu", "--ranks", "3", "--steps", "100000"], signum=signum,
                    to_group=signum == signal.SIGINT, when=MOMENTS[moment])
    assert run.returncode == 130, run.stderr[-3000:]
    _check_interrupted(run, None)
    assert run.stderr.strip().splitlines()[-1] == (
        f"hisparse-hal scenario: interrupted ({signal.Signals(signum).name}); the ranks were stopped and the shared "
        "pool removed; no --json file was written")


def test_a_pool_left_by_a_killed_run_is_removed_by_the_next_run(tmp_path):
    import subprocess
    import sys

    from tests.cli.interrupt_watch import SHM, script

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = SHM / f"hisparse-hal-pool-{int(dead.stdout)}-{'f' * 32}"
    stale.write_bytes(b"\0" * 8192)
    done = subprocess.run([script(), "scenario", "--backend", "cpu", "--ranks", "2", "--steps", "5"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not stale.exists()
    said = f"hisparse-hal scenario: removed {stale}, left in shared memory by an exited process" in done.stderr
    # /dev/shm is shared by the xdist workers: a scenario run of the other worker may have swept it first.
    assert said or os.environ.get("PYTEST_XDIST_WORKER"), done.stderr[-2000:]


@pytest.mark.skipif(SOAK <= 0, reason="the interrupt soak runs with HISPARSE_SOAK_INTERRUPTS=N")
@pytest.mark.timeout(120 * SOAK + 60)
def test_soak_interrupts_at_random_moments(tmp_path):
    rng = random.Random(int(os.environ.get("HISPARSE_SOAK_SEED", "24")))
    commands = [
        (["conformance", "--backend", "cpu", "-k", "scenario"], 40.0, True),
        (["conformance", "--backend", "cpu", "-k", "scenario or ipc", "-n", "2"], 45.0, True),
        (["conformance", "--backend", "cpu", "-k", "stats or capture or scenario"], 40.0, True),
        (["scenario", "--backend", "cpu", "--ranks", "3", "--steps", "3000"], 15.0, False),
        (["scenario", "--backend", "cpu", "--ranks", "2", "--steps", "20000"], 15.0, False),
    ]
    counts = {"interrupted": 0, "finished first": 0, "leftovers": 0, "survivors": 0}
    for i in range(SOAK):
        args, longest, conformance = rng.choice(commands)
        report = tmp_path / f"r{i}"
        signum = rng.choice([signal.SIGINT, signal.SIGTERM])
        delay = rng.uniform(0.2, longest)
        run = interrupt([*args, "--report", str(report)] if conformance else args, delay_s=delay, signum=signum,
                        to_group=rng.random() < 0.5)
        counts["interrupted" if run.returncode == 130 else "finished first"] += 1
        counts["leftovers"] += len(run.leftovers)
        counts["survivors"] += len(run.survivors)
        print(f"soak {i + 1}/{SOAK}: {' '.join(args[:4])} +{delay:.1f}s {signal.Signals(signum).name} -> "
              f"rc {run.returncode}, leftovers {run.leftovers}, survivors {run.survivors}", flush=True)
        _check_interrupted(run, report if conformance else None)
    print(f"soak done: {counts}")


# Imported by the console script's interpreter at start-up (PYTHONPATH): the import of torch writes a marker
# file, then waits 600 s, so a signal sent once the marker exists lands while the command starts, however
# loaded the machine is.
_SLOW_TORCH_IMPORT = """
import os, sys, time

class _SlowTorch:
    def find_spec(self, name, path=None, target=None):
        if name == "torch":
            sys.meta_path.remove(self)
            open(os.environ["HISPARSE_TEST_IMPORTING_TORCH"], "w").close()
            time.sleep(600)
        return None

sys.meta_path.insert(0, _SlowTorch())
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_while_the_command_starts_is_one_line(signum, tmp_path):
    (tmp_path / "sitecustomize.py").write_text(_SLOW_TORCH_IMPORT)
    importing = tmp_path / "importing-torch"
    run = interrupt(["info"], signum=signum, when=lambda watch: importing.exists(),
                    extra_env={"PYTHONPATH": str(tmp_path), "HISPARSE_TEST_IMPORTING_TORCH": str(importing)})
    assert run.signalled, "the command ended before the signal: the slowed torch import did not take effect"
    assert run.returncode == 130 and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert run.stderr.strip() == f"hisparse-hal: interrupted ({signal.Signals(signum).name}) while starting; " \
                                 "nothing was done"
