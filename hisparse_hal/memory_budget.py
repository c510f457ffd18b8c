"""The memory a command may use: what the kernel says is available, and a check that refuses a run whose
estimate does not fit before anything is allocated (instead of the allocator failing halfway through).
"""

from __future__ import annotations

import os

from .errors import InvalidArgumentError

__all__ = ["available_bytes", "check_fits"]


def available_bytes() -> int | None:
    """Bytes of memory available to new allocations (``MemAvailable``; else free pages), or None when unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


def check_fits(needed: int, what: str, available: int | None = None) -> None:
    """Refuse ``what`` when its estimate ``needed`` exceeds the memory available.

    Raises:
        InvalidArgumentError: it does not fit; the message gives both figures and names ``what``.
    """
    free = available_bytes() if available is None else available
    if free is not None and needed > free:
        raise InvalidArgumentError(
            f"{what} needs about {needed / 2**30:.1f} GiB of memory, but {free / 2**30:.1f} GiB is available; "
            "choose smaller values"
        )
