"""The hardware matrix generates one CI job per machine, and rejects malformed matrices."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("ci_jobs", REPO / "ci" / "jobs.py")
assert _spec is not None and _spec.loader is not None
ci_jobs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ci_jobs)


def test_committed_matrix_gives_one_job_per_machine_with_its_command(capsys):
    assert ci_jobs.main(["--report-root", "out"]) == 0
    jobs = {job["name"]: job for job in json.loads(capsys.readouterr().out)["include"]}
    assert jobs["cpu"]["command"] == "hisparse-hal conformance --backend cpu --report out/cpu --junit out/cpu/junit.xml"
    assert jobs["cpu"]["results"] == "out/cpu" and jobs["amd-mi300x"]["results"] == "out/amd-mi300x/conformance"
    assert jobs["amd-mi300x"]["install"] == "pip install '.[test,rocm]'"
    assert jobs["nvidia-h200"]["command"] == "ci/gpu-check.sh cuda out/nvidia-h200"
    assert {job["backend"] for job in jobs.values()} == {"cpu", "cuda", "rocm"}
    assert all((REPO / job["command"].split()[0]).exists() for job in jobs.values() if job["command"].startswith("ci/"))


def _matrix(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "matrix.toml"
    path.write_text(body)
    return path


def test_unknown_backend_is_rejected_by_name(tmp_path):
    body = '[[machine]]\nname = "x"\nbackend = "tpu"\nrunner = "r"\narch = "a"\ntorch = "t"\n'
    with pytest.raises(SystemExit, match=r"machine 'x' names unknown backend 'tpu'"):
        ci_jobs.load_matrix(_matrix(tmp_path, body))


def test_duplicate_machine_name_is_rejected(tmp_path):
    one = '[[machine]]\nname = "x"\nbackend = "cpu"\nrunner = "r"\narch = "a"\ntorch = "t"\n'
    with pytest.raises(SystemExit, match="machine name 'x' appears twice"):
        ci_jobs.load_matrix(_matrix(tmp_path, one + one))


def test_machine_missing_a_field_is_rejected(tmp_path):
    with pytest.raises(SystemExit, match=r"machine 0 \(x\) lacks \['runner', 'arch', 'torch'\]"):
        ci_jobs.load_matrix(_matrix(tmp_path, '[[machine]]\nname = "x"\nbackend = "cpu"\n'))
