"""Run a child command in its own process group, so an interrupt can be passed on and nothing outlives it.

Invariant: when :func:`run_in_group` returns, no process of the child's group is alive. On SIGINT or SIGTERM
the child itself gets SIGINT (what a terminal's Ctrl-C sends) and ``grace_s`` seconds to run its cleanup
(pytest's session finish, which stops xdist workers; a scenario driver ending its ranks and removing its pool);
then its whole group gets SIGTERM and SIGKILL. Only the child is interrupted: its own children (workers, ranks,
peers) are its to stop, and none of them prints a ``KeyboardInterrupt`` traceback from the middle of its start-up.
If this process is SIGKILLed, nothing here runs: a child started with ``python_child.python_command`` ends
itself then (``die_with_parent``), and it is started from the thread that waits for it, as that requires.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from types import FrameType

__all__ = ["GroupRun", "run_in_group", "end_group", "DEFAULT_GRACE_S"]

#: Seconds an interrupted child's group has to finish its cleanup before it is ended.
DEFAULT_GRACE_S = 20.0
_TERM_GRACE_S = 3.0


@dataclasses.dataclass(frozen=True)
class GroupRun:
    """How a child run ended.

    Attributes:
        returncode: the child's exit status (negative: killed by that signal).
        interrupted_by: the signal (``"SIGINT"``, ``"SIGTERM"``) that interrupted the run, or None.
        forced: the group did not finish within the grace period and was ended with SIGTERM/SIGKILL.
    """

    returncode: int
    interrupted_by: str | None = None
    forced: bool = False


def end_group(pgid: int, grace_s: float = _TERM_GRACE_S) -> bool:
    """SIGTERM every process of group ``pgid``, then SIGKILL what is left after ``grace_s``.

    Returns:
        True when any process of the group was still alive to be signalled.
    """
    if not _signal_group(pgid, signal.SIGTERM):
        return False
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _group_alive(pgid):
        time.sleep(0.05)
    _signal_group(pgid, signal.SIGKILL)
    return True


def _signal_group(pgid: int, signum: int) -> bool:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    except PermissionError:  # a process that changed its credentials: nothing this process may end
        return False
    return True


def _group_alive(pgid: int) -> bool:
    return _signal_group(pgid, 0)


@contextlib.contextmanager
def _catching(signals: Sequence[int], caught: list[int]) -> Iterator[None]:
    """Record SIGINT/SIGTERM in ``caught`` instead of raising, for the duration of the block."""

    def handler(signum: int, frame: FrameType | None) -> None:
        caught.append(signum)

    if threading.current_thread() is not threading.main_thread():  # handlers can be set in the main thread only
        yield
        return
    previous = {signum: signal.signal(signum, handler) for signum in signals}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def run_in_group(
    argv: Sequence[str], env: Mapping[str, str] | None = None, grace_s: float = DEFAULT_GRACE_S,
    start_with_sigint_blocked: bool = False,
) -> GroupRun:
    """Run ``argv`` in a new process group and wait for it; pass an interrupt on to the whole group.

    From the main thread it handles SIGINT and SIGTERM while the child runs; from another thread it cannot, and
    only ends what is left of the group when the child exits.

    Args:
        argv: the command.
        env: its environment (default: this process's).
        grace_s: seconds the group has, after an interrupt, to finish before SIGTERM and SIGKILL.
        start_with_sigint_blocked: the child starts with SIGINT blocked and unblocks it once it can handle it
            (the conformance plugin does, when pytest's session starts); an interrupt before that waits.

    Returns:
        The child's exit status, and the signal that interrupted the run if one did.

    Raises:
        OSError: the command could not be started.
    """
    caught: list[int] = []
    forced = False
    with _catching((signal.SIGINT, signal.SIGTERM), caught):
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}) if start_with_sigint_blocked else None
        try:
            child = subprocess.Popen(list(argv), env=dict(env) if env is not None else None, start_new_session=True)
        finally:
            if blocked is not None:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        pgid = child.pid
        forwarded = 0
        deadline: float | None = None
        while True:
            try:
                code = child.wait(timeout=0.05)
                break
            except subprocess.TimeoutExpired:
                pass
            if len(caught) > forwarded:
                if forwarded == 0:  # first interrupt: let the child clean up
                    with contextlib.suppress(ProcessLookupError):
                        child.send_signal(signal.SIGINT)
                    deadline = time.monotonic() + grace_s
                else:  # a second interrupt: do not wait any longer
                    deadline = time.monotonic()
                forwarded = len(caught)
            if deadline is not None and time.monotonic() >= deadline and not forced:
                forced = end_group(pgid)
        if caught:  # the leader has exited: give its group (xdist workers, ranks) the rest of the grace period
            while deadline is not None and time.monotonic() < deadline and _group_alive(pgid):
                time.sleep(0.05)
        forced = end_group(pgid) or forced  # whatever is left of the group does not outlive the run
    interrupted = signal.Signals(caught[0]).name if caught else None
    return GroupRun(code, interrupted, forced)
