#!/usr/bin/env bash
# GPU check: everything a lent GPU machine should run, written under one folder. Installs nothing.
#
# Usage: ci/gpu-check.sh [BACKEND] [OUTDIR]
#        ci/gpu-check.sh --dry-run [OUTDIR]
#   BACKEND  backend name, default "cuda". The same script with "rocm" runs on an AMD machine
#            (rocm-smi replaces nvidia-smi; vLLM's HiSparse kernels are CUDA-only, so the vllm-peer steps are
#            skipped); nothing else changes.
#   OUTDIR   where results go; default $OUT when set (the device tool's output folder), else
#            reports/gpu-check-<backend>-<UTC timestamp> in the checkout (ignored by git, so the next run's
#            commit line does not say "(dirty)" because of this one).
#   --dry-run  on any machine, no GPU: lists what a device call would carry (GPU_CHECK_CARRY, default
#            ".vllm-peer .whl") with the total against the 64 MiB limit, checks the vLLM sources, and runs the
#            vllm-peer harness with the oracle standing in for vLLM's kernels at small shapes. Nothing else.
#
# Precondition: the package is importable in the current python (pip install -e '.[test,cuda]', or
# '.[test,rocm]' on AMD, done beforehand, with a GPU build of torch). Every step is bounded with `timeout`; a failing step is
# recorded in summary.txt and the next step still runs. Exit status: 0 when every step passed.
# Step limits (seconds) can be lowered to fit a device budget: GPU_CHECK_CONFORMANCE_S, GPU_CHECK_BENCH_S,
# GPU_CHECK_CACHE_OPS_S, GPU_CHECK_NO_SYNC_S, GPU_CHECK_SCENARIO_S, GPU_CHECK_KERNELS_S, GPU_CHECK_VLLM_PEER_S.
# GPU_CHECK_STEPS (comma-separated step names) runs only those steps, e.g. to fit one device call:
# GPU_CHECK_STEPS=device-smi,torch,vllm-peer-sequences,vllm-peer-timing.
# The vllm-peer steps need .vllm-peer, filled by ci/prepare-vllm-peer.sh on a machine with pip (docs/kernels.md).
set -u

dry_run=0
if [ "${1:-}" = "--dry-run" ]; then
    dry_run=1
    shift
    set -- cpu "$@"
fi
backend="${1:-cuda}"
root="$(cd "$(dirname "$0")/.." && pwd)"
outdir="${2:-${OUT:-$root/reports/gpu-check-${backend}-$(date -u +%Y%m%dT%H%M%SZ)}}"
mkdir -p "$outdir"
outdir="$(cd "$outdir" && pwd)"
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"
summary="$outdir/summary.txt"
failed=0

# Every step runs in the checkout's root, where a plain (non-editable) install imports the root's own
# hisparse_hal folder and stops: say so once, before any step, rather than as each step's failure.
extras="test,$backend"
[ "$backend" = cpu ] && extras="test"
if ! import_error="$("$python" -c 'import hisparse_hal' 2>&1)"; then
    message="the package does not import in the checkout's root, where every step runs (install it editable"
    message+=" first: pip install -e '.[$extras]'): ${import_error##*$'\n'}"
    echo "ci/gpu-check.sh: $message" >&2
    echo "precondition: $message" >"$summary"  # what a device run brings back (ci/device-run.sh)
    exit 2
fi

# step NAME SECONDS COMMAND...: stdout to NAME.txt, stderr to NAME.err, status to summary.txt.
step() {
    local name="$1" seconds="$2"
    shift 2
    local start end rc
    if [ -n "${GPU_CHECK_STEPS:-}" ] && [[ ",$GPU_CHECK_STEPS," != *",$name,"* ]]; then
        echo "$name: skipped (not in GPU_CHECK_STEPS)" >>"$summary"
        return 0
    fi
    start=$(date +%s)
    timeout --kill-after=15 "$seconds" "$@" >"$outdir/$name.txt" 2>"$outdir/$name.err"
    rc=$?
    end=$(date +%s)
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        echo "$name: TIMED OUT after ${seconds}s (rc $rc)" >>"$summary"
    else
        echo "$name: rc $rc in $((end - start))s" >>"$summary"
    fi
    [ "$rc" -eq 0 ] || failed=1
    [ -s "$outdir/$name.err" ] || rm -f "$outdir/$name.err"
    return 0
}

{
    echo "hisparse-hal GPU check, backend $backend"
    echo "date (UTC): $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host: $(uname -srmn)"
    echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown) $(git status --porcelain 2>/dev/null | grep -q . && echo '(dirty)')"
    echo
} >"$summary"

