"""The conformance run's record: per-test outcomes gathered from pytest reports, ``results.json`` and
``summary.md``.

Invariant: every collected test ends with exactly one outcome among passed, failed, skipped, xfailed
and xpassed, so the summary's counts add up to the number of tests. An error in setup or teardown
counts as failed; an unexpected pass of a strict expected failure counts as xpassed and fails the run.
A run that did not finish (``incomplete``) reads INCOMPLETE, never PASS, and so does each area it cut short; a
selection of the suite (``selection.full_suite`` false) reads as partial; a ``--strict`` run with unmatched
expectation entries reads FAIL, as its exit status says.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .tiers import read_tiers

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
    "area_verdict",
    "terminal_lines",
    "report_lines",
    "skip_kind",
    "CAPABILITY_SKIP_PREFIX",
    "PROBE_GATE_SKIP_PREFIX",
    "NOT_APPLICABLE_REASONS",
    "skipped_capability",
    "strict_failure",
    "run_text",
]

#: Areas in tier order; a test's area is its module name without ``test_`` (``test_swaps.py`` -> swaps). Each
#: tier module declares its AREA, ORDER and TITLE (:mod:`.tiers`), so a new tier is one file.
_TIERS = read_tiers()
AREAS = tuple(tier.area for tier in _TIERS)
AREA_TITLES = {tier.area: tier.title for tier in _TIERS}
OUTCOMES = ("passed", "failed", "skipped", "xfailed", "xpassed")
FAILING = ("failed", "xpassed")

#: How the plugin words a skip for a capability the backend lacks, and the probe tier's gate.
CAPABILITY_SKIP_PREFIX = "backend capability "
PROBE_GATE_SKIP_PREFIX = "probe tier failed "
#: How a test words a skip for a capability it reads itself (``capability kv_formats lacks fp8_ds_mla``).
TEST_CAPABILITY_SKIP_PREFIX = "capability "
#: Skips a test makes because it does not apply to this kind of backend (a CPU device has no device memory to
#: refuse; a factory-built backend is not selected by the registry; a format with fixed rows has no width to get
#: wrong). Reasons start with one of these.
NOT_APPLICABLE_REASONS = (
    "the backend's device is host memory",
    "the backend under test comes from a factory",
    "fp8_ds_mla rows have a fixed width",
)
EXPECTATION_MARK = "(expectations "


def skip_kind(reason: str) -> str:
    """The kind of a skip (or an expected failure) from its reason: ``capability``, ``probe-gate``,
    ``expectation``, ``not-applicable`` or ``skipped`` (none of those)."""
    if EXPECTATION_MARK in reason:
        return "expectation"
    if reason.startswith((CAPABILITY_SKIP_PREFIX, TEST_CAPABILITY_SKIP_PREFIX)):
        return "capability"
    if reason.startswith(PROBE_GATE_SKIP_PREFIX):
        return "probe-gate"
    if reason.startswith(NOT_APPLICABLE_REASONS):
        return "not-applicable"
    return "skipped"


def skipped_capability(reason: str) -> str | None:
    """The capability a capability skip names (``ipc_events`` of ``backend capability ipc_events is False``)."""
    for prefix in (CAPABILITY_SKIP_PREFIX, TEST_CAPABILITY_SKIP_PREFIX):
        if reason.startswith(prefix):
            word = reason[len(prefix):].split(maxsplit=1)[0] if reason[len(prefix):].strip() else ""
            return word.split("=", 1)[0] or None
    return None


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
        """The ``tests[]`` entry of ``results.json``: ``skip_kind`` for a skip or an expected failure (else null),
        and ``capability`` for a capability skip."""
        kind = skip_kind(self.reason) if self.outcome in ("skipped", "xfailed") else None
        entry: dict[str, Any] = {
            "id": self.id,
            "area": self.area,
            "outcome": self.outcome,
            "duration": round(self.duration, 4),
            "reason": self.reason,
            "skip_kind": kind,
        }
        if kind == "capability":
            entry["capability"] = skipped_capability(self.reason)
        return entry


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


def _area_rows(tests: list[Mapping[str, Any]],
               per_area: Mapping[str, int] | None = None) -> list[tuple[str, dict[str, int]]]:
    areas = [a for a in AREAS] + sorted(({t["area"] for t in tests} | set(per_area or {})) - set(AREAS))
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


def area_verdict(counts: Mapping[str, int], selected: int | None, incomplete: bool) -> str:
    """One area's verdict: FAIL when a test of it failed (``FAIL (INCOMPLETE n/N)`` when, besides, the run stopped
    before the rest of the area ran); in a run that did not finish, ``INCOMPLETE n/N`` when fewer of its tests have
    an outcome than were selected (``N``; None: not recorded, so never PASS); else :func:`verdict` of its counts.

    Args:
        counts: the area's outcome counts (``OUTCOMES`` keys).
        selected: how many of the area's tests the run selected (``selection.per_area``), None when unknown.
        incomplete: whether the run did not finish.
    """
    base = verdict(counts)
    if not incomplete:
        return base
    ran = sum(counts.get(o, 0) for o in OUTCOMES)
    if base == "FAIL":
        return f"FAIL (INCOMPLETE {ran}/{selected})" if selected is not None and ran < selected else base
    if selected is None:
        return f"INCOMPLETE {ran}/?" if ran else base  # nothing recorded and nothing ran: nothing to say
    return f"INCOMPLETE {ran}/{selected}" if ran < selected else base


def strict_failure(doc: Mapping[str, Any]) -> bool:
    """Whether the run was ``--strict`` and an expectation entry matched no test (the run fails)."""
    expectations = doc.get("expectations") or {}
    return bool(expectations.get("strict") and expectations.get("unmatched"))


def overall_verdict(doc: Mapping[str, Any]) -> str:
    """The run's verdict: INCOMPLETE for a run that did not finish, FAIL for a ``--strict`` run with unmatched
    expectation entries or for test processes that tested different backends or devices (``device_mismatch``),
    else :func:`verdict` of its counts, a PASS with ``(partial)`` after it when the run was a selection of the
    suite."""
    if doc.get("incomplete"):
        return "INCOMPLETE"
    if strict_failure(doc) or doc.get("device_mismatch"):
        return "FAIL"
    counts_verdict = verdict(doc["summary"])
    full = (doc.get("selection") or {}).get("full_suite", False)  # unrecorded: not taken for the full suite
    if counts_verdict == "PASS" and not full:
        return f"{counts_verdict} (partial)"
    return counts_verdict


def selection_text(selection: Mapping[str, Any] | None) -> str:
    """One line saying which part of the suite ran (``-k``, ``-m``, further pytest arguments, counts)."""
    if not selection:
        return "selection: not recorded (a report from before suite selections were recorded)"
    selected = selection.get("selected", "?")
    parts = [f"{selected} test{'' if selected == 1 else 's'} selected", f"{selection.get('deselected', 0)} deselected"]
    for key, flag in (("keyword", "-k"), ("markexpr", "-m")):
        if selection.get(key):
            parts.append(f"{flag} {selection[key]!r}")
    if selection.get("pytest_args"):
        parts.append(f"pytest args {selection['pytest_args']!r}")
    if selection.get("areas"):
        parts.append("areas " + ", ".join(selection["areas"]))
    kind = "the full suite" if selection.get("full_suite") else "a PARTIAL run (a selection of the suite)"
    if selection.get("subset"):
        kind = f"a PARTIAL run (the named subset {selection['subset']!r})"
    return f"{kind}: " + "; ".join(parts)


def _incomplete_text(incomplete: Mapping[str, Any]) -> str:
    why = incomplete.get("reason") or "the run did not finish"
    running = incomplete.get("running")
    return f"**INCOMPLETE**: {why}" + (f"; it was running `{running}`" if running else "") + (
        "; the tests not yet run are missing from this report."
    )


def run_text(doc: Mapping[str, Any]) -> str | None:
    """The header line of a format-2 report: date, host, device and driver, hisparse-hal version and commit,
    contract and suite hash prefix (None for an older report)."""
    run = doc.get("run")
    if not isinstance(run, Mapping):
        return None
    device = run.get("device") or {}
    name = device.get("name") or "?"
    driver = f", driver {device['driver']}" if device.get("driver") else ""
    contract = (doc.get("contract") or {}).get("id", "?")
    suite = doc.get("suite") or {}
    digest = str(suite.get("sha256") or "?")[:12]
    commit = run.get("commit") or "not a checkout"
    return (f"Run {run.get('started') or '?'} on {run.get('host') or '?'}: {device.get('type') or '?'} "
            f"device {name}{driver}; hisparse-hal {run.get('hisparse_hal_version') or '?'} (commit {commit}); "
            f"contract {contract}; suite {suite.get('version') or doc.get('suite_version')} sha256 {digest}; "
            f"mode {doc.get('mode') or '?'}.")


def report_lines(directory: str | Path) -> list[str]:
    """Where a run's report is, and what to do with it next (the README's path: verify, then merge)."""
    folder = Path(directory)
    return [f"report: {folder / 'results.json'}, {folder / 'summary.md'}",
            f"next: hisparse-hal verify {folder} (CONFORMANT or NOT CONFORMANT, with every reason)"]


def terminal_lines(doc: Mapping[str, Any]) -> list[str]:
    """What a run prints at its end: ``summary.md``'s title, run line, verdict notes and table, then the selection."""
    lines = [line for line in render_summary(doc).splitlines()
             if line.startswith(("|", "# ", "**INCOMPLETE", "**FAIL", "Run "))]
    return [*lines, selection_text(doc.get("selection"))]


