"""The runner: its pytest command line, the run it resolves once (run.json), and how little a run repeats."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from hisparse_hal import probing
from hisparse_hal.conformance import runner
from hisparse_hal.conformance.resolved_run import ResolvedRun
from hisparse_hal.errors import InvalidArgumentError
from hisparse_hal.vendors.cpu.backend import CpuBackend


def test_runner_builds_the_pytest_command_line():
    parser = argparse.ArgumentParser()
    runner.add_arguments(parser)
    args = parser.parse_args(
        ["--backend", "cpu", "--report", "out", "--strict", "-k", "swaps", "--pytest-args", "-x --maxfail 2"]
    )
    argv = runner.pytest_arguments(args, ResolvedRun.resolve("cpu"))
    assert argv[:2] == ["-p", "hisparse_hal.conformance.plugin"] and "--pyargs" in argv
    assert argv[argv.index("--hal-backend") + 1] == "cpu"
    assert argv[argv.index("--hal-expectations") + 1].endswith("cpu/expectations.toml")
    assert argv[argv.index("--hal-report") + 1] == "out" and "--hal-strict" in argv
    assert argv[argv.index("-k") + 1] == "swaps" and argv[-3:] == ["-x", "--maxfail", "2"]
    with pytest.raises(SystemExit):
        parser.parse_args(["--backend", "cpu", "--factory", "m:f"])


# ------------------------------------------------------------------------------------------ the run, resolved once
def test_a_resolved_run_round_trips_through_run_json_and_builds_without_probing(tmp_path, monkeypatch):
    run = ResolvedRun.resolve("cpu")
    assert run.recipe.registry_name == "cpu" and run.backend_class == "hisparse_hal.vendors.cpu.backend:CpuBackend"
    assert run.expectations is not None and run.expectations.endswith("cpu/expectations.toml")
    assert {p["name"] for p in run.probes} >= {"cpu", "cuda", "rocm"} and "page_lock" in run.probe_facts()
    again = ResolvedRun.read(run.write(tmp_path / "run.json"))
    assert again == run

    def no_probing(*args: Any) -> None:
        raise AssertionError("a resolved run must not scan or probe again")

    monkeypatch.setattr(probing, "discover_specs", no_probing)
    monkeypatch.setattr(probing, "run_probe", no_probing)
    assert isinstance(again.build(), CpuBackend)


def make_cpu_backend() -> CpuBackend:
    """A factory function: its backend's class is known only once it has run."""
    return CpuBackend()


def test_the_expectations_are_decided_once_for_every_source(tmp_path):
    assert ResolvedRun.resolve("cpu", expectations="none").expectations is None
    assert ResolvedRun.resolve("cpu", expectations="mine.toml").expectations == "mine.toml"
    by_class = ResolvedRun.resolve(factory="hisparse_hal.vendors.cpu.backend:CpuBackend")
    assert not by_class.expectations_pending and str(by_class.expectations).endswith("cpu/expectations.toml")
    by_function = ResolvedRun.resolve(factory="tests.conformance.test_runner:make_cpu_backend")
    assert by_function.expectations_pending and by_function.expectations is None
    decided = by_function.with_expectations_of(CpuBackend())
    assert not decided.expectations_pending and str(decided.expectations).endswith("cpu/expectations.toml")


def test_a_file_that_is_not_a_run_is_refused(tmp_path):
    (tmp_path / "run.json").write_text("{}")
    with pytest.raises(InvalidArgumentError, match="not a conformance run.json"):
        ResolvedRun.read(tmp_path / "run.json")


TRACE_SITE = Path(__file__).with_name("trace_site")


def _traced(tmp_path: Path, command: list[str]) -> dict[str, Counter[str]]:
    """Run ``command`` with every process traced; the counts of each event per process role."""
    trace = tmp_path / "trace.txt"
    env = {**os.environ, "CONFORMANCE_TRACE_FILE": str(trace),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(TRACE_SITE), os.environ.get("PYTHONPATH")]))}
    env.pop("HISPARSE_HAL_BACKEND", None)
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return trace_counts(trace.read_text())


def trace_counts(text: str) -> dict[str, Counter[str]]:
    """``<pid> <event>`` lines summed per role: ``runner``, ``pytest`` (the child) or ``other``."""
    roles: dict[str, str] = {}
    counts: dict[str, Counter[str]] = {}
    for line in text.splitlines():
        pid, _, event = line.partition(" ")
        if event.startswith("process "):
            roles[pid] = ("pytest" if " pytest" in event else "runner" if "conformance" in event else "other")
            continue
        assert not event.startswith("missing"), f"the tracer lost a target: {event}"
        counts.setdefault(roles.get(pid, "other"), Counter())[event.split(" ")[0]] += 1
    return counts


def test_a_conformance_run_scans_and_probes_once_in_the_runner_and_not_again_in_pytest(tmp_path):
    counts = _traced(tmp_path, [sys.executable, "-m", "hisparse_hal.cli", "conformance", "--backend", "cpu",
                                "-k", "test_stats_dtype"])
    probes = len(ResolvedRun.resolve("cpu").probes)
    assert counts["runner"] == Counter({"entry-point-scan": 1, "probe": probes, "mlock-trial": 1})
    # each pytest child builds the backend once (CpuBackend's own mlock trial) and resolves nothing: the -k
    # selection check's quiet collection (conformance.preflight) and the run
    assert counts["pytest"] == Counter({"mlock-trial": 2})


def test_pytest_with_the_plugin_alone_resolves_once(tmp_path):
    counts = _traced(tmp_path, [sys.executable, "-m", "pytest", "-p", runner.PLUGIN, "-c", str(runner.SETTINGS),
                                "--rootdir", str(runner.SETTINGS.parent), "-p", "no:cacheprovider", "--pyargs",
                                runner.TESTS, "-q", "--hal-backend", "cpu", "-k", "test_stats_dtype"])
    probes = len(ResolvedRun.resolve("cpu").probes)
    assert counts["pytest"] == Counter({"entry-point-scan": 1, "probe": probes, "mlock-trial": 2})


def test_every_function_the_tracer_counts_exists_where_it_looks():
    """A renamed module or function would be counted as zero calls, not as missing: check the targets exist."""
    import importlib

    site = importlib.util.spec_from_file_location("trace_site_under_test", TRACE_SITE / "sitecustomize.py")
    assert site is not None and site.loader is not None
    tracer = importlib.util.module_from_spec(site)
    site.loader.exec_module(tracer)
    for module_name, functions in tracer._TARGETS.items():
        module = importlib.import_module(module_name)
        for function in functions:
            assert callable(getattr(module, function, None)), f"{module_name}.{function} is gone; update the tracer"
