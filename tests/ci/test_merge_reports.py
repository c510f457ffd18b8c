"""ci/merge_reports.py: one compatibility row per machine's report; a file that is not a report is refused."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from tests.ci import matrix_reports as reports

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
    assert "| cuda on NVIDIA H200 | sm_90 | 2.13 | PASS 1/1 | n/a | PASS 1/1 | n/a |" in table  # probe, surface, swaps
    assert "MI300X ROCm 7.2: `test_swaps.py::t1`" in table


def _refused(merge, capsys, argv: list[str]) -> str:
    """The one stderr line of a refused merge (exit 2, as every command exits for bad input)."""
    assert merge.main(argv) == 2
    (line,) = capsys.readouterr().err.splitlines()
    return line


def test_merge_reports_rejects_a_file_that_is_not_a_report(tmp_path, capsys):
    merge = _merge_module()
    (tmp_path / "x.json").write_text("{}")
    line = _refused(merge, capsys, ["--out", str(tmp_path / "out"), str(tmp_path / "x.json")])
    assert line.startswith("merge_reports: ") and "not a conformance results.json" in line
    assert not (tmp_path / "out").exists()


def test_a_folder_without_results_json_is_refused_with_exit_2(tmp_path, capsys):
    merge = _merge_module()
    (tmp_path / "empty").mkdir()
    line = _refused(merge, capsys, ["--out", str(tmp_path / "out"), str(tmp_path / "empty")])
    assert line.startswith("merge_reports: ") and str(tmp_path / "empty") in line


# ------------------------------------------------------------------------------------------ six kinds of report
def _six(tmp_path: Path) -> list[str]:
    """A full PASS, a FAIL, an INCOMPLETE run cut short in cache ops, a ``-k`` subset, a ``--strict`` failure and
    an interrupted format-1 report, as report folders; returns their paths in that order."""
    docs = {"pass": reports.full_pass(), "fail": reports.with_failures(), "cut": reports.cut_short(),
            "subset": reports.keyword_subset(), "strict": reports.strict_failure(),
            "old": reports.format1(incomplete=True)}
    return [str(reports.write(tmp_path / name, doc, reports.real_bench() if name == "pass" else None))
            for name, doc in docs.items()]


def _real_run(tmp_path: Path) -> Path:
    script = shutil.which("hisparse-hal", path=str(Path(sys.executable).parent)) or shutil.which("hisparse-hal")
    assert script, "the hisparse-hal console script is not installed (pip install -e '.[test]')"
    folder = tmp_path / "real"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HISPARSE_HAL_")}
    done = subprocess.run([script, "conformance", "--backend", "cpu", "-k", "test_backend_identity", "--report",
                           str(folder)], env=env, capture_output=True, text=True, timeout=280)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return folder


def test_merge_names_each_row_by_backend_device_and_host_and_keeps_every_verdict(tmp_path):
    merge = _merge_module()
    specs = [*_six(tmp_path), str(_real_run(tmp_path))]
    rc = merge.main(["--out", str(tmp_path / "out"), *specs])
    assert rc == 1
    merged = json.loads((tmp_path / "out" / "compatibility.json").read_text())
    rows = merged["rows"]
    assert [r["label"] for r in rows[:5]] == [
        "cpu (registry) on Intel Xeon Platinum 8480+ @ node-a", "cpu (registry) on AMD EPYC 9654 @ node-b",
        "cpu (registry) on Intel Xeon Gold 6338 @ node-c", "cpu (registry) on Intel Xeon Gold 6338 @ node-d",
        "cpu (registry) on Intel Xeon Gold 6338 @ node-e"]
    assert len({r["label"] for r in rows}) == len(rows), "every row can be told apart"
    assert [r["verdict"] for r in rows] == ["PASS", "FAIL", "INCOMPLETE", "PASS (partial)", "FAIL", "INCOMPLETE",
                                            "PASS (partial)"]
    cut, old, real = rows[2], rows[5], rows[6]
    assert cut["areas"]["cache_ops"]["verdict"] == "INCOMPLETE 2/51" and cut["areas"]["probe"]["verdict"] == "PASS"
    assert old["areas"]["cache_ops"]["verdict"] == "INCOMPLETE 4/?", "no per-area selection: N unknown, never PASS"
    assert rows[4]["strict_unmatched"] == ["test_swaps.py::test_renamed_long_ago"]
    assert rows[1]["failing"] == [
        "test_swaps.py::test_swaps_1", "test_swaps.py::test_swaps_2", "test_ipc.py::test_ipc_1"]
    assert rows[1]["claims"][0]["capability"] == "graph_capture"
    assert rows[0]["contract"] == "hisparse-hal-1" and rows[0]["mode"] == "full" and rows[3]["mode"] == "subset"
    assert rows[0]["hisparse_hal_version"] == "0.9.0" and rows[0]["started"] == "2026-12-05T02:10:00Z"
    assert old["contract"] == old["mode"] == old["started"] == old["hisparse_hal_version"] == "not recorded"
    assert rows[0]["bench"] == {"file": str(tmp_path / "pass" / "bench.json"), "figures": ["gathers", "swaps"]}
    assert real["label"].startswith("cpu (registry) on ") and real["areas"]["probe"]["passed"] == 1
    assert real["areas"]["probe"]["verdict"] == "PASS" and real["areas"]["swaps"]["verdict"] == "n/a"

    table = (tmp_path / "out" / "compatibility.md").read_text()
    assert "| cpu (registry) on Intel Xeon Gold 6338 @ node-c | - | 2.13.0+cpu | PASS 2/2 |" in table
    assert "| INCOMPLETE 2/51 | n/a | n/a | **INCOMPLETE** |" in table  # scenario, claims not reached
    lines = {line.split(" | ")[0]: line for line in table.splitlines() if line.startswith("| cpu")}
    old_line = lines["| cpu (registry) on cpu"]  # format 1: no CPU model, no host
    assert old_line.endswith("| INCOMPLETE 4/? | n/a | n/a | **INCOMPLETE** |") and "PASS" not in old_line
    assert lines["| cpu (registry) on Intel Xeon Gold 6338 @ node-e"].endswith("**FAIL** |")
    assert "expectation entry matches no test (--strict): `test_swaps.py::test_renamed_long_ago`" in table
    assert "contract hisparse-hal-1; mode full; started 2026-12-05T02:10:00Z; hisparse-hal 0.9.0" in table
    assert "`graph_capture`: capture() recorded and replayed a swap" in table

    page = (tmp_path / "out" / "index.html").read_text()
    assert 'href="#report-2-fail-swaps"' in page and 'id="report-2-fail-swaps"' in page
    assert "INCOMPLETE</span><span class=\"n\">2/51" in page and "<svg" in page


def test_exit_status_is_zero_only_for_full_passes_and_a_strict_failure_never_passes(tmp_path):
    merge = _merge_module()
    full = str(reports.write(tmp_path / "pass", reports.full_pass()))
    subset = str(reports.write(tmp_path / "subset", reports.keyword_subset()))
    strict = str(reports.write(tmp_path / "strict", reports.strict_failure()))
    out = str(tmp_path / "out")
    assert merge.main(["--out", out, full]) == 0
    assert merge.main(["--out", out, full, subset]) == 1
    assert merge.main(["--out", out, "--allow-partial", full, subset]) == 0
    assert merge.main(["--out", out, "--allow-partial", full, strict]) == 1


def test_a_format_1_strict_run_with_an_unmatched_entry_reads_fail(tmp_path):
    """Newcomer trial #2: the report has no verdict key and every test passed, but --strict failed the run."""
    merge = _merge_module()
    folder = reports.write(tmp_path / "old", reports.format1(strict_unmatched=True))
    assert merge.main(["--out", str(tmp_path / "out"), str(folder)]) == 1
    row = json.loads((tmp_path / "out" / "compatibility.json").read_text())["rows"][0]
    assert row["verdict"] == "FAIL" and row["strict_unmatched"] == ["test_gone.py::test_x"]
    assert "**FAIL**" in (tmp_path / "out" / "compatibility.md").read_text()


