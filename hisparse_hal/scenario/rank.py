"""One rank of a scenario run, as a spawned process: build the backend, map and pin the shared pool,
run the steps (rank 0 writes, the others read and verify), tear down, and send back one outcome.

Invariant: a rank always tries to send an outcome (an error included) and always unpins what it pinned;
only a SIGKILL (the injected fault) ends it without one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist

from hisparse_hal.errors import HalError, InvalidDescriptorError
from hisparse_hal.kv_cache import KVCacheConfig, LayerSpec
from hisparse_hal.python_child import die_with_parent
from hisparse_hal.settings import EVENT_TIMEOUT_ENV

from .blocks import find_mismatches, plan_step, step_rows
from .config import ROW_BYTES, ScenarioConfig, choose_sync
from .pool import SharedPool
from .sync import BarrierStepSync, EventStepSync, barrier_timeout

__all__ = ["rank_main"]

log = logging.getLogger(__name__)


def _build_backend(config: ScenarioConfig) -> Any:
    if config.backend_factory is not None:
        backend = config.backend_factory()
    else:
        from hisparse_hal.registry import get_backend

        backend = get_backend(config.backend)
    if config.host_chunk_bytes is not None:
        backend.host_chunk_bytes = config.host_chunk_bytes
    return backend


def _device_cache(backend: Any, config: ScenarioConfig, blocks: int, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A device KV cache of ``blocks`` blocks, prepared as a swap region: (raw uint8 view, typed view)."""
    formats = backend.capabilities.kv_formats
    kv_format, width = ("fp8_ds_mla", ROW_BYTES) if "fp8_ds_mla" in formats else ("bf16", ROW_BYTES // 2)
    kv_config = KVCacheConfig(kv_format, num_blocks=blocks, block_size=config.block_size, row_width=width,
                              layers=(LayerSpec(name),))
    storage = torch.zeros(kv_config.layer_bytes, dtype=torch.uint8, device=backend.device)
    caches: dict[str, Any] = {name: storage}
    backend.prepare_kv_cache_views(kv_config, caches, forward_context={})
    return storage.view(blocks, config.block_size, ROW_BYTES), caches[name]


def _preflight(backend: Any, pool: SharedPool, sync: Any, config: ScenarioConfig) -> dict[str, str]:
    """Check the refusals the scenario relies on; each entry is ``"refused: ..."``, ``"skipped: ..."``
    or ``"ACCEPTED: ..."`` (a failure)."""
    found: dict[str, str] = {}
    chunks = backend.host_registration(pool.data).chunks
    if len(chunks) < 2:
        found["spanning_descriptor"] = f"skipped: the pool is one registration of {chunks[0].size} bytes"
    else:
        boundary = chunks[1].address
        src = torch.tensor([boundary - config.block_bytes])
        dst = torch.tensor([pool.data.data_ptr()])  # any valid destination; the source is the bad one
        try:
            backend.swap_blocks_batch(src, dst, torch.tensor([2 * config.block_bytes]))
        except InvalidDescriptorError as exc:
            found["spanning_descriptor"] = f"refused: {exc}"
        else:
            found["spanning_descriptor"] = "ACCEPTED: a descriptor spanning two registrations was copied"
    if isinstance(sync, EventStepSync):
        try:
            backend.import_event(backend.device, sync.own_handle)
        except HalError as exc:
            found["self_import"] = f"refused: {type(exc).__name__}: {exc}"
        else:
            found["self_import"] = "ACCEPTED: this process imported its own exported event"
    return found


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def rank_main(rank: int, config: ScenarioConfig, pool_path: str, port: int, conn: Any, driver_pid: int) -> None:
    """Entry point of rank ``rank`` (spawned by the driver ``driver_pid``, with which it dies); sends one outcome
    dictionary through ``conn``."""
    die_with_parent(driver_pid)  # a SIGKILLed driver leaves no rank stepping on its own
    outcome: dict[str, Any] = {"rank": rank, "pid": os.getpid(), "steps_done": 0, "bytes_moved": 0,
                               "mismatches": 0, "mismatch_examples": [], "preflight": {}, "step_times": []}
    try:
        _run_rank(rank, config, pool_path, port, outcome)
    except BaseException as exc:  # noqa: BLE001 - reported to the driver, which judges it
        outcome.update(error_type=type(exc).__name__, error=str(exc), traceback=traceback.format_exc(),
                       lost_rank=getattr(exc, "rank", None))
    times = sorted(outcome.pop("step_times"))
    outcome.update(step_p50_s=_percentile(times, 0.50), step_p99_s=_percentile(times, 0.99))
    with contextlib.suppress(Exception):
        conn.send(outcome)
    conn.close()


def _run_rank(rank: int, config: ScenarioConfig, pool_path: str, port: int, outcome: dict[str, Any]) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # the ranks share one machine
    if config.threads_per_rank is not None:
        torch.set_num_threads(config.threads_per_rank)
    if config.timeout_s is not None:
        os.environ[EVENT_TIMEOUT_ENV] = str(config.timeout_s)
    from hisparse_hal.settings import event_timeout_s

    timeout_s = event_timeout_s()
    backend = _build_backend(config)
    pool = SharedPool(pool_path, rank, config.ranks, config.pool_blocks, config.block_bytes)
    sync: Any = None
    pinned = False
    ok = False
    loop_start: float | None = None
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=config.ranks, timeout=barrier_timeout(timeout_s))
        dist.barrier()  # every rank has mapped the pool: its name can go
        if rank == 0 and SharedPool.unlink(pool_path):
            log.debug("unlinked the shared pool %s; the ranks keep their mappings", pool_path)
        choice = choose_sync(backend.capabilities, config.steps, config.sync)
        outcome.update(sync=choice.path, sync_reason=choice.reason, backend=backend.name)
        if rank == 0:
            log.info("scenario sync path: %s (%s)", choice.path, choice.reason)
        backend.pin_tensor(pool.data)
        pinned = True
        outcome["pool_chunks"] = len(backend.host_registration(pool.data).chunks)
        sync = (EventStepSync(backend, pool, config.slots, timeout_s) if choice.path == "events"
                else BarrierStepSync(backend, pool, timeout_s))
        if config.preflight:
            outcome["preflight"] = _preflight(backend, pool, sync, config)
        loop_start = time.perf_counter()
        if rank == 0:
            _write_steps(backend, pool, sync, config, outcome)
        else:
            _read_steps(backend, pool, sync, config, outcome)
        outcome["loop_s"] = time.perf_counter() - loop_start
        sync.finish()
        ok = True
    except BaseException:
        if sync is not None:
            sync.notice_lost()
        raise
    finally:
        if loop_start is not None and outcome.get("loop_s") is None:  # a loop a lost peer ended: its time too
            outcome["loop_s"] = time.perf_counter() - loop_start
        if sync is not None:
            sync.close()
        if pinned:
            backend.unpin_tensor(pool.data)
        outcome["registrations_left"] = len(backend.pinned_registrations())
        pool.close()
        if ok and dist.is_initialized():
            dist.destroy_process_group()  # after a failure a peer may be gone: exiting releases it


