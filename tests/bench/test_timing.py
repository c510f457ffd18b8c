"""The benchmarks' device waits (``bench/timing.py`` and its callers): every timed run sits between two calls of the
backend's ``synchronize()``, the swap and gather benchmarks wait through it before checking bytes, the cache-ops
peak memory reads the accelerator's allocator between two waits, and the host needs no side stream."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch

from hisparse_hal.bench import cache_ops, swaps
from hisparse_hal.bench.timing import on_accelerator, time_runs
from hisparse_hal.vendors.cpu.backend import CpuBackend


class CountingCpuBackend(CpuBackend):
    """The CPU device with its ``synchronize`` calls counted, in order with the swaps they follow."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[str] = []

    def synchronize(self) -> None:
        self.log.append("synchronize")
        super().synchronize()

    def swap_blocks_batch(self, src: torch.Tensor, dst: torch.Tensor, sizes: torch.Tensor) -> None:
        self.log.append("swap")
        super().swap_blocks_batch(src, dst, sizes)


def test_each_timed_run_is_between_two_waits_and_warm_ups_are_not() -> None:
    log: list[str] = []
    timing = time_runs(lambda: log.append("run"), 3, lambda: log.append("wait"), warmup=2,
                       before=lambda: log.append("before"))
    assert log == ["before", "run"] * 2 + ["before", "wait", "run", "wait"] * 3
    assert timing.runs == 3 and 0 <= timing.best_s <= timing.median_s


def test_without_a_wait_only_the_host_work_is_timed() -> None:
    log: list[str] = []
    time_runs(lambda: log.append("run"), 2, warmup=0)
    assert log == ["run", "run"]


def test_time_runs_refuses_zero_repeats() -> None:
    with pytest.raises(ValueError, match="repeats must be at least 1, got 0"):
        time_runs(lambda: None, 0)


def test_the_swap_benchmark_waits_through_the_backend_before_timers_and_the_byte_check(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(swaps, "SWAP_BLOCK_BYTES", (4096,))
    backend = CountingCpuBackend()
    figures = swaps.bench_swaps(backend, total_bytes=4 * 4096, repeats=2)
    assert [f.descriptors for f in figures] == [4]
    # ours (a warm-up swap, then 2 timed swaps each between two waits), the per-copy loop (memmoves on the
    # host, 2 timed runs between waits), one contiguous copy (likewise), the region check (host only, no wait),
    # then the swap whose bytes are checked, after a wait.
    timed_swaps = ["swap"] + ["synchronize", "swap", "synchronize"] * 2
    timed_other = ["synchronize", "synchronize"] * 2
    assert backend.log == timed_swaps + timed_other + timed_other + ["swap", "synchronize"]


def test_the_host_has_no_side_stream_and_is_not_an_accelerator() -> None:
    assert on_accelerator(torch.device("cpu")) is False
    assert isinstance(swaps.side_stream(torch.device("cpu")), contextlib.nullcontext)


def test_peak_memory_on_an_accelerator_reads_its_allocator_between_two_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The accelerator path with torch.accelerator's memory functions replaced by a recording allocator."""
    log: list[object] = []
    allocated = {"now": 1000, "peak": 1000}

    def allocate() -> None:
        log.append("fn")
        allocated["peak"] = allocated["now"] + 4096

    def reading(name: str, key: str | None) -> Any:
        def read(device: torch.device) -> int | None:
            log.append((name, device))
            return None if key is None else allocated[key]
        return read

    monkeypatch.setattr(cache_ops, "on_accelerator", lambda device: True)
    monkeypatch.setattr(torch.accelerator, "memory_allocated", reading("allocated", "now"))
    monkeypatch.setattr(torch.accelerator, "reset_peak_memory_stats", reading("reset", None))
    monkeypatch.setattr(torch.accelerator, "max_memory_allocated", reading("peak", "peak"))
    gpu = torch.device("cuda", 0)
    peak = cache_ops._peak_extra_bytes(allocate, gpu, lambda: log.append("wait"))
    assert peak == 4096
    assert log == ["wait", ("allocated", gpu), ("reset", gpu), "fn", "wait", ("peak", gpu)]
