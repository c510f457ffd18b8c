"""The shared GPU backend (``vendors/gpu/backend.py``, ``TorchGpuBackend``) with a recording copy runtime, on
the CPU.

The runtime here is a plain Python recorder that moves real bytes; it proves the backend's decisions
(copy path, chunking, error re-basing, teardown tolerance, IPC members' checks, the capture gate).
torch's device module itself (streams, graphs, events) needs a GPU: a SIMULATED one stands in here.
"""

from __future__ import annotations

import ctypes
from typing import Any, Literal, cast

import pytest
import torch

from hisparse_hal.capabilities import Capabilities
from hisparse_hal.errors import (
    DeviceRuntimeError,
    InvalidArgumentError,
    UnsupportedCapabilityError,
)
from hisparse_hal.regions import SwapBatch
from hisparse_hal.testing.sim_device_module import SimulatedDeviceModule
from hisparse_hal.vendors.gpu.backend import TorchGpuBackend
from hisparse_hal.vendors.gpu.events import GpuIpcEvent, encode_event_handle
from hisparse_hal.vendors.gpu.runtime import CopyRuntime


class RecordingRuntime:
    """A CopyRuntime that records calls and copies bytes with memmove (host memory only)."""

    label = "recording runtime"

    def __init__(self, batch: bool = True, fail_at: int | None = None, lost: bool = False) -> None:
        self.batch = batch
        self.fail_at = fail_at  # index within one copy_batch call
        self.lost = lost
        self.calls: list[tuple[str, Any]] = []

    def has_batch_copy(self) -> bool:
        return self.batch

    def copy_batch(self, batch: SwapBatch, stream: int, *, use_attributes: bool) -> None:
        self.calls.append(("batch", (batch.count, stream, use_attributes)))
        if self.fail_at is not None and self.fail_at < batch.count:
            raise DeviceRuntimeError("vendorBatchCopy", 1, "ERROR_INVALID_VALUE", "simulated", self.fail_at)
        for d, s, n in zip(batch.dst.tolist(), batch.src.tolist(), batch.sizes.tolist(), strict=True):
            ctypes.memmove(d, s, n)

    def copy_each(self, batch: SwapBatch, stream: int) -> None:
        self.calls.append(("each", (batch.count, stream)))
        for d, s, n in zip(batch.dst.tolist(), batch.src.tolist(), batch.sizes.tolist(), strict=True):
            ctypes.memmove(d, s, n)

    def register_host(self, address: int, size: int) -> int | None:
        self.calls.append(("register", (address, size)))
        return None

    def unregister_host(self, address: int) -> None:
        self.calls.append(("unregister", address))
        if self.lost:
            raise DeviceRuntimeError("vendorHostUnregister", 4, "ERROR_DEINITIALIZED")

    def is_context_lost(self, error: DeviceRuntimeError) -> bool:
        return error.error_name == "ERROR_DEINITIALIZED"


def caps(batch_copy: Literal["native", "loop"] = "native", cap: int | None = 4, ipc: bool = True) -> Capabilities:
    return Capabilities(
        batch_copy, cap, ipc, None, True, True, False, frozenset({"bf16"}), copy_attributes=batch_copy == "native"
    )


class Backend(TorchGpuBackend):
    name = "test_gpu"


def simulated(backend: TorchGpuBackend) -> SimulatedDeviceModule:
    """The simulated device module under ``backend`` (torch's stream and capture state as attributes)."""
    return cast(SimulatedDeviceModule, backend.device_module)


def setup(
    runtime: RecordingRuntime, capabilities: Capabilities | None = None
) -> tuple[Backend, torch.Tensor, torch.Tensor]:
    backend = Backend(capabilities or caps(), runtime, 0, device=torch.device("cpu"),
                      device_module=SimulatedDeviceModule(0x10))
    device = torch.arange(40 * 16, dtype=torch.int32).view(torch.uint8)[: 10 * 256].clone()
    host = torch.zeros(10, 256, dtype=torch.uint8)
    backend.register_region(device.data_ptr(), device.numel(), "device", device=torch.device("cuda", 0))
    backend.pin_tensor(host)
    return backend, device, host


