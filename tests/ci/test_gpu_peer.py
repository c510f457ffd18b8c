"""The GPU peer's preparation on CPU: ``ci/gpu-check.sh --dry-run`` (carried files and size, the harness against
the oracle), ``ci/carried_size.py`` on a scratch repository, and ``ci/fetch-vllm-sdist.sh`` with a stand-in pip."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("ci_carried_size", REPO / "ci" / "carried_size.py")
assert _spec is not None and _spec.loader is not None
carried_size = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(carried_size)


def _summary(outdir: Path) -> dict[str, str]:
    lines = (outdir / "summary.txt").read_text().splitlines()
    return {line.split(":")[0]: line.split(": ", 1)[1] for line in lines if ": rc " in line or "skipped" in line}


def test_the_dry_run_lists_the_carried_files_and_runs_the_harness_against_the_oracle(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable, GPU_CHECK_CARRY="ci/vllm_kernel_peer")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    done = subprocess.run(["bash", "ci/gpu-check.sh", "--dry-run", str(tmp_path)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    steps = _summary(tmp_path)
    assert set(steps) == {"carried", "vllm-sources", "vllm-peer-sequences", "vllm-peer-timing"}, done.stdout
    assert steps["carried"].startswith("rc 0") and steps["vllm-peer-sequences"].startswith("rc 0")
    assert steps["vllm-peer-timing"].startswith("rc 0"), (tmp_path / "vllm-peer-timing.err").read_text()
    carried = (tmp_path / "carried.txt").read_text()
    assert "carry ci/vllm_kernel_peer/binding.cpp " in carried and "of 64 MiB: fits" in carried
    if not steps["vllm-sources"].startswith("rc 0"):  # .vllm-peer not prepared on this machine
        assert "run ci/prepare-vllm-peer.sh" in (tmp_path / "vllm-sources.err").read_text()
    sequences = json.loads((tmp_path / "vllm-peer" / "sequences.json").read_text())
    assert sequences["peer"] == "oracle" and sequences["sequences"]
    assert all(not s["mismatches"] and s["error"] is None for s in sequences["sequences"])
    timing = json.loads((tmp_path / "vllm-peer" / "timing.json").read_text())
    assert {(f["requests"], f["queries"]) for f in timing["figures"]} == {(r, q) for r in (2, 4) for q in (1, 2, 4)}
    assert done.returncode == (0 if all(v.startswith("rc 0") for v in steps.values()) else 1)


def _repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / ".gitignore").write_text("/carried/\n/junk/\n")
    (root / "tracked.txt").write_bytes(b"x" * 1000)
    (root / "carried").mkdir()
    (root / "carried" / "a.bin").write_bytes(b"y" * 3000)
    (root / "junk").mkdir()
    (root / "junk" / "big.bin").write_bytes(b"z" * 10_000)
    return root


def test_a_package_that_does_not_import_in_the_root_stops_the_check_in_one_line_before_any_step(tmp_path):
    """A plain install run from the checkout's root imports the root's hisparse_hal folder, which stops: the check
    says so once (exit 2, the import's own last line) instead of recording each step as failed. Modelled with
    ``python -S``, under which the installed package cannot be found either."""
    wrapper = tmp_path / "python-without-site"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n', encoding="utf-8")
    wrapper.chmod(0o755)
    env = dict(os.environ, PYTHON=str(wrapper))
    done = subprocess.run(["bash", "ci/gpu-check.sh", "cuda", str(tmp_path / "out")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("ci/gpu-check.sh: the package does not import in the checkout's root, where every step "
                           "runs (install it editable first: pip install -e '.[test,cuda]'): ")
    assert "ImportError: " in line or "ModuleNotFoundError: " in line  # the import's own last line
    recorded = (tmp_path / "out" / "summary.txt").read_text()  # what a device run brings back
    assert recorded == line.replace("ci/gpu-check.sh: ", "precondition: ", 1) + "\n"


def test_carried_size_counts_the_tree_and_the_carried_paths_but_not_other_ignored_files(tmp_path):
    root = _repo(tmp_path)
    lines, ok = carried_size.report(root, ["carried"])
    assert ok
    assert "carry carried/a.bin 3000" in lines
    assert "working tree: 2 files, 1017 bytes; carried: 3000 bytes" in lines  # tracked.txt + .gitignore
    assert lines[-1].startswith("total 4017 bytes") and lines[-1].endswith("fits")


def test_carried_size_fails_on_a_missing_path_or_over_the_limit(tmp_path):
    root = _repo(tmp_path)
    lines, ok = carried_size.report(root, ["carried", "absent"])
    assert not ok and "carry absent: MISSING" in lines
    lines, ok = carried_size.report(root, ["carried"], limit_mib=0)
    assert not ok and lines[-1].endswith("of 0 MiB: TOO LARGE")


_FAKE_PIP = """#!/usr/bin/env bash
# Stand-in python: records how pip was asked, then saves a file that is not vLLM's sdist.
echo "$* | target=$VLLM_TARGET_DEVICE | skip_suffix=$VLLM_SKIP_VERSION_SUFFIX | path=$PYTHONPATH" >>"$LOG"
[ "$3" = download ] || exit 0  # the scratch install of the build plug-ins
dest=""
while [ $# -gt 0 ]; do [ "$1" = -d ] && dest="$2"; shift; done
echo not-vllm >"$dest/vllm-0.34.0.tar.gz"
"""


def test_fetch_uses_pip_only_and_refuses_a_file_with_the_wrong_digest(tmp_path):
    fake = tmp_path / "python"
    fake.write_text(_FAKE_PIP)
    fake.chmod(0o755)
    log = tmp_path / "pip.log"
    done = subprocess.run(["bash", "ci/fetch-vllm-sdist.sh", str(tmp_path / "dest")], cwd=REPO,
                          env=dict(os.environ, PYTHON=str(fake), LOG=str(log)), capture_output=True, text=True)
    assert done.returncode != 0 and "FAILED" in done.stderr + done.stdout
    install, download = log.read_text().splitlines()
    assert install.startswith("-m pip install -q --no-warn-script-location --target ")
    assert "setuptools-scm==10.3.4 setuptools-rust==1.13.0" in install
    assert download.startswith("-m pip download -q --no-deps --no-binary :all: --no-build-isolation --require-hashes")
    assert "target=empty | skip_suffix=1 | path=/" in download and "/build-deps" in download
    script = (REPO / "ci" / "fetch-vllm-sdist.sh").read_text()
    assert "://" not in script  # pip's configured index only: no address in the script
