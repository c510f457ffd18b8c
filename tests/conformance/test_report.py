"""Reports say what ran: a run that did not finish reads INCOMPLETE (summary.md, results.json, JUnit, the merged
table), a selection of the suite reads partial, and neither passes for a full PASS (issue 24)."""

from __future__ import annotations

import ast
import importlib.util
import json
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from hisparse_hal.conformance.junit import render_junit
from hisparse_hal.conformance.report import (
    ResultCollector,
    TestResult,
    area_of,
    area_verdict,
    build_results,
    mark_incomplete,
    overall_verdict,
    render_summary,
    selection_text,
    skip_kind,
    suite_test_id,
    write_report,
)

REPO = Path(__file__).resolve().parents[2]


def _doc(full_suite: bool = True, **extra: object) -> dict:
    tests = [{"id": "test_swaps.py::t0", "area": "swaps", "outcome": "passed", "duration": 0.1, "reason": ""}]
    return {"suite_version": "1.0", "backend": "cpu", "facts": {"torch": "2.13"}, "tests": tests,
            "summary": {"passed": 1, "failed": 0, "skipped": 0, "xfailed": 0, "xpassed": 0},
            "selection": {"keyword": None if full_suite else "swaps", "markexpr": None, "pytest_args": None,
                          "selected": 1, "deselected": 0 if full_suite else 222, "areas": ["swaps"],
                          "full_suite": full_suite},
            **extra}


