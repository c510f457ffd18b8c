"""The (hits, misses) device counter (``hisparse_hal/stats.py``): creation, reads and deltas."""

from __future__ import annotations

import pytest
import torch

from hisparse_hal.errors import InvalidArgumentError
from hisparse_hal.stats import new_stats_counter, read_stats, stats_delta


def test_uint64_counter_zeroes_copies_and_deltas_wrap_modulo_2_64():
    counter = new_stats_counter(torch.device("cpu"), torch.uint64)
    host = torch.empty(2, dtype=torch.uint64)
    counter.view(torch.int64).copy_(torch.tensor([-3, 5]))  # hits = 2**64 - 3
    host.copy_(counter)
    before = read_stats(host)
    assert before == (2**64 - 3, 5)
    counter.view(torch.int64).copy_(torch.tensor([4, 9]))  # wrapped past 2**64
    host.copy_(counter)
    assert stats_delta(before, read_stats(host)) == (7, 4)


def test_stats_dtype_other_than_64_bit_integer_is_rejected():
    with pytest.raises(InvalidArgumentError, match="stats dtype must be torch.uint64 or torch.int64, got torch.int32"):
        new_stats_counter(torch.device("cpu"), torch.int32)
