"""Units of the conformance suite that need no pytest run: expectations files, the result collector and
summary, the compatibility merge, backend recipes and the runner's pytest command line."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from hisparse_hal.conformance import runner
from hisparse_hal.conformance.expectations import backend_architectures, load_expectations
from hisparse_hal.conformance.recipe import BackendRecipe, load_factory, vendor_expectations_path
from hisparse_hal.conformance.report import ResultCollector, area_of, build_results, render_summary, suite_test_id
from hisparse_hal.errors import InvalidArgumentError
from hisparse_hal.vendors.cpu.backend import CpuBackend

REPO = Path(__file__).resolve().parents[2]


def _merge_module():
    spec = importlib.util.spec_from_file_location("merge_reports", REPO / "ci" / "merge_reports.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------------------------------ expectations
def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "expectations.toml"
    path.write_text(text)
    return path


def test_expectations_are_read_with_their_reasons_and_architectures(tmp_path):
    path = _write(tmp_path, """
[[expectations]]
id = "test_ipc.py"
status = "skip"
reason = "no IPC on this runtime (ROCm/clr#0)"

[[expectations]]
id = "test_ipc.py::test_ipc_event_survives_1000_record_wait_cycles"
status = "xfail"
reason = "32-slot ring"
architectures = ["gfx942"]
""")
    found = load_expectations(path)
    assert [e.status for e in found.entries] == ["skip", "xfail"]
    cycles = "test_ipc.py::test_ipc_event_survives_1000_record_wait_cycles"
    longest, other_arch = found.lookup(cycles, ["gfx942"]), found.lookup(cycles, ["sm_90"])
    assert longest is not None and longest.status == "xfail", "the longest matching id wins"
    assert other_arch is not None and other_arch.status == "skip", (
        "an entry limited to other architectures does not apply"
    )
    assert found.lookup("test_swaps.py::test_x", []) is None
    assert found.needs_architectures()
    assert [e.id for e in found.unmatched(["test_swaps.py::test_x"])] == ["test_ipc.py", cycles]
    assert "32-slot ring" in found.entries[1].describe() and "gfx942" in found.entries[1].describe()


def test_inline_expectations_list_is_accepted(tmp_path):
    found = load_expectations(
        _write(tmp_path, 'expectations = [ { id = "test_a.py", status = "skip", reason = "r" } ]\n')
    )
    assert found.entries[0].id == "test_a.py"
    assert load_expectations(_write(tmp_path, "expectations = []\n")).entries == ()


@pytest.mark.parametrize(
    "text,message",
    [
        ('[[expectations]]\nid = "t"\nstatus = "xfail"\n', r"non-empty 'reason' is required"),
        ('[[expectations]]\nid = "t"\nstatus = "xfail"\nreason = "  "\n', r"non-empty 'reason' is required"),
        (
            '[[expectations]]\nid = "t"\nstatus = "fail"\nreason = "r"\n',
            r"'status' must be one of \('xfail', 'skip'\), got 'fail'",
        ),
        ('[[expectations]]\nstatus = "skip"\nreason = "r"\n', r"'id' must be a non-empty test id"),
        ('[[expectations]]\nid = "t"\nstatus = "skip"\nreason = "r"\nwhy = 1\n', r"unknown keys \['why'\]"),
        ('[[expectations]]\nid = "t"\nstatus = "skip"\nreason = "r"\narchs = ["x"]\n', r"spelled 'architectures'"),
        (
            '[[expectations]]\nid = "t"\nstatus = "skip"\nreason = "r"\narchitectures = "gfx942"\n',
            r"'architectures' must be a list",
        ),
        ('[[expectation]]\nid = "t"\n', r"unknown top-level keys \['expectation'\]"),
        ("id = [", r"not valid TOML"),
    ],
)
def test_a_malformed_expectations_file_is_rejected_naming_the_entry(tmp_path, text, message):
    with pytest.raises(InvalidArgumentError, match=message):
        load_expectations(_write(tmp_path, text))


def test_a_missing_expectations_file_is_rejected(tmp_path):
    with pytest.raises(InvalidArgumentError, match=r"cannot read expectations file .*nope.toml"):
        load_expectations(tmp_path / "nope.toml")


def test_architectures_come_from_versions_and_probe_facts():
    assert backend_architectures({"arch": "gfx942"}, {"architectures": ["gfx942", "gfx950"]}) == ("gfx942", "gfx950")
    assert backend_architectures({}, {"arch": "sm_90, sm_80"}) == ("sm_90", "sm_80")
    assert backend_architectures({}, {}) == ()


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


# ------------------------------------------------------------------------------------------ recipe and runner
def test_recipe_needs_exactly_one_source():
    with pytest.raises(InvalidArgumentError, match="exactly one"):
        BackendRecipe()
    with pytest.raises(InvalidArgumentError, match="not both"):
        BackendRecipe.resolve("cpu", "m:f")
    assert BackendRecipe.resolve("cpu").registry_name == "cpu"
    assert BackendRecipe.resolve(None, "m:f").describe() == "m:f (factory)"


def test_factories_are_checked():
    assert load_factory("hisparse_hal.vendors.cpu.backend:CpuBackend") is CpuBackend
    for target, message in (
        ("nocolon", "package.module:callable"),
        ("os:path.nope", "no attribute"),
        ("os:sep", "not callable"),
    ):
        with pytest.raises(InvalidArgumentError, match=message):
            load_factory(target)


class _Subclass(CpuBackend):
    """A backend defined outside any vendor package."""


def test_vendor_expectations_are_found_through_the_class_hierarchy():
    found = vendor_expectations_path(_Subclass)
    assert found is not None and found.parts[-2:] == ("cpu", "expectations.toml")


def test_runner_builds_the_pytest_command_line():
    parser = argparse.ArgumentParser()
    runner.add_arguments(parser)
    args = parser.parse_args(
        ["--backend", "cpu", "--report", "out", "--strict", "-k", "swaps", "--pytest-args", "-x --maxfail 2"]
    )
    argv = runner.pytest_arguments(args, BackendRecipe.resolve("cpu"))
    assert argv[:2] == ["-p", "hisparse_hal.conformance.plugin"] and "--pyargs" in argv
    assert argv[argv.index("--hal-backend") + 1] == "cpu"
    assert argv[argv.index("--hal-expectations") + 1].endswith("cpu/expectations.toml")
    assert argv[argv.index("--hal-report") + 1] == "out" and "--hal-strict" in argv
    assert argv[argv.index("-k") + 1] == "swaps" and argv[-3:] == ["-x", "--maxfail", "2"]
    with pytest.raises(SystemExit):
        parser.parse_args(["--backend", "cpu", "--factory", "m:f"])
