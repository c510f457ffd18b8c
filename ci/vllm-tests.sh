#!/usr/bin/env bash
# The real-vLLM tests in their own virtual environment: torch 2.13.0 (CPU), vllm==0.34.0 without its dependencies
# (it pins torch 2.14.0 and CUDA-only packages), exactly the packages its HiSparse modules and plugin loader import
# (ci/vllm-requirements.txt, all pinned, installed with --no-deps so pip never replaces torch), and this project
# with its entry point. Then tests/integrations/with_vllm, and vLLM 0.34.0's own CPU-runnable HiSparse tests
# (ci/vllm-own-tests.sh, about 30 s on 2 cores; it ends with how many of them called a hisparse-hal member).
#
# Usage: ci/vllm-tests.sh   (HISPARSE_VLLM_VENV=path reuses or places the venv, and keeps it; default: a fresh
#        temp dir, removed when the script ends, however it ends: a few GB per run otherwise)
set -euo pipefail
cd "$(dirname "$0")/.."

start=$(date +%s)
if [ -n "${HISPARSE_VLLM_VENV:-}" ]; then
    venv="$HISPARSE_VLLM_VENV"
else
    scratch="$(mktemp -d)"
    trap 'rm -rf "$scratch"' EXIT
    venv="$scratch/venv-vllm"
fi
python3 -m venv "$venv"
# shellcheck disable=SC1091
source "$venv/bin/activate"
python -m pip install -q --upgrade pip
python -m pip install -q torch==2.13.0
python -m pip install -q --no-deps vllm==0.34.0
python -m pip install -q --no-deps -r ci/vllm-requirements.txt
python -m pip install -q -e '.[test,triton]'
python -c 'import torch; assert torch.__version__.startswith("2.13.0"), torch.__version__'
echo "== vLLM venv ready in $(( $(date +%s) - start )) s"

echo "== hisparse-hal vllm-check --json (exit 1 expected: a CPU-only machine has no accelerator for vLLM's HiSparse)"
HISPARSE_HAL_VLLM_BACKEND=cpu hisparse-hal vllm-check --json || true
echo "== tests/integrations/with_vllm against vLLM $(python -c 'import vllm; print(vllm.__version__)')"
python -m pytest -p no:xdist -q tests/integrations/with_vllm
echo "== vLLM 0.34.0's own HiSparse unit tests with hisparse-hal's backend"
HISPARSE_VLLM_VENV="$venv" bash ci/vllm-own-tests.sh
echo "== vLLM step took $(( $(date +%s) - start )) s"
