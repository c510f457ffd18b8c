"""The hardware matrix: conformance report folders merged into one row each, written as Markdown, JSON and one
self-contained HTML page (inline CSS and SVG; no script, nothing fetched).

Invariant: a row never reads better than its report: a ``--strict`` failure reads FAIL, an area a run cut short
reads ``INCOMPLETE n/N``, an area a run did not reach reads ``n/a``, and a field an older report lacks reads
"not recorded".
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from html import escape
from pathlib import Path
from typing import Any

from hisparse_hal.errors import InvalidArgumentError

from .matrix_plots import bench_charts
from .report import AREA_TITLES, AREAS, OUTCOMES, area_verdict, overall_verdict, selection_text

__all__ = ["ReportInput", "NOT_RECORDED", "load_report", "merge", "render_markdown", "render_html", "write_outputs"]

NOT_RECORDED = "not recorded"
FAILING = ("failed", "xpassed")
_REQUIRED = {"suite_version", "backend", "facts", "summary", "tests"}
# Worse verdicts rank higher; a row shows the worse of its recorded verdict and what its counts say.
_RANK = {"PASS": 0, "PASS (partial)": 1, "SKIPPED": 2, "-": 2, "INCOMPLETE": 3, "FAIL": 4}


@dataclasses.dataclass(frozen=True)
class ReportInput:
    """One report folder to merge: its ``results.json`` document, where it came from, and its ``bench.json``
    document when the folder holds one."""

    label: str | None
    doc: dict[str, Any]
    source: str
    bench: dict[str, Any] | None = None


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InvalidArgumentError(f"cannot read {what} {path}: {exc}") from None


def load_report(spec: str) -> ReportInput:
    """Read one REPORT argument: a ``results.json``, a folder holding one, or ``LABEL=path``.

    A ``bench.json`` beside the ``results.json`` is read too.

    Raises:
        InvalidArgumentError: the file is missing, is not JSON, or is not a conformance results document (the
            message names the path and the missing keys or the malformed test entry), or a ``bench.json`` beside
            it cannot be read.
    """
    given, sep, path_text = spec.partition("=")
    label: str | None = given
    if not sep or Path(spec).exists():
        label, path_text = None, spec
    path = Path(path_text)
    if path.is_dir():
        path = path / "results.json"
    doc = _read_json(path, "report")
    if not isinstance(doc, dict) or _REQUIRED - set(doc):
        missing = sorted(_REQUIRED - set(doc)) if isinstance(doc, dict) else sorted(_REQUIRED)
        raise InvalidArgumentError(f"{path} is not a conformance results.json (missing {missing})")
    tests = doc["tests"] if isinstance(doc["tests"], list) else [doc["tests"]]
    malformed = [t for t in tests if not isinstance(t, dict) or {"id", "area", "outcome"} - set(t)]
    if malformed:
        raise InvalidArgumentError(f"{path}: every tests[] entry needs id, area and outcome; got {malformed[:1]}")
    bench_path = path.with_name("bench.json")
    bench = _read_json(bench_path, "benchmark figures") if bench_path.exists() else None
    if bench is not None and not isinstance(bench, dict):
        raise InvalidArgumentError(f"{bench_path} is not a 'hisparse-hal bench --json' document (not an object)")
    return ReportInput(label, doc, str(path), bench)


# ------------------------------------------------------------------------------------------ rows
def _device_label(facts: Mapping[str, Any]) -> str:
    probe = facts.get("probe", {}) or {}
    for key in ("device_names", "devices", "device_name", "gpu_names"):
        value = probe.get(key)
        if value:
            return ", ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    return str(facts.get("device", "?"))


def _worse(a: str, b: str) -> str:
    return a if _RANK.get(a, 3) >= _RANK.get(b, 3) else b


def _row_verdict(doc: Mapping[str, Any]) -> tuple[str, list[str]]:
    """The row's verdict and notes: the worse of the recorded ``verdict`` (format 2) and what the counts,
    ``incomplete`` and a strict run's unmatched expectation entries say."""
    computed = overall_verdict(doc)
    expectations = doc.get("expectations") or {}
    if expectations.get("strict") and expectations.get("unmatched") and computed != "INCOMPLETE":
        computed = "FAIL"
    recorded = doc.get("verdict")
    if not recorded:
        return computed, []
    notes = []
    mismatch = doc.get("device_mismatch")
    if isinstance(mismatch, Mapping) and mismatch.get("reason"):
        notes.append(str(mismatch["reason"]))
    if _RANK.get(computed, 3) > _RANK.get(str(recorded), 3):
        notes.append(f"results.json records {recorded}, but its outcomes say {computed}")
    return _worse(str(recorded), computed), notes


