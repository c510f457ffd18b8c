"""RocmBackend (``vendors/rocm/backend.py``) end to end on the CPU, driving the SIMULATED HIP runtime
(``hisparse_hal/testing/sim_hip_runtime.py``) through the real ctypes binding: swaps per ROCm release, the 8,192
cap, device aliases, rollback, teardown, KV formats per architecture, the capture gate and the IPC cycle limit.
Proves logic, not AMD hardware."""

from __future__ import annotations

import dataclasses
import logging
import types

import pytest
import torch

from hisparse_hal import KVCacheConfig, LayerSpec
from hisparse_hal.errors import (
    CaptureMisuseError,
    DeviceRuntimeError,
    InvalidArgumentError,
    InvalidDescriptorError,
    UnsupportedCapabilityError,
)
from hisparse_hal.registry import ProbeResult
from hisparse_hal.testing.sim_hip_runtime import (
    SimulatedHipRuntime,
    SimulatedIpcRing,
    capturing,
    simulated_rocm_backend,
)
from hisparse_hal.vendors.gpu import events as gpu_events
from hisparse_hal.vendors.gpu.events import GpuIpcEvent
from hisparse_hal.vendors.gpu.runtime import CopyRuntime
from hisparse_hal.vendors.rocm.backend import RocmBackend
from hisparse_hal.vendors.rocm.ipc_cycles import CycleLimitedIpcEvent
from hisparse_hal.vendors.rocm.runtime import HipRuntime

BLOCK = 64  # bytes per block: block_size 4 rows x row_width 8 bf16 elements


def cache_config(num_blocks: int, fmt: str = "bf16", row_width: int = 8) -> KVCacheConfig:
    return KVCacheConfig(fmt, num_blocks, 4, row_width, (LayerSpec("layer.0"),))


def device_cache(backend, sim, num_blocks: int) -> torch.Tensor:
    """A KV cache in simulated device memory, registered through prepare_kv_cache_views."""
    raw = torch.randint(0, 256, (num_blocks * BLOCK,), dtype=torch.uint8)
    sim.adopt_device_memory(raw, "kv layer.0")
    caches = {"layer.0": raw}
    backend.prepare_kv_cache_views(cache_config(num_blocks), caches, {})
    return raw


def spill(backend, sim, num_blocks: int, host: torch.Tensor | None = None):
    """Swap every device block to a pinned host pool in reverse order; return (device, host, order)."""
    device = device_cache(backend, sim, num_blocks)
    if host is None:
        host = torch.zeros(num_blocks, BLOCK, dtype=torch.uint8)
        backend.pin_tensor(host)
    order = torch.arange(num_blocks - 1, -1, -1)
    backend.swap_blocks_batch(
        device.data_ptr() + torch.arange(num_blocks) * BLOCK,
        host.data_ptr() + order * BLOCK,
        torch.full((num_blocks,), BLOCK),
    )
    return device.view(num_blocks, BLOCK), host, order


# ----------------------------------------------------------------------------------------- swaps
@pytest.mark.parametrize(
    "release,path,attribute_orders",
    [("7.0", "loop", None), ("7.1", "batch", ()), ("7.2.0", "batch", ()), ("7.2.1", "batch", ()),
     ("7.2.3", "batch", ()), ("7.13", "batch", (1,) * 50), ("7.14", "batch", (1,) * 50)],
)
def test_swap_on_each_rocm_release_takes_the_planned_path_and_moves_every_byte(release, path, attribute_orders):
    sim = SimulatedHipRuntime(release)
    backend = simulated_rocm_backend(sim)
    device, host, order = spill(backend, sim, 50)
    assert backend.last_swap_path == path
    sim.synchronize()
    assert torch.equal(host[order], device)
    if path == "batch":
        assert sim.batch_sizes == [50]
        assert sim.batch_attribute_orders == [attribute_orders]  # stream-ordered reads only from 7.13
    else:
        assert sim.calls["hipMemcpyAsync"] == 50 and sim.calls["hipMemcpyBatchAsync"] == 0
    assert sim.callback_errors == []


