#!/usr/bin/env bash
# The README's first command: runs walrelay's main job end to end on a
# throwaway PostgreSQL that it starts and removes itself.
#
# Today that job is the replication half: stream a sample workload through a
# pgoutput slot and print the decoded events with their LSNs. (The Kafka
# half, issue "Relay to Kafka", will extend this script with a throwaway
# broker.)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-postgres.sh >/dev/null
exec cargo run --quiet --locked -p walrelay-pg --example stream_events
