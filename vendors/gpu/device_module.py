"""The one place the shared GPU layer reaches torch for its device: ``torch.accelerator`` for the device scope and
synchronisation, and the device module ``torch.get_device_module(device)`` for what torch.accelerator has no
equivalent of (the raw current-stream handle, capture state, graphs, interprocess events).

Invariant: nothing else in ``vendors/gpu`` (or the CUDA and ROCm backends) calls a torch device namespace by name.
"""

from __future__ import annotations

import contextlib
from types import ModuleType
from typing import Any, Protocol

import torch

from hisparse_hal.errors import InvalidArgumentError, UnsupportedCapabilityError

__all__ = ["GpuDeviceModule", "TorchDeviceModule", "HostDeviceModule", "device_module_for"]


class GpuDeviceModule(Protocol):
    """What the shared GPU layer asks of torch for one device; tests and simulators pass a stand-in."""

    def scope(self, index: int | None = None) -> contextlib.AbstractContextManager[object]:
        """Make device ``index`` (default: this device) torch's current device for a ``with`` block."""

    def current_stream_handle(self) -> int:
        """The raw handle of torch's current stream on this device (0 is the legacy default stream)."""

    def synchronize(self) -> None:
        """Block until the work queued on every stream of this device has completed."""

    def is_current_stream_capturing(self) -> bool:
        """True while torch's current stream is capturing; creates no device context."""

    def new_graph(self) -> Any:
        """A new, empty graph to capture into (``torch.cuda.CUDAGraph`` on CUDA and HIP)."""

    def graph_capture(self, graph: Any) -> contextlib.AbstractContextManager[object]:
        """Capture the block's work into ``graph`` on a side stream the device module makes current."""

    def ipc_event(self) -> Any:
        """A new interprocess event (timing off, spinning wait), created lazily by torch."""

    def open_ipc_event(self, index: int, handle: bytes) -> Any:
        """Open another process's event from its IPC handle, on device ``index``."""


class TorchDeviceModule:
    """torch's API for one GPU: ``torch.accelerator`` and the device module resolved from the device.

    Releases (each from torch's documentation of that release): ``torch.accelerator.synchronize`` 2.6,
    ``torch.accelerator.current_device_index`` 2.7, ``torch.accelerator.device_index`` 2.8,
    ``torch.get_device_module`` 2.5 at the latest. ``torch.Stream`` (what ``torch.accelerator.current_stream``
    returns) carries no raw handle (torch/_C/__init__.pyi), so the handle is the device module stream's
    ``cuda_stream``. ``torch.accelerator.Graph`` captures on the current stream, not on a side stream as this
    layer's contract says (torch/accelerator/graphs.py), so graphs go through the device module. IPC events are the
    device module's ``Event(interprocess=True)`` and ``Event.from_ipc_handle``: ``torch.cuda.Event`` exactly.

    Args:
        device: the GPU, with its index.
        module: torch's device module for it; default ``torch.get_device_module(device)``.
    """

    def __init__(self, device: torch.device, module: ModuleType | None = None) -> None:
        self.device = device
        self.index = device.index if device.index is not None else 0
        self.module = module if module is not None else torch.get_device_module(device)

    @classmethod
    def current(cls, device_type: str) -> TorchDeviceModule:
        """The module of torch's current device of ``device_type`` (``torch.accelerator.current_device_index``,
        torch 2.7); initialises the device, so only a chosen backend calls it."""
        return cls(torch.device(device_type, torch.accelerator.current_device_index()))

    def scope(self, index: int | None = None) -> contextlib.AbstractContextManager[object]:
        """``torch.accelerator.device_index`` for ``index`` (default: this device)."""
        return torch.accelerator.device_index(self.index if index is None else index)

    def current_stream_handle(self) -> int:
        """The raw handle of the device module's current stream on this device."""
        return int(self.module.current_stream(self.device).cuda_stream)

    def synchronize(self) -> None:
        """``torch.accelerator.synchronize`` on this device (a no-op before torch has initialised it)."""
        torch.accelerator.synchronize(self.device)

    def is_current_stream_capturing(self) -> bool:
        """The device module's ``is_current_stream_capturing`` (False where no context exists)."""
        return bool(self.module.is_current_stream_capturing())

    def new_graph(self) -> Any:
        """The device module's graph class, empty."""
        return self.module.CUDAGraph()

    def graph_capture(self, graph: Any) -> contextlib.AbstractContextManager[object]:
        """The device module's ``graph`` context manager (side stream, capture begin and end)."""
        return self.module.graph(graph)

    def ipc_event(self) -> Any:
        """The device module's ``Event(enable_timing=False, blocking=False, interprocess=True)``."""
        return self.module.Event(enable_timing=False, blocking=False, interprocess=True)

    def open_ipc_event(self, index: int, handle: bytes) -> Any:
        """The device module's ``Event.from_ipc_handle(index, handle)``."""
        return self.module.Event.from_ipc_handle(index, handle)


class HostDeviceModule:
    """The host device a test injects under a GPU backend with a simulated runtime: work is synchronous, so there
    is nothing to scope or wait for and nothing is ever capturing; streams, graphs and IPC events do not exist."""

    device = torch.device("cpu")

    def scope(self, index: int | None = None) -> contextlib.AbstractContextManager[object]:
        """A block that changes nothing."""
        return contextlib.nullcontext()

    def current_stream_handle(self) -> int:
        """Raises: UnsupportedCapabilityError: the host has no stream (a simulator passes its own module)."""
        raise self._absent("a stream handle")

    def synchronize(self) -> None:
        """Nothing to wait for: host work has completed when its call returns."""

    def is_current_stream_capturing(self) -> bool:
        """Always False: nothing captures on the host."""
        return False

    def new_graph(self) -> Any:
        """Raises: UnsupportedCapabilityError: no graphs on the host."""
        raise self._absent("graphs")

    def graph_capture(self, graph: Any) -> contextlib.AbstractContextManager[object]:
        """Raises: UnsupportedCapabilityError: no graph capture on the host."""
        raise self._absent("graph capture")

    def ipc_event(self) -> Any:
        """Raises: UnsupportedCapabilityError: no interprocess GPU events on the host."""
        raise self._absent("interprocess events")

    def open_ipc_event(self, index: int, handle: bytes) -> Any:
        """Raises: UnsupportedCapabilityError: no interprocess GPU events on the host."""
        raise self._absent("interprocess events")

    @staticmethod
    def _absent(what: str) -> UnsupportedCapabilityError:
        return UnsupportedCapabilityError(
            f"the host device injected under a GPU backend has no {what}; pass a device_module stand-in "
            "(hisparse_hal.testing.sim_device_module) to simulate one"
        )


def device_module_for(device: torch.device) -> GpuDeviceModule:
    """The device module of a GPU backend's device: :class:`HostDeviceModule` for the host (a test's injected
    device), else :class:`TorchDeviceModule` over ``torch.get_device_module(device)``.

    Raises:
        InvalidArgumentError: ``device`` is not a ``torch.device``.
        RuntimeError: torch has no module for the device type (``torch.get_device_module``'s own error).
    """
    if not isinstance(device, torch.device):
        raise InvalidArgumentError(f"device_module_for: expected a torch.device, got {type(device).__name__}")
    if device.type == "cpu":
        return HostDeviceModule()
    return TorchDeviceModule(device)
