"""Conformance report folders for the matrix tests, built as JSON: a full PASS, a FAIL, an INCOMPLETE run cut
short in an area, a ``-k`` subset, a ``--strict`` failure and a format-1 report from before the run record."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

OUTCOMES = ("passed", "failed", "skipped", "xfailed", "xpassed")


def _tests(per_area: dict[str, list[str]], reasons: dict[str, str] | None = None) -> list[dict[str, Any]]:
    tests = []
    for area, outcomes in per_area.items():
        for n, outcome in enumerate(outcomes):
            test_id = f"test_{area}.py::test_{area}_{n}"
            reason = (reasons or {}).get(test_id, "skipped: no graph capture" if outcome == "skipped" else "")
            tests.append({"id": test_id, "area": area, "outcome": outcome, "duration": 0.01, "reason": reason,
                          "skip_kind": "capability" if outcome == "skipped" else None})
    return tests


def format2(tests: list[dict[str, Any]], *, verdict: str, host: str, device: str, label: str = "cpu (registry)",
            mode: str = "full", selection: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """A format-2 ``results.json`` document holding ``tests``."""
    per_area: dict[str, int] = {}
    for t in tests:
        per_area[t["area"]] = per_area.get(t["area"], 0) + 1
    doc: dict[str, Any] = {
        "format": 2,
        "suite_version": "1.1",
        "backend": label.split(" ")[0],
        "facts": {"architectures": [], "torch": "2.13.0+cpu", "device": "cpu", "recipe": label},
        "summary": {o: sum(1 for t in tests if t["outcome"] == o) for o in OUTCOMES},
        "tests": tests,
        "expectations": {"file": None, "strict": False, "unmatched": []},
        "selection": selection or {"selected": len(tests), "deselected": 0, "full_suite": True, "per_area": per_area},
        "verdict": verdict,
        "contract": {"id": "hisparse-hal-1", "title": "hisparse-hal HiSparseBackend 1"},
        "suite": {"version": "1.1", "sha256": "ab" * 32, "files": 14},
        "mode": mode,
        "backend_under_test": {"kind": "registry", "label": label,
                               "qualname": "hisparse_hal.vendors.cpu.backend:CpuBackend", "build": {}},
        "run": {"started": "2026-12-05T02:10:00Z", "finished": "2026-12-05T02:14:30Z",
                "hisparse_hal_version": "0.9.0", "commit": "0123456789abcdef0123456789abcdef01234567",
                "host": host, "device": {"type": "cpu", "name": device, "driver": None},
                "python": "3.11.7", "torch": "2.13.0+cpu"},
        "claims": [],
    }
    doc.update(extra)
    return doc


def full_pass() -> dict[str, Any]:
    """Every area run, every test passed or skipped for a capability."""
    return format2(_tests({"probe": ["passed"] * 3, "swaps": ["passed"] * 4, "capture": ["passed", "skipped"],
                           "cache_ops": ["passed"] * 5}),
                   verdict="PASS", host="node-a", device="Intel Xeon Platinum 8480+")


def with_failures() -> dict[str, Any]:
    """Two failures in swaps and one in IPC, and a claim: a denied capability found working."""
    tests = _tests({"probe": ["passed"] * 3, "swaps": ["passed", "failed", "failed", "passed"],
                    "ipc": ["passed", "failed"]},
                   {"test_swaps.py::test_swaps_1": "AssertionError: destination block 7 holds block 3's bytes",
                    "test_swaps.py::test_swaps_2": "InvalidDescriptorError not raised for offset -1",
                    "test_ipc.py::test_ipc_1": "EventTimeoutError: peer waited 5.0 s"})
    claim = {"capability": "graph_capture", "claimed": False, "works": True,
             "evidence": "capture() recorded and replayed a swap"}
    return format2(tests, verdict="FAIL", host="node-b", device="AMD EPYC 9654", claims=[claim])


def cut_short() -> dict[str, Any]:
    """An interrupted run: probe finished (2 of 2), cache ops cut short after 2 of 51."""
    tests = _tests({"probe": ["passed", "passed"], "cache_ops": ["passed", "passed"]})
    selection = {"selected": 53, "deselected": 0, "full_suite": True, "per_area": {"probe": 2, "cache_ops": 51}}
    return format2(tests, verdict="INCOMPLETE", host="node-c", device="Intel Xeon Gold 6338", selection=selection,
                   incomplete={"reason": "the run was interrupted (SIGINT or SIGTERM) before every selected test ran"})


def keyword_subset() -> dict[str, Any]:
    """A ``-k swaps`` run: a subset that passed."""
    tests = _tests({"swaps": ["passed"] * 4})
    selection = {"keyword": "swaps", "selected": 4, "deselected": 220, "full_suite": False,
                 "areas": ["swaps"], "per_area": {"swaps": 4}}
    return format2(tests, verdict="PASS (partial)", host="node-d", device="Intel Xeon Gold 6338", mode="subset",
                   selection=selection)


def strict_failure() -> dict[str, Any]:
    """A ``--strict`` run whose expectations file has an entry matching no test; every test passed."""
    doc = format2(_tests({"probe": ["passed"] * 3}), verdict="FAIL", host="node-e", device="Intel Xeon Gold 6338")
    doc["expectations"] = {"file": "vendor.toml", "strict": True, "unmatched": ["test_swaps.py::test_renamed_long_ago"]}
    return doc


def format1(*, incomplete: bool = False, strict_unmatched: bool = False) -> dict[str, Any]:
    """A report from before format 2: no verdict, contract, run record or per-area selection."""
    tests = _tests({"probe": ["passed"] * 2, "cache_ops": ["passed"] * 4})
    doc: dict[str, Any] = {
        "suite_version": "1.0", "backend": "cpu",
        "facts": {"architectures": [], "torch": "2.13.0+cpu", "device": "cpu", "recipe": "cpu (registry)"},
        "summary": {o: sum(1 for t in tests if t["outcome"] == o) for o in OUTCOMES},
        "tests": [{k: v for k, v in t.items() if k != "skip_kind"} for t in tests],
        "expectations": {"file": None, "strict": strict_unmatched,
                         "unmatched": ["test_gone.py::test_x"] if strict_unmatched else []},
        "selection": {"selected": 6, "deselected": 0, "areas": ["probe", "cache_ops"], "full_suite": True},
    }
    if incomplete:
        doc["incomplete"] = {"reason": "the run was interrupted (SIGINT or SIGTERM) before every selected test ran"}
    return doc


def write(folder: Path, doc: dict[str, Any], bench: dict[str, Any] | None = None) -> Path:
    """``folder/results.json`` (and ``folder/bench.json``); returns the folder."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(doc, indent=2), encoding="utf-8")
    if bench is not None:
        (folder / "bench.json").write_text(json.dumps(bench, indent=2), encoding="utf-8")
    return folder


def real_bench() -> dict[str, Any]:
    """What `hisparse-hal bench --backend cpu --repeats 3 --json F` wrote on the 2-core machine (tests/ci/data)."""
    return json.loads((Path(__file__).with_name("data") / "bench_cpu.json").read_text(encoding="utf-8"))
