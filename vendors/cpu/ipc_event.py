"""Interprocess events of the CPU reference device: a small record in a shared-memory file.

The record holds two counters, records issued and records completed, read and written only under a
byte-range lock on the file: an open-file-description lock where the kernel has them (Linux 3.15+), so two
imports of one event in one process exclude each other too, else (and in a child forked with the event) a
POSIX ``lockf`` lock serialized within the process per file. The kernel's lock hand-off orders memory (unlock
releases, lock acquires), so bytes written before ``record()`` are visible to a process whose ``wait()`` returned. The
exporter holds a shared ``flock`` on the file while its event lives; an importer that can take that
lock exclusively knows the exporter exited or closed the event, so no wait can hang on it, and removes
the file a killed exporter left behind; ``create_event`` sweeps any such file no importer touched.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import re
import stat
import struct
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Iterator

import torch

from hisparse_hal.errors import EventTimeoutError, InvalidArgumentError, PeerLostError, ResourceExhaustedError
from hisparse_hal.events import DEFAULT_TIMEOUT, WaitDefault, check_timeout_s, wait_bound
from hisparse_hal.settings import EVENT_TIMEOUT_ENV

from .delayed_work import DelayedWork
from .graph import refuse_while_capturing

__all__ = ["CpuIpcEvent", "create_event", "import_event", "sweep_stale_event_files", "sweep_stale_events"]

log = logging.getLogger(__name__)

HANDLE_KIND = "hisparse-hal/cpu-ipc-event"
HANDLE_VERSION = 1
NAME_PREFIX = "hisparse-hal-event-"
_NAME = re.compile(NAME_PREFIX + r"[0-9a-f]{32}\Z")
_MAGIC = b"HSHALCPU"
_HEADER = struct.Struct("<8s16sQ")  # magic, event token, creator pid
_COUNTERS = struct.Struct("<QQ")  # records issued, records completed
_COUNTERS_AT = _HEADER.size
#: How often a waiting importer checks that the exporter still holds the event.
LIVENESS_PERIOD_S = 0.05
#: Longest handle :func:`import_event` decodes (an exported one is about 250 bytes).
MAX_HANDLE_BYTES = 4096
#: The system running out of something an event needs: descriptors, space or inodes in the directory, memory.
_EXHAUSTED = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOSPC, errno.EDQUOT, errno.ENOMEM, errno.ENOLCK})

#: Identifies this process in handles (a pid alone collides across PID namespaces); renewed on fork.
_process_token = uuid.uuid4().hex


def _renew_process_token() -> None:
    global _process_token
    _process_token = uuid.uuid4().hex


os.register_at_fork(after_in_child=_renew_process_token)


def _event_dir() -> str:
    """``/dev/shm`` (memory-backed, shared by local processes) where it exists, else the temp dir."""
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


#: ``struct flock`` (l_type, l_whence, l_start, l_len, l_pid, padding) for ``fcntl``'s OFD lock commands.
_FLOCK = struct.Struct("hhqqi4x")
_OFD_TYPES = {fcntl.LOCK_SH: fcntl.F_RDLCK, fcntl.LOCK_EX: fcntl.F_WRLCK, fcntl.LOCK_UN: fcntl.F_UNLCK}
_ofd_locks: bool | None = None  # decided once per process, by the first record (never mixed: see _uses_ofd)


def _uses_ofd(fd: int) -> bool:
    """Whether this process locks counters with open-file-description locks (``F_OFD_SETLKW``).

    POSIX ``lockf`` locks belong to the process: a second import of one event in the same process is granted
    the lock its first import holds, and closing any descriptor of the file drops them all (fcntl(2)). OFD
    locks belong to the open file, so neither happens. Decided once, by querying the kernel, because OFD and
    ``lockf`` locks conflict even within one process.
    """
    global _ofd_locks
    if _ofd_locks is None:
        command = getattr(fcntl, "F_OFD_GETLK", None)
        try:
            if command is not None:
                fcntl.fcntl(fd, command, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, _COUNTERS_AT, _COUNTERS.size, 0))
        except OSError:
            command = None  # a kernel before 3.15 (EINVAL)
        _ofd_locks = command is not None
    return _ofd_locks


class _FileLock:
    """Serializes this process's ``lockf`` sections and closes on one file (``lockf`` fallback only)."""

    def __init__(self) -> None:
        # Reentrant: a finalizer that closes another descriptor of the file may run inside a section (GC).
        self.lock = threading.RLock()


