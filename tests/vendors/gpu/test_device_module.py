"""The device seam (``vendors/gpu/device_module.py``): which device module a GPU backend's device gets, what each
call of :class:`TorchDeviceModule` asks of ``torch.accelerator`` and of torch's device module (recorded through a
stand-in module, since this machine has no GPU), and that the shared backend reaches torch only through it."""

from __future__ import annotations

import ast
import contextlib
import logging
import pathlib
import types
from typing import Any

import pytest
import torch

from hisparse_hal.errors import InvalidArgumentError, UnsupportedCapabilityError
from hisparse_hal.testing.sim_device_module import SimulatedDeviceModule
from hisparse_hal.vendors.gpu import events as gpu_events
from hisparse_hal.vendors.gpu.backend import TorchGpuBackend
from hisparse_hal.vendors.gpu.device_module import HostDeviceModule, TorchDeviceModule, device_module_for
from tests.vendors.gpu.test_backend import RecordingRuntime, caps

VENDORS = pathlib.Path(__file__).resolve().parents[3] / "vendors"


class RecordingModule(types.SimpleNamespace):
    """A torch device module stand-in: each call is recorded as (name, arguments)."""

    def __init__(self) -> None:
        super().__init__(calls=[])
        calls = self.calls

        class Event:
            def __init__(self, **kwargs: Any) -> None:
                calls.append(("Event", kwargs))

            @classmethod
            def from_ipc_handle(cls, index: int, handle: bytes) -> str:
                calls.append(("from_ipc_handle", (index, handle)))
                return "opened"

            def ipc_handle(self) -> bytes:
                calls.append(("ipc_handle", None))
                return b"\x07" * 64

        self.Event = Event

    def current_stream(self, device: torch.device) -> Any:
        self.calls.append(("current_stream", device))
        return types.SimpleNamespace(cuda_stream=0x7F00)

    def is_current_stream_capturing(self) -> bool:
        self.calls.append(("is_current_stream_capturing", None))
        return True

    def CUDAGraph(self) -> str:  # noqa: N802 - torch's name
        self.calls.append(("CUDAGraph", None))
        return "graph"

    def graph(self, graph: object) -> contextlib.AbstractContextManager[None]:
        self.calls.append(("graph", graph))
        return contextlib.nullcontext()


def _recording_scope(seen: list[tuple[str, object]]) -> Any:
    """A stand-in for ``torch.accelerator.device_index`` that records the index and changes nothing."""

    def device_index(index: int) -> contextlib.AbstractContextManager[None]:
        seen.append(("device_index", index))
        return contextlib.nullcontext()

    return device_index


# ----------------------------------------------------------------------------------------- which module
def test_a_gpu_device_gets_torchs_own_device_module_with_its_index() -> None:
    chosen = device_module_for(torch.device("cuda", 3))
    assert isinstance(chosen, TorchDeviceModule)
    assert chosen.module is torch.get_device_module("cuda") and chosen.module is torch.cuda
    assert (chosen.device, chosen.index) == (torch.device("cuda", 3), 3)


def test_an_indexless_gpu_device_means_index_0() -> None:
    chosen = device_module_for(torch.device("cuda"))
    assert isinstance(chosen, TorchDeviceModule) and chosen.index == 0


def test_the_host_device_gets_the_host_module() -> None:
    assert isinstance(device_module_for(torch.device("cpu")), HostDeviceModule)


def test_a_device_torch_has_no_module_for_is_torchs_error() -> None:
    with pytest.raises(RuntimeError, match="'meta' does not have a corresponding module"):
        device_module_for(torch.device("meta"))


@pytest.mark.parametrize("bad", ["cuda:0", 0, None], ids=repr)
def test_only_a_torch_device_is_accepted(bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match=f"expected a torch.device, got {type(bad).__name__}$"):
        device_module_for(bad)  # type: ignore[arg-type]


def test_the_backend_resolves_its_module_from_its_device() -> None:
    on_gpu = TorchGpuBackend(caps(), RecordingRuntime(), 2)
    assert isinstance(on_gpu.device_module, TorchDeviceModule) and on_gpu.device_module.index == 2
    assert on_gpu.device_module.module is torch.cuda
    injected = TorchGpuBackend(caps(), RecordingRuntime(), 0, device=torch.device("cpu"))
    assert isinstance(injected.device_module, HostDeviceModule)
    given = SimulatedDeviceModule(0x42)
    assert TorchGpuBackend(caps(), RecordingRuntime(), 0, device_module=given).device_module is given


# ----------------------------------------------------------------------------------------- what each call asks
def test_stream_capture_graph_and_events_go_to_the_device_module() -> None:
    module = RecordingModule()
    gpu = TorchDeviceModule(torch.device("cuda", 1), module)  # type: ignore[arg-type]
    assert gpu.current_stream_handle() == 0x7F00
    assert gpu.is_current_stream_capturing() is True
    graph = gpu.new_graph()
    with gpu.graph_capture(graph):
        pass
    gpu.ipc_event()
    assert gpu.open_ipc_event(1, b"h" * 64) == "opened"
    assert module.calls == [
        ("current_stream", torch.device("cuda", 1)),
        ("is_current_stream_capturing", None),
        ("CUDAGraph", None),
        ("graph", "graph"),
        # torch.cuda.Event(interprocess=True) exactly as the layer made it before the seam
        ("Event", {"enable_timing": False, "blocking": False, "interprocess": True}),
        ("from_ipc_handle", (1, b"h" * 64)),
    ]


