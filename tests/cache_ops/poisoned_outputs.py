"""Poisoned resolve outputs for the cache-ops tests: every output starts as a value no op writes, so an
entry the op must leave alone is seen to be left alone."""

from __future__ import annotations

import torch

from hisparse_hal.testing.sequences import POISON

__all__ = ["ResolveOutputs"]


class ResolveOutputs:
    """The outputs of one resolve call over ``rows`` batch rows of top-k ``top_k``, each filled with ``poison``.

    ``attention`` and ``valid_counts`` are row-strided views (as vLLM's tests pass them); ``snapshot`` lists all.
    """

    def __init__(self, rows: int, top_k: int, poison: int = POISON) -> None:
        self.hot = torch.full((rows, top_k), poison, dtype=torch.int32)
        self.attention = torch.full((rows, top_k + 3), poison, dtype=torch.int32)[:, :top_k]
        self.swap_host = self.hot.clone()
        self.swap_device = self.hot.clone()
        self.valid_counts = torch.full((rows, 2), poison, dtype=torch.int32)[:, 0]
        self.swap_counts = torch.full((rows,), poison, dtype=torch.int32)

    def snapshot(self) -> dict[str, list]:
        return {name: getattr(self, name).tolist()
                for name in ("hot", "attention", "swap_host", "swap_device", "valid_counts", "swap_counts")}
