#!/usr/bin/env bash
# Chart tests: render, lint and validate charts/device-numa-extender with the real Helm SDK.
#   tests/chart/run.sh                 run the tests (extra args go to pytest)
#   tests/chart/run.sh --regenerate    rewrite deploy/device-numa-extender.yaml from a fresh render
#   tests/chart/run.sh --render JSON   print the chart rendered with these values (tests/e2e uses it)
# Needs only python3 (>= 3.10) with venv + pip and access to PyPI; the venv is .venv at the repo
# root, reinstalled whenever requirements.txt changes.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${CHART_TEST_VENV:-$ROOT/.venv}"
REQ="$ROOT/tests/chart/requirements.txt"
PYTHON="${PYTHON:-python3}"
STAMP="$VENV/.chart-requirements.sha256"
want="$(sha256sum "$REQ" | cut -d' ' -f1)"
if [ ! -x "$VENV/bin/python" ] || [ "$(cat "$STAMP" 2>/dev/null || true)" != "$want" ]; then
  "$PYTHON" -m venv "$VENV"
  # Time-boxed: a registry that hangs must fail the run, not stall CI.
  timeout 900 "$VENV/bin/python" -m pip install --disable-pip-version-check --no-input -q -r "$REQ"
  echo "$want" > "$STAMP"
fi
if [ "${1:-}" = "--regenerate" ]; then
  exec "$VENV/bin/python" "$ROOT/tests/chart/render.py" --write
fi
if [ "${1:-}" = "--render" ]; then
  exec "$VENV/bin/python" "$ROOT/tests/chart/render.py" --values-json "${2:?--render wants a JSON object of values}"
fi
cd "$ROOT"
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/chart "$@"
