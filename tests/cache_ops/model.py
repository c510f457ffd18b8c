"""A small resolve world for the cache-ops tests: geometry, tables and persistent DGI / LRU / stats, called with
vLLM 0.34.0's 23 positional arguments through any implementation's ``resolve_residency``."""

from __future__ import annotations

from typing import Any

import torch

from tests.cache_ops.poisoned_outputs import ResolveOutputs

__all__ = ["I32", "Model"]

I32 = torch.int32


class Model:
    """State of one worked example. ``resident`` is indexed by **state** row (block 0 = host)."""

    def __init__(self, *, block: int, top_k: int, hot_size: int, union: int, states: int, hot_table: list,
                 source: list, request_state_indices: list, resident: list | None = None,
                 attention_block_stride: int | None = None, host_rows: int = 64) -> None:
        self.block, self.top_k, self.hot_size, self.union = block, top_k, hot_size, union
        self.host = torch.arange(host_rows * 16, dtype=torch.int64).remainder(251).to(torch.uint8).view(host_rows, 16)
        self.hot_cache = torch.zeros(64, block, 16, dtype=torch.uint8)
        self.hot_table = torch.tensor(hot_table, dtype=I32)
        self.source = torch.tensor(source, dtype=I32)
        self.resident = torch.tensor(resident, dtype=I32) if resident is not None else None
        self.states = torch.tensor(request_state_indices, dtype=I32)
        self.dgi = torch.full((states, hot_size), -1, dtype=I32)
        self.lru = torch.arange(hot_size, dtype=torch.int16).repeat(states, 1)
        self.stats = torch.zeros(2, dtype=torch.uint64)
        self.attention_block_stride = attention_block_stride or block

    def args(self, topk: list[list[int]], request_ids: list[int], out: ResolveOutputs,
             num_valid_rows: int | None = None) -> tuple[Any, ...]:
        """The 23 positional arguments of one call."""
        valid = torch.tensor([num_valid_rows], dtype=I32) if num_valid_rows is not None else None
        return (
            self.host, self.hot_cache, self.hot_table, torch.tensor(topk, dtype=I32), out.hot, self.dgi, self.lru,
            self.states, self.hot_size, self.union, self.stats, out.attention, self.attention_block_stride,
            torch.tensor(request_ids, dtype=I32), self.source, self.block, out.valid_counts, out.swap_host,
            out.swap_device, out.swap_counts, self.resident, self.block if self.resident is not None else 0, valid,
        )

    def step(self, ops: Any, topk: list[list[int]], request_ids: list[int],
             num_valid_rows: int | None = None) -> ResolveOutputs:
        out = ResolveOutputs(len(topk), self.top_k)
        ops.resolve_residency(*self.args(topk, request_ids, out, num_valid_rows))
        return out

    def state(self) -> tuple[list, list, list]:
        return self.dgi.tolist(), self.lru.tolist(), self.stats.view(torch.int64).tolist()
