"""The scenario's pieces on their own (sync choice, configuration, verification, the shared pool's
liveness), and end to end through the command: a clean run, a planted copy bug, a killed rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from hisparse_hal.capabilities import KV_FORMATS, Capabilities
from hisparse_hal.errors import InvalidArgumentError, UnsupportedCapabilityError
from hisparse_hal.scenario import FaultPlan, ScenarioConfig, choose_sync, run_scenario
from hisparse_hal.scenario.blocks import find_mismatches, plan_step, step_rows
from hisparse_hal.scenario.config import ROW_BYTES
from hisparse_hal.scenario.pool import SharedPool


def _caps(ipc_events: bool, limit: int | None) -> Capabilities:
    return Capabilities(batch_copy="loop", max_batch_descriptors=None, ipc_events=ipc_events,
                        ipc_event_max_cycles=limit, shared_host_pool=ipc_events and limit is None,
                        graph_capture=False, host_pointer_alias=False,
                        kv_formats=KV_FORMATS)


def test_sync_uses_ipc_events_when_the_backend_has_them_without_a_cycle_limit():
    choice = choose_sync(_caps(True, None), 1000)
    assert (choice.path, choice.reason) == ("events", "IPC events: ipc_events=True, no cycle limit, 1000 steps")


def test_sync_falls_back_to_barriers_when_the_run_outlasts_the_event_cycle_limit():
    choice = choose_sync(_caps(True, 32), 1000)
    assert choice.path == "barrier"
    assert "1000 record/wait cycles per event, over the backend's ipc_event_max_cycles=32" in choice.reason
    assert choose_sync(_caps(True, 32), 32).path == "events"  # a run that fits the limit keeps events


def test_sync_falls_back_to_barriers_without_ipc_events_and_refuses_forced_events():
    assert "no IPC events (ipc_events=False)" in choose_sync(_caps(False, None), 10).reason
    refused = r"IPC event synchronization was requested, but the backend has no IPC events"
    with pytest.raises(UnsupportedCapabilityError, match=refused):
        choose_sync(_caps(False, None), 10, "events")
    assert choose_sync(_caps(True, None), 10, "barrier").reason == "barrier synchronization was requested"


@pytest.mark.parametrize("changes, message", [
    ({"ranks": 1}, r"ranks must be an int >= 2, got 1"),
    ({"slots": 1}, r"slots must be an int >= 2, got 1"),
    ({"rows_per_block": 17}, r"rows_per_block \(17\) cannot exceed block_size \(16\)"),
    ({"sync": "fast"}, r"sync must be 'auto', 'events' or 'barrier', got 'fast'"),
    ({"kill": FaultPlan(2, 0)}, r"names a rank outside \[0, 2\)"),
])
def test_config_rejects_bad_values_naming_them(changes, message):
    with pytest.raises(InvalidArgumentError, match=message):
        ScenarioConfig(**changes)


def _gathered(rows):
    return rows.reshape(-1, ROW_BYTES).clone()


def test_verification_passes_the_written_rows_and_names_a_stale_or_torn_block():
    config = ScenarioConfig()
    plan = plan_step(config, 7)
    good = step_rows(7, torch.arange(config.blocks_per_step), plan.offsets)
    assert find_mismatches(plan, _gathered(good)) == (0, [])
    stale = good.clone()
    stale[3] = step_rows(5, torch.arange(config.blocks_per_step), plan_step(config, 5).offsets)[3]
    count, notes = find_mismatches(plan, _gathered(stale))
    assert count == 1 and "step 7 block 3" in notes[0] and "holds step 5 block 3" in notes[0]
    assert "(stale: an older step)" in notes[0]
    torn = good.clone()
    torn[9, 2, 600] ^= 0xFF
    count, notes = find_mismatches(plan, _gathered(torn))
    assert count == 1 and "block 9" in notes[0] and "damaged payload (torn)" in notes[0]
    blank = torch.zeros_like(good)
    count, notes = find_mismatches(plan, _gathered(blank), limit=2)
    assert count == config.blocks_per_step and len(notes) == 2 and "no scenario header" in notes[0]


def test_step_plans_use_distinct_positions_sources_and_offsets():
    config = ScenarioConfig()
    for step in (0, 1, 17, 999):
        plan = plan_step(config, step)
        assert sorted(plan.positions.tolist()) == list(range(config.blocks_per_step))
        assert len(set(plan.source_blocks.tolist())) == config.blocks_per_step
        assert all(len(set(row)) == config.rows_per_block for row in plan.offsets.tolist())
        assert plan.slot == step % config.slots


def test_shared_pool_file_can_be_unlinked_while_mapped_and_reports_no_live_rank_lost(tmp_path):
    path = SharedPool.create(2, 4, 4096)
    try:
        pool = SharedPool(path, 0, 2, 4, 4096)
        assert pool.word(0) == -1 and pool.pid_of(0) == os.getpid() and pool.pid_of(1) == -1
        assert pool.lost_ranks() == []  # rank 1 never mapped the pool: not lost, not yet there
        assert SharedPool.unlink(path) and not os.path.exists(path)
        pool.data[0, :4] = torch.tensor([1, 2, 3, 4], dtype=torch.uint8)  # the mapping outlives the name
        assert pool.data[0, :4].tolist() == [1, 2, 3, 4]
        pool.close()
    finally:
        SharedPool.unlink(path)


@pytest.mark.timeout(300)
def test_a_swap_that_copies_one_byte_short_is_reported_as_a_mismatch_naming_the_block():
    from hisparse_hal.testing.broken_backends import SwapOneByteShort

    result = run_scenario(ScenarioConfig(ranks=2, steps=20, backend_factory=SwapOneByteShort, timeout_s=20))
    reader = result.ranks[1]
    assert not result.ok and reader.error_type is None
    assert reader.mismatches > 0
    assert reader.mismatch_examples and "checksum differs" in reader.mismatch_examples[0]


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "HISPARSE_HAL_BACKEND"}
    return subprocess.run([sys.executable, "-m", "hisparse_hal.cli", "scenario", *args],
                          capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.timeout(300)
def test_scenario_command_prints_rates_and_percentiles_and_writes_json(tmp_path):
    report = tmp_path / "scenario.json"
    done = _cli("--ranks", "2", "--steps", "30", "--backend", "cpu", "--json", str(report))
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "sync: events (IPC events: ipc_events=True, no cycle limit, 30 steps)" in out
    assert "2 ranks x 30 steps" in out and "steps/s" in out and "MiB moved" in out
    assert "p50 ms" in out and "p99 ms" in out and out.rstrip().endswith("PASS")
    assert "\r" not in out, "a progress bar was drawn although stdout is not a terminal"
    doc = json.loads(report.read_text())
    assert doc["ok"] is True and doc["sync"] == "events" and [r["steps_done"] for r in doc["ranks"]] == [30, 30]


@pytest.mark.timeout(300)
def test_scenario_command_exits_non_zero_when_a_rank_dies():
    done = _cli("--ranks", "2", "--steps", "60", "--backend", "cpu", "--sync", "barrier", "--kill", "1:10",
                "--timeout", "10")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "PeerLostError: rank 1 (pid" in done.stdout and done.stdout.rstrip().endswith("FAIL")


def test_scenario_command_refuses_an_unknown_backend_with_the_probe_table_before_starting_ranks():
    done = _cli("--ranks", "2", "--steps", "5", "--backend", "no-such-backend")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "no-such-backend" in done.stderr and "cpu" in done.stderr and "rank" not in done.stdout
