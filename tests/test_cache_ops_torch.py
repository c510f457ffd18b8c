"""The vectorized torch cache ops: worked examples, differential runs against the oracle, no host sync."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from host_sync_guard import HostSyncError, no_host_sync
from poisoned_outputs import ResolveOutputs

from hisparse_hal.cache_ops import oracle, torch_impl
from hisparse_hal.cache_ops.sequences import POISON as POISON_SEQ
from hisparse_hal.cache_ops.sequences import SHAPES, SequenceShape, StepRecord, build_sequence, run_sequence
from hisparse_hal.errors import InvalidArgumentError

I32 = torch.int32
POISON = -999


# --------------------------------------------------------------------------------------------------------------
# Worked examples of docs/design/cache-ops.md (research §2.7 and §2.8), with the expected values written out.
# --------------------------------------------------------------------------------------------------------------


class _ExampleA:
    """Two single-row requests A (batch row 0, state 2) and B (batch row 1, state 3); B=4, K=3, H=6."""

    block, top_k, hot_size = 4, 3, 6

    def __init__(self) -> None:
        self.host = torch.zeros(64, 16, dtype=torch.uint8)
        self.hot_cache = torch.zeros(40, self.block, 16, dtype=torch.uint8)
        self.hot_block_table = torch.tensor([[20, 21], [30, 31]], dtype=I32)
        self.source = torch.tensor([[5, 9, 3], [7, 2, 11]], dtype=I32)
        self.resident = torch.zeros(4, 3, dtype=I32)
        self.resident[0, 2] = 10  # A's page 2 lives in GPU block 10 (row 0 = batch row, row 2 = state row)
        self.resident[2, 2] = 10
        self.state_of_request = torch.tensor([2, 3, -1, -1], dtype=I32)
        self.dgi = torch.full((4, self.hot_size), -1, dtype=I32)
        self.lru = torch.arange(self.hot_size, dtype=torch.int16).repeat(4, 1)
        self.stats = torch.zeros(2, dtype=torch.uint64)
        self.flags = torch.zeros(1, dtype=I32)

    def step(self, topk: list[list[int]]) -> ResolveOutputs:
        out = ResolveOutputs(2, self.top_k, POISON)
        torch_impl.resolve_residency(
            self.host, self.hot_cache, self.hot_block_table, torch.tensor(topk, dtype=I32), out.hot, self.dgi,
            self.lru, self.state_of_request, self.hot_size, 3, out.miss_mask, self.stats, out.attention, 4,
            torch.tensor([0, 1], dtype=I32), self.source, self.block, out.resolved, out.valid_counts,
            out.swap_host, out.swap_device, out.swap_counts, self.resident, self.block, 0, error_flags=self.flags,
        )
        return out


def _stats(stats: torch.Tensor) -> list[int]:
    return stats.view(torch.int64).tolist()


def test_resolve_example_a_step_one_loads_misses_into_oldest_slots_and_serves_resident_page() -> None:
    example = _ExampleA()
    out = example.step([[1, 6, 9], [0, 5, -1]])
    assert out.hot.tolist() == [[80, 81, 41], [120, 121, -1]]
    assert out.attention.tolist() == [[80, 81, 41], [120, 121, -1]]
    assert out.resolved.tolist() == [[21, 38, 13], [28, 9, -1]]
    assert out.valid_counts.tolist() == [3, 2]
    assert out.miss_mask.tolist() == [[1, 1, 0], [1, 1, 0]]
    assert out.swap_counts.tolist() == [2, 2]
    assert out.swap_host[:, :2].tolist() == [[21, 38], [28, 9]]
    assert out.swap_device[:, :2].tolist() == [[80, 81], [120, 121]]
    assert out.swap_host[:, 2].tolist() == [POISON, POISON], "entries past the count must stay untouched"
    assert example.dgi[2:].tolist() == [[21, 38, -1, -1, -1, -1], [28, 9, -1, -1, -1, -1]]
    assert example.lru[2:].tolist() == [[2, 3, 4, 5, 0, 1], [2, 3, 4, 5, 0, 1]]
    assert example.dgi[:2].tolist() == [[-1] * 6] * 2, "state rows 0 and 1 belong to nobody this step"
    assert _stats(example.stats) == [0, 4]
    assert example.flags.tolist() == [0]


def test_resolve_example_a_three_steps_keep_hits_and_rotate_lru() -> None:
    example = _ExampleA()
    example.step([[1, 6, 9], [0, 5, -1]])
    second = example.step([[6, 2, 1], [5, 4, 0]])
    assert second.hot.tolist() == [[81, 82, 80], [121, 122, 120]]
    assert second.swap_counts.tolist() == [1, 1]
    assert second.swap_host[:, 0].tolist() == [22, 8]
    assert second.swap_device[:, 0].tolist() == [82, 122]
    assert example.lru[2:].tolist() == [[3, 4, 5, 2, 0, 1], [3, 4, 5, 2, 0, 1]]
    assert _stats(example.stats) == [4, 6]
    third = example.step([[3, 0, 7], [8, 9, 5]])
    assert third.hot.tolist() == [[83, 84, 85], [123, 124, 121]]
    assert third.swap_counts.tolist() == [3, 2]
    assert example.dgi[2:].tolist() == [[21, 38, 22, 23, 20, 39], [28, 9, 8, 44, 45, -1]]
    assert example.lru[2:].tolist() == [[2, 0, 1, 3, 4, 5], [5, 2, 0, 3, 4, 1]]
    assert _stats(example.stats) == [5, 11]


def _example_b_step(state: dict[str, torch.Tensor], topk: list[list[int]]) -> ResolveOutputs:
    out = ResolveOutputs(3, 3, POISON)
    torch_impl.resolve_residency(
        state["host"], state["hot"], torch.tensor([[6, 7, 8]], dtype=I32), torch.tensor(topk, dtype=I32), out.hot,
        state["dgi"], state["lru"], torch.tensor([1], dtype=I32), 9, 6, out.miss_mask, state["stats"], None, 0,
        torch.tensor([0, 0, -1], dtype=I32), torch.tensor([[1, 2, 3, 4]], dtype=I32), 4, None, None, out.swap_host,
        out.swap_device, out.swap_counts, None, 0, 0,
    )
    return out


def test_resolve_example_b_mtp_rows_share_one_union_and_spill_swaps_into_later_rows() -> None:
    state = {
        "host": torch.zeros(64, 16, dtype=torch.uint8),
        "hot": torch.zeros(16, 4, 16, dtype=torch.uint8),
        "dgi": torch.full((2, 9), -1, dtype=I32),
        "lru": torch.arange(9, dtype=torch.int16).repeat(2, 1),
        "stats": torch.zeros(2, dtype=torch.uint64),
    }
    first = _example_b_step(state, [[2, 3, 4], [3, 5, 6], [7, 7, 7]])
    assert first.hot.tolist() == [[24, 25, 26], [25, 27, 28], [-1, -1, -1]]
    assert first.miss_mask.tolist() == [[1, 1, 1], [0, 1, 1], [POISON] * 3], "padding rows keep miss_mask"
    assert first.swap_host[:2].tolist() == [[6, 7, 8], [9, 10, POISON]]
    assert first.swap_device[:2].tolist() == [[24, 25, 26], [27, 28, POISON]]
    assert first.swap_counts.tolist() == [3, 2, 0]
    assert state["lru"][1].tolist() == [5, 6, 7, 8, 0, 1, 2, 3, 4]
    assert _stats(state["stats"]) == [1, 5]
    second = _example_b_step(state, [[3, 8, 2], [5, 9, -1], [7, 7, 7]])
    assert second.hot.tolist() == [[25, 29, 24], [27, 30, -1], [-1, -1, -1]]
    assert second.swap_counts.tolist() == [2, 0, 0]
    assert second.swap_host[0, :2].tolist() == [12, 13]
    assert second.swap_device[0, :2].tolist() == [29, 30]
    assert state["lru"][1].tolist() == [7, 8, 2, 4, 5, 6, 0, 1, 3]
    assert state["dgi"][0].tolist() == [-1] * 9
    assert _stats(state["stats"]) == [4, 7]


# --------------------------------------------------------------------------------------------------------------
# No host synchronisation: what a CUDA/HIP graph capture needs, checked on the CPU.
# --------------------------------------------------------------------------------------------------------------


_mask = torch.tensor([True, False, True])
_values = torch.tensor([3, 1, 2])


@pytest.mark.parametrize(
    ("pattern", "call"),
    [
        ("item", lambda: _values[0].item()),
        ("tolist", lambda: _values.tolist()),
        ("branch on a value", lambda: bool(_values.any())),
        ("int of a value", lambda: int(_values.sum())),
        ("nonzero", lambda: _values.nonzero()),
        ("single-argument where", lambda: torch.where(_mask)),
        ("unique", lambda: torch.unique(_values)),
        ("boolean-mask indexing", lambda: _values[_mask]),
        ("boolean-mask assignment", lambda: _values.clone().__setitem__(_mask, 0)),
        ("masked_select", lambda: torch.masked_select(_values, _mask)),
    ],
)
def test_no_host_sync_guard_catches_each_syncing_pattern(pattern: str, call: Any) -> None:
    with pytest.raises(HostSyncError, match="host|data-dependent"):
        with no_host_sync():
            call()


def test_no_host_sync_guard_lets_fixed_shape_ops_through() -> None:
    with no_host_sync():
        out = torch.where(_mask, _values, -1).cumsum(0)
    assert out.tolist() == [3, 2, 4]


def test_torch_ops_read_no_device_value_on_the_host_over_three_steps() -> None:
    example = _ExampleA()
    rows = [[[1, 6, 9], [0, 5, -1]], [[6, 2, 1], [5, 4, 0]], [[3, 0, 7], [8, 9, 5]]]
    with no_host_sync():
        for topk in rows:
            out = example.step(topk)
            torch_impl.gather_compact(example.host, example.hot_cache, out.swap_host, out.swap_device,
                                      out.swap_counts)
            torch_impl.gather_plan(example.host, example.hot_cache, out.resolved, out.hot, out.miss_mask,
                                   example.state_of_request, out.attention, 4)
        torch_impl.invalidate_written_slots(example.dgi, example.state_of_request, torch.tensor([0, 1], dtype=I32),
                                            torch.tensor([21, 9]))
    assert example.dgi[2:].tolist() == [[-1, 38, 22, 23, 20, 39], [28, -1, 8, 44, 45, -1]]


# --------------------------------------------------------------------------------------------------------------
# Differential runs against the oracle over generated multi-step decode sequences.
# --------------------------------------------------------------------------------------------------------------


def _first_difference(ours: list[StepRecord], reference: list[StepRecord]) -> str:
    """Where two recordings of one sequence first differ (step and field), for a readable failure."""
    for step, (a, b) in enumerate(zip(ours, reference, strict=False)):
        for field in ("outputs", "dgi", "lru", "stats", "error_flags", "hot_bytes", "staging_bytes",
                      "dgi_after_invalidate"):
            mine, theirs = getattr(a, field), getattr(b, field)
            if field == "outputs":
                for name in theirs:
                    if mine[name] != theirs[name]:
                        return f"step {step} {name}: torch {mine[name]} != oracle {theirs[name]}"
            elif mine != theirs:
                return f"step {step} {field}: torch {mine} != oracle {theirs}"
    return "different number of steps" if len(ours) != len(reference) else ""


def _assert_matches_oracle(seeds: range, shape: SequenceShape) -> list[list[StepRecord]]:
    recordings = []
    for seed in seeds:
        sequence = build_sequence(seed, shape)
        ours, reference = run_sequence(torch_impl, sequence), run_sequence(oracle, sequence)
        assert ours == reference, f"seed {seed}, {shape}: {_first_difference(ours, reference)}"
        recordings.append(reference)
    return recordings


# 6 shapes x 200 seeds = 1,200 sequences here (plus 120 with outputs left None);
# test_cache_ops_library.py runs 800 more through torch.ops.
SEEDS_PER_SHAPE = 200


@pytest.mark.parametrize("shape", SHAPES, ids=[f"shape{i}" for i in range(len(SHAPES))])
def test_torch_equals_oracle_on_every_output_and_state_over_generated_sequences(shape: SequenceShape) -> None:
    index = SHAPES.index(shape)
    recordings = _assert_matches_oracle(range(index * 10_000, index * 10_000 + SEEDS_PER_SHAPE), shape)
    steps = [step for recording in recordings for step in recording]
    # The sequences must reach the cases this test exists for, or a pass would prove little.
    flags = {step.error_flags for step in steps}
    padded = sum(row == [-1] * shape.top_k for step in steps for row in step.outputs["hot_indices"])
    untouched = sum(POISON_SEQ in row for step in steps for row in step.outputs["miss_mask"])
    multi_row_swaps = sum(
        count > 0 for step in steps for r, count in enumerate(step.outputs["swap_counts"]) if r > 0
    )
    assert padded > 0 and untouched > 0, "padding rows (outputs -1, miss_mask untouched) must occur"
    assert any(flag & oracle.FLAG_LRU_TRIPWIRE for flag in flags), "a corrupted LRU victim must occur"
    if shape.queries * shape.top_k > 1:
        assert any(flag & oracle.FLAG_UNION_OVERFLOW for flag in flags), "some run must overflow max_union_rows"
    if shape.queries > 1:
        assert multi_row_swaps > 0, "an MTP run must spill swaps into its later rows"



class _WithoutOutputs:
    """An implementation called with some optional resolve outputs left None (the rest of its ops unchanged)."""

    def __init__(self, ops: Any, dropped: tuple[int, ...]) -> None:
        def resolve(*args: Any, **kwargs: Any) -> None:
            ops.resolve_residency(*(None if i in dropped else a for i, a in enumerate(args)), **kwargs)

        self.resolve_residency: Callable[..., None] = resolve
        self.gather_compact: Callable[..., None] = ops.gather_compact
        self.gather_plan: Callable[..., None] = ops.gather_plan
        self.invalidate_written_slots: Callable[..., None] = ops.invalidate_written_slots


# Positions in vLLM's argument list: miss_mask 10, stats 11, attention 12, resolved 17, valid_counts 18, swaps 19-21.
VLLM_CALL = (10, 17)  # what HiSparseRuntime._resolve_residency leaves None
BARE_CALL = (10, 11, 12, 17, 18, 19, 20, 21)


@pytest.mark.parametrize("dropped", [VLLM_CALL, BARE_CALL], ids=["vllm-call", "no-optional-outputs"])
def test_torch_equals_oracle_when_optional_outputs_are_none(dropped: tuple[int, ...]) -> None:
    for seed in range(900_000, 900_060):
        sequence = build_sequence(seed, SHAPES[seed % len(SHAPES)])
        ours = run_sequence(_WithoutOutputs(torch_impl, dropped), sequence)
        reference = run_sequence(_WithoutOutputs(oracle, dropped), sequence)
        assert ours == reference, f"seed {seed}: {_first_difference(ours, reference)}"



class _WithoutHostSync:
    """torch_impl with every op call run under :class:`no_host_sync`."""

    def __init__(self) -> None:
        self.resolve_residency = self._guarded(torch_impl.resolve_residency)
        self.gather_compact = self._guarded(torch_impl.gather_compact)
        self.gather_plan = self._guarded(torch_impl.gather_plan)
        self.invalidate_written_slots = self._guarded(torch_impl.invalidate_written_slots)

    @staticmethod
    def _guarded(op: Callable[..., None]) -> Callable[..., None]:
        def call(*args: Any, **kwargs: Any) -> None:
            with no_host_sync():
                op(*args, **kwargs)

        return call


def test_torch_ops_read_no_device_value_on_the_host_over_generated_sequences() -> None:
    for seed in range(800_000, 800_030):
        sequence = build_sequence(seed, SHAPES[seed % len(SHAPES)])
        ours, reference = run_sequence(_WithoutHostSync(), sequence), run_sequence(oracle, sequence)
        assert ours == reference, f"seed {seed}: {_first_difference(ours, reference)}"


# --------------------------------------------------------------------------------------------------------------
# Targeted cases, each also checked against the oracle on identical poisoned inputs.
# --------------------------------------------------------------------------------------------------------------


def _resolve_both(**kwargs: Any) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Run torch_impl and the oracle on clones of the same single-request-per-row inputs (B=2, K=3, H=6)."""
    results = []
    for ops in (torch_impl, oracle):
        t = {name: value.clone() for name, value in kwargs.items()}
        ops.resolve_residency(
            t["host"], t["hot"], t["hot_block_table"], t["topk"], t["hot_indices"], t["dgi"], t["lru"], t["rsi"],
            t["lru"].shape[1], int(t["union_cap"]), t["miss_mask"], t["stats"], None, 0, t["request_ids"], t["source"],
            2, None, t["valid_counts"], t["swap_host"], t["swap_device"], t["swap_counts"], None, 0, 0,
            error_flags=t["flags"],
        )
        results.append(t)
    return results[0], results[1]


