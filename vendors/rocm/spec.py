"""Registry entry of the ROCm backend and its probe, which never initializes HIP.

The probe reads, in order: torch's build (``torch.version.hip``), the HIP runtime library on disk (not
loaded), the GPUs through amdsmi or else the KFD sysfs topology, and the visibility variables. Every
way of being unavailable has its own reason; the facts name versions, devices and architectures.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from hisparse_hal.registry import BackendSpec, Probe

from .amdsmi_inventory import import_amdsmi, read_amdsmi_inventory
from .capabilities import ARCHITECTURES
from .kfd_topology import read_kfd_topology
from .visible_devices import VISIBILITY_VARIABLES, resolve_visible_devices

__all__ = ["ProbeInputs", "probe_rocm", "probe", "torch_build", "SPEC"]


def _find_library() -> tuple[Path | None, list[str]]:
    from .runtime import (
        find_hip_library,  # ctypes declarations only; nothing is loaded
    )

    return find_hip_library()


@dataclasses.dataclass(frozen=True)
class ProbeInputs:
    """Everything the probe reads, injectable for tests.

    Attributes:
        torch_version: ``torch.__version__``.
        torch_hip: ``torch.version.hip`` (None on CUDA and CPU builds).
        torch_cuda: ``torch.version.cuda``.
        environ: the environment (visibility variables).
        sysfs_root: where sysfs is mounted (the KFD topology fallback).
        amdsmi_importer: returns the ``amdsmi`` module or raises ``ImportError``.
        library_finder: returns ``(path or None, paths tried)`` for ``libamdhip64``.
    """

    torch_version: str
    torch_hip: str | None
    torch_cuda: str | None
    environ: Mapping[str, str]
    sysfs_root: Path = Path("/sys")
    amdsmi_importer: Callable[[], Any] = import_amdsmi
    library_finder: Callable[[], tuple[Path | None, list[str]]] = _find_library

    @classmethod
    def from_process(cls) -> ProbeInputs:
        """The inputs of this process."""
        return cls(torch.__version__, getattr(torch.version, "hip", None), torch.version.cuda, os.environ)


def probe_rocm(inputs: ProbeInputs) -> Probe:
    """Whether a ROCm build of torch, the HIP runtime and a visible AMD GPU are present.

    Args:
        inputs: what to read (see :class:`ProbeInputs`).

    Returns:
        A :class:`Probe` whose reason names the first thing missing, or what was found.
    """
    facts: dict[str, Any] = {"torch": inputs.torch_version, "torch.version.hip": inputs.torch_hip}
    if not inputs.torch_hip:
        build = f"a CUDA build (CUDA {inputs.torch_cuda})" if inputs.torch_cuda else "a CPU build"
        return Probe(
            False, f"torch {inputs.torch_version} is {build}, not a ROCm build (torch.version.hip is None)", facts
        )

    library, tried = inputs.library_finder()
    if library is None:
        facts["hip_library_tried"] = tried
        return Probe(
            False,
            f"torch {inputs.torch_version} is a ROCm build (HIP {inputs.torch_hip}) but libamdhip64 was not "
            f"found; tried {len(tried)} paths (see facts hip_library_tried); set ROCM_PATH",
            facts,
        )
    facts["hip_library"] = str(library)

    smi = read_amdsmi_inventory(inputs.amdsmi_importer)
    facts.update(smi.facts)
    if smi.devices:
        physical, source = smi.devices, "amdsmi"
    else:
        facts["amdsmi_error"] = smi.error
        kfd = read_kfd_topology(inputs.sysfs_root)
        if kfd.skipped:
            facts["kfd_skipped_nodes"] = list(kfd.skipped)
        if not kfd.devices:
            why_kfd = kfd.error or "the KFD topology lists no GPU node (simd_count > 0)"
            return Probe(False, f"no AMD GPU found: {smi.error}; {why_kfd}", facts)
        physical, source = kfd.devices, "kfd-sysfs"
    facts["device_source"] = source
    facts["physical_gpus"] = [d.as_fact() for d in physical]

    visibility = resolve_visible_devices(physical, inputs.environ)
    facts["visibility_env"] = {k: inputs.environ[k] for k in VISIBILITY_VARIABLES if k in inputs.environ}
    facts["visibility"] = list(visibility.applied)
    if visibility.problems:
        facts["visibility_problems"] = list(visibility.problems)
    facts["visible_gpus"] = [
        {"hip_index": i, **d.as_fact()} for i, d in enumerate(visibility.devices)
    ]
    if not visibility.devices:
        why = "; ".join(visibility.applied + visibility.problems)
        return Probe(False, f"{len(physical)} AMD GPU(s) found ({source}) but none is visible to HIP: {why}", facts)

    archs = sorted({d.arch or "unknown" for d in visibility.devices})
    facts["archs"] = archs
    unknown = [a for a in archs if a not in ARCHITECTURES]
    if unknown:
        facts["archs_planned_conservatively"] = unknown
    names = ", ".join(f"{d.arch or 'unknown arch'} ({d.name})" for d in visibility.devices[:4])
    more = f" and {len(visibility.devices) - 4} more" if len(visibility.devices) > 4 else ""
    warning = f"; {visibility.problems[0]}" if visibility.problems else ""
    return Probe(
        True,
        f"ROCm build of torch (HIP {inputs.torch_hip}) with {len(visibility.devices)} visible AMD GPU(s) "
        f"from {source}: {names}{more}{warning}",
        facts,
    )


def probe() -> Probe:
    """The registry's probe: :func:`probe_rocm` on this process. Creates no HIP context."""
    return probe_rocm(ProbeInputs.from_process())


def torch_build() -> str | None:
    """``"hip <version>"`` when torch is a ROCm build (``torch.version.hip`` set), else None."""
    hip = getattr(torch.version, "hip", None)
    return f"hip {hip}" if hip else None


SPEC = BackendSpec(
    name="rocm",
    priority=100,
    probe=probe,
    backend_class="hisparse_hal.vendors.rocm.backend:RocmBackend",
    # torch's ROCm build keeps the "cuda" device type and torch.cuda API (torch docs, notes/hip.rst "HIP (ROCm)
    # semantics"), and Triton's AMD backend (third_party/amd) compiles for those tensors.
    device_type="cuda",
    torch_build=torch_build,
    compiles_triton=True,
)
