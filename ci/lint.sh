#!/usr/bin/env bash
# Lint and type check, as CI runs them before the tests (ruff and mypy settings: pyproject.toml).
#
# mypy reads an installed copy of the package: pyproject maps vendors/ to hisparse_hal.vendors and
# conformance/ to hisparse_hal.conformance, a layout neither mypy nor an editable install exposes to a
# static checker. So the package is installed (no deps) into a scratch folder, checked as
# `-p hisparse_hal`, and tests/ and ci/ are checked against it.
# Usage: ci/lint.sh   (needs: pip install -e '.[lint]')
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"

echo "== ruff"
"$python" -m ruff check .

echo "== mypy"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
# Built from a copy: setuptools leaves a build/ folder behind, and a stale one keeps deleted modules.
mkdir "$scratch/src"
cp -R pyproject.toml README.md hisparse_hal vendors conformance "$scratch/src/"
"$python" -m pip install -q --no-deps --no-build-isolation --target "$scratch/site" "$scratch/src" >/dev/null
(cd "$scratch" && MYPYPATH="$scratch/site" "$python" -m mypy --config-file "$OLDPWD/pyproject.toml" -p hisparse_hal)
MYPYPATH="$scratch/site:tests" "$python" -m mypy tests ci