def render_summary(doc: Mapping[str, Any]) -> str:
    """``summary.md``: one table by area a person reads at a glance, then failures, xfails and skips."""
    tests = list(doc["tests"])
    facts = doc.get("facts", {})
    overall = overall_verdict(doc)
    lines = [
        f"# Conformance: {doc['backend']} — {overall}",
        "",
    ]
    header = run_text(doc)
    if header:
        lines += [header, ""]
    if doc.get("incomplete"):
        lines += [_incomplete_text(doc["incomplete"]), ""]
    if strict_failure(doc):
        lines += ["**FAIL (--strict)**: expectation entries matched no test (listed below).", ""]
    mismatch = doc.get("device_mismatch")
    if mismatch:
        why = mismatch.get("reason") if isinstance(mismatch, Mapping) else None
        lines += [f"**FAIL (devices)**: {why or 'the test processes tested different backends or devices'}.", ""]
    lines += [
        f"Suite {doc['suite_version']}; torch {facts.get('torch', '?')}; "
        f"device {facts.get('device', '?')}; architectures {', '.join(facts.get('architectures', [])) or 'n/a'}.",
        "",
        selection_text(doc.get("selection")) + ".",
        "",
        "| Area | Verdict | Passed | Failed | Skipped | XFailed | XPassed |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    per_area = (doc.get("selection") or {}).get("per_area")
    for area, counts in _area_rows(tests, per_area):
        selected = per_area.get(area, 0) if isinstance(per_area, Mapping) else None
        if not any(counts.values()) and not selected:
            continue
        cells = " | ".join(str(counts[o]) for o in OUTCOMES)
        judged = area_verdict(counts, selected, bool(doc.get("incomplete")))
        lines.append(f"| {AREA_TITLES.get(area, area)} | {judged} | {cells} |")
    s = doc["summary"]
    lines.append(
        f"| **Total** | **{overall}** | {s['passed']} | {s['failed']} | {s['skipped']} | {s['xfailed']} "
        f"| {s['xpassed']} |"
    )
    claims = doc.get("claims") or []
    if claims:
        lines += ["", "## Capability claims that probes contradict (warning)", ""]
        lines += [f"- `{c.get('capability')}`: the backend denies it, but a probe found it working: "
                  f"{c.get('evidence')}" for c in claims]
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
    if "verdict" in doc:  # format 2: kept in step with what the document now says (a crash recorded, a mark)
        doc = {**doc, "verdict": overall_verdict(doc)}
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
