"""Interprocess events of the CPU reference device, within one process and across spawned processes.

Every wait is bounded: events get short timeouts, pipes are polled with timeouts, processes are joined
with timeouts, and pytest-timeout bounds each test.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import pickle
import threading
import time

import pytest
import torch

from hisparse_hal.errors import EventTimeoutError, InvalidArgumentError, PeerLostError
from hisparse_hal.vendors.cpu import ipc_event
from hisparse_hal.vendors.cpu.backend import CpuBackend
from hisparse_hal.vendors.cpu.ipc_event import CpuIpcEvent

POOL_BYTES = 4096
CYCLES = 1000
SOAK_CYCLES = 10_000
SPAWN = multiprocessing.get_context("spawn")


@pytest.fixture
def backend() -> CpuBackend:
    return CpuBackend(event_timeout_s=5.0)


@pytest.fixture
def event(backend):
    created = backend.create_ipc_event()
    yield created
    created.close()


def _as_foreign(handle: bytes) -> bytes:
    """The same handle as if another process had exported it (so this process may import it)."""
    fields = json.loads(handle)
    fields["process"] = "0" * 32
    return json.dumps(fields).encode()


def _event_path(handle: bytes) -> str:
    fields = json.loads(handle)
    return os.path.join(fields["dir"], fields["name"])


def _recv(conn, timeout: float = 30.0):
    if not conn.poll(timeout):
        raise AssertionError(f"no message from the other process within {timeout} s")
    return conn.recv()


def _pattern(cycle: int) -> torch.Tensor:
    return ((torch.arange(POOL_BYTES) * 7 + cycle) % 256).to(torch.uint8)


# ----------------------------------------------------------------------------- in one process
def test_record_query_wait_and_synchronize_complete_at_once(event):
    assert event.query()
    event.record()
    assert event.query()
    event.wait()
    event.synchronize()
    for _ in range(100):
        event.record()
    assert event._record.read() == (101, 101)


def test_export_gives_picklable_bytes_naming_the_event_its_creator_and_a_token(backend, event):
    handle = backend.export_event(event)
    assert isinstance(handle, bytes) and pickle.loads(pickle.dumps(handle)) == handle
    fields = json.loads(handle)
    assert fields["name"] == event.name and fields["name"].startswith("hisparse-hal-event-")
    assert fields["pid"] == os.getpid() and len(fields["token"]) == 32
    assert os.path.exists(_event_path(handle))


def test_import_in_the_exporting_process_is_rejected(backend, event):
    with pytest.raises(
        InvalidArgumentError, match="exported by this same process; .* only be imported in another process"
    ):
        backend.import_event(torch.device("cpu"), backend.export_event(event))


@pytest.mark.parametrize(
    "handle, message",
    [
        ("not bytes", r"handle must be bytes from export_event, got str"),
        (b"\xff\x00garbage", r"9-byte handle is not a CPU IPC event handle \(could not decode it"),
        (b"HSHALEV1" + bytes(92), r"this handle comes from a GPU backend's export_event"),
        (b"[1, 2]", r"handle kind 'list' is not 'hisparse-hal/cpu-ipc-event'"),
        (json.dumps({"kind": "other"}).encode(), r"handle kind 'other' is not"),
        (json.dumps({"kind": ipc_event.HANDLE_KIND, "version": 99}).encode(), r"handle version 99 is not 1"),
        (
            json.dumps({"kind": ipc_event.HANDLE_KIND, "version": 1, "dir": "/dev/shm"}).encode(),
            r"handle field 'name' is missing or not a str",
        ),
        (
            json.dumps(
                {
                    "kind": ipc_event.HANDLE_KIND,
                    "version": 1,
                    "dir": "/etc",
                    "name": "../etc/passwd",
                    "token": "0" * 32,
                    "pid": 1,
                    "process": "0" * 32,
                }
            ).encode(),
            r"handle names '/etc'/'../etc/passwd', which is not a CPU IPC event",
        ),
    ],
    ids=["str", "undecodable", "gpu_handle", "json_list", "wrong_kind", "wrong_version", "missing_field", "bad_name"],
)
def test_import_rejects_malformed_handles(backend, handle, message):
    with pytest.raises(InvalidArgumentError, match=f"import_event: {message}"):
        backend.import_event("cpu", handle)


def test_import_rejects_a_token_that_does_not_match_the_file(backend, event):
    fields = json.loads(_as_foreign(backend.export_event(event)))
    fields["token"] = "f" * 32
    with pytest.raises(InvalidArgumentError, match="is not the event this handle names \\(token mismatch\\)"):
        backend.import_event("cpu", json.dumps(fields).encode())


@pytest.mark.parametrize(
    "device, message", [("meta", "imports events on 'cpu', got meta"), ("nonsense", "'nonsense' is not a device")]
)
def test_import_rejects_a_non_cpu_device(backend, event, device, message):
    with pytest.raises(InvalidArgumentError, match=message):
        backend.import_event(device, backend.export_event(event))


def test_export_rejects_what_create_ipc_event_did_not_make(backend, event):
    with pytest.raises(InvalidArgumentError, match="expected an event from create_ipc_event, got object"):
        backend.export_event(object())
    imported = backend.import_event("cpu", _as_foreign(backend.export_event(event)))
    with pytest.raises(InvalidArgumentError, match="got CpuIpcEvent that was itself imported"):
        backend.export_event(imported)
    imported.close()
    event.close()
    with pytest.raises(InvalidArgumentError, match=f"export_event: event {event.name} is closed"):
        backend.export_event(event)


def test_closing_the_exporter_removes_the_file_and_later_imports_fail(backend):
    created = backend.create_ipc_event()
    handle = backend.export_event(created)
    created.close()
    created.close()  # idempotent
    assert not os.path.exists(_event_path(handle))
    for member in ("record", "wait", "query", "synchronize"):
        with pytest.raises(InvalidArgumentError, match=f"{member} on closed CPU IPC event"):
            getattr(created, member)()
    with pytest.raises(InvalidArgumentError, match=r"no longer exists: its exporter closed it or exited"):
        backend.import_event("cpu", _as_foreign(handle))


def test_collected_exporter_removes_its_file(backend):
    created = backend.create_ipc_event()
    path = _event_path(backend.export_event(created))
    del created
    assert not os.path.exists(path)


def test_record_and_wait_reject_a_stream_that_is_not_the_cpu_torch_stream(event):
    with pytest.raises(InvalidArgumentError, match="pass stream=None or a CPU torch.Stream, got 'side'"):
        event.record("side")
    with pytest.raises(InvalidArgumentError, match="one implicit stream"):
        event.wait("side")


def test_event_is_a_torch_event_that_records_on_the_cpu_torch_stream_vllm_passes(backend):
    """vLLM 0.34.0 records on a ``torch.Stream`` and hands the event to ``torch.Stream.wait_event``
    (kv_connector/v1/hisparse/worker.py:175-177, 419), which reads it as a ``torch.Event``."""
    created = backend.create_ipc_event()
    stream = torch.Stream("cpu")
    assert isinstance(created, torch.Event)
    created.record(stream)
    stream.wait_event(created)  # a no-op on torch's CPU stream; must not fault
    created.wait(stream)
    created.synchronize()
    assert created.query()
    assert isinstance(pickle.loads(pickle.dumps(backend.export_event(created))), bytes)
    with pytest.raises(InvalidArgumentError, match="a CPU torch.Stream"):
        created.record(object())  # type: ignore[arg-type]  # the wrong type on purpose


def test_pending_record_makes_waits_time_out_with_what_they_waited_for(event):
    event.timeout_s = 0.2
    event._issue_pending()
    assert not event.query()
    start = time.monotonic()
    with pytest.raises(
        EventTimeoutError, match=r"wait on CPU IPC event .* timed out after 0.2 s waiting for record #1 \(completed: #0"
    ):
        event.wait()
    assert time.monotonic() - start < 2
    with pytest.raises(
        EventTimeoutError, match=r"synchronize .* timed out after 0.1 s .* raise HISPARSE_HAL_EVENT_TIMEOUT_S"
    ):
        event.synchronize(timeout=0.1)
    event.record()  # record #2 completes, and with it everything before
    event.wait()
    assert event.query()


def test_importer_waiting_on_a_closed_exporter_fails_fast(backend):
    created = backend.create_ipc_event()
    imported = backend.import_event("cpu", _as_foreign(backend.export_event(created)))
    imported.timeout_s = 30
    created._issue_pending()
    created.close()
    start = time.monotonic()
    with pytest.raises(
        EventTimeoutError, match=r"exporting process \(pid \d+\) exited or closed the event with record #1 pending"
    ):
        imported.wait()
    assert time.monotonic() - start < 5
    imported.close()


def test_records_by_an_importer_are_seen_by_the_exporter(backend, event):
    imported = backend.import_event("cpu", _as_foreign(backend.export_event(event)))
    imported.record()
    imported.record()
    assert event._record.read() == (2, 2) and event.query()
    imported.close()


def test_records_from_many_threads_are_all_counted(event):
    threads = [threading.Thread(target=lambda: [event.record() for _ in range(250)]) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert event._record.read() == (1000, 1000)


def _close_inherited(event: CpuIpcEvent) -> None:
    event.close()


@pytest.mark.timeout(60)
def test_a_forked_child_closing_an_inherited_event_leaves_the_exporters_file(backend, event):
    path = _event_path(backend.export_event(event))
    process = multiprocessing.get_context("fork").Process(target=_close_inherited, args=(event,))
    process.start()
    process.join(30)
    assert process.exitcode == 0
    assert os.path.exists(path)
    event.record()
    assert event.query()


def test_event_timeout_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("HISPARSE_HAL_EVENT_TIMEOUT_S", "2.5")
    backend = CpuBackend()
    assert backend.event_timeout_s == 2.5
    created = backend.create_ipc_event()
    assert created.timeout_s == 2.5
    created.close()
    monkeypatch.setenv("HISPARSE_HAL_EVENT_TIMEOUT_S", "soon")
    with pytest.raises(
        InvalidArgumentError,
        match="HISPARSE_HAL_EVENT_TIMEOUT_S must be a positive, finite number of seconds, got 'soon'",
    ):
        CpuBackend()
    monkeypatch.setenv("HISPARSE_HAL_EVENT_TIMEOUT_S", "inf")
    with pytest.raises(InvalidArgumentError, match="finite number of seconds, got 'inf'"):
        CpuBackend()
    bad: object
    for bad in (0, math.nan, math.inf, -1, True, "5"):
        with pytest.raises(InvalidArgumentError,
                           match=rf"^event_timeout_s must be a positive, finite number of seconds, got {bad!r}$"):
            CpuBackend(event_timeout_s=bad)  # type: ignore[arg-type]  # wrong on purpose


# ----------------------------------------------------------------------------- per-call timeouts (issue 30 item 4)
BAD_TIMEOUTS = [math.nan, math.inf, -math.inf, -1, 0, True, "0.1", [0.1]]


def _in_daemon(call) -> tuple[threading.Thread, list]:
    """Run ``call`` in a daemon thread (a wait that never returns cannot hang the run); its outcome in the list."""
    outcome: list = []

    def run() -> None:
        try:
            call()
            outcome.append("returned")
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


@pytest.mark.parametrize("bad", BAD_TIMEOUTS, ids=repr)
def test_synchronize_refuses_a_bad_timeout_naming_it_before_waiting(event, bad):
    """``synchronize(float("nan"))`` used to spin for ever on a pending record; ``inf`` was taken as a bound."""
    event._issue_pending()
    before = event._record.read()
    thread, outcome = _in_daemon(lambda: event.synchronize(bad))
    thread.join(30)
    assert not thread.is_alive(), f"synchronize({bad!r}) is still waiting"
    assert isinstance(outcome[0], InvalidArgumentError), outcome
    assert str(outcome[0]) == (f"timeout must be a positive, finite number of seconds, got {bad!r}; pass None to "
                               "wait without a bound")
    assert event._record.read() == before == (1, 0)


def test_synchronize_none_waits_without_a_bound_until_the_record_completes(event):
    event.timeout_s = 0.01  # the default bound, which None must not apply
    event._issue_pending()
    thread, outcome = _in_daemon(lambda: event.synchronize(None))
    thread.join(0.5)  # 50 times the default bound: a bounded wait would have raised by now
    assert thread.is_alive() and outcome == []
    event.record()  # completes record #2 and everything before it
    thread.join(30)
    assert outcome == ["returned"]
    with pytest.raises(EventTimeoutError, match="timed out after 0.01 s"):  # omitted: the event's own bound
        event._issue_pending()
        event.synchronize()


@pytest.mark.parametrize("bad", BAD_TIMEOUTS, ids=repr)
def test_an_events_timeout_s_cannot_be_set_to_a_bad_bound(event, bad):
    event.timeout_s = 2
    with pytest.raises(InvalidArgumentError,
                       match=r"^CPU IPC event timeout_s must be a positive, finite number of seconds, got "):
        event.timeout_s = bad
    assert event.timeout_s == 2.0


@pytest.mark.parametrize("bad", [math.nan, 0, True])
def test_create_and_import_refuse_a_bad_bound_before_opening_anything(backend, event, bad, tmp_path, monkeypatch):
    handle = _as_foreign(backend.export_event(event))
    monkeypatch.setattr(ipc_event, "_event_dir", lambda: str(tmp_path))
    descriptors = sorted(os.listdir("/proc/self/fd"))
    with pytest.raises(InvalidArgumentError, match=rf"^event timeout_s must be a positive, finite .*got {bad!r}$"):
        ipc_event.create_event(bad)
    with pytest.raises(InvalidArgumentError, match=rf"^event timeout_s must be a positive, finite .*got {bad!r}$"):
        ipc_event.import_event(handle, bad)
    assert os.listdir(tmp_path) == [] and sorted(os.listdir("/proc/self/fd")) == descriptors


# ----------------------------------------------------------------------------- across processes
#: Every DELAY_EVERY-th cycle the producer's swap lands DELAY_S after record() returns (delay_next_swap), so the
#: pipe message no longer orders the consumer's read: only a wait() that waits does.
DELAY_EVERY, DELAY_S = 100, 0.05


def _consumer(handle: bytes, pool_path: str, conn, backend_class: str = "CpuBackend") -> None:
    """Spawned: import the event, then per cycle wait and check the shared pool's bytes."""
    backend = _backend_named(backend_class)
    event = backend.import_event(torch.device("cpu"), handle)
    pool = torch.from_file(pool_path, shared=True, size=POOL_BYTES, dtype=torch.uint8)
    conn.send("ready")
    bad = []
    while True:
        cycle = _recv(conn)
        if cycle is None:
            break
        event.wait()
        if not torch.equal(pool, _pattern(cycle)):
            bad.append(cycle)
        conn.send(cycle)
    event.record()  # an importer may record too; the exporter sees it
    conn.send(("done", bad, event.query()))
    event.close()


