#!/usr/bin/env bash
# Installs Debezium's PostgreSQL connector on a Kafka Connect worker, as
# Debezium's users run it, for the side-by-side runs (crate
# walrelay-testkit, `debezium`), from Maven Central.
#
# Two parts, each pinned and checked:
# - the Connect worker: `mvn dependency:copy-dependencies` on
#   scripts/debezium/pom.xml (connect-runtime, connect-json,
#   connect-transforms at the broker's version, which scripts/install-kafka.sh
#   pins, plus the SLF4J-to-log4j2 binding that only Kafka's tarball ships)
#   gives the worker's libs/. The sha256 of the resolved jar set (sha256 of
#   the sorted `sha256  name` lines of every jar, kept as libs.sha256) must
#   equal the pin.
# - the connector: Debezium's plugin archive
#   (io.debezium:debezium-connector-postgres:<version>:tar.gz:plugin),
#   whose sha256 must equal the pin, unpacked into plugins/ (the worker's
#   plugin.path), as Debezium's docs install it.
# Maven checks the repository's checksums too (--strict-checksums).
#
# Prints a directory laid out as:
#   DIR/libs/*.jar                         java -cp 'DIR/libs/*' org.apache.kafka.connect.cli.ConnectStandalone ...
#   DIR/plugins/debezium-connector-postgres/  plugin.path=DIR/plugins
#   DIR/config/log4j2.properties           -Dlog4j2.configurationFile=...
# under target/tools/debezium-<version>-connect-<kafka version>. Idempotent:
# when that directory is complete and its jars and archive hash to the pins
# it only prints the path.
#
# Another Debezium or Connect version by hand: WALRELAY_DEBEZIUM_VERSION=<v>
# with WALRELAY_DEBEZIUM_PLUGIN_SHA256=<hash>, WALRELAY_KAFKA_VERSION=<v>
# with WALRELAY_CONNECT_JARS_SHA256=<hash> (a first run without the hash
# fails and names the one it found). WALRELAY_DEBEZIUM_HOME points the
# testkit at any directory laid out as above.
set -euo pipefail

PINNED_DEBEZIUM_VERSION="3.6.1.Final"
PINNED_PLUGIN_SHA256="408b00c073b27ddaa7af34684f60fcf5bbf6605de68a8662ec9462f2a88880d2"
PINNED_LOG4J_VERSION="2.24.3"
# The jar set of Connect at the broker's pinned version (see below).
PINNED_CONNECT_JARS_SHA256="0d657d1249d55e1ac6602a8a08079bff1e5df7ae577ae3db600a9d2356f1514d"

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${SCRIPT_DIR}/.." && pwd)"
TOOLS_DIR="${REPO_ROOT}/target/tools"
POM="${SCRIPT_DIR}/debezium/pom.xml"
LOG4J_CONFIG="${SCRIPT_DIR}/debezium/log4j2.properties"
MAVEN_REPO="${TOOLS_DIR}/maven-repo"

log() { echo "install-debezium.sh: $*" >&2; }
die() {
    log "ERROR: $*"
    exit 1
}

