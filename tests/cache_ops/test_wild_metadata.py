"""Wild metadata values (legal shapes and dtypes): every implementation equals the oracle, raises nothing, and
writes nothing outside the op's tensors (guard blocks around the hot cache).

Each call draws block-table entries, DGI values, LRU slots, state indices, request ids, counts and token ids
from the whole int32 / int16 range mixed with near-range values (docs/design/cache-ops.md, decision D8).
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from typing import Any

import pytest
import torch

from hisparse_hal.cache_ops import host_impl, oracle, tables, torch_impl
from hisparse_hal.cache_ops.arguments import attention_stride_bound
from hisparse_hal.errors import UnionOverflowError

I32_MIN, I32_MAX = -(1 << 31), (1 << 31) - 1
GUARD = 0xA5
#: Calls per op for the oracle, torch and host columns (all in one test per op).
CALLS = 2000
#: The Triton column (interpreter, ~20-60 ms a call) runs the same calls in this many xdist chunks.
TRITON_CHUNKS = 8


def _wild(rng: random.Random, size: int, low: int = I32_MIN, high: int = I32_MAX) -> int:
    """Mostly near the valid range [0, size), sometimes a boundary, sometimes anything in [low, high]."""
    pick = rng.random()
    if pick < 0.6:
        return rng.randrange(-1, size + 1)
    if pick < 0.8:
        return rng.choice([low, high, -1, 0, size, size - 1, high - 1, low + 1])
    return rng.randint(low, high)


def _i32(rng: random.Random, shape: tuple[int, ...], size: int) -> torch.Tensor:
    count = 1
    for dim in shape:
        count *= dim
    return torch.tensor([_wild(rng, size) for _ in range(count)], dtype=torch.int32).view(shape)


class Guarded:
    """A 3-D hot cache between two guard blocks of a fixed pattern."""

    def __init__(self, rng: random.Random, blocks: int, block: int, width: int) -> None:
        self.buffer = torch.full((blocks + 2, block, width), GUARD, dtype=torch.uint8)
        self.buffer[1:-1] = torch.tensor([rng.randrange(256) for _ in range(blocks * block * width)],
                                         dtype=torch.uint8).view(blocks, block, width)
        self.hot = self.buffer[1:-1]

    def guards_intact(self) -> bool:
        return bool((self.buffer[0] == GUARD).all()) and bool((self.buffer[-1] == GUARD).all())


def _host(rng: random.Random, rows: int, width: int) -> torch.Tensor:
    return torch.tensor([rng.randrange(256) for _ in range(rows * width)], dtype=torch.uint8).view(rows, width)


def _resolve_case(seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    top_k, queries, block = rng.randint(1, 3), rng.randint(1, 3), rng.choice([1, 2, 4])
    hot_size = top_k * (queries + 1) + rng.randint(0, 2)
    num_rows, states = rng.randint(1, 4), rng.randint(1, 4)
    num_states = max(states, num_rows)
    host_rows, width = rng.randint(1, 24), 16
    hot_blocks = rng.randint(1, 6)
    translated = rng.random() < 0.7
    source_block = rng.randint(1, 4)
    request_rows = rng.randint(max(1, num_rows // 2), num_rows + 1)
    args: dict[str, Any] = {
        "host": _host(rng, host_rows, width),
        "hot_blocks": hot_blocks, "block": block, "width": width, "hot_seed": rng.randrange(1 << 30),
        "hot_block_table": _i32(rng, (max(num_rows, request_rows), -(-hot_size // block) + rng.randint(0, 1)),
                                hot_blocks),
        "global_indices": _i32(rng, (num_rows, top_k), host_rows if not translated else 8 * source_block),
        "device_global_indices": _i32(rng, (num_states, hot_size), host_rows),
        "lru_slots": torch.tensor([[_wild(rng, hot_size, -(1 << 15), (1 << 15) - 1) if rng.random() < 0.2 else slot
                                    for slot in rng.sample(range(hot_size), hot_size)] for _ in range(num_states)],
                                  dtype=torch.int16),
        "request_state_indices": _i32(rng, (request_rows,), num_states) if rng.random() < 0.8 else None,
        "region_stride": hot_size,
        "max_union_rows": rng.randint(1, hot_size) if rng.random() < 0.85 else 1,
        # the largest stride whose attention indices fit int32 (arguments.attention_stride_bound)
        "attention_block_stride": rng.choice([block, block + 3,
                                              min(attention_stride_bound(hot_blocks, block), I32_MAX)]),
        "stats": torch.tensor([rng.randint(-(1 << 63), (1 << 63) - 1) for _ in range(2)]).view(torch.uint64),
    }
    if translated:
        ids = sorted(_wild(rng, request_rows) for _ in range(num_rows)) if rng.random() < 0.7 else \
            [_wild(rng, request_rows) for _ in range(num_rows)]
        args["request_ids"] = torch.tensor(ids, dtype=torch.int32)
        args["source_block_table"] = _i32(rng, (request_rows, rng.randint(1, 8)), host_rows // source_block + 2)
        args["source_block_size"] = source_block
        if rng.random() < 0.5:  # by state row (vLLM 0.34.0), sometimes fewer rows than states
            args["resident_block_table"] = _i32(rng, (rng.randint(1, num_states + 1), rng.randint(1, 4)), hot_blocks)
        if rng.random() < 0.6:
            args["num_valid_rows"] = torch.tensor([_wild(rng, num_rows + 1)], dtype=torch.int32)
    if args["request_state_indices"] is None and "request_ids" in args:
        args["request_state_indices"] = torch.arange(request_rows, dtype=torch.int32)
    return args


def _run_resolve(ops: Any, case: dict[str, Any]) -> dict[str, Any]:
    rng = random.Random(case["hot_seed"])
    guarded = Guarded(rng, case["hot_blocks"], case["block"], case["width"])
    num_rows, top_k = case["global_indices"].shape
    outputs = {name: torch.full((num_rows, top_k), -7777, dtype=torch.int32) for name in (
        "hot", "attention", "swap_host", "swap_device")}
    valid = torch.full((num_rows,), -7777, dtype=torch.int32)
    swap_counts = torch.full((num_rows,), -7777, dtype=torch.int32)
    dgi, lru, stats = case["device_global_indices"].clone(), case["lru_slots"].clone(), case["stats"].clone()
    resident = case.get("resident_block_table")
    error = None
    try:
        ops.resolve_residency(
            case["host"], guarded.hot, case["hot_block_table"], case["global_indices"], outputs["hot"], dgi, lru,
            case["request_state_indices"], case["region_stride"], case["max_union_rows"], stats,
            outputs["attention"], case["attention_block_stride"], case.get("request_ids"),
            case.get("source_block_table"), case.get("source_block_size", 0), valid,
            outputs["swap_host"], outputs["swap_device"], swap_counts, resident,
            case["block"] if resident is not None else 0, case.get("num_valid_rows"),
        )
    except UnionOverflowError as exc:  # raised before any write: the record below must still be pristine
        error = str(exc)
    assert guarded.guards_intact(), "resolve_residency wrote outside its tensors"
    record: dict[str, Any] = {name: t.tolist() for name, t in outputs.items()}
    record.update(valid=valid.tolist(), swap_counts=swap_counts.tolist(), dgi=dgi.tolist(), lru=lru.tolist(),
                  stats=stats.view(torch.int64).tolist(), error=error, hot=guarded.hot.tolist())
    return record


def _gather_case(seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    rows, cols, block, blocks = rng.randint(1, 4), rng.randint(1, 5), rng.choice([1, 2, 4]), rng.randint(1, 4)
    host_rows, width = rng.randint(1, 12), 16
    hot_rows = blocks * block
    return {
        "host": _host(rng, host_rows, width), "blocks": blocks, "block": block, "width": width,
        "hot_seed": rng.randrange(1 << 30),
        "sources": _i32(rng, (rows, cols), host_rows), "destinations": _i32(rng, (rows, cols), hot_rows),
        "counts": _i32(rng, (rows + rng.randint(0, 2),), cols), "mask": _i32(rng, (rows, cols), 2),
    }


def _run_compact(ops: Any, case: dict[str, Any]) -> dict[str, Any]:
    guarded = Guarded(random.Random(case["hot_seed"]), case["blocks"], case["block"], case["width"])
    ops.gather_compact(case["host"], guarded.hot, case["sources"], case["destinations"], case["counts"])
    assert guarded.guards_intact(), "gather_compact wrote outside the hot cache"
    return {"hot": guarded.hot.tolist()}


def _run_plan(ops: Any, case: dict[str, Any]) -> dict[str, Any]:
    guarded = Guarded(random.Random(case["hot_seed"]), case["blocks"], case["block"], case["width"])
    ops.gather_plan(case["host"], guarded.hot, case["sources"], case["destinations"], case["mask"])
    assert guarded.guards_intact(), "gather_plan wrote outside the hot cache"
    return {"hot": guarded.hot.tolist()}


def _invalidate_case(seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    states, hot_size, requests, tokens = rng.randint(1, 3), rng.randint(1, 5), rng.randint(1, 4), rng.randint(0, 6)
    slots = [rng.choice([_wild(rng, 10), rng.randint(-(1 << 63), (1 << 63) - 1)]) for _ in range(tokens)]
    tables_named = rng.randint(1, 3)
    return {"tables": [_i32(rng, (states, hot_size), 10) for _ in range(tables_named)],
            "order": [rng.randrange(tables_named) for _ in range(rng.randint(1, 4))],
            "rsi": _i32(rng, (requests,), states), "ids": _i32(rng, (tokens,), requests),
            "slots": torch.tensor(slots, dtype=torch.int64)}


def _run_invalidate(ops: Any, case: dict[str, Any]) -> dict[str, Any]:
    live = [table.clone() for table in case["tables"]]
    for table in live:
        tables.register_table(table)
    pointers = torch.tensor([live[i].data_ptr() for i in case["order"]], dtype=torch.int64)
    states, slots = live[0].shape
    ops.invalidate_written_slots(pointers, case["rsi"], case["ids"], case["slots"], states, slots)
    return {"tables": [table.tolist() for table in live]}


OPS: dict[str, tuple[Callable[[int], dict[str, Any]], Callable[[Any, dict[str, Any]], dict[str, Any]]]] = {
    "resolve_residency": (_resolve_case, _run_resolve),
    "gather_compact": (_gather_case, _run_compact),
    "gather_plan": (_gather_case, _run_plan),
    "invalidate_written_slots": (_invalidate_case, _run_invalidate),
}


def _assert_equal(name: str, ops: Any, seeds: range) -> None:
    build, run = OPS[name]
    for seed in seeds:
        case = build(seed)
        want = run(oracle, case)
        got = run(ops, case)
        for field, value in want.items():
            assert got[field] == value, f"{name} seed {seed}: {ops.__name__} {field} {got[field]} != oracle {value}"


@pytest.mark.parametrize("name", list(OPS))
@pytest.mark.parametrize("ops", [torch_impl, host_impl], ids=["torch", "host"])
def test_wild_metadata_gives_the_oracle_result_without_raising_or_straying(ops: Any, name: str) -> None:
    _assert_equal(name, ops, range(CALLS))


def test_wild_cases_reach_huge_values_union_errors_and_out_of_range_entries() -> None:
    errors = huge = tripped = 0
    for seed in range(200):
        case = _resolve_case(seed)
        record = _run_resolve(oracle, case)
        errors += record["error"] is not None
        pairs = zip(sum(record["swap_host"], []), sum(record["swap_device"], []), strict=True)
        tripped += any(d == -1 and h >= 0 for h, d in pairs)
        huge += int((case["hot_block_table"].abs() > 1 << 30).any())
    assert errors > 2 and tripped > 5 and huge > 20, (errors, tripped, huge)


@pytest.mark.parametrize("chunk", range(TRITON_CHUNKS))
@pytest.mark.parametrize("name", list(OPS))
def test_wild_metadata_through_the_triton_kernels_gives_the_oracle_result(name: str, chunk: int,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    if os.environ.get("TRITON_INTERPRET", "1") != "1":
        pytest.skip("the Triton column runs the kernels through the interpreter (TRITON_INTERPRET=1)")
    os.environ.setdefault("TRITON_INTERPRET", "1")
    pytest.importorskip("triton", reason="triton is not installed: the Triton column cannot run")
    from hisparse_hal.cache_ops import triton_impl

    per_chunk = CALLS // TRITON_CHUNKS
    _assert_equal(name, triton_impl, range(chunk * per_chunk, (chunk + 1) * per_chunk))
