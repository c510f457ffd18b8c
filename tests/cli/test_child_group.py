"""What an interrupt leaves behind (issue 24): a child's whole process group gets the interrupt and a grace period,
then is ended; shared-memory pools whose creator is dead are found and removed, live ones never."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from hisparse_hal.child_group import run_in_group
from hisparse_hal.scenario.pool import NAME_PREFIX, SharedPool, pool_owner, sweep_stale_pools

# A parent that starts a grandchild in its group, writes both pids, and on SIGINT cleans up (a marker file).
_CHILD = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    out = sys.argv[1]
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open(out + ".pids", "w").write(f"{os.getpid()} {grandchild.pid}")
    try:
        time.sleep(600)
    except KeyboardInterrupt:
        open(out + ".interrupted", "w").write("yes")
        time.sleep(float(sys.argv[2]))  # the cleanup takes this long
        open(out + ".cleaned", "w").write("yes")
        sys.exit(2)
""")


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


#: Longest wait for a child's marker file (an interpreter starting on a loaded machine).
_START_LIMIT_S = 240.0


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + _START_LIMIT_S
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.02)


def _interrupt_when_started(marker: Path, signum: int, times: int = 1) -> threading.Thread:
    """Signal this process once the child wrote its pids; a second time once the child is in its cleanup."""
    def send() -> None:
        _wait_for(Path(str(marker) + ".pids"))
        os.kill(os.getpid(), signum)
        if times > 1:
            _wait_for(Path(str(marker) + ".interrupted"))
            os.kill(os.getpid(), signum)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupt_reaches_the_child_which_cleans_up_and_nothing_of_its_group_survives(tmp_path, signum):
    marker = tmp_path / "child"
    thread = _interrupt_when_started(marker, signum)
    ended = run_in_group([sys.executable, "-c", _CHILD, str(marker), "0.3"], grace_s=10)
    thread.join()
    assert ended.interrupted_by == signal.Signals(signum).name and ended.returncode == 2
    assert (tmp_path / "child.cleaned").read_text() == "yes"
    leader, grandchild = map(int, (tmp_path / "child.pids").read_text().split())
    assert not _alive(grandchild), "the grandchild outlived the run"


def test_a_child_that_overruns_its_grace_period_is_ended_by_group(tmp_path):
    marker = tmp_path / "child"
    thread = _interrupt_when_started(marker, signal.SIGINT)
    started = time.monotonic()
    ended = run_in_group([sys.executable, "-c", _CHILD, str(marker), "600"], grace_s=1)
    thread.join()
    # Ended, not waited for: the cleanup would take 600 s (a bound no load comes near).
    assert ended.forced and ended.interrupted_by == "SIGINT" and time.monotonic() - started < 300
    assert not (tmp_path / "child.cleaned").exists()
    assert not any(_alive(int(p)) for p in (tmp_path / "child.pids").read_text().split())


def test_a_second_interrupt_ends_the_group_without_waiting(tmp_path):
    marker = tmp_path / "child"
    thread = _interrupt_when_started(marker, signal.SIGINT, times=2)
    started = time.monotonic()
    ended = run_in_group([sys.executable, "-c", _CHILD, str(marker), "600"], grace_s=600)
    thread.join()
    # The second interrupt ends the group: neither the 600 s grace nor the 600 s cleanup is waited for.
    assert ended.forced and (tmp_path / "child.interrupted").exists() and time.monotonic() - started < 300


def test_an_uninterrupted_run_returns_the_exit_status_and_ends_stragglers(tmp_path):
    code = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            f"open({str(tmp_path / 'pid')!r}, 'w').write(str(p.pid)); sys.exit(3)")
    ended = run_in_group([sys.executable, "-c", code])
    assert ended.returncode == 3 and ended.interrupted_by is None
    assert not _alive(int((tmp_path / "pid").read_text()))


def test_pool_files_carry_their_creators_pid():
    path = SharedPool.create(2, 2, 4096)
    try:
        assert pool_owner(os.path.basename(path)) == os.getpid()
    finally:
        SharedPool.unlink(path)


def test_the_sweep_removes_pools_of_dead_creators_and_keeps_live_ones(tmp_path):
    dead = tmp_path / f"{NAME_PREFIX}{_dead_pid()}-{'a' * 32}"
    live = tmp_path / f"{NAME_PREFIX}{os.getpid()}-{'b' * 32}"
    other = tmp_path / "unrelated-file"
    for path in (dead, live, other):
        path.write_bytes(b"\0" * 4096)
    assert sweep_stale_pools(str(tmp_path)) == [str(dead)]
    assert live.exists() and other.exists() and not dead.exists()


def test_the_sweep_judges_old_style_names_by_the_pids_their_ranks_recorded(tmp_path):
    import struct

    from hisparse_hal.scenario.pool import _PIDS_AT

    def old_style(name: str, pids: list[int]) -> Path:
        path = tmp_path / f"{NAME_PREFIX}{name}"
        words = [-1] * 511
        for i, pid in enumerate(pids):
            words[_PIDS_AT + i] = pid
        path.write_bytes(struct.pack("<511q", *words) + b"\0" * 8)
        return path

    dead = old_style("c" * 32, [_dead_pid()])
    live = old_style("d" * 32, [os.getpid()])
    fresh = old_style("e" * 32, [])
    assert sweep_stale_pools(str(tmp_path)) == [str(dead)]
    assert live.exists() and fresh.exists()


def test_a_child_started_with_sigint_blocked_gets_the_interrupt_when_it_unblocks_it(tmp_path):
    marker = tmp_path / "child"
    code = textwrap.dedent(f"""
        import signal, time
        open({str(marker) + '.pids'!r}, "w").write("0 0")
        time.sleep(1.0)  # start-up: an interrupt now must wait
        try:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {{signal.SIGINT}})
            time.sleep(30)
        except KeyboardInterrupt:
            open({str(marker) + '.cleaned'!r}, "w").write("after unblocking")
    """)
    thread = _interrupt_when_started(marker, signal.SIGINT)
    ended = run_in_group([sys.executable, "-c", code], grace_s=10, start_with_sigint_blocked=True)
    thread.join()
    assert ended.interrupted_by == "SIGINT" and not ended.forced and ended.returncode == 0
    assert (tmp_path / "child.cleaned").read_text() == "after unblocking"
