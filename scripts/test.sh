#!/usr/bin/env bash
# Runs every test: formatting, lints, all Rust tests (unit, property, integration against the
# in-process fake API server, the real binary end to end), the Helm chart tests, and the
# end-to-end scenarios against a real control plane (tests/e2e: etcd, kube-apiserver and
# kube-scheduler v1.37 built from Kubernetes' Go modules), and the annotations checked with
# koordinator's own parsers (tests/koord-compat).
# Needs only the Rust toolchain, Go, Python 3 with venv/pip, and the package registries.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() { printf '\n==> %s\n' "$*"; }

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy (all targets, warnings are errors)"
cargo clippy --locked --all-targets -- -D warnings

step "module imports: no cycle, no arrow up the layers (ARCHITECTURE.md)"
python3 scripts/import_graph.py

step "cargo test (unit, property and integration tests; benches are run separately, see BENCHMARKS.md)"
cargo test --locked

step "Helm chart tests (real Helm SDK, Kubernetes 1.33 schemas)"
tests/chart/run.sh

step "koordinator's own parsers read what the extender writes (tests/koord-compat, koordinator v1.7.0)"
cargo build --release --locked --bin device-numa-extender
(
  cd tests/koord-compat
  unformatted="$(gofmt -l .)"
  if [ -n "$unformatted" ]; then
    echo "gofmt: these files need formatting: $unformatted" >&2
    exit 1
  fi
  go vet .
  go test -count=1 .
  # koordinator's own accumulator (its Kubernetes 1.28 pins, so a module of its own) records
  # its answers again; they must be exactly the cases src/placement/cpu/koord_cases.rs replays.
  cd accumulator
  unformatted="$(gofmt -l .)"
  if [ -n "$unformatted" ]; then
    echo "gofmt: these files need formatting: $unformatted" >&2
    exit 1
  fi
  go build -ldflags=-checklinkname=0 -o "${TMPDIR:-/tmp}/dne-koord-accumulator" .
  if ! "${TMPDIR:-/tmp}/dne-koord-accumulator" -seed 1 -cases 3000 | cmp -s - ../accumulator-cases.jsonl; then
    echo "tests/koord-compat/accumulator-cases.jsonl is not what koordinator's accumulator answers: regenerate it (see tests/koord-compat/accumulator/main.go)" >&2
    exit 1
  fi
  # koordinator's own GPU partition step, likewise: src/placement/device/partition.rs replays it.
  go vet ./partitions
  go build -ldflags=-checklinkname=0 -o "${TMPDIR:-/tmp}/dne-koord-partitions" ./partitions
  if ! "${TMPDIR:-/tmp}/dne-koord-partitions" -seed 1 -cases 3000 | cmp -s - ../partition-cases.jsonl; then
    echo "tests/koord-compat/partition-cases.jsonl is not what koordinator's partition step answers: regenerate it (see tests/koord-compat/accumulator/partitions/main.go)" >&2
    exit 1
  fi
  # And its GPU topology allocator: src/placement/device/allocate.rs replays it.
  go vet ./gputree
  go build -ldflags=-checklinkname=0 -o "${TMPDIR:-/tmp}/dne-koord-gputree" ./gputree
  if ! "${TMPDIR:-/tmp}/dne-koord-gputree" -seed 1 -cases 3000 | cmp -s - ../gputree-cases.jsonl; then
    echo "tests/koord-compat/gputree-cases.jsonl is not what koordinator's GPU topology allocator answers: regenerate it (see tests/koord-compat/accumulator/gputree/main.go)" >&2
    exit 1
  fi
  # And its NUMA-level amplification: src/placement/cpu/amplified_cases.rs replays it (klog's
  # complaints about refused allocations go to stderr).
  go vet ./numaamp
  go build -ldflags=-checklinkname=0 -o "${TMPDIR:-/tmp}/dne-koord-numaamp" ./numaamp
  if ! "${TMPDIR:-/tmp}/dne-koord-numaamp" -seed 1 -cases 2000 2>/dev/null | cmp -s - ../numaamp-cases.jsonl; then
    echo "tests/koord-compat/numaamp-cases.jsonl is not what koordinator's NUMA amplification answers: regenerate it (see tests/koord-compat/accumulator/numaamp/main.go)" >&2
    exit 1
  fi
)

step "End-to-end scenarios: real kube-apiserver + kube-scheduler v1.37 and the release binary"
scripts/e2e.sh
