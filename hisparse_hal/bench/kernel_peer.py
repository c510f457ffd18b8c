"""The kernel peer check: a peer implementation of the four cache ops against ours, bit for bit after every step
of the generated decode sequences, and one decode step's time side by side (``ci/gpu-check.sh``, step vllm-peer).

The peer is pluggable: on a GPU, vLLM 0.34.0's own kernels built from its sdist (:mod:`.vllm_extension`); on CPU
the oracle stands in for it, so the comparison and the timing are tested without a GPU. "Ours" is the backend's
``create_cache_ops`` (Triton on a GPU, the host implementation on CPU). Nothing in the package imports this.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from hisparse_hal.cache_ops import oracle
from hisparse_hal.errors import InvalidArgumentError
from hisparse_hal.testing.sequences import (
    SHAPES,
    CacheOpsLike,
    DecodeSequence,
    SequenceRun,
    StepRecord,
    build_sequence,
    run_sequence,
)

from .arguments import positive_ints
from .cache_ops import CacheOpsCase, _Step
from .table import Column, format_table, write_json
from .timing import time_runs

__all__ = [
    "FIELDS",
    "OurOps",
    "Peer",
    "SequenceResult",
    "StepFigure",
    "compare_records",
    "compare_sequence",
    "compare_sequences",
    "main",
    "oracle_peer",
    "time_case",
]

#: What is compared after every step: every output, the state (DGI, LRU, stats), the typed error, the hot and
#: staging bytes, and every group's table after invalidation.
FIELDS: tuple[str, ...] = (
    "hot_indices", "attention_indices", "valid_counts", "swap_host", "swap_device", "swap_counts",
    "dgi", "lru", "stats", "error", "hot_bytes", "staging_bytes", "tables_after_invalidate",
)


@dataclasses.dataclass(frozen=True)
class Peer:
    """One peer implementation.

    Attributes:
        name: how tables and JSON name it (``"oracle"``, ``"vllm"``).
        ops: the four ops, called positionally.
        pinned_host: wants ``host_cache`` as pinned CPU memory (vLLM's kernels check it,
            ``hisparse_kernels.cu:1037-1038``), not a device view of it.
    """

    name: str
    ops: CacheOpsLike
    pinned_host: bool = False


def oracle_peer() -> Peer:
    """The CPU stand-in: the reference implementation, on host tensors."""
    return Peer("oracle", oracle)


def _fields(record: StepRecord) -> dict[str, Any]:
    return {**record.outputs, "dgi": record.dgi, "lru": record.lru, "stats": record.stats, "error": record.error,
            "hot_bytes": record.hot_bytes, "staging_bytes": record.staging_bytes,
            "tables_after_invalidate": record.tables_after_invalidate}


def compare_records(peer: Sequence[StepRecord], ours: Sequence[StepRecord]) -> list[tuple[int, str]]:
    """``(step, field)`` for every field of :data:`FIELDS` that differs, step by step (a missing step is
    ``(step, "step")``)."""
    mismatches = []
    for index in range(max(len(peer), len(ours))):
        if index >= len(peer) or index >= len(ours):
            mismatches.append((index, "step"))
            continue
        theirs, mine = _fields(peer[index]), _fields(ours[index])
        mismatches.extend((index, name) for name in FIELDS if theirs[name] != mine[name])
    return mismatches


@dataclasses.dataclass(frozen=True)
class SequenceResult:
    """One sequence's comparison. ``skipped`` says why it was not run (a union overflow: vLLM's kernel traps,
    ``hisparse_kernels.cu:563-571``, and the device context is lost); ``error`` a call that raised."""

    shape: int
    seed: int
    steps: int
    mismatches: list[tuple[int, str]]
    skipped: str | None = None
    error: str | None = None

    @property
    def equal(self) -> bool:
        return self.skipped is None and self.error is None and not self.mismatches


class OurOps:
    """Our side of a comparison: a backend and the cache ops its ``create_cache_ops`` returns."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.ops = backend.create_cache_ops(None)
        self.device = backend.device


def _run_ours(ours: OurOps, sequence: DecodeSequence) -> list[StepRecord]:
    """Our ops on ``sequence``: host cache on CPU, pinned by the backend on a GPU (its device view is used)."""
    run = SequenceRun(sequence, ours.device, host_device="cpu")
    pinned = ours.device.type != "cpu"
    if pinned:
        ours.backend.pin_tensor(run.host)
    try:
        return run_sequence(ours.ops, sequence, run=run)
    finally:
        if pinned:
            ours.backend.unpin_tensor(run.host)


def _run_peer(peer: Peer, sequence: DecodeSequence, device: torch.device) -> list[StepRecord]:
    run = SequenceRun(sequence, device, host_device="cpu" if peer.pinned_host else device)
    if peer.pinned_host:
        run.host = run.host.pin_memory()
    return run_sequence(peer.ops, sequence, run=run)


