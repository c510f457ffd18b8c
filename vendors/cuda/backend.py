"""``CudaBackend``: the HiSparse contract on NVIDIA GPUs, the shared GPU layer plus what CUDA decides.

Only what differs from ROCm lives here: the CUDA driver binding, the capability plan from the probed
driver version, architecture and host-pointer attribute, and picking the device. Constructing it
initialises the driver (``cuInit``) but creates no device context; the first pin or swap does (through
the primary context torch also uses).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from hisparse_hal.errors import BackendUnavailableError
from hisparse_hal.vendors.gpu.backend import TorchGpuBackend
from hisparse_hal.vendors.gpu.device_module import GpuDeviceModule, TorchDeviceModule
from hisparse_hal.vendors.gpu.runtime import CopyRuntime

from .capabilities import plan_capabilities
from .runtime import CudaDriver

if TYPE_CHECKING:
    from hisparse_hal.registry import ProbeResult

__all__ = ["CudaBackend"]

_Backend = TypeVar("_Backend", bound="CudaBackend")


class CudaBackend(TorchGpuBackend):
    """NVIDIA GPUs through torch's CUDA build and the CUDA driver (``libcuda.so.1``).

    Build it with :meth:`for_device` (or ``get_backend("cuda")``, which calls :meth:`from_probe`).
    """

    name = "cuda"

    @classmethod
    def for_device(
        cls: type[_Backend],
        device_index: int,
        driver_version: int,
        arch: str,
        *,
        runtime: CopyRuntime | None = None,
        device: torch.device | None = None,
        max_batch_descriptors: int | None = None,
        device_module: GpuDeviceModule | None = None,
    ) -> _Backend:
        """A backend for CUDA device ``device_index`` with capabilities planned for its driver and arch.

        Args:
            device_index: torch's CUDA device index.
            driver_version: ``cuDriverGetVersion`` encoding (12080 = 12.8).
            arch: ``"sm_90"``.
            runtime: the copy runtime; default a :class:`CudaDriver` over ``libcuda.so.1``. Tests pass
                one over the simulated driver. A :class:`CudaDriver` is asked whether kernels may use
                registered host pointers (``capabilities.host_pointer_alias`` is the opposite); any other
                runtime is taken to return no aliases.
            device: override of the KV-cache device (tests only; default ``cuda:<device_index>``).
            max_batch_descriptors: descriptor cap; default from ``HISPARSE_HAL_CUDA_MAX_BATCH`` or 8192.
            device_module: torch's API for the device (tests: a simulated one); default from ``device``.

        Raises:
            InvalidArgumentError: a bad driver version, architecture or cap.
            BackendUnavailableError: libcuda could not be loaded.
            DeviceRuntimeError: the driver failed to initialise or to report the device attribute.
        """
        runtime = runtime if runtime is not None else CudaDriver(device_index)
        # Registered host memory is addressable by its host pointer only where the device attribute
        # CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM is set (CUDA driver API, cuDeviceGetAttribute and
        # cuMemHostRegister); elsewhere the driver's register_host returns the device alias.
        alias = isinstance(runtime, CudaDriver) and not runtime.host_pointer_usable_on_device()
        capabilities = plan_capabilities(
            driver_version, arch, max_batch_descriptors=max_batch_descriptors, host_pointer_alias=alias
        )
        return cls(capabilities, runtime, device_index, device=device, device_module=device_module)

    @classmethod
    def from_probe(cls, probe: ProbeResult) -> CudaBackend:
        """The backend for torch's current CUDA device, planned from the probed driver version and the
        device's architecture as torch reports it (NVML numbers devices in PCI order, CUDA may not).

        Raises:
            BackendUnavailableError: the probe's facts lack the driver version, or torch cannot use CUDA.
        """
        facts: Mapping[str, Any] = probe.facts
        driver_version = facts.get("driver_version")
        if not isinstance(driver_version, int):
            raise BackendUnavailableError(
                f"the CUDA probe facts give no driver version (driver_version={driver_version!r}); "
                "run 'hisparse-hal info'"
            )
        try:
            gpu = TorchDeviceModule.current(cls.device_type)
            major, minor = gpu.module.get_device_capability(gpu.index)
        except (RuntimeError, AssertionError) as exc:
            raise BackendUnavailableError(f"torch cannot use CUDA although the probe passed: {exc}") from exc
        return cls.for_device(gpu.index, driver_version, f"sm_{major}{minor}")
