"""The conformance suite judged end to end: it passes the CPU reference device in one full run that ``verify``
finds CONFORMANT, and it fails each
deliberately broken backend (hisparse_hal/testing/broken_backends.py) in the area where its bug is; expectations,
gating and the runner's errors behave as documented."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hisparse_hal.conformance.mustpass import suite_digest
from hisparse_hal.conformance.report import AREA_TITLES, AREAS, OUTCOMES
from hisparse_hal.conformance.run_record import cpu_model_name
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


#: The one full CPU run of the suite takes about 3 min on 2 idle cores (171 s measured beside other test runs);
#: its limit leaves room for a loaded machine (pytest-timeout's default of 300 s would not).
FULL_RUN_LIMIT_S = 1500


@pytest.mark.timeout(FULL_RUN_LIMIT_S)
def test_conformance_passes_on_the_cpu_reference_device_and_verify_says_conformant(tmp_path):
    junit = tmp_path / "junit.xml"
    done, doc = _conformance(tmp_path, "--backend", "cpu", "--strict", "--junit", str(junit),
                             timeout=FULL_RUN_LIMIT_S - 120)
    assert done.returncode == 0, _tail(done)
    assert doc is not None and (tmp_path / "report" / "summary.md").exists()
    summary = doc["summary"]
    assert set(summary) == set(OUTCOMES)
    assert sum(summary.values()) == len(doc["tests"]), "the summary does not add up to the tests"
    assert summary["failed"] == summary["xpassed"] == 0
    assert doc["backend"] == "cpu" and doc["suite_version"] and doc["facts"]["capabilities"]["graph_capture"] is True
    areas = _by_area(doc)
    for area in AREAS:
        assert areas[area]["passed"] > 0, f"no {area} test passed on the CPU device"
    for test in doc["tests"]:
        assert set(test) - {"capability"} == {"id", "area", "outcome", "duration", "reason", "skip_kind"}
        if test["outcome"] == "skipped":
            assert test["reason"].strip(), f"{test['id']} was skipped without a reason"
            assert test["skip_kind"] in ("capability", "not-applicable"), test
    assert doc["format"] == 2 and doc["verdict"] == "PASS" and doc["mode"] == "full" and doc["claims"] == []
    assert doc["contract"]["id"] == "hisparse-hal-1" and doc["suite"] == suite_digest()
    assert doc["run"]["device"] == {"type": "cpu", "name": cpu_model_name(), "driver": None}
    assert doc["run"]["finished"] >= doc["run"]["started"] and doc["run"]["host"]
    assert doc["selection"]["per_area"] == {a: sum(areas[a].values()) for a in AREAS}
    table = (tmp_path / "report" / "summary.md").read_text()
    for area in AREAS:
        assert f"| {AREA_TITLES[area]} | PASS |" in table
    assert f"| **Total** | **PASS** | {summary['passed']} | 0 |" in table
    assert f"; contract hisparse-hal-1; suite {doc['suite']['version']} sha256 {doc['suite']['sha256'][:12]}; " \
        "mode full." in table
    assert '<property name="verdict" value="PASS" />' in junit.read_text()
    verified = subprocess.run([sys.executable, "-m", "hisparse_hal.cli", "verify", str(tmp_path / "report")],
                              cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert (verified.returncode, verified.stdout) == (0, "CONFORMANT\n"), verified.stdout + verified.stderr


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
    assert done.returncode == 1 and doc["verdict"] == "FAIL", "the report must agree with the exit status"
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert summary.startswith(f"# Conformance: {BROKEN_MODULE}:GatherMinusOneReadsLastRow — FAIL\n")
    assert "| **Total** | **FAIL** |" in summary and "| **Total** | **FAIL** |" in done.stdout
    assert "FAIL (--strict): expectation entry matches no test: test_gone.py (skip): stale" in done.stdout
    assert "--hal-strict" not in done.stdout


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