def compare_sequence(peer: Peer, ours: OurOps, shape: int, seed: int) -> SequenceResult:
    """Build sequence ``seed`` of ``SHAPES[shape]``, screen it with the oracle (a union overflow is skipped),
    then run the peer and ours on it and compare every step."""
    sequence = build_sequence(seed, SHAPES[shape])
    screen = run_sequence(oracle, sequence)
    overflow = next((i for i, record in enumerate(screen) if record.error is not None), None)
    if overflow is not None:
        return SequenceResult(shape, seed, len(sequence.steps), [], skipped=f"union overflow at step {overflow}")
    try:
        theirs = _run_peer(peer, sequence, ours.device)
        mine = _run_ours(ours, sequence)
    except RuntimeError as exc:  # a failed launch or check; a lost device context stops the caller
        return SequenceResult(shape, seed, len(sequence.steps), [], error=f"{type(exc).__name__}: {exc}")
    return SequenceResult(shape, seed, len(sequence.steps), compare_records(theirs, mine))


def compare_sequences(peer: Peer, ours: OurOps, seeds: int) -> list[SequenceResult]:
    """Every shape of ``SHAPES`` with seeds ``0 .. seeds - 1``; stops after an error on a GPU (its context may
    be lost, so later results would say nothing)."""
    results = []
    for shape in range(len(SHAPES)):
        for seed in range(seeds):
            result = compare_sequence(peer, ours, shape, seed)
            results.append(result)
            if result.error is not None and ours.device.type != "cpu":
                return results
    return results


@dataclasses.dataclass(frozen=True)
class StepFigure:
    """One decode step (resolve + gather_compact) of one case: median seconds of the peer and of ours, and
    whether the step's results (hot indices, DGI, LRU, swap counts) were equal."""

    requests: int
    queries: int
    peer_resolve_s: float
    peer_compact_s: float
    ours_resolve_s: float
    ours_compact_s: float
    rows_copied: int
    same: bool

    @property
    def peer_step_s(self) -> float:
        return self.peer_resolve_s + self.peer_compact_s

    @property
    def ours_step_s(self) -> float:
        return self.ours_resolve_s + self.ours_compact_s


class _HostArgument:
    """``ops`` with argument 0 (``host_cache``) replaced: a peer that wants the pinned CPU tensor, where the
    benchmark step holds the backend's device view."""

    def __init__(self, ops: CacheOpsLike, host: torch.Tensor) -> None:
        self._ops, self._host = ops, host

    def resolve_residency(self, *args: Any) -> None:
        self._ops.resolve_residency(self._host, *args[1:])

    def gather_compact(self, *args: Any) -> None:
        self._ops.gather_compact(self._host, *args[1:])


def time_case(case: CacheOpsCase, peer: Peer, ours: OurOps, repeats: int) -> StepFigure:
    """Warm one case's state with our ops, then time the same next step with the peer's and ours (the state is
    restored before every run) and compare the two results."""
    step = _Step(case, ours.backend)
    try:
        peer_ops: Any = _HostArgument(peer.ops, step.pinned) if peer.pinned_host else peer.ops
        step.resolve(ours.ops, step.warm_topk)
        step.save()
        timed = {}
        results = []
        for name, ops in (("peer", peer_ops), ("ours", ours.ops)):
            step.restore()
            step.resolve(ops, step.topk)  # warm-up (compiles) and the result compared
            results.append(step.result())
            resolve = time_runs(functools.partial(step.resolve, ops, step.topk), repeats, ours.backend.synchronize,
                                warmup=0, before=step.restore)
            compact = time_runs(functools.partial(step.compact, ops), repeats, ours.backend.synchronize, warmup=0)
            timed[name] = (resolve.median_s, compact.median_s)
        same = all(torch.equal(a, b) for a, b in zip(*results, strict=True))
        rows = int(step.swap_counts.sum())
        return StepFigure(case.requests, case.queries, *timed["peer"], *timed["ours"], rows, same)
    finally:
        step.release()


def _columns(peer: str) -> tuple[Column, ...]:
    return (
        Column("req", 4, lambda f: f.requests),
        Column("Q", 2, lambda f: f.queries),
        Column(f"{peer} res ms", 12, lambda f: f.peer_resolve_s * 1e3, ".3f"),
        Column(f"{peer} cmp ms", 12, lambda f: f.peer_compact_s * 1e3, ".3f"),
        Column(f"{peer} step ms", 13, lambda f: f.peer_step_s * 1e3, ".3f"),
        Column("ours res ms", 12, lambda f: f.ours_resolve_s * 1e3, ".3f"),
        Column("ours cmp ms", 12, lambda f: f.ours_compact_s * 1e3, ".3f"),
        Column("ours step ms", 13, lambda f: f.ours_step_s * 1e3, ".3f"),
        Column("ours/peer", 10, lambda f: f"{f.ours_step_s / f.peer_step_s:.2f}x"),
        Column("rows", 7, lambda f: f.rows_copied),
        Column("same", 5, lambda f: "yes" if f.same else "NO"),
    )


