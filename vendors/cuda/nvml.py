"""Reading the visible NVIDIA GPUs through NVML (``pynvml``), the way CUDA itself would number them.

Invariant: creates no CUDA context and loads no CUDA library; NVML is initialised and shut down around
each read. ``CUDA_VISIBLE_DEVICES`` is honoured as CUDA parses it: indices or ``GPU-`` UUIDs (unique
prefixes allowed), parsing stops at the first invalid entry, and empty or ``-1`` hides all. ``MIG-``
instances are not resolved (they read as an invalid entry). Indices are NVML's (PCI bus order), which
is CUDA's numbering with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` or on machines with one GPU model; CUDA's
default fastest-first order may differ on mixed machines, so the backend reads its own device's
architecture from torch.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["NvmlDevice", "NvmlReading", "read_nvml", "visible_indices"]

VISIBLE_ENV = "CUDA_VISIBLE_DEVICES"


@dataclasses.dataclass(frozen=True)
class NvmlDevice:
    """One visible GPU: its CUDA ordinal, NVML index, name, ``sm_XY`` arch and UUID."""

    index: int
    nvml_index: int
    name: str
    arch: str
    uuid: str

    def as_fact(self) -> dict[str, Any]:
        """JSON-ready form for probe facts."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class NvmlReading:
    """What NVML reported: CUDA driver version (``12080``), NVIDIA driver string, visible devices."""

    cuda_driver_version: int
    nvidia_driver: str
    devices: tuple[NvmlDevice, ...]
    physical_count: int


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def visible_indices(visible: str | None, uuids: list[str]) -> list[int]:
    """NVML indices CUDA would expose, in CUDA order, for a ``CUDA_VISIBLE_DEVICES`` value.

    Args:
        visible: the variable's value, or None when unset (all devices).
        uuids: the UUID of every physical device, by NVML index (``"GPU-..."``).
    """
    if visible is None:
        return list(range(len(uuids)))
    chosen: list[int] = []
    for token in visible.split(","):
        token = token.strip()
        if token.lstrip("-").isdigit():
            index = int(token)
            if index < 0 or index >= len(uuids) or index in chosen:
                break  # CUDA stops at the first invalid entry ("-1" hides everything after it)
            chosen.append(index)
            continue
        matches = [i for i, uuid in enumerate(uuids) if token and uuid.startswith(token)]
        if len(matches) != 1 or matches[0] in chosen:
            break
        chosen.append(matches[0])
    return chosen


def read_nvml(pynvml: Any, visible: str | None) -> NvmlReading:
    """Read driver version and the visible devices with NVML, then shut NVML down.

    Args:
        pynvml: the ``pynvml`` module (injected so tests can pass a fake).
        visible: the ``CUDA_VISIBLE_DEVICES`` value, or None.

    Raises:
        Whatever ``pynvml`` raises (``NVMLError`` subclasses); the caller turns it into a reason.
    """
    pynvml.nvmlInit()
    try:
        version = int(pynvml.nvmlSystemGetCudaDriverVersion())
        nvidia_driver = _text(pynvml.nvmlSystemGetDriverVersion())
        count = int(pynvml.nvmlDeviceGetCount())
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        uuids = [_text(pynvml.nvmlDeviceGetUUID(h)) for h in handles]
        devices = []
        for ordinal, nvml_index in enumerate(visible_indices(visible, uuids)):
            handle = handles[nvml_index]
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
            devices.append(
                NvmlDevice(ordinal, nvml_index, _text(pynvml.nvmlDeviceGetName(handle)),
                           f"sm_{int(major)}{int(minor)}", uuids[nvml_index])
            )
        return NvmlReading(version, nvidia_driver, tuple(devices), count)
    finally:
        pynvml.nvmlShutdown()
