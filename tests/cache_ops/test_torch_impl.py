"""torch_impl and host_impl against the oracle over generated vLLM 0.34.0 decode sequences, the torch path's
no-host-sync guarantee, and its GPU behaviour on a union overflow (device assertion, masked writes)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from hisparse_hal.cache_ops import device_checks, host_impl, oracle, torch_impl
from hisparse_hal.cache_ops.sequences import (
    SHAPES,
    SequenceRun,
    SequenceShape,
    StepRecord,
    build_sequence,
    run_sequence,
)
from hisparse_hal.testing.host_sync_guard import HostSyncError, no_host_sync
from tests.cache_ops.model import I32, Model
from tests.cache_ops.poisoned_outputs import ResolveOutputs

_mask = torch.tensor([True, False, True])
_values = torch.tensor([3, 1, 2])


@pytest.mark.parametrize(
    ("pattern", "call"),
    [
        ("item", lambda: _values[0].item()),
        ("tolist", lambda: _values.tolist()),
        ("branch on a value", lambda: bool(_values.any())),
        ("nonzero", lambda: _values.nonzero()),
        ("unique", lambda: torch.unique(_values)),
        ("boolean-mask indexing", lambda: _values[_mask]),
    ],
)
def test_no_host_sync_guard_catches_each_syncing_pattern(pattern: str, call: Any) -> None:
    with pytest.raises(HostSyncError, match="host|data-dependent"):
        with no_host_sync():
            call()


def first_difference(ours: list[StepRecord], reference: list[StepRecord]) -> str:
    """Where two recordings of one sequence first differ (step and field), for a readable failure."""
    for step, (a, b) in enumerate(zip(ours, reference, strict=False)):
        for field in ("error", "outputs", "dgi", "lru", "stats", "hot_bytes", "staging_bytes",
                      "tables_after_invalidate"):
            mine, theirs = getattr(a, field), getattr(b, field)
            if mine != theirs:
                return f"step {step} {field}: {str(mine)[:300]} != oracle {str(theirs)[:300]}"
    return "different number of steps" if len(ours) != len(reference) else ""


#: Sequences per shape and implementation here (7 shapes x 2 implementations x 60 = 840).
SEEDS_PER_SHAPE = 60


@pytest.mark.parametrize("impl", [torch_impl, host_impl], ids=["torch", "host"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"shape{i}" for i in range(len(SHAPES))])
def test_implementation_equals_oracle_on_every_output_and_state_over_generated_sequences(
        impl: Any, shape: SequenceShape) -> None:
    errors = 0
    for seed in range(SEEDS_PER_SHAPE):
        sequence = build_sequence(seed, shape)
        ours, reference = run_sequence(impl, sequence), run_sequence(oracle, sequence)
        assert ours == reference, f"seed {seed}, {shape}: {first_difference(ours, reference)}"
        errors += sum(record.error is not None for record in reference)
    assert errors < SEEDS_PER_SHAPE * shape.steps  # most steps run; some raise the union error


def test_sequences_exercise_padding_resident_pages_spills_errors_and_every_table() -> None:
    """The generated sequences reach what the differential test must cover (not a vacuous equality)."""
    seen = {"padding": 0, "resident": 0, "spill": 0, "error": 0, "other table cleared": 0, "stats": 0}
    for seed in range(20):
        for shape in SHAPES:
            sequence = build_sequence(seed, shape)
            records = run_sequence(oracle, sequence)
            for step, record in zip(sequence.steps, records, strict=True):
                seen["padding"] += step.num_valid_rows < len(step.request_ids)
                seen["resident"] += step.resident_block_table is not None and any(map(any,
                                                                                      step.resident_block_table))
                seen["spill"] += any(c > 0 for c in record.outputs["swap_counts"][1:])
                seen["error"] += record.error is not None
                seen["stats"] += record.stats != [0, 0]
            run = SequenceRun(sequence)
            before = [t.tolist() for t in run.other_tables]
            seen["other table cleared"] += records[-1].tables_after_invalidate[1:] != before
    assert all(count > 0 for count in seen.values()), seen


def test_torch_ops_read_no_device_value_on_the_host_over_generated_sequences(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A GPU's code path: values are not readable, so checks become _assert_async (never a host read).
    monkeypatch.setattr(device_checks, "values_readable", lambda device: False)
    for seed in range(4):
        for shape in SHAPES[:4]:
            sequence = build_sequence(seed, shape)
            reference = run_sequence(oracle, sequence)
            if any(record.error for record in reference):
                continue  # on a GPU that step asserts; tested below
            run = SequenceRun(sequence)
            for index, step in enumerate(sequence.steps):
                io = run.tensors(step)
                with no_host_sync():
                    run.resolve(torch_impl, step, io)
                    run.gather(torch_impl, io)
                    run.plan(torch_impl, step)
                assert io.hot_indices.tolist() == reference[index].outputs["hot_indices"]
                run.mirror_and_invalidate(torch_impl, step, index)  # not captured by vLLM (B16)
            assert run.dgi.tolist() == reference[-1].tables_after_invalidate[0]


def _overflow_world() -> Model:
    return Model(block=4, top_k=4, hot_size=8, union=2, states=2, hot_table=[[1, 2], [3, 4]],
                 source=[[0, 2, 3, 5], [0, 6, 7, 8]], request_state_indices=[0, 1])


def test_on_a_gpu_path_a_union_overflow_asserts_on_the_device_before_any_write(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device_checks, "values_readable", lambda device: False)
    world = _overflow_world()
    out = ResolveOutputs(2, 4)
    with pytest.raises(RuntimeError, match="union exceeds max_union_rows = 2"):  # CPU _assert_async raises now
        torch_impl.resolve_residency(*world.args([[4, 5, -1, -1], [4, 5, 6, -1]], [0, 1], out))
    assert out.snapshot() == ResolveOutputs(2, 4).snapshot()
    assert world.state() == ([[-1] * 8] * 2, [list(range(8))] * 2, [0, 0])


def test_on_a_gpu_path_the_overflowing_run_is_masked_so_no_state_is_corrupted(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the assertion fires asynchronously (a GPU), the launch's writes for that run are masked."""
    asserted: list[str] = []
    monkeypatch.setattr(device_checks, "values_readable", lambda device: False)
    monkeypatch.setattr(torch, "_assert_async", lambda condition, message="": asserted.append(message))
    world = _overflow_world()
    out = world.step(torch_impl, [[4, 5, -1, -1], [4, 5, 6, -1]], [0, 1])
    assert asserted and "max_union_rows = 2" in asserted[0]
    assert out.hot.tolist()[1] == [-1] * 4 and out.swap_counts.tolist() == [2, 0]  # run 1 padded
    dgi, lru, stats = world.state()
    assert dgi[1] == [-1] * 8 and lru[1] == list(range(8))  # state row 1 untouched
    assert dgi[0][:2] == [8, 9] and stats == [0, 2]  # run 0 fitted and ran


