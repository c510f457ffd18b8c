"""swap_blocks_batch on the CPU reference device: real bytes, vectorized, whole-batch validation."""

from __future__ import annotations

import contextlib
import ctypes
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hisparse_hal.errors import InvalidDescriptorError
from hisparse_hal.vendors.cpu import byte_copy
from hisparse_hal.vendors.cpu.backend import CpuBackend

BLOCK = 656


def _host_bytes(tensor: torch.Tensor) -> bytes:
    """The bytes of a contiguous host tensor (no numpy: CI installs none)."""
    return ctypes.string_at(tensor.data_ptr(), tensor.numel() * tensor.element_size())


def _i64(values) -> torch.Tensor:
    return torch.as_tensor(values, dtype=torch.int64)


def _random_bytes(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (n,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


@pytest.fixture
def backend() -> CpuBackend:
    return CpuBackend()


@pytest.fixture
def cache_and_pool(backend):
    """A 'device' cache registered explicitly and a pinned host pool, 64 blocks of 656 bytes each."""
    cache = _random_bytes(64 * BLOCK).view(64, BLOCK)
    pool = torch.zeros(64, BLOCK, dtype=torch.uint8)
    backend.register_region(cache.data_ptr(), cache.numel(), "cache")
    backend.pin_tensor(pool)
    yield cache, pool
    backend.unpin_tensor(pool)


def _oracle(memory: bytearray, base: int, src, dst, sizes) -> None:
    """Descriptors one after another, each like memmove, on a Python copy of the bytes."""
    for s, d, n in zip(src, dst, sizes, strict=True):
        memory[d - base:d - base + n] = bytes(memory[s - base:s - base + n])


def test_swap_moves_uniform_blocks_to_permuted_destinations(backend, cache_and_pool):
    cache, pool = cache_and_pool
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(1))
    src = cache.data_ptr() + torch.arange(64) * BLOCK
    dst = pool.data_ptr() + perm * BLOCK
    backend.swap_blocks_batch(src, dst, torch.full((64,), BLOCK))
    assert torch.equal(pool[perm], cache)
    assert backend.last_swap == byte_copy.SwapMoveReport(vectorized=64, looped=0, hazard=False, one_pass=64)


def test_swap_of_50000_uniform_656_byte_descriptors_is_vectorized_and_byte_exact(backend, monkeypatch):
    n = 50_000
    cache = _random_bytes(n * BLOCK, seed=2)
    pool = torch.zeros(n * BLOCK, dtype=torch.uint8)
    backend.register_region(cache.data_ptr(), cache.numel(), "cache")
    backend.pin_tensor(pool)

    def forbidden(*_args):
        raise AssertionError("the per-descriptor memmove fallback must not run for uniform sizes")

    monkeypatch.setattr(byte_copy, "memmove_each", forbidden)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(3))
    backend.swap_blocks_batch(cache.data_ptr() + perm * BLOCK, pool.data_ptr() + torch.arange(n) * BLOCK,
                              torch.full((n,), BLOCK))
    assert torch.equal(pool.view(n, BLOCK), cache.view(n, BLOCK)[perm])
    assert backend.last_swap.vectorized == n


def test_swap_with_unaligned_offsets_is_vectorized_in_smaller_pieces(backend, monkeypatch):
    memory = _random_bytes(1 << 16, seed=4)
    out = torch.zeros(1 << 16, dtype=torch.uint8)
    backend.register_region(memory.data_ptr(), memory.numel(), "src")
    backend.register_region(out.data_ptr(), out.numel(), "dst")
    monkeypatch.setattr(byte_copy, "memmove_each", lambda *a: pytest.fail("memmove fallback used"))
    src = memory.data_ptr() + 3 + torch.arange(40) * 999  # odd offsets: one-byte pieces
    dst = out.data_ptr() + 7 + torch.randperm(40, generator=torch.Generator().manual_seed(5)) * 1001
    backend.swap_blocks_batch(src, dst, torch.full((40,), 999))
    expected = bytearray(_host_bytes(memory)) + bytearray(_host_bytes(out))
    base = memory.data_ptr()
    got = _host_bytes(out)
    for s, d in zip(src.tolist(), dst.tolist(), strict=True):
        assert got[d - out.data_ptr():d - out.data_ptr() + 999] == bytes(expected[s - base:s - base + 999])
    assert out[:7].eq(0).all()