# Connect runs at the broker's version: the one scripts/install-kafka.sh
# pins, read from it so that the two never drift apart.
PINNED_KAFKA_VERSION="$(sed -n 's/^PINNED_VERSION="\([^"]*\)"$/\1/p' "${SCRIPT_DIR}/install-kafka.sh")"
[ -n "${PINNED_KAFKA_VERSION}" ] ||
    die "cannot read PINNED_VERSION from ${SCRIPT_DIR}/install-kafka.sh"

KAFKA_VERSION="${WALRELAY_KAFKA_VERSION:-${PINNED_KAFKA_VERSION}}"
if [ "${KAFKA_VERSION}" = "${PINNED_KAFKA_VERSION}" ]; then
    EXPECTED_JARS_SHA256="${WALRELAY_CONNECT_JARS_SHA256:-${PINNED_CONNECT_JARS_SHA256}}"
    LOG4J_VERSION="${PINNED_LOG4J_VERSION}"
else
    EXPECTED_JARS_SHA256="${WALRELAY_CONNECT_JARS_SHA256:-}"
    LOG4J_VERSION=""
fi
DEBEZIUM_VERSION="${WALRELAY_DEBEZIUM_VERSION:-${PINNED_DEBEZIUM_VERSION}}"
if [ "${DEBEZIUM_VERSION}" = "${PINNED_DEBEZIUM_VERSION}" ]; then
    EXPECTED_PLUGIN_SHA256="${WALRELAY_DEBEZIUM_PLUGIN_SHA256:-${PINNED_PLUGIN_SHA256}}"
else
    EXPECTED_PLUGIN_SHA256="${WALRELAY_DEBEZIUM_PLUGIN_SHA256:-}"
fi
PLUGIN_ARTIFACT="io.debezium:debezium-connector-postgres:${DEBEZIUM_VERSION}:tar.gz:plugin"
PLUGIN_NAME="debezium-connector-postgres"
INSTALL_DIR="${TOOLS_DIR}/debezium-${DEBEZIUM_VERSION}-connect-${KAFKA_VERSION}"

# The sha256 of a jar set: of the sorted "sha256  name" lines of its jars.
jars_manifest() {
    (cd "$1" && LC_ALL=C ls -1 -- *.jar | while read -r jar; do sha256sum -- "${jar}"; done)
}
jars_sha256() {
    jars_manifest "$1" | sha256sum | cut -d' ' -f1
}

complete() {
    [ -n "${EXPECTED_JARS_SHA256}" ] && [ -n "${EXPECTED_PLUGIN_SHA256}" ] &&
        [ -f "${INSTALL_DIR}/libs.sha256" ] &&
        [ "$(jars_sha256 "${INSTALL_DIR}/libs")" = "${EXPECTED_JARS_SHA256}" ] &&
        [ "$(cat "${INSTALL_DIR}/plugin.sha256" 2>/dev/null)" = "${EXPECTED_PLUGIN_SHA256}" ] &&
        # The unpacked plugin as it came out of the checked archive.
        (cd "${INSTALL_DIR}/plugins/${PLUGIN_NAME}" && sha256sum --quiet -c "${INSTALL_DIR}/plugin-jars.sha256") \
            >/dev/null 2>&1 &&
        cmp -s "${LOG4J_CONFIG}" "${INSTALL_DIR}/config/log4j2.properties"
}

if complete; then
    echo "${INSTALL_DIR}"
    exit 0
fi

# Java 17 and Maven, from Debian when missing.
# shellcheck source=lib/java-maven.sh
. "${SCRIPT_DIR}/lib/java-maven.sh"
require_java_and_maven "Kafka Connect ${KAFKA_VERSION} with Debezium ${DEBEZIUM_VERSION}"
command -v tar >/dev/null 2>&1 || die "tar not found: it unpacks Debezium's plugin archive"
mkdir -p "${TOOLS_DIR}"

stage="$(mktemp -d "${TOOLS_DIR}/debezium-${DEBEZIUM_VERSION}.tmp.XXXXXX")"
trap 'rm -rf "${stage}"' EXIT

MVN=(mvn -q -B -C -Dstyle.color=never -f "${POM}" "-Dmaven.repo.local=${MAVEN_REPO}" "-Dkafka.version=${KAFKA_VERSION}")

# The binding must be at log4j-core's version (connect-runtime brings
# log4j-core); for a version without a pinned one, the resolved
# log4j-core says which.
if [ -z "${LOG4J_VERSION}" ]; then
    log "resolving the dependencies of org.apache.kafka:connect-runtime:${KAFKA_VERSION}"
    "${MVN[@]}" -Dlog4j.version="${PINNED_LOG4J_VERSION}" dependency:list \
        -DoutputFile="${stage}/deps.txt" >"${stage}/mvn.log" 2>&1 ||
        die "mvn could not resolve org.apache.kafka:connect-runtime:${KAFKA_VERSION}:
$(tail -n 30 "${stage}/mvn.log")"
    LOG4J_VERSION="$(sed -n 's/.*org\.apache\.logging\.log4j:log4j-core:jar:\([^:]*\):.*/\1/p' "${stage}/deps.txt" | head -n1)"
    [ -n "${LOG4J_VERSION}" ] || LOG4J_VERSION="${PINNED_LOG4J_VERSION}"
fi

log "resolving the Kafka Connect ${KAFKA_VERSION} worker (log4j ${LOG4J_VERSION}) from Maven Central"
"${MVN[@]}" -Dlog4j.version="${LOG4J_VERSION}" dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="${stage}/libs" >"${stage}/mvn.log" 2>&1 ||
    die "mvn dependency:copy-dependencies failed for connect-runtime:${KAFKA_VERSION}:
$(tail -n 30 "${stage}/mvn.log")
(is Maven Central reachable? a proxy goes into ~/.m2/settings.xml)"

for jar in connect-runtime connect-json connect-transforms connect-api kafka-clients; do
    [ -f "${stage}/libs/${jar}-${KAFKA_VERSION}.jar" ] ||
        die "the resolved set has no ${jar}-${KAFKA_VERSION}.jar"
done
[ -f "${stage}/libs/log4j-core-${LOG4J_VERSION}.jar" ] ||
    die "log4j-core is not at ${LOG4J_VERSION} in the resolved set ($(cd "${stage}/libs" && ls log4j-core-*.jar 2>/dev/null)); the binding log4j-slf4j-impl must match it"

actual_jars="$(jars_sha256 "${stage}/libs")"
if [ -z "${EXPECTED_JARS_SHA256}" ]; then
    die "no sha256 is pinned for the Kafka Connect ${KAFKA_VERSION} jar set; the resolved set ($(ls "${stage}/libs" | wc -l) jars) hashes to
    ${actual_jars}
check it, then run again with WALRELAY_CONNECT_JARS_SHA256=${actual_jars}"
fi
if [ "${actual_jars}" != "${EXPECTED_JARS_SHA256}" ]; then
    rejected="${TOOLS_DIR}/connect-${KAFKA_VERSION}.rejected-jars.sha256"
    jars_manifest "${stage}/libs" >"${rejected}"
    die "sha256 mismatch for the Kafka Connect ${KAFKA_VERSION} jar set resolved from Maven Central:
    expected ${EXPECTED_JARS_SHA256}
    actual   ${actual_jars}
refusing to install it. Its jars and their hashes are listed in ${rejected};
set WALRELAY_CONNECT_JARS_SHA256 only after checking what changed"
fi

log "fetching ${PLUGIN_ARTIFACT} from Maven Central"
"${MVN[@]}" dependency:copy -Dartifact="${PLUGIN_ARTIFACT}" \
    -DoutputDirectory="${stage}/download" >"${stage}/mvn.log" 2>&1 ||
    die "mvn could not fetch ${PLUGIN_ARTIFACT}:
$(tail -n 30 "${stage}/mvn.log")
(Maven Central serves only part of the newest Debezium releases: the pinned ${PINNED_DEBEZIUM_VERSION} is known to be complete)"
archive="${stage}/download/${PLUGIN_NAME}-${DEBEZIUM_VERSION}-plugin.tar.gz"
[ -f "${archive}" ] || die "mvn reported success but wrote no ${archive##*/}"

actual_plugin="$(sha256sum "${archive}" | cut -d' ' -f1)"
if [ -z "${EXPECTED_PLUGIN_SHA256}" ]; then
    die "no sha256 is pinned for Debezium ${DEBEZIUM_VERSION}'s plugin archive; the one fetched hashes to
    ${actual_plugin}
check it, then run again with WALRELAY_DEBEZIUM_PLUGIN_SHA256=${actual_plugin}"
fi
if [ "${actual_plugin}" != "${EXPECTED_PLUGIN_SHA256}" ]; then
    die "sha256 mismatch for ${archive##*/} from Maven Central:
    expected ${EXPECTED_PLUGIN_SHA256}
    actual   ${actual_plugin}
refusing to install it; set WALRELAY_DEBEZIUM_PLUGIN_SHA256 only after checking what changed"
fi

mkdir -p "${stage}/plugins"
tar -xzf "${archive}" -C "${stage}/plugins" --no-same-owner ||
    die "cannot unpack ${archive##*/}"
[ -f "${stage}/plugins/${PLUGIN_NAME}/${PLUGIN_NAME}-${DEBEZIUM_VERSION}.jar" ] ||
    die "${archive##*/} has no ${PLUGIN_NAME}/${PLUGIN_NAME}-${DEBEZIUM_VERSION}.jar"
jars_manifest "${stage}/plugins/${PLUGIN_NAME}" >"${stage}/plugin-jars.sha256"
echo "${actual_plugin}" >"${stage}/plugin.sha256"

mkdir -p "${stage}/config"
cp "${LOG4J_CONFIG}" "${stage}/config/log4j2.properties"
jars_manifest "${stage}/libs" >"${stage}/libs.sha256"
rm -rf "${stage}/download" "${stage}/deps.txt" "${stage}/mvn.log"
chmod -R a+rX "${stage}"

# Replace a stale or partial copy; rename so no reader sees half a tree.
rm -rf "${INSTALL_DIR}"
mv "${stage}" "${INSTALL_DIR}"
trap - EXIT

log "installed Kafka Connect ${KAFKA_VERSION} ($(ls "${INSTALL_DIR}/libs" | wc -l) jars, sha256 ${actual_jars}) with Debezium's PostgreSQL connector ${DEBEZIUM_VERSION} (plugin archive sha256 ${actual_plugin})"
echo "${INSTALL_DIR}"
