"""Graph capture: ``is_current_stream_capturing`` is False outside, True inside and False after; captured
swaps and gathers run only on replay, in order, and replay correctly again on new data; an operation
that cannot be captured raises ``CaptureMisuseError`` and the capture still completes."""

from __future__ import annotations

import pytest
import torch

from hisparse_hal.conformance.arenas import allocate_guarded, device_caches, pinned_host_pool, random_bytes, synchronize
from hisparse_hal.conformance.swap_plan import SwapPlan
from hisparse_hal.errors import CaptureMisuseError, InvalidDescriptorError

#: This tier (read by conformance/tiers.py, without importing this module): its area, its place in the
#: run and its title in the reports.
AREA = "capture"
ORDER = 80
TITLE = "Graph capture"

needs_capture = pytest.mark.needs("graph_capture")


def _pair(memory, backend, size: int, seed: int):
    (cache,) = memory.enter_context(device_caches(backend, 1, size))
    pool = memory.enter_context(pinned_host_pool(backend, size))
    cache.fill(random_bytes(cache.size, seed))
    pool.fill(random_bytes(pool.size, seed + 1))
    return cache, pool


def _plan(src, dst, count: int, block: int) -> SwapPlan:
    plan = SwapPlan()
    plan.add_many(
        src, torch.arange(count) * block, dst, torch.arange(count).flip(0) * block, torch.full((count,), block)
    )
    return plan


def test_is_current_stream_capturing_is_false_outside_any_capture(backend):
    assert backend.is_current_stream_capturing() is False
    assert backend.is_current_stream_capturing() is False


@needs_capture
def test_capturing_is_true_inside_a_capture_and_false_after(backend):
    assert backend.is_current_stream_capturing() is False
    with backend.capture() as graph:
        assert backend.is_current_stream_capturing() is True
    assert backend.is_current_stream_capturing() is False
    graph.replay()  # an empty capture replays
    assert backend.is_current_stream_capturing() is False


@needs_capture
def test_capturing_is_false_after_a_capture_block_raises(backend):
    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with backend.capture():
            assert backend.is_current_stream_capturing() is True
            raise Boom()
    assert backend.is_current_stream_capturing() is False
    with backend.capture():  # and a new capture can start
        assert backend.is_current_stream_capturing() is True
    assert backend.is_current_stream_capturing() is False


@needs_capture
def test_captured_swap_runs_only_on_replay_and_replays_twice(backend, memory):
    cache, pool = _pair(memory, backend, 64 * 656, 1)
    plan = _plan(cache, pool, 64, 656)
    untouched = plan.snapshot()
    s, d, n = plan.descriptors()
    with backend.capture() as graph:
        backend.swap_blocks_batch(s, d, n)
        s.fill_(cache.address), d.fill_(pool.address), n.fill_(1)  # descriptors are read at call time
    synchronize(backend.device)
    plan.assert_unchanged(untouched)  # nothing ran during the capture
    graph.replay()
    plan.assert_matches(plan.expected(untouched))
    cache.fill(random_bytes(cache.size, 2))  # new data in the same memory
    second = plan.snapshot()
    graph.replay()
    plan.assert_matches(plan.expected(second))


@needs_capture
def test_captured_gather_runs_only_on_replay_and_replays_twice(backend):
    source = random_bytes(8 * 4 * 96, 3).view(8, 4, 96).to(backend.device)
    ids = torch.tensor([5, -1, 31, 0, 12]).to(backend.device)
    destination = torch.zeros((5, 96), dtype=torch.uint8, device=backend.device)
    with backend.capture() as graph:
        backend.gather_resident_rows(source, destination, ids)
    synchronize(backend.device)
    assert bool((destination.to("cpu") == 0).all()), "a captured gather ran before replay"
    for round_ in range(2):
        if round_:
            source.copy_(random_bytes(source.numel(), 4).view(source.shape).to(backend.device))
        graph.replay()
        synchronize(backend.device)
        rows = source.to("cpu").view(32, 96)
        expected = rows[ids.to("cpu").clamp_min(0)]
        assert torch.equal(destination.to("cpu"), expected), f"replay {round_ + 1} gathered the wrong bytes"


@needs_capture
def test_captured_gather_reads_the_row_ids_written_in_place_before_each_replay(backend):
    """Capture by reference: engines capture once with a static id buffer and rewrite it every step."""
    source = random_bytes(8 * 4 * 96, 21).view(8, 4, 96).to(backend.device)
    ids = torch.zeros(6, dtype=torch.int64, device=backend.device)  # the static buffer the graph reads
    destination = torch.zeros((6, 96), dtype=torch.uint8, device=backend.device)
    with backend.capture() as graph:
        backend.gather_resident_rows(source, destination, ids)
    rows = source.to("cpu").view(32, 96)
    steps = [[5, -1, 31, 0, 12, 12], [31, 30, 29, 28, 27, 26], [-1, -1, 3, 3, 7, 1], [0, 1, 2, 3, 4, 5]]
    for step, written in enumerate(steps):
        ids.copy_(torch.tensor(written))  # in place: same storage the capture saw
        graph.replay()
        synchronize(backend.device)
        expected = rows[torch.tensor(written).clamp_min(0)]
        assert torch.equal(destination.to("cpu"), expected), (
            f"replay {step + 1} did not gather the ids written into the captured id tensor before it "
            f"(ids {written}); a captured gather must read its id buffer at replay time"
        )


