"""ci/merge_reports.py: one compatibility row per machine's report; a file that is not a report is refused."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _merge_module():
    spec = importlib.util.spec_from_file_location("merge_reports", REPO / "ci" / "merge_reports.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module



# ------------------------------------------------------------------------------------------ merge
def _doc(backend: str, outcomes: dict[str, str], arch: list[str]) -> dict:
    tests = [{"id": f"test_{area}.py::t{i}", "area": area, "outcome": o, "duration": 0.0, "reason": ""}
             for i, (area, o) in enumerate(outcomes.items())]
    summary = {
        o: sum(1 for t in tests if t["outcome"] == o) for o in ("passed", "failed", "skipped", "xfailed", "xpassed")
    }
    return {
        "suite_version": "1.0",
        "backend": backend,
        "facts": {"architectures": arch, "torch": "2.13", "probe": {"device_names": ["NVIDIA H200"]}},
        "summary": summary,
        "tests": tests,
        "selection": {"selected": len(tests), "deselected": 0, "full_suite": True},
    }


def test_merge_reports_builds_one_row_per_machine(tmp_path):
    merge = _merge_module()
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "results.json").write_text(
        json.dumps(_doc("cuda", {"probe": "passed", "swaps": "passed", "ipc": "xfailed"}, ["sm_90"]))
    )
    (tmp_path / "b.json").write_text(json.dumps(_doc("rocm", {"probe": "passed", "swaps": "failed"}, ["gfx942"])))
    rc = merge.main(["--out", str(tmp_path / "out"), str(tmp_path / "a"), f"MI300X ROCm 7.2={tmp_path / 'b.json'}"])
    assert rc == 1, "a failing row makes the merge fail"
    merged = json.loads((tmp_path / "out" / "compatibility.json").read_text())
    first, second = merged["rows"]
    assert first["label"] == "cuda on NVIDIA H200" and first["verdict"] == "PASS"
    assert first["areas"]["ipc"]["verdict"] == "PASS" and first["areas"]["gathers"]["verdict"] == "n/a"
    assert (
        second["label"] == "MI300X ROCm 7.2"
        and second["verdict"] == "FAIL"
        and second["failing"] == ["test_swaps.py::t1"]
    )
    table = (tmp_path / "out" / "compatibility.md").read_text()
    assert "| cuda on NVIDIA H200 | sm_90 | 2.13 | PASS 1/1 | PASS 1/1 | n/a |" in table
    assert "MI300X ROCm 7.2: `test_swaps.py::t1`" in table


def test_merge_reports_rejects_a_file_that_is_not_a_report(tmp_path):
    merge = _merge_module()
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(SystemExit, match="not a conformance results.json"):
        merge.main(["--out", str(tmp_path / "out"), str(tmp_path / "x.json")])
