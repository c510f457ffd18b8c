"""``CudaBackend`` end to end on the CPU: the real backend and libcuda binding over the simulated driver.

The simulator (``hisparse_hal/testing/sim_cuda_driver.py``) stands in for libcuda and moves real host bytes;
the backend's device is injected as the CPU and its device module is a SIMULATED one (stream and capture
state as plain attributes). What this proves: swap validation, path choice, chunking at the cap, pinning with
rollback and dead-context teardown, capture rules. What it cannot prove: anything about a real GPU.
"""

from __future__ import annotations

import logging
import math
import mmap
from typing import cast

import pytest
import torch

from hisparse_hal import KVCacheConfig, LayerSpec
from hisparse_hal.errors import (
    BackendUnavailableError,
    CaptureMisuseError,
    DeviceRuntimeError,
    InvalidArgumentError,
    InvalidDescriptorError,
    UnsupportedCapabilityError,
)
from hisparse_hal.registry import ProbeResult
from hisparse_hal.testing.sim_cuda_driver import DEVICE_ALIAS_OFFSET, SimulatedCudaDriver
from hisparse_hal.testing.sim_device_module import SimulatedDeviceModule
from hisparse_hal.vendors.cuda import runtime as driver_module
from hisparse_hal.vendors.cuda.backend import CudaBackend
from hisparse_hal.vendors.cuda.capabilities import BATCH_CAP_ENV
from hisparse_hal.vendors.cuda.runtime import CudaDriver

STREAM = 0x5A00
GPU = torch.device("cuda", 0)  # label only: simulated device memory is host memory


def simulated(backend: CudaBackend) -> SimulatedDeviceModule:
    """The simulated device module under ``backend``: torch's stream and capture state as attributes."""
    return cast(SimulatedDeviceModule, backend.device_module)


def make_backend(
    driver_version: int = 12080, *, cap: int | None = None, **sim_options: object
) -> tuple[CudaBackend, SimulatedCudaDriver]:
    sim = SimulatedCudaDriver(driver_version, **sim_options)  # type: ignore[arg-type]
    backend = CudaBackend.for_device(
        0, driver_version, "sm_90", runtime=CudaDriver(0, sim), device=torch.device("cpu"), max_batch_descriptors=cap,
        device_module=SimulatedDeviceModule(STREAM),
    )
    return backend, sim


