"""The libcuda binding (``vendors/cuda/runtime.py``, ``CudaDriver``) driven through the simulated driver.

The simulator (``hisparse_hal/testing/sim_cuda_driver.py``) is not the NVIDIA driver: these tests prove the
binding's logic (symbol resolution per version, ABI choice, error checking, context handling, real bytes moved
through the C calling convention), not the hardware.
"""

from __future__ import annotations

import ctypes

import pytest
import torch

from hisparse_hal.errors import BackendUnavailableError, DeviceRuntimeError
from hisparse_hal.regions import Region, RegionTable, SwapBatch
from hisparse_hal.testing.sim_cuda_driver import CODES, DEVICE_ALIAS_OFFSET, SimulatedCudaDriver
from hisparse_hal.vendors.cuda.runtime import (
    CU_MEMCPY_SRC_ACCESS_ORDER_STREAM,
    CudaDriver,
    CUmemcpyAttributes,
    load_libcuda,
)

STREAM = 0x7F00


class Setup:
    """A simulated device buffer, a registered host buffer and a region table over both."""

    def __init__(self, sim: SimulatedCudaDriver, nbytes: int = 8192) -> None:
        self.sim = sim
        self.driver = CudaDriver(0, sim)
        self.device = sim.allocate_device(nbytes)
        self.device.copy_(
            torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
        )
        self.host = torch.zeros(nbytes, dtype=torch.uint8)
        self.driver.register_host(self.host.data_ptr(), nbytes)
        self.table = RegionTable()
        self.table.add(Region(self.device.data_ptr(), nbytes, "explicit", "device"))
        self.table.add(Region(self.host.data_ptr(), nbytes, "pinned_host", "host"))

    def spill(self, blocks: list[int], block: int = 512, sizes: list[int] | None = None) -> SwapBatch:
        """Device block i -> host block blocks[i]."""
        n = len(blocks)
        src = self.device.data_ptr() + torch.arange(n, dtype=torch.int64) * block
        dst = self.host.data_ptr() + torch.tensor(blocks, dtype=torch.int64) * block
        size = (
            torch.tensor(sizes, dtype=torch.int64) if sizes is not None else torch.full((n,), block, dtype=torch.int64)
        )
        return self.table.check_swap_batch(src, dst, size)

    def host_block(self, i: int, block: int = 512) -> torch.Tensor:
        return self.host[i * block:(i + 1) * block]

    def device_block(self, i: int, block: int = 512) -> torch.Tensor:
        return self.device[i * block:(i + 1) * block]


def test_attribute_struct_matches_cuda_12_8_layout() -> None:
    assert ctypes.sizeof(CUmemcpyAttributes) == 24
    assert CUmemcpyAttributes.srcLocHint.offset == 4 and CUmemcpyAttributes.flags.offset == 20
    assert CU_MEMCPY_SRC_ACCESS_ORDER_STREAM == 1


@pytest.mark.parametrize(
    "version, expected", [(11080, False), (12040, False), (12079, False), (12080, True), (12090, True), (13000, True)]
)
def test_batch_symbol_resolves_only_from_driver_12_8(version: int, expected: bool) -> None:
    sim = SimulatedCudaDriver(version)
    driver = CudaDriver(0, sim)
    assert driver.has_batch_copy() is expected
    lookups = sim.calls_to("cuGetProcAddress")
    # Below 12.8 the binding does not ask: a version above the driver's is an error by contract.
    assert lookups == ([{"symbol": b"cuMemcpyBatchAsync", "version": 12080, "flags": 0}] if expected else [])


def test_cuda_13_driver_gets_the_12_8_abi_with_fail_index() -> None:
    sim = SimulatedCudaDriver(13000)
    setup = Setup(sim)
    setup.driver.copy_batch(setup.spill([1, 0]), STREAM, use_attributes=True)
    assert sim.calls_to("cuMemcpyBatchAsync")[-1]["abi"] == 12080
    assert torch.equal(setup.host_block(1), setup.device_block(0))


def test_simulator_itself_remaps_the_name_to_v2_at_13_0() -> None:
    """Guards the simulator: asking at 13000 would hand back the ABI without failIdx (quirk 2)."""
    sim = SimulatedCudaDriver(13000)
    CudaDriver(0, sim).has_batch_copy()
    pointer, status = ctypes.c_void_p(), ctypes.c_int(-1)
    assert sim.cuGetProcAddress_v2(b"cuMemcpyBatchAsync", ctypes.byref(pointer), 13000, 0, ctypes.byref(status)) == 0
    assert pointer.value == ctypes.cast(sim._batch_v2, ctypes.c_void_p).value


