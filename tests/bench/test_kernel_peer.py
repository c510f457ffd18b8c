"""The kernel peer harness on CPU: the oracle standing in for vLLM's kernels against the CPU backend's cache ops,
field by field after every step, a union-overflow sequence skipped, and the timing table; plus the source check
of the vLLM extension builder."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from hisparse_hal.bench import kernel_peer, vllm_extension
from hisparse_hal.bench.cache_ops import CacheOpsCase
from hisparse_hal.bench.kernel_peer import FIELDS, Peer, compare_records, compare_sequence, oracle_peer, time_case
from hisparse_hal.cache_ops import oracle, torch_impl
from hisparse_hal.errors import InvalidArgumentError, UnsupportedCapabilityError
from hisparse_hal.registry import get_backend
from hisparse_hal.testing.sequences import SHAPES, build_sequence, run_sequence

SMALL = CacheOpsCase(2, context=256, top_k=64, queries=2)


@pytest.fixture(scope="module")
def ours() -> Any:
    return kernel_peer.OurOps(get_backend("cpu"))


class _Tampered:
    """The oracle, except that after resolve call number ``at`` it changes one element of one tensor argument."""

    def __init__(self, at: int, argument: int) -> None:
        self.calls, self.at, self.argument = 0, at, argument
        self.gather_compact, self.gather_plan = oracle.gather_compact, oracle.gather_plan
        self.invalidate_written_slots = oracle.invalidate_written_slots

    def resolve_residency(self, *args: Any) -> None:
        oracle.resolve_residency(*args)
        if self.calls == self.at:
            target = args[self.argument]
            target.view(-1)[0] += 1
        self.calls += 1


class _Refusing:
    """A peer that must not be called."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the peer was called ({name})")


@pytest.mark.parametrize("peer", [oracle_peer(), Peer("torch", torch_impl)], ids=["oracle", "torch_impl"])
def test_a_faithful_peer_equals_the_cpu_backend_on_every_field(ours, peer):
    results = kernel_peer.compare_sequences(peer, ours, seeds=1)
    ran = [r for r in results if r.skipped is None]
    assert len(results) == len(SHAPES) and ran
    assert all(r.equal for r in ran), [(r.shape, r.seed, r.mismatches, r.error) for r in ran if not r.equal]
    assert all(r.steps == SHAPES[r.shape].steps for r in results)


@pytest.mark.parametrize(("argument", "field"), [(6, "lru"), (19, "swap_counts"), (4, "hot_indices")])
def test_a_peer_that_differs_is_named_at_its_step_and_field(ours, argument, field):
    shape, seed = 0, _seed_without_overflow(0)
    result = compare_sequence(Peer("tampered", _Tampered(at=1, argument=argument)), ours, shape, seed)
    assert not result.equal and result.error is None
    assert (1, field) in result.mismatches
    assert all(step >= 1 for step, _ in result.mismatches), result.mismatches  # step 0 was left alone


def test_a_union_overflow_sequence_is_skipped_without_calling_the_peer(ours):
    found = next(((shape, seed) for seed in range(400) for shape in range(len(SHAPES))
                  if any(r.error for r in run_sequence(oracle, build_sequence(seed, SHAPES[shape])))), None)
    assert found is not None, "no generated sequence overflows its union cap in 400 seeds"
    result = compare_sequence(Peer("refusing", _Refusing()), ours, *found)
    assert result.skipped is not None and result.skipped.startswith("union overflow at step")
    assert not result.equal and result.mismatches == []


def test_compare_records_names_a_missing_step():
    records = run_sequence(oracle, build_sequence(0, SHAPES[1]))
    assert compare_records(records, records) == []
    assert compare_records(records, records[:-1]) == [(len(records) - 1, "step")]
    assert set(FIELDS) >= {"dgi", "lru", "stats", "hot_bytes", "tables_after_invalidate", "swap_host"}


def test_one_timed_step_is_equal_and_reports_both_sides(ours):
    figure = time_case(SMALL, oracle_peer(), ours, repeats=1)
    assert figure.same and figure.rows_copied > 0
    assert (figure.requests, figure.queries) == (2, 2)
    assert figure.peer_step_s > 0 and figure.ours_step_s > 0