def test_swap_mixed_sizes_groups_by_size_and_matches_the_oracle(backend):
    memory = _random_bytes(1 << 18, seed=6)
    backend.register_region(memory.data_ptr(), memory.numel(), "arena")
    base = memory.data_ptr()
    sizes = [64] * 20 + [656] * 20 + [4096] * 20 + [3, 17]
    src, dst, cursor = [], [], 0
    for size in sizes:  # sources in the first half, destinations in the second, disjoint
        src.append(base + cursor)
        dst.append(base + (1 << 17) + cursor)
        cursor += size + 5
    expected = bytearray(_host_bytes(memory))
    _oracle(expected, base, src, dst, sizes)
    backend.swap_blocks_batch(_i64(src), _i64(dst), _i64(sizes))
    assert _host_bytes(memory) == bytes(expected)
    assert backend.last_swap == byte_copy.SwapMoveReport(vectorized=60, looped=2, hazard=False)


def test_swap_with_own_source_and_destination_overlapping_behaves_like_memmove(backend):
    memory = _random_bytes(64 * 2 * BLOCK, seed=7)
    backend.register_region(memory.data_ptr(), memory.numel(), "arena")
    base = memory.data_ptr()
    src = [base + 2 * BLOCK * i for i in range(64)]
    dst = [s + 8 for s in src]  # each shifts its own block by 8 bytes, into the gap after it
    expected = bytearray(_host_bytes(memory))
    _oracle(expected, base, src, dst, [BLOCK] * 64)
    backend.swap_blocks_batch(_i64(src), _i64(dst), torch.full((64,), BLOCK))
    assert _host_bytes(memory) == bytes(expected)
    assert backend.last_swap.vectorized == 64


def test_swap_with_chained_descriptors_runs_them_in_order(backend):
    memory = _random_bytes(4 * BLOCK, seed=8)
    backend.register_region(memory.data_ptr(), memory.numel(), "arena")
    a, b, c = (memory.data_ptr() + i * BLOCK for i in range(3))
    first = memory[:BLOCK].clone()
    backend.swap_blocks_batch(_i64([a, b]), _i64([b, c]), _i64([BLOCK, BLOCK]))  # A->B, then B->C
    assert torch.equal(memory[BLOCK:2 * BLOCK], first) and torch.equal(memory[2 * BLOCK:3 * BLOCK], first)
    assert backend.last_swap.hazard


def test_swap_with_duplicate_destinations_keeps_the_last_write(backend, cache_and_pool):
    cache, pool = cache_and_pool
    src = cache.data_ptr() + torch.arange(40) * BLOCK
    dst = torch.full((40,), pool.data_ptr())
    backend.swap_blocks_batch(src, dst, torch.full((40,), BLOCK))
    assert torch.equal(pool[0], cache[39])
    assert backend.last_swap.hazard


def test_swap_of_large_blocks_uses_one_memmove_per_descriptor(backend):
    size = 1 << 20
    memory = _random_bytes(4 * size, seed=9)
    backend.register_region(memory.data_ptr(), memory.numel(), "arena")
    base = memory.data_ptr()
    expected = torch.cat([memory[:2 * size], memory[:2 * size]])
    backend.swap_blocks_batch(_i64([base, base + size]), _i64([base + 2 * size, base + 3 * size]), _i64([size, size]))
    assert torch.equal(memory, expected)
    assert backend.last_swap == byte_copy.SwapMoveReport(vectorized=0, looped=2, hazard=False)


def test_empty_batch_and_zero_size_descriptors_copy_nothing(backend, cache_and_pool):
    cache, pool = cache_and_pool
    backend.swap_blocks_batch(_i64([]), _i64([]), _i64([]))
    backend.swap_blocks_batch(_i64([cache.data_ptr()]), _i64([pool.data_ptr()]), _i64([0]))
    assert pool.eq(0).all()


