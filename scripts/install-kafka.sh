#!/usr/bin/env bash
# Installs the Apache Kafka broker (4.x, KRaft) that walrelay's tests run
# on (crate walrelay-testkit, `KafkaCluster`), from Maven Central.
#
# Kafka's distribution tarball is not on Maven Central, but its jars are:
# `mvn dependency:copy-dependencies` on scripts/kafka/pom.xml (kafka_2.13,
# whose POM brings the broker's runtime jars, plus the SLF4J-to-log4j2
# binding that only the tarball ships) gives the tarball's libs/. Maven
# checks the repository's checksums; this script also pins the sha256 of
# the resolved jar set (sha256 of the sorted `sha256  name` lines of every
# jar, kept as libs.sha256) and refuses a set that differs.
#
# Prints a directory laid out like Kafka's distribution:
#   DIR/libs/*.jar                 java -cp 'DIR/libs/*' kafka.Kafka server.properties
#   DIR/config/log4j2.properties   -Dlog4j2.configurationFile=...
# under target/tools/kafka-<version>. Idempotent: when that directory is
# complete and its jars hash to the pin it only prints the path.
#
# Another Kafka line (e.g. 3.9.x) by hand: WALRELAY_KAFKA_VERSION=<v>, with
# WALRELAY_KAFKA_JARS_SHA256=<hash> (a first run without it fails and names
# the hash it found). A 3.x broker, whose tarball logs through reload4j,
# logs through the same log4j2 binding and configuration. WALRELAY_KAFKA_HOME points the tests at any
# directory laid out as above.
set -euo pipefail

PINNED_VERSION="4.1.1"
PINNED_LOG4J_VERSION="2.24.3"
PINNED_JARS_SHA256="3a34e90b2c305fced2b81eb1d737a8f6b0e1fc5831f4ef1a0f8a89c07bd1badd"
# The newest line whose high watermark still passes records while the
# in-sync set is below min.insync.replicas (Kafka 3.7.0 made it wait:
# KAFKA-15583). The tail fence's durability test (tests/fence_durability.rs)
# reproduces on it what the fence's rule guards against:
# `scripts/install-kafka.sh 3.6.2`.
OLD_LINE_VERSION="3.6.2"
OLD_LINE_JARS_SHA256="d8b02e52fddb480a6b39f35c18659769d395b301b597699d3ecd9f9a6e166872"

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${SCRIPT_DIR}/.." && pwd)"
TOOLS_DIR="${REPO_ROOT}/target/tools"
POM="${SCRIPT_DIR}/kafka/pom.xml"
LOG4J_CONFIG="${SCRIPT_DIR}/kafka/log4j2.properties"
MAVEN_REPO="${TOOLS_DIR}/maven-repo"

VERSION="${1:-${WALRELAY_KAFKA_VERSION:-${PINNED_VERSION}}}"
if [ "${VERSION}" = "${PINNED_VERSION}" ]; then
    EXPECTED_SHA256="${WALRELAY_KAFKA_JARS_SHA256:-${PINNED_JARS_SHA256}}"
    LOG4J_VERSION="${PINNED_LOG4J_VERSION}"
elif [ "${VERSION}" = "${OLD_LINE_VERSION}" ]; then
    EXPECTED_SHA256="${WALRELAY_KAFKA_JARS_SHA256:-${OLD_LINE_JARS_SHA256}}"
    LOG4J_VERSION=""
else
    EXPECTED_SHA256="${WALRELAY_KAFKA_JARS_SHA256:-}"
    LOG4J_VERSION=""
fi
KAFKA_DIR="${TOOLS_DIR}/kafka-${VERSION}"

log() { echo "install-kafka.sh: $*" >&2; }
die() {
    log "ERROR: $*"
    exit 1
}

# The sha256 of a jar set: of the sorted "sha256  name" lines of its jars.
jars_manifest() {
    (cd "$1" && LC_ALL=C ls -1 -- *.jar | while read -r jar; do sha256sum -- "${jar}"; done)
}
jars_sha256() {
    jars_manifest "$1" | sha256sum | cut -d' ' -f1
}

complete() {
    [ -f "${KAFKA_DIR}/libs.sha256" ] &&
        [ -n "${EXPECTED_SHA256}" ] &&
        [ "$(jars_sha256 "${KAFKA_DIR}/libs")" = "${EXPECTED_SHA256}" ] &&
        cmp -s "${LOG4J_CONFIG}" "${KAFKA_DIR}/config/log4j2.properties"
}

if complete; then
    echo "${KAFKA_DIR}"
    exit 0
