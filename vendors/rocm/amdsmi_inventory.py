"""AMD GPUs listed through amdsmi (the ``[rocm]`` extra), which reads the driver without a HIP context.

vLLM's ROCm platform probes the same way (``amdsmi_init``, ``amdsmi_get_processor_handles``). Invariant:
every successful ``amdsmi_init`` is paired with ``amdsmi_shut_down``; no HIP call is made.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
from types import ModuleType
from typing import Any, Callable

from .kfd_topology import gfx_name
from .visible_devices import GpuDevice

__all__ = ["AmdSmiInventory", "import_amdsmi", "read_amdsmi_inventory"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class AmdSmiInventory:
    """What amdsmi reported, or why it could not be used.

    Attributes:
        devices: GPUs in amdsmi's handle order.
        error: why amdsmi gave no devices (not installed, init failed, none found), else None.
        facts: versions amdsmi knows (``rocm_version``, ``driver_version``), best effort.
    """

    devices: tuple[GpuDevice, ...]
    error: str | None
    facts: dict[str, str] = dataclasses.field(default_factory=dict)


def import_amdsmi() -> ModuleType:
    """Import the ``amdsmi`` package (the ``[rocm]`` extra).

    Raises:
        ImportError: it is not installed.
    """
    return importlib.import_module("amdsmi")


def read_amdsmi_inventory(importer: Callable[[], Any] = import_amdsmi) -> AmdSmiInventory:
    """List GPUs with amdsmi.

    Args:
        importer: returns the ``amdsmi`` module (tests pass a fake).

    Returns:
        An :class:`AmdSmiInventory`; ``error`` is set when amdsmi is missing, fails to initialize
        (common in unprivileged containers and WSL, vLLM #40081, #46110) or lists no GPU.
    """
    try:
        amdsmi = importer()
    except Exception as exc:  # noqa: BLE001 - ImportError, or OSError/KeyError from a broken install
        return AmdSmiInventory((), f"amdsmi is not importable ({type(exc).__name__}: {exc}); "
                                   "install it with pip install 'hisparse-hal[rocm]'")
    try:
        amdsmi.amdsmi_init()
    except Exception as exc:  # noqa: BLE001 - AmdSmiException and friends; recorded, not swallowed
        return AmdSmiInventory((), f"amdsmi_init failed ({type(exc).__name__}: {exc})")
    try:
        return _list_devices(amdsmi)
    except Exception as exc:  # noqa: BLE001 - a failed listing falls back to sysfs, with the reason
        return AmdSmiInventory((), f"amdsmi_get_processor_handles failed ({type(exc).__name__}: {exc})")
    finally:
        try:
            amdsmi.amdsmi_shut_down()
        except Exception:  # noqa: BLE001 - shutting down must not hide the result
            log.warning("amdsmi_shut_down failed", exc_info=True)


def _list_devices(amdsmi: Any) -> AmdSmiInventory:
    handles = list(amdsmi.amdsmi_get_processor_handles())
    if not handles:
        return AmdSmiInventory((), "amdsmi lists no AMD GPU")
    devices = []
    for index, handle in enumerate(handles):
        try:
            asic = amdsmi.amdsmi_get_gpu_asic_info(handle)
        except Exception as exc:  # noqa: BLE001 - keep the device, name what is unknown
            asic = {"market_name": f"unknown ({type(exc).__name__})"}
        devices.append(
            GpuDevice(index, str(asic.get("market_name") or "AMD GPU"), _arch(asic.get("target_graphics_version")))
        )
    facts: dict[str, str] = {}
    for key, call in (
        ("rocm_version", lambda: amdsmi.amdsmi_get_rocm_version()),
        ("driver_version", lambda: amdsmi.amdsmi_get_gpu_driver_info(handles[0])["driver_version"]),
    ):
        try:
            value = call()
        except Exception:  # noqa: BLE001 - optional facts only
            continue
        if isinstance(value, tuple):  # some amdsmi releases return (ok, version)
            value = value[-1]
        if value:
            facts[key] = str(value)
    return AmdSmiInventory(tuple(devices), None, facts)


def _arch(raw: object) -> str | None:
    if isinstance(raw, str) and raw.lower().startswith("gfx"):
        return raw.lower()
    if isinstance(raw, int) and not isinstance(raw, bool):
        return gfx_name(raw)
    return None
