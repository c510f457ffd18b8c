"""``RocmBackend``: the shared torch GPU layer plus what differs on AMD GPUs.

What is ROCm's own: the HIP runtime binding and its capability plan, the device alias of every host
registration (which the shared layer's ``device_addresses`` hands kernels), KV formats per gfx
architecture, graph capture gated on the HIP version, and IPC events that stop at ROCm 7.2's cycle limit.
Invariant: runtime copies take host addresses (the HIP runtime resolves registered host pointers); only kernels
need the device alias (SGLang #35233).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

import torch

from hisparse_hal.errors import UnsupportedCapabilityError
from hisparse_hal.kv_cache import KV_FORMAT_SPECS
from hisparse_hal.vendors.gpu.backend import TorchGpuBackend
from hisparse_hal.vendors.gpu.device_module import TorchDeviceModule
from hisparse_hal.vendors.gpu.events import GpuIpcEvent

from .capabilities import GfxArch, arch_facts, parse_arch, plan_capabilities
from .ipc_cycles import CycleLimitedIpcEvent
from .runtime import HipRuntime

if TYPE_CHECKING:
    from hisparse_hal.registry import ProbeResult

__all__ = ["RocmBackend"]

log = logging.getLogger(__name__)

_FP8_MAX = {"fp8_e4m3fn": 448, "fp8_e4m3fnuz": 224}


class RocmBackend(TorchGpuBackend):
    """The HiSparse backend for AMD GPUs on a ROCm build of torch. Not yet run on AMD hardware.

    Constructed like :class:`TorchGpuBackend`: ``capabilities`` from
    :func:`~hisparse_hal.vendors.rocm.plan_capabilities` for this GPU, ``runtime`` a :class:`HipRuntime`,
    ``device_index`` the HIP ordinal (after the visibility variables); tests inject the CPU device with a
    simulated runtime.
    """

    name = "rocm"

    @property
    def arch(self) -> GfxArch:
        """This GPU's architecture as planned (``capabilities.versions["arch"]``, e.g. gfx942 + features)."""
        return parse_arch(self.capabilities.versions.get("arch", ""))

    @classmethod
    def from_probe(cls, probe: ProbeResult) -> RocmBackend:
        """Bind the HIP runtime torch loaded, read the current GPU's architecture and plan for it.

        This creates the HIP context (selection has already chosen this backend).

        Raises:
            BackendUnavailableError: libamdhip64 could not be loaded or lacks a required symbol.
            DeviceRuntimeError: hipRuntimeGetVersion failed.
        """
        runtime = HipRuntime.load()
        gpu = TorchDeviceModule.current(cls.device_type)
        device_index = gpu.index
        arch = gpu.module.get_device_properties(device_index).gcnArchName
        capabilities = plan_capabilities(runtime.runtime_version(), arch, batch_symbol=runtime.has_batch_copy())
        extra = {"torch.version.hip": str(torch.version.hip), "hip_library": runtime.path}
        for key in ("rocm_version", "driver_version", "device_source"):
            if key in probe.facts:
                extra[key] = str(probe.facts[key])
        capabilities = dataclasses.replace(capabilities, versions={**capabilities.versions, **extra})
        log.info(
            "rocm backend on HIP device %d (%s), HIP runtime %s",
            device_index,
            arch,
            capabilities.versions["hip_runtime"],
        )
        return cls(capabilities, runtime, device_index)

    # ----------------------------------------------------------------- KV formats per architecture
    def validate_kv_cache_config(self, kv_cache_config: Any) -> None:
        """Validate a KV cache description for this GPU's architecture (formats from the capabilities).

        Raises:
            InvalidArgumentError: a malformed config.
            UnsupportedCapabilityError: a format this architecture cannot hold; for an fp8 flavour the
                message names the one this architecture uses (gfx94x: fnuz, gfx950: OCP; quirk 16).
        """
        try:
            super().validate_kv_cache_config(kv_cache_config)
        except UnsupportedCapabilityError as error:
            hint = self._format_hint(getattr(kv_cache_config, "format", None))
            if hint:
                raise UnsupportedCapabilityError(f"{error}. {hint}") from error
            raise

    def _format_hint(self, requested: object) -> str:
        if requested == "fp8_ds_mla":
            return "fp8_ds_mla is the CUDA 656-byte MLA row format (vLLM runtime.py); it is not offered on ROCm"
        if requested not in _FP8_MAX:
            return ""
        facts = arch_facts(self.arch)
        if facts is None:
            return f"{self.arch.base} is not in the ROCm architecture table, so no fp8 flavour is assumed; use 'bf16'"
        if facts.fp8_format is None:
            return f"{self.arch.base} ({facts.product}) has no fp8 KV format here; use 'bf16'"
        theirs = KV_FORMAT_SPECS[facts.fp8_format].description
        return (
            f"{self.arch.base} ({facts.product}) stores fp8 KV as {facts.fp8_format!r} ({theirs}); "
            f"{requested!r} (max {_FP8_MAX[str(requested)]}) would be misread (vLLM #45563)"
        )

    # ----------------------------------------------------------------- IPC events
    def create_ipc_event(self) -> GpuIpcEvent:
        """An interprocess event; on ROCm 7.2.x one that refuses its 33rd record or wait (see
        :class:`~hisparse_hal.vendors.rocm.ipc_cycles.CycleLimitedIpcEvent`)."""
        return self._limit_cycles(super().create_ipc_event())

    def import_event(self, device: torch.device | int | str, handle: bytes) -> GpuIpcEvent:
        """Open another process's event; limited like :meth:`create_ipc_event` where the runtime needs it."""
        return self._limit_cycles(super().import_event(device, handle))

    def _limit_cycles(self, event: GpuIpcEvent) -> GpuIpcEvent:
        limit = self.capabilities.ipc_event_max_cycles
        if limit is None:
            return event
        return CycleLimitedIpcEvent(event, limit, str(self.capabilities.versions.get("hip_runtime")))
