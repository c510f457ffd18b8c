"""The production shapes the cache ops are sized, compiled and benchmarked at (DeepSeek-V3.2 HiSparse)."""

from __future__ import annotations

__all__ = ["ROW_BYTES", "TOP_K", "BLOCK"]

ROW_BYTES = 656  # fp8_ds_mla (vLLM runtime.py FP8_DS_MLA_ROW_BYTES)
TOP_K = 2048  # DeepSeek-V3.2 index top-k
BLOCK = 64  # KV block size
