"""Merge the conformance reports of a hardware matrix into one compatibility table.

Usage: ``python ci/merge_reports.py --out DIR REPORT [REPORT ...]`` where each REPORT is a
``results.json``, a directory holding one, or ``LABEL=path``. Writes ``DIR/compatibility.md`` (one row
per machine and backend, one column per area) and ``DIR/compatibility.json`` (the same, for tools).
Invariant: every input appears as one row; an area a run did not reach reads ``n/a``, never PASS; a run that
did not finish reads INCOMPLETE and a selection of the suite reads ``(partial)``, so neither passes for a full
run. The exit status is 0 only when every row is a full PASS (``--allow-partial``: partial passes count).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hisparse_hal.conformance.report import AREA_TITLES, AREAS, OUTCOMES, overall_verdict, selection_text, verdict

__all__ = ["load_report", "merge", "render_markdown", "main"]


def load_report(spec: str) -> tuple[str | None, dict[str, Any], str]:
    """``(label or None, results document, source path)`` for one REPORT argument.

    Raises:
        SystemExit: the file is missing or not a conformance results document.
    """
    given, sep, path_text = spec.partition("=")
    label: str | None = given
    if not sep or Path(spec).exists():
        label, path_text = None, spec
    path = Path(path_text)
    if path.is_dir():
        path = path / "results.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise SystemExit(f"merge_reports: cannot read {path}: {exc}") from None
    missing = {"suite_version", "backend", "facts", "summary", "tests"} - set(doc)
    if missing:
        raise SystemExit(f"merge_reports: {path} is not a conformance results.json (missing {sorted(missing)})")
    return label, doc, str(path)


def _device_label(facts: dict[str, Any]) -> str:
    probe = facts.get("probe", {}) or {}
    for key in ("device_names", "devices", "device_name", "gpu_names"):
        value = probe.get(key)
        if value:
            return ", ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    return str(facts.get("device", "?"))


def merge(reports: Sequence[tuple[str | None, dict[str, Any], str]]) -> dict[str, Any]:
    """The compatibility document: one row per report, with per-area counts and verdicts."""
    rows = []
    for label, doc, source in reports:
        facts = doc.get("facts", {})
        areas: dict[str, Any] = {}
        for area in AREAS:
            counts = {o: sum(1 for t in doc["tests"] if t["area"] == area and t["outcome"] == o) for o in OUTCOMES}
            areas[area] = {"verdict": verdict(counts) if any(counts.values()) else "n/a", **counts}
        archs = facts.get("architectures", [])
        rows.append({
            "label": label or f"{doc['backend']} on {_device_label(facts)}",
            "backend": doc["backend"],
            "device": _device_label(facts),
            "architectures": archs,
            "torch": facts.get("torch"),
            "suite_version": doc["suite_version"],
            "summary": doc["summary"],
            "verdict": overall_verdict(doc),
            "partial": bool(doc.get("incomplete")) or not (doc.get("selection") or {}).get("full_suite", False),
            "selection": selection_text(doc.get("selection")),
            "areas": areas,
            "failing": [t["id"] for t in doc["tests"] if t["outcome"] in ("failed", "xpassed")],
            "source": source,
        })
    return {"areas": list(AREAS), "suite_versions": sorted({r["suite_version"] for r in rows}), "rows": rows}


def _cell(area: dict[str, Any]) -> str:
    if area["verdict"] == "n/a":
        return "n/a"
    ran = area["passed"] + area["failed"] + area["xfailed"] + area["xpassed"]
    text = f"{area['verdict']} {area['passed']}/{ran}"
    extra = [f"{area[k]} {k}" for k in ("xfailed", "skipped") if area[k]]
    return text + (f" ({', '.join(extra)})" if extra else "")


def render_markdown(merged: dict[str, Any]) -> str:
    """The compatibility table as Markdown, failing tests listed under it."""
    header = ["Backend / machine", "Arch", "torch", *(AREA_TITLES[a] for a in merged["areas"]), "Overall"]
    lines = [
        "# hisparse-hal compatibility",
        "",
        f"Suite versions: {', '.join(merged['suite_versions']) or 'none'}.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for row in merged["rows"]:
        cells = [row["label"], ", ".join(row["architectures"]) or "-", str(row["torch"] or "-"),
                 *(_cell(row["areas"][a]) for a in merged["areas"]), f"**{row['verdict']}**"]
        lines.append("| " + " | ".join(cells) + " |")
    partial = [row for row in merged["rows"] if row["partial"]]
    if partial:
        lines += ["", "## Partial or unfinished runs", ""]
        lines += [f"- {row['label']}: **{row['verdict']}**; {row['selection']}" for row in partial]
    failing = [row for row in merged["rows"] if row["failing"]]
    if failing:
        lines += ["", "## Failing tests", ""]
        for row in failing:
            shown = row["failing"][:15]
            more = f" and {len(row['failing']) - 15} more" if len(row["failing"]) > 15 else ""
            lines.append(f"- {row['label']}: " + ", ".join(f"`{t}`" for t in shown) + more)
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns 0 when every row passes, 1 otherwise."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for compatibility.md and compatibility.json")
    parser.add_argument(
        "reports", nargs="+", metavar="REPORT", help="results.json, a directory with one, or LABEL=path"
    )
    parser.add_argument("--allow-partial", action="store_true",
                        help="exit 0 when every row passes, even rows that ran a selection of the suite")
    args = parser.parse_args(argv)
    merged = merge([load_report(spec) for spec in args.reports])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compatibility.json").write_text(json.dumps(merged, indent=2) + "\n", encoding="utf-8")
    (out / "compatibility.md").write_text(render_markdown(merged), encoding="utf-8")
    print(render_markdown(merged))
    passing = ("PASS", "PASS (partial)") if args.allow_partial else ("PASS",)
    return 0 if all(row["verdict"] in passing for row in merged["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
