"""Test helper: run the ``hisparse-hal`` console script, signal it at a chosen moment, and find what survives it:
processes (every descendant carries a marker in its environment) and ``/dev/shm`` files whose owner was one of
them (a scenario pool names its creator; a CPU IPC event file records its exporter's pid in its header)."""

from __future__ import annotations

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
from pathlib import Path

SHM = Path("/dev/shm") if os.access("/dev/shm", os.W_OK) else Path(os.environ.get("TMPDIR", "/tmp"))
MARKER = "HISPARSE_TEST_INTERRUPT_RUN"


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


@dataclasses.dataclass
class Interrupted:
    """What one signalled run printed and left."""

    returncode: int
    stdout: str
    stderr: str
    signalled: bool
    leftovers: list[str]
    survivors: list[int]


def interrupt(args: list[str], delay_s: float, signum: int = signal.SIGINT, *, to_group: bool = False,
              cwd: Path | None = None, timeout: float = 300, extra_env: dict[str, str] | None = None,
              after_processes: int = 0) -> Interrupted:
    """Run ``hisparse-hal ARGS``, send ``signum`` after ``delay_s`` (to the command, or to its whole process
    group as a terminal's Ctrl-C does), wait for it, and collect what survived.

    ``after_processes``: start counting ``delay_s`` only once the run has that many processes (the command is
    one), so the moment is the same on a loaded machine, where start-up alone may take seconds."""
    marker = uuid.uuid4().hex
    before = {p.name for p in SHM.glob("hisparse-hal-*")}
    env = {k: v for k, v in os.environ.items() if not k.startswith("HISPARSE_HAL_")}
    env[MARKER] = marker
    env.update(extra_env or {})
    seen: set[int] = set()
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            seen.update(_marked_pids(marker))
            stop.wait(0.1)

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    # Output goes to files, not pipes: a full pipe would stall the command before the signal is sent.
    out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    child = subprocess.Popen([script(), *args], env=env, cwd=cwd, stdout=out, stderr=err, text=True,
                             start_new_session=True)
    signalled = False
    deadline = time.monotonic() + timeout
    while len(seen) < after_processes and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        child.wait(timeout=delay_s)
    except subprocess.TimeoutExpired:
        signalled = True
        if to_group:
            os.killpg(child.pid, signum)
        else:
            child.send_signal(signum)
    try:
        child.wait(timeout=timeout)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    finally:
        out.close()
        err.close()
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
        time.sleep(0.3)
        stop.set()
        watcher.join()
    seen.update(_marked_pids(marker))
    survivors = sorted(pid for pid in _marked_pids(marker) if _alive(pid))
    new = [SHM / name for name in {p.name for p in SHM.glob("hisparse-hal-*")} - before]
    leftovers = sorted(str(p) for p in new if p.exists() and _owners(p) & seen)
    for pid in survivors:  # leave nothing behind for the next test either
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return Interrupted(child.returncode, stdout, stderr, signalled, leftovers, survivors)
