"""Registry entry of the CPU reference device. Always available; chosen automatically only when
torch has no GPU build."""

from __future__ import annotations

import resource

import torch

from hisparse_hal.registry import BackendSpec, Probe


def probe() -> Probe:
    """Always available; reports whether this process may page-lock memory (RLIMIT_MEMLOCK, and a
    one-page ``mlock`` trial)."""
    from .page_lock import probe_page_lock

    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    limit = "unlimited" if soft == resource.RLIM_INFINITY else f"{soft} bytes"
    locks, detail = probe_page_lock()
    return Probe(
        True,
        "the CPU reference device runs the whole contract on host memory (no GPU needed)",
        {"torch": torch.__version__, "memlock_limit": limit, "page_lock": locks, "page_lock_detail": detail},
    )


SPEC = BackendSpec(
    name="cpu",
    priority=0,
    probe=probe,
    backend_class="hisparse_hal.vendors.cpu.backend:CpuBackend",
    fallback_only=True,
)
