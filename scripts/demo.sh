#!/usr/bin/env bash
# The README's first command: walrelay's main job end to end on servers it
# starts and removes itself. Starts a throwaway PostgreSQL and a Tansu
# broker (`--kafka`: an Apache Kafka node instead), runs `walrelay setup` and `walrelay run`, emits a few thousand
# events from SQL (helpers, raw messages, outbox rows, one rolled-back
# transaction), reads them back from Kafka, prints a table, and stops
# everything.
set -euo pipefail
cd "$(dirname "$0")/.."
broker=tansu
case "${1:-}" in
"") ;;
--kafka) broker=kafka ;;
*)
    echo "usage: scripts/demo.sh [--kafka]" >&2
    exit 2
    ;;
esac
scripts/install-deps.sh >/dev/null
scripts/install-postgres.sh >/dev/null
if [ "${broker}" = kafka ]; then
    kafka_home="$(scripts/install-kafka.sh)"
    export WALRELAY_KAFKA_HOME="${kafka_home}"
else
    scripts/install-tansu.sh >/dev/null
fi
cargo build --quiet --locked -p walrelay --bin walrelay --example demo
WALRELAY_BROKER="${broker}" exec target/debug/examples/demo