def test_empty_batches_return_without_touching_anything() -> None:
    world = Model(block=4, top_k=4, hot_size=8, union=4, states=1, hot_table=[[1, 2]], source=[[0, 2]],
                  request_state_indices=[0])
    out = ResolveOutputs(0, 4)
    args = list(world.args([[-1] * 4], [], out))
    args[3] = torch.zeros(0, 4, dtype=I32)
    for impl in (oracle, torch_impl, host_impl):
        impl.resolve_residency(*args)
    assert world.state() == ([[-1] * 8], [list(range(8))], [0, 0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU: torch.cuda.set_sync_debug_mode")
def test_torch_ops_on_a_gpu_do_not_synchronize_under_sync_debug_mode_error() -> None:
    sequence = build_sequence(7, SHAPES[0])
    expected = run_sequence(oracle, sequence)
    run = SequenceRun(sequence, "cuda")
    for index, step in enumerate(sequence.steps):
        io = run.tensors(step)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            run.resolve(torch_impl, step, io)
            run.gather(torch_impl, io)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        if expected[index].error is None:
            assert io.hot_indices.tolist() == expected[index].outputs["hot_indices"], f"step {index}"
        run.plan(torch_impl, step)
        run.mirror_and_invalidate(torch_impl, step, index)


@pytest.mark.parametrize("impl", [torch_impl], ids=["torch"])
def test_on_a_gpu_path_an_unknown_table_address_asserts_and_only_known_tables_are_cleared(
        impl: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from hisparse_hal.cache_ops import tables

    asserted: list[str] = []
    monkeypatch.setattr(device_checks, "values_readable", lambda device: False)
    monkeypatch.setattr(torch, "_assert_async", lambda condition, message="": asserted.append(message))
    known = torch.tensor([[5, 6], [5, 5]], dtype=I32)
    tables.register_table(known)
    stranger = torch.tensor([[5, 5], [5, 5]], dtype=I32)
    pointers = torch.tensor([stranger.data_ptr(), known.data_ptr()], dtype=torch.int64)
    impl.invalidate_written_slots(pointers, torch.tensor([1], dtype=I32), torch.tensor([0], dtype=I32),
                                  torch.tensor([5], dtype=torch.int64), 2, 2)
    assert asserted and "unknown table address" in asserted[0]
    assert known.tolist() == [[5, 6], [-1, -1]] and stranger.tolist() == [[5, 5], [5, 5]]


def test_torch_gathers_in_many_small_rounds_equal_the_oracle(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rounds of 3 plan entries and of one row: the last-writer pass and the row pass cross round edges."""
    monkeypatch.setattr(torch_impl, "PLAN_ROUND_ENTRIES", 3)
    monkeypatch.setattr(torch_impl, "COPY_ROUND_BYTES", 1)
    for seed in range(6):
        for shape in SHAPES:
            sequence = build_sequence(seed, shape)
            ours, reference = run_sequence(torch_impl, sequence), run_sequence(oracle, sequence)
            assert ours == reference, f"seed {seed}, {shape}: {first_difference(ours, reference)}"