def test_backend_synchronize_lands_the_queued_copies_through_its_device_module():
    sim = SimulatedHipRuntime("7.14")  # copies are queued until the simulated device synchronizes
    backend = simulated_rocm_backend(sim)
    device, host, order = spill(backend, sim, 8)
    assert not host.any()  # enqueued, not landed
    backend.synchronize()
    assert torch.equal(host[order], device)
    assert backend.device_module.synchronizations == 1


@pytest.mark.parametrize("release", ["7.2.1", "7.2.3"])
def test_swap_on_rocm_7_2_never_passes_attributes_so_never_gets_801(release):
    sim = SimulatedHipRuntime(release)
    backend = simulated_rocm_backend(sim)
    spill(backend, sim, 10)
    assert sim.batch_attribute_orders == [()]


def test_swap_of_20000_descriptors_is_chunked_at_8192_and_copies_every_byte():
    sim = SimulatedHipRuntime("7.14")
    backend = simulated_rocm_backend(sim)
    device, host, order = spill(backend, sim, 20_000)
    assert sim.batch_sizes == [8192, 8192, 3616]
    assert not sim.faulted
    sim.synchronize()
    assert torch.equal(host[order], device)


def test_without_the_cap_the_simulated_gpu_faults_so_the_cap_is_what_prevents_it():
    sim = SimulatedHipRuntime("7.14")
    uncapped = dataclasses.replace(simulated_rocm_backend(sim).capabilities, max_batch_descriptors=None)
    backend = simulated_rocm_backend(sim, capabilities=uncapped)
    with pytest.raises(InvalidArgumentError, match="given 8193 descriptors"):
        spill(backend, sim, 8193)  # the binding itself still refuses; now bypass it as an unchecked caller would
    runtime = backend.runtime
    batch = backend.regions.check_swap_batch(*_identity_descriptors(backend, 8193))
    function = runtime._functions["hipMemcpyBatchAsync"]
    status = function(
        batch.dst.data_ptr(), batch.src.data_ptr(), batch.sizes.data_ptr(), 8193, None, None, 0, None, 0x5000
    )
    assert status == 700 and sim.faulted
    with pytest.raises(DeviceRuntimeError, match="hipErrorIllegalAddress"):
        runtime.copy_batch(
            backend.regions.check_swap_batch(*_identity_descriptors(backend, 2)), 0x5000, use_attributes=False
        )


def _identity_descriptors(backend, count):
    region = next(r for r in backend.regions if r.kind == "device_cache")
    pinned = next(r for r in backend.regions if r.kind == "pinned_host")
    return (
        region.start + torch.arange(count) * BLOCK,
        pinned.start + torch.arange(count) * BLOCK,
        torch.full((count,), BLOCK),
    )


def test_swap_on_the_legacy_default_stream_uses_the_copy_loop():
    sim = SimulatedHipRuntime("7.14")
    backend = simulated_rocm_backend(sim, stream=0)
    device, host, order = spill(backend, sim, 12)
    assert backend.last_swap_path == "loop" and sim.calls["hipMemcpyBatchAsync"] == 0
    sim.synchronize(0)
    assert torch.equal(host[order], device)


def test_swap_while_capturing_issues_per_copy_calls_a_graph_can_hold():
    sim = SimulatedHipRuntime("7.14")
    backend = simulated_rocm_backend(sim)
    device = device_cache(backend, sim, 8)
    host = torch.zeros(8, BLOCK, dtype=torch.uint8)
    backend.pin_tensor(host)
    with capturing(backend):
        backend.swap_blocks_batch(
            device.data_ptr() + torch.arange(8) * BLOCK,
            host.data_ptr() + torch.arange(8) * BLOCK,
            torch.full((8,), BLOCK),
        )
    assert backend.last_swap_path == "loop" and sim.calls["hipMemcpyAsync"] == 8


def test_batch_copy_mode_loop_forces_per_copy_calls_for_comparisons():
    sim = SimulatedHipRuntime("7.14")
    backend = simulated_rocm_backend(sim)
    backend.batch_copy_mode = "loop"
    spill(backend, sim, 5)
    assert (backend.last_swap_path, sim.calls["hipMemcpyAsync"]) == ("loop", 5)


