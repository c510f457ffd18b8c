"""The Triton cache ops, run on CPU tensors by triton's interpreter (TRITON_INTERPRET=1).

Closed forms from the semantics page (the worked examples), error flags, the gathers and invalidation,
then generated multi-step sequences compared bit for bit with the oracle. The interpreter proves the
kernels' logic; it does not compile them for a GPU, so nothing here says they compile or how fast they run.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the kernels are first defined

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")
pytest.importorskip("numpy")  # triton's interpreter needs numpy

from hisparse_hal.cache_ops import oracle, triton_impl  # noqa: E402
from hisparse_hal.cache_ops.sequences import SHAPES, StepRecord, build_sequence, run_sequence  # noqa: E402
from hisparse_hal.errors import UnsupportedCapabilityError  # noqa: E402

POISON = -7
I32 = torch.int32
#: Generated multi-step sequences run through the Triton ops here (10 per shape). The interpreter costs about
#: 0.45 s per sequence on the project's 2-core VM when idle, 1-2 s when shared (3-5 steps of five launches), so
#: the default keeps this file under a minute; HISPARSE_HAL_TRITON_SEQUENCES runs more (2,000: 15-60 minutes).
TRITON_SEQUENCES = int(os.environ.get("HISPARSE_HAL_TRITON_SEQUENCES", "60"))
SEED_BASE = 80_000


def t32(values: object) -> torch.Tensor:
    return torch.tensor(values, dtype=I32)


def poisoned(rows: int, cols: int) -> torch.Tensor:
    return torch.full((rows, cols), POISON, dtype=I32)


class Outputs:
    """Every optional output of resolve_residency, poisoned so unwritten entries stay visible."""

    def __init__(self, rows: int, top_k: int) -> None:
        self.hot = poisoned(rows, top_k)
        self.miss = poisoned(rows, top_k)
        self.attention = poisoned(rows, top_k)
        self.resolved = poisoned(rows, top_k)
        self.swap_host = poisoned(rows, top_k)
        self.swap_device = poisoned(rows, top_k)
        self.valid = torch.full((rows,), POISON, dtype=I32)
        self.swap_counts = torch.full((rows,), POISON, dtype=I32)


class Example:
    """Worked example A of the semantics page: two single-row requests (B=4, K=3, H=6, U=3)."""

    def __init__(self) -> None:
        self.host = torch.zeros(64, 16, dtype=torch.uint8)
        self.hot_cache = torch.zeros(40, 4, 16, dtype=torch.uint8)
        self.hot_table = t32([[20, 21], [30, 31]])
        self.states = t32([2, 3, -1, -1])
        self.request_ids = t32([0, 1])
        self.source = t32([[5, 9, 3], [7, 2, 11]])
        self.resident = torch.zeros(4, 3, dtype=I32)
        self.resident[0, 2] = self.resident[2, 2] = 10  # either index space (research Open question 1)
        self.dgi = torch.full((4, 6), -1, dtype=I32)
        self.lru = torch.arange(6, dtype=torch.int16).repeat(4, 1)
        self.stats = torch.zeros(2, dtype=torch.uint64)
        self.flags = torch.zeros(1, dtype=I32)

    def step(self, topk: list[list[int]], max_union_rows: int = 3) -> Outputs:
        out = Outputs(2, 3)
        triton_impl.resolve_residency(
            self.host, self.hot_cache, self.hot_table, t32(topk), out.hot, self.dgi, self.lru, self.states, 6,
            max_union_rows, out.miss, self.stats, out.attention, 4, self.request_ids, self.source, 4, out.resolved,
            out.valid, out.swap_host, out.swap_device, out.swap_counts, self.resident, 4, 0, error_flags=self.flags,
        )
        return out

    def counters(self) -> list[int]:
        return self.stats.view(torch.int64).tolist()


def test_worked_example_a_three_steps_match_the_semantics_page() -> None:
    ex = Example()
    one = ex.step([[1, 6, 9], [0, 5, -1]])
    assert one.hot.tolist() == [[80, 81, 41], [120, 121, -1]]
    assert one.attention.tolist() == [[80, 81, 41], [120, 121, -1]]  # A = B = 4: attention = physical row
    assert one.resolved.tolist() == [[21, 38, 13], [28, 9, -1]] and one.valid.tolist() == [3, 2]
    assert one.miss.tolist() == [[1, 1, 0], [1, 1, 0]]
    assert one.swap_host.tolist() == [[21, 38, POISON], [28, 9, POISON]]
    assert one.swap_device.tolist() == [[80, 81, POISON], [120, 121, POISON]] and one.swap_counts.tolist() == [2, 2]
    assert ex.lru[2:].tolist() == [[2, 3, 4, 5, 0, 1]] * 2 and ex.counters() == [0, 4]

    two = ex.step([[6, 2, 1], [5, 4, 0]])
    assert two.hot.tolist() == [[81, 82, 80], [121, 122, 120]] and two.swap_counts.tolist() == [1, 1]
    assert ex.lru[2:].tolist() == [[3, 4, 5, 2, 0, 1]] * 2 and ex.counters() == [4, 6]

    three = ex.step([[3, 0, 7], [8, 9, 5]])
    assert three.hot.tolist() == [[83, 84, 85], [123, 124, 121]] and three.swap_counts.tolist() == [3, 2]
    assert ex.dgi[2:].tolist() == [[21, 38, 22, 23, 20, 39], [28, 9, 8, 44, 45, -1]]
    assert ex.lru[2:].tolist() == [[2, 0, 1, 3, 4, 5], [5, 2, 0, 3, 4, 1]]
    assert ex.counters() == [5, 11] and ex.flags.tolist() == [0]


def test_worked_example_b_speculative_rows_share_slots_and_spill_swaps_past_the_first_row() -> None:
    host, hot_cache = torch.zeros(64, 16, dtype=torch.uint8), torch.zeros(40, 4, 16, dtype=torch.uint8)
    hot_table = t32([[6, 7, 8], [6, 7, 8], [0, 0, 0]])
    states, request_ids, source = t32([1, -1, -1]), t32([0, 0, -1]), t32([[1, 2, 3, 4]] * 3)
    dgi, lru = torch.full((3, 9), -1, dtype=I32), torch.arange(9, dtype=torch.int16).repeat(3, 1)
    stats = torch.zeros(2, dtype=torch.uint64)

    def step(topk: list[list[int]]) -> Outputs:
        out = Outputs(3, 3)
        triton_impl.resolve_residency(
            host, hot_cache, hot_table, t32(topk), out.hot, dgi, lru, states, 9, 6, out.miss, stats, out.attention,
            4, request_ids, source, 4, out.resolved, out.valid, out.swap_host, out.swap_device, out.swap_counts,
            None, 0, 0,
        )
        return out

    one = step([[2, 3, 4], [3, 5, 6], [7, 7, 7]])
    assert one.hot.tolist() == [[24, 25, 26], [25, 27, 28], [-1, -1, -1]]
    assert one.swap_host.tolist() == [[6, 7, 8], [9, 10, POISON], [POISON] * 3]
    assert one.swap_counts.tolist() == [3, 2, 0]
    assert one.miss.tolist() == [[1, 1, 1], [0, 1, 1], [POISON] * 3]  # padding rows: miss_mask untouched
    assert lru[1].tolist() == [5, 6, 7, 8, 0, 1, 2, 3, 4] and stats.view(torch.int64).tolist() == [1, 5]

    two = step([[3, 8, 2], [5, 9, -1], [7, 7, 7]])
    assert two.hot.tolist() == [[25, 29, 24], [27, 30, -1], [-1, -1, -1]] and two.swap_counts.tolist() == [2, 0, 0]
    assert lru[1].tolist() == [7, 8, 2, 4, 5, 6, 0, 1, 3] and stats.view(torch.int64).tolist() == [4, 7]


def test_union_overflow_sets_flag_1_and_treats_the_run_as_padding() -> None:
    ex = Example()
    out = ex.step([[1, 6, 2], [0, 5, -1]], max_union_rows=2)  # request A has 3 distinct host rows
    assert ex.flags.tolist() == [1]
    assert out.hot[0].tolist() == [-1, -1, -1] and out.resolved[0].tolist() == [-1, -1, -1]
    assert out.valid[0].item() == 0 and out.swap_counts[0].item() == 0
    assert out.miss[0].tolist() == [POISON] * 3 and out.swap_host[0].tolist() == [POISON] * 3
    assert ex.dgi[2].tolist() == [-1] * 6 and ex.lru[2].tolist() == list(range(6))
    assert out.hot[1].tolist() == [120, 121, -1]  # the other request is resolved normally
    assert ex.counters() == [0, 2]


def test_state_row_used_by_two_runs_sets_flag_4_and_pads_the_later_run() -> None:
    ex = Example()
    ex.states = t32([2, 2, -1, -1])
    out = ex.step([[1, 6, 9], [0, 5, -1]])
    assert ex.flags.tolist() == [4]
    assert out.hot.tolist() == [[80, 81, 41], [-1, -1, -1]] and out.swap_counts.tolist() == [2, 0]
    assert ex.dgi[2].tolist() == [21, 38, -1, -1, -1, -1]


def test_out_of_range_lru_victim_sets_flag_2_and_degrades_to_a_remiss() -> None:
    ex = Example()
    ex.lru[2, 0] = 17  # slot 17 of a 6-slot region: corruption
    out = ex.step([[1, 6, 9], [0, 5, -1]])
    assert ex.flags.tolist() == [2]
    assert out.hot[0].tolist() == [-1, 81, 41] and out.miss[0].tolist() == [0, 1, 0]
    assert out.swap_host[0, :2].tolist() == [21, 38] and out.swap_device[0, :2].tolist() == [-1, 81]
    assert ex.dgi[2].tolist() == [-1, 38, -1, -1, -1, -1]
    assert ex.lru[2].tolist() == [2, 3, 4, 5, 17, 1]  # the bad value stays, in the just-filled part
    assert ex.counters() == [0, 3]


def test_empty_batch_returns_without_touching_state() -> None:
    ex = Example()
    empty = torch.zeros(0, 3, dtype=I32)
    triton_impl.resolve_residency(
        ex.host, ex.hot_cache, ex.hot_table, empty, empty.clone(), ex.dgi, ex.lru, ex.states, 6, 3, None, ex.stats,
        None, 0, None, None, 0, None, None, None, None, None, None, 0, 0,
    )
    assert ex.dgi.eq(-1).all() and ex.counters() == [0, 0]


# --------------------------------------------------------------------------------------------- gathers
def _host_rows(rows: int, width: int = 32) -> torch.Tensor:
    return torch.randint(0, 256, (rows, width), dtype=torch.uint8, generator=torch.Generator().manual_seed(rows))


def test_gather_compact_copies_clamped_counts_zero_fills_and_skips_bad_destinations() -> None:
    host = _host_rows(10)
    slab = torch.full((6, 80), 0xAB, dtype=torch.uint8)
    hot = slab[:, :64].view(6, 2, 32)  # blocks 80 B apart (a multi-layer slab), rows back to back
    before = slab.clone()
    rows = t32([[1, 11, 3, 4], [5, -1, 6, 2]])
    dest = t32([[0, 1, 2, 3], [4, 5, 12, -2]])
    triton_impl.gather_compact(host, hot, rows, dest, t32([3, 9]))  # 9 clamps to 4 columns
    flat = [hot[d // 2, d % 2] for d in range(12)]
    assert torch.equal(flat[0], host[1]) and torch.equal(flat[2], host[3]) and torch.equal(flat[4], host[5])
    assert flat[1].eq(0).all()  # host row 11 >= 10 rows: zeros, never stale
    assert flat[3].eq(0xAB).all()  # past row 0's count of 3
    assert flat[5].eq(0xAB).all()  # source -1: skipped
    assert torch.equal(slab[:, 64:], before[:, 64:])  # bytes between blocks untouched


def test_gather_plan_copies_masked_columns_and_writes_attention_for_every_column() -> None:
    host = _host_rows(8)
    hot = torch.zeros(4, 2, 32, dtype=torch.uint8)
    rows = t32([[1, 2, 3], [4, 5, 6]])
    dest = t32([[0, 1, -1], [2, 3, 4]])
    mask = t32([[1, 0, 1], [1, 1, 1]])
    states = t32([0, -1])  # plan row 1 is padding
    attention = poisoned(2, 3)
    triton_impl.gather_plan(host, hot, rows, dest, mask, states, attention, 5)
    flat = hot.view(8, 32)
    assert torch.equal(flat[0], host[1]) and flat[1].eq(0).all() and flat[2:].eq(0).all()
    assert attention.tolist() == [[0, 1, -1], [-1, -1, -1]]


def test_gather_plan_on_a_2d_staging_buffer_uses_block_size_one() -> None:
    host = _host_rows(8)
    staging = torch.zeros(5, 32, dtype=torch.uint8)
    attention = poisoned(1, 3)
    triton_impl.gather_plan(host, staging, t32([[7, 9, 2]]), t32([[4, 0, 1]]), t32([[1, 1, 1]]), None, attention, 3)
    assert torch.equal(staging[4], host[7]) and staging[0].eq(0).all() and torch.equal(staging[1], host[2])
    assert attention.tolist() == [[12, 0, 3]]


def test_invalidate_clears_every_occurrence_in_the_right_state_row_only() -> None:
    dgi = t32([[5, 6, 5, 7], [5, 5, 6, 6], [6, 6, 6, 6]])
    triton_impl.invalidate_written_slots(
        dgi, t32([1, 0, -1]), t32([0, 0, 2, 9, -1]), torch.tensor([5, -1, 6, 6, 6], dtype=torch.int64)
    )
    assert dgi.tolist() == [[5, 6, 5, 7], [-1, -1, 6, 6], [6, 6, 6, 6]]


# --------------------------------------------------------------------------------------------- availability
def test_without_triton_the_ops_raise_a_typed_error_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "triton", None)
    monkeypatch.delitem(sys.modules, "hisparse_hal.cache_ops.triton_kernels", raising=False)
    monkeypatch.delattr("hisparse_hal.cache_ops.triton_kernels", raising=False)
    triton_impl._kernel_module.cache_clear()
    try:
        expected = r"need triton, which does not import here .*hisparse-hal\[triton\]"
        with pytest.raises(UnsupportedCapabilityError, match=expected):
            triton_impl.invalidate_written_slots(t32([[1]]), t32([0]), t32([0]), torch.tensor([1]))
    finally:
        triton_impl._kernel_module.cache_clear()


def test_cpu_tensors_without_the_interpreter_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    kernels = triton_impl.kernels()
    monkeypatch.setattr(kernels, "INTERPRETED", False)
    with pytest.raises(UnsupportedCapabilityError, match="triton runs CPU tensors only through its interpreter"):
        triton_impl.kernels(torch.device("cpu"))


# --------------------------------------------------------------------------------------------- differential
def _first_difference(got: list[StepRecord], want: list[StepRecord]) -> str:
    for step, (g, w) in enumerate(zip(got, want, strict=False)):
        for field in ("outputs", "dgi", "lru", "stats", "error_flags", "hot_bytes", "staging_bytes",
                      "dgi_after_invalidate"):
            a, b = getattr(g, field), getattr(w, field)
            if field == "outputs":
                a = {name: value for name, value in a.items() if value != b[name]}
                b = {name: b[name] for name in a}
            if a != b:
                return f"step {step} {field}: triton {a} oracle {b}"
    return f"{len(got)} steps against {len(want)}"


@pytest.mark.parametrize("index", range(TRITON_SEQUENCES))
def test_generated_sequence_matches_the_oracle_bit_for_bit(index: int) -> None:
    sequence = build_sequence(SEED_BASE + index, SHAPES[index % len(SHAPES)])
    got, want = run_sequence(triton_impl, sequence), run_sequence(oracle, sequence)
    assert got == want, _first_difference(got, want)
