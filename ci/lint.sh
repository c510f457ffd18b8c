#!/usr/bin/env bash
# Lint and type check, as CI runs them before the tests (ruff and mypy settings: pyproject.toml).
#
# Usage: ci/lint.sh   (needs: pip install -e '.[lint]', and '.[actionlint]' for the workflow check; without
# actionlint it fails unless HISPARSE_LINT_SKIP_ACTIONLINT gives the reason to skip that check)
set -euo pipefail
cd "$(dirname "$0")/.."
python="${PYTHON:-python3}"

echo "== ruff"
"$python" -m ruff check .

echo "== mypy"
"$python" -m mypy -p hisparse_hal
MYPYPATH="tests" "$python" -m mypy tests ci

echo "== actionlint (.github/workflows)"
if command -v actionlint >/dev/null 2>&1; then
    actionlint
elif [ -n "${HISPARSE_LINT_SKIP_ACTIONLINT:-}" ]; then
    echo "actionlint SKIPPED: $HISPARSE_LINT_SKIP_ACTIONLINT"
else
    echo "ci/lint.sh: actionlint is not installed: pip install -e '.[actionlint]'" >&2
    exit 1
fi