def _merge_module():
    spec = importlib.util.spec_from_file_location("merge_reports", REPO / "ci" / "merge_reports.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_finished_full_run_passes():
    assert overall_verdict(_doc()) == "PASS"
    assert render_summary(_doc()).startswith("# Conformance: cpu — PASS\n")


def test_a_selection_reads_partial_with_its_keyword_and_deselected_count():
    summary = render_summary(_doc(full_suite=False))
    assert summary.startswith("# Conformance: cpu — PASS (partial)\n")
    assert "a PARTIAL run" in summary and "222 deselected" in summary and "-k 'swaps'" in summary


def test_a_report_that_does_not_record_its_selection_is_not_taken_for_the_full_suite():
    doc = _doc()
    del doc["selection"]
    assert overall_verdict(doc) == "PASS (partial)" and "selection: not recorded" in render_summary(doc)


def test_an_interrupted_run_is_marked_incomplete_in_both_files(tmp_path):
    write_report(tmp_path, _doc(incomplete={"running": "test_swaps.py::t1"}))
    assert mark_incomplete(tmp_path, "the run was interrupted (SIGINT)") == tmp_path / "results.json"
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["incomplete"] == {"running": "test_swaps.py::t1", "reason": "the run was interrupted (SIGINT)"}
    summary = (tmp_path / "summary.md").read_text()
    assert summary.startswith("# Conformance: cpu — INCOMPLETE\n") and "PASS**" not in summary
    assert "interrupted (SIGINT)" in summary and "`test_swaps.py::t1`" in summary


def test_marking_a_folder_without_a_report_writes_nothing(tmp_path):
    assert mark_incomplete(tmp_path, "interrupted") is None and list(tmp_path.iterdir()) == []


def test_junit_of_an_incomplete_run_has_an_error_case_and_the_selection():
    root = ET.fromstring(render_junit(_doc(full_suite=False, incomplete={"reason": "interrupted (SIGTERM)"})))
    suite = root.find("testsuite")
    assert suite is not None and suite.attrib["errors"] == "1" and suite.attrib["tests"] == "2"
    props = {p.attrib["name"]: p.attrib["value"] for p in suite.iter("property")}
    assert props["verdict"] == "INCOMPLETE" and props["incomplete"] == "true"
    assert props["full_suite"] == "false" and props["deselected"] == "222" and props["keyword"] == "swaps"
    error = suite.find("testcase/error")
    assert error is not None and error.attrib["type"] == "incomplete" and "SIGTERM" in error.attrib["message"]


def test_merge_shows_partial_and_incomplete_rows_and_fails_on_them(tmp_path):
    merge = _merge_module()
    for name, doc in (("full", _doc()), ("part", _doc(full_suite=False)),
                      ("cut", _doc(incomplete={"reason": "interrupted"}))):
        (tmp_path / f"{name}.json").write_text(json.dumps(doc))
    out = tmp_path / "out"
    rc = merge.main(["--out", str(out), *(f"{n}={tmp_path / n}.json" for n in ("full", "part", "cut"))])
    rows = {r["label"]: r for r in json.loads((out / "compatibility.json").read_text())["rows"]}
    assert rc == 1
    assert [rows[n]["verdict"] for n in ("full", "part", "cut")] == ["PASS", "PASS (partial)", "INCOMPLETE"]
    text = (out / "compatibility.md").read_text()
    assert "## Partial or unfinished runs" in text and "- part: **PASS (partial)**" in text


def test_merge_accepts_partial_passes_when_asked(tmp_path):
    merge = _merge_module()
    (tmp_path / "part.json").write_text(json.dumps(_doc(full_suite=False)))
    assert merge.main(["--out", str(tmp_path / "o"), "--allow-partial", str(tmp_path / "part.json")]) == 0
    assert merge.main(["--out", str(tmp_path / "o"), str(tmp_path / "part.json")]) == 1


# ------------------------------------------------------------------------------------------ report
def _report(nodeid: str, when: str, outcome: str, longrepr=None, wasxfail=None, duration=0.1):
    report = SimpleNamespace(nodeid=nodeid, when=when, outcome=outcome, longrepr=longrepr, duration=duration,
                             passed=outcome == "passed", failed=outcome == "failed", skipped=outcome == "skipped")
    if wasxfail is not None:
        report.wasxfail = wasxfail
    return report


def test_ids_and_areas_do_not_depend_on_where_the_suite_is_installed():
    assert (
        suite_test_id("../site-packages/hisparse_hal/conformance/tests/test_swaps.py::test_a[1]")
        == "test_swaps.py::test_a[1]"
    )
    assert area_of("x/test_ipc.py::test_b") == "ipc" and area_of("x/test_elsewhere.py::t") == "other"


def test_collector_gives_every_test_one_outcome():
    collector = ResultCollector()
    phases: dict[str, list[tuple[Any, ...]]] = {
        "t/test_swaps.py::ok": [("setup", "passed"), ("call", "passed"), ("teardown", "passed")],
        "t/test_swaps.py::bad": [
            ("setup", "passed"),
            ("call", "failed", "AssertionError: 3 bytes differ"),
            ("teardown", "passed"),
        ],
        "t/test_pinning.py::setup_error": [("setup", "failed", "RuntimeError: no pool"), ("teardown", "passed")],
        "t/test_stats.py::teardown_error": [
            ("setup", "passed"),
            ("call", "passed"),
            ("teardown", "failed", "AssertionError: canary"),
        ],
        "t/test_ipc.py::skipped": [
            ("setup", "skipped", ("f", 1, "Skipped: backend capability ipc_events is False")),
            ("teardown", "passed"),
        ],
        "t/test_ipc.py::xfailed": [
            ("setup", "passed"),
            ("call", "skipped", None, "32-slot ring"),
            ("teardown", "passed"),
        ],
        "t/test_ipc.py::xpassed": [
            ("setup", "passed"),
            ("call", "failed", "[XPASS(strict)] 32-slot ring"),
            ("teardown", "passed"),
        ],
    }
    for nodeid, steps in phases.items():
        for step in steps:
            when, outcome, *rest = step
            collector.add(_report(nodeid, when, outcome, rest[0] if rest else None, rest[1] if len(rest) > 1 else None))
    results = {r.id.split("::")[1]: r for r in collector.results()}
    assert {k: r.outcome for k, r in results.items()} == {
        "ok": "passed", "bad": "failed", "setup_error": "failed", "teardown_error": "failed",
        "skipped": "skipped", "xfailed": "xfailed", "xpassed": "xpassed",
    }
    assert results["setup_error"].reason == "error in setup: RuntimeError: no pool"
    assert results["teardown_error"].reason.startswith("error in teardown")
    assert results["skipped"].reason == "backend capability ipc_events is False"
    assert results["xfailed"].reason == "32-slot ring"
    assert abs(results["ok"].duration - 0.3) < 1e-9
    assert [r.area for r in collector.results()][:2] == ["swaps", "swaps"], "results are in tier order"
    doc = build_results("1.0", "cpu", {"torch": "2"}, collector.results())
    assert doc["summary"] == {"passed": 1, "failed": 3, "skipped": 1, "xfailed": 1, "xpassed": 1}
    text = render_summary(doc)
    assert "| Swaps | FAIL | 1 | 1 | 0 | 0 | 0 |" in text and "| IPC events | FAIL | 0 | 0 | 1 | 1 | 1 |" in text
    assert "| **Total** | **FAIL** | 1 | 3 | 1 | 1 | 1 |" in text
    assert "## Failures" in text and "3 bytes differ" in text


# ------------------------------------------------------------------------------------------ format 2 (issue 31)
def test_an_area_cut_short_reads_incomplete_never_pass():
    counts = {"passed": 2, "failed": 0, "skipped": 0, "xfailed": 0, "xpassed": 0}
    assert area_verdict(counts, 51, incomplete=True) == "INCOMPLETE 2/51"
    assert area_verdict(counts, 2, incomplete=True) == "PASS"  # the area finished before the run stopped
    assert area_verdict(counts, None, incomplete=True) == "INCOMPLETE 2/?"
    assert area_verdict(counts, 51, incomplete=False) == "PASS"
    assert area_verdict({**counts, "failed": 1}, 51, incomplete=True) == "FAIL (INCOMPLETE 3/51)"
    assert area_verdict({**counts, "failed": 1}, 3, incomplete=True) == "FAIL"  # the area had finished
    assert area_verdict({**counts, "failed": 1}, None, incomplete=True) == "FAIL"
    assert area_verdict({**counts, "failed": 1}, 51, incomplete=False) == "FAIL"
    assert area_verdict(dict.fromkeys(counts, 0), 6, incomplete=True) == "INCOMPLETE 0/6"
    assert area_verdict(dict.fromkeys(counts, 0), None, incomplete=True) == "-", "nothing recorded, nothing ran"


def test_summary_of_an_interrupted_run_shows_each_cut_area_and_the_unreached_ones():
    doc = _doc(incomplete={"reason": "interrupted (SIGINT)"})
    doc["selection"]["per_area"] = {"swaps": 3, "ipc": 6}
    summary = render_summary(doc)
    assert "| Swaps | INCOMPLETE 1/3 | 1 | 0 | 0 | 0 | 0 |" in summary
    assert "| IPC events | INCOMPLETE 0/6 | 0 | 0 | 0 | 0 | 0 |" in summary
    assert "| Swaps | PASS" not in summary


def _strict_doc() -> dict:
    return _doc(full_suite=False, expectations={"file": "x.toml", "strict": True,
                                                "unmatched": ["test_gone.py (skip): stale"]})


def test_a_strict_run_with_unmatched_entries_is_fail_in_summary_verdict_and_junit():
    doc = _strict_doc()
    assert overall_verdict(doc) == "FAIL"
    summary = render_summary(doc)
    assert summary.startswith("# Conformance: cpu — FAIL\n") and "**FAIL (--strict)**" in summary
    assert "| **Total** | **FAIL** |" in summary and "--hal-strict" not in summary
    suite = ET.fromstring(render_junit(doc)).find("testsuite")
    assert suite is not None and suite.attrib["failures"] == "1" and suite.attrib["tests"] == "2"
    props = {p.attrib["name"]: p.attrib["value"] for p in suite.iter("property")}
    assert props["verdict"] == "FAIL"
    failure = suite.find("testcase/failure[@type='strict']")
    assert failure is not None and "test_gone.py (skip): stale" in failure.attrib["message"]
    doc["expectations"]["strict"] = False
    assert overall_verdict(doc) == "PASS (partial)", "unmatched entries without --strict only warn"


def test_the_summary_header_names_date_host_device_driver_version_commit_contract_and_suite():
    doc = _doc(format=2, mode="full", contract={"id": "vllm-0.34.0", "title": "vllm 0.34.0 HiSparseBackend"},
               suite={"version": "1.0", "sha256": "abcdef0123456789" * 4, "files": []},
               run={"started": "2026-12-05T02:00:00+00:00", "finished": None, "host": "rig7",
                    "hisparse_hal_version": "0.1.0", "commit": "1234abc (dirty)",
                    "device": {"type": "cuda", "name": "NVIDIA H200", "driver": "570.86.15"},
                    "python": "3.11.7", "torch": "2.13.0"})
    line = render_summary(doc).splitlines()[2]
    assert line == ("Run 2026-12-05T02:00:00+00:00 on rig7: cuda device NVIDIA H200, driver 570.86.15; hisparse-hal "
                    "0.1.0 (commit 1234abc (dirty)); contract vllm-0.34.0; suite 1.0 sha256 abcdef012345; mode full.")
    props = {p.attrib["name"]: p.attrib["value"]
             for p in ET.fromstring(render_junit(doc)).iter("property")}
    assert props["contract"] == "vllm-0.34.0" and props["device_name"] == "NVIDIA H200"
    assert props["suite_sha256"].startswith("abcdef") and props["host"] == "rig7" and props["mode"] == "full"


def test_tests_entries_carry_their_skip_kind_and_capability():
    cases = {
        "backend capability ipc_events is False on 'x'; this test needs it": ("capability", "ipc_events"),
        "capability ipc_event_max_cycles=32 declares fewer than 1000 record/wait cycles":
            ("capability", "ipc_event_max_cycles"),
        "capability kv_formats lacks fp8_ds_mla": ("capability", "kv_formats"),
        "probe tier failed (test_probe.py::x); the rest ...": ("probe-gate", None),
        "known bug (expectations vendors/x/expectations.toml)": ("expectation", None),
        "the backend's device is host memory, so a device tensor is a host tensor": ("not-applicable", None),
        "Skipped for no reason given": ("skipped", None),
    }
    for reason, (kind, capability) in cases.items():
        entry = TestResult("test_ipc.py::t", "ipc", "skipped", 0.0, reason).as_dict()
        assert entry["skip_kind"] == kind and entry.get("capability") == capability, (reason, entry)
    assert TestResult("t.py::t", "ipc", "xfailed", 0.0, "bug (expectations f.toml)").as_dict()["skip_kind"] == \
        "expectation"
    assert TestResult("t.py::t", "ipc", "passed").as_dict()["skip_kind"] is None


def _skip_reasons_in_the_suite() -> list[tuple[str, str]]:
    """(where, the reason's constant beginning) of every ``pytest.skip(...)`` in the suite's test modules."""
    found = []
    for path in sorted((REPO / "conformance" / "tests").glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "skip"
                    and node.args):
                arg = node.args[0]
                text = arg.value if isinstance(arg, ast.Constant) else "".join(
                    str(v.value) for v in getattr(arg, "values", [])[:1] if isinstance(v, ast.Constant))
                found.append((f"{path.name}:{node.lineno}", str(text)))
    return found


def test_every_skip_the_suite_makes_is_a_capability_or_not_applicable():
    reasons = _skip_reasons_in_the_suite()
    assert len(reasons) >= 5
    for where, text in reasons:
        assert skip_kind(text) in ("capability", "not-applicable"), (
            f"{where}: the skip {text!r} reads as neither a named capability ('capability NAME ...') nor one of "
            "report.NOT_APPLICABLE_REASONS, so verify cannot allow it"
        )


def test_marking_a_format_2_report_incomplete_keeps_its_verdict_in_step(tmp_path):
    write_report(tmp_path, _doc(format=2, verdict="PASS"))
    assert json.loads((tmp_path / "results.json").read_text())["verdict"] == "PASS"
    mark_incomplete(tmp_path, "the test process died (exit status -11) and the run was not resumed")
    assert json.loads((tmp_path / "results.json").read_text())["verdict"] == "INCOMPLETE"


def test_the_selection_line_counts_one_test_in_the_singular():
    one = {"selected": 1, "deselected": 262, "keyword": "test_backend_identity", "full_suite": False}
    assert selection_text(one) == ("a PARTIAL run (a selection of the suite): 1 test selected; 262 deselected; "
                                   "-k 'test_backend_identity'")
    two = selection_text({**one, "selected": 2})
    assert two.startswith("a PARTIAL run (a selection of the suite): 2 tests selected")
