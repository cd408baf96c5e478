#!/usr/bin/env bash
# The README's first command: walrelay's main job end to end on servers it
# starts and removes itself. Starts a throwaway PostgreSQL and a Tansu
# broker, runs `walrelay setup` and `walrelay run`, emits a few thousand
# events from SQL (helpers, raw messages, outbox rows, one rolled-back
# transaction), reads them back from Kafka, prints a table, and stops
# everything.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh >/dev/null
scripts/install-postgres.sh >/dev/null
scripts/install-tansu.sh >/dev/null
cargo build --quiet --locked -p walrelay --bin walrelay --example demo
exec target/debug/examples/demo
