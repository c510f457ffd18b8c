"""The GPU IPC event handle codec and ``GpuIpcEvent`` (``vendors/gpu/events.py``), with a fake torch event."""

from __future__ import annotations

import math
import pickle
import subprocess
import sys
import threading
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
    event = GpuIpcEvent(FakeTorchEvent(None), 1, 0.05, imported=True)
    with pytest.raises(EventTimeoutError, match=r"IPC event on device 1 did not complete within 0.05 s"):
        event.synchronize()
    with pytest.raises(EventTimeoutError, match="within 0.01 s"):
        event.synchronize(timeout=0.01)


def test_event_forwards_record_wait_query_and_synchronize_returns_when_done() -> None:
    torch_event = FakeTorchEvent(3)
    event = GpuIpcEvent(torch_event, 0, 5.0, imported=False)
    event.record("s1")
    event.wait(None)
    event.synchronize()
    assert torch_event.recorded == ["s1"] and torch_event.waited == [None] and torch_event.queries == 4


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1, 0, True, "0.1"], ids=repr)
def test_synchronize_refuses_a_bad_timeout_before_querying(bad: object) -> None:
    """``synchronize(float("nan"))`` used to poll for ever (``monotonic() >= nan`` is never true)."""
    torch_event = FakeTorchEvent(None)
    event = GpuIpcEvent(torch_event, 0, 5.0, imported=True)
    outcome: list = []
    thread = threading.Thread(target=lambda: outcome.append(_raised(event.synchronize, bad)), daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), f"synchronize({bad!r}) is still waiting"
    assert isinstance(outcome[0], InvalidArgumentError)
    assert str(outcome[0]) == (f"timeout must be a positive, finite number of seconds, got {bad!r}; pass None to "
                               "wait without a bound")
    assert torch_event.queries == 0


def _raised(call: Any, *args: object) -> BaseException | None:
    try:
        call(*args)
    except BaseException as exc:  # noqa: BLE001 - handed to the test
        return exc
    return None


def test_synchronize_none_waits_past_the_default_bound_until_done() -> None:
    torch_event = FakeTorchEvent(200)  # completes at the 201st query
    event = GpuIpcEvent(torch_event, 0, 1e-6, imported=True)
    with pytest.raises(EventTimeoutError):
        event.synchronize()  # the default: the event's own (tiny) bound
    torch_event.queries = 0
    event.synchronize(None)  # no bound: polls until the event completes
    assert torch_event.queries == 201


@pytest.mark.parametrize("bad", [math.nan, math.inf, 0, False])
def test_timeout_s_is_checked_at_construction_and_when_set(bad: object) -> None:
    with pytest.raises(InvalidArgumentError, match=r"^GPU IPC event timeout_s must be a positive, finite number"):
        GpuIpcEvent(FakeTorchEvent(0), 0, bad, imported=False)  # type: ignore[arg-type]
    event = GpuIpcEvent(FakeTorchEvent(0), 0, 3, imported=False)
    with pytest.raises(InvalidArgumentError, match=rf"got {bad!r}$"):
        event.timeout_s = bad  # type: ignore[assignment]
    assert event.timeout_s == 3.0