def test_descriptor_arrays_may_be_reused_once_the_call_returns(backend, cache_and_pool):
    cache, pool = cache_and_pool
    src, dst, sizes = _i64([cache.data_ptr()]), _i64([pool.data_ptr()]), _i64([BLOCK])
    backend.swap_blocks_batch(src, dst, sizes)
    src.fill_(0)
    assert torch.equal(pool[0], cache[0])


def test_cache_ops_swap_and_stats_counter(backend, cache_and_pool):
    cache, pool = cache_and_pool
    ops = backend.create_cache_ops(runtime="runtime")
    assert ops.runtime == "runtime" and ops.backend is backend
    ops.swap_blocks_batch(_i64([cache.data_ptr() + BLOCK]), _i64([pool.data_ptr()]), _i64([BLOCK]))
    assert torch.equal(pool[0], cache[1])
    counter = ops.new_stats_counter()
    assert counter.dtype == torch.uint64 and counter.device == torch.device("cpu") and counter.shape == (2,)


# ----------------------------------------------------------------------------- rejected batches
BAD_BATCHES = [
    pytest.param(lambda c, p: ([c], [p, p], [BLOCK]), r"equal lengths, got src=1, dst=2, sizes=1", id="length"),
    pytest.param(
        lambda c, p: (torch.tensor([1], dtype=torch.int32), [p], [BLOCK]),
        r"'src' must have dtype torch.int64, got torch.int32",
        id="dtype",
    ),
    pytest.param(
        lambda c, p: (torch.tensor([c], device="meta"), [p], [BLOCK]),
        r"'src' must be a CPU tensor, got device meta",
        id="device",
    ),
    pytest.param(lambda c, p: ([[c]], [[p]], [[BLOCK]]), r"'src' must be 1-D, got shape \(1, 1\)", id="2d"),
    pytest.param(
        lambda c, p: ([c, c], [p, p + BLOCK], [BLOCK, -1]), r"descriptor 1 has negative size -1", id="negative"
    ),
    pytest.param(
        lambda c, p: ([c, 64], [p, p], [BLOCK, 8]),
        r"descriptor 1: source range \[0x40, 0x48\) \(8 bytes\) is not inside any known region",
        id="outside",
    ),
    pytest.param(
        lambda c, p: ([c, c], [p, p + 63 * BLOCK + 1], [BLOCK, BLOCK]),
        r"descriptor 1: destination range .* runs past the end of region 'pinned host",
        id="straddle",
    ),
]


@pytest.mark.parametrize("make, message", BAD_BATCHES)
def test_bad_batch_is_rejected_whole_and_copies_nothing(backend, cache_and_pool, make, message):
    cache, pool = cache_and_pool
    src, dst, sizes = (x if isinstance(x, torch.Tensor) else _i64(x) for x in make(cache.data_ptr(), pool.data_ptr()))
    with pytest.raises(InvalidDescriptorError, match=message):
        backend.swap_blocks_batch(src, dst, sizes)
    assert pool.eq(0).all()


def test_rejected_batch_names_the_first_bad_index(backend, cache_and_pool):
    cache, pool = cache_and_pool
    src = cache.data_ptr() + torch.arange(10) * BLOCK
    src[7] = 0x10
    with pytest.raises(InvalidDescriptorError) as info:
        backend.swap_blocks_batch(src, pool.data_ptr() + torch.arange(10) * BLOCK, torch.full((10,), BLOCK))
    assert info.value.index == 7 and "nothing was copied" in str(info.value)
    assert pool.eq(0).all()


def test_swap_rejects_non_tensor_descriptors(backend):
    with pytest.raises(InvalidDescriptorError, match=r"'src' must be a torch.Tensor, got list"):
        backend.swap_blocks_batch([1], _i64([1]), _i64([1]))


def test_swap_rejects_descriptor_spanning_two_pinned_chunks(backend):
    pool = torch.zeros(8, 4096, dtype=torch.uint8)
    backend.host_chunk_bytes = 4 * 4096
    backend.pin_tensor(pool)
    source = torch.ones(2 * 4096, dtype=torch.uint8)
    backend.register_region(source.data_ptr(), source.numel(), "source")
    with pytest.raises(InvalidDescriptorError, match=r"runs past the end of region 'pinned host .* chunk 1/2'"):
        backend.swap_blocks_batch(_i64([source.data_ptr()]), _i64([pool.data_ptr() + 3 * 4096]), _i64([2 * 4096]))
    assert pool.eq(0).all()


