"""``run_scenario``: start the ranks of a tensor-parallel offload run as processes, watch them, and
collect one ``ScenarioResult``.

Invariant: the driver never hangs on a rank. The ranks that have sent nothing are killed and reported once
rank 0 has published no new step for the stall bound (:func:`stall_bound_s`: the wait bound plus
``STALL_GRACE_S``), and before the first step not earlier than ``STARTUP_GRACE_S`` after the start; the pool's
file is removed however the run ends. Ranks start with SIGINT blocked and die with the driver (SIGKILL included):
an interrupt is the driver's to handle, and it ends the ranks (SIGTERM, then SIGKILL) before it returns.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import mmap
import multiprocessing.resource_tracker
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.multiprocessing

from hisparse_hal.settings import event_timeout_s

from .config import ScenarioConfig
from .pool import CONTROL_BYTES, PUBLISHED, SharedPool
from .rank import rank_main

__all__ = ["RankOutcome", "ScenarioResult", "run_scenario"]

log = logging.getLogger(__name__)

#: Time for the ranks to start (interpreters, torch, backend, rendezvous): until rank 0 publishes its first step,
#: the ranks are not killed for a stall before this long after the start, whatever the stall bound.
STARTUP_GRACE_S = 120.0
#: Seconds beyond the wait bound a rank has to report its own timeout before the driver kills it.
STALL_GRACE_S = 30.0


def stall_bound_s(timeout_s: float | None) -> float:
    """Seconds without a newly published step after which the driver kills the ranks that sent nothing:
    the wait bound (``timeout_s``, else ``HISPARSE_HAL_EVENT_TIMEOUT_S``) plus ``STALL_GRACE_S``."""
    return (timeout_s or event_timeout_s()) + STALL_GRACE_S


@dataclasses.dataclass(frozen=True)
class RankOutcome:
    """What one rank reported (or what the driver saw, for a rank that sent nothing).

    ``error_type``/``error`` are None on success; ``lost_rank`` names the rank an error blames.
    """

    rank: int
    pid: int | None
    exitcode: int | None
    steps_done: int
    bytes_moved: int
    step_p50_s: float
    step_p99_s: float
    mismatches: int
    mismatch_examples: tuple[str, ...]
    preflight: dict[str, str]
    registrations_left: int | None
    sync: str | None
    sync_reason: str | None
    loop_s: float | None
    error_type: str | None
    error: str | None
    lost_rank: int | None
    pool_chunks: int | None
    backend: str | None

    @property
    def ok(self) -> bool:
        """Finished every step with no error, no mismatch, no accepted bad input and nothing pinned."""
        return (self.error_type is None and self.mismatches == 0 and self.registrations_left == 0
                and not any(v.startswith("ACCEPTED") for v in self.preflight.values()))


@dataclasses.dataclass(frozen=True)
class ScenarioResult:
    """The outcome of :func:`run_scenario`."""

    config: ScenarioConfig
    ranks: tuple[RankOutcome, ...]
    wall_s: float
    pool_path: str

    @property
    def ok(self) -> bool:
        """Every rank finished every step cleanly."""
        return all(r.ok and r.steps_done == self.config.steps for r in self.ranks)

    @property
    def sync(self) -> str | None:
        """The synchronization path the ranks ran (``"events"`` or ``"barrier"``)."""
        return next((r.sync for r in self.ranks if r.sync), None)

    @property
    def backend(self) -> str | None:
        """The backend the ranks built."""
        return next((r.backend for r in self.ranks if r.backend), None)

    @property
    def sync_reason(self) -> str | None:
        """Why that path was chosen."""
        return next((r.sync_reason for r in self.ranks if r.sync_reason), None)

    @property
    def steps_per_s(self) -> float:
        """Steps per second of rank 0's step loop, also when it stopped early (0 when it never ran)."""
        loop = self.ranks[0].loop_s
        return self.ranks[0].steps_done / loop if loop else 0.0

    @property
    def bytes_moved(self) -> int:
        """Bytes copied by every rank's swaps and gathers."""
        return sum(r.bytes_moved for r in self.ranks)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary of the whole result."""
        config = dataclasses.asdict(self.config)
        config["backend_factory"] = repr(self.config.backend_factory) if self.config.backend_factory else None
        return {"ok": self.ok, "backend": self.backend, "pool_path": self.pool_path, "sync": self.sync,
                "sync_reason": self.sync_reason, "wall_s": self.wall_s,
                "steps_per_s": self.steps_per_s, "bytes_moved": self.bytes_moved, "config": config,
                "ranks": [dataclasses.asdict(r) | {"ok": r.ok} for r in self.ranks]}


@contextlib.contextmanager
def _rank_start_uninterrupted() -> Iterator[None]:
    """Start a rank whole: hold SIGINT and SIGTERM until ``Process.start()`` has handed the rank its start-up data,
    then deliver them. An interrupt in the middle would close the pipe the spawned rank is reading, which then
    dies printing ``EOFError: Ran out of input``. Blocking the signal in this thread alone is not enough: the
    kernel hands a process-directed signal to any thread that does not block it, and Python runs its handler in
    the main thread all the same; so, in the main thread, the handlers are swapped for ones that only note the
    signal. SIGINT also stays blocked in this thread, so the rank inherits it blocked: a terminal's Ctrl-C, sent
    to the whole foreground group, reaches only the driver, which stops the ranks.

    The resource tracker is started first: ``Process.start()`` starts it on first use, and
    ``ResourceTracker.ensure_running`` blocks SIGINT and SIGTERM around spawning it and then *unblocks* them
    (CPython ``Lib/multiprocessing/resource_tracker.py``, bpo-33613), which would leave the rank started right after
    it with SIGINT deliverable while its interpreter imports ``site`` ("Fatal Python error: init_import_site")."""
    multiprocessing.resource_tracker.ensure_running()
    noted: list[int] = []
    with contextlib.ExitStack() as restore:  # every restore runs, even when a restored handler raises meanwhile
        restore.callback(_deliver_first, noted)
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        restore.callback(signal.pthread_sigmask, signal.SIG_SETMASK, blocked)  # a pending SIGINT: delivered then
        if threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGINT, signal.SIGTERM):
                restore.callback(signal.signal, signum,
                                 signal.signal(signum, lambda received, _frame: noted.append(received)))
        yield


def _deliver_first(noted: list[int]) -> None:
    """Raise the first signal noted while a rank started, now through the driver's own handler."""
    if noted:
        signal.raise_signal(noted[0])


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _outcome(rank: int, process: Any, sent: dict[str, Any] | None) -> RankOutcome:
    sent = dict(sent or {})
    if not sent:
        code = process.exitcode
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
        sent = {"error_type": "RankExited", "error": f"rank {rank} ended without an outcome ({how})"}
    fields = {f.name for f in dataclasses.fields(RankOutcome)}
    defaults: dict[str, Any] = {"pid": process.pid, "steps_done": 0, "bytes_moved": 0,
                                "step_p50_s": 0.0, "step_p99_s": 0.0,
                                "mismatches": 0, "mismatch_examples": (), "preflight": {}, "registrations_left": None,
                                "sync": None, "sync_reason": None, "loop_s": None, "error_type": None, "error": None,
                                "lost_rank": None, "pool_chunks": None, "backend": None}
    values = {**defaults, **{k: v for k, v in sent.items() if k in fields}}
    values["mismatch_examples"] = tuple(values["mismatch_examples"])
    return RankOutcome(rank=rank, exitcode=process.exitcode, **{k: v for k, v in values.items() if k != "rank"})


