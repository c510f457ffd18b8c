"""Registry entry of the third vendor: what the core asks a spec (device type, torch build, variables, sweep)."""

from __future__ import annotations

import os
from collections.abc import Mapping

from hisparse_hal.errors import InvalidArgumentError
from hisparse_hal.registry import BackendSpec, Probe

from .runtime import RUNTIME_VERSION, runtime_facts

__all__ = ["BUILD_ENV", "SPEC", "SWEPT", "probe"]

#: ``1``: pretend the running torch is this vendor's build (the core then refuses a silent CPU fallback).
BUILD_ENV = "HISPARSE_HAL_THIRD_BUILD"
#: What the sweep hook returns, so a test sees the core ran it.
SWEPT: list[str] = []


def probe() -> Probe:
    """Always available: the stand-in runtime is always there."""
    return Probe(True, f"the third vendor's runtime {RUNTIME_VERSION} runs on host memory", runtime_facts())


def torch_build() -> str | None:
    """``"third <version>"`` when ``HISPARSE_HAL_THIRD_BUILD=1``, else None."""
    return f"third {RUNTIME_VERSION}" if os.environ.get(BUILD_ENV, "") == "1" else None


def check_environment(environ: Mapping[str, str]) -> None:
    """``HISPARSE_HAL_THIRD_BUILD`` must be ``0`` or ``1``."""
    value = environ.get(BUILD_ENV)
    if value is not None and value not in ("0", "1"):
        raise InvalidArgumentError(f"{BUILD_ENV} must be 0 or 1, got {value!r}")


def sweep_shared_files() -> list[str]:
    """The paths in :data:`SWEPT` (nothing is on disk)."""
    return list(SWEPT)


SPEC = BackendSpec(
    name="third",
    priority=50,
    probe=probe,
    backend_class="tests.vendors.third_vendor.backend:ThirdBackend",
    device_type="cpu",
    torch_build=torch_build,
    environment=((BUILD_ENV, "1: the running torch is the third vendor's build"),),
    check_environment=check_environment,
    sweep_shared_files=sweep_shared_files,
)
