"""``hisparse-hal scenario``: the checks a run passes before any rank starts (rank count, memory, output path);
the values themselves are checked by :class:`~hisparse_hal.scenario.config.ScenarioConfig`.
"""

from __future__ import annotations

import argparse

from hisparse_hal.errors import InvalidArgumentError
from hisparse_hal.memory_budget import check_fits
from hisparse_hal.output_checks import writable_file

from .config import ConfigFieldError, FaultPlan, ScenarioConfig
from .pool import CONTROL_BYTES, MAX_RANKS

__all__ = ["validate", "RANK_BYTES", "bytes_needed", "config_from_options", "OPTION_OF_FIELD"]

#: The ``scenario`` option that sets each :class:`ScenarioConfig` field, for the command's errors.
OPTION_OF_FIELD = {"ranks": "--ranks", "steps": "--steps", "sync": "--sync", "timeout_s": "--timeout",
                   "host_chunk_bytes": "--host-chunk-bytes", "kill": "--kill"}

#: Resident memory of one rank: an interpreter with torch and the backend imported (about 160 MB measured on
#: CPU, 64 ranks used about 10 GB), rounded up.
RANK_BYTES = 200 << 20


def bytes_needed(config: ScenarioConfig) -> int:
    """Memory estimate of a run: every rank's process, its device cache, and the shared pool."""
    pool = CONTROL_BYTES + config.pool_blocks * config.block_bytes
    per_rank = RANK_BYTES + 2 * config.pool_blocks * config.block_bytes
    return pool + config.ranks * per_rank


def validate(config: ScenarioConfig, json_path: str | None = None) -> None:
    """Check what ``config`` alone does not: the rank count against the pool's control page, the memory
    estimate against what is available, and the ``--json`` path.

    Raises:
        InvalidArgumentError: the first problem, named with its value.
    """
    if config.ranks > MAX_RANKS:
        raise InvalidArgumentError(f"--ranks must be at most {MAX_RANKS} (the shared pool's control page holds "
                                   f"that many ranks), got {config.ranks}")
    check_fits(bytes_needed(config), f"scenario --ranks {config.ranks} (about {RANK_BYTES >> 20} MiB per rank)")
    if json_path:
        writable_file(json_path, "--json")


def config_from_options(args: argparse.Namespace) -> ScenarioConfig:
    """The run's :class:`ScenarioConfig` from the ``scenario`` options.

    Raises:
        InvalidArgumentError: a bad value, named by its option (``--timeout``, ``--kill 5:10``), not its field.
    """
    kill = FaultPlan(*args.kill) if args.kill else None
    try:
        return ScenarioConfig(ranks=args.ranks, steps=args.steps, backend=args.backend, sync=args.sync,
                              timeout_s=args.timeout, host_chunk_bytes=args.host_chunk_bytes, kill=kill)
    except ConfigFieldError as exc:
        option = OPTION_OF_FIELD.get(exc.field, exc.field)
        if kill is not None and exc.field == "kill":
            option = f"--kill {kill.rank}:{kill.step}"
        raise InvalidArgumentError(f"{option} {exc.problem}") from None
