"""The CPU device's cache ops (``host_impl``): gathers that copy only the misses, bit-equal to the oracle."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from hisparse_hal.cache_ops import host_impl, oracle
from hisparse_hal.cache_ops.sequences import SHAPES, SequenceShape, build_sequence, run_sequence
from hisparse_hal.errors import InvalidArgumentError

I32 = torch.int32


def _both(call: Any, host: torch.Tensor, hot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    ours, reference = hot.clone(), hot.clone()
    call(host_impl, host, ours)
    call(oracle, host, reference)
    return ours, reference


def _rows(rows: int, width: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 256, (rows, width), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


def test_gather_compact_copies_counted_entries_zero_fills_past_host_and_skips_bad_rows() -> None:
    host, hot = _rows(10, 32, 1), _rows(8, 32, 2).view(4, 2, 32)
    sources = torch.tensor([[3, 12, -1], [4, 5, 6]], dtype=I32)
    destinations = torch.tensor([[0, 1, 2], [8, 3, 7]], dtype=I32)

    def call(ops: Any, h: torch.Tensor, out: torch.Tensor) -> None:
        ops.gather_compact(h, out, sources, destinations, torch.tensor([3, 2], dtype=I32))

    ours, reference = _both(call, host, hot)
    assert torch.equal(ours, reference)
    rows, before = ours.view(8, 32), hot.view(8, 32)
    assert torch.equal(rows[0], host[3]) and rows[1].eq(0).all() and torch.equal(rows[3], host[5])
    assert torch.equal(rows[2], before[2]) and torch.equal(rows[7], before[7])


def test_gather_compact_repeated_destination_ends_with_the_later_entry_across_rows() -> None:
    host, hot = _rows(6, 16, 3), _rows(4, 16, 4).view(2, 2, 16)
    sources = torch.tensor([[1, 2], [3, 11]], dtype=I32)  # 11 is past the host cache: zeros win last
    destinations = torch.tensor([[2, 1], [1, 2]], dtype=I32)

    def call(ops: Any, h: torch.Tensor, out: torch.Tensor) -> None:
        ops.gather_compact(h, out, sources, destinations, torch.tensor([2, 2], dtype=I32))

    ours, reference = _both(call, host, hot)
    assert torch.equal(ours, reference)
    assert torch.equal(ours.view(4, 16)[1], host[3]) and ours.view(4, 16)[2].eq(0).all()


def test_gather_compact_into_a_strided_slab_view_keeps_the_other_layer_and_nan_payloads() -> None:
    slab = torch.randn(3, 2, 2, 8, generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    host = torch.tensor([[float("nan")] * 8, [1.5] * 8, [-0.0] * 8], dtype=torch.bfloat16)
    host.view(torch.int16)[0, 0] = 0x7FC1

    def call(ops: Any, h: torch.Tensor, out: torch.Tensor) -> None:
        ops.gather_compact(h, out[:, 0], torch.tensor([[0, 2]], dtype=I32), torch.tensor([[5, 0]], dtype=I32),
                           torch.tensor([2], dtype=I32))

    ours, reference = _both(call, host, slab)
    assert torch.equal(ours.view(torch.int16), reference.view(torch.int16))
    assert torch.equal(ours[2, 0, 1].view(torch.int16), host[0].view(torch.int16))
    assert torch.equal(ours[:, 1].view(torch.int16), slab[:, 1].view(torch.int16))


def test_word_rows_takes_the_widest_word_the_offset_allows() -> None:
    buffer = torch.zeros(4 * 32 + 4, dtype=torch.uint8)
    assert host_impl.word_rows(buffer[:128].view(4, 32)).dtype == torch.int64
    assert host_impl.word_rows(buffer[4:132].view(4, 32)).dtype == torch.int32
    assert host_impl.word_rows(buffer[2:130].view(4, 32)).dtype == torch.int16
    assert host_impl.word_rows(buffer[1:129].view(4, 32)).dtype == torch.uint8


def test_gather_compact_on_a_misaligned_hot_cache_copies_through_narrower_words() -> None:
    host = _rows(5, 16, 6)
    storage = _rows(1, 8 * 16 + 2, 7).view(-1)
    hot = storage[2:130].view(4, 2, 16)  # 2-byte aligned: int16 words

    def call(ops: Any, h: torch.Tensor, out: torch.Tensor) -> None:
        ops.gather_compact(h, out[:, :], torch.tensor([[4, 0, 2]], dtype=I32), torch.tensor([[7, 0, 3]], dtype=I32),
                           torch.tensor([3], dtype=I32))

    ours, reference = _both(call, host, hot)
    assert torch.equal(ours, reference) and torch.equal(ours.view(8, 16)[7], host[4])


def test_gather_plan_on_a_staging_buffer_copies_masked_entries_and_writes_attention_everywhere() -> None:
    host, staging = _rows(6, 16, 8), _rows(4, 16, 9)
    sources = torch.tensor([[1, 2, 3], [4, 5, 0]], dtype=I32)
    destinations = torch.tensor([[0, 1, -1], [2, 3, 3]], dtype=I32)
    mask = torch.tensor([[1, 0, 1], [1, 1, 1]], dtype=I32)
    attention = {name: torch.full((2, 3), -9, dtype=I32) for name in ("ours", "oracle")}

    def call(ops: Any, h: torch.Tensor, out: torch.Tensor) -> None:
        key = "ours" if ops is host_impl else "oracle"
        ops.gather_plan(h, out, sources, destinations, mask, torch.tensor([0, 0], dtype=I32), attention[key], 1)

    ours, reference = _both(call, host, staging)
    assert torch.equal(ours, reference) and torch.equal(attention["ours"], attention["oracle"])
    assert torch.equal(ours[3], host[0]) and torch.equal(ours[1], staging[1])


def test_gather_compact_rejects_bad_arguments_before_copying() -> None:
    host, hot = _rows(4, 16, 10), _rows(4, 32, 11).view(2, 2, 32)
    before = hot.clone()
    with pytest.raises(InvalidArgumentError, match="the host cache's row size"):
        host_impl.gather_compact(host, hot, torch.zeros(1, 1, dtype=I32), torch.zeros(1, 1, dtype=I32),
                                 torch.ones(1, dtype=I32))
    assert torch.equal(hot, before)


# 6 shapes x 60 seeds = 360 sequences (about 20 s on one core); the conformance tier runs 2,000 more through
# the CPU backend, whose capability picks this implementation.
SEEDS_PER_SHAPE = 60


@pytest.mark.parametrize("shape", SHAPES, ids=[f"shape{i}" for i in range(len(SHAPES))])
def test_host_equals_oracle_on_every_output_and_state_over_generated_sequences(shape: SequenceShape) -> None:
    base = 50_000 + SHAPES.index(shape) * 1_000
    for seed in range(base, base + SEEDS_PER_SHAPE):
        sequence = build_sequence(seed, shape)
        assert run_sequence(host_impl, sequence) == run_sequence(oracle, sequence), f"seed {seed}, {shape}"
