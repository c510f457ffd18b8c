"""CPU IPC events under what a hostile or unlucky process does (issue 30 items 8 and 11): two imports of one
handle in one process with threads, forged handles naming a directory, FIFO, ``/proc/self/mem`` or deeply
nested text, and a process out of file descriptors or space. Every wait and child is bounded in time."""

from __future__ import annotations

import errno
import fcntl
import gc
import json
import multiprocessing
import os
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from hisparse_hal.errors import InvalidArgumentError, ResourceExhaustedError
from hisparse_hal.vendors.cpu import ipc_event
from hisparse_hal.vendors.cpu.backend import CpuBackend
from hisparse_hal.vendors.cpu.ipc_event import CpuIpcEvent

RECORDS_PER_THREAD = 500


def _as_foreign(handle: bytes) -> bytes:
    """The same handle as if another process had exported it (so this process may import it)."""
    fields = json.loads(handle)
    fields["process"] = "0" * 32
    return json.dumps(fields).encode()


def _forged(directory: str, name: str | None = None) -> tuple[bytes, str]:
    """A well-formed handle naming ``directory``/``hisparse-hal-event-<hex>``, and that path."""
    name = name or ipc_event.NAME_PREFIX + uuid.uuid4().hex
    fields = {"kind": ipc_event.HANDLE_KIND, "version": 1, "dir": directory, "name": name,
              "token": uuid.uuid4().hex, "pid": 1, "process": "0" * 32}
    return json.dumps(fields).encode(), os.path.join(directory, name)


def _descriptors() -> set[tuple[str, str]]:
    """This process's open descriptors with what each names. Garbage from earlier tests is collected first, so
    its finalizers do not close descriptors in the middle of a check."""
    gc.collect()
    opened = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            opened.add((fd, os.readlink(f"/proc/self/fd/{fd}")))
        except FileNotFoundError:  # the listing's own descriptor, closed already
            pass
    return opened


def _opened_since(before: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """Descriptors open now that were not open at ``before`` (a leak); ones closed meanwhile are not counted."""
    return _descriptors() - before


def _bounded(call: Callable[[], Any], seconds: float = 30) -> Any:
    """``call()``'s result or exception, run in a daemon thread so a call that blocks fails the test instead of
    hanging it."""
    outcome: list = []

    def run() -> None:
        try:
            outcome.append(call())
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{call} blocked for {seconds} s"
    return outcome[0]


@pytest.fixture(params=["ofd", "lockf"])
def lock_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways a process locks counters: OFD locks (this kernel) and the ``lockf`` fallback."""
    if request.param == "lockf":
        monkeypatch.setattr(ipc_event, "_ofd_locks", False)
    return request.param


@pytest.fixture
def exporter_and_two_imports(lock_mode: str) -> Iterator[tuple[CpuIpcEvent, CpuIpcEvent, CpuIpcEvent]]:
    backend = CpuBackend(event_timeout_s=30)
    exporter = backend.create_ipc_event()
    handle = _as_foreign(backend.export_event(exporter))
    one, two = backend.import_event("cpu", handle), backend.import_event("cpu", handle)
    if lock_mode == "ofd" and one._record.file_lock is not None:
        pytest.skip("this kernel has no open-file-description locks: the lockf case covers it")
    assert (one._record.file_lock is None) == (lock_mode == "ofd")
    yield exporter, one, two
    for event in (two, one, exporter):
        event.close()


# ----------------------------------------------------------------------------- item 8: two imports, one process
def test_two_imports_in_one_process_with_threads_lose_no_record(exporter_and_two_imports) -> None:
    """POSIX ``lockf`` locks belong to the process: the second import was granted the lock the first held, and
    their read-modify-writes of the counters interleaved (6,829 of 8,000 records counted)."""
    exporter, one, two = exporter_and_two_imports
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible, inside the locked sections too
    try:
        threads = [threading.Thread(target=lambda e=event: [e.record() for _ in range(RECORDS_PER_THREAD)])
                   for event in (one, two, one, two, exporter)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    finally:
        sys.setswitchinterval(switch)
    assert not any(thread.is_alive() for thread in threads)
    total = len(threads) * RECORDS_PER_THREAD
    assert exporter._record.read() == one._record.read() == two._record.read() == (total, total)
    assert one.query() and two.query() and exporter.query()


def _record_many(event: CpuIpcEvent, count: int) -> None:
    for _ in range(count):
        event.record()


@pytest.mark.timeout(240)
def test_a_forked_child_recording_on_an_inherited_event_loses_no_record_of_its_parent(lock_mode: str) -> None:
    """A forked child shares the parent's open file description, so an OFD lock would not exclude it: the
    child locks with lockf instead (8,980 of 10,000 records counted without that)."""
    backend = CpuBackend(event_timeout_s=30)
    event = backend.create_ipc_event()
    count = 5 * RECORDS_PER_THREAD
    child = multiprocessing.get_context("fork").Process(target=_record_many, args=(event, count))
    child.start()
    _record_many(event, count)
    child.join(120)
    assert child.exitcode == 0
    assert event._record.read() == (2 * count, 2 * count)
    event.close()


_OTHER_PROCESS_TRIES_THE_LOCK = textwrap.dedent("""
    import fcntl, os, sys
    fd = os.open(sys.argv[1], os.O_RDWR)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, int(sys.argv[2]), int(sys.argv[3]))
    except OSError:
        print("held")
    else:
        print("free")
