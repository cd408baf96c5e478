#!/usr/bin/env bash
# Installs what the Java consumer (java/) is built and tested with: a JDK
# 17 (javac; Apache Kafka runs on the JRE alone) and Maven, from Debian
# (openjdk-17-jdk-headless, maven), when either is missing. Maven then
# fetches the pinned versions of java/pom.xml into target/tools/m2 when
# scripts/test.sh builds the project.
#
# Idempotent: does nothing but report when both are there. Needs root or
# sudo for apt-get. Prints nothing on stdout.
set -euo pipefail

# shellcheck source=scripts/lib/as-root.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/as-root.sh"

missing=()
command -v javac >/dev/null 2>&1 || missing+=(openjdk-17-jdk-headless)
command -v mvn >/dev/null 2>&1 || missing+=(maven)
if [ "${#missing[@]}" -gt 0 ]; then
    echo "install-java.sh: installing ${missing[*]} (Debian, --no-install-recommends)..." >&2
    apt_install "${missing[@]}"
fi
for tool in javac mvn; do
    command -v "${tool}" >/dev/null 2>&1 || {
        echo "install-java.sh: ${tool} is still missing after installing ${missing[*]}" >&2
        exit 1
    }
done
major="$(javac -version 2>&1 | sed -n 's/^javac \([0-9]*\).*/\1/p')"
if [ -z "${major}" ] || [ "${major}" -lt 17 ]; then
    echo "install-java.sh: javac ${major:-?} is older than 17, which java/pom.xml targets; install a JDK 17 or newer first on the PATH" >&2
    exit 1
fi
echo "install-java.sh: javac ${major}, $(mvn -v 2>/dev/null | head -1 | sed 's/\x1b\[[0-9;]*m//g')" >&2
