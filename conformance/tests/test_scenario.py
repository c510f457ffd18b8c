"""The integration tier: an engine on one machine. Two ranks run the tensor-parallel offload scenario
(rank 0 writes one shared pinned host pool, the peer reads every step back and verifies it) for 1,000
steps on the capability-chosen path and on the event-free barrier path; a rank killed mid-run ends
every other rank with a typed error naming it, in bounded time, with nothing left pinned and no file
left in /dev/shm; a pool over several registrations refuses a descriptor that spans two."""

from __future__ import annotations

import os
import time

import pytest

from hisparse_hal.scenario import FaultPlan, ScenarioConfig, ScenarioResult, run_scenario
from hisparse_hal.scenario.config import ROW_BYTES

#: This tier (read by conformance/tiers.py, without importing this module): its area, its place in the
#: run and its title in the reports.
AREA = "scenario"
ORDER = 110
TITLE = "TP scenario (integration)"

#: The scenario's ranks read hisparse-hal's pinning records (host_registration, pinned_registrations).
pytestmark = pytest.mark.hal_extension

STEPS = 1000
#: Bound of every wait on another rank in these runs; a lost rank must be noticed well within it.
TIMEOUT_S = 20.0
SHM = "/dev/shm"


def _config(recipe, **changes) -> ScenarioConfig:
    where = {"backend": recipe.registry_name} if recipe.registry_name else {"backend_factory": recipe.build}
    return ScenarioConfig(ranks=2, timeout_s=TIMEOUT_S, **where, **changes)


def _shm_files() -> set[str]:
    return {name for name in os.listdir(SHM) if name.startswith("hisparse-hal-")} if os.path.isdir(SHM) else set()


def _left_behind(result: ScenarioResult, before: set[str]) -> list[str]:
    """Files of this run still in /dev/shm: its pool, and event files whose creator was one of its ranks
    (the CPU device's event header holds the creator's pid at byte 24). Other processes on the machine
    may create and remove their own files meanwhile; those are not this run's."""
    pids = {r.pid for r in result.ranks}
    left = [result.pool_path] if os.path.exists(result.pool_path) else []
    for name in _shm_files() - before:
        try:
            with open(os.path.join(SHM, name), "rb") as f:
                header = f.read(32)
        except OSError:
            continue
        if len(header) == 32 and int.from_bytes(header[24:32], "little") in pids:
            left.append(name)
    return left


def _describe(result: ScenarioResult) -> str:
    return "\n".join(
        f"rank {r.rank}: steps {r.steps_done}, mismatches {r.mismatches} {list(r.mismatch_examples)}, "
        f"error {r.error_type}: {r.error}, left pinned {r.registrations_left}, preflight {r.preflight}"
        for r in result.ranks
    )


def _assert_clean_run(result: ScenarioResult, path: str) -> None:
    assert result.ok, _describe(result)
    assert result.sync == path, f"ran {result.sync} ({result.sync_reason}), expected {path}"
    for rank in result.ranks:
        assert rank.steps_done == STEPS and rank.mismatches == 0 and rank.registrations_left == 0, _describe(result)
        assert rank.exitcode == 0
    peer = result.ranks[1]
    rows = STEPS * result.config.blocks_per_step * result.config.rows_per_block
    assert peer.bytes_moved == STEPS * result.config.blocks_per_step * result.config.block_bytes + rows * ROW_BYTES


@pytest.mark.smoke
@pytest.mark.timeout(600)
def test_two_ranks_run_1000_steps_on_the_path_capabilities_choose_and_every_read_verifies(backend_recipe, capabilities):
    before = _shm_files()
    result = run_scenario(_config(backend_recipe, steps=STEPS))
    limit = capabilities.ipc_event_max_cycles
    expected = "events" if capabilities.ipc_events and (limit is None or limit >= STEPS) else "barrier"
    _assert_clean_run(result, expected)
    if expected == "events":
        for rank in result.ranks:  # a handle opened by the process that exported it is refused
            assert rank.preflight["self_import"].startswith("refused: ") and "process" in rank.preflight["self_import"]
    assert _left_behind(result, before) == []


@pytest.mark.timeout(600)
def test_two_ranks_run_1000_steps_on_the_event_free_barrier_path(backend_recipe):
    before = _shm_files()
    result = run_scenario(_config(backend_recipe, steps=STEPS, sync="barrier"))
    _assert_clean_run(result, "barrier")
    assert result.sync_reason == "barrier synchronization was requested"
    assert _left_behind(result, before) == []


@pytest.mark.timeout(300)
@pytest.mark.parametrize("sync", ["auto", "barrier"])
@pytest.mark.parametrize("killed", [0, 1], ids=["writer_killed", "reader_killed"])
def test_a_rank_killed_mid_run_ends_the_other_with_peer_lost_naming_it_and_leaks_nothing(backend_recipe, sync, killed):
    before = _shm_files()
    start = time.monotonic()
    result = run_scenario(_config(backend_recipe, steps=400, sync=sync, kill=FaultPlan(killed, 100)))
    elapsed = time.monotonic() - start
    dead, survivor = result.ranks[killed], result.ranks[1 - killed]
    assert dead.exitcode == -9 and dead.error_type == "RankExited" and "killed by signal 9" in dead.error
    assert survivor.error_type == "PeerLostError", _describe(result)
    assert survivor.lost_rank == killed
    assert f"rank {killed} (pid {dead.pid}) exited while rank {1 - killed} was " in survivor.error
    assert 100 <= survivor.steps_done <= 100 + result.config.slots, "the survivor went on past the dead rank"
    assert survivor.exitcode == 0 and survivor.registrations_left == 0, "the survivor left host memory pinned"
    assert elapsed < TIMEOUT_S + 60, f"the run took {elapsed:.0f} s to end after a rank died"
    assert not result.ok
    assert _left_behind(result, before) == []


@pytest.mark.timeout(300)
def test_a_pool_over_several_registrations_runs_and_refuses_a_descriptor_spanning_two(backend_recipe):
    config = _config(backend_recipe, steps=50, blocks_per_step=32)  # 64 blocks of 10,496 bytes
    chunk = 16 * config.block_bytes  # a multiple of the page size: lcm(4096, 10,496) = 16 blocks
    result = run_scenario(_config(backend_recipe, steps=50, blocks_per_step=32, host_chunk_bytes=chunk))
    assert result.ok, _describe(result)
    for rank in result.ranks:
        assert rank.pool_chunks == 4
        verdict = rank.preflight["spanning_descriptor"]
        assert verdict.startswith("refused: ") and "descriptor 0" in verdict, verdict