def _mode(doc: Mapping[str, Any]) -> str:
    """``full``, ``subset``, or ``subset smoke`` for a named subset (see conformance/subsets.py)."""
    mode = doc.get("mode") or NOT_RECORDED
    subset = (doc.get("selection") or {}).get("subset")
    return f"{mode} {subset}" if subset and mode != NOT_RECORDED else str(mode)


def _short_commit(commit: Any) -> str:
    if not commit:
        return NOT_RECORDED
    if commit == "not a checkout":
        return commit
    sha, _, rest = str(commit).partition(" ")
    return sha[:10] + (f" {rest}" if rest else "")


def _date(text: Any) -> str:
    if not text:
        return NOT_RECORDED
    text = str(text)
    utc = text.endswith(("Z", "+00:00"))
    return text[:16].replace("T", " ") + (" UTC" if utc else "")


def _run_fields(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The format-2 record of who ran what, where and when; "not recorded" for what an older report lacks."""
    run = doc.get("run") or {}
    device = run.get("device") or {}
    contract = doc.get("contract") or {}
    suite = doc.get("suite") or {}
    under_test = doc.get("backend_under_test") or {}
    return {
        "format": doc.get("format", 1),
        "contract": contract.get("id") or NOT_RECORDED,
        "contract_title": contract.get("title") or NOT_RECORDED,
        "mode": _mode(doc),
        "started": run.get("started") or NOT_RECORDED,
        "finished": run.get("finished") or NOT_RECORDED,
        "date": _date(run.get("started")),
        "hisparse_hal_version": run.get("hisparse_hal_version") or NOT_RECORDED,
        # A format-2 run records a null commit when hisparse-hal was not installed from a git checkout.
        "commit": run.get("commit") or ("not a checkout" if "commit" in run else NOT_RECORDED),
        "host": run.get("host") or NOT_RECORDED,
        "device_type": device.get("type") or NOT_RECORDED,
        "device_driver": device.get("driver") or NOT_RECORDED,
        "python": run.get("python") or (doc.get("facts") or {}).get("python") or NOT_RECORDED,
        "qualname": under_test.get("qualname") or (doc.get("facts") or {}).get("backend_class") or NOT_RECORDED,
        "kind": under_test.get("kind") or NOT_RECORDED,
        "suite_sha256": suite.get("sha256") or NOT_RECORDED,
    }


def _areas_of(doc: Mapping[str, Any], area_names: Sequence[str]) -> dict[str, dict[str, Any]]:
    per_area = (doc.get("selection") or {}).get("per_area")  # None: not recorded (a report before it was)
    incomplete = bool(doc.get("incomplete"))
    areas: dict[str, dict[str, Any]] = {}
    for area in area_names:
        counts = {o: sum(1 for t in doc["tests"] if t["area"] == area and t["outcome"] == o) for o in OUTCOMES}
        selected = None if per_area is None else per_area.get(area, 0)
        verdict_of_area = area_verdict(counts, None if selected is None else int(selected), incomplete)
        areas[area] = {"verdict": "n/a" if verdict_of_area == "-" else verdict_of_area, "selected": selected, **counts}
    return areas


def _row(report: ReportInput, area_names: Sequence[str]) -> dict[str, Any]:
    doc = report.doc
    facts = doc.get("facts", {}) or {}
    run = doc.get("run") or {}
    under_test = doc.get("backend_under_test") or {}
    backend_label = under_test.get("label") or facts.get("recipe") or doc["backend"]
    device = (run.get("device") or {}).get("name") or _device_label(facts)
    host = run.get("host")
    row_verdict, notes = _row_verdict(doc)
    expectations = doc.get("expectations") or {}
    failures = [{k: t.get(k, "") for k in ("id", "area", "outcome", "reason")}
                for t in doc["tests"] if t["outcome"] in FAILING]
    return {
        "label": report.label or f"{backend_label} on {device}" + (f" @ {host}" if host else ""),
        "backend": doc["backend"],
        "backend_label": backend_label,
        "device": device,
        "architectures": facts.get("architectures", []),
        "torch": run.get("torch") or facts.get("torch"),
        "suite_version": doc["suite_version"],
        "summary": doc["summary"],
        "verdict": row_verdict,
        "notes": notes,
        "partial": bool(doc.get("incomplete")) or not (doc.get("selection") or {}).get("full_suite", False),
        "selection": selection_text(doc.get("selection")),
        "incomplete": (doc.get("incomplete") or {}).get("reason") if doc.get("incomplete") else None,
        **_run_fields(doc),
        "areas": _areas_of(doc, area_names),
        "failing": [f["id"] for f in failures],
        "failures": failures,
        "strict_unmatched": list(expectations.get("unmatched") or []) if expectations.get("strict") else [],
        "claims": list(doc.get("claims") or []),
        "bench": report.bench,
        "source": report.source,
    }


def merge(reports: Sequence[ReportInput]) -> dict[str, Any]:
    """The compatibility document: one row per report (in the order given), with per-area counts and verdicts.

    Rows whose automatic labels coincide get their source path appended, so every row can be told apart.
    """
    extra = sorted({t["area"] for r in reports for t in r.doc["tests"]} - set(AREAS))
    area_names = [*AREAS, *extra]
    rows = [_row(r, area_names) for r in reports]
    labels = [row["label"] for row in rows]
    for row, report in zip(rows, reports, strict=True):
        if report.label is None and labels.count(row["label"]) > 1:
            row["label"] += f" [{row['source']}]"
    return {"areas": area_names, "suite_versions": sorted({r["suite_version"] for r in rows}), "rows": rows}


# ------------------------------------------------------------------------------------------ markdown
def cell_text(area: Mapping[str, Any]) -> str:
    """One area's cell: its verdict and passed/ran (``PASS 3/4 (1 skipped)``), ``INCOMPLETE n/N``, or ``n/a``."""
    if area["verdict"] == "n/a":
        return "n/a"
    if area["verdict"].startswith("INCOMPLETE"):
        extra = [f"{area[k]} {k}" for k in ("failed", "xpassed") if area[k]]
        return area["verdict"] + (f" ({', '.join(extra)})" if extra else "")
    ran = area["passed"] + area["failed"] + area["xfailed"] + area["xpassed"]
    extra = [f"{area[k]} {k}" for k in ("xfailed", "skipped") if area[k]]
    return f"{area['verdict']} {area['passed']}/{ran}" + (f" ({', '.join(extra)})" if extra else "")


def render_markdown(merged: Mapping[str, Any]) -> str:
    """The compatibility table as Markdown; then each run's record, partial runs, failures and claims."""
    header = ["Backend / machine", "Arch", "torch", *(AREA_TITLES.get(a, a) for a in merged["areas"]), "Overall"]
    lines = ["# hisparse-hal compatibility", "",
             f"Suite versions: {', '.join(merged['suite_versions']) or 'none'}.", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in merged["rows"]:
        cells = [row["label"], ", ".join(row["architectures"]) or "-", str(row["torch"] or "-"),
                 *(cell_text(row["areas"][a]) for a in merged["areas"]), f"**{row['verdict']}**"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## Runs", ""]
    lines += [f"- {row['label']}: contract {row['contract']}; mode {row['mode']}; started {row['started']}; "
              f"hisparse-hal {row['hisparse_hal_version']} (commit {row['commit']}); source {row['source']}"
              + "".join(f"; {note}" for note in row["notes"]) for row in merged["rows"]]
    partial = [row for row in merged["rows"] if row["partial"]]
    if partial:
        lines += ["", "## Partial or unfinished runs", ""]
        lines += [f"- {row['label']}: **{row['verdict']}**; {row['selection']}" for row in partial]
    failing = [row for row in merged["rows"] if row["failing"] or row["strict_unmatched"]]
    if failing:
        lines += ["", "## Failing tests", ""]
        for row in failing:
            shown = [f"`{t}`" for t in row["failing"][:15]]
            shown += [f"expectation entry matches no test (--strict): `{e}`" for e in row["strict_unmatched"]]
            more = f" and {len(row['failing']) - 15} more" if len(row["failing"]) > 15 else ""
            lines.append(f"- {row['label']}: " + ", ".join(shown) + more)
    claims = [(row, c) for row in merged["rows"] for c in row["claims"]]
    if claims:
        lines += ["", "## Capabilities denied but found working", ""]
        lines += [f"- {row['label']}: `{c.get('capability')}`: {c.get('evidence', '')}" for row, c in claims]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------ HTML
_CSS = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px;color:#1b1b1b;background:#fff}
h1{font-size:22px;margin:0 0 4px}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:15px;margin:16px 0 6px}.lede{color:#555;margin:0 0 14px}
table{border-collapse:collapse}th,td{border:1px solid #d0d0d0;padding:3px 5px;vertical-align:top}
#matrix th{background:#f3f3f3;font-weight:600;text-align:left}#matrix thead th{font-size:12px}
#matrix th.name{max-width:240px;font-size:13px}#matrix td{white-space:nowrap;font-size:12px}
#matrix thead th{max-width:90px}
td .x{display:block;color:#555;font-weight:400;font-size:11px;white-space:normal;max-width:160px}
td.cell .v{font-weight:600;display:block}td.cell .n{display:block}
.v-pass{background:#e3f4e6;color:#14532d}.v-partial{background:#f1f6d8;color:#3f5212}
.v-fail{background:#fde2e1;color:#8c1d18}.v-incomplete{background:#ffedd1;color:#7a4300}
.v-skipped{background:#eceff3;color:#37474f}.v-na{background:#fafafa;color:#9a9a9a}
td a,th a{color:inherit}.verdict{font-weight:700}.nr{color:#9a9a9a;font-style:italic}
dl.run{display:grid;grid-template-columns:max-content auto;gap:2px 12px;margin:6px 0}dl.run dt{color:#555}
dl.run dd{margin:0}ul.failures li{margin:3px 0}code{font-size:12px;background:#f4f4f4;padding:0 3px}
.note{color:#8c1d18}.legend span{display:inline-block;padding:1px 8px;margin-right:6px;border-radius:3px}
svg.chart{display:inline-block;margin:8px 16px 16px 0;max-width:100%}
.table-scroll{overflow-x:auto;max-width:100%}dd,li,.report p{overflow-wrap:anywhere}
#matrix th.name{position:sticky;left:0;z-index:1;min-width:150px;box-shadow:1px 0 0 #d0d0d0}
"""


def _verdict_class(text: str) -> str:
    if text.startswith("INCOMPLETE"):
        return "v-incomplete"
    if text.startswith("FAIL"):
        return "v-fail"  # also "FAIL (INCOMPLETE n/N)": an area that failed before the run stopped
    return {"PASS": "v-pass", "PASS (partial)": "v-partial", "FAIL": "v-fail", "SKIPPED": "v-skipped",
            "n/a": "v-na", "-": "v-na"}.get(text, "v-incomplete")


def _value(text: Any) -> str:
    return f'<span class="nr">{NOT_RECORDED}</span>' if text in (None, NOT_RECORDED) else escape(str(text))


def _anchor(index: int, what: str) -> str:
    return f"report-{index}-{what}"


def _area_cell(index: int, area: str, counts: Mapping[str, Any]) -> str:
    shown = counts["verdict"]
    ran = sum(counts[o] for o in OUTCOMES)
    head, _, fraction = shown.partition(" ")
    numbers = fraction or ("" if shown == "n/a" else f"{counts['passed']}/{ran - counts['skipped']}")
    extra = ", ".join(f"{counts[o]} {o}" for o in ("failed", "xpassed", "xfailed", "skipped") if counts[o])
    body = (f'<span class="v">{escape(head)}</span>' + (f'<span class="n">{escape(numbers)}</span>' if numbers else "")
            + (f'<span class="x">{escape(extra)}</span>' if extra else ""))
    if counts["failed"] or counts["xpassed"]:
        body = f'<a href="#{_anchor(index, "fail-" + area)}">{body}</a>'
    return f'<td class="cell {_verdict_class(shown)}" data-area="{escape(area)}">{body}</td>'


def _hal_version(row: Mapping[str, Any]) -> str:
    if row["hisparse_hal_version"] == NOT_RECORDED and row["commit"] == NOT_RECORDED:
        return _value(NOT_RECORDED)
    return f"{_value(row['hisparse_hal_version'])}<br>{_value(_short_commit(row['commit']))}"


def _verdict_notes(index: int, row: Mapping[str, Any]) -> str:
    notes = []
    if row["strict_unmatched"]:
        notes.append(f"--strict: {len(row['strict_unmatched'])} unmatched expectation entr"
                     + ("y" if len(row["strict_unmatched"]) == 1 else "ies"))
    if row["claims"]:
        notes.append(f'<a href="#{_anchor(index, "claims")}">{len(row["claims"])} denied capability found working'
                     "</a>")
    notes += [escape(n) for n in row["notes"]]
    return "".join(f'<span class="x">{n}</span>' for n in notes)


def _date_html(date: str) -> str:
    return _value(date) if date == NOT_RECORDED else escape(date).replace(" ", "<br>", 1)


def _matrix_table(merged: Mapping[str, Any]) -> str:
    head = "".join(f"<th>{escape(AREA_TITLES.get(a, a))}</th>" for a in merged["areas"])
    # A narrow window scrolls the table alone, its row names kept in view (sticky first column).
    lines = ['<div class="table-scroll"><table id="matrix"><thead><tr><th>Backend / machine</th><th>Verdict</th>'
             '<th>Contract, mode</th>'
             f"<th>Date</th><th>hisparse-hal</th>{head}</tr></thead><tbody>"]
    for i, row in enumerate(merged["rows"], 1):
        verdict_text = escape(row["verdict"])
        if row["failures"] or row["strict_unmatched"]:
            verdict_text = f'<a href="#{_anchor(i, "failures")}">{verdict_text}</a>'
        verdict_text += _verdict_notes(i, row)
        cells = "".join(_area_cell(i, a, row["areas"][a]) for a in merged["areas"])
        lines.append(
            f'<tr id="row-{i}"><th class="name" scope="row"><a href="#{_anchor(i, "details")}">'
            f'{escape(row["label"])}</a></th><td class="verdict {_verdict_class(row["verdict"])}">{verdict_text}</td>'
            f'<td><span class="contract">{_value(row["contract"])}</span><br><span class="mode">'
            f'{_value(row["mode"])}</span></td><td class="date">{_date_html(row["date"])}</td>'
            f'<td class="version">{_hal_version(row)}</td>{cells}</tr>'
        )
    lines.append("</tbody></table></div>")
    return "\n".join(lines)


def _run_details(row: Mapping[str, Any]) -> str:
    fields = [("Verdict", row["verdict"]), ("Contract", f"{row['contract']} ({row['contract_title']})"
               if row["contract"] != NOT_RECORDED else NOT_RECORDED), ("Mode", row["mode"]),
              ("Selection", row["selection"]), ("Started", row["started"]), ("Finished", row["finished"]),
              ("hisparse-hal", row["hisparse_hal_version"]), ("Commit", row["commit"]), ("Host", row["host"]),
              ("Device", f"{row['device']} ({row['device_type']}; driver {row['device_driver']})"),
              ("Backend", f"{row['qualname']} ({row['kind']})"),
              ("torch / Python", f"{row['torch'] or NOT_RECORDED} / {row['python']}"),
              ("Suite", f"{row['suite_version']}, sha256 {row['suite_sha256']}"),
              ("Report format", row["format"]), ("Source", row["source"])]
    if row["incomplete"]:
        fields.insert(1, ("Incomplete", row["incomplete"]))
    items = "".join(f"<dt>{escape(k)}</dt><dd>{_value(v)}</dd>" for k, v in fields)
    notes = "".join(f'<p class="note">{escape(n)}</p>' for n in row["notes"])
    return f'<dl class="run">{items}</dl>{notes}'


def _failure_lists(index: int, row: Mapping[str, Any], areas: Sequence[str]) -> str:
    """The row's failures, in one block per area whose id the area's cell links to."""
    if not (row["failures"] or row["strict_unmatched"]):
        return ""
    parts = [f'<div class="failures" id="{_anchor(index, "failures")}"><h3>Failures</h3>']
    if row["strict_unmatched"]:
        parts.append('<ul class="failures strict">' + "".join(
            f"<li>expectation entry matches no test (<code>--strict</code>): <code>{escape(str(e))}</code></li>"
            for e in row["strict_unmatched"]) + "</ul>")
    for area in areas:
        chosen = [f for f in row["failures"] if f["area"] == area]
        if chosen:
            items = "".join(f'<li><code class="test-id">{escape(f["id"])}</code> ({escape(f["outcome"])}): '
                            f'{escape(" ".join(str(f["reason"]).split())[:600])}</li>' for f in chosen)
            parts.append(f'<div class="area-failures" id="{_anchor(index, "fail-" + area)}">'
                         f'<h4>{escape(AREA_TITLES.get(area, area))}</h4><ul class="failures">{items}</ul></div>')
    return "".join(parts) + "</div>"


def _claims(index: int, row: Mapping[str, Any]) -> str:
    if not row["claims"]:
        return ""
    items = "".join(f"<li><code>{escape(str(c.get('capability')))}</code>: denied by the backend, found working"
                    f" ({escape(str(c.get('evidence', '')))})</li>" for c in row["claims"])
    return (f'<div class="claims" id="{_anchor(index, "claims")}"><h3>Capabilities denied but found working</h3>'
            f"<ul>{items}</ul></div>")


def _bench(index: int, row: Mapping[str, Any]) -> str:
    if row["bench"] is None:
        return ""
    charts = bench_charts(row["bench"])
    body = "".join(charts) or "<p>bench.json holds no figures this page can plot.</p>"
    return f'<h3 id="{_anchor(index, "bench")}">Benchmark figures (bench.json)</h3>{body}'


def render_html(merged: Mapping[str, Any]) -> str:
    """The matrix as one static HTML page: the table (rows x areas, counts, colours, links to failures), then
    each run's record, failures, claims and benchmark plots. Self-contained: no script, nothing fetched."""
    rows = merged["rows"]
    legend = "".join(f'<span class="{c}">{t}</span>' for t, c in (
        ("PASS", "v-pass"), ("PASS (partial)", "v-partial"), ("FAIL", "v-fail"),
        ("INCOMPLETE", "v-incomplete"), ("SKIPPED", "v-skipped"), ("n/a", "v-na")))
    sections = []
    for i, row in enumerate(rows, 1):
        sections.append(f'<section class="report" id="{_anchor(i, "details")}"><h2>{escape(row["label"])}</h2>'
                        f"{_run_details(row)}{_failure_lists(i, row, merged['areas'])}{_claims(i, row)}"
                        f"{_bench(i, row)}</section>")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>hisparse-hal compatibility matrix</title><style>{_CSS}</style></head><body>\n"
        "<h1>hisparse-hal compatibility matrix</h1>\n"
        f'<p class="lede">{len(rows)} report{"s" if len(rows) != 1 else ""}; suite versions '
        f"{escape(', '.join(merged['suite_versions']) or 'none')}. Each cell: verdict, passed/run, other outcomes; "
        "a cell with failures links to them.</p>\n"
        f'<p class="legend">{legend}</p>\n{_matrix_table(merged)}\n' + "\n".join(sections) + "\n</body></html>\n"
    )


def write_outputs(out: str | Path, merged: Mapping[str, Any]) -> dict[str, Path]:
    """Write ``compatibility.md``, ``compatibility.json`` and ``index.html`` into ``out`` (created if needed).

    Returns:
        The paths written, by name.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"md": out / "compatibility.md", "json": out / "compatibility.json", "html": out / "index.html"}
    without_bench = {**merged, "rows": [{**row, "bench": _bench_summary(row)} for row in merged["rows"]]}
    paths["json"].write_text(json.dumps(without_bench, indent=2, default=str) + "\n", encoding="utf-8")
    paths["md"].write_text(render_markdown(merged), encoding="utf-8")
    paths["html"].write_text(render_html(merged), encoding="utf-8")
    return paths


def _bench_summary(row: Mapping[str, Any]) -> dict[str, Any] | None:
    bench = row["bench"]
    if bench is None:
        return None
    return {"file": str(Path(row["source"]).with_name("bench.json")),
            "figures": sorted(k for k, v in bench.items() if isinstance(v, list) and v and isinstance(v[0], dict))}
