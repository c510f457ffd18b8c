"""The conformance run's record: per-test outcomes gathered from pytest reports, ``results.json`` and
``summary.md``.

Invariant: every collected test ends with exactly one outcome among passed, failed, skipped, xfailed
and xpassed, so the summary's counts add up to the number of tests. An error in setup or teardown
counts as failed; an unexpected pass of a strict expected failure counts as xpassed and fails the run.
A run that did not finish (``incomplete``) reads INCOMPLETE, never PASS; a selection of the suite
(``selection.full_suite`` false) reads as partial.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "AREAS",
    "OUTCOMES",
    "TestResult",
    "ResultCollector",
    "area_of",
    "suite_test_id",
    "build_results",
    "write_report",
    "render_summary",
    "overall_verdict",
    "mark_incomplete",
    "selection_text",
]

#: Areas in tier order; a test's area is its module name without ``test_`` (``test_swaps.py`` -> swaps).
AREAS = ("probe", "surface", "swaps", "gathers", "pinning", "config", "stats", "capture", "ipc", "cache_ops",
         "scenario")
AREA_TITLES = {
    "probe": "Probe", "surface": "vLLM surface",
    "swaps": "Swaps", "gathers": "Gathers", "pinning": "Pinning", "config": "KV config and views",
    "stats": "Stats", "capture": "Graph capture", "ipc": "IPC events", "cache_ops": "Cache ops",
    "scenario": "TP scenario (integration)",
}
OUTCOMES = ("passed", "failed", "skipped", "xfailed", "xpassed")
FAILING = ("failed", "xpassed")


def suite_test_id(nodeid: str) -> str:
    """A test id independent of where the suite is installed: ``test_swaps.py::test_name[param]``."""
    path, sep, rest = nodeid.partition("::")
    return f"{os.path.basename(path)}{sep}{rest}"


def area_of(nodeid: str) -> str:
    """The area of a test from its module (``test_swaps.py`` -> ``swaps``); ``other`` when unknown."""
    module = os.path.basename(nodeid.partition("::")[0])
    name = module.removeprefix("test_").removesuffix(".py")
    return name if name in AREAS else "other"


@dataclasses.dataclass
class TestResult:
    """The outcome of one test across its setup, call and teardown phases."""

    __test__ = False  # not a pytest test class

    id: str
    area: str
    outcome: str = "passed"
    duration: float = 0.0
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        """The ``tests[]`` entry of ``results.json``."""
        return {
            "id": self.id,
            "area": self.area,
            "outcome": self.outcome,
            "duration": round(self.duration, 4),
            "reason": self.reason,
        }


def _reason_of(report: Any) -> str:
    """A one-paragraph reason: a skip's message, an xfail's reason, or a failure's last lines."""
    wasxfail = getattr(report, "wasxfail", None)
    if report.skipped and wasxfail is not None:
        return str(wasxfail)
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    crash = getattr(longrepr, "reprcrash", None)
    if crash is not None and getattr(crash, "message", None):
        return str(crash.message)[:2000]
    text = str(longrepr or "").strip()
    return text.splitlines()[-1][:2000] if text else ""


