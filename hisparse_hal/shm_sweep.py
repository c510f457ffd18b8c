"""Remove the memory-backed files (``/dev/shm``) that processes of this package leave when they exit without
removing them (killed, or ended by a crash):
scenario pools whose creator is dead and CPU IPC event files whose exporter is dead.

Invariant: only files whose owner is gone are removed; a live run's files are never touched.
"""

from __future__ import annotations

import os

__all__ = ["sweep_shared_files", "SWEPT"]

#: How a command names a file the sweep removed: the sweep knows only that the file's owner exited.
SWEPT = "left in shared memory by an exited process"


def sweep_shared_files() -> list[str]:
    """Sweep stale scenario pools and CPU IPC event files.

    Returns:
        The paths removed (for the command to report).
    """
    from .scenario.pool import sweep_stale_pools
    from .vendors.cpu.ipc_event import _event_dir, sweep_stale_events

    removed = sweep_stale_pools()
    removed += [os.path.join(_event_dir(), name) for name in sweep_stale_events()]
    return removed
