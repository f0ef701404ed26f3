#!/usr/bin/env bash
# End-to-end scenarios against a real control plane (tests/e2e): embedded etcd, kube-apiserver
# and a stock kube-scheduler v1.37 compiled from Kubernetes' Go modules, the chart's RBAC and
# scheduler configuration, and the extender's release binary.
#   scripts/e2e.sh                  build the release binary and run every scenario
#   scripts/e2e.sh -run Preemption  extra args go to `go test`
#   DNE_E2E_LOGS=/tmp/e2e-logs      keep every extender and kube-scheduler log there
#   DNE_E2E_LOG=/tmp/cp.log         the in-process etcd/kube-apiserver log (default: a temp file)
# Needs Go (see tests/e2e/go.mod) and the module proxy; the first build of the control plane
# takes tens of minutes on 2 cores, later ones seconds (GOCACHE).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

if ! command -v go >/dev/null 2>&1; then
  echo "scripts/e2e.sh: Go is required for the end-to-end scenarios (tests/e2e/go.mod)" >&2
  exit 1
fi

echo "==> cargo build --release (the binary the scenarios run)"
cargo build --release --locked --bin device-numa-extender

cd tests/e2e
echo "==> gofmt, go vet (tests/e2e)"
unformatted="$(gofmt -l .)"
if [ -n "$unformatted" ]; then
  echo "gofmt: these files need formatting: $unformatted" >&2
  exit 1
fi
go vet .

# The chart tests' venv (tests/chart/run.sh) renders non-default chart values for some scenarios.
echo "==> go test ./tests/e2e"
# -count=1: the scenarios read files outside the module (the binary, the chart), which go's
# test cache does not track. -p 1 / -parallel 2: one package, two scenarios at a time on
# a 2-core machine.
exec go test -count=1 -timeout 60m -parallel 2 "$@" .
