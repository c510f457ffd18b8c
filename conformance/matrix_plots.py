"""Inline SVG bar charts of a ``hisparse-hal bench --json`` document, for the matrix page.

Invariant: a chart draws only numbers the document holds (a missing or non-numeric figure leaves its bar out,
never a zero bar), each bar carries its exact value as a tooltip, and nothing refers outside the SVG.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

__all__ = ["bar_chart_svg", "bench_charts"]

_SERIES_COLOURS = ("#1f6fb2", "#e08a1e", "#5b8c3a", "#8e5ba8", "#c0392b", "#607d8b")
_WIDTH, _HEIGHT, _LEFT, _RIGHT, _TOP, _BOTTOM = 680, 270, 56, 12, 48, 40


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _nice_ceiling(value: float) -> float:
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    return next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= value)


def _short(value: float) -> str:
    return f"{value:.3g}"


def bar_chart_svg(title: str, unit: str, series: Sequence[str],
                  groups: Sequence[tuple[str, Sequence[float | None]]]) -> str:
    """One grouped bar chart as an ``<svg>`` element: a group of bars per x label, one bar per series.

    Args:
        title: drawn above the chart (include what is measured).
        unit: the y axis' unit, shown on the axis and in each bar's tooltip.
        series: the name of each bar within a group (the legend).
        groups: ``(x label, values)`` with one value per series; None leaves that bar out.
    """
    values = [v for _, vs in groups for v in vs if v is not None]
    top = _nice_ceiling(max(values, default=1.0))
    plot_w, plot_h = _WIDTH - _LEFT - _RIGHT, _HEIGHT - _TOP - _BOTTOM
    parts = [f'<svg class="chart" width="{_WIDTH}" height="{_HEIGHT}" '
             f'viewBox="0 0 {_WIDTH} {_HEIGHT}" role="img" aria-label="{escape(title)}">',
             f"<title>{escape(title)}</title>",
             f'<text x="{_LEFT}" y="16" font-size="13" font-weight="600">{escape(title)}</text>']
    x = _LEFT
    for n, name in enumerate(series):  # legend
        colour = _SERIES_COLOURS[n % len(_SERIES_COLOURS)]
        parts.append(f'<rect x="{x}" y="26" width="10" height="10" fill="{colour}"/>'
                     f'<text x="{x + 14}" y="35" font-size="11">{escape(name)}</text>')
        x += 24 + 7 * len(name)
    for k in range(5):  # y axis ticks
        tick = top * k / 4
        y = _TOP + plot_h - plot_h * k / 4
        parts.append(f'<line x1="{_LEFT}" x2="{_LEFT + plot_w}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e2e2e2"/>'
                     f'<text x="{_LEFT - 4}" y="{y + 4:.1f}" font-size="10" text-anchor="end">{_short(tick)}</text>')
    parts.append(f'<text x="12" y="{_TOP + plot_h / 2:.1f}" font-size="11" text-anchor="middle" '
                 f'transform="rotate(-90 12 {_TOP + plot_h / 2:.1f})">{escape(unit)}</text>')
    group_w = plot_w / max(len(groups), 1)
    bar_w = group_w * 0.8 / max(len(series), 1)
    for g, (label, group_values) in enumerate(groups):
        x0 = _LEFT + g * group_w + group_w * 0.1
        for n, value in enumerate(group_values):
            if value is None:
                continue
            h = plot_h * value / top
            bx, by = x0 + n * bar_w, _TOP + plot_h - h
            parts.append(f'<rect x="{bx:.1f}" y="{by:.1f}" width="{bar_w - 1:.1f}" height="{h:.1f}" '
                         f'fill="{_SERIES_COLOURS[n % len(_SERIES_COLOURS)]}"><title>{escape(label)}, '
                         f"{escape(series[n])}: {_short(value)} {escape(unit)}</title></rect>"
                         f'<text x="{bx + bar_w / 2:.1f}" y="{by - 2:.1f}" font-size="9" '
                         f'text-anchor="middle">{_short(value)}</text>')
        parts.append(f'<text x="{x0 + group_w * 0.4:.1f}" y="{_TOP + plot_h + 16}" font-size="11" '
                     f'text-anchor="middle">{escape(label)}</text>')
    parts.append(f'<line x1="{_LEFT}" x2="{_LEFT + plot_w}" y1="{_TOP + plot_h}" y2="{_TOP + plot_h}" '
                 'stroke="#555"/></svg>')
    return "".join(parts)


def _bytes(n: Any) -> str:
    if not isinstance(n, int):
        return str(n)
    for unit, size in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def _entries(bench: Mapping[str, Any], key: str) -> list[Mapping[str, Any]]:
    value = bench.get(key)
    return [e for e in value if isinstance(e, Mapping)] if isinstance(value, list) else []


def _swap_chart(bench: Mapping[str, Any]) -> str | None:
    rows = _entries(bench, "swaps")
    if not rows:
        return None
    keys = ("ours_gbps", "loop_gbps", "one_copy_gbps")
    return bar_chart_svg("swap_blocks_batch, device to host, by block size", "GB/s",
                         ("ours", "per-copy loop", "one copy"),
                         [(_bytes(r.get("block_bytes")), [_number(r.get(k)) for k in keys]) for r in rows])


def _gather_chart(bench: Mapping[str, Any]) -> str | None:
    rows = _entries(bench, "gathers")
    if not rows:
        return None
    keys = ("ours_gbps", "reference_gbps", "one_copy_gbps")
    return bar_chart_svg("gather_resident_rows, 656-byte rows, by row count", "GB/s", ("ours", "reference", "one copy"),
                         [(f"{r.get('rows')} rows", [_number(r.get(k)) for k in keys]) for r in rows])


def _cache_ops_chart(bench: Mapping[str, Any]) -> str | None:
    rows = _entries(bench, "figures")
    if not rows:
        return None
    implementations = list(dict.fromkeys(str(r.get("implementation")) for r in rows))
    cases: dict[str, dict[str, float | None]] = {}
    for r in rows:
        case: Mapping[str, Any] = r["case"] if isinstance(r.get("case"), Mapping) else {}
        label = f"{case.get('requests', '?')} req x {case.get('queries', '?')} q"
        step = _number(r.get("step_s"))
        cases.setdefault(label, {})[str(r.get("implementation"))] = None if step is None else step * 1e3
    return bar_chart_svg("cache ops: one decode step (resolve + compact)", "ms", implementations,
                         [(label, [by_impl.get(i) for i in implementations]) for label, by_impl in cases.items()])


def _submission_chart(bench: Mapping[str, Any]) -> str | None:
    rows = _entries(bench, "submission")
    if not rows:
        return None
    return bar_chart_svg("swap submission host cost (simulated vendor libraries)", "us per call",
                         ("ours (median)", "plain Python"),
                         [(f"{r.get('backend')} {r.get('descriptors')}", [_number(r.get("ours_median_us")),
                                                                         _number(r.get("plain_us"))]) for r in rows])


def bench_charts(bench: Mapping[str, Any]) -> list[str]:
    """The SVG charts for every kind of figure ``bench`` holds (swaps, gathers, cache ops, submission), each
    preceded by a line naming the backend, device and torch the document records."""
    charts = [c for c in (_swap_chart(bench), _gather_chart(bench), _cache_ops_chart(bench), _submission_chart(bench))
              if c is not None]
    facts = [f"{k} {bench[k]}" for k in ("backend", "device", "torch") if bench.get(k)]
    if charts and facts:
        charts.insert(0, f"<p>{escape('; '.join(facts))}</p>")
    return charts