def run_scenario(config: ScenarioConfig, on_progress: Callable[[int], None] | None = None) -> ScenarioResult:
    """Run ``config.ranks`` spawned ranks over one shared host pool for ``config.steps`` steps.

    Args:
        config: the run.
        on_progress: called with the number of steps rank 0 has published, as it grows.

    Returns:
        Every rank's outcome; ``result.ok`` says whether the run was clean. A rank's failure is an
        outcome, not an exception.

    Raises:
        InvalidArgumentError: a bad ``HISPARSE_HAL_EVENT_TIMEOUT_S`` or too many ranks.
    """
    stall_s = stall_bound_s(config.timeout_s)
    processes: list[Any] = []
    conns: list[Any] = []
    received: dict[int, dict[str, Any] | None] = {}
    started = time.monotonic()
    pool_path = SharedPool.create(config.ranks, config.pool_blocks, config.block_bytes)
    interrupted = False
    try:
        control = _map_control(pool_path)  # unmapped when the last view is gone (a traceback's frame included)
        _start_ranks(config, pool_path, processes, conns)
        _collect_outcomes(config, conns, processes, control, received, on_progress, stall_s)
    except BaseException:
        interrupted = True  # an interrupt (KeyboardInterrupt) or an error of the driver's own: stop the ranks now
        raise
    finally:
        # First, so that a second interrupt while the ranks are being stopped cannot leave the file behind.
        if SharedPool.unlink(pool_path):
            log.info("removed the shared pool %s (no rank got far enough to remove it)", pool_path)
        _stop_ranks(processes, conns, interrupted)
    wall = time.monotonic() - started
    outcomes = tuple(_outcome(rank, processes[rank], received.get(rank)) for rank in range(config.ranks))
    return ScenarioResult(config, outcomes, wall, pool_path)