def test_batch_copy_moves_real_bytes_with_stream_ordered_source_reads() -> None:
    sim = SimulatedCudaDriver(12080)
    setup = Setup(sim)
    order = [5, 2, 7, 0, 3]
    setup.driver.copy_batch(setup.spill(order), STREAM, use_attributes=True)
    for i, b in enumerate(order):
        assert torch.equal(setup.host_block(b), setup.device_block(i))
    call = sim.calls_to("cuMemcpyBatchAsync")[-1]
    assert call == {"abi": 12080, "count": 5, "stream": STREAM, "num_attrs": 1, "src_access_order": 1}
    assert sim.callback_errors == []


def test_batch_copy_on_the_legacy_stream_fails_with_the_driver_error_name() -> None:
    setup = Setup(SimulatedCudaDriver(12080))
    with pytest.raises(
        DeviceRuntimeError,
        match=r"cuMemcpyBatchAsync failed with CUDA_ERROR_INVALID_VALUE \(1\): 2 descriptors on stream 0x0",
    ) as info:
        setup.driver.copy_batch(setup.spill([0, 1]), 0, use_attributes=True)
    assert info.value.error_name == "CUDA_ERROR_INVALID_VALUE" and info.value.index is None


def test_batch_failure_reports_the_failing_descriptor_index() -> None:
    sim = SimulatedCudaDriver(12080)
    setup = Setup(sim)
    batch = setup.spill([0, 1, 2, 3])
    sim.fail_copies_touching(setup.device.data_ptr() + 2 * 512)
    with pytest.raises(DeviceRuntimeError, match="CUDA_ERROR_INVALID_VALUE .* at descriptor 2") as info:
        setup.driver.copy_batch(batch, STREAM, use_attributes=True)
    assert info.value.index == 2 and info.value.code == 1


def test_zero_byte_descriptors_are_left_out_and_indices_keep_the_callers_numbering() -> None:
    sim = SimulatedCudaDriver(12080)
    setup = Setup(sim)
    batch = setup.spill([0, 1, 2, 3], sizes=[512, 0, 512, 512])
    setup.driver.copy_batch(batch, STREAM, use_attributes=True)  # the batch call rejects 0-byte entries
    assert sim.calls_to("cuMemcpyBatchAsync")[-1]["count"] == 3
    assert torch.equal(setup.host_block(3), setup.device_block(3))
    setup.driver.copy_batch(setup.spill([5], sizes=[0]), STREAM, use_attributes=True)  # nothing left: no call
    assert len(sim.calls_to("cuMemcpyBatchAsync")) == 1
    sim.fail_copies_touching(setup.device.data_ptr() + 3 * 512)
    with pytest.raises(DeviceRuntimeError, match="at descriptor 3"):
        setup.driver.copy_batch(batch, STREAM, use_attributes=True)


def test_batch_without_attributes_is_refused_by_cuda() -> None:
    setup = Setup(SimulatedCudaDriver(12080))
    with pytest.raises(DeviceRuntimeError, match="CUDA_ERROR_INVALID_VALUE"):
        setup.driver.copy_batch(setup.spill([0]), STREAM, use_attributes=False)


def test_batch_on_a_driver_without_the_symbol_is_a_typed_error() -> None:
    setup = Setup(SimulatedCudaDriver(12040))
    with pytest.raises(
        DeviceRuntimeError, match="CUDA_ERROR_NOT_FOUND .*driver 12040 has no batch copy; use copy_each"
    ):
        setup.driver.copy_batch(setup.spill([0]), STREAM, use_attributes=True)


@pytest.mark.parametrize("stream", [0, STREAM])
def test_per_copy_loop_moves_real_bytes_on_any_stream(stream: int) -> None:
    sim = SimulatedCudaDriver(12040)
    setup = Setup(sim)
    setup.driver.copy_each(setup.spill([3, 1, 2], sizes=[512, 0, 100]), stream)
    assert torch.equal(setup.host_block(3), setup.device_block(0))
    assert torch.equal(setup.host_block(2)[:100], setup.device_block(2)[:100])
    assert int(setup.host_block(1).count_nonzero()) == 0
    assert [c["size"] for c in sim.calls_to("cuMemcpyAsync")] == [512, 100]
    assert {c["stream"] for c in sim.calls_to("cuMemcpyAsync")} == {stream}