_file_locks: weakref.WeakValueDictionary[tuple[int, int], _FileLock] = weakref.WeakValueDictionary()
_file_locks_guard = threading.Lock()


def _file_lock(fd: int) -> _FileLock | None:
    """The process-wide lock of ``fd``'s file under the ``lockf`` fallback; None with OFD locks."""
    if _uses_ofd(fd):
        return None
    stat = os.fstat(fd)
    with _file_locks_guard:
        lock = _file_locks.get((stat.st_dev, stat.st_ino))
        if lock is None:
            lock = _file_locks[(stat.st_dev, stat.st_ino)] = _FileLock()
        return lock


class _Record:
    """The open file of one event and its locked counter operations."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        # Byte-range locks never exclude the same lock owner: threads sharing this descriptor take this first.
        self._threads = threading.Lock()
        #: The ``lockf`` fallback's per-file lock, shared by every record of the file in this process.
        self.file_lock = _file_lock(fd)
        self._pid = os.getpid()

    def _lock_range(self, kind: int) -> None:
        # A child forked with this record shares its open file description, so the parent's OFD lock would be
        # the child's too: the child locks with lockf, which conflicts with OFD locks (fcntl(2)).
        if self.file_lock is None and self._pid == os.getpid():
            flock = _FLOCK.pack(_OFD_TYPES[kind], os.SEEK_SET, _COUNTERS_AT, _COUNTERS.size, 0)
            fcntl.fcntl(self.fd, fcntl.F_OFD_SETLKW, flock)
        else:
            fcntl.lockf(self.fd, kind, _COUNTERS.size, _COUNTERS_AT)

    @contextlib.contextmanager
    def _locked(self, kind: int) -> Iterator[None]:
        with self._threads, (self.file_lock.lock if self.file_lock is not None else contextlib.nullcontext()):
            self._lock_range(kind)
            try:
                yield
            finally:
                self._lock_range(fcntl.LOCK_UN)

    def read(self) -> tuple[int, int]:
        with self._locked(fcntl.LOCK_SH):
            return _COUNTERS.unpack(os.pread(self.fd, _COUNTERS.size, _COUNTERS_AT))

    def issue(self) -> int:
        with self._locked(fcntl.LOCK_EX):
            issued, completed = _COUNTERS.unpack(os.pread(self.fd, _COUNTERS.size, _COUNTERS_AT))
            os.pwrite(self.fd, _COUNTERS.pack(issued + 1, completed), _COUNTERS_AT)
            return issued + 1

    def complete(self, sequence: int) -> None:
        with self._locked(fcntl.LOCK_EX):
            issued, completed = _COUNTERS.unpack(os.pread(self.fd, _COUNTERS.size, _COUNTERS_AT))
            os.pwrite(self.fd, _COUNTERS.pack(issued, max(completed, sequence)), _COUNTERS_AT)

    def holder_alive(self) -> bool:
        """Whether some process (the exporter) still holds the event's liveness lock.

        On Linux ``flock`` locks and POSIX record locks do not interact (flock(2)), so the counters'
        ``lockf`` never disturbs this one.
        """
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        return False


def _release(fd: int, path: str | None, owner_pid: int, file_lock: _FileLock | None) -> None:
    """Finalizer: the exporter unlinks the file (importers keep their open descriptors); all close.
    A forked child that inherited the exporter's event only closes its copy of the descriptor. Under the
    ``lockf`` fallback the close waits for this process's sections on the file (it would drop their lock)."""
    if path is not None and os.getpid() == owner_pid:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
    _close(fd, file_lock)


def _close(fd: int, file_lock: _FileLock | None) -> None:
    with file_lock.lock if file_lock is not None else contextlib.nullcontext():
        os.close(fd)


