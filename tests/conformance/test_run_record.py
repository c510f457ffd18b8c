"""What a report records about its run (results.json format 2, issue 31): a denied capability that works is
reported as a claim (a warning, the run still passes); an interrupted ``-n 2`` run still names its device and
backend and reads INCOMPLETE n/N for the area it cut short; the run facts are read, not guessed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from hisparse_hal.conformance.run_record import checkout_commit, cpu_model_name, device_identity

PLANTED = textwrap.dedent('''
    """Backends planted for tests/conformance/test_run_record.py."""
    import dataclasses
    import os
    import time

    from hisparse_hal.vendors.cpu.backend import CpuBackend


    class DeniesWorkingCapabilities(CpuBackend):
        """Denies IPC events and graph capture, both of which work: a stale or dishonest claim."""

        def __init__(self):
            super().__init__()
            self._capabilities = dataclasses.replace(self._capabilities, ipc_events=False, graph_capture=False)


    class GatherWaitsForAFile(CpuBackend):
        """Gathers block until the file named by PLANTED_RELEASE exists (at most 300 s): a run stopped mid-area."""

        def gather_resident_rows(self, source, destination, row_ids):
            deadline = time.monotonic() + 300
            while not os.path.exists(os.environ["PLANTED_RELEASE"]) and time.monotonic() < deadline:
                time.sleep(0.05)
            super().gather_resident_rows(source, destination, row_ids)
''')


def _start(tmp_path: Path, *args: str) -> tuple[subprocess.Popen, Path]:
    (tmp_path / "planted_backends.py").write_text(PLANTED)
    env = {k: v for k, v in os.environ.items() if k != "HISPARSE_HAL_BACKEND"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PLANTED_RELEASE"] = str(tmp_path / "release")
    report = tmp_path / "report"
    child = subprocess.Popen([sys.executable, "-m", "hisparse_hal.cli", "conformance", *args, "--report", str(report)],
                             cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return child, report


def test_a_denied_capability_that_works_is_reported_as_a_claim_and_the_run_still_passes(tmp_path):
    child, report = _start(tmp_path, "--factory", "planted_backends:DeniesWorkingCapabilities", "-k",
                           "test_claims or test_backend_identity")
    out, err = child.communicate(timeout=600)
    assert child.returncode == 0, out[-3000:] + err[-2000:]
    doc = json.loads((report / "results.json").read_text())
    claims = {c["capability"]: c for c in doc["claims"]}
    assert set(claims) == {"ipc_events", "graph_capture"}, doc["claims"]
    assert claims["ipc_events"]["claimed"] is False and claims["ipc_events"]["works"] is True
    assert "create_ipc_event() and export_event() succeeded" in claims["ipc_events"]["evidence"]
    assert "capture() captured an empty graph that replays" in claims["graph_capture"]["evidence"]
    assert doc["summary"]["failed"] == 0 and doc["verdict"] == "PASS (partial)"
    assert doc["backend_under_test"]["kind"] == "factory"
    assert doc["backend_under_test"]["qualname"] == "planted_backends:DeniesWorkingCapabilities"
    summary = (report / "summary.md").read_text()
    assert "## Capability claims that probes contradict (warning)" in summary
    assert "- `graph_capture`: the backend denies it, but a probe found it working" in summary
    assert "warning: the backend denies ipc_events, but a probe found it working" in out


def test_an_interrupted_run_under_xdist_names_its_device_and_its_cut_area(tmp_path):
    child, report = _start(tmp_path, "--factory", "planted_backends:GatherWaitsForAFile", "-n", "2", "-k",
                           "test_probe or test_stats or test_gathers")
    results = report / "results.json"
    try:
        deadline = time.monotonic() + 300
        running = None
        while running is None and time.monotonic() < deadline and child.poll() is None:
            time.sleep(0.2)
            try:
                checkpoint = json.loads(results.read_text())
            except (OSError, ValueError):
                continue
            running = (checkpoint.get("incomplete") or {}).get("running") or None
            if running and "test_gathers.py" not in running:
                running = None  # wait until a gather blocks
        assert running, "no gather test started"
        assert checkpoint["facts"]["device"] == "cpu", "the checkpoint of a -n run must name the device"
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=300)
    finally:
        (tmp_path / "release").touch()
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == 130, out[-3000:] + err[-2000:]
    doc = json.loads(results.read_text())
    assert doc["verdict"] == "INCOMPLETE" and doc["incomplete"]
    assert doc["facts"]["device"] == "cpu" and doc["facts"]["backend_class"].endswith(":GatherWaitsForAFile")
    assert doc["facts"]["capabilities"]["graph_capture"] is True
    assert doc["run"]["device"] == {"type": "cpu", "name": cpu_model_name(), "driver": None}
    summary = (report / "summary.md").read_text()
    assert "device cpu;" in summary and "device ?" not in summary
    gathers = doc["selection"]["per_area"]["gathers"]
    ran = sum(1 for t in doc["tests"] if t["area"] == "gathers")
    assert ran < gathers and f"| Gathers | INCOMPLETE {ran}/{gathers} |" in summary


def test_device_identity_reads_the_probe_facts_and_versions_it_names():
    cuda_facts = {"devices": [{"index": 0, "name": "NVIDIA A100"}, {"index": 1, "name": "NVIDIA H200"}],
                  "nvidia_driver": "570.86.15"}
    assert device_identity("cuda:1", {"driver": "12.8"}, cuda_facts) == \
        {"type": "cuda", "name": "NVIDIA H200", "driver": "570.86.15"}
    assert device_identity("cuda:0", {"driver": "12.8"}, {}) == {"type": "cuda", "name": None, "driver": "12.8"}
    rocm = device_identity("cuda:0", {"product": "MI300X", "hip_runtime": "6.2.1"}, {"driver_version": "6.8.5"})
    assert rocm == {"type": "cuda", "name": "MI300X", "driver": "6.8.5"}
    assert device_identity("cuda:0", {}, {}, torch_name="Some GPU")["name"] == "Some GPU"
    cpu = device_identity("cpu", {}, {})
    assert cpu["type"] == "cpu" and cpu["driver"] is None and cpu["name"] == cpu_model_name()


def test_the_commit_is_the_checkouts_or_null_outside_one(tmp_path):
    commit = checkout_commit()
    if commit is not None:  # an editable install in a git checkout
        assert len(commit.split()[0]) == 40 and commit.endswith(("(dirty)", commit.split()[0]))
    assert checkout_commit(tmp_path) is None
