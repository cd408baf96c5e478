#!/usr/bin/env bash
# Installs Prometheus's server and promtool from Debian's `prometheus`
# package (2.42 on bookworm), for the tests of the shipped alert rules and
# dashboard (deploy/prometheus, deploy/grafana; docs/testing.md), and
# Debian's python3-yaml, with which scripts/check-ops-kit.py reads them.
# Only the
# binaries are used: the package's service is never started (a
# policy-rc.d that refuses every start is in place while apt-get runs, and
# the tests start their own server on a loopback port with a throwaway
# data directory).
#
# Idempotent: does nothing but report when both binaries are there. Needs
# root or sudo for apt-get. Prints nothing on stdout but the report.
set -euo pipefail

# shellcheck source=scripts/lib/as-root.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/as-root.sh"

missing=()
if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
    missing+=(prometheus)
fi
if ! /usr/bin/python3 -c 'import yaml' >/dev/null 2>&1; then
    missing+=(python3-yaml)
fi
if [ "${#missing[@]}" -gt 0 ]; then
    echo "Installing ${missing[*]} (Debian, --no-install-recommends; Prometheus's service is not started)..." >&2
    # invoke-rc.d (and deb-systemd-invoke) ask /usr/sbin/policy-rc.d
    # whether a service may start; 101 is "no". Put one in place unless
    # the machine has its own, and remove only ours afterwards.
    policy=/usr/sbin/policy-rc.d
    ours=""
    if [ ! -e "${policy}" ]; then
        as_root sh -c "printf '#!/bin/sh\nexit 101\n' > ${policy} && chmod 755 ${policy}"
        ours=yes
    fi
    status=0
    apt_install "${missing[@]}" || status=$?
    if [ -n "${ours}" ]; then
        as_root rm -f "${policy}"
    fi
    [ "${status}" -eq 0 ] || exit "${status}"
    # Belt and braces: if an init system started it anyway, stop it (the
    # tests need no server of the package's, and port 9090 stays free).
    if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet prometheus 2>/dev/null; then
        as_root systemctl disable --now prometheus >&2 || true
    fi
fi

if ! /usr/bin/python3 -c 'import yaml' >/dev/null 2>&1; then
    echo "install-prometheus.sh: /usr/bin/python3 still cannot import yaml after installing python3-yaml" >&2
    exit 1
fi
for bin in promtool prometheus; do
    if ! command -v "${bin}" >/dev/null 2>&1; then
        echo "install-prometheus.sh: ${bin} is still missing after installing Debian's prometheus package" >&2
        exit 1
    fi
done
echo "Prometheus: $(prometheus --version 2>&1 | head -n 1); $(promtool --version 2>&1 | head -n 1)"
