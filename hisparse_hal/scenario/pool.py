"""The shared host pool of a scenario: one memory-backed file every rank maps, with a control page.

Invariant: the file is unlinked as soon as every rank has mapped it, and its name carries the pid of the
process that created it, so a file left by a creator that was SIGKILLed before that moment is found and
removed by :func:`sweep_stale_pools` once that creator is dead; each rank holds a POSIX lock on its own byte
of the file while it lives, so any rank can tell, without a timeout, that another one is gone (the kernel
drops a dead process's locks). The mapping is never unmapped while a tensor views it: every view keeps the
``mmap`` object alive (``torch.frombuffer`` holds a reference, not a buffer export, so an explicit ``close()``
would succeed under a live view), and it is unmapped when the last view is gone.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import mmap
import os
import struct
import tempfile
import uuid

import torch

from hisparse_hal.errors import InvalidArgumentError
from hisparse_hal.python_child import process_alive

__all__ = ["SharedPool", "CONTROL_BYTES", "PUBLISHED", "ABORTED", "ABORTED_BY", "NAME_PREFIX", "sweep_stale_pools",
           "pool_owner"]

log = logging.getLogger(__name__)

#: Bytes before the data: int64 words (step published by rank 0, steps consumed per rank, pids).
CONTROL_BYTES = mmap.PAGESIZE
#: Word holding the last step rank 0 published (-1: none).
PUBLISHED = 0
_CONSUMED_AT = 1
_PIDS_AT = 128
#: Word set to ``1 + lost rank`` by the first rank that finds another one gone (0: none).
ABORTED = 511
#: Word holding the rank that set ``ABORTED`` (the reporter; meaningful only once ``ABORTED`` is set).
ABORTED_BY = 510
NAME_PREFIX = "hisparse-hal-pool-"
MAX_RANKS = _PIDS_AT - _CONSUMED_AT


def _pool_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


class SharedPool:
    """One rank's mapping of the shared pool.

    Attributes:
        control: ``[CONTROL_BYTES // 8]`` int64 words (see ``PUBLISHED``, ``consumed_word``, ``ABORTED``).
        data: ``[pool_blocks, block_bytes]`` uint8, page-aligned; what each rank pins.
    """

    def __init__(self, path: str, rank: int, ranks: int, pool_blocks: int, block_bytes: int) -> None:
        self.path = path
        self.rank = rank
        self.ranks = ranks
        size = CONTROL_BYTES + pool_blocks * block_bytes
        self._fd = os.open(path, os.O_RDWR)  # the only descriptor this process opens on the file
        self._map: mmap.mmap | None = None
        try:
            if os.fstat(self._fd).st_size != size:
                raise InvalidArgumentError(f"shared pool {path} is {os.fstat(self._fd).st_size} bytes, expected {size}")
            self._map = mmap.mmap(self._fd, size)
            whole = torch.frombuffer(self._map, dtype=torch.uint8)
            self.control = whole[:CONTROL_BYTES].view(torch.int64)
            self.data = whole[CONTROL_BYTES:].view(pool_blocks, block_bytes)
            fcntl.lockf(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, rank)  # "rank is alive", until exit
            self.control[_PIDS_AT + rank] = os.getpid()
        except BaseException:
            os.close(self._fd)
            raise

    # ------------------------------------------------------------------ creation and removal
    @staticmethod
    def create(ranks: int, pool_blocks: int, block_bytes: int) -> str:
        """Create the pool's file (zeroed data, control words ready) and return its path.

        Raises:
            InvalidArgumentError: more ranks than the control page has words for.
        """
        if ranks > MAX_RANKS:
            raise InvalidArgumentError(f"the shared pool's control page holds at most {MAX_RANKS} ranks, got {ranks}")
        path = os.path.join(_pool_dir(), f"{NAME_PREFIX}{os.getpid()}-{uuid.uuid4().hex}")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, CONTROL_BYTES + pool_blocks * block_bytes)
            unset = _PIDS_AT + MAX_RANKS  # published, consumed and pid words start at -1; ABORTED at 0
            os.pwrite(fd, struct.pack(f"<{unset}q", *([-1] * unset)), 0)
        except BaseException:
            os.close(fd)
            SharedPool.unlink(path)
            raise
        os.close(fd)
        return path

    @staticmethod
    def unlink(path: str) -> bool:
        """Remove the pool's file name (mappings stay valid); False when it was gone already."""
        try:
            os.unlink(path)
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                raise
            return False
        return True

    # ------------------------------------------------------------------ control words
    @staticmethod
    def consumed_word(rank: int) -> int:
        """Index of the word holding the last step ``rank`` finished reading."""
        return _CONSUMED_AT + rank

    def word(self, index: int) -> int:
        """The control word ``index``."""
        return int(self.control[index])

    def set_word(self, index: int, value: int) -> None:
        """Store ``value`` in control word ``index``."""
        self.control[index] = value

    def pid_of(self, rank: int) -> int:
        """The pid ``rank`` recorded when it mapped the pool (-1: not yet)."""
        return int(self.control[_PIDS_AT + rank])

    # ------------------------------------------------------------------ liveness
    def is_lost(self, rank: int) -> bool:
        """Whether ``rank`` mapped the pool and has since exited (its liveness lock is free)."""
        if rank == self.rank or self.pid_of(rank) < 0:
            return False
        try:
            fcntl.lockf(self._fd, fcntl.LOCK_SH | fcntl.LOCK_NB, 1, rank)
        except OSError:
            return False  # held: alive
        fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, rank)
        return True

    def lost_ranks(self) -> list[int]:
        """Every other rank that has exited."""
        return [r for r in range(self.ranks) if self.is_lost(r)]

    def close(self) -> None:
        """Drop this rank's liveness lock and its references to the mapping.

        The mapping itself is unmapped when the last tensor viewing it is gone (a traceback's frame that
        still holds ``data`` can be printed safely), never here.
        """
        self.control = self.data = None  # type: ignore[assignment]
        self._map = None
        os.close(self._fd)