""")


def _lock_seen_from_another_process(path: str) -> str:
    command = [sys.executable, "-c", _OTHER_PROCESS_TRIES_THE_LOCK, path, str(ipc_event._COUNTERS.size),
               str(ipc_event._COUNTERS_AT)]
    return subprocess.run(command, capture_output=True, text=True, check=True, timeout=120).stdout.strip()


def test_closing_one_import_keeps_the_lock_another_holds(exporter_and_two_imports, lock_mode: str) -> None:
    """Closing any descriptor of the file dropped every ``lockf`` lock of the process, so a peer could enter
    a section another import of the same event was in."""
    exporter, one, two = exporter_and_two_imports
    path = one._path
    assert _lock_seen_from_another_process(path) == "free"
    with one._record._locked(fcntl.LOCK_EX):
        assert _lock_seen_from_another_process(path) == "held"
        closer = threading.Thread(target=two.close, daemon=True)
        closer.start()
        closer.join(0.2 if lock_mode == "lockf" else 30)  # the fallback's close waits for the section
        assert _lock_seen_from_another_process(path) == "held"
    closer.join(30)
    assert not closer.is_alive() and two.closed
    one.record()
    assert exporter._record.read() == (1, 1)


# ----------------------------------------------------------------------------- item 11: forged handles
def _assert_import_refused(handle: bytes, message: str) -> None:
    backend = CpuBackend(event_timeout_s=5)
    before = _descriptors()
    error = _bounded(lambda: backend.import_event("cpu", handle))
    assert isinstance(error, InvalidArgumentError), error
    assert error.__class__ is InvalidArgumentError and message in str(error), str(error)
    assert not _opened_since(before)


def test_a_handle_naming_a_directory_is_refused_naming_it(tmp_path) -> None:
    handle, path = _forged(str(tmp_path))
    os.mkdir(path)
    _assert_import_refused(handle, f"the handle names {path}, which is not a CPU IPC event file (Is a directory)")
    assert os.path.isdir(path)


def test_a_handle_naming_a_fifo_is_refused_without_blocking(tmp_path) -> None:
    handle, path = _forged(str(tmp_path))
    os.mkfifo(path)
    _assert_import_refused(handle, f"the handle names {path}, which is not a CPU IPC event file (a FIFO)")
    assert os.path.exists(path)


@pytest.mark.parametrize("target", ["/proc/self/mem", "/dev/null", "regular"])
def test_a_handle_naming_a_symbolic_link_is_refused_without_following_it(tmp_path, target: str) -> None:
    handle, path = _forged(str(tmp_path))
    if target == "regular":
        target = str(tmp_path / "bytes")
        with open(target, "wb") as file:
            file.write(b"\0" * 64)
    os.symlink(target, path)
    _assert_import_refused(handle, f"the handle names {path}, which is not a CPU IPC event file (a symbolic link)")
    assert os.path.islink(path)


@pytest.mark.parametrize(("text", "message"), [
    (b"[" * 2000 + b"]" * 2000, "4000-byte handle is not a CPU IPC event handle (could not decode it"),
    (b'{"kind": ' + b"[" * 2000 + b"]" * 2000 + b"}",
     "4010-byte handle is not a CPU IPC event handle (could not decode it: maximum recursion"),
    (b"[" * 100_000 + b"]" * 100_000, "200000-byte handle is longer than any CPU IPC event handle (at most 4096"),
], ids=["nested-list", "nested-field", "huge"])
def test_deeply_nested_or_huge_handle_text_is_refused(text: bytes, message: str) -> None:
    _assert_import_refused(text, message)


def test_sweeping_leaves_forged_entries_alone_without_blocking(tmp_path) -> None:
    fifo, _ = _forged(str(tmp_path))
    for make in (os.mkfifo, os.mkdir, lambda p: os.symlink("/proc/self/mem", p)):
        make(_forged(str(tmp_path))[1])
    entries = sorted(os.listdir(tmp_path))
    before = _descriptors()
    assert _bounded(lambda: ipc_event.sweep_stale_events(str(tmp_path))) == []
    assert sorted(os.listdir(tmp_path)) == entries and not _opened_since(before)
    del fifo


# ----------------------------------------------------------------------------- item 11: out of descriptors or space
_OUT_OF_DESCRIPTORS = textwrap.dedent("""
    import errno, os, resource, sys
    from hisparse_hal.errors import ResourceExhaustedError
    from hisparse_hal.vendors.cpu import ipc_event
    ipc_event._event_dir = lambda: sys.argv[1]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 256), hard))
    fillers = []
    try:
        while True:
            fillers.append(os.open("/dev/null", os.O_RDONLY))
    except OSError as exc:
        assert exc.errno == errno.EMFILE
    try:
        ipc_event.create_event(5)
    except ResourceExhaustedError as exc:
        print(type(exc).__name__, exc.errno, "|", exc.strerror)
    for fd in fillers:
        os.close(fd)
    print("left:", os.listdir(sys.argv[1]))
    event = ipc_event.create_event(5)
    print("after:", len(os.listdir(sys.argv[1])))
    event.close()
