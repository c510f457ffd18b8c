"""``hisparse-hal bench``: every option checked before anything is measured or allocated, each with a one-line
error naming the option and the value (the benchmarks' own checks stay as a second guard).
"""

from __future__ import annotations

import argparse
import math

from hisparse_hal.cache_ops.shapes import BLOCK, ROW_BYTES, TOP_K
from hisparse_hal.errors import InvalidArgumentError
from hisparse_hal.memory_budget import check_fits
from hisparse_hal.output_checks import require_module, writable_file

from .options import MODE_OPTIONS

__all__ = ["validate", "positive_ints", "min_context", "swap_bytes_needed", "cache_ops_bytes_needed", "check_mode"]

#: Share of each row's top-k the cache-ops benchmark replaces between two steps (CacheOpsCase.churn).
CHURN = 0.1
#: Python memmove-loop entry per descriptor of the swap benchmark's plain alternative (tuple of three ints).
_LOOP_ENTRY_BYTES = 200
_SMALLEST_SWAP_BLOCK = 656


def check_mode(args: argparse.Namespace) -> None:
    """One benchmark mode per run, and no option of another mode.

    Raises:
        InvalidArgumentError: two modes (naming both), or an option the chosen mode does not read (naming it).
    """
    modes = [m for m in MODE_OPTIONS if m and getattr(args, m[2:].replace("-", "_"), False)]
    if len(modes) > 1:
        named = ", ".join(modes[:-1]) + f" and {modes[-1]}"
        raise InvalidArgumentError(f"{named} are separate benchmarks; run one at a time")
    mode = modes[0] if modes else None
    given: set[str] = getattr(args, "given", set())
    for other, options in MODE_OPTIONS.items():
        unused = [o for o in options if o in given and other != mode]
        if not unused:
            continue
        if mode is None:
            raise InvalidArgumentError(f"{unused[0]} is an option of {other}; add {other} or drop {unused[0]}")
        owner = other or "the swap benchmark (no mode option)"
        raise InvalidArgumentError(f"{unused[0]} does nothing with {mode}: it is an option of {owner}")


def positive_ints(text: str, option: str) -> list[int]:
    """``"64,128"`` -> ``[64, 128]``.

    Raises:
        InvalidArgumentError: empty, not integers, or not positive.
    """
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or any(v <= 0 for v in values):
        raise InvalidArgumentError(f"{option} must be positive integers separated by commas, got {text!r}")
    return values


def min_context() -> int:
    """The smallest ``--context``: top-k plus the rows that change each step, rounded up to a block."""
    needed = TOP_K + int(TOP_K * CHURN)
    return math.ceil(needed / BLOCK) * BLOCK


def swap_bytes_needed(swap_mib: int) -> int:
    """Host memory of the swap benchmark's largest case: source, destination and check copy, plus the plain
    loop's per-descriptor entries at the smallest block size."""
    nbytes = swap_mib << 20
    return 3 * nbytes + (nbytes // _SMALLEST_SWAP_BLOCK) * (_LOOP_ENTRY_BYTES + 24)


def cache_ops_bytes_needed(requests: int, queries: int, context: int) -> int:
    """Memory of one cache-ops case: the host pool, the hot cache and the per-row index tensors."""
    pages = context // BLOCK
    host = (1 + requests * pages) * BLOCK * ROW_BYTES
    hot = requests * (queries + 1) * TOP_K * ROW_BYTES
    indices = requests * queries * TOP_K * 4 * 10 + requests * (queries + 1) * TOP_K * 6
    return host + hot + indices


def validate(args: argparse.Namespace) -> None:
    """Check every ``bench`` option for the mode asked for, output paths and optional modules included.

    Raises:
        InvalidArgumentError: the first bad option, named with its value.
    """
    if args.repeats < 1:
        raise InvalidArgumentError(f"--repeats must be at least 1, got {args.repeats}")
    check_mode(args)
    if args.json:
        writable_file(args.json, "--json")
    if args.plot:
        require_module("matplotlib", "plot", "bench --plot")
        writable_file(args.plot, "--plot")
    if args.cache_ops:
        requests = positive_ints(args.requests, "--requests")
        queries = positive_ints(args.queries, "--queries")
        least = min_context()
        if args.context < least or args.context % BLOCK:
            raise InvalidArgumentError(
                f"--context must be a multiple of {BLOCK} and at least {least} (top-k {TOP_K} plus the "
                f"{CHURN:.0%} of it that changes each step), got {args.context}"
            )
        check_fits(cache_ops_bytes_needed(max(requests), max(queries), args.context),
                   f"bench --cache-ops with --requests {max(requests)} --queries {max(queries)} "
                   f"--context {args.context}")
        return
    if args.submission:
        return
    if getattr(args, "pinning", False):
        positive_ints(args.pin_chunks, "--pin-chunks")
        if args.pin_mib < 1:
            raise InvalidArgumentError(f"--pin-mib must be at least 1 (MiB of host pool), got {args.pin_mib}")
        check_fits(args.pin_mib << 20, f"bench --pinning --pin-mib {args.pin_mib}")
        return
    if args.swap_mib < 1:
        raise InvalidArgumentError(f"--swap-mib must be at least 1 (MiB per swap case), got {args.swap_mib}")
    check_fits(swap_bytes_needed(args.swap_mib), f"bench --swap-mib {args.swap_mib}")
