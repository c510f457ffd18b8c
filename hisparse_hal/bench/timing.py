"""One way to time a benchmark path: warm-up, then repeated runs, device-synchronized, best and median kept."""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable

import torch

__all__ = ["Timing", "sync", "time_runs"]


@dataclasses.dataclass(frozen=True)
class Timing:
    """Seconds of the fastest and the median of ``runs`` timed runs."""

    best_s: float
    median_s: float
    runs: int


def sync(device: torch.device | None) -> None:
    """Wait for ``device``'s queued work (a no-op for host devices), so a timer measures completed work."""
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def time_runs(
    fn: Callable[[], object],
    repeats: int,
    device: torch.device | None = None,
    warmup: int = 1,
    before: Callable[[], object] | None = None,
) -> Timing:
    """Time ``fn`` over ``repeats`` runs after ``warmup`` untimed ones.

    Args:
        fn: the path to time.
        repeats: timed runs (at least one).
        device: synchronized before each timer start and after each run (None: host only).
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
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return Timing(min(times), statistics.median(times), repeats)