def test_a_runtime_failure_in_a_later_chunk_names_the_descriptor_in_the_whole_batch():
    sim = SimulatedHipRuntime("7.14")
    backend = simulated_rocm_backend(sim)
    device = device_cache(backend, sim, 9000)
    first = torch.zeros(8192, BLOCK, dtype=torch.uint8)
    second = torch.zeros(808, BLOCK, dtype=torch.uint8)
    backend.pin_tensor(first)
    backend.pin_tensor(second)
    del sim.registrations[second.data_ptr()]  # the runtime forgets the second pool behind the backend's back
    dst = torch.cat([first.data_ptr() + torch.arange(8192) * BLOCK, second.data_ptr() + torch.arange(808) * BLOCK])
    with pytest.raises(DeviceRuntimeError, match="at descriptor 8192") as info:
        backend.swap_blocks_batch(device.data_ptr() + torch.arange(9000) * BLOCK, dst, torch.full((9000,), BLOCK))
    assert info.value.index == 8192
    assert "descriptors before 8192 were already enqueued" in str(info.value)


def test_a_rejected_batch_reaches_no_runtime_call():
    sim = SimulatedHipRuntime("7.14")
    backend = simulated_rocm_backend(sim)
    device = device_cache(backend, sim, 4)
    with pytest.raises(InvalidDescriptorError, match="swap descriptor 1: destination range"):
        backend.swap_blocks_batch(
            torch.tensor([device.data_ptr(), device.data_ptr() + BLOCK]),
            torch.tensor([device.data_ptr() + 2 * BLOCK, 0x20]),
            torch.tensor([8, 8]),
        )
    assert sim.calls["hipMemcpyBatchAsync"] == sim.calls["hipMemcpyAsync"] == 0


# ----------------------------------------------------------------------------------------- aliases
def test_pinning_records_the_device_alias_on_the_registration_chunks_and_regions():
    sim = SimulatedHipRuntime("7.2.1", alias_offset=0x40_0000_0000)
    backend = simulated_rocm_backend(sim)
    host = torch.zeros(256, BLOCK, dtype=torch.uint8)
    backend.pin_tensor(host)
    record = backend.host_registration(host)
    assert record.device_alias == host.data_ptr() + 0x40_0000_0000
    assert [c.device_alias for c in record.chunks] == [host.data_ptr() + 0x40_0000_0000]
    assert [r.device_alias for r in backend.regions if r.kind == "pinned_host"] == [record.device_alias]


def test_device_addresses_translate_pinned_host_addresses_for_kernels_vectorized():
    sim = SimulatedHipRuntime("7.2.1")
    backend = simulated_rocm_backend(sim)
    backend.host_chunk_bytes = 16 * 4096  # several registrations, each with its own alias
    host = torch.arange(64 * 4096, dtype=torch.int64).to(torch.uint8).view(64, 4096)
    backend.pin_tensor(host)
    assert len(backend.host_registration(host).chunks) == 4
    addresses = host.data_ptr() + torch.tensor([0, 5 * 4096 + 7, 63 * 4096 + 4095])
    aliases = backend.device_addresses(addresses)
    assert aliases.tolist() == (addresses + sim.alias_offset).tolist()
    for alias, row, col in zip(aliases.tolist(), (0, 5, 63), (0, 7, 4095), strict=True):
        assert sim.kernel_read(alias, 1) == bytes([int(host[row, col])])  # a kernel sees the host bytes there


def test_a_kernel_given_the_host_address_instead_of_the_alias_faults_on_the_simulated_gpu():
    from hisparse_hal.testing.sim_hip_runtime import SimulatedGpuFault

    sim = SimulatedHipRuntime("7.2.1")
    backend = simulated_rocm_backend(sim)
    host = torch.zeros(4, BLOCK, dtype=torch.uint8)
    backend.pin_tensor(host)
    with pytest.raises(SimulatedGpuFault, match="Memory access fault by GPU on address"):
        sim.kernel_read(host.data_ptr(), 8)


