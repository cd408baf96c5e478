#!/usr/bin/env bash
# A/B timing of the Java consumers without relaying WAL first: starts one
# throwaway PostgreSQL 15 cluster and one KRaft Kafka node on loopback,
# fills a 4-partition and a 1-partition topic with RECORDS records shaped as
# the relay writes them (io.walrelay.bench.Fill), then times the
# BenchConsumer modes interleaved, REPEATS times, each run on a fresh
# database and a fresh group reading the same records.
#
#   java/bench/run-ab.sh [RECORDS=300000] [REPEATS=3] [OUT_DIR]
#
# Env: WALRELAY_KAFKA_HOME (Kafka 4.1.1), MODES (default
# "before batch limit careful"), BEFORE_JAR (the walrelay-consumer jar that
# "before" runs instead of this build's, e.g. one built from main),
# JAVA_OPTS (extra JVM flags for the children), PG_BIN, PROFILE_DIR (with
# JAVA_OPTS=-XX:StartFlightRecording=settings=profile: each child's JFR
# recording is dumped there when it reached RECORDS; the CPU it reports
# then includes the profiler's).
# Build first: mvn -o -pl bench -am -DskipTests package (writes
# java/bench/target/classpath.txt).
#
# One line per run: mode, partitions, repeat, records/s (from the child's
# "first" line to its "processed RECORDS" line), the child's CPU (user+sys
# from /proc/PID/stat when it reached RECORDS, JVM start and JIT included)
# in µs per record, and the part of it spent after the first record; then
# medians and ratios against "limit". Per run, OUT has the child's stdout
# with arrival times (.log), its CPU per thread name (.threads) and the
# database's commits and rows (.db).
set -euo pipefail

RECORDS=${1:-300000}
REPEATS=${2:-3}
OUT=${3:-$(mktemp -d /tmp/walrelay-ab-out.XXXXXX)}
MODES=${MODES:-"before batch limit careful"}
KAFKA_HOME=${WALRELAY_KAFKA_HOME:?set WALRELAY_KAFKA_HOME to Kafka 4.1.1}
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
HERE=$(cd "$(dirname "$0")" && pwd)
CP="$HERE/target/classes:$(cat "$HERE/target/classpath.txt")"
TICK=$(getconf CLK_TCK)
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/walrelay-ab.XXXXXX)
chmod 755 "$WORK"
PG_PORT=$((20000 + RANDOM % 20000))
BROKER=$((PG_PORT + 1)); CONTROLLER=$((PG_PORT + 2))
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

