#!/usr/bin/env bash
# ci/gpu-check.sh on a lent GPU machine that reaches no package index (the workplace's device tool), in one call.
#
# Usage (from the checkout root, after `pip wheel --no-deps -w .whl .` here; `.whl` travels as a carried path):
#   bash ci/device-run.sh [BACKEND]
# Installs the carried hisparse-hal wheel (no dependencies: the machine's own GPU torch, Triton and NVML stay),
# runs ci/gpu-check.sh with step limits that fit a short lease (override with the GPU_CHECK_*_S variables), and
# packs every result into "$OUT/gpu-check.tar.gz" plus "$OUT/summary.txt" (the tool returns at most 8 files).
set -u
backend="${1:-cuda}"
out="${OUT:?OUT must name the folder whose files come back}"
python="${PYTHON:-python3}"
"$python" -m pip install -q --no-deps --no-index --force-reinstall .whl/hisparse_hal-*.whl || exit 2
PATH="$(dirname "$("$python" -c 'import sys; print(sys.executable)')"):$PATH"
export PATH PYTHONUNBUFFERED=1
export GPU_CHECK_CONFORMANCE_S="${GPU_CHECK_CONFORMANCE_S:-150}" GPU_CHECK_BENCH_S="${GPU_CHECK_BENCH_S:-60}"
export GPU_CHECK_CACHE_OPS_S="${GPU_CHECK_CACHE_OPS_S:-75}" GPU_CHECK_NO_SYNC_S="${GPU_CHECK_NO_SYNC_S:-45}"
export GPU_CHECK_KERNELS_S="${GPU_CHECK_KERNELS_S:-75}" GPU_CHECK_SCENARIO_S="${GPU_CHECK_SCENARIO_S:-45}"
results=/tmp/gpu-check
rm -rf "$results"
bash ci/gpu-check.sh "$backend" "$results"
rc=$?
tar -czf "$out/gpu-check.tar.gz" -C /tmp gpu-check
cp "$results/summary.txt" "$out/summary.txt"
exit "$rc"