class ResultCollector:
    """Gathers ``pytest_runtest_logreport`` reports (forwarded from xdist workers too) into results."""

    def __init__(self) -> None:
        self._results: dict[str, TestResult] = {}

    def add(self, report: Any) -> None:
        """Fold one phase report into its test's result."""
        test_id = suite_test_id(report.nodeid)
        result = self._results.get(test_id)
        if result is None:
            result = self._results[test_id] = TestResult(test_id, area_of(report.nodeid))
        result.duration += float(getattr(report, "duration", 0.0) or 0.0)
        when = report.when
        wasxfail = getattr(report, "wasxfail", None)
        if report.failed:
            longrepr = str(report.longrepr or "")
            if when == "call" and "[XPASS(strict)]" in longrepr:
                result.outcome, result.reason = (
                    "xpassed",
                    "unexpected pass of an expected failure: " + longrepr.replace("[XPASS(strict)]", "").strip(),
                )
            elif result.outcome not in FAILING:
                phase = "" if when == "call" else f"error in {when}: "
                result.outcome, result.reason = "failed", phase + _reason_of(report)
        elif report.skipped:
            if result.outcome not in FAILING:
                result.outcome = "xfailed" if wasxfail is not None else "skipped"
                result.reason = _reason_of(report)
        elif when == "call" and wasxfail is not None:  # non-strict xpass (the suite makes xfails strict)
            result.outcome, result.reason = "xpassed", f"unexpected pass: {wasxfail}"

    def restore(self, tests: Iterable[Mapping[str, Any]]) -> None:
        """Take over results recorded by an earlier, interrupted process of the same run."""
        for t in tests:
            self._results[t["id"]] = TestResult(t["id"], t["area"], t["outcome"], float(t["duration"]), t["reason"])

    def discard(self, test_id: str) -> None:
        """Forget a test that did not finish (an interrupted run): it gets no outcome."""
        self._results.pop(test_id, None)

    def results(self) -> list[TestResult]:
        """Results sorted by area (tier order), then id."""
        order = {area: n for n, area in enumerate(AREAS + ("other",))}
        return sorted(self._results.values(), key=lambda r: (order.get(r.area, len(order)), r.id))

    def failing(self) -> list[TestResult]:
        """Tests that failed or passed unexpectedly."""
        return [r for r in self._results.values() if r.outcome in FAILING]


