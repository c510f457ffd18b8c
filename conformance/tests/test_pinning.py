"""Pinning: a host tensor is registered whole (in bounded chunks that end on page and block boundaries),
becomes a swap region, and is released whole; a failed chunk rolls every earlier chunk back, leaving
nothing registered; misuse is a typed error that changes nothing. Under the vLLM contract (no registration records
among vLLM's 14 members, and swaps of raw pointers), a pinned tensor is one whose bytes a swap reads, and a released
one is one ``unpin_tensor`` refuses with a RuntimeError (what vLLM catches, runtime.py:372-374); misuse is refused
where ``cudaHostRegister``/``cudaHostUnregister`` refuse it (vllm/utils/host_memory.py:13-26)."""

from __future__ import annotations

import mmap

import pytest
import torch

from hisparse_hal.backend import HiSparseBackend
from hisparse_hal.conformance.arenas import (
    allocate_guarded,
    device_caches,
    pinned_host_pool,
    random_bytes,
    synchronize,
)
from hisparse_hal.conformance.contracts import VLLM_034_CONTRACT, contract_of_backend, refused, typed_refusals
from hisparse_hal.conformance.swap_plan import SwapPlan
from hisparse_hal.errors import DeviceRuntimeError, InvalidArgumentError, InvalidDescriptorError
from hisparse_hal.host_registration import plan_host_chunks

#: This tier (read by conformance/tiers.py, without importing this module): its area, its place in the
#: run and its title in the reports.
AREA = "pinning"
ORDER = 50
TITLE = "Pinning"

PAGE = mmap.PAGESIZE


def _host(size: int, label: str = "host tensor"):
    return allocate_guarded(size, torch.device("cpu"), label, align=PAGE)


def _regions_touching(backend, address: int, size: int) -> list:
    return [r for r in backend.regions if r.start < address + size and address < r.end]


def _has_records(backend) -> bool:
    """Whether the backend keeps hisparse-hal's registration records (not part of vLLM's contract)."""
    return isinstance(backend, HiSparseBackend)


def _swap_reaches(backend, tensor: torch.Tensor, offset: int = 0) -> bool:
    """Whether a one-byte swap out of ``tensor`` at ``offset`` into a device cache is accepted (it reads the tensor)."""
    refusal = InvalidDescriptorError if typed_refusals(backend) else Exception  # vLLM's: any exception
    with device_caches(backend, 1, 64, "pin probe") as (cache,):
        try:
            backend.swap_blocks_batch(torch.tensor([tensor.data_ptr() + offset]), torch.tensor([cache.address]),
                                      torch.tensor([1]))
        except refusal:
            return False
        synchronize(backend.device)
    return True


def _assert_not_pinned(backend, tensor: torch.Tensor) -> None:
    address, size = tensor.data_ptr(), tensor.numel() * tensor.element_size()
    if contract_of_backend(backend) is VLLM_034_CONTRACT:  # released: unpin_tensor refuses it (a RuntimeError)
        try:
            backend.unpin_tensor(tensor)
        except RuntimeError:
            return
        raise AssertionError("unpin_tensor of the released tensor was still accepted: it was still pinned")
    if not _has_records(backend):
        assert not _swap_reaches(backend, tensor), "a swap out of the unpinned tensor is still accepted"
        assert not _swap_reaches(backend, tensor, size - 1), "a swap out of the unpinned tensor is still accepted"
        return
    with pytest.raises(InvalidArgumentError, match="not pinned"):
        backend.host_registration(tensor)
    assert not [r for r in backend.pinned_registrations() if r.address == address], "a registration record remains"
    assert not _regions_touching(backend, address, size), "a swap region over the tensor remains"


def _assert_pinned_whole(backend, tensor: torch.Tensor) -> None:
    size = tensor.numel() * tensor.element_size()
    if not _has_records(backend):
        assert _swap_reaches(backend, tensor) and _swap_reaches(backend, tensor, size - 1), (
            "a pinned tensor must be a swap region, first byte to last"
        )
        return
    record = backend.host_registration(tensor)
    assert record.address == tensor.data_ptr() and record.size == size
    assert isinstance(record.page_locked, bool)
    assert record in backend.pinned_registrations()
    covered = sum(chunk.size for chunk in record.chunks)
    assert covered == record.size and record.chunks[0].address == record.address
    assert _regions_touching(backend, record.address, record.size), "a pinned tensor must be a swap region"