def test_per_copy_loop_failure_names_the_call_and_index() -> None:
    sim = SimulatedCudaDriver(12040)
    setup = Setup(sim)
    sim.fail_copies_touching(setup.host.data_ptr() + 4 * 512)
    with pytest.raises(
        DeviceRuntimeError,
        match=r"cuMemcpyAsync failed with CUDA_ERROR_INVALID_VALUE \(1\) at descriptor 1: copy of 512 bytes",
    ):
        setup.driver.copy_each(setup.spill([0, 4, 5]), STREAM)


def test_every_call_runs_with_the_primary_context_pushed_and_popped() -> None:
    sim = SimulatedCudaDriver(12080)
    setup = Setup(sim)
    pushes_before = len(sim.calls_to("cuCtxPushCurrent"))
    setup.driver.copy_batch(setup.spill([0]), STREAM, use_attributes=True)
    assert len(sim.calls_to("cuCtxPushCurrent")) == pushes_before + 1
    assert sim.calls_to("cuCtxPushCurrent")[-1] == {"context": sim.primary_context(0)}
    assert len(sim.calls_to("cuCtxPopCurrent")) == len(sim.calls_to("cuCtxPushCurrent"))
    assert len(sim.calls_to("cuDevicePrimaryCtxRetain")) == 1  # retained once


def test_no_push_when_the_primary_context_is_already_current() -> None:
    sim = SimulatedCudaDriver(12080)
    setup = Setup(sim)
    assert sim.cuCtxPushCurrent_v2(sim.primary_context(0)) == 0  # as torch leaves it after cudaSetDevice
    pushes = len(sim.calls_to("cuCtxPushCurrent"))
    setup.driver.copy_batch(setup.spill([0]), STREAM, use_attributes=True)
    assert len(sim.calls_to("cuCtxPushCurrent")) == pushes


def test_registration_is_portable_and_double_registration_is_a_named_error() -> None:
    sim = SimulatedCudaDriver(12080)
    driver = CudaDriver(0, sim)
    host = torch.zeros(4096, dtype=torch.uint8)
    assert driver.register_host(host.data_ptr(), 4096) is None  # attribute 91 set: no alias
    assert sim.registered[host.data_ptr()] == (4096, 0x01)  # CU_MEMHOSTREGISTER_PORTABLE
    with pytest.raises(
        DeviceRuntimeError,
        match=r"cuMemHostRegister failed with CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED \(712\): "
        r"registering 4096 bytes",
    ):
        driver.register_host(host.data_ptr(), 4096)
    driver.unregister_host(host.data_ptr())
    assert sim.registered == {}
    with pytest.raises(
        DeviceRuntimeError, match="cuMemHostUnregister failed with CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED"
    ) as info:
        driver.unregister_host(host.data_ptr())
    assert not driver.is_context_lost(info.value)


def test_registration_returns_the_device_alias_where_the_device_cannot_use_host_pointers() -> None:
    sim = SimulatedCudaDriver(12080, host_pointer_usable=False)
    driver = CudaDriver(0, sim)
    host = torch.zeros(8192, dtype=torch.uint8)
    alias = driver.register_host(host.data_ptr(), 8192)
    assert alias == host.data_ptr() + DEVICE_ALIAS_OFFSET != host.data_ptr()
    assert sim.registered[host.data_ptr()] == (8192, 0x03)  # PORTABLE | DEVICEMAP
    assert sim.calls_to("cuMemHostGetDevicePointer") == [{"address": host.data_ptr(), "flags": 0}]


def test_host_pointer_attribute_is_read_once_for_the_drivers_device_without_a_context() -> None:
    sim = SimulatedCudaDriver(12080, device_count=2, host_pointer_usable=False)
    driver = CudaDriver(1, sim)
    assert driver.host_pointer_usable_on_device() is False
    assert driver.host_pointer_usable_on_device() is False
    assert sim.calls_to("cuDeviceGetAttribute") == [{"attribute": 91, "device": 1}]
    assert sim.calls_to("cuDevicePrimaryCtxRetain") == []
    assert CudaDriver(0, SimulatedCudaDriver(12080)).host_pointer_usable_on_device() is True


