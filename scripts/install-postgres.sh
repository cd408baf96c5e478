#!/usr/bin/env bash
# Installs the PostgreSQL 15 server binaries that walrelay's tests, examples
# and benchmarks run throwaway clusters with (crate walrelay-testkit).
#
# Idempotent: does nothing but report when /usr/lib/postgresql/15/bin/initdb
# is already there. Never starts a system service and creates no system
# cluster: the testkit runs its own clusters in temporary directories.
#
# Another PostgreSQL can be used instead by pointing WALRELAY_PG_BIN at its
# bin directory.
set -euo pipefail

PG_MAJOR=15
PG_BIN="/usr/lib/postgresql/${PG_MAJOR}/bin"

# shellcheck source=scripts/lib/as-root.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib/as-root.sh"

if [ ! -x "${PG_BIN}/initdb" ]; then
    echo "Installing PostgreSQL ${PG_MAJOR} from Debian packages..."
    # Tell postgresql-common not to create (and start) a "main" cluster.
    as_root mkdir -p /etc/postgresql-common/createcluster.d
    echo "create_main_cluster = false" |
        as_root tee /etc/postgresql-common/createcluster.d/walrelay-no-main-cluster.conf >/dev/null
    # Keep package scripts from starting services while installing.
    policy_rc_d=/usr/sbin/policy-rc.d
    added_policy=0
    if [ ! -e "${policy_rc_d}" ]; then
        printf '#!/bin/sh\nexit 101\n' | as_root tee "${policy_rc_d}" >/dev/null
        as_root chmod 755 "${policy_rc_d}"
        added_policy=1
    fi
    cleanup() {
        if [ "${added_policy}" -eq 1 ]; then
            as_root rm -f "${policy_rc_d}"
        fi
    }
    trap cleanup EXIT
    apt_install "postgresql-${PG_MAJOR}" "postgresql-client-${PG_MAJOR}"
fi

# The testkit runs the server as "postgres" when the tests run as root
# (initdb refuses root). The Debian package normally creates the user.
if ! getent passwd postgres >/dev/null 2>&1; then
    echo "Creating the postgres system user..."
    if command -v adduser >/dev/null 2>&1; then
        as_root adduser --system --group --home /var/lib/postgresql --shell /bin/bash \
            --disabled-password postgres
    else
        as_root groupadd --system postgres 2>/dev/null || true
        as_root useradd --system --gid postgres --home-dir /var/lib/postgresql \
            --shell /bin/bash postgres
    fi
fi

if [ ! -x "${PG_BIN}/initdb" ] || [ ! -x "${PG_BIN}/pg_ctl" ] || [ ! -x "${PG_BIN}/postgres" ]; then
    echo "install-postgres.sh: ${PG_BIN} still lacks initdb/pg_ctl/postgres" >&2
    exit 1
fi
echo "PostgreSQL server binaries: ${PG_BIN}"
"${PG_BIN}/postgres" --version
