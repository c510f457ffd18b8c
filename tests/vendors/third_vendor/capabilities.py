"""The third vendor's capabilities, decided in one pure function: the CPU device's, with its runtime version."""

from __future__ import annotations

import dataclasses

from hisparse_hal.capabilities import Capabilities

__all__ = ["plan_capabilities"]


def plan_capabilities(base: Capabilities, runtime_version: str) -> Capabilities:
    """``base`` (the host device it runs on) with ``versions["third_runtime"]`` recorded.

    Args:
        base: the capabilities of the device it runs on.
        runtime_version: the runtime's version.

    Returns:
        The :class:`Capabilities`.
    """
    return dataclasses.replace(base, versions={**base.versions, "third_runtime": runtime_version})