""")


def test_create_out_of_file_descriptors_is_a_typed_error_leaving_nothing(tmp_path) -> None:
    run = subprocess.run([sys.executable, "-c", _OUT_OF_DESCRIPTORS, str(tmp_path)], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].startswith(f"ResourceExhaustedError {errno.EMFILE} | create_ipc_event: could not create "
                               f"{tmp_path}/{ipc_event.NAME_PREFIX}"), run.stdout
    assert "Too many open files; nothing was left behind" in lines[0] and "ulimit -n" in lines[0]
    assert lines[1:] == ["left: []", "after: 1"]


def _failing(real: Callable[..., Any], code: int, when: Callable[..., bool]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        if when(*args):
            raise OSError(code, os.strerror(code))
        return real(*args, **kwargs)
    return call


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EMFILE, errno.ENFILE, errno.EDQUOT])
@pytest.mark.parametrize("call", ["open", "pwrite"])
def test_create_out_of_space_or_descriptors_is_typed_and_leaves_no_file(tmp_path, monkeypatch, code: int,
                                                                        call: str) -> None:
    monkeypatch.setattr(ipc_event, "_event_dir", lambda: str(tmp_path))
    if call == "open":
        monkeypatch.setattr(os, "open", _failing(os.open, code, lambda path, *rest: str(path).startswith(
            str(tmp_path))))
    else:
        monkeypatch.setattr(os, "pwrite", _failing(os.pwrite, code, lambda *args: True))
    before = _descriptors()
    with pytest.raises(ResourceExhaustedError, match=rf"^\[Errno {code}\] create_ipc_event: could not "
                       rf"{'create' if call == 'open' else 'write'} {tmp_path}/{ipc_event.NAME_PREFIX}[0-9a-f]{{32}}: "
                       rf"{os.strerror(code)}; nothing was left behind") as info:
        ipc_event.create_event(5)
    assert info.value.errno == code and isinstance(info.value, OSError)
    assert os.listdir(tmp_path) == [] and not _opened_since(before)


def test_import_out_of_descriptors_is_typed(monkeypatch) -> None:
    backend = CpuBackend(event_timeout_s=5)
    exporter = backend.create_ipc_event()
    handle = _as_foreign(backend.export_event(exporter))
    monkeypatch.setattr(os, "open", _failing(os.open, errno.EMFILE, lambda path, *rest: path == exporter._path))
    with pytest.raises(ResourceExhaustedError, match=rf"import_event: could not open {exporter._path}: Too many"):
        backend.import_event("cpu", handle)
    monkeypatch.undo()
    exporter.record()
    assert exporter._record.read() == (1, 1)
    exporter.close()
