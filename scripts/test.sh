#!/usr/bin/env bash
# The README's test command: installs what is missing, then checks
# formatting, lints and runs every test (unit tests, and integration tests
# against throwaway PostgreSQL clusters and Tansu brokers this suite starts
# and removes).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/install-deps.sh
scripts/install-postgres.sh
scripts/install-tansu.sh

echo "==> cargo fmt --check"
cargo fmt --all -- --check

echo "==> cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

echo "==> cargo build (the binaries and examples that end-to-end tests run)"
cargo build --workspace --bins --examples --locked

echo "==> cargo test"
# Integration tests start their own clusters; two cores are plenty busy
# with two test threads.
cargo test --workspace --all-targets --locked -- --test-threads="${WALRELAY_TEST_THREADS:-2}"