def build_results(
    suite_version: str,
    backend: str,
    facts: Mapping[str, Any],
    tests: Iterable[TestResult],
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``results.json`` document."""
    tests = list(tests)
    summary = {outcome: sum(1 for t in tests if t.outcome == outcome) for outcome in OUTCOMES}
    doc: dict[str, Any] = {
        "suite_version": suite_version,
        "backend": backend,
        "facts": dict(facts),
        "summary": summary,
        "tests": [t.as_dict() for t in tests],
    }
    if extra:
        doc.update(extra)
    return doc


def _area_rows(tests: list[Mapping[str, Any]]) -> list[tuple[str, dict[str, int]]]:
    areas = [a for a in AREAS] + sorted({t["area"] for t in tests} - set(AREAS))
    rows = []
    for area in areas:
        counts = {o: sum(1 for t in tests if t["area"] == area and t["outcome"] == o) for o in OUTCOMES}
        rows.append((area, counts))
    return rows


def verdict(counts: Mapping[str, int]) -> str:
    """``FAIL`` when anything failed or passed unexpectedly, ``PASS`` when something passed, else ``SKIPPED``/``-``."""
    if counts.get("failed", 0) or counts.get("xpassed", 0):
        return "FAIL"
    if counts.get("passed", 0) or counts.get("xfailed", 0):
        return "PASS"
    return "SKIPPED" if counts.get("skipped", 0) else "-"


def overall_verdict(doc: Mapping[str, Any]) -> str:
    """The run's verdict: INCOMPLETE for a run that did not finish, else :func:`verdict` of its counts,
    a PASS with ``(partial)`` after it when the run was a selection of the suite."""
    if doc.get("incomplete"):
        return "INCOMPLETE"
    counts_verdict = verdict(doc["summary"])
    full = (doc.get("selection") or {}).get("full_suite", False)  # unrecorded: not taken for the full suite
    if counts_verdict == "PASS" and not full:
        return f"{counts_verdict} (partial)"
    return counts_verdict


def selection_text(selection: Mapping[str, Any] | None) -> str:
    """One line saying which part of the suite ran (``-k``, ``-m``, further pytest arguments, counts)."""
    if not selection:
        return "selection: not recorded (a report from before suite selections were recorded)"
    parts = [f"{selection.get('selected', '?')} tests selected", f"{selection.get('deselected', 0)} deselected"]
    for key, flag in (("keyword", "-k"), ("markexpr", "-m")):
        if selection.get(key):
            parts.append(f"{flag} {selection[key]!r}")
    if selection.get("pytest_args"):
        parts.append(f"pytest args {selection['pytest_args']!r}")
    if selection.get("areas"):
        parts.append("areas " + ", ".join(selection["areas"]))
    kind = "the full suite" if selection.get("full_suite") else "a PARTIAL run (a selection of the suite)"
    return f"{kind}: " + "; ".join(parts)


def _incomplete_text(incomplete: Mapping[str, Any]) -> str:
    why = incomplete.get("reason") or "the run did not finish"
    running = incomplete.get("running")
    return f"**INCOMPLETE**: {why}" + (f"; it was running `{running}`" if running else "") + (
        "; the tests not yet run are missing from this report."
    )


def render_summary(doc: Mapping[str, Any]) -> str:
    """``summary.md``: one table by area a person reads at a glance, then failures, xfails and skips."""
    tests = list(doc["tests"])
    facts = doc.get("facts", {})
    overall = overall_verdict(doc)
    lines = [
        f"# Conformance: {doc['backend']} — {overall}",
        "",
    ]
    if doc.get("incomplete"):
        lines += [_incomplete_text(doc["incomplete"]), ""]
    lines += [
        f"Suite {doc['suite_version']}; torch {facts.get('torch', '?')}; "
        f"device {facts.get('device', '?')}; architectures {', '.join(facts.get('architectures', [])) or 'n/a'}.",
        "",
        selection_text(doc.get("selection")) + ".",
        "",
        "| Area | Verdict | Passed | Failed | Skipped | XFailed | XPassed |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for area, counts in _area_rows(tests):
        if not any(counts.values()):
            continue
        lines.append(
            f"| {AREA_TITLES.get(area, area)} | {verdict(counts)} | {counts['passed']} | {counts['failed']} | "
            f"{counts['skipped']} | {counts['xfailed']} | {counts['xpassed']} |"
        )
    s = doc["summary"]
    lines.append(
        f"| **Total** | **{overall}** | {s['passed']} | {s['failed']} | {s['skipped']} | {s['xfailed']} "
        f"| {s['xpassed']} |"
    )
    for title, outcomes in (("Failures", FAILING), ("Expected failures", ("xfailed",)), ("Skipped", ("skipped",))):
        chosen = [t for t in tests if t["outcome"] in outcomes]
        if not chosen:
            continue
        lines += ["", f"## {title}", ""]
        for t in chosen:
            reason = " ".join(str(t["reason"]).split())[:300]
            lines.append(f"- `{t['id']}` ({t['area']}, {t['outcome']}): {reason}")
    unmatched = doc.get("expectations", {}).get("unmatched", [])
    if unmatched:
        lines += ["", "## Expectation entries that matched no test", ""]
        lines += [f"- `{entry}`" for entry in unmatched]
    return "\n".join(lines) + "\n"


def write_report(directory: str | Path, doc: Mapping[str, Any]) -> tuple[Path, Path]:
    """Write ``results.json`` and ``summary.md`` into ``directory`` (created if needed).

    Returns:
        The two paths.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    results = directory / "results.json"
    summary = directory / "summary.md"
    # Each file is replaced whole, so an interrupt mid-write leaves the previous version, never half of one.
    _replace_text(results, json.dumps(doc, indent=2, default=str) + "\n")
    _replace_text(summary, render_summary(doc))
    return results, summary


def _replace_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def mark_incomplete(directory: str | Path, reason: str) -> Path | None:
    """Mark the report in ``directory`` as the record of a run that did not finish (INCOMPLETE in
    ``results.json`` and ``summary.md``), keeping what it recorded.

    Returns:
        The ``results.json`` path, or None when the directory holds no readable report.
    """
    path = Path(directory) / "results.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    incomplete = dict(doc.get("incomplete") or {})
    incomplete["reason"] = reason
    doc["incomplete"] = incomplete
    write_report(directory, doc)
    return path
