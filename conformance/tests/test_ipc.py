"""IPC events across spawned processes, every exchange bounded: handles survive pickling, a consumer
that waited sees exactly the bytes written before the record, events survive at least 1,000
record/wait cycles, a same-process import is refused, and a wait on a pending record or on an exporter
that died ends, in bounded time, with a clear typed error."""

from __future__ import annotations

import contextlib
import multiprocessing
import pickle

import pytest
import torch
import torch.multiprocessing  # noqa: F401 - registers torch's reductions, so shared tensors reach spawned peers

from hisparse_hal.conformance.ipc_peers import Peer
from hisparse_hal.errors import HalError

#: This tier (read by conformance/tiers.py, without importing this module): its area, its place in the
#: run and its title in the reports.
AREA = "ipc"
ORDER = 90
TITLE = "IPC events"

pytestmark = pytest.mark.needs("ipc_events")

#: Wait bound given to peers that wait on a record that will not complete (HISPARSE_HAL_EVENT_TIMEOUT_S).
SHORT_WAIT_S = 2.0
CYCLES = 1000


@contextlib.contextmanager
def _peers(*peers: Peer):
    try:
        yield peers
    finally:
        for peer in peers:
            peer.stop()


def _pool_exchange(recipe, cycles: int, size: int = 8192, delay_first: bool = False) -> dict:
    """Run a producer and a consumer over one shared host pool for ``cycles`` record/wait cycles."""
    pool = torch.zeros(size, dtype=torch.uint8).share_memory_()
    context = multiprocessing.get_context("spawn")
    producer_end, consumer_end = context.Pipe()
    producer = Peer(
        recipe,
        "pool_producer",
        name="producer",
        params={"peer": producer_end, "pool": pool, "cycles": cycles, "size": size, "delay_first": delay_first},
    )
    consumer = Peer(recipe, "pool_consumer", name="consumer",
                    params={"peer": consumer_end, "pool": pool, "cycles": cycles, "size": size})
    producer_end.close()
    consumer_end.close()
    with _peers(producer, consumer):
        result = consumer.expect("result", timeout=300)
        if result["failure"] is None:
            producer.expect("done")
        return result


def test_ipc_handle_round_trips_through_pickle_into_a_spawned_process(backend, backend_recipe):
    event = backend.create_ipc_event()
    handle = backend.export_event(event)
    assert isinstance(handle, bytes)
    importer = Peer(backend_recipe, "event_importer", name="importer")
    with _peers(importer):
        importer.send("import", handle=pickle.loads(pickle.dumps(handle)))
        importer.expect("imported")
        event.record()
        importer.send("wait")
        waited = importer.expect("waited")
        assert waited["raised"] is None, (
            f"wait on an imported, recorded event raised {waited['raised']}: {waited.get('message')}"
        )
        assert waited["query_after"] is True
        # And the other way: an event exported by the spawned process is imported here.
        importer.send("export")
        theirs = backend.import_event(backend.device, pickle.loads(pickle.dumps(importer.expect("handle")["handle"])))
        importer.send("record_own")
        importer.expect("recorded")
        theirs.wait()
        theirs.synchronize()
        assert theirs.query() is True


@pytest.mark.hal_extension  # vLLM imports only on other ranks (worker.py:172-183); the refusal is hisparse-hal's
def test_ipc_import_in_the_exporting_process_is_rejected(backend):
    event = backend.create_ipc_event()
    handle = backend.export_event(event)
    with pytest.raises(HalError, match=r"(?i)process"):
        backend.import_event(backend.device, handle)


@pytest.mark.smoke
def test_ipc_consumer_reads_exactly_the_bytes_written_before_the_record(backend_recipe):
    result = _pool_exchange(backend_recipe, cycles=5, size=64 * 1024, delay_first=True)
    assert result["failure"] is None, result["failure"]
    assert result["cycles_ok"] == 5


def test_ipc_event_survives_1000_record_wait_cycles(backend_recipe, capabilities):
    limit = capabilities.ipc_event_max_cycles
    if limit is not None and limit < CYCLES:
        pytest.skip(f"capability ipc_event_max_cycles={limit} declares fewer than {CYCLES} record/wait cycles")
    result = _pool_exchange(backend_recipe, cycles=CYCLES, size=4096)
    assert result["failure"] is None, f"after {result['cycles_ok']} good cycles: {result['failure']}"
    assert result["cycles_ok"] == CYCLES


def test_ipc_event_survives_its_declared_cycle_limit(backend_recipe, capabilities):
    limit = capabilities.ipc_event_max_cycles
    if limit is None:
        pytest.skip("capability ipc_event_max_cycles is None (no declared limit; the 1000-cycle test covers it)")
    result = _pool_exchange(backend_recipe, cycles=min(limit, CYCLES), size=4096)
    assert result["failure"] is None, f"after {result['cycles_ok']} good cycles: {result['failure']}"


def _owner_with_pending_record(owner: Peer) -> tuple[bytes, str]:
    handle = owner.expect("handle")["handle"]
    owner.send("pending")
    mode = owner.expect("pending")["mode"]
    return handle, mode


def test_ipc_wait_on_a_pending_record_blocks_until_it_completes_or_times_out(backend_recipe):
    importer = Peer(
        backend_recipe, "event_importer", name="importer", env={"HISPARSE_HAL_EVENT_TIMEOUT_S": str(SHORT_WAIT_S)}
    )
    owner = Peer(backend_recipe, "event_owner", name="exporter")
    with _peers(owner, importer):
        handle, mode = _owner_with_pending_record(owner)
        importer.send("import", handle=handle)
        assert importer.expect("imported")["query"] is False, "query() says complete while a record is pending"
        importer.send("wait")
        waited = importer.expect("waited", timeout=120)
    if mode == "never":
        assert waited["raised"] is not None, (
            f"wait() returned after {waited['elapsed']:.3f} s on a record that never completes"
        )
        assert waited["timeout_error"], (
            f"a timed-out wait must raise EventTimeoutError, got {waited['raised']}: {waited['message']}"
        )
        assert waited["elapsed"] >= 0.5 * SHORT_WAIT_S, (
            f"wait() gave up after {waited['elapsed']:.3f} s, before its bound"
        )
        assert "time" in waited["message"].lower()
    else:
        assert waited["raised"] is None, (
            f"wait() on a delayed record raised {waited['raised']}: {waited.get('message')}"
        )
        assert waited["elapsed"] >= 0.2, (
            f"wait() returned after {waited['elapsed']:.3f} s, before the delayed record completed"
        )
        assert waited["query_after"] is True


def test_ipc_wait_on_an_exporter_that_died_ends_with_a_clear_error(backend_recipe):
    importer = Peer(backend_recipe, "event_importer", name="importer", env={"HISPARSE_HAL_EVENT_TIMEOUT_S": "20"})
    owner = Peer(backend_recipe, "event_owner", name="exporter")
    with _peers(owner, importer):
        handle, _mode = _owner_with_pending_record(owner)
        importer.send("import", handle=handle)
        importer.expect("imported")
        owner.kill()  # the exporter dies with its record pending
        assert owner.process.exitcode is not None
        importer.send("wait")
        waited = importer.expect("waited", timeout=90)
    assert waited["raised"] is not None, (
        f"wait() returned normally after {waited['elapsed']:.3f} s although the exporter died with its record pending"
    )
    assert waited["hal_error"], (
        f"the error must be a typed hisparse-hal error, got {waited['raised']}: {waited['message']}"
    )
    assert waited["message"].strip()
    assert waited["elapsed"] < 30, f"the wait took {waited['elapsed']:.1f} s to notice the exporter died"
