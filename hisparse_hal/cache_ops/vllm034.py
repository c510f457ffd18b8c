"""vLLM 0.34.0's four cache ops, written once: each op's parameters (vLLM's names, order, defaults) and what it writes.

The facts are ``csrc/torch_bindings.cpp:1070-1114`` of the 0.34.0 sdist (registered as
``torch.ops._C_cache_ops.hisparse_<name>``). :mod:`.signatures` derives the schema strings, ``inspect`` signatures
and argument counts from this module; a later vLLM gets a module of its own beside it (docs/design/cache-ops.md §7).
"""

from __future__ import annotations

import torch

__all__ = ["OPS", "SOURCE", "VERSION", "WRITES", "gather_compact", "gather_plan", "invalidate_written_slots",
           "resolve_residency"]

#: The vLLM release these signatures belong to.
VERSION = "0.34.0"
#: Where vLLM defines them.
SOURCE = "csrc/torch_bindings.cpp:1070-1114"

Tensor = torch.Tensor


def resolve_residency(
    host_cache: Tensor,
    hot_cache: Tensor,
    hot_block_table: Tensor,
    global_indices: Tensor,
    hot_indices: Tensor,
    device_global_indices: Tensor,
    lru_slots: Tensor,
    request_state_indices: Tensor | None,
    region_stride: int,
    max_union_rows: int,
    stats: Tensor | None = None,
    attention_indices: Tensor | None = None,
    attention_block_stride: int = 0,
    request_ids: Tensor | None = None,
    source_block_table: Tensor | None = None,
    source_block_size: int = 0,
    valid_counts: Tensor | None = None,
    swap_host_physical_rows: Tensor | None = None,
    swap_device_physical_rows: Tensor | None = None,
    swap_counts: Tensor | None = None,
    resident_block_table: Tensor | None = None,
    resident_block_size: int = 0,
    num_valid_rows: Tensor | None = None,
) -> None:
    """Plan one decode or verification step (vLLM 0.34.0 ``hisparse_resolve_residency``, 23 arguments).

    Translates top-k token positions to host rows, finds hot-buffer hits per contiguous request run, gives
    misses the oldest evictable slots, writes indices, swap plan, counts and stats, and rewrites the
    DGI and LRU state (docs/design/cache-ops.md). Moves no KV bytes.

    Raises:
        InvalidArgumentError: a dtype, shape, device, stride or scalar vLLM's op rejects (nothing written).
        UnionOverflowError: a run selects more than ``max_union_rows`` host rows (nothing written; on a
            GPU a device-side assertion instead, see the design doc).
    """


def gather_compact(
    host_cache: Tensor,
    hot_cache: Tensor,
    miss_global_indices: Tensor,
    miss_hot_indices: Tensor,
    miss_counts: Tensor,
) -> None:
    """Copy each row's first ``clamp(miss_counts[r], 0, K)`` planned host rows to hot rows (vLLM 0.34.0
    ``hisparse_gather_compact``). Host rows past the end zero-fill; negative sources or destinations
    outside the hot cache are skipped; a destination named twice ends with the later entry.

    Raises:
        InvalidArgumentError: a dtype, shape, device or stride check failed (nothing copied).
    """


def gather_plan(
    host_cache: Tensor,
    hot_cache: Tensor,
    global_indices: Tensor,
    hot_indices: Tensor,
    miss_mask: Tensor,
) -> None:
    """Copy host row ``global_indices[r, c]`` to hot row ``hot_indices[r, c]`` where ``miss_mask`` is
    nonzero (vLLM 0.34.0 ``hisparse_gather_plan``), with ``compact``'s skip and zero-fill rules.

    Raises:
        InvalidArgumentError: a dtype, shape, device or stride check failed (nothing copied).
    """


def invalidate_written_slots(
    device_global_indices_ptrs: Tensor,
    request_state_indices: Tensor,
    req_id_per_token: Tensor,
    written_slots: Tensor,
    num_state_rows: int,
    region_stride: int,
) -> None:
    """In every table named by address, set to -1 each entry of a written token's state row that holds
    the token's rewritten host row (vLLM 0.34.0 ``hisparse_invalidate_written_slots``).

    Raises:
        InvalidArgumentError: a dtype, shape or device check failed (nothing written).
        UnknownTableError: an address names no registered table of shape ``[num_state_rows,
            region_stride]`` (nothing written; on a GPU a device-side assertion instead).
    """


#: The four ops in our order (vLLM defines resolve, invalidate, plan, compact).
OPS = (resolve_residency, gather_compact, gather_plan, invalidate_written_slots)

#: The arguments each op's schema marks written (``Tensor!``, or ``Tensor(x!)?`` when optional). Invalidation
#: writes the tables it names through raw pointers, invisibly to torch's alias analysis, as vLLM's op does: none.
WRITES: dict[str, tuple[str, ...]] = {
    "resolve_residency": ("hot_cache", "hot_indices", "device_global_indices", "lru_slots", "stats",
                          "attention_indices", "valid_counts", "swap_host_physical_rows",
                          "swap_device_physical_rows", "swap_counts"),
    "gather_compact": ("hot_cache",),
    "gather_plan": ("hot_cache",),
    "invalidate_written_slots": (),
}
