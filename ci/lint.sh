#!/usr/bin/env bash
# Lint and type check, as CI runs them before the tests (ruff and mypy settings: pyproject.toml).
#
# Usage: ci/lint.sh   (needs: pip install -e '.[lint]': ruff, mypy and actionlint)
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"

echo "== ruff"
"$python" -m ruff check .

echo "== mypy (one build, each module under its import name: ci/typecheck.py)"
"$python" ci/typecheck.py

echo "== actionlint (.github/workflows)"
actionlint