def _maybe_die(config: ScenarioConfig, rank: int, step: int) -> None:
    if config.kill is not None and config.kill.rank == rank and config.kill.step == step:
        log.warning("scenario fault: rank %d kills itself at step %d", rank, step)
        os.kill(os.getpid(), signal.SIGKILL)


def _write_steps(backend: Any, pool: SharedPool, sync: Any, config: ScenarioConfig, outcome: dict[str, Any]) -> None:
    count, block_size = config.blocks_per_step, config.block_size
    raw, _typed = _device_cache(backend, config, 2 * count, "scenario.rank0")
    all_offsets = torch.arange(block_size).expand(count, block_size)
    sizes = torch.full((count,), config.block_bytes, dtype=torch.int64)
    cache_base, pool_base = raw.data_ptr(), pool.data.data_ptr()
    times = outcome["step_times"]
    for step in range(config.steps):
        _maybe_die(config, 0, step)
        start = time.perf_counter()
        plan = plan_step(config, step)
        sync.before_write(step)
        rows = step_rows(step, torch.arange(count), all_offsets, backend.device)
        raw.index_copy_(0, plan.source_blocks.to(backend.device), rows)
        src = cache_base + plan.source_blocks * config.block_bytes
        dst = pool_base + (plan.slot * count + plan.positions) * config.block_bytes
        backend.swap_blocks_batch(src, dst, sizes)
        sync.after_write(step)
        times.append(time.perf_counter() - start)
        outcome["steps_done"] = step + 1
        outcome["bytes_moved"] += count * config.block_bytes


def _read_steps(backend: Any, pool: SharedPool, sync: Any, config: ScenarioConfig, outcome: dict[str, Any]) -> None:
    count, block_size = config.blocks_per_step, config.block_size
    raw, typed = _device_cache(backend, config, count, f"scenario.rank{pool.rank}")
    staging = torch.empty(count * config.rows_per_block, ROW_BYTES, dtype=torch.uint8, device=backend.device)
    load_positions = torch.arange(count)
    load_blocks = count - 1 - load_positions  # slot position p lands in cache block count - 1 - p
    sizes = torch.full((count,), config.block_bytes, dtype=torch.int64)
    dst = raw.data_ptr() + load_blocks * config.block_bytes
    times = outcome["step_times"]
    for step in range(config.steps):
        _maybe_die(config, pool.rank, step)
        start = time.perf_counter()
        plan = plan_step(config, step)
        sync.before_read(step)
        src = pool.data.data_ptr() + (plan.slot * count + load_positions) * config.block_bytes
        backend.swap_blocks_batch(src, dst, sizes)
        row_ids = ((count - 1 - plan.positions)[:, None] * block_size + plan.offsets).flatten()
        backend.gather_resident_rows(typed, staging, row_ids.to(backend.device))
        sync.after_read(step)
        bad, notes = find_mismatches(plan, staging.cpu())
        if bad:
            outcome["mismatches"] += bad
            room = 5 - len(outcome["mismatch_examples"])
            outcome["mismatch_examples"] += notes[:max(room, 0)]
        times.append(time.perf_counter() - start)
        outcome["steps_done"] = step + 1
        outcome["bytes_moved"] += count * config.block_bytes + staging.numel()
