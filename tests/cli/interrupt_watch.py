"""Test helper: run the ``hisparse-hal`` console script, signal it at an observed moment, and find what survives
it: processes (every descendant carries a marker in its environment) and ``/dev/shm`` files whose owner was one of
them (a scenario pool names its creator; a CPU IPC event file records its exporter's pid in its header).

Moments are events seen in the process table and in ``/dev/shm`` (:data:`MOMENTS`), never a delay: on a loaded
machine start-up alone may take a minute, and a delay then lands at another moment."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

SHM = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else Path(os.environ.get("TMPDIR", "/tmp"))
MARKER = "HISPARSE_TEST_INTERRUPT_RUN"
#: Longest wait for an observed moment (interpreters, torch and ranks starting on a machine at load 8).
MOMENT_LIMIT_S = 240.0
#: Longest wait for a run's processes to be gone after its parent was killed.
EXIT_LIMIT_S = 120.0
#: Time a finished run's last processes have to end on their own (a helper reading its closed pipe).
SETTLE_S = 30.0


def script() -> str:
    found = shutil.which("hisparse-hal", path=str(Path(sys.executable).parent)) or shutil.which("hisparse-hal")
    assert found, "the hisparse-hal console script is not installed (pip install -e '.[test]')"
    return found


def _marked_pids(marker: str) -> set[int]:
    needle = f"{MARKER}={marker}".encode()
    found = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if needle in Path(entry.path, "environ").read_bytes():
                found.add(int(entry.name))
        except OSError:
            continue
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _owners(path: Path) -> set[int]:
    """The pids a hisparse-hal shared file belongs to."""
    name = path.name
    try:
        raw = path.read_bytes()[: 4096]
    except OSError:
        return set()
    if name.startswith("hisparse-hal-pool-"):
        head = name[len("hisparse-hal-pool-"):].partition("-")
        owners = {int(head[0])} if head[1] and head[0].isdigit() else set()
        words = struct.unpack(f"<{len(raw) // 8}q", raw[: len(raw) // 8 * 8])
        return owners | {w for w in words[128:255] if w > 0}
    if name.startswith("hisparse-hal-event-") and len(raw) >= 32:
        return {struct.unpack_from("<Q", raw, 24)[0]}
    return set()


@contextlib.contextmanager
def _sigint_not_ignored() -> Iterator[None]:
    """Let a command started in this block take SIGINT, even when this test run ignores it.

    A test run started in the background (``cmd &``, ``nohup``) inherits SIGINT ignored, and an ignored signal
    stays ignored across ``exec``: the command's Python would then install no handler and a SIGINT would do
    nothing (issue 30: "a SIGINT 1.5 s into info gave exit 0"). A caught signal is reset to its default at
    ``exec``, so catching it here for the moment of the start is enough."""
    main = threading.current_thread() is threading.main_thread()
    if not main or signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


class Watch:
    """A running ``hisparse-hal`` command and what it has been seen to start (polled every 50 ms)."""

    def __init__(self, args: list[str], *, cwd: Path | None = None, extra_env: dict[str, str] | None = None) -> None:
        self.marker = uuid.uuid4().hex
        self.before = {p.name for p in SHM.glob("hisparse-hal-*")}
        env = {k: v for k, v in os.environ.items() if not k.startswith("HISPARSE_HAL_")}
        env[MARKER] = self.marker
        env.update(extra_env or {})
        self.seen: set[int] = set()
        self.pools_seen: set[str] = set()
        # Output goes to files, not pipes: a full pipe would stall the command before the signal is sent.
        self._out, self._err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        with _sigint_not_ignored():
            self.child = subprocess.Popen([script(), *args], env=env, cwd=cwd, stdout=self._out,
                                          stderr=self._err, text=True, start_new_session=True)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.seen.update(_marked_pids(self.marker))
            self.pools_seen.update(str(p) for p in self.pools())
            self._stop.wait(0.05)

    def alive(self) -> list[int]:
        """The run's processes alive now."""
        return sorted(pid for pid in _marked_pids(self.marker) if _alive(pid))

    def spawned(self) -> list[int]:
        """The run's live multiprocessing children (scenario ranks, conformance IPC peers)."""
        return [pid for pid in self.alive() if "spawn_main" in _cmdline(pid)]

    def pools(self) -> list[Path]:
        """Scenario pool files in /dev/shm created by one of the run's processes."""
        return [p for p in SHM.glob("hisparse-hal-pool-*") if _owners(p) & (self.seen | {self.child.pid})]

    def leftovers(self) -> list[str]:
        """Files of the run's processes in /dev/shm that were not there before it."""
        new = [SHM / name for name in {p.name for p in SHM.glob("hisparse-hal-*")} - self.before]
        return sorted(str(p) for p in new if p.exists() and _owners(p) & (self.seen | {self.child.pid}))

    def wait_until(self, moment: Callable[[Watch], bool], what: str, limit_s: float = MOMENT_LIMIT_S) -> None:
        """Wait until ``moment(self)`` holds; fail (with the output) when the command ends first or it never does."""
        deadline = time.monotonic() + limit_s
        while not moment(self):
            if self.child.poll() is not None:
                raise AssertionError(f"the command ended (exit {self.child.returncode}) before {what}:\n"
                                     f"{self.output()[1][-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"not {what} within {limit_s:.0f} s")
            time.sleep(0.05)

    def wait_gone(self, limit_s: float = EXIT_LIMIT_S) -> list[int]:
        """Wait until none of the run's processes is alive (at most ``limit_s``); the ones still alive."""
        deadline = time.monotonic() + limit_s
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.alive()

    def output(self) -> tuple[str, str]:
        """What the command printed so far (stdout, stderr)."""
        self._out.seek(0)
        self._err.seek(0)
        return self._out.read(), self._err.read()

    def close(self) -> list[int]:
        """Stop watching, kill whatever of the run is left (so nothing outlives the test); the pids that were."""
        if self.child.poll() is None:
            os.killpg(self.child.pid, signal.SIGKILL)
            self.child.wait()
        self._stop.set()
        self._thread.join()
        self.seen.update(_marked_pids(self.marker))
        survivors = self.wait_gone(SETTLE_S)  # multiprocessing's resource tracker ends once its pipe closes
        for pid in survivors:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        self._out.close()
        self._err.close()
        return survivors


def ranks_started(watch: Watch) -> bool:
    """The command has started a multiprocessing child (a scenario rank or an IPC peer)."""
    return bool(watch.spawned())


def pool_created(watch: Watch) -> bool:
    """A scenario pool file exists and a rank is starting: the ranks have not all mapped it yet."""
    return bool(watch.pools()) and bool(watch.spawned())


def ranks_stepping(watch: Watch) -> bool:
    """A scenario pool was created and is gone again (rank 0 removes its name once every rank mapped it) while
    the ranks are alive: the ranks are running their steps."""
    return bool(watch.pools_seen) and not watch.pools() and bool(watch.spawned())


#: The observed moments a test can signal at.
MOMENTS: dict[str, Callable[[Watch], bool]] = {
    "ranks started": ranks_started, "pool created": pool_created, "ranks stepping": ranks_stepping,
}


@dataclasses.dataclass
class Interrupted:
    """What one signalled run printed and left."""

    returncode: int
    stdout: str
    stderr: str
    signalled: bool
    leftovers: list[str]
    survivors: list[int]


def interrupt(args: list[str], delay_s: float = 0.0, signum: int = signal.SIGINT, *, to_group: bool = False,
              cwd: Path | None = None, timeout: float = 300, extra_env: dict[str, str] | None = None,
              when: Callable[[Watch], bool] | None = None) -> Interrupted:
    """Run ``hisparse-hal ARGS``, send ``signum`` once ``when`` holds (an observed moment, see :data:`MOMENTS`),
    plus ``delay_s`` (the soak's random moments), to the command or to its whole process group as a terminal's
    Ctrl-C does; wait for it (at most ``timeout`` after the signal), and collect what survived."""
    watch = Watch(args, cwd=cwd, extra_env=extra_env)
    signalled = False
    try:
        if when is not None:
            watch.wait_until(when, "the moment to signal came")
        try:
            watch.child.wait(timeout=delay_s)
        except subprocess.TimeoutExpired:
            signalled = True
            if to_group:
                os.killpg(watch.child.pid, signum)
            else:
                watch.child.send_signal(signum)
        watch.child.wait(timeout=timeout)
        stdout, stderr = watch.output()
        leftovers = watch.leftovers()
    finally:
        survivors = watch.close()
    return Interrupted(watch.child.returncode, stdout, stderr, signalled, leftovers, survivors)
