"""The scenario's pieces on their own (sync choice, configuration, verification, the shared pool's
liveness), and end to end through the command: a clean run, a planted copy bug, a killed rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hisparse_hal.capabilities import KV_FORMATS, Capabilities
from hisparse_hal.scenario import ScenarioConfig, run_scenario
from hisparse_hal.scenario.config import ROW_BYTES


def _caps(ipc_events: bool, limit: int | None) -> Capabilities:
    return Capabilities(batch_copy="loop", max_batch_descriptors=None, ipc_events=ipc_events,
                        ipc_event_max_cycles=limit, shared_host_pool=ipc_events and limit is None,
                        graph_capture=False, host_pointer_alias=False,
                        kv_formats=KV_FORMATS)










def _gathered(rows):
    return rows.reshape(-1, ROW_BYTES).clone()








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