def _exchange(backend: CpuBackend, tmp_path, cycles: int, consumer_class: str = "CpuBackend",
              delay_every: int = DELAY_EVERY, delay_s: float = DELAY_S) -> tuple:
    """Produce ``cycles`` patterns into a pool shared with a spawned consumer; what the consumer reported."""
    pool_path = (
        f"/dev/shm/hisparse-hal-test-pool-{os.getpid()}" if os.path.isdir("/dev/shm") else str(tmp_path / "pool")
    )
    with open(pool_path, "wb") as f:
        f.write(bytes(POOL_BYTES))
    event = backend.create_ipc_event()
    parent, child = SPAWN.Pipe()
    process = SPAWN.Process(target=_consumer, args=(backend.export_event(event), pool_path, child, consumer_class))
    try:
        pool = torch.from_file(pool_path, shared=True, size=POOL_BYTES, dtype=torch.uint8)
        backend.pin_tensor(pool)
        staging = torch.empty(POOL_BYTES, dtype=torch.uint8)
        backend.register_region(staging.data_ptr(), POOL_BYTES, "staging")
        descriptors = (torch.tensor([staging.data_ptr()]), torch.tensor([pool.data_ptr()]), torch.tensor([POOL_BYTES]))
        process.start()
        assert _recv(parent, 60) == "ready"
        for cycle in range(cycles):
            staging.copy_(_pattern(cycle))
            if cycle % delay_every == 0:
                backend.delay_next_swap(delay_s)
            backend.swap_blocks_batch(*descriptors)  # the producer writes the shared pool...
            event.record()  # ...then records; the consumer waits, then reads
            parent.send(cycle)
            assert _recv(parent) == cycle  # handshake: the consumer is done reading
        parent.send(None)
        report = _recv(parent)
        records = event._record.read()
        process.join(30)
        assert process.exitcode == 0
        backend.unpin_tensor(pool)
        return report, records
    finally:
        if process.is_alive():
            process.kill()
        event.close()
        os.unlink(pool_path)