def test_registration_never_asks_for_an_alias_where_host_pointers_are_usable() -> None:
    sim = SimulatedCudaDriver(12080, host_pointer_usable=True)
    driver = CudaDriver(0, sim)
    host = torch.zeros(4096, dtype=torch.uint8)
    assert driver.register_host(host.data_ptr(), 4096) is None
    assert sim.calls_to("cuMemHostGetDevicePointer") == []


def test_failed_alias_query_releases_the_registration_and_names_the_call() -> None:
    sim = SimulatedCudaDriver(12080, host_pointer_usable=False, device_pointer_error="CUDA_ERROR_OUT_OF_MEMORY")
    driver = CudaDriver(0, sim)
    host = torch.zeros(4096, dtype=torch.uint8)
    with pytest.raises(
        DeviceRuntimeError,
        match=r"cuMemHostGetDevicePointer failed with CUDA_ERROR_OUT_OF_MEMORY \(2\): device alias of 0x[0-9a-f]+ "
              r"\(\+4096 bytes\); the registration was released",
    ):
        driver.register_host(host.data_ptr(), 4096)
    assert sim.registered == {}
    assert sim.calls_to("cuMemHostUnregister") == [{"address": host.data_ptr()}]
    assert sim.calls_to("cuCtxPopCurrent") and sim._stack() == []  # the context was popped


def test_host_pointer_attribute_query_on_a_bad_ordinal_is_a_typed_error() -> None:
    driver = CudaDriver(3, SimulatedCudaDriver(12080, device_count=1))
    expected = "cuDeviceGet failed with CUDA_ERROR_INVALID_DEVICE .*device ordinal 3"
    with pytest.raises(DeviceRuntimeError, match=expected):
        driver.host_pointer_usable_on_device()


def test_lost_context_is_recognised() -> None:
    sim = SimulatedCudaDriver(12080)
    driver = CudaDriver(0, sim)
    host = torch.zeros(4096, dtype=torch.uint8)
    driver.register_host(host.data_ptr(), 4096)
    sim.lose_context()
    with pytest.raises(DeviceRuntimeError, match="CUDA_ERROR_DEINITIALIZED") as info:
        driver.unregister_host(host.data_ptr())
    assert driver.is_context_lost(info.value)


def test_unknown_error_code_still_gets_a_name() -> None:
    driver = CudaDriver(0, SimulatedCudaDriver(12080))
    driver.driver_version()
    assert driver.error_name(12345) == "CUresult 12345"
    assert driver.error_name(CODES["CUDA_ERROR_ILLEGAL_ADDRESS"]) == "CUDA_ERROR_ILLEGAL_ADDRESS"


def test_cuinit_failure_is_a_typed_error() -> None:
    with pytest.raises(DeviceRuntimeError, match=r"cuInit failed with CUDA_ERROR_NO_DEVICE \(100\)"):
        CudaDriver(0, SimulatedCudaDriver(12080, device_count=0)).driver_version()


def test_bad_device_ordinal_is_a_typed_error() -> None:
    driver = CudaDriver(3, SimulatedCudaDriver(12080, device_count=1))
    with pytest.raises(
        DeviceRuntimeError, match="cuDeviceGet failed with CUDA_ERROR_INVALID_DEVICE .*device ordinal 3"
    ):
        driver.register_host(torch.zeros(16, dtype=torch.uint8).data_ptr(), 16)


def test_library_lacking_required_symbols_is_unavailable() -> None:
    class Empty:
        pass

    with pytest.raises(BackendUnavailableError, match=r"the CUDA driver library lacks \['cuInit'"):
        CudaDriver(0, Empty()).driver_version()


def test_missing_libcuda_lists_every_path_tried(tmp_path) -> None:
    paths = (str(tmp_path / "libcuda.so.1"), str(tmp_path / "lib64" / "libcuda.so.1"))
    with pytest.raises(BackendUnavailableError, match="cannot load the CUDA driver library; tried") as info:
        load_libcuda(paths)
    message = str(info.value)
    assert all(path in message for path in paths)
    assert "LD_LIBRARY_PATH" in message


def test_binding_is_lazy_no_library_is_loaded_at_construction() -> None:
    sim = SimulatedCudaDriver(12080)
    CudaDriver(0, sim)
    assert sim.calls == []
