"""The CPU device's runtime binding: the only module that calls into libc (``mlock``/``munlock`` page
locking, ``memmove`` byte copies) or reads ``RLIMIT_MEMLOCK``; the role ``runtime.py`` has in ``cuda/``
(libcuda) and ``rocm/`` (libamdhip64).

Invariant: a page stays locked while any live locked range in the process touches it, whichever backend
locked it (``mlock`` does not count: one ``munlock`` unlocks a page however often it was locked), so
unlocking a range leaves its pages that another live range shares locked.
When the OS refuses (RLIMIT_MEMLOCK, no CAP_IPC_LOCK) the range is reported as not locked, never raised.
"""

from __future__ import annotations

import bisect
import ctypes
import ctypes.util
import errno
import logging
import mmap
import resource
import threading
from collections.abc import Callable

import torch

from hisparse_hal.errors import DeviceRuntimeError

__all__ = ["PageLocker", "probe_page_lock", "memlock_limit", "memmove_each", "REFUSAL_ERRNOS"]

log = logging.getLogger(__name__)

PAGE_BYTES = mmap.PAGESIZE
#: mlock(2) errors that mean "not allowed or over the limit here": pinning goes on without locking.
#: EAGAIN: some of the range could not be locked; ENOMEM: over RLIMIT_MEMLOCK; EPERM: not permitted.
REFUSAL_ERRNOS = frozenset({errno.EPERM, errno.ENOMEM, errno.EAGAIN})

_libc_lock = threading.Lock()
_libc: ctypes.CDLL | None = None


def _load_libc() -> ctypes.CDLL:
    global _libc
    with _libc_lock:
        if _libc is None:
            lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            for name in ("mlock", "munlock"):
                fn = getattr(lib, name)
                fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
                fn.restype = ctypes.c_int
            _libc = lib
        return _libc


def _libc_call(name: str) -> Callable[[int, int], int]:
    """``call(address, size) -> 0 or errno`` for libc ``mlock`` or ``munlock``."""

    def call(address: int, size: int) -> int:
        fn = getattr(_load_libc(), name)
        ctypes.set_errno(0)
        return 0 if fn(address, size) == 0 else ctypes.get_errno()

    return call


def _page_span(address: int, size: int) -> tuple[int, int]:
    """The page-aligned ``[lo, hi)`` covering ``[address, address + size)``."""
    lo = address - address % PAGE_BYTES
    end = address + size
    hi = end + (-end) % PAGE_BYTES
    return lo, hi


def probe_page_lock() -> tuple[bool, str]:
    """Try to lock and unlock one page of a fresh buffer.

    Returns:
        ``(works, detail)``: whether ``mlock`` works in this process, and why not when it does not.
    """
    buffer = mmap.mmap(-1, PAGE_BYTES)
    try:
        address = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
        code = _libc_call("mlock")(address, PAGE_BYTES)
        if code:
            return False, f"mlock refused with {errno.errorcode.get(code, code)}: {_refusal_hint(code)}"
        _libc_call("munlock")(address, PAGE_BYTES)
        return True, "mlock works"
    except OSError as exc:  # libc could not be loaded
        return False, f"libc mlock unavailable: {exc}"
    finally:
        buffer.close()


def _refusal_hint(code: int) -> str:
    if code == errno.EPERM:
        return "this process may not lock memory (no CAP_IPC_LOCK and RLIMIT_MEMLOCK is 0)"
    return "the range is over this process's RLIMIT_MEMLOCK (raise it with `ulimit -l`)"