@pytest.mark.timeout(180)
def test_producer_and_consumer_exchange_1000_record_wait_cycles_across_processes(backend, tmp_path):
    (status, bad, consumer_saw_complete), records = _exchange(backend, tmp_path, CYCLES)
    assert (status, bad, consumer_saw_complete) == ("done", [], True)
    assert records == (CYCLES + 1, CYCLES + 1)


@pytest.mark.timeout(120)
def test_the_exchange_fails_a_consumer_whose_wait_returns_at_once(backend, tmp_path):
    """Planted bug: with delayed swaps the pipe alone does not order the read, so a no-op wait() reads stale bytes.

    Every cycle is delayed by half a second here, so the stale read does not depend on how fast the consumer runs.
    """
    (status, bad, _), _ = _exchange(backend, tmp_path, 3, "IpcWaitReturnsAtOnce", delay_every=1, delay_s=0.5)
    assert (status, bad) == ("done", [0, 1, 2])


def test_a_delayed_swap_lands_after_record_returns_and_the_record_completes_behind_it(backend):
    source, target = torch.arange(64, dtype=torch.uint8), torch.zeros(64, dtype=torch.uint8)
    backend.register_region(source.data_ptr(), 64, "source")
    backend.pin_tensor(target)
    event = backend.create_ipc_event()
    backend.delay_next_swap(0.2)
    backend.swap_blocks_batch(torch.tensor([source.data_ptr()]), torch.tensor([target.data_ptr()]), torch.tensor([64]))
    event.record()
    assert target.eq(0).all() and event.query() is False, "the delayed swap landed before record() returned"
    event.synchronize()
    assert torch.equal(target, source) and event.query() is True
    backend.unpin_tensor(target)


