"""Which synchronisation the scenario's ranks use (``scenario/sync.py:choose_sync``): IPC events when the backend has
them without a cycle limit the run would outlast, barriers otherwise."""

from __future__ import annotations

import pytest

from hisparse_hal.capabilities import KV_FORMATS, Capabilities
from hisparse_hal.errors import UnsupportedCapabilityError
from hisparse_hal.scenario import choose_sync


def _caps(ipc_events: bool, limit: int | None) -> Capabilities:
    return Capabilities(batch_copy="loop", max_batch_descriptors=None, ipc_events=ipc_events,
                        ipc_event_max_cycles=limit, shared_host_pool=ipc_events and limit is None,
                        graph_capture=False, host_pointer_alias=False,
                        kv_formats=KV_FORMATS)


def test_sync_uses_ipc_events_when_the_backend_has_them_without_a_cycle_limit():
    choice = choose_sync(_caps(True, None), 1000)
    assert (choice.path, choice.reason) == ("events", "IPC events: ipc_events=True, no cycle limit, 1000 steps")


def test_sync_falls_back_to_barriers_when_the_run_outlasts_the_event_cycle_limit():
    choice = choose_sync(_caps(True, 32), 1000)
    assert choice.path == "barrier"
    assert "1000 record/wait cycles per event, over the backend's ipc_event_max_cycles=32" in choice.reason
    assert choose_sync(_caps(True, 32), 32).path == "events"  # a run that fits the limit keeps events


def test_sync_falls_back_to_barriers_without_ipc_events_and_refuses_forced_events():
    assert "no IPC events (ipc_events=False)" in choose_sync(_caps(False, None), 10).reason
    refused = r"IPC event synchronization was requested, but the backend has no IPC events"
    with pytest.raises(UnsupportedCapabilityError, match=refused):
        choose_sync(_caps(False, None), 10, "events")
    assert choose_sync(_caps(True, None), 10, "barrier").reason == "barrier synchronization was requested"
