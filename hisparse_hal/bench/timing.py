"""One way to time a benchmark path: warm-up, then repeated runs, each between two waits for the backend's queued
work (``HiSparseBackend.synchronize``), best and median kept."""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable

import torch

__all__ = ["Timing", "on_accelerator", "time_runs"]


@dataclasses.dataclass(frozen=True)
class Timing:
    """Seconds of the fastest and the median of ``runs`` timed runs."""

    best_s: float
    median_s: float
    runs: int


def on_accelerator(device: torch.device) -> bool:
    """Whether ``device`` is torch's current accelerator (``torch.accelerator``, torch 2.6), whose work is queued on
    streams and whose memory has allocator statistics; False for the host."""
    if not torch.accelerator.is_available():
        return False
    accelerator = torch.accelerator.current_accelerator()
    return accelerator is not None and device.type == accelerator.type


def time_runs(
    fn: Callable[[], object],
    repeats: int,
    synchronize: Callable[[], object] | None = None,
    warmup: int = 1,
    before: Callable[[], object] | None = None,
) -> Timing:
    """Time ``fn`` over ``repeats`` runs after ``warmup`` untimed ones.

    Args:
        fn: the path to time.
        repeats: timed runs (at least one).
        synchronize: called before each timer start and after each run, so the timer measures completed work:
            the backend's ``synchronize`` (None: host work only, complete when ``fn`` returns).
        warmup: untimed runs first (compiles kernels, fills caches).
        before: run untimed before every run, warm-up included (e.g. restore the state ``fn`` consumes).

    Returns:
        The fastest and the median run.

    Raises:
        ValueError: ``repeats`` is below one.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    for _ in range(warmup):
        if before is not None:
            before()
        fn()
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        if synchronize is not None:
            synchronize()
        start = time.perf_counter()
        fn()
        if synchronize is not None:
            synchronize()
        times.append(time.perf_counter() - start)
    return Timing(min(times), statistics.median(times), repeats)
