"""Registry entry of the CPU reference device. Always available; chosen automatically only when
torch has no GPU build."""

from __future__ import annotations

import torch

from hisparse_hal.registry import BackendSpec, Probe


def probe() -> Probe:
    """Always available; reports whether this process may page-lock memory (RLIMIT_MEMLOCK, and a
    one-page ``mlock`` trial)."""
    from .runtime import memlock_limit, probe_page_lock

    limit = memlock_limit()
    locks, detail = probe_page_lock()
    return Probe(
        True,
        "the CPU reference device runs the whole contract on host memory (no GPU needed)",
        {"torch": torch.__version__, "memlock_limit": limit, "page_lock": locks, "page_lock_detail": detail},
    )


def sweep_shared_files() -> list[str]:
    """Remove the IPC event files (``/dev/shm``) of exited exporters; returns their paths."""
    from .ipc_event import sweep_stale_event_files

    return sweep_stale_event_files()


SPEC = BackendSpec(
    name="cpu",
    priority=0,
    probe=probe,
    backend_class="hisparse_hal.vendors.cpu.backend:CpuBackend",
    fallback_only=True,
    device_type="cpu",
    sweep_shared_files=sweep_shared_files,
)