cleanup() {
  [ -n "${KAFKA_PID:-}" ] && kill "$KAFKA_PID" 2>/dev/null || true
  as_pg "$PG_BIN/pg_ctl" stop -D "$WORK/pg" -m immediate >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# PostgreSQL: trust authentication, fsync off (as the conformance tests' cluster).
mkdir -p "$WORK/pg" && [ "$(id -u)" = 0 ] && chown postgres "$WORK/pg"
as_pg "$PG_BIN/initdb" -D "$WORK/pg" -U postgres -A trust -E UTF8 --locale=C --no-sync >/dev/null
printf "listen_addresses = '127.0.0.1'\nport = %s\nunix_socket_directories = '%s'\nmax_connections = 60\nshared_buffers = '128MB'\nfsync = off\n" \
  "$PG_PORT" "$WORK/pg" >> "$WORK/pg/postgresql.auto.conf"
as_pg "$PG_BIN/pg_ctl" start -D "$WORK/pg" -l "$WORK/pg/log" -w -t 60 >/dev/null
SERVER_URL="jdbc:postgresql://127.0.0.1:$PG_PORT/postgres?user=postgres"

# Kafka: one combined KRaft node, configured as the conformance tests' TestKafka.
cat > "$WORK/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$CONTROLLER
listeners=PLAINTEXT://127.0.0.1:$BROKER,CONTROLLER://127.0.0.1:$CONTROLLER
advertised.listeners=PLAINTEXT://127.0.0.1:$BROKER
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$WORK/kafka-data
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
PROPS
KJAVA=(java -Xms64m -Xmx1g -XX:+UseSerialGC -Djava.awt.headless=true
  "-Dlog4j2.configurationFile=$KAFKA_HOME/config/log4j2.properties" -cp "$KAFKA_HOME/libs/*")
# "--cluster-id=": a random id may start with "-", which the tool would take for an option.
"${KJAVA[@]}" kafka.tools.StorageTool format --ignore-formatted "--cluster-id=$(head -c16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=' | cut -c1-22)" \
  -c "$WORK/server.properties" >/dev/null
"${KJAVA[@]}" kafka.Kafka "$WORK/server.properties" > "$WORK/kafka.log" 2>&1 &
KAFKA_PID=$!
BOOT="127.0.0.1:$BROKER"

for P in 4 1; do
  for i in $(seq 1 60); do
    java -cp "$CP" io.walrelay.bench.Fill "$BOOT" "ab$P" "$P" "$RECORDS" >> "$OUT/fill.log" 2>&1 && break
    sleep 1
  done
  grep -q "filled ab$P" "$OUT/fill.log" || { echo "filling ab$P failed"; tail -20 "$OUT/fill.log"; exit 1; }
done

# Runs one child to RECORDS; prints "mode partitions repeat records/s cpu_us/record".
run_one() {
  local mode=$1 p=$2 rep=$3
  local cp=$CP arg=$mode
  if [ "$mode" = before ]; then
    # The same classpath with BEFORE_JAR in place of this build's library jar.
    cp="${BEFORE_JAR:?set BEFORE_JAR for mode before}:$HERE/target/classes:$(tr ':' '\n' < "$HERE/target/classpath.txt" | grep -v '/walrelay-consumer-[^/]*\.jar$' | paste -sd:)"
    arg=batch
  fi
  local db="ab_${mode}_${p}_${rep}"
  local url
  url=$(java -cp "$CP" io.walrelay.bench.FreshDatabase "$SERVER_URL" "$db")
  local log="$OUT/$mode-$p-$rep.log" fifo="$WORK/fifo"
  rm -f "$fifo"; mkfifo "$fifo"
  # Each stdout line stamped with the wall clock as it arrives.
  (while IFS= read -r line; do echo "$EPOCHREALTIME $line"; done < "$fifo" > "$log") &
  local stamper=$!
  # shellcheck disable=SC2086
  java ${JAVA_OPTS:-} -cp "$cp" io.walrelay.bench.BenchConsumer "$BOOT" "ab$p" "$url" "g-$db" "$arg" "$p" \
    > "$fifo" 2> "$OUT/$mode-$p-$rep.err" &
  local pid=$!
  local deadline=$((SECONDS + 300)) cpu="" cpu_first=""
  while [ $SECONDS -lt $deadline ]; do
    if [ -z "$cpu_first" ] && grep -q ' first$' "$log" 2>/dev/null; then
      # The CPU spent before the first record (JVM start, joining the group), within one 20 ms turn.
      cpu_first=$(awk -v t="$TICK" '{print ($14 + $15) / t}' "/proc/$pid/stat")
    fi
    if awk -v n="$RECORDS" '$2=="processed" && $3>=n {f=1} END {exit !f}' "$log" 2>/dev/null; then
      cpu=$(awk -v t="$TICK" '{print ($14 + $15) / t}' "/proc/$pid/stat")
      # Where that CPU went, per thread name (numbers folded: C2 CompilerThre#, walrelay-worker-#).
      for task in /proc/"$pid"/task/*; do
        echo "$(tr -d '0-9' < "$task/comm" | tr ' ' '_') $(awk '{print $14 + $15}' "$task/stat")"
      done 2>/dev/null | awk -v t="$TICK" -v n="$RECORDS" '{c[$1]+=$2} END {for (k in c) printf "%8.2f us/record %s\n", c[k]*1e6/t/n, k}' \
        | sort -rn > "$OUT/$mode-$p-$rep.threads"
      break
    fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.02
  done
  if [ -n "${PROFILE_DIR:-}" ]; then
    # With JAVA_OPTS=-XX:StartFlightRecording=settings=profile: the child
    # halts at its stop, before JFR could write the recording itself.
    mkdir -p "$PROFILE_DIR"
    jcmd "$pid" JFR.dump filename="$PROFILE_DIR/$mode-$p-$rep.jfr" >/dev/null 2>&1 || true
  fi
  kill -TERM "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  wait "$stamper" 2>/dev/null || true
  # The database's committed transactions (the child's batches, and a few of its own set-up), after the child left.
  sleep 0.5
  "$PG_BIN/psql" -h 127.0.0.1 -p "$PG_PORT" -U postgres -d "$db" -Atc \
    "SELECT 'commits ' || xact_commit || ' rows ' || (SELECT count(*) FROM applied_events) FROM pg_stat_database WHERE datname = current_database()" \
    > "$OUT/$mode-$p-$rep.db" 2>&1 || true
  if [ -z "$cpu" ]; then
    echo "$mode $p $rep FAILED" ; return
  fi
  awk -v n="$RECORDS" -v cpu="$cpu" -v c0="${cpu_first:-0}" -v m="$mode" -v p="$p" -v r="$rep" '
    $2=="first" && !f {f=$1}
    $2=="processed" && $3>=n && !d {d=$1}
    END {printf "%s %d %d %.0f %.2f %.2f\n", m, p, r, n/(d-f), cpu*1e6/n, (cpu-c0)*1e6/n}' "$log"
}

RESULTS="$OUT/results.txt"
: > "$RESULTS"
# The modes run back to back, in alternating direction from one repeat to
# the next, so that no mode always runs first (after the fill, or after a
# given other mode).
REVERSED=$(echo "$MODES" | tr ' ' '\n' | grep -v '^$' | tac | paste -sd' ')
for rep in $(seq 1 "$REPEATS"); do
  order=$MODES
  [ $((rep % 2)) = 0 ] && order=$REVERSED
  for P in 4 1; do
    for mode in $order; do
      run_one "$mode" "$P" "$rep" | tee -a "$RESULTS"
    done
  done
done

echo "--- medians over the repeats (records/s, CPU µs/record), and the median of each repeat's ratio to limit"
awk -f "$HERE/ab-summary.awk" "$RESULTS" | sort -k2,2nr -k1,1 | tee "$OUT/summary.txt"
echo "raw lines: $RESULTS"
