#!/usr/bin/env bash
# Lint and type check, as CI runs them before the tests (ruff and mypy settings: pyproject.toml).
#
# Usage: ci/lint.sh   (needs: pip install -e '.[lint]': ruff, mypy and actionlint)
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"

echo "== ruff"
"$python" -m ruff check .

echo "== mypy"
"$python" -m mypy -p hisparse_hal -m hisparse_hal_launcher
"$python" -m mypy tests ci

echo "== actionlint (.github/workflows)"
actionlint