def _dying_exporter(conn) -> None:
    """Spawned: export one event with a record in flight and one idle, then exit without cleanup."""
    backend = CpuBackend()
    pending, idle = backend.create_ipc_event(), backend.create_ipc_event()
    pending._issue_pending()
    conn.send((backend.export_event(pending), backend.export_event(idle)))
    _recv(conn, 60)
    os._exit(0)  # no finalizers: the files stay behind, the liveness lock goes with the process


@pytest.mark.timeout(120)
def test_waiting_on_an_exporter_that_died_ends_in_a_clear_error_in_bounded_time(backend):
    parent, child = SPAWN.Pipe()
    process = SPAWN.Process(target=_dying_exporter, args=(child,))
    process.start()
    try:
        pending_handle, idle_handle = _recv(parent, 60)
        pending = backend.import_event("cpu", pending_handle)
        pending.timeout_s = 60
        assert not pending.query()
        parent.send("die")
        process.join(30)
        assert process.exitcode == 0
        start = time.monotonic()
        with pytest.raises(
            EventTimeoutError,
            match=r"exporting process \(pid \d+\) exited or closed the event with record #1 pending .* never complete",
        ):
            pending.wait()
        assert time.monotonic() - start < 5
        assert not os.path.exists(_event_path(pending_handle))  # the importer removed the stale file
        assert os.path.exists(_event_path(idle_handle))
        with pytest.raises(InvalidArgumentError, match=r"the exporter of event .* \(pid \d+\) exited or closed it"):
            backend.import_event("cpu", idle_handle)
        assert not os.path.exists(_event_path(idle_handle))  # the stale file was removed
        pending.close()
    finally:
        if process.is_alive():
            process.kill()