@pytest.mark.smoke
def test_pin_and_unpin_round_trip(backend):
    arena = _host(64 * PAGE)
    tensor = arena.inner.view(64, PAGE)
    backend.pin_tensor(tensor)
    try:
        _assert_pinned_whole(backend, tensor)
    finally:
        backend.unpin_tensor(tensor)
    _assert_not_pinned(backend, tensor)
    backend.pin_tensor(tensor)  # a released tensor can be pinned again
    backend.unpin_tensor(tensor)
    _assert_not_pinned(backend, tensor)
    arena.assert_canaries_intact()


def test_pinned_tensor_keeps_its_contents(backend):
    arena = _host(16 * PAGE)
    data = random_bytes(arena.size, 1)
    arena.fill(data)
    backend.pin_tensor(arena.inner)
    try:
        assert torch.equal(arena.inner, data), "pinning must not change the tensor's bytes"
    finally:
        backend.unpin_tensor(arena.inner)
    assert torch.equal(arena.inner, data), "unpinning must not change the tensor's bytes"
    arena.assert_canaries_intact()


def test_pin_of_an_already_pinned_tensor_is_rejected_and_changes_nothing(backend):
    arena = _host(8 * PAGE)
    backend.pin_tensor(arena.inner)
    try:
        record = backend.host_registration(arena.inner) if _has_records(backend) else None
        with refused(backend, InvalidArgumentError, match="already pinned"):
            backend.pin_tensor(arena.inner)
        if record is None:
            assert _swap_reaches(backend, arena.inner), "the refused second pin unpinned the tensor"
        else:
            assert backend.host_registration(arena.inner) == record
            assert sum(1 for r in backend.pinned_registrations() if r.address == arena.address) == 1
    finally:
        backend.unpin_tensor(arena.inner)
    _assert_not_pinned(backend, arena.inner)
    with refused(backend, InvalidArgumentError, match="not pinned", vllm_error=RuntimeError):
        backend.unpin_tensor(arena.inner)  # the double pin must not have left a second registration


def test_pin_of_a_tensor_overlapping_a_pinned_one_is_rejected(backend):
    arena = _host(8 * PAGE)
    backend.pin_tensor(arena.inner[: 4 * PAGE])
    try:
        with refused(backend, InvalidArgumentError, match="overlaps"):
            backend.pin_tensor(arena.inner[2 * PAGE : 6 * PAGE])
        _assert_not_pinned(backend, arena.inner[4 * PAGE :])
    finally:
        backend.unpin_tensor(arena.inner[: 4 * PAGE])


def test_unpin_of_a_tensor_never_pinned_is_rejected(backend):
    tensor = torch.zeros(4 * PAGE, dtype=torch.uint8)
    with pytest.raises((RuntimeError, ValueError)) as raised:
        backend.unpin_tensor(tensor)
    assert isinstance(raised.value, RuntimeError), (
        f"unpin_tensor failed with {type(raised.value).__name__}, not a RuntimeError: vLLM releases its host pools "
        "catching only RuntimeError (vllm/v1/hisparse/runtime.py:372-374)"
    )
    if typed_refusals(backend):
        assert isinstance(raised.value, InvalidArgumentError) and "not pinned" in str(raised.value), raised.value


def test_unpin_of_a_view_of_a_pinned_tensor_is_rejected_and_keeps_the_pin(backend):
    arena = _host(8 * PAGE)
    backend.pin_tensor(arena.inner)
    try:
        with refused(backend, InvalidArgumentError, match=r"not pinned", vllm_error=RuntimeError):
            backend.unpin_tensor(arena.inner[PAGE:])
        if _has_records(backend):
            assert backend.host_registration(arena.inner).size == 8 * PAGE
        else:
            assert _swap_reaches(backend, arena.inner) and _swap_reaches(backend, arena.inner, 8 * PAGE - 1)
    finally:
        backend.unpin_tensor(arena.inner)


