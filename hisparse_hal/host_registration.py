"""Registering (pinning) host memory in bounded chunks, with rollback.

One registration call of 512 GiB or more fails on NVIDIA r580+ drivers (vLLM #51080/#51081), so every
backend registers a host pool in chunks of at most 256 GiB whose ends fall on page and block
boundaries. If any chunk fails, the chunks already registered are released in reverse order and the
error propagates: a failed pin leaves nothing registered.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import mmap
import os
from collections.abc import Callable, Mapping, Sequence

from .errors import InvalidArgumentError
from .settings import positive_setting

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "HostChunk",
    "HostRegistration",
    "plan_host_chunks",
    "register_in_chunks",
    "default_chunk_bytes",
    "unwritable_part",
]

log = logging.getLogger(__name__)

#: 256 GiB: half the size at which one cudaHostRegister call failed on r580 drivers (vLLM #51080).
DEFAULT_CHUNK_BYTES = 256 << 30
PAGE_BYTES = mmap.PAGESIZE
CHUNK_ENV = "HISPARSE_HAL_PIN_CHUNK_BYTES"


def default_chunk_bytes(environ: Mapping[str, str] | None = None) -> int:
    """The chunk cap: ``HISPARSE_HAL_PIN_CHUNK_BYTES`` if set (decimal or ``0x`` hex), else 256 GiB.

    Raises:
        InvalidArgumentError: the variable is not a positive integer.
    """
    value = positive_setting(CHUNK_ENV, DEFAULT_CHUNK_BYTES, lambda text: int(text, 0), "a positive byte count",
                             environ, default_text=f"{DEFAULT_CHUNK_BYTES >> 30} GiB")
    assert value is not None
    return value


@dataclasses.dataclass(frozen=True)
class HostChunk:
    """One registered piece of a host range: ``[address, address + size)`` and its device alias."""

    address: int
    size: int
    device_alias: int | None = None


@dataclasses.dataclass(frozen=True)
class HostRegistration:
    """The record of one pinned tensor.

    Attributes:
        address: first byte of the tensor's data.
        size: bytes registered.
        chunks: the registration calls made, in order.
        page_locked: whether the memory is really page-locked (the CPU device may only record it).
        device_alias: device address of ``address`` when the backend has ``host_pointer_alias``
            (chunk aliases are in ``chunks``), else None.
    """

    address: int
    size: int
    chunks: tuple[HostChunk, ...]
    page_locked: bool
    device_alias: int | None = None


def plan_host_chunks(
    address: int, size: int, block_bytes: int, max_chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> list[tuple[int, int]]:
    """Split ``[address, address + size)`` into ``(address, size)`` chunks of at most
    ``max_chunk_bytes`` whose inner boundaries are multiples of both the page size and
    ``block_bytes`` from ``address``, so no block straddles two registrations.

    Raises:
        InvalidArgumentError: non-positive sizes, or a page-and-block period larger than the cap.
    """
    if size <= 0:
        raise InvalidArgumentError(f"cannot register {size} bytes at {address:#x}: size must be > 0")
    if block_bytes <= 0:
        raise InvalidArgumentError(f"block size must be > 0 bytes, got {block_bytes}")
    if max_chunk_bytes <= 0:
        raise InvalidArgumentError(f"chunk cap must be > 0 bytes, got {max_chunk_bytes}")
    if size <= max_chunk_bytes:
        return [(address, size)]
    period = math.lcm(PAGE_BYTES, block_bytes)
    if period > max_chunk_bytes:
        raise InvalidArgumentError(
            f"cannot chunk a {size}-byte registration: one page-and-block period is {period} bytes "
            f"(page {PAGE_BYTES}, block {block_bytes}), over the {max_chunk_bytes}-byte chunk cap; "
            f"raise {CHUNK_ENV}"
        )
    step = (max_chunk_bytes // period) * period
    return [(address + off, min(step, size - off)) for off in range(0, size, step)]


def register_in_chunks(
    chunks: Sequence[tuple[int, int]],
    register: Callable[[int, int, int], int | None],
    unregister: Callable[[int, int], None],
) -> tuple[HostChunk, ...]:
    """Register each chunk in order; on any failure release the registered ones in reverse.

    Args:
        chunks: ``(address, size)`` pairs from :func:`plan_host_chunks`.
        register: ``register(address, size, chunk_index)`` registers one chunk and returns its device
            alias (or None).
        unregister: ``unregister(address, size)`` releases one chunk.

    Returns:
        The registered chunks with their aliases.

    Raises:
        Whatever ``register`` raised, after the rollback. A failure during rollback is logged and
        does not hide the original error.
    """
    done: list[HostChunk] = []
    try:
        for index, (address, size) in enumerate(chunks):
            alias = register(address, size, index)
            done.append(HostChunk(address, size, alias))
    except BaseException:
        for chunk in reversed(done):
            try:
                unregister(chunk.address, chunk.size)
            except Exception:  # noqa: BLE001 - keep rolling back, keep the first error
                log.exception("rollback: releasing host chunk %#x (+%d) failed", chunk.address, chunk.size)
        raise
    return tuple(done)


#: Where Linux lists this process's mappings and their permissions.
MAPS_PATH = "/proc/self/maps"


def unwritable_part(address: int, size: int, maps_path: str = MAPS_PATH) -> str | None:
    """Why some byte of ``[address, address + size)`` is not writable memory of this process, or None.

    Reads the mapping permissions from ``/proc/self/maps`` (one pass over a few hundred lines; call it at
    registration, never per swap). Where the file does not exist (not Linux) nothing can be said: None.
    What the OS cannot tell is not detected either: memory of an immutable Python object (``bytes``
    viewed through ``torch.frombuffer``) lies in a writable heap mapping, and torch keeps no read-only flag.

    Returns:
        ``"[lo, hi) is not mapped"`` or ``"[lo, hi) is mapped r--p (path)"`` for the first bad piece.
    """
    if not os.path.exists(maps_path):
        return None
    cursor, end = address, address + size
    with open(maps_path) as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            low_text, _, high_text = fields[0].partition("-")
            low, high = int(low_text, 16), int(high_text, 16)
            if high <= cursor:
                continue
            if low > cursor:
                return f"[{cursor:#x}, {min(low, end):#x}) is not mapped"
            if "w" not in fields[1]:
                where = fields[5].strip() if len(fields) > 5 else "anonymous"
                return f"[{cursor:#x}, {min(high, end):#x}) is mapped {fields[1]} ({where or 'anonymous'})"
            cursor = high
            if cursor >= end:
                return None
    return f"[{cursor:#x}, {end:#x}) is not mapped"
