"""``ThirdBackend``: the contract on host memory under the registry name ``third`` (the CPU reference device's
implementation, as an out-of-tree vendor may reuse it)."""

from __future__ import annotations

from hisparse_hal.vendors.cpu.backend import CpuBackend

from .capabilities import plan_capabilities
from .runtime import RUNTIME_VERSION

__all__ = ["ThirdBackend"]


class ThirdBackend(CpuBackend):
    """The third vendor's backend (see the module docstring)."""

    name = "third"

    def __init__(self) -> None:
        super().__init__()
        self._capabilities = plan_capabilities(self._capabilities, RUNTIME_VERSION)
