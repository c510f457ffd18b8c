"""``hisparse-hal verify``: a report is CONFORMANT only when it is a whole, finished, full run of the installed suite
with every must-pass test allowed; each defect is named in its own line (issue 31). The reports here start from a
real small CPU run (``-k test_stats``) and are edited into what each case needs; the CONFORMANT verdict on a real
full run is checked in test_selftest.py, beside that run."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hisparse_hal.cli import main
from hisparse_hal.conformance.contracts import HAL_CONTRACT
from hisparse_hal.conformance.mustpass import file_sha256, read_mustpass
from hisparse_hal.conformance.report import OUTCOMES, overall_verdict, write_report
from hisparse_hal.conformance.verify import verify_document


@pytest.fixture(scope="module")
def small_run(tmp_path_factory) -> dict[str, Any]:
    """The results.json of a real ``conformance --backend cpu -k test_stats`` run (4 tests)."""
    where = tmp_path_factory.mktemp("small-run")
    env = {k: v for k, v in os.environ.items() if k != "HISPARSE_HAL_BACKEND"}
    done = subprocess.run([sys.executable, "-m", "hisparse_hal.cli", "conformance", "--backend", "cpu", "-k",
                           "test_stats", "--report", str(where / "report")],
                          cwd=where, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    return json.loads((where / "report" / "results.json").read_text())


def _recount(doc: dict[str, Any]) -> dict[str, Any]:
    doc["summary"] = {o: sum(1 for t in doc["tests"] if t["outcome"] == o) for o in OUTCOMES}
    doc["verdict"] = overall_verdict(doc)
    return doc


@pytest.fixture
def whole(small_run) -> dict[str, Any]:
    """The small run edited into a full run: every other must-pass test recorded as passed, no selection."""
    doc = copy.deepcopy(small_run)
    ran = {t["id"] for t in doc["tests"]}
    for test_id in read_mustpass(HAL_CONTRACT):
        if test_id not in ran:
            doc["tests"].append({"id": test_id, "area": "other", "outcome": "passed", "duration": 0.0, "reason": "",
                                 "skip_kind": None})
    doc["mode"] = "full"
    doc["selection"].update(keyword=None, deselected=0, full_suite=True, selected=len(doc["tests"]))
    return _recount(doc)


def _reasons(doc: dict[str, Any]) -> list[str]:
    return verify_document(doc).reasons


def _only_reason(doc: dict[str, Any], *words: str) -> str:
    reasons = _reasons(doc)
    assert len(reasons) == 1, reasons
    for word in words:
        assert word in reasons[0], reasons[0]
    return reasons[0]


def test_the_real_small_run_is_format_2_and_not_conformant_as_a_subset(small_run, tmp_path, capsys):
    assert small_run["format"] == 2 and small_run["contract"]["id"] == "hisparse-hal-1"
    assert small_run["mode"] == "subset" and small_run["verdict"] == "PASS (partial)"
    write_report(tmp_path, small_run)
    assert main(["verify", str(tmp_path)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "NOT CONFORMANT"
    assert "- mode: a subset of the suite ran (keyword 'test_stats'), not the full suite" in lines
    assert "- verdict: PASS (partial), not PASS" in lines
    missing = len(set(read_mustpass(HAL_CONTRACT)) - {t["id"] for t in small_run["tests"]})
    assert any(line.startswith(f"- must-pass: {missing} of ") for line in lines), lines


def test_the_edited_whole_run_is_conformant(whole, tmp_path, capsys):
    write_report(tmp_path, whole)
    assert main(["verify", str(tmp_path)]) == 0
    assert capsys.readouterr().out == "CONFORMANT\n"


def test_an_interrupted_run_is_not_conformant(whole):
    whole["incomplete"] = {"reason": "the run was interrupted (SIGINT) before every selected test ran"}
    whole["verdict"] = "INCOMPLETE"
    reasons = _reasons(whole)
    assert "incomplete: the run did not finish (the run was interrupted (SIGINT) before every selected test ran)" \
        in reasons
    assert "verdict: INCOMPLETE, not PASS" in reasons and len(reasons) == 2


def test_an_edited_expectations_file_is_not_conformant(whole, tmp_path):
    vendor = whole["expectations"]["file"]
    assert vendor and whole["expectations"]["committed"] is True and whole["expectations"]["sha256"] == \
        file_sha256(vendor)
    edited = tmp_path / "expectations.toml"
    edited.write_text(Path(vendor).read_text() + '\n[[expectations]]\nid = "test_swaps.py"\nstatus = "skip"\n'
                      'reason = "not tonight"\n')
    whole["expectations"].update(file=str(edited), sha256=file_sha256(edited), committed=False)
    _only_reason(whole, "expectations: the file the run used", str(edited), "is not the vendor's committed file",
                 "edited or replaced")


def test_an_expected_failure_from_an_edited_file_is_not_an_allowed_outcome(whole):
    test = next(t for t in whole["tests"] if t["id"].startswith("test_stats.py::"))
    test.update(outcome="xfailed", reason="known bug (expectations /tmp/x.toml)", skip_kind="expectation")
    whole["expectations"]["sha256"] = "0" * 64
    reasons = _reasons(whole)
    assert any(r.startswith("expectations: ") for r in reasons)
    assert f"{test['id']} xfailed, not from the vendor's committed expectations file: known bug " \
        "(expectations /tmp/x.toml)" in reasons


def test_a_report_of_another_suite_version_or_hash_is_not_conformant(whole):
    other = copy.deepcopy(whole)
    other["suite"]["sha256"] = "f" * 64
    _only_reason(other, "suite: the report's suite hash ffffffffffff is not the installed suite's",
                 "a different or modified suite")
    whole["suite"]["version"] = "0.9"
    _only_reason(whole, "suite: the report is of suite version 0.9")


def test_a_missing_must_pass_test_is_named(whole):
    gone = whole["tests"].pop(0)
    _only_reason(whole, f"must-pass: 1 of {len(read_mustpass(HAL_CONTRACT))} tests of hisparse-hal-1 are missing "
                 f"from the report: {gone['id']}")


def test_a_failed_test_is_named_with_its_reason_even_when_the_summary_was_not_updated(whole):
    test = whole["tests"][0]
    test.update(outcome="failed", reason="AssertionError: 3 bytes differ")
    reasons = _reasons(whole)  # summary and verdict still say PASS: verify recounts
    assert f"{test['id']} failed: AssertionError: 3 bytes differ" in reasons
    assert "verdict: PASS (its tests say FAIL), not PASS" in reasons and len(reasons) == 2


def test_a_probe_gate_skip_is_not_an_allowed_outcome(whole):
    test = whole["tests"][-1]
    why = "probe tier failed (test_probe.py::x); the rest of the suite is skipped until the probe tier passes"
    test.update(outcome="skipped", reason=why, skip_kind="probe-gate")
    _only_reason(_recount(whole), f"{test['id']} skipped (probe-gate), not for a named missing capability: {why}")


def test_a_capability_skip_is_allowed_and_a_claim_is_a_warning(whole):
    test = whole["tests"][-1]
    test.update(outcome="skipped", reason="backend capability ipc_events is False on 'x'; this test needs it",
                skip_kind="capability", capability="ipc_events")
    whole["facts"]["capabilities"]["ipc_events"] = False  # as the backend that skipped it records it
    whole["claims"] = [{"capability": "graph_capture", "claimed": False, "works": True, "evidence": "replayed"}]
    result = verify_document(_recount(whole))
    assert result.conformant and result.lines() == [
        "CONFORMANT", "warning: claim: the backend denies graph_capture, but a probe found it working: replayed"]


def test_a_capability_skip_the_reports_own_capabilities_contradict_is_named(whole):
    test = whole["tests"][-1]
    why = "backend capability ipc_events is False on 'x'; this test needs it"
    test.update(outcome="skipped", reason=why, skip_kind="capability", capability="ipc_events")
    whole["facts"]["capabilities"]["ipc_events"] = True
    _only_reason(_recount(whole), f"{test['id']} skipped for a missing capability, but the report's capabilities "
                 f"say ipc_events is true: {why}")
    whole["facts"]["capabilities"]["ipc_events"] = False
    assert verify_document(whole).conformant


def test_a_kv_format_skip_is_contradicted_when_the_recorded_formats_list_it(whole):
    test = whole["tests"][-1]
    test.update(outcome="skipped", reason="capability kv_formats lacks fp8_ds_mla", skip_kind="capability",
                capability="kv_formats")
    whole["facts"]["capabilities"]["kv_formats"] = ["bf16", "fp8_ds_mla"]
    _only_reason(_recount(whole), f"{test['id']} skipped for a missing capability, but the report's capabilities "
                 "say kv_formats lists fp8_ds_mla: capability kv_formats lacks fp8_ds_mla")
    whole["facts"]["capabilities"]["kv_formats"] = ["bf16"]
    assert verify_document(whole).conformant


def test_a_strict_run_with_unmatched_entries_is_not_conformant(whole):
    whole["expectations"].update(strict=True, unmatched=["test_gone.py (skip): stale"])
    _only_reason(_recount(whole), "verdict: FAIL, not PASS")


def test_a_format_1_report_fails_the_schema_with_each_missing_key(whole):
    for key in ("format", "contract", "suite", "run"):
        del whole[key]
    reasons = _reasons(whole)
    assert set(reasons) == {f"schema: {key} is missing" for key in ("format", "contract", "suite", "run")}


@pytest.mark.parametrize("content", [None, "{not json", "[1, 2]"])
def test_a_folder_without_a_readable_report_is_one_line_and_exit_2(tmp_path, capsys, content):
    if content is not None:
        (tmp_path / "results.json").write_text(content)
    assert main(["verify", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1
    assert captured.err.startswith("hisparse-hal verify: ")


def test_a_scaled_down_setting_is_a_warning_not_a_reason(whole):
    """A smaller cache_ops run is the same suite (hash and ids), so it stays conformant, and verify says so."""
    whole["facts"]["env"] = {**whole["facts"].get("env", {}), "HISPARSE_HAL_CACHE_OPS_SEQUENCES": "16"}
    result = verify_document(whole)
    assert result.conformant and result.lines()[-1] == (
        "warning: setting: the run set HISPARSE_HAL_CACHE_OPS_SEQUENCES=16 (the cache_ops tier ran that many "
        "generated sequences, not its default)")