class Pool:
    """A simulated device cache (registered as an explicit device region) and a pinned host pool."""

    def __init__(
        self, backend: CudaBackend, sim: SimulatedCudaDriver, blocks: int = 64, block: int = 656
    ) -> None:
        self.block = block
        self.device = sim.allocate_device(blocks * block)
        self.device.copy_(
            torch.randint(0, 256, (blocks * block,), dtype=torch.uint8, generator=torch.Generator().manual_seed(7))
        )
        self.region = backend.register_region(self.device.data_ptr(), blocks * block, "sim device cache", device=GPU)
        self.host = torch.zeros(blocks, block, dtype=torch.uint8)
        backend.pin_tensor(self.host)

    def spill(
        self, src_blocks: list[int] | torch.Tensor, dst_blocks: list[int] | torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        s = torch.as_tensor(src_blocks, dtype=torch.int64)
        d = torch.as_tensor(dst_blocks, dtype=torch.int64)
        return (self.device.data_ptr() + s * self.block, self.host.data_ptr() + d * self.block,
                torch.full((s.numel(),), self.block, dtype=torch.int64))

    def device_blocks(self) -> torch.Tensor:
        return self.device.view(-1, self.block)


@pytest.fixture(autouse=True)
def _default_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(BATCH_CAP_ENV, raising=False)


def test_swap_moves_bytes_with_one_native_batch_call() -> None:
    backend, sim = make_backend()
    pool = Pool(backend, sim)
    order = torch.randperm(64, generator=torch.Generator().manual_seed(1))
    backend.swap_blocks_batch(*pool.spill(torch.arange(64), order))
    assert torch.equal(pool.host[order], pool.device_blocks())
    assert backend.last_swap_path == "batch"
    assert [c["count"] for c in sim.calls_to("cuMemcpyBatchAsync")] == [64]
    assert sim.calls_to("cuMemcpyBatchAsync")[0]["src_access_order"] == 1  # stream order (vLLM #39306)
    assert sim.callback_errors == []


def test_swap_is_chunked_at_the_cap_so_the_crash_size_is_never_reached() -> None:
    backend, sim = make_backend(cap=16, crash_above=16)
    pool = Pool(backend, sim)
    backend.swap_blocks_batch(*pool.spill(list(range(50)), list(range(49, -1, -1))))
    assert [c["count"] for c in sim.calls_to("cuMemcpyBatchAsync")] == [16, 16, 16, 2]
    assert torch.equal(pool.host[:50].flip(0), pool.device_blocks()[:50])
    assert sim.poisoned_with is None


def test_cap_from_the_environment_reaches_the_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(BATCH_CAP_ENV, "10")
    backend, sim = make_backend(crash_above=10)
    pool = Pool(backend, sim)
    backend.swap_blocks_batch(*pool.spill(list(range(25)), list(range(25))))
    assert [c["count"] for c in sim.calls_to("cuMemcpyBatchAsync")] == [10, 10, 5]


def test_without_a_cap_the_simulated_driver_crashes_and_the_error_is_sticky() -> None:
    """The failure the cap prevents (vLLM #49276), and why every return code is checked (quirk 7)."""
    backend, sim = make_backend(cap=64, crash_above=16)
    pool = Pool(backend, sim)
    with pytest.raises(DeviceRuntimeError, match="cuMemcpyBatchAsync failed with CUDA_ERROR_ILLEGAL_ADDRESS"):
        backend.swap_blocks_batch(*pool.spill(list(range(20)), list(range(20))))
    with pytest.raises(DeviceRuntimeError, match="CUDA_ERROR_ILLEGAL_ADDRESS"):
        backend.swap_blocks_batch(*pool.spill([0], [0]))


def test_failing_descriptor_index_counts_from_the_start_of_the_whole_swap() -> None:
    backend, sim = make_backend(cap=4)
    pool = Pool(backend, sim)
    sim.fail_copies_touching(pool.device.data_ptr() + 6 * pool.block)
    with pytest.raises(
        DeviceRuntimeError, match="at descriptor 6: .*descriptors before 4 were already enqueued"
    ) as info:
        backend.swap_blocks_batch(*pool.spill(list(range(10)), list(range(10))))
    assert info.value.index == 6


def test_legacy_default_stream_uses_the_per_copy_loop() -> None:
    backend, sim = make_backend()
    simulated(backend).stream = 0
    pool = Pool(backend, sim)
    backend.swap_blocks_batch(*pool.spill([0, 1, 2], [2, 1, 0]))
    assert backend.last_swap_path == "loop"
    assert sim.calls_to("cuMemcpyBatchAsync") == []
    assert [c["stream"] for c in sim.calls_to("cuMemcpyAsync")] == [0, 0, 0]
    assert torch.equal(pool.host[:3].flip(0), pool.device_blocks()[:3])


def test_driver_before_12_8_uses_the_per_copy_loop() -> None:
    backend, sim = make_backend(12040)
    pool = Pool(backend, sim)
    assert backend.capabilities.batch_copy == "loop"
    backend.swap_blocks_batch(*pool.spill([4, 5], [0, 1]))
    assert backend.last_swap_path == "loop"
    assert len(sim.calls_to("cuMemcpyAsync")) == 2 and sim.calls_to("cuGetProcAddress") == []
    assert torch.equal(pool.host[:2], pool.device_blocks()[4:6])


def test_loop_mode_forces_the_per_copy_loop_for_comparisons() -> None:
    backend, sim = make_backend()
    pool = Pool(backend, sim)
    backend.batch_copy_mode = "loop"
    backend.swap_blocks_batch(*pool.spill([0, 1], [1, 0]))
    assert backend.last_swap_path == "loop" and sim.calls_to("cuMemcpyBatchAsync") == []
    with pytest.raises(InvalidArgumentError, match=r"batch_copy_mode must be one of \('auto', 'loop'\), got 'fast'"):
        backend.batch_copy_mode = "fast"


def test_swap_outside_known_regions_is_rejected_before_the_driver_is_called() -> None:
    backend, sim = make_backend()
    pool = Pool(backend, sim)
    src, dst, sizes = pool.spill([0, 1, 2], [0, 1, 2])
    dst[1] += 10**6
    calls = len(sim.calls)
    with pytest.raises(
        InvalidDescriptorError, match="swap descriptor 1: destination range .* is not inside any known region"
    ):
        backend.swap_blocks_batch(src, dst, sizes)
    assert len(sim.calls) == calls
    assert int(pool.host.count_nonzero()) == 0


def test_descriptor_arrays_may_be_reused_after_the_call() -> None:
    backend, sim = make_backend()
    pool = Pool(backend, sim)
    src, dst, sizes = pool.spill([0, 1], [5, 6])
    backend.swap_blocks_batch(src, dst, sizes)
    src.fill_(0)  # the simulator copies synchronously; the real driver copies the arrays during the call
    assert torch.equal(pool.host[5:7], pool.device_blocks()[:2])


def test_empty_swap_calls_nothing() -> None:
    backend, sim = make_backend()
    calls = len(sim.calls)
    empty = torch.empty(0, dtype=torch.int64)
    backend.swap_blocks_batch(empty, empty, empty)
    assert len(sim.calls) == calls


# ----------------------------------------------------------------------------- pinning
def test_pin_registers_in_page_and_block_aligned_chunks_below_the_driver_limit() -> None:
    backend, sim = make_backend(max_register_bytes=64 * 1024)
    backend.host_chunk_bytes = 40 * 1024
    block = 6144  # a block of one and a half pages: chunk ends must fall on both boundaries
    host = torch.zeros(40, block, dtype=torch.uint8)  # 240 KiB; one call would exceed the "512 GiB" limit
    backend.pin_tensor(host)
    calls = sim.calls_to("cuMemHostRegister")
    sizes = [c["size"] for c in calls]
    step = (40 * 1024 // math.lcm(mmap.PAGESIZE, block)) * math.lcm(mmap.PAGESIZE, block)
    assert sizes[:-1] == [step] * (len(sizes) - 1) and sum(sizes) == host.numel() and len(sizes) > 1
    assert all(size < 64 * 1024 for size in sizes)
    assert all((c["address"] - host.data_ptr()) % block == 0 for c in calls)
    assert all(c["flags"] == 0x01 for c in calls)
    record = backend.host_registration(host)
    assert len(record.chunks) == len(sizes) and record.page_locked and record.device_alias is None
    assert backend.capabilities.host_pointer_alias is False  # attribute 91 is 1 on the default simulator
    assert all(chunk.device_alias is None for chunk in record.chunks)
    backend.unpin_tensor(host)
    assert sim.registered == {}
    unregistered = [c["address"] for c in sim.calls_to("cuMemHostUnregister")]
    assert unregistered == sorted(unregistered, reverse=True)  # chunk by chunk, in reverse


def test_pin_on_a_device_without_host_pointer_access_records_every_chunks_device_alias() -> None:
    backend, sim = make_backend(host_pointer_usable=False)
    assert backend.capabilities.host_pointer_alias is True
    assert "CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM is 0" in backend.capabilities.reasons["host_pointer_alias"]
    backend.host_chunk_bytes = 16 * 1024
    host = torch.zeros(12, 4096, dtype=torch.uint8)
    backend.pin_tensor(host)
    assert all(c["flags"] == 0x03 for c in sim.calls_to("cuMemHostRegister"))  # PORTABLE | DEVICEMAP
    record = backend.host_registration(host)
    assert len(record.chunks) == 3
    assert [c.device_alias for c in record.chunks] == [c.address + DEVICE_ALIAS_OFFSET for c in record.chunks]
    assert record.device_alias == host.data_ptr() + DEVICE_ALIAS_OFFSET != host.data_ptr()
    regions = sorted((r for r in backend.regions if r.kind == "pinned_host"), key=lambda r: r.start)
    assert [r.device_alias for r in regions] == [c.device_alias for c in record.chunks]


def test_swaps_keep_host_addresses_on_a_device_that_needs_device_aliases() -> None:
    backend, sim = make_backend(host_pointer_usable=False)
    pool = Pool(backend, sim)
    backend.swap_blocks_batch(*pool.spill([0, 5, 9], [1, 2, 3]))
    assert torch.equal(pool.host[1:4], pool.device_blocks()[[0, 5, 9]])
    assert sim.callback_errors == []


def test_pin_failing_halfway_rolls_back_every_registered_chunk() -> None:
    backend, sim = make_backend(fail_register_call=3)
    backend.host_chunk_bytes = 16 * 1024
    host = torch.zeros(16, 4096, dtype=torch.uint8)
    with pytest.raises(
        DeviceRuntimeError,
        match=r"cuMemHostRegister failed with CUDA_ERROR_OUT_OF_MEMORY \(2\): registering 16384 bytes",
    ):
        backend.pin_tensor(host)
    assert sim.registered == {}
    assert len(sim.calls_to("cuMemHostUnregister")) == 2
    assert backend.pinned_registrations() == () and len(backend.regions) == 0
    backend.pin_tensor(host)  # nothing was left half-pinned: pinning again works
    assert backend.host_registration(host).size == host.numel()


def test_unpin_with_a_lost_context_logs_and_leaves_the_memory(caplog: pytest.LogCaptureFixture) -> None:
    backend, sim = make_backend()
    host = torch.zeros(8, 4096, dtype=torch.uint8)
    backend.pin_tensor(host)
    sim.lose_context()
    with caplog.at_level(logging.WARNING, logger="hisparse_hal.vendors.gpu.backend"):
        backend.unpin_tensor(host)
    assert "left registered, the device context is gone" in caplog.text and "CUDA_ERROR_DEINITIALIZED" in caplog.text
    assert backend.pinned_registrations() == ()
    with pytest.raises(InvalidArgumentError, match="was not pinned"):
        backend.unpin_tensor(host)


def test_unpin_error_that_is_not_a_lost_context_is_raised() -> None:
    backend, sim = make_backend()
    host = torch.zeros(8, 4096, dtype=torch.uint8)
    backend.pin_tensor(host)
    del sim.registered[host.data_ptr()]  # someone else released it behind our back
    with pytest.raises(DeviceRuntimeError, match="CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED"):
        backend.unpin_tensor(host)


# ----------------------------------------------------------------------------- captures
def test_swap_inside_a_capture_is_captured_per_copy_never_batched() -> None:
    backend, sim = make_backend()
    pool = Pool(backend, sim)
    simulated(backend).capturing = True
    backend.swap_blocks_batch(*pool.spill([0, 1], [3, 4]))
    assert backend.last_swap_path == "loop"
    assert sim.calls_to("cuMemcpyBatchAsync") == [] and len(sim.calls_to("cuMemcpyAsync")) == 2


def test_capturing_swap_touching_an_explicit_host_region_is_rejected_before_the_driver() -> None:
    backend, sim = make_backend()
    pool = Pool(backend, sim)
    staging = torch.zeros(4, pool.block, dtype=torch.uint8)  # pageable: not pinned by the backend
    backend.register_region(staging.data_ptr(), staging.numel(), "staging", device=torch.device("cpu"))
    simulated(backend).capturing = True
    calls = len(sim.calls)
    src = torch.tensor([pool.device.data_ptr(), pool.device.data_ptr() + pool.block], dtype=torch.int64)
    dst = torch.tensor([pool.host.data_ptr(), staging.data_ptr()], dtype=torch.int64)
    with pytest.raises(
        CaptureMisuseError, match="swap descriptor 1 touches explicit host region 'staging'.*capture is still valid"
    ):
        backend.swap_blocks_batch(src, dst, torch.full((2,), pool.block, dtype=torch.int64))
    assert len(sim.calls) == calls


@pytest.mark.parametrize("member", ["pin_tensor", "unpin_tensor"])
def test_pinning_while_capturing_is_rejected_before_the_driver(member: str) -> None:
    backend, sim = make_backend()
    host = torch.zeros(4, 4096, dtype=torch.uint8)
    if member == "unpin_tensor":
        backend.pin_tensor(host)
    simulated(backend).capturing = True
    calls = len(sim.calls)
    with pytest.raises(CaptureMisuseError, match=f"{member} cannot run while the current stream is capturing"):
        getattr(backend, member)(host)
    assert len(sim.calls) == calls


def test_capture_while_capturing_is_misuse() -> None:
    backend, _ = make_backend()
    simulated(backend).capturing = True
    with pytest.raises(CaptureMisuseError, match="already capturing"):
        with backend.capture():
            pass


# ----------------------------------------------------------------------------- KV caches and gathers
def test_kv_config_accepts_ocp_fp8_and_656_byte_ds_mla_rows() -> None:
    backend, _ = make_backend()
    backend.validate_kv_cache_config(KVCacheConfig("fp8_ds_mla", 8, 64, 656, (LayerSpec("l0"),)))
    backend.validate_kv_cache_config(KVCacheConfig("fp8_e4m3fn", 8, 64, 576, (LayerSpec("l0"),)))
    with pytest.raises(InvalidArgumentError, match="'fp8_ds_mla' rows are 656 bytes .* got row_width 576"):
        backend.validate_kv_cache_config(KVCacheConfig("fp8_ds_mla", 8, 64, 576, (LayerSpec("l0"),)))


def test_kv_config_rejects_fnuz_fp8_on_nvidia() -> None:
    backend, _ = make_backend()
    with pytest.raises(
        UnsupportedCapabilityError, match=r"'fp8_e4m3fnuz' is not supported on backend 'cuda' \(sm_90\)"
    ):
        backend.validate_kv_cache_config(KVCacheConfig("fp8_e4m3fnuz", 8, 64, 576, (LayerSpec("l0"),)))


def test_prepared_cache_layers_become_swap_sources() -> None:
    backend, sim = make_backend()
    config = KVCacheConfig("fp8_ds_mla", 4, 2, 656, (LayerSpec("l0"), LayerSpec("l1", 4 * 2 * 656)))
    storage = torch.randint(0, 256, (2 * 4 * 2 * 656,), dtype=torch.uint8)
    sim._device_memory.append((storage.data_ptr(), storage.data_ptr() + storage.numel(), storage))
    caches = {"l0": storage, "l1": storage}
    backend.prepare_kv_cache_views(config, caches, {})
    assert (
        caches["l1"].shape == (4, 2, 656)
        and caches["l1"].untyped_storage().data_ptr() == storage.untyped_storage().data_ptr()
    )
    host = torch.zeros(2, 656, dtype=torch.uint8)
    backend.pin_tensor(host)
    src = torch.tensor([caches["l1"][3, 1].data_ptr(), caches["l0"][0, 0].data_ptr()], dtype=torch.int64)
    dst = torch.tensor([host[0].data_ptr(), host[1].data_ptr()], dtype=torch.int64)
    backend.swap_blocks_batch(src, dst, torch.full((2,), 656, dtype=torch.int64))
    assert torch.equal(host[0], caches["l1"][3, 1]) and torch.equal(host[1], caches["l0"][0, 0])


def test_gather_runs_on_the_backend_device_and_preserves_bytes() -> None:
    backend, _ = make_backend()
    source = torch.randint(0, 256, (4, 8, 656), dtype=torch.uint8)
    out = torch.empty(3, 328, dtype=torch.bfloat16)
    backend.gather_resident_rows(source, out, torch.tensor([9, -1, 31]))
    assert torch.equal(out.view(torch.uint8), source.view(32, 656)[[9, 0, 31]])
    with pytest.raises(InvalidArgumentError, match="gather source is on meta, but backend 'cuda' runs on cpu"):
        backend.gather_resident_rows(torch.empty(4, 8, 656, device="meta"), out, torch.tensor([0]))


# ----------------------------------------------------------------------------- construction from a probe
def _probe_result(facts: dict) -> ProbeResult:
    return ProbeResult("cuda", 100, True, "test", facts)


@pytest.mark.parametrize("host_pointer_usable", [True, False])
def test_from_probe_plans_from_the_probed_driver_torchs_device_capability_and_the_host_pointer_attribute(
    monkeypatch: pytest.MonkeyPatch, host_pointer_usable: bool
) -> None:
    sim = SimulatedCudaDriver(12090, device_count=2, host_pointer_usable=host_pointer_usable)
    monkeypatch.setattr(driver_module, "load_libcuda", lambda: sim)
    monkeypatch.setattr(torch.accelerator, "current_device_index", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (9, 0) if index == 1 else (8, 0))
    backend = CudaBackend.from_probe(_probe_result({"driver_version": 12090}))
    assert backend.device == torch.device("cuda", 1) and backend.device_index == 1
    assert backend.capabilities.batch_copy == "native"
    assert dict(backend.capabilities.versions) == {
        "driver": "12.9",
        "driver_api": "12090",
        "arch": "sm_90",
        "batch_cap": "default",
    }
    assert isinstance(backend.runtime, CudaDriver) and backend.runtime.device_ordinal == 1
    assert sim.calls_to("cuDeviceGetAttribute") == [{"attribute": 91, "device": 1}]
    assert backend.capabilities.host_pointer_alias is (not host_pointer_usable)
    assert sim.calls_to("cuDevicePrimaryCtxRetain") == []  # building the backend creates no context


def test_from_probe_without_a_driver_version_is_unavailable() -> None:
    with pytest.raises(BackendUnavailableError, match="the CUDA probe facts give no driver version"):
        CudaBackend.from_probe(_probe_result({}))


def test_from_probe_on_a_torch_without_cuda_is_unavailable() -> None:
    if torch.version.cuda is not None:
        pytest.skip("needs a torch build without CUDA")
    with pytest.raises(BackendUnavailableError, match="torch cannot use CUDA although the probe passed"):
        CudaBackend.from_probe(_probe_result({"driver_version": 12080}))


def test_cache_ops_kernels_get_the_registration_alias_on_a_device_that_needs_one() -> None:
    backend, sim = make_backend(host_pointer_usable=False)
    backend.host_chunk_bytes = 16 * 1024
    host = torch.zeros(12, 4096, dtype=torch.uint8)
    backend.pin_tensor(host)
    layer = host[4:8]  # a view inside the second chunk, as one layer of a host pool
    assert backend.device_address_of_host(layer) == layer.data_ptr() + DEVICE_ALIAS_OFFSET
    with pytest.raises(
        UnsupportedCapabilityError, match=r"device alias 0x[0-9a-f]+ of host memory .* cannot be dereferenced"
    ):
        backend.device_view_of_host(layer)  # the simulated device is the CPU: an alias is not readable there
    backend.unpin_tensor(host)


def test_cache_ops_kernels_use_the_host_address_where_the_device_may() -> None:
    backend, sim = make_backend()
    host = torch.zeros(4, 4096, dtype=torch.uint8)
    backend.pin_tensor(host)
    assert backend.device_address_of_host(host[1:]) == host[1:].data_ptr()
    assert backend.device_view_of_host(host) is host
    backend.unpin_tensor(host)
    with pytest.raises(InvalidArgumentError, match=r"is not inside memory pinned by backend 'cuda'; pin_tensor"):
        backend.device_address_of_host(host)
