"""How a step's writer and readers order themselves: IPC events plus the pool's step words, or
torch.distributed barriers.

Invariant: rank 0 never overwrites a slot before every peer finished reading the step it held, a
peer never reads a step before rank 0's copy of it completed, and every wait on another rank ends
within the timeout: with ``PeerLostError`` naming the rank when it is gone, else ``EventTimeoutError``.
"""

from __future__ import annotations

import datetime
import logging
import time
from typing import Any, Protocol

import torch

from hisparse_hal.errors import EventTimeoutError, HalError, InvalidArgumentError, PeerLostError

from .pool import ABORTED, ABORTED_BY, PUBLISHED, SharedPool

__all__ = ["StepSync", "EventStepSync", "BarrierStepSync", "synchronize_device", "lost_rank_error", "find_lost_rank"]

log = logging.getLogger(__name__)

#: How often a waiting rank checks that the rank it waits for is alive.
LIVENESS_PERIOD_S = 0.05


def synchronize_device(backend: Any) -> None:
    """Wait for the backend's queued device work: its ``synchronize()`` (every stream of a GPU; the swaps still in
    flight on the CPU device)."""
    backend.synchronize()


def lost_rank_error(pool: SharedPool, lost: int, doing: str, reported_by: int | None = None) -> PeerLostError:
    """The error of a rank that found ``lost`` gone (and marks the pool aborted for the others)."""
    if pool.word(ABORTED) == 0:
        pool.set_word(ABORTED_BY, pool.rank)
        pool.set_word(ABORTED, lost + 1)
    via = f" (reported by rank {reported_by})" if reported_by is not None and reported_by != pool.rank else ""
    return PeerLostError(
        f"rank {lost} (pid {pool.pid_of(lost)}) exited{via} while rank {pool.rank} was {doing}; the run cannot "
        "continue. Nothing of this rank stays pinned; why it died: its exit status in the run's result, and its "
        "own messages on the stderr every rank shares with the process that started the run",
        pid=pool.pid_of(lost), rank=lost,
    )


def find_lost_rank(pool: SharedPool, first: int | None = None) -> tuple[int, int | None] | None:
    """The rank to blame for a failed wait, and the rank that reported it (None: this rank found it), or None.

    A rank that exited is not necessarily the one that died: the first rank to find a loss marks the pool
    (``ABORTED``) and then exits with its error, releasing its own liveness lock. So the mark decides, and it is
    read again *after* a lost rank is seen, since that rank may have set it just before it exited.

    Args:
        pool: this rank's mapping of the pool.
        first: the rank to check first (the one being waited for).
    """
    aborted = pool.word(ABORTED)
    if aborted:
        return aborted - 1, pool.word(ABORTED_BY)
    order = ([first] if first is not None else []) + [r for r in range(pool.ranks) if r != first]
    lost = next((r for r in order if pool.is_lost(r)), None)
    if lost is None:
        return None
    aborted = pool.word(ABORTED)
    return (aborted - 1, pool.word(ABORTED_BY)) if aborted else (lost, None)


class StepSync(Protocol):
    """The four points of a step where ranks order themselves (writer: rank 0, readers: the others)."""

    path: str

    def before_write(self, step: int) -> None:
        """Rank 0, before overwriting the step's slot."""

    def after_write(self, step: int) -> None:
        """Rank 0, after enqueuing the step's spill."""

    def before_read(self, step: int) -> None:
        """A peer, before reading the step."""

    def after_read(self, step: int) -> None:
        """A peer, after enqueuing its reads of the step."""

    def finish(self) -> None:
        """Every rank, after its last step (all ranks meet), before anything is released."""

    def close(self) -> None:
        """Release events; safe after a failure."""


class _Waiting:
    """Bounded polling of a control word, watching the awaited rank's liveness."""

    def __init__(self, pool: SharedPool, timeout_s: float) -> None:
        self.pool = pool
        self.timeout_s = timeout_s

    def until(self, index: int, target: int, waiting_for: int, doing: str) -> None:
        pool = self.pool
        if pool.word(index) >= target:
            return
        start = time.monotonic()
        next_check = start + LIVENESS_PERIOD_S
        pause = 1e-5
        while pool.word(index) < target:
            now = time.monotonic()
            if now >= next_check:
                next_check = now + LIVENESS_PERIOD_S
                found = find_lost_rank(pool, waiting_for)
                if found is not None:
                    raise lost_rank_error(pool, found[0], doing, reported_by=found[1])
            if now - start >= self.timeout_s:
                raise EventTimeoutError(
                    f"rank {pool.rank} waited {self.timeout_s:g} s for rank {waiting_for} while {doing} "
                    f"(control word {index} is {pool.word(index)}, needs {target}); rank {waiting_for} is alive "
                    "but stalled. Raise the scenario timeout if its steps are legitimately this slow"
                )
            time.sleep(pause)
            pause = min(pause * 2, 2e-3)


#: Room for one exported handle in the exchange (CUDA's is 64 bytes, the CPU device's about 250).
HANDLE_ROOM = 4096


