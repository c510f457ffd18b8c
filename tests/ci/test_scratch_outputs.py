"""The CI scripts leave nothing where it dirties the checkout or fills $TMPDIR: ``ci/gpu-check.sh`` without OUTDIR
writes under the ignored ``reports/``; ``ci/vllm-own-tests.sh`` removes its temporary sdist folder unless told to
keep it. Each runs from a scratch copy with stand-ins, so no GPU, network or vLLM is needed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _scratch_repo(tmp_path: Path, *scripts: str) -> Path:
    repo = tmp_path / "repo"
    (repo / "ci").mkdir(parents=True)
    for script in scripts:
        shutil.copy(REPO / "ci" / script, repo / "ci" / script)
    shutil.copy(REPO / ".gitignore", repo / ".gitignore")
    for command in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"]):
        subprocess.run(["git", *command], cwd=repo, check=True, capture_output=True)
    return repo


def test_gpu_check_without_outdir_writes_under_ignored_reports_and_the_checkout_stays_clean(tmp_path):
    repo = _scratch_repo(tmp_path, "gpu-check.sh")
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    env["GPU_CHECK_STEPS"] = "none-of-them"
    env["PYTHON"] = sys.executable  # the check's one precondition: the package imports in the checkout's root
    done = subprocess.run(["bash", str(repo / "ci" / "gpu-check.sh"), "cuda"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    written = list((repo / "reports").glob("gpu-check-cuda-*/summary.txt"))
    assert len(written) == 1 and "device-smi: skipped" in written[0].read_text()
    assert "(dirty)" not in written[0].read_text()
    status = subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True, text=True, check=True)
    assert status.stdout == ""
    assert [p.name for p in tmp_path.iterdir()] == ["repo"]  # nothing in the folder it was started from


STAND_IN_FETCH = """#!/usr/bin/env bash
set -e
mkdir -p "$1/src/vllm-0.34.0/tests"
tar czf "$1/vllm-0.34.0.tar.gz" -C "$1/src" vllm-0.34.0
"""


@pytest.mark.parametrize("keep", [False, True])
def test_vllm_own_tests_removes_its_sdist_folder_unless_told_to_keep_it(tmp_path, keep):
    repo = _scratch_repo(tmp_path, "vllm-own-tests.sh")
    (repo / "ci" / "fetch-vllm-sdist.sh").write_text(STAND_IN_FETCH)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text("#!/bin/sh\nexit 0\n")  # stands in for vLLM's pytest run
    (bin_dir / "python").chmod(0o755)
    private = tmp_path / "tmp"
    private.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("HISPARSE_VLLM_")}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", TMPDIR=str(private))
    if keep:
        env["HISPARSE_VLLM_KEEP_SDIST"] = "1"
    done = subprocess.run(["bash", "ci/vllm-own-tests.sh"], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    left = sorted(p.name for p in private.iterdir())
    if keep:
        assert len(left) == 1 and left[0].startswith("hisparse-vllm-sdist-")
        assert f"keeping vLLM's sdist in {private / left[0]}" in done.stderr
    else:
        assert left == []
