"""Registry entry of the CUDA backend. The probe touches no device: torch.version, then NVML."""

from __future__ import annotations

import torch

from hisparse_hal.registry import BackendSpec, Probe


def probe() -> Probe:
    """Whether a CUDA build of torch and a visible NVIDIA GPU are present."""
    facts = {"torch": torch.__version__, "torch.version.cuda": torch.version.cuda}
    if getattr(torch.version, "hip", None):
        return Probe(False, f"torch {torch.__version__} is a ROCm build (HIP {torch.version.hip}), not CUDA", facts)
    if torch.version.cuda is None:
        return Probe(False, f"torch {torch.__version__} is a CPU build (torch.version.cuda is None)", facts)
    return Probe(False, "CUDA probe not implemented yet", facts)


SPEC = BackendSpec(
    name="cuda",
    priority=100,
    probe=probe,
    backend_class="hisparse_hal.vendors.cuda.backend:CudaBackend",
)