def _slow_exporter(conn) -> None:
    """Spawned: export an event with a record in flight and an event it then closes; stay alive."""
    backend = CpuBackend()
    pending, closed = backend.create_ipc_event(), backend.create_ipc_event()
    pending._issue_pending()
    handles = (backend.export_event(pending), backend.export_event(closed))
    closed.close()
    conn.send(handles)
    _recv(conn, 60)


@pytest.mark.timeout(120)
def test_waiting_on_a_live_exporters_unfinished_record_times_out_and_closed_events_cannot_be_imported(backend):
    parent, child = SPAWN.Pipe()
    process = SPAWN.Process(target=_slow_exporter, args=(child,))
    process.start()
    try:
        pending_handle, closed_handle = _recv(parent, 60)
        with pytest.raises(InvalidArgumentError, match=r"no longer exists: its exporter closed it or exited"):
            backend.import_event("cpu", closed_handle)
        pending = backend.import_event("cpu", pending_handle)
        pending.timeout_s = 0.3
        with pytest.raises(
            EventTimeoutError, match=r"timed out after 0.3 s waiting for record #1 \(completed: #0, exporter pid \d+\)"
        ):
            pending.wait()
        pending.close()
        parent.send("exit")
        process.join(30)
        assert process.exitcode == 0
        assert not os.path.exists(_event_path(pending_handle))  # the exporter removed its file at exit
    finally:
        if process.is_alive():
            process.kill()


