"""The conformance suite judged end to end: it passes the CPU reference device (run in parts, each well under the
per-test time limit on a loaded machine), and it fails each
deliberately broken backend (hisparse_hal/testing/broken_backends.py) in the area where its bug is; expectations,
gating and the runner's errors behave as documented."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hisparse_hal.conformance.report import AREA_TITLES, AREAS, OUTCOMES
from hisparse_hal.testing.broken_backends import BROKEN, MUST_FAIL

BROKEN_MODULE = "hisparse_hal.testing.broken_backends"


def _conformance(tmp_path: Path, *args: str, timeout: float = 900) -> tuple[subprocess.CompletedProcess, dict | None]:
    """Run ``hisparse-hal conformance`` in a fresh interpreter (cwd: a temp dir) with a report."""
    env = dict(os.environ)
    env.pop("HISPARSE_HAL_BACKEND", None)
    report = tmp_path / "report"
    done = subprocess.run(
        [sys.executable, "-m", "hisparse_hal.cli", "conformance", *args, "--report", str(report)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout,
    )
    results = report / "results.json"
    return done, (json.loads(results.read_text()) if results.exists() else None)


def _by_area(doc: dict) -> dict[str, dict[str, int]]:
    out = {area: {o: 0 for o in OUTCOMES} for area in (*AREAS, "other")}
    for test in doc["tests"]:
        out[test["area"]][test["outcome"]] += 1
    return out


def _tail(done: subprocess.CompletedProcess) -> str:
    return (done.stdout[-4000:] + "\n" + done.stderr[-2000:]).strip()


#: The CPU run of the whole suite, in parts that each stay well under pytest-timeout's limit on a loaded
#: machine: (the test modules' -k expression, the areas it covers).
SUITE_PARTS = {
    "probe-stats-config-pinning": ("test_probe or test_surface or test_stats or test_config or test_pinning",
                                   ("probe", "surface", "stats", "config", "pinning")),
    "swaps-gathers": ("test_swaps or test_gathers", ("swaps", "gathers")),
    "capture-cache_ops": ("test_capture or test_cache_ops", ("capture", "cache_ops")),
    "ipc": ("test_ipc", ("ipc",)),
    "scenario": ("test_scenario", ("scenario",)),
}


def test_the_suite_parts_cover_every_area_and_every_test_module():
    modules = {p.stem for p in (Path(__file__).parents[2] / "conformance" / "tests").glob("test_*.py")}
    keywords = {word for expression, _ in SUITE_PARTS.values() for word in expression.split(" or ")}
    assert keywords == modules
    assert sorted(area for _, areas in SUITE_PARTS.values() for area in areas) == sorted(AREAS)


@pytest.mark.parametrize("part", sorted(SUITE_PARTS))
def test_conformance_passes_on_the_cpu_reference_device(tmp_path, part):
    keyword, part_areas = SUITE_PARTS[part]
    done, doc = _conformance(tmp_path, "--backend", "cpu", "--strict", "-k", keyword)
    assert done.returncode == 0, _tail(done)
    assert doc is not None and (tmp_path / "report" / "summary.md").exists()
    summary = doc["summary"]
    assert set(summary) == set(OUTCOMES)
    assert sum(summary.values()) == len(doc["tests"]), "the summary does not add up to the tests"
    assert summary["failed"] == summary["xpassed"] == 0
    assert doc["backend"] == "cpu" and doc["suite_version"] and doc["facts"]["capabilities"]["graph_capture"] is True
    areas = _by_area(doc)
    for area in part_areas:
        assert areas[area]["passed"] > 0, f"no {area} test passed on the CPU device"
    for test in doc["tests"]:
        assert set(test) == {"id", "area", "outcome", "duration", "reason"}
        if test["outcome"] == "skipped":
            assert test["reason"].strip(), f"{test['id']} was skipped without a reason"
    table = (tmp_path / "report" / "summary.md").read_text()
    for area in part_areas:
        assert f"| {AREA_TITLES[area]} | PASS |" in table
    assert f"| **Total** | **PASS (partial)** | {summary['passed']} | 0 |" in table  # a selection of the suite


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_conformance_fails_a_broken_backend_in_its_area(tmp_path, name):
    area, keyword = BROKEN[name]
    done, doc = _conformance(tmp_path, "--factory", f"{BROKEN_MODULE}:{name}", "-k", f"({keyword}) or test_stats")
    assert done.returncode == 1, f"{name} was not failed:\n{_tail(done)}"
    assert doc is not None, _tail(done)
    areas = _by_area(doc)
    assert areas[area]["failed"] > 0, f"{name} has no failure in {area}: {areas}"
    failed = {t["id"] for t in doc["tests"] if t["outcome"] == "failed"}
    for test_id in MUST_FAIL.get(name, ()):
        assert any(i.endswith(test_id) for i in failed), f"{name} did not fail {test_id}; failed: {sorted(failed)}"
    if area == "probe":
        assert areas["stats"]["skipped"] == sum(areas["stats"].values()) > 0, "a failed probe tier must skip the rest"
    else:
        assert areas["probe"]["failed"] == 0, f"{name}'s bug leaked into the probe tier and gated the suite"
        control = "config" if area == "stats" else "stats"  # a stats bug is judged against the config area
        assert areas[control]["failed"] == 0 and areas[control]["passed"] > 0, f"an unrelated area ({control}) failed"
    assert doc["summary"]["failed"] == sum(a["failed"] for a in areas.values())


def test_a_failed_probe_tier_skips_the_rest_with_a_reason_under_xdist(tmp_path):
    done, doc = _conformance(
        tmp_path, "--factory", f"{BROKEN_MODULE}:UnstableCapabilities", "-n", "2", "-k", "probe or stats or gathers"
    )
    assert done.returncode == 1, _tail(done)
    assert doc is not None, _tail(done)
    areas = _by_area(doc)
    assert areas["probe"]["failed"] == 1
    later = [t for t in doc["tests"] if t["area"] in ("stats", "gathers")]
    assert later and all(t["outcome"] == "skipped" for t in later), [t["outcome"] for t in later]
    assert all("probe tier failed (test_probe.py::test_capabilities_are_a_stable_value)" in t["reason"] for t in later)


def _expectations(tmp_path: Path, entries: str) -> Path:
    path = tmp_path / "expectations.toml"
    path.write_text(entries)
    return path


def test_expectations_skip_xfail_strictly_and_warn_on_stale_entries(tmp_path):
    path = _expectations(tmp_path, """
