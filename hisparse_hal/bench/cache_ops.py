"""``hisparse-hal bench --cache-ops``: one decode step of the cache ops at DeepSeek-V3.2 HiSparse shapes.

Per case (656-byte fp8_ds_mla rows, top-k 2048, a 4096-slot hot buffer per request, 64 to 512 requests) it
times resolve_residency + gather_compact in the oracle, torch and Triton implementations on the same
warmed state, checks that they agree bit for bit, and sets gather_compact's bytes against one contiguous
copy of the same bytes. Figures are medians of device-synchronized repeats; state is restored untimed.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from hisparse_hal.cache_ops.shapes import BLOCK, ROW_BYTES, TOP_K
from hisparse_hal.errors import InvalidArgumentError

if TYPE_CHECKING:
    from hisparse_hal.backend import HiSparseBackend

__all__ = ["CacheOpsCase", "CacheOpsFigure", "bench_case", "add_arguments", "run", "DEFAULT_REQUESTS"]

DEFAULT_REQUESTS = (64, 128, 256, 512)


@dataclasses.dataclass(frozen=True)
class CacheOpsCase:
    """One benchmark shape: ``requests`` single-row decode requests of ``context`` tokens each."""

    requests: int
    context: int = 8192
    top_k: int = TOP_K
    slots: int = 2 * TOP_K  # device_buffer_size default (Q + 1) * K with Q = 1
    churn: float = 0.1  # share of the top-k that changes between two steps


@dataclasses.dataclass(frozen=True)
class CacheOpsFigure:
    """Median seconds of one step (resolve + compact) per implementation; NaN where not run."""

    case: CacheOpsCase
    implementation: str
    resolve_s: float
    compact_s: float
    repeats: int
    rows_copied: int
    one_copy_s: float
    matches_torch: bool | None

    @property
    def step_s(self) -> float:
        return self.resolve_s + self.compact_s

    @property
    def bytes_copied(self) -> int:
        return self.rows_copied * ROW_BYTES


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class _Step:
    """The tensors of one warmed decode step; :meth:`restore` puts the replacement state back."""

    def __init__(self, case: CacheOpsCase, backend: HiSparseBackend, seed: int = 0) -> None:
        device = backend.device
        if case.context < case.top_k or case.context % BLOCK or case.slots % BLOCK:
            raise InvalidArgumentError(
                f"context ({case.context}) must be >= top_k ({case.top_k}) and, like slots ({case.slots}), "
                f"a multiple of {BLOCK}"
            )
        r, k, h = case.requests, case.top_k, case.slots
        generator = torch.Generator().manual_seed(seed)
        pages = case.context // BLOCK
        host_rows = (1 + r * pages) * BLOCK  # host block 0 is the null block
        host = torch.empty(host_rows, ROW_BYTES, dtype=torch.uint8)
        host.view(-1)[::4096] = 1  # touch every page once so first-touch faults stay out of the timing
        self.backend = backend
        self.pinned = host
        if device.type != "cpu":
            backend.pin_tensor(host)
        self.host = backend.device_view_of_host(host)  # what CacheOps hands the implementations
        self.source = (1 + torch.arange(r * pages, dtype=torch.int32).view(r, pages)).to(device)
        hot_blocks = r * (h // BLOCK)
        self.hot = torch.zeros(hot_blocks, BLOCK, ROW_BYTES, dtype=torch.uint8, device=device)
        self.hot_table = torch.arange(hot_blocks, dtype=torch.int32).view(r, h // BLOCK).to(device)
        self.dgi = torch.full((r, h), -1, dtype=torch.int32, device=device)
        self.lru = torch.arange(h, dtype=torch.int16).repeat(r, 1).to(device)
        self.states = torch.arange(r, dtype=torch.int32, device=device)
        self.stats = torch.zeros(2, dtype=torch.uint64, device=device)
        first = torch.stack([torch.randperm(case.context, generator=generator)[:k] for _ in range(r)])
        changed = int(k * case.churn)
        second = first.clone()
        for row in range(r):
            unused = torch.ones(case.context, dtype=torch.bool)
            unused[first[row]] = False
            fresh = unused.nonzero().squeeze(1)
            second[row, :changed] = fresh[torch.randperm(fresh.numel(), generator=generator)[:changed]]
        self.warm_topk = first.to(torch.int32).to(device)
        self.topk = second.to(torch.int32).to(device)
        self.outputs = {
            name: torch.full((r, k), -1, dtype=torch.int32, device=device)
            for name in ("hot", "attention", "resolved", "swap_host", "swap_device", "miss")
        }
        self.valid = torch.zeros(r, dtype=torch.int32, device=device)
        self.swap_counts = torch.zeros(r, dtype=torch.int32, device=device)
        self.case = case
        self.saved: tuple[torch.Tensor, torch.Tensor] | None = None

    def resolve(self, ops: object, topk: torch.Tensor) -> None:
        out = self.outputs
        ops.resolve_residency(  # type: ignore[attr-defined]
            self.host, self.hot, self.hot_table, topk, out["hot"], self.dgi, self.lru, self.states,
            self.case.slots, self.case.top_k, out["miss"], self.stats, out["attention"], BLOCK, self.states,
            self.source, BLOCK, out["resolved"], self.valid, out["swap_host"], out["swap_device"],
            self.swap_counts, None, BLOCK, 0,
        )

    def compact(self, ops: object) -> None:
        out = self.outputs
        ops.gather_compact(self.host, self.hot, out["swap_host"], out["swap_device"], self.swap_counts)  # type: ignore[attr-defined]

    def release(self) -> None:
        if self.backend.device.type != "cpu":
            self.backend.unpin_tensor(self.pinned)

    def save(self) -> None:
        self.saved = (self.dgi.clone(), self.lru.clone())

    def restore(self) -> None:
        assert self.saved is not None
        self.dgi.copy_(self.saved[0])
        self.lru.copy_(self.saved[1])

    def result(self) -> tuple[torch.Tensor, ...]:
        return (self.outputs["hot"].clone(), self.dgi.clone(), self.lru.clone(), self.swap_counts.clone())


def _implementation(name: str) -> object:
    return importlib.import_module(f"hisparse_hal.cache_ops.{name}")


def _median(fn: Callable[[], object], before: Callable[[], object], device: torch.device, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        before()
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench_case(
    case: CacheOpsCase, backend: HiSparseBackend, implementations: dict[str, int]
) -> list[CacheOpsFigure]:
    """Time each implementation (module name -> repeats) on one case, on ``backend``'s device; the torch
    implementation's result is the comparison point.

    Returns:
        One figure per implementation, in the order given.
    """
    device = backend.device
    step = _Step(case, backend)
    try:
        return _bench_step(step, device, implementations)
    finally:
        step.release()


def _bench_step(step: _Step, device: torch.device, implementations: dict[str, int]) -> list[CacheOpsFigure]:
    case = step.case
    torch_ops = _implementation("torch_impl")
    step.resolve(torch_ops, step.warm_topk)  # warm the state: every request's first top-k is resident
    step.save()
    step.resolve(torch_ops, step.topk)
    reference = step.result()
    rows = int(step.swap_counts.sum())
    src = torch.empty(rows * ROW_BYTES, dtype=torch.uint8, pin_memory=device.type == "cuda")
    dst = torch.empty(rows * ROW_BYTES, dtype=torch.uint8, device=device)
    one_copy = _median(lambda: dst.copy_(src, non_blocking=True), lambda: None, device, 5)
    figures = []
    for name, repeats in implementations.items():
        ops = _implementation(name)
        step.restore()
        step.resolve(ops, step.topk)  # warm-up (compiles Triton kernels) and correctness check
        result = step.result()
        matches = all(torch.equal(a, b) for a, b in zip(result, reference, strict=True))
        resolve_s = _median(functools.partial(step.resolve, ops, step.topk), step.restore, device, repeats)
        compact_s = _median(functools.partial(step.compact, ops), lambda: None, device, repeats)
        figures.append(CacheOpsFigure(case, name, resolve_s, compact_s, repeats, rows, one_copy, matches))
    return figures


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options ``hisparse-hal bench`` gains for the cache ops."""
    parser.add_argument("--cache-ops", action="store_true",
                        help="benchmark the four cache ops' decode step (oracle, torch, triton) instead")
    parser.add_argument("--requests", default=",".join(map(str, DEFAULT_REQUESTS)),
                        help="comma-separated request counts for --cache-ops (default 64,128,256,512)")
    parser.add_argument("--context", type=int, default=8192, help="tokens of context per request (--cache-ops)")
    parser.add_argument("--no-oracle", action="store_true", help="skip the slow oracle (--cache-ops)")