def test_swaps_give_the_runtime_host_addresses_never_aliases():
    sim = SimulatedHipRuntime("7.2.1")
    backend = simulated_rocm_backend(sim)
    device, host, _order = spill(backend, sim, 6)
    destinations = {dst for _call, dst, _src, _n in sim.copy_log}
    assert destinations <= set((host.data_ptr() + torch.arange(6) * BLOCK).tolist())


def test_device_addresses_reject_an_address_outside_every_pinned_tensor_naming_it():
    sim = SimulatedHipRuntime("7.2.1")
    backend = simulated_rocm_backend(sim)
    host = torch.zeros(4, BLOCK, dtype=torch.uint8)
    backend.pin_tensor(host)
    bad = host.data_ptr() + 4 * BLOCK  # one past the end
    with pytest.raises(InvalidArgumentError, match=rf"address {bad:#x} \(index 1\) is not inside a tensor pinned"):
        backend.device_addresses(torch.tensor([host.data_ptr(), bad]))
    with pytest.raises(InvalidArgumentError, match="expected a 1-D int64 CPU tensor"):
        backend.device_addresses(torch.tensor([1.0]))


# ----------------------------------------------------------------------------------------- pinning
def test_a_registration_failing_halfway_rolls_back_every_chunk():
    sim = SimulatedHipRuntime("7.2.1", fail_register_on_call=3)
    backend = simulated_rocm_backend(sim)
    backend.host_chunk_bytes = 4 * 4096
    host = torch.zeros(16, 4096, dtype=torch.uint8)
    with pytest.raises(DeviceRuntimeError, match="hipHostRegister failed with hipErrorOutOfMemory"):
        backend.pin_tensor(host)
    assert sim.calls["hipHostRegister"] == 3 and sim.calls["hipHostUnregister"] == 2
    assert sim.registrations == {}
    assert backend.pinned_registrations() == ()
    assert not [r for r in backend.regions if r.kind == "pinned_host"]


def test_an_alias_query_failing_on_a_later_chunk_rolls_back_every_chunk():
    sim = SimulatedHipRuntime("7.2.1", fail_device_pointer_on_call=2)
    backend = simulated_rocm_backend(sim)
    backend.host_chunk_bytes = 4 * 4096
    host = torch.zeros(16, 4096, dtype=torch.uint8)
    with pytest.raises(DeviceRuntimeError, match="hipHostGetDevicePointer failed"):
        backend.pin_tensor(host)
    assert sim.registrations == {}
    assert backend.pinned_registrations() == ()


def test_unpin_after_runtime_teardown_is_tolerated_and_logged(caplog):
    sim = SimulatedHipRuntime("7.2.1")
    backend = simulated_rocm_backend(sim)
    host = torch.zeros(4, BLOCK, dtype=torch.uint8)
    backend.pin_tensor(host)
    sim.shutdown()
    with caplog.at_level(logging.WARNING):
        backend.unpin_tensor(host)
    assert "left registered, the device context is gone" in caplog.text
    assert backend.pinned_registrations() == ()


def test_unpin_after_a_sticky_gpu_fault_is_tolerated():
    sim = SimulatedHipRuntime("7.14")
    backend = simulated_rocm_backend(sim)
    host = torch.zeros(4, BLOCK, dtype=torch.uint8)
    backend.pin_tensor(host)
    sim.faulted = True  # every later call returns hipErrorIllegalAddress, as after a real fault
    backend.unpin_tensor(host)
    assert backend.pinned_registrations() == ()


def test_unpin_reports_a_runtime_error_that_is_not_teardown():
    sim = SimulatedHipRuntime("7.2.1")
    backend = simulated_rocm_backend(sim)
    host = torch.zeros(4, BLOCK, dtype=torch.uint8)
    backend.pin_tensor(host)
    sim.registrations.clear()
    with pytest.raises(DeviceRuntimeError, match="hipErrorHostMemoryNotRegistered"):
        backend.unpin_tensor(host)


def test_pinning_while_capturing_is_refused_before_any_runtime_call():
    sim = SimulatedHipRuntime("7.2.1")
    backend = simulated_rocm_backend(sim)
    with capturing(backend), pytest.raises(CaptureMisuseError, match="pin_tensor cannot run while"):
        backend.pin_tensor(torch.zeros(4, BLOCK, dtype=torch.uint8))
    assert sim.calls["hipHostRegister"] == 0


