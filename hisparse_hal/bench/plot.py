"""``hisparse-hal bench --plot FILE.png``: swap throughput against block size, ours beside the loop and one copy.

Needs matplotlib (the optional extra ``[plot]``: ``pip install -e '.[plot]'`` from the checkout),
imported only when a plot is asked for; it draws on the non-interactive Agg canvas, so no display is needed.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..errors import BackendUnavailableError

if TYPE_CHECKING:
    from .swaps import SwapFigure

__all__ = ["plot_swaps"]


def _block_label(size: int) -> str:
    for unit, shift in (("MiB", 20), ("KiB", 10)):
        if size >= 1 << shift and size % (1 << shift) == 0:
            return f"{size >> shift} {unit}"
    return f"{size} B"


def plot_swaps(figures: Sequence[SwapFigure], path: str, title: str) -> None:
    """Write a PNG of GB/s against block size (log scale) for our swaps, the plain loop and one copy.

    Args:
        figures: one :class:`~hisparse_hal.bench.swaps.SwapFigure` per block size.
        path: where to write the PNG.
        title: the plot's title (backend, device, date).

    Raises:
        BackendUnavailableError: matplotlib is not installed (``pip install -e '.[plot]'``).
    """
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise BackendUnavailableError(
            f"bench --plot needs matplotlib ({exc}); install it from the checkout with: pip install -e '.[plot]'"
        ) from None
    rows = sorted(figures, key=lambda f: f.block_bytes)
    blocks = [f.block_bytes for f in rows]
    figure = Figure(figsize=(7.5, 5.0), dpi=120)
    axes = figure.add_subplot()
    loop_kind = rows[0].loop_kind if rows else "loop"
    ours_style = {"marker": "o", "linewidth": 2.4, "color": "#1f5fbf"}
    copy_style = {"marker": "^", "linestyle": "--", "color": "#555555"}
    for values, label, style in (
        ([f.ours_gbps for f in rows], "swap_blocks_batch (ours)", ours_style),
        ([f.loop_gbps for f in rows], f"plain alternative ({loop_kind})", {"marker": "s", "color": "#c0504d"}),
        ([f.one_copy_gbps for f in rows], "one contiguous copy (limit)", copy_style),
    ):
        axes.plot(blocks, values, label=label, **style)
    axes.set_xscale("log", base=2)
    # Ratios go under each block size, where they cannot hide a line.
    ticks = [
        f"{_block_label(f.block_bytes)}\n{f.speedup_vs_loop:.1f}x loop\n{f.fraction_of_limit:.0%} of copy" for f in rows
    ]
    axes.set_xticks(blocks, ticks, fontsize=8)
    axes.set_xlim(blocks[0] / 1.6, blocks[-1] * 1.6) if blocks else None
    axes.set_xlabel("bytes per descriptor (block size); ours against the loop and against one copy")
    axes.set_ylabel("GB/s")
    top = max([f.ours_gbps for f in rows] + [f.loop_gbps for f in rows] + [f.one_copy_gbps for f in rows], default=1.0)
    axes.set_ylim(0, top * 1.3)
    axes.set_title(textwrap.fill(title, 80), fontsize=9)
    axes.grid(True, which="major", alpha=0.3)
    axes.legend(loc="upper left", fontsize=8, framealpha=0.9)
    figure.tight_layout()
    figure.savefig(path)