def _peer(args: argparse.Namespace) -> Peer:
    if args.peer == "oracle":
        return oracle_peer()
    from .vllm_extension import build

    ops = build(Path(args.sources), Path(args.binding), Path(args.sums), Path(args.build_dir), args.verbose)
    return Peer("vllm", ops, pinned_host=True)


def _sequences_part(peer: Peer, ours: OurOps, args: argparse.Namespace, out: Path) -> bool:
    results = compare_sequences(peer, ours, args.seeds)
    ran = [r for r in results if r.skipped is None]
    equal = sum(r.equal for r in ran)
    print(f"sequences: {len(results)} built, {len(results) - len(ran)} skipped (union overflow: vLLM's kernel "
          f"traps), {len(ran)} run, {equal} equal on every field after every step")
    for result in [r for r in ran if not r.equal][:20]:
        what = result.error or ", ".join(f"step {s} {f}" for s, f in result.mismatches[:6])
        print(f"  shape {result.shape} seed {result.seed}: {what}")
    write_json(str(out / "sequences.json"), {
        "peer": peer.name, "ours": ours.ops.implementation, "device": str(ours.device), "fields": FIELDS,
        "sequences": [dataclasses.asdict(r) for r in results],
    })
    return equal == len(ran)


def _timing_part(peer: Peer, ours: OurOps, args: argparse.Namespace, out: Path) -> bool:
    cases = [CacheOpsCase(r, context=args.context, top_k=args.top_k, queries=q)
             for r in args.request_counts for q in args.query_counts]
    figures = [time_case(case, peer, ours, args.repeats) for case in cases]
    print(f"one decode step (resolve + gather_compact), median of {args.repeats}, top-k {args.top_k}, "
          f"context {args.context}, (Q + 1) x top-k hot slots; {peer.name} vs ours ({ours.ops.implementation})")
    print("\n".join(format_table(_columns(peer.name), figures)))
    payload = [dict(dataclasses.asdict(f), peer_step_s=f.peer_step_s, ours_step_s=f.ours_step_s) for f in figures]
    write_json(str(out / "timing.json"), {
        "peer": peer.name, "ours": ours.ops.implementation, "device": str(ours.device), "torch": torch.__version__,
        "load_average": list(os.getloadavg()) if os.name == "posix" else None, "figures": payload,
    })
    return all(f.same for f in figures)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m hisparse_hal.bench.kernel_peer", description=__doc__)
    parser.add_argument("--peer", choices=("oracle", "vllm"), default="oracle")
    parser.add_argument("--backend", default="cpu", help="the backend whose create_cache_ops is 'ours'")
    parser.add_argument("--out", required=True, help="folder for sequences.json and timing.json")
    parser.add_argument("--only", choices=("sequences", "timing"), help="run one part (default both)")
    parser.add_argument("--seeds", type=int, default=20, help="seeds per generated shape")
    parser.add_argument("--requests", default="64,128,256,512")
    parser.add_argument("--queries", default="1,2,4")
    parser.add_argument("--top-k", type=int, default=2048)
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--sources", default=".vllm-peer", help="the folder ci/prepare-vllm-peer.sh filled")
    parser.add_argument("--binding", default="ci/vllm_kernel_peer/binding.cpp")
    parser.add_argument("--sums", default="ci/vllm_kernel_peer/SHA256SUMS")
    parser.add_argument("--build-dir", default="/tmp/hisparse-vllm-peer-build")
    parser.add_argument("--verbose", action="store_true", help="print the compiler's command lines")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the check; exit 0 when every compared sequence and every timed step were equal.

    Raises:
        InvalidArgumentError: a count below one (``--seeds``, ``--repeats``) or a bad list (before anything is
            built or written).
    """
    args = _parser().parse_args(argv)
    for option in ("seeds", "repeats"):
        if getattr(args, option) < 1:
            raise InvalidArgumentError(f"--{option} must be at least 1, got {getattr(args, option)}")
    args.request_counts = positive_ints(args.requests, "--requests")
    args.query_counts = positive_ints(args.queries, "--queries")
    from hisparse_hal.registry import get_backend

    ours = OurOps(get_backend(args.backend))
    peer = _peer(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"peer {peer.name} vs ours ({ours.ops.implementation} on {ours.backend.name}, {ours.device}), "
          f"torch {torch.__version__}", flush=True)
    ok = True
    if args.only in (None, "sequences"):
        ok &= _sequences_part(peer, ours, args, out)
    if args.only in (None, "timing"):
        ok &= _timing_part(peer, ours, args, out)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