# ----------------------------------------------------------------------------- soak and killed exporters
def _backend_named(backend_class: str) -> CpuBackend:
    """The CPU device, or a planted bug from tests/broken_backends.py (spawned children inherit sys.path)."""
    if backend_class == "CpuBackend":
        return CpuBackend(event_timeout_s=20)
    from hisparse_hal.testing import broken_backends

    return getattr(broken_backends, backend_class)(event_timeout_s=20)


def _soak_peer(handle: bytes, pool_path: str, cycles: int, conn, backend_class: str = "CpuBackend") -> None:
    """Spawned: per cycle wait on the parent's event, check the word it wrote, answer on its own event."""
    backend = _backend_named(backend_class)
    theirs = backend.import_event("cpu", handle)
    mine = backend.create_ipc_event()
    words = torch.from_file(pool_path, shared=True, size=2, dtype=torch.int64)
    conn.send(backend.export_event(mine))
    bad: list[tuple[str | int, int]] = []  # ("order", cycle) or (cycle, value read)
    for cycle in range(cycles):
        if _recv(conn) != cycle:
            bad.append(("order", cycle))
            break
        theirs.wait()
        if int(words[0]) != cycle:
            bad.append((cycle, int(words[0])))
        words[1] = cycle  # read back by the parent after waiting on our event
        mine.record()
        conn.send(cycle)
    conn.send(("done", bad))
    _recv(conn)  # the parent waits on our event until it is done with it
    mine.close()


#: Every SOAK_DELAY_EVERY-th cycle the parent's word lands through a delayed swap (see DELAY_EVERY).
SOAK_DELAY_EVERY = 1000


def _soak(backend: CpuBackend, tmp_path, cycles: int, peer_class: str = "CpuBackend",
          delay_every: int = SOAK_DELAY_EVERY, delay_s: float = DELAY_S) -> tuple:
    """Record/wait ``cycles`` times each way with a spawned peer; (peer's report, words the parent read wrong)."""
    pool_path = str(tmp_path / "words")
    with open(pool_path, "wb") as f:
        f.write(bytes(16))
    words = torch.from_file(pool_path, shared=True, size=2, dtype=torch.int64)
    words.fill_(-1)  # no cycle's value, so a read before cycle 0's write lands is seen as wrong
    staging = torch.zeros(1, dtype=torch.int64)
    backend.pin_tensor(words)
    backend.register_region(staging.data_ptr(), 8, "soak staging")
    delayed_write = (torch.tensor([staging.data_ptr()]), torch.tensor([words.data_ptr()]), torch.tensor([8]))
    mine = backend.create_ipc_event()
    parent, child = SPAWN.Pipe()
    process = SPAWN.Process(target=_soak_peer,
                            args=(backend.export_event(mine), pool_path, cycles, child, peer_class))
    process.start()
    try:
        theirs = backend.import_event("cpu", _recv(parent, 60))
        wrong = []
        for cycle in range(cycles):
            if cycle % delay_every == 0:  # lands after record() returns: only the peer's wait() orders it
                staging[0] = cycle
                backend.delay_next_swap(delay_s)
                backend.swap_blocks_batch(*delayed_write)
            else:
                words[0] = cycle
            mine.record()
            parent.send(cycle)
            assert _recv(parent) == cycle
            theirs.wait()
            if int(words[1]) != cycle:
                wrong.append((cycle, int(words[1])))
        report = _recv(parent)
        mine.synchronize()  # delayed writes a broken peer did not wait for may still be in flight
        assert mine._record.read() == (cycles, cycles)
        assert theirs._record.read() == (cycles, cycles)
        theirs.close()
        parent.send("bye")
        process.join(30)
        assert process.exitcode == 0
        backend.unpin_tensor(words)
        return report, wrong
    finally:
        if process.is_alive():
            process.kill()
        mine.close()


