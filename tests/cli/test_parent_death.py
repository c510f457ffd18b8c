"""Children die with their parent on every path, SIGKILL included (issue 30 item 3): a Python child started with
``python_command``, ``hisparse-hal scenario``'s ranks, ``hisparse-hal conformance``'s pytest child and the IPC
peers and ranks it starts. What the killed run left in ``/dev/shm`` is removed by the next run.

Every moment is observed (a pid printed, a process in the table, a pool file in /dev/shm), and every wait is
bounded and generous, so the outcome does not depend on the machine's load."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from hisparse_hal.python_child import python_command, python_environment
from tests.cli.interrupt_watch import EXIT_LIMIT_S, MOMENTS, Watch, _alive, ranks_started, script


def _wait_dead(pid: int, limit_s: float = EXIT_LIMIT_S) -> bool:
    deadline = time.monotonic() + limit_s
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not _alive(pid)


def test_a_python_child_dies_when_its_parent_is_sigkilled():
    # The parent starts a child that would sleep for ten minutes, prints its pid and waits for it.
    parent_code = ("import subprocess, sys\n"
                   "from hisparse_hal.python_child import python_command, python_environment\n"
                   "child = subprocess.Popen(python_command(code='import time; time.sleep(600)'), "
                   "env=python_environment())\n"
                   "print(child.pid, flush=True)\n"
                   "child.wait()\n")
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())  # type: ignore[union-attr]
        assert _alive(child)
        parent.kill()
        parent.wait()
        assert _wait_dead(child), f"the child {child} outlived its SIGKILLed parent"
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()  # type: ignore[union-attr]


def test_a_child_whose_parent_died_before_it_could_ask_ends_at_once():
    # The race: the parent died between the fork and the request, so the child already has another parent.
    done = subprocess.run(python_command(code="print('ran')"), env=python_environment(), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stdout == "ran\n", done.stderr
    command = python_command(code="print('ran')")
    pid_at = command.index(str(os.getpid()))
    command[pid_at] = "1"  # as if the process that built the command were pid 1: this child's parent is not it
    done = subprocess.run(command, env=python_environment(), capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL and done.stdout == "", (done.returncode, done.stderr)


def _kill_and_check(watch: Watch) -> list[str]:
    """SIGKILL the command only (not its group); assert every process of the run ends; return what it left in
    /dev/shm."""
    os.kill(watch.child.pid, signal.SIGKILL)
    watch.child.wait()
    survivors = watch.wait_gone()
    details = {pid: open(f"/proc/{pid}/cmdline", "rb").read()[:200] for pid in survivors if _alive(pid)}
    assert survivors == [], f"processes outlived the SIGKILLed command: {details}"
    return watch.leftovers()


def _next_run_sweeps(leftovers: list[str]) -> None:
    done = subprocess.run([script(), "scenario", "--backend", "cpu", "--ranks", "2", "--steps", "2"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    still = [path for path in leftovers if os.path.exists(path)]
    assert still == [], f"the next run did not remove {still}\n{done.stderr[-2000:]}"
    for path in leftovers:
        said = f"removed {path}, left in shared memory by an exited process" in done.stderr
        if os.path.basename(path).startswith("hisparse-hal-pool-") and not said:
            # /dev/shm is shared by the xdist workers: a scenario run of the other worker may have swept it first.
            assert os.environ.get("PYTEST_XDIST_WORKER"), f"the next run removed {path} without saying so"


@pytest.mark.timeout(900)
@pytest.mark.parametrize("moment", ["pool created", "ranks stepping"])
def test_a_sigkilled_scenario_leaves_no_rank_and_the_next_run_sweeps_its_files(moment):
    watch = Watch(["scenario", "--backend", "cpu", "--ranks", "2", "--steps", "1000000"])
    try:
        watch.wait_until(MOMENTS[moment], f"the scenario reached '{moment}'")
        ranks = watch.spawned()
        leftovers = _kill_and_check(watch)
        assert all(not _alive(pid) for pid in ranks)
    finally:
        watch.close()
    if moment == "pool created":  # the pool's name carries the dead driver's pid, unless rank 0 removed it first
        assert leftovers or not watch.pools_seen.intersection(os.listdir("/dev/shm"))
    _next_run_sweeps(leftovers)


@pytest.mark.timeout(900)
@pytest.mark.parametrize("keyword", ["test_ipc", "scenario"])
def test_a_sigkilled_conformance_run_leaves_no_pytest_child_peer_or_rank(tmp_path, keyword):
    watch = Watch(["conformance", "--backend", "cpu", "-k", keyword, "--report", str(tmp_path / "report")])
    try:
        watch.wait_until(ranks_started, "the suite started an IPC peer or a scenario rank")
        assert len(watch.alive()) >= 3, "expected the command, its pytest child and a peer or rank"
        leftovers = _kill_and_check(watch)
    finally:
        watch.close()
    _next_run_sweeps(leftovers)
