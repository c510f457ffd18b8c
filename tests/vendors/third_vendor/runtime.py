"""The third vendor's runtime binding: here a pure-Python stand-in for a vendor library (no C library to load)."""

from __future__ import annotations

__all__ = ["RUNTIME_VERSION", "runtime_facts"]

#: What the stand-in library reports as its version.
RUNTIME_VERSION = "0.3"


def runtime_facts() -> dict[str, str]:
    """The facts the probe reports: the runtime's version."""
    return {"third_runtime": RUNTIME_VERSION}