@pytest.mark.parametrize(
    "make,match",
    [
        pytest.param(lambda: torch.zeros(64, 64, dtype=torch.uint8).t(), r"contiguous",
                     marks=pytest.mark.hal_extension),  # cudaHostRegister takes data_ptr and nbytes, any layout
        (lambda: torch.zeros(0, dtype=torch.uint8), r"empty"),
        (lambda: torch.empty(64, dtype=torch.uint8, device="meta"), r"host memory.*meta"),
        (lambda: bytearray(64), r"torch.Tensor.*bytearray"),
    ],
    ids=["non_contiguous", "empty", "not_host", "not_a_tensor"],
)
def test_pin_rejects_what_cannot_be_pinned(backend, make, match):
    value = make()
    before = backend.pinned_registrations() if _has_records(backend) else None
    with refused(backend, InvalidArgumentError, match=match):
        backend.pin_tensor(value)
    if before is not None:
        assert backend.pinned_registrations() == before


def test_pin_of_a_device_tensor_is_rejected(backend):
    if backend.device.type == "cpu":
        pytest.skip("the backend's device is host memory, so a device tensor is a host tensor")
    tensor = torch.zeros(PAGE, dtype=torch.uint8, device=backend.device)
    with refused(backend, InvalidArgumentError, match=r"host memory"):
        backend.pin_tensor(tensor)


@pytest.mark.hal_extension
def test_registration_records_a_device_alias_exactly_when_the_backend_needs_one(backend, capabilities):
    arena = _host(4 * PAGE)
    backend.pin_tensor(arena.inner)
    try:
        record = backend.host_registration(arena.inner)
        regions = _regions_touching(backend, record.address, record.size)
        if capabilities.host_pointer_alias:
            assert record.device_alias is not None, "host_pointer_alias is declared, but the record has no device alias"
            assert all(chunk.device_alias is not None for chunk in record.chunks), "a chunk lacks its device alias"
            assert record.device_alias == record.chunks[0].device_alias
            assert all(r.device_alias is not None for r in regions), "a pinned region lacks its device alias"
        else:
            assert record.device_alias is None, "host_pointer_alias is False, but the record carries an alias"
            assert all(chunk.device_alias is None for chunk in record.chunks)
    finally:
        backend.unpin_tensor(arena.inner)


# ------------------------------------------------------------------------------------------ chunks
@pytest.mark.hal_extension
def test_pin_registers_in_chunks_that_end_on_page_and_block_boundaries(backend, monkeypatch):
    block, blocks = 3 * PAGE // 2, 40  # a block of one and a half pages: chunk ends need both boundaries
    monkeypatch.setattr(backend, "host_chunk_bytes", 7 * PAGE)
    arena = _host(block * blocks)
    tensor = arena.inner.view(blocks, block)
    backend.pin_tensor(tensor)
    try:
        record = backend.host_registration(tensor)
        planned = plan_host_chunks(tensor.data_ptr(), block * blocks, block, 7 * PAGE)
        assert [(c.address, c.size) for c in record.chunks] == planned
        assert len(record.chunks) > 2
        for chunk in record.chunks[:-1]:
            offset = chunk.address + chunk.size - record.address
            assert offset % PAGE == 0 and offset % block == 0, (
                f"chunk ends at offset {offset}, not on a page and block boundary"
            )
            assert chunk.size <= 7 * PAGE
    finally:
        backend.unpin_tensor(tensor)
    _assert_not_pinned(backend, tensor)


@pytest.mark.hal_extension
def test_swaps_reach_every_block_of_a_chunked_pool(backend, memory, monkeypatch):
    block, blocks = 3 * PAGE // 2, 24
    monkeypatch.setattr(backend, "host_chunk_bytes", 5 * PAGE)
    (cache,) = memory.enter_context(device_caches(backend, 1, block * blocks))
    pool = memory.enter_context(pinned_host_pool(backend, block * blocks, block_bytes=block))
    assert len(backend.host_registration(pool.pinned).chunks) > 1
    cache.fill(random_bytes(cache.size, 2))
    pool.fill(random_bytes(pool.size, 3))
    plan = SwapPlan()
    plan.add_many(
        cache, torch.arange(blocks) * block, pool, torch.arange(blocks).flip(0) * block, torch.full((blocks,), block)
    )
    before = plan.snapshot()
    expected = plan.expected(before)
    backend.swap_blocks_batch(*plan.descriptors())
    plan.assert_matches(expected)


