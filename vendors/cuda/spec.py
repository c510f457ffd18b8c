"""Registry entry of the CUDA backend. The probe touches no device: ``torch.version``, then NVML.

Each way of being unavailable has its own sentence: a CPU or ROCm build of torch, NVML bindings
missing, NVML failing, no visible device, a driver too old for the backend or for torch's CUDA.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch
from packaging.version import InvalidVersion, Version

from hisparse_hal.registry import BackendSpec, Probe

from .capabilities import BATCH_CAP_ENV, MIN_DRIVER, batch_cap_from_env, format_driver_version
from .nvml import VISIBLE_ENV, read_nvml

__all__ = ["probe", "torch_build", "check_environment", "SPEC"]


def _torch_cuda_version() -> int | None:
    """``torch.version.cuda`` ("12.8") in the driver encoding (12080), or None when unparsable."""
    try:
        version = Version(str(torch.version.cuda))
    except InvalidVersion:
        return None
    return version.major * 1000 + version.minor * 10


def probe() -> Probe:
    """Whether a CUDA build of torch, NVML and a visible NVIDIA GPU with a recent driver are present.

    Returns:
        A :class:`Probe` whose facts hold the torch and driver versions, device names and archs.
    """
    facts: dict[str, Any] = {"torch": torch.__version__, "torch.version.cuda": torch.version.cuda}
    if getattr(torch.version, "hip", None):
        return Probe(False, f"torch {torch.__version__} is a ROCm build (HIP {torch.version.hip}), not CUDA", facts)
    if torch.version.cuda is None:
        return Probe(False, f"torch {torch.__version__} is a CPU build (torch.version.cuda is None)", facts)
    try:
        import pynvml
    except ImportError as exc:
        return Probe(
            False,
            f"the NVML bindings are not installed ({exc}); install them with "
            "pip install nvidia-ml-py (the [cuda] extra: pip install -e '.[cuda]' in a hisparse-hal checkout)",
            facts,
        )
    visible = os.environ.get(VISIBLE_ENV)
    facts[VISIBLE_ENV] = visible
    try:
        reading = read_nvml(pynvml, visible)
    except pynvml.NVMLError as exc:
        return Probe(
            False, f"NVML could not read the GPUs ({type(exc).__name__}: {exc}); is the NVIDIA driver loaded?", facts
        )
    facts.update(
        driver_version=reading.cuda_driver_version,
        driver=format_driver_version(reading.cuda_driver_version),
        nvidia_driver=reading.nvidia_driver,
        devices=[d.as_fact() for d in reading.devices],
        archs=sorted({d.arch for d in reading.devices}),
        physical_devices=reading.physical_count,
    )
    if not reading.devices:
        if reading.physical_count and visible is not None:
            why = f"{VISIBLE_ENV}={visible!r} hides all {reading.physical_count} NVIDIA GPUs"
        else:
            why = "NVML reports no NVIDIA GPU"
        return Probe(False, f"no CUDA device is visible: {why}", facts)
    driver = format_driver_version(reading.cuda_driver_version)
    if reading.cuda_driver_version < MIN_DRIVER:
        return Probe(
            False,
            f"the NVIDIA driver supports CUDA {driver} (driver {reading.nvidia_driver}), older than the "
            f"CUDA {format_driver_version(MIN_DRIVER)} this backend needs; update the driver",
            facts,
        )
    needed = _torch_cuda_version()
    if needed is not None and reading.cuda_driver_version // 1000 < needed // 1000:
        # Minor-version compatibility covers 12.x on any 12 driver; a major version does not.
        return Probe(
            False,
            f"torch {torch.__version__} is built for CUDA {torch.version.cuda} but the driver only supports "
            f"CUDA {driver} (driver {reading.nvidia_driver}); update the driver or install a torch built "
            f"for CUDA {reading.cuda_driver_version // 1000}",
            facts,
        )
    names = ", ".join(f"{d.name} ({d.arch})" for d in reading.devices)
    return Probe(
        True,
        f"{len(reading.devices)} NVIDIA GPU(s) visible: {names}; driver CUDA {driver}, torch CUDA {torch.version.cuda}",
        facts,
    )


def torch_build() -> str | None:
    """``"cuda <version>"`` when torch is a CUDA build (``torch.version.cuda`` set, ``torch.version.hip`` not),
    else None."""
    if getattr(torch.version, "hip", None) or not getattr(torch.version, "cuda", None):
        return None
    return f"cuda {torch.version.cuda}"


def check_environment(environ: Mapping[str, str]) -> None:
    """Check ``HISPARSE_HAL_CUDA_MAX_BATCH`` (raises ``InvalidArgumentError`` quoting a bad value)."""
    batch_cap_from_env(environ)


SPEC = BackendSpec(
    name="cuda",
    priority=100,
    probe=probe,
    backend_class="hisparse_hal.vendors.cuda.backend:CudaBackend",
    device_type="cuda",
    torch_build=torch_build,
    compiles_triton=True,  # Triton's NVIDIA backend (third_party/nvidia) compiles for torch's "cuda" tensors
    environment=((BATCH_CAP_ENV, "descriptors per CUDA batch call"),),
    check_environment=check_environment,
)