[[expectations]]
id = "test_stats.py::test_stats_dtype_is_a_64_bit_integer_and_matches_capabilities"
status = "xfail"
reason = "planted: this test passes, so the run must report an unexpected pass"

[[expectations]]
id = "test_stats.py::test_new_stats_counter"
status = "skip"
reason = "planted skip by prefix"

[[expectations]]
id = "test_stats.py::test_stats_deltas"
status = "xfail"
reason = "applies only on another architecture"
architectures = ["gfx942"]

[[expectations]]
id = "test_nowhere.py::test_that_does_not_exist"
status = "skip"
reason = "stale entry"
""")
    done, doc = _conformance(tmp_path, "--backend", "cpu", "--expectations", str(path), "-k", "test_stats")
    assert done.returncode == 1, _tail(done)
    assert doc is not None, _tail(done)
    outcome = {t["id"].split("::")[1]: t for t in doc["tests"]}
    assert outcome["test_stats_dtype_is_a_64_bit_integer_and_matches_capabilities"]["outcome"] == "xpassed"
    assert outcome["test_new_stats_counter_is_zeroed_on_the_device"]["outcome"] == "skipped"
    assert "planted skip by prefix" in outcome["test_new_stats_counter_is_zeroed_on_the_device"]["reason"]
    assert outcome["test_stats_deltas_are_taken_modulo_two_to_the_64"]["outcome"] == "passed"
    assert doc["summary"]["xpassed"] == 1
    assert doc["expectations"]["unmatched"] == ["test_nowhere.py::test_that_does_not_exist (skip): stale entry"]
    assert "expectation entry matches no test" in done.stdout


def test_expected_failures_of_a_broken_backend_pass_the_run_and_stale_entries_fail_it_under_strict(tmp_path):
    path = _expectations(tmp_path, """
