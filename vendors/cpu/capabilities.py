"""What the CPU reference device can do, decided in one pure function from what the probe found.

Everything is on (native vectorized copies, IPC events without a cycle limit, a shared host pool, capture,
every KV format); the only fact that varies is whether this process may page-lock memory.
"""

from __future__ import annotations

import torch

from hisparse_hal.capabilities import KV_FORMATS, Capabilities

__all__ = ["plan_capabilities"]


def plan_capabilities(page_lock: bool, page_lock_detail: str, memlock_limit: str) -> Capabilities:
    """The CPU device's capabilities (before the cache-ops choice, which the backend adds).

    Args:
        page_lock: whether a one-page ``mlock`` trial succeeded in this process.
        page_lock_detail: the trial's explanation, recorded in ``versions``.
        memlock_limit: the soft ``RLIMIT_MEMLOCK`` as text (``"unlimited"``, ``"65536 bytes"``).

    Returns:
        The :class:`Capabilities`; ``versions`` records torch's version and the page-locking facts,
        ``reasons`` says how swaps and pinning work here.
    """
    return Capabilities(
        batch_copy="native",
        max_batch_descriptors=None,
        ipc_events=True,
        ipc_event_max_cycles=None,
        shared_host_pool=True,
        graph_capture=True,
        host_pointer_alias=False,
        kv_formats=KV_FORMATS,
        stats_dtype=torch.uint64,
        versions={
            "torch": torch.__version__,
            "page_lock": "mlock" if page_lock else "unavailable",
            "page_lock_detail": page_lock_detail,
            "memlock_limit": memlock_limit,
        },
        reasons={
            "batch_copy": "swaps are vectorized with torch index_select/index_copy_ per (region pair, size) "
            "group; hazardous, tiny or huge copies use ctypes.memmove per descriptor",
            "versions": "pinning page-locks with mlock where RLIMIT_MEMLOCK allows, else registers unlocked "
            "(versions['page_lock'] says which)",
        },
    )