# vLLM 0.34.0's csrc/hisparse_kernels.cu (from .vllm-peer) as a torch extension against our cache ops: every
# output and state tensor after every step of the generated sequences, then one decode step's time at 64-512
# requests x Q 1, 2, 4 (hisparse_hal/bench/kernel_peer.py). Two processes: a device fault in one leaves the other.
peer_check() {
    local part="$1"
    shift
    step "vllm-peer-$part" "${GPU_CHECK_VLLM_PEER_S:-240}" "$python" -m hisparse_hal.bench.kernel_peer \
        --only "$part" --out "$outdir/vllm-peer" "$@"
}

if [ "$dry_run" -eq 1 ]; then
    # shellcheck disable=SC2086 # GPU_CHECK_CARRY is a list of paths
    step carried 60 "$python" ci/carried_size.py ${GPU_CHECK_CARRY:-.vllm-peer .whl}
    step vllm-sources 60 "$python" -c 'import pathlib, sys
from hisparse_hal.bench.vllm_extension import check_sources
for path in check_sources(pathlib.Path(".vllm-peer"), pathlib.Path("ci/vllm_kernel_peer/SHA256SUMS")):
    print(path, "sha256 ok")'
    small=(--peer oracle --backend cpu --seeds 2 --requests 2,4 --queries 1,2,4 --top-k 64 --context 256 --repeats 2)
    peer_check sequences "${small[@]}"
    peer_check timing "${small[@]}"
    echo "finished: $(date -u +%Y-%m-%dT%H:%M:%SZ)" >>"$summary"
    cat "$summary"
    exit "$failed"
fi

case "$backend" in
    rocm) step device-smi 60 rocm-smi --showproductname --showdriverversion --showmeminfo vram ;;
    *) step device-smi 60 nvidia-smi ;;
esac
step pip-torch 60 sh -c "\"$python\" -m pip list 2>/dev/null | grep -i -E '^(torch|nvidia-ml-py|amdsmi|hisparse-hal|triton) '"
step torch 120 "$python" -c '
import torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "hip", getattr(torch.version, "hip", None))
print("devices", torch.cuda.device_count())
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    print(i, p.name, getattr(p, "gcnArchName", None) or f"sm_{p.major}{p.minor}", f"{p.total_memory >> 30} GiB")
'
step info-json 120 hisparse-hal info --json
step info 120 hisparse-hal info --backend "$backend"
step conformance "${GPU_CHECK_CONFORMANCE_S:-360}" hisparse-hal conformance --backend "$backend" --report "$outdir/conformance" \
    --junit "$outdir/conformance/junit.xml"
step bench "${GPU_CHECK_BENCH_S:-240}" hisparse-hal bench --backend "$backend" --json "$outdir/bench.json"
# The cache ops on the device (Triton where installed, else torch) against the oracle at 64 requests, then the
# gather-id check's sync rule under torch.cuda.set_sync_debug_mode("error") (skipped without a GPU).
step cache-ops-bench "${GPU_CHECK_CACHE_OPS_S:-240}" hisparse-hal bench --cache-ops --backend "$backend" --requests 64 --json "$outdir/cache-ops-bench.json"
step no-sync "${GPU_CHECK_NO_SYNC_S:-120}" "$python" -m pytest -q -p no:cacheprovider tests/vendors/gpu/test_gather_on_device.py tests/cache_ops/test_torch_impl.py -k "sync"
# The Triton kernels as this device's triton compiles them (runtime warm-up, production shapes), against the
# offline compile for the device's target (docs/kernels.md): shared memory, registers and spills must agree.
step kernels-vs-device "${GPU_CHECK_KERNELS_S:-300}" \
    hisparse-hal kernels --against-device --production-only --json "$outdir/kernels-device.json"
if [ "$backend" = cuda ]; then
    peer_check sequences --peer vllm --backend "$backend"
    peer_check timing --peer vllm --backend "$backend"
else
    echo "vllm-peer: skipped (vLLM 0.34.0's HiSparse kernels are CUDA-only, csrc/ops.h:737-738)" >>"$summary"
fi
step scenario "${GPU_CHECK_SCENARIO_S:-180}" hisparse-hal scenario --ranks 2 --steps 1000 --backend "$backend" --json "$outdir/scenario.json"

echo "finished: $(date -u +%Y-%m-%dT%H:%M:%SZ)" >>"$summary"
cat "$summary"
exit "$failed"