fi

# Java 17 and Maven, from Debian when missing.
# shellcheck source=lib/java-maven.sh
. "${SCRIPT_DIR}/lib/java-maven.sh"
require_java_and_maven "Kafka ${VERSION}"
mkdir -p "${TOOLS_DIR}"

stage="$(mktemp -d "${TOOLS_DIR}/kafka-${VERSION}.tmp.XXXXXX")"
trap 'rm -rf "${stage}"' EXIT

MVN=(mvn -q -B -Dstyle.color=never -f "${POM}" "-Dmaven.repo.local=${MAVEN_REPO}" "-Dkafka.version=${VERSION}")

# The binding must be at log4j-core's version; for a version without a
# pinned one, the resolved log4j-core says which.
if [ -z "${LOG4J_VERSION}" ]; then
    log "resolving the dependencies of org.apache.kafka:kafka_2.13:${VERSION}"
    "${MVN[@]}" -Dlog4j.version="${PINNED_LOG4J_VERSION}" dependency:list \
        -DoutputFile="${stage}/deps.txt" >"${stage}/mvn.log" 2>&1 ||
        die "mvn could not resolve org.apache.kafka:kafka_2.13:${VERSION}:
$(tail -n 30 "${stage}/mvn.log")"
    LOG4J_VERSION="$(sed -n 's/.*org\.apache\.logging\.log4j:log4j-core:jar:\([^:]*\):.*/\1/p' "${stage}/deps.txt" | head -n1)"
    # Kafka's own log4j-core wins over the binding's (declared first); a 3.x
    # line has none, and the binding's at the pinned version stays.
    [ -n "${LOG4J_VERSION}" ] || die "no log4j-core in the dependencies of kafka_2.13:${VERSION}"
fi

log "resolving org.apache.kafka:kafka_2.13:${VERSION} (log4j ${LOG4J_VERSION}) from Maven Central"
"${MVN[@]}" -Dlog4j.version="${LOG4J_VERSION}" dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="${stage}/libs" >"${stage}/mvn.log" 2>&1 ||
    die "mvn dependency:copy-dependencies failed for kafka_2.13:${VERSION}:
$(tail -n 30 "${stage}/mvn.log")"

[ -f "${stage}/libs/kafka_2.13-${VERSION}.jar" ] ||
    die "the resolved set has no kafka_2.13-${VERSION}.jar"
[ -f "${stage}/libs/log4j-core-${LOG4J_VERSION}.jar" ] ||
    die "log4j-core is not at ${LOG4J_VERSION} in the resolved set ($(cd "${stage}/libs" && ls log4j-core-*.jar 2>/dev/null)); the binding log4j-slf4j-impl must match it"

actual="$(jars_sha256 "${stage}/libs")"
if [ -z "${EXPECTED_SHA256}" ]; then
    die "no sha256 is pinned for Kafka ${VERSION}; the resolved jar set ($(ls "${stage}/libs" | wc -l) jars) hashes to
    ${actual}
check it, then run again with WALRELAY_KAFKA_JARS_SHA256=${actual}"
fi
if [ "${actual}" != "${EXPECTED_SHA256}" ]; then
    rejected="${TOOLS_DIR}/kafka-${VERSION}.rejected-jars.sha256"
    jars_manifest "${stage}/libs" >"${rejected}"
    die "sha256 mismatch for the jar set of Kafka ${VERSION} resolved from Maven Central:
    expected ${EXPECTED_SHA256}
    actual   ${actual}
refusing to install it. Its jars and their hashes are listed in ${rejected};
set WALRELAY_KAFKA_JARS_SHA256 only after checking what changed"
fi

mkdir -p "${stage}/config"
cp "${LOG4J_CONFIG}" "${stage}/config/log4j2.properties"
jars_manifest "${stage}/libs" >"${stage}/libs.sha256"
rm -f "${stage}/deps.txt" "${stage}/mvn.log"
chmod -R a+rX "${stage}"

# Replace a stale or partial copy; rename so no reader sees half a tree.
rm -rf "${KAFKA_DIR}"
mv "${stage}" "${KAFKA_DIR}"
trap - EXIT

java -cp "${KAFKA_DIR}/libs/*" kafka.tools.StorageTool random-uuid >/dev/null 2>&1 ||
    log "warning: 'kafka.tools.StorageTool random-uuid' failed with ${KAFKA_DIR}/libs"
log "installed Apache Kafka ${VERSION} ($(ls "${KAFKA_DIR}/libs" | wc -l) jars, sha256 ${actual})"
echo "${KAFKA_DIR}"
