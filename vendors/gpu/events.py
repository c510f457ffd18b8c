"""Interprocess events on a GPU: the picklable handle codec and :class:`GpuIpcEvent`, the device module's
interprocess ``Event`` (``torch.cuda.Event`` on CUDA and HIP) with a bounded ``synchronize``.

A handle carries the exporting process's token and pid, so importing it in its own process (which CUDA and
HIP refuse, ROCm hip #2882) is caught before any device call.
"""

from __future__ import annotations

import os
import struct
import time
import uuid
from typing import Any

from hisparse_hal.errors import EventTimeoutError, InvalidArgumentError
from hisparse_hal.events import DEFAULT_TIMEOUT, WaitDefault, check_timeout_s, wait_bound

__all__ = ["IPC_EVENT_HANDLE_BYTES", "GpuIpcEvent", "encode_event_handle", "decode_event_handle"]

#: Bytes of a CUDA/HIP IPC event handle (``cudaIpcEventHandle_t`` / ``hipIpcEventHandle_t``).
IPC_EVENT_HANDLE_BYTES = 64
_HANDLE_MAGIC = b"HSHALEV1"
_HANDLE_HEADER = struct.Struct("<8s16sqi")  # magic, exporting process token, pid, device index
#: Identifies this process in exported handles; with the pid it survives PID namespaces and fork.
_PROCESS_TOKEN = uuid.uuid4().bytes


def encode_event_handle(device_index: int, handle: bytes) -> bytes:
    """Pack an IPC event handle with its device index and exporting process into picklable bytes.

    Raises:
        InvalidArgumentError: ``handle`` is not 64 bytes.
    """
    if len(handle) != IPC_EVENT_HANDLE_BYTES:
        raise InvalidArgumentError(
            f"an IPC event handle must be {IPC_EVENT_HANDLE_BYTES} bytes, got {len(handle)}"
        )
    return _HANDLE_HEADER.pack(_HANDLE_MAGIC, _PROCESS_TOKEN, os.getpid(), device_index) + bytes(handle)


def decode_event_handle(data: object) -> tuple[bool, int, bytes]:
    """Unpack bytes made by :func:`encode_event_handle`.

    Returns:
        ``(exported_by_this_process, device_index, handle)``.

    Raises:
        InvalidArgumentError: not bytes, the wrong length, or not a hisparse-hal event handle.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise InvalidArgumentError(f"import_event: handle must be bytes from export_event, got {type(data).__name__}")
    raw = bytes(data)
    expected = _HANDLE_HEADER.size + IPC_EVENT_HANDLE_BYTES
    if len(raw) != expected or not raw.startswith(_HANDLE_MAGIC):
        raise InvalidArgumentError(
            f"import_event: handle of {len(raw)} bytes is not from a GPU backend's export_event "
            f"(expected {expected} bytes starting with {_HANDLE_MAGIC!r})"
        )
    _magic, token, pid, device_index = _HANDLE_HEADER.unpack_from(raw)
    same_process = token == _PROCESS_TOKEN and pid == os.getpid()
    return same_process, device_index, raw[_HANDLE_HEADER.size:]


class GpuIpcEvent:
    """An interprocess event of the device module (``torch.cuda.Event`` on CUDA and HIP) with a bounded
    ``synchronize``.

    ``torch_event`` is the wrapped event (from :meth:`~.device_module.GpuDeviceModule.ipc_event`);
    ``record``/``wait``/``query`` forward to it. ``timeout_s`` bounds
    ``synchronize()`` without a timeout (positive and finite: anything else raises ``InvalidArgumentError``).
    """

    def __init__(self, torch_event: Any, device_index: int, timeout_s: float, imported: bool) -> None:
        self.torch_event = torch_event
        self.device_index = device_index
        self.timeout_s = timeout_s  # checked by the property's setter
        self.imported = imported

    @property
    def timeout_s(self) -> float:
        """Bound of ``synchronize()`` without its own timeout, in seconds."""
        return self._timeout_s

    @timeout_s.setter
    def timeout_s(self, value: float) -> None:
        self._timeout_s = check_timeout_s(value, "GPU IPC event timeout_s")

    def record(self, stream: object | None = None) -> None:
        """Record on ``stream`` (the current stream when None)."""
        # The contract's stream is opaque (``object``); here it is a torch stream, which torch checks.
        self.torch_event.record(stream)

    def wait(self, stream: object | None = None) -> None:
        """Make ``stream`` (the current stream when None) wait for the event on the device."""
        self.torch_event.wait(stream)

    def query(self) -> bool:
        """True when the work recorded before the event has completed."""
        return bool(self.torch_event.query())

    def synchronize(self, timeout: float | None | WaitDefault = DEFAULT_TIMEOUT) -> None:
        """Block until the event completes, at most ``timeout`` seconds: ``timeout_s`` when omitted, no bound
        when ``None`` (the only infinite wait: a peer that never records then hangs it).

        Raises:
            InvalidArgumentError: ``timeout`` is NaN, infinite, zero or negative, a bool or not a number
                (checked before the event is queried).
            EventTimeoutError: the event did not complete in time.
        """
        bound = wait_bound(timeout, self.timeout_s)
        deadline = time.monotonic() + bound
        pause = 1e-5
        while not self.query():
            if time.monotonic() >= deadline:
                raise EventTimeoutError(
                    f"IPC event on device {self.device_index} did not complete within {bound} s; "
                    "check that the exporting process recorded it and is still running"
                )
            time.sleep(pause)
            pause = min(pause * 2, 1e-3)