def _all_gather_bytes(payload: bytes, ranks: int) -> list[bytes]:
    """Every rank's ``payload``, through one fixed-size gloo all-gather (no pickling, no numpy)."""
    if len(payload) > HANDLE_ROOM - 4:
        raise InvalidArgumentError(
            f"an exported event handle of {len(payload)} bytes exceeds the {HANDLE_ROOM - 4}-byte exchange"
        )
    mine = torch.zeros(HANDLE_ROOM, dtype=torch.uint8)
    mine[:4] = torch.tensor([len(payload)], dtype=torch.int32).view(torch.uint8)
    mine[4:4 + len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    gathered = [torch.empty_like(mine) for _ in range(ranks)]
    torch.distributed.all_gather(gathered, mine)
    out = []
    for item in gathered:
        size = int(item[:4].view(torch.int32)[0])
        out.append(bytes(item[4:4 + size].tolist()))
    return out


class EventStepSync:
    """IPC events: rank 0 records one exported event per step, each peer one of its own.

    An IPC event carries no step number: a wait issued before the exporter's record of step k waits
    on an older record. So the step travels in the pool's control words (host order) and the event
    orders the device work (a GPU stream waits on it; on the host-synchronous CPU device it completes
    at the record).
    """

    path = "events"

    def __init__(self, backend: Any, pool: SharedPool, slots: int, timeout_s: float) -> None:
        self.backend = backend
        self.pool = pool
        self.rank = pool.rank
        self.slots = slots
        self._wait = _Waiting(pool, timeout_s)
        self.own = backend.create_ipc_event()
        self.own_handle = backend.export_event(self.own)
        handles = _all_gather_bytes(self.own_handle, pool.ranks)
        self.imported: dict[int, Any] = {}
        readers_of = range(1, pool.ranks) if self.rank == 0 else [0]
        for rank in readers_of:
            self.imported[rank] = backend.import_event(backend.device, handles[rank])

    def _wait_event(self, rank: int, doing: str) -> None:
        try:
            self.imported[rank].wait()
        except PeerLostError:
            lost, reported_by = find_lost_rank(self.pool, rank) or (rank, None)
            raise lost_rank_error(self.pool, lost, doing, reported_by=reported_by) from None

    def before_write(self, step: int) -> None:
        previous = step - self.slots  # the step whose slot this one reuses
        if previous < 0:
            return
        for rank in self.imported:
            doing = f"waiting for rank {rank} to finish reading step {previous} before overwriting its slot"
            self._wait.until(SharedPool.consumed_word(rank), previous, rank, doing)
            self._wait_event(rank, doing)

    def after_write(self, step: int) -> None:
        self.own.record()
        self.pool.set_word(PUBLISHED, step)

    def before_read(self, step: int) -> None:
        doing = f"waiting for rank 0 to publish step {step}"
        self._wait.until(PUBLISHED, step, 0, doing)
        self._wait_event(0, doing)

    def after_read(self, step: int) -> None:
        self.own.record()
        self.pool.set_word(SharedPool.consumed_word(self.rank), step)

    def finish(self) -> None:
        # Every importer is done with every event before any exporter closes its own.
        torch.distributed.barrier()

    def close(self) -> None:
        for event in [*self.imported.values(), self.own]:
            close = getattr(event, "close", None)
            if callable(close):
                close()
        self.imported.clear()

    def notice_lost(self) -> None:
        """After a failure: touch the lost ranks' events, so a backend that cleans up after a dead
        exporter does so now (the CPU device removes its file)."""
        for event in self.imported.values():
            try:
                event.query()
            except HalError:
                pass


class BarrierStepSync:
    """Event-free: one torch.distributed barrier per step, after rank 0's spill and the peers' reads of
    the step before. With at least two slots, that one barrier orders both directions: after barrier k,
    peers read slot k while rank 0 writes slot k + 1, whose last readers passed barrier k."""

    path = "barrier"

    def __init__(self, backend: Any, pool: SharedPool, timeout_s: float) -> None:
        self.backend = backend
        self.pool = pool
        self.timeout_s = timeout_s

    def _barrier(self, doing: str) -> None:
        try:
            torch.distributed.barrier()
        except RuntimeError as exc:  # gloo: a peer's connection closed, or the group's timeout
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline:  # the lost rank's lock is released as it dies
                found = find_lost_rank(self.pool)
                if found is not None:
                    raise lost_rank_error(self.pool, found[0], doing, reported_by=found[1]) from exc
                time.sleep(0.02)
            raise EventTimeoutError(
                f"rank {self.pool.rank}: torch.distributed barrier failed while {doing} and no rank has exited: "
                f"{exc}"
            ) from exc

    def before_write(self, step: int) -> None:
        return None

    def after_write(self, step: int) -> None:
        synchronize_device(self.backend)
        self.pool.set_word(PUBLISHED, step)
        self._barrier(f"publishing step {step}")

    def before_read(self, step: int) -> None:
        self._barrier(f"waiting for rank 0 to publish step {step}")

    def after_read(self, step: int) -> None:
        synchronize_device(self.backend)

    def finish(self) -> None:
        self._barrier("finishing")

    def close(self) -> None:
        return None

    def notice_lost(self) -> None:
        return None


def barrier_timeout(timeout_s: float) -> datetime.timedelta:
    """The torch.distributed group timeout for a scenario whose waits are bounded by ``timeout_s``."""
    return datetime.timedelta(seconds=timeout_s)