def spill(device: torch.Tensor, host: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    idx = torch.arange(n, dtype=torch.int64)
    return (
        device.data_ptr() + idx * 256,
        host.data_ptr() + (n - 1 - idx) * 256,
        torch.full((n,), 256, dtype=torch.int64),
    )


def test_the_recording_runtime_satisfies_the_copy_runtime_protocol() -> None:
    assert isinstance(RecordingRuntime(), CopyRuntime)


def test_device_defaults_to_cuda_index_and_index_is_validated() -> None:
    backend = TorchGpuBackend(caps(), RecordingRuntime(), 3)
    assert backend.device == torch.device("cuda", 3)
    assert backend.batch_copy_mode == "auto" and backend.last_swap_path is None
    with pytest.raises(InvalidArgumentError, match="device_index must be an int >= 0, got -1"):
        TorchGpuBackend(caps(), RecordingRuntime(), -1)


def test_native_swap_is_chunked_at_the_cap_with_attributes() -> None:
    runtime = RecordingRuntime()
    backend, device, host = setup(runtime)
    backend.swap_blocks_batch(*spill(device, host, 10))
    assert [c for c in runtime.calls if c[0] == "batch"] == [
        ("batch", (4, 0x10, True)),
        ("batch", (4, 0x10, True)),
        ("batch", (2, 0x10, True)),
    ]
    assert torch.equal(host.flip(0).reshape(-1), device)


def test_no_cap_means_one_call() -> None:
    runtime = RecordingRuntime()
    backend, device, host = setup(runtime, caps(cap=None))
    backend.swap_blocks_batch(*spill(device, host, 10))
    assert [c for c in runtime.calls if c[0] == "batch"] == [("batch", (10, 0x10, True))]


@pytest.mark.parametrize(
    "why, capabilities, batch_symbol, stream, mode, capturing",
    [
        ("legacy default stream", caps(), True, 0, "auto", False),
        ("capabilities say loop", caps("loop"), True, 0x10, "auto", False),
        ("batch symbol missing", caps(), False, 0x10, "auto", False),
        ("loop mode", caps(), True, 0x10, "loop", False),
        ("capturing", caps(), True, 0x10, "auto", True),
    ],
)
def test_per_copy_loop_is_used_when_the_batch_call_cannot_be(why: str, capabilities: Capabilities, batch_symbol: bool,
                                                             stream: int, mode: str, capturing: bool) -> None:
    runtime = RecordingRuntime(batch=batch_symbol)
    backend, device, host = setup(runtime, capabilities)
    simulated(backend).stream, backend.batch_copy_mode, simulated(backend).capturing = stream, mode, capturing
    backend.swap_blocks_batch(*spill(device, host, 10))
    copies = [c for c in runtime.calls if c[0] in ("batch", "each")]
    assert copies == [("each", (10, stream))], why  # the loop is never chunked
    assert backend.last_swap_path == "loop"
    assert torch.equal(host.flip(0).reshape(-1), device)


def test_chunk_error_index_is_rebased_onto_the_whole_swap() -> None:
    runtime = RecordingRuntime(fail_at=1)
    backend, device, host = setup(runtime)
    runtime.fail_at = None
    calls = {"n": 0}
    original = runtime.copy_batch

    def fail_in_second_chunk(batch: SwapBatch, stream: int, *, use_attributes: bool) -> None:
        calls["n"] += 1
        runtime.fail_at = 1 if calls["n"] == 2 else None
        original(batch, stream, use_attributes=use_attributes)

    runtime.copy_batch = fail_in_second_chunk  # type: ignore[method-assign]
    with pytest.raises(
        DeviceRuntimeError,
        match=r"vendorBatchCopy failed with ERROR_INVALID_VALUE \(1\) at descriptor 5: simulated; "
        r"descriptors before 4 were already enqueued",
    ) as info:
        backend.swap_blocks_batch(*spill(device, host, 10))
    assert (info.value.index, info.value.code, info.value.error_name, info.value.call) == (
        5,
        1,
        "ERROR_INVALID_VALUE",
        "vendorBatchCopy",
    )


def test_first_chunk_error_keeps_its_index_and_detail() -> None:
    runtime = RecordingRuntime(fail_at=2)
    backend, device, host = setup(runtime)
    with pytest.raises(DeviceRuntimeError, match="at descriptor 2: simulated$") as info:
        backend.swap_blocks_batch(*spill(device, host, 3))
    assert info.value.detail == "simulated"


def test_unpin_tolerates_a_lost_context_only(caplog: pytest.LogCaptureFixture) -> None:
    runtime = RecordingRuntime(lost=True)
    backend, _device, host = setup(runtime)
    backend.unpin_tensor(host)
    assert "recording runtime: host chunk" in caplog.text and "ERROR_DEINITIALIZED" in caplog.text
    assert backend.pinned_registrations() == ()


def test_ipc_members_need_the_capability() -> None:
    backend = TorchGpuBackend(caps(ipc=False), RecordingRuntime(), 0, device=torch.device("cpu"))
    with pytest.raises(
        UnsupportedCapabilityError, match=r"does not implement create_ipc_event \(this device has no IPC events\)"
    ):
        backend.create_ipc_event()
    with pytest.raises(UnsupportedCapabilityError, match="import_event"):
        backend.import_event(0, b"")


def test_import_in_the_exporting_process_is_rejected_as_cuda_and_hip_do() -> None:
    backend = TorchGpuBackend(caps(), RecordingRuntime(), 0, device=torch.device("cpu"))
    with pytest.raises(
        InvalidArgumentError, match="exported by this same process; CUDA and HIP refuse .*ROCm hip #2882"
    ):
        backend.import_event(torch.device("cuda", 0), encode_event_handle(0, bytes(64)))


@pytest.mark.parametrize(
    "handle, message",
    [
        ("not bytes", "handle must be bytes from export_event, got str"),
        (b"x" * 100, "handle of 100 bytes is not from a GPU backend's export_event"),
        (bytes(64), "handle of 64 bytes is not from a GPU backend's export_event"),
    ],
)
def test_malformed_event_handles_are_rejected(handle: object, message: str) -> None:
    backend = TorchGpuBackend(caps(), RecordingRuntime(), 0, device=torch.device("cpu"))
    with pytest.raises(InvalidArgumentError, match=message):
        backend.import_event(0, handle)  # type: ignore[arg-type]


def test_import_on_a_non_gpu_device_is_rejected() -> None:
    backend = TorchGpuBackend(caps(), RecordingRuntime(), 0, device=torch.device("cpu"))
    with pytest.raises(InvalidArgumentError, match="device must be a GPU device \\('cuda'\\), got cpu"):
        backend.import_event("cpu", encode_event_handle(0, bytes(64)))


def test_export_rejects_objects_that_are_not_exportable_events() -> None:
    backend = TorchGpuBackend(caps(), RecordingRuntime(), 0, device=torch.device("cpu"))
    with pytest.raises(InvalidArgumentError, match="expected an event from create_ipc_event, got object"):
        backend.export_event(object())  # type: ignore[arg-type]
    imported = GpuIpcEvent(object(), 0, 1.0, imported=True)
    with pytest.raises(InvalidArgumentError, match="got GpuIpcEvent that was itself imported"):
        backend.export_event(imported)


def test_capture_is_refused_by_capability_before_touching_the_device():
    no_capture = Capabilities("native", 4, True, None, True, False, False, frozenset({"bf16"}),
                              reasons={"graph_capture": "runtime 1.0: graph capture needs 1.1 (example #1)",
                                       "batch_copy": "a capture note elsewhere is not the reason"})
    backend = Backend(no_capture, RecordingRuntime(), 0, device=torch.device("cpu"))
    with pytest.raises(
        UnsupportedCapabilityError,
        match=r"capture\(\) \(capability graph_capture is False: runtime 1\.0: "
        r"graph capture needs 1\.1 \(example #1\)\)",
    ):
        backend.capture()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 0, -2, True, "30"], ids=repr)
def test_event_timeout_s_is_checked_by_the_constructor(bad: object) -> None:
    with pytest.raises(InvalidArgumentError,
                       match=rf"^event_timeout_s must be a positive, finite number of seconds, got {bad!r}$"):
        TorchGpuBackend(caps(), RecordingRuntime(), 0, device=torch.device("cpu"), event_timeout_s=bad)  # type: ignore[arg-type]
