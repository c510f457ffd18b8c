"""Which synchronisation the scenario's ranks use (``scenario/sync.py:choose_sync``): IPC events when the backend has
them without a cycle limit the run would outlast, barriers otherwise; which rank a survivor blames for a loss; the
device waits go through the backend's ``synchronize()``."""

from __future__ import annotations

import pytest

from hisparse_hal.capabilities import KV_FORMATS, Capabilities
from hisparse_hal.errors import PeerLostError, UnsupportedCapabilityError
from hisparse_hal.scenario import choose_sync
from hisparse_hal.scenario.pool import _PIDS_AT, ABORTED, ABORTED_BY, SharedPool
from hisparse_hal.scenario.sync import BarrierStepSync, find_lost_rank, lost_rank_error, synchronize_device


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


def _pool_of_three(as_rank: int):
    """Rank ``as_rank``'s mapping of a 3-rank pool whose other ranks recorded their pids and hold no lock (in one
    process, so every other rank reads as exited)."""
    path = SharedPool.create(3, 1, 4096)
    pool = SharedPool(path, as_rank, 3, 1, 4096)
    SharedPool.unlink(path)
    for rank in range(3):
        pool.control[_PIDS_AT + rank] = 1000 + rank
    return pool


def test_a_survivor_blames_the_rank_the_abort_mark_names_not_the_first_rank_that_exited():
    # Rank 1 died; rank 0 found it, marked the pool and exited with its error. Rank 2 now sees ranks 0 and 1
    # both gone: the mark, not the lowest exited rank, says which one was lost (issue 30 item 11).
    pool = _pool_of_three(as_rank=2)
    try:
        assert find_lost_rank(pool) == (0, None)  # unmarked: the first exited rank
        pool.set_word(ABORTED_BY, 0)
        pool.set_word(ABORTED, 1 + 1)
        assert find_lost_rank(pool) == (1, 0)
        assert find_lost_rank(pool, first=0) == (1, 0)
        error = lost_rank_error(pool, 1, "publishing step 7", reported_by=0)
        assert isinstance(error, PeerLostError) and (error.rank, error.pid) == (1, 1001)
        assert str(error).startswith("rank 1 (pid 1001) exited (reported by rank 0) while rank 2 was publishing step 7")
    finally:
        pool.close()


def test_the_first_rank_to_find_a_loss_marks_the_pool_with_itself_as_the_reporter():
    pool = _pool_of_three(as_rank=0)
    try:
        lost_rank_error(pool, 2, "waiting")
        assert (pool.word(ABORTED), pool.word(ABORTED_BY)) == (3, 0)
        lost_rank_error(pool, 1, "waiting")  # a later finding does not overwrite the first
        assert (pool.word(ABORTED), pool.word(ABORTED_BY)) == (3, 0)
    finally:
        pool.close()


class _CountingBackend:
    """Counts ``synchronize()`` calls; any other member would fail the test (the waits need none)."""

    def __init__(self) -> None:
        self.synchronizations = 0

    def synchronize(self) -> None:
        self.synchronizations += 1


def test_a_device_wait_is_the_backends_synchronize():
    backend = _CountingBackend()
    synchronize_device(backend)
    assert backend.synchronizations == 1


def test_a_reader_on_the_barrier_path_waits_for_its_device_after_each_read():
    backend = _CountingBackend()
    sync = BarrierStepSync(backend, pool=None, timeout_s=1.0)  # type: ignore[arg-type]
    sync.after_read(0)
    sync.after_read(1)
    assert backend.synchronizations == 2
