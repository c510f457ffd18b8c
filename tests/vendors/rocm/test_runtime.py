"""The HIP runtime binding (``vendors/rocm/runtime.py``, ``HipRuntime``), driven through its C ABI by the simulated
HIP runtime (``hisparse_hal/testing/sim_hip_runtime.py``): every return code checked, batch descriptors passed by
pointer, attributes only where allowed, the library found in order with every path listed when none loads."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest
import torch

from hisparse_hal.errors import BackendUnavailableError, DeviceRuntimeError, InvalidArgumentError
from hisparse_hal.regions import Region, RegionTable
from hisparse_hal.testing.sim_hip_runtime import RELEASES, SimulatedHipRuntime
from hisparse_hal.vendors.rocm.runtime import (
    LIBRARY_NAMES,
    HipMemcpyAttributes,
    HipRuntime,
    load_hip_library,
    mapped_hip_libraries,
)

STREAM = 0x7000


def blocks(sim: SimulatedHipRuntime, count: int, size: int = 32):
    """A simulated device buffer and a registered host buffer of ``count`` blocks, and a validated batch
    copying device block i to host block count-1-i."""
    device = torch.randint(0, 256, (count, size), dtype=torch.uint8)
    host = torch.zeros(count, size, dtype=torch.uint8)
    sim.adopt_device_memory(device)
    runtime = sim.runtime()
    runtime.register_host(host.data_ptr(), host.numel())
    table = RegionTable()
    table.add(Region(device.data_ptr(), device.numel(), "device_cache", "dev"))
    table.add(Region(host.data_ptr(), host.numel(), "pinned_host", "host"))
    order = torch.arange(count - 1, -1, -1)
    batch = table.check_swap_batch(
        device.data_ptr() + torch.arange(count) * size, host.data_ptr() + order * size, torch.full((count,), size)
    )
    return runtime, device, host, batch, order


def test_hip_memcpy_attributes_matches_the_c_layout():
    assert ctypes.sizeof(HipMemcpyAttributes) == 24
    assert ctypes.alignment(HipMemcpyAttributes) == 4


def test_runtime_reads_the_version_and_error_names_through_the_c_abi():
    sim = SimulatedHipRuntime("7.2.1")
    runtime = sim.runtime()
    assert runtime.runtime_version() == RELEASES["7.2.1"].version == 70253211
    assert runtime.error_name(801) == "hipErrorNotSupported"
    assert runtime.error_name(12345) == "hipErrorUnknown"
    assert sim.callback_errors == []


@pytest.mark.parametrize("release,expected", [("7.0", False), ("7.1", True), ("7.14", True)])
def test_runtime_probes_the_batch_symbol(release, expected):
    assert SimulatedHipRuntime(release).runtime().has_batch_copy() is expected


def test_copy_batch_is_one_call_that_moves_every_byte_once_synchronized():
    sim = SimulatedHipRuntime("7.2.1")
    runtime, device, host, batch, order = blocks(sim, 100)
    runtime.copy_batch(batch, STREAM, use_attributes=False)
    assert sim.calls["hipMemcpyBatchAsync"] == 1 and sim.calls["hipMemcpyAsync"] == 0
    assert not torch.equal(host[order], device)  # queued on the stream, not yet run
    sim.synchronize(STREAM)
    assert torch.equal(host[order], device)
    assert sim.callback_errors == []


def test_copy_batch_passes_the_descriptor_tensors_memory_directly():
    sim = SimulatedHipRuntime("7.14")
    runtime, _device, _host, batch, _order = blocks(sim, 4)
    runtime.copy_batch(batch, STREAM, use_attributes=False)
    # The simulator read the arrays at the pointers it was given: the same values, in order.
    logged = [(d, s, n) for _call, d, s, n in sim.copy_log]
    assert logged == list(zip(batch.dst.tolist(), batch.src.tolist(), batch.sizes.tolist(), strict=True))


def test_copy_batch_with_attributes_asks_for_stream_ordered_source_reads():
    sim = SimulatedHipRuntime("7.13")
    runtime, _device, _host, batch, _order = blocks(sim, 5)
    runtime.copy_batch(batch, STREAM, use_attributes=True)
    assert sim.batch_attribute_orders == [(1, 1, 1, 1, 1)]  # hipMemcpySrcAccessOrderStream for every copy
    assert sim.callback_errors == []


def test_copy_batch_with_attributes_on_rocm_7_2_fails_with_hip_error_801():
    sim = SimulatedHipRuntime("7.2.3")
    runtime, _device, host, batch, _order = blocks(sim, 3)
    with pytest.raises(
        DeviceRuntimeError, match=r"hipMemcpyBatchAsync failed with hipErrorNotSupported \(801\)"
    ) as info:
        runtime.copy_batch(batch, STREAM, use_attributes=True)
    assert info.value.index is None
    sim.synchronize()
    assert int(host.sum()) == 0


def test_copy_batch_names_the_failing_descriptor_the_runtime_reports():
    sim = SimulatedHipRuntime("7.14")
    runtime, device, host, batch, _order = blocks(sim, 6)
    runtime.unregister_host(host.data_ptr())  # the runtime no longer knows the destination
    with pytest.raises(
        DeviceRuntimeError, match=r"hipErrorInvalidValue \(1\) at descriptor 0: 6 copies on stream 0x7000"
    ) as info:
        runtime.copy_batch(batch, STREAM, use_attributes=False)
    assert (info.value.call, info.value.code, info.value.index) == ("hipMemcpyBatchAsync", 1, 0)


def test_copy_batch_leaves_zero_byte_descriptors_out_and_numbers_errors_as_given():
    sim = SimulatedHipRuntime("7.14")
    runtime, device, host, batch, order = blocks(sim, 6)
    sizes = batch.sizes.clone()
    sizes[[0, 2]] = 0
    dst = batch.dst.clone()
    dst[4] = 0x10  # unknown to the runtime
    sparse = batch.__class__(batch.src, dst, sizes, batch.src_region, batch.dst_region, batch.regions)
    with pytest.raises(DeviceRuntimeError, match="at descriptor 4") as info:
        runtime.copy_batch(sparse, STREAM, use_attributes=False)
    assert info.value.index == 4
    dst[4] = batch.dst[4]
    runtime.copy_batch(sparse, STREAM, use_attributes=False)
    assert sim.batch_sizes == [4]
    sim.synchronize()
    kept = torch.tensor([1, 3, 4, 5])
    assert torch.equal(host[order][kept], device[kept])
    assert int(host[order][[0, 2]].sum()) == 0


def test_copy_batch_of_only_zero_byte_descriptors_makes_no_call():
    sim = SimulatedHipRuntime("7.14")
    runtime, _device, _host, batch, _order = blocks(sim, 3)
    empty = batch.__class__(
        batch.src, batch.dst, torch.zeros(3, dtype=torch.int64), batch.src_region, batch.dst_region, batch.regions
    )
    runtime.copy_batch(empty, STREAM, use_attributes=False)
    runtime.copy_each(empty, STREAM)
    assert sim.calls["hipMemcpyBatchAsync"] == sim.calls["hipMemcpyAsync"] == 0


def test_copy_batch_refuses_more_descriptors_than_the_cap_before_calling_the_runtime():
    sim = SimulatedHipRuntime("7.14")
    runtime, _device, _host, batch, _order = blocks(sim, 8193, size=1)
    with pytest.raises(InvalidArgumentError, match="given 8193 descriptors; more than 8192 fault the GPU"):
        runtime.copy_batch(batch, STREAM, use_attributes=False)
    assert sim.calls["hipMemcpyBatchAsync"] == 0 and not sim.faulted


def test_copy_batch_without_the_symbol_is_refused():
    sim = SimulatedHipRuntime("7.0")
    runtime, _device, _host, batch, _order = blocks(sim, 2)
    with pytest.raises(InvalidArgumentError, match="has no hipMemcpyBatchAsync"):
        runtime.copy_batch(batch, STREAM, use_attributes=False)


def test_copy_each_issues_one_async_copy_per_descriptor():
    sim = SimulatedHipRuntime("7.0")
    runtime, device, host, batch, order = blocks(sim, 7)
    runtime.copy_each(batch, STREAM)
    assert sim.calls["hipMemcpyAsync"] == 7
    sim.synchronize(STREAM)
    assert torch.equal(host[order], device)


def test_copy_each_names_the_failing_descriptor_and_what_was_enqueued():
    sim = SimulatedHipRuntime("7.0")
    runtime, _device, host, batch, _order = blocks(sim, 4)
    bad = batch.__class__(
        batch.src.clone(), batch.dst.clone(), batch.sizes, batch.src_region, batch.dst_region, batch.regions
    )
    bad.src[2] = 0x10  # no memory the simulated runtime knows
    with pytest.raises(
        DeviceRuntimeError, match="hipMemcpyAsync failed with hipErrorInvalidValue .1. at descriptor 2"
    ) as info:
        runtime.copy_each(bad, STREAM)
    assert "descriptors before 2 were already enqueued" in str(info.value)
    assert sim.calls["hipMemcpyAsync"] == 3


def test_register_host_returns_the_device_alias_and_unregister_releases_it():
    sim = SimulatedHipRuntime("7.2.1", alias_offset=0x1000_0000)
    runtime = sim.runtime()
    host = torch.zeros(4096, dtype=torch.uint8)
    alias = runtime.register_host(host.data_ptr(), 4096)
    assert alias == host.data_ptr() + 0x1000_0000
    assert sim.registrations[host.data_ptr()].flags == 0x3  # hipHostRegisterMapped | hipHostRegisterPortable
    runtime.unregister_host(host.data_ptr())
    assert sim.registrations == {}


def test_register_host_errors_carry_the_hip_error_name():
    sim = SimulatedHipRuntime("7.2.1", fail_register_on_call=1)
    runtime = sim.runtime()
    host = torch.zeros(64, dtype=torch.uint8)
    with pytest.raises(DeviceRuntimeError, match=r"hipHostRegister failed with hipErrorOutOfMemory \(2\): 64 bytes at"):
        runtime.register_host(host.data_ptr(), 64)


def test_register_host_releases_the_range_when_the_alias_query_fails():
    sim = SimulatedHipRuntime("7.2.1", fail_device_pointer_on_call=1)
    runtime = sim.runtime()
    host = torch.zeros(64, dtype=torch.uint8)
    with pytest.raises(
        DeviceRuntimeError, match="hipHostGetDevicePointer failed with hipErrorInvalidValue .*registration released"
    ):
        runtime.register_host(host.data_ptr(), 64)
    assert sim.registrations == {}


def test_unregister_of_an_unknown_range_raises_with_the_hip_name():
    runtime = SimulatedHipRuntime("7.2.1").runtime()
    with pytest.raises(
        DeviceRuntimeError, match=r"hipHostUnregister failed with hipErrorHostMemoryNotRegistered \(713\)"
    ) as info:
        runtime.unregister_host(0x1234000)
    assert runtime.is_context_lost(info.value) is False


def test_errors_after_teardown_count_as_a_lost_context():
    sim = SimulatedHipRuntime("7.2.1")
    runtime = sim.runtime()
    host = torch.zeros(64, dtype=torch.uint8)
    runtime.register_host(host.data_ptr(), 64)
    sim.shutdown()
    with pytest.raises(DeviceRuntimeError, match="hipErrorDeinitialized") as info:
        runtime.unregister_host(host.data_ptr())
    assert runtime.is_context_lost(info.value) is True


class _Library:
    def __init__(self, missing=()):
        self.path = "<partial library>"
        self.sim = SimulatedHipRuntime("7.14")
        self.missing = set(missing)

    def address(self, name):
        return None if name in self.missing else self.sim.address(name)


def test_a_library_missing_required_symbols_is_not_a_hip_runtime():
    with pytest.raises(
        BackendUnavailableError, match=r"does not export \['hipHostRegister', 'hipHostGetDevicePointer'\]"
    ):
        HipRuntime(_Library(missing={"hipHostRegister", "hipHostGetDevicePointer"}))


# ----------------------------------------------------------------------------------------- loading
def test_load_tries_names_in_order_and_lists_every_path_when_none_loads(tmp_path):
    present = tmp_path / "libamdhip64.so.7"
    present.write_bytes(b"not an ELF file")
    attempts: list[str] = []

    def loader(path):
        attempts.append(path)
        raise OSError(f"{path}: invalid ELF header")

    with pytest.raises(BackendUnavailableError) as info:
        load_hip_library(loader, directories=[tmp_path])
    message = str(info.value)
    assert attempts == ["libamdhip64.so", str(present), "libamdhip64.so.7", "libamdhip64.so.6"]
    for name in LIBRARY_NAMES:
        assert f"{tmp_path / name}" in message
        assert f"{name} (dynamic linker search)" in message
    assert f"{tmp_path / 'libamdhip64.so'}: not present" in message
    assert "invalid ELF header" in message


def test_load_prefers_the_library_torch_already_mapped(tmp_path):
    mapped = tmp_path / "torch-lib" / "libamdhip64.so"
    mapped.parent.mkdir()
    mapped.write_bytes(b"")
    (tmp_path / "libamdhip64.so").write_bytes(b"")
    # Any real handle does (this process's own symbols): the test is about which path is loaded.
    library = load_hip_library(lambda path: ctypes.CDLL(None), directories=[tmp_path], preferred=[str(mapped)])
    assert library.path == str(mapped)


def test_load_falls_back_to_so_7_then_so_6(tmp_path):
    (tmp_path / "libamdhip64.so.6").write_bytes(b"")
    loaded = load_hip_library(
        lambda path: ctypes.CDLL(None) if path.endswith(".so.6") else (_ for _ in ()).throw(OSError("no")),
        directories=[tmp_path],
    )
    assert Path(loaded.path).name == "libamdhip64.so.6"


def test_mapped_libraries_are_read_from_proc_maps_lines():
    maps = (
        "7f10-7f20 r-xp 00000000 08:01 42 /venv/torch/lib/libamdhip64.so\n"
        "7f20-7f30 r--p 00000000 08:01 42 /venv/torch/lib/libamdhip64.so\n"
        "7f30-7f40 r-xp 00000000 08:01 43 /usr/lib/libc.so.6\n"
        "7f40-7f50 rw-p 00000000 00:00 0 \n"
    )
    assert mapped_hip_libraries(maps) == ["/venv/torch/lib/libamdhip64.so"]
