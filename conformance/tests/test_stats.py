"""Stats: the ``[hits, misses]`` counter of ``stats_dtype`` can be made zeroed on the device, updated
there, copied into pinned host memory, and read as deltas modulo 2**64."""

from __future__ import annotations

import pytest
import torch

from hisparse_hal.backend import HiSparseBackend
from hisparse_hal.conformance.arenas import allocate_guarded, synchronize
from hisparse_hal.stats import STATS_MODULUS, read_stats, stats_delta

#: This tier (read by conformance/tiers.py, without importing this module): its area, its place in the
#: run and its title in the reports.
AREA = "stats"
ORDER = 70
TITLE = "Stats"


def test_stats_dtype_is_a_64_bit_integer_and_matches_capabilities(backend, capabilities):
    assert backend.stats_dtype in (torch.uint64, torch.int64), (
        f"stats_dtype {backend.stats_dtype} is not uint64 or int64"
    )
    assert backend.stats_dtype == capabilities.stats_dtype


@pytest.mark.hal_extension
def test_new_stats_counter_is_zeroed_on_the_device(backend):
    counter = backend.create_cache_ops(None).new_stats_counter()
    assert counter.device == backend.device
    assert counter.dtype == backend.stats_dtype and tuple(counter.shape) == (2,)
    synchronize(backend.device)
    assert read_stats(counter.to("cpu")) == (0, 0)


def _counter(backend):
    """The device counter: the ops' ``new_stats_counter()`` on hisparse-hal's backends; for the vLLM contract, the
    tensor vLLM allocates itself, ``zeros(2, stats_dtype)`` on the device (vllm/v1/hisparse/runtime.py:623-624)."""
    if isinstance(backend, HiSparseBackend):
        return backend.create_cache_ops(None).new_stats_counter()
    return torch.zeros(2, dtype=backend.stats_dtype, device=backend.device)


@pytest.fixture
def pinned_stats(backend):
    """A pinned 2-element host tensor of ``stats_dtype`` (in a page of its own, guarded)."""
    arena = allocate_guarded(16, torch.device("cpu"), "pinned stats", align=4096)
    host = arena.inner.view(backend.stats_dtype)
    backend.pin_tensor(host)
    yield host
    backend.unpin_tensor(host)
    arena.assert_canaries_intact()


@pytest.mark.smoke
def test_stats_counter_copies_into_pinned_host_memory(backend, pinned_stats):
    counter = _counter(backend)
    counter.view(torch.int64).copy_(torch.tensor([123456789, 42]).to(backend.device))
    pinned_stats.copy_(counter, non_blocking=True)
    synchronize(backend.device)
    assert read_stats(pinned_stats) == (123456789, 42)
    counter.zero_()
    pinned_stats.copy_(counter)
    synchronize(backend.device)
    assert read_stats(pinned_stats) == (0, 0)


def test_stats_deltas_are_taken_modulo_two_to_the_64(backend, pinned_stats):
    counter = _counter(backend)
    counter.view(torch.int64).copy_(torch.tensor([-3, -1]).to(backend.device))  # 2**64 - 3, 2**64 - 1
    pinned_stats.copy_(counter)
    synchronize(backend.device)
    before = read_stats(pinned_stats)
    assert before == (STATS_MODULUS - 3, STATS_MODULUS - 1)
    counter.view(torch.int64).add_(torch.tensor([5, 2]).to(backend.device))  # wraps on the device
    pinned_stats.copy_(counter)
    synchronize(backend.device)
    after = read_stats(pinned_stats)
    assert after == (2, 1)
    assert stats_delta(before, after) == (5, 2)
