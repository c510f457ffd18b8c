"""What a scenario run is asked to do (``ScenarioConfig``) and how its ranks synchronize (``choose_sync``).

Invariant: the synchronization path is decided from the backend's capabilities and the run's length,
never from a vendor name, and the decision always carries its reason.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

from hisparse_hal.capabilities import Capabilities
from hisparse_hal.errors import InvalidArgumentError, UnsupportedCapabilityError
from hisparse_hal.events import check_timeout_s

__all__ = ["FaultPlan", "ScenarioConfig", "ConfigFieldError", "SyncChoice", "choose_sync", "ROW_BYTES"]

#: Bytes of one KV row: the 656-byte ``fp8_ds_mla`` row (512 B NoPE + 16 B scales + 128 B RoPE).
ROW_BYTES = 656

SyncPath = Literal["events", "barrier"]


class ConfigFieldError(InvalidArgumentError):
    """A bad :class:`ScenarioConfig` field. ``field`` and ``problem`` let a command name its own option
    (``--timeout`` for ``timeout_s``) instead of the field; the message names the field."""

    def __init__(self, field: str, problem: str, subject: str | None = None) -> None:
        super().__init__(f"{subject or f'scenario {field}'} {problem}")
        self.field = field
        self.problem = problem


@dataclasses.dataclass(frozen=True)
class FaultPlan:
    """Kill ``rank`` with SIGKILL when it reaches ``step`` (before that step's work)."""

    rank: int
    step: int


@dataclasses.dataclass(frozen=True)
class ScenarioConfig:
    """One tensor-parallel offload run on one machine.

    Attributes:
        ranks: processes; rank 0 writes the shared pool, the others read it.
        steps: engine steps.
        backend: registry name of the backend each rank builds (None: what ``get_backend()`` selects).
        backend_factory: a picklable zero-argument callable returning the backend; overrides ``backend``.
        sync: ``"auto"`` (by capability), or force ``"events"`` or ``"barrier"``.
        blocks_per_step: KV blocks rank 0 spills per step.
        block_size: rows per block.
        rows_per_block: rows each peer gathers from every block of a step (sparse selection).
        slots: steps the pool holds at once (rank 0 may run ``slots - 1`` steps ahead of the slowest peer).
        timeout_s: bound of every wait on another rank (default ``HISPARSE_HAL_EVENT_TIMEOUT_S``).
        host_chunk_bytes: largest single host registration (None: the backend's default); a small
            value makes the pool span several registrations.
        kill: a fault to inject (None: none).
        preflight: each rank first checks the refusals the scenario relies on.
        threads_per_rank: torch intra-op threads per rank (None: torch's default). The ranks share
            the machine's cores; one thread each keeps N ranks from oversubscribing them.
    """

    ranks: int = 2
    steps: int = 1000
    backend: str | None = None
    backend_factory: Callable[[], Any] | None = None
    sync: Literal["auto", "events", "barrier"] = "auto"
    blocks_per_step: int = 16
    block_size: int = 16
    rows_per_block: int = 4
    slots: int = 2
    timeout_s: float | None = None
    host_chunk_bytes: int | None = None
    kill: FaultPlan | None = None
    preflight: bool = True
    threads_per_rank: int | None = 1

    def __post_init__(self) -> None:
        for name, least in (("ranks", 2), ("steps", 1), ("blocks_per_step", 1), ("block_size", 1),
                            ("rows_per_block", 1), ("slots", 2)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ConfigFieldError(name, f"must be an int >= {least}, got {value!r}")
        if self.steps >= 2**31:
            raise ConfigFieldError("steps", f"must be below 2**31 (rows carry the step as int32), got {self.steps}")
        if self.rows_per_block > self.block_size:
            raise InvalidArgumentError(
                f"rows_per_block ({self.rows_per_block}) cannot exceed block_size ({self.block_size})"
            )
        threads = self.threads_per_rank
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise InvalidArgumentError(f"threads_per_rank must be None or an int >= 1, got {self.threads_per_rank!r}")
        if self.sync not in ("auto", "events", "barrier"):
            raise InvalidArgumentError(f"scenario sync must be 'auto', 'events' or 'barrier', got {self.sync!r}")
        if self.timeout_s is not None:
            try:
                seconds = check_timeout_s(self.timeout_s, "scenario timeout_s")
            except InvalidArgumentError as exc:
                problem = str(exc).removeprefix("scenario timeout_s ")
                raise ConfigFieldError("timeout_s", problem) from None
            if seconds >= 1e6:
                raise ConfigFieldError("timeout_s", f"must be under 1e6 seconds, got {self.timeout_s!r}")
        chunk = self.host_chunk_bytes
        if chunk is not None and (not isinstance(chunk, int) or chunk < 1):
            raise ConfigFieldError("host_chunk_bytes", f"must be a positive int, got {self.host_chunk_bytes!r}",
                                   subject="host_chunk_bytes")
        if self.kill is not None and not (0 <= self.kill.rank < self.ranks and 0 <= self.kill.step < self.steps):
            raise ConfigFieldError(
                "kill", f"names a rank outside [0, {self.ranks}) or a step outside [0, {self.steps})",
                subject=f"fault {self.kill}",
            )

    @property
    def block_bytes(self) -> int:
        """Bytes of one KV block."""
        return self.block_size * ROW_BYTES

    @property
    def pool_blocks(self) -> int:
        """Blocks in the shared pool: ``slots`` steps of ``blocks_per_step``."""
        return self.slots * self.blocks_per_step


@dataclasses.dataclass(frozen=True)
class SyncChoice:
    """The synchronization path of a run and why it was chosen."""

    path: SyncPath
    reason: str


def choose_sync(capabilities: Capabilities, steps: int, requested: str = "auto") -> SyncChoice:
    """Pick how peers learn that rank 0's writes landed and rank 0 that the peers finished reading.

    IPC events when the backend has them and one event survives ``steps`` record/wait cycles
    (``ipc_event_max_cycles``: ROCm 7.2.x emulates them with a 32-slot ring, vLLM #57602); otherwise
    torch.distributed barriers, which need no event.

    Raises:
        UnsupportedCapabilityError: ``requested == "events"`` on a backend whose events cannot carry the run.
    """
    limit = capabilities.ipc_event_max_cycles
    if not capabilities.ipc_events:
        why_not = "the backend has no IPC events (ipc_events=False)"
    elif limit is not None and steps > limit:
        why_not = f"the run needs {steps} record/wait cycles per event, over the backend's ipc_event_max_cycles={limit}"
    else:
        why_not = None
    if requested == "barrier":
        return SyncChoice("barrier", "barrier synchronization was requested")
    if why_not is None:
        cycles = "no cycle limit" if limit is None else f"limit {limit} cycles"
        return SyncChoice("events", f"IPC events: ipc_events=True, {cycles}, {steps} steps")
    if requested == "events":
        raise UnsupportedCapabilityError(
            f"IPC event synchronization was requested, but {why_not}; use sync='auto' or 'barrier'"
        )
    return SyncChoice("barrier", f"torch.distributed (gloo) barriers: {why_not}")