class _PageLedger:
    """Every live locked page span ``(lo, hi)`` of the process, sorted (a span locked twice is held twice)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self._spans: list[tuple[int, int]] = []
        self._longest = 0  # the longest span ever held: how far back a span reaching ``lo`` can start

    def hold(self, lo: int, hi: int) -> None:
        """Record one more holder of ``[lo, hi)`` (call with :attr:`lock` held)."""
        bisect.insort(self._spans, (lo, hi))
        self._longest = max(self._longest, hi - lo)

    def drop(self, lo: int, hi: int) -> None:
        """Forget one holder of ``[lo, hi)`` (call with :attr:`lock` held)."""
        i = bisect.bisect_left(self._spans, (lo, hi))
        if i < len(self._spans) and self._spans[i] == (lo, hi):
            del self._spans[i]

    def uncovered(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """The pieces of ``[lo, hi)`` no held span touches, in order (call with :attr:`lock` held)."""
        first = bisect.bisect_left(self._spans, (lo - self._longest, -1))
        last = bisect.bisect_left(self._spans, (hi, -1))
        pieces, cursor = [], lo
        for other_lo, other_hi in self._spans[first:last]:  # sorted by start, all starting before hi
            if other_hi <= cursor:
                continue
            if other_lo > cursor:
                pieces.append((cursor, other_lo))
            cursor = max(cursor, other_hi)
            if cursor >= hi:
                break
        if cursor < hi:
            pieces.append((cursor, hi))
        return pieces


#: The process's one ledger: every :class:`PageLocker` (one per CPU backend) shares it.
_LEDGER = _PageLedger()


class PageLocker:
    """Locks and unlocks host byte ranges for one backend; pages another live range of the process (any
    backend's) still touches stay locked.

    ``mlock``/``munlock`` are attributes (``call(address, size) -> 0 or errno``) so tests can make the
    OS refuse.
    """

    def __init__(self) -> None:
        self.mlock: Callable[[int, int], int] = _libc_call("mlock")
        self.munlock: Callable[[int, int], int] = _libc_call("munlock")
        self._locked: dict[tuple[int, int], tuple[int, int]] = {}  # (address, size) -> page span
        self._refusal_logged = False

    def is_locked(self, address: int, size: int) -> bool:
        """Whether ``[address, address + size)`` was locked by :meth:`lock` and not yet unlocked."""
        with _LEDGER.lock:
            return (address, size) in self._locked

    def locked_ranges(self) -> tuple[tuple[int, int], ...]:
        """Every ``(address, size)`` this locker holds locked."""
        with _LEDGER.lock:
            return tuple(self._locked)

    def lock(self, address: int, size: int) -> bool:
        """Page-lock ``[address, address + size)``.

        Returns:
            True when locked; False when the OS refused (EPERM, ENOMEM, EAGAIN), logged once at INFO.

        Raises:
            DeviceRuntimeError: any other ``mlock`` failure (EINVAL: a bad range).
        """
        lo, hi = _page_span(address, size)
        with _LEDGER.lock:
            code = self.mlock(lo, hi - lo)
            if code == 0:
                self._locked[(address, size)] = (lo, hi)
                _LEDGER.hold(lo, hi)
                return True
            # A failed mlock may have locked part of the range; undo that, sparing pages others hold.
            for piece_lo, piece_hi in _LEDGER.uncovered(lo, hi):
                self.munlock(piece_lo, piece_hi - piece_lo)
        if code not in REFUSAL_ERRNOS:
            raise DeviceRuntimeError(
                "mlock", code, errno.errorcode.get(code, str(code)),
                f"locking {size} bytes at {address:#x} failed",
            )
        if not self._refusal_logged:
            self._refusal_logged = True
            log.info(
                "cpu device: pinned host memory is registered but not page-locked: mlock of %d bytes "
                "refused with %s; %s", size, errno.errorcode.get(code, code), _refusal_hint(code),
            )
        return False

    def unlock(self, address: int, size: int) -> None:
        """Unlock a range locked by :meth:`lock` (a range that was not locked is ignored).

        Pages another live locked range of the process touches stay locked. A failing ``munlock`` is
        logged: the range is forgotten either way, and the lock dies with the process.
        """
        code = 0
        with _LEDGER.lock:
            span = self._locked.pop((address, size), None)
            if span is None:
                return
            _LEDGER.drop(*span)
            for piece_lo, piece_hi in _LEDGER.uncovered(*span):
                code = self.munlock(piece_lo, piece_hi - piece_lo) or code
        if code:
            log.warning("cpu device: munlock of %d bytes at %#x failed with %s", size, address,
                        errno.errorcode.get(code, code))


def memlock_limit() -> str:
    """This process's soft ``RLIMIT_MEMLOCK``: ``"unlimited"`` or ``"<n> bytes"``."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return "unlimited" if soft == resource.RLIM_INFINITY else f"{soft} bytes"


def memmove_each(src: torch.Tensor, dst: torch.Tensor, sizes: torch.Tensor) -> None:
    """Copy descriptor by descriptor, in order, with ``ctypes.memmove`` (overlap-safe)."""
    for s, d, n in zip(src.tolist(), dst.tolist(), sizes.tolist(), strict=True):
        ctypes.memmove(d, s, n)
