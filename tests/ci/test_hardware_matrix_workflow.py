"""The hardware-matrix workflow consumes exactly what ``ci/jobs.py`` prints: its matrix is that output, every
``matrix.*`` field it reads is one each job has, and the merge step finds each job's report where it was uploaded."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / ".github" / "workflows" / "hardware-matrix.yml"


def _jobs_output(*args: str) -> str:
    done = subprocess.run([sys.executable, str(REPO / "ci" / "jobs.py"), *args], capture_output=True, text=True,
                          timeout=60, check=True)
    return done.stdout


def test_workflow_matrix_is_jobs_py_output_and_reads_only_fields_it_has():
    text = WORKFLOW.read_text(encoding="utf-8")
    doc = json.loads(_jobs_output("--report-root", "reports"))
    assert list(doc) == ["include"], "a matrix strategy would turn any other top-level key into a dimension"
    jobs = doc["include"]
    assert len(jobs) >= 2
    assert "python ci/jobs.py --report-root reports > jobs.json" in text
    assert "matrix: ${{ fromJSON(needs.plan.outputs.matrix) }}" in text
    assert "runs-on: ${{ matrix.runner }}" in text
    used = set(re.findall(r"\$\{\{\s*matrix\.(\w+)\s*\}\}", text)) | set(re.findall(r"matrix\.(\w+) ==", text))
    assert {"runner", "install", "command", "report", "name", "backend"} <= used
    for job in jobs:
        missing = used - set(job)
        assert not missing, f"the workflow reads matrix fields {sorted(missing)} that job {job['name']} lacks"


def test_merge_step_finds_each_report_where_the_job_uploaded_it():
    text = WORKFLOW.read_text(encoding="utf-8")
    jobs = json.loads(_jobs_output("--report-root", "reports"))["include"]
    # Each job uploads its report folder as an artifact named after the machine; the merge job downloads them
    # all under reports/, so reports/<name> there is the job's report folder.
    assert re.search(r"name: \$\{\{ matrix\.name \}\}\n\s+path: \$\{\{ matrix\.report \}\}", text)
    assert re.search(r"uses: actions/download-artifact@v\d+\n\s+with:\n\s+path: reports\n", text)
    assert "python ci/jobs.py --report-root reports --merge-inputs" in text
    assert "python ci/merge_reports.py --out merged" in text and "GITHUB_STEP_SUMMARY" in text
    inputs = _jobs_output("--report-root", "reports", "--merge-inputs").split()
    assert inputs == [f"{job['name']}={job['results']}" for job in jobs]
    for job in jobs:
        assert job["report"] == f"reports/{job['name']}"
        assert job["results"].startswith(job["report"]) and job["junit"] == f"{job['results']}/junit.xml"
        assert job["junit"] in job["command"] or job["command"].startswith("ci/gpu-check.sh ")
    gpu_check = (REPO / "ci" / "gpu-check.sh").read_text(encoding="utf-8")
    assert '--report "$outdir/conformance"' in gpu_check and '--junit "$outdir/conformance/junit.xml"' in gpu_check