@pytest.mark.hal_extension
def test_swap_spanning_two_registration_chunks_is_rejected(backend, memory, monkeypatch):
    """One descriptor must not span two host registrations (the batch copy rejects it; vendor-facts.md)."""
    block, blocks = PAGE, 8
    monkeypatch.setattr(backend, "host_chunk_bytes", 2 * PAGE)
    (cache,) = memory.enter_context(device_caches(backend, 1, 4 * PAGE))
    pool = memory.enter_context(pinned_host_pool(backend, block * blocks, block_bytes=block))
    first = backend.host_registration(pool.pinned).chunks[0]
    plan = SwapPlan()
    plan.add_many(cache, torch.tensor([0]), pool, torch.tensor([0]), torch.tensor([16]))
    before = plan.snapshot()
    s = torch.tensor([cache.address])
    d = torch.tensor([first.address + first.size - 8])
    with pytest.raises(InvalidDescriptorError, match=r"descriptor 0\b.*destination.*past the end") as info:
        backend.swap_blocks_batch(s, d, torch.tensor([16]))
    assert info.value.index == 0
    plan.assert_unchanged(before)


class _ChunkFault:
    """Wraps the backend's chunk hooks: chunk ``fail_at`` raises; every call is recorded."""

    def __init__(self, backend, fail_at: int) -> None:
        self.fail_at = fail_at
        self.registered: list[tuple[int, int, int]] = []
        self.unregistered: list[tuple[int, int]] = []
        self._register = backend._register_host_chunk
        self._unregister = backend._unregister_host_chunk

    def register(self, address: int, size: int, index: int):
        if index == self.fail_at:
            raise DeviceRuntimeError("hostRegister", 2, "ERROR_OUT_OF_MEMORY", f"injected failure of chunk {index}")
        alias = self._register(address, size, index)
        self.registered.append((address, size, index))
        return alias

    def unregister(self, address: int, size: int) -> None:
        self.unregistered.append((address, size))
        self._unregister(address, size)


@pytest.mark.hal_extension
@pytest.mark.parametrize("fail_at", [0, 1, 3])
def test_pin_rolls_back_every_registered_chunk_when_one_fails(backend, monkeypatch, fail_at):
    block, blocks = PAGE, 16
    monkeypatch.setattr(backend, "host_chunk_bytes", 4 * PAGE)
    fault = _ChunkFault(backend, fail_at)
    monkeypatch.setattr(backend, "_register_host_chunk", fault.register)
    monkeypatch.setattr(backend, "_unregister_host_chunk", fault.unregister)
    arena = _host(block * blocks)
    tensor = arena.inner.view(blocks, block)
    before = backend.pinned_registrations()
    with pytest.raises(DeviceRuntimeError, match=f"injected failure of chunk {fail_at}"):
        backend.pin_tensor(tensor)
    assert [i for _, _, i in fault.registered] == list(range(fail_at)), "chunks must be registered in order"
    assert fault.unregistered == [(a, s) for a, s, _ in reversed(fault.registered)], (
        "every registered chunk must be released, in reverse order"
    )
    assert backend.pinned_registrations() == before
    _assert_not_pinned(backend, tensor)
    monkeypatch.undo()
    backend.pin_tensor(tensor)  # the vendor's own state was rolled back too: pinning again works
    try:
        assert len(backend.host_registration(tensor).chunks) == 1
    finally:
        backend.unpin_tensor(tensor)
    _assert_not_pinned(backend, tensor)


@pytest.mark.hal_extension
def test_unpin_releases_every_chunk_in_reverse_order(backend, monkeypatch):
    block, blocks = PAGE, 12
    monkeypatch.setattr(backend, "host_chunk_bytes", 4 * PAGE)
    fault = _ChunkFault(backend, fail_at=-1)
    monkeypatch.setattr(backend, "_register_host_chunk", fault.register)
    monkeypatch.setattr(backend, "_unregister_host_chunk", fault.unregister)
    arena = _host(block * blocks)
    tensor = arena.inner.view(blocks, block)
    backend.pin_tensor(tensor)
    backend.unpin_tensor(tensor)
    assert len(fault.registered) == 3
    assert fault.unregistered == [(a, s) for a, s, _ in reversed(fault.registered)]
    _assert_not_pinned(backend, tensor)