def test_a_timed_step_that_differs_is_not_same(ours):
    figure = time_case(SMALL, Peer("tampered", _Tampered(at=0, argument=5)), ours, repeats=1)
    assert not figure.same


def test_main_writes_the_sequences_and_timing_json(tmp_path, capsys):
    rc = kernel_peer.main(["--out", str(tmp_path), "--seeds", "1", "--requests", "2", "--queries", "1,4",
                           "--top-k", "64", "--context", "256", "--repeats", "1"])
    text = capsys.readouterr().out
    assert rc == 0, text
    sequences = json.loads((tmp_path / "sequences.json").read_text())
    timing = json.loads((tmp_path / "timing.json").read_text())
    assert sequences["peer"] == "oracle" and sequences["ours"] == "host"
    assert len(sequences["sequences"]) == len(SHAPES)
    assert [(f["requests"], f["queries"], f["same"]) for f in timing["figures"]] == [(2, 1, True), (2, 4, True)]
    assert "oracle step ms" in text and "ours step ms" in text


@pytest.mark.parametrize("option", ["--seeds", "--repeats"])
def test_main_refuses_a_count_below_one(tmp_path, option):
    with pytest.raises(InvalidArgumentError, match=f"{option} must be at least 1, got 0"):
        kernel_peer.main(["--out", str(tmp_path / "never"), option, "0"])
    assert not (tmp_path / "never").exists()


@pytest.mark.parametrize(("option", "value"), [("--requests", "64,0"), ("--queries", "one")])
def test_main_refuses_a_bad_list_before_writing(tmp_path, option, value):
    with pytest.raises(InvalidArgumentError, match=f"{option} must be positive integers .*got '{value}'"):
        kernel_peer.main(["--out", str(tmp_path / "never"), option, value])
    assert not (tmp_path / "never").exists()


def _seed_without_overflow(shape: int) -> int:
    return next(seed for seed in range(100)
                if not any(r.error for r in run_sequence(oracle, build_sequence(seed, SHAPES[shape]))))


def _sources(tmp_path: Path) -> tuple[Path, Path]:
    sources = tmp_path / "src"
    (sources / "csrc").mkdir(parents=True)
    (sources / "csrc" / "a.cu").write_bytes(b"kernel bytes")
    (sources / "LICENSE").write_bytes(b"license")
    sums = tmp_path / "SHA256SUMS"
    sums.write_text("".join(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.relative_to(sources)}\n"
                            for p in (sources / "csrc" / "a.cu", sources / "LICENSE")))
    return sources, sums


def test_check_sources_accepts_the_listed_files(tmp_path):
    sources, sums = _sources(tmp_path)
    assert vllm_extension.check_sources(sources, sums) == [sources / "csrc" / "a.cu", sources / "LICENSE"]


def test_check_sources_names_a_changed_or_missing_file(tmp_path):
    sources, sums = _sources(tmp_path)
    (sources / "csrc" / "a.cu").write_bytes(b"kernel bytez")
    with pytest.raises(InvalidArgumentError, match=r"a\.cu has sha256 [0-9a-f]{64}, .*SHA256SUMS expects"):
        vllm_extension.check_sources(sources, sums)
    (sources / "csrc" / "a.cu").unlink()
    with pytest.raises(InvalidArgumentError, match=r"a\.cu is missing .*run ci/prepare-vllm-peer\.sh"):
        vllm_extension.check_sources(sources, sums)
    with pytest.raises(InvalidArgumentError, match="nothing.txt does not exist"):
        vllm_extension.check_sources(sources, tmp_path / "nothing.txt")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal where torch has no CUDA device")
def test_build_refuses_without_cuda_before_compiling(tmp_path):
    sources, sums = _sources(tmp_path)
    with pytest.raises(UnsupportedCapabilityError, match="needs a CUDA device .*torch " + re.escape(torch.__version__)):
        vllm_extension.build(sources, tmp_path / "binding.cpp", sums, tmp_path / "build")
    assert not (tmp_path / "build").exists()