class CpuIpcEvent(torch.Event):
    """A ``torch.Event`` (CPU) whose state lives in a shared-memory file.

    It derives from ``torch.Event`` so that ``torch.Stream.wait_event(event)`` (vLLM 0.34.0,
    ``kv_connector/v1/hisparse/worker.py:419, 913``) is memory-safe: torch reads its argument as a
    ``torch.Event`` without a type check (``torch/csrc/Stream.cpp``, ``THPStream_wait_event``). On the CPU
    that wait is a no-op (torch's CPU stream has no events) and never reaches :meth:`wait`; only
    :meth:`wait` and :meth:`synchronize` order work across processes.

    ``record()`` completes at once (host work is synchronous on the CPU device) after bumping the
    issued counter; ``wait()`` and ``synchronize()`` block until the latest record issued before the
    call has completed, for at most ``timeout_s`` seconds. Records and waits are unlimited.

    Attributes:
        name: the shared file's name (``hisparse-hal-event-<uuid4>``).
        creator_pid: pid of the exporting process (for messages).
        owner: True in the process that created (and exports) the event.
        timeout_s: bound of ``wait`` and of ``synchronize()`` without a timeout, in seconds (positive and
            finite: setting anything else raises ``InvalidArgumentError``).
        handle: the picklable bytes that :func:`import_event` opens.
    """

    def __new__(cls, *args: object, **kwargs: object) -> CpuIpcEvent:
        return super().__new__(cls, torch.device("cpu"))  # torch.Event's own arguments: the device only

    def __init__(self, fd: int, directory: str, name: str, token: str, creator_pid: int,
                 creator_process: str, owner: bool, timeout_s: float) -> None:
        self._record = _Record(fd)
        self.name = name
        self.creator_pid = creator_pid
        self.owner = owner
        self.timeout_s = timeout_s  # checked by the property's setter
        self.handle = json.dumps({
            "kind": HANDLE_KIND, "version": HANDLE_VERSION, "dir": directory, "name": name,
            "token": token, "pid": creator_pid, "process": creator_process,
        }).encode()
        self._path = os.path.join(directory, name)
        #: The backend's delayed host work (set by CpuBackend), which a record completes behind.
        self.host_work: DelayedWork | None = None
        self._finalizer = weakref.finalize(self, _release, fd, self._path if owner else None, os.getpid(),
                                           self._record.file_lock)

    @property
    def timeout_s(self) -> float:
        """Bound of every wait without its own timeout, in seconds."""
        return self._timeout_s

    @timeout_s.setter
    def timeout_s(self, value: float) -> None:
        self._timeout_s = check_timeout_s(value, "CPU IPC event timeout_s")

    def __repr__(self) -> str:
        role = "exporter" if self.owner else f"imported from pid {self.creator_pid}"
        return f"CpuIpcEvent({self.name}, {role}{', closed' if self.closed else ''})"

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (or the event was collected)."""
        return not self._finalizer.alive

    def close(self) -> None:
        """Release the event: the exporter removes the shared file; an importer's next call then raises
        ``PeerLostError``. Idempotent."""
        self._finalizer()

    def record(self, stream: object | None = None) -> None:
        """Record: every host operation issued before it has completed, so it completes at once.

        Raises:
            PeerLostError: an imported event whose exporter exited or closed it (its file is removed).
            CaptureMisuseError: while capturing. InvalidArgumentError: a stream that is not a CPU
                ``torch.Stream``, or a closed event.
        """
        self._usable("record", stream)
        sequence = self._record.issue()
        if self.host_work is None:
            self._record.complete(sequence)
        else:  # completes behind host work a delay left in flight (CpuBackend.delay_next_swap), at once if none
            self.host_work.after(lambda: self._record.complete(sequence))

    def query(self) -> bool:
        """True when every record issued so far has completed."""
        self._usable("query", None)
        issued, completed = self._record.read()
        return completed >= issued

    def wait(self, stream: object | None = None) -> None:
        """Block until the latest record issued before this call has completed (the CPU device's only
        stream is the host). Returns at once when nothing is pending.

        Raises:
            EventTimeoutError: not complete within ``timeout_s``.
            PeerLostError: (an ``EventTimeoutError``) on an imported event whose exporter exited or
                closed it, at the call or within ``LIVENESS_PERIOD_S`` of it during the wait; the
                exporter's file is removed then.
            CaptureMisuseError: while capturing. InvalidArgumentError: a stream that is not a CPU
                ``torch.Stream``, or a closed event.
        """
        self._usable("wait", stream)
        self._wait_for(self._record.read()[0], "wait", self.timeout_s)

    def synchronize(self, timeout: float | None | WaitDefault = DEFAULT_TIMEOUT) -> None:
        """Like :meth:`wait`, bounded by ``timeout`` seconds: ``timeout_s`` when omitted, no bound when ``None``
        (the only infinite wait; a lost exporter still ends it with ``PeerLostError``).

        Raises:
            InvalidArgumentError: ``timeout`` is NaN, infinite, zero or negative, a bool or not a number
                (checked before anything is read). Others as :meth:`wait`.
        """
        bound = wait_bound(timeout, self.timeout_s)
        self._usable("synchronize", None)
        self._wait_for(self._record.read()[0], "synchronize", bound)

    def _issue_pending(self) -> int:
        """Issue a record without completing it: an in-flight record, as a GPU stream has while its
        work runs. The CPU device never leaves one itself; tests use this to exercise bounded waits."""
        return self._record.issue()

    def _usable(self, member: str, stream: object | None) -> None:
        if self.closed:
            raise InvalidArgumentError(f"{member} on closed CPU IPC event {self.name}")
        if stream is not None and not (isinstance(stream, torch.Stream) and stream.device.type == "cpu"):
            raise InvalidArgumentError(
                f"{member}: the CPU device has one implicit stream; pass stream=None or a CPU torch.Stream, "
                f"got {stream!r}"
            )
        if member != "query":
            refuse_while_capturing(f"CpuIpcEvent.{member}")
        if not self.owner and not self._record.holder_alive():
            raise self._exporter_lost(member)

    def _exporter_lost(self, member: str) -> PeerLostError:
        """Remove the file of an exporter that is gone (it cannot any more) and describe the loss."""
        _unlink_stale(self._path)
        issued, completed = self._record.read()
        if completed < issued:
            state = f"with record #{issued} pending (completed: #{completed}); it will never complete"
        else:
            state = f"after {completed} completed records; no further record can come"
        return PeerLostError(
            f"{member} on CPU IPC event {self.name}: the exporting process (pid {self.creator_pid}) exited "
            f"or closed the event {state}. An exported event must outlive every importer's use",
            pid=self.creator_pid,
        )

    def _wait_for(self, target: int, member: str, bound: float) -> None:
        start = time.monotonic()
        next_liveness = start + LIVENESS_PERIOD_S
        pause = 1e-5
        while True:
            completed = self._record.read()[1]
            if completed >= target:
                return
            now = time.monotonic()
            if not self.owner and now >= next_liveness:
                next_liveness = now + LIVENESS_PERIOD_S
                if not self._record.holder_alive():
                    raise self._exporter_lost(member)
            if now - start >= bound:
                raise EventTimeoutError(
                    f"{member} on CPU IPC event {self.name} timed out after {bound:g} s waiting for record "
                    f"#{target} (completed: #{completed}, exporter pid {self.creator_pid}); raise "
                    f"{EVENT_TIMEOUT_ENV} or event.timeout_s if the recorded work is legitimately slow"
                )
            time.sleep(pause)
            pause = min(pause * 2, 2e-3)


def create_event(timeout_s: float) -> CpuIpcEvent:
    """Create an exportable event owned by this process (its shared file lives until it is closed).

    Raises:
        InvalidArgumentError: ``timeout_s`` is not a positive, finite number.
        ResourceExhaustedError: no file descriptor (``EMFILE``/``ENFILE``), space or inode (``ENOSPC``), quota,
            memory or lock left; no file is left behind.
    """
    timeout_s = check_timeout_s(timeout_s, "event timeout_s")
    directory = _event_dir()
    sweep_stale_events(directory)
    name = NAME_PREFIX + uuid.uuid4().hex
    token = uuid.uuid4().hex
    path = os.path.join(directory, name)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise _exhausted_or_raw(exc, f"create_ipc_event: could not create {path}") from exc
    try:
        # Locked before the header is written: a sweeper that wins the lock first sees an empty file
        # and leaves it alone, and once the header exists the lock is held.
        fcntl.flock(fd, fcntl.LOCK_SH)  # held while the event lives: the importers' liveness signal
        written = os.pwrite(fd, _HEADER.pack(_MAGIC, bytes.fromhex(token), os.getpid()) + _COUNTERS.pack(0, 0), 0)
        if written != _HEADER.size + _COUNTERS.size:
            raise OSError(errno.ENOSPC, f"wrote {written} of {_HEADER.size + _COUNTERS.size} bytes")
    except BaseException as exc:
        os.close(fd)
        os.unlink(path)
        if isinstance(exc, OSError):
            raise _exhausted_or_raw(exc, f"create_ipc_event: could not write {path}") from exc
        raise
    return CpuIpcEvent(fd, directory, name, token, os.getpid(), _process_token, True, timeout_s)


def _exhausted_or_raw(exc: OSError, what: str) -> OSError:
    """``exc`` as :class:`ResourceExhaustedError` when the system ran out of something (else unchanged)."""
    if exc.errno not in _EXHAUSTED:
        return exc
    return ResourceExhaustedError(
        exc.errno, f"{what}: {os.strerror(exc.errno)}; nothing was left behind. Close unused events or files, "
        f"raise the open-file limit (ulimit -n) or free space in {_event_dir()}",
    )


def _parse_handle(handle: object) -> dict:
    if not isinstance(handle, (bytes, bytearray, memoryview)):
        raise InvalidArgumentError(f"import_event: handle must be bytes from export_event, got {type(handle).__name__}")
    raw = bytes(handle)
    if len(raw) > MAX_HANDLE_BYTES:
        raise InvalidArgumentError(
            f"import_event: {len(raw)}-byte handle is longer than any CPU IPC event handle (at most "
            f"{MAX_HANDLE_BYTES} bytes)"
        )
    if raw.startswith(b"HSHALEV1"):
        raise InvalidArgumentError(
            "import_event: this handle comes from a GPU backend's export_event, not the CPU device's"
        )
    try:
        fields = json.loads(raw.decode())
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # RecursionError: deeply nested text
        raise InvalidArgumentError(
            f"import_event: {len(raw)}-byte handle is not a CPU IPC event handle (could not decode it: {exc})"
        ) from None
    if not isinstance(fields, dict) or fields.get("kind") != HANDLE_KIND:
        kind = fields.get("kind") if isinstance(fields, dict) else type(fields).__name__
        raise InvalidArgumentError(f"import_event: handle kind {kind!r} is not {HANDLE_KIND!r}")
    if fields.get("version") != HANDLE_VERSION:
        raise InvalidArgumentError(
            f"import_event: handle version {fields.get('version')!r} is not {HANDLE_VERSION}; export and "
            "import with the same hisparse-hal release"
        )
    expected = {"dir": str, "name": str, "token": str, "pid": int, "process": str}
    for key, kind in expected.items():
        if not isinstance(fields.get(key), kind):
            raise InvalidArgumentError(f"import_event: handle field {key!r} is missing or not a {kind.__name__}")
    if (
        not _NAME.match(fields["name"])
        or not os.path.isabs(fields["dir"])
        or not re.fullmatch(r"[0-9a-f]{32}", fields["token"])
    ):
        raise InvalidArgumentError(
            f"import_event: handle names {fields['dir']!r}/{fields['name']!r}, which is not a CPU IPC event"
        )
    return fields


def import_event(handle: object, timeout_s: float) -> CpuIpcEvent:
    """Open an event exported by another process.

    Raises:
        InvalidArgumentError: not a CPU event handle (naming what is wrong: over ``MAX_HANDLE_BYTES``, not
            JSON or nested too deeply, a field missing); one naming a directory, FIFO, device, symbolic link
            or anything but this user's regular file (opened without blocking or following links); a handle
            exported by this same process (CUDA and HIP refuse same-process opens, ROCm hip #2882: use the
            original event); an event that no longer exists or whose exporter exited; a bad ``timeout_s``.
        ResourceExhaustedError: no file descriptor left to open it.
    """
    timeout_s = check_timeout_s(timeout_s, "event timeout_s")
    fields = _parse_handle(handle)
    if fields["process"] == _process_token:
        raise InvalidArgumentError(
            "import_event: this handle was exported by this same process; as on CUDA and HIP, an IPC "
            "event can only be imported in another process. Use the original event here"
        )
    path = os.path.join(fields["dir"], fields["name"])
    try:
        fd = _open_event_file(path)
    except FileNotFoundError:
        raise InvalidArgumentError(
            f"import_event: event {fields['name']} (exported by pid {fields['pid']}) no longer exists: its "
            "exporter closed it or exited. An exported event must outlive every importer's use"
        ) from None
    except OSError as exc:
        if exc.errno in _EXHAUSTED:
            raise _exhausted_or_raw(exc, f"import_event: could not open {path}") from exc
        reason = "a symbolic link" if exc.errno == errno.ELOOP else exc.strerror or str(exc)
        raise InvalidArgumentError(f"import_event: the handle names {path}, which is not a CPU IPC event file "
                                   f"({reason})") from None
    try:
        header = os.pread(fd, _HEADER.size, 0)
        if len(header) < _HEADER.size or _HEADER.unpack(header)[:2] != (_MAGIC, bytes.fromhex(fields["token"])):
            raise InvalidArgumentError(f"import_event: {path} is not the event this handle names (token mismatch)")
        if not _Record(fd).holder_alive():
            _unlink_stale(path)
            raise InvalidArgumentError(
                f"import_event: the exporter of event {fields['name']} (pid {fields['pid']}) exited or "
                "closed it; an exported event must outlive every importer's use"
            )
    except BaseException:
        _close(fd, _file_lock(fd))
        raise
    return CpuIpcEvent(fd, fields["dir"], fields["name"], fields["token"], fields["pid"], fields["process"],
                       False, timeout_s)


def _open_event_file(path: str) -> int:
    """Open ``path`` read-write if it is a regular file of this user: never through a symbolic link (``/proc``
    files), never blocking (a FIFO), never a directory or device.

    Raises:
        OSError: the open failed (``ENOENT``, ``ELOOP`` for a link, ``EISDIR``, ``EMFILE``, ...) or, for what
            opened but is no event file, ``EINVAL`` naming its kind.
    """
    fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    info = os.fstat(fd)
    if stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid():
        return fd
    os.close(fd)
    kind = "a regular file of another user" if stat.S_ISREG(info.st_mode) else _KINDS.get(
        stat.S_IFMT(info.st_mode), "not a regular file")
    raise OSError(errno.EINVAL, kind)


_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
          stat.S_IFSOCK: "a socket", stat.S_IFDIR: "a directory"}


def _unlink_stale(path: str) -> None:
    """Remove the file of an event whose exporter died without closing it."""
    try:
        os.unlink(path)
    except OSError as exc:
        if exc.errno != errno.ENOENT:
            raise


def sweep_stale_events(directory: str | None = None) -> list[str]:
    """Remove the files of events whose exporter exited without closing them (a SIGKILL, say).

    A file is stale when it holds a complete header and nobody holds its liveness lock; a file being
    created is locked before its header is written, so it is never taken for stale. Files this user
    cannot open are left alone. ``create_event`` calls this first, so killed exporters leave nothing
    behind once any process of this user creates an event again.

    Returns:
        The names of the files removed.
    """
    directory = directory or _event_dir()
    removed: list[str] = []
    try:
        names = [name for name in os.listdir(directory) if _NAME.match(name)]
    except OSError:
        return removed
    for name in names:
        path = os.path.join(directory, name)
        try:
            fd = _open_event_file(path)
        except OSError:
            continue  # gone already, another user's, or no event file (a directory, FIFO or link: left alone)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # its exporter is alive
            if os.fstat(fd).st_size >= _HEADER.size + _COUNTERS.size:
                _unlink_stale(path)
                removed.append(name)
        finally:
            _close(fd, _file_lock(fd))
    if removed:
        log.info("removed %d CPU IPC event file(s) left by exporters that exited: %s", len(removed), ", ".join(removed))
    return removed


def sweep_stale_event_files() -> list[str]:
    """:func:`sweep_stale_events` in the event directory, as full paths (the CPU spec's ``sweep_shared_files``).

    Returns:
        The paths removed.
    """
    directory = _event_dir()
    return [os.path.join(directory, name) for name in sweep_stale_events(directory)]
