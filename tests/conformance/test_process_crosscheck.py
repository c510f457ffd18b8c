"""Every test process of one conformance run must test one backend on one device (SYCL-CTS cross-checks each test
executable's device dump): xdist workers and a process resumed after a crash are compared, and a run whose processes
differ is FAIL in results.json, summary.md, the exit status, verify and the merged page, even when every test
passed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hisparse_hal.conformance import matrix_page, report, run_record, verify

from .test_runner_usage import _conformance

BROKEN = "hisparse_hal.testing.broken_backends"


def _identity(runtime: str = "12.8", name: str = "H200") -> dict:
    return {"backend_class": "vendors.cuda:CudaBackend", "device": "cuda:0",
            "device_identity": {"type": "cuda", "name": name, "driver": "575.57"},
            "capabilities": {"versions": {"runtime": runtime}, "ipc_events": True}}


# ------------------------------------------------------------------------------------------ the comparison
def test_one_process_or_equal_processes_are_no_mismatch():
    assert run_record.device_mismatch({}) is None
    assert run_record.device_mismatch({"main (pid 1)": _identity()}) is None
    assert run_record.device_mismatch({"gw0 (pid 1)": _identity(), "gw1 (pid 2)": _identity()}) is None


def test_a_mismatch_names_the_processes_and_each_fact_that_differs_with_its_values():
    found = run_record.device_mismatch({"gw1 (pid 2)": _identity(name="A100"), "gw0 (pid 1)": _identity()})
    assert found is not None
    assert found["reason"] == (
        "the test processes did not test one backend on one device (2 processes: gw0 (pid 1), gw1 (pid 2)): "
        "device_identity.name: gw0 (pid 1) 'H200', gw1 (pid 2) 'A100'")
    assert found["processes"]["gw1 (pid 2)"]["device_identity"]["name"] == "A100"


def test_a_fact_only_one_process_has_is_a_difference_and_long_lists_are_cut_at_three():
    other = _identity(runtime="12.9", name="A100")
    other["device"] = "cuda:1"
    other["device_identity"]["driver"] = "580.1"
    other["capabilities"]["versions"]["hip"] = "7.2"
    found = run_record.device_mismatch({"a": _identity(), "b": other})
    assert found is not None
    assert found["reason"].endswith("; and 2 more facts")
    assert "capabilities.versions.hip: a None, b '7.2'" in found["reason"]


def test_process_identity_keeps_what_the_processes_must_agree_on_and_nothing_else():
    facts = {**_identity(), "architectures": ["sm_90"], "process": "gw0 (pid 1)", "backend_name": "cuda"}
    assert run_record.process_identity(facts) == _identity()


# ------------------------------------------------------------------------------------------ the verdict
def _doc_with(mismatch: dict | None) -> dict[str, Any]:
    summary = {o: 0 for o in report.OUTCOMES}
    summary["passed"] = 3
    doc: dict[str, Any] = {"suite_version": "1.1", "backend": "cuda", "facts": {"device": "cuda:0"}, "tests": [],
                           "summary": summary, "selection": {"full_suite": True}}
    if mismatch:
        doc["device_mismatch"] = mismatch
    return doc


def test_a_mismatch_makes_an_all_passed_run_fail_and_summary_md_says_why():
    mismatch = run_record.device_mismatch({"gw0 (pid 1)": _identity(), "gw1 (pid 2)": _identity(name="A100")})
    assert mismatch is not None
    assert report.overall_verdict(_doc_with(None)) == "PASS"
    doc = _doc_with(mismatch)
    assert report.overall_verdict(doc) == "FAIL"
    summary = report.render_summary(doc)
    assert summary.splitlines()[0].endswith("— FAIL")
    assert f"**FAIL (devices)**: {mismatch['reason']}." in summary


def test_the_merged_page_notes_the_mismatch_on_the_row(tmp_path):
    mismatch = run_record.device_mismatch({"gw0 (pid 1)": _identity(), "gw1 (pid 2)": _identity(name="A100")})
    assert mismatch is not None
    doc = {**_doc_with(mismatch), "verdict": "FAIL"}
    merged = matrix_page.merge([matrix_page.ReportInput(None, doc, str(tmp_path / "results.json"))])
    (row,) = merged["rows"]
    assert row["verdict"] == "FAIL" and row["notes"] == [mismatch["reason"]]
    assert "device_identity.name: gw0 (pid 1) &#x27;H200&#x27;" in matrix_page.render_html(merged)


# ------------------------------------------------------------------------------------------ real runs
def _report(folder: Path) -> dict:
    return json.loads((folder / "results.json").read_text(encoding="utf-8"))


def test_xdist_workers_that_report_different_versions_fail_the_run_though_every_test_passed(tmp_path):
    done = _conformance(tmp_path, "--factory", f"{BROKEN}:VersionsDifferPerProcess", "-n", "2",
                        "-k", "test_probe", "--report", str(tmp_path / "r"))
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    doc = _report(tmp_path / "r")
    assert doc["summary"]["failed"] == 0 and doc["summary"]["passed"] > 0
    assert doc["verdict"] == "FAIL"
    labels = sorted(doc["facts"]["processes"])
    assert [label.split(" ")[0] for label in labels] == ["gw0", "gw1"]
    reason = doc["device_mismatch"]["reason"]
    assert "capabilities.versions.runtime" in reason and all(label in reason for label in labels)
    assert f"**FAIL (devices)**: {reason}." in (tmp_path / "r" / "summary.md").read_text(encoding="utf-8")
    assert "**FAIL (devices)**" in done.stdout
    checked = verify.verify_folder(tmp_path / "r")
    assert f"devices: {reason}" in checked.reasons


def test_xdist_workers_that_agree_are_listed_and_the_run_passes(tmp_path):
    done = _conformance(tmp_path, "--backend", "cpu", "-n", "2", "-k", "test_probe", "--report", str(tmp_path / "r"))
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    doc = _report(tmp_path / "r")
    assert len(doc["facts"]["processes"]) == 2 and "device_mismatch" not in doc
    assert doc["verdict"] == "PASS (partial)"
    (first, second) = doc["facts"]["processes"].values()
    assert first == second and first["backend_class"].endswith(":CpuBackend")


@pytest.mark.parametrize(("factory", "mismatch"), [
    ("SwapCrashesTheProcess", False),
    ("CrashesAndVersionsDifferPerProcess", True),
])
def test_the_process_resumed_after_a_crash_is_compared_with_the_one_that_crashed(tmp_path, factory, mismatch):
    done = _conformance(tmp_path, "--factory", f"{BROKEN}:{factory}", "--expectations", "none",
                        "-k", "test_swap_batch_of_n_descriptors_copies_every_byte and 8191", "--report",
                        str(tmp_path / "r"))
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]  # the crash is a failure either way
    doc = _report(tmp_path / "r")
    processes = doc["facts"]["processes"]
    assert len(processes) == 2 and all(label.startswith("main (pid ") for label in processes), processes
    assert ("device_mismatch" in doc) is mismatch
    if mismatch:
        assert "capabilities.versions.runtime" in doc["device_mismatch"]["reason"]