def _requests(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or any(v <= 0 for v in values):
        raise InvalidArgumentError(f"--requests must be positive integers separated by commas, got {text!r}")
    return values


def run(args: argparse.Namespace) -> int:
    """Run the cache-ops benchmark on the selected backend's device and print the table."""
    from hisparse_hal.cache_ops.selection import choose_cache_ops, probe_triton
    from hisparse_hal.registry import get_backend

    backend = get_backend(args.backend)
    device = backend.device
    counts = sorted(_requests(args.requests))
    choice, reason = choose_cache_ops(device)
    interpreted = device.type != "cuda"
    if interpreted:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # read when the kernels are first defined
    triton = probe_triton()
    print(f"cache ops on {backend.name} ({device}), torch {torch.__version__}; capability picks {choice}: {reason}")
    print(f"rows {ROW_BYTES} B, top-k {TOP_K}, {2 * TOP_K} hot slots per request, context {args.context} tokens, "
          "10% of the top-k new each step; resolve + gather_compact per step, median of repeats")
    if triton.version is None:
        print(f"triton is not measured: it does not import ({triton.error})")
    elif interpreted:
        print(f"triton runs in its CPU interpreter (TRITON_INTERPRET=1), so only on the smallest case "
              f"({counts[0]} requests) and once: its time says nothing about a GPU")
    print()
    header = (f"{'requests':>8} {'impl':>8} {'resolve ms':>11} {'compact ms':>11} {'step ms':>9} {'x oracle':>9} "
              f"{'x torch':>8} {'rows':>7} {'MB':>7} {'1 copy ms':>10} {'compact/copy':>13} {'same':>5}")
    print(header)
    figures: list[CacheOpsFigure] = []
    for index, requests in enumerate(counts):
        plan: dict[str, int] = {}
        if not args.no_oracle:
            plan["oracle"] = 1
        plan["torch_impl"] = args.repeats
        if triton.version is not None and (not interpreted or index == 0):
            plan["triton_impl"] = args.repeats if not interpreted else 1
        case = CacheOpsCase(requests, context=args.context)
        rows = bench_case(case, backend, plan)
        figures.extend(rows)
        by_name = {f.implementation: f for f in rows}
        for f in rows:
            oracle = by_name.get("oracle")
            versus_oracle = f"{oracle.step_s / f.step_s:8.1f}x" if oracle else f"{'-':>9}"
            versus_torch = by_name["torch_impl"].step_s / f.step_s
            print(f"{requests:>8} {f.implementation.removesuffix('_impl'):>8} {f.resolve_s * 1e3:>11.2f} "
                  f"{f.compact_s * 1e3:>11.2f} {f.step_s * 1e3:>9.2f} {versus_oracle} {versus_torch:>7.2f}x "
                  f"{f.rows_copied:>7} {f.bytes_copied / 1e6:>7.2f} {f.one_copy_s * 1e3:>10.3f} "
                  f"{f.compact_s / f.one_copy_s:>12.1f}x {'yes' if f.matches_torch else 'NO':>5}")
    if args.json:
        payload = [dict(dataclasses.asdict(f), step_s=f.step_s, bytes_copied=f.bytes_copied) for f in figures]
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"device": str(device), "torch": torch.__version__, "figures": payload}, handle, indent=2)
    return 0 if all(f.matches_torch for f in figures) else 1
