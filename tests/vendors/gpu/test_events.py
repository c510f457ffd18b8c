"""The GPU IPC event handle codec and ``GpuIpcEvent`` (``vendors/gpu/events.py``), with a fake torch event."""

from __future__ import annotations

import pickle
import subprocess
import sys
from typing import Any

import pytest

from hisparse_hal.errors import EventTimeoutError, InvalidArgumentError
from hisparse_hal.vendors.gpu.events import GpuIpcEvent, decode_event_handle, encode_event_handle


def test_event_handle_round_trips_and_pickles() -> None:
    raw = bytes(range(64))
    data = encode_event_handle(2, raw)
    assert isinstance(data, bytes) and pickle.loads(pickle.dumps(data)) == data
    same_process, device_index, handle = decode_event_handle(data)
    assert (same_process, device_index, handle) == (True, 2, raw)


def test_event_handle_from_another_process_is_not_same_process(tmp_path: Any) -> None:
    code = (
        "import sys; from hisparse_hal.vendors.gpu.events import encode_event_handle; "
        "sys.stdout.buffer.write(encode_event_handle(1, bytes(64)))"
    )
    data = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, check=True, timeout=120
    ).stdout
    assert decode_event_handle(data) == (False, 1, bytes(64))


def test_encode_rejects_a_handle_of_the_wrong_size() -> None:
    with pytest.raises(InvalidArgumentError, match="an IPC event handle must be 64 bytes, got 10"):
        encode_event_handle(0, bytes(10))


class FakeTorchEvent:
    def __init__(self, done_after: int | None) -> None:
        self.queries = 0
        self.done_after = done_after
        self.recorded: list[object] = []
        self.waited: list[object] = []

    def query(self) -> bool:
        self.queries += 1
        return self.done_after is not None and self.queries > self.done_after

    def record(self, stream: object = None) -> None:
        self.recorded.append(stream)

    def wait(self, stream: object = None) -> None:
        self.waited.append(stream)


def test_event_synchronize_is_bounded() -> None:
    event = GpuIpcEvent(FakeTorchEvent(None), 1, 0.05, imported=True)  # type: ignore[arg-type]
    with pytest.raises(EventTimeoutError, match=r"IPC event on device 1 did not complete within 0.05 s"):
        event.synchronize()
    with pytest.raises(EventTimeoutError, match="within 0.01 s"):
        event.synchronize(timeout=0.01)


def test_event_forwards_record_wait_query_and_synchronize_returns_when_done() -> None:
    torch_event = FakeTorchEvent(3)
    event = GpuIpcEvent(torch_event, 0, 5.0, imported=False)  # type: ignore[arg-type]
    event.record("s1")
    event.wait(None)
    event.synchronize()
    assert torch_event.recorded == ["s1"] and torch_event.waited == [None] and torch_event.queries == 4
