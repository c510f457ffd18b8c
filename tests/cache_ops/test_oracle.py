"""The worked examples of docs/design/cache-ops.md (design note §3.3-3.6), each decision we took where vLLM is
silent, and the typed errors (nothing written on error), in the oracle and every implementation.

``ops`` runs each test through the oracle, torch_impl and host_impl; tests/cache_ops/test_triton_impl.py runs them
again through the Triton kernels (interpreter) by importing them with its own ``ops`` fixture."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from hisparse_hal.cache_ops import host_impl, oracle, tables, torch_impl
from hisparse_hal.errors import InvalidArgumentError, UnionOverflowError, UnknownTableError
from hisparse_hal.testing.sequences import POISON as P
from tests.cache_ops.model import I32, Model
from tests.cache_ops.poisoned_outputs import ResolveOutputs


@pytest.fixture(params=[oracle, torch_impl, host_impl], ids=["oracle", "torch", "host"])
def ops(request: pytest.FixtureRequest) -> Any:
    return request.param


def decode_world(**overrides: object) -> Model:
    """One request (batch row 0) on state row 1 of 2; hot blocks 1, 2 (slots 0-3 -> rows 4-7, 4-7 -> 8-11);
    source pages 0..3 -> host blocks 0 (null), 2, 3, 5."""
    settings = dict(block=4, top_k=4, hot_size=8, union=4, states=2, hot_table=[[1, 2]], source=[[0, 2, 3, 5]],
                    request_state_indices=[1])
    settings.update(overrides)
    return Model(**settings)  # type: ignore[arg-type]


def test_example_1_two_decode_steps_load_misses_into_the_oldest_slots_then_hit_and_rotate_the_lru(ops: Any) -> None:
    world = decode_world()
    out = world.step(ops, [[4, 5, 0, -1]], [0])  # tokens 4, 5 -> host rows 8, 9; token 0 is on the null block
    assert out.hot.tolist() == [[4, 5, -1, -1]]
    assert out.attention.tolist() == [[4, 5, -1, -1]]
    assert out.valid_counts.tolist() == [2]
    assert out.swap_host.tolist() == [[8, 9, P, P]] and out.swap_device.tolist() == [[4, 5, P, P]]
    assert out.swap_counts.tolist() == [2]
    dgi, lru, stats = world.state()
    assert dgi == [[-1] * 8, [8, 9, -1, -1, -1, -1, -1, -1]]  # state row 1 only
    assert lru == [list(range(8)), [2, 3, 4, 5, 6, 7, 0, 1]]
    assert stats == [0, 2]

    out = world.step(ops, [[5, 6, 4, -1]], [0])  # 9 and 8 hit, 10 misses into slot 2
    assert out.hot.tolist() == [[5, 6, 4, -1]]
    assert out.swap_host.tolist() == [[10, P, P, P]] and out.swap_counts.tolist() == [1]
    dgi, lru, stats = world.state()
    assert dgi[1] == [8, 9, 10, -1, -1, -1, -1, -1]
    assert lru[1] == [3, 4, 5, 6, 7, 2, 0, 1]  # evictables[M:] + evictables[:M] + hits
    assert stats == [2, 3]


def test_example_2_two_identical_verification_rows_give_stats_top_k_top_k(ops: Any) -> None:
    world = decode_world()
    out = world.step(ops, [[4, 5, 6, 7], [4, 5, 6, 7]], [0, 0])
    assert out.hot.tolist() == [[4, 5, 6, 7], [4, 5, 6, 7]]
    assert out.swap_counts.tolist() == [4, 0]
    assert world.state()[2] == [4, 4]  # [top_k, top_k]: the second row's references are hits


def test_example_3_a_run_spills_its_misses_into_the_next_rows_flat_segment(ops: Any) -> None:
    world = decode_world(top_k=2)
    out = world.step(ops, [[4, 5], [6, 7]], [0, 0])
    assert out.swap_host.tolist() == [[8, 9], [10, 11]]
    assert out.swap_device.tolist() == [[4, 5], [6, 7]]
    assert out.swap_counts.tolist() == [2, 2]  # clamp(M - j * top_k, 0, top_k)


def test_example_4_rows_past_num_valid_rows_are_padding_whatever_their_stale_request_ids(ops: Any) -> None:
    world = decode_world()
    out = world.step(ops, [[4, 5, -1, -1], [6, 7, -1, -1], [8, 9, -1, -1]], [0, 0, 0], num_valid_rows=1)
    assert out.hot.tolist() == [[4, 5, -1, -1], [-1] * 4, [-1] * 4]
    assert out.valid_counts.tolist() == [2, 0, 0] and out.swap_counts.tolist() == [2, 0, 0]
    assert world.state()[2] == [0, 2]  # only row 0 loaded


def test_example_5_resident_pages_are_looked_up_by_state_row_and_not_counted(ops: Any) -> None:
    # State row 1's page 1 is resident in block 7 (rows 28-31); state row 0's table would say block 9.
    world = decode_world(resident=[[0, 9, 0, 0], [0, 7, 0, 0]])
    out = world.step(ops, [[4, 5, 8, -1]], [0])  # 4, 5 resident; 8 is host row 12
    assert out.hot.tolist() == [[28, 29, 4, -1]]
    assert out.valid_counts.tolist() == [3]
    assert out.swap_host.tolist() == [[12, P, P, P]]
    assert world.state()[2] == [0, 1]


def test_example_6_an_out_of_range_lru_victim_trips_the_wire_without_writing_the_dgi(ops: Any) -> None:
    world = decode_world()
    world.lru[1, 0] = 99
    out = world.step(ops, [[4, 5, -1, -1]], [0])
    assert out.hot.tolist() == [[-1, 5, -1, -1]]  # the invalid entry's references get -1
    assert out.swap_host.tolist() == [[8, 9, P, P]] and out.swap_device.tolist() == [[-1, 5, P, P]]
    assert out.swap_counts.tolist() == [2]  # M counts invalid misses
    dgi, lru, stats = world.state()
    assert dgi[1] == [-1, 9, -1, -1, -1, -1, -1, -1]
    assert lru[1] == [2, 3, 4, 5, 6, 7, 99, 1]
    assert stats == [0, 1]


def test_example_7_a_slot_the_corrupted_lru_lost_still_serves_its_row_as_in_vllms_slot_scan(ops: Any) -> None:
    # Issue 29: after example 1's first step slot 0 holds host row 8; the LRU loses it (99 in its place).
    # vLLM scans every slot of the DGI for hits (hisparse_kernels.cu:574-609), so row 8 is served from slot 0.
    world = decode_world()
    world.step(ops, [[4, 5, 0, -1]], [0])
    world.lru[1, 6] = 99
    assert world.state()[1][1] == [2, 3, 4, 5, 6, 7, 99, 1]
    out = world.step(ops, [[4, 5, -1, -1]], [0])
    assert out.hot.tolist() == [[4, 5, -1, -1]]
    assert out.swap_host.tolist() == [[P] * 4] and out.swap_device.tolist() == [[P] * 4]
    assert out.swap_counts.tolist() == [0]
    dgi, lru, stats = world.state()
    assert dgi[1] == [8, 9, -1, -1, -1, -1, -1, -1]  # row 8 is not loaded a second time
    assert lru[1] == [2, 3, 4, 5, 6, 7, 99, 1]  # slot 0 stays lost; the lost 99 is evictable
    assert stats == [2, 2]  # step 1's [0, 2] plus [2, 0]: two hits, no load


def test_decision_d3_a_row_held_by_two_slots_is_served_by_the_later_slot_in_slot_order(ops: Any) -> None:
    world = decode_world()
    world.dgi[1] = torch.tensor([8, -1, -1, -1, -1, 8, -1, -1], dtype=I32)
    world.lru[1] = torch.tensor([5, 0, 1, 2, 3, 4, 6, 7], dtype=torch.int16)  # slot 5 is older than slot 0
    out = world.step(ops, [[4, -1, -1, -1]], [0])
    assert out.hot.tolist() == [[9, -1, -1, -1]]  # slot 5 = hot row 9, whatever the LRU order
    dgi, lru, stats = world.state()
    assert dgi[1] == [8, -1, -1, -1, -1, 8, -1, -1]
    assert lru[1] == [1, 2, 3, 4, 6, 7, 5, 0]  # both slots are hits, at the most recently used end
    assert stats == [1, 0]


def test_decision_d5_misses_past_the_evictables_take_hit_slots_from_the_most_recent_end(ops: Any) -> None:
    # LRU lost slot 0 (holding 8) and names slot 1 (holding 9) twice: 2 hit entries, 6 evictables, 7 misses.
    # vLLM reads victim m at s_lru_out[H - 1 - m] (hisparse_kernels.cu:733): the 7th miss takes hit slot 1.
    world = decode_world(union=8)
    world.dgi[1] = torch.tensor([8, 9, -1, -1, -1, -1, -1, -1], dtype=I32)
    world.lru[1] = torch.tensor([1, 2, 3, 4, 5, 6, 7, 1], dtype=torch.int16)
    out = world.step(ops, [[5, 6, 7, 8], [9, 10, 11, 12]], [0, 0])  # host rows 9-15 and 20
    assert out.hot.tolist() == [[5, 6, 7, 8], [9, 10, 11, 5]]
    assert out.swap_host.tolist() == [[10, 11, 12, 13], [14, 15, 20, P]]
    assert out.swap_device.tolist() == [[6, 7, 8, 9], [10, 11, 5, P]]
    assert out.swap_counts.tolist() == [4, 3]
    dgi, lru, stats = world.state()
    assert dgi[1] == [8, 20, 10, 11, 12, 13, 14, 15]  # lost slot 0 is never evicted
    assert lru[1] == [3, 4, 5, 6, 7, 1, 1, 1]  # V[M - E:M] + hits, V = evictables + hits reversed
    assert stats == [1, 7]


def test_decision_d9_a_victim_named_twice_by_the_lru_ends_holding_the_later_miss(ops: Any) -> None:
    world = decode_world()
    world.lru[1] = torch.tensor([3, 3, 0, 1, 2, 4, 5, 6], dtype=torch.int16)  # slot 7 lost, slot 3 twice
    out = world.step(ops, [[4, 5, -1, -1]], [0])
    assert out.hot.tolist() == [[7, 7, -1, -1]]
    assert out.swap_host.tolist() == [[8, 9, P, P]] and out.swap_device.tolist() == [[7, 7, P, P]]
    dgi, lru, stats = world.state()
    assert dgi[1] == [-1, -1, -1, 9, -1, -1, -1, -1]
    assert lru[1] == [0, 1, 2, 4, 5, 6, 3, 3]
    assert stats == [0, 2]


def test_a_run_without_host_rows_writes_indices_and_leaves_state_and_stats_alone(ops: Any) -> None:
    world = decode_world()
    out = world.step(ops, [[0, 1, -1, 99]], [0])  # null block, -1, past the source table
    assert out.hot.tolist() == [[-1] * 4] and out.valid_counts.tolist() == [0] and out.swap_counts.tolist() == [0]
    assert world.state() == ([[-1] * 8] * 2, [list(range(8))] * 2, [0, 0])


def test_decision_d1_a_later_run_on_a_claimed_state_row_is_padding(ops: Any) -> None:
    world = decode_world(hot_table=[[1, 2], [3, 4]], source=[[0, 2, 3, 5], [0, 6, 7, 8]],
                        request_state_indices=[1, 1])
    out = world.step(ops, [[4, -1, -1, -1], [4, -1, -1, -1]], [0, 1])
    assert out.hot.tolist() == [[4, -1, -1, -1], [-1] * 4]
    assert out.swap_counts.tolist() == [1, 0]


def test_decision_d4_in_row_duplicates_share_one_entry_and_count_as_hits_after_the_first(ops: Any) -> None:
    world = decode_world()
    out = world.step(ops, [[4, 4, 5, -1]], [0])
    assert out.hot.tolist() == [[4, 4, 5, -1]]
    assert world.state()[2] == [1, 2]


def test_decision_d6_stats_wrap_modulo_two_to_the_64_and_int64_stats_work_too(ops: Any) -> None:
    world = decode_world()
    world.stats.view(torch.int64).copy_(torch.tensor([-1, -2]))  # 2**64 - 1, 2**64 - 2
    world.step(ops, [[4, 5, 4, -1], [-1] * 4], [0, 0])
    assert world.state()[2] == [0, 0]
    world.stats = torch.zeros(2, dtype=torch.int64)
    world.step(ops, [[6, -1, -1, -1]], [0])
    assert world.stats.tolist() == [0, 1]


def test_union_over_max_union_rows_raises_a_typed_error_naming_the_run_and_writes_nothing(ops: Any) -> None:
    world = decode_world(union=2, hot_table=[[1, 2], [3, 4]], source=[[0, 2, 3, 5], [0, 6, 7, 8]],
                        request_state_indices=[0, 1])
    out = ResolveOutputs(2, 4)
    before = world.state()
    with pytest.raises(UnionOverflowError, match=r"request 1 \(state row 1\) selects 3 distinct host rows.*"
                       r"max_union_rows = 2; nothing was written") as caught:
        ops.resolve_residency(*world.args([[4, 5, -1, -1], [4, 5, 6, -1]], [0, 1], out))
    assert (caught.value.state_row, caught.value.request, caught.value.union_rows) == (1, 1, 3)
    assert isinstance(caught.value, InvalidArgumentError)
    assert out.snapshot() == ResolveOutputs(2, 4).snapshot()  # request 0 fitted, yet nothing was written
    assert world.state() == before


def test_gather_plan_copies_masked_entries_zero_fills_past_the_host_and_skips_bad_ones(ops: Any) -> None:
    host = torch.arange(1, 4 * 16 + 1, dtype=torch.uint8).view(4, 16)
    slab = torch.full((3, 3, 16), 200, dtype=torch.uint8)
    hot = slab[:, :2]  # block stride 48 bytes, rows of 16: non-contiguous blocks
    sources = torch.tensor([[0, 3, 9, -1, 2, 1]], dtype=I32)
    targets = torch.tensor([[0, 3, 5, 1, 6, 2]], dtype=I32)
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]], dtype=I32)
    ops.gather_plan(host, hot, sources, targets, mask)
    assert hot[0, 0].tolist() == host[0].tolist() and hot[1, 1].tolist() == host[3].tolist()
    assert hot[2, 1].tolist() == [0] * 16  # host row 9 is past the host cache: zeros
    assert hot[0, 1].tolist() == [200] * 16  # source -1 skipped
    assert hot[1, 0].tolist() == [200] * 16  # masked off
    assert slab[:, 2].tolist() == [[[200] * 16] * 1][0] * 3  # the other layer's rows are untouched


def test_gather_compact_clamps_counts_and_a_repeated_destination_ends_with_the_later_entry(ops: Any) -> None:
    host = torch.arange(1, 6 * 16 + 1, dtype=torch.uint8).view(6, 16)
    hot = torch.full((2, 2, 16), 200, dtype=torch.uint8)
    sources = torch.tensor([[1, 2], [3, 4], [5, 0], [0, 1]], dtype=I32)
    targets = torch.tensor([[0, 1], [1, 2], [3, 3], [9, -1]], dtype=I32)
    ops.gather_compact(host, hot, sources, targets, torch.tensor([7, 1, -3, 2], dtype=I32))
    flat = hot.view(4, 16)
    assert flat[0].tolist() == host[1].tolist()
    assert flat[1].tolist() == host[3].tolist()  # row 1's entry came later
    assert flat[2].tolist() == [200] * 16  # row 1 count 1: its second entry is not copied
    assert flat[3].tolist() == [200] * 16  # count -3: nothing


def test_invalidate_clears_matching_slots_in_every_named_table_once_per_duplicate_address(ops: Any) -> None:
    first = torch.tensor([[5, 7, 5, -1], [7, 7, 1, 2]], dtype=I32)
    second = torch.tensor([[7, 5, 0, 0], [1, 7, 3, 7]], dtype=I32)
    other_shape = torch.full((3, 4), 7, dtype=I32)
    for table in (first, second, other_shape):
        tables.register_table(table)
    pointers = torch.tensor([first.data_ptr(), second.data_ptr(), first.data_ptr()], dtype=torch.int64)
    rsi = torch.tensor([1, 0, -1], dtype=I32)
    tokens = torch.tensor([1, 0, 2, 5, 0], dtype=I32)
    slots = torch.tensor([5, 7, 1, 1, 2**32 + 3], dtype=torch.int64)
    ops.invalidate_written_slots(pointers, rsi, tokens, slots, 2, 4)
    assert first.tolist() == [[-1, 7, -1, -1], [-1, -1, 1, 2]]
    assert second.tolist() == [[7, -1, 0, 0], [1, -1, 3, -1]]
    assert other_shape.tolist() == [[7] * 4] * 3


def test_invalidate_refuses_an_unknown_or_wrongly_shaped_table_address_before_writing(ops: Any) -> None:
    known = torch.tensor([[5, 5]], dtype=I32)
    wide = torch.tensor([[5, 5, 5]], dtype=I32)
    tables.register_table(known)
    tables.register_table(wide)
    args = (torch.tensor([0], dtype=I32), torch.tensor([0], dtype=I32), torch.tensor([5], dtype=torch.int64), 1, 2)
    for address in (wide.data_ptr(), 12345):
        pointers = torch.tensor([known.data_ptr(), address], dtype=torch.int64)
        with pytest.raises(UnknownTableError, match=rf"device_global_indices_ptrs\[1\] = {address:#x} is no "
                           r"registered \[1, 2\] int32 .*nothing was written"):
            ops.invalidate_written_slots(pointers, *args)
        assert known.tolist() == [[5, 5]] and wide.tolist() == [[5, 5, 5]]


@pytest.mark.parametrize(("position", "value", "message"), [
    (3, torch.zeros(1, 4, dtype=torch.int64), r"global_indices is torch.int64 .*expected dtype torch.int32"),
    (4, torch.zeros(2, 4, dtype=I32), r"hot_indices is .*\(2, 4\).*expected shape \(1, 4\)"),
    (8, 9, r"region_stride is 9; expected an int in \[8, 8\]"),
    (9, 9, r"max_union_rows is 9; expected an int in \[1, 8\]"),
    (1, torch.zeros(64, 16, dtype=torch.uint8), r"hot_cache is .*expected a 3-D paged cache"),
    (22, torch.tensor([1], dtype=torch.int64), r"num_valid_rows is torch.int64 .*expected dtype torch.int32"),
    (22, torch.tensor([1, 1], dtype=I32), r"num_valid_rows is .*expected one int32 element"),
    (10, torch.zeros(2, dtype=torch.float32), r"stats is torch.float32 .*expected dtype torch.uint64"),
    (17, None, r"swap_host_physical_rows is None; expected a tensor because swap_device_physical_rows is given"),
    (2, torch.zeros(1, 1, dtype=I32), r"hot_block_table is .*expected at least 2 columns"),
])
def test_resolve_rejects_a_bad_argument_naming_it_and_writes_nothing(ops: Any, position: int, value: object,
                                                                     message: str) -> None:
    world = decode_world()
    out = ResolveOutputs(1, 4)
    args = list(world.args([[4, 5, -1, -1]], [0], out, num_valid_rows=1))
    args[position] = value
    before = world.state()
    with pytest.raises(InvalidArgumentError, match=message):
        ops.resolve_residency(*args)
    assert out.snapshot() == ResolveOutputs(1, 4).snapshot() and world.state() == before


def test_num_valid_rows_without_request_ids_is_refused(ops: Any) -> None:
    world = decode_world()
    out = ResolveOutputs(1, 4)
    args = list(world.args([[4, 5, -1, -1]], [0], out, num_valid_rows=1))
    args[13] = args[14] = None
    with pytest.raises(InvalidArgumentError, match=r"request_ids is None; expected a tensor: num_valid_rows"):
        ops.resolve_residency(*args)
