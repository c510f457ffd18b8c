"""Swaps: every byte of every descriptor lands where it should, nothing else moves, and a bad batch is
rejected whole with a typed error naming its first bad descriptor, before anything is copied.

Under vLLM's contract a swap copies raw pointers: only malformed descriptor arrays must be refused (any exception,
nothing copied; ``csrc/cache_kernels.cu:114-126``); the checks of addresses and sizes are hisparse-hal's."""

from __future__ import annotations

import contextlib

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hisparse_hal.conformance.arenas import (
    GuardedBytes,
    allocate_guarded,
    describe_mismatch,
    device_caches,
    pinned_host_pool,
    random_bytes,
)
from hisparse_hal.conformance.contracts import refused, typed_refusals
from hisparse_hal.conformance.swap_plan import SwapPlan
from hisparse_hal.errors import InvalidDescriptorError

#: This tier (read by conformance/tiers.py, without importing this module): its area, its place in the
#: run and its title in the reports.
AREA = "swaps"
ORDER = 30
TITLE = "Swaps"

KIB, MIB = 1 << 10, 1 << 20
DIRECTIONS = ("device_to_host", "host_to_device", "device_to_device", "host_to_host")
# Derandomized: the same cases on every run and machine, so reports are comparable across a matrix.
GENERATED = settings(
    max_examples=25, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
)


def _ends(
    memory: contextlib.ExitStack, backend, direction: str, size: int, seed: int = 0
) -> tuple[GuardedBytes, GuardedBytes]:
    """A filled source and destination of at least ``size`` bytes for ``direction``."""
    src_kind, _, dst_kind = direction.partition("_to_")
    devices = []
    if "device" in (src_kind, dst_kind):
        devices = memory.enter_context(device_caches(backend, 2 if src_kind == dst_kind else 1, size))
    hosts = [
        memory.enter_context(pinned_host_pool(backend, size, label=f"pinned host pool {i}"))
        for i in range(2 if src_kind == dst_kind == "host" else (1 if "host" in (src_kind, dst_kind) else 0))
    ]
    pick = {"device": iter(devices), "host": iter(hosts)}
    src, dst = next(pick[src_kind]), next(pick[dst_kind])
    src.fill(random_bytes(src.size, seed))
    dst.fill(random_bytes(dst.size, seed + 1))
    return src, dst


def _swap_and_check(backend, plan: SwapPlan) -> None:
    before = plan.snapshot()
    expected = plan.expected(before)
    backend.swap_blocks_batch(*plan.descriptors())
    plan.assert_matches(expected)


def _permuted_blocks(src: GuardedBytes, dst: GuardedBytes, count: int, block: int, seed: int) -> SwapPlan:
    """``count`` blocks of ``block`` bytes: source block i goes to a permuted destination slot."""
    generator = torch.Generator().manual_seed(seed)
    slots = torch.randperm(count, generator=generator)
    plan = SwapPlan()
    plan.add_many(src, torch.arange(count) * block, dst, slots * block, torch.full((count,), block))
    return plan


# ------------------------------------------------------------------------------------------ good batches
def test_swap_of_an_empty_batch_copies_nothing(backend, memory):
    src, dst = _ends(memory, backend, "device_to_host", 4096)
    before = {id(a): a.read() for a in (src, dst)}
    empty = torch.empty(0, dtype=torch.int64)
    backend.swap_blocks_batch(empty, empty.clone(), empty.clone())
    for arena in (src, dst):
        assert torch.equal(arena.read(), before[id(arena)]), f"{arena.label} changed after an empty batch"
        arena.assert_canaries_intact()


@pytest.mark.parametrize("count", [1, 2, 8191, 8192, pytest.param(8193, marks=pytest.mark.smoke), 50_000])
def test_swap_batch_of_n_descriptors_copies_every_byte(backend, memory, count):
    block = 48  # odd-ish block size: not a power of two, not 64-byte aligned
    src, dst = _ends(memory, backend, "device_to_host", count * block, seed=count)
    _swap_and_check(backend, _permuted_blocks(src, dst, count, block, seed=count))


