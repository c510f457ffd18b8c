"""The conformance JUnit file: one test case per test, failures and unexpected passes as failures, expected
failures and capability skips as skips of their own kind, counts that match results.json."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from hisparse_hal.conformance.junit import render_junit, skip_kind, write_junit

DOC = {
    "suite_version": "1.0",
    "backend": "cpu",
    "facts": {"torch": "2.13.0+cpu", "device": "cpu"},
    "summary": {"passed": 1, "failed": 1, "skipped": 2, "xfailed": 1, "xpassed": 1},
    "tests": [
        {"id": "test_swaps.py::test_ok[4]", "area": "swaps", "outcome": "passed", "duration": 0.5, "reason": ""},
        {
            "id": "test_swaps.py::test_bad",
            "area": "swaps",
            "outcome": "failed",
            "duration": 0.25,
            "reason": "AssertionError: byte 7 <differs> & more",
        },
        {
            "id": "test_capture.py::test_graph",
            "area": "capture",
            "outcome": "skipped",
            "duration": 0.0,
            "reason": "backend capability graph_capture is False on 'rocm'; this test needs it",
        },
        {
            "id": "test_ipc.py::test_ipc",
            "area": "ipc",
            "outcome": "skipped",
            "duration": 0.0,
            "reason": (
                "probe tier failed (test_probe.py::x); the rest of the suite is skipped until the probe tier passes"
            ),
        },
        {
            "id": "test_stats.py::test_known",
            "area": "stats",
            "outcome": "xfailed",
            "duration": 0.1,
            "reason": "driver 7.2 rejects attributes (expectations rocm/expectations.toml)",
        },
        {
            "id": "test_stats.py::test_fixed",
            "area": "stats",
            "outcome": "xpassed",
            "duration": 0.1,
            "reason": "unexpected pass of an expected failure: fixed upstream",
        },
    ],
}


def test_junit_has_one_case_per_test_with_its_kind(tmp_path):
    path = write_junit(tmp_path / "sub" / "junit.xml", DOC)
    root = ET.parse(path).getroot()
    suite = root.find("testsuite")
    assert suite is not None
    assert root.attrib["tests"] == suite.attrib["tests"] == "6"
    assert suite.attrib["failures"] == "2" and suite.attrib["skipped"] == "3" and suite.attrib["errors"] == "0"
    cases = {(c.attrib["file"], c.attrib["name"]): c for c in suite.iter("testcase")}
    assert len(cases) == 6
    ok = cases[("test_swaps.py", "test_ok[4]")]
    assert ok.attrib["classname"] == "hisparse_hal.conformance.cpu.swaps" and ok.attrib["time"] == "0.5000"
    assert list(ok) == []
    bad = cases[("test_swaps.py", "test_bad")].find("failure")
    assert bad is not None and bad.attrib["type"] == "failure" and bad.text == "AssertionError: byte 7 <differs> & more"
    xpass = cases[("test_stats.py", "test_fixed")].find("failure")
    assert xpass is not None and xpass.attrib["type"] == "unexpected-pass"
    skips = {name: c.find("skipped") for (_, name), c in cases.items()}
    kinds = {name: skip.attrib["type"] for name, skip in skips.items() if skip is not None}
    assert kinds == {"test_graph": "capability", "test_ipc": "probe-gate", "test_known": "expected-failure"}
    props = {p.attrib["name"]: p.attrib["value"] for p in suite.iter("property")}
    assert props == {"backend": "cpu", "suite_version": "1.0", "torch": "2.13.0+cpu", "device": "cpu",
                     "verdict": "FAIL"}


def test_skip_kinds_follow_the_plugins_wording():
    assert skip_kind("backend capability ipc_events is False on 'x'; this test needs it") == "capability"
    assert skip_kind("not on this platform (expectations cpu/expectations.toml)") == "expectation"
    assert skip_kind("needs two devices") == "skipped"
    assert render_junit(DOC).startswith('<?xml version="1.0" encoding="utf-8"?>\n<testsuites ')


def test_the_selection_counts_subset_and_a_device_mismatch_are_properties(tmp_path):
    doc = {**DOC, "selection": {"full_suite": False, "selected": 12, "deselected": 251, "subset": "smoke",
                                "markexpr": "smoke"},
           "device_mismatch": {"reason": "the test processes did not test one backend on one device (...)"}}
    suite = ET.fromstring(render_junit(doc).split("\n", 1)[1]).find("testsuite")
    assert suite is not None
    props = {p.attrib["name"]: p.attrib["value"] for p in suite.iter("property")}
    assert {k: props[k] for k in ("selected", "deselected", "subset", "markexpr", "full_suite", "verdict")} == {
        "selected": "12", "deselected": "251", "subset": "smoke", "markexpr": "smoke", "full_suite": "false",
        "verdict": "FAIL"}
    assert props["device_mismatch"].startswith("the test processes did not test one backend on one device")
