#!/usr/bin/env bash
# vLLM 0.34.0's own CPU-runnable HiSparse unit tests, from its sdist, with hisparse-hal's CPU backend resolved by
# vLLM (HISPARSE_HAL_VLLM_BACKEND=cpu) and put in place of CUDAHiSparseBackend where the tests patch it in
# (ci/vllm_own_tests/hisparse_hal_backend.py; vLLM's files are not edited). Known failures carry their reasons
# there (strict xfail). Runs in the venv ci/vllm-tests.sh built (active, or HISPARSE_VLLM_VENV).
# vLLM's sdist goes into a temporary folder removed on exit (HISPARSE_VLLM_KEEP_SDIST=1 keeps it and says where);
# HISPARSE_VLLM_SDIST_DIR names a folder of your own instead, reused and never removed.
#
# The Hub files (tests/v1/core/{test_kv_cache_planning,test_kv_cache_utils,test_prefix_caching,test_scheduler}.py,
# tests/test_config.py) run offline: the plugin writes a local hub cache with the model configs they name
# (ci/vllm_own_tests/local_hub.py). test_kv_cache_allocation_scope.py's HiSparse case is the parameter
# `hisparse=True` (id `[True]`, no "hisparse" in its name), so -k names it. The plugin prints at the end how many
# of these tests called a hisparse-hal member (ci/vllm_own_tests/member_trace.py).
# Not run: tests/v1/attention/test_sparse_mla_backends.py and tests/v1/e2e/general/test_hisparse.py need CUDA.
set -euo pipefail
cd "$(dirname "$0")/.."
root="$(pwd)"
if [ -n "${HISPARSE_VLLM_VENV:-}" ]; then
  # PATH, not bin/activate: a copied venv's activate script names the directory it was made in.
  export PATH="$HISPARSE_VLLM_VENV/bin:$PATH"
fi
if [ -n "${HISPARSE_VLLM_SDIST_DIR:-}" ]; then
  work="$HISPARSE_VLLM_SDIST_DIR"
else
  work="$(mktemp -d "${TMPDIR:-/tmp}/hisparse-vllm-sdist-XXXXXX")"
  if [ "${HISPARSE_VLLM_KEEP_SDIST:-0}" = 1 ]; then
    echo "vllm-own-tests: keeping vLLM's sdist in $work (HISPARSE_VLLM_KEEP_SDIST=1)" >&2
  else
    trap 'rm -rf "$work"' EXIT
  fi
fi
if [ ! -d "$work/vllm-0.34.0/tests" ]; then
  PYTHON=python bash ci/fetch-vllm-sdist.sh "$work"
  tar xzf "$work/vllm-0.34.0.tar.gz" -C "$work" vllm-0.34.0/tests
fi
# Only tests/ is used, from its own directory, so `import vllm` is the installed package, not the sdist's source.
cd "$work/vllm-0.34.0"
export VLLM_TARGET_DEVICE=cpu HISPARSE_HAL_REPLACE_CUDA_BACKEND=1 HF_HUB_OFFLINE=1 PYTHONPATH="$root/ci/vllm_own_tests"
python -m pytest -p no:xdist -p no:cacheprovider --noconftest -p hisparse_hal_backend -q -rxXfE -W ignore::pytest.PytestUnknownMarkWarning \
  -k "hisparse or HiSparse or test_mrv2_kv_pool_only_wraps_backing_allocation[True]" \
  tests/v1/kv_connector/unit/test_hisparse_stats.py \
  tests/v1/kv_connector/unit/test_hisparse_connector.py \
  tests/v1/worker/test_utils.py \
  tests/v1/worker/test_attn_utils.py \
  tests/v1/worker/test_kv_cache_allocation_scope.py \
  tests/v1/core/test_kv_cache_config_builder.py \
  tests/v1/core/test_kv_cache_planning.py \
  tests/v1/core/test_kv_cache_utils.py \
  tests/v1/core/test_prefix_caching.py \
  tests/v1/core/test_scheduler.py \
  tests/test_config.py