def _case(topk: list[list[int]], request_ids: list[int], rsi: list[int], union_cap: int = 6) -> dict[str, torch.Tensor]:
    rows = len(topk)
    source = torch.arange(1, 1 + 4 * 8, dtype=I32).view(4, 8)  # request q, page p -> host block 8q+p+1
    return {
        "host": torch.zeros(80, 16, dtype=torch.uint8), "hot": torch.zeros(16, 2, 16, dtype=torch.uint8),
        "hot_block_table": torch.tensor([[1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 11, 12]], dtype=I32),
        "topk": torch.tensor(topk, dtype=I32), "hot_indices": torch.full((rows, 3), POISON, dtype=I32),
        "dgi": torch.full((3, 6), -1, dtype=I32), "lru": torch.arange(6, dtype=torch.int16).repeat(3, 1),
        "rsi": torch.tensor(rsi, dtype=I32), "union_cap": torch.tensor(union_cap),
        "miss_mask": torch.full((rows, 3), POISON, dtype=I32), "stats": torch.zeros(2, dtype=torch.uint64),
        "request_ids": torch.tensor(request_ids, dtype=I32), "source": source,
        "valid_counts": torch.full((rows,), POISON, dtype=I32),
        "swap_host": torch.full((rows, 3), POISON, dtype=I32), "swap_device": torch.full((rows, 3), POISON, dtype=I32),
        "swap_counts": torch.full((rows,), POISON, dtype=I32), "flags": torch.zeros(1, dtype=I32),
    }