@pytest.mark.timeout(240)
def test_ten_thousand_record_wait_cycles_across_processes_each_way_see_every_write(backend, tmp_path):
    """Issue 10 item 5: far past ROCm 7.2's 32-slot ring (vLLM #57602), in both directions."""
    assert _soak(backend, tmp_path, SOAK_CYCLES) == (("done", []), [])


@pytest.mark.timeout(120)
def test_the_soak_fails_a_peer_whose_wait_returns_at_once(backend, tmp_path):
    """Planted bug: the peer's wait() returns at once, so it reads the parent's delayed word before it lands."""
    (status, bad), wrong = _soak(backend, tmp_path, 3, "IpcWaitReturnsAtOnce", delay_every=1, delay_s=0.5)
    assert (status, [cycle for cycle, _ in bad], wrong) == ("done", [0, 1, 2], [])


def _killed_exporter(conn) -> None:
    """Spawned: export two idle events, one recorded, then wait to be killed."""
    backend = CpuBackend()
    recorded, fresh = backend.create_ipc_event(), backend.create_ipc_event()
    recorded.record()
    conn.send((backend.export_event(recorded), backend.export_event(fresh)))
    _recv(conn, 60)


@pytest.mark.timeout(120)
def test_an_exporter_killed_with_sigkill_leaves_no_file_after_the_importers_next_call(backend):
    parent, child = SPAWN.Pipe()
    process = SPAWN.Process(target=_killed_exporter, args=(child,))
    process.start()
    try:
        recorded_handle, fresh_handle = _recv(parent, 60)
        recorded = backend.import_event("cpu", recorded_handle)
        recorded.wait()  # nothing pending while the exporter lives: returns at once
        process.kill()
        process.join(30)
        assert process.exitcode == -9
        assert os.path.exists(_event_path(recorded_handle))  # SIGKILL ran no cleanup
        start = time.monotonic()
        with pytest.raises(PeerLostError, match=r"query on CPU IPC event .*: the exporting process \(pid \d+\) exited "
                           r"or closed the event after 1 completed records; no further record can come") as lost:
            recorded.query()
        assert time.monotonic() - start < 1
        assert lost.value.pid == process.pid
        assert isinstance(lost.value, EventTimeoutError)
        assert not os.path.exists(_event_path(recorded_handle))
        with pytest.raises(PeerLostError, match=r"wait on CPU IPC event"):
            recorded.wait()  # every later call says the same; the file is already gone
        recorded.close()
    finally:
        if process.is_alive():
            process.kill()
    # The exporter's other event was never imported: the next create_ipc_event sweeps it.
    assert os.path.exists(_event_path(fresh_handle))
    created = backend.create_ipc_event()
    assert not os.path.exists(_event_path(fresh_handle))
    assert os.path.exists(os.path.join(os.path.dirname(_event_path(fresh_handle)), created.name))
    created.close()


def test_the_sweep_leaves_live_events_and_files_being_created_alone(backend, event, tmp_path):
    live = backend.create_ipc_event()
    half_made = tmp_path / (ipc_event.NAME_PREFIX + "0" * 32)
    half_made.write_bytes(b"")  # a creator between open() and its header: no lock yet, no header
    dead = tmp_path / (ipc_event.NAME_PREFIX + "1" * 32)
    dead.write_bytes(bytes(64))  # a complete file nobody holds
    assert ipc_event.sweep_stale_events(str(tmp_path)) == [dead.name]
    assert half_made.exists() and not dead.exists()
    removed = ipc_event.sweep_stale_events()  # the real directory: events alive here are held
    assert live.name not in removed and event.name not in removed
    assert os.path.exists(_event_path(backend.export_event(live)))
    assert os.path.exists(_event_path(backend.export_event(event)))
    live.close()


def test_the_specs_sweep_hook_returns_the_full_paths_it_removed(tmp_path, monkeypatch):
    monkeypatch.setattr(ipc_event, "_event_dir", lambda: str(tmp_path))
    dead = tmp_path / (ipc_event.NAME_PREFIX + "2" * 32)
    dead.write_bytes(bytes(64))  # a complete file nobody holds
    from hisparse_hal.vendors.cpu.spec import SPEC

    assert SPEC.sweep_shared_files is not None
    assert SPEC.sweep_shared_files() == [str(dead)]
    assert not dead.exists()
