"""The bytes of every step: which blocks rank 0 spills where, which rows peers gather, and what those
rows must hold.

Invariant: everything is a pure function of (config, step), so every rank derives the same plan and the
expected bytes without exchanging them. Each row starts with a header naming its step, logical block
and offset, so a stale or torn read is reported by what it found.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from .config import ROW_BYTES, ScenarioConfig

__all__ = ["StepPlan", "plan_step", "step_rows", "block_checksums", "find_mismatches"]

_HEADER_BYTES = 16
_MAGIC = 0x31485348  # "HSH1" little-endian: marks a row written by the scenario


@dataclasses.dataclass(frozen=True)
class StepPlan:
    """Where step ``step``'s blocks go (CPU int64 tensors).

    Attributes:
        slot: which pool slot the step occupies.
        positions: ``[B]`` slot position of logical block ``j``.
        source_blocks: ``[B]`` block of rank 0's device cache that holds logical block ``j``.
        offsets: ``[B, rows_per_block]`` the rows peers gather from each logical block.
    """

    step: int
    slot: int
    positions: torch.Tensor
    source_blocks: torch.Tensor
    offsets: torch.Tensor


def _stride_coprime_to(n: int) -> int:
    stride = 3
    while math.gcd(stride, n) != 1:
        stride += 2
    return stride


def plan_step(config: ScenarioConfig, step: int) -> StepPlan:
    """The plan of ``step``: a permutation of slot positions, a rotating window of source blocks in
    rank 0's cache (``2 * blocks_per_step`` blocks), and distinct row offsets that move every step."""
    count = config.blocks_per_step
    j = torch.arange(count)
    positions = (j * _stride_coprime_to(count) + step) % count
    source_blocks = (j + step * count) % (2 * count)
    spacing = config.block_size // config.rows_per_block
    offsets = (torch.arange(config.rows_per_block)[None, :] * spacing + step + j[:, None]) % config.block_size
    return StepPlan(step, step % config.slots, positions, source_blocks, offsets)


def step_rows(
    step: int, blocks: torch.Tensor, offsets: torch.Tensor, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """The ``[len(blocks), offsets.shape[1], ROW_BYTES]`` uint8 rows of ``step`` for logical ``blocks``.

    A row holds an int32 header (step, block, offset, magic) and a payload derived from all three.
    """
    j = blocks.to(device=device, dtype=torch.int64).view(-1, 1, 1)
    o = offsets.to(device=device, dtype=torch.int64).unsqueeze(-1)
    columns = torch.arange(_HEADER_BYTES, ROW_BYTES, device=device, dtype=torch.int64)
    payload = ((columns * 7 + step * 131 + j * 17 + o * 29) % 251).to(torch.uint8)
    shape = (j.shape[0], o.shape[1], 1)
    header = torch.cat(
        [torch.full(shape, step, device=device, dtype=torch.int64), j.expand(shape), o.expand(shape),
         torch.full(shape, _MAGIC, device=device, dtype=torch.int64)],
        dim=-1,
    ).to(torch.int32).view(torch.uint8)
    return torch.cat([header, payload], dim=-1)


def block_checksums(rows: torch.Tensor) -> torch.Tensor:
    """Per block of ``[blocks, rows, ROW_BYTES]`` uint8: the sum of every byte times its position + 1."""
    weights = torch.arange(1, rows.shape[1] * ROW_BYTES + 1, dtype=torch.int64, device=rows.device)
    return (rows.reshape(rows.shape[0], -1).to(torch.int64) * weights).sum(dim=1)


def find_mismatches(plan: StepPlan, gathered: torch.Tensor, limit: int = 3) -> tuple[int, list[str]]:
    """Compare a peer's gathered rows of one step with what rank 0 wrote.

    Args:
        plan: the step's plan.
        gathered: ``[B * rows_per_block, ROW_BYTES]`` uint8 on the host, in logical block order.
        limit: how many mismatching blocks to describe.

    Returns:
        The number of blocks whose checksum differs, and a description of the first ``limit``.
    """
    count, per_block = plan.offsets.shape
    got = gathered.view(count, per_block, ROW_BYTES)
    want = step_rows(plan.step, torch.arange(count), plan.offsets)
    bad = (block_checksums(got) != block_checksums(want)).nonzero().flatten().tolist()
    notes = []
    for block in bad[:limit]:
        rows_differ = (got[block] != want[block]).any(dim=1).nonzero().flatten()
        row = int(rows_differ[0]) if rows_differ.numel() else 0
        header = got[block, row, :_HEADER_BYTES].clone().view(torch.int32).tolist()
        found_step, found_block, found_offset, magic = header
        if magic != _MAGIC:
            what = "no scenario header (torn or never written)"
        elif found_step < plan.step:
            what = f"step {found_step} block {found_block} offset {found_offset} (stale: an older step)"
        elif found_step > plan.step:
            what = f"step {found_step} block {found_block} offset {found_offset} (overwritten before it was read)"
        else:
            what = f"step {found_step} block {found_block} offset {found_offset} with a damaged payload (torn)"
        notes.append(
            f"step {plan.step} block {block} (slot {plan.slot}, position {int(plan.positions[block])}): checksum "
            f"differs; row offset {int(plan.offsets[block, row])} holds {what}"
        )
    return len(bad), notes