def _assert_same(ours: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> None:
    for name, value in reference.items():
        assert torch.equal(ours[name], value), f"{name}: torch {ours[name].tolist()} != oracle {value.tolist()}"


def test_union_overflow_flags_bit_one_and_treats_only_that_run_as_padding() -> None:
    # Request 0 has two rows with 5 distinct host rows > max_union_rows 4; request 1 fits.
    case = _case([[0, 1, 2], [3, 4, 2], [0, 1, -1]], [0, 0, 1], [0, 1, 2, -1], union_cap=4)
    ours, reference = _resolve_both(**case)
    _assert_same(ours, reference)
    assert ours["flags"].tolist() == [oracle.FLAG_UNION_OVERFLOW]
    assert ours["hot_indices"][:2].tolist() == [[-1, -1, -1]] * 2
    assert ours["miss_mask"][:2].tolist() == [[POISON] * 3] * 2, "an overflowed run keeps miss_mask"
    assert ours["swap_counts"].tolist() == [0, 0, 2]
    assert ours["dgi"][0].tolist() == [-1] * 6 and ours["lru"][0].tolist() == list(range(6))
    assert ours["hot_indices"][2].tolist() == [8, 9, -1], "request 1 (hot blocks 4, 5) is served normally"


def test_out_of_range_lru_victim_flags_bit_two_and_drops_only_that_reference() -> None:
    case = _case([[0, 1, 2]], [0], [0])
    case["lru"][0] = torch.tensor([0, -1, 2, 3, 4, 5], dtype=torch.int16)
    ours, reference = _resolve_both(**case)
    _assert_same(ours, reference)
    assert ours["flags"].tolist() == [oracle.FLAG_LRU_TRIPWIRE]
    assert ours["hot_indices"].tolist() == [[2, -1, 4]]
    assert ours["miss_mask"].tolist() == [[1, 0, 1]]
    assert ours["swap_host"].tolist() == [[2, 3, 4]] and ours["swap_device"].tolist() == [[2, -1, 4]]
    assert ours["lru"][0].tolist() == [3, 4, 5, 0, -1, 2], "the bad slot stays among the just-filled slots"
    assert ours["dgi"][0].tolist() == [2, -1, 4, -1, -1, -1]
    assert ours["stats"].view(torch.int64).tolist() == [0, 2], "a dropped reference is neither hit nor miss"


def test_second_run_on_one_state_row_flags_bit_four_and_becomes_padding() -> None:
    # Requests 0 and 2 both map to state row 1; the later run (batch row 2) must not touch it.
    case = _case([[0, 1, -1], [0, 1, -1], [4, 5, -1]], [0, 1, 2], [1, 0, 1, -1])
    ours, reference = _resolve_both(**case)
    _assert_same(ours, reference)
    assert ours["flags"].tolist() == [oracle.FLAG_SHARED_STATE_ROW]
    assert ours["hot_indices"][2].tolist() == [-1, -1, -1] and ours["swap_counts"].tolist() == [2, 2, 0]
    assert ours["dgi"][1].tolist() == [2, 3, -1, -1, -1, -1]


def test_in_row_duplicates_share_one_slot_and_count_one_miss() -> None:
    case = _case([[5, 5, 6]], [0], [2])
    ours, reference = _resolve_both(**case)
    _assert_same(ours, reference)
    assert ours["hot_indices"].tolist() == [[2, 2, 3]]
    assert ours["miss_mask"].tolist() == [[1, 0, 1]]
    assert ours["swap_counts"].tolist() == [2]
    assert ours["stats"].view(torch.int64).tolist() == [1, 2]


def test_stats_wrap_modulo_two_to_the_64() -> None:
    case = _case([[0, 1, 2]], [0], [0])
    case["stats"] = torch.tensor([-1, -2], dtype=torch.int64).view(torch.uint64)  # 2**64-1, 2**64-2
    ours, reference = _resolve_both(**case)
    _assert_same(ours, reference)
    assert ours["stats"].view(torch.int64).tolist() == [-1, 1]


def _check_rejects_bad_argument_before_writing(ops: Any) -> None:
    """Call ``ops`` once on the very tensors of a case with int32 ``lru_slots``; every output must stay poisoned."""
    t = _case([[0, 1, 2]], [0], [0])
    t["lru"] = t["lru"].to(I32)
    before = {name: value.clone() for name, value in t.items()}
    with pytest.raises(InvalidArgumentError, match="lru_slots"):
        ops.resolve_residency(
            t["host"], t["hot"], t["hot_block_table"], t["topk"], t["hot_indices"], t["dgi"], t["lru"], t["rsi"],
            t["lru"].shape[1], int(t["union_cap"]), t["miss_mask"], t["stats"], None, 0, t["request_ids"], t["source"],
            2, None, t["valid_counts"], t["swap_host"], t["swap_device"], t["swap_counts"], None, 0, 0,
            error_flags=t["flags"],
        )
    assert t["hot_indices"].eq(POISON).all(), "hot_indices was written before the argument check"
    changed = sorted(name for name, value in t.items() if not torch.equal(value, before[name]))
    assert changed == [], f"written before the argument check: {changed}"


@pytest.mark.parametrize("ops", [torch_impl, oracle], ids=["torch_impl", "oracle"])
def test_resolve_rejects_bad_argument_before_writing_anything(ops: Any) -> None:
    _check_rejects_bad_argument_before_writing(ops)


def test_rejects_before_writing_check_fails_an_impl_that_writes_hot_indices_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Planted bug: the implementation fills hot_indices, then runs its argument check.
    real_check = torch_impl.arguments.check_resolve_residency

    def write_then_check(*args: Any, **kwargs: Any) -> None:
        args[4].fill_(0)
        real_check(*args, **kwargs)

    monkeypatch.setattr(torch_impl, "arguments", SimpleNamespace(check_resolve_residency=write_then_check))
    with pytest.raises(AssertionError, match="hot_indices was written before the argument check"):
        _check_rejects_bad_argument_before_writing(torch_impl)


def _gather_both(call: Any, host: torch.Tensor, hot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    ours, reference = hot.clone(), hot.clone()
    call(torch_impl, host, ours)
    call(oracle, host, reference)
    return ours, reference


def test_gather_compact_copies_counted_entries_zero_fills_past_host_and_skips_bad_destinations() -> None:
    host = torch.randint(0, 256, (10, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    hot = torch.randint(0, 256, (4, 2, 32), dtype=torch.uint8, generator=torch.Generator().manual_seed(2))
    sources = torch.tensor([[3, 12, -1], [4, 5, 6]], dtype=I32)
    destinations = torch.tensor([[0, 1, 2], [8, 3, 7]], dtype=I32)
    counts = torch.tensor([3, 2], dtype=I32)

    def call(ops: Any, h: torch.Tensor, out: torch.Tensor) -> None:
        ops.gather_compact(h, out, sources, destinations, counts)

    ours, reference = _gather_both(call, host, hot)
    assert torch.equal(ours, reference)
    rows, before = ours.view(8, 32), hot.view(8, 32)
    assert torch.equal(rows[0], host[3]) and rows[1].eq(0).all() and torch.equal(rows[3], host[5])
    assert torch.equal(rows[2], before[2]), "negative host row: skipped"
    assert torch.equal(rows[7], before[7]), "entry past the count: skipped"


def test_gather_compact_moves_bf16_bits_exactly_into_a_strided_slab_view() -> None:
    # Two layers interleaved per block: layer 0's view skips layer 1's rows, which must stay untouched.
    slab = torch.randn(3, 2, 2, 8, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    layer0 = slab[:, 0]
    host = torch.tensor([[float("nan")] * 8, [1.5] * 8, [-0.0] * 8], dtype=torch.bfloat16)
    host.view(torch.int16)[0, 0] = 0x7FC1  # a NaN payload a float copy could canonicalise
    layer1_before = slab[:, 1].clone()

    def call(ops: Any, h: torch.Tensor, out: torch.Tensor) -> None:
        view = out[:, 0]
        ops.gather_compact(h, view, torch.tensor([[0, 2]], dtype=I32), torch.tensor([[5, 0]], dtype=I32),
                           torch.tensor([2], dtype=I32))

    ours, reference = _gather_both(call, host, slab)
    assert torch.equal(ours.view(torch.int16), reference.view(torch.int16))
    assert torch.equal(ours[2, 0, 1].view(torch.int16), host[0].view(torch.int16))
    assert torch.equal(ours[:, 1].view(torch.int16), layer1_before.view(torch.int16))
    assert not torch.equal(layer0.view(torch.int16), ours[:, 0].view(torch.int16)), "layer 0 did change"


def test_gather_plan_skips_padding_rows_and_writes_attention_for_every_entry() -> None:
    host = torch.randint(0, 256, (6, 16), dtype=torch.uint8, generator=torch.Generator().manual_seed(4))
    staging = torch.zeros(4, 16, dtype=torch.uint8)
    attention = {}

    def call(ops: Any, h: torch.Tensor, out: torch.Tensor) -> None:
        attention[ops] = torch.full((2, 2), POISON, dtype=I32)
        ops.gather_plan(h, out, torch.tensor([[1, 2], [3, 4]], dtype=I32), torch.tensor([[0, -1], [2, 3]], dtype=I32),
                        torch.tensor([[1, 1], [1, 1]], dtype=I32), torch.tensor([0, -1], dtype=I32),
                        attention[ops], 5)

    ours, reference = _gather_both(call, host, staging)
    assert torch.equal(ours, reference)
    assert torch.equal(ours[0], host[1]) and ours[1:].eq(0).all(), "row 1 is padding: nothing copied"
    assert attention[torch_impl].tolist() == attention[oracle].tolist() == [[0, -1], [-1, -1]]


def test_invalidate_clears_every_occurrence_in_the_token_state_row_only() -> None:
    dgi = torch.tensor([[7, 3, 7, -1], [7, 7, 2, 9], [5, 9, 9, 1]], dtype=I32)
    args = (torch.tensor([1, 2, -1], dtype=I32), torch.tensor([0, 1, 2, 5, -1, 1], dtype=I32),
            torch.tensor([7, 9, 9, 9, 7, 2**40]))
    ours, reference = dgi.clone(), dgi.clone()
    torch_impl.invalidate_written_slots(ours, *args)
    oracle.invalidate_written_slots(reference, *args)
    assert torch.equal(ours, reference)
    assert ours.tolist() == [[7, 3, 7, -1], [-1, -1, 2, 9], [5, -1, -1, 1]]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU: torch.cuda.set_sync_debug_mode")
def test_torch_ops_on_a_gpu_do_not_synchronize_under_sync_debug_mode_error() -> None:
    from hisparse_hal.cache_ops.sequences import SequenceRun

    sequence = build_sequence(7, SHAPES[0])
    expected = run_sequence(oracle, sequence)
    run = SequenceRun(sequence, "cuda")
    for index, step in enumerate(sequence.steps):
        io = run.tensors(step)  # built (and copied to the device) before the checked region
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            run.resolve(torch_impl, step, io)
            run.gather(torch_impl, io)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert io.hot_indices.tolist() == expected[index].outputs["hot_indices"], f"step {index}"
        assert run.dgi.tolist() == expected[index].dgi and run.lru.tolist() == expected[index].lru, f"step {index}"
        run.plan(torch_impl, step)
        run.mirror_and_invalidate(torch_impl, step, index)