def test_a_recorded_verdict_better_than_the_outcomes_is_overruled_with_a_note(tmp_path):
    merge = _merge_module()
    doc = reports.with_failures()
    doc["verdict"] = "PASS"
    folder = reports.write(tmp_path / "r", doc)
    assert merge.main(["--out", str(tmp_path / "out"), str(folder)]) == 1
    row = json.loads((tmp_path / "out" / "compatibility.json").read_text())["rows"][0]
    assert row["verdict"] == "FAIL"
    assert row["notes"] == ["results.json records PASS, but its outcomes say FAIL"]


def test_rows_with_the_same_automatic_label_are_told_apart_by_their_source(tmp_path):
    merge = _merge_module()
    a = reports.write(tmp_path / "a", reports.format1())
    b = reports.write(tmp_path / "b", reports.format1())
    merge.main(["--out", str(tmp_path / "out"), str(a), str(b)])
    labels = [r["label"] for r in json.loads((tmp_path / "out" / "compatibility.json").read_text())["rows"]]
    assert labels == [f"cpu (registry) on cpu [{a / 'results.json'}]", f"cpu (registry) on cpu [{b / 'results.json'}]"]


def test_an_unreadable_bench_json_is_refused_by_name(tmp_path, capsys):
    merge = _merge_module()
    folder = reports.write(tmp_path / "r", reports.full_pass())
    (folder / "bench.json").write_text("{not json")
    line = _refused(merge, capsys, ["--out", str(tmp_path / "out"), str(folder)])
    assert re.search(r"cannot read benchmark figures .*r/bench.json", line), line
    assert not (tmp_path / "out").exists(), "nothing is written when an input is refused"


def test_a_report_with_a_malformed_test_entry_is_refused_by_name(tmp_path, capsys):
    merge = _merge_module()
    doc = reports.full_pass()
    del doc["tests"][2]["outcome"]
    folder = reports.write(tmp_path / "r", doc)
    line = _refused(merge, capsys, ["--out", str(tmp_path / "out"), str(folder)])
    assert re.search(r"r/results.json: every tests\[\] entry needs id, area and outcome; got "
                     r"\[\{'id': 'test_probe.py::test_probe_2'", line), line