# ----------------------------------------------------------------------------------------- KV formats
@pytest.mark.parametrize(
    "arch,fmt,message",
    [
        (
            "gfx942:sramecc+:xnack-",
            "fp8_e4m3fn",
            r"gfx942 .* stores fp8 KV as 'fp8_e4m3fnuz' .*'fp8_e4m3fn' \(max 448\) would be misread",
        ),
        (
            "gfx950",
            "fp8_e4m3fnuz",
            r"gfx950 .* stores fp8 KV as 'fp8_e4m3fn' .*'fp8_e4m3fnuz' \(max 224\) would be misread",
        ),
        ("gfx90a", "fp8_e4m3fnuz", r"gfx90a \(Instinct MI200 \(CDNA2\)\) has no fp8 KV format here; use 'bf16'"),
        ("gfx1201", "fp8_e4m3fn", r"gfx1201 is not in the ROCm architecture table"),
        ("gfx950", "fp8_ds_mla", r"fp8_ds_mla is the CUDA 656-byte MLA row format"),
    ],
)
def test_kv_config_with_a_format_the_architecture_cannot_hold_is_refused_with_the_right_one_named(arch, fmt, message):
    backend = simulated_rocm_backend(SimulatedHipRuntime("7.14"), arch)
    row_width = 656 if fmt == "fp8_ds_mla" else 64
    with pytest.raises(UnsupportedCapabilityError, match=message):
        backend.validate_kv_cache_config(cache_config(4, fmt, row_width))


@pytest.mark.parametrize(
    "arch,fmt", [("gfx942:sramecc+:xnack-", "fp8_e4m3fnuz"), ("gfx950", "fp8_e4m3fn"), ("gfx90a", "bf16")]
)
def test_kv_views_of_the_architectures_format_share_storage(arch, fmt):
    sim = SimulatedHipRuntime("7.14")
    backend = simulated_rocm_backend(sim, arch)
    raw = torch.zeros(4 * 4 * 64 * 2, dtype=torch.uint8)
    caches = {"layer.0": raw}
    backend.prepare_kv_cache_views(cache_config(4, fmt, 64), caches, {})
    assert caches["layer.0"].untyped_storage().data_ptr() == raw.untyped_storage().data_ptr()
    assert caches["layer.0"].shape == (4, 4, 64)


def test_kv_config_that_is_malformed_gets_the_core_error_unchanged():
    backend = simulated_rocm_backend(SimulatedHipRuntime("7.14"), "gfx950")
    with pytest.raises(InvalidArgumentError, match="num_blocks must be a positive int"):
        backend.validate_kv_cache_config(cache_config(0))


# ----------------------------------------------------------------------------------------- capture
def test_capture_before_rocm_7_2_1_is_refused_with_the_reason():
    backend = simulated_rocm_backend(SimulatedHipRuntime("7.2.0"))
    with pytest.raises(
        UnsupportedCapabilityError,
        match=r"capture\(\) \(capability graph_capture is False: HIP 7\.2\.53210: "
        r"graph capture needs ROCm 7\.2\.1 .*SGLang #23580",
    ):
        backend.capture()


def test_capture_from_rocm_7_2_1_goes_to_the_shared_layer():
    backend = simulated_rocm_backend(SimulatedHipRuntime("7.2.1"))
    context = backend.capture()  # entering it needs a real HIP device; the gate is what is tested here
    assert hasattr(context, "__enter__")


# ----------------------------------------------------------------------------------------- IPC events
@pytest.fixture
def simulated_events():
    """The SIMULATED ROCm 7.2 IPC ring; :func:`with_events` makes a backend's device module create its events."""
    return SimulatedIpcRing(slots=32)


def with_events(backend, ring: SimulatedIpcRing):
    """``backend`` whose simulated device module makes IPC events on ``ring`` (as torch.cuda.Event would)."""
    backend.device_module.event_class = ring.event_class()
    return backend


