"""The reference oracle of the cache ops: worked examples, closed forms, invariants on generated sequences, errors.

The worked examples are those of docs/design/cache-ops.md (research §2.7 and §2.8, and the doc's own 3-step
example); the invariants are the research doc's §10.3 list, checked on generated multi-step decode sequences.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from poisoned_outputs import ResolveOutputs

from hisparse_hal.cache_ops import oracle
from hisparse_hal.cache_ops.sequences import (
    POISON,
    SHAPES,
    DecodeStep,
    SequenceRun,
    StepTensors,
    decode_sequences,
)
from hisparse_hal.errors import InvalidArgumentError

I32 = torch.int32


class Model:
    """State of one worked example: geometry, tables and persistent DGI / LRU / stats."""

    def __init__(self, *, block: int, top_k: int, hot_size: int, union: int, states: int, hot_table: list,
                 source: list, request_state_indices: list, resident: list | None = None,
                 attention_block_stride: int | None = None) -> None:
        self.block, self.top_k, self.hot_size, self.union = block, top_k, hot_size, union
        self.host = torch.zeros(64, 16, dtype=torch.uint8)
        self.hot_cache = torch.zeros(64, block, 16, dtype=torch.uint8)
        self.hot_table = torch.tensor(hot_table, dtype=I32)
        self.source = torch.tensor(source, dtype=I32)
        self.resident = torch.tensor(resident, dtype=I32) if resident is not None else None
        self.states = torch.tensor(request_state_indices, dtype=I32)
        self.dgi = torch.full((states, hot_size), -1, dtype=I32)
        self.lru = torch.arange(hot_size, dtype=torch.int16).repeat(states, 1)
        self.stats = torch.zeros(2, dtype=torch.uint64)
        self.flags = torch.zeros(1, dtype=I32)
        self.attention_block_stride = attention_block_stride or block

    def step(self, topk: list[list[int]], request_ids: list[int]) -> ResolveOutputs:
        out = ResolveOutputs(len(topk), self.top_k)
        oracle.resolve_residency(
            self.host, self.hot_cache, self.hot_table, torch.tensor(topk, dtype=I32), out.hot, self.dgi, self.lru,
            self.states, self.hot_size, self.union, out.miss_mask, self.stats, out.attention,
            self.attention_block_stride, torch.tensor(request_ids, dtype=I32), self.source, self.block,
            out.resolved, out.valid_counts, out.swap_host, out.swap_device, out.swap_counts, self.resident,
            self.block, 0, error_flags=self.flags,
        )
        return out

    def stats_pair(self) -> list[int]:
        return self.stats.view(torch.int64).tolist()


def example_a() -> Model:
    """Research §2.7: requests A (batch row 0, state 2) and B (batch row 1, state 3); B=4, K=3, H=6."""
    resident = [[0, 0, 0], [0, 0, 0], [0, 0, 0], [0, 0, 0]]
    resident[0][2] = resident[2][2] = 10  # A's page 2 lives in GPU block 10, in both index spaces
    return Model(block=4, top_k=3, hot_size=6, union=3, states=4, hot_table=[[20, 21], [30, 31]],
                 source=[[5, 9, 3], [7, 2, 11]], request_state_indices=[2, 3, -1, -1], resident=resident)


def test_example_a_step_one_loads_misses_into_oldest_slots_and_serves_the_resident_page() -> None:
    model = example_a()
    out = model.step([[1, 6, 9], [0, 5, -1]], [0, 1])
    assert out.hot.tolist() == [[80, 81, 41], [120, 121, -1]]
    assert out.attention.tolist() == out.hot.tolist()  # A = B: attention index = physical row
    assert out.resolved.tolist() == [[21, 38, 13], [28, 9, -1]]
    assert out.valid_counts.tolist() == [3, 2]
    assert out.miss_mask.tolist() == [[1, 1, 0], [1, 1, 0]]
    assert out.swap_counts.tolist() == [2, 2]
    assert out.swap_host[:, :2].tolist() == [[21, 38], [28, 9]]
    assert out.swap_device[:, :2].tolist() == [[80, 81], [120, 121]]
    assert out.swap_host[:, 2].tolist() == [POISON, POISON]  # entries past the count are not written
    assert model.dgi[2].tolist() == [21, 38, -1, -1, -1, -1]
    assert model.dgi[3].tolist() == [28, 9, -1, -1, -1, -1]
    assert model.lru[2].tolist() == model.lru[3].tolist() == [2, 3, 4, 5, 0, 1]
    assert model.stats_pair() == [0, 4]
    assert model.dgi[[0, 1]].tolist() == [[-1] * 6] * 2  # other state rows untouched


def test_example_a_steps_two_and_three_hit_cached_rows_and_evict_in_lru_order() -> None:
    model = example_a()
    model.step([[1, 6, 9], [0, 5, -1]], [0, 1])
    out = model.step([[6, 2, 1], [5, 4, 0]], [0, 1])
    assert out.hot.tolist() == [[81, 82, 80], [121, 122, 120]]
    assert out.swap_counts.tolist() == [1, 1]
    assert (out.swap_host[:, 0].tolist(), out.swap_device[:, 0].tolist()) == ([22, 8], [82, 122])
    assert out.miss_mask.tolist() == [[0, 1, 0], [0, 1, 0]]
    assert model.lru[2].tolist() == model.lru[3].tolist() == [3, 4, 5, 2, 0, 1]
    assert model.stats_pair() == [4, 6]
    out = model.step([[3, 0, 7], [8, 9, 5]], [0, 1])
    assert out.hot.tolist() == [[83, 84, 85], [123, 124, 121]]
    assert out.swap_counts.tolist() == [3, 2]
    assert model.dgi[2].tolist() == [21, 38, 22, 23, 20, 39]
    assert model.dgi[3].tolist() == [28, 9, 8, 44, 45, -1]
    assert model.lru[2].tolist() == [2, 0, 1, 3, 4, 5]
    assert model.lru[3].tolist() == [5, 2, 0, 3, 4, 1]
    assert model.stats_pair() == [5, 11]


def example_b() -> Model:
    """Research §2.8: one request (state 1) with two MTP rows plus a padding row; B=4, K=3, Q=2, H=9."""
    return Model(block=4, top_k=3, hot_size=9, union=6, states=2, hot_table=[[6, 7, 8], [0, 0, 0], [0, 0, 0]],
                 source=[[1, 2, 3, 4], [0, 0, 0, 0], [0, 0, 0, 0]], request_state_indices=[1, -1, -1])


def test_example_b_mtp_rows_share_one_union_and_spill_swaps_into_the_next_row() -> None:
    model = example_b()
    out = model.step([[2, 3, 4], [3, 5, 6], [7, 7, 7]], [0, 0, -1])
    assert out.hot.tolist() == [[24, 25, 26], [25, 27, 28], [-1, -1, -1]]
    assert out.swap_counts.tolist() == [3, 2, 0]
    assert out.swap_host.view(-1)[:5].tolist() == [6, 7, 8, 9, 10]
    assert out.swap_device.view(-1)[:5].tolist() == [24, 25, 26, 27, 28]
    assert out.miss_mask[:2].tolist() == [[1, 1, 1], [0, 1, 1]]  # row 1's host row 7 was loaded by row 0
    assert out.miss_mask[2].tolist() == [POISON] * 3  # padding rows keep their miss_mask
    assert out.valid_counts.tolist() == [3, 3, 0]
    assert out.resolved[2].tolist() == [-1, -1, -1]
    assert model.stats_pair() == [1, 5]
    assert model.lru[1].tolist() == [5, 6, 7, 8, 0, 1, 2, 3, 4]
    assert model.lru[0].tolist() == list(range(9))


def test_example_b_step_two_puts_both_misses_in_the_first_rows_segment() -> None:
    model = example_b()
    model.step([[2, 3, 4], [3, 5, 6], [7, 7, 7]], [0, 0, -1])
    out = model.step([[3, 8, 2], [5, 9, -1], [7, 7, 7]], [0, 0, -1])
    assert out.hot.tolist() == [[25, 29, 24], [27, 30, -1], [-1, -1, -1]]
    assert out.swap_counts.tolist() == [2, 0, 0]
    assert out.swap_host[0, :2].tolist() == [12, 13]
    assert out.swap_device[0, :2].tolist() == [29, 30]
    assert model.lru[1].tolist() == [7, 8, 2, 4, 5, 6, 0, 1, 3]
    assert model.stats_pair() == [4, 7]


def doc_example() -> Model:
    """docs/design/cache-ops.md's worked example: request R (two MTP rows, state 0) and S (one row, state 2).

    B=2, K=2, Q=2, H=5, U=4; attention block stride 3. R's hot blocks [10, 11, 12], S's [20, 21, 22];
    R's source blocks [3, 4, 5, 6], S's [7, 8, 9, 1]; S's page 3 is resident in GPU block 30.
    """
    resident = [[0, 0, 0, 0], [0, 0, 0, 30], [0, 0, 0, 0]]
    return Model(block=2, top_k=2, hot_size=5, union=4, states=3, hot_table=[[10, 11, 12], [20, 21, 22], [0] * 3],
                 source=[[3, 4, 5, 6], [7, 8, 9, 1], [0] * 4], request_state_indices=[0, 2, -1],
                 resident=resident, attention_block_stride=3)


def test_doc_example_three_steps_with_mtp_resident_page_padding_and_invalidation() -> None:
    model = doc_example()
    out = model.step([[0, 3], [3, 5], [6, 1]], [0, 0, 1])
    assert out.resolved.tolist() == [[6, 9], [9, 11], [2, 15]]
    assert out.hot.tolist() == [[20, 21], [21, 22], [60, 40]]
    assert out.attention.tolist() == [[30, 31], [31, 33], [90, 60]]
    assert out.miss_mask.tolist() == [[1, 1], [0, 1], [0, 1]]
    assert out.swap_counts.tolist() == [2, 1, 1]
    assert out.swap_host.tolist() == [[6, 9], [11, POISON], [15, POISON]]
    assert out.swap_device.tolist() == [[20, 21], [22, POISON], [40, POISON]]
    assert model.dgi.tolist() == [[6, 9, 11, -1, -1], [-1] * 5, [15, -1, -1, -1, -1]]
    assert model.lru.tolist() == [[3, 4, 0, 1, 2], [0, 1, 2, 3, 4], [1, 2, 3, 4, 0]]
    assert model.stats_pair() == [1, 4]

    # Step 2: S comes first in the batch now (batch row 0), R second; a graph-padding row ends the batch.
    model.hot_table = torch.tensor([[20, 21, 22], [10, 11, 12], [0] * 3], dtype=I32)
    model.source = torch.tensor([[7, 8, 9, 1], [3, 4, 5, 6], [0] * 4], dtype=I32)
    model.resident = torch.tensor([[0, 0, 0, 30], [0] * 4, [0] * 4], dtype=I32)
    model.states = torch.tensor([2, 0, -1], dtype=I32)
    out = model.step([[1, 7], [5, 7], [0, -1]], [0, 1, -1])
    assert out.resolved.tolist() == [[15, 3], [11, 13], [-1, -1]]  # a resident entry still reports its host row
    assert out.hot.tolist() == [[40, 61], [22, 23], [-1, -1]]
    assert out.attention.tolist() == [[60, 91], [33, 34], [-1, -1]]
    assert out.miss_mask.tolist() == [[0, 0], [0, 1], [POISON, POISON]]
    assert out.valid_counts.tolist() == [2, 2, 0]
    assert out.swap_counts.tolist() == [0, 1, 0]
    assert (out.swap_host[1, 0].item(), out.swap_device[1, 0].item()) == (13, 23)  # in R's own segment
    assert out.swap_host[0].tolist() == [POISON, POISON]
    assert model.dgi.tolist() == [[6, 9, 11, 13, -1], [-1] * 5, [15, -1, -1, -1, -1]]
    assert model.lru.tolist() == [[4, 0, 1, 3, 2], [0, 1, 2, 3, 4], [1, 2, 3, 4, 0]]
    assert model.stats_pair() == [3, 5]

    # The mirror rewrote host row 13 (R's token 7): invalidation drops R's copy; 9 is not in S's row; q=5 is ignored.
    oracle.invalidate_written_slots(model.dgi, model.states, torch.tensor([1, 0, 5], dtype=I32),
                                    torch.tensor([13, 9, 13], dtype=torch.int64))
    assert model.dgi.tolist() == [[6, 9, 11, -1, -1], [-1] * 5, [15, -1, -1, -1, -1]]

    # Step 3: R's two rows first again, S in batch row 2 (request id 2); 13 is reloaded, into another slot.
    model.hot_table = torch.tensor([[10, 11, 12], [10, 11, 12], [20, 21, 22]], dtype=I32)
    model.source = torch.tensor([[3, 4, 5, 6], [3, 4, 5, 6], [7, 8, 9, 1]], dtype=I32)
    model.resident = torch.tensor([[0] * 4, [0] * 4, [0, 0, 0, 30]], dtype=I32)
    model.states = torch.tensor([0, 0, 2], dtype=I32)
    out = model.step([[7, 6], [2, 0], [0, 2]], [0, 0, 2])
    assert out.resolved.tolist() == [[13, 12], [8, 6], [14, 16]]
    assert out.hot.tolist() == [[24, 21], [23, 20], [41, 42]]
    assert out.attention.tolist() == [[36, 31], [34, 30], [61, 63]]
    assert out.miss_mask.tolist() == [[1, 1], [1, 0], [1, 1]]
    assert out.swap_counts.tolist() == [2, 1, 2]
    assert out.swap_host.tolist() == [[13, 12], [8, POISON], [14, 16]]
    assert out.swap_device.tolist() == [[24, 21], [23, POISON], [41, 42]]
    assert model.dgi.tolist() == [[6, 12, 11, 8, 13], [-1] * 5, [15, 14, 16, -1, -1]]
    assert model.lru.tolist() == [[2, 4, 1, 3, 0], [0, 1, 2, 3, 4], [3, 4, 0, 1, 2]]
    assert model.stats_pair() == [4, 10]
    assert model.flags.tolist() == [0]


def test_cold_start_with_distinct_rows_takes_slot_i_and_rotates_the_lru_left_by_k() -> None:
    for top_k, hot_size in ((1, 1), (3, 6), (5, 7), (8, 16)):
        model = Model(block=4, top_k=top_k, hot_size=hot_size, union=top_k, states=1,
                      hot_table=[list(range(2, 2 + -(-hot_size // 4)))], source=[list(range(1, 12))],
                      request_state_indices=[0])
        out = model.step([list(range(top_k))], [0])
        assert out.hot.tolist() == [[8 + i for i in range(top_k)]]
        assert model.lru[0].tolist() == list(range(top_k, hot_size)) + list(range(top_k))
        assert model.dgi[0].tolist()[:top_k] == [4 + i for i in range(top_k)]
        assert model.stats_pair() == [0, top_k]


def test_warm_replay_of_the_same_step_is_all_hits_with_no_swaps_and_unchanged_state() -> None:
    model = example_b()
    model.step([[2, 3, 4], [3, 5, 6], [7, 7, 7]], [0, 0, -1])
    dgi, lru = model.dgi.clone(), model.lru.clone()
    out = model.step([[2, 3, 4], [3, 5, 6], [7, 7, 7]], [0, 0, -1])
    assert out.swap_counts.tolist() == [0, 0, 0]
    assert out.miss_mask[:2].tolist() == [[0, 0, 0], [0, 0, 0]]
    assert torch.equal(model.dgi, dgi) and torch.equal(model.lru, lru)
    assert model.stats_pair() == [1 + 6, 5]


# --------------------------------------------------------------------------------------------------------------
# Decisions of ours (docs/design/cache-ops.md, "Where the sources are silent").
# --------------------------------------------------------------------------------------------------------------


def test_in_row_duplicate_maps_to_one_slot_and_counts_one_miss_then_hits() -> None:
    model = Model(block=4, top_k=3, hot_size=6, union=3, states=1, hot_table=[[1, 2]], source=[[5, 6]],
                  request_state_indices=[0])
    out = model.step([[2, 2, 3]], [0])
    assert out.hot.tolist() == [[4, 4, 5]]
    assert out.miss_mask.tolist() == [[1, 0, 1]]
    assert model.stats_pair() == [1, 2]


def test_union_overflow_flags_bit_one_and_treats_the_run_as_padding() -> None:
    model = Model(block=4, top_k=2, hot_size=4, union=2, states=1, hot_table=[[1], [1]], source=[[5, 6], [5, 6]],
                  request_state_indices=[0])
    out = model.step([[0, 1], [2, 3]], [0, 0])  # three rows: two rows x two distinct tokens = 4 > U = 2
    assert model.flags.tolist() == [oracle.FLAG_UNION_OVERFLOW]
    assert out.hot.tolist() == [[-1, -1], [-1, -1]] and out.valid_counts.tolist() == [0, 0]
    assert out.miss_mask.tolist() == [[POISON] * 2] * 2
    assert model.dgi.tolist() == [[-1] * 4] and model.lru.tolist() == [[0, 1, 2, 3]]


def test_state_row_used_by_two_runs_flags_bit_three_and_pads_the_later_run() -> None:
    model = Model(block=4, top_k=1, hot_size=2, union=1, states=1, hot_table=[[1], [2]], source=[[5], [6]],
                  request_state_indices=[0, 0])
    out = model.step([[0], [0]], [0, 1])
    assert model.flags.tolist() == [oracle.FLAG_SHARED_STATE_ROW]
    assert out.hot.tolist() == [[4], [-1]]
    assert model.dgi.tolist() == [[20, -1]]


def test_out_of_range_lru_victim_flags_bit_two_drops_the_reference_and_plans_a_skipped_copy() -> None:
    model = Model(block=4, top_k=2, hot_size=3, union=2, states=1, hot_table=[[1]], source=[[5]],
                  request_state_indices=[0])
    model.lru[0] = torch.tensor([7, 0, 1], dtype=torch.int16)
    out = model.step([[1, 2]], [0])
    assert model.flags.tolist() == [oracle.FLAG_LRU_TRIPWIRE]
    assert out.hot.tolist() == [[-1, 4]]
    assert out.swap_host[0].tolist() == [21, 22] and out.swap_device[0].tolist() == [-1, 4]
    assert out.miss_mask.tolist() == [[0, 1]] and out.valid_counts.tolist() == [2]
    assert model.stats_pair() == [0, 1]
    assert model.lru[0].tolist() == [1, 7, 0]


def test_stats_wrap_modulo_two_to_the_64() -> None:
    model = Model(block=4, top_k=2, hot_size=2, union=2, states=1, hot_table=[[1]], source=[[5]],
                  request_state_indices=[0])
    model.stats.view(torch.int64).copy_(torch.tensor([-1, -1]))  # 2**64 - 1 each
    model.step([[0, 1]], [0])
    assert model.stats_pair() == [-1, 1]


# --------------------------------------------------------------------------------------------------------------
# gather_compact, gather_plan, invalidate_written_slots
# --------------------------------------------------------------------------------------------------------------


def _caches(host_rows: int = 8, blocks: int = 3, block: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    host = torch.arange(host_rows * 16, dtype=torch.int64).remainder(251).to(torch.uint8).view(host_rows, 16)
    return host, torch.full((blocks, block, 16), 0xEE, dtype=torch.uint8)


def test_gather_compact_copies_count_entries_zero_fills_past_host_and_skips_bad_rows() -> None:
    host, hot = _caches()
    plan_host = torch.tensor([[3, 9, -1, 5], [1, 2, 0, 0]], dtype=I32)
    plan_hot = torch.tensor([[0, 1, 2, 99], [3, -1, 4, 5]], dtype=I32)
    oracle.gather_compact(host, hot, plan_host, plan_hot, torch.tensor([4, 2], dtype=I32))
    rows = hot.view(6, 16)
    assert torch.equal(rows[0], host[3]) and torch.equal(rows[3], host[1])
    assert rows[1].tolist() == [0] * 16  # host row 9 >= 8 rows: zeros, never stale
    assert rows[2].tolist() == rows[4].tolist() == rows[5].tolist() == [0xEE] * 16  # skipped / past count


def test_gather_compact_clamps_negative_and_oversized_counts() -> None:
    host, hot = _caches()
    oracle.gather_compact(host, hot, torch.tensor([[1, 2]], dtype=I32), torch.tensor([[0, 1]], dtype=I32),
                          torch.tensor([-3], dtype=I32))
    assert hot.view(6, 16)[:2].tolist() == [[0xEE] * 16] * 2
    oracle.gather_compact(host, hot, torch.tensor([[1, 2]], dtype=I32), torch.tensor([[0, 1]], dtype=I32),
                          torch.tensor([50], dtype=I32))
    assert torch.equal(hot.view(6, 16)[:2], host[1:3])


def test_gather_plan_copies_masked_entries_into_a_staging_buffer_and_writes_attention_for_every_column() -> None:
    host, _ = _caches()
    staging = torch.full((4, 16), 0xEE, dtype=torch.uint8)
    attention = torch.full((2, 2), POISON, dtype=I32)
    oracle.gather_plan(host, staging, torch.tensor([[2, 3], [4, 5]], dtype=I32),
                       torch.tensor([[0, 1], [2, -1]], dtype=I32), torch.tensor([[1, 0], [1, 1]], dtype=I32),
                       torch.tensor([0, -1], dtype=I32), attention, 1)
    assert torch.equal(staging[0], host[2])
    assert staging[1:].tolist() == [[0xEE] * 16] * 3  # mask 0, padding row 1
    assert attention.tolist() == [[0, 1], [-1, -1]]


def test_invalidate_clears_every_occurrence_in_the_right_state_row_only() -> None:
    dgi = torch.tensor([[5, 7, 5], [5, 8, 9]], dtype=I32)
    oracle.invalidate_written_slots(dgi, torch.tensor([1, 0], dtype=I32), torch.tensor([1, 0, -1, 7, 1], dtype=I32),
                                    torch.tensor([5, 9, 8, 8, -1], dtype=torch.int64))
    assert dgi.tolist() == [[-1, 7, -1], [5, 8, -1]]


# --------------------------------------------------------------------------------------------------------------
# §10.3 invariants on generated multi-step sequences.
# --------------------------------------------------------------------------------------------------------------


class StepCheck:
    """Checks one resolve + gather_compact step against the research doc's §10.3 invariants."""

    def __init__(self, run: SequenceRun, step: DecodeStep) -> None:
        self.run, self.step = run, step
        self.dgi, self.lru = run.dgi.tolist(), run.lru.tolist()
        self.stats = run.stats.view(torch.int64).tolist()
        self.hot = run.hot.view(torch.uint8).clone()

    def translate(self, q: int, t: int) -> tuple[int, int]:
        block, host_rows = self.run.sequence.shape.block_size, self.run.sequence.host_rows
        src, res = self.step.source_block_table, self.step.resident_block_table
        if t < 0 or t // block >= len(src[q]) or src[q][t // block] <= 0:
            g = -1
        else:
            g = src[q][t // block] * block + t % block
        resident = -1
        if res is not None and t >= 0 and t // block < len(res[q]) and res[q][t // block] > 0:
            resident = res[q][t // block] * block + t % block
        return (g if g < host_rows else -1), resident

    def after(self, io: StepTensors) -> None:
        run, step, k = self.run, self.step, self.run.sequence.top_k
        block, hot_size = run.sequence.shape.block_size, run.sequence.shape.slots
        hot, miss = io.hot_indices.tolist(), io.miss_mask.tolist()
        dgi, lru = run.dgi.tolist(), run.lru.tolist()
        hot_rows = run.hot.view(torch.uint8).flatten(0, 1)
        host = run.host.view(torch.uint8)
        flags = int(run.error_flags.item())  # cumulative over the sequence
        counts, valid = io.swap_counts.tolist(), io.valid_counts.tolist()
        runs: dict[int, list[int]] = {}
        for r, q in enumerate(step.request_ids):
            runs.setdefault(q, []).append(r)
        hits = misses = 0
        claimed: set[int] = set()
        for q, rows in runs.items():  # runs in batch order (dicts keep insertion order)
            s = step.request_state_indices[q] if 0 <= q < len(step.request_state_indices) else -1
            union = {g for r in rows for g, res in (self.translate(q, t) for t in step.global_indices[r])
                     if g >= 0 and res < 0}
            overflow = s >= 0 and len(union) > step.max_union_rows
            shared = s >= 0 and not overflow and s in claimed
            if s >= 0 and not overflow:
                claimed.add(s)
            assert not overflow or flags & oracle.FLAG_UNION_OVERFLOW
            assert not shared or flags & oracle.FLAG_SHARED_STATE_ROW
            if s < 0 or overflow or shared:
                for r in rows:  # padding: -1 outputs, zero counts, miss_mask untouched
                    assert hot[r] == [-1] * k and valid[r] == 0 and counts[r] == 0 and miss[r] == [POISON] * k
                continue
            assert sorted(lru[s]) == sorted(self.lru[s]), "LRU must stay a permutation of its slots"
            held = [x for x in dgi[s] if x >= 0]
            assert len(held) == len(set(held)), "DGI entries of a state row must be distinct"
            slot_of: dict[int, int] = {}
            for r in rows:
                for c, t in enumerate(step.global_indices[r]):
                    g, resident = self.translate(q, t)
                    if resident >= 0:
                        assert hot[r][c] == resident
                    elif g < 0:
                        assert hot[r][c] == -1
                    elif hot[r][c] >= 0:  # sound: the slot holds g and, after gather, its bytes
                        slot = next(x for x in range(hot_size)
                                    if step.hot_block_table[q][x // block] * block + x % block == hot[r][c])
                        assert dgi[s][slot] == g
                        assert torch.equal(hot_rows[hot[r][c]], host[g]), f"hot row {hot[r][c]} != host {g}"
                        assert slot_of.setdefault(g, slot) == slot, "one host row, one slot per request"
                        hits += miss[r][c] == 0
                        misses += miss[r][c] == 1
            plan = io.swap_host.view(-1).tolist(), io.swap_device.view(-1).tolist()
            m = sum(counts[r] for r in rows)
            destinations = plan[1][rows[0] * k: rows[0] * k + m]
            assert len({d for d in destinations if d >= 0}) == len([d for d in destinations if d >= 0])
            loaded = set(plan[0][rows[0] * k: rows[0] * k + m])
            hit_slots = [x for x in range(hot_size) if self.dgi[s][x] >= 0 and self.dgi[s][x] in slot_of]
            for x in hit_slots:  # a hit slot is never a swap destination and keeps its row
                assert self.dgi[s][x] not in loaded and dgi[s][x] == self.dgi[s][x]
            assert lru[s][hot_size - len(hit_slots):] == [x for x in self.lru[s] if x in hit_slots]
        before, now = self.stats, run.stats.view(torch.int64).tolist()
        assert [(now[i] - before[i]) % 2**64 for i in range(2)] == [hits, misses]


@settings(max_examples=120, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(sequence=decode_sequences())
def test_generated_sequences_keep_the_section_10_3_invariants(sequence: Any) -> None:
    run = SequenceRun(sequence)
    for index, step in enumerate(sequence.steps):
        io = run.tensors(step)
        check = StepCheck(run, step)
        run.resolve(oracle, step, io)
        run.gather(oracle, io)
        check.after(io)
        untouched = run.staging.clone()
        run.plan(oracle, step)
        for c, (g, m) in enumerate(zip(step.plan_rows, step.plan_mask, strict=True)):
            expected = untouched[c] if not m or g < 0 else (
                run.host[g] if g < sequence.host_rows else torch.zeros_like(untouched[c]))
            assert torch.equal(run.staging[c], expected)
        run.mirror_and_invalidate(oracle, step, index)
        for t, w in zip(step.written_tokens, step.written_slots, strict=True):
            if 0 <= t < len(step.request_state_indices) and step.request_state_indices[t] >= 0 and w >= 0:
                assert w not in run.dgi[step.request_state_indices[t]].tolist()


def test_shapes_cover_top_k_one_block_size_one_and_mtp_runs() -> None:
    assert {s.top_k for s in SHAPES} >= {1, 3, 8} and min(s.block_size for s in SHAPES) == 1
    assert max(s.queries for s in SHAPES) >= 3


# --------------------------------------------------------------------------------------------------------------
# Typed errors for bad arguments (nothing written).
# --------------------------------------------------------------------------------------------------------------


def _resolve_args(**overrides: Any) -> dict[str, Any]:
    model = example_a()
    out = ResolveOutputs(2, 3)
    args = {
        "host_cache": model.host,
        "hot_cache": model.hot_cache,
        "hot_block_table": model.hot_table,
        "global_indices": torch.tensor([[1, 6, 9], [0, 5, -1]], dtype=I32),
        "hot_indices": out.hot,
        "device_global_indices": model.dgi,
        "lru_slots": model.lru,
        "request_state_indices": model.states,
        "region_stride": 6,
        "max_union_rows": 3,
        "miss_mask": out.miss_mask,
        "stats": model.stats,
        "attention_indices": out.attention,
        "attention_block_stride": 4,
        "request_ids": torch.tensor([0, 1], dtype=I32),
        "source_block_table": model.source,
        "source_block_size": 4,
        "resolved_global_indices": out.resolved,
        "valid_counts": out.valid_counts,
        "swap_host_physical_rows": out.swap_host,
        "swap_device_physical_rows": out.swap_device,
        "swap_counts": out.swap_counts,
        "resident_block_table": model.resident,
        "resident_block_size": 4,
        "resident_null_block": 0,
    }
    args.update(overrides)
    return args


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"global_indices": torch.zeros(2, 3, dtype=torch.int64)},
            r"global_indices is torch.int64 \(2, 3\).*expected dtype torch.int32",
        ),
        ({"hot_indices": torch.zeros(2, 4, dtype=I32)}, r"hot_indices is .*\(2, 4\).*expected shape \(2, 3\)"),
        ({"lru_slots": torch.zeros(4, 6, dtype=I32)}, "lru_slots is torch.int32.*expected dtype torch.int16"),
        (
            {"region_stride": 7},
            r"region_stride is 7; expected an int in \[6, 6\] \(it must equal lru_slots.size\(1\)\)",
        ),
        ({"max_union_rows": 0}, r"max_union_rows is 0; expected an int in \[1, 6\]"),
        ({"max_union_rows": 7}, r"max_union_rows is 7; expected an int in \[1, 6\]"),
        ({"stats": torch.zeros(2, dtype=torch.int64)}, "stats is torch.int64.*expected dtype torch.uint64"),
        ({"attention_block_stride": 3}, r"attention_block_stride is 3; expected an int in \[4, inf\]"),
        (
            {"request_ids": None, "resident_block_table": None},
            "request_ids is None; expected a tensor because source_block_table is given",
        ),
        ({"swap_counts": None}, "swap_counts is None; expected a tensor because swap_host_physical_rows is given"),
        ({"resident_block_size": 2}, r"resident_block_size is 2; expected an int in \[4, 4\]"),
        (
            {"hot_cache": torch.zeros(4, 4, 12, dtype=torch.uint8)},
            "hot_cache is .*expected rows of a positive multiple of 16 bytes",
        ),
        ({"hot_cache": torch.zeros(16, 16, dtype=torch.uint8)}, "hot_cache is .*expected a 3-D paged cache"),
        ({"hot_block_table": torch.zeros(2, 1, dtype=I32)}, r"hot_block_table is .*expected at least 2 columns"),
        (
            {"global_indices": torch.zeros(3, 2, dtype=I32).t()},
            "global_indices is .*expected stride 1 in the last dimension",
        ),
        ({"region_stride": 6.0}, "region_stride is float 6.0; expected a Python int"),
        ({"valid_counts": [0, 0]}, "valid_counts is list .*expected a torch.Tensor or None"),
        (
            {
                "lru_slots": torch.zeros(4, 2, dtype=torch.int16),
                "device_global_indices": torch.zeros(4, 2, dtype=I32),
                "region_stride": 2,
            },
            r"lru_slots is 2 slots per state row; expected at least top_k = 3 slots",
        ),
    ],
)
def test_resolve_rejects_bad_arguments_with_a_message_naming_the_value(overrides: dict, message: str) -> None:
    args = _resolve_args(**overrides)
    before = {name: value.clone() for name, value in args.items() if isinstance(value, torch.Tensor)}
    with pytest.raises(InvalidArgumentError, match=message):
        oracle.resolve_residency(**args)
    for name, value in before.items():
        assert torch.equal(args[name], value), f"{name} changed although the call was rejected"


def test_resolve_rejects_a_tensor_on_another_device() -> None:
    meta = torch.zeros(2, 3, dtype=I32, device="meta")
    with pytest.raises(
        InvalidArgumentError,
        match=re.escape("hot_indices is torch.int32 (2, 3) strides (3, 1) on meta; expected a tensor on cpu"),
    ):
        oracle.resolve_residency(**_resolve_args(hot_indices=meta))


def test_gather_compact_rejects_mismatched_row_bytes_and_short_counts() -> None:
    host, hot = _caches()
    plan = torch.zeros(2, 2, dtype=I32)
    with pytest.raises(InvalidArgumentError, match="hot_cache is 32-byte rows; expected the host cache's row size"):
        oracle.gather_compact(host, torch.zeros(2, 2, 32, dtype=torch.uint8), plan, plan, torch.zeros(2, dtype=I32))
    with pytest.raises(InvalidArgumentError, match="miss_counts is .*expected at least 2 elements"):
        oracle.gather_compact(host, hot, plan, plan, torch.zeros(1, dtype=I32))


def test_gather_plan_rejects_short_request_state_indices() -> None:
    host, hot = _caches()
    plan = torch.zeros(2, 2, dtype=I32)
    with pytest.raises(InvalidArgumentError, match="request_state_indices is .*expected at least 2 elements"):
        oracle.gather_plan(host, hot, plan, plan, plan, torch.zeros(1, dtype=I32), None, 0)


def test_invalidate_rejects_int32_written_slots_and_length_mismatch() -> None:
    dgi, ids = torch.zeros(2, 3, dtype=I32), torch.zeros(2, dtype=I32)
    with pytest.raises(InvalidArgumentError, match="written_slots is torch.int32 .*expected dtype torch.int64"):
        oracle.invalidate_written_slots(dgi, ids, ids, torch.zeros(2, dtype=I32))
    with pytest.raises(InvalidArgumentError, match="written_slots is .*expected 2 elements, one per entry"):
        oracle.invalidate_written_slots(dgi, ids, ids, torch.zeros(3, dtype=torch.int64))