def pool_owner(name: str) -> int | None:
    """The pid of the process that created the pool file ``name`` (``hisparse-hal-pool-<pid>-<uuid>``);
    None for another name, or a file named before pids were recorded (``hisparse-hal-pool-<uuid>``)."""
    if not name.startswith(NAME_PREFIX):
        return None
    pid, sep, _ = name[len(NAME_PREFIX):].partition("-")
    return int(pid) if sep and pid.isdigit() else None


def _recorded_pids(path: str) -> list[int]:
    """The pids the ranks wrote into an old-style pool's control page (none: no rank mapped it)."""
    try:
        with open(path, "rb") as f:
            f.seek(_PIDS_AT * 8)
            raw = f.read(MAX_RANKS * 8)
    except OSError:
        return []
    words = struct.unpack(f"<{len(raw) // 8}q", raw[: len(raw) // 8 * 8])
    return [w for w in words if w > 0]


def sweep_stale_pools(directory: str | None = None, min_age_s: float = 3600.0) -> list[str]:
    """Remove pool files whose creator is dead: what a SIGKILLed scenario driver left behind.

    A file whose name carries its creator's pid is removed once that process is gone. An old-style name
    (no pid) is removed when every pid its ranks recorded is gone, or, with none recorded, when it is
    older than ``min_age_s``. Files of live runs, and other users' files, are left alone.

    Returns:
        The paths removed.
    """
    import time

    where = directory or _pool_dir()
    try:
        names = [n for n in os.listdir(where) if n.startswith(NAME_PREFIX)]
    except OSError:
        return []
    removed = []
    for name in sorted(names):
        path = os.path.join(where, name)
        owner = pool_owner(name)
        if owner is not None:
            stale = not process_alive(owner)
        else:
            pids = _recorded_pids(path)
            try:
                old = time.time() - os.stat(path).st_mtime > min_age_s
            except OSError:
                continue
            stale = not any(process_alive(p) for p in pids) if pids else old
        if not stale:
            continue
        try:
            os.unlink(path)
        except OSError:  # gone meanwhile, or not ours to remove
            continue
        log.info("removed the stale shared pool %s (its creator is gone)", path)
        removed.append(path)
    return removed
