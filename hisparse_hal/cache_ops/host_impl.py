"""The four vLLM 0.34.0 cache ops for tensors in host memory (the CPU device): gathers copy only planned rows.

Invariant: outputs, state and untouched entries are bit-equal to ``oracle.py``. Unlike ``torch_impl`` it reads
values on the host (boolean masks, ``nonzero``): on the CPU device that costs nothing and nothing is captured as
a device graph (the CPU backend's captures re-run the op), so the gathers move ``misses`` rows, not ``R x K``.
"""

from __future__ import annotations

import torch

from . import torch_impl
from .arguments import GatherInputs, ResolveInputs
from .signatures import vllm_ops
from .torch_impl import slab_row_ids, slab_rows, word_rows

__all__ = ["gather", "gather_compact", "gather_plan", "invalidate_written_slots", "resolve", "resolve_residency",
           "word_rows"]

_I64 = torch.int64
#: Rows per index_select / index_copy_ round: 8,192 rows of 656 B (5.4 MiB). At 64 requests 512 rows
#: per round took 2.9 ms, 8,192 1.8 ms, one round for all 13k rows 3.4 ms (quiet 2-core machine).
_CHUNK_ROWS = 8192

# Planning and invalidation have no row copies to save: they are torch_impl's vectorized code (no per-value
# Python), which already costs a small fraction of the oracle (docs/benchmarks.md).
# On the CPU device torch_impl reads the union bound and the table addresses to raise typed errors.


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
    blocks, block_size, words = hot.shape
    slab = slab_rows(hot)
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
        if slab is not None:
            slab[0].index_copy_(0, slab_row_ids(dst, block_size, slab[1]), rows)
        else:  # blocks strided apart (a slab view): address each row by (block, offset)
            hot.index_put_((dst // block_size, dst % block_size), rows)


def gather(inputs: GatherInputs) -> None:
    """``hisparse_gather_plan`` / ``hisparse_gather_compact`` on checked inputs, copying only the entries
    :func:`torch_impl.plan_gather` selects (boolean indexing: free on host memory)."""
    if inputs.empty:
        return
    source, destination, write = torch_impl.plan_gather(inputs)
    _copy_planned_rows(inputs.host_cache, inputs.hot_cache, source[write], destination[write])


def resolve(inputs: ResolveInputs) -> None:
    """``hisparse_resolve_residency``: ``torch_impl``'s phases, classifying slots only for the runs that need it
    (values are free to read here), so the ``[rows, H]`` work shrinks to ``[runs, H]``."""
    torch_impl.resolve(inputs, compact_leaders=True)


_OPS = vllm_ops(resolve, gather, torch_impl.invalidate)
resolve_residency = _OPS.resolve_residency
gather_compact = _OPS.gather_compact
gather_plan = _OPS.gather_plan
invalidate_written_slots = _OPS.invalidate_written_slots
