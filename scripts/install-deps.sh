#!/usr/bin/env bash
# Installs the system packages walrelay's build needs: librdkafka (built
# from source by the rdkafka crate, with its own configure script) links
# the system OpenSSL for TLS and SASL/SCRAM, which needs OpenSSL's headers
# (libssl-dev) and pkg-config to find them. A C compiler and make are
# needed too (build-essential).
#
# Idempotent: installs only what is missing and does nothing but report
# when everything is there. Needs root or sudo for apt-get.
set -euo pipefail

# shellcheck source=scripts/lib/as-root.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/as-root.sh"

missing=()
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
if ! pkg-config --exists openssl 2>/dev/null; then
    missing+=(libssl-dev)
fi
command -v cc >/dev/null 2>&1 || missing+=(build-essential)
command -v make >/dev/null 2>&1 || missing+=(make)

if [ "${#missing[@]}" -gt 0 ]; then
    echo "Installing build dependencies: ${missing[*]}..."
    apt_install "${missing[@]}"
fi

if ! pkg-config --exists openssl; then
    echo "install-deps.sh: pkg-config still cannot find OpenSSL (libssl-dev)" >&2
    exit 1
fi
echo "Build dependencies: OpenSSL $(pkg-config --modversion openssl), pkg-config $(pkg-config --version)"
