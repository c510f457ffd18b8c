"""Pinned memory stays its tensor's (issue 30 items 1, 6, 7, 8, 11): storage held while pinned, moved memory
refused and released, every chunk released on unpin, read-only memory refused, linear chunked pinning, page
locks counted across backends, unpin/unregister ordered after queued copies. CPU device and both simulators."""

from __future__ import annotations

import contextlib
import errno
import mmap
import warnings
from collections.abc import Callable, Iterator

import pytest
import torch

from hisparse_hal import regions as regions_module
from hisparse_hal.errors import DeviceRuntimeError, InvalidArgumentError, InvalidDescriptorError
from hisparse_hal.testing.sim_cuda_driver import SimulatedCudaDriver
from hisparse_hal.testing.sim_hip_runtime import SimulatedHipRuntime, simulated_rocm_backend
from hisparse_hal.vendors.cpu.backend import CpuBackend
from hisparse_hal.vendors.cpu.runtime import PageLocker
from hisparse_hal.vendors.cuda.backend import CudaBackend
from hisparse_hal.vendors.cuda.runtime import CudaDriver

PAGE = mmap.PAGESIZE
CANARY = 0xA5


def _i64(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def _canaried(nbytes: int, fill: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A buffer of ``nbytes`` filled with ``fill`` between 64 canary bytes each side: (whole, inner view)."""
    whole = torch.full((nbytes + 128,), CANARY, dtype=torch.uint8)
    inner = whole[64:64 + nbytes]
    inner.fill_(fill)
    return whole, inner


def _source(backend, fill: int = 0x3C) -> tuple[torch.Tensor, torch.Tensor]:
    """A canaried page of ``fill`` registered as an explicit region: (whole buffer, the page)."""
    whole, page = _canaried(PAGE, fill)
    backend.register_region(page.data_ptr(), PAGE, "source")
    return whole, page


def _state(backend) -> tuple:
    return (tuple(backend.regions), backend.pinned_registrations())


def _rocm(**options: object):
    sim = SimulatedHipRuntime("7.14", **options)  # type: ignore[arg-type]
    return simulated_rocm_backend(sim), sim


class _SimCuda(CudaBackend):
    def _current_stream_handle(self) -> int:
        return 0x7000

    def is_current_stream_capturing(self) -> bool:
        return False


def _cuda(**options: object):
    sim = SimulatedCudaDriver(12080, **options)  # type: ignore[arg-type]
    backend = _SimCuda.for_device(0, 12080, "sm_90", runtime=CudaDriver(0, sim), device=torch.device("cpu"))
    return backend, sim


# ----------------------------------------------------------------------------- item 1: stale regions
def test_a_pinned_tensor_dropped_without_unpin_keeps_its_memory_so_no_allocation_lands_there():
    backend = CpuBackend()
    pool = torch.zeros(PAGE, dtype=torch.uint8)
    address = pool.data_ptr()
    backend.pin_tensor(pool)
    del pool  # the reproducer: freed without unpin_tensor
    others = [torch.full((PAGE,), 7, dtype=torch.uint8) for _ in range(64)]  # same size: the allocator's reuse
    assert all(other.data_ptr() != address for other in others)
    whole, source = _source(backend)
    backend.swap_blocks_batch(_i64(source.data_ptr()), _i64(address), _i64(PAGE))  # into memory the pin holds
    assert all(bool((other == 7).all()) for other in others)
    assert bool((whole[:64] == CANARY).all()) and bool((whole[-64:] == CANARY).all())
    assert len(backend.pinned_registrations()) == 1


@pytest.mark.parametrize("move", ["resize_", "set_", "storage_resize"])
def test_a_swap_into_memory_the_pinned_tensor_left_is_refused_naming_the_region_and_releases_it(move):
    backend = CpuBackend()
    pool = torch.zeros(PAGE, dtype=torch.uint8)
    address = pool.data_ptr()
    backend.pin_tensor(pool)
    whole, source = _source(backend)  # registered before the move: a registration would release the stale pin
    if move == "resize_":
        pool.resize_(64 << 20)  # a new allocation: the old bytes go back to the allocator
    elif move == "set_":
        pool.set_(torch.zeros(PAGE, dtype=torch.uint8).untyped_storage())
    else:
        pool.untyped_storage().resize_(0)
    assert pool.data_ptr() != address or pool.untyped_storage().nbytes() == 0
    after = pool.clone() if pool.untyped_storage().nbytes() else None
    with pytest.raises(InvalidDescriptorError, match=(
        rf"swap descriptor 0 names region 'pinned host {address:#x} chunk 1/1' \[{address:#x}, "
        rf"{address + PAGE:#x}\), whose tensor's memory is no longer there \(.*\); its registration was released "
        "and nothing was copied"
    )) as info:
        backend.swap_blocks_batch(_i64(source.data_ptr()), _i64(address), _i64(PAGE))
    assert info.value.index == 0
    assert after is None or torch.equal(pool, after)
    assert bool((whole[:64] == CANARY).all()) and bool((whole[64:-64] == 0x3C).all())
    assert [r.label for r in backend.regions] == ["source"] and backend.pinned_registrations() == ()
    assert backend.page_locker.locked_ranges() == ()
    backend.unpin_tensor(pool)  # already released by the swap: a no-op, not an error vLLM would log
    assert backend.pinned_registrations() == ()


def test_unpin_after_resize_releases_the_old_range_and_the_address_can_be_pinned_again():
    backend, sim = _rocm()
    pool = torch.zeros(4, PAGE, dtype=torch.uint8)
    address = pool.data_ptr()
    backend.pin_tensor(pool)
    assert set(sim.registrations) == {address}
    pool.resize_(8 << 20)
    backend.unpin_tensor(pool)
    assert sim.registrations == {} and _state(backend) == ((), ())
    again = torch.zeros(4, PAGE, dtype=torch.uint8)
    backend.pin_tensor(again)
    backend.unpin_tensor(again)
    assert sim.registrations == {}


@pytest.mark.parametrize("make", [_rocm, _cuda], ids=["rocm-sim", "cuda-sim"])
def test_a_moved_pinned_tensor_releases_its_driver_registration_on_the_next_pin(make):
    backend, sim = make()
    pool = torch.zeros(4, PAGE, dtype=torch.uint8)
    address = pool.data_ptr()
    backend.pin_tensor(pool)
    pool.resize_(8 << 20)
    other = torch.zeros(2, PAGE, dtype=torch.uint8)
    backend.pin_tensor(other)  # the next call releases the stale pin: the old address is free again
    registered = set(sim.registrations) if hasattr(sim, "registrations") else set(sim.registered)
    assert registered == {other.data_ptr()}  # the old chunk is gone (other may even sit at the reused address)
    assert len(backend.regions) == 1 and backend.regions.find(address + 3 * PAGE) is None
    assert [r.address for r in backend.pinned_registrations()] == [other.data_ptr()]
    backend.unpin_tensor(pool)  # released already: no error
    backend.unpin_tensor(other)


def test_a_swap_into_a_moved_pin_on_the_rocm_simulator_is_refused_before_the_runtime_and_unregisters_it():
    backend, sim = _rocm()
    device = torch.full((PAGE,), 0x3C, dtype=torch.uint8)
    sim.adopt_device_memory(device, "cache")
    backend.register_region(device.data_ptr(), PAGE, "cache", device=backend.device)
    pool = torch.zeros(PAGE, dtype=torch.uint8)
    address = pool.data_ptr()
    backend.pin_tensor(pool)
    pool.resize_(64 << 20)
    copies = sim.calls["hipMemcpyBatchAsync"] + sim.calls["hipMemcpyAsync"]
    label = f"pinned host {address:#x} chunk 1/1"
    with pytest.raises(InvalidDescriptorError, match=rf"names region '{label}'.*nothing was"):
        backend.swap_blocks_batch(_i64(device.data_ptr()), _i64(address), _i64(PAGE))
    assert sim.calls["hipMemcpyBatchAsync"] + sim.calls["hipMemcpyAsync"] == copies and not sim.pending
    assert sim.registrations == {} and backend.pinned_registrations() == ()
    second = torch.zeros(PAGE, dtype=torch.uint8)
    backend.pin_tensor(second)
    second_address = second.data_ptr()
    second.resize_(64 << 20)
    with pytest.raises(InvalidArgumentError, match=rf"address {second_address:#x} \(index 0\) is not in a pinned host"):
        backend.device_address(second_address)  # kernels are never given a moved tensor's old address
    assert sim.registrations == {} and backend.pinned_registrations() == ()


def test_a_captured_swap_into_a_pin_that_moved_is_refused_at_replay_and_writes_nothing():
    backend = CpuBackend()
    pool = torch.zeros(PAGE, dtype=torch.uint8)
    address = pool.data_ptr()
    backend.pin_tensor(pool)
    whole, source = _source(backend)
    with backend.capture() as graph:
        backend.swap_blocks_batch(_i64(source.data_ptr()), _i64(address), _i64(PAGE))
    pool.resize_(64 << 20)
    with pytest.raises(InvalidDescriptorError, match=r"replay: a captured swap uses region 'pinned host .*released"):
        graph.replay()
    assert backend.pinned_registrations() == () and bool((whole[64:-64] == 0x3C).all())


# ----------------------------------------------------------------------------- item 6: unpin releases every chunk
@pytest.mark.parametrize("make,option", [(_rocm, "fail_unregister_on_calls"), (_cuda, "fail_unregister_calls")],
                         ids=["rocm-sim", "cuda-sim"])
def test_a_failed_chunk_release_keeps_that_chunk_tracked_releases_the_others_and_a_retry_finishes(make, option):
    backend, sim = make(**{option: {2}})
    backend.host_chunk_bytes = PAGE
    pool = torch.zeros(4, PAGE, dtype=torch.uint8)
    backend.pin_tensor(pool)
    chunks = [c.address for c in backend.host_registration(pool).chunks]

    def registered() -> set[int]:
        return set(sim.registrations) if hasattr(sim, "registrations") else set(sim.registered)

    assert registered() == set(chunks)
    with pytest.raises(DeviceRuntimeError, match="Unregister"):
        backend.unpin_tensor(pool)
    assert registered() == {chunks[2]}  # released in reverse: the 2nd call is chunk 3; every other one went
    assert _state(backend) == ((), ())  # no longer a swap region
    with pytest.raises(InvalidArgumentError, match="is already pinned; its release failed earlier: call unpin_tensor"):
        backend.pin_tensor(pool)
    backend.unpin_tensor(pool)  # the retry releases exactly the chunk left
    assert registered() == set()
    backend.pin_tensor(pool)
    backend.unpin_tensor(pool)
    assert registered() == set() and _state(backend) == ((), ())


# ----------------------------------------------------------------------------- item 7: read-only memory
def _read_only_tensor() -> tuple[mmap.mmap, torch.Tensor]:
    mapping = mmap.mmap(-1, 2 * PAGE, prot=mmap.PROT_READ)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch: "The given buffer is not writable"
        tensor = torch.frombuffer(mapping, dtype=torch.uint8)
    return mapping, tensor


@pytest.mark.parametrize("make", [CpuBackend, lambda: _rocm()[0]], ids=["cpu", "rocm-sim"])
def test_pinning_a_read_only_mapping_is_refused_and_registers_nothing(make):
    backend = make()
    _mapping, tensor = _read_only_tensor()
    before = bytes(tensor.numpy())
    with pytest.raises(InvalidArgumentError, match=(
        rf"pin_tensor: tensor \[{tensor.data_ptr():#x}, {tensor.data_ptr() + 2 * PAGE:#x}\) \(8192 bytes\) is not "
        r"writable host memory: .* is mapped r--s .*only writable memory can be registered"
    )):
        backend.pin_tensor(tensor)
    assert _state(backend) == ((), ()) and bytes(tensor.numpy()) == before


def test_registering_a_read_only_range_is_refused_and_registers_nothing():
    backend = CpuBackend()
    _mapping, tensor = _read_only_tensor()
    with pytest.raises(InvalidArgumentError, match=r"register_region: region 'ro' .* is not writable host memory"):
        backend.register_region(tensor.data_ptr(), 64, "ro")
    with pytest.raises(InvalidArgumentError, match=r"is not writable host memory: \[0x1000, 0x1040\) is not mapped"):
        backend.register_region(0x1000, 64, "nowhere")
    assert _state(backend) == ((), ())


# ----------------------------------------------------------------------------- item 8: linear pinning
def test_pinning_and_unpinning_many_chunks_rebuild_the_region_table_once_each(monkeypatch):
    builds: list[int] = []
    original = regions_module._TableView.build.__func__  # type: ignore[attr-defined]

    def counted(cls, regions):
        builds.append(len(regions))
        return original(cls, regions)

    backend = CpuBackend()
    backend.host_chunk_bytes = PAGE
    pool = torch.zeros(512, PAGE, dtype=torch.uint8)
    monkeypatch.setattr(regions_module._TableView, "build", classmethod(counted))
    backend.pin_tensor(pool)
    assert builds == [512] and len(backend.regions) == 512
    backend.unpin_tensor(pool)
    assert builds == [512, 0] and _state(backend) == ((), ())


def test_unregister_region_waits_for_a_delayed_swap_into_it():
    backend = CpuBackend()
    whole, staging = _canaried(PAGE, 0)
    _source_whole, source = _canaried(PAGE, 0x3C)
    region = backend.register_region(staging.data_ptr(), PAGE, "staging")
    backend.register_region(source.data_ptr(), PAGE, "source")
    backend.delay_next_swap(0.2)
    backend.swap_blocks_batch(_i64(source.data_ptr()), _i64(staging.data_ptr()), _i64(PAGE))
    backend.unregister_region(region)
    assert bool((staging == 0x3C).all()), "unregister_region returned before the delayed copy landed"
    assert bool((whole[:64] == CANARY).all()) and bool((whole[-64:] == CANARY).all())


def test_preparing_views_again_waits_for_a_delayed_swap_into_the_cache_it_replaces():
    from hisparse_hal import KVCacheConfig, LayerSpec

    backend = CpuBackend()
    config = KVCacheConfig("bf16", 4, 2, 64, (LayerSpec("layer"),))
    whole, cache = _canaried(config.layer_bytes, 0)
    backend.prepare_kv_cache_views(config, {"layer": cache}, {})
    _source_whole, source = _canaried(config.layer_bytes, 0x3C)
    backend.register_region(source.data_ptr(), source.numel(), "source")
    backend.delay_next_swap(0.2)
    backend.swap_blocks_batch(_i64(source.data_ptr()), _i64(cache.data_ptr()), _i64(config.layer_bytes))
    other = torch.zeros(config.layer_bytes, dtype=torch.uint8)
    backend.prepare_kv_cache_views(config, {"layer": other}, {})
    assert bool((cache == 0x3C).all()), "prepare_kv_cache_views returned before the delayed copy landed"
    assert bool((whole[:64] == CANARY).all()) and bool((whole[-64:] == CANARY).all())


def test_gpu_unpin_waits_for_a_queued_copy_into_the_pool_before_unregistering():
    backend, sim = _rocm()  # this simulator queues copies until synchronize, as a stream does
    device = torch.randint(0, 256, (4 * PAGE,), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    sim.adopt_device_memory(device, "cache")
    backend.register_region(device.data_ptr(), device.numel(), "cache", device=backend.device)
    pool = torch.zeros(4 * PAGE, dtype=torch.uint8)
    backend.pin_tensor(pool)
    backend.swap_blocks_batch(_i64(device.data_ptr()), _i64(pool.data_ptr()), _i64(4 * PAGE))
    assert sim.pending and not torch.equal(pool, device)
    backend.unpin_tensor(pool)
    assert not sim.pending and torch.equal(pool, device) and sim.registrations == {}


# ----------------------------------------------------------------------------- item 11: page locks per process
def _recorder(calls: list[tuple[str, int, int]], name: str, result: int = 0) -> Callable[[int, int], int]:
    def call(address: int, size: int) -> int:
        calls.append((name, address, size))
        return result
    return call


def _lockers(count: int) -> tuple[list[PageLocker], list[tuple[str, int, int]]]:
    calls: list[tuple[str, int, int]] = []
    lockers = [PageLocker() for _ in range(count)]
    for locker in lockers:
        locker.mlock = _recorder(calls, "mlock")
        locker.munlock = _recorder(calls, "munlock")
    return lockers, calls


def test_two_backends_sharing_a_page_the_second_unlock_keeps_the_first_ones_page_locked():
    (first, second), calls = _lockers(2)
    base = 0x7E0000000000
    assert first.lock(base + 100, PAGE)  # pages base and base + PAGE
    assert second.lock(base + PAGE + 200, 2 * PAGE)  # pages base + PAGE .. base + 3 PAGE
    second.unlock(base + PAGE + 200, 2 * PAGE)
    assert calls[-1] == ("munlock", base + 2 * PAGE, 2 * PAGE)  # the shared page stays locked for `first`
    first.unlock(base + 100, PAGE)
    assert calls[-1] == ("munlock", base, 2 * PAGE)
    assert first.locked_ranges() == () and second.locked_ranges() == ()


def test_two_backends_pinning_the_same_range_unlock_it_only_when_both_let_go():
    (first, second), calls = _lockers(2)
    base = 0x7E0000100000
    assert first.lock(base, 4 * PAGE) and second.lock(base, 4 * PAGE)
    first.unlock(base, 4 * PAGE)
    assert [c for c in calls if c[0] == "munlock"] == []
    second.unlock(base, 4 * PAGE)
    assert calls[-1] == ("munlock", base, 4 * PAGE)


def test_a_refused_lock_undoes_only_pages_no_other_backend_holds():
    (first, second), calls = _lockers(2)
    base = 0x7E0000200000
    assert first.lock(base, 2 * PAGE)
    second.mlock = _recorder(calls, "mlock", errno.ENOMEM)
    assert not second.lock(base + PAGE, 3 * PAGE)
    assert calls[-1] == ("munlock", base + 2 * PAGE, 2 * PAGE)
    first.unlock(base, 2 * PAGE)


def test_a_gpu_graph_capturing_a_swap_into_a_pin_that_moved_refuses_to_replay(monkeypatch):
    backend, sim = _rocm(run_copies_immediately=True)
    assert backend.capabilities.graph_capture
    replays: list[int] = []

    class FakeGraph:  # the device module's graph (torch.cuda.CUDAGraph's face); the simulator copies at capture
        def replay(self) -> None:
            replays.append(1)

    @contextlib.contextmanager
    def fake_graph_capture(graph: FakeGraph) -> Iterator[None]:
        backend.simulated_capturing = True
        try:
            yield
        finally:
            backend.simulated_capturing = False

    monkeypatch.setattr(backend.device_module, "new_graph", FakeGraph)
    monkeypatch.setattr(backend.device_module, "graph_capture", fake_graph_capture)
    from hisparse_hal import KVCacheConfig, LayerSpec

    device = torch.full((PAGE,), 0x3C, dtype=torch.uint8)
    sim.adopt_device_memory(device, "cache")
    backend.prepare_kv_cache_views(KVCacheConfig("bf16", PAGE // 64, 4, 8, (LayerSpec("layer.0"),)),
                                   {"layer.0": device}, {})
    pool = torch.zeros(PAGE, dtype=torch.uint8)
    address = pool.data_ptr()
    backend.pin_tensor(pool)
    with backend.capture() as graph:
        backend.swap_blocks_batch(_i64(device.data_ptr()), _i64(address), _i64(PAGE))
    graph.replay()
    assert replays == [1]
    pool.resize_(64 << 20)
    with pytest.raises(InvalidDescriptorError, match=rf"replay: a captured swap uses region 'pinned host {address:#x}"):
        graph.replay()
    assert replays == [1] and sim.registrations == {} and backend.pinned_registrations() == ()
