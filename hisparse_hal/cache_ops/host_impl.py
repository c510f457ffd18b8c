"""The four cache ops for tensors in host memory (the CPU device): gathers that copy only the planned rows.

Invariant: outputs, state and untouched entries are bit-equal to ``oracle.py``. Unlike ``torch_impl`` it reads
values on the host (boolean masks, ``nonzero``): on the CPU device that costs nothing and nothing is captured as
a device graph (the CPU backend's captures re-run the op), so the gathers move ``misses`` rows, not ``R x K``.
"""

from __future__ import annotations

import torch

from . import arguments, torch_impl
from .torch_impl import word_rows

__all__ = ["gather_compact", "gather_plan", "invalidate_written_slots", "resolve_residency", "word_rows"]

_I64 = torch.int64
#: Rows per index_select / index_copy_ round: 8,192 rows of 656 B (5.4 MiB). At 64 requests 512 rows
#: per round took 2.9 ms, 8,192 1.8 ms, one round for all 13k rows 3.4 ms (quiet 2-core machine).
_CHUNK_ROWS = 8192

# Planning and invalidation have no row copies to save: they are torch_impl's vectorized code (no per-value
# Python), which already costs a small fraction of the oracle (docs/benchmarks.md).
resolve_residency = torch_impl.resolve_residency
invalidate_written_slots = torch_impl.invalidate_written_slots


def _copy_planned_rows(host_cache: torch.Tensor, hot_cache: torch.Tensor, source: torch.Tensor,
                       destination: torch.Tensor) -> None:
    """Hot row ``destination[i]`` := host row ``source[i]`` (zeros past the host cache), in list order.

    ``destination`` holds in-range hot rows and ``source`` non-negative host rows (int64, 1-D). A row named
    twice ends with its later entry, as the oracle's loop does: only each destination's last entry copies.
    """
    if destination.numel() == 0:
        return
    # Destination order: each row's last entry survives, and the writes (then, through the plan's layout, the
    # reads too) walk memory forwards (measured: 1.7-2.2 ms vs 2.5-2.8 ms in plan order at 64 requests).
    ordered, order = torch.sort(destination, stable=True)
    last = torch.ones_like(ordered, dtype=torch.bool)
    last[:-1] = ordered[1:] != ordered[:-1]
    keep = order[last]
    source, destination = source[keep], ordered[last]
    host = word_rows(host_cache)
    hot = word_rows(hot_cache)
    if hot.dim() == 2:
        hot = hot.unsqueeze(1)
    blocks, block_size, words = hot.shape
    flat = hot.view(blocks * block_size, words) if hot.stride(0) == block_size * words else None
    host_rows = host.shape[0]
    for start in range(0, destination.numel(), _CHUNK_ROWS):
        src = source[start:start + _CHUNK_ROWS]
        dst = destination[start:start + _CHUNK_ROWS]
        past = src >= host_rows
        if host_rows == 0:
            rows = hot.new_zeros(src.numel(), words)
        else:
            rows = host.index_select(0, src.clamp(max=host_rows - 1))
            if bool(past.any()):
                rows[past] = 0
        if flat is not None:
            flat.index_copy_(0, dst, rows)
        else:  # blocks strided apart (a slab view): address each row by (block, offset)
            hot.index_put_((dst // block_size, dst % block_size), rows)


def gather_compact(
    host_cache: torch.Tensor,
    hot_cache: torch.Tensor,
    miss_global_indices: torch.Tensor,
    miss_hot_indices: torch.Tensor,
    miss_counts: torch.Tensor,
) -> None:
    """Copy the first ``clamp(miss_counts[r], 0, K)`` planned rows of every row ``r`` from host to hot.

    A host row past the end zero-fills its destination; a negative host row or a destination outside the hot
    cache is skipped; a destination named twice ends with the later entry. Arguments as vLLM 0.33.0's
    ``hisparse_gather_compact``.

    Raises:
        InvalidArgumentError: a dtype, shape, device or stride check failed (nothing is copied).
    """
    arguments.check_gather_compact(host_cache, hot_cache, miss_global_indices, miss_hot_indices, miss_counts)
    num_rows, top_k = miss_global_indices.shape
    if num_rows == 0 or top_k == 0:
        return
    hot_rows = hot_cache.shape[0] * hot_cache.shape[1]
    count = miss_counts.reshape(-1)[:num_rows].to(_I64).clamp(0, top_k)
    planned = torch.arange(top_k, dtype=_I64)[None, :] < count[:, None]
    source = miss_global_indices[planned].to(_I64)
    destination = miss_hot_indices[planned].to(_I64)
    copies = (source >= 0) & (destination >= 0) & (destination < hot_rows)
    _copy_planned_rows(host_cache, hot_cache, source[copies], destination[copies])


def gather_plan(
    host_cache: torch.Tensor,
    hot_cache: torch.Tensor,
    global_indices: torch.Tensor,
    hot_indices: torch.Tensor,
    miss_mask: torch.Tensor,
    request_state_indices: torch.Tensor | None = None,
    attention_indices: torch.Tensor | None = None,
    attention_block_stride: int = 0,
) -> None:
    """Copy host row ``global_indices[r, c]`` to hot row ``hot_indices[r, c]`` wherever ``miss_mask`` is set.

    ``request_state_indices[r] < 0`` marks padding row ``r`` (nothing copied, attention -1). A 2-D hot cache is
    a staging buffer with block size 1. Arguments as vLLM 0.33.0's ``hisparse_gather_plan``.

    Raises:
        InvalidArgumentError: a dtype, shape, device or stride check failed (nothing is copied).
    """
    planned = torch_impl.plan_gather_plan(
        host_cache, hot_cache, global_indices, hot_indices, miss_mask, request_state_indices,
        attention_indices, attention_block_stride,
    )
    if planned is None:
        return
    source, destination, copies = planned
    _copy_planned_rows(host_cache, hot_cache, source[copies], destination[copies])
