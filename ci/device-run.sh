#!/usr/bin/env bash
# ci/gpu-check.sh on a lent GPU machine that reaches no package index (the workplace's device tool), in one call.
#
# Usage (from the checkout root, after `pip download --no-deps -d .whl 'setuptools>=77'` and
# `bash ci/prepare-vllm-peer.sh` here; `.whl` (the build backend) and `.vllm-peer` travel as carried paths,
# `python ci/carried_size.py .vllm-peer .whl` prints their size):
#   bash ci/device-run.sh [BACKEND]
# Installs the checkout in editable mode, its build backend from the carried .whl (no dependencies: the machine's
# own GPU torch, Triton and NVML stay; editable, because ci/gpu-check.sh runs from the checkout's root, where a plain
# install would be shadowed by the root's hisparse_hal/ folder, which lacks the mapped vendors/ and conformance/),
# runs ci/gpu-check.sh with step limits that fit a short lease (override with the GPU_CHECK_*_S variables), and
# packs every result into "$OUT/gpu-check.tar.gz" plus "$OUT/summary.txt" (the tool returns at most 8 files).
# All steps together outlast one 600 s call: name a subset in GPU_CHECK_STEPS (ci/gpu-check.sh), e.g. the vLLM
# kernel peer alone: GPU_CHECK_STEPS=device-smi,torch,vllm-peer-sequences,vllm-peer-timing.
set -u
backend="${1:-cuda}"
out="${OUT:?OUT must name the folder whose files come back}"
python="${PYTHON:-python3}"
"$python" -m pip install -q --no-deps --no-index --find-links .whl -e . || exit 2
PATH="$(dirname "$("$python" -c 'import sys; print(sys.executable)')"):$PATH"
export PATH PYTHONUNBUFFERED=1
export GPU_CHECK_CONFORMANCE_S="${GPU_CHECK_CONFORMANCE_S:-150}" GPU_CHECK_BENCH_S="${GPU_CHECK_BENCH_S:-60}"
export GPU_CHECK_CACHE_OPS_S="${GPU_CHECK_CACHE_OPS_S:-75}" GPU_CHECK_NO_SYNC_S="${GPU_CHECK_NO_SYNC_S:-45}"
export GPU_CHECK_KERNELS_S="${GPU_CHECK_KERNELS_S:-75}" GPU_CHECK_SCENARIO_S="${GPU_CHECK_SCENARIO_S:-45}"
export GPU_CHECK_VLLM_PEER_S="${GPU_CHECK_VLLM_PEER_S:-240}"
results=/tmp/gpu-check
rm -rf "$results"
bash ci/gpu-check.sh "$backend" "$results"
rc=$?
tar -czf "$out/gpu-check.tar.gz" -C /tmp gpu-check
cp "$results/summary.txt" "$out/summary.txt"
exit "$rc"
