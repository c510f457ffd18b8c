"""The (hits, misses) counter arithmetic and the Capabilities value's own checks."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from hisparse_hal import Capabilities
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


def test_capabilities_reject_unknown_format_and_bad_cap():
    with pytest.raises(InvalidArgumentError, match=r"unknown KV formats \['fp4'\]"):
        Capabilities("native", None, True, None, True, True, False, frozenset({"fp4"}))
    with pytest.raises(InvalidArgumentError, match="max_batch_descriptors must be None or >= 1, got 0"):
        Capabilities("native", 0, True, None, True, True, False, frozenset({"bf16"}))
    with pytest.raises(InvalidArgumentError, match="batch_copy must be 'native' or 'loop', got 'dma'"):
        Capabilities("dma", None, True, None, True, True, False, frozenset({"bf16"}))  # type: ignore[arg-type]


def test_capabilities_are_frozen_and_serialise():
    caps = Capabilities("loop", 8192, True, 32, False, True, True, frozenset({"bf16"}), versions={"hip": "7.2.1"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        caps.batch_copy = "native"  # type: ignore[misc]
    data = caps.as_dict()
    assert data["kv_formats"] == ["bf16"] and data["stats_dtype"] == "uint64" and data["versions"] == {"hip": "7.2.1"}
