"""The (hits, misses) counter: a 2-element device tensor of ``stats_dtype``, read rarely.

torch supports little beyond ``zeros`` and ``copy_`` on ``uint64``, so values are read through an
``int64`` view and deltas are taken in Python ints modulo 2**64.
"""

from __future__ import annotations

import torch

from .errors import InvalidArgumentError

__all__ = ["STATS_MODULUS", "new_stats_counter", "read_stats", "stats_delta"]

STATS_MODULUS = 1 << 64


def new_stats_counter(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A zeroed ``[hits, misses]`` counter on ``device``.

    Raises:
        InvalidArgumentError: ``dtype`` is not ``torch.uint64`` or ``torch.int64``.
    """
    if dtype not in (torch.uint64, torch.int64):
        raise InvalidArgumentError(f"stats dtype must be torch.uint64 or torch.int64, got {dtype}")
    return torch.zeros(2, dtype=dtype, device=device)


def read_stats(host_copy: torch.Tensor) -> tuple[int, int]:
    """The counter's values as non-negative Python ints (read through an int64 view).

    Raises:
        InvalidArgumentError: not a 2-element 64-bit CPU tensor.
    """
    if host_copy.device.type != "cpu" or host_copy.numel() != 2 or host_copy.element_size() != 8:
        raise InvalidArgumentError(
            f"stats must be a 2-element 64-bit CPU tensor, got {host_copy.dtype} "
            f"shape {tuple(host_copy.shape)} on {host_copy.device}"
        )
    raw = host_copy.view(torch.int64).tolist()
    return raw[0] % STATS_MODULUS, raw[1] % STATS_MODULUS


def stats_delta(previous: tuple[int, int], current: tuple[int, int]) -> tuple[int, int]:
    """Increments since ``previous``, modulo 2**64 (a counter that wrapped still gives the right delta)."""
    return (current[0] - previous[0]) % STATS_MODULUS, (current[1] - previous[1]) % STATS_MODULUS
