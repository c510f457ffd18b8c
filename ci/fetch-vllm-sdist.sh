#!/usr/bin/env bash
# Fetch vLLM 0.34.0's source distribution through pip (its configured index; no address is written here) into
# DEST, checked by sha256. Used by ci/vllm-own-tests.sh (vLLM's tests) and ci/prepare-vllm-peer.sh (its csrc).
#
# Usage: ci/fetch-vllm-sdist.sh DEST      -> DEST/vllm-0.34.0.tar.gz (kept when already there and intact)
#
# `pip download` of an sdist always prepares its metadata first. vLLM's setup.py imports torch (the running
# python's), setuptools-scm and setuptools-rust, and with VLLM_TARGET_DEVICE=empty builds no CMake/CUDA metadata.
# The two build plug-ins go into a scratch folder (pinned, real packages), never into the venv; pip checks the
# hash (--require-hashes), and sha256sum checks the saved file again. VLLM_SKIP_VERSION_SUFFIX keeps the
# version the file's 0.34.0. The python running pip ($PYTHON, default python3) needs torch and setuptools.
set -euo pipefail
dest="${1:?usage: ci/fetch-vllm-sdist.sh DEST}"
python="${PYTHON:-python3}"
version=0.34.0
sha256=fcad848b246a9d8652b47e6425af92334dc02492f9802720f54e27b823cf0113
sdist="$dest/vllm-$version.tar.gz"
mkdir -p "$dest"
if [ -f "$sdist" ] && echo "$sha256  $sdist" | sha256sum -c --quiet 2>/dev/null; then
  echo "$sdist (already there, sha256 ok)"
  exit 0
fi
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
"$python" -m pip install -q --no-warn-script-location --target "$scratch/build-deps" \
  setuptools-scm==10.3.4 setuptools-rust==1.13.0
echo "vllm==$version --hash=sha256:$sha256" >"$scratch/requirements.txt"
PYTHONPATH="$scratch/build-deps${PYTHONPATH:+:$PYTHONPATH}" VLLM_TARGET_DEVICE=empty VLLM_SKIP_VERSION_SUFFIX=1 \
  "$python" -m pip download -q --no-deps --no-binary :all: --no-build-isolation --require-hashes \
  -d "$dest" -r "$scratch/requirements.txt"
echo "$sha256  $sdist" | sha256sum -c --quiet
echo "$sdist (sha256 ok)"