@needs_capture
def test_captured_swap_keeps_its_descriptor_values_from_capture_time(backend, memory):
    """Swaps capture by value: rewriting the descriptor arrays after the capture changes no replay."""
    cache, pool = _pair(memory, backend, 64 * 656, 23)
    plan = _plan(cache, pool, 32, 656)  # the first 32 blocks only; the rest must stay untouched
    s, d, n = plan.descriptors()
    with backend.capture() as graph:
        backend.swap_blocks_batch(s, d, n)
    for step in range(3):
        s.add_(32 * 656), d.add_(32 * 656)  # the arrays now name the other half, or beyond it
        n.fill_(1 + step)
        cache.fill(random_bytes(cache.size, 24 + step))
        before = plan.snapshot()
        graph.replay()
        synchronize(backend.device)
        plan.assert_matches(plan.expected(before))  # exactly the capture-time copies; nothing else moved


@pytest.mark.smoke
@needs_capture
def test_captured_swap_and_gather_replay_in_order(backend, memory):
    """Replay a captured host-to-device swap, then a gather that reads what the swap wrote."""
    block, count = 96, 32
    cache, pool = _pair(memory, backend, block * count, 5)
    plan = _plan(pool, cache, count, block)
    rows = cache.inner[: block * count].view(count, 1, block)  # the cache seen as [blocks, 1 row, row bytes]
    ids = torch.tensor([0, 31, 7, 7, -1]).to(backend.device)
    destination = torch.zeros((5, block), dtype=torch.uint8, device=backend.device)
    with backend.capture() as graph:
        backend.swap_blocks_batch(*plan.descriptors())
        backend.gather_resident_rows(rows, destination, ids)
    before = plan.snapshot()
    graph.replay()
    synchronize(backend.device)
    plan.assert_matches(plan.expected(before))
    swapped = cache.read().view(count, block)
    assert torch.equal(destination.to("cpu"), swapped[ids.to("cpu").clamp_min(0)]), (
        "the gather did not see the swap replayed before it"
    )


@pytest.mark.hal_extension
@needs_capture
def test_pin_inside_a_capture_raises_capture_misuse_and_the_capture_completes(backend, memory):
    cache, pool = _pair(memory, backend, 16 * 512, 6)
    first, second = _plan(cache, pool, 8, 512), SwapPlan()
    second.add_many(cache, torch.arange(8, 16) * 512, pool, torch.arange(8, 16) * 512, torch.full((8,), 512))
    stranger = allocate_guarded(4096, torch.device("cpu"), "pinned inside a capture", align=4096)
    untouched = first.snapshot()
    with backend.capture() as graph:
        backend.swap_blocks_batch(*first.descriptors())
        with pytest.raises(CaptureMisuseError, match=r"pin_tensor"):
            backend.pin_tensor(stranger.inner)
        assert backend.is_current_stream_capturing() is True, "a refused operation must not end the capture"
        backend.swap_blocks_batch(*second.descriptors())
    assert not [r for r in backend.pinned_registrations() if r.address == stranger.address], (
        "the refused pin registered memory"
    )
    synchronize(backend.device)
    first.assert_unchanged(untouched)
    graph.replay()
    both = SwapPlan()
    both.add_many(
        cache,
        torch.arange(16) * 512,
        pool,
        torch.cat([torch.arange(8).flip(0), torch.arange(8, 16)]) * 512,
        torch.full((16,), 512),
    )
    both.assert_matches(both.expected(untouched))


@pytest.mark.hal_extension  # hisparse-hal's capture() and CaptureMisuseError
@needs_capture
@pytest.mark.needs("ipc_events")
def test_create_ipc_event_inside_a_capture_raises_capture_misuse(backend):
    with backend.capture() as graph:
        with pytest.raises(CaptureMisuseError, match=r"create_ipc_event"):
            backend.create_ipc_event()
        assert backend.is_current_stream_capturing() is True
    graph.replay()
    assert backend.is_current_stream_capturing() is False


@pytest.mark.hal_extension  # hisparse-hal's capture() and CaptureMisuseError
@needs_capture
def test_nested_capture_raises_capture_misuse_and_the_outer_capture_completes(backend, memory):
    cache, pool = _pair(memory, backend, 8 * 256, 7)
    plan = _plan(cache, pool, 8, 256)
    untouched = plan.snapshot()
    with backend.capture() as graph:
        with pytest.raises(CaptureMisuseError):
            with backend.capture():
                pass
        assert backend.is_current_stream_capturing() is True
        backend.swap_blocks_batch(*plan.descriptors())
    assert backend.is_current_stream_capturing() is False
    graph.replay()
    plan.assert_matches(plan.expected(untouched))


@pytest.mark.hal_extension  # hisparse-hal's capture() and CaptureMisuseError
@needs_capture
def test_replay_before_the_capture_ends_raises_capture_misuse(backend):
    with backend.capture() as graph:
        with pytest.raises(CaptureMisuseError):
            graph.replay()
        assert backend.is_current_stream_capturing() is True
    graph.replay()


@pytest.mark.hal_extension  # a region check: vLLM's op checks no address (csrc/cache_kernels.cu:114-126)
@needs_capture
def test_a_bad_swap_inside_a_capture_is_rejected_at_call_time_and_the_capture_completes(backend, memory):
    cache, pool = _pair(memory, backend, 8 * 256, 8)
    plan = _plan(cache, pool, 8, 256)
    untouched = plan.snapshot()
    s, d, n = plan.descriptors()
    bad = d.clone()
    bad[4] = pool.address + pool.size  # one past the end
    with backend.capture() as graph:
        with pytest.raises(InvalidDescriptorError, match=r"descriptor 4\b") as info:
            backend.swap_blocks_batch(s, bad, n)
        assert info.value.index == 4
        backend.swap_blocks_batch(s, d, n)
    graph.replay()
    plan.assert_matches(plan.expected(untouched))
