"""The command line of every Python child process the package starts, so that the child imports the package
its parent imported (the installed one) and never a same-named source folder in the working directory, and dies
with the process that started it (:func:`die_with_parent`), even when that one is SIGKILLed.

Invariant: the child's ``sys.path`` does not start with the working directory (``-P`` on Python >= 3.11, a
bootstrap that drops that entry before anything is imported on 3.10), and its environment carries
``PYTHONSAFEPATH=1`` so the interpreters it starts in turn (pytest-xdist workers, ``python -c`` probes) are safe too.
This module imports nothing of the package (the bootstrap loads it by path, before torch is imported).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from collections.abc import Mapping, Sequence

__all__ = ["python_command", "python_environment", "die_with_parent", "process_alive"]

# Runs with ``-c``: on Python 3.10, which has neither -P nor PYTHONSAFEPATH, sys.path[0] is then '' (the working
# directory) and is removed first (under -P or PYTHONSAFEPATH there is no such entry and nothing is removed). It
# loads this file by path (not the package, whose import imports torch) to call die_with_parent with the pid of
# the process that built the command, then runs the module or code the way ``-m`` / ``-c`` would.
_BOOTSTRAP = (
    "import importlib.util, runpy, sys\n"
    "if sys.path and sys.path[0] == '':\n"
    "    del sys.path[0]\n"
    "helper, parent, kind, target = sys.argv[1:5]\n"
    "del sys.argv[1:5]\n"
    "spec = importlib.util.spec_from_file_location('_hisparse_hal_python_child', helper)\n"
    "python_child = importlib.util.module_from_spec(spec)\n"
    "spec.loader.exec_module(python_child)\n"
    "python_child.die_with_parent(int(parent))\n"
    "if kind == '-m':\n"
    "    runpy.run_module(target, run_name='__main__', alter_sys=True)\n"
    "else:\n"
    "    sys.argv[0] = '-c'\n"
    "    exec(compile(target, '<string>', 'exec'), {'__name__': '__main__'})\n"
)


def python_command(*, module: str | None = None, code: str | None = None, args: Sequence[str] = ()) -> list[str]:
    """The argv that runs ``python -m MODULE ARGS`` or ``python -c CODE ARGS`` in this interpreter, safely.

    The child dies with this process (see :func:`die_with_parent`): start it from this process, directly
    (``subprocess``, not through a shell or another process), from a thread that waits for it.

    Args:
        module: a module to run as ``__main__`` (``-m``); exactly one of ``module`` and ``code``.
        code: Python source to run (``-c``).
        args: the child's arguments (its ``sys.argv[1:]``).

    Returns:
        The command line for :func:`subprocess.run` (pass ``env=python_environment()`` as well).

    Raises:
        ValueError: neither or both of ``module`` and ``code`` given.
    """
    if module is not None and code is None:
        kind, target = "-m", module
    elif code is not None and module is None:
        kind, target = "-c", code
    else:
        raise ValueError(f"python_command needs exactly one of module and code, got module={module!r}, code={code!r}")
    safe_path = ["-P"] if sys.version_info >= (3, 11) else []
    return [sys.executable, *safe_path, "-c", _BOOTSTRAP, os.path.abspath(__file__), str(os.getpid()), kind, target,
            *args]


def python_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child started with :func:`python_command`.

    Args:
        base: the environment to start from (default: this process's).

    Returns:
        A copy of ``base`` with ``PYTHONSAFEPATH=1`` (honoured from Python 3.11 by the child's own children).
    """
    env = dict(os.environ if base is None else base)
    env["PYTHONSAFEPATH"] = "1"
    return env


# prctl(2) option: the signal this process gets when its parent ends (Linux; survives execve).
_PR_SET_PDEATHSIG = 1
#: Seconds between checks of the parent, where the kernel cannot be asked to signal its death.
WATCH_PERIOD_S = 0.5


def process_alive(pid: int) -> bool:
    """Whether a process with this pid exists (another user's live process counts: the kernel says it exists)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def die_with_parent(parent_pid: int) -> None:
    """Make this process end (SIGKILL) when its parent ``parent_pid`` ends, however that ends, SIGKILL included.

    Call it first thing in a child. On Linux the kernel delivers SIGKILL at the parent's death
    (``PR_SET_PDEATHSIG``); elsewhere a daemon thread checks the parent every ``WATCH_PERIOD_S``. A parent that
    died before the call (between the fork and here) is caught by comparing ``os.getppid()`` with
    ``parent_pid`` after setting it: this process then ends at once.

    Caveat (Linux): the signal fires when the *thread* that started this child exits, not only the process.
    The package starts its children from a thread that waits for them (``run_in_group``, the scenario driver,
    the conformance suite's IPC peers), so that thread outlives them; a caller that starts one from a
    short-lived thread must not use this.

    Args:
        parent_pid: the pid of the process that started this one.
    """
    libc = _libc()
    if libc is not None and libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) == 0:
        if os.getppid() != parent_pid:
            os.kill(os.getpid(), signal.SIGKILL)
        return
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(target=_watch_parent, args=(parent_pid,), name="hisparse-parent-watch", daemon=True).start()


def _libc() -> ctypes.CDLL | None:
    """The C library with ``prctl`` (Linux), else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    return libc if hasattr(libc, "prctl") else None


def _watch_parent(parent_pid: int) -> None:
    """End this process once its parent is no longer ``parent_pid`` (it was reparented: the parent died)."""
    stop = threading.Event()
    while not stop.wait(WATCH_PERIOD_S):
        if os.getppid() != parent_pid:
            os.kill(os.getpid(), signal.SIGKILL)
