"""Remove the memory-backed files (``/dev/shm``) that processes of this package leave when they exit without
removing them (killed, or ended by a crash):
scenario pools whose creator is dead, and what each backend spec's ``sweep_shared_files`` hook removes (the CPU
device's IPC event files whose exporter is dead).

Invariant: only files whose owner is gone are removed; a live run's files are never touched.
"""

from __future__ import annotations

import logging

__all__ = ["sweep_shared_files", "SWEPT"]

#: How a command names a file the sweep removed: the sweep knows only that the file's owner exited.
SWEPT = "left in shared memory by an exited process"

log = logging.getLogger(__name__)


def sweep_shared_files() -> list[str]:
    """Sweep stale scenario pools, then run every registered backend's ``sweep_shared_files`` hook.

    Returns:
        The paths removed (for the command to report).
    """
    from .probing import registered_specs
    from .scenario.pool import sweep_stale_pools

    removed = sweep_stale_pools()
    for spec in registered_specs():
        if spec.sweep_shared_files is None:
            continue
        try:
            removed += spec.sweep_shared_files()
        except Exception as exc:  # noqa: BLE001 - cleanup after an interrupt: one vendor's failure stops no other
            log.warning("the %r backend's shared-memory sweep failed: %s: %s", spec.name, type(exc).__name__, exc)
    return removed