@pytest.mark.parametrize("block", [1, 2, 3, 7, 64, 655, 656, 4096, 64 * KIB + 1, MIB, 4 * MIB])
def test_swap_of_uniform_block_size_copies_every_byte(backend, memory, block):
    count = max(2, min(4096, (12 * MIB) // block))
    src, dst = _ends(memory, backend, "device_to_host", count * block, seed=block)
    _swap_and_check(backend, _permuted_blocks(src, dst, count, block, seed=block))


def _layout(sizes: list[int], order: list[int], gaps: list[int]) -> torch.Tensor:
    """Offsets placing block ``order[k]`` k-th, after a gap of ``gaps[k]`` bytes (unaligned starts)."""
    offsets = [0] * len(sizes)
    running = 0
    for k, i in enumerate(order):
        offsets[i] = running + gaps[k]
        running = offsets[i] + sizes[i]
    return torch.tensor(offsets, dtype=torch.int64)


MIXED_SIZES = [1, 4 * MIB, 3, 656, 4096, 2, 64 * KIB + 1, 7, MIB - 1, 48, 1, 655, 256 * KIB, 9, 4 * MIB - 3, 100]


@pytest.mark.parametrize("direction", DIRECTIONS)
def test_swap_of_mixed_block_sizes_copies_every_byte(backend, memory, direction):
    count = len(MIXED_SIZES)
    gaps = [(k * 37) % 101 for k in range(count)]
    span = sum(MIXED_SIZES) + sum(gaps)
    src, dst = _ends(memory, backend, direction, span, seed=7)
    generator = torch.Generator().manual_seed(11)
    plan = SwapPlan()
    plan.add_many(
        src, _layout(MIXED_SIZES, list(range(count)), gaps),
        dst, _layout(MIXED_SIZES, torch.randperm(count, generator=generator).tolist(), gaps[::-1]),
        torch.tensor(MIXED_SIZES),
    )
    _swap_and_check(backend, plan)


def test_swap_of_adjacent_destinations_leaves_no_gap_or_overlap(backend, memory):
    sizes = torch.tensor([5, 1, 656, 3, 4096, 2, 17, 1])
    total = int(sizes.sum())
    src, dst = _ends(memory, backend, "device_to_host", total * 2, seed=3)
    plan = SwapPlan()
    dst_off = torch.cumsum(sizes, 0) - sizes  # back to back, no gaps
    src_off = (torch.cumsum(sizes.flip(0), 0) - sizes.flip(0)).flip(0) + 3
    plan.add_many(src, src_off, dst, dst_off, sizes)
    _swap_and_check(backend, plan)


def test_swap_skips_zero_size_descriptors_among_others(backend, memory):
    src, dst = _ends(memory, backend, "device_to_host", 64 * 40, seed=5)
    sizes = torch.tensor([64, 0, 64, 0, 0, 64, 64, 0] * 5)
    plan = SwapPlan()
    plan.add_many(src, torch.arange(40) * 64, dst, torch.arange(40).flip(0) * 64, sizes)
    _swap_and_check(backend, plan)


def test_swap_within_one_region_between_disjoint_ranges(backend, memory):
    (cache,) = memory.enter_context(device_caches(backend, 1, 64 * KIB))
    cache.fill(random_bytes(cache.size, 21))
    half = cache.size // 2
    plan = SwapPlan()
    plan.add_many(cache, torch.arange(16) * 656, cache, half + torch.arange(16).flip(0) * 1000, torch.full((16,), 656))
    _swap_and_check(backend, plan)


def test_swap_reads_descriptor_arrays_at_call_time(backend, memory):
    """The caller may reuse its descriptor arrays as soon as the call returns (vendor-facts.md)."""
    src, dst = _ends(memory, backend, "device_to_host", 8192 * 4, seed=9)
    plan = _permuted_blocks(src, dst, 4, 8192, seed=9)
    before = plan.snapshot()
    expected = plan.expected(before)
    s, d, n = plan.descriptors()
    backend.swap_blocks_batch(s, d, n)
    s.copy_(torch.full_like(s, src.address)), d.copy_(torch.full_like(d, dst.address)), n.fill_(1)
    plan.assert_matches(expected)


def test_swap_accepts_non_contiguous_descriptor_arrays(backend, memory):
    src, dst = _ends(memory, backend, "host_to_device", 1000 * 64, seed=13)
    plan = _permuted_blocks(src, dst, 1000, 64, seed=13)
    before = plan.snapshot()
    expected = plan.expected(before)
    s, d, n = plan.descriptors()
    # Interleave with garbage so the real descriptors are every other element of a larger tensor.
    spread = [torch.stack([t, torch.full_like(t, -1)], 1).reshape(-1)[::2] for t in (s, d, n)]
    assert not spread[0].is_contiguous()
    backend.swap_blocks_batch(*spread)
    plan.assert_matches(expected)


def test_swap_chunks_batches_past_max_batch_descriptors_transparently(backend, memory, capabilities):
    cap = capabilities.max_batch_descriptors
    count = 2 * cap + 3 if cap is not None else 60_000
    if count > 400_000:
        pytest.skip(
            f"capability max_batch_descriptors={cap} needs a batch of {count} descriptors; the suite stops at 400000"
        )
    block = 16
    src, dst = _ends(memory, backend, "device_to_host", count * block, seed=17)
    _swap_and_check(backend, _permuted_blocks(src, dst, count, block, seed=17))


def test_swap_chunk_boundaries_copy_the_descriptors_on_both_sides(backend, memory, capabilities):
    cap = capabilities.max_batch_descriptors or 8192
    if cap + 1 > 400_000:
        pytest.skip(f"capability max_batch_descriptors={cap} is beyond the suite's 400000-descriptor bound")
    # Mixed sizes around every chunk boundary, so a chunk that drops or repeats a descriptor shows.
    count = cap + 1
    sizes = (torch.arange(count) % 5 + 1) * 8
    slot = 48
    src, dst = _ends(memory, backend, "host_to_device", count * slot, seed=19)
    generator = torch.Generator().manual_seed(19)
    plan = SwapPlan()
    plan.add_many(src, torch.arange(count) * slot, dst, torch.randperm(count, generator=generator) * slot, sizes)
    _swap_and_check(backend, plan)


def test_swap_into_a_pinned_pool_seen_as_blocks(backend, memory):
    """A pool pinned as ``[num_blocks, block_bytes]`` (as an engine pins it) takes block-sized copies."""
    block, count = 656, 96
    (cache,) = memory.enter_context(device_caches(backend, 1, block * count))
    pool = memory.enter_context(pinned_host_pool(backend, block * count, block_bytes=block))
    cache.fill(random_bytes(cache.size, 23))
    pool.fill(random_bytes(pool.size, 24))
    _swap_and_check(backend, _permuted_blocks(cache, pool, count, block, seed=23))


@pytest.mark.hal_extension
def test_swap_through_cache_ops_copies_every_byte(backend, memory):
    src, dst = _ends(memory, backend, "device_to_host", 256 * 656, seed=25)
    ops = backend.create_cache_ops(runtime=None)
    plan = _permuted_blocks(src, dst, 256, 656, seed=25)
    before = plan.snapshot()
    ops.swap_blocks_batch(*plan.descriptors())
    plan.assert_matches(plan.expected(before))


@pytest.mark.hal_extension  # synchronize() is hisparse-hal's member, not one of vLLM's 14
def test_synchronize_returns_once_a_device_to_host_swap_has_landed(backend, memory):
    """The host bytes are read right after ``backend.synchronize()``, with no other wait: the wait is the backend's."""
    src, dst = _ends(memory, backend, "device_to_host", 512 * 656, seed=26)
    plan = _permuted_blocks(src, dst, 512, 656, seed=26)
    expected = plan.expected(plan.snapshot())[id(dst)]
    backend.swap_blocks_batch(*plan.descriptors())
    backend.synchronize()
    landed = dst.inner.clone()  # host memory: no torch synchronisation in this read
    assert torch.equal(landed, expected), describe_mismatch(landed, expected, dst.label)


@pytest.mark.hal_extension
def test_swap_into_an_explicitly_registered_region_until_it_is_unregistered(backend, memory):
    (cache,) = memory.enter_context(device_caches(backend, 1, 64 * 100))
    staging = memory.enter_context(_explicit_region(backend, 64 * 100))
    cache.fill(random_bytes(cache.size, 27))
    staging.fill(random_bytes(staging.size, 28))
    plan = _permuted_blocks(cache, staging, 100, 64, seed=27)
    _swap_and_check(backend, plan)
    backend.unregister_region(staging.region)
    s, d, n = plan.descriptors()
    with pytest.raises(InvalidDescriptorError, match=r"descriptor 0\b.*destination.*not inside any known region"):
        backend.swap_blocks_batch(s, d, n)
    staging.region = None


@contextlib.contextmanager
def _explicit_region(backend, size: int):
    """A guarded range on the backend's device made a swap region with ``register_region``."""
    arena = allocate_guarded(size, backend.device, "explicit region")
    arena.region = backend.register_region(arena.address, arena.size, "conformance explicit", device=backend.device)
    try:
        yield arena
    finally:
        if arena.region is not None:
            backend.unregister_region(arena.region)
    arena.assert_canaries_intact()


# ------------------------------------------------------------------------------------------ bad batches
BAD_MESSAGE = r"(?s)descriptor {index}\b.*"


def _bad_batch_setup(memory, backend, count: int = 8):
    src, dst = _ends(memory, backend, "device_to_host", 64 * KIB, seed=31)
    plan = _permuted_blocks(src, dst, count, 256, seed=31)
    return src, dst, plan


def _assert_rejected(backend, plan: SwapPlan, descriptors, *, index: int | None, match: str) -> None:
    before = plan.snapshot()
    with refused(backend, InvalidDescriptorError, match=match) as info:
        backend.swap_blocks_batch(*descriptors)
    if typed_refusals(backend):
        error: InvalidDescriptorError = info.value
        assert isinstance(error, ValueError), "InvalidDescriptorError must also be a ValueError"
        assert error.index == index, f"error names descriptor {error.index}, the first bad one is {index}"
    plan.assert_unchanged(before)


def test_swap_rejects_descriptor_arrays_of_unequal_length(backend, memory):
    _, _, plan = _bad_batch_setup(memory, backend)
    s, d, n = plan.descriptors()
    _assert_rejected(backend, plan, (s, d, n[:-1]), index=None, match=r"equal length.*sizes=7")


@pytest.mark.parametrize("dtype", [
    torch.int32, pytest.param(torch.uint64, marks=pytest.mark.hal_extension), torch.float64,
])  # uint64 is what vLLM's op takes on XPU (vllm/_custom_ops.py:3041-3043): refusing it is hisparse-hal's rule
def test_swap_rejects_descriptors_of_the_wrong_dtype(backend, memory, dtype):
    _, _, plan = _bad_batch_setup(memory, backend)
    s, d, n = plan.descriptors()
    _assert_rejected(
        backend, plan, (s, d.to(dtype), n), index=None, match=rf"'dst'.*int64.*{str(dtype).removeprefix('torch.')}"
    )


def test_swap_rejects_descriptors_on_a_non_host_device(backend, memory):
    _, _, plan = _bad_batch_setup(memory, backend)
    s, d, n = plan.descriptors()
    _assert_rejected(backend, plan, (s.to("meta"), d, n), index=None, match=r"'src'.*CPU tensor.*meta")


def test_swap_rejects_descriptors_that_are_not_1d(backend, memory):
    _, _, plan = _bad_batch_setup(memory, backend)
    s, d, n = plan.descriptors()
    _assert_rejected(backend, plan, (s, d, n.view(2, 4)), index=None, match=r"'sizes'.*1-D.*\(2, 4\)")


def test_swap_rejects_descriptors_that_are_not_tensors(backend, memory):
    _, _, plan = _bad_batch_setup(memory, backend)
    s, d, n = plan.descriptors()
    _assert_rejected(backend, plan, (s.tolist(), d, n), index=None, match=r"'src'.*torch.Tensor.*list")


@pytest.mark.hal_extension  # vLLM's op checks no address or size (csrc/cache_kernels.cu:114-126)
def test_swap_rejects_a_negative_size_naming_its_index(backend, memory):
    _, _, plan = _bad_batch_setup(memory, backend)
    s, d, n = plan.descriptors()
    n[5] = -256
    _assert_rejected(backend, plan, (s, d, n), index=5, match=r"descriptor 5\b.*negative size -256")


@pytest.mark.hal_extension  # vLLM's op checks no address or size (csrc/cache_kernels.cu:114-126)
def test_swap_rejects_a_source_outside_every_known_region(backend, memory):
    _, _, plan = _bad_batch_setup(memory, backend)
    stranger = torch.zeros(4096, dtype=torch.uint8)  # host memory no one registered
    s, d, n = plan.descriptors()
    s[6] = stranger.data_ptr()
    _assert_rejected(backend, plan, (s, d, n), index=6, match=r"descriptor 6\b.*source.*not inside any known region")


@pytest.mark.hal_extension  # vLLM's op checks no address or size (csrc/cache_kernels.cu:114-126)
def test_swap_rejects_a_destination_outside_every_known_region(backend, memory):
    _, dst, plan = _bad_batch_setup(memory, backend)
    s, d, n = plan.descriptors()
    d[3] = dst.address - 16  # inside the canary band before the pool: allocated, but no region
    _assert_rejected(backend, plan, (s, d, n), index=3, match=r"descriptor 3\b.*destination")


@pytest.mark.hal_extension  # vLLM's op checks no address or size (csrc/cache_kernels.cu:114-126)
def test_swap_rejects_a_destination_straddling_its_region_end_by_one_byte(backend, memory):
    _, dst, plan = _bad_batch_setup(memory, backend)
    s, d, n = plan.descriptors()
    d[7] = dst.address + dst.size - int(n[7]) + 1
    _assert_rejected(backend, plan, (s, d, n), index=7, match=r"descriptor 7\b.*destination.*past the end.*by 1 bytes")


@pytest.mark.hal_extension  # vLLM's op checks no address or size (csrc/cache_kernels.cu:114-126)
def test_swap_rejects_a_source_straddling_its_region_end(backend, memory):
    src, _, plan = _bad_batch_setup(memory, backend)
    s, d, n = plan.descriptors()
    s[4] = src.address + src.size - 100
    _assert_rejected(backend, plan, (s, d, n), index=4, match=r"descriptor 4\b.*source.*past the end")


@pytest.mark.hal_extension  # vLLM's op checks no address or size (csrc/cache_kernels.cu:114-126)
def test_swap_rejects_a_range_that_overflows_the_address_space(backend, memory):
    src, _, plan = _bad_batch_setup(memory, backend)
    s, d, n = plan.descriptors()
    s[2] = src.address
    n[2] = (1 << 63) - 1 - src.address + 1000  # address + size wraps past int64
    _assert_rejected(backend, plan, (s, d, n), index=2, match=r"descriptor 2\b")


@pytest.mark.hal_extension  # vLLM's op checks no address or size (csrc/cache_kernels.cu:114-126)
def test_swap_names_the_first_of_several_bad_descriptors(backend, memory):
    _, _, plan = _bad_batch_setup(memory, backend)
    s, d, n = plan.descriptors()
    n[6] = -1
    s[2] = 4096  # the zero page: never a known region
    _assert_rejected(backend, plan, (s, d, n), index=2, match=r"descriptor 2\b")


@pytest.mark.hal_extension  # vLLM's op checks no address or size (csrc/cache_kernels.cu:114-126)
def test_swap_rejects_a_bad_last_descriptor_of_a_chunked_batch_before_copying_any_chunk(backend, memory, capabilities):
    cap = capabilities.max_batch_descriptors or 8192
    count = min(cap + 1, 400_000) if cap < 400_000 else 8193
    block = 8
    src, dst = _ends(memory, backend, "device_to_host", count * block, seed=37)
    plan = _permuted_blocks(src, dst, count, block, seed=37)
    s, d, n = plan.descriptors()
    d[count - 1] = dst.address + dst.size  # one past the end, 8 bytes
    _assert_rejected(backend, plan, (s, d, n), index=count - 1, match=rf"descriptor {count - 1}\b.*destination")


@pytest.mark.hal_extension  # vLLM's op checks no address or size (csrc/cache_kernels.cu:114-126)
def test_swap_rejects_a_region_after_it_was_unpinned(backend, memory):
    (cache,) = memory.enter_context(device_caches(backend, 1, 8192))
    with pinned_host_pool(backend, 8192, label="released pool") as pool:
        address = pool.address
    cache.fill(random_bytes(cache.size, 41))
    plan = SwapPlan()
    plan.add_many(cache, torch.tensor([0]), cache, torch.tensor([4096]), torch.tensor([16]))
    s = torch.tensor([cache.address])
    d = torch.tensor([address])
    _assert_rejected(
        backend,
        plan,
        (s, d, torch.tensor([16])),
        index=0,
        match=r"descriptor 0\b.*destination.*not inside any known region",
    )


# ------------------------------------------------------------------------------------------ generated
@st.composite
def _batches(draw):
    count = draw(st.integers(0, 48))
    sizes = draw(st.lists(st.integers(0, 3000), min_size=count, max_size=count))
    order = draw(st.permutations(range(count)))
    to_host = draw(st.booleans())
    shift = draw(st.integers(0, 95))
    return sizes, list(order), to_host, shift


def test_swap_generated_batches_copy_exactly(backend, memory):
    slot = 3096
    (cache,) = memory.enter_context(device_caches(backend, 1, 48 * slot + 96))
    pool = memory.enter_context(pinned_host_pool(backend, 48 * slot + 96))

    @GENERATED
    @given(_batches())
    def check(case):
        sizes, order, to_host, shift = case
        src, dst = (cache, pool) if to_host else (pool, cache)
        src.fill(random_bytes(src.size, len(sizes) + shift))
        plan = SwapPlan()
        count = len(sizes)
        plan.add_many(
            src,
            torch.arange(count) * slot + shift,
            dst,
            torch.tensor(order, dtype=torch.int64) * slot + (95 - shift),
            torch.tensor(sizes, dtype=torch.int64),
        )
        _swap_and_check(backend, plan)

    check()


@st.composite
def _bad_batches(draw):
    count = draw(st.integers(1, 40))
    bad = draw(st.integers(0, count - 1))
    kind = draw(st.sampled_from(["negative", "src_outside", "dst_outside", "src_straddle", "dst_straddle"]))
    return count, bad, kind


@pytest.mark.hal_extension  # vLLM's op checks no address or size (csrc/cache_kernels.cu:114-126)
def test_swap_generated_bad_descriptor_is_named_and_nothing_copied(backend, memory):
    block = 512
    src, dst = _ends(memory, backend, "device_to_host", 40 * block, seed=47)

    @GENERATED
    @given(_bad_batches())
    def check(case):
        count, bad, kind = case
        plan = _permuted_blocks(src, dst, count, block, seed=count)
        s, d, n = plan.descriptors()
        if kind == "negative":
            n[bad] = -1
        elif kind == "src_outside":
            s[bad] = src.address - 64
        elif kind == "dst_outside":
            d[bad] = dst.address + dst.size + 64
        elif kind == "src_straddle":
            s[bad] = src.address + src.size - block + 1
        else:
            d[bad] = dst.address + dst.size - 1
        _assert_rejected(backend, plan, (s, d, n), index=bad, match=rf"descriptor {bad}\b")

    check()