def test_ipc_event_on_rocm_7_2_refuses_the_33rd_record_before_the_ring_breaks(simulated_events):
    backend = with_events(simulated_rocm_backend(SimulatedHipRuntime("7.2.1")), simulated_events)
    event = backend.create_ipc_event()
    assert isinstance(event, CycleLimitedIpcEvent)
    for _ in range(32):
        event.record()
    with pytest.raises(
        UnsupportedCapabilityError,
        match=r"IPC event record 33 refused: HIP 7\.2\.53211 .*local event plus a host barrier",
    ):
        event.record()
    assert simulated_events.records == 32 and not simulated_events.broken


def test_imported_ipc_event_on_rocm_7_2_refuses_the_33rd_wait(simulated_events, monkeypatch):
    exporter = with_events(simulated_rocm_backend(SimulatedHipRuntime("7.2.1")), simulated_events)
    with monkeypatch.context() as patch:
        patch.setattr(gpu_events, "_PROCESS_TOKEN", b"\x01" * 16)  # as if exported by another process
        handle = exporter.export_event(exporter.create_ipc_event())
    importer = with_events(simulated_rocm_backend(SimulatedHipRuntime("7.2.1")), simulated_events)
    event = importer.import_event(torch.device("cuda", 0), handle)
    assert importer.device_module.scopes[-1] == 0  # the event was opened with its device current
    for _ in range(32):
        event.wait()
    with pytest.raises(UnsupportedCapabilityError, match="IPC event wait 33 refused"):
        event.wait()
    assert simulated_events.waits == 32


def test_the_simulated_ring_does_break_silently_without_the_guard(simulated_events):
    raw = simulated_events.event_class()(interprocess=True)
    for _ in range(33):
        raw.record()
    assert simulated_events.broken  # the hazard the guard prevents


def test_ipc_events_on_rocm_7_14_are_not_limited(simulated_events):
    backend = with_events(simulated_rocm_backend(SimulatedHipRuntime("7.14")), simulated_events)
    event = backend.create_ipc_event()
    assert type(event) is GpuIpcEvent
    for _ in range(1000):
        event.record()
    assert simulated_events.records == 1000


def test_a_cycle_limited_event_can_still_be_exported(simulated_events):
    backend = with_events(simulated_rocm_backend(SimulatedHipRuntime("7.2.1")), simulated_events)
    handle = backend.export_event(backend.create_ipc_event())
    assert isinstance(handle, bytes) and len(handle) > 64


# ----------------------------------------------------------------------------------------- construction
def test_the_hip_binding_satisfies_the_shared_copy_runtime_protocol():
    assert isinstance(SimulatedHipRuntime("7.14").runtime(), CopyRuntime)


def test_from_probe_plans_for_the_current_gpu_and_records_probe_versions(monkeypatch):
    sim = SimulatedHipRuntime("7.2.1")
    monkeypatch.setattr(HipRuntime, "load", classmethod(lambda cls, *a, **k: cls(sim)))
    monkeypatch.setattr(torch.accelerator, "current_device_index", lambda: 0)
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda index: types.SimpleNamespace(gcnArchName="gfx950:sramecc+:xnack-")
    )
    probe = ProbeResult("rocm", 100, True, "ok", {"rocm_version": "7.2.1", "device_source": "amdsmi"})
    backend = RocmBackend.from_probe(probe)
    assert backend.device == torch.device("cuda", 0)
    assert backend.capabilities.kv_formats == frozenset({"bf16", "fp8_e4m3fn"})
    assert backend.capabilities.versions["rocm_version"] == "7.2.1"
    assert backend.capabilities.versions["hip_library"] == sim.path
    assert backend.capabilities.graph_capture is True


def test_gathers_run_through_the_shared_one_pass_gather():
    backend = simulated_rocm_backend(SimulatedHipRuntime("7.14"))
    source = torch.arange(2 * 4 * 8, dtype=torch.bfloat16).view(2, 4, 8)
    destination = torch.empty(3, 8, dtype=torch.bfloat16)
    backend.gather_resident_rows(source, destination, torch.tensor([5, -1, 2]))
    assert torch.equal(destination, torch.stack([source[1, 1], source[0, 0], source[0, 2]]))
