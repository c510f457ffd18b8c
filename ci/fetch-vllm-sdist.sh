#!/usr/bin/env bash
# Fetch vLLM 0.34.0's source distribution through pip (its configured index; no address is written here) into
# DEST, checked by sha256. Reusable by any CI script that needs vLLM's sources (tests, csrc).
#
# Usage: ci/fetch-vllm-sdist.sh DEST      -> DEST/vllm-0.34.0.tar.gz (kept when already there and intact)
#
# `pip download` of an sdist always prepares its metadata, and vLLM's setup.py imports torch, setuptools_rust
# and setuptools_scm and would build CMake/CUDA metadata. So pip runs with --no-build-isolation,
# VLLM_TARGET_DEVICE=empty (no extensions) and two stand-in modules for the Rust and version plug-ins (a
# temporary folder on PYTHONPATH; the version is the pinned one). The python running pip ($PYTHON, default
# python3) needs torch, packaging and setuptools. pip itself checks the hash (--require-hashes); sha256sum checks
# the saved file again.
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
stub="$(mktemp -d)"
trap 'rm -rf "$stub"' EXIT
mkdir -p "$stub/setuptools_rust" "$stub/setuptools_scm"
cat >"$stub/setuptools_rust/__init__.py" <<'PY'
"""Stand-in for setuptools_rust while pip prepares vLLM's sdist metadata (ci/fetch-vllm-sdist.sh): builds nothing."""
import enum


class Binding(enum.Enum):
    PyO3 = 1
    Exec = 2


class RustExtension:
    def __init__(self, *args, **kwargs):
        self.binding = kwargs.get("binding")
        self.target = {}
PY
cat >"$stub/setuptools_rust/build.py" <<'PY'
"""Stand-in build_rust command: does nothing."""
from setuptools import Command


class build_rust(Command):
    user_options = []

    def initialize_options(self):
        pass

    def finalize_options(self):
        pass

    def run(self):
        pass
PY
cat >"$stub/setuptools_scm/__init__.py" <<'PY'
"""Stand-in for setuptools_scm: the pinned version from SETUPTOOLS_SCM_PRETEND_VERSION."""
import os


def get_version(**kwargs):
    return os.environ["SETUPTOOLS_SCM_PRETEND_VERSION"]
PY
echo "vllm==$version --hash=sha256:$sha256" >"$stub/requirements.txt"
PYTHONPATH="$stub${PYTHONPATH:+:$PYTHONPATH}" VLLM_TARGET_DEVICE=empty VLLM_SKIP_VERSION_SUFFIX=1 \
  SETUPTOOLS_SCM_PRETEND_VERSION="$version" \
  "$python" -m pip download -q --no-deps --no-binary :all: --no-build-isolation --require-hashes \
  -d "$dest" -r "$stub/requirements.txt"
echo "$sha256  $sdist" | sha256sum -c --quiet
echo "$sdist (sha256 ok)"
