"""AMD GPUs listed through amdsmi (the ``[rocm]`` extra), which reads the driver without a HIP context.

vLLM's ROCm platform probes the same way (``amdsmi_init``, ``amdsmi_get_processor_handles``). Invariants:
every successful ``amdsmi_init`` is paired with ``amdsmi_shut_down``; no HIP call is made; nothing amdsmi
prints while importing reaches stdout; a failure amdsmi reports by return value never becomes a fact.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import logging
from collections.abc import Callable
from types import ModuleType
from typing import Any

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
        facts: versions amdsmi knows (``rocm_version``, ``driver_version``), best effort; when one is
            unknown, ``<name>_error`` says why instead (``rocm_version_error``, ``driver_version_error``).
    """

    devices: tuple[GpuDevice, ...]
    error: str | None
    facts: dict[str, str] = dataclasses.field(default_factory=dict)


def import_amdsmi() -> ModuleType:
    """Import the ``amdsmi`` package (the ``[rocm]`` extra) without letting it write to stdout.

    amdsmi 7.0.2 (``amdsmi_wrapper.py``) ``print``s two lines when ``libamd_smi.so`` is missing, then fails
    with ``KeyError: 'libamd_smi.so'``; on stdout they would corrupt ``hisparse-hal info --json``. Those are
    Python-level prints, so ``sys.stdout`` is redirected for the import and what was said is logged at
    debug level. File descriptor 1 is left alone: the package writes nothing there, and redirecting it
    would also swallow the output of the host process's other threads.

    Raises:
        ImportError: it is not installed. A broken install raises what its import raised (``KeyError``,
            ``OSError``).
    """
    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(said):
            return importlib.import_module("amdsmi")
    finally:
        if said.getvalue():
            log.debug("importing amdsmi printed: %s", said.getvalue().rstrip())


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
                                   "install it with pip install amdsmi (the [rocm] extra: "
                                   "pip install -e '.[rocm]' in a hisparse-hal checkout)")
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
        name = asic.get("market_name")
        devices.append(
            GpuDevice(index, str(name) if name and name != _NOT_AVAILABLE else "AMD GPU",
                      _arch(asic.get("target_graphics_version")))
        )
    facts: dict[str, str] = {}
    for key, call, read in (
        ("rocm_version", "amdsmi_get_rocm_version", _rocm_version),
        ("driver_version", "amdsmi_get_gpu_driver_info", _driver_version),
    ):
        try:
            value, why_unknown = read(amdsmi, handles[0])
        except Exception as exc:  # noqa: BLE001 - optional facts: the reason is kept, the listing goes on
            value, why_unknown = None, f"{call} failed ({type(exc).__name__}: {exc})"
        if value is not None:
            facts[key] = value
        else:
            facts[f"{key}_error"] = str(why_unknown)
    return AmdSmiInventory(tuple(devices), None, facts)


# amdsmi 7.0.2 fills fields the driver leaves empty with this text instead of failing
# (amdsmi_interface.py: amdsmi_get_gpu_asic_info, amdsmi_get_gpu_driver_info).
_NOT_AVAILABLE = "N/A"


def _rocm_version(amdsmi: Any, _handle: Any) -> tuple[str | None, str | None]:
    """``(version, None)`` or ``(None, why unknown)``.

    ``amdsmi_get_rocm_version`` reports failure by return value, not by raising: it returns ``(True,
    "7.0.2")`` or ``(False, "Could not find librocm-core.so")`` (amdsmi 7.0.2, amdsmi_interface.py).
    """
    result = amdsmi.amdsmi_get_rocm_version()
    if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], bool):
        ok, text = result
        if ok and text:
            return str(text), None
        return None, f"amdsmi_get_rocm_version failed: {text}" if not ok else "amdsmi_get_rocm_version gave no version"
    if isinstance(result, str) and result and result != _NOT_AVAILABLE:
        return result, None
    return None, f"amdsmi_get_rocm_version returned {result!r}, neither (ok, version) nor a version"


def _driver_version(amdsmi: Any, handle: Any) -> tuple[str | None, str | None]:
    value = amdsmi.amdsmi_get_gpu_driver_info(handle).get("driver_version")
    if not value or value == _NOT_AVAILABLE:
        return None, f"amdsmi_get_gpu_driver_info gave driver_version {value!r}"
    return str(value), None


def _arch(raw: object) -> str | None:
    # amdsmi 7.0.2 builds the name as "gfx" + hex(target), so an unset target reads "gfx0".
    if isinstance(raw, str) and raw.lower().startswith("gfx") and raw.lower() != "gfx0":
        return raw.lower()
    if isinstance(raw, int) and not isinstance(raw, bool):
        return gfx_name(raw)
    return None
