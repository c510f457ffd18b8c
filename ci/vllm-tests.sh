#!/usr/bin/env bash
# The real-vLLM tests (tests/with_vllm) in their own virtual environment: torch 2.13.0 (CPU), vllm==0.33.0
# without its dependencies, exactly the pure-Python packages its HiSparse runtime and plugin loader import
# (ci/vllm-requirements.txt, all pinned), and this project with its entry point.
#
# Usage: ci/vllm-tests.sh   (HISPARSE_VLLM_VENV=path reuses or places the venv; default: a fresh temp dir)
set -euo pipefail
cd "$(dirname "$0")/.."

start=$(date +%s)
venv="${HISPARSE_VLLM_VENV:-$(mktemp -d)/venv-vllm}"
python3 -m venv "$venv"
# shellcheck disable=SC1091
source "$venv/bin/activate"
python -m pip install -q --upgrade pip
python -m pip install -q torch==2.13.0
# vLLM 0.33.0 pins torch 2.14.0 and CUDA-only packages; --no-deps keeps the CPU torch above.
python -m pip install -q --no-deps vllm==0.33.0
python -m pip install -q -r ci/vllm-requirements.txt
python -m pip install -q -e '.[test,triton]' numpy
echo "== vLLM venv ready in $(( $(date +%s) - start )) s"

echo "== hisparse-hal vllm-check --json (exit 1 expected here: vLLM 0.33.0's config refuses HiSparse off CUDA)"
hisparse-hal vllm-check --json || true
echo "== tests/with_vllm against vLLM $(python -c 'import vllm; print(vllm.__version__)')"
python -m pytest -p no:xdist -q tests/with_vllm
echo "== vLLM step took $(( $(date +%s) - start )) s"