def test_swap_into_a_tensor_after_unpin_is_rejected(backend, cache_and_pool):
    cache, _pool = cache_and_pool
    other = torch.zeros(BLOCK, dtype=torch.uint8)
    backend.pin_tensor(other)
    backend.unpin_tensor(other)
    with pytest.raises(InvalidDescriptorError, match="is not inside any known region"):
        backend.swap_blocks_batch(_i64([cache.data_ptr()]), _i64([other.data_ptr()]), _i64([BLOCK]))
    assert other.eq(0).all()


# ----------------------------------------------------------------------------- generated cases
ARENA = 1 << 14


@st.composite
def _permuted_batches(draw):
    """Disjoint destination slots in a permuted order; sources anywhere in the source arena."""
    uniform = draw(st.booleans())
    count = draw(st.integers(0, 80))
    if uniform:
        size = draw(st.sampled_from([1, 3, 8, 64, 100, 656]))
        sizes = [size] * count
    else:
        sizes = draw(st.lists(st.sampled_from([0, 1, 2, 7, 8, 64, 656, 1000]), min_size=count, max_size=count))
    slot = max(sizes, default=1) or 1
    count = min(count, ARENA // slot)
    sizes = sizes[:count]
    slots = random.Random(draw(st.integers(0, 2**32))).sample(range(ARENA // slot), count)
    shift = draw(st.integers(0, 3))
    dst = [s * slot + min(shift, slot - n) for s, n in zip(slots, sizes, strict=True)]
    src = [draw(st.integers(0, ARENA - n)) for n in sizes]
    return src, dst, sizes


@st.composite
def _arbitrary_in_one_region(draw):
    """Descriptors anywhere in one region: sources and destinations may overlap in any way."""
    count = draw(st.integers(1, 40))
    sizes = draw(st.lists(st.sampled_from([1, 4, 16, 64, 656]), min_size=count, max_size=count))
    src = [draw(st.integers(0, ARENA - n)) for n in sizes]
    dst = [draw(st.integers(0, ARENA - n)) for n in sizes]
    return src, dst, sizes


@contextlib.contextmanager
def _vector_threshold(min_group: int):
    """Lower the vectorized path's group threshold so small generated batches take it too."""
    saved = byte_copy.MIN_VECTOR_GROUP
    byte_copy.MIN_VECTOR_GROUP = min_group
    try:
        yield
    finally:
        byte_copy.MIN_VECTOR_GROUP = saved


@settings(max_examples=150, deadline=None)
@given(case=_permuted_batches(), seed=st.integers(0, 2**16), min_group=st.sampled_from([1, 16]))
def test_generated_swaps_between_two_regions_match_the_oracle(case, seed, min_group):
    backend = CpuBackend()
    src_off, dst_off, sizes = case
    source, target = _random_bytes(ARENA, seed), _random_bytes(ARENA, seed + 1)
    backend.register_region(source.data_ptr(), ARENA, "source")
    backend.register_region(target.data_ptr(), ARENA, "target")
    expected = bytearray(_host_bytes(target))
    data = _host_bytes(source)
    for s, d, n in zip(src_off, dst_off, sizes, strict=True):
        expected[d:d + n] = data[s:s + n]
    with _vector_threshold(min_group):
        backend.swap_blocks_batch(_i64([source.data_ptr() + s for s in src_off]),
                                  _i64([target.data_ptr() + d for d in dst_off]), _i64(sizes))
    assert _host_bytes(target) == bytes(expected)
    assert _host_bytes(source) == data


@settings(max_examples=150, deadline=None)
@given(case=_arbitrary_in_one_region(), seed=st.integers(0, 2**16), min_group=st.sampled_from([1, 16]))
def test_generated_overlapping_swaps_in_one_region_run_in_order_like_memmove(case, seed, min_group):
    backend = CpuBackend()
    src_off, dst_off, sizes = case
    memory = _random_bytes(ARENA, seed)
    base = memory.data_ptr()
    backend.register_region(base, ARENA, "arena")
    expected = bytearray(_host_bytes(memory))
    _oracle(expected, base, [base + s for s in src_off], [base + d for d in dst_off], sizes)
    with _vector_threshold(min_group):
        backend.swap_blocks_batch(_i64([base + s for s in src_off]), _i64([base + d for d in dst_off]), _i64(sizes))
    assert _host_bytes(memory) == bytes(expected)


def test_swap_whose_sources_tile_a_run_scatters_in_one_pass(backend):
    cache = _random_bytes(64 * BLOCK, seed=21).view(64, BLOCK)
    pool = torch.zeros(256, BLOCK, dtype=torch.uint8)
    backend.register_region(cache.data_ptr(), cache.numel(), "cache")
    backend.pin_tensor(pool)
    slots = torch.randperm(256, generator=torch.Generator().manual_seed(22))[:64]  # scattered, not a run
    order = torch.randperm(64, generator=torch.Generator().manual_seed(23))
    backend.swap_blocks_batch(cache.data_ptr() + order * BLOCK, pool.data_ptr() + slots * BLOCK,
                              torch.full((64,), BLOCK))
    assert torch.equal(pool[slots], cache[order])
    untouched = torch.ones(256, dtype=torch.bool)
    untouched[slots] = False
    assert pool[untouched].eq(0).all()
    assert backend.last_swap == byte_copy.SwapMoveReport(vectorized=64, looped=0, hazard=False, one_pass=64)
    backend.unpin_tensor(pool)


def test_swap_of_large_blocks_into_a_run_is_one_vectorized_pass(backend, monkeypatch):
    size, n = 64 << 10, 16
    memory = _random_bytes(n * size, seed=24)
    out = torch.zeros(n * size, dtype=torch.uint8)
    backend.register_region(memory.data_ptr(), memory.numel(), "device")
    backend.pin_tensor(out)
    monkeypatch.setattr(byte_copy, "memmove_each", lambda *a: pytest.fail("memmove fallback used"))
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(25))
    backend.swap_blocks_batch(memory.data_ptr() + perm * size, out.data_ptr() + torch.arange(n) * size,
                              torch.full((n,), size))
    assert torch.equal(out.view(n, size), memory.view(n, size)[perm])
    assert backend.last_swap == byte_copy.SwapMoveReport(vectorized=n, looped=0, hazard=False, one_pass=n)
    backend.unpin_tensor(out)


def test_swap_of_large_blocks_scattered_on_both_sides_uses_memmove_in_batch_order(backend):
    size, n = 64 << 10, 16
    memory = _random_bytes(2 * n * size, seed=26)
    out = torch.zeros(2 * n * size, dtype=torch.uint8)
    backend.register_region(memory.data_ptr(), memory.numel(), "device")
    backend.pin_tensor(out)
    src_slots = torch.randperm(2 * n, generator=torch.Generator().manual_seed(27))[:n]
    dst_slots = torch.randperm(2 * n, generator=torch.Generator().manual_seed(28))[:n]
    backend.swap_blocks_batch(memory.data_ptr() + src_slots * size, out.data_ptr() + dst_slots * size,
                              torch.full((n,), size))
    assert torch.equal(out.view(2 * n, size)[dst_slots], memory.view(2 * n, size)[src_slots])
    assert backend.last_swap == byte_copy.SwapMoveReport(vectorized=0, looped=n, hazard=False)
    backend.unpin_tensor(out)


def test_swap_into_a_run_with_a_duplicate_destination_is_not_taken_for_a_run(backend):
    cache = _random_bytes(64 * BLOCK, seed=29).view(64, BLOCK)
    pool = torch.zeros(64, BLOCK, dtype=torch.uint8)
    backend.register_region(cache.data_ptr(), cache.numel(), "cache")
    backend.pin_tensor(pool)
    slots = [0, 0] + list(range(2, 64))  # 64 destinations over 64 slots, slot 1 never written
    backend.swap_blocks_batch(cache.data_ptr() + torch.arange(64) * BLOCK, pool.data_ptr() + _i64(slots) * BLOCK,
                              torch.full((64,), BLOCK))
    assert torch.equal(pool[0], cache[1]) and pool[1].eq(0).all() and torch.equal(pool[2:], cache[2:])
    assert backend.last_swap.hazard
    backend.unpin_tensor(pool)