def _map_control(pool_path: str) -> torch.Tensor:
    """The pool's control words (rank 0's published step), mapped for reading.

    The tensor holds the only reference to the mapping: it is unmapped when the tensor (and every view of it)
    is gone, so nothing reads it after an unmap, however the run ends.
    """
    fd = os.open(pool_path, os.O_RDWR)
    try:
        mapping = mmap.mmap(fd, CONTROL_BYTES)  # read only here; writable so torch maps it without a warning
    finally:
        os.close(fd)
    return torch.frombuffer(mapping, dtype=torch.int64)


def _start_ranks(config: ScenarioConfig, pool_path: str, processes: list[Any], conns: list[Any]) -> None:
    """Spawn the ranks, appending each process and its pipe as it starts (so an interrupt midway stops those)."""
    context = torch.multiprocessing.get_context("spawn")
    port = _free_port()
    for rank in range(config.ranks):
        parent_end, child_end = context.Pipe(duplex=False)
        process = context.Process(target=rank_main, args=(rank, config, pool_path, port, child_end, os.getpid()),
                                  name=f"hisparse-scenario-rank{rank}", daemon=True)
        with _rank_start_uninterrupted():
            process.start()  # the rank inherits the mask: a Ctrl-C reaches the driver, which stops the ranks
            child_end.close()
            processes.append(process)  # before a held interrupt is delivered, so the driver stops this rank too
            conns.append(parent_end)


def _collect_outcomes(config: ScenarioConfig, conns: list[Any], processes: list[Any], control: torch.Tensor,
                      received: dict[int, dict[str, Any] | None], on_progress: Callable[[int], None] | None,
                      stall_s: float) -> None:
    """Wait for every rank's outcome into ``received``, reporting progress; kill the ranks that sent nothing once
    no step was published for ``stall_s`` (before the first step: for ``max(STARTUP_GRACE_S, stall_s)``)."""
    published, last_change = -1, time.monotonic()
    while len(received) < config.ranks:
        for rank, conn in enumerate(conns):
            if rank in received:
                continue
            try:
                if conn.poll(0.05 / config.ranks):
                    received[rank] = conn.recv()
            except (EOFError, OSError):
                received[rank] = None  # its end closed without an outcome (killed)
        now_published = int(control[PUBLISHED])
        now = time.monotonic()
        if now_published != published:
            published, last_change = now_published, now
            if on_progress is not None:
                on_progress(published + 1)
        if now - last_change > (stall_s if published >= 0 else max(STARTUP_GRACE_S, stall_s)):
            for rank, process in enumerate(processes):
                if rank not in received:
                    log.error("rank %d made no progress for %.0f s; killing it", rank, now - last_change)
                    process.kill()
            last_change = now


def _stop_ranks(processes: list[Any], conns: list[Any], interrupted: bool) -> None:
    """Join the ranks (after SIGTERM when interrupted: their pins and locks end with them), killing stragglers."""
    if interrupted:
        for process in processes:
            if process.is_alive() and process.pid is not None:
                with contextlib.suppress(OSError):
                    os.kill(process.pid, signal.SIGTERM)
    for process in processes:
        process.join(3 if interrupted else 10)
        if process.is_alive():
            process.kill()
            process.join(10)
    for conn in conns:
        conn.close()
