"""Registry entry of the ROCm backend. The probe touches no device: torch.version, then amdsmi."""

from __future__ import annotations

import torch

from hisparse_hal.registry import BackendSpec, Probe


def probe() -> Probe:
    """Whether a ROCm build of torch and a visible AMD GPU are present."""
    facts = {"torch": torch.__version__, "torch.version.hip": getattr(torch.version, "hip", None)}
    if not getattr(torch.version, "hip", None):
        build = f"a CUDA build (CUDA {torch.version.cuda})" if torch.version.cuda else "a CPU build"
        return Probe(False, f"torch {torch.__version__} is {build}, not a ROCm build (torch.version.hip is None)", facts)
    return Probe(False, "ROCm probe not implemented yet", facts)


SPEC = BackendSpec(
    name="rocm",
    priority=100,
    probe=probe,
    backend_class="hisparse_hal.vendors.rocm.backend:RocmBackend",
)
