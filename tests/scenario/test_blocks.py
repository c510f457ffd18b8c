"""Each step's plan and its verification (``scenario/blocks.py``): distinct positions, sources and offsets; a stale
or torn block is named."""

from __future__ import annotations

import torch

from hisparse_hal.scenario import ScenarioConfig
from hisparse_hal.scenario.blocks import find_mismatches, plan_step, step_rows
from hisparse_hal.scenario.config import ROW_BYTES


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
