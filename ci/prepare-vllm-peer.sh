#!/usr/bin/env bash
# Prepare the GPU peer check (ci/gpu-check.sh, step vllm-peer) on a machine with pip: take vLLM 0.34.0's sdist
# through ci/fetch-vllm-sdist.sh and extract only the files the peer builds from into DEST (default .vllm-peer,
# git-ignored; the device call carries it), each checked against ci/vllm_kernel_peer/SHA256SUMS. vLLM's files
# are Apache-2.0 and never committed here; its LICENSE travels with them.
#
# Usage: ci/prepare-vllm-peer.sh [DEST]
#   HISPARSE_VLLM_SDIST_DIR  keep (or reuse) the sdist there instead of a temporary folder.
set -euo pipefail
cd "$(dirname "$0")/.."
dest="${1:-.vllm-peer}"
sums=ci/vllm_kernel_peer/SHA256SUMS
if [ -n "${HISPARSE_VLLM_SDIST_DIR:-}" ]; then
  work="$HISPARSE_VLLM_SDIST_DIR"
else
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
fi
bash ci/fetch-vllm-sdist.sh "$work"
staged="$(mktemp -d)"
trap 'rm -rf "$staged"; [ -n "${HISPARSE_VLLM_SDIST_DIR:-}" ] || rm -rf "$work"' EXIT
# shellcheck disable=SC2046 # one path per line of SHA256SUMS, none with spaces
tar xzf "$work/vllm-0.34.0.tar.gz" -C "$staged" --strip-components=1 \
  $(awk '{print "vllm-0.34.0/" $2}' "$sums")
(cd "$staged" && sha256sum -c --quiet "$OLDPWD/$sums")
rm -rf "$dest"
mkdir -p "$dest"
cp -a "$staged/." "$dest/"
echo "$dest: $(awk '{print $2}' "$sums" | tr '\n' ' ')($(du -sb "$dest" | cut -f1) bytes, sha256 ok)"