def test_scope_and_synchronize_go_to_torch_accelerator(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, object]] = []
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda device=None: seen.append(("synchronize", device)))
    monkeypatch.setattr(torch.accelerator, "device_index", _recording_scope(seen))
    gpu = TorchDeviceModule(torch.device("cuda", 1), RecordingModule())  # type: ignore[arg-type]
    with gpu.scope():
        pass
    with gpu.scope(5):
        pass
    gpu.synchronize()
    assert seen == [("device_index", 1), ("device_index", 5), ("synchronize", torch.device("cuda", 1))]


def test_current_reads_torch_accelerators_current_index(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.accelerator, "current_device_index", lambda: 6)
    gpu = TorchDeviceModule.current("cuda")
    assert (gpu.device, gpu.index, gpu.module) == (torch.device("cuda", 6), 6, torch.cuda)


def test_the_host_module_waits_for_nothing_and_refuses_what_the_host_lacks() -> None:
    host = HostDeviceModule()
    with host.scope(3):
        pass
    host.synchronize()
    assert host.is_current_stream_capturing() is False
    for call, what in [(host.current_stream_handle, "a stream handle"), (host.new_graph, "graphs"),
                       (host.ipc_event, "interprocess events"),
                       (lambda: host.graph_capture(None), "graph capture"),
                       (lambda: host.open_ipc_event(0, b""), "interprocess events")]:
        with pytest.raises(UnsupportedCapabilityError, match=f"has no {what}; pass a device_module stand-in"):
            call()


# ----------------------------------------------------------------------------------------- the backend through it
def test_backend_synchronize_and_unpin_wait_through_the_device_module() -> None:
    landed: list[int] = []
    module = SimulatedDeviceModule(0x10, on_synchronize=lambda: landed.append(1))
    backend = TorchGpuBackend(caps(), RecordingRuntime(), 0, device=torch.device("cpu"), device_module=module)
    backend.synchronize()
    assert (module.synchronizations, landed) == (1, [1])
    host = torch.zeros(4096, dtype=torch.uint8)
    backend.pin_tensor(host)
    backend.unpin_tensor(host)  # queued copies into the pool must land before it is unregistered
    assert module.synchronizations == 2


def test_a_failed_wait_before_unregistering_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    def lost() -> None:
        raise RuntimeError("CUDA error: device context is gone")

    module = SimulatedDeviceModule(0x10, on_synchronize=lost)
    backend = TorchGpuBackend(caps(), RecordingRuntime(), 0, device=torch.device("cpu"), device_module=module)
    host = torch.zeros(4096, dtype=torch.uint8)
    backend.pin_tensor(host)
    with caplog.at_level(logging.WARNING):
        backend.unpin_tensor(host)
    assert "could not wait for device work before unregistering host memory: CUDA error" in caplog.text
    assert backend.pinned_registrations() == ()
    with pytest.raises(RuntimeError, match="device context is gone"):
        backend.synchronize()  # asked for directly, the failure is the caller's


def test_ipc_events_are_made_exported_and_opened_through_the_device_module(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, object]] = []
    monkeypatch.setattr(torch.accelerator, "device_index", _recording_scope(seen))
    module = RecordingModule()
    backend = TorchGpuBackend(caps(), RecordingRuntime(), 2,
                              device_module=TorchDeviceModule(torch.device("cuda", 2), module))  # type: ignore[arg-type]
    event = backend.create_ipc_event()
    with monkeypatch.context() as patch:
        patch.setattr(gpu_events, "_PROCESS_TOKEN", b"\x01" * 16)  # as if exported by another process
        handle = backend.export_event(event)
    opened = backend.import_event(torch.device("cuda", 1), handle)
    assert module.calls == [
        ("Event", {"enable_timing": False, "blocking": False, "interprocess": True}),
        ("ipc_handle", None),  # created eagerly, inside the backend's device scope
        ("ipc_handle", None),
        ("from_ipc_handle", (1, b"\x07" * 64)),
    ]
    # created and exported on the backend's GPU, imported on the one the caller names
    assert [index for _, index in seen] == [2, 2, 1]
    assert (opened.torch_event, opened.device_index, opened.imported) == ("opened", 1, True)


def test_no_module_under_vendors_names_a_torch_device_namespace_but_the_seam() -> None:
    """No ``torch.<device namespace>`` attribute is read anywhere in vendors/ (docstrings aside): the seam module
    reaches the device module through ``torch.get_device_module`` and ``torch.accelerator`` only."""
    namespaces = {"cuda", "xpu", "mps", "mtia", "npu", "hpu"}
    found = []
    for path in sorted(VENDORS.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Attribute) and node.attr in namespaces and isinstance(node.value, ast.Name)
                    and node.value.id == "torch"):
                found.append(f"{path.relative_to(VENDORS)}:{node.lineno}: torch.{node.attr}")
    assert found == [], "\n".join(found)