[[expectations]]
id = "test_gathers.py::test_gather_reads_row_zero_for_minus_one_ids"
status = "xfail"
reason = "planted: -1 reads the last row"
""")
    args = (
        "--factory",
        f"{BROKEN_MODULE}:GatherMinusOneReadsLastRow",
        "--expectations",
        str(path),
        "-k",
        "reads_row_zero",
    )
    done, doc = _conformance(tmp_path, *args)
    assert done.returncode == 0, _tail(done)
    assert doc is not None, _tail(done)
    assert doc["summary"]["xfailed"] == 2 and doc["summary"]["failed"] == 0
    stale = _expectations(
        tmp_path, path.read_text() + '\n[[expectations]]\nid = "test_gone.py"\nstatus = "skip"\nreason = "stale"\n'
    )
    done, doc = _conformance(tmp_path, *args[:2], "--expectations", str(stale), "-k", "reads_row_zero", "--strict")
    assert done.returncode != 0, _tail(done)
    assert doc is not None, _tail(done)
    assert doc["expectations"]["unmatched"] and doc["expectations"]["strict"] is True


def test_a_malformed_expectations_file_is_a_usage_error(tmp_path):
    path = _expectations(tmp_path, '[[expectations]]\nid = "test_stats.py"\nstatus = "xfail"\n')
    done, _ = _conformance(tmp_path, "--backend", "cpu", "--expectations", str(path), "-k", "test_stats")
    assert done.returncode == 2, _tail(done)  # usage or environment, as in every subcommand
    assert "a non-empty 'reason' is required" in done.stderr + done.stdout


def test_an_unknown_backend_fails_with_the_probe_table(tmp_path):
    done, doc = _conformance(tmp_path, "--backend", "no-such-backend")
    assert done.returncode == 2 and doc is None
    assert "unknown backend 'no-such-backend'" in done.stderr
    assert "available  reason" in done.stderr and "cpu" in done.stderr


@pytest.mark.parametrize(
    "factory,message",
    [("no_such_module:make", "cannot import 'no_such_module'"), (f"{BROKEN_MODULE}:NoSuchClass", "has no attribute"),
     ("builtins:dict", "not a HiSparseBackend"), ("justaname", "package.module:callable")],
)
def test_a_bad_factory_fails_clearly(tmp_path, factory, message):
    done, _ = _conformance(tmp_path, "--factory", factory, "-k", "test_stats")
    assert done.returncode != 0
    assert message in done.stderr + done.stdout, _tail(done)


def test_a_backend_that_crashes_the_process_is_reported_in_the_test_that_crashed_and_the_run_resumes(tmp_path):
    done, doc = _conformance(
        tmp_path, "--factory", f"{BROKEN_MODULE}:SwapCrashesTheProcess", "-k", "test_stats or test_swap_batch_of_n"
    )
    assert done.returncode == 1, _tail(done)
    assert "the test process died" in done.stderr and "resuming" in done.stderr
    assert doc is not None, _tail(done)
    crashed = [t for t in doc["tests"] if "died" in t["reason"]]
    assert len(crashed) == 6 and all(t["area"] == "swaps" and t["outcome"] == "failed" for t in crashed)
    assert "incomplete" not in doc
    by_area = _by_area(doc)
    assert by_area["stats"]["passed"] == 4, "tests after the crash must still run"
    assert sum(doc["summary"].values()) == len(doc["tests"])
    assert len({t["id"] for t in doc["tests"]}) == len(doc["tests"])
    assert "| Swaps | FAIL |" in (tmp_path / "report" / "summary.md").read_text()
