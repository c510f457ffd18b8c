"""``TorchGpuBackend.gather_resident_rows`` (``vendors/gpu/backend.py``) checks row ids on the device: no read-back
to the host, a bad id reported later.

CPU tensors stand in for device memory (a simulated ROCm backend on the CPU device); the shared guard of
``host_sync_guard`` fails on every operator or Tensor method (``.tolist()``, ``.item()``) that would read a
device value back to the host. The last test runs the same gather on a real GPU under
``torch.cuda.set_sync_debug_mode("error")`` and is skipped without one.
"""

from __future__ import annotations

import pytest
import torch

from hisparse_hal import gather
from hisparse_hal.errors import InvalidArgumentError
from hisparse_hal.gather import gather_rows
from hisparse_hal.testing.host_sync_guard import HostSyncError, no_host_sync
from hisparse_hal.testing.sim_hip_runtime import SimulatedHipRuntime, simulated_rocm_backend
from hisparse_hal.vendors.cpu.backend import CpuBackend


def _source() -> torch.Tensor:
    return torch.arange(4 * 8 * 16, dtype=torch.int32).to(torch.uint8).view(4, 8, 16)


@pytest.fixture
def gpu_layer():
    return simulated_rocm_backend(SimulatedHipRuntime("7.14"))


def test_guard_catches_the_host_side_range_check():
    """The guard is not blind: the host-checked gather (what the CPU device uses) trips it."""
    source, out = _source(), torch.empty(2, 16, dtype=torch.uint8)
    with pytest.raises(HostSyncError, match="reads (a )?device values? on the host"):
        with no_host_sync():
            gather_rows(source, out, torch.tensor([1, 2]), check_range=True)


def _check_gpu_layer_gather_reads_nothing_back(gpu_layer, ids):
    source, out = _source(), torch.empty(3, 16, dtype=torch.uint8)
    row_ids = torch.tensor(ids)
    with no_host_sync() as guard:
        gpu_layer.gather_resident_rows(source, out, row_ids)
    assert "aten.index_select.out" in guard.seen  # the gather ran under the guard
    rows = source.view(-1, 16)
    assert torch.equal(out[0], rows[3])


@pytest.mark.parametrize("ids", [[3, -1, 31], [3, 32, -5]], ids=["valid_ids", "out_of_range_ids"])
def test_gpu_layer_gather_reads_nothing_back_to_the_host(gpu_layer, ids):
    _check_gpu_layer_gather_reads_nothing_back(gpu_layer, ids)


@pytest.mark.parametrize("readback", ["tolist", "item"])
def test_read_back_check_fails_a_device_check_that_reads_ids_with_a_tensor_method(gpu_layer, monkeypatch, readback):
    """Planted bug: the device-side range check reads the ids to Python first (never reaching the dispatcher)."""
    real_clamp = gather._clamp_and_record

    def clamp_after_reading_ids(row_ids, total, block_size, record):
        ids = row_ids.tolist() if readback == "tolist" else [row_ids[i].item() for i in range(row_ids.numel())]
        if any(not -1 <= i < total for i in ids):
            record[0] = 1
        return real_clamp(row_ids, total, block_size, record)

    monkeypatch.setattr(gather, "_clamp_and_record", clamp_after_reading_ids)
    with pytest.raises(HostSyncError, match=f"Tensor.{readback} reads a device value on the host"):
        _check_gpu_layer_gather_reads_nothing_back(gpu_layer, [3, -1, 31])


def test_gpu_layer_reports_an_out_of_range_id_through_raise_gather_faults(gpu_layer):
    source, out = _source(), torch.empty(3, 16, dtype=torch.uint8)
    gpu_layer.gather_resident_rows(source, out, torch.tensor([3, 32, -1]))  # does not raise: nothing read back
    rows = source.view(-1, 16)
    assert torch.equal(out[0], rows[3]) and torch.equal(out[1], rows[31]) and torch.equal(out[2], rows[0])
    with pytest.raises(
        InvalidArgumentError,
        match=r"gather row_ids\[1\] = 32 is out of range: ids must be -1 \(not resident\) or in \[0, 32\) "
        r"for 4 blocks of 8 rows; found by the device-side check after the gather ran.*discard it",
    ):
        gpu_layer.raise_gather_faults()
    gpu_layer.raise_gather_faults()  # reported once, then cleared


def test_gpu_layer_keeps_the_first_fault_until_it_is_read(gpu_layer):
    source, out = _source(), torch.empty(2, 16, dtype=torch.uint8)
    gpu_layer.gather_resident_rows(source, out, torch.tensor([0, -2], dtype=torch.int32))
    gpu_layer.gather_resident_rows(source, out, torch.tensor([99, 0]))
    with pytest.raises(InvalidArgumentError, match=r"row_ids\[1\] = -2 is out of range"):
        gpu_layer.raise_gather_faults()


def test_gpu_layer_with_no_gather_yet_has_no_fault_to_raise(gpu_layer):
    gpu_layer.raise_gather_faults()


def test_cpu_device_raises_from_the_gather_and_has_nothing_deferred():
    backend = CpuBackend()
    source, out = _source(), torch.zeros(2, 16, dtype=torch.uint8)
    with pytest.raises(InvalidArgumentError, match=r"row_ids\[1\] = 32 is out of range"):
        backend.gather_resident_rows(source, out, torch.tensor([1, 32]))
    assert out.eq(0).all()
    backend.raise_gather_faults()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU")
def test_gpu_gather_does_not_synchronize_under_sync_debug_mode_error():
    from hisparse_hal.vendors.cuda.capabilities import plan_capabilities
    from hisparse_hal.vendors.cuda.runtime import CudaDriver
    from hisparse_hal.vendors.gpu.backend import TorchGpuBackend

    backend = TorchGpuBackend(plan_capabilities(12080, "sm_90"), CudaDriver(0), torch.cuda.current_device())
    source = _source().to(backend.device)
    out = torch.empty(3, 16, dtype=torch.uint8, device=backend.device)
    good, bad = torch.tensor([3, -1, 31], device=backend.device), torch.tensor([3, 32, -5], device=backend.device)
    backend.gather_resident_rows(source, out, good)  # the fault record is allocated outside the check
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        backend.gather_resident_rows(source, out, good)
        backend.gather_resident_rows(source, out, bad)
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    with pytest.raises(InvalidArgumentError, match=r"row_ids\[1\] = 32 is out of range"):
        backend.raise_gather_faults()
