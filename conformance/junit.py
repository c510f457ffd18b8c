"""JUnit XML from a conformance ``results.json``: the per-test format GitHub Actions, GitLab, Buildkite and Jenkins
ingest. One ``<testcase>`` per conformance test; expected failures and skips carry their kind and reason.

Invariant: written from the final report (after any crash-resume), so it counts exactly the tests ``results.json`` does,
plus, for a run that did not finish, one ``<error>`` case saying so (a CI page never shows an interrupted run green).
The selection (``-k``, a named subset, full suite or not, selected and deselected counts), the verdict, a
device mismatch between test processes and the contract are kept as properties;
a ``--strict`` run with unmatched expectation entries has one failing case saying so (its verdict is FAIL).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .report import CAPABILITY_SKIP_PREFIX, PROBE_GATE_SKIP_PREFIX, overall_verdict, skip_kind, strict_failure

__all__ = ["CAPABILITY_SKIP_PREFIX", "PROBE_GATE_SKIP_PREFIX", "skip_kind", "render_junit", "write_junit"]


def _testcase(parent: ET.Element, test: Mapping[str, Any], backend: str) -> None:
    module, _, name = str(test["id"]).partition("::")
    case = ET.SubElement(parent, "testcase", {
        "classname": f"hisparse_hal.conformance.{backend}.{test['area']}",
        "name": name or module,
        "file": module,
        "time": f"{float(test['duration']):.4f}",
    })
    reason = str(test.get("reason", ""))
    outcome = test["outcome"]
    if outcome == "failed":
        ET.SubElement(case, "failure", {"type": "failure", "message": reason[:500]}).text = reason
    elif outcome == "xpassed":
        ET.SubElement(case, "failure", {"type": "unexpected-pass", "message": reason[:500]}).text = reason
    elif outcome == "xfailed":
        ET.SubElement(case, "skipped", {"type": "expected-failure", "message": reason[:500]})
    elif outcome == "skipped":
        ET.SubElement(case, "skipped", {"type": skip_kind(reason), "message": reason[:500]})


def render_junit(doc: Mapping[str, Any]) -> str:
    """The JUnit XML text of one conformance results document.

    Args:
        doc: a ``results.json`` document (``backend``, ``suite_version``, ``facts``, ``summary``, ``tests``).

    Returns:
        ``<testsuites>`` holding one ``<testsuite>`` named after the backend, as a UTF-8 XML string.
    """
    backend = str(doc["backend"])
    summary = doc["summary"]
    tests = list(doc["tests"])
    incomplete = doc.get("incomplete")
    strict = strict_failure(doc)
    counts = {
        "tests": str(len(tests) + (1 if incomplete else 0) + (1 if strict else 0)),
        "failures": str(summary.get("failed", 0) + summary.get("xpassed", 0) + (1 if strict else 0)),
        "errors": "1" if incomplete else "0",
        "skipped": str(summary.get("skipped", 0) + summary.get("xfailed", 0)),
        "time": f"{sum(float(t['duration']) for t in tests):.3f}",
    }
    root = ET.Element("testsuites", {"name": "hisparse-hal conformance", **counts})
    suite = ET.SubElement(root, "testsuite", {"name": f"hisparse-hal conformance: {backend}", **counts})
    properties = ET.SubElement(suite, "properties")
    facts = doc.get("facts", {})
    selection = doc.get("selection") or {}
    contract = doc.get("contract") or {}
    suite_block = doc.get("suite") or {}
    run = doc.get("run") or {}
    device = run.get("device") or {}
    for key, value in (("backend", backend), ("suite_version", doc.get("suite_version")),
                       ("contract", contract.get("id")), ("contract_title", contract.get("title")),
                       ("suite_sha256", suite_block.get("sha256")), ("mode", doc.get("mode")),
                       ("started", run.get("started")), ("host", run.get("host")),
                       ("hisparse_hal_version", run.get("hisparse_hal_version")), ("commit", run.get("commit")),
                       ("device_name", device.get("name")), ("device_driver", device.get("driver")),
                       ("torch", facts.get("torch")), ("device", facts.get("device")),
                       ("verdict", overall_verdict(doc)), ("incomplete", "true" if incomplete else None),
                       ("full_suite", str(selection["full_suite"]).lower() if "full_suite" in selection else None),
                       ("selected", selection.get("selected")), ("deselected", selection.get("deselected")),
                       ("subset", selection.get("subset")), ("keyword", selection.get("keyword")),
                       ("markexpr", selection.get("markexpr")), ("pytest_args", selection.get("pytest_args")),
                       ("device_mismatch", (doc.get("device_mismatch") or {}).get("reason"))):
        if value is not None:
            ET.SubElement(properties, "property", {"name": key, "value": str(value)})
    for test in tests:
        _testcase(suite, test, backend)
    if strict:
        case = ET.SubElement(suite, "testcase", {"classname": f"hisparse_hal.conformance.{backend}.expectations",
                                                 "name": "expectation entries match tests (--strict)", "time": "0"})
        text = "expectation entries match no test: " + "; ".join(map(str, doc["expectations"]["unmatched"]))
        ET.SubElement(case, "failure", {"type": "strict", "message": text[:500]}).text = text
    if incomplete:
        case = ET.SubElement(suite, "testcase", {"classname": f"hisparse_hal.conformance.{backend}.run",
                                                 "name": "run incomplete", "time": "0"})
        why = str(incomplete.get("reason") or "the run did not finish")
        running = incomplete.get("running")
        text = why + (f"; it was running {running}" if running else "")
        ET.SubElement(case, "error", {"type": "incomplete", "message": text[:500]}).text = text
    ET.indent(root)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def write_junit(path: str | Path, doc: Mapping[str, Any]) -> Path:
    """Write :func:`render_junit` of ``doc`` to ``path`` (parent folders created).

    Returns:
        The path written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_junit(doc), encoding="utf-8")
    return path
